"""Model benchmarks, each measured side by side with its peer in the same run and reported as ratios.

1. Our encoder (dot, full, pre-LN) against nn.TransformerEncoder of the same size: forward+backward tokens/s.
2. Local attention (window 128) against full attention at n = 1k, 2k, 4k, 8k: time and peak memory.
3. Local attention against the `local-attention` package (lucidrains) at the same window.
4. Additive against dot-product scores at n = 256 and 1024: time and peak memory.

Times: the two sides alternate, after warm-up, and the median of the repeats is kept. Peak memory: each
measurement runs in a fresh process and reports the growth of its peak resident set size (ru_maxrss)
over the forward+backward pass, so allocator caches of other measurements do not leak in.

    python benchmarks/model.py [--threads 1] [--quick] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from models.attention import SCORES, full_attention, local_attention  # noqa: E402
from models.blocks import EncoderLayer  # noqa: E402
from models.config import ModelConfig  # noqa: E402

H, D = 4, 64  # heads and head size of the attention benchmarks


def timed(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def side_by_side(a, b, repeats: int, warmup: int = 1) -> tuple[float, float]:
    """Median seconds of a() and b(), alternating so that both see the same machine state."""
    for _ in range(warmup):
        a()
        b()
    ta, tb = [], []
    for _ in range(repeats):
        ta += timed(a, 1)
        tb += timed(b, 1)
    return statistics.median(ta), statistics.median(tb)


# --- 1. encoder layer stack ----------------------------------------------------------------------


def encoder_pair(C=256, heads=8, layers=4, ff=1024, dropout=0.1):
    cfg = ModelConfig(
        arch="encoder",
        n_classes=2,
        d_model=C,
        n_heads=heads,
        d_ff=ff,
        norm="pre",
        dropout=dropout,
        attn_dropout=dropout,
    )
    ours = nn.Sequential(*[EncoderLayer(cfg, "full") for _ in range(layers)])
    theirs = nn.TransformerEncoder(
        nn.TransformerEncoderLayer(C, heads, ff, dropout=dropout, batch_first=True, norm_first=True),
        layers,
        enable_nested_tensor=False,
    )
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in theirs.parameters())
    return ours.train(), theirs.train()


def bench_encoder(repeats: int) -> dict:
    B, T, C = 16, 256, 256
    ours, theirs = encoder_pair(C)
    x = torch.randn(B, T, C)

    def step(m):
        return lambda: m(x).sum().backward()

    a, b = side_by_side(step(ours), step(theirs), repeats)
    return {
        "batch": B,
        "length": T,
        "d_model": C,
        "layers": 4,
        "heads": 8,
        "ours_s": a,
        "torch_s": b,
        "ours_tokens_per_s": B * T / a,
        "torch_tokens_per_s": B * T / b,
        "speedup": b / a,
    }


# --- 2 and 4. attention kernels ------------------------------------------------------------------


def attention_step(kind: str, n: int, causal: bool, window: int = 128, B: int = 1):
    score = SCORES["additive" if kind.startswith("additive") else "dot"](H, D, 1 << 18)
    q, k, v = (torch.randn(B, H, n, D, requires_grad=True) for _ in range(3))

    if kind in ("local", "additive_local"):

        def f():
            local_attention(q, k, v, score, window=window, causal=causal).sum().backward()
    elif kind in ("full", "additive"):

        def f():
            full_attention(q, k, v, score, causal=causal).sum().backward()
    elif kind == "local_attention_pkg":
        from local_attention import LocalAttention

        peer = LocalAttention(
            window_size=window, causal=causal, exact_windowsize=causal, autopad=True, use_rotary_pos_emb=False
        )

        def f():
            peer(q, k, v).sum().backward()
    else:
        raise ValueError(kind)
    return f


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def measure_peak(kind: str, n: int, causal: bool) -> float:
    """In this (fresh) process: MB that one forward+backward adds to the resident set at its peak.

    Linux: the high-water mark is reset through /proc/self/clear_refs just before the pass, so nothing
    earlier (imports) hides it. Elsewhere: growth of ru_maxrss (a lower bound)."""
    torch.set_num_threads(1)
    f = attention_step(kind, n, causal)
    try:
        Path("/proc/self/clear_refs").write_text("5")
        before = _status_kb("VmRSS")
        f()
        return (_status_kb("VmHWM") - before) / 1024
    except OSError:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        f()
        grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
        return grown / 1024 if platform.system() != "Darwin" else grown / 2**20


def peak_memory_mb(kind: str, n: int, causal: bool) -> float:
    """``measure_peak`` in a fresh process, so that allocator caches of other measurements stay out."""
    code = f"import sys; sys.path.insert(0, {str(ROOT)!r}); from benchmarks.model import measure_peak; print(measure_peak({kind!r}, {n}, {causal}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    return float(out.stdout.strip().splitlines()[-1])


def bench_local_vs_full(lengths, repeats: int) -> list[dict]:
    rows = []
    for causal in (True, False):
        for n in lengths:
            a, b = side_by_side(
                attention_step("local", n, causal),
                attention_step("full", n, causal),
                repeats if n < 8192 else max(2, repeats // 2),
            )
            rows.append(
                {
                    "causal": causal,
                    "n": n,
                    "local_s": a,
                    "full_s": b,
                    "speedup": b / a,
                    "local_us_per_token": a / n * 1e6,
                    "local_peak_mb": peak_memory_mb("local", n, causal),
                    "full_peak_mb": peak_memory_mb("full", n, causal),
                }
            )
    return rows


def bench_local_vs_package(lengths, repeats: int) -> list[dict]:
    rows = []
    for causal in (True, False):
        for n in lengths:
            a, b = side_by_side(
                attention_step("local", n, causal), attention_step("local_attention_pkg", n, causal), repeats
            )
            rows.append(
                {
                    "causal": causal,
                    "n": n,
                    "ours_s": a,
                    "package_s": b,
                    "speedup": b / a,
                    "ours_peak_mb": peak_memory_mb("local", n, causal),
                    "package_peak_mb": peak_memory_mb("local_attention_pkg", n, causal),
                }
            )
    return rows


def bench_additive(lengths, repeats: int) -> list[dict]:
    rows = []
    for n in lengths:
        a, b = side_by_side(attention_step("additive", n, False), attention_step("full", n, False), repeats)
        rows.append(
            {
                "n": n,
                "additive_s": a,
                "dot_s": b,
                "slowdown": a / b,
                "additive_peak_mb": peak_memory_mb("additive", n, False),
                "dot_peak_mb": peak_memory_mb("full", n, False),
            }
        )
    return rows


# --- report --------------------------------------------------------------------------------------


def markdown(results: dict) -> str:
    e = results["encoder"]
    lines = [
        "# Model benchmarks",
        "",
        f"Command: `{results['command']}`  ",
        f"Machine: {results['machine']}; torch {results['torch']}; {results['threads']} thread(s).  ",
        "Times are medians of alternating repeats (forward + backward); memory is the growth of the peak RSS "
        "of a fresh process over one forward + backward.",
        "",
        "## 1. Encoder stack against nn.TransformerEncoder (dot, full, pre-LN)",
        "",
        f"{e['layers']} layers, d_model {e['d_model']}, {e['heads']} heads, batch {e['batch']} x {e['length']} tokens, "
        "dropout 0.1, forward + backward.",
        "",
        "| | tokens/s | ratio |",
        "|---|---:|---:|",
        f"| ours | {e['ours_tokens_per_s']:,.0f} | **{e['speedup']:.2f}x** |",
        f"| nn.TransformerEncoder | {e['torch_tokens_per_s']:,.0f} | 1.00x |",
        "",
        "## 2. Local attention (window 128) against full attention",
        "",
        f"{H} heads of size {D}, batch 1, forward + backward, dot-product scores.",
        "",
        "| causal | n | local ms | full ms | speed-up | local us/token | local peak MB | full peak MB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results["local_vs_full"]:
        lines.append(
            f"| {r['causal']} | {r['n']} | {r['local_s'] * 1e3:.1f} | {r['full_s'] * 1e3:.1f} | **{r['speedup']:.1f}x** "
            f"| {r['local_us_per_token']:.2f} | {r['local_peak_mb']:.0f} | {r['full_peak_mb']:.0f} |"
        )
    for causal in (True, False):
        rows = [r for r in results["local_vs_full"] if r["causal"] == causal]
        growth = rows[-1]["local_us_per_token"] / rows[0]["local_us_per_token"]
        lines.append(
            f"\nTime per token of local attention, n={rows[-1]['n']} over n={rows[0]['n']} "
            f"(causal={causal}): **{growth:.2f}x**"
        )
    lines += [
        "",
        "## 3. Local attention against the `local-attention` package (same window, 128)",
        "",
        "The package runs with `exact_windowsize=True` when causal (the same keys as ours), its default "
        "(whole neighbouring blocks, up to 2 x window) otherwise, and without its rotary embedding.",
        "",
        "| causal | n | ours ms | package ms | speed-up | ours peak MB | package peak MB |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results["local_vs_package"]:
        lines.append(
            f"| {r['causal']} | {r['n']} | {r['ours_s'] * 1e3:.1f} | {r['package_s'] * 1e3:.1f} | "
            f"**{r['speedup']:.2f}x** | {r['ours_peak_mb']:.0f} | {r['package_peak_mb']:.0f} |"
        )
    lines += [
        "",
        "## 4. Additive against dot-product scores (full attention, not causal)",
        "",
        "| n | additive ms | dot ms | additive / dot time | additive peak MB | dot peak MB |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results["additive"]:
        lines.append(
            f"| {r['n']} | {r['additive_s'] * 1e3:.1f} | {r['dot_s'] * 1e3:.1f} | {r['slowdown']:.1f}x | "
            f"{r['additive_peak_mb']:.0f} | {r['dot_peak_mb']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="fewer repeats and lengths (a smoke run)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    repeats = 2 if args.quick else 7
    lengths = [1024, 2048] if args.quick else [1024, 2048, 4096, 8192]
    results = {
        "command": "python benchmarks/model.py"
        + (f" --threads {args.threads}" if args.threads != 1 else "")
        + (" --quick" if args.quick else ""),
        "machine": f"{platform.machine()}, {torch.get_num_threads()} torch thread(s) of {__import__('os').cpu_count()} cores",
        "torch": torch.__version__,
        "threads": args.threads,
    }
    print("encoder ...", flush=True)
    results["encoder"] = bench_encoder(repeats)
    print("local vs full ...", flush=True)
    results["local_vs_full"] = bench_local_vs_full(lengths, repeats)
    print("local vs package ...", flush=True)
    results["local_vs_package"] = bench_local_vs_package(lengths[:2] if args.quick else [1024, 4096, 8192], repeats)
    print("additive ...", flush=True)
    results["additive"] = bench_additive([256, 1024], repeats)
    args.out.mkdir(parents=True, exist_ok=True)
    name = "model-quick" if args.quick else "model"
    (args.out / f"{name}.json").write_text(json.dumps(results, indent=2))
    (args.out / f"{name}.md").write_text(markdown(results))
    print(markdown(results))
    return results


if __name__ == "__main__":
    main()
