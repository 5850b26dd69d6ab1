"""``ablate sweep STUDY``: every cell of a study as a Ray Tune trial, recorded in MLflow exactly once.

MLflow is the record of what has been done. A submission:
1. checks the study (nothing starts if anything is wrong) and reads the study's experiment: cells with a
   finished or diverged run are done and never trained again; runs left RUNNING by a submission that
   died (driver killed, machine restarted) are marked KILLED; the rest is to do;
2. opens a parent run for the submission and runs the cells left to do as Tune trials on a local Ray
   (loopback) or on a cluster, with the study's resources per trial and worker processes reused between
   trials;
3. each trial checks MLflow again before training (a retried or restored trial never trains a finished
   cell twice), marks its own lost earlier attempts KILLED, trains with ``ablations.train.train`` into a
   child run (or, with ``workers > 1``, as data-parallel training through Ray Train, rank 0 logging), and
   records anything that goes wrong as a failed run with the traceback;
4. prints progress while it runs and a summary table from MLflow at the end.

Tune retries a trial that raised or whose process or node died, ``retries`` times. A diverged run is a
result, not a failure.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ablations import tracking
from ablations.study import Cell, Resources, Study
from dashboards.load import KIND_CELL, KIND_STUDY, RESULT_STATES, cell_state, search_all  # shared conventions


def study_cell_runs(uri: str, study: str, cell_id: str | None = None) -> dict[str, list]:
    """cell_id -> its runs (every attempt of every submission), oldest first; one cell's only, if given."""
    exp = tracking.client(uri).get_experiment_by_name(study)
    if exp is None:
        return {}
    out: dict[str, list] = {}
    query = f"tags.kind = '{KIND_CELL}'" + (f" and tags.cell_id = '{cell_id}'" if cell_id else "")
    for run in sorted(search_all(uri, [exp.experiment_id], query), key=lambda r: r.info.start_time):
        out.setdefault(run.data.tags.get("cell_id", ""), []).append(run)
    return out


def mark_killed(uri: str, run, reason: str) -> None:
    from mlflow.entities import RunTag

    c = tracking.client(uri)
    c.log_batch(run.info.run_id, tags=[RunTag("status_detail", f"killed: {reason}")])
    c.set_terminated(run.info.run_id, "KILLED")


def finished_result(runs: list):
    return next((r for r in runs if cell_state(r) in RESULT_STATES), None)


# --- one trial -------------------------------------------------------------------------------------


@dataclass
class TrialContext:
    """What every trial needs to know about its submission (shipped to the workers)."""

    uri: str
    study: str
    parent_run_id: str
    submission: int
    resources: Resources
    storage: str
    metric: str
    code: dict[str, str] = field(default_factory=dict)


def cell_tags(cell: Cell, ctx: TrialContext, attempt: int) -> dict[str, str]:
    import ray

    tags = {
        "kind": KIND_CELL,
        "study": ctx.study,
        "variant": cell.variant,
        "seed": str(cell.seed),
        "cell_id": cell.cell_id,
        "submission": str(ctx.submission),
        "attempt": str(attempt),
        "pid": str(os.getpid()),
        "workers": str(ctx.resources.workers),
        **ctx.code,
    }
    if ray.is_initialized():
        rc = ray.get_runtime_context()
        tags["ray_node"] = rc.get_node_id()
        tags["ray_node_ip"] = ray.util.get_node_ip_address()
    tags["code_dir"] = str(Path(sys.modules["models"].__file__).resolve().parent.parent)
    for k, v in cell.settings.items():  # the design's axes, and what a tuned study's search chose
        tags[f"tuned.{k.removeprefix('tuned:')}" if k.startswith("tuned:") else f"axis.{k}"] = str(v)
    return tags


def _record_early_failure(cell: Cell, ctx: TrialContext, tags: dict[str, str], err: BaseException) -> None:
    """A failure before train() opened a run (data missing on this node, say) is recorded all the same."""
    logger = tracking.RunLogger(ctx.uri, ctx.study, f"{cell.variant} | seed {cell.seed}", ctx.parent_run_id, tags)
    logger.start(cell.run.params(), cell.run.to_dict())
    logger.log_text("".join(traceback.format_exception(err)), "traceback.txt")
    logger.end(tracking.STATUS_FAILED, f"{type(err).__name__}: {err}"[:1000])


def run_cell(cell: Cell, ctx: TrialContext, report: Callable[[dict], None]) -> dict[str, Any]:
    """Train one cell unless MLflow already holds its result. Raises when training fails (Tune retries)."""
    import torch

    from ablations.train import Tracking, train

    torch.set_num_threads(max(1, int(ctx.resources.per_worker_cpus)))
    runs = study_cell_runs(ctx.uri, ctx.study, cell.cell_id).get(cell.cell_id, [])
    done = finished_result(runs)
    if done is not None:  # trained by an earlier attempt or submission: never twice
        out = {"status": cell_state(done), "run_id": done.info.run_id, "reused": True}
        report(out)
        return out
    for run in runs:
        if run.info.status == "RUNNING":  # an attempt whose process or node died
            mark_killed(ctx.uri, run, "lost: its process or node stopped before it finished; retried")
    attempt = 1 + sum(1 for r in runs if r.data.tags.get("submission") == str(ctx.submission))
    tags = cell_tags(cell, ctx, attempt)
    where = Tracking(ctx.uri, ctx.study, ctx.parent_run_id, f"{cell.variant} | seed {cell.seed}", tags)

    def hook(step: int, metrics: dict[str, float]) -> None:
        if any(k.startswith("val/") for k in metrics):
            report({**metrics, "step": step})

    try:
        if ctx.resources.workers > 1:
            result = _run_data_parallel(cell, ctx, where)
        else:
            result = train(cell.run, where, hooks=[hook])
    except Exception as err:
        recorded = any(
            r.data.tags.get("attempt") == str(attempt) and r.data.tags.get("submission") == str(ctx.submission)
            for r in study_cell_runs(ctx.uri, ctx.study, cell.cell_id).get(cell.cell_id, [])
        )
        if not recorded:
            _record_early_failure(cell, ctx, tags, err)
        raise
    out = {"status": result.status, "run_id": result.run_id, "reused": False}
    if ctx.metric in result.metrics:
        out[ctx.metric] = result.metrics[ctx.metric]
    report(out)
    return out


def _run_data_parallel(cell: Cell, ctx: TrialContext, where):
    from ray.tune.integration.ray_train import TuneReportCallback

    from ablations.parallel import ParallelJob, run_data_parallel

    job = ParallelJob(cell.run, where, ctx.resources, report_validation=True)
    name = f"ddp-{cell.cell_id}-{where.tags.get('attempt', '1')}"
    return run_data_parallel(job, name=name, storage_path=ctx.storage, callbacks=[TuneReportCallback()])


def _trainable(config: dict, cells: dict[str, Cell], ctx: TrialContext) -> None:
    from ray import tune

    run_cell(cells[config["cell_id"]], ctx, lambda metrics: tune.report(_tune_safe(metrics)))


def _tune_safe(metrics: dict[str, Any]) -> dict[str, Any]:
    return {k.replace("/", "_"): v for k, v in metrics.items()}


# --- the submission --------------------------------------------------------------------------------

HEARTBEAT_S = 10.0  # a submission's parent run records a heartbeat this often
STALE_AFTER_S = 60.0  # a submission on another machine without a heartbeat for this long has died


class SubmissionRunning(ValueError):
    """Another submission of the same study is alive: two would train the same cells."""


def _alive(run) -> bool:
    """Whether the driver of a RUNNING parent run is still there (its pid on this machine, else its heartbeat)."""
    tags = run.data.tags
    if tags.get("driver_host") == socket.gethostname() and tags.get("driver_pid", "").isdigit():
        try:
            os.kill(int(tags["driver_pid"]), 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    beat = run.data.metrics.get("heartbeat", run.info.start_time / 1000)
    return time.time() - beat < STALE_AFTER_S


def check_no_live_submission(study: Study, uri: str) -> None:
    exp = tracking.client(uri).get_experiment_by_name(study.name)
    if exp is None:
        return
    for run in search_all(uri, [exp.experiment_id], f"tags.kind = '{KIND_STUDY}' and attributes.status = 'RUNNING'"):
        if _alive(run):
            t = run.data.tags
            raise SubmissionRunning(
                f"submission {t.get('submission')} of {study.name!r} is still running (pid {t.get('driver_pid')} on "
                f"{t.get('driver_host')}, MLflow run {run.info.run_id}); two submissions would train the same "
                "cells: wait for it to end, or stop it, then run the same command again"
            )


class Heartbeat(threading.Thread):
    """Tells later submissions on other machines that this one is alive."""

    def __init__(self, uri: str, run_id: str) -> None:
        super().__init__(daemon=True, name="ablate-heartbeat")
        self.uri, self.run_id, self.stopped = uri, run_id, threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(HEARTBEAT_S):
            with contextlib.suppress(Exception):  # a slow or unreachable store must not stop the study
                tracking.client(self.uri).log_metric(self.run_id, "heartbeat", time.time())

    def stop(self) -> None:
        self.stopped.set()


@dataclass
class Plan:
    todo: list[Cell]
    done: dict[str, Any]  # cell_id -> its finished/diverged run
    stale: list[Any]  # runs left RUNNING by a submission that died


def plan(study: Study, uri: str) -> Plan:
    runs = study_cell_runs(uri, study.name)
    todo, done, stale = [], {}, []
    for cell in study.cells:
        cell_runs = runs.get(cell.cell_id, [])
        result = finished_result(cell_runs)
        if result is not None:
            done[cell.cell_id] = result
        else:
            todo.append(cell)
        stale += [r for r in cell_runs if r.info.status == "RUNNING"]
    return Plan(todo, done, stale)


def describe_plan(study: Study, p: Plan, out: Callable[[str], None] = print) -> None:
    width = max(len(c.variant) for c in study.cells)
    out(
        f"study {study.name!r} ({study.design}, {len(study.variants)} variants x {len(study.seeds)} seeds): "
        f"{len(study.cells)} cells, {len(p.done)} done in MLflow, {len(p.todo)} to train"
    )
    out(
        f"each trial: {study.resources.describe()}; budget {study.budget or 'from the run file'}; "
        f"metric {study.metric} ({study.direction})"
    )
    out(f"{'variant':<{width}}  seed  cell id           state")
    for cell in study.cells:
        state = f"done ({cell_state(p.done[cell.cell_id])})" if cell.cell_id in p.done else "to train"
        out(f"{cell.variant:<{width}}  {cell.seed:>4}  {cell.cell_id}  {state}")
    for s in study.skipped:
        out(f"{s.variant:<{width}}  {s.seed:>4}  {'-' * 16}  skipped: {s.reason}")
    if p.stale:
        out(f"{len(p.stale)} run(s) left RUNNING by an earlier submission will be marked KILLED")


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
                eta = f", about {_duration(mean * -(-left // self.slots))} left"
            counts = ", ".join(f"{n} {s}" for s, n in sorted(self.states.items()))
            self.out(
                f"[{_duration(time.monotonic() - self.t0)}] {done}/{self.total} cells done ({counts}), "
                f"{len(self.started)} running{eta}  <- {label}: {state}"
            )


def _duration(seconds: float) -> str:
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


@dataclass
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


def summarize(study: Study, uri: str) -> tuple[dict[str, int], list[dict[str, Any]]]:
    """One row per cell from MLflow: its final state (its best attempt), metric and run."""
    runs = study_cell_runs(uri, study.name)
    rows, counts = [], Counter()
    for cell in study.cells:
        cell_runs = runs.get(cell.cell_id, [])
        result = finished_result(cell_runs)
        run = result or (cell_runs[-1] if cell_runs else None)
        state = cell_state(run) if run is not None else "to train"
        counts[state] += 1
        value = run.data.metrics.get(study.metric) if run is not None else None
        rows.append(
            {
                "variant": cell.variant,
                "seed": cell.seed,
                "cell_id": cell.cell_id,
                "state": state,
                study.metric: value,
                "attempts": len(cell_runs),
                "run_id": run.info.run_id if run else "",
            }
        )
    counts["skipped"] = len(study.skipped)
    return dict(counts), rows


def format_rows(study: Study, rows: list[dict[str, Any]]) -> str:
    width = max([len(r["variant"]) for r in rows] + [7])
    lines = [f"{'variant':<{width}}  seed  {'state':<9}  {study.metric:>20}  attempts  run"]
    for r in rows:
        v = r[study.metric]
        value = f"{v:.4g}" if isinstance(v, (int, float)) else "-"
        lines.append(
            f"{r['variant']:<{width}}  {r['seed']:>4}  {r['state']:<9}  {value:>20}  {r['attempts']:>8}  {r['run_id']}"
        )
    return "\n".join(lines)


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
            f"the Ray cluster at {address} cannot write to the local store {uri}; start an MLflow "
            "server and pass --tracking-uri (or MLFLOW_TRACKING_URI)"
        )
    check_no_live_submission(study, uri)
    if study.tune:  # each variant's own search first; the cells then run at each variant's best parameters
        check_fits(address, num_cpus, study.resources.cpus, study.resources.gpus)  # before the searches
        from ablations.search import tune_study

        study = tune_study(study, uri=uri, address=address, num_cpus=num_cpus, storage=None, out=out)
    p = plan(study, uri)
    for run in p.stale:
        mark_killed(uri, run, "its submission ended (driver stopped) before the trial finished")
    if p.stale:
        out(f"marked {len(p.stale)} run(s) left RUNNING by an earlier submission as KILLED")
    if not p.todo:
        counts, rows = summarize(study, uri)
        out(f"all {len(study.cells)} cells of {study.name!r} are done in MLflow; nothing to train")
        return StudyResult(study.name, None, counts, rows, uri)

    check_fits(address, num_cpus, study.resources.cpus, study.resources.gpus)  # before anything is recorded
    parent = _open_submission(study, uri, p)
    ctx = TrialContext(
        uri,
        study.name,
        parent.run_id,
        parent.submission,
        study.resources,
        str(tracking.home() / "ray_results"),
        study.metric,
        tracking.code_version(),
    )
    out(
        f"submission {parent.submission} of {study.name!r}: {len(p.todo)} cells to train, {len(p.done)} already done "
        f"(MLflow parent run {parent.run_id})"
    )
    status = tracking.STATUS_FAILED
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
        status = tracking.STATUS_FINISHED
    except KeyboardInterrupt:
        status = tracking.STATUS_KILLED
        raise
    finally:
        for run in [
            r
            for runs in study_cell_runs(uri, study.name).values()
            for r in runs
            if r.info.status == "RUNNING" and r.data.tags.get("submission") == str(parent.submission)
        ]:
            mark_killed(uri, run, "the submission stopped before the trial finished")
        counts, rows = summarize(study, uri)
        if status == tracking.STATUS_FINISHED and (counts.get("to train") or counts.get("killed")):
            status = tracking.STATUS_KILLED  # Tune was interrupted (Ctrl-C) and returned
        if status != tracking.STATUS_FINISHED:
            out("the submission did not finish: run the same command again to train the missing cells")
        heartbeat.stop()
        parent.finish(status, counts, rows, format_rows(study, rows))
        if conn is not None:
            conn.close()
    return StudyResult(study.name, parent.run_id, counts, rows, uri)


def _tune(study: Study, todo: list[Cell], ctx: TrialContext, slots: int, limit: int | None, out) -> None:
    from ray import tune

    resources = {"cpu": study.resources.cpus}
    if study.resources.gpus:
        resources["gpu"] = study.resources.gpus
    if study.resources.workers > 1:  # the trial only drives; its workers get their own placement group
        resources = {"cpu": 0, "memory": 1}
    cells = {c.cell_id: c for c in todo}
    labels = {c.cell_id: f"{c.variant} | seed {c.seed}" for c in todo}
    progress = Progress(len(todo), slots, out)
    trainable = tune.with_resources(tune.with_parameters(_trainable, cells=cells, ctx=ctx), resources)
    storage = Path(ctx.storage)
    storage.mkdir(parents=True, exist_ok=True)
    tuner = tune.Tuner(
        trainable,
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


@dataclass
class Submission:
    uri: str
    run_id: str
    submission: int

    def finish(self, status: str, counts: dict[str, int], rows: list[dict], table: str) -> None:
        from mlflow.entities import Metric

        c = tracking.client(self.uri)
        now = int(time.time() * 1000)
        c.log_batch(
            self.run_id, metrics=[Metric(f"cells_{k.replace(' ', '_')}", float(v), now, 0) for k, v in counts.items()]
        )
        c.log_text(self.run_id, table + "\n", "summary.txt")
        c.log_text(self.run_id, json.dumps(rows, indent=1, default=str), "cells.json")
        c.set_tag(self.run_id, "status_detail", status)
        c.set_terminated(self.run_id, tracking.MLFLOW_STATUS[status])


def _open_submission(study: Study, uri: str, p: Plan) -> Submission:
    from mlflow.entities import Param

    c = tracking.client(uri)
    exp_id = tracking.experiment_id(uri, study.name)
    previous = search_all(uri, [exp_id], f"tags.kind = '{KIND_STUDY}'")
    for run in previous:  # a submission that died without finishing (check_no_live_submission ran first)
        if run.info.status == "RUNNING":
            c.set_tag(run.info.run_id, "status_detail", "killed: the driver stopped before the submission ended")
            c.set_terminated(run.info.run_id, "KILLED")
    number = 1 + max([int(r.data.tags.get("submission", 0)) for r in previous] or [0])
    tags = {
        "kind": KIND_STUDY,
        "study": study.name,
        "submission": str(number),
        "design": study.design,
        "driver_host": socket.gethostname(),
        "driver_pid": str(os.getpid()),
        "cells": str(len(study.cells)),
        "cells_to_train": str(len(p.todo)),
        "status_detail": "running",
        **tracking.code_version(),
    }
    run = c.create_run(exp_id, tags=tags, run_name=f"{study.name} #{number}")
    params = [
        Param("design", study.design),
        Param("axes", ",".join(study.axes)[:6000]),
        Param("seeds", ",".join(map(str, study.seeds))),
        Param("metric", study.metric),
        Param("direction", study.direction),
        Param("resources", study.resources.describe()),
    ]
    c.log_batch(run.info.run_id, params=params)
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "study.yaml"
        copy.write_text(Path(study.source).read_text())
        c.log_artifact(run.info.run_id, str(copy))
    design = {
        "kind": study.design,
        "axes": study.axes,
        "metric": study.metric,
        "direction": study.direction,
        "variants": [
            {"name": v, "settings": {k: str(x) for k, x in s.items()}}
            for v, s in dict((c.variant, c.settings) for c in study.cells).items()
        ],
        "seeds": study.seeds,
        "skipped": [vars(s) for s in study.skipped],
        # a cell keeps its id when the design grows (a new axis at the base's value), but its label changes
        "cells": {c.cell_id: c.variant for c in study.cells},
    }
    c.log_dict(run.info.run_id, design, "design.json")
    if study.description:
        c.set_tag(run.info.run_id, "mlflow.note.content", study.description)
    return Submission(uri, run.info.run_id, number)
