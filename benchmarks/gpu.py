"""GPU benchmarks (issues 16 and 52): our CUDA paths against the anchors torch itself offers, side by side in one run.

    python benchmarks/gpu.py                  # a CUDA machine: every section, each within its own time limit (about
                                              # 12 minutes on an H200), then results/gpu.md, gpu.json and the GPU
                                              # section of benchmarks/README.md, with the device named
    python benchmarks/gpu.py --resume         # the sections results/gpu.json lacks, or that failed or were cut off
    python benchmarks/gpu.py --only decoder,encoder   # these sections again, the others kept
    python benchmarks/gpu.py --smoke          # any machine, CPU by default: every section at tiny sizes through the
                                              # same code paths (results/smoke/); exit 1 when a section fails
    python benchmarks/gpu.py --smoke --compiler aot_eager   # the same through torch.compile's graph capture without
                                              # generating kernels (what the test suite runs: seconds, not a minute)
    python benchmarks/gpu.py --smoke --device cuda   # on the GPU first (about a minute): the real kernels at tiny sizes

Sections (targets from issue 16):

1. ``attention``: local attention, window 256, causal, 16 heads of 64, bf16, forward + backward, at 4k, 16k, 64k and
   1k tokens (the target's length first: a run cut off keeps it): ours (``LocalPattern.attend``: FlexAttention with
   cached BlockMasks) against FlexAttention's sliding window written the obvious way (``create_block_mask``) and
   flash full causal attention (scaled_dot_product_attention); dilated attention (half the heads at dilation 2) and
   ALiBi, each against the FlexAttention that computes the same thing. Before it is timed, each of ours is checked
   to give the outputs of its anchor (a peer that computes something else is no peer: the first H100 run had one).
   The anchors call the process's compiled ``flex_attention`` (``models.flex.compiled``), as every model layer
   does. Targets: time and memory at most FlexAttention's at every length; at 4k at least as fast as flash.
2. ``decoder``: one training step of a 16k-token decoder (d 512, 4 layers, bf16 autocast, fused AdamW): local
   (window 256) against full attention, eager, then both compiled (``training.compile``). Target: at least 2x.
3. ``additive``: additive (Bahdanau) against dot-product scores, full attention, n = 4096, fp32: time and memory.
   Target: at most 10x dot, memory bounded by the tile.
4. ``encoder``: a training step (forward, backward, fused AdamW) of an encoder of d 1024, 8 layers, T 2048, batch 16,
   bf16 autocast: ours against nn.TransformerEncoder, eager, then both under torch.compile (the compiled plain loop):
   tokens/s and MFU. Target: MFU at least 45%.
5. ``run_vs_loop``: ``ablate run`` against a plain loop on the 85M-parameter byte LM (benchmarks/run_vs_loop.py
   --size gpu), eager; 6. ``run_vs_loop_compiled``: the same with ``training.compile`` and ``training.fused_adamw``.
   The ratio is the median of at least five alternating repeats, with its range. Target: at least 0.97x.

Time: every section has its own limit (``LIMITS``, seconds on an H100; ``--limits name=seconds,...``); within it,
a section measures what it can and stops before its limit when the next measurement would not fit; at its limit it
is stopped (SIGALRM). Each section's figures are written as soon as they are measured (results/gpu.json, gpu.md):
a run cut off keeps what it measured, and ``--resume`` runs the rest. torch's limit of compilations per function
makes a compilation past it an error here (``fail_on_recompile_limit_hit``), not a silent run of the uncompiled,
dense path (which is what the first H100 run measured at 4k tokens for four contenders).

Times: CUDA events around each call (a CPU clock on a CPU), after warm-up (compilation), median of the repeats,
the contenders alternating. Peak memory: torch.cuda.max_memory_allocated over one call, above what was allocated
before it (not measured on a CPU).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import platform
import re
import signal
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

H, D, WINDOW = 16, 64, 256
DILATIONS = (1,) * (H // 2) + (2,) * (H // 2)  # the dilated contenders: half the heads at dilation 2
BEGIN, END = "<!-- gpu:begin -->", "<!-- gpu:end -->"

# Seconds each section may take (`benchmarks/gpu_session.sh` fits them to its device calls). From the H200 sessions
# of 2026-11-27 and -28 (torch 2.11): attention was cut at 120 s while compiling cold, and took 114 s with the
# compilations cached; decoder 30 s, additive 9, encoder 43; `ablate run` against the loop, eager, 101 s for five
# repeats; compiled, 130 to 160 s for the untimed run that fills torch.compile's cache, then repeats that reuse it.
LIMITS = {
    "attention": 240,
    "decoder": 40,
    "additive": 15,
    "encoder": 60,
    "run_vs_loop": 150,
    "run_vs_loop_compiled": 300,
    "profile": 110,  # additive's fused kernels compile for each chunk size
    "packed": 450,  # benchmarks/packing.py's levels: 150 + 80 + 100 + 100 s, and the calibration
}
SECTIONS = tuple(LIMITS)

GPU_PLAN: dict[str, dict[str, Any]] = {
    "attention": {
        "heads": H,
        "head_dim": D,
        "window": WINDOW,
        "lengths": [4096, 16384, 65536, 1024],
        "dtype": "bfloat16",
        "repeats": 10,
        "warmup": 3,
    },
    "decoder": {
        "tokens": 16384,
        "d_model": 512,
        "n_heads": 8,
        "n_layers": 4,
        "d_ff": 2048,
        "window": WINDOW,
        "repeats": 10,
        "warmup": 3,
    },
    "additive": {"n": 4096, "d_model": 512, "heads": 8, "head_dim": 64, "repeats": 10, "warmup": 3},
    "encoder": {"T": 2048, "batch": 16, "d_model": 1024, "layers": 8, "heads": 16, "repeats": 10, "warmup": 3},
    "run_vs_loop": {"size": "gpu", "steps": 30, "repeats": 5, "warm": 10, "precision": "bf16-mixed", "compile": False},
    "run_vs_loop_compiled": {
        "size": "gpu",
        "steps": 30,
        "repeats": 5,
        "warm": 20,  # step 0 compiles; the rest settle the allocator and autotuning
        "precision": "bf16-mixed",
        "compile": True,
    },
    "profile": {
        "decoder": {
            "tokens": 16384,
            "d_model": 512,
            "n_heads": 8,
            "n_layers": 4,
            "d_ff": 2048,
            "window": WINDOW,
            "repeats": 10,
            "warmup": 3,
        },
        "additive": {
            "n": 4096,
            "d_model": 512,
            "heads": 8,
            "head_dim": 64,
            "chunk_bits": [20, 22, 24, 26],
            "repeats": 5,
            "warmup": 2,
        },
    },  # fmt: skip
    "packed": {"study": "norm_placement", "levels": [16, 1, 4, 8], "limits": {16: 150, 1: 80, 4: 100, 8: 100}},
}
QUICK_PLAN = {  # a short check on a GPU (not the measurement): results/quick/
    **GPU_PLAN,
    "attention": {**GPU_PLAN["attention"], "lengths": [4096, 1024], "repeats": 3},
    "decoder": {**GPU_PLAN["decoder"], "tokens": 4096, "repeats": 3},
    "additive": {**GPU_PLAN["additive"], "n": 1024, "repeats": 3},
    "encoder": {**GPU_PLAN["encoder"], "T": 512, "batch": 4, "repeats": 3},
    "run_vs_loop": {**GPU_PLAN["run_vs_loop"], "steps": 20, "repeats": 2},
    "run_vs_loop_compiled": {**GPU_PLAN["run_vs_loop_compiled"], "steps": 20, "repeats": 2},
    "packed": {**GPU_PLAN["packed"], "levels": [4], "limits": {4: 60}},
}
SMOKE_PLAN: dict[str, dict[str, Any]] = {  # tiny sizes, the same code paths: results/smoke/
    "attention": {
        "heads": 4,
        "head_dim": 16,
        "window": 64,
        "lengths": [320],  # a ragged last block (each new length is a compilation per variant on a CPU)
        "dtype": "float32",
        "repeats": 1,
        "warmup": 1,
    },
    "decoder": {
        "tokens": 384,
        "d_model": 64,
        "n_heads": 4,
        "n_layers": 2,
        "d_ff": 128,
        "window": 64,
        "repeats": 1,
        "warmup": 1,
    },
    "additive": {"n": 128, "d_model": 64, "heads": 4, "head_dim": 16, "repeats": 1, "warmup": 1},
    "encoder": {"T": 64, "batch": 2, "d_model": 64, "layers": 2, "heads": 4, "repeats": 1, "warmup": 1},
    "run_vs_loop": {
        "size": "tiny",
        "steps": 10,
        "repeats": 2,  # the order swapped
        "warm": 10,
        "task": {"max_chars": 20000},
        "precision": "bf16-mixed",
        "compile": False,
    },
    "run_vs_loop_compiled": {
        "size": "tiny",
        "steps": 10,
        "repeats": 1,
        "warm": 10,
        "task": {"max_chars": 20000},
        "precision": "bf16-mixed",
        "compile": True,
    },
}
SMOKE_PLAN["profile"] = {
    "decoder": SMOKE_PLAN["decoder"],
    "additive": {**SMOKE_PLAN["additive"], "chunk_bits": [10, 12]},
}
SMOKE_PLAN["packed"] = {"study": "norm_placement", "levels": [2], "smoke": True}
SMOKE_CUDA = {  # a smoke run on a GPU: the attention kernels at the measured head size and dtype (shared memory)
    "attention": {**SMOKE_PLAN["attention"], "heads": H, "head_dim": D, "dtype": "bfloat16", "lengths": [256, 320]},
}
SMOKE_LIMIT = 180.0

# What a CPU cannot show: printed by a smoke run so that nobody takes its pass for more than it is.
CPU_LIMITS = (
    "FlexAttention has no backward on CPU (torch 2.13): attention is timed forward only there, and training steps "
    "of local attention run on the tiled kernels (FlexAttention on CUDA)",
    "kernel resources (Triton's shared memory per block: the ALiBi table that needed 240 KB of an H100's 227 KB), "
    "flash kernels, bf16 tensor cores and peak memory are CUDA's: run `--smoke --device cuda` on the GPU first",
)


class SectionTimeout(Exception):  # noqa: N818  (a signal, not an error)
    """A section reached its time limit."""


# --- timing -----------------------------------------------------------------------------------------------------


class Clock:
    """Milliseconds of one call (CUDA events on a GPU, the CPU clock elsewhere) and its peak memory (GPU only)."""

    def __init__(self, device) -> None:
        self.cuda = device.type == "cuda"

    def ms(self, fn: Callable[[], object]) -> float:
        import torch

        if not self.cuda:
            start = time.perf_counter()
            fn()
            return 1000 * (time.perf_counter() - start)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end)

    def peak_mb(self, fn: Callable[[], object]) -> float | None:
        """Peak memory of one call above what was allocated before it, MB (None on a CPU: not measured)."""
        import torch

        if not self.cuda:
            return None
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - before) / 2**20


class Context:
    """What a section works with: the device and its clock, its time limit, and ``put`` to store its figures so
    far (written to disk at once)."""

    def __init__(self, name: str, device, limit: float, store: Callable[[str, Any], None], notes: list[str]) -> None:
        self.name, self.device, self.clock = name, device, Clock(device)
        self.deadline = time.monotonic() + limit
        self.store, self.notes = store, notes

    @property
    def cpu(self) -> bool:
        return self.device.type != "cuda"

    def time_left(self) -> float:
        return self.deadline - time.monotonic()

    def check(self) -> None:
        if self.time_left() <= 0:
            raise SectionTimeout(self.name)

    def put(self, value: Any) -> None:
        self.store(self.name, value)

    def note(self, text: str) -> None:
        self.notes.append(f"{self.name}: {text}")


def side_by_side(ctx: Context, fns: dict[str, Callable[[], object]], repeats: int, warmup: int) -> dict[str, dict]:
    """{name: {"ms", "mb", "n"}}: every function warmed up (compiled), then timed in alternation (round robin) for
    ``repeats`` rounds, or fewer when the section's time cannot hold another round (``n`` says how many)."""
    for fn in fns.values():
        for _ in range(warmup):
            ctx.check()
            ctx.clock.ms(fn)
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        started = time.monotonic()
        for name, fn in fns.items():
            times[name].append(ctx.clock.ms(fn))
        if ctx.time_left() < 2 * (time.monotonic() - started):  # the next round and the peaks would not fit
            break
    return {
        name: {"ms": statistics.median(times[name]), "mb": ctx.clock.peak_mb(fns[name]), "n": len(times[name])}
        for name in fns
    }


def fwd_bwd(attend: Callable, q, k, v, backward: bool) -> Callable[[], None]:
    import torch

    def run() -> None:
        if backward:
            q.grad = k.grad = v.grad = None
            attend(q, k, v).float().sum().backward()
        else:
            with torch.no_grad():
                attend(q, k, v)

    return run


# --- 1. attention kernels ---------------------------------------------------------------------------------------

_BLOCK_MASK_BUILDER: dict[bool, Callable] = {}


def peer_masks(
    n: int, device: str = "cuda", compiled: bool = True, heads: int = H, window: int = WINDOW, dilations=None
):
    """The anchors' block masks, written the obvious way with ``create_block_mask``: (window, dilated).
    The dilated mask is built per head: its mask_mod reads each head's dilation, and a mask built for H=None holds
    head 0's blocks for every head (half the keys of the heads at dilation 2 left out)."""
    import torch
    from torch.nn.attention.flex_attention import create_block_mask

    dilations = dilations or (DILATIONS if heads == H else (1,) * (heads // 2) + (2,) * (heads - heads // 2))
    dil = torch.tensor(dilations, device=device)

    def plain(b, h, i, j):
        return (i >= j) & (i - j <= window)

    def dilated(b, h, i, j):
        d = dil[h]
        return (i >= j) & ((i - j) % d == 0) & (i - j <= window * d)

    if compiled not in _BLOCK_MASK_BUILDER:  # one compiled builder for the process: its kernels serve every length
        _BLOCK_MASK_BUILDER[compiled] = torch.compile(create_block_mask) if compiled else create_block_mask
    build = _BLOCK_MASK_BUILDER[compiled]
    return build(plain, None, None, n, n, device=device), build(dilated, None, heads, n, n, device=device)


PAIRS = (  # ours, and the anchor that computes the same thing
    ("ours local", "FlexAttention window"),
    ("ours dilated", "FlexAttention dilated"),
    ("ours local + ALiBi", "FlexAttention window + ALiBi"),
)


def attention_contenders(n: int, p: dict, device, requires_grad: bool) -> tuple[dict[str, Callable], tuple]:
    """Each contender's attend(q, k, v) at ``n`` tokens, and the (q, k, v) they share."""
    import torch
    import torch.nn.functional as F

    from models import flex
    from models.attention import DotScore
    from models.config import LayerAttention
    from models.patterns import DilatedPattern, LocalPattern
    from models.positions import ALiBi

    heads, head_dim, window = p["heads"], p["head_dim"], p["window"]
    dilations = (1,) * (heads // 2) + (2,) * (heads - heads // 2)
    flex_attention = flex.compiled(device)  # the one every model layer calls: its compilations are shared
    score = DotScore(heads, head_dim).to(device)
    alibi = ALiBi(heads, causal=True).to(device)
    slopes = alibi.past
    dtype = getattr(torch, p["dtype"])
    q, k, v = (
        torch.randn(1, heads, n, head_dim, device=device, dtype=dtype, requires_grad=requires_grad) for _ in range(3)
    )

    def alibi_mod(s, b, h, i, j):
        return s - slopes[h] * (i - j)

    plain_mask, dilated_mask = peer_masks(
        n, device=str(device), compiled=device.type == "cuda", heads=heads, window=window, dilations=dilations
    )
    local = LocalPattern(LayerAttention("local", window, (1,) * heads))
    dilated = DilatedPattern(LayerAttention("dilated", window, dilations))
    attends = {
        "flash full causal": lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True),
        "FlexAttention window": lambda a, b, c: flex_attention(a, b, c, block_mask=plain_mask),
        "ours local": lambda a, b, c: local.attend(a, b, c, score, causal=True),
        "FlexAttention dilated": lambda a, b, c: flex_attention(a, b, c, block_mask=dilated_mask),
        "ours dilated": lambda a, b, c: dilated.attend(a, b, c, score, causal=True),
        "FlexAttention window + ALiBi": lambda a, b, c: flex_attention(
            a, b, c, score_mod=alibi_mod, block_mask=plain_mask
        ),
        "ours local + ALiBi": lambda a, b, c: local.attend(a, b, c, score, causal=True, bias=alibi.bias),
    }
    return attends, (q, k, v)


def check_pairs(attends: dict[str, Callable], qkv: tuple, dtype: str) -> dict[str, float]:
    """The largest difference between each of ours and its anchor's outputs; an error where they differ by more
    than rounding (a peer that computes something else)."""
    import torch

    tolerance = 3e-2 if dtype in ("bfloat16", "float16") else 1e-4
    diffs = {}
    with torch.no_grad():
        for ours, anchor in PAIRS:
            diff = (attends[ours](*qkv).float() - attends[anchor](*qkv).float()).abs().max().item()
            diffs[ours] = diff
            if not diff <= tolerance:
                raise AssertionError(
                    f"{ours} and {anchor} differ by {diff:.3g} (more than {tolerance:g}) at {qkv[0].shape[-2]} tokens: "
                    "they do not compute the same attention"
                )
    return diffs


def alibi_loads(heads: int, device) -> list[int]:
    """Elements of each tensor the ALiBi score_mod handed to FlexAttention reads: two (H,) slopes when it computes
    the bias in the kernel. A table of distances it gathered from made the H100's kernel for bf16 and heads of 64
    need 240 KB of shared memory (227 KB there): no CPU shows that, but this shows the table is gone."""
    import torch

    from models import flex
    from models.positions import ALiBi

    mod = flex.alibi_score_mod(ALiBi(heads, causal=True).bias, device, torch.float32)
    cells = [c.cell_contents for c in mod.__closure__ or ()]
    return sorted(t.numel() for t in cells if isinstance(t, torch.Tensor))


def attention(ctx: Context, p: dict) -> None:
    from models import flex

    loads = alibi_loads(p["heads"], ctx.device)
    if loads != [p["heads"], p["heads"]]:
        raise AssertionError(f"the ALiBi score_mod reads tensors of {loads} elements: two of {p['heads']} expected")
    ctx.note(f"ALiBi's score_mod reads two ({p['heads']},) slopes and no table of distances")
    backward = not ctx.cpu  # FlexAttention has no backward on CPU (torch 2.13)
    if ctx.cpu:
        ctx.note("forward only (FlexAttention has no backward on CPU, torch 2.13); ours through FlexAttention")
    rows: list[dict] = []
    # on a CPU the windowed patterns reach FlexAttention only when asked (``auto`` keeps them on the tiled kernels)
    with flex.mode("compiled" if ctx.cpu else "auto"):
        for n in p["lengths"]:
            ctx.check()
            attends, qkv = attention_contenders(n, p, ctx.device, backward)
            diffs = check_pairs(attends, qkv, p["dtype"])
            fns = {name: fwd_bwd(fn, *qkv, backward) for name, fn in attends.items()}
            result = side_by_side(ctx, fns, p["repeats"], p["warmup"])
            rows.append({"n": n, **result, "max_diff": diffs})
            ctx.put(rows)
            print(
                f"attention n={n}: " + ", ".join(f"{k} {v['ms']:.2f} ms {_mb(v['mb'])}" for k, v in result.items()),
                flush=True,
            )
            del attends, qkv, fns
            _free(ctx)


def _mb(mb: float | None) -> str:
    return "" if mb is None else f"{mb:.0f} MB"


def _free(ctx: Context) -> None:
    import torch

    if not ctx.cpu:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


# --- 2. a 16k-token decoder training step --------------------------------------------------------------------------


def decoder_steps(ctx: Context, p: dict, compiled: bool) -> dict[str, Callable[[], None]]:
    """One training step of the decoder with full and with local attention (``compiled``: both compiled)."""
    import torch
    import torch.nn.functional as F

    from models import ModelConfig, Transformer

    fns = {}
    local = f"local w{p['window']}"
    for name, pattern in (("full", {"pattern": "full"}), (local, {"pattern": "local", "window": p["window"]})):
        ctx.check()
        cfg = ModelConfig(
            arch="decoder",
            vocab_size=256,
            d_model=p["d_model"],
            n_heads=p["n_heads"],
            n_layers=p["n_layers"],
            d_ff=p["d_ff"],
            **pattern,
        )
        model = Transformer(cfg).to(ctx.device)
        if compiled:
            model.compile()  # what training.compile does
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        x = torch.randint(4, 256, (1, p["tokens"] + 1), device=ctx.device)

        def step(model=model, opt=opt, x=x) -> None:
            with torch.autocast(ctx.device.type, dtype=torch.bfloat16):
                logits = model(x[:, :-1])
            F.cross_entropy(logits.flatten(0, 1).float(), x[:, 1:].flatten()).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        fns[name + (" compiled" if compiled else "")] = step
    return fns


def decoder(ctx: Context, p: dict) -> None:
    if ctx.cpu:
        ctx.note("local attention trains on the tiled kernels on a CPU (FlexAttention there has no backward)")
    out: dict[str, Any] = {"tokens": p["tokens"], "window": p["window"]}
    for compiled in (False, True):  # eager first: a section cut off while compiling keeps it
        fns = decoder_steps(ctx, p, compiled)
        out.update(side_by_side(ctx, fns, p["repeats"], p["warmup"]))
        ctx.put(out)
        print("decoder step: " + ", ".join(f"{k} {v['ms']:.1f} ms {_mb(v['mb'])}" for k, v in _timed(out)), flush=True)
        del fns
        _free(ctx)


def _timed(d: dict) -> list[tuple[str, dict]]:
    return [(k, v) for k, v in d.items() if isinstance(v, dict) and "ms" in v]


# --- 3. additive against dot-product scores ------------------------------------------------------------------------


def additive_fns(ctx: Context, p: dict, chunks: dict[str, int] | None = None) -> dict[str, Callable[[], None]]:
    """Forward + backward of one attention layer with dot scores, and with additive scores (``chunks``: one per
    name, with its ``chunk_elements``)."""
    import torch

    from models.attention import MultiHeadAttention

    fns = {}
    for name, score, chunk in [("dot", "dot", 1 << 20), *((k, "additive", v) for k, v in (chunks or {}).items())]:
        attn = MultiHeadAttention(p["d_model"], p["heads"], p["head_dim"], score=score, chunk_elements=chunk)
        attn = attn.to(ctx.device)
        x = torch.randn(1, p["n"], p["d_model"], device=ctx.device, requires_grad=True)

        def run(attn=attn, x=x) -> None:
            x.grad = None
            attn(x).sum().backward()

        fns[name] = run
    return fns


def additive(ctx: Context, p: dict) -> None:
    from models import fused

    fns = additive_fns(ctx, p, {"additive": 1 << 20})
    # on a CPU the fused kernels run only when asked (``auto`` keeps them for CUDA)
    with fused.mode("compiled" if ctx.cpu else "auto"):
        out = side_by_side(ctx, fns, p["repeats"], p["warmup"])
    result = {"n": p["n"], **out, "ratio": out["additive"]["ms"] / out["dot"]["ms"]}
    ctx.put(result)
    print(f"additive vs dot n={p['n']}: {result['ratio']:.1f}x", flush=True)


# --- 7. where the time of a step goes: kernel shares, attention alone, additive's chunks -----------------------------


def kernel_table(fn: Callable[[], None], device, steps: int = 3, top: int = 10) -> dict[str, Any]:
    """The kernels of ``steps`` calls of ``fn`` by their device time (on a CPU: the operators by CPU time): each
    one's ms per call and share, the top ``top`` and the rest."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    for _ in range(2):
        fn()
    if cuda:
        torch.cuda.synchronize()
    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
    with profile(activities=activities) as prof:
        for _ in range(steps):
            fn()
        if cuda:
            torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        if cuda and e.device_type != DeviceType.CUDA:
            continue
        us = e.self_device_time_total if cuda else e.self_cpu_time_total
        if us > 0 and (cuda or e.key.startswith("aten::")):
            rows.append((us / 1000 / steps, e.key))
    rows.sort(reverse=True)
    total = sum(ms for ms, _ in rows) or 1.0
    kept = [{"kernel": k[:90], "ms": ms, "share": ms / total} for ms, k in rows[:top]]
    rest = sum(ms for ms, _ in rows[top:])
    return {"total_ms": total, "kernels": kept, "rest_ms": rest, "n_kernels": len(rows)}


def attention_alone(ctx: Context, p: dict) -> dict[str, dict]:
    """The decoder's attention core alone (its heads, its length, bf16, forward + backward): flash causal against
    ours local, what the decoder's step can gain at most from local attention (the rest of the step stays)."""
    import torch
    import torch.nn.functional as F

    from models.attention import DotScore
    from models.config import LayerAttention
    from models.patterns import LocalPattern

    heads, head_dim = p["n_heads"], p["d_model"] // p["n_heads"]
    dtype = torch.bfloat16 if not ctx.cpu else torch.float32
    q, k, v = (
        torch.randn(1, heads, p["tokens"], head_dim, device=ctx.device, dtype=dtype, requires_grad=True)
        for _ in range(3)
    )
    local = LocalPattern(LayerAttention("local", p["window"], (1,) * heads))
    score = DotScore(heads, head_dim).to(ctx.device)
    fns = {
        "full (flash causal)": fwd_bwd(
            lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True), q, k, v, True
        ),
        "local": fwd_bwd(lambda a, b, c: local.attend(a, b, c, score, causal=True), q, k, v, True),
    }
    return side_by_side(ctx, fns, p["repeats"], p["warmup"])


def profile(ctx: Context, p: dict) -> None:
    """Named limits: where the decoder's step and additive attention spend their time."""
    from models import fused

    d = p["decoder"]  # local attention: FlexAttention on CUDA, the tiled kernels on a CPU (as in training)
    out: dict[str, Any] = {"shape": {k: d[k] for k in ("tokens", "d_model", "n_heads", "n_layers", "window")}}
    out["cpu"] = ctx.cpu  # a CPU's operators overlap nothing: no host time to name
    out["attention_alone"] = alone = attention_alone(ctx, d)
    ctx.put(out)
    steps = decoder_steps(ctx, d, compiled=False)
    timed = side_by_side(ctx, steps, d["repeats"], d["warmup"])
    out["decoder_steps"] = timed
    for name, fn in steps.items():
        ctx.check()
        out.setdefault("decoder_kernels", {})[name] = kernel_table(fn, ctx.device)
        ctx.put(out)
    full_step = timed["full"]["ms"]
    full_attn, local_attn = (alone[k]["ms"] * d["n_layers"] for k in ("full (flash causal)", "local"))
    out["decoder_bound"] = {
        "rest_ms": full_step - full_attn,  # the step without its attention core
        "predicted_local_ms": full_step - full_attn + local_attn,
        "bound_with_this_local": full_step / (full_step - full_attn + local_attn),
        "bound_with_free_attention": full_step / max(full_step - full_attn, 1e-9),
    }
    ctx.put(out)
    del steps
    _free(ctx)
    a = p["additive"]
    chunks = {f"additive chunk 2^{b}": 1 << b for b in a["chunk_bits"]}
    with fused.mode("compiled" if ctx.cpu else "auto"):
        fns = additive_fns(ctx, a, chunks)
        out["additive_chunks"] = {"n": a["n"], **side_by_side(ctx, fns, a["repeats"], a["warmup"])}
        ctx.put(out)
        for name in ("dot", f"additive chunk 2^{a['chunk_bits'][0]}"):
            ctx.check()
            out.setdefault("additive_kernels", {})[name] = kernel_table(fns[name], ctx.device)
            ctx.put(out)
    b = out["decoder_bound"]
    print(
        f"profile: decoder rest of step {b['rest_ms']:.1f} ms; local bound {b['bound_with_this_local']:.2f}x "
        f"(free attention {b['bound_with_free_attention']:.2f}x); additive "
        + ", ".join(f"{k} {v['ms']:.1f} ms" for k, v in out["additive_chunks"].items() if isinstance(v, dict)),
        flush=True,
    )


# --- 8. a study packed onto one GPU ---------------------------------------------------------------------------------


def packed(ctx: Context, p: dict) -> None:
    from benchmarks import packing

    smoke = p.get("smoke", False)
    if smoke:
        from ablations import localcluster

        cluster = localcluster.up(0, cpus_per_node=2, gpus=1)  # declared, not there: the placement on a CPU
        try:
            packing.measure(
                p["study"],
                tuple(p["levels"]),
                smoke=True,
                address=cluster.address,
                on_level=ctx.put,
                time_left=ctx.time_left,
            )
        finally:
            localcluster.stop(cluster)
        return
    limits = {int(k): v for k, v in p["limits"].items()}
    packing.measure(p["study"], tuple(p["levels"]), limits, time_left=ctx.time_left, on_level=ctx.put)


# --- 4. an encoder against nn.TransformerEncoder -------------------------------------------------------------------


def encoder(ctx: Context, p: dict) -> None:
    import torch
    from torch import nn

    from models.blocks import EncoderLayer
    from models.config import ModelConfig
    from models.flops import peak_flops_per_s

    C, layers, heads, T, batch = p["d_model"], p["layers"], p["heads"], p["T"], p["batch"]
    cfg = ModelConfig(arch="encoder", n_classes=2, d_model=C, n_heads=heads, d_ff=4 * C, norm="pre", dropout=0.0)
    x = torch.randn(batch, T, C, device=ctx.device)
    flops = 3 * layers * batch * (24 * T * C * C + 4 * T * T * C)  # forward 2x(12 T C^2 + 2 T^2 C), backward 2x
    peak = peak_flops_per_s(ctx.device, "bf16-mixed")
    out: dict[str, Any] = {"T": T, "batch": batch, "d_model": C, "layers": layers, "flops_per_step": flops}

    def build(kind: str) -> nn.Module:
        if kind == "ours":
            return nn.Sequential(*[EncoderLayer(cfg, "full") for _ in range(layers)]).to(ctx.device)
        return nn.TransformerEncoder(
            nn.TransformerEncoderLayer(C, heads, 4 * C, dropout=0.0, batch_first=True, norm_first=True),
            layers,
            enable_nested_tensor=False,
        ).to(ctx.device)

    def step_of(module: nn.Module) -> Callable[[], None]:
        opt = torch.optim.AdamW(module.parameters(), lr=1e-4, fused=True)

        def step() -> None:  # a plain training step: bf16 autocast, backward, fused AdamW
            with torch.autocast(ctx.device.type, dtype=torch.bfloat16):
                y = module(x)
            y.float().square().mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        return step

    for compiled in (False, True):  # eager first: a section cut off while compiling keeps it
        ctx.check()
        fns = {}
        for kind in ("ours", "nn.TransformerEncoder"):
            module = build(kind)
            fns[kind + (" compiled" if compiled else "")] = step_of(torch.compile(module) if compiled else module)
        for name, timing in side_by_side(ctx, fns, p["repeats"], p["warmup"]).items():
            timing["tokens_per_s"] = batch * T / (timing["ms"] / 1000)
            timing["mfu"] = flops / (timing["ms"] / 1000) / peak if peak else None
            out[name] = timing
        ctx.put(out)
        del fns
        _free(ctx)
    print(
        "encoder: "
        + ", ".join(f"{k} {v['tokens_per_s']:,.0f} tokens/s MFU {_pct(v.get('mfu'))}" for k, v in _timed(out)),
        flush=True,
    )


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


# --- 5, 6. ablate run against a plain loop -------------------------------------------------------------------------


_STORE: dict[str, Any] = {}  # one MLflow store for both run_vs_loop sections (a new SQLite store takes seconds)


def tracking_uri() -> str:
    """``--tracking-uri``, else a SQLite store in a temporary folder, created once for the process."""
    import tempfile

    if "uri" not in _STORE:
        _STORE["folder"] = tempfile.TemporaryDirectory(prefix="gpu-bench-")
        _STORE["uri"] = f"sqlite:///{_STORE['folder'].name}/mlflow.db"
    return _STORE["uri"]


def run_vs_loop(ctx: Context, p: dict) -> None:
    from benchmarks.run_vs_loop import measure

    fused = p["compile"]  # the compiled row is the field's setting: compile and fused AdamW together
    r = measure(
        p["size"],
        p["steps"],
        p["repeats"],
        1 if ctx.cpu else None,
        p["precision"],
        p["compile"],
        fused,
        warm=p.get("warm"),
        task=p.get("task"),
        time_left=ctx.time_left,
        on_repeat=lambda partial: ctx.put([partial]),
        uri=tracking_uri(),
    )
    ctx.put([r])
    lo, hi = r["ratio_range"]
    print(
        f"ablate run vs loop (compile {p['compile']}, fused AdamW {fused}): {r['ratio']:.3f}x "
        f"(range {lo:.3f}-{hi:.3f}, {r['repeats']} repeats; graphs compiled in the windows: "
        f"{r['graphs_compiled_in_windows']})",
        flush=True,
    )


RUNS: dict[str, Callable[[Context, dict], None]] = {
    "attention": attention,
    "decoder": decoder,
    "additive": additive,
    "encoder": encoder,
    "run_vs_loop": run_vs_loop,
    "run_vs_loop_compiled": run_vs_loop,
    "profile": profile,
    "packed": packed,
}


# --- the report ----------------------------------------------------------------------------------------------------


TITLES = {
    "attention": f"1. Attention, window {WINDOW}, causal, {H} heads of {D}, bf16, forward + backward",
    "decoder": "2. One training step",
    "additive": "3. Additive against dot-product scores",
    "encoder": "4. Encoder",
    "run_vs_loop": "5. `ablate run` against a plain PyTorch loop",
    "run_vs_loop_compiled": "6. `ablate run` against a plain PyTorch loop, compiled, fused AdamW",
    "profile": "7. Where the time goes",
    "packed": "8. A study packed onto one GPU",
}


def markdown(r: dict) -> str:
    """The report: every section measured, and for one that failed, was cut off or did not run, what happened."""
    lines = [f"Measured on {r['device']} (torch {r['torch']}, CUDA {r['cuda']}), {r['date']}, with `{r['command']}`."]
    meta = r.get("sections", {})
    for name in SECTIONS:
        lines.append("")
        m = meta.get(name, {})
        old_error = isinstance(r.get(name), dict) and "error" in r[name]  # results written before sections' meta
        if name not in r and not m:
            lines.append(f"**{TITLES[name]}**: not run.")
            continue
        if old_error or (name not in r and m.get("status") == "failed"):
            lines.append(f"**{TITLES[name]}**: failed: `{(r[name] if old_error else m)['error']}`.")
            continue
        if name not in r:
            lines.append(f"**{TITLES[name]}**: {m.get('error') or m.get('status')}, before it measured anything.")
            continue
        lines += _RENDER[name](r[name])
        if m.get("status") in ("failed", "cut", "running"):  # running: the process was stopped from outside
            why = m.get("error") or "the run was stopped while this section ran"
            lines += ["", f"({why}: the figures above are what it measured before.)"]
        if m.get("device") and (m["device"] != r["device"] or m.get("date", r["date"]) != r["date"]):
            lines += ["", f"(This section: {m['device']}, torch {m.get('torch')}, {m.get('date')}.)"]
    timed = [
        f"{n} {meta[n]['seconds']:.0f} s ({meta[n]['limit_s']:.0f})" for n in SECTIONS if "seconds" in meta.get(n, {})
    ]
    if timed:
        lines += ["", "Seconds per section (its limit): " + ", ".join(timed) + "."]
    return "\n".join(lines) + "\n"


def _attention_md(rows: list[dict]) -> list[str]:
    lines = [f"**{TITLES['attention']}** (ms / peak MB):", ""]
    names = [k for k in rows[0] if k not in ("n", "max_diff")]
    lines += ["| tokens | " + " | ".join(names) + " |", "|---:|" + "---:|" * len(names)]
    for row in sorted(rows, key=lambda x: x["n"]):
        cells = [f"{row[k]['ms']:.2f} / {'-' if row[k]['mb'] is None else format(row[k]['mb'], '.0f')}" for k in names]
        lines.append(f"| {row['n']:,} | " + " | ".join(cells) + " |")
    diffs = [row["max_diff"] for row in rows if "max_diff" in row]
    if diffs:
        worst = {k: max(d[k] for d in diffs) for k in diffs[0]}
        lines += [
            "",
            "Each of ours gave its anchor's outputs before it was timed (largest difference: "
            + ", ".join(f"{k} {v:.2g}" for k, v in worst.items())
            + ").",
        ]
    return lines


def _decoder_md(d: dict) -> list[str]:
    local = next(k for k in d if isinstance(k, str) and k.startswith("local") and not k.endswith("compiled"))
    lines = [
        f"**{TITLES['decoder']} of a {d['tokens']:,}-token decoder** (d 512, 4 layers, bf16 autocast): full attention "
        f"{d['full']['ms']:.1f} ms / {_mb(d['full']['mb']) or '-'}, {local} {d[local]['ms']:.1f} ms / "
        f"{_mb(d[local]['mb']) or '-'}: **{d['full']['ms'] / d[local]['ms']:.2f}x** faster (target 2x)."
    ]
    if f"{local} compiled" in d and "full compiled" in d:
        full, ours = d["full compiled"], d[f"{local} compiled"]
        lines[0] += (
            f" Both compiled: full {full['ms']:.1f} ms, local {ours['ms']:.1f} ms: **{full['ms'] / ours['ms']:.2f}x**."
        )
    return lines


def _additive_md(a: dict) -> list[str]:
    return [
        f"**{TITLES['additive']}**, n = {a['n']:,}, fp32, forward + backward: dot {a['dot']['ms']:.2f} ms "
        f"/ {_mb(a['dot']['mb']) or '-'}, additive {a['additive']['ms']:.2f} ms / {_mb(a['additive']['mb']) or '-'}: "
        f"**{a['ratio']:.1f}x** (target at most 10x)."
    ]


def _encoder_md(e: dict) -> list[str]:
    parts = [
        f"{k} {v['tokens_per_s']:,.0f} tokens/s (MFU {_pct(v.get('mfu'))})"
        for k, v in e.items()
        if isinstance(v, dict) and "tokens_per_s" in v
    ]
    return [
        f"**{TITLES['encoder']}** (d {e['d_model']}, {e['layers']} layers, T {e['T']}, batch {e['batch']}, bf16 "
        f"autocast, a training step with fused AdamW): " + ", ".join(parts) + "."
    ]


def _run_vs_loop_md(rows: list[dict], title: str = TITLES["run_vs_loop"]) -> list[str]:
    lines = [
        f"**{title}** (85M-parameter byte LM, batch 32 x 512, bf16-mixed):",
        "",
        "| compile, fused AdamW | ours tokens/s | loop tokens/s | ratio (median) | range | repeats |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for x in rows:
        span = x.get("ratio_range")
        lines.append(
            f"| {x['compile']}, {x['fused_adamw']} | {x['ours_tokens_per_s']:,.0f} | {x['loop_tokens_per_s']:,.0f} | "
            f"**{x['ratio']:.3f}x** | {f'{span[0]:.3f}-{span[1]:.3f}' if span else '-'} | {x.get('repeats', '-')} |"
        )
    timed = sum(x.get("graphs_compiled_in_windows", 0) for x in rows)
    if timed:
        lines += ["", f"{timed} graph(s) compiled inside the timed windows: a compilation was timed as training."]
    return lines


_RENDER: dict[str, Callable[[Any], list[str]]] = {
    "attention": _attention_md,
    "decoder": _decoder_md,
    "additive": _additive_md,
    "encoder": _encoder_md,
    "run_vs_loop": _run_vs_loop_md,
    "run_vs_loop_compiled": lambda rows: _run_vs_loop_md(rows, TITLES["run_vs_loop_compiled"]),
    "profile": lambda r: _profile_md(r),
    "packed": lambda r: _packed_md(r),
}


def _kernels_md(name: str, t: dict) -> list[str]:
    top = "; ".join(f"`{k['kernel'][:60]}` {k['ms']:.2f} ms ({k['share']:.0%})" for k in t["kernels"][:5])
    return [f"- {name}: {t['total_ms']:.2f} ms of kernels a call ({t['n_kernels']} kinds); the largest: {top}"]


def _profile_md(r: dict) -> list[str]:
    lines = [f"**{TITLES['profile']}**:", ""]
    if "attention_alone" in r:
        a = r["attention_alone"]
        sh = r["shape"]
        lines.append(
            f"- the decoder's attention core alone ({sh['n_heads']} heads of {sh['d_model'] // sh['n_heads']}, "
            f"{sh['tokens']:,} tokens, window {sh['window']}, bf16, forward + backward, one layer of "
            f"{sh['n_layers']}): " + ", ".join(f"{k} {v['ms']:.2f} ms" for k, v in a.items())
        )
    if "decoder_bound" in r:
        b, steps = r["decoder_bound"], r["decoder_steps"]
        lines.append(
            f"- the decoder's step: full {steps['full']['ms']:.1f} ms, of which {b['rest_ms']:.1f} ms is not attention; "
            f"with this local attention the step can be at best **{b['bound_with_this_local']:.2f}x** faster than "
            f"full ({b['predicted_local_ms']:.1f} ms predicted), and {b['bound_with_free_attention']:.2f}x with "
            "attention that cost nothing"
        )
    for name, t in r.get("decoder_kernels", {}).items():
        lines += _kernels_md(f"decoder step, {name}", t)
        wall = r.get("decoder_steps", {}).get(name, {}).get("ms")
        if wall is not None and not r.get("cpu"):
            lines[-1] += (
                f"; the step takes {wall:.1f} ms: the GPU waits {max(0.0, wall - t['total_ms']):.1f} ms on the host"
            )
    if "additive_chunks" in r:
        c = r["additive_chunks"]
        lines.append(
            f"- additive attention at n = {c['n']:,} by chunk size (fp32, forward + backward): "
            + ", ".join(f"{k} {v['ms']:.2f} ms / {_mb(v['mb']) or '-'}" for k, v in c.items() if isinstance(v, dict))
        )
    for name, t in r.get("additive_kernels", {}).items():
        lines += _kernels_md(name, t)
    return lines


def _packed_md(r: dict) -> list[str]:
    from benchmarks import packing

    return packing.markdown(r, "the device above", TITLES["packed"])


def write_readme_section(text: str, readme: Path) -> None:
    """Replace the text between the GPU markers of benchmarks/README.md (appended with them if absent)."""
    body = readme.read_text()
    block = f"{BEGIN}\n{text}{END}"
    if BEGIN in body and END in body:
        body = re.sub(re.escape(BEGIN) + r".*?" + re.escape(END), lambda _: block, body, flags=re.S)
    else:
        body = body.rstrip() + "\n\n## GPU\n\n" + block + "\n"
    readme.write_text(body)


# --- running ---------------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def time_limit(seconds: float, name: str) -> Iterator[None]:
    """SectionTimeout in the main thread once ``seconds`` have passed (SIGALRM): the section's own checks stop it
    before, between measurements; this stops one that a single compilation or measurement holds past its limit."""

    import threading

    if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
        yield
        return

    def expire(signum, frame):
        raise SectionTimeout(name)

    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@contextlib.contextmanager
def compiler(backend: str) -> Iterator[None]:
    """Every torch.compile of the process (the models', models.flex's and models.fused's included) with ``backend``
    unless it names one. ``aot_eager`` captures the graphs as inductor would (graph breaks, recompilations and
    torch's limit on them, the backward's graph) without generating kernels: seconds instead of a minute on a CPU.
    A smoke run's option; ``inductor`` (torch's default) changes nothing."""
    import torch

    if backend == "inductor":
        yield
        return
    original = torch.compile

    def compile_with(model=None, **options):
        options.setdefault("backend", backend)
        return original(**options) if model is None else original(model, **options)

    torch.compile = compile_with
    try:
        yield
    finally:
        torch.compile = original


def parse_limits(text: str | None) -> dict[str, float]:
    limits = dict(LIMITS)
    for item in filter(None, (text or "").split(",")):
        name, sep, value = item.partition("=")
        if not sep or name not in LIMITS:
            raise SystemExit(f"--limits takes name=seconds for sections {', '.join(SECTIONS)} (got {item!r})")
        limits[name] = float(value)
    return limits


def sections_named(values: list[str] | None) -> list[str]:
    names = [n for v in values or [] for n in v.split(",") if n]
    unknown = [n for n in names if n not in SECTIONS]
    if unknown:
        raise SystemExit(f"--only: unknown section(s) {', '.join(unknown)}; sections: {', '.join(SECTIONS)}")
    return names


def done(r: dict, name: str) -> bool:
    """A section measured to its end (results written before sections carried their status: present, no error)."""
    meta = r.get("sections", {}).get(name)
    if meta is not None:
        return meta.get("status") == "done"
    return name in r and not (isinstance(r[name], dict) and "error" in r[name])


def sections_to_run(r: dict, only: list[str], resume: bool) -> list[str]:
    """``only`` when given, else every section, less those ``r`` holds done when resuming."""
    return only or [s for s in SECTIONS if not (resume and done(r, s))]


def run_sections(
    r: dict, todo: list[str], plans: dict, limits: dict[str, float], device, save: Callable[[], None]
) -> list[str]:
    """Run ``todo`` in order, each within its limit, saving after every figure; the notes of the run."""
    import torch

    notes: list[str] = []
    meta_all = r.setdefault("sections", {})

    def store(name: str, value: Any) -> None:
        r[name] = value
        save()

    for name in todo:
        meta = meta_all[name] = {
            "limit_s": limits[name],
            "device": r.get("device_now", r["device"]),  # a resumed file's header names the earlier device
            "torch": torch.__version__,
            "date": datetime.date.today().isoformat(),
            "status": "running",
        }
        r.pop(name, None)
        torch.use_deterministic_algorithms(False)  # run_vs_loop's trainer sets it for the process
        ctx = Context(name, device, limits[name], store, notes)
        started = time.monotonic()
        print(f"== {name} (limit {limits[name]:g} s)", flush=True)
        try:
            with time_limit(limits[name], name):
                RUNS[name](ctx, plans[name])
            meta["status"] = "done"
        except SectionTimeout:
            meta["status"], meta["error"] = "cut", f"cut off at its time limit of {limits[name]:g} s"
        except Exception as e:  # noqa: BLE001 - reported in the results, not hidden
            traceback.print_exc()
            meta["status"] = "failed"
            meta["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
        meta["seconds"] = round(time.monotonic() - started, 1)
        if device.type == "cuda":
            with contextlib.suppress(Exception):
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
        save()
        print(f"== {name}: {meta['status']} in {meta['seconds']:.0f} s {meta.get('error', '')}", flush=True)
    torch.use_deterministic_algorithms(False)
    return notes


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--smoke", action="store_true", help="tiny sizes, any device (CPU by default): results/smoke/")
    mode.add_argument("--quick", action="store_true", help="short lengths, few repeats on a GPU: results/quick/")
    parser.add_argument("--device", default=None, help="cuda (default) or, with --smoke, cpu (its default)")
    parser.add_argument("--compiler", choices=("inductor", "aot_eager"), default="inductor", help=compiler.__doc__)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--only", nargs="+", metavar="SECTION", help=f"some of {', '.join(SECTIONS)} (comma or space)")
    parser.add_argument("--resume", action="store_true", help="the sections gpu.json lacks, or that failed or were cut")
    parser.add_argument("--limits", help="seconds per section, e.g. attention=200,encoder=90 (default: LIMITS)")
    parser.add_argument("--tracking-uri", help="the MLflow store of `ablate run`'s runs (default: a temporary one)")
    args = parser.parse_args(argv)
    if args.tracking_uri:
        _STORE["uri"] = args.tracking_uri
    only = sections_named(args.only)
    import torch

    device = torch.device(args.device or ("cpu" if args.smoke else "cuda"))
    if device.type == "cuda" and not torch.cuda.is_available():
        print(
            "benchmarks/gpu.py needs a CUDA device: torch.cuda.is_available() is False here "
            "(`--smoke` runs every section on the CPU at tiny sizes)",
            file=sys.stderr,
        )
        raise SystemExit(2)
    # past torch's limit of compilations of one function it runs the function uncompiled (FlexAttention: the dense
    # scores, as the first H100 run measured without knowing): an error of the section here
    torch._dynamo.config.fail_on_recompile_limit_hit = True
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    else:  # one thread: two on a machine of two cores collapsed as soon as anything else ran (STACK_NOTES)
        torch.set_num_threads(1)
    plans = SMOKE_PLAN if args.smoke else QUICK_PLAN if args.quick else GPU_PLAN
    if args.smoke and device.type == "cuda":
        plans = {**plans, **SMOKE_CUDA}
    limits = {k: SMOKE_LIMIT for k in LIMITS} if args.smoke else parse_limits(args.limits)
    if args.smoke and args.limits:
        limits.update({k: v for k, v in parse_limits(args.limits).items() if v != LIMITS[k]})
    out = args.out / "smoke" if args.smoke else args.out / "quick" if args.quick else args.out
    out.mkdir(parents=True, exist_ok=True)
    command = " ".join(["python benchmarks/gpu.py", *(argv if argv is not None else sys.argv[1:])])
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({platform.machine()})"
    previous = out / "gpu.json"
    r: dict[str, Any] = {}
    if (args.resume or only) and previous.exists():
        r = json.loads(previous.read_text())
        r["command"] = f"{r['command']}; then {command}" if r.get("command") else command
    if not r:
        r = {
            "device": name,
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "host": platform.node(),
            "date": datetime.date.today().isoformat(),
            "command": command,
        }
    elif r.get("device") != name:
        print(f"note: {previous} was measured on {r.get('device')}; the sections run now on {name}", flush=True)
    r["device_now"] = name
    todo = sections_to_run(r, only, args.resume)

    def save() -> None:
        (out / "gpu.json").write_text(json.dumps(r, indent=1, default=str))
        (out / "gpu.md").write_text("# GPU benchmarks\n\n" + markdown(_for_report(r)))

    started = time.monotonic()
    with compiler(args.compiler):
        notes = run_sections(r, todo, plans, limits, device, save)
    text = markdown(_for_report(r))
    if not args.smoke and not args.quick:
        write_readme_section(text, ROOT / "benchmarks" / "README.md")
    print(text)
    failed = [s for s in todo if r["sections"][s]["status"] != "done"]
    if args.smoke:
        print(f"smoke run on {name} (compiler {args.compiler}) in {time.monotonic() - started:.1f} s:")
        for s in todo:
            m = r["sections"][s]
            print(f"  {s}: {m['status']} in {m['seconds']:.1f} s {m.get('error', '')}")
        for line in notes:
            print(f"  {line}")
        if device.type != "cuda":
            print("  not shown on a CPU: " + "; ".join(CPU_LIMITS))
    r["failed"] = failed
    if failed and (args.smoke or argv is None):
        raise SystemExit(1)
    return r


def _for_report(r: dict) -> dict:
    """The results with each section's device as the header's when the header's device measured none of them."""
    meta = r.get("sections", {})
    devices = {m.get("device") for m in meta.values() if m.get("device")}
    if meta and r.get("device") not in devices and len(devices) == 1:
        return {**r, "device": devices.pop()}
    return r


if __name__ == "__main__":
    main()
