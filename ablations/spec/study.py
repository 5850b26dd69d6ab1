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
direction: minimize
constraints:                           # skip (or refuse) cells, with the reason
  - skip: {model.norm: post, training.warmup_steps: 0}
    reason: Post-LN without warm-up is known to diverge here
skip_invalid: false                    # true: cells the model refuses are skipped with its reason
resources: {cpus: 1, gpus: 0, workers: 1}   # per trial; fractions of GPUs allowed; workers > 1: DDP
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

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from ablations.spec.common import (
    Budget,
    KeyedError,
    Origin,
    Resources,
    Strict,
    check_axes,
    check_name,
    mapping,
    settings_overrides,
    short,
    trial_overrides,
    validate,
)
from ablations.spec.errors import SpecError, found
from ablations.spec.metrics import logged_metrics, unknown_metric
from ablations.spec.run import RunConfig, apply_overrides, axis_keys, load_base, read_document, resolve_run
from ablations.spec.search import load_search

DESIGNS = ("grid", "one_at_a_time", "variants")


class OneAtATime(Strict):
    baseline: dict[str, Any] = Field(default_factory=dict)
    axes: dict[str, list[Any]] = Field(min_length=1)

    @field_validator("axes")
    @classmethod
    def _values(cls, v):
        for key, values in v.items():
            if not values:
                raise KeyedError((key,), "must be a non-empty list of values")
        return v


class VariantItem(Strict):
    name: str = Field(min_length=1)
    set: dict[str, Any] = Field(default_factory=dict)


class Design(Strict):
    """Exactly one of: a full factorial ``grid``, ``one_at_a_time`` changes from a baseline, named ``variants``."""

    grid: dict[str, list[Any]] | None = None
    one_at_a_time: OneAtATime | None = None
    variants: list[VariantItem] | None = Field(None, min_length=1)

    @model_validator(mode="after")
    def _one(self) -> Design:
        given = [k for k in DESIGNS if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"needs exactly one of {', '.join(DESIGNS)} (got {len(given)})")
        if self.grid is not None:
            if not self.grid:
                raise KeyedError(("grid",), "is empty: name at least one axis with its values")
            for key, values in self.grid.items():
                if not values:
                    raise KeyedError(("grid", key), "must be a non-empty list of values")
        if self.variants is not None:
            names: set[str] = set()
            for i, v in enumerate(self.variants):
                if v.name in names:
                    raise KeyedError(("variants", i, "name"), f"{v.name!r} is used twice")
                names.add(v.name)
        return self

    @property
    def kind(self) -> str:
        return next(k for k in DESIGNS if getattr(self, k) is not None)


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
    name: str
    description: str = ""
    base: str | dict[str, Any]
    design: Design
    seeds: Any = Field(1, validate_default=True)  # a count (3) or a list of seeds ([0, 1, 2])
    metric: str = "final/val_loss"
    direction: Literal["minimize", "maximize"] = "minimize"
    constraints: list[Constraint] = Field(default_factory=list)
    skip_invalid: bool = False
    resources: Resources = Resources()
    max_concurrent: int | None = Field(None, ge=1)
    budget: Budget = Budget()
    retries: int = Field(1, ge=0)
    max_cells: int = Field(1000, ge=1)
    tune: dict[str, Any] | None = None  # a search per variant before the cells (ablations/spec/search.py)
    analysis: dict[str, Any] | None = None  # how the results are compared (dashboards/analysis.py)
    vary_data: bool = False  # true: each seed also regenerates the task's data (task.data_seed = seed)
    reuse_results: Literal["same_code", "any_code"] = "same_code"  # any_code: results of other code count as done

    @field_validator("name")
    @classmethod
    def _name(cls, v):
        return check_name(v, "it names the MLflow experiment")

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, v):
        if isinstance(v, int) and not isinstance(v, bool) and v >= 1:
            return list(range(v))
        if isinstance(v, list) and v and all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in v):
            if len(set(v)) != len(v):
                raise ValueError(f"{v} repeats a seed")
            return list(v)
        raise ValueError(f"{v!r} must be a count (3) or a list of non-negative integers ([0, 1, 2])")

    @field_validator("metric")
    @classmethod
    def _metric(cls, v):
        if "/" not in v:
            raise ValueError(f"{v!r} must name a summary metric such as final/val_loss or test/exact_match")
        return v


STUDY_KEYS = tuple(StudyFile.model_fields)


@dataclass(frozen=True)
class Cell:
    """One trial of a study: a variant, a seed, and the resolved run."""

    variant: str  # human readable: "norm=post warmup_steps=0", "baseline", or a variant's name
    settings: dict[str, Any]  # the axis values that define the variant
    seed: int
    run: RunConfig

    @property
    def cell_id(self) -> str:
        return self.run.config_hash()


@dataclass(frozen=True)
class Skipped:
    variant: str
    seed: int
    reason: str


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
    raw: dict[str, Any] = field(default_factory=dict)
    tune: dict[str, Any] | None = None  # a search per variant before the cells (ablations/search/tuned.py)
    analysis: dict[str, Any] | None = None  # the validated analysis: section (dashboards/analysis.py)
    vary_data: bool = False
    reuse_any_code: bool = False  # results trained by other code (another code fingerprint) count as done
    tuning: dict[str, Any] | None = None  # a tuned study: the tuning seed, each chosen value's place in its range
    metrics: list[str] = field(default_factory=list)  # the summary metrics every variant's runs log

    @property
    def variants(self) -> list[str]:
        return list(dict.fromkeys(c.variant for c in self.cells))

    @property
    def seeds(self) -> list[int]:
        return sorted({c.seed for c in self.cells})


# --- expansion ----------------------------------------------------------------------------------------------


def _label(settings: dict[str, Any]) -> str:
    return " ".join(f"{short(k)}={v}" for k, v in settings.items()) or "base"


def _axis_paths(design: Design) -> list[tuple[tuple, Any]]:
    """(where in the file, key) of every key the design sets."""
    if design.grid is not None:
        return [(("design", "grid", k), k) for k in design.grid]
    if design.one_at_a_time is not None:  # its baseline and its axes
        body = design.one_at_a_time
        return [(("design", "one_at_a_time", part, k), k) for part in ("baseline", "axes") for k in getattr(body, part)]
    return [(("design", "variants", i, "set", k), k) for i, item in enumerate(design.variants or []) for k in item.set]


def _variants(design: Design) -> tuple[list[str], list[tuple[str, dict, dict]]]:
    """(axes, [(variant label, settings, where each setting is in the file (key None: the variant))])."""
    if design.grid is not None:
        axes = list(design.grid)
        out = []
        for combo in itertools.product(*(design.grid[k] for k in axes)):
            settings = dict(zip(axes, combo))
            where = {None: ("design", "grid"), **{k: ("design", "grid", k) for k in axes}}
            out.append((_label(settings), settings, where))
        return axes, out
    if design.one_at_a_time is not None:
        body = design.one_at_a_time
        base_where = {k: ("design", "one_at_a_time", "baseline", k) for k in body.baseline}
        axes = list(body.axes)
        out = [("baseline", dict(body.baseline), {None: ("design", "one_at_a_time", "baseline"), **base_where})]
        for k in axes:
            for i, v in enumerate(body.axes[k]):
                settings = {**body.baseline, k: v}
                if settings != body.baseline:
                    path = ("design", "one_at_a_time", "axes", k, i)
                    out.append((f"{short(k)}={v}", settings, {**base_where, None: path, k: path}))
        return axes, out
    out, axes = [], []
    for i, item in enumerate(design.variants or []):
        for k in item.set:
            if k not in axes:
                axes.append(k)
        where = {None: ("design", "variants", i), **{k: ("design", "variants", i, "set", k) for k in item.set}}
        out.append((item.name, dict(item.set), where))
    return axes, out


def _matches(run_data: dict[str, Any], when: dict[str, Any]) -> bool:
    for key, value in when.items():
        node: Any = run_data
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node != value:
            return False
    return True


def load_study(path: str | Path, *, seeds: list[int] | None = None) -> Study:
    """Read and check a study file and expand it into cells. Raises SpecError before anything starts."""
    path = Path(path)
    source = str(path)
    doc = read_document(path)
    origin = Origin(source, doc)
    data = doc.data
    for required in ("name", "base", "design"):
        if required not in data:
            raise origin.error((required,), "is required")
    base, base_origin = load_base(origin, data["base"], path.parent)
    base.pop("name", None)
    valid = axis_keys(base)
    study_keys = list(STUDY_KEYS) + [f"design.{k}" for k in DESIGNS] + [f"budget.{k}" for k in Budget.model_fields]
    study_keys += [f"resources.{k}" for k in Resources.model_fields]
    file = validate(StudyFile, data, origin, study_keys + valid)
    constrained = [(("constraints", i, c.action, k), k) for i, c in enumerate(file.constraints) for k in c.when]
    check_axes(origin, _axis_paths(file.design) + constrained, valid)  # every unknown key at once
    axes, variants = _variants(file.design)
    seed_list = seeds if seeds is not None else file.seeds

    total = len(variants) * len(seed_list)
    if total > file.max_cells:
        raise origin.error(
            ("design",),
            f"expands to {total} cells ({len(variants)} variants x {len(seed_list)} seeds), "
            f"more than max_cells={file.max_cells}; shrink the design or raise max_cells",
        )

    cells: list[Cell] = []
    skipped: list[Skipped] = []
    seen: dict[str, Cell] = {}
    every_trial = trial_overrides(file.resources, file.budget)
    for label, settings, where in variants:
        run_data = apply_overrides(base, settings_overrides({**settings, **every_trial}))
        reason = None
        for i, c in enumerate(file.constraints):
            if _matches(run_data, c.when):
                if c.action == "refuse":
                    raise origin.error(("constraints", i), f"variant {label!r} is refused: {c.reason}")
                reason = c.reason
                break
        for seed in seed_list:
            if reason is not None:
                skipped.append(Skipped(label, seed, reason))
                continue
            seeded = run_data
            if file.vary_data:  # the seed also draws the data: synthetic tasks regenerate, splits resample
                seeded = apply_overrides(run_data, [(["task", "data_seed"], seed)])
            try:
                run = resolve_run({**seeded, "seed": seed, "name": file.name}, Origin(None))
            except SpecError as err:
                if not file.skip_invalid:
                    raise found(
                        [_variant_error(e, label, settings, where, origin, base_origin) for e in err.every()]
                    ) from None
                skipped.append(Skipped(label, seed, f"{err.key}: {err.message}"))
                continue
            cell = Cell(label, settings, seed, run)
            if cell.cell_id in seen:  # e.g. a one_at_a_time value equal to the baseline's
                continue
            seen[cell.cell_id] = cell
            cells.append(cell)
    if not cells:
        raise origin.error(("design",), "leaves no cell to run (every cell is skipped)")
    tune = _tune(origin, file, base, axes)
    metrics = _metrics(origin, file, cells)
    analysis = _analysis(origin, file, [v for v in dict.fromkeys(c.variant for c in cells)], axes, metrics)
    return Study(
        name=file.name,
        description=file.description,
        source=source,
        design=file.design.kind,
        axes=axes,
        cells=cells,
        skipped=skipped,
        metric=file.metric,
        direction=file.direction,
        resources=file.resources,
        max_concurrent=file.max_concurrent,
        retries=file.retries,
        budget=file.budget,
        raw=data,
        tune=tune,
        analysis=analysis,
        vary_data=file.vary_data,
        reuse_any_code=file.reuse_results == "any_code",
        metrics=sorted(metrics),
    )


def _variant_error(
    err: SpecError, label: str, settings: dict, where: dict, origin: Origin, base_origin: Origin
) -> SpecError:
    """A variant the model refuses, blamed on the line that caused it: the design's setting of the key (or of a
    key the message names, "n_heads=3"), else the base's line of the key."""
    fix = "(fix it, add a constraint that skips it, or set skip_invalid: true)"
    message = f"{err.key + ': ' if err.key else ''}{err.message} {fix}"
    key = err.key or ""
    named = [k for k in settings if f"{k.rsplit('.', 1)[-1]}=" in err.message]
    if key in settings or named or not key or base_origin.doc is None:
        path = where.get(key if key in settings else (named[0] if named else None), where[None])
        return origin.error(path, message, key=f"variant {label!r}")
    blamed = base_origin.error(tuple(key.split(".")), message, key=f"variant {label!r}")
    if blamed.source != origin.source:  # the base is another file: say which study it serves
        return SpecError(blamed.source, blamed.key, f"{message} (base of {origin.source})", blamed.line)
    return blamed


def _metrics(origin: Origin, file: StudyFile, cells: list[Cell]) -> set[str]:
    """The metrics every variant's runs log; the study's ``metric`` must be one of them (a typo in it would
    otherwise be found by ``ablate report``, after all the compute)."""
    per_variant: dict[str, set[str]] = {}
    for cell in cells:
        if cell.variant not in per_variant:
            per_variant[cell.variant] = logged_metrics(cell.run)
    common = set.intersection(*per_variant.values())
    missing = [v for v, names in per_variant.items() if file.metric not in names]
    if missing:
        problem = unknown_metric(file.metric, per_variant[missing[0]]) or ""
        if len(missing) < len(per_variant):
            problem += f" (the runs of {', '.join(repr(v) for v in missing)} do not log it)"
        raise origin.error(("metric",), problem)
    return common


def _analysis(
    origin: Origin, file: StudyFile, variants: list[str], axes: list[str], metrics: set[str]
) -> dict[str, Any] | None:
    """The ``analysis:`` section, checked against the study's variants, axes and metrics before anything runs."""
    if file.analysis is None:
        return None
    from dashboards.analysis import AnalysisError, check_analysis, parse_analysis

    try:
        analysis = parse_analysis(file.analysis)
        check_analysis(analysis, variants, axes, metrics, kind=file.design.kind)
    except AnalysisError as err:
        raise origin.error(err.path, err.message) from None
    return analysis.model_dump(mode="json", exclude_defaults=True)


def _tune(origin: Origin, file: StudyFile, base: dict[str, Any], axes: list[str]) -> dict[str, Any] | None:
    """A study's ``tune:`` section: the search every variant gets, with the same budget, before its seeds run."""
    if file.tune is None:
        return None
    tune = dict(file.tune)
    for key in ("name", "base", "storage"):
        if key in tune:
            raise origin.error(("tune", key), "is set by the study (each variant gets its own search); remove it")
    for key in mapping(origin, ("tune", "space"), tune.get("space") or {}):
        if key in axes:
            raise origin.error(
                ("tune", "space", key), "is also an axis of the design: a variant cannot both fix it and tune it"
            )
    tune.setdefault("resources", {"cpus": file.resources.cpus, "gpus": file.resources.gpus})
    tune.setdefault("budget", file.budget.as_dict())
    # checked now, with the base (every variant's search is checked again with its own settings)
    load_search(origin.under("tune"), {**tune, "name": f"{file.name}.tune"}, base=base)
    return tune
