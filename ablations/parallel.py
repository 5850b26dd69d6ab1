"""Data-parallel training of one run (``resources.workers > 1``) through Ray Train V2 and Lightning.

Sweeps and searches share it. Every rank trains; rank 0 alone logs to the run's one MLflow run and runs the
caller's rank-0 hooks (a search's pruner reports to Optuna there). A decision to stop early that rank 0 takes
reaches every rank at the same validation (``ablations.train.Drain`` broadcasts it), so no rank is left
waiting in an all-reduce.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ablations.process import exit_quickly, import_paused, training_modules
from ablations.tracking import Hook, RunResult, Tracking
from record import vocabulary
from record.secrets import Credentials
from record.spec import Resources, RunConfig


@dataclass(kw_only=True)
class ParallelJob:
    """What every rank needs (shipped to the Ray Train workers)."""

    run: RunConfig
    where: Tracking
    resources: Resources
    rank0_hooks: Callable[[], list[Hook]] | None = None  # built on rank 0, in its process (picklable)
    report_validation: bool = False  # every rank reports each validation to Ray (Tune reads them)
    fence: Callable[[str], bool] | None = None  # rank 0 asks it before writing a result (ablations.claims.Fence)
    credentials: Credentials = dataclasses.field(default_factory=Credentials)  # set by run_data_parallel


def _worker(config: dict) -> None:
    """One rank."""
    job: ParallelJob = config["job"]
    job.credentials.apply()
    exit_quickly()  # this rank's process ends without collecting its libraries' garbage
    import_paused(["ray.train.lightning", *training_modules(job.where.uri)])  # with the collector paused
    import ray.train
    import torch
    from ray.train.lightning import RayDDPStrategy, RayLightningEnvironment, prepare_trainer

    from ablations.train import train

    torch.set_num_threads(max(1, int(job.resources.per_worker_cpus)))
    rank = ray.train.get_context().get_world_rank()
    hooks: list[Hook] = []
    if rank == 0 and job.rank0_hooks is not None:
        hooks += job.rank0_hooks()
    if job.report_validation:

        def report(step: int, metrics: dict[str, float]) -> None:
            if any(k.startswith("val/") for k in metrics):
                ray.train.report({**metrics, "step": step})  # every rank reports at the same points (Train V2)

        hooks.append(report)
    options = {
        "strategy": RayDDPStrategy(),
        "plugins": [RayLightningEnvironment()],
        "devices": "auto",
        "accelerator": "gpu" if job.resources.gpus else "cpu",
    }
    train(
        job.run,
        job.where,
        hooks=hooks,
        trainer_options=options,
        prepare=prepare_trainer,
        log=rank == 0,
        fence=job.fence if rank == 0 else None,
    )


def backend(resources: Resources) -> str:
    """torch.distributed's backend for the workers: NCCL when each has a GPU of its own, gloo on CPUs and when
    workers share GPUs (``resources.share_gpus``: NCCL refuses two ranks on one device, and Ray Train, left to
    choose, picks NCCL whenever GPUs are asked for)."""
    return "nccl" if resources.gpus and resources.per_worker_gpus >= 1 else "gloo"


def run_data_parallel(
    job: ParallelJob, *, name: str, storage_path: str, callbacks: list[Any] | None = None
) -> RunResult:
    """Train ``job.run`` on ``job.resources.workers`` Ray Train workers; the result is rank 0's MLflow run.

    Ray Train V2 keeps reported metrics only with checkpoints, so the result is read back from MLflow, the
    record of every run, by a tag unique to this call."""
    import uuid

    from ray.train import RunConfig as TrainRunConfig
    from ray.train import ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    key = f"{name}-{uuid.uuid4().hex[:8]}"
    job = dataclasses.replace(
        job,
        where=dataclasses.replace(job.where, tags={**job.where.tags, vocabulary.TAG_RAY_TRAIN_RUN: key}),
        credentials=Credentials.from_environ(),  # the trial's, which has them from its driver
    )
    r = job.resources
    per_worker = {"CPU": r.per_worker_cpus}
    if r.gpus:
        per_worker["GPU"] = r.per_worker_gpus
    trainer = TorchTrainer(
        _worker,
        train_loop_config={"job": job},
        scaling_config=ScalingConfig(num_workers=r.workers, use_gpu=bool(r.gpus), resources_per_worker=per_worker),
        torch_config=TorchConfig(backend=backend(r)),
        run_config=TrainRunConfig(name=key, storage_path=storage_path, callbacks=callbacks or []),
    )
    try:
        trainer.fit()
    except Exception as err:  # a rank died: rank 0's run, if it started, must not stay RUNNING
        _recorded_result(job, key, f"{type(err).__name__}: {err}"[:1000])
        raise
    return _recorded_result(job, key, "rank 0 did not end its run")


def _recorded_result(job: ParallelJob, key: str, lost: str) -> RunResult:
    """Rank 0's run, found by its tag; a run still RUNNING (rank 0 is gone) is ended as failed with ``lost``."""
    from ablations import tracking

    uri = tracking.resolve_uri(job.where.uri)
    experiment = tracking.experiment_name(job.run, job.where)
    c = vocabulary.client(uri)
    exp = c.get_experiment_by_name(experiment)
    runs = c.search_runs([exp.experiment_id], f"tags.ray_train_run = '{key}'") if exp else []
    if not runs:
        return RunResult(
            run_id="",
            status=vocabulary.STATUS_FAILED,
            detail=f"rank 0 recorded no MLflow run ({lost})",
            metrics={},
            tracking_uri=uri,
            experiment=experiment,
        )
    run = runs[0]
    status, detail = vocabulary.parse_status(run.data.tags.get(vocabulary.TAG_STATUS, ""))
    if run.info.status == "RUNNING" or not status:
        status, detail = vocabulary.STATUS_FAILED, lost
        vocabulary.end_run(uri, run.info.run_id, status, detail)
    return RunResult(
        run_id=run.info.run_id,
        status=status,
        detail=detail,
        metrics=dict(run.data.metrics),
        tracking_uri=uri,
        experiment=experiment,
    )
