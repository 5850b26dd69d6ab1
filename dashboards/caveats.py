"""What could mislead a reader of an ablation table, said beside it (issue 21): variants near chance or not yet
converged, compared variants whose parameter counts differ by more than a stated ratio, intervals printed from
fewer seeds than they need, a family its seeds cannot resolve; and the rule for bold: a variant is marked best
only when the family's tests show it better than every other variant.

The thresholds are the study's ``analysis.warn`` settings (record/spec/analysis.py); docs/statistics.md explains
each check. Nothing here reads MLflow: dashboards/table.py hands over the values, curves and parameter counts.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from models import plugins
from record import stats
from record.spec.analysis_parts import Warn
from record.spec.equivalence import coinciding_pairs, coinciding_sentence, equivalent_pairs, sentence
from record.spec.metrics import chance_kind, chance_share
from record.testable import Falls


@dataclass(frozen=True)
class Caveat:
    """One warning: ``kind`` chance | convergence | params | seeds | resolution | family | self_states;
    ``variants``: those it names; ``contrasts``: the labels of the contrasts it concerns (empty: every contrast of
    the table)."""

    kind: str
    text: str
    variants: tuple[str, ...] = ()
    contrasts: tuple[str, ...] = ()

    def concerns(self, label: str) -> bool:
        return not self.contrasts or label in self.contrasts


# --- warnings of one's own (plugins) ---------------------------------------------------------------------------


@dataclass(frozen=True)
class TableView:
    """What a warning of one's own reads of a table: each variant's (mean, seeds), its contrasts
    (``record.stats.Contrast``: ``label``, ``a``, ``b``, ``estimate``, ``p_adj``, ...), each variant's model fields as
    MLflow holds them (text), every cell's row (a pandas DataFrame: variant, seed, outcome, value and the runs'
    params), and the metric compared."""

    means: dict[str, tuple[float, int]]
    contrasts: tuple
    models: dict[str, dict[str, str]]
    cells: Any
    metric: str


class WarningRegistry(dict):
    """name -> ``check(view: TableView) -> Caveat | str | None``: a researcher's own warning, said in every report
    beside the built-in ones (its kind is its name). ``@WARNINGS.register("name")`` adds one (models.plugins)."""

    def register(self, name: str):
        if not isinstance(name, str) or not name:
            raise ValueError(f"a warning needs a non-empty string name (got {name!r})")

        def bind(check):
            if name in self and self[name] is not check:
                raise ValueError(f"warning {name!r} is already registered ({self[name]!r}); pick another name")
            self[name] = check
            return check

        return bind

    def unregister(self, name: str) -> None:
        self.pop(name, None)


WARNINGS = WarningRegistry()
plugins.track("warning", WARNINGS)  # what a plugin registers here is counted as its own


def own_warnings(view: TableView) -> list[Caveat]:
    """Every registered warning's say on the table; one that raises is reported as such, not hidden."""
    out = []
    for name, check in WARNINGS.items():
        try:
            said = check(view)
        except Exception as err:  # a researcher's code: its failure is said, the report goes on
            said = f"the warning {name!r} failed: {type(err).__name__}: {err}"
        if isinstance(said, str):
            said = Caveat(kind=name, text=said)
        if said is not None:
            out.append(said)
    return out


# --- near chance ----------------------------------------------------------------------------------------------


def _chance_words(value: float, kind: str, classes: int, metric: str) -> str:
    if kind == "loss":
        return f"{value:.3g}, {chance_share(value, kind, classes):.0%} of ln {classes} = {math.log(classes):.3g}"
    if kind == "ppl":
        return f"{value:.3g}, against {classes} for a uniform guess"
    if metric.endswith("exact_match"):  # every token of a sequence right: a uniform guess gets 1/C^length
        return f"{value:.3g}, where a uniform guess gets at most 1/{classes} = {1 / classes:.2g}"
    return f"{value:.3g}, against 1/{classes} = {1 / classes:.2g} for a uniform guess"


def near_chance(
    means: dict[str, tuple[float, int]], classes: dict[str, int | None], metric: str, warn: Warn
) -> Caveat | None:
    """``means``: variant -> (mean of the metric over its successful seeds, seeds); ``classes``: variant -> the
    classes its loss is over (None: unknown). A caveat naming every variant whose mean sits at or beyond
    ``warn.chance_fraction`` of the way from perfect to a uniform guess."""
    kind = chance_kind(metric)
    if kind is None:
        return None
    judged, near, names = [], [], []
    for variant, (value, n) in means.items():
        c = classes.get(variant)
        if c is None or n < 1 or not math.isfinite(value):
            continue
        judged.append(variant)
        if chance_share(value, kind, c) >= warn.chance_fraction:
            near.append(f"{variant} {_chance_words(value, kind, c, metric)}")
            names.append(variant)
    if not near:
        return None
    rule = f"warn.chance_fraction {warn.chance_fraction:g}"
    if len(near) == len(judged) and len(judged) > 1:
        text = (
            f"every variant is near chance on {metric} ({'; '.join(near)}; {rule}): the table compares models "
            "that have barely learned the task, and its differences say little about the change"
        )
    else:
        it = "these variants have" if len(near) > 1 else "it has"
        text = (
            f"near chance on {metric}: {'; '.join(near)} ({rule}): {it} barely learned the task, and a difference "
            "from a variant near chance may only say which one started learning first"
        )
    return Caveat("chance", text, tuple(names))


# --- convergence -------------------------------------------------------------------------------------------------


def recent_ends(points: Sequence[tuple], window: float) -> tuple[float, float] | None:
    """A lower-is-better curve ``[(step, value, ...)]`` at the start of the last ``window`` of its steps (step
    end × (1 − window), linearly interpolated between the points around it) and at its last point. None when the
    curve has no point at or before the window's start (one validation only, say)."""
    pts = sorted((int(p[0]), float(p[1])) for p in points if math.isfinite(float(p[1])))
    if len(pts) < 2:
        return None
    steps, values = (np.array(x, dtype=float) for x in zip(*pts))
    start = steps[-1] * (1 - window)
    if steps[0] > start or steps[-1] <= start:
        return None
    return float(np.interp(start, steps, values)), float(values[-1])


def trend_ends(points: Sequence[tuple], window: float) -> tuple[float, float] | None:
    """The same for a noisy curve (the training loss, logged often): a least-squares line through the points in
    the window, at the window's start and at its last step. None with fewer than three."""
    pts = sorted((int(p[0]), float(p[1])) for p in points if math.isfinite(float(p[1])))
    if len(pts) < 3:
        return None
    start = pts[-1][0] * (1 - window)
    inside = [(s, v) for s, v in pts if s >= start]
    if len(inside) < 3 or len({s for s, _ in inside}) < 2:
        return None
    x, y = (np.array(a, dtype=float) for a in zip(*inside))
    slope, intercept = np.polyfit(x, y, 1)
    return float(slope * start + intercept), float(slope * x[-1] + intercept)


def not_converged(
    falls: Falls, curve: dict[str, str], warn: Warn, unjudged: Iterable[str] = ()
) -> tuple[Caveat | None, str | None]:
    """``falls``: each judged seed's curve over the window, per variant; ``curve``: variant -> the curve judged
    (val/loss, or train/loss where validation was too sparse). (a caveat naming each variant whose mean relative
    fall is above ``warn.converged_fraction`` and larger than its seeds' spread of the final loss, a note naming
    the variants no curve could judge). A loss near its floor falls by large fractions of a tiny value while
    moving less than its seeds differ: that does not warn."""
    still = []
    for variant, fs in falls.relative.items():
        if fs and float(np.mean(fs)) > warn.converged_fraction and not falls.settled(variant):
            seeds = f"mean of {len(fs)} seeds, at most {max(fs):.0%}" if len(fs) > 1 else "one seed"
            still.append((variant, f"{variant}: {curve[variant]} fell {float(np.mean(fs)):.0%} ({seeds})"))
    unjudged = [v for v in unjudged if not falls.relative.get(v)]
    note = None
    if unjudged:
        note = (
            f"not checked for convergence: {', '.join(unjudged)} (no val/loss or train/loss curve reaches back "
            f"to the last {warn.converged_window:.0%} of its steps)"
        )
    if not still:
        return None, note
    every = len(still) == len([v for v, fs in falls.relative.items() if fs]) and len(still) > 1
    who = "every variant was" if every else "these variants were"
    text = (
        f"not converged: {who} still improving over the last {warn.converged_window:.0%} of training steps "
        f"({'; '.join(w for _, w in still)}; warn.converged_fraction {warn.converged_fraction:g}): their "
        "final values would still change with more steps, and so might the comparison"
    )
    return Caveat("convergence", text, tuple(v for v, _ in still)), note


# --- parameter counts ----------------------------------------------------------------------------------------


def param_ratio(compared: Iterable[tuple[str, str, str, float, float]], warn: Warn) -> Caveat | None:
    """``compared``: (contrast label, name a, name b, parameters of a, of b) for each contrast the table shows.
    A caveat naming each one whose counts differ by more than ``warn.param_ratio``."""
    over, labels, names = [], [], []
    for label, a, b, pa, pb in compared:
        if not (math.isfinite(pa) and math.isfinite(pb)) or min(pa, pb) <= 0:
            continue
        big, small = (a, b) if pa >= pb else (b, a)
        r = max(pa, pb) / min(pa, pb)
        if r > warn.param_ratio:
            over.append(f"{big} has {r:.3g}x the parameters of {small} ({max(pa, pb):,.0f} vs {min(pa, pb):,.0f})")
            labels.append(label)
            names += [a, b]
    if not over:
        return None
    text = (
        f"parameter counts differ by more than {warn.param_ratio:g}x between compared variants: {'; '.join(over)} "
        "(warn.param_ratio): a difference between them may come from their size as much as from what changed"
    )
    return Caveat("params", text, tuple(dict.fromkeys(names)), tuple(labels))


# --- seeds -------------------------------------------------------------------------------------------------------


def few_seeds(intervals: Iterable[tuple[str, tuple[str, ...], int]], warn: Warn, test: str) -> Caveat | None:
    """``intervals``: (what, the variants it belongs to, seeds) for every interval the table prints (a variant's
    ± or a contrast's [CI]). A caveat when any rests on fewer than ``warn.min_seeds`` seeds: a t interval
    assumes normal values, which so few cannot check (docs/statistics.md measures the under-coverage)."""
    shown = list(intervals)
    few = [(what, vs, n) for what, vs, n in shown if n < warn.min_seeds]
    if not few:
        return None
    counts = " or ".join(str(n) for n in sorted({n for _, _, n in few}))
    who = (
        "every interval printed rests"
        if len(few) == len(shown)
        else "the intervals of " + ", ".join(w for w, _, _ in few) + " rest"
    )
    also = "; so do the paired t-test's p-values" if test == "t" else ""
    text = (
        f"few seeds for the intervals printed: {who} on {counts} seeds (warn.min_seeds {warn.min_seeds}); a t "
        "interval assumes normal values, which so few seeds cannot check, and under skewed values it under-covers "
        f"(a nominal 95% t interval covered 85% of log-normal differences at 3 seeds, docs/statistics.md){also}; "
        "read the ± and [CI] as rough"
    )
    names = tuple(dict.fromkeys(v for _, vs, _ in few for v in vs))
    labels = tuple(w for w, vs, _ in few if " vs " in w)
    return Caveat("seeds", text, names, labels)


def _stuck(
    family: Sequence[stats.Contrast], floors: list[float], alpha: float, what: str = "exact test's", tails: int = 2
) -> tuple[tuple[stats.Contrast, ...], str, int]:
    """The testable contrasts that cannot pass whatever the data (their floor above the best step Holm can give
    them), why (said for those with the most seeds, the highest floor), and the seeds that can."""
    steps = stats.holm_best_steps(floors, alpha)
    stuck = [(c, f, st) for c, f, st in zip(family, floors, steps) if c.testable and f > st]
    if not stuck:
        return (), "", 0
    n = max(c.n for c, _, _ in stuck)
    _, floor, step = max((x for x in stuck if x[0].n == n), key=lambda x: x[1])
    why = stats.holm_floor(n, alpha, len(family), floor, step=step, what=what) or ""
    return tuple(c for c, _, _ in stuck), why, stats.smallest_exact_n(step, tails=tails)


def unresolvable(family: Sequence[stats.Contrast], alpha: float, test: str) -> Caveat | None:
    """A caveat when contrasts of the family cannot come out different whatever the data: their smallest
    attainable p (the exact test's 2/2^n, for pairs and factorial effects alike) is above the largest step Holm can
    give them (``stats.holm_best_steps``: alpha / family size, raised where other tests with more seeds can be
    rejected first). Every testable one (nothing can be resolved), or some of them: those are named."""
    testable = [c for c in family if c.testable]
    if test == "t" or not testable:
        return None
    floors = [(c.min_p if math.isfinite(c.min_p) else 0.0) if c.testable else 1.0 for c in family]
    stuck, why, need = _stuck(family, floors, alpha)
    if not stuck:
        return None
    if len(stuck) == len(testable):
        text = (
            f"too few seeds to resolve anything: {why}, so no contrast of the family can come out different "
            f"whatever the data ({need} seeds can); its 'not resolved' says nothing about the size of a difference"
        )
        return Caveat("resolution", text)
    labels = tuple(c.label for c in stuck)
    text = (
        f"too few seeds for some contrasts: {why}, so {', '.join(labels)} cannot come out different whatever "
        f"the data ({need} seeds can, or a smaller family); their 'not resolved' says nothing about the size of a "
        "difference"
    )
    return Caveat("resolution", text, contrasts=labels)


def unshowable_equivalence(family: Sequence[stats.Contrast], alpha: float, test: str) -> Caveat | None:
    """A caveat when contrasts with a declared margin cannot come out equivalent whatever the data: the exact
    form of the two one-sided tests (sign-flip tests of d + m and d - m) cannot go below 1/2^n over n seeds, above
    the largest step Holm over the contrasts with a margin can give them (as ``correct`` corrects: every one in
    the family, an untestable one at p 1). Those contrasts are named."""
    margined = [c for c in family if c.margin is not None]
    if test == "t" or not any(c.testable for c in margined):
        return None
    floors = [(0.5**c.n if c.min_p > 0 else 0.0) if c.testable else 1.0 for c in margined]
    stuck, why, need = _stuck(margined, floors, alpha, "exact two one-sided tests'", tails=1)
    if not stuck:
        return None
    labels = tuple(c.label for c in stuck)
    text = (
        f"too few seeds to show equivalence (Holm over the contrasts with a margin): {why}, so {', '.join(labels)} cannot "
        f"come out equivalent whatever the data ({need} seeds can); their 'not resolved' says nothing about whether "
        "they are equivalent"
    )
    return Caveat("resolution", text, contrasts=labels)


# --- one model family under two names ------------------------------------------------------------------------


def same_family(models: dict[str, dict[str, str]]) -> Caveat | None:
    """``models``: variant -> its model's fields (a cell's ``params.model.*``). A caveat naming the pairs of
    variants that compare one model family under two names (``record.spec.equivalence``: Luong's general
    against dot over projected q and k), as the dry run and the sweep said before the runs."""
    pairs = equivalent_pairs(models)
    if not pairs:
        return None
    text = "; ".join(sentence(a, b, other) for a, b, other in pairs)
    labels = tuple(f"{a} vs {b}" for a, b, _ in pairs) + tuple(f"{b} vs {a}" for a, b, _ in pairs)
    return Caveat("family", text, tuple(dict.fromkeys(v for a, b, _ in pairs for v in (a, b))), labels)


def coinciding_scores(models: dict[str, dict[str, str]]) -> Caveat | None:
    """``models``: variant -> its model's fields (a cell's ``params.model.*``). A caveat naming the variants that
    compare scores in self-attention over the states themselves (``record.spec.equivalence``), where q and k are
    one tensor and a token scores itself |x|^2, as the dry run and the sweep said before the runs."""
    pairs = coinciding_pairs(models)
    if not pairs:
        return None
    labels = tuple(f"{a} vs {b}" for a, b in pairs) + tuple(f"{b} vs {a}" for a, b in pairs)
    return Caveat("self_states", coinciding_sentence(pairs), tuple(dict.fromkeys(v for p in pairs for v in p)), labels)


# --- best ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Best:
    """The variant marked best (None: none is established), the one with the best mean, and why not: the other
    variant it is not shown better than and that contrast's verdict (or "no test in the family")."""

    variant: str | None
    leader: str | None
    against: str = ""
    why: str = ""


def best_variant(means: dict[str, float], family: Sequence[stats.Contrast], direction: str) -> Best:
    """The best mean (failed seeds counted under the rule) is marked only when, for every other variant, a
    contrast of the family between the two is "different" in the leader's favour (Holm-corrected)."""
    finite = {v: m for v, m in means.items() if math.isfinite(m)}
    if len(means) < 2 or not finite:
        return Best(None, None, why="one variant")
    pick = max if direction == "maximize" else min
    top = pick(finite.values())
    leaders = [v for v, m in finite.items() if m == top]
    leader = leaders[0]
    if len(leaders) > 1:
        return Best(None, leader, leaders[1], "the same mean")
    for other in means:
        if other == leader:
            continue
        c = next((c for c in family if c.kind == "pair" and {c.a, c.b} == {leader, other}), None)
        if c is None:
            return Best(None, leader, other, "no test of the pair in the family")
        wanted = "different (better)" if c.a == leader else "different (worse)"
        if not c.verdict.startswith(wanted):
            return Best(None, leader, other, c.verdict)
    return Best(leader, leader)


__all__ = [
    "Best",
    "Caveat",
    "best_variant",
    "coinciding_scores",
    "few_seeds",
    "near_chance",
    "not_converged",
    "param_ratio",
    "same_family",
    "recent_ends",
    "trend_ends",
    "unresolvable",
    "unshowable_equivalence",
]
