"""Several cells on one GPU (``resources.gpus`` below 1): how many at once, how much memory one needs, measured by
a calibration step, and a refusal before anything trains when they would not fit in a GPU's memory.

A calibration step is one optimisation step (forward, backward, AdamW) on the longest training batch of the task,
then a forward pass on the longest evaluation batch, of the largest distinct models of the study. The driver runs it
on the CPU, counting the bytes of the tensors it allocates: the same step allocates the same tensors on a GPU, and the
driver holds no CUDA context that would take a GPU's memory from the cells (a GPU's allocator peak, measured the same
way, is ``step_memory_mb(run, cuda)``). Each process on a GPU also holds a CUDA context and torch's kernels
(``CUDA_CONTEXT_MB``), added per cell.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from ablations.cluster import DoesNotFit
from record.spec import Resources, RunConfig, Study

# Per process on a GPU, beside its tensors: the CUDA context, torch's kernels, cuBLAS's workspace and the caching
# allocator's slack. On an H200 with torch 2.11 (benchmarks/results/gpu.md, 2026-11-28) nvidia-smi showed at most 810
# MiB per trial process of norm_placement, whose calibration step counts 9 MiB of tensors: 800 MiB besides them.
CUDA_CONTEXT_MB = 800.0
CALIBRATED_MODELS = 2  # the distinct models of a study calibrated: the largest by parameters (about 1 s each)
GIB = 1024.0


@dataclass(frozen=True)
class Calibration:
    """What one cell needs of a GPU: the allocator's peak of its calibration step plus a process's context."""

    step_mb: float  # the calibration step's peak (allocator reserved on a GPU; tensor bytes on a CPU)
    context_mb: float
    device: str  # where the step ran: "NVIDIA H200", or "cpu"
    variant: str  # the variant whose step needed the most

    @property
    def cell_mb(self) -> float:
        return self.step_mb + self.context_mb

    def describe(self) -> str:
        how = "allocator peak" if self.device != "cpu" else "tensor bytes"
        return (
            f"one cell needs {_gib(self.cell_mb)} ({how} of a calibration step on {self.device}: {_gib(self.step_mb)}, "
            f"+ {_gib(self.context_mb)} per process for CUDA's context and kernels; the most of any variant: "
            f"{self.variant})"
        )


def cells_per_gpu(r: Resources) -> int | None:
    """Cells a GPU holds at once by the study's fraction (``gpus: 0.125``: 8); None unless cells share GPUs."""
    gpus = r.per_worker_gpus if r.workers > 1 else r.gpus
    if not 0 < gpus < 1:
        return None
    return math.floor(1 / gpus + 1e-9)


def _gib(mb: float) -> str:
    return f"{mb / GIB:.2f} GiB" if mb >= GIB else f"{mb:.0f} MiB" if mb >= 10 else f"{mb:.1f} MiB"


# --- the calibration step --------------------------------------------------------------------------------------------


def calibrate(study: Study, out: Callable[[str], None] = print) -> Calibration:
    """The most memory any variant's cell needs (the largest ``CALIBRATED_MODELS`` distinct models, by parameter
    count; the seed does not change the memory), from a calibration step on the CPU."""
    import torch

    runs = _distinct_models(study)
    out(f"packing: one calibration step of the {len(runs)} largest model(s) of {study.name!r}, on the CPU")
    data: dict[str, object] = {}  # one task's data for every model that trains on it
    measured = [(step_memory_mb(run, torch.device("cpu"), data), label) for label, run in runs]
    step_mb, label = max(measured)
    return Calibration(step_mb=step_mb, context_mb=CUDA_CONTEXT_MB, device="cpu", variant=label)


def _distinct_models(study: Study) -> list[tuple[str, RunConfig]]:
    """One run per distinct (model, task, batch sizes, precision): the largest few by parameters."""
    import torch

    from models.transformer import Transformer

    seen: dict[str, tuple[int, str, RunConfig]] = {}
    for cell in study.cells:
        run, t = cell.run, cell.run.training
        key = repr((run.model, run.task.to_dict(), t.batch_size, t.eval_batch_size, t.precision, t.compile))
        if key not in seen:
            with torch.device("meta"):  # counted without allocating the parameters
                n = Transformer(run.model).num_parameters()
            seen[key] = (n, cell.variant, run)
    ranked = sorted(seen.values(), key=lambda x: -x[0])[:CALIBRATED_MODELS]
    return [(label, run) for _, label, run in ranked]


def step_memory_mb(run: RunConfig, device, cache: dict | None = None) -> float:
    """Peak memory of one training step on the longest batch and one evaluation forward on the longest eval batch.
    ``cache``: task data built by earlier calls, by task (reused)."""
    import torch

    from models.lightning import LitTransformer
    from models.tasks import TaskDataModule

    t = run.training
    torch.manual_seed(run.seed)
    key = repr((run.task.to_dict(), t.batch_size, t.eval_batch_size))
    cache = {} if cache is None else cache
    if key not in cache:
        cache[key] = TaskDataModule(run.task, t.batch_size, run.seed, t.eval_batch_size)
        cache[key].setup()
    data = cache[key]
    train_batch = _longest_batch(data, ["train"], t.batch_size)
    eval_batch = _longest_batch(data, [s for s in data.task.splits if s != "train"], data.eval_batch_size)

    def train_step() -> None:
        module = LitTransformer(run.model, t, run.task.kind).to(device)
        optimizer = module.configure_optimizers()["optimizer"]
        with _autocast(device, t.precision):
            loss, _, _ = module.step_loss(_to(train_batch, device), step=0)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def evaluation() -> None:
        module = LitTransformer(run.model, t, run.task.kind).to(device).eval()
        with torch.no_grad(), _autocast(device, t.precision):
            module.scored_logits(_to(eval_batch, device))

    peaks = [_peak_mb(train_step, device)]
    if eval_batch is not None:
        peaks.append(_peak_mb(evaluation, device))
    return max(peaks)


def _peak_mb(fn: Callable[[], None], device) -> float:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        before = torch.cuda.memory_reserved(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize(device)
        return max(0, torch.cuda.max_memory_reserved(device) - before) / 2**20
    # Why a private module: torch has no public count of the CPU's tensor bytes; MemTracker (torch 2.5+) follows
    # every allocation through a dispatch mode, and torch's own tests check it against the CUDA allocator's peak.
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = MemTracker()
    with tracker:
        fn()
    return tracker.get_tracker_snapshot("peak")[device]["Total"] / 2**20


def _autocast(device, precision: str):
    import contextlib

    import torch

    if precision.startswith("bf16"):
        return torch.autocast(device.type, dtype=torch.bfloat16)
    if precision.startswith("16"):
        return torch.autocast(device.type, dtype=torch.float16)
    return contextlib.nullcontext()


def _longest_batch(data, splits: list[str], size: int):
    """The ``size`` longest examples of ``splits``, collated: the batch that needs the most memory."""
    from models.tasks.batches import collate

    rows = [r for s in splits for r in data.rows.get(s, [])]
    if not rows:
        return None
    rows = sorted(rows, key=_length, reverse=True)[:size]
    return collate(data.task.kind, rows)


def _length(row: dict) -> int:
    return sum(len(v) for v in row.values() if isinstance(v, list | str))


def _to(batch: dict, device) -> dict:
    return {k: v.to(device) for k, v in batch.items()}


# --- a GPU's memory, and the check -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuMemory:
    mb: float
    source: str  # "declared (resources.gpu_memory_gb)", "this machine's NVIDIA H200", "node 10.0.0.2's NVIDIA A10G"


def local_gpu_memory(r: Resources) -> GpuMemory | None:
    """The memory of a GPU as declared, else of this machine's smallest GPU as ``nvidia-smi`` reports it (which,
    unlike torch, creates no CUDA context); None when neither says."""
    if r.gpu_memory_gb is not None:
        return GpuMemory(r.gpu_memory_gb * GIB, "declared (resources.gpu_memory_gb)")
    import shutil
    import subprocess

    if shutil.which("nvidia-smi") is None:
        return None
    query = ["nvidia-smi", "--query-gpu=memory.total,name", "--format=csv,noheader,nounits"]
    try:
        lines = subprocess.run(query, capture_output=True, text=True, timeout=60, check=True).stdout.splitlines()
        gpus = [(float(mb), name.strip()) for mb, name in (line.split(",", 1) for line in lines if line.strip())]
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    if not gpus:
        return None
    mb, name = min(gpus)
    return GpuMemory(mb, f"this machine's {name}")


def cluster_gpu_memory(r: Resources) -> GpuMemory | None:
    """The smallest GPU memory of the connected cluster's GPU nodes, asked by a task on each (declared first);
    None when no node's task finds CUDA (GPUs declared to Ray on a machine without them)."""
    if r.gpu_memory_gb is not None:
        return local_gpu_memory(r)
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    need = min(r.per_worker_gpus if r.workers > 1 else r.gpus, 1.0)

    @ray.remote(num_cpus=0, num_gpus=need)
    def probe() -> tuple[float, str] | None:
        import torch

        if not torch.cuda.is_available():
            return None
        props = torch.cuda.get_device_properties(0)
        return props.total_memory / 2**20, props.name

    nodes = [n for n in ray.nodes() if n.get("Alive") and n["Resources"].get("GPU", 0) >= need]
    asks = {
        n["NodeManagerAddress"]: probe.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
        ).remote()
        for n in nodes
    }
    found = [(res, addr) for addr, ref in asks.items() if (res := ray.get(ref, timeout=300)) is not None]
    if not found:
        return None
    (mb, name), addr = min(found)
    return GpuMemory(mb, f"node {addr}'s {name}")


def check_memory(r: Resources, calibration: Calibration, memory: GpuMemory) -> None:
    """Refuse, with the numbers and the fraction that fits, cells that would not fit in a GPU's memory together."""
    per_gpu = cells_per_gpu(r) or 1
    need = per_gpu * calibration.cell_mb
    if need <= memory.mb:
        return
    fit = math.floor(memory.mb / calibration.cell_mb)
    fix = (
        f"at most {fit} fit: set resources.gpus to {math.floor(10**6 / fit) / 10**6:g} (1/{fit}) or more"
        if fit >= 1
        else "not even one fits: make the model or the batch smaller, or use a larger GPU"
    )
    raise DoesNotFit(
        f"{per_gpu} cell(s) at once on a GPU (resources.gpus {r.gpus:g}) need {per_gpu} x {_gib(calibration.cell_mb)}"
        f" = {_gib(need)}, but a GPU holds {_gib(memory.mb)} ({memory.source}); {calibration.describe()}; {fix}"
    )


def packing_lines(r: Resources, calibration: Calibration, memory: GpuMemory | None) -> list[str]:
    """What the dry run says of packing: cells at once per GPU, memory per cell, and the total against a GPU's."""
    per_gpu = cells_per_gpu(r) or 1
    lines = [f"packing: {per_gpu} cell(s) at once per GPU (resources.gpus {r.gpus:g}); {calibration.describe()}"]
    total = per_gpu * calibration.cell_mb
    if memory is None:
        lines.append(
            f"packing: {per_gpu} x {_gib(calibration.cell_mb)} = {_gib(total)} per GPU; a GPU's memory is read on "
            "the cluster when the sweep starts (or declare resources.gpu_memory_gb)"
        )
    else:
        lines.append(
            f"packing: {per_gpu} x {_gib(calibration.cell_mb)} = {_gib(total)} of a GPU's {_gib(memory.mb)} "
            f"({memory.source}): {'fits' if total <= memory.mb else 'does not fit'}"
        )
    return lines


def check_before(study: Study, address: str | None, out: Callable[[str], None] = print) -> Calibration | None:
    """Before anything is recorded: a packing study's calibration, checked against a GPU's memory where this machine
    knows it (declared, or the local Ray's GPUs). None: cells do not share GPUs."""
    r = study.resources
    if cells_per_gpu(r) is None:
        return None
    calibration = calibrate(study, out)
    memory = local_gpu_memory(r) if address is None or r.gpu_memory_gb is not None else None
    for line in packing_lines(r, calibration, memory):
        out(line)
    if memory is not None:
        check_memory(r, calibration, memory)
    return calibration


def check_on_cluster(r: Resources, calibration: Calibration | None, out: Callable[[str], None] = print) -> None:
    """Once connected to a cluster at an address: its GPUs' memory, asked on its nodes, against the calibration."""
    if calibration is None or r.gpu_memory_gb is not None:
        return  # not packing, or checked before anything was recorded
    memory = cluster_gpu_memory(r)
    if memory is None:
        out("packing: no GPU node of the cluster reports its memory (no CUDA there): not checked")
        return
    check_memory(r, calibration, memory)
    out(f"packing: {packing_lines(r, calibration, memory)[-1].removeprefix('packing: ')}")
