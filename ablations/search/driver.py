"""``ablate search SPEC``: an Optuna search over run-configuration keys, its trials on Ray, tracked in MLflow.

The driver asks Optuna for trials (define-by-run, so conditional keys work), runs each as a Ray task with
the trial's resources (``ablations.search.trial``), and tells Optuna the result as it arrives (the sampler
learns from every finished trial). Inside the task, every validation reports the ``prune_on`` metric to
Optuna through the shared storage and asks whether to stop; a pruned trial ends early as a result. Running
the same command again resumes the study up to ``n_trials``; a trial left running by a dead process is failed
and asked again with the same parameters. Several processes may work on one study at once through a shared
storage.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ablations import tracking
from ablations.search.ledger import (
    FAILURE_ATTR,
    HOST_ATTR,
    PID_ATTR,
    SURPLUS_ATTR,
    counted_trials,
    fail_and_ask_again,
    stale_trials,
    surplus,
    tell,
)
from ablations.search.results import best_trials, counts, finish_parent, last_parent
from ablations.search.runs import end_dead_search_runs, end_orphaned_trial_runs, open_parent
from ablations.search.setup import make_pruner, make_sampler, open_storage, process_seed, storage_problem, storage_url
from ablations.search.trial import TrialTask, run_trial
from ablations.shell import cluster_address, open_ray, refuse_unreachable
from models import plugins
from record import vocabulary
from record.secrets import Credentials, redact_url
from record.spec import SearchSpec, SpecError, resolve_run


@dataclass(kw_only=True)
class SearchResult:
    name: str
    storage: str
    parent_run_id: str | None  # None: nothing was asked and no parent run is in the store
    counts: dict[str, int]
    best: list[dict[str, Any]]  # the best trial (several on a Pareto front): number, params, values
    tracking_uri: str


def other_objectives(study, spec: SearchSpec, url: str) -> str | None:
    """A study of the spec's name created with other objectives: the search refuses to join it."""
    known = study.user_attrs.get("objectives")
    if not known or [tuple(o) for o in known] == spec.objectives:
        return None
    return (
        f"the Optuna study {spec.name!r} in {redact_url(url)} was created with objectives {known}; this spec has "
        f"{spec.objectives}: give the search another name"
    )


def _open_study(spec: SearchSpec, url: str, out: Callable[[str], None]):
    """The Optuna study (created, or joined and resumed), its lost trials failed and asked again. The process that
    creates it samples with the spec's seed; a process that joins or resumes it with a seed of its own (two
    samplers with one seed would propose the same trials)."""
    import optuna

    if problem := storage_problem(url):  # before anything is written to it
        raise ValueError(f"the Optuna storage {redact_url(url)} {problem}")
    storage = open_storage(url)
    pruner = make_pruner(spec.pruner, spec.warmup_trials, spec.warmup_steps)
    try:
        seed = spec.seed
        study = optuna.create_study(
            study_name=spec.name,
            storage=storage,
            sampler=make_sampler(spec, seed),
            pruner=pruner,
            directions=spec.directions,
        )
    except optuna.exceptions.DuplicatedStudyError:
        seed = process_seed(spec.seed)
        study = optuna.load_study(
            study_name=spec.name, storage=storage, sampler=make_sampler(spec, seed), pruner=pruner
        )
    if problem := other_objectives(study, spec, url):
        raise ValueError(problem)
    study.set_user_attr("objectives", [list(o) for o in spec.objectives])
    with warnings.catch_warnings():  # optuna-dashboard labels the axes with these (not "Objective 0")
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names([metric for metric, _ in spec.objectives])
    # trials a dead process left running: failed, and asked again with the same parameters (on this machine by
    # the pid of the process that asked them; elsewhere, RDB storages, by their heartbeat)
    for t in stale_trials(study):
        fail_and_ask_again(study, t.number, t.params)
        out(f"trial {t.number} was left running by a process that stopped: failed, and asked again")
    with contextlib.suppress(Exception), warnings.catch_warnings():  # storages without heartbeats: nothing to do
        warnings.simplefilter("ignore")
        optuna.storages.fail_stale_trials(study)
    return study, seed


def preflight(spec: SearchSpec, address: str | None, uri: str, url: str, num_cpus: int | None) -> None:
    """Before anything starts (and in a dry run): stores a remote cluster cannot reach, trials a local Ray could
    never hold. Raises ValueError."""
    from ablations.cluster import check_fits

    # first: at an address, whether it answers (a dashboard's address, or one where nothing listens), before
    # what it could reach; else whether the local Ray can hold a trial
    check_fits(address, num_cpus, spec.resources.cpus, spec.resources.gpus)
    fix = "use an MLflow server (--tracking-uri) and an Optuna storage (--storage postgresql://...) every node reaches"
    refuse_unreachable(address, [uri, url], fix, ask=False)


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

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    uri = tracking.resolve_uri(tracking_uri, create=False)  # the embedded store's folder: once the checks pass
    url = storage_url(spec, storage)
    address = cluster_address(address)
    preflight(spec, address, uri, url, num_cpus)
    study, seed = _open_study(spec, url, out)
    uri = tracking.resolve_uri(tracking_uri)
    experiment = experiment or spec.name
    # runs of trials a dead process left (failed and asked again by _open_study), and its own parent run
    end_orphaned_trial_runs(uri, experiment, study, spec.name, "its search process stopped before the trial finished")
    end_dead_search_runs(uri, experiment, spec.name)
    if spec.n_trials is not None and counted_trials(study) >= spec.n_trials:  # no Ray, no new parent run
        out(f"search {spec.name!r}: its storage holds all {spec.n_trials} trials; nothing to ask (--n-trials for more)")
        parent = last_parent(uri, experiment, spec.name)
        best = best_trials(study, spec)
        return SearchResult(
            name=spec.name, storage=url, parent_run_id=parent, counts=counts(study), best=best, tracking_uri=uri
        )
    parent_id = open_parent(spec, uri, url, experiment, seed)
    search = _Search(spec, study, uri, url, experiment, parent_id, out)
    search.connect(address, num_cpus)
    return search.run()


class _Search:
    """One process's part of a search: it asks Optuna for trials, runs each as a Ray task, and tells the result
    as it arrives, until the study has its trials or this process's time is up; its end is recorded whatever
    stopped it."""

    def __init__(self, spec: SearchSpec, study, uri: str, url: str, experiment: str, parent_id: str, out) -> None:
        self.spec, self.study, self.uri, self.url, self.out = spec, study, uri, url, out
        self.experiment, self.parent_id = experiment, parent_id
        self.code = tracking.code_version()
        self.credentials = Credentials.from_environ()  # the trials write to MLflow as this user
        self.running: dict[Any, tuple[int, float]] = {}  # future -> (trial number, start time)
        self.t0 = time.monotonic()
        self.address: str | None = None  # the cluster's (None: a local Ray)

    def connect(self, address: str | None, num_cpus: int | None) -> None:
        """Ray, and the remote task a trial runs as. A data-parallel trial's task only drives: its workers get
        the resources, in their own placement group."""
        import ray

        from ablations.sweep.placement import trial_slots

        spec, parallel = self.spec, self.spec.resources.workers > 1
        self.address = address
        stores = {"the MLflow store": self.uri, "the Optuna storage": self.url}
        stores["Ray Train's storage"] = tracking.ray_storage()
        try:
            self.conn = open_ray(address, num_cpus, spec.resources, stores, dashboard=parallel)
        except BaseException:
            finish_parent(self.uri, self.parent_id, spec, self.study, vocabulary.STATUS_FAILED)
            raise
        self.concurrency = min(spec.concurrency, trial_slots(spec.resources))
        if self.concurrency < spec.concurrency:
            self.out(
                f"concurrency {spec.concurrency} is more than the cluster holds at once: {self.concurrency} trial(s) at once"
            )
        # a trial whose process or node dies (out of memory, a lost node) is run again by Ray, up to SYSTEM_RETRIES
        # times; a trial's own exception is a result (run_trial never raises)
        self.remote = ray.remote(run_trial).options(
            num_cpus=0 if parallel else spec.resources.cpus,
            num_gpus=None if parallel else spec.resources.gpus or None,
            max_retries=SYSTEM_RETRIES,
            retry_exceptions=False,
        )

    def run(self) -> SearchResult:
        spec, status = self.spec, vocabulary.STATUS_FAILED
        pruner = "no" if spec.pruner == "none" else spec.pruner
        self.out(
            f"search {spec.name!r}: {describe_sampler(spec)}, {pruner} pruner, {self.concurrency} trial(s) at once; "
            f"storage {redact_url(self.url)}; MLflow parent run {self.parent_id}"
        )
        for warning in spec.warnings:
            self.out(f"warning: {warning}")
        try:
            while True:
                while len(self.running) < self.concurrency and self._can_ask():
                    self._ask()
                if not self.running:
                    break
                self._collect()
            status = vocabulary.STATUS_FINISHED
        except KeyboardInterrupt:
            status = vocabulary.STATUS_KILLED
            self._interrupted()
            raise
        finally:
            n, best = finish_parent(self.uri, self.parent_id, spec, self.study, status)
            reason = "the search stopped before the trial finished"
            end_orphaned_trial_runs(self.uri, self.experiment, self.study, spec.name, reason)
            self.conn.close()
        return SearchResult(
            name=spec.name, storage=self.url, parent_run_id=self.parent_id, counts=n, best=best, tracking_uri=self.uri
        )

    def _can_ask(self) -> bool:
        spec = self.spec
        if spec.timeout is not None and time.monotonic() - self.t0 > spec.timeout:
            return False
        return spec.n_trials is None or counted_trials(self.study) < spec.n_trials

    def _ask(self) -> None:
        """One trial asked and started, or failed at once: a surplus trial, or an impossible combination."""
        from optuna.trial import TrialState

        spec, study = self.spec, self.study
        with warnings.catch_warnings():  # "heartbeats are meant for Study.optimize": we beat them ourselves
            warnings.simplefilter("ignore", UserWarning)
            trial = study.ask()
        # whose trial it is, before anything can interrupt (a GP sampler's proposal takes seconds): a trial
        # without them, left RUNNING by Ctrl-C, was never asked again and still counted
        trial.set_user_attr(HOST_ATTR, socket.gethostname())
        trial.set_user_attr(PID_ATTR, os.getpid())
        if surplus(study, trial.number, spec.n_trials):  # another process asked the last one at once
            trial.set_user_attr(SURPLUS_ATTR, True)
            study.tell(trial, state=TrialState.FAIL)
            self.out(f"trial {trial.number} not run: another process asked the search's last trial at the same time")
            return
        params = spec.suggest(trial)
        try:
            data = spec.run_data(params)
            resolve_run({**data, "name": spec.name}, f"{spec.source} (trial {trial.number})")
        except SpecError as err:  # an impossible combination: a failed trial with its reason
            trial.set_user_attr(FAILURE_ATTR, f"refused: {err.message}"[:500])
            study.tell(trial, state=TrialState.FAIL)
            self.out(f"trial {trial.number} refused: {err.message} ({params})")
            return
        self.running[self.remote.remote(self._task(trial.number, params, data))] = (trial.number, time.monotonic())

    def _task(self, number: int, params: dict[str, Any], data: dict[str, Any]) -> TrialTask:
        spec = self.spec
        return TrialTask(
            spec_name=spec.name,
            storage=self.url,
            number=number,
            params=params,
            run_data=data,
            uri=self.uri,
            experiment=self.experiment,
            parent_run_id=self.parent_id,
            objectives=spec.objectives,
            prune_on=spec.prune_on,
            pruner=spec.pruner,
            warmup_trials=spec.warmup_trials,
            warmup_steps=spec.warmup_steps,
            seeds_per_trial=spec.seeds_per_trial,
            code=self.code,
            resources=spec.resources,
            ray_storage=tracking.ray_storage(),
            credentials=self.credentials,
            plugins=plugins.refs(travelled=self.address is not None),  # a cluster's workers import Ray's copies
        )

    def _collect(self) -> None:
        """The results that have arrived, told to Optuna (waiting at most 5 s for one)."""
        import ray

        done, _ = ray.wait(list(self.running), num_returns=1, timeout=5.0)
        for ref in done:
            number, started = self.running.pop(ref)
            result = _result(ref, number, self.uri, self.experiment)
            state = tell(self.study, number, result, self.spec)
            for run_id in result.get("run_ids") or [result.get("run_id")]:
                if run_id:
                    vocabulary.client(self.uri).set_tag(run_id, vocabulary.TAG_OPTUNA_STATE, state)
            line = progress_line(
                self.study, self.spec, number, state, result, time.monotonic() - started, len(self.running), self.t0
            )
            self.out(line)

    def _interrupted(self) -> None:
        """Ctrl-C: the running trials cancelled, and failed as interrupted, not by themselves: the next run asks
        them again."""
        import ray

        for ref in self.running:
            ray.cancel(ref, force=True)
        for number, _ in self.running.values():
            fail_and_ask_again(self.study, number, self.study.trials[number].params)


SYSTEM_RETRIES = 2  # runs of a trial whose process or node died, before it is failed with the reason


def _result(ref, number: int, uri: str, experiment: str) -> dict[str, Any]:
    """A trial's result; a trial whose process or node died on every attempt is failed with the reason, and its
    MLflow run, left RUNNING, is ended as failed (the driver never crashes because of one trial)."""
    import ray

    try:
        return ray.get(ref)
    except ray.exceptions.RayError as err:
        if "PluginUnavailable: " in str(err):  # no variant causes it: the search stops, nothing is told to Optuna
            from ablations.shell import WorkerEnvironmentError

            why = str(err)[str(err).rindex("PluginUnavailable: ") + 19 :].strip().splitlines()[0]
            raise WorkerEnvironmentError(
                f"a plugin does not load on a worker, {why}; fix that node's environment (install the plugin there, "
                "or name it by path so that it travels with the search) and start it again"
            ) from None
        reason = (
            f"its process or node died on every attempt ({SYSTEM_RETRIES + 1}): {type(err).__name__}: "
            + str(err).strip().splitlines()[0][:300]
        )
        for run in vocabulary.running_runs(uri, experiment, vocabulary.KIND_TRIAL, trial=str(number)):
            vocabulary.end_run(uri, run.info.run_id, vocabulary.STATUS_FAILED, reason)
        return {"status": vocabulary.STATUS_FAILED, "reason": reason, "values": None, "run_id": ""}


def describe_sampler(spec: SearchSpec) -> str:
    if spec.random_only:
        return (
            f"{spec.sampler} sampler, but n_trials={spec.n_trials} does not exceed its {spec.startup_trials} random "
            "startup trials: this is a random search (raise n_trials or lower startup_trials)"
        )
    if spec.sampler == "nsga2":
        return f"nsga2 sampler (generations of {spec.startup_trials}, the first random)"
    if spec.startup_trials:
        return f"{spec.sampler} sampler (the first {spec.startup_trials} trials random)"
    return f"{spec.sampler} sampler"


def progress_line(
    study, spec: SearchSpec, number: int, state: str, result: dict, seconds: float, running: int, t0: float
) -> str:
    c = counts(study)
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
        f"[{time.monotonic() - t0:.0f}s] trial {number} {state.lower()}{value} in {seconds:.0f}s; "  # both rounded
        f"{done}{goal} done, {c.get('FAIL', 0)} failed, {running} running{best}"
    )


__all__ = ["SearchResult", "best_trials", "counted_trials", "run_search"]
