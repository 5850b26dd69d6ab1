"""``ablate search SPEC``: an Optuna search over run-configuration keys, its trials on Ray, tracked in MLflow.

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
prune_on: val/loss                     # the intermediate metric reported from inside training
n_trials: 20                           # in total, across every process on the study; failed trials count
timeout: 600                           # seconds this process asks for new trials (optional)
concurrency: 2                         # trials at once in this process
resources: {cpus: 1, gpus: 0}          # per trial; workers: 2 trains each trial data-parallel
budget: {steps: 300}                   # per trial
seed: 0                                # of the sampler
storage: null                          # default: SQLite in .ablate/optuna.db; or a URL, or journal:PATH
```

The driver asks Optuna for trials (define-by-run, so conditional keys work), runs each as a Ray task with
the trial's resources, and tells Optuna the result as it arrives (the sampler learns from every finished
trial). Inside the task, every validation reports the ``prune_on`` metric to Optuna through the shared
storage and asks whether to stop; a pruned trial ends early as a result. Running the same command again
resumes the study up to ``n_trials``; a trial left running by a dead process is failed and asked again
with the same parameters. Several processes may work on one study at once through a shared storage.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ablations import tracking
from ablations.spec import SpecError, apply_overrides, read_yaml, resolve_run
from ablations.study import Resources, _base, _budget, _check_axis, _mapping, _resources, valid_axis_keys

if TYPE_CHECKING:
    from ablations.train import Hook

SAMPLERS = ("tpe", "random", "cmaes", "gp", "nsga2")
PRUNERS = ("median", "successive_halving", "hyperband", "wilcoxon", "none")
SEARCH_KEYS = (
    "name",
    "description",
    "base",
    "space",
    "objectives",
    "metric",
    "direction",
    "sampler",
    "pruner",
    "prune_on",
    "n_trials",
    "timeout",
    "concurrency",
    "resources",
    "budget",
    "seed",
    "storage",
)
KIND_SEARCH, KIND_TRIAL = "search", "trial"


@dataclass(frozen=True)
class Param:
    key: str
    type: str  # float | int | categorical
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    choices: tuple = ()
    when: dict[str, Any] = field(default_factory=dict)

    def active(self, params: dict[str, Any]) -> bool:
        """Whether the conditions hold: each ``when`` key has its value (or one of a list of values)."""
        return all(params.get(k) in (v if isinstance(v, list) else [v]) for k, v in self.when.items())

    def suggest(self, trial) -> Any:
        if self.type == "float":
            return trial.suggest_float(self.key, self.low, self.high, log=self.log, step=self.step)
        if self.type == "int":
            return trial.suggest_int(self.key, int(self.low), int(self.high), log=self.log, step=int(self.step or 1))
        return trial.suggest_categorical(self.key, list(self.choices))


@dataclass
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
    budget: dict[str, float]
    seed: int
    storage: str | None

    @property
    def directions(self) -> list[str]:
        return [d for _, d in self.objectives]

    def run_data(self, params: dict[str, Any]) -> dict[str, Any]:
        """The run configuration of a trial: the base, the budget, the trial's parameters."""
        overrides = {"resources.threads": max(1, int(self.resources.per_worker_cpus))}
        if "steps" in self.budget:
            overrides["training.max_steps"] = self.budget["steps"]
        if "time" in self.budget:
            overrides["training.max_time"] = float(self.budget["time"])
        overrides.update(params)
        return apply_overrides(self.base, [(k.split("."), v) for k, v in overrides.items()])


def _param(source: str, key: str, body: Any, valid: list[str]) -> Param:
    where = f"space.{key}"
    _check_axis(source, where, key, valid)
    body = _mapping(source, where, body)
    kind = body.get("type")
    allowed = {
        "float": {"type", "low", "high", "log", "step", "when"},
        "int": {"type", "low", "high", "log", "step", "when"},
        "categorical": {"type", "choices", "when"},
    }
    if kind not in allowed:
        raise SpecError(source, f"{where}.type", f"{kind!r} is not a valid choice; valid: float, int, categorical")
    extra = sorted(set(body) - allowed[kind])
    if extra:
        raise SpecError(
            source,
            f"{where}.{extra[0]}",
            f"unknown key for a {kind} parameter; valid: {', '.join(sorted(allowed[kind]))}",
        )
    when = dict(_mapping(source, f"{where}.when", body.get("when") or {}))
    if kind == "categorical":
        choices = body.get("choices")
        if not isinstance(choices, list) or not choices:
            raise SpecError(source, f"{where}.choices", "must be a non-empty list of values")
        return Param(key, kind, choices=tuple(choices), when=when)
    low, high, log, step = body.get("low"), body.get("high"), body.get("log", False), body.get("step")
    for name, v in (("low", low), ("high", high)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (kind == "int" and not isinstance(v, int)):
            raise SpecError(source, f"{where}.{name}", f"{v!r} must be {'an integer' if kind == 'int' else 'a number'}")
    if not low < high:
        raise SpecError(source, where, f"low={low} must be below high={high}")
    if not isinstance(log, bool):
        raise SpecError(source, f"{where}.log", f"{log!r} must be true or false")
    if log and low <= 0:
        raise SpecError(source, f"{where}.low", f"a log scale needs low > 0 (got {low})")
    if step is not None and (isinstance(step, bool) or not isinstance(step, (int, float)) or step <= 0 or log):
        raise SpecError(source, f"{where}.step", f"{step!r} must be a positive number, and cannot go with log: true")
    return Param(key, kind, float(low), float(high), log, step, when=when)


def _objectives(source: str, data: dict) -> list[tuple[str, str]]:
    if "objectives" in data and ("metric" in data or "direction" in data):
        raise SpecError(source, "objectives", "give either objectives (a list) or metric and direction, not both")
    items = data.get("objectives") or [
        {"metric": data.get("metric", "final/val_loss"), "direction": data.get("direction", "minimize")}
    ]
    if not isinstance(items, list):
        raise SpecError(source, "objectives", "must be a list of {metric, direction}")
    out = []
    for i, item in enumerate(items):
        item = _mapping(source, f"objectives[{i}]", item)
        metric, direction = item.get("metric"), item.get("direction", "minimize")
        if not isinstance(metric, str) or "/" not in metric:
            raise SpecError(
                source,
                f"objectives[{i}].metric",
                f"{metric!r} must name a summary metric such as final/val_loss or cost/tokens_per_s",
            )
        if direction not in ("minimize", "maximize"):
            raise SpecError(
                source, f"objectives[{i}].direction", f"{direction!r} is not a valid choice; valid: minimize, maximize"
            )
        out.append((metric, direction))
    return out


def _positive_int(source: str, key: str, v: Any, allow_none: bool = True) -> int | None:
    if v is None and allow_none:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise SpecError(source, key, f"{v!r} must be a positive integer")
    return v


def load_search(
    path: str | Path, data: dict[str, Any] | None = None, *, base: dict[str, Any] | None = None
) -> SearchSpec:
    """Read and check a search file (or a study's ``tune:`` section, with its base). Raises SpecError."""
    path = Path(path)
    source = str(path)
    data = read_yaml(path) if data is None else data
    unknown = sorted(set(data) - set(SEARCH_KEYS))
    if unknown:
        raise SpecError(source, unknown[0], f"unknown key; valid: {', '.join(SEARCH_KEYS)}")
    for required in ("name", "space") + (("base",) if base is None else ()):
        if required not in data:
            raise SpecError(source, required, "is required")
    name = data["name"]
    if not isinstance(name, str) or not name.replace("_", "").replace("-", "").replace(".", "").isalnum():
        raise SpecError(source, "name", f"{name!r} must be letters, digits, '_', '-' or '.'")
    base = dict(base) if base is not None else _base(source, data["base"], path.parent)
    base.pop("name", None)
    valid = valid_axis_keys(base)
    space_body = _mapping(source, "space", data["space"])
    if not space_body:
        raise SpecError(source, "space", "is empty: name at least one key with its range")
    space = [_param(source, k, v, valid) for k, v in space_body.items()]
    keys = {p.key: p for p in space}
    for p in space:
        for k, v in p.when.items():
            if k not in keys or keys[k].type != "categorical":
                raise SpecError(source, f"space.{p.key}.when.{k}", "must name a categorical parameter of the space")
            for one in v if isinstance(v, list) else [v]:
                if one not in keys[k].choices:
                    raise SpecError(
                        source, f"space.{p.key}.when.{k}", f"{one!r} is not one of its choices {list(keys[k].choices)}"
                    )
    ordered: list[Param] = []  # conditions first: a parameter comes after the ones its `when` names
    while len(ordered) < len(space):
        ready = [p for p in space if p not in ordered and all(keys[k] in ordered for k in p.when)]
        if not ready:
            raise SpecError(source, "space", "the `when` conditions form a cycle")
        ordered += ready
    space = ordered
    objectives = _objectives(source, data)
    sampler = data.get("sampler", "tpe" if len(objectives) == 1 else "nsga2")
    if sampler not in SAMPLERS:
        raise SpecError(source, "sampler", f"{sampler!r} is not a valid choice; valid: {', '.join(SAMPLERS)}")
    if sampler in ("cmaes",) and len(objectives) > 1:
        raise SpecError(source, "sampler", "cmaes optimises one objective; use nsga2 (or tpe, gp) for several")
    pruner = data.get("pruner", "median" if len(objectives) == 1 else "none")
    if pruner not in PRUNERS:
        raise SpecError(source, "pruner", f"{pruner!r} is not a valid choice; valid: {', '.join(PRUNERS)}")
    if pruner != "none" and len(objectives) > 1:
        raise SpecError(source, "pruner", "Optuna prunes single-objective searches only; set pruner: none")
    prune_on = data.get("prune_on", "val/loss")
    if not isinstance(prune_on, str) or not prune_on.startswith("val/"):
        raise SpecError(
            source, "prune_on", f"{prune_on!r} must be a validation metric reported while training, e.g. val/loss"
        )
    n_trials = _positive_int(source, "n_trials", data.get("n_trials"))
    timeout = data.get("timeout")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0):
        raise SpecError(source, "timeout", f"{timeout!r} must be a positive number of seconds")
    if n_trials is None and timeout is None:
        raise SpecError(source, "n_trials", "give n_trials, timeout, or both: a search needs an end")
    resources = _resources(source, data.get("resources"))
    storage = data.get("storage")
    if storage is not None and not isinstance(storage, str):
        raise SpecError(source, "storage", "must be a storage URL (sqlite:///..., postgresql://...) or journal:PATH")
    seed = data.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise SpecError(source, "seed", f"{seed!r} must be an integer")
    description = data.get("description", "")
    spec = SearchSpec(
        name,
        description if isinstance(description, str) else "",
        source,
        base,
        space,
        objectives,
        sampler,
        pruner,
        prune_on,
        n_trials,
        float(timeout) if timeout else None,
        _positive_int(source, "concurrency", data.get("concurrency", 1), False),
        resources,
        _budget(source, data.get("budget")),
        seed,
        storage,
    )
    # every parameter at its low end and at its high end must make a valid run (caught here, not in trial 17)
    for pick in (0, -1):
        params = {}
        for p in space:
            if p.active(params):
                params[p.key] = p.choices[pick] if p.type == "categorical" else (p.low if pick == 0 else p.high)
                if p.type == "int":
                    params[p.key] = int(params[p.key])
        try:
            resolve_run(
                {**spec.run_data(params), "name": name}, f"{source} (space at its {'low' if pick == 0 else 'high'} end)"
            )
        except SpecError as err:
            raise SpecError(source, f"space ({err.key})", f"{err.message}; at {params}") from None
    return spec


# --- storage ------------------------------------------------------------------------------------------


def storage_url(spec: SearchSpec, override: str | None = None) -> str:
    return (
        override
        or spec.storage
        or os.environ.get("ABLATE_OPTUNA_STORAGE")
        or f"sqlite:///{tracking.home() / 'optuna.db'}"
    )


def open_storage(url: str):
    """An Optuna storage: RDB (SQLite, PostgreSQL, ...) with heartbeats, or a journal file (journal:PATH)."""
    import optuna

    if url.startswith("journal:"):
        from optuna.storages.journal import JournalFileBackend

        path = Path(url.removeprefix("journal:")).expanduser().resolve()
        path.parent.mkdir(parents=True, exist_ok=True)
        return optuna.storages.JournalStorage(JournalFileBackend(str(path)))
    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    with (
        warnings.catch_warnings(),
        tracking.sqlite_first_use(url) if url.startswith("sqlite:///") else contextlib.nullcontext(),
    ):
        warnings.simplefilter("ignore")  # Optuna marks heartbeats experimental
        return optuna.storages.RDBStorage(
            url,
            heartbeat_interval=10,
            grace_period=60,
            heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=1),
            engine_kwargs={"pool_pre_ping": True} if not url.startswith("sqlite") else None,
        )


def make_sampler(spec: SearchSpec):
    import optuna

    s = spec.sampler
    if s == "tpe":
        return optuna.samplers.TPESampler(seed=spec.seed, multivariate=True, group=True, constant_liar=True)
    if s == "random":
        return optuna.samplers.RandomSampler(seed=spec.seed)
    if s == "cmaes":
        return optuna.samplers.CmaEsSampler(seed=spec.seed, warn_independent_sampling=False)
    if s == "gp":
        return optuna.samplers.GPSampler(seed=spec.seed)
    return optuna.samplers.NSGAIISampler(seed=spec.seed)


def make_pruner(p: str):
    """The pruner named ``p``. The storage keeps no pruner: the driver and every trial must build the same one."""
    import optuna

    if p == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=0)
    if p == "successive_halving":
        return optuna.pruners.SuccessiveHalvingPruner()
    if p == "hyperband":
        return optuna.pruners.HyperbandPruner()
    if p == "wilcoxon":
        return optuna.pruners.WilcoxonPruner()
    return optuna.pruners.NopPruner()


# --- one trial (in a Ray worker) ---------------------------------------------------------------------


@dataclass
class TrialTask:
    spec_name: str
    storage: str
    trial_id: int
    number: int
    params: dict[str, Any]
    run_data: dict[str, Any]
    uri: str
    experiment: str
    parent_run_id: str
    objectives: list[tuple[str, str]]
    prune_on: str
    pruner: str
    code: dict[str, str]
    resources: Resources
    ray_storage: str  # where Ray Train keeps a data-parallel trial's state


def pruning_hooks(task: TrialTask, storage=None, last_step: int | None = None) -> list[Hook]:
    """Report ``prune_on`` to the trial at every validation and stop training when the pruner says so, except at
    ``last_step`` (pruning there saves nothing and loses a finished result). Optuna takes intermediate values
    from single-objective studies only: a multi-objective trial reports nothing."""
    import optuna

    from ablations.train import StopTraining

    if len(task.objectives) > 1:
        return []
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = storage or open_storage(task.storage)
    study = optuna.load_study(study_name=task.spec_name, storage=storage, pruner=make_pruner(task.pruner))
    trial = optuna.Trial(study, task.trial_id)

    def hook(step: int, metrics: dict[str, float]) -> None:
        value = metrics.get(task.prune_on)
        if value is None or not math.isfinite(value):
            return
        trial.report(value, step)
        if task.pruner != "none" and (last_step is None or step < last_step) and trial.should_prune():
            raise StopTraining(
                tracking.STATUS_PRUNED, f"pruned by the {task.pruner} pruner at {task.prune_on}={value:.4g}"
            )

    return [hook]


def run_trial(task: TrialTask) -> dict[str, Any]:
    """Train one trial, reporting ``prune_on`` to Optuna at every validation; never raises (a failure is a result).

    With ``resources.workers > 1`` the trial trains data-parallel (Ray Train), and rank 0 reports and prunes."""
    from ablations.train import Tracking, train

    storage = open_storage(task.storage)
    stop = threading.Event()

    def beat() -> None:  # tells a later process that this trial is alive (RDB storages)
        while not stop.wait(5):
            with contextlib.suppress(Exception):
                storage.record_heartbeat(task.trial_id)

    if hasattr(storage, "record_heartbeat"):
        threading.Thread(target=beat, daemon=True).start()
    tags = {
        "kind": KIND_TRIAL,
        "study": task.spec_name,
        "trial": str(task.number),
        "optuna_trial_id": str(task.trial_id),
        "pid": str(os.getpid()),
        "host": socket.gethostname(),
        "workers": str(task.resources.workers),
        **task.code,
        **{f"param.{k}": str(v) for k, v in task.params.items()},
    }
    try:
        run = resolve_run({**task.run_data, "name": task.spec_name}, f"{task.spec_name} trial {task.number}")
        where = Tracking(task.uri, task.experiment, task.parent_run_id, f"trial {task.number}", tags)
        if task.resources.workers > 1:
            from functools import partial

            from ablations.parallel import ParallelJob, run_data_parallel

            job = ParallelJob(
                run, where, task.resources, rank0_hooks=partial(pruning_hooks, task, last_step=run.training.max_steps)
            )
            result = run_data_parallel(job, name=f"{task.spec_name}-trial-{task.number}", storage_path=task.ray_storage)
        else:
            result = train(run, where, hooks=pruning_hooks(task, storage, run.training.max_steps))
    except Exception as err:
        return {"status": "failed", "reason": f"{type(err).__name__}: {err}"[:500], "values": None, "run_id": ""}
    finally:
        stop.set()
    values = [result.metrics.get(m) for m, _ in task.objectives]
    return {
        "status": result.status,
        "reason": result.detail,
        "values": values,
        "run_id": result.run_id,
        "metrics": {k: v for k, v in result.metrics.items() if isinstance(v, float)},
    }


# --- the driver -------------------------------------------------------------------------------------------


@dataclass
class SearchResult:
    name: str
    storage: str
    parent_run_id: str
    counts: dict[str, int]
    best: list[dict[str, Any]]  # the best trial (several on a Pareto front): number, params, values
    tracking_uri: str


def _stale_trials(study) -> list:
    """RUNNING trials whose driver is gone: asked on this machine by a process that no longer exists."""
    from optuna.trial import TrialState

    stale = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        host, pid = t.system_attrs.get("ablate:host"), t.system_attrs.get("ablate:pid")
        if host == socket.gethostname() and isinstance(pid, int) and pid != os.getpid():
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                stale.append(t)
            except PermissionError:
                pass
    return stale


def counted_trials(study) -> int:
    """Trials asked so far, failed ones included (a search whose trials all fail ends), except those that did
    not end by themselves (a dead process, Ctrl-C, a stale heartbeat): they are asked again, and the retry
    counts instead."""
    import optuna
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    retried = {t.user_attrs.get("retry_of") for t in trials}
    with warnings.catch_warnings():  # Optuna marks its retry bookkeeping experimental
        warnings.simplefilter("ignore")
        for t in trials:  # trials whose heartbeat stopped, asked again by Optuna's own callback
            retried.update(optuna.storages.RetryHeartbeatStaleTrialCallback.retry_history(t))
    return sum(
        t.state != TrialState.WAITING and not (t.state == TrialState.FAIL and t.number in retried) for t in trials
    )


def _fail_and_ask_again(study, number: int, params: dict[str, Any]) -> None:
    """A trial that did not end by itself (its process died, or Ctrl-C): failed, and queued again with the same
    parameters; the retry, not the lost trial, counts towards ``n_trials``."""
    from optuna.trial import TrialState

    study.tell(number, state=TrialState.FAIL)
    study.enqueue_trial(params, user_attrs={"retry_of": number}, skip_if_exists=False)


def _suggest(spec: SearchSpec, trial) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for p in spec.space:
        if p.active(params):
            params[p.key] = p.suggest(trial)
    return params


def run_search(
    spec: SearchSpec,
    *,
    address: str | None = None,
    tracking_uri: str | None = None,
    storage: str | None = None,
    num_cpus: int | None = None,
    experiment: str | None = None,
    out: Callable[[str], None] = print,
) -> SearchResult:
    """Ask, run on Ray, tell, until the study has ``n_trials`` or this process's ``timeout`` ends."""
    import optuna
    from optuna.trial import TrialState

    from ablations.cluster import check_fits, connect, is_loopback_address

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    uri = tracking.resolve_uri(tracking_uri)
    url = storage_url(spec, storage)
    address = address or os.environ.get("RAY_ADDRESS") or None
    if not is_loopback_address(address) and (
        uri.startswith(("sqlite:", "file:")) or url.startswith(("sqlite:", "journal:"))
    ):
        raise ValueError(
            f"the Ray cluster at {address} cannot write to local stores ({uri}, {url}); use an MLflow "
            "server (--tracking-uri) and a shared Optuna storage (--storage postgresql://...)"
        )
    check_fits(address, num_cpus, spec.resources.cpus, spec.resources.gpus)
    st = open_storage(url)
    study = optuna.create_study(
        study_name=spec.name,
        storage=st,
        sampler=make_sampler(spec),
        pruner=make_pruner(spec.pruner),
        directions=spec.directions,
        load_if_exists=True,
    )
    known = study.user_attrs.get("objectives")
    if known and [tuple(o) for o in known] != spec.objectives:
        raise ValueError(
            f"the Optuna study {spec.name!r} in {url} was created with objectives {known}; this spec has "
            f"{spec.objectives}: give the search another name"
        )
    study.set_user_attr("objectives", [list(o) for o in spec.objectives])
    # trials a dead process left running: failed, and asked again with the same parameters (on this machine by
    # the pid of the process that asked them; elsewhere, RDB storages, by their heartbeat)
    for t in _stale_trials(study):
        _fail_and_ask_again(study, t.number, t.params)
        out(f"trial {t.number} was left running by a process that stopped: failed, and asked again")
    with contextlib.suppress(Exception), warnings.catch_warnings():  # storages without heartbeats: nothing to do
        warnings.simplefilter("ignore")
        optuna.storages.fail_stale_trials(study)

    experiment = experiment or spec.name
    exp_id = tracking.experiment_id(uri, experiment)
    c = tracking.client(uri)
    parent = c.create_run(
        exp_id,
        run_name=f"search {spec.name}",
        tags={
            "kind": KIND_SEARCH,
            "study": spec.name,
            "storage": url if "@" not in url else url.split("@")[-1],
            "sampler": spec.sampler,
            "pruner": spec.pruner,
            "status_detail": "running",
            **tracking.code_version(),
        },
    )
    parent_id = parent.info.run_id
    from mlflow.entities import Param as MLParam

    c.log_batch(
        parent_id,
        params=[
            MLParam("sampler", spec.sampler),
            MLParam("pruner", spec.pruner),
            MLParam("objectives", ",".join(f"{m}:{d}" for m, d in spec.objectives)),
            MLParam("n_trials", str(spec.n_trials)),
            MLParam("space", ",".join(p.key for p in spec.space)),
        ],
    )
    if Path(spec.source).exists():
        c.log_artifact(parent_id, spec.source)
    code = tracking.code_version()

    parallel = spec.resources.workers > 1
    conn = connect(address, num_cpus=num_cpus, dashboard=parallel)
    import ray

    # a data-parallel trial's task only drives: its workers get the resources, in their own placement group
    remote = ray.remote(run_trial).options(
        num_cpus=0 if parallel else spec.resources.cpus,
        num_gpus=None if parallel else spec.resources.gpus or None,
        max_retries=0,
    )
    running: dict[Any, tuple[int, float]] = {}  # future -> (trial number, start time)
    t0, status = time.monotonic(), tracking.STATUS_FAILED

    def can_ask() -> bool:
        if spec.timeout is not None and time.monotonic() - t0 > spec.timeout:
            return False
        return spec.n_trials is None or counted_trials(study) < spec.n_trials

    out(
        f"search {spec.name!r}: {spec.sampler} sampler, {spec.pruner} pruner, {spec.concurrency} trial(s) at once; "
        f"storage {url}; MLflow parent run {parent_id}"
    )
    try:
        while True:
            while len(running) < spec.concurrency and can_ask():
                with warnings.catch_warnings():  # "heartbeats are meant for Study.optimize": we beat them ourselves
                    warnings.simplefilter("ignore", UserWarning)
                    trial = study.ask()
                params = _suggest(spec, trial)
                trial.storage.set_trial_system_attr(trial._trial_id, "ablate:host", socket.gethostname())  # noqa: SLF001
                trial.storage.set_trial_system_attr(trial._trial_id, "ablate:pid", os.getpid())  # noqa: SLF001
                try:
                    data = spec.run_data(params)
                    resolve_run({**data, "name": spec.name}, f"{spec.source} (trial {trial.number})")
                except SpecError as err:  # an impossible combination: a failed trial with its reason
                    study.tell(trial, state=TrialState.FAIL)
                    out(f"trial {trial.number} refused: {err.message} ({params})")
                    continue
                task = TrialTask(
                    spec.name,
                    url,
                    trial._trial_id,
                    trial.number,
                    params,
                    data,
                    uri,
                    experiment,  # noqa: SLF001
                    parent_id,
                    spec.objectives,
                    spec.prune_on,
                    spec.pruner,
                    code,
                    spec.resources,
                    str(tracking.home() / "ray_results"),
                )
                running[remote.remote(task)] = (trial.number, time.monotonic())
            if not running:
                break
            done, _ = ray.wait(list(running), num_returns=1, timeout=5.0)
            for ref in done:
                number, started = running.pop(ref)
                result = ray.get(ref)
                state = _tell(study, number, result, spec)
                if result.get("run_id"):
                    c.set_tag(result["run_id"], "optuna_state", state)
                out(_progress_line(study, spec, number, state, result, time.monotonic() - started, len(running), t0))
        status = tracking.STATUS_FINISHED
    except KeyboardInterrupt:
        status = tracking.STATUS_KILLED
        for ref in running:
            ray.cancel(ref, force=True)
        for number, _ in running.values():  # interrupted, not failed by itself: the next run asks it again
            _fail_and_ask_again(study, number, study.trials[number].params)
        raise
    finally:
        counts = _counts(study)
        best = _best(study, spec)
        _finish_parent(c, parent_id, spec, study, counts, best, status)
        conn.close()
    return SearchResult(spec.name, url, parent_id, counts, best, uri)


def _tell(study, number: int, result: dict[str, Any], spec: SearchSpec) -> str:
    from optuna.trial import TrialState

    status, values = result["status"], result.get("values")
    if status == tracking.STATUS_PRUNED:
        study.tell(number, state=TrialState.PRUNED)
        return "PRUNED"
    if status == tracking.STATUS_FINISHED and values and all(v is not None and math.isfinite(v) for v in values):
        study.tell(number, values if len(values) > 1 else values[0])
        return "COMPLETE"
    study.tell(number, state=TrialState.FAIL)  # diverged, failed, or no value for an objective
    return "FAIL"


def _progress_line(
    study, spec: SearchSpec, number: int, state: str, result: dict, seconds: float, running: int, t0: float
) -> str:
    c = _counts(study)
    done = c.get("COMPLETE", 0) + c.get("PRUNED", 0)
    goal = f"/{spec.n_trials}" if spec.n_trials else ""
    value = ""
    if state == "COMPLETE":
        value = " " + ", ".join(f"{m}={v:.4g}" for (m, _), v in zip(spec.objectives, result["values"]))
    elif result.get("reason"):
        value = f" ({result['reason'][:120]})"
    elif state == "FAIL" and result.get("values"):
        missing = [m for (m, _), v in zip(spec.objectives, result["values"]) if v is None or not math.isfinite(v)]
        value = f" (the run recorded no finite {', '.join(missing)})" if missing else f" ({result['status']})"
    best = ""
    if len(spec.objectives) == 1 and c.get("COMPLETE"):
        with contextlib.suppress(ValueError):
            best = f"; best {study.best_value:.4g} (trial {study.best_trial.number})"
    return (
        f"[{int(time.monotonic() - t0)}s] trial {number} {state.lower()}{value} in {seconds:.0f}s; "
        f"{done}{goal} done, {c.get('FAIL', 0)} failed, {running} running{best}"
    )


def _counts(study) -> dict[str, int]:
    from collections import Counter

    return dict(Counter(t.state.name for t in study.get_trials(deepcopy=False)))


def _best(study, spec: SearchSpec) -> list[dict[str, Any]]:
    try:
        trials = study.best_trials
    except Exception:
        return []
    return [
        {"number": t.number, "params": t.params, "values": dict(zip([m for m, _ in spec.objectives], t.values))}
        for t in trials
    ]


def _finish_parent(
    c, parent_id: str, spec: SearchSpec, study, counts: dict[str, int], best: list[dict], status: str
) -> None:
    import json

    from mlflow.entities import Metric, RunTag

    now = int(time.time() * 1000)
    metrics = [Metric(f"trials_{k.lower()}", float(v), now, 0) for k, v in counts.items()]
    tags = [RunTag("status_detail", status)]
    if best:
        top = best[0]
        metrics += [Metric(f"best/{m}", float(v), now, 0) for m, v in top["values"].items()]
        tags += [RunTag("best_trial", str(top["number"]))] + [
            RunTag(f"best.{k}", str(v)) for k, v in top["params"].items()
        ]
    c.log_batch(parent_id, metrics=metrics, tags=tags)
    c.log_text(parent_id, json.dumps({"counts": counts, "best": best}, indent=1, default=str), "best.json")
    with contextlib.suppress(Exception):
        page = plots_html(study, spec)
        if page:
            c.log_text(parent_id, page, "optuna_plots.html")
    c.set_terminated(parent_id, tracking.MLFLOW_STATUS[status])


def plots_html(study, spec: SearchSpec) -> str:
    """Optuna's plots in one self-contained page: history, parallel coordinates, parameter importances
    (PED-ANOVA and fANOVA), and the Pareto front when there are several objectives."""
    import optuna.visualization as vis
    from optuna.importance import FanovaImportanceEvaluator, PedAnovaImportanceEvaluator
    from optuna.trial import TrialState

    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if len(complete) < 2:
        return ""
    names = [m for m, _ in spec.objectives]
    figs = []
    if len(names) == 1:
        figs.append(("optimisation history", vis.plot_optimization_history(study, target_name=names[0])))
        figs.append(("parallel coordinates", vis.plot_parallel_coordinate(study, target_name=names[0])))
        if len({k for t in complete for k in t.params}) > 0 and len(complete) >= 3:
            for label, ev in (
                ("PED-ANOVA", PedAnovaImportanceEvaluator()),
                ("fANOVA", FanovaImportanceEvaluator(seed=0)),
            ):
                with contextlib.suppress(Exception):
                    figs.append(
                        (
                            f"parameter importance ({label})",
                            vis.plot_param_importances(study, evaluator=ev, target_name=names[0]),
                        )
                    )
        figs.append(("intermediate values", vis.plot_intermediate_values(study)))
    else:
        figs.append(("Pareto front", vis.plot_pareto_front(study, target_names=names)))
        for i, n in enumerate(names):
            figs.append(
                (
                    f"history of {n}",
                    vis.plot_optimization_history(study, target=lambda t, i=i: t.values[i], target_name=n),
                )
            )
    parts, first = [], True
    for title, fig in figs:
        parts.append(f"<h2>{title}</h2>" + fig.to_html(full_html=False, include_plotlyjs=first))
        first = False
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{spec.name}: Optuna plots</title></head>"
        f"<body style='font-family:sans-serif;max-width:1200px;margin:auto'><h1>{spec.name}</h1>{''.join(parts)}"
        "</body></html>"
    )


def format_best(result: SearchResult) -> str:
    if not result.best:
        return "no trial completed"
    lines = []
    for b in result.best:
        values = ", ".join(f"{k}={v:.4g}" for k, v in b["values"].items())
        params = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in b["params"].items())
        lines.append(f"trial {b['number']}: {values}\n  {params}")
    return "\n".join(lines)


# --- tuned ablations ---------------------------------------------------------------------------------


def tune_study(
    study,
    *,
    uri: str,
    address: str | None,
    num_cpus: int | None,
    storage: str | None,
    out: Callable[[str], None] = print,
):
    """Each variant's own search (the same space and budget for all), then its cells at its best parameters.

    Searches are Optuna studies named ``STUDY.tune.VARIANT``, tracked in the MLflow experiment ``STUDY.tuning``;
    they resume like any search, so a resubmitted study finds them done and gets the same cells (whose ids
    include the tuned values), trained exactly once.
    """
    import dataclasses
    import re

    from ablations.study import Cell

    best: dict[str, dict[str, Any]] = {}
    for variant in study.variants:
        cell = next(c for c in study.cells if c.variant == variant)
        base = cell.run.to_dict()
        base.pop("name", None)
        base.pop("seed", None)
        slug = re.sub(r"[^\w.\-]+", "_", variant).strip("_") or "variant"
        spec = load_search(study.source, {**study.tune, "name": f"{study.name}.tune.{slug}"}, base=base)
        out(
            f"tuning {variant!r}: {spec.n_trials} trial(s) of {', '.join(p.key for p in spec.space)} "
            f"({spec.sampler}, {spec.pruner} pruner) on {', '.join(m for m, _ in spec.objectives)}"
        )
        result = run_search(
            spec,
            address=address,
            tracking_uri=uri,
            storage=storage,
            num_cpus=num_cpus,
            experiment=f"{study.name}.tuning",
            out=lambda line: out("  " + line),
        )
        if not result.best:
            raise RuntimeError(f"tuning {variant!r} completed no trial; see the MLflow experiment {study.name}.tuning")
        best[variant] = result.best[0]["params"]
        shown = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in best[variant].items())
        out(f"  best for {variant!r}: {shown}")
    cells = []
    for cell in study.cells:
        data = cell.run.to_dict()
        tuned = apply_overrides(data, [(k.split("."), v) for k, v in best[cell.variant].items()])
        run = resolve_run(tuned, f"{study.source} (variant {cell.variant!r}, tuned)")
        cells.append(
            Cell(
                cell.variant,
                {**cell.settings, **{f"tuned:{k}": v for k, v in best[cell.variant].items()}},
                cell.seed,
                run,
            )
        )
    return dataclasses.replace(study, cells=cells)
