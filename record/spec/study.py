"""Study files: a base run, a design over its keys, seeds, the metric that decides, resources and budget.

```yaml
name: norm_placement
description: Pre-LN against Post-LN, with and without warm-up.
base: ../runs/quickstart.yaml          # a run file (relative to this file), or the run inline
design:
  grid:                                # full factorial over the axes
    model.norm: [pre, post]
    training.warmup_steps: [0, 100]
  # one_at_a_time: {baseline: {model.norm: pre}, axes: {model.norm: [post], model.positions: [learned]}}
  # variants: [{name: pre, set: {model.norm: pre}}, {name: post, set: {model.norm: post}}]
seeds: 3                               # or a list: [0, 1, 2]
metric: final/val_loss                 # a summary metric of the runs
direction: minimize                    # optional: every metric the runs log knows its own (loss: minimize)
constraints:                           # skip (or refuse) cells, with the reason
  - skip: {model.norm: post, training.warmup_steps: 0}
    reason: Post-LN without warm-up is known to diverge here
skip_invalid: false                    # true: cells the model refuses are skipped with its reason
resources: {cpus: 1, gpus: 0, workers: 1}   # per trial; fractions of GPUs pack cells onto one (gpus: 0.125: 8 per GPU,
                                       # memory checked: gpu_memory_gb or the GPU's own); workers > 1: DDP
max_concurrent: 2                      # trials at once (default: as many as the resources allow)
budget: {steps: 400}                   # per trial: steps and/or time (seconds)
retries: 1                             # an exception is retried this often, then recorded as failed
max_cells: 500                         # refuse larger studies (a typo in a grid can mean 10,000 runs)
```

The file's structure is the pydantic model ``StudyFile``. Each cell (variant x seed) is a fully resolved
RunConfig with a stable id: the hash of the result-affecting configuration and the seed. The same
configuration in two variants is one cell; adding a seed or an axis value adds only the new cells.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from record.spec.analysis import Analysis, AnalysisError, check_analysis, parse_analysis
from record.spec.cells import Cell, Cells, Skipped
from record.spec.common import (
    Budget,
    Origin,
    Resources,
    Strict,
    check_axes,
    check_name,
    validate,
)
from record.spec.decides import BY_ITS_FIELDS, EVERY, NONE, decides
from record.spec.errors import SpecError, found
from record.spec.metrics import better, direction_problem, in_order, logged_metrics, variant_metrics
from record.spec.run import axis_keys, load_base, read_document, structure_errors
from record.spec.seedplan import SeedPlan
from record.spec.tuning import Tune, Tuning, parse_tune, tune_errors
from record.spec.variants import DESIGNS, FIX, Design, expand
from record.stats.family import smallest_exact_n


class Constraint(Strict):
    skip: dict[str, Any] | None = None
    refuse: dict[str, Any] | None = None
    reason: str = Field(min_length=1)

    @model_validator(mode="after")
    def _one(self) -> Constraint:
        if (self.skip is None) == (self.refuse is None):
            raise ValueError("needs one of skip or refuse (a mapping of axis values), and a reason")
        return self

    @property
    def action(self) -> str:
        return "skip" if self.skip is not None else "refuse"

    @property
    def when(self) -> dict[str, Any]:
        return self.skip if self.skip is not None else self.refuse


class StudyFile(Strict):
    """A study file as written; each field says whether it decides verdicts (``record.spec.decides``)."""

    name: str = Field(json_schema_extra=decides(NONE))
    description: str = Field("", json_schema_extra=decides(NONE))
    # a researcher's own components (models.plugins), loaded first; their code enters each cell's identity
    plugins: list[str] = Field(default_factory=list, json_schema_extra=decides(NONE))
    base: str | dict[str, Any] = Field(json_schema_extra=decides(EVERY))
    design: Design = Field(json_schema_extra=decides(EVERY))
    # a count (3), a list ([0, 1, 2]) or a plan ({first, batch, max}): seeds, or a SeedPlan, once validated
    seeds: list[int] | SeedPlan = Field(1, validate_default=True, json_schema_extra=decides(EVERY))
    metric: str = Field("final/val_loss", json_schema_extra=decides(EVERY))
    # None: the metric's own (record.spec.metrics.better)
    direction: Literal["minimize", "maximize"] | None = Field(None, json_schema_extra=decides(EVERY))
    constraints: list[Constraint] = Field(default_factory=list, json_schema_extra=decides(EVERY))
    skip_invalid: bool = Field(False, json_schema_extra=decides(EVERY))
    resources: Resources = Field(Resources(), json_schema_extra=decides(NONE))
    max_concurrent: int | None = Field(None, ge=1, json_schema_extra=decides(NONE))
    budget: Budget = Field(Budget(), json_schema_extra=decides(EVERY))
    retries: int = Field(1, ge=0, json_schema_extra=decides(NONE))
    max_cells: int = Field(1000, ge=1, json_schema_extra=decides(NONE))
    # a search per variant before the cells (record/spec/search.py)
    tune: dict[str, Any] | None = Field(None, json_schema_extra=decides(EVERY))
    # how the results are compared (record/spec/analysis.py), parsed there with its own messages
    analysis: dict[str, Any] | None = Field(None, json_schema_extra=decides(BY_ITS_FIELDS))
    # true: each seed also regenerates the task's data (task.data_seed = seed)
    vary_data: bool = Field(False, json_schema_extra=decides(EVERY))
    # any_code: results of other code count as done
    reuse_results: Literal["same_code", "any_code"] = Field("same_code", json_schema_extra=decides(EVERY))
    # why this submission's declaration differs from the registered one (ablations.register)
    amend: str | None = Field(None, json_schema_extra=decides(NONE))

    @field_validator("name")
    @classmethod
    def _name(cls, v):
        return check_name(v, "it names the MLflow experiment")

    @field_validator("seeds", mode="before")
    @classmethod
    def _seeds(cls, v):
        if isinstance(v, dict):  # a seed plan (record/spec/seedplan.py)
            try:
                return SeedPlan.model_validate(v)
            except ValidationError as err:
                first = err.errors()[0]
                where = ".".join(str(x) for x in first["loc"])
                msg = first["msg"].removeprefix("Value error, ")
                keys = ", ".join(SeedPlan.model_fields)
                raise ValueError(f"a seed plan's {where or 'keys'}: {msg} (a plan holds {keys})") from None
        if isinstance(v, int) and not isinstance(v, bool) and v > 10_000:  # list(range(v)) would not fit in memory
            raise ValueError(f"{v} seeds are more than a study runs: give at most 10,000")
        if isinstance(v, int) and not isinstance(v, bool) and v >= 1:
            return list(range(v))
        if isinstance(v, list) and v and all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in v):
            if len(set(v)) != len(v):
                raise ValueError(f"{v} repeats a seed")
            return list(v)
        raise ValueError(
            f"{v!r} must be a count (3), a list of non-negative integers ([0, 1, 2]) or a seed plan "
            "({first: 8, batch: 2, max: 16})"
        )

    @field_validator("metric")
    @classmethod
    def _metric(cls, v):
        if "/" not in v:
            raise ValueError(f"{v!r} must name a summary metric such as final/val_loss or test/exact_match")
        return v


STUDY_KEYS = tuple(StudyFile.model_fields)


@dataclass(kw_only=True)
class Study:
    name: str
    description: str
    source: str
    design: str
    axes: list[str]
    cells: list[Cell]
    skipped: list[Skipped]
    metric: str
    direction: str
    resources: Resources
    max_concurrent: int | None
    retries: int
    budget: Budget
    tune: Tune | None = None  # a search per variant before the cells (ablations/search/tuned.py)
    analysis: Analysis = field(default_factory=Analysis)  # how the results are compared (record/spec/analysis.py)
    vary_data: bool = False
    reuse_any_code: bool = False  # results trained by other code (another code fingerprint) count as done
    tuning: Tuning | None = None  # a tuned study: the tuning seed, each chosen value's place in its range
    metrics: list[str] = field(default_factory=list)  # the summary metrics every variant's runs log
    amend: str | None = None  # the file's reason for an amendment of its registered declaration
    plan: SeedPlan | None = None  # seeds added in batches where a contrast is open (record/spec/seedplan.py)

    @property
    def variants(self) -> list[str]:
        return list(dict.fromkeys(c.variant for c in self.cells))

    @property
    def seeds(self) -> list[int]:
        return sorted({c.seed for c in self.cells})


def _design_keys(data: dict[str, Any]) -> list[tuple[tuple, Any]]:
    """(where in the file, key) of every key the design and the constraints set, read from the file as it is, so
    that they are judged even when other parts of the design are wrong (their mistakes are named beside these)."""

    def keys(path: tuple, value: Any) -> list[tuple[tuple, Any]]:
        return [((*path, k), k) for k in value] if isinstance(value, dict) else []

    design = data.get("design") if isinstance(data.get("design"), dict) else {}
    out = keys(("design", "grid"), design.get("grid"))
    one = design.get("one_at_a_time") if isinstance(design.get("one_at_a_time"), dict) else {}
    out += [k for part in ("baseline", "axes") for k in keys(("design", "one_at_a_time", part), one.get(part))]
    variants = design.get("variants") if isinstance(design.get("variants"), list) else []
    for i, item in enumerate(variants):
        out += keys(("design", "variants", i, "set"), item.get("set")) if isinstance(item, dict) else []
    constraints = data.get("constraints") if isinstance(data.get("constraints"), list) else []
    for i, item in enumerate(constraints):
        for action in ("skip", "refuse"):
            out += keys(("constraints", i, action), item.get(action)) if isinstance(item, dict) else []
    return out


def load_study(path: str | Path, *, seeds: list[int] | None = None) -> Study:
    """Read and check a study file and expand it into cells. Raises SpecError before anything starts."""
    path = Path(path)
    parsed = _read(path)
    file, origin = parsed.file, parsed.origin
    axes, variants = expand(file.design)
    plan = file.seeds if isinstance(file.seeds, SeedPlan) and seeds is None else None
    seed_list = seeds if seeds is not None else list(range(plan.max)) if plan else file.seeds
    total = len(variants) * len(seed_list)
    if total > file.max_cells:
        raise origin.error(
            ("design",),
            f"expands to {total} cells ({len(variants)} variants x {len(seed_list)} seeds), "
            f"more than max_cells={file.max_cells}; shrink the design or raise max_cells",
        )
    cells = Cells(parsed.file, parsed.origin, parsed.base, parsed.base_origin)
    for label, settings, where in variants:
        cells.add_variant(label, settings, where, seed_list)
    if not cells.cells and not cells.invalid:
        reasons = list(dict.fromkeys(f"{k.variant}: {k.reason}" for k in cells.skipped))  # why, not only that
        shown = "; ".join(reasons[:3]) + ("; ..." if len(reasons) > 3 else "")
        raise origin.error(("design",), f"leaves no cell to run: every cell is skipped ({shown})")
    labels = list(dict.fromkeys(label for label, _, _ in variants if label in cells.named | cells.labels))
    tune, analysis, metrics, direction = _second_pass(parsed, cells, labels, axes)
    return Study(
        name=file.name,
        description=file.description,
        source=str(path),
        design=file.design.kind,
        axes=axes,
        cells=cells.cells,
        skipped=cells.skipped,
        metric=file.metric,
        direction=direction,
        resources=file.resources,
        max_concurrent=file.max_concurrent,
        retries=file.retries,
        budget=file.budget,
        tune=tune,
        analysis=analysis,
        vary_data=file.vary_data,
        reuse_any_code=file.reuse_results == "any_code",
        metrics=in_order(metrics or ()),
        amend=file.amend,
        plan=plan,
    )


@dataclass
class _Parsed:
    """A study file whose structure has been checked: the file, its base (the run every cell starts from)."""

    origin: Origin
    data: dict[str, Any]
    file: StudyFile
    base: dict[str, Any]
    base_origin: Origin
    analysis: Analysis  # its structure checked; the names it gives are checked once the cells are known


def _read(path: Path) -> _Parsed:
    """The file's structure, every mistake at once: keys, values, axes, the analysis, the tune, the base's."""
    doc = read_document(path, ("name", "base", "design", "seeds", "metric", "..."))
    origin = Origin(str(path), doc)
    data = doc.data
    errors: list[SpecError] = []
    base, base_origin, has_base = {}, origin, False  # without a base, pydantic names it; no axis can be judged
    if "base" in data:
        try:
            base, base_origin = load_base(origin, data["base"], path.parent)
            base.pop("name", None)
            has_base = True
        except SpecError as err:
            errors += err.every()
    valid = axis_keys(base) if has_base else []
    study_keys = list(STUDY_KEYS) + [f"design.{k}" for k in DESIGNS] + [f"budget.{k}" for k in Budget.model_fields]
    study_keys += [f"resources.{k}" for k in Resources.model_fields]
    file = None
    try:
        file = validate(StudyFile, data, origin, study_keys + valid)
    except SpecError as err:  # a base that load_base refused is said once, by load_base
        refused_base = "base" in data and not has_base
        errors += [e for e in err.every() if not (refused_base and (e.key or "").split(".")[0] == "base")]
    design_keys = _design_keys(data) if has_base else []
    try:
        check_axes(origin, design_keys, valid)
    except SpecError as err:
        errors += err.every()
    analysis, problems = _parse_analysis(origin, data.get("analysis"))
    errors += problems
    base_problems = structure_errors(base_origin, base) if has_base else []  # after the study's own (its file first)
    if has_base and not base_problems:  # a tune's search is judged with the base: only a base without mistakes
        axes_set = {k for p, k in design_keys if p[0] == "design" and "baseline" not in p}
        errors += tune_errors(origin, data, base, axes_set)
    errors += base_problems
    if errors:
        raise found(errors)
    return _Parsed(origin, data, file, base, base_origin, analysis)


def _second_pass(parsed: _Parsed, cells: Cells, labels: list[str], axes: list[str]):
    """Every variant refused, then the tune, the metric and its direction, and the names the analysis gives
    (judged by the variants that are valid; a refused variant is still a name the analysis may give), at once.
    Returns (tune, analysis, the metrics every variant logs, direction)."""
    file, origin = parsed.file, parsed.origin
    problems = list(cells.invalid)
    tune = analysis = None
    metrics: set[str] | None = None  # with no valid cell, the analysis's metrics are not judged
    try:
        tune = parse_tune(origin, file.name, file.tune, file.resources, file.budget, parsed.base)
    except SpecError as err:
        problems += err.every()
    if cells.cells:
        try:
            metrics = variant_metrics(origin, file.metric, [(c.variant, c.run) for c in cells.cells])
        except SpecError as err:
            problems += err.every()
            metrics = set.intersection(*(logged_metrics(c.run) for c in cells.cells))
    direction = file.direction or better(file.metric) or "minimize"
    problem = direction_problem(file.metric, file.direction) if file.metric in (metrics or ()) else None
    if problem:  # (a metric no run logs is said above)
        problems.append(origin.error(("direction",) if file.direction else ("metric",), problem))
    try:
        levels = {a: list(dict.fromkeys(str(c.settings[a]) for c in cells.cells if a in c.settings)) for a in axes}
        analysis = _checked_analysis(parsed, labels, axes, metrics, levels)
        if isinstance(file.seeds, SeedPlan):
            _check_plan(parsed, file.seeds, labels, axes, levels)
    except SpecError as err:
        problems += err.every()
    if problems:
        raise _with_fix_last(problems, origin)
    return tune, analysis, metrics, direction


def _check_plan(parsed: _Parsed, plan: SeedPlan, variants: list[str], axes: list[str], levels: dict) -> None:
    """A seed plan decides the contrasts the study declares, by the group-sequential exact test, and its first look
    must be able to decide one: the exact test's smallest p at ``first`` seeds (2/2^n) at most the alpha spent by
    the first look at Holm's first step (alpha / family)."""
    analysis, origin = parsed.analysis, parsed.origin
    if analysis.contrasts is None:
        raise origin.error(
            ("seeds",), "a seed plan decides the contrasts the study declares: declare analysis.contrasts (pairs, "
            "main_effects or interactions), the questions the seeds are added to answer",
        )  # fmt: skip
    if analysis.test == "t":
        raise origin.error(
            ("analysis", "test"), "a seed plan's looks use the group-sequential exact sign-flip test; the t-test has "
            "no exact sequential form here: remove test: t, or declare a seed count instead of a plan",
        )  # fmt: skip
    family = analysis.family(variants, variants[0], axes, parsed.file.design.kind == "grid")
    size = family.size({a: len(v) for a, v in levels.items()})
    step = plan.spend(plan.first / plan.max, analysis.alpha / size)
    if plan.first >= smallest_exact_n(step):
        return
    fits = [
        f
        for f in range(plan.first, plan.max + 1)
        if f >= smallest_exact_n(plan.spend(f / plan.max, analysis.alpha / size))
    ]
    fix = (
        f"use first: {fits[0]} or more"
        if fits
        else f"raise max (even {plan.max} seeds at once cannot), or declare fewer contrasts"
    )
    raise origin.error(
        ("seeds", "first"),
        f"{plan.first} seeds at the first look cannot decide anything: by then the plan has spent alpha {step:.3g} at "
        f"Holm's first step (alpha {analysis.alpha:g} over a family of {size}, {plan.spending} spending at "
        f"{plan.first} of {plan.max} seeds), which the exact test reaches only from {smallest_exact_n(step)} seeds "
        f"(its smallest p, 2/2^n); {fix}",
    )


def _with_fix_last(problems: list[SpecError], origin: Origin) -> SpecError:
    """Every problem, the study's file first; the way out of a variant's mistakes said once, after the last."""
    errors = found(sorted(problems, key=lambda e: e.source != origin.source)).every()
    last = max((i for i, e in enumerate(errors) if (e.key or "").startswith("variant ")), default=None)
    if last is not None:
        e = errors[last]
        errors[last] = SpecError(e.source, e.key, f"{e.message} {FIX}", e.line)
    return found(errors)


def _parse_analysis(origin: Origin, value: Any) -> tuple[Analysis, list[SpecError]]:
    """The ``analysis:`` section, parsed once (absent: the defaults), and the mistakes of its structure (its keys
    and values), named beside the file's other mistakes."""
    if not isinstance(value, dict | None):  # the file's schema says it (a mapping), once
        return Analysis(), []
    try:
        return parse_analysis(value), []
    except AnalysisError as err:
        return Analysis(), [origin.error(e.path, e.message) for e in (err, *err.also)]


def _checked_analysis(
    parsed: _Parsed, variants: list[str], axes: list[str], metrics: set[str] | None, levels: dict[str, list[str]]
) -> Analysis:
    """The ``analysis:`` section, checked against the study's variants, axes (and their ``levels``) and metrics
    before anything runs."""
    try:
        check_analysis(parsed.analysis, variants, axes, metrics, kind=parsed.file.design.kind, levels=levels)
    except AnalysisError as err:  # every mistake at once
        raise found([parsed.origin.error(e.path, e.message) for e in (err, *err.also)]) from None
    return parsed.analysis
