"""A search's MLflow runs, as its driver sees them: the parent run it opens, and the runs a stopped search
process left RUNNING, ended."""

from __future__ import annotations

import os
import socket

from ablations import tracking
from ablations.search.ledger import gone_here
from record import vocabulary
from record.secrets import redact_url
from record.spec import SearchSpec


def open_parent(spec: SearchSpec, uri: str, url: str, experiment: str, seed: int) -> str:
    """This process's parent run of the search, RUNNING: the spec's settings as params, the spec file as its
    artifact; returns its id."""
    from mlflow.entities import Param as MLParam

    c = vocabulary.client(uri)
    parent = c.create_run(
        tracking.experiment_id(uri, experiment),
        run_name=f"search {spec.name}",
        tags={
            vocabulary.TAG_KIND: vocabulary.KIND_SEARCH,
            vocabulary.TAG_STUDY: spec.name,
            vocabulary.TAG_STORAGE: redact_url(url),
            vocabulary.TAG_SAMPLER: spec.sampler,
            vocabulary.TAG_PRUNER: spec.pruner,
            vocabulary.TAG_STATUS: vocabulary.STATUS_RUNNING,
            vocabulary.TAG_DRIVER_HOST: socket.gethostname(),  # a later process ends it if this one dies
            vocabulary.TAG_DRIVER_PID: str(os.getpid()),
            **tracking.code_version(),
        },
    )
    c.log_batch(
        parent.info.run_id,
        params=[
            MLParam("sampler", spec.sampler),
            MLParam("pruner", spec.pruner),
            MLParam("objectives", ",".join(f"{m}:{d}" for m, d in spec.objectives)),
            MLParam("n_trials", str(spec.n_trials)),
            MLParam("space", ",".join(p.key for p in spec.space)),
            MLParam("sampler_seed", str(seed)),
            MLParam("startup_trials", str(spec.startup_trials)),
            MLParam("pruner_warmup", f"{spec.warmup_trials} trials, {spec.warmup_steps} steps"),
            MLParam("diverged", spec.diverged),
        ],
    )
    if os.path.exists(spec.source):
        c.log_artifact(parent.info.run_id, spec.source)
    return parent.info.run_id


def end_orphaned_trial_runs(uri: str, experiment: str, study, spec_name: str, reason: str) -> int:
    """A trial's MLflow run is RUNNING only while its Optuna trial is: runs of this search whose trial has ended
    (interrupted, or lost with a dead process, then failed and asked again) are marked KILLED with ``reason``. A
    trial another live process runs is RUNNING in Optuna too, and keeps its run. A run that finished after its
    search process died, before Optuna was told, is not a result either: its trial was asked again, and the retry
    is the result. Returns how many were ended."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    states = {t.number: t.state for t in trials}
    retries = {t.user_attrs["retry_of"]: t.number for t in trials if "retry_of" in t.user_attrs}
    ended = 0
    for run in vocabulary.running_runs(uri, experiment, vocabulary.KIND_TRIAL, study=spec_name):
        number = run.data.tags.get(vocabulary.TAG_TRIAL, "")
        if number.isdigit() and states.get(int(number)) != TrialState.RUNNING:
            vocabulary.mark_killed(uri, run, reason)
            ended += 1
    for run in vocabulary.runs_in_status(uri, experiment, vocabulary.KIND_TRIAL, "FINISHED", study=spec_name):
        number = run.data.tags.get(vocabulary.TAG_TRIAL, "")
        if number.isdigit() and states.get(int(number)) == TrialState.FAIL and int(number) in retries:
            retry = retries[int(number)]
            why = f"finished after its search process stopped, before Optuna was told; asked again as trial {retry}"
            vocabulary.mark_killed(uri, run, why)
            ended += 1
    return ended


def end_dead_search_runs(uri: str, experiment: str, spec_name: str) -> int:
    """The parent runs of this search whose process died on this machine without ending them (SIGKILL, a crash):
    KILLED, as a sweep's dead submissions are. Without it a killed search's parent run stayed RUNNING for good (the
    fault soak found it: benchmarks/soak.py). A process on another machine is never judged dead by its pid: its run
    is left as it is. Returns how many were ended."""
    ended = 0
    for run in vocabulary.running_runs(uri, experiment, vocabulary.KIND_SEARCH, study=spec_name):
        tags = run.data.tags
        if gone_here(tags.get(vocabulary.TAG_DRIVER_HOST), tags.get(vocabulary.TAG_DRIVER_PID, "")):
            vocabulary.mark_killed(uri, run, "its search process stopped before the search ended")
            ended += 1
    return ended
