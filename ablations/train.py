"""One training run, no Ray: ``train(run_config, tracking) -> RunResult``. ``ablate run`` calls it, and so does
every trial of a sweep.

Order of work: the data is built first (a missing corpus or an offline hub fails before anything is
logged), then the MLflow run starts, then training. Whatever happens after that is recorded: a diverged
run is a result (status diverged, exit code 0); an exception is recorded as failed with its traceback as
an artifact, then raised to the caller; Ctrl-C is recorded as killed.
"""

from __future__ import annotations

import json
import logging
import math
import signal
import tempfile
import threading
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
import torch

from ablations import tracking
from ablations.tracking import Hook, RunResult, Tracking, experiment_name
from models.lightning import LitTransformer, check_device, reset_peak_memory
from models.tasks import TaskDataModule
from record import vocabulary
from record.spec import RunConfig
from record.spec.metrics import metric_split


def quiet_lightning() -> None:
    """Lightning's banners and tips are noise on a terminal running many trials."""
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    logging.getLogger("lightning.fabric").setLevel(logging.WARNING)
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    for pattern in (
        ".*does not have many workers.*",
        ".*isinstance\\(treespec, LeafSpec\\).*",
        ".*The number of training batches.*",
        ".*Found .* module\\(s\\) in eval mode.*",
        ".*`training_step` returned `None`.*",
    ):
        warnings.filterwarnings("ignore", message=pattern)


def _summary_name(name: str, prefix: str) -> str:
    return f"{prefix}/{name.replace('/', '_')}"


def summarize(module, extra: dict[str, float]) -> dict[str, float]:
    out = {_summary_name(k, "best"): v for k, v in module.best.items()}
    out.update({_summary_name(k, "final"): v for k, v in module.last_val.items()})
    out.update({f"cost/{k}": v for k, v in module.cost_summary().items()})
    out.update(extra)
    return {k: v for k, v in out.items() if v is not None and math.isfinite(v)}


class StopTraining(Exception):  # noqa: N818  (a signal, not an error)
    """Raised by a hook to end training early as a result (a search's pruner, say), not as a failure."""

    def __init__(self, status: str, reason: str) -> None:
        super().__init__(reason)
        self.status, self.reason = status, reason


class Drain(L.Callback):
    """Hands the module's pending metrics to MLflow (asynchronously) and to the hooks."""

    def __init__(self, run_logger, hooks: list[Hook]) -> None:
        self.run_logger, self.hooks = run_logger, hooks
        self.stopped: tuple[str, str, int] | None = None  # (status, reason, step) when a hook stopped training
        self.fitting = False  # hooks run while training only: what is drained after it is logged, not judged
        self.exception: BaseException | None = None  # what ended fit(), if anything did

    def drain(self, module) -> None:
        while module.pending:
            step, metrics = module.pending.pop(0)
            if self.run_logger is not None:
                self.run_logger.log_metrics(metrics, step)
            if not self.fitting:
                continue
            for hook in self.hooks:
                try:
                    hook(step, metrics)
                except StopTraining as stop:
                    if self.stopped is None:
                        self.stopped = (stop.status, f"{stop.reason} (step {step})", step)
                    if module.trainer.world_size == 1:  # data-parallel: all ranks stop at the next validation
                        module.trainer.should_stop = True

    def on_train_start(self, trainer, pl_module) -> None:
        self.fitting = True

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        # the last step's metrics, before the module's clock starts on this one: drained at the end of the step
        # (Lightning calls the callbacks before the module), MLflow's hand-off and the hooks (Ray Tune's reports,
        # a pruner) were timed as training: a 50 ms hook made a 2.5 ms step 23 ms, as a review measured
        self.drain(pl_module)

    def on_validation_end(self, trainer, pl_module) -> None:
        self.drain(pl_module)
        if trainer.world_size > 1 and not trainer.sanity_checking:
            # data-parallel: rank 0's hooks decide (a pruner asks there), and every rank stops at this same
            # validation; a rank that stopped alone would leave the others waiting in an all-reduce
            self.stopped = trainer.strategy.broadcast(self.stopped, src=0)
            if self.stopped is not None:
                trainer.should_stop = True

    def on_train_end(self, trainer, pl_module) -> None:
        self.drain(pl_module)
        self.fitting = False  # the final evaluation runs on rank 0 alone: no hook may wait for the other ranks

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        self.exception = exception


def fit(trainer, module, data, drain: Drain) -> None:
    """``trainer.fit``, interruptible. Lightning turns Ctrl-C into ``sys.exit(1)`` and ignores every later Ctrl-C,
    and SIGTERM into a SystemExit at the next step; either would end a run as failed and leave the caller (a
    sweep, a test session) running. Both come back as KeyboardInterrupt, with Ctrl-C working again."""
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    main = threading.current_thread() is threading.main_thread()
    sigint = signal.getsignal(signal.SIGINT) if main else None
    drain.exception = None
    try:
        trainer.fit(module, datamodule=data)
    except SystemExit as err:
        if main:
            signal.signal(signal.SIGINT, sigint)
        if isinstance(err, SIGTERMException):
            raise KeyboardInterrupt("SIGTERM") from None
        if isinstance(drain.exception, KeyboardInterrupt):
            raise KeyboardInterrupt(*drain.exception.args) from None
        raise


class ProgressBar(L.Callback):
    """A bar over the optimisation steps with the latest loss and validation metrics."""

    SHOWN = ("train/loss", "val/loss", "val/exact_match", "val/accuracy")

    def __init__(self, max_steps: int) -> None:
        self.max_steps = max_steps
        self.shown: dict[str, str] = {}

    def on_train_start(self, trainer, pl_module) -> None:
        import sys

        from tqdm.auto import tqdm

        # on a terminal, redraw at most 10 times a second; in a log file, every 10 seconds
        self.bar = tqdm(
            total=self.max_steps, unit="step", dynamic_ncols=True, mininterval=0.1 if sys.stderr.isatty() else 10.0
        )

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        for _, metrics in pl_module.pending:
            self.shown.update({k.removeprefix("train/"): f"{metrics[k]:.4g}" for k in self.SHOWN if k in metrics})
        self.bar.set_postfix(self.shown, refresh=False)
        self.bar.update(trainer.global_step - self.bar.n)

    def on_validation_end(self, trainer, pl_module) -> None:
        self.shown.update({k: f"{v:.4g}" for k, v in pl_module.last_val.items() if k in self.SHOWN})

    def on_train_end(self, trainer, pl_module) -> None:
        self.bar.update(trainer.global_step - self.bar.n)
        self.bar.close()


def typical_lengths(rows: list[dict]) -> tuple[int, int]:
    """Mean target (or sequence) length and mean source length of some training examples."""
    sample = rows[:1000]
    if not sample:
        return 1, 0
    if "src" in sample[0]:
        tgt = sum(len(r["tgt"]) + 1 for r in sample) / len(sample)
        src = sum(len(r["src"]) for r in sample) / len(sample)
        return round(tgt), round(src)
    return round(sum(len(r["tokens"]) for r in sample) / len(sample)), 0


def train(
    run: RunConfig,
    where: Tracking | None = None,
    *,
    progress: bool = False,
    hooks: list[Hook] | None = None,
    trainer_options: dict[str, Any] | None = None,
    prepare: Callable[[Any], Any] | None = None,
    log: bool = True,
    fence: Callable[[str], bool] | None = None,
) -> RunResult:
    """Train one configuration and record it in MLflow (``log=False``: record nothing, for measurements).

    ``hooks`` receive every batch of metrics recorded while training (a sweep reports them to Ray Tune; a
    search's pruner may raise ``StopTraining``); the final evaluation after training is logged only;
    ``trainer_options`` go to ``lightning.Trainer`` (a Ray Train strategy, for example) and ``prepare``, when
    given, wraps the trainer before fitting (``ray.train.lightning.prepare_trainer``). ``fence(run_id)``, when
    given, is asked before a result (finished or diverged) is written: False (the cell's claim was taken over)
    ends the run as killed instead.
    """
    quiet_lightning()
    if run.resources.threads:
        torch.set_num_threads(run.resources.threads)
    where = where or Tracking()
    t = run.training
    device = training_device(trainer_options)
    check_device(t, device)  # a setting this device cannot run is refused before anything starts
    L.seed_everything(run.seed, workers=True, verbose=False)
    data = TaskDataModule(run.task, t.batch_size, run.seed, t.eval_batch_size)
    data.setup()  # fails here, before anything is logged, when the data cannot be built
    uri = tracking.resolve_uri(where.uri)
    experiment = experiment_name(run, where)
    run_logger = _run_logger(run, where, uri, experiment, device) if log else None
    attempt = _Attempt(started=time.perf_counter())
    try:
        attempt.fit(run, data, run_logger, hooks, progress, trainer_options, prepare)
    except KeyboardInterrupt as err:
        attempt.status, attempt.detail = (
            vocabulary.STATUS_KILLED,
            f"interrupted ({'SIGTERM' if str(err) == 'SIGTERM' else 'Ctrl-C'})",
        )
        raise
    except BaseException as err:
        attempt.status, attempt.detail = vocabulary.STATUS_FAILED, f"{type(err).__name__}: {err}"[:1000]
        if run_logger is not None:
            run_logger.log_text(traceback.format_exc(), "traceback.txt")
        raise
    finally:
        if run_logger is not None:
            status, detail = _fenced(run_logger.run_id, attempt.status, attempt.detail, fence)
            attempt.status, attempt.detail = status, detail
            run_logger.end(status, detail, attempt.summary, step=attempt.step)
    return RunResult(
        run_id=run_logger.run_id if run_logger else "",
        status=attempt.status,
        detail=attempt.detail,
        metrics=attempt.summary,
        tracking_uri=uri,
        experiment=experiment,
    )


@dataclass
class _Attempt:
    """What one call of ``train`` reached: its status and detail, the summary, the step (read when it ends, however
    it ends)."""

    started: float
    status: str = vocabulary.STATUS_FAILED
    detail: str = ""
    summary: dict[str, float] = field(default_factory=dict)
    module: Any = None

    @property
    def step(self) -> int:
        return self.module.global_step if self.module is not None else 0

    def fit(self, run: RunConfig, data, run_logger, hooks, progress: bool, trainer_options, prepare) -> None:
        t = run.training
        if run_logger is not None:
            run_logger.log_datasets(data.data, run.task.name, {s: data.digest(s) for s in data.data})
        length, source_length = typical_lengths(data.rows["train"])
        reset_peak_memory()  # this run's peak, not the worker process's (sweeps reuse processes)
        module = self.module = LitTransformer(
            run.model,
            t,
            run.task.kind,
            log_every=run.tracking.log_every,
            typical_length=length,
            typical_source_length=source_length,
        )
        drain = Drain(run_logger, list(hooks or []))
        callbacks = [ProgressBar(t.max_steps), drain] if progress else [drain]  # the bar reads before drain empties
        with tempfile.TemporaryDirectory(prefix="ablate-") as scratch:
            trainer = _trainer(t, callbacks, scratch, trainer_options, prepare)
            fit(trainer, module, data, drain)
            self.status, self.detail, extra = _outcome(module, drain, trainer, data)
            if run_logger is not None and run.tracking.checkpoint and trainer.is_global_zero and drain.stopped is None:
                path = Path(scratch) / "model.pt"
                torch.save(module.model.state_dict(), path)
                run_logger.log_artifact(path, "checkpoint")
            extra["cost/wall_time_s"] = time.perf_counter() - self.started
            extra["cost/steps"] = float(trainer.global_step)
            self.summary = summarize(module, extra)


def training_device(trainer_options: dict[str, Any] | None) -> torch.device:
    """The device Lightning's Trainer trains on: CUDA where its accelerator (``auto`` unless the options name one)
    finds it, else the CPU."""
    accelerator = (trainer_options or {}).get("accelerator", "auto")
    cuda = (not isinstance(accelerator, str) or accelerator in ("auto", "gpu", "cuda")) and torch.cuda.is_available()
    return torch.device("cuda" if cuda else "cpu")


def device_name(device: torch.device) -> str:
    """What a run's ``device`` tag says: the GPU's name, or the CPU's architecture."""
    import platform

    return torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({platform.machine()})"


def _run_logger(run: RunConfig, where: Tracking, uri: str, experiment: str, device: torch.device) -> tracking.RunLogger:
    """The run's MLflow run, started with its params and configuration, and the device it trains on (the params say
    how it trains, bf16-mixed, compile and fused AdamW among them; the device says where)."""
    tags = {
        vocabulary.TAG_DEVICE: device_name(device),
        vocabulary.TAG_SEED: str(run.seed),
        vocabulary.TAG_TASK: run.task.name,
        vocabulary.TAG_ARCH: run.model.arch,
        vocabulary.TAG_OUTPUT_CLASSES: str(run.task.output_classes(run.model) or ""),
        vocabulary.TAG_CONFIG_HASH: run.config_hash(),
        **where.tags,
        vocabulary.TAG_CODE: tracking.code_fingerprint(),  # of the code this process runs
    }
    run_logger = tracking.RunLogger(
        uri=uri,
        experiment=experiment,
        run_name=where.run_name or run.name,
        parent_run_id=where.parent_run_id,
        tags=tags,
    )
    run_logger.start(run.params(), run.to_dict())
    if run.plugins:  # which version of the researcher's own components the run compares
        from models import plugins

        run_logger.set_tags({f"{vocabulary.TAG_PLUGIN_PREFIX}{m}": d for m, d in run.plugins.items()})
        used = [plugins.LOADED[m].manifest() for m in run.plugins if m in plugins.LOADED]
        run_logger.log_text(json.dumps(used, indent=1), vocabulary.PLUGINS_ARTIFACT)
    return run_logger


def _trainer(t, callbacks: list, scratch: str, trainer_options: dict[str, Any] | None, prepare) -> Any:
    """Lightning's Trainer for the training settings ``t`` (``trainer_options`` override; ``prepare`` wraps)."""
    options = dict(
        accelerator="auto",
        devices=1,
        max_steps=t.max_steps,
        precision=t.precision,
        gradient_clip_val=t.grad_clip,
        deterministic=t.deterministic,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        val_check_interval=t.val_every,
        check_val_every_n_epoch=None,
        limit_val_batches=t.val_batches or 1.0,
        default_root_dir=scratch,
        max_time={"seconds": t.max_time} if t.max_time else None,
        callbacks=callbacks,
    )
    options.update(trainer_options or {})
    trainer = L.Trainer(**options)
    return prepare(trainer) if prepare is not None else trainer


def _outcome(module, drain: Drain, trainer, data) -> tuple[str, str, dict[str, float]]:
    """(status, detail, the final evaluation's metrics) once fit() has returned: diverged, stopped by a hook,
    or finished; a finished run whose evaluation is not finite diverged."""
    extra: dict[str, float] = {}
    detail = ""
    if module.diverged:
        status, detail = vocabulary.STATUS_DIVERGED, module.diverged["reason"]
        extra["diverged_step"] = float(module.diverged["step"])
    elif drain.stopped is not None:
        status, detail, stop_step = drain.stopped
        extra["stopped_step"] = float(stop_step)
    else:
        status = vocabulary.STATUS_FINISHED
    if trainer.is_global_zero and drain.stopped is None:
        extra.update(_final_evaluation(module, data, drain))
        lost = [k for k, v in {**module.last_val, **extra}.items() if not math.isfinite(v)]
        if status == vocabulary.STATUS_FINISHED and lost:  # the training loss stayed finite, the model's outputs
            # did not: a result with no value, counted as diverged whatever the metric is called (dropped as
            # "no value yet", it vanished; only a loss's name was checked)
            status, detail = vocabulary.STATUS_DIVERGED, f"non-finite {', '.join(lost)} after training"
            extra["diverged_step"] = float(trainer.global_step)
    return status, detail, extra


def _fenced(run_id: str, status: str, detail: str, fence: Callable[[str], bool] | None) -> tuple[str, str]:
    """A result is written only while the cell's claim holds: taken over, the run ends as killed."""
    if fence is not None and status in vocabulary.RESULT_STATES and not fence(run_id):
        return (
            vocabulary.STATUS_KILLED,
            "its claim on the cell was taken over (the lease expired): another submission trains it",
        )
    return status, detail


def _final_evaluation(module, data, drain: Drain) -> dict[str, float]:
    """Validation at the last step (unless it just ran) and every test split, in this process."""
    if module.diverged is not None:
        return {}
    if module.last_val_step != module.global_step:
        t = module.training_cfg  # the same batches as every validation before it (val_batches)
        module.record_validation(
            module.evaluate(data.val_dataloader(), "val", t.decode_batches, max_batches=t.val_batches)
        )
        drain.drain(module)
    results: dict[str, float] = {}
    for split in data.task.splits:
        if split not in ("train", "validation"):
            results.update(module.evaluate(data.loader(split), split, positions=data.task.target_positions(split)))
    return results | majority_shares(data)


def majority_shares(data) -> dict[str, float]:
    """A classification task's ``data/<split>_majority``: what always answering a held-out split's most frequent
    class scores, the level a model that learned nothing of its input falls to (the report's room check: a
    variant cannot lose more accuracy than its comparator holds above it)."""
    if data.task.kind != "classify":
        return {}
    out = {}
    for split in data.task.splits:
        labels = Counter(r["label"] for r in data.rows[split])
        if split != "train" and labels and all(isinstance(k, int) for k in labels):
            out[f"data/{metric_split(split)}_majority"] = max(labels.values()) / sum(labels.values())
    return out
