"""Search files: an Optuna search over run-configuration keys.

```yaml
name: lr_warmup                        # the Optuna study and the MLflow experiment
base: ../runs/quickstart.yaml          # a run file (relative to this file), or the run inline
space:
  training.lr: {type: float, low: 1.0e-4, high: 1.0e-2, log: true}
  training.warmup_steps: {type: int, low: 0, high: 200, step: 50}
  model.pattern: {type: categorical, choices: [full, local]}
  model.window: {type: int, low: 4, high: 32, when: {model.pattern: [local, dilated]}}   # conditional
objectives:                            # one or more; several: a Pareto front (nsga2)
  - {metric: final/val_loss, direction: minimize}
sampler: tpe                           # tpe | random | cmaes | gp | nsga2
pruner: median                         # median | successive_halving | hyperband | wilcoxon | none
prune_on: val/loss                     # reported at each validation (default: the objective's own, else val/loss)
n_trials: 20                           # in total, across every process on the study; failed trials count
timeout: 600                           # seconds this process asks for new trials (optional)
concurrency: 2                         # trials at once in this process
resources: {cpus: 1, gpus: 0}          # per trial; workers: 2 trains each trial data-parallel
budget: {steps: 300}                   # per trial
seed: 0                                # of the sampler
storage: null                          # default: SQLite in .ablate/optuna.db; or a URL, or journal:PATH
```

The file's structure is the pydantic model ``SearchFile``; ``load_search`` checks it against the base run
(every key of the space is a key of the run; both ends of every range make a valid run) and returns a
``SearchSpec``. Imports no optuna: the samplers and pruners are built by ``ablations.search``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from record.spec.common import (
    Budget,
    KeyedError,
    Origin,
    Resources,
    Strict,
    check_name,
    trial_overrides,
    validate,
)
from record.spec.errors import SpecError, found
from record.spec.metrics import (
    better,
    direction_problem,
    intermediate_metrics,
    logged_metrics,
    pruned_on,
    unknown_metric,
)
from record.spec.overrides import apply_overrides
from record.spec.run import axis_keys, load_base, read_document, resolve_run, structure_errors
from record.spec.space import Param, parse_space, refused_values, suggest_param


class Objective(Strict):
    metric: str
    direction: Literal["minimize", "maximize"] | None = None  # None: the metric's own (record.spec.metrics.better)

    @field_validator("metric")
    @classmethod
    def _metric(cls, v):
        if "/" not in v:
            raise ValueError(f"{v!r} must name a summary metric such as final/val_loss or cost/tokens_per_s")
        return v


class PrunerWarmup(Strict):
    """No trial is pruned before ``trials`` trials have finished, nor before step ``steps`` (default: the base
    run's first validation, ``training.val_every``)."""

    trials: int = Field(2, ge=0)
    steps: int | None = Field(None, ge=0)


class SearchFile(Strict):
    name: str
    description: str = ""
    plugins: list[str] = Field(default_factory=list)  # a researcher's own components (models.plugins), loaded first
    base: str | dict[str, Any] | None = None
    space: dict[str, dict[str, Any]]
    objectives: list[Objective] | None = Field(None, min_length=1)
    metric: str | None = None
    direction: Literal["minimize", "maximize"] | None = None
    sampler: Literal["tpe", "random", "cmaes", "gp", "nsga2"] | None = None
    pruner: Literal["median", "successive_halving", "hyperband", "wilcoxon", "none"] | None = None
    prune_on: str | None = None  # default: the objective's own validation metric, else val/loss (metrics.pruned_on)
    pruner_warmup: PrunerWarmup = PrunerWarmup()
    startup_trials: int | None = Field(None, ge=0)  # random trials before TPE/GP model (default: fitted to n_trials)
    diverged: Literal["worst", "fail"] = "worst"  # how a diverged trial is told: the worst value seen, or FAIL
    # each trial trains this many seeds (the run's seed and the next ones) and is told the mean of its objectives
    seeds_per_trial: int = Field(1, ge=1, le=20)
    n_trials: int | None = Field(None, ge=1)
    timeout: float | None = Field(None, gt=0)
    concurrency: int = Field(1, ge=1)
    resources: Resources = Resources()
    budget: Budget = Budget()
    seed: int = 0
    storage: str | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, v):
        return check_name(v, "it names the Optuna study and the MLflow experiment")

    @field_validator("prune_on")
    @classmethod
    def _prune_on(cls, v):
        if v is not None and not v.startswith("val/"):
            raise ValueError(f"{v!r} must be a validation metric reported while training, e.g. val/loss")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> SearchFile:
        if not self.space:
            raise KeyedError(("space",), "is empty: name at least one key with its range")
        if self.objectives is not None and (self.metric is not None or self.direction is not None):
            raise KeyedError(("objectives",), "give either objectives (a list) or metric and direction, not both")
        several = self.objectives is not None and len(self.objectives) > 1
        if self.sampler == "cmaes" and several:
            raise KeyedError(("sampler",), "cmaes optimises one objective; use nsga2 (or tpe, gp) for several")
        if self.pruner not in (None, "none") and several:
            raise KeyedError(("pruner",), "Optuna prunes single-objective searches only; set pruner: none")
        if self.pruner not in (None, "none") and self.seeds_per_trial > 1:
            raise KeyedError(
                ("pruner",),
                f"with seeds_per_trial {self.seeds_per_trial} a trial is the mean of several runs, and a pruner "
                "judges one run's curve; set pruner: none",
            )
        if self.n_trials is None and self.timeout is None:
            raise KeyedError(("n_trials",), "give n_trials, timeout, or both: a search needs an end")
        return self


SEARCH_KEYS = tuple(SearchFile.model_fields)


@dataclass(kw_only=True)
class SearchSpec:
    name: str
    description: str
    source: str
    base: dict[str, Any]
    space: list[Param]
    objectives: list[tuple[str, str]]  # (metric, direction)
    sampler: str
    pruner: str
    prune_on: str
    n_trials: int | None
    timeout: float | None
    concurrency: int
    resources: Resources
    budget: Budget
    seed: int
    storage: str | None
    warmup_trials: int = 2
    warmup_steps: int = 0
    startup_trials: int = 0  # random trials before the sampler's model (tpe, gp); 0 for the others
    diverged: str = "worst"
    seeds_per_trial: int = 1  # a trial's objective: the mean over this many seeds (the base's seed and the next)
    warnings: list[str] = field(default_factory=list)  # said before the search starts (``refused_values``)
    startup_given: int | None = None  # the file's startup_trials (None: fitted to n_trials)

    def set_trials(self, n_trials: int) -> None:
        """``--n-trials``: the budget, and the random startup trials fitted to it again unless the file gave them."""
        self.n_trials = n_trials
        self.startup_trials = _startup(self.startup_given, self.sampler, n_trials)

    @property
    def random_only(self) -> bool:
        """A model-based sampler that never gets past its random startup trials within the budget."""
        return (
            self.sampler in ("tpe", "gp", "nsga2")
            and self.n_trials is not None
            and self.n_trials <= self.startup_trials
        )

    @property
    def directions(self) -> list[str]:
        return [d for _, d in self.objectives]

    def run_data(self, params: dict[str, Any]) -> dict[str, Any]:
        """The run configuration of a trial: the base, the budget, the trial's parameters."""
        overrides = {**trial_overrides(self.resources, self.budget), **params}
        return apply_overrides(self.base, [(k.split("."), v) for k, v in overrides.items()])

    def assign(self, value: Callable[[Param], Any]) -> dict[str, Any]:
        """A trial's parameters, each ``value(param)``, define-by-run: a conditional key only when its condition
        holds."""
        params: dict[str, Any] = {}
        for p in self.space:
            if p.active(params):
                params[p.key] = value(p)
        return params

    def suggest(self, trial) -> dict[str, Any]:
        """The trial's parameters, asked of Optuna."""
        return self.assign(lambda p: suggest_param(p, trial))


def _val_every(base: dict[str, Any]) -> int:
    """The base run's validation interval: the first step at which a pruner may judge a trial."""
    from models.training import TrainingConfig

    training = base.get("training") if isinstance(base.get("training"), dict) else {}
    given = training.get("val_every")  # a value of the wrong type is the base's mistake, named when it is resolved
    return given if isinstance(given, int) and not isinstance(given, bool) else TrainingConfig.val_every


def _startup(given: int | None, sampler: str, n_trials: int | None) -> int:
    """Random startup trials of a model-based sampler: as given, else Optuna's 10 fitted to the budget (a quarter
    of it, at least 2), so that a small search is not random search under TPE's name. For NSGA-II, its population
    (its first generation is random): Optuna's 50 fitted the same way (at least 4), so that 16 trials are four
    generations rather than a third of one."""
    if sampler not in ("tpe", "gp", "nsga2"):
        return 0
    if given is not None:
        return given
    if sampler == "nsga2":
        return 50 if n_trials is None else min(50, max(4, n_trials // 4))
    return 10 if n_trials is None else min(10, max(2, n_trials // 4))


def load_search(
    path: str | Path | Origin, data: dict[str, Any] | None = None, *, base: dict[str, Any] | None = None
) -> SearchSpec:
    """Read and check a search file (or a study's ``tune:`` section, with its base). Raises SpecError."""
    if isinstance(path, Origin):
        origin, folder = path, Path(path.source or ".").parent
    else:
        doc = read_document(path, ("name", "base", "space", "n_trials", "metric", "...")) if data is None else None
        origin, folder = Origin(str(path), doc), Path(path).parent
        data = doc.data if doc is not None else data
    file, base, space, base_origin = _structure(origin, dict(data or {}), folder, base)
    given = [(o.metric, o.direction) for o in file.objectives or ()] or [
        (file.metric or "final/val_loss", file.direction)
    ]
    objectives = [(metric, direction or better(metric) or "minimize") for metric, direction in given]
    sampler = file.sampler or ("tpe" if len(objectives) == 1 else "nsga2")
    if sampler == "nsga2" and file.startup_trials is not None and file.startup_trials < 2:  # the default one too
        raise origin.error(("startup_trials",), "is NSGA-II's population with sampler nsga2: give at least 2")
    spec = SearchSpec(
        name=file.name,
        description=file.description,
        source=origin.source or "",
        base=base,
        space=space,
        objectives=objectives,
        sampler=sampler,
        pruner=file.pruner or ("median" if len(objectives) == 1 and file.seeds_per_trial == 1 else "none"),
        prune_on=file.prune_on or "val/loss",
        n_trials=file.n_trials,
        timeout=file.timeout,
        concurrency=file.concurrency,
        resources=file.resources,
        budget=file.budget,
        seed=file.seed,
        storage=file.storage,
        warmup_trials=file.pruner_warmup.trials,
        warmup_steps=file.pruner_warmup.steps if file.pruner_warmup.steps is not None else _val_every(base),
        startup_trials=_startup(file.startup_trials, sampler, file.n_trials),
        startup_given=file.startup_trials,
        diverged=file.diverged,
        seeds_per_trial=file.seeds_per_trial,
    )
    for pick in (0, -1):  # every parameter at its low end and at its high end must make a valid run
        _check_end(spec, file, origin, given, pick, base_origin)
    spec.warnings = refused_values(spec)
    return spec


def _structure(origin: Origin, data: dict[str, Any], folder: Path, base: dict[str, Any] | None):
    """(the file, its base, its space, where the base's keys are: None for a base given by the caller), every
    mistake of the file's structure at once: its keys, values, space and base (the base file's after its own)."""
    errors: list[SpecError] = []
    base_errors: list[SpecError] = []
    base_origin = None
    if base is None and "base" in data:
        try:
            base, base_origin = load_base(origin, data["base"], folder)
            base_errors = structure_errors(base_origin, base)
        except SpecError as err:
            errors += err.every()
    elif base is None:
        errors.append(origin.error(("base",), "is required"))
    has_base = base is not None
    base = dict(base or {})
    base.pop("name", None)
    valid = axis_keys(base) if has_base else []
    file_keys = list(SEARCH_KEYS) + [f"budget.{k}" for k in Budget.model_fields]
    file_keys += [f"resources.{k}" for k in Resources.model_fields]
    file = space = None
    try:
        file = validate(SearchFile, data, origin, file_keys + valid)
    except SpecError as err:  # the base's type is said once, by load_base
        errors += [e for e in err.every() if has_base or (e.key or "").split(".")[0] != "base"]
    body = data.get("space")
    try:  # without a base, the parameters are judged but not the keys they set
        space = parse_space(origin, body if isinstance(body, dict) else {}, valid if has_base else None)
    except SpecError as err:
        errors += err.every()
    if errors or base_errors:
        raise found(errors + base_errors)
    return file, base, space, base_origin


def _holds(data: Any, path: tuple) -> bool:
    for part in path:
        if not isinstance(data, dict) or part not in data:
            return False
        data = data[part]
    return True


def _check_end(
    spec: SearchSpec, file: SearchFile, origin: Origin, given: list, pick: int, base_origin: Origin | None
) -> None:
    """The space at its low (``pick`` 0) or high (-1) end makes a valid run (caught here, not in trial 17), which
    logs every objective and reports prune_on."""
    params = spec.assign(lambda p, pick=pick: p.end(pick))
    try:
        run = resolve_run({**spec.run_data(params), "name": spec.name}, Origin(None))
    except SpecError as err:  # blamed on the parameter that causes it (its key, or "n_heads=1000" named)
        end = "low" if pick == 0 else "high"
        cause = [k for k in params if k == err.key or k in err.involves]
        message = f"{err.message} (with the space at its {end} end: {params})"
        if cause:  # the key the model named, when it is not the parameter's own
            named = f"{err.key}: " if err.key and err.key != cause[0] else ""
            raise origin.error(("space", cause[0]), f"{named}{message}") from None
        path = tuple((err.key or "").split("."))
        if base_origin is not None and _holds(spec.base, path):  # the base's own mistake, whatever the space sets
            served = f" (base of {origin.source})" if base_origin.source != origin.source else ""
            raise base_origin.error(path, err.message + served) from None
        raise origin.error(("space",), message, key=f"space ({err.key})") from None
    logged = logged_metrics(run)
    for i, (metric, direction) in enumerate(given):
        where = ("objectives", i) if file.objectives else ()
        if problem := unknown_metric(metric, logged, "a search's objective is one value per trial"):
            raise origin.error((*where, "metric"), problem)
        if problem := direction_problem(metric, direction):
            raise origin.error((*where, "direction" if direction else "metric"), problem)
    if spec.pruner != "none":
        spec.prune_on, problem = pruned_on(file.prune_on, *spec.objectives[0], intermediate_metrics(run))
        if problem:
            raise origin.error(("prune_on",), problem)
