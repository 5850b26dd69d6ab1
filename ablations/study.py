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

Each cell (variant x seed) is a fully resolved RunConfig with a stable id: the hash of the result-affecting
configuration and the seed. The same configuration in two variants is one cell; adding a seed or an axis
value adds only the new cells.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ablations.spec import RunConfig, SpecError, apply_overrides, read_yaml, resolve_run
from models.config import ModelConfig

STUDY_KEYS = (
    "name",
    "description",
    "base",
    "design",
    "seeds",
    "metric",
    "direction",
    "constraints",
    "skip_invalid",
    "resources",
    "max_concurrent",
    "budget",
    "retries",
    "max_cells",
    "tune",
)
DESIGNS = ("grid", "one_at_a_time", "variants")


@dataclass(frozen=True)
class Resources:
    cpus: float = 1.0
    gpus: float = 0.0
    workers: int = 1

    @property
    def per_worker_cpus(self) -> float:
        return self.cpus / self.workers

    def describe(self) -> str:
        parts = [f"{self.cpus:g} CPU"]
        if self.gpus:
            parts.append(f"{self.gpus:g} GPU")
        if self.workers > 1:
            parts.append(f"{self.workers} workers (DDP)")
        return ", ".join(parts)


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


@dataclass
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
    budget: dict[str, float]
    raw: dict[str, Any] = field(default_factory=dict)
    tune: dict[str, Any] | None = None  # a search per variant before the cells (see ablations/search.py)

    @property
    def variants(self) -> list[str]:
        return list(dict.fromkeys(c.variant for c in self.cells))

    @property
    def seeds(self) -> list[int]:
        return sorted({c.seed for c in self.cells})


# --- checking the pieces ---------------------------------------------------------------------------


def valid_axis_keys(base: dict[str, Any]) -> list[str]:
    """Every dotted key a design may set, for the base's task."""
    from models.lightning import TrainingConfig
    from models.tasks import TASKS

    keys = [f"model.{f.name}" for f in fields(ModelConfig)]
    keys += [f"training.{f.name}" for f in fields(TrainingConfig)]
    task = base.get("task") or {}
    task_cls = TASKS.get(task.get("name")) if isinstance(task, dict) else None
    keys.append("task.name")
    if task_cls is not None:
        keys += [f"task.{f.name}" for f in fields(task_cls.Params)]
    return keys


def _check_axis(source: str, where: str, key: Any, valid: list[str]) -> str:
    if not isinstance(key, str) or key not in valid:
        near = [k for k in valid if isinstance(key, str) and key.split(".")[-1] in k] or valid
        raise SpecError(
            source,
            where,
            f"unknown axis {key!r}; valid keys look like {', '.join(near[:12])}" + (" ..." if len(near) > 12 else ""),
        )
    return key


def _mapping(source: str, where: str, value: Any) -> dict:
    if not isinstance(value, dict):
        raise SpecError(source, where, f"must be a mapping (got {type(value).__name__})")
    return value


def _values(source: str, where: str, value: Any) -> list:
    if not isinstance(value, list) or not value:
        raise SpecError(source, where, "must be a non-empty list of values")
    return value


def _short(key: str) -> str:
    return key.split(".", 1)[1] if "." in key else key


def _label(settings: dict[str, Any]) -> str:
    return " ".join(f"{_short(k)}={v}" for k, v in settings.items()) or "base"


def _design(source: str, design: Any, valid: list[str]) -> tuple[str, list[str], list[tuple[str, dict]]]:
    """(kind, axes, [(variant label, settings)])."""
    design = _mapping(source, "design", design)
    kinds = [k for k in design if k in DESIGNS]
    unknown = [k for k in design if k not in DESIGNS]
    if unknown:
        raise SpecError(source, f"design.{unknown[0]}", f"unknown design; valid: {', '.join(DESIGNS)}")
    if len(kinds) != 1:
        raise SpecError(source, "design", f"needs exactly one of {', '.join(DESIGNS)} (got {len(kinds)})")
    kind = kinds[0]
    body = design[kind]
    if kind == "grid":
        body = _mapping(source, "design.grid", body)
        if not body:
            raise SpecError(source, "design.grid", "is empty: name at least one axis with its values")
        axes = [_check_axis(source, f"design.grid.{k}", k, valid) for k in body]
        values = [_values(source, f"design.grid.{k}", body[k]) for k in axes]
        return kind, axes, [(_label(s), s) for s in (dict(zip(axes, combo)) for combo in itertools.product(*values))]
    if kind == "one_at_a_time":
        body = _mapping(source, "design.one_at_a_time", body)
        extra = set(body) - {"baseline", "axes"}
        if extra:
            raise SpecError(source, f"design.one_at_a_time.{sorted(extra)[0]}", "unknown key; valid: baseline, axes")
        baseline = _mapping(source, "design.one_at_a_time.baseline", body.get("baseline") or {})
        for k in baseline:
            _check_axis(source, f"design.one_at_a_time.baseline.{k}", k, valid)
        axes_body = _mapping(source, "design.one_at_a_time.axes", body.get("axes"))
        if not axes_body:
            raise SpecError(source, "design.one_at_a_time.axes", "is empty: name at least one axis with its values")
        axes = [_check_axis(source, f"design.one_at_a_time.axes.{k}", k, valid) for k in axes_body]
        out = [("baseline", dict(baseline))]
        for k in axes:
            for v in _values(source, f"design.one_at_a_time.axes.{k}", axes_body[k]):
                settings = {**baseline, k: v}
                if settings != baseline:
                    out.append((f"{_short(k)}={v}", settings))
        return kind, axes, out
    body = _values(source, "design.variants", body)
    out, names, axes = [], set(), []
    for i, item in enumerate(body):
        item = _mapping(source, f"design.variants[{i}]", item)
        extra = set(item) - {"name", "set"}
        if extra:
            raise SpecError(source, f"design.variants[{i}].{sorted(extra)[0]}", "unknown key; valid: name, set")
        name = item.get("name")
        if not isinstance(name, str) or not name.strip():
            raise SpecError(source, f"design.variants[{i}].name", "every variant needs a name")
        if name in names:
            raise SpecError(source, f"design.variants[{i}].name", f"{name!r} is used twice")
        names.add(name)
        settings = _mapping(source, f"design.variants[{i}].set", item.get("set") or {})
        for k in settings:
            _check_axis(source, f"design.variants[{i}].set.{k}", k, valid)
            if k not in axes:
                axes.append(k)
        out.append((name, dict(settings)))
    return kind, axes, out


def _constraints(source: str, value: Any, valid: list[str]) -> list[tuple[str, dict, str]]:
    out = []
    for i, item in enumerate(value or []):
        item = _mapping(source, f"constraints[{i}]", item)
        actions = [a for a in ("skip", "refuse") if a in item]
        extra = set(item) - {"skip", "refuse", "reason"}
        if extra or len(actions) != 1:
            raise SpecError(
                source, f"constraints[{i}]", "needs one of skip or refuse (a mapping of axis values), and a reason"
            )
        when = _mapping(source, f"constraints[{i}].{actions[0]}", item[actions[0]])
        for k in when:
            _check_axis(source, f"constraints[{i}].{actions[0]}.{k}", k, valid)
        reason = item.get("reason")
        if not isinstance(reason, str) or not reason.strip():
            raise SpecError(source, f"constraints[{i}].reason", "say why (it is shown for every cell it matches)")
        out.append((actions[0], when, reason))
    return out


def _matches(run_data: dict[str, Any], when: dict[str, Any]) -> bool:
    for key, value in when.items():
        node: Any = run_data
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node != value:
            return False
    return True


def _seeds(source: str, value: Any) -> list[int]:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return list(range(value))
    if (
        isinstance(value, list)
        and value
        and all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in value)
    ):
        if len(set(value)) != len(value):
            raise SpecError(source, "seeds", f"{value} repeats a seed")
        return list(value)
    raise SpecError(source, "seeds", f"{value!r} must be a count (3) or a list of non-negative integers ([0, 1, 2])")


def _resources(source: str, value: Any) -> Resources:
    value = _mapping(source, "resources", value or {})
    extra = set(value) - {"cpus", "gpus", "workers"}
    if extra:
        raise SpecError(source, f"resources.{sorted(extra)[0]}", "unknown key; valid: cpus, gpus, workers")
    r = Resources(**value)
    for name in ("cpus", "gpus"):
        v = getattr(r, name)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
            raise SpecError(source, f"resources.{name}", f"{v!r} must be a non-negative number (fractions allowed)")
    if r.cpus <= 0:
        raise SpecError(source, "resources.cpus", f"{r.cpus} must be more than 0")
    if isinstance(r.workers, bool) or not isinstance(r.workers, int) or r.workers < 1:
        raise SpecError(source, "resources.workers", f"{r.workers!r} must be a positive integer")
    if r.workers > 1 and r.cpus < r.workers:
        raise SpecError(
            source, "resources.cpus", f"{r.cpus:g} CPUs cannot feed {r.workers} workers; give at least one per worker"
        )
    return Resources(float(r.cpus), float(r.gpus), r.workers)


def _budget(source: str, value: Any) -> dict[str, float]:
    value = _mapping(source, "budget", value or {})
    extra = set(value) - {"steps", "time"}
    if extra:
        raise SpecError(source, f"budget.{sorted(extra)[0]}", "unknown key; valid: steps, time (seconds)")
    for k, v in value.items():
        if (
            isinstance(v, bool)
            or not isinstance(v, (int, float))
            or v <= 0
            or (k == "steps" and not isinstance(v, int))
        ):
            raise SpecError(
                source, f"budget.{k}", f"{v!r} must be a positive {'integer' if k == 'steps' else 'number'}"
            )
    return dict(value)


def _base(source: str, value: Any, folder: Path) -> dict[str, Any]:
    if isinstance(value, str):
        path = (folder / value).resolve()
        if not path.exists():
            raise SpecError(source, "base", f"run file {value!r} not found (looked for {path})")
        return read_yaml(path)
    return dict(_mapping(source, "base", value))


def settings_to_overrides(settings: dict[str, Any]) -> list[tuple[list[str], Any]]:
    return [(k.split("."), v) for k, v in settings.items()]


def load_study(path: str | Path, *, seeds: list[int] | None = None) -> Study:
    """Read and check a study file and expand it into cells. Raises SpecError before anything starts."""
    path = Path(path)
    source = str(path)
    data = read_yaml(path)
    unknown = sorted(set(data) - set(STUDY_KEYS))
    if unknown:
        raise SpecError(source, unknown[0], f"unknown key; valid: {', '.join(STUDY_KEYS)}")
    for required in ("name", "base", "design"):
        if required not in data:
            raise SpecError(source, required, "is required")
    name = data["name"]
    if not isinstance(name, str) or not re.fullmatch(r"[\w.\-]+", name):
        raise SpecError(
            source, "name", f"{name!r} must be letters, digits, '_', '-' or '.' (it names the MLflow experiment)"
        )
    base = _base(source, data["base"], path.parent)
    base.pop("name", None)
    valid = valid_axis_keys(base)
    kind, axes, variants = _design(source, data["design"], valid)
    seed_list = seeds if seeds is not None else _seeds(source, data.get("seeds", 1))
    constraints = _constraints(source, data.get("constraints"), valid)
    skip_invalid = data.get("skip_invalid", False)
    if not isinstance(skip_invalid, bool):
        raise SpecError(source, "skip_invalid", f"{skip_invalid!r} must be true or false")
    budget = _budget(source, data.get("budget"))
    retries = data.get("retries", 1)
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise SpecError(source, "retries", f"{retries!r} must be a non-negative integer")
    max_concurrent = data.get("max_concurrent")
    if max_concurrent is not None and (
        isinstance(max_concurrent, bool) or not isinstance(max_concurrent, int) or max_concurrent < 1
    ):
        raise SpecError(source, "max_concurrent", f"{max_concurrent!r} must be a positive integer")
    max_cells = data.get("max_cells", 1000)
    if isinstance(max_cells, bool) or not isinstance(max_cells, int) or max_cells < 1:
        raise SpecError(source, "max_cells", f"{max_cells!r} must be a positive integer")
    direction = data.get("direction", "minimize")
    if direction not in ("minimize", "maximize"):
        raise SpecError(source, "direction", f"{direction!r} is not a valid choice; valid: 'minimize', 'maximize'")
    metric = data.get("metric", "final/val_loss")
    if not isinstance(metric, str) or "/" not in metric:
        raise SpecError(
            source, "metric", f"{metric!r} must name a summary metric such as final/val_loss or test/exact_match"
        )
    resources = _resources(source, data.get("resources"))
    description = data.get("description", "")
    if not isinstance(description, str):
        raise SpecError(source, "description", "must be text")

    total = len(variants) * len(seed_list)
    if total > max_cells:
        raise SpecError(
            source,
            "design",
            f"expands to {total} cells ({len(variants)} variants x {len(seed_list)} seeds), "
            f"more than max_cells={max_cells}; shrink the design or raise max_cells",
        )

    cells: list[Cell] = []
    skipped: list[Skipped] = []
    seen: dict[str, Cell] = {}
    # a trial's torch threads follow the CPUs it is given, whatever the run file says (2 trials x 2 threads
    # on 2 cores would each run at half speed)
    budget_overrides: dict[str, Any] = {"resources.threads": max(1, int(resources.per_worker_cpus))}
    if "steps" in budget:
        budget_overrides["training.max_steps"] = budget["steps"]
    if "time" in budget:
        budget_overrides["training.max_time"] = float(budget["time"])
    for label, settings in variants:
        run_data = apply_overrides(base, settings_to_overrides({**settings, **budget_overrides}))
        reason = None
        for action, when, why in constraints:
            if _matches(run_data, when):
                if action == "refuse":
                    raise SpecError(source, "constraints", f"variant {label!r} is refused: {why}")
                reason = why
                break
        for seed in seed_list:
            if reason is not None:
                skipped.append(Skipped(label, seed, reason))
                continue
            try:
                run = resolve_run({**run_data, "seed": seed, "name": name}, f"{source} (variant {label!r})")
            except SpecError as err:
                if not skip_invalid:
                    raise SpecError(
                        source,
                        f"variant {label!r}",
                        f"{err.key + ': ' if err.key else ''}{err.message} (fix it, add a constraint that "
                        "skips it, or set skip_invalid: true)",
                    ) from None
                skipped.append(Skipped(label, seed, f"{err.key}: {err.message}"))
                continue
            cell = Cell(label, settings, seed, run)
            if cell.cell_id in seen:  # e.g. a one_at_a_time value equal to the baseline's
                continue
            seen[cell.cell_id] = cell
            cells.append(cell)
    if not cells:
        raise SpecError(source, "design", "leaves no cell to run (every cell is skipped)")
    tune = _tune(source, data.get("tune"), base, axes, resources, budget, name)
    return Study(
        name,
        description,
        source,
        kind,
        axes,
        cells,
        skipped,
        metric,
        direction,
        resources,
        max_concurrent,
        retries,
        budget,
        data,
        tune,
    )


def _tune(
    source: str,
    value: Any,
    base: dict[str, Any],
    axes: list[str],
    resources: Resources,
    budget: dict[str, float],
    name: str,
) -> dict[str, Any] | None:
    """A study's ``tune:`` section: the search every variant gets, with the same budget, before its seeds run."""
    if value is None:
        return None
    from ablations.search import load_search

    tune = dict(_mapping(source, "tune", value))
    for key in ("name", "base", "storage"):
        if key in tune:
            raise SpecError(source, f"tune.{key}", "is set by the study (each variant gets its own search); remove it")
    for key in _mapping(source, "tune.space", tune.get("space") or {}):
        if key in axes:
            raise SpecError(
                source, f"tune.space.{key}", "is also an axis of the design: a variant cannot both fix it and tune it"
            )
    tune.setdefault("resources", {"cpus": resources.cpus, "gpus": resources.gpus})
    tune.setdefault("budget", budget)
    try:  # checked now, with the base (every variant's search is checked again with its own settings)
        load_search(source, {**tune, "name": f"{name}.tune"}, base=base)
    except SpecError as err:
        raise SpecError(source, f"tune.{err.key}", err.message) from None
    return tune
