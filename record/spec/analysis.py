"""The ``analysis:`` section of a study file: how its results are compared (docs/statistics.md).

```yaml
analysis:
  test: permutation            # permutation (exact paired sign-flip test, the default) | t (paired t-test)
  alpha: 0.05                  # the family-wise level; intervals are at 1 - alpha
  failure_rule: worst          # worst | exclude | value: how a failed seed enters the metric comparison
  failure_values: {}           # failure_rule value: {metric: the value a failed seed takes}
  never_learned: {}            # {metric: threshold}: a finished cell not better than it is a failure
  margins: {}                  # {metric: m}: equivalence margins, tested by two one-sided tests (TOST)
  contrasts:                   # the correction family; absent: each variant against the baseline
    pairs: [[variant, comparator], ...]   # or "baseline": each variant against the baseline
    main_effects: false        # true (every axis of a grid) or a list of axes
    interactions: false        # true (every pair of axes) or a list of [axis, axis]
  power: 0.8                   # the power at which the detectable difference is stated
  detect: {}                   # {metric: difference}: how many seeds that difference needs
  expect:                      # the effects the study looks for (a paper's), each judged for room in the metric
    - contrast: [variant, comparator]   # a contrast of the family: a pair, or an effect's label
      value: -0.21             # the expected difference (variant - comparator) in the metric's units
      metric: test/accuracy    # default: the study's metric
      source: "Tay et al. 2021, Table 1"
  claims:                      # the papers' sentences, each shown beside the verdict of the contrast that tests it
    - contrast: [additive, dot]         # a contrast of the family
      source: "Vaswani et al. 2017, section 3.2.1"
      sentence: "additive and dot-product attention perform similarly for small values of d_k"
  converged: {window: 0.2, fraction: 0.05}  # declared: a contrast of a variant still improving is not testable
  warn:                        # when the report warns a reader (dashboards/caveats.py)
    chance_fraction: 0.9       # near chance: a loss at or above 0.9 x ln(classes), an accuracy within 10% of the way from 1/classes to 1
    converged_window: 0.2      # the last fraction of training steps the convergence check looks at
    converged_fraction: 0.05   # not converged: val/loss fell by more than 5% (relative) over that window
    param_ratio: 1.5           # compared variants whose parameter counts differ by more than this ratio
    min_seeds: 5               # intervals printed from fewer seeds get a warning
```

A declaration of the layer both running and comparing stand on: it imports no ray, mlflow, optuna or torch; the
study loader validates the section with it before anything runs (``parse_analysis`` then ``check_analysis``), and
the report reads it back from the submission's ``design.json`` (``from_design``; absent: the defaults).
The models of its parts (``Contrasts``, ``Expect``, ``Converged``, ``Warn``) are in record/spec/analysis_parts.py.
"""

from __future__ import annotations

import difflib
import itertools
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from record.spec.analysis_parts import Claim, Contrasts, Converged, Expect, Margin, Warn
from record.spec.decides import EVERY, ITS_OWN, NONE, decides
from record.stats.family import Family, effect_labels, holm_floor, min_p, smallest_exact_n

TESTS = ("permutation", "t")
FAILURE_RULES = ("worst", "exclude", "value")

FIXES = {  # what to do about a bad value, by key (the last part of its location)
    "test": f"use one of: {', '.join(TESTS)}",
    "failure_rule": f"use one of: {', '.join(FAILURE_RULES)}",
    "alpha": "use a level above 0 and at most 0.5, e.g. 0.05",
    "power": "use a power between 0 and 1, e.g. 0.8",
    "margins": "give each metric a positive margin, e.g. {final/val_loss: 0.005} or {final/val_loss: {relative: 0.05}}",
    "detect": "give each metric a positive difference, e.g. {final/val_loss: 0.01}",
    "pairs": "write each contrast as [variant, comparator], or pairs: baseline",
    "main_effects": "write true (every axis) or a list of axes",
    "interactions": "write true (every pair of axes) or a list of [axis, axis]",
    "chance_fraction": "use a fraction between 0 and 1, e.g. 0.9",
    "converged_window": "use a fraction of the training steps between 0 and 1, e.g. 0.2",
    "converged_fraction": "use a relative improvement above 0, e.g. 0.05",
    "param_ratio": "use a ratio above 1, e.g. 1.5",
    "min_seeds": "use a whole number of seeds, at least 2, e.g. 5",
    "warn": "write a mapping of settings, e.g. warn: {param_ratio: 2}",
    "expect": "write a list of {contrast: [variant, comparator], value: -0.21, source: ...}",
    "claims": "write a list of {contrast: [variant, comparator], source: 'a paper, where', sentence: 'its words'}",
    "source": "name the paper and where in it, e.g. 'Vaswani et al. 2017, section 3.2.1'",
    "sentence": "quote the paper's sentence",
    "contrast": "name a contrast of the family: [variant, comparator], or an effect's label",
    "value": "give the expected difference (variant - comparator) in the metric's units, e.g. -0.21",
    "converged": "write a mapping, e.g. converged: {window: 0.2, fraction: 0.05}",
    "window": "use a fraction of the training steps between 0 and 1, e.g. 0.2",
    "fraction": "use a relative fall above 0, e.g. 0.05",
}


class Analysis(BaseModel):
    """How a study's results are compared; every field has a default (docs/statistics.md)."""

    model_config = ConfigDict(extra="forbid")

    test: Literal["permutation", "t"] = Field("permutation", json_schema_extra=decides(EVERY))
    alpha: float = Field(0.05, gt=0, le=0.5, json_schema_extra=decides(EVERY))
    failure_rule: Literal["worst", "exclude", "value"] = Field("worst", json_schema_extra=decides(EVERY))
    failure_values: dict[str, float] = Field(default_factory=dict, json_schema_extra=decides(EVERY))
    never_learned: dict[str, float] = Field(default_factory=dict, json_schema_extra=decides(EVERY))
    # {metric: m} (absolute, in the metric's units) or {metric: {relative: 0.05}} / {metric: {log: 0.05}}
    margins: dict[str, float | Margin] = Field(default_factory=dict, json_schema_extra=decides(EVERY))
    # None: each variant against the baseline
    contrasts: Contrasts | None = Field(None, json_schema_extra=decides(ITS_OWN))
    power: float = Field(0.8, gt=0, lt=1, json_schema_extra=decides(NONE))
    detect: dict[str, float] = Field(default_factory=dict, json_schema_extra=decides(NONE))
    expect: list[Expect] = Field(default_factory=list, json_schema_extra=decides(ITS_OWN))
    # a quotation mapped to its contrast: it moves no verdict, it says which one a sentence is read from
    claims: list[Claim] = Field(default_factory=list, json_schema_extra=decides(NONE))
    # None: not declared (the report still warns, by ``warn``)
    converged: Converged | None = Field(None, json_schema_extra=decides(EVERY))
    warn: Warn = Field(default_factory=Warn, json_schema_extra=decides(NONE))

    @field_validator("margins", mode="before")
    @classmethod
    def _scaled(cls, value: Any) -> Any:
        return {m: Margin.of(m, x) for m, x in value.items()} if isinstance(value, dict) else value

    @field_validator("margins", "detect")
    @classmethod
    def _positive(cls, value: dict[str, Any], info: Any) -> dict[str, Any]:
        for metric, x in value.items():
            if not isinstance(x, Margin) and not x > 0:
                raise ValueError(f"{metric}: must be positive (got {x})")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Analysis:
        if self.failure_rule == "value" and not self.failure_values:
            raise ValueError(
                "failure_rule: value needs failure_values: {metric: value} (the value a failed seed takes)"
            )
        if self.failure_values and self.failure_rule != "value":
            raise ValueError(
                f"failure_values: only used with failure_rule value (got failure_rule {self.failure_rule}); "
                "remove failure_values or set failure_rule: value"
            )
        return self

    def margin(self, metric: str) -> tuple[float, str, str] | None:
        """``metric``'s margin as its test runs it: (the margin, its scale: absolute or log, how it reads), or
        None when none is declared."""
        m = self.margins.get(metric)
        if m is None:
            return None
        if isinstance(m, Margin):
            return m.on_log, "log", m.text
        return float(m), "absolute", f"±{float(m):.3g}"

    @property
    def confidence(self) -> float:
        """The level of every interval: 1 - alpha."""
        return 1.0 - self.alpha

    def family(self, variants: list[str], baseline: str, axes: list[str], is_grid: bool) -> Family:
        """The correction family. Declared: what ``contrasts`` lists (factorial effects only on a grid). The
        default: a grid of two axes or more, its main effects and two-way interactions (the questions a factorial
        design asks); otherwise each variant against the baseline."""
        c = self.contrasts
        if c is None:
            if is_grid and len(axes) >= 2:
                return Family([], list(axes), list(itertools.combinations(axes, 2)), True)
            return Family([(v, baseline) for v in variants if v != baseline], [], [], True)
        pairs = [(v, baseline) for v in variants if v != baseline] if c.pairs == "baseline" else list(c.pairs)
        main = (
            [] if not is_grid or c.main_effects is False else list(axes if c.main_effects is True else c.main_effects)
        )
        inter = c.interactions if is_grid and c.interactions is not False else []
        inter = list(itertools.combinations(axes, 2)) if inter is True else [tuple(p) for p in inter]
        return Family([tuple(p) for p in pairs], main, inter, False)

    def _stuck(self, size: int, seeds: int, tails: int) -> tuple[str, int] | None:
        """Before any run: why the family's tests, each the exact test over ``seeds`` (pairs and factorial effects
        alike: each effect is tested within each seed), cannot go below tails / 2^seeds at Holm's first step
        alpha / size, and the seeds that can; None when they can."""
        if self.test == "t" or seeds < 1:
            return None
        floor = 0.5**seeds if tails == 1 else min_p(seeds)  # the two one-sided tests: 1 / 2^n
        what = "exact test's" if tails == 2 else "exact two one-sided tests'"
        why = holm_floor(seeds, self.alpha, size, floor, what=what)
        return (why, smallest_exact_n(self.alpha / size, tails=tails)) if why else None

    def unshowable_equivalence(self, size: int, seeds: int, metric: str) -> str | None:
        """Before any run: why no contrast of a family of ``size`` can come out equivalent within ``metric``'s
        margin whatever the data (the exact two one-sided tests' smallest p, 1/2^seeds), or None when they can or
        no margin is declared."""
        stuck = self._stuck(size, seeds, 1) if metric in self.margins else None
        if stuck is None:
            return None
        why, need = stuck
        return (
            f"{why} for the family of {size}: none of its contrasts can come out equivalent within "
            f"{Margin.shown(self.margins[metric])} on {metric} whatever the data; use at least {need} seeds (seeds: {need})"
        )

    def unresolvable(self, size: int, seeds: int) -> str | None:
        """Before any run: why no contrast of a family of ``size`` (pairs and factorial effects, each tested by the
        exact test within each seed) can come out different whatever the data, or None when they can."""
        stuck = self._stuck(size, seeds, 2)
        if stuck is None:
            return None
        why, need = stuck
        return (
            f"{why} for the family of {size}: none of its contrasts can come out different whatever the data; use "
            f"at least {need} seeds (seeds: {need})"
            + (" or declare fewer contrasts (analysis.contrasts)" if size > 1 else "")
        )

    def describe_rule(self, metric: str, worst: float | None = None) -> str:
        """The failure rule in words, for a table's caption."""
        if self.failure_rule == "exclude":
            return "exclude (failed seeds are left out of the metric comparison; the success rate is tested apart)"
        if self.failure_rule == "value" and metric in self.failure_values:
            return f"value (a failed seed counts as {metric} = {self.failure_values[metric]:g})"
        shown = "" if worst is None else f" = {worst:.4g}"
        fallback = " (no failure_values entry for this metric)" if self.failure_rule == "value" else ""
        return f"worst{fallback} (a failed seed counts as the worst {metric} any finished cell of the study reached{shown})"


class AnalysisError(ValueError):
    """Bad input in an ``analysis:`` section: ``path`` is the key (("analysis", "contrasts", "pairs", 1)),
    ``message`` what is wrong and the fix; str() joins them ("analysis.contrasts.pairs[1]: ..."). A study loader
    can turn ``path`` into the file's line."""

    def __init__(self, path: tuple[Any, ...], message: str):
        self.path, self.message = tuple(path), message
        self.also: tuple[AnalysisError, ...] = ()  # the section's other mistakes, found in the same pass
        super().__init__(f"{key_text(self.path)}: {message}")


def _carrying(errors: list[AnalysisError]) -> AnalysisError:
    """The first of the mistakes found in one pass, carrying the others (``also``)."""
    errors[0].also = tuple(errors[1:])
    return errors[0]


def key_text(path: tuple[Any, ...]) -> str:
    """("analysis", "contrasts", "pairs", 1) -> "analysis.contrasts.pairs[1]"."""
    out = ""
    for item in path:
        out += f"[{item}]" if isinstance(item, int) else (f".{item}" if out else str(item))
    return out


UNION_MEMBERS = ("list[tuple[str,str]]", "literal['baseline']", "bool", "list[str]", "list[tuple[str, str]]")


def _path(loc: tuple[Any, ...], where: str) -> tuple[Any, ...]:
    # pydantic names the union member it tried; the key is what a person needs
    return (where, *(x for x in loc if x not in UNION_MEMBERS))


def parse_analysis(data: Any, where: str = "analysis") -> Analysis:
    """Validate an ``analysis:`` mapping (None: the defaults). Raises AnalysisError (a ValueError) naming the key
    and the fix."""
    if data is None:
        return Analysis()
    if not isinstance(data, dict):
        raise AnalysisError(
            (where,), f"must be a mapping of settings (got {type(data).__name__}); see docs/statistics.md"
        )
    try:
        return Analysis.model_validate(data)
    except ValidationError as err:
        errors = {}  # one per key (pydantic names a bad value once for each member of a union: the first says it)
        for e in err.errors():
            one = _error(e, where)
            errors.setdefault(one.path, one)
        raise _carrying(list(errors.values())) from None


def _error(e: dict[str, Any], where: str) -> AnalysisError:
    """One of pydantic's errors as the key and the fix."""
    path = _path(tuple(e["loc"]), where)
    key = next((str(x) for x in reversed(e["loc"]) if isinstance(x, str) and x in FIXES), "")
    if e["type"] == "extra_forbidden":
        parent = next((x for x in reversed(e["loc"][:-1]) if isinstance(x, str)), "")
        parts = {"contrasts": Contrasts, "warn": Warn, "expect": Expect, "claims": Claim, "converged": Converged}
        model = parts.get(parent, Analysis)
        valid = ", ".join(model.model_fields)
        close = difflib.get_close_matches(str(e["loc"][-1]), list(model.model_fields), 1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        return AnalysisError(path, f"unknown key; {hint}valid keys: {valid}")
    msg = re.sub(r"Input should be a valid dictionary( or instance of \w+)?", "must be a mapping", e["msg"])
    msg = msg.removeprefix("Value error, ")
    if not e["loc"] and ": " in msg:  # a check across keys names its key first
        head, msg = msg.split(": ", 1)
        path = (where, head)
    shown = "input" in e and not isinstance(e["input"], dict) and "(got" not in msg
    got = f" (got {e['input']!r})" if shown else ""
    fix = f"; fix: {FIXES[key]}" if key in FIXES and "fix" not in msg and ";" not in msg else ""
    return AnalysisError(path, f"{msg}{got}{fix}")


PLURAL = {
    "a variant": "variants",
    "an axis": "axes",
    "a metric": "metrics",
    "a contrast of the family": "its contrasts",
}


def _unknown(what: str, name: str, known: list[str] | set[str], path: tuple[Any, ...], fix: str) -> AnalysisError:
    known = sorted(known) if isinstance(known, set) else list(known)
    close = difflib.get_close_matches(name, known, 1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return AnalysisError(path, f"{name!r} is not {what}{hint}; {PLURAL[what]}: {', '.join(known)}; fix: {fix}")


def check_analysis(
    analysis: Analysis,
    variants: list[str],
    axes: list[str],
    metrics: set[str] | None = None,
    *,
    kind: str | None = None,
    levels: dict[str, list[str]] | None = None,
    where: str = "analysis",
) -> None:
    """Refuse an analysis that names what the study does not have, before anything runs.

    ``variants``: the study's variant names (the baseline first); ``axes``: its design's axes; ``metrics``: the
    metrics its runs log, when known (None: metric names are not checked); ``kind``: the design's kind (grid,
    one_at_a_time, variants), when known: main effects and interactions need a full grid; ``levels``: each axis's
    levels as the report spells them, when known (an expectation on a factorial effect names one of its labels).
    Raises AnalysisError (a ValueError) with the key, what is valid and the fix: the first, carrying every other
    (``also``).
    """
    problems = list(_problems(analysis, variants, axes, metrics, kind, where))
    problems += _named_problems(analysis, variants, axes, metrics, kind, levels, where)
    if problems:
        raise _carrying(problems)


def _named_problems(
    analysis: Analysis,
    variants: list[str],
    axes: list[str],
    metrics: set[str] | None,
    kind: str | None,
    levels: dict[str, list[str]] | None,
    where: str,
) -> list[AnalysisError]:
    """Every expectation and claim that names no contrast of the family, or a metric the runs do not log."""
    if not (analysis.expect or analysis.claims) or not variants:
        return []
    family = analysis.family(variants, variants[0], axes, kind == "grid")
    names = [f"{a} vs {b}" for a, b in family.pairs]
    if levels is not None and all(a in levels for a in axes):
        names += effect_labels(levels, family.main, family.interactions)
    out = []
    for key, each in (("expect", analysis.expect), ("claims", analysis.claims)):
        for i, e in enumerate(each):
            if e.name not in names and (isinstance(e.contrast, tuple) or levels is not None):
                at = (where, key, i, "contrast")
                out.append(_unknown("a contrast of the family", e.name, names, at, FIXES["contrast"]))
            if e.metric is not None and metrics is not None and e.metric not in metrics:
                at = (where, key, i, "metric")
                out.append(_unknown("a metric", e.metric, set(metrics), at, "name a summary metric"))
    return out


def _problems(
    analysis: Analysis, variants: list[str], axes: list[str], metrics: set[str] | None, kind: str | None, where: str
):
    """Every name the analysis gives that the study does not have (``check_analysis``)."""
    c = analysis.contrasts
    if c is not None and isinstance(c.pairs, list):
        seen: dict[frozenset[str], int] = {}
        for i, pair in enumerate(c.pairs):
            key = (where, "contrasts", "pairs", i)
            for name in pair:
                if name not in variants:
                    yield _unknown(
                        "a variant", name, variants, key, "use the variant names of `ablate sweep --dry-run`"
                    )
            if pair[0] == pair[1]:
                yield AnalysisError(key, f"compares {pair[0]!r} with itself; name two different variants")
            both = frozenset(pair)
            if both in seen:
                yield AnalysisError(
                    key, f"the same contrast as pairs[{seen[both]}] ({' vs '.join(pair)}); list each contrast once"
                )
            seen[both] = i
    if c is not None and (c.main_effects or c.interactions):
        if kind is not None and kind != "grid":
            yield AnalysisError(
                (where, "contrasts"),
                f"main effects and interactions need a full grid (design.grid), and this study's design is {kind!r}; "
                "declare pairs instead",
            )
        elif not axes:
            yield AnalysisError((where, "contrasts"), "main effects and interactions need a grid's axes; declare pairs")
        else:
            yield from _grid_problems(c, axes, where)
    if metrics is not None:
        for key in ("margins", "detect", "never_learned", "failure_values"):
            for metric in getattr(analysis, key):
                if metric not in metrics:
                    yield _unknown(
                        "a metric", metric, set(metrics), (where, key, metric), "name a summary metric the runs log"
                    )


def _grid_problems(c: Contrasts, axes: list[str], where: str):
    """The main effects and interactions that name what the grid does not have."""
    if isinstance(c.main_effects, list):
        for i, axis in enumerate(c.main_effects):
            if axis not in axes:
                yield _unknown(
                    "an axis", axis, axes, (where, "contrasts", "main_effects", i), "name an axis of the grid"
                )
    if isinstance(c.interactions, list):
        for i, pair in enumerate(c.interactions):
            key = (where, "contrasts", "interactions", i)
            for axis in pair:
                if axis not in axes:
                    yield _unknown("an axis", axis, axes, key, "name two axes of the grid")
            if pair[0] == pair[1]:
                yield AnalysisError(key, f"an interaction needs two different axes (got {pair[0]!r} twice)")
    if c.interactions and len(axes) < 2:
        yield AnalysisError((where, "contrasts", "interactions"), "the grid has one axis; interactions need two")


def from_design(design: dict[str, Any]) -> Analysis:
    """The analysis a submission recorded in its design.json (absent in older studies: the defaults)."""
    try:
        return parse_analysis(design.get("analysis"), "design.json: analysis")
    except AnalysisError as err:
        raise AnalysisError(
            err.path, f"{err.message} (the study's recorded design; fix the study file and submit it again)"
        ) from None


__all__ = [
    "Analysis",
    "AnalysisError",
    "Contrasts",
    "Converged",
    "Expect",
    "Family",
    "Warn",
    "check_analysis",
    "from_design",
    "parse_analysis",
]
