"""The claimed cells of a submission as one Ray Tune run: its progress lines, the halt on a failure no variant
causes, and Tune's advice that contradicts ours kept off the terminal."""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ablations.sweep.trial import TrialContext, trainable
from record.spec import Cell, Study


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


@dataclass
class _Halt:
    """Why the submission stops at once: a failure no variant causes (a node that cannot load a plugin)."""

    why: str | None = None

    def judge(self, trial) -> None:
        error = trial.get_error()
        text = "" if error is None else str(error)
        marker = "PluginUnavailable: "
        if marker in text and self.why is None:
            self.why = text[text.rindex(marker) + len(marker) :].strip().splitlines()[0]


def _tune_callback(progress: Progress, labels: dict[str, str], halt: _Halt):
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
            halt.judge(trial)
            progress.end(trial.trial_id, "failed", labels[trial.config["cell_id"]])

        def on_trial_recover(self, iteration, trials, trial, **info):
            halt.judge(trial)
            progress.out(f"  retrying {labels[trial.config['cell_id']]} (attempt {trial.num_failures + 1})")

    class Stop(tune.Stopper):  # every trial, once a failure no variant causes is seen
        def __call__(self, trial_id, result):
            return False

        def stop_all(self):
            return halt.why is not None

    return Report(), Stop()


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


def run_tune(study: Study, todo: list[Cell], ctx: TrialContext, slots: int, limit: int | None, out) -> None:
    """The claimed cells as Tune trials of one Tuner; raises WorkerEnvironmentError when a plugin does not load on
    a worker (no variant causes that: the submission stops)."""
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
    halt = _Halt()
    report, stop = _tune_callback(progress, labels, halt)
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
            callbacks=[report],
            stop=stop,
        ),
    )
    # Ray Tune installs its own Ctrl-C handler and leaves it installed after fit(): a later Ctrl-C in this process
    # (a notebook, a test session, the next sweep) would only set the event of a run that has ended
    sigint = signal.getsignal(signal.SIGINT) if threading.current_thread() is threading.main_thread() else None
    try:
        tuner.fit()
    finally:
        if sigint is not None:
            signal.signal(signal.SIGINT, sigint)
    if halt.why is not None:
        from ablations.shell import WorkerEnvironmentError

        raise WorkerEnvironmentError(
            f"a plugin does not load on a worker, {halt.why}; fix that node's environment (install the plugin there, "
            "or name it by path so that it travels with the submission) and submit again: no cell was recorded for it"
        )
