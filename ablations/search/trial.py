"""One trial of a search, in a Ray worker: train, report the intermediate metric to Optuna, stop when pruned.

A trial never raises: a failure is a result (status failed with its reason). Its heartbeat tells a later
process that it is alive (RDB storages).
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ablations.process import exit_quickly, import_paused, trial_modules
from ablations.search.setup import make_pruner, open_storage, trial_id
from record import vocabulary
from record.secrets import Credentials
from record.spec import Resources, resolve_run

if TYPE_CHECKING:
    from ablations.tracking import Hook


@dataclass(kw_only=True)
class TrialTask:
    spec_name: str
    storage: str
    number: int
    params: dict[str, Any]
    run_data: dict[str, Any]
    uri: str
    experiment: str
    parent_run_id: str
    objectives: list[tuple[str, str]]
    prune_on: str
    pruner: str
    warmup_trials: int = 2
    warmup_steps: int = 0
    seeds_per_trial: int = 1  # the run's seed and the next ones, each trained; the trial is told their mean
    code: dict[str, str]
    resources: Resources
    ray_storage: str  # where Ray Train keeps a data-parallel trial's state
    credentials: Credentials = field(default_factory=Credentials)  # the driver's MLflow credentials
    plugins: list = field(default_factory=list)  # models.plugins.PluginRef of every plugin the driver loaded


# A trial whose Optuna trial another process has ended: a search started again took it for lost (its driver was
# killed, or its heartbeat went stale), failed it and asked it again. Its retry is the trial's result; this one
# stops, and its MLflow run ends as killed instead of failed (or finished beside its retry).
TAKEN_OVER = "its trial was ended by another search process, which took it for lost and asks it again"
UNFENCED = "the Optuna storage did not say whether its trial still runs, so its result does not count"


# A storage briefly away (PostgreSQL restarting, its connections cut) costs a trial's report a wait, not the trial:
# the report is tried again for up to this many seconds; a storage away for longer fails the trial with its error.
STORAGE_PATIENCE = 60.0


def patiently(call):
    """``call()``, tried again while the storage is away for up to ``STORAGE_PATIENCE`` seconds (stores.patiently)."""
    from ablations.stores import patiently as patient

    return patient(call, STORAGE_PATIENCE)


def taken_from_it(storage, tid: int) -> str | None:
    """Why the trial's result must not count, or None while it still runs in the storage: the fence before its
    result. A storage briefly away is waited for; one that cannot say within ``STORAGE_PATIENCE`` fences it out too,
    since another process may have asked the trial again (the soak saw a check that read a restarting PostgreSQL as
    "still running" let a taken-over trial's result stand beside its retry's)."""
    try:
        ended = patiently(lambda: storage.get_trial(tid).state.is_finished())
    except Exception as err:
        return f"{UNFENCED}: {type(err).__name__}"
    return TAKEN_OVER if ended else None


def pruning_hooks(task: TrialTask, storage=None, last_step: int | None = None) -> list[Hook]:
    """Report ``prune_on`` to the trial at every validation and stop training when the pruner says so, except at
    ``last_step`` (pruning there saves nothing and loses a finished result). Optuna takes intermediate values
    from single-objective studies only: a multi-objective trial reports nothing. A trial that another process
    has ended stops as killed (``TAKEN_OVER``)."""
    import optuna
    from optuna.exceptions import UpdateFinishedTrialError

    from ablations.train import StopTraining

    if len(task.objectives) > 1:
        return []
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = storage or open_storage(task.storage)
    pruner = make_pruner(task.pruner, task.warmup_trials, task.warmup_steps)
    study = optuna.load_study(study_name=task.spec_name, storage=storage, pruner=pruner)
    # optuna.trial.Trial(study, trial_id) is the public way to act on a trial another process asked
    trial = optuna.trial.Trial(study, trial_id(storage, task.spec_name, task.number))

    def hook(step: int, metrics: dict[str, float]) -> None:
        value = metrics.get(task.prune_on)
        if value is None or not math.isfinite(value):
            return
        try:
            patiently(lambda: trial.report(value, step))
        except UpdateFinishedTrialError:
            raise StopTraining(vocabulary.STATUS_KILLED, TAKEN_OVER) from None
        if task.pruner != "none" and (last_step is None or step < last_step) and patiently(trial.should_prune):
            raise StopTraining(
                vocabulary.STATUS_PRUNED, f"pruned by the {task.pruner} pruner at {task.prune_on}={value:.4g}"
            )

    return [hook]


def trial_tags(task: TrialTask) -> dict[str, str]:
    return {
        vocabulary.TAG_KIND: vocabulary.KIND_TRIAL,
        vocabulary.TAG_STUDY: task.spec_name,
        vocabulary.TAG_TRIAL: str(task.number),
        vocabulary.TAG_PID: str(os.getpid()),
        vocabulary.TAG_HOST: socket.gethostname(),
        vocabulary.TAG_WORKERS: str(task.resources.workers),
        **task.code,
        **{f"{vocabulary.PARAM_PREFIX}{k}": str(v) for k, v in task.params.items()},
    }


def lost_attempts(task: TrialTask) -> None:
    """Runs of this trial left RUNNING by an attempt whose process died (Ray runs the trial again): KILLED."""
    try:
        running = vocabulary.running_runs(
            task.uri, task.experiment, vocabulary.KIND_TRIAL, trial=str(task.number), study=task.spec_name
        )
        for run in running:
            vocabulary.mark_killed(task.uri, run, "lost: its process or node died before it finished; run again")
    except Exception:  # the store is unreachable: the trial's own run will say so
        return


def _heartbeat(storage, tid: int) -> threading.Event:
    """Tells a later process that this trial is alive (RDB storages), until the event returned is set."""
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(5):
            with contextlib.suppress(Exception):
                storage.record_heartbeat(tid)

    if hasattr(storage, "record_heartbeat"):
        threading.Thread(target=beat, daemon=True).start()
    return stop


def seed_runs(task: TrialTask) -> list[dict[str, Any]]:
    """The trial's runs: its run at the run's seed and at each next one (``seeds_per_trial``). A task whose data
    follows the seed (a study's ``vary_data``: ``task.data_seed`` equal to the seed) regenerates it with each."""
    first = task.run_data.get("seed", 0)
    runs = []
    for seed in range(first, first + task.seeds_per_trial):
        data = {**task.run_data, "seed": seed}
        if isinstance(data.get("task"), dict) and data["task"].get("data_seed") == first:
            data["task"] = {**data["task"], "data_seed": seed}
        runs.append(data)
    return runs


def _train(task: TrialTask, storage, run_data: dict[str, Any], *, reports: bool = True):
    """One of the trial's runs, here or data-parallel on Ray Train (rank 0 reports to Optuna and prunes). Only
    the first run of a trial of several seeds reports its curve (``reports``): Optuna keeps one per trial."""
    from ablations.tracking import Tracking

    run = resolve_run({**run_data, "name": task.spec_name}, f"{task.spec_name} trial {task.number}")
    several = task.seeds_per_trial > 1
    where = Tracking(
        uri=task.uri,
        experiment=task.experiment,
        parent_run_id=task.parent_run_id,
        run_name=f"trial {task.number}" + (f" seed {run.seed}" if several else ""),
        tags=trial_tags(task) | {vocabulary.TAG_CONFIG_HASH: run.config_hash(workers=task.resources.workers)},
    )
    if task.resources.workers > 1:
        from functools import partial

        from ablations.parallel import ParallelJob, run_data_parallel

        hooks = partial(pruning_hooks, task, last_step=run.training.max_steps) if reports else (lambda: [])
        job = ParallelJob(run=run, where=where, resources=task.resources, rank0_hooks=hooks)
        return run_data_parallel(job, name=f"{task.spec_name}-trial-{task.number}", storage_path=task.ray_storage)
    # trained here: torch is imported only now (a data-parallel trial's task drives its workers, above)
    from ablations.train import train

    return train(run, where, hooks=pruning_hooks(task, storage, run.training.max_steps) if reports else [])


def _train_seeds(task: TrialTask, storage) -> tuple[Any, dict[str, float] | None, list[str]]:
    """Each of the trial's runs in turn: (the last run's result; the mean of every float metric the runs all
    logged, or None for a single run or when a run did not finish, whose result then stands for the trial; every
    run's id)."""
    results = []
    for i, data in enumerate(seed_runs(task)):
        result = _train(task, storage, data, reports=i == 0)
        results.append(result)
        if result.status != vocabulary.STATUS_FINISHED:
            if task.seeds_per_trial > 1:
                result.detail = f"seed {data['seed']}: {result.detail or result.status}"
            return result, None, [r.run_id for r in results]
    ids = [r.run_id for r in results]
    if len(results) == 1:
        return result, None, ids
    shared = set.intersection(*({k for k, v in r.metrics.items() if isinstance(v, float)} for r in results))
    return result, {k: sum(r.metrics[k] for r in results) / len(results) for k in sorted(shared)}, ids


def run_trial(task: TrialTask) -> dict[str, Any]:
    """Train one trial, reporting ``prune_on`` to Optuna at every validation; never raises (a failure is a result).

    With ``resources.workers > 1`` the trial trains data-parallel (Ray Train), and rank 0 reports and prunes."""
    task.credentials.apply()
    exit_quickly()  # this worker's process ends without collecting its libraries' garbage
    import_paused(["optuna", *trial_modules(task.uri, task.resources.workers)])  # and imports with it paused
    from models import plugins

    plugins.load_on_worker(task.plugins)  # raised (PluginUnavailable), never a trial's result: before its bookkeeping
    lost_attempts(task)
    try:  # a storage restarting is waited for; one that stays away fails the trial with its error
        storage = patiently(lambda: open_storage(task.storage))
        tid = patiently(lambda: trial_id(storage, task.spec_name, task.number))
    except Exception as err:
        reason = f"the Optuna storage did not answer: {type(err).__name__}: {err}"[:500]
        return {"status": "failed", "reason": reason, "values": None, "run_id": ""}
    stop = _heartbeat(storage, tid)
    try:
        result, mean, run_ids = _train_seeds(task, storage)
    except Exception as err:
        return {"status": "failed", "reason": f"{type(err).__name__}: {err}"[:500], "values": None, "run_id": ""}
    finally:
        stop.set()
    if result.status != vocabulary.STATUS_KILLED and (why := taken_from_it(storage, tid)):
        # ended while it trained its last steps (or reported nothing: several objectives): not a result either
        for run_id in filter(None, run_ids):
            with contextlib.suppress(Exception):
                vocabulary.end_run(task.uri, run_id, vocabulary.STATUS_KILLED, why)
        return {"status": vocabulary.STATUS_KILLED, "reason": why, "values": None, "run_id": result.run_id}
    metrics = result.metrics if mean is None else mean
    return {
        "status": result.status,
        "reason": result.detail,
        "values": [metrics.get(m) for m, _ in task.objectives],
        "run_id": result.run_id,
        "run_ids": run_ids,
        "metrics": {k: v for k, v in metrics.items() if isinstance(v, float)},
    }
