"""One cell of a study in a Ray Tune trial: check MLflow, train (or reuse), record whatever happens.

A retried or restored trial never trains a finished cell twice: the trial checks MLflow again before
training, marks its own lost earlier attempts KILLED, trains with ``ablations.train.train`` into a child run
(or, with ``workers > 1``, data-parallel through Ray Train with rank 0 logging) and records anything that goes
wrong as a failed run with the traceback, then raises so that Tune retries it.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ablations import tracking
from ablations.claims import ANY_CODE, Claim, Fence
from ablations.process import exit_quickly, import_paused, trial_modules
from models import plugins
from record import vocabulary
from record.secrets import Credentials
from record.spec import Cell, Resources


@dataclass(kw_only=True)
class TrialContext:
    """What every trial needs to know about its submission (shipped to the workers)."""

    uri: str
    study: str
    parent_run_id: str
    submission: int
    resources: Resources
    storage: str
    metric: str
    code: dict[str, str] = field(default_factory=dict)  # git sha and dirty flag (tags)
    fingerprint: str = ""  # of the code that shapes a result (ablations.tracking.code_fingerprint)
    reuse_any_code: bool = False  # a result trained by other code counts as done
    claims_url: str = ""
    owner: str = ""
    tokens: dict[str, int] = field(default_factory=dict)  # cell_id -> the fencing token of its claim
    credentials: Credentials = field(default_factory=Credentials)  # the driver's MLflow credentials
    plugins: list = field(default_factory=list)  # models.plugins.PluginRef of every plugin the driver loaded


def cell_tags(cell: Cell, ctx: TrialContext, attempt: int) -> dict[str, str]:
    import ray

    tags = {
        vocabulary.TAG_KIND: vocabulary.KIND_CELL,
        vocabulary.TAG_STUDY: ctx.study,
        vocabulary.TAG_VARIANT: cell.variant,
        vocabulary.TAG_SEED: str(cell.seed),
        vocabulary.TAG_CELL_ID: cell.cell_id,
        vocabulary.TAG_CONFIG_HASH: cell.cell_id,  # the hash of what it trains, its data-parallel workers included
        vocabulary.TAG_SUBMISSION: str(ctx.submission),
        vocabulary.TAG_ATTEMPT: str(attempt),
        vocabulary.TAG_PID: str(os.getpid()),
        vocabulary.TAG_WORKERS: str(ctx.resources.workers),
        **ctx.code,
        vocabulary.TAG_CODE: ctx.fingerprint,  # train() replaces it with the fingerprint of the code it runs
    }
    if ray.is_initialized():
        rc = ray.get_runtime_context()
        tags[vocabulary.TAG_RAY_NODE] = rc.get_node_id()
        tags[vocabulary.TAG_RAY_NODE_IP] = ray.util.get_node_ip_address()
    tags[vocabulary.TAG_CODE_DIR] = str(Path(sys.modules["models"].__file__).resolve().parent.parent)
    return tags  # its settings are recorded once, in the submission's design.json


def run_name(cell: Cell) -> str:
    return f"{cell.variant} | seed {cell.seed}"


def _record_early_failure(cell: Cell, ctx: TrialContext, tags: dict[str, str], err: BaseException) -> None:
    """A failure before train() opened a run (data missing on this node, say) is recorded all the same."""
    logger = tracking.RunLogger(
        uri=ctx.uri, experiment=ctx.study, run_name=run_name(cell), parent_run_id=ctx.parent_run_id, tags=tags
    )
    logger.start(cell.run.params(), cell.run.to_dict())
    logger.log_text("".join(traceback.format_exception(err)), "traceback.txt")
    logger.end(vocabulary.STATUS_FAILED, f"{type(err).__name__}: {err}"[:1000])


def run_cell(cell: Cell, ctx: TrialContext, report: Callable[[dict], None]) -> dict[str, Any]:
    """Train one cell unless MLflow already holds its result. Raises when training fails (Tune retries)."""
    ctx.credentials.apply()
    exit_quickly()  # this process ends without collecting its libraries' garbage
    import_paused(trial_modules(ctx.uri, ctx.resources.workers))  # and imports with the collector paused
    plugins.load_on_worker(ctx.plugins)  # raised here (PluginUnavailable), nothing of the cell is recorded
    runs = vocabulary.cell_runs(ctx.uri, ctx.study, cell.cell_id).get(cell.cell_id, [])
    code = None if ctx.reuse_any_code else ctx.fingerprint
    done = vocabulary.result_run(runs, code)
    if done is not None:  # trained by an earlier attempt or submission: never twice
        out = {"status": vocabulary.cell_state(done), "run_id": done.info.run_id, "reused": True}
        report(out)
        return out
    for run in runs:
        if run.info.status == "RUNNING":  # an attempt whose process or node died
            vocabulary.mark_killed(ctx.uri, run, "lost: its process or node stopped before it finished; retried")
    # the earlier runs of this cell by this code (any code's with reuse_any_code), whichever submission made them:
    # what the sweep's table and `ablate report` count as its attempts
    attempt = 1 + sum(vocabulary.same_code(r, code) for r in runs)
    tags = cell_tags(cell, ctx, attempt)
    fence = None
    if cell.cell_id in ctx.tokens:  # the result is written only while this submission's claim holds
        claim = Claim(ctx.study, cell.cell_id, code or ANY_CODE, ctx.tokens[cell.cell_id])  # the driver's key
        fence = Fence(ctx.claims_url, ctx.owner, claim)
        tags[vocabulary.TAG_CLAIM] = str(claim.token)
    where = tracking.Tracking(
        uri=ctx.uri, experiment=ctx.study, parent_run_id=ctx.parent_run_id, run_name=run_name(cell), tags=tags
    )

    def hook(step: int, metrics: dict[str, float]) -> None:
        if any(k.startswith("val/") for k in metrics):
            report({**metrics, "step": step})

    try:
        if ctx.resources.workers > 1:  # this actor only drives the workers: no torch here
            result = _run_data_parallel(cell, ctx, where, fence)
        else:
            result = _train_here(cell, ctx, where, hook, fence)
    except Exception as err:
        recorded = any(
            r.data.tags.get(vocabulary.TAG_ATTEMPT) == str(attempt)
            for r in vocabulary.cell_runs(ctx.uri, ctx.study, cell.cell_id).get(cell.cell_id, [])
        )
        if not recorded:
            _record_early_failure(cell, ctx, tags, err)
        raise
    out = {"status": result.status, "run_id": result.run_id, "reused": False}
    if ctx.metric in result.metrics:
        out[ctx.metric] = result.metrics[ctx.metric]
    report(out)
    return out


def _train_here(cell: Cell, ctx: TrialContext, where, hook, fence):
    import torch

    from ablations.train import train

    torch.set_num_threads(max(1, int(ctx.resources.per_worker_cpus)))
    return train(cell.run, where, hooks=[hook], fence=fence)


def _run_data_parallel(cell: Cell, ctx: TrialContext, where, fence):
    from ray.tune.integration.ray_train import TuneReportCallback

    from ablations.parallel import ParallelJob, run_data_parallel

    job = ParallelJob(run=cell.run, where=where, resources=ctx.resources, report_validation=True, fence=fence)
    name = f"ddp-{cell.cell_id}-{where.tags.get(vocabulary.TAG_ATTEMPT, '1')}"
    return run_data_parallel(job, name=name, storage_path=ctx.storage, callbacks=[TuneReportCallback()])


def trainable(config: dict, cells: dict[str, Cell], ctx: TrialContext) -> None:
    """The Tune function trainable: ``config["cell_id"]`` names the cell."""
    from ray import tune

    run_cell(cells[config["cell_id"]], ctx, lambda metrics: tune.report(tune_safe(metrics)))


def tune_safe(metrics: dict[str, Any]) -> dict[str, Any]:
    """Tune's metric names cannot hold '/'."""
    return {k.replace("/", "_"): v for k, v in metrics.items()}
