"""``ablate sweep STUDY``: every cell of a study as a Ray Tune trial, recorded in MLflow exactly once.

A submission:
1. checks the study (nothing starts if anything is wrong) and reads the study's experiment: cells with a
   finished or diverged run are done and never trained again; runs left RUNNING by a submission that
   died (driver killed, machine restarted) are marked KILLED; the rest is to do (``ablations.sweep.plan``);
2. opens a parent run for the submission (``ablations.sweep.submission``) and runs the cells left to do as
   Tune trials (``ablations.sweep.trial``) on a local Ray (loopback) or on a cluster, with the study's
   resources per trial and worker processes reused between trials;
3. prints progress while it runs and a summary table from MLflow at the end.

Tune retries a trial that raised or whose process or node died, ``retries`` times. A diverged run is a
result, not a failure.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ablations import records, tracking
from ablations.secrets import redact_url
from ablations.spec import Cell, Study
from ablations.sweep.plan import format_rows, plan, summarize
from ablations.sweep.submission import Heartbeat, check_no_live_submission, open_submission
from ablations.sweep.trial import TrialContext, trainable


class Progress:
    """Progress lines on the terminal: cells done, running, failed; time left. Fed by Tune's callbacks."""

    def __init__(self, total: int, slots: int, out: Callable[[str], None] = print) -> None:
        self.total, self.slots, self.out = total, max(1, slots), out
        self.started: dict[str, float] = {}
        self.durations: list[float] = []
        self.states: Counter = Counter()
        self.t0 = time.monotonic()
        self.lock = threading.Lock()

    def __getstate__(self) -> dict:  # Tune pickles its callbacks with the experiment state
        return {k: v for k, v in self.__dict__.items() if k != "lock"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, lock=threading.Lock())

    def start(self, trial_id: str) -> None:
        with self.lock:
            self.started[trial_id] = time.monotonic()

    def end(self, trial_id: str, state: str, label: str) -> None:
        with self.lock:
            t = self.started.pop(trial_id, None)
            if t is not None:
                self.durations.append(time.monotonic() - t)
            self.states[state] += 1
            done = sum(self.states.values())
            left = self.total - done
            eta = ""
            if self.durations and left:
                mean = sum(self.durations) / len(self.durations)
                eta = f", about {duration(mean * -(-left // self.slots))} left"
            counts = ", ".join(f"{n} {s}" for s, n in sorted(self.states.items()))
            self.out(
                f"[{duration(time.monotonic() - self.t0)}] {done}/{self.total} cells done ({counts}), "
                f"{len(self.started)} running{eta}  <- {label}: {state}"
            )


def duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def _tune_callback(progress: Progress, labels: dict[str, str]):
    from ray import tune

    class Report(tune.Callback):
        def on_trial_start(self, iteration, trials, trial, **info):
            progress.start(trial.trial_id)

        def on_trial_complete(self, iteration, trials, trial, **info):
            result = trial.last_result or {}
            state = result.get("status", "finished")
            if result.get("reused"):
                state = f"{state} (earlier run)"
            progress.end(trial.trial_id, state, labels[trial.config["cell_id"]])

        def on_trial_error(self, iteration, trials, trial, **info):
            progress.end(trial.trial_id, "failed", labels[trial.config["cell_id"]])

        def on_trial_recover(self, iteration, trials, trial, **info):
            progress.out(f"  retrying {labels[trial.config['cell_id']]} (attempt {trial.num_failures + 1})")

    return Report()


@dataclass(kw_only=True)
class StudyResult:
    study: str
    parent_run_id: str | None
    counts: dict[str, int]
    rows: list[dict[str, Any]]
    tracking_uri: str

    @property
    def complete(self) -> bool:
        """Every cell has a result: finished, diverged or failed."""
        return not (self.counts.get("to train") or self.counts.get("killed") or self.counts.get("running"))


def run_study(
    study: Study,
    *,
    address: str | None = None,
    tracking_uri: str | None = None,
    max_concurrent: int | None = None,
    num_cpus: int | None = None,
    out: Callable[[str], None] = print,
) -> StudyResult:
    """Run the cells of a study that MLflow does not hold yet; return the summary from MLflow."""
    from ablations.cluster import check_fits, connect, is_loopback_address

    uri = tracking.resolve_uri(tracking_uri)
    address = address or os.environ.get("RAY_ADDRESS") or None
    if not is_loopback_address(address) and uri.startswith(("sqlite:", "file:")):
        raise ValueError(
            f"the Ray cluster at {address} cannot write to the local store {redact_url(uri)}; start an MLflow "
            "server and pass --tracking-uri (or MLFLOW_TRACKING_URI)"
        )
    check_no_live_submission(study, uri)
    if study.tune:  # each variant's own search first; the cells then run at each variant's best parameters
        check_fits(address, num_cpus, study.resources.cpus, study.resources.gpus)  # before the searches
        from ablations.search.tuned import tune_study

        study = tune_study(study, uri=uri, address=address, num_cpus=num_cpus, storage=None, out=out)
    p = plan(study, uri)
    for run in p.stale:
        records.mark_killed(uri, run, "its submission ended (driver stopped) before the trial finished")
    if p.stale:
        out(f"marked {len(p.stale)} run(s) left RUNNING by an earlier submission as KILLED")
    if not p.todo:
        counts, rows = summarize(study, uri)
        out(f"all {len(study.cells)} cells of {study.name!r} are done in MLflow; nothing to train")
        return StudyResult(study=study.name, parent_run_id=None, counts=counts, rows=rows, tracking_uri=uri)

    check_fits(address, num_cpus, study.resources.cpus, study.resources.gpus)  # before anything is recorded
    parent = open_submission(study, uri, p)
    ctx = TrialContext(
        uri=uri,
        study=study.name,
        parent_run_id=parent.run_id,
        submission=parent.submission,
        resources=study.resources,
        storage=str(tracking.home() / "ray_results"),
        metric=study.metric,
        code=tracking.code_version(),
    )
    out(
        f"submission {parent.submission} of {study.name!r}: {len(p.todo)} cells to train, {len(p.done)} already done "
        f"(MLflow parent run {parent.run_id})"
    )
    status = records.STATUS_FAILED
    conn = None
    heartbeat = Heartbeat(uri, parent.run_id)
    heartbeat.start()
    try:
        conn = connect(address, num_cpus=num_cpus, dashboard=study.resources.workers > 1)
        import ray

        total_cpus = ray.cluster_resources().get("CPU", 1)
        slots = max(1, int(total_cpus // study.resources.cpus))
        if max_concurrent or study.max_concurrent:
            slots = min(slots, max_concurrent or study.max_concurrent)
        out(
            f"Ray: {'local, started here' if conn.started_here else address} "
            f"({int(total_cpus)} CPUs, {len(ray.nodes())} node(s)); up to {slots} trial(s) at once"
        )
        _tune(study, p.todo, ctx, slots, max_concurrent or study.max_concurrent, out)
        status = records.STATUS_FINISHED
    except KeyboardInterrupt:
        status = records.STATUS_KILLED
        raise
    finally:
        for run in [
            r
            for runs in records.cell_runs(uri, study.name).values()
            for r in runs
            if r.info.status == "RUNNING" and r.data.tags.get(records.TAG_SUBMISSION) == str(parent.submission)
        ]:
            records.mark_killed(uri, run, "the submission stopped before the trial finished")
        counts, rows = summarize(study, uri)
        if status == records.STATUS_FINISHED and (counts.get("to train") or counts.get("killed")):
            status = records.STATUS_KILLED  # Tune was interrupted (Ctrl-C) and returned
        if status != records.STATUS_FINISHED:
            out("the submission did not finish: run the same command again to train the missing cells")
        heartbeat.stop()
        parent.finish(status, counts, rows, format_rows(study, rows))
        if conn is not None:
            conn.close()
    return StudyResult(study=study.name, parent_run_id=parent.run_id, counts=counts, rows=rows, tracking_uri=uri)


class _OneVoice(logging.Filter):
    """Ray Tune's advice on interruption ("Resume experiment with: Tuner.restore(...)", "Trials did not
    complete") contradicts ours: MLflow is the record, and the same command again trains what is missing."""

    NOISE = (
        "Resume experiment with",
        "Trials did not complete",
        "Tuner.restore",
        "Stop signal received",  # Tune's own Ctrl-C notice; ours follows
        "Failed to fetch metrics for",  # trials that had not reported yet when Tune stopped
    )

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(s in message for s in self.NOISE)


def _tune(study: Study, todo: list[Cell], ctx: TrialContext, slots: int, limit: int | None, out) -> None:
    from ray import tune

    quiet = _OneVoice()
    for name in ("ray.tune.tune", "ray.tune.tuner", "ray.tune.analysis.experiment_analysis"):
        logging.getLogger(name).addFilter(quiet)
    for handler in logging.getLogger("ray").handlers:  # what propagates to Ray's own handler
        handler.addFilter(quiet)

    resources = {"cpu": study.resources.cpus}
    if study.resources.gpus:
        resources["gpu"] = study.resources.gpus
    if study.resources.workers > 1:  # the trial only drives; its workers get their own placement group
        resources = {"cpu": 0, "memory": 1}
    cells = {c.cell_id: c for c in todo}
    labels = {c.cell_id: f"{c.variant} | seed {c.seed}" for c in todo}
    progress = Progress(len(todo), slots, out)
    fn = tune.with_resources(tune.with_parameters(trainable, cells=cells, ctx=ctx), resources)
    storage = Path(ctx.storage)
    storage.mkdir(parents=True, exist_ok=True)
    tuner = tune.Tuner(
        fn,
        param_space={"cell_id": tune.grid_search(list(cells))},
        tune_config=tune.TuneConfig(
            max_concurrent_trials=limit or (slots if study.resources.workers > 1 else None),
            reuse_actors=True,
            trial_dirname_creator=lambda t: f"{t.config['cell_id']}-{t.trial_id}",
        ),
        run_config=tune.RunConfig(
            name=f"{study.name}-{ctx.submission}-{int(time.time())}",
            storage_path=str(storage),
            verbose=0,
            failure_config=tune.FailureConfig(max_failures=study.retries),
            callbacks=[_tune_callback(progress, labels)],
        ),
    )
    tuner.fit()
