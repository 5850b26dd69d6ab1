"""GPU benchmarks (issue 16): our CUDA paths against the anchors torch itself offers, side by side in one run.

    python benchmarks/gpu.py            # on any CUDA machine: all of it, then results/gpu.md, gpu.json and the
                                        # GPU section of benchmarks/README.md, with the device named
    python benchmarks/gpu.py --quick    # short lengths and few repeats (a smoke run, written to results/quick/)

1. Local attention, window 256, causal, 16 heads of 64, bf16, forward + backward, at 1k to 64k tokens: ours
   (``LocalPattern.attend``: FlexAttention with cached BlockMasks) against FlexAttention's sliding window written
   the obvious way (``create_block_mask``, compiled) and flash full causal attention (scaled_dot_product_attention).
   Also dilated attention (half the heads at dilation 2) and ALiBi, each against the FlexAttention that
   computes the same thing. Targets: time and peak memory at most FlexAttention's at every length; at 4k at
   least as fast as flash full causal attention.
2. One training step of a 16k-token decoder (d 512, 4 layers): local (window 256) against full attention.
   Target: at least 2x faster, with less memory.
3. Additive (Bahdanau) scores against dot-product scores, full attention, n = 4096, fp32: time and memory.
   Target: at most 10x dot, memory bounded by the tile.
4. An encoder of d 1024, 8 layers, T 2048 (bf16 autocast): ours against nn.TransformerEncoder, tokens/s and MFU.
5. ``ablate run`` against a plain loop on the 85M-parameter byte LM (benchmarks/run_vs_loop.py --size gpu), eager
   and with compile + fused AdamW. Target: at least 0.97x.

Times: CUDA events around each call, after warm-up (compilation), median of the repeats, the sides alternating.
Peak memory: torch.cuda.max_memory_allocated over one forward + backward, above what was allocated before it.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

H, D, WINDOW = 16, 64, 256
BEGIN, END = "<!-- gpu:begin -->", "<!-- gpu:end -->"


def cuda_time(fn: Callable[[], object], repeats: int, warmup: int = 3) -> float:
    """Median milliseconds of fn() measured with CUDA events."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def peak_mb(fn: Callable[[], object]) -> float:
    """Peak memory of one call above what was allocated before it, MB."""
    import torch

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**20


def side_by_side(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, dict[str, float]]:
    """{name: {"ms", "mb"}}: every function warmed up, then timed in alternation (round robin), then its peak."""
    for fn in fns.values():
        cuda_time(fn, 1, warmup=3)
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            times[name].append(cuda_time(fn, 1, warmup=0))
    return {name: {"ms": statistics.median(times[name]), "mb": peak_mb(fns[name])} for name in fns}


def fwd_bwd(attend: Callable, q, k, v) -> Callable[[], None]:
    def run() -> None:
        q.grad = k.grad = v.grad = None
        attend(q, k, v).sum().backward()

    return run


# --- 1. attention kernels ---------------------------------------------------------------------------------------


def attention_kernels(lengths: list[int], repeats: int) -> list[dict]:
    import torch

    rows = []
    for n in lengths:
        result = side_by_side(_attention_at(n), repeats)
        rows.append({"n": n, **result})
        print(f"attention n={n}: " + ", ".join(f"{k} {v['ms']:.2f} ms {v['mb']:.0f} MB" for k, v in result.items()))
        print("row", json.dumps(rows[-1]))  # in the log too: a run stopped by a time limit keeps each length
        torch.cuda.empty_cache()
    return rows


DILATIONS = (1,) * (H // 2) + (2,) * (H // 2)  # the dilated contenders: half the heads at dilation 2


def peer_masks(n: int, device: str = "cuda", compiled: bool = True):
    """The anchors' block masks, written the obvious way with ``create_block_mask``: (window, dilated).
    The dilated mask is built per head (H): its mask_mod reads each head's dilation, and a mask built for
    H=None holds head 0's blocks for every head (half the keys of the heads at dilation 2 left out)."""
    import torch
    from torch.nn.attention.flex_attention import create_block_mask

    dil = torch.tensor(DILATIONS, device=device)

    def window(b, h, i, j):
        return (i >= j) & (i - j <= WINDOW)

    def dilated(b, h, i, j):
        d = dil[h]
        return (i >= j) & ((i - j) % d == 0) & (i - j <= WINDOW * d)

    build = torch.compile(create_block_mask) if compiled else create_block_mask
    return build(window, None, None, n, n, device=device), build(dilated, None, H, n, n, device=device)


def _attention_at(n: int) -> dict[str, Callable[[], None]]:
    """Forward + backward of each contender at ``n`` tokens (the anchors and ours on the same q, k, v)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention.flex_attention import flex_attention

    from models.attention import DotScore
    from models.config import LayerAttention
    from models.patterns import DilatedPattern, LocalPattern
    from models.positions import ALiBi

    flex = torch.compile(flex_attention, dynamic=False)
    score = DotScore(H, D).cuda()
    alibi = ALiBi(H, causal=True).cuda()
    slopes = alibi.past
    q, k, v = (torch.randn(1, H, n, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))

    def alibi_mod(s, b, h, i, j):
        return s - slopes[h] * (i - j)

    plain_mask, dilated_mask = peer_masks(n)
    local = LocalPattern(LayerAttention("local", WINDOW, (1,) * H))
    dilated_ours = DilatedPattern(LayerAttention("dilated", WINDOW, DILATIONS))
    return {
        "flash full causal": fwd_bwd(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True), q, k, v),
        "FlexAttention window": fwd_bwd(lambda a, b, c: flex(a, b, c, block_mask=plain_mask), q, k, v),
        "ours local": fwd_bwd(lambda a, b, c: local.attend(a, b, c, score, causal=True), q, k, v),
        "FlexAttention dilated": fwd_bwd(lambda a, b, c: flex(a, b, c, block_mask=dilated_mask), q, k, v),
        "ours dilated": fwd_bwd(lambda a, b, c: dilated_ours.attend(a, b, c, score, causal=True), q, k, v),
        "FlexAttention window + ALiBi": fwd_bwd(
            lambda a, b, c: flex(a, b, c, score_mod=alibi_mod, block_mask=plain_mask), q, k, v
        ),
        "ours local + ALiBi": fwd_bwd(
            lambda a, b, c: local.attend(a, b, c, score, causal=True, bias=alibi.bias), q, k, v
        ),
    }


# --- 2. a 16k-token decoder training step --------------------------------------------------------------------------


def decoder_step(tokens: int, repeats: int) -> dict:
    import torch
    import torch.nn.functional as F

    from models import ModelConfig, Transformer

    out = {}
    fns = {}
    for name, pattern in (("full", {"pattern": "full"}), ("local w256", {"pattern": "local", "window": WINDOW})):
        cfg = ModelConfig(
            arch="decoder", vocab_size=256, d_model=512, n_heads=8, n_layers=4, d_ff=2048, max_len=tokens, **pattern
        )
        model = Transformer(cfg).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        x = torch.randint(4, 256, (1, tokens + 1), device="cuda")

        def step(model=model, opt=opt, x=x) -> None:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = model(x[:, :-1])
            F.cross_entropy(logits.flatten(0, 1).float(), x[:, 1:].flatten()).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        fns[name] = step
    out = side_by_side(fns, repeats)
    print("decoder step: " + ", ".join(f"{k} {v['ms']:.1f} ms {v['mb']:.0f} MB" for k, v in out.items()))
    return {"tokens": tokens, **out}


# --- 3. additive against dot-product scores ------------------------------------------------------------------------


def additive_vs_dot(n: int, repeats: int) -> dict:
    import torch

    from models.attention import MultiHeadAttention

    fns = {}
    for score in ("dot", "additive"):
        attn = MultiHeadAttention(512, 8, 64, score=score).cuda()
        x = torch.randn(1, n, 512, device="cuda", requires_grad=True)

        def run(attn=attn, x=x) -> None:
            x.grad = None
            attn(x).sum().backward()

        fns[score] = run
    out = side_by_side(fns, repeats)
    print(f"additive vs dot n={n}: " + ", ".join(f"{k} {v['ms']:.2f} ms {v['mb']:.0f} MB" for k, v in out.items()))
    return {"n": n, **out, "ratio": out["additive"]["ms"] / out["dot"]["ms"]}


# --- 4. an encoder against nn.TransformerEncoder -------------------------------------------------------------------


def encoder(T: int, batch: int, repeats: int) -> dict:
    import torch
    from torch import nn

    from models.blocks import EncoderLayer
    from models.config import ModelConfig
    from models.flops import peak_flops_per_s

    C, layers, heads = 1024, 8, 16
    cfg = ModelConfig(arch="encoder", n_classes=2, d_model=C, n_heads=heads, d_ff=4 * C, norm="pre", dropout=0.0)
    ours = nn.Sequential(*[EncoderLayer(cfg, "full") for _ in range(layers)]).cuda()
    theirs = nn.TransformerEncoder(
        nn.TransformerEncoderLayer(C, heads, 4 * C, dropout=0.0, batch_first=True, norm_first=True),
        layers,
        enable_nested_tensor=False,
    ).cuda()
    x = torch.randn(batch, T, C, device="cuda", requires_grad=True)

    def run(m) -> Callable[[], None]:
        def f() -> None:
            x.grad = None
            with torch.autocast("cuda", dtype=torch.bfloat16):
                y = m(x)
            y.float().sum().backward()

        return f

    out = side_by_side({"ours": run(ours), "nn.TransformerEncoder": run(theirs)}, repeats)
    flops = 3 * layers * batch * (24 * T * C * C + 4 * T * T * C)  # forward 2x(12 T C^2 + 2 T^2 C), backward 2x
    peak = peak_flops_per_s(torch.device("cuda"), "bf16-mixed")
    for name in out:
        out[name]["tokens_per_s"] = batch * T / (out[name]["ms"] / 1000)
        out[name]["mfu"] = flops / (out[name]["ms"] / 1000) / peak if peak else float("nan")
    print("encoder: " + ", ".join(f"{k} {v['tokens_per_s']:,.0f} tokens/s MFU {v['mfu']:.1%}" for k, v in out.items()))
    return {"T": T, "batch": batch, "d_model": C, "layers": layers, **out}


# --- 5. ablate run against a plain loop ----------------------------------------------------------------------------


def run_vs_loop(steps: int, repeats: int) -> list[dict]:
    from benchmarks.run_vs_loop import measure

    rows = []
    for compile_, fused in ((False, False), (True, True)):
        r = measure("gpu", steps, repeats, None, "bf16-mixed", compile_, fused)
        print(f"ablate run vs loop (compile {compile_}, fused {fused}): {r['ratio']:.3f}x")
        print("row", json.dumps(r, default=str))
        rows.append(r)
    return rows


# --- the report ----------------------------------------------------------------------------------------------------


TITLES = {
    "attention": f"1. Attention, window {WINDOW}, causal, {H} heads of {D}, bf16, forward + backward",
    "decoder": "2. One training step",
    "additive": "3. Additive against dot-product scores",
    "encoder": "4. Encoder",
    "run_vs_loop": "5. `ablate run` against a plain PyTorch loop",
}
SECTIONS = tuple(TITLES)


def markdown(r: dict) -> str:
    """The report: every section measured, and for one that failed or did not run, what happened instead."""
    lines = [f"Measured on {r['device']} (torch {r['torch']}, CUDA {r['cuda']}), {r['date']}, with `{r['command']}`."]
    for name in SECTIONS:
        lines.append("")
        if name not in r:
            lines.append(f"**{TITLES[name]}**: not run.")
        elif isinstance(r[name], dict) and "error" in r[name]:
            lines.append(f"**{TITLES[name]}**: failed: `{r[name]['error']}`.")
        else:
            lines += _RENDER[name](r[name])
    return "\n".join(lines) + "\n"


def _attention_md(rows: list[dict]) -> list[str]:
    lines = [
        f"**{TITLES['attention']}** (ms / peak MB):",
        "",
    ]
    names = [k for k in rows[0] if k != "n"]
    lines += ["| tokens | " + " | ".join(names) + " |", "|---:|" + "---:|" * len(names)]
    for row in rows:
        lines.append(
            f"| {row['n']:,} | " + " | ".join(f"{row[k]['ms']:.2f} / {row[k]['mb']:.0f}" for k in names) + " |"
        )
    return lines


def _decoder_md(d: dict) -> list[str]:
    return [
        f"**{TITLES['decoder']} of a {d['tokens']:,}-token decoder** (d 512, 4 layers, bf16 autocast): full attention "
        f"{d['full']['ms']:.1f} ms / {d['full']['mb']:.0f} MB, local w{WINDOW} {d['local w256']['ms']:.1f} ms / "
        f"{d['local w256']['mb']:.0f} MB: **{d['full']['ms'] / d['local w256']['ms']:.2f}x** faster (target 2x)."
    ]


def _additive_md(a: dict) -> list[str]:
    return [
        f"**{TITLES['additive']}**, n = {a['n']:,}, fp32, forward + backward: dot {a['dot']['ms']:.2f} ms "
        f"/ {a['dot']['mb']:.0f} MB, additive {a['additive']['ms']:.2f} ms / {a['additive']['mb']:.0f} MB: "
        f"**{a['ratio']:.1f}x** (target at most 10x)."
    ]


def _encoder_md(e: dict) -> list[str]:
    return [
        f"**{TITLES['encoder']}** (d {e['d_model']}, {e['layers']} layers, T {e['T']}, batch {e['batch']}, bf16 autocast): ours "
        f"{e['ours']['tokens_per_s']:,.0f} tokens/s (MFU {e['ours']['mfu']:.1%}), nn.TransformerEncoder "
        f"{e['nn.TransformerEncoder']['tokens_per_s']:,.0f} tokens/s (MFU {e['nn.TransformerEncoder']['mfu']:.1%})."
    ]


def _run_vs_loop_md(rows: list[dict]) -> list[str]:
    lines = [
        f"**{TITLES['run_vs_loop']}** (85M-parameter byte LM, batch 32 x 512, bf16-mixed):",
        "",
        "| compile, fused AdamW | ours tokens/s | loop tokens/s | ratio |",
        "|---|---:|---:|---:|",
    ]
    for x in rows:
        lines.append(
            f"| {x['compile']}, {x['fused_adamw']} | {x['ours_tokens_per_s']:,.0f} | {x['loop_tokens_per_s']:,.0f} | "
            f"**{x['ratio']:.3f}x** |"
        )
    return lines


_RENDER = {
    "attention": _attention_md,
    "decoder": _decoder_md,
    "additive": _additive_md,
    "encoder": _encoder_md,
    "run_vs_loop": _run_vs_loop_md,
}


def write_readme_section(text: str, readme: Path) -> None:
    """Replace the text between the GPU markers of benchmarks/README.md (appended with them if absent)."""
    body = readme.read_text()
    block = f"{BEGIN}\n{text}{END}"
    if BEGIN in body and END in body:
        body = re.sub(re.escape(BEGIN) + r".*?" + re.escape(END), lambda _: block, body, flags=re.S)
    else:
        body = body.rstrip() + "\n\n## GPU\n\n" + block + "\n"
    readme.write_text(body)


def main(argv: list[str] | None = None) -> dict:
    import datetime

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--quick", action="store_true", help="short lengths, few repeats; results/quick/, README untouched"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument(
        "--only", nargs="+", choices=SECTIONS, help="these sections alone (README untouched)", metavar="SECTION"
    )
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("benchmarks/gpu.py needs a CUDA device: torch.cuda.is_available() is False here", file=sys.stderr)
        raise SystemExit(2)
    torch.backends.cuda.matmul.allow_tf32 = True
    repeats = 3 if args.quick else 10
    lengths = [1024, 4096] if args.quick else [1024, 4096, 16384, 65536]
    r = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "host": platform.node(),
        "date": datetime.date.today().isoformat(),
        "command": " ".join(
            [
                "python benchmarks/gpu.py",
                *(["--quick"] if args.quick else []),
                *(["--only", *args.only] if args.only else []),
            ]
        ),
    }
    runs = {
        "attention": lambda: attention_kernels(lengths, repeats),
        "decoder": lambda: decoder_step(4096 if args.quick else 16384, repeats),
        "additive": lambda: additive_vs_dot(1024 if args.quick else 4096, repeats),
        "encoder": lambda: encoder(512 if args.quick else 2048, 4 if args.quick else 8, repeats),
        "run_vs_loop": lambda: run_vs_loop(30 if args.quick else 100, 2 if args.quick else 3),
    }
    out = args.out / "quick" if args.quick else args.out
    out.mkdir(parents=True, exist_ok=True)
    for name in args.only or SECTIONS:
        # each section is written as soon as it is measured: a run stopped by a time limit keeps what it measured,
        # and a section that fails is reported with its error while the others still run
        try:
            r[name] = runs[name]()
        except Exception as e:  # noqa: BLE001 - reported in the results, not hidden
            import traceback

            traceback.print_exc()
            r[name] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]}
        torch.cuda.empty_cache()
        text = markdown(r)
        (out / "gpu.json").write_text(json.dumps(r, indent=1, default=str))
        (out / "gpu.md").write_text("# GPU benchmarks\n\n" + text)
    if not args.quick and not args.only:
        write_readme_section(text, ROOT / "benchmarks" / "README.md")
    print(text)
    return r


if __name__ == "__main__":
    main()
