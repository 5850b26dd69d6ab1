"""`ablate run` against a plain PyTorch loop: training tokens/s on the same model and the same batches, in
one process, the two alternating.

`ablate run`'s code path is ``ablations.train.train`` with MLflow tracking (a SQLite store in a temporary
folder): Lightning's Trainer, the LightningModule (loss, divergence guard, metrics every ``log_every``
steps), the Drain callback handing metrics to MLflow's background thread. The plain loop is what a user
would write: the same ``Transformer``, the same DataLoader (same seed, same order), AdamW with the same
hyper-parameters and schedule, gradient clipping, the same precision (autocast for ``bf16-mixed``), the same
``torch.compile`` and fused-AdamW choices, and the same deterministic-algorithms setting.

Both are timed over the same window of steps (after warm-up: compilation, allocator, first MLflow writes),
from the end of one step to the end of another, waiting for the device at both ends; the tokens are the
non-padding tokens of the window's batches. Compiled, one untimed run of ours first fills torch.compile's cache
(the window's shapes included: an epoch's last, smaller batch recompiles), which both sides then reuse; the graphs
compiled inside each window are counted and reported (0 expected). The two alternate, the order swapped every
repeat (ours first, then the loop first), so that drift of the machine falls on both. Reported: tokens/s of both
(medians), the ratio as the median of the per-repeat ratios with their range (min, max), and the fixed cost per
step ((time of ours - time of the loop) / steps).

    python benchmarks/run_vs_loop.py [--size tiny|cpu|gpu] [--steps 100] [--repeats 3] [--threads 1]
        [--precision 32-true] [--compile] [--fused-adamw]

Sizes: ``tiny`` (d 64, 2 layers, 8 x 64 tokens: a step of a few ms, so that fixed costs per step show),
``cpu`` (d 128, 4 layers, 8 x 128 tokens: about 0.1 s a step on one core), ``gpu`` (the issue's 85M-parameter byte LM: d 768, 12 layers,
32 x 512 tokens).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SIZES = {
    "tiny": {"model": dict(d_model=64, n_heads=4, n_layers=2, d_ff=256), "block_size": 64, "batch_size": 8},
    "cpu": {"model": dict(d_model=128, n_heads=4, n_layers=4, d_ff=512), "block_size": 128, "batch_size": 8},
    "gpu": {"model": dict(d_model=768, n_heads=12, n_layers=12, d_ff=3072), "block_size": 512, "batch_size": 32},
}
LOG_EVERY = 10


def run_config(
    size: str,
    steps: int,
    warm: int,
    threads: int | None,
    precision: str,
    compile: bool,
    fused: bool,
    task: dict | None = None,
):
    from record.spec import resolve_run

    s = SIZES[size]
    return resolve_run(
        {
            "name": f"run-vs-loop-{size}",
            "seed": 0,
            "task": {"name": "text", "source": "pydoc", "block_size": s["block_size"], **(task or {})},
            "model": {"arch": "decoder", **s["model"]},  # sinusoidal positions: no table to size
            "training": {
                "max_steps": warm + steps + 1,
                "batch_size": s["batch_size"],
                "eval_batch_size": 64,
                "val_every": 10**6,  # no validation inside the window (the final one runs after training)
                "val_batches": 1,
                "lr": 1e-3,
                "warmup_steps": 10,
                "precision": precision,
                "compile": compile,
                "fused_adamw": fused,
            },
            "tracking": {"log_every": LOG_EVERY},
            "resources": {"threads": threads} if threads else {},
        }
    )


def sync() -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def training_batches(run, last: int) -> Iterator[tuple[int, dict]]:
    """(step, batch) of the training loader's batches for steps 0 .. last, epochs following each other (the data
    is set up now, each epoch's loader made as the steps reach it, as the trainer does)."""
    from models.tasks import TaskDataModule

    data = TaskDataModule(run.task, run.training.batch_size, run.seed, run.training.eval_batch_size)
    data.setup()

    def steps() -> Iterator[tuple[int, dict]]:
        step = 0
        while step <= last:
            for batch in data.train_dataloader():
                yield step, batch
                step += 1
                if step > last:
                    return

    return steps()


def window_tokens(run, first: int, last: int) -> int:
    """Non-padding tokens of the training batches of steps first+1 .. last (the loaders' order)."""
    from models.tasks import PAD

    return sum(int((b["tokens"] != PAD).sum()) for step, b in training_batches(run, last) if first < step)


def graphs_compiled() -> int:
    """Graphs torch.compile has compiled in this process so far (a recompilation is one more)."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def mark() -> tuple[float, float, int]:
    """(wall seconds, CPU seconds of this process: every thread, MLflow's sender included, graphs compiled)."""
    sync()
    return time.perf_counter(), time.process_time(), graphs_compiled()


def elapsed(marks: dict, first: int, last: int) -> tuple[float, float, int]:
    """(wall, CPU) seconds and the graphs compiled from the end of step ``first`` to the end of step ``last``."""
    return marks[last][0] - marks[first][0], marks[last][1] - marks[first][1], marks[last][2] - marks[first][2]


def ours(run, first: int, last: int, uri: str) -> tuple[tuple[float, float, int], dict]:
    """(wall, CPU) seconds and graphs compiled from the end of step ``first`` to the end of step ``last`` of
    ``ablate run``'s code path, and its summary metrics."""
    from ablations.train import Tracking, train

    marks: dict[int, tuple[float, float, int]] = {}

    def hook(step: int, metrics: dict) -> None:  # called at the end of every logged step, by the Drain callback
        if "train/loss" in metrics and step in (first, last):
            marks[step] = mark()

    result = train(run, Tracking(uri, "run-vs-loop"), hooks=[hook])
    return elapsed(marks, first, last), result.metrics


def plain_loop(run, first: int, last: int) -> tuple[float, float, int]:
    """(wall, CPU) seconds and graphs compiled from the end of step ``first`` to the end of step ``last`` of a plain
    PyTorch loop."""
    import lightning as L
    import torch
    import torch.nn.functional as F

    from models.tasks import PAD
    from models.training import lr_factor
    from models.transformer import Transformer

    t = run.training
    if run.resources.threads:
        torch.set_num_threads(run.resources.threads)
    L.seed_everything(run.seed, workers=True, verbose=False)
    torch.use_deterministic_algorithms(t.deterministic)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    batches = training_batches(run, last)
    model = Transformer(run.model).to(device)
    if t.compile:
        model.compile()
    opt = torch.optim.AdamW(  # the implementation the LightningModule uses (fused, or foreach: models/lightning.py)
        model.parameters(),
        lr=t.lr,
        betas=t.betas,
        eps=t.eps,
        weight_decay=t.weight_decay,
        fused=t.fused_adamw or None,
        foreach=None if t.fused_adamw else True,
    )
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(t, run.model.d_model, s))
    autocast = t.precision.startswith(("bf16", "16")) and t.precision.endswith("mixed")
    dtype = torch.bfloat16 if t.precision.startswith("bf16") else torch.float16
    model.train()
    marks: dict[int, tuple[float, float, int]] = {}
    for step, batch in batches:
        tokens = batch["tokens"].to(device, non_blocking=True)
        inp, tgt = tokens[:, :-1], tokens[:, 1:]
        with torch.autocast(device.type, dtype=dtype, enabled=autocast):
            logits = model(inp)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), tgt.masked_fill(tgt == PAD, -100).flatten())
        loss.backward()
        if t.grad_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if step in (first, last):
            marks[step] = mark()
    return elapsed(marks, first, last)


def measure(
    size: str,
    steps: int,
    repeats: int,
    threads: int | None,
    precision: str,
    compile: bool,
    fused: bool,
    *,
    warm: int | None = None,
    task: dict | None = None,
    time_left: Callable[[], float] | None = None,
    on_repeat: Callable[[dict], None] | None = None,
    uri: str | None = None,
) -> dict:
    """``repeats`` alternating repeats of both sides (fewer when ``time_left()``, seconds, cannot hold one more:
    then ``cut`` says so); ``on_repeat`` receives the figures so far after each repeat (a run stopped later keeps
    them); ``warm``: steps before the window (default: 2 logging intervals, 5 when compiled); ``task``: settings
    of the text task over the size's (``max_chars`` for a smaller corpus); ``uri``: the MLflow store (default: a
    new SQLite store in a temporary folder, whose tables take seconds to create)."""
    if warm is None:
        warm = 2 * LOG_EVERY if not compile else 5 * LOG_EVERY
    warm = max(LOG_EVERY, warm // LOG_EVERY * LOG_EVERY)  # both ends of the window are logged steps
    steps = max(LOG_EVERY, steps // LOG_EVERY * LOG_EVERY)
    first, last = warm, warm + steps
    run = run_config(size, steps, warm, threads, precision, compile, fused, task)
    tokens = window_tokens(run, first, last)
    names = ("ours_s", "loop_s", "ours_cpu_s", "loop_cpu_s", "ours_graphs", "loop_graphs", "repeat_s", "warmup_s")
    rows: dict[str, list[float]] = {name: [] for name in names}
    reported: list = []
    metrics: dict = {}
    cut = ""
    with tempfile.TemporaryDirectory(prefix="run-vs-loop-") as tmp:
        uri = uri or f"sqlite:///{tmp}/mlflow.db"
        if compile:  # untimed: whichever side ran first would otherwise compile inside its window
            started = time.perf_counter()
            ours(run, first, last, uri)
            rows["warmup_s"].append(time.perf_counter() - started)
        for i in range(repeats):
            # the shortest repeat so far (compiled, the untimed run above held the compilations)
            if i and time_left is not None and time_left() < min(rows["repeat_s"]):
                cut = f"{i} of {repeats} repeats: the time limit could not hold another"
                break
            started = time.perf_counter()
            for side in ("ours", "loop") if i % 2 == 0 else ("loop", "ours"):  # the order swaps every repeat
                if side == "ours":
                    (wall, cpu, graphs), metrics = ours(run, first, last, uri)
                    reported.append(metrics.get("cost/tokens_per_s"))
                else:
                    wall, cpu, graphs = plain_loop(run, first, last)
                rows[f"{side}_s"].append(wall)
                rows[f"{side}_cpu_s"].append(cpu)
                rows[f"{side}_graphs"].append(graphs)
            rows["repeat_s"].append(time.perf_counter() - started)
            if on_repeat is not None:
                on_repeat(summary(run, size, tokens, steps, rows, reported, metrics, cut="running"))
    return summary(run, size, tokens, steps, rows, reported, metrics, cut)


def summary(run, size: str, tokens: int, steps: int, rows: dict, reported: list, metrics: dict, cut: str) -> dict:
    """The figures of the repeats in ``rows``: medians of both sides, and the ratio as the median of the per-repeat
    ratios (loop time / our time: above 1, ours is faster) with their range."""
    import torch

    t = run.training
    a, b = statistics.median(rows["ours_s"]), statistics.median(rows["loop_s"])
    ac, bc = statistics.median(rows["ours_cpu_s"]), statistics.median(rows["loop_cpu_s"])
    ratios = [lo / us for lo, us in zip(rows["loop_s"], rows["ours_s"])]
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else f"CPU ({platform.machine()})"
    return {
        "size": size,
        "model": SIZES[size],
        "params": sum(p.numel() for p in __import__("models").Transformer(run.model).parameters()),
        "precision": t.precision,
        "compile": t.compile,
        "fused_adamw": t.fused_adamw,
        "device": device,
        "threads": torch.get_num_threads(),
        "window_steps": steps,
        "window_tokens": tokens,
        "graphs_compiled_in_windows": sum(rows["ours_graphs"]) + sum(rows["loop_graphs"]),
        "repeats": len(ratios),
        "cut": cut,
        "seconds": rows,
        "ours_tokens_per_s": tokens / a,
        "loop_tokens_per_s": tokens / b,
        "ratios": ratios,
        "ratio": statistics.median(ratios),
        "ratio_range": [min(ratios), max(ratios)],
        "fixed_cost_per_step_ms": 1000 * (a - b) / steps,
        "cpu_ratio": bc / ac,  # CPU seconds of the process: what the host spent, whatever else ran beside
        "cpu_fixed_cost_per_step_ms": 1000 * (ac - bc) / steps,
        "ours_reported_tokens_per_s": reported,
        "last_metrics": metrics,
    }


def markdown(r: dict, command: str) -> str:
    return "\n".join(
        [
            "# `ablate run` against a plain PyTorch loop",
            "",
            f"Command: `{command}`  ",
            f"Device: {r['device']}; {r['threads']} torch thread(s); torch {__import__('torch').__version__}.  ",
            f"Model: decoder, {r['params'] / 1e6:.2f}M parameters ({r['model']['model']}), batch "
            f"{r['model']['batch_size']} x {r['model']['block_size']} bytes of the pydoc corpus; precision "
            f"{r['precision']}, compile {r['compile']}, fused AdamW {r['fused_adamw']}.  ",
            f"Window: {r['window_steps']} steps ({r['window_tokens']:,} tokens) after warm-up; median of "
            f"{r['repeats']} alternating repeats (the order swapped every repeat); the ratio's range over them: "
            f"{r['ratio_range'][0]:.3f}x to {r['ratio_range'][1]:.3f}x.",
            "",
            "| path | tokens/s | ratio |",
            "|---|---:|---:|",
            f"| `ablate run` (Lightning, MLflow tracking) | {r['ours_tokens_per_s']:,.0f} | **{r['ratio']:.3f}x** |",
            f"| plain PyTorch loop | {r['loop_tokens_per_s']:,.0f} | 1.000x |",
            "",
            f"Fixed cost per step: {r['fixed_cost_per_step_ms']:.2f} ms (wall). CPU time of the process over the "
            f"window (all its threads; unaffected by other load on the machine): ratio **{r['cpu_ratio']:.3f}x**, "
            f"{r['cpu_fixed_cost_per_step_ms']:.2f} ms per step.",
            "",
            *(
                [
                    f"Graphs compiled inside the timed windows: {r['graphs_compiled_in_windows']} (a compilation was "
                    "timed: the figures above are not the training's speed)",
                    "",
                ]
                if r["graphs_compiled_in_windows"]
                else []
            ),
        ]
    )


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=sorted(SIZES), default="cpu")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: 1 on CPU)")
    parser.add_argument("--precision", default="32-true")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--fused-adamw", action="store_true")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--name", default=None, help="results file name (default: run_vs_loop_<size>)")
    args = parser.parse_args(argv)
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "false")
    import torch

    threads = args.threads or (None if torch.cuda.is_available() else 1)
    r = measure(args.size, args.steps, args.repeats, threads, args.precision, args.compile, args.fused_adamw)
    command = "python benchmarks/run_vs_loop.py " + " ".join(argv if argv is not None else sys.argv[1:])
    r["command"] = command.strip()
    name = args.name or f"run_vs_loop_{args.size}"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{name}.json").write_text(json.dumps(r, indent=2, default=str))
    (args.out / f"{name}.md").write_text(markdown(r, r["command"]))
    print(markdown(r, r["command"]))
    return r


if __name__ == "__main__":
    main()
