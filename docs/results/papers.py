"""The papers' own published numbers beside ours: one figure per study, docs/results/STUDY/paper_vs_ours.png.

    .venv/bin/python docs/results/papers.py      (after docs/results/run.sh; reads the committed table.json files)

The papers' numbers below are copied from their tables and text (the source of each is named next to it); no
paper's figure image is copied. Ours come from the reports' table.json (mean over seeds, 95% t interval) and
the committed benchmark results.
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

# --- the papers' numbers ---------------------------------------------------------------------------------------

# Vaswani et al. 2017, "Attention Is All You Need", Table 3 (newstest2013 dev, English-German), rows base, (A), (E)
VASWANI_HEADS = {1: (5.29, 24.9), 4: (5.00, 25.5), 8: (4.92, 25.8), 16: (4.91, 25.8), 32: (5.01, 25.4)}  # h: PPL, BLEU
VASWANI_POSITIONS = {"sinusoidal (base)": (4.92, 25.8), "learned (row E)": (4.92, 25.7)}
# Britz et al. 2017, "Massive Exploration of NMT Architectures", attention table (newstest2013 BLEU, mean of runs);
# read from secondary notes that reproduce the table (no copy of the paper itself was available here)
BRITZ = {
    "multiplicative": {128: 22.03, 256: 22.33, 512: 21.78, 1024: 18.22},
    "additive": {128: 22.23, 256: 22.33, 512: 22.47, 1024: 22.10},
}
# Xiong et al. 2020, "On Layer Normalization in the Transformer Architecture", section 3.2 and 4.2 (IWSLT14 De-En
# BLEU, Adam; "around 34" is the paper's wording for Post-LN with 4,000 warm-up steps and for Pre-LN without)
XIONG = [
    ("Post-LN\nno warm-up", 8.45, False),
    ("Post-LN\nwarm-up 500\nlr 1e-3", 2.77, False),
    ("Post-LN\nwarm-up 500\nlr 5e-4", 31.16, False),
    ("Post-LN\nwarm-up 4000", 34.0, True),
    ("Pre-LN\nno warm-up", 34.0, True),
]
# Tay et al. 2021, "Long Range Arena", Table 1 (accuracy) and Table 2 (steps per second, relative to the Transformer)
LRA = {"Transformer": {"ListOps": 36.37, "Text": 64.27, "Retrieval": 57.46}}
LRA["Local Attention"] = {"ListOps": 15.82, "Text": 52.98, "Retrieval": 53.39}
LRA_SPEEDUP = {1024: 1.1, 2048: 1.7, 3072: 3.2, 4096: 5.3}
# Michel et al. 2019, "Are Sixteen Heads Really Better than One?", Table 1: BLEU change when one head of the WMT
# encoder's self-attention is removed, the range of each layer's 16 cells (base BLEU 36.05)
MICHEL_RANGE = {
    1: (-0.53, 0.11),
    2: (0.00, 0.20),
    3: (-0.11, 0.24),
    4: (-0.10, 0.14),
    5: (-0.31, 0.21),
    6: (-0.31, 0.15),
}

PAPER, OURS = "#7f7f7f", "#1f77b4"


def table(study: str) -> dict[str, dict]:
    path = HERE / study / "table.json"
    return {r["variant"]: r for r in json.loads(path.read_text())} if path.exists() else {}


def seeds(*tables: dict[str, dict]) -> str:
    """The seeds behind the tables' means, for a title."""
    ns = sorted({r["n"] for t in tables for r in t.values()})
    return f"{ns[0]}" if len(ns) == 1 else f"{ns[0]}-{ns[-1]}"


def point(ax, x, rec: dict, **kw) -> None:
    """A variant's mean with its 95% t interval."""
    lo, hi = rec["ci_low"], rec["ci_high"]
    err = [[rec["mean"] - lo], [hi - rec["mean"]]] if lo == lo and hi == hi else None
    ax.errorbar([x], [rec["mean"]], yerr=err, fmt="o", capsize=3, **kw)


def finish(fig, study: str, title: str) -> None:
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    out = HERE / study / "paper_vs_ours.png"
    fig.savefig(out, dpi=110)
    plt.close(fig)
    print(f"wrote {out.relative_to(ROOT)}")


def heads() -> None:
    """Row A at a fixed width: the paper's 1-32 heads at d_model 512, ours at d_model 128 (a quarter)."""
    ours = table("heads")
    if not ours:
        return
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    hs = sorted(VASWANI_HEADS)
    ax = axes[0]
    ax.plot(range(len(hs)), [VASWANI_HEADS[h][1] for h in hs], "o-", color=PAPER)
    ax.set_xticks(range(len(hs)), [f"{h}\n(d_k {512 // h})" for h in hs])
    ax.set(title="Vaswani et al. Table 3 (A): dev BLEU ↑", xlabel="heads (d_model 512; base 8)")
    ax = axes[1]
    names = [f"h{h} dk{128 // h}" for h in hs]
    for i, name in enumerate(names):
        if name in ours:
            point(ax, i, ours[name], color=OURS)
    ax.set_xticks(range(len(hs)), [f"{h}\n(d_k {128 // h})" for h in hs])
    ax.set(xlabel="heads (d_model 128; base 8)")
    ax.set_title("ours: final/val_loss ↓", fontsize=9)
    finish(
        fig, "heads", f"Number of heads: the paper (translation) and ours, byte-level LM ({seeds(ours)} seeds, 95% CI)"
    )


def positions() -> None:
    ours, long = table("positions"), table("positions_long")
    if not ours:
        return
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.6), gridspec_kw={"width_ratios": [1, 1.6, 1.6]})
    ax = axes[0]
    names = list(VASWANI_POSITIONS)
    ax.bar(range(2), [VASWANI_POSITIONS[n][1] for n in names], color=PAPER)
    for i, n in enumerate(names):
        ax.text(i, VASWANI_POSITIONS[n][1] + 0.1, f"BLEU {VASWANI_POSITIONS[n][1]}\nPPL {VASWANI_POSITIONS[n][0]}",
                ha="center", fontsize=8)  # fmt: skip
    ax.set_xticks(range(2), names)
    ax.set(ylim=(24, 26.5), title="Vaswani et al. Table 3 (E): dev BLEU ↑")
    kinds = ["sinusoidal", "learned", "rotary", "alibi", "none"]
    for ax, recs, title in (
        (axes[1], ours, "ours, byte-level LM, blocks of 64: final/val_loss ↓"),
        (axes[2], long, "ours, positions 64-255 (never trained): test_long/loss ↓"),
    ):
        for i, k in enumerate(kinds):
            if f"positions={k}" in recs:
                point(ax, i, recs[f"positions={k}"], color=OURS)
        ax.set_xticks(range(len(kinds)), kinds)
        ax.set_title(title, fontsize=9)
        if recs is long:
            ax.set_yscale("log")
    finish(fig, "positions", f"Learned against sinusoidal positions: the paper and ours ({seeds(ours)} seeds, 95% CI)")


def attention_score() -> None:
    ours = table("attention_score")
    if not ours:
        return
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    ax = axes[0]
    for name, style in (("multiplicative", "s--"), ("additive", "o-")):
        dims = sorted(BRITZ[name])
        ax.plot(dims, [BRITZ[name][d] for d in dims], style, color=PAPER, label=name)
    ax.set_xscale("log", base=2)
    ax.set(title="Britz et al.: newstest2013 BLEU ↑", xlabel="attention dimension")
    ax.legend(fontsize=8)
    ax = axes[1]
    for k, (score, color) in enumerate(
        (("dot", "#1f77b4"), ("dot_unscaled", "#d62728"), ("additive", "#2ca02c"), ("general", "#9467bd"))
    ):
        xs, ys = [], []
        for i, d in enumerate((16, 64)):
            rec = ours.get(f"score={score} head_dim={d}")
            if rec:
                point(ax, i + (k - 1.5) * 0.08, rec, color=color, label=score if i == 0 else None)
                xs.append(i + (k - 1.5) * 0.08)
                ys.append(rec["mean"])
        ax.plot(xs, ys, "-", color=color, alpha=0.5)
    ax.set_yscale("log")
    ax.set_xticks([0, 1], ["d_k 16", "d_k 64"])
    ax.set(title="ours, reversal: final/val_loss ↓ (log)")
    ax.legend(fontsize=8)
    finish(
        fig,
        "attention_score",
        f"Attention scores as the key dimension grows: the paper and ours ({seeds(ours)} seeds, 95% CI)",
    )


def norm_placement() -> None:
    grid, tuned = table("norm_placement"), table("norm_placement_tuned")
    if not grid:
        return
    ratios = [1.3, 1.3, 1] if tuned else [1.3, 1.3]  # the tuned panel once norm_placement_tuned has run
    fig, axes = plt.subplots(1, len(ratios), figsize=(4.7 * len(ratios), 3.8), gridspec_kw={"width_ratios": ratios})
    ax = axes[0]
    bars = ax.bar(range(len(XIONG)), [v for _, v, _ in XIONG], color=PAPER)
    for b, (_, v, approx) in zip(bars, XIONG):
        ax.text(b.get_x() + b.get_width() / 2, v + 0.5, ("≈" if approx else "") + f"{v:g}", ha="center", fontsize=8)
        if approx:
            b.set_hatch("//")
    ax.set_xticks(range(len(XIONG)), [n for n, _, _ in XIONG], fontsize=7)
    ax.set(title="Xiong et al.: IWSLT14 BLEU ↑ (quoted from the text)")
    ax = axes[1]
    labels = []
    for i, (layers, warm) in enumerate(((2, 0), (2, 100), (4, 0), (4, 100))):
        labels.append(f"{layers} layers\nwarm-up {warm}")
        for j, (norm, color) in enumerate((("pre", OURS), ("post", "#d62728"))):
            rec = grid.get(f"norm={norm} warmup_steps={warm} n_layers={layers} lr=0.01")
            if rec:
                point(ax, i + (j - 0.5) * 0.25, rec, color=color, label=f"{norm}-LN" if i == 0 else None)
    ax.set_yscale("log")
    ax.set_xticks(range(4), labels, fontsize=8)
    ax.set(title="ours, reversal, lr 1e-2: final/val_loss ↓ (log)")
    ax.legend(fontsize=8)
    if not tuned:
        finish(fig, "norm_placement", f"Pre-LN against Post-LN: the paper and ours ({seeds(grid)} seeds, 95% CI)")
        return
    ax = axes[2]
    labels = []
    for i, warm in enumerate((0, 100)):
        labels.append(f"warm-up {warm}")
        for j, (norm, color) in enumerate((("pre", OURS), ("post", "#d62728"))):
            rec = tuned.get(f"norm={norm} warmup_steps={warm}")
            if rec:
                point(ax, i + (j - 0.5) * 0.25, rec, color=color, label=f"{norm}-LN" if i == 0 else None)
                ax.annotate(rec.get("tuned", ""), (i + (j - 0.5) * 0.25, rec["mean"]), fontsize=7,
                            xytext=(4, 4), textcoords="offset points")  # fmt: skip
    ax.set_yscale("log")
    ax.set_xticks(range(2), labels)
    ax.set(title="ours, 4 layers, each at its tuned lr ↓ (log)")
    finish(fig, "norm_placement", f"Pre-LN against Post-LN: the paper and ours ({seeds(grid, tuned)} seeds, 95% CI)")


def locality() -> None:
    ours = table("locality")
    if not ours:
        return
    bench = json.loads((ROOT / "benchmarks" / "results" / "model.json").read_text())["local_vs_full"]
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.6))
    ax = axes[0]
    tasks = ["ListOps", "Text", "Retrieval"]
    for j, (model, color) in enumerate((("Transformer", PAPER), ("Local Attention", "#c7c7c7"))):
        ax.bar([i + (j - 0.5) * 0.38 for i in range(3)], [LRA[model][t] for t in tasks], 0.38, color=color, label=model)
    ax.set_xticks(range(3), tasks)
    ax.set(title="Long Range Arena, Table 1: accuracy ↑")
    ax.legend(fontsize=8)
    ax = axes[1]
    for i, rec in enumerate(ours.values()):
        point(ax, i, rec, color=OURS)
    ax.set_xticks(range(len(ours)), list(ours), rotation=20, ha="right", fontsize=7)
    ax.set_title("ours, ListOps (60-160 tokens): test/accuracy ↑", fontsize=9)
    ax = axes[2]
    ns = sorted(LRA_SPEEDUP)
    ax.plot(ns, [LRA_SPEEDUP[n] for n in ns], "s--", color=PAPER, label="LRA Table 2 (TPU, steps/s)")
    speed = sorted((r["n"], r["speedup"]) for r in bench if r["causal"])
    ax.plot([n for n, _ in speed], [x for _, x in speed], "o-", color=OURS, label="ours (CPU, fwd+bwd, causal, w=128)")
    ax.set_xscale("log", base=2)
    ax.set(title="local over full attention: speed-up ↑", xlabel="sequence length")
    ax.legend(fontsize=7)
    finish(
        fig, "locality", f"Local and dilated against full attention: the papers and ours ({seeds(ours)} seeds, 95% CI)"
    )


def michel() -> None:
    path = HERE / "michel_heads" / "heads.json"
    if not path.exists():
        return
    models = json.loads(path.read_text())
    fig, axes = plt.subplots(1, 2, figsize=(12, 3.8))
    ax = axes[0]
    for layer, (lo, hi) in MICHEL_RANGE.items():
        ax.plot([layer, layer], [lo, hi], "-", color=PAPER, lw=6, solid_capstyle="butt")
    ax.axhline(0, color="black", lw=0.5)
    ax.set(title="Michel et al. Table 1: ΔBLEU per head removed\n(WMT encoder self-attention, range per layer; ↓ = harm)",
           xlabel="layer")  # fmt: skip
    ax = axes[1]
    modules = list(dict.fromkeys(h["module"] for h in models[0]["heads"]))
    variants = list(dict.fromkeys(m["variant"] for m in models))
    colors = dict(zip(variants, (OURS, "#ff7f0e", "#2ca02c")))
    for i, module in enumerate(modules):
        for k, m in enumerate(models):
            changes = [h["change"] for h in m["heads"] if h["module"] == module]
            x = i + (k - (len(models) - 1) / 2) * 0.04
            label = m["variant"] if i == 0 and m is next(n for n in models if n["variant"] == m["variant"]) else None
            ax.plot([x, x], [min(changes), max(changes)], "-", color=colors[m["variant"]], lw=2, solid_capstyle="butt",
                    label=label)  # fmt: skip
    ax.axhline(0, color="black", lw=0.5)
    ax.set_yscale("symlog", linthresh=1e-3)
    ax.set_xticks(range(len(modules)), modules, rotation=30, ha="right", fontsize=7)
    ax.set_title("ours: Δ val/loss per head removed\n(range per module, one bar per seed; ↑ = harm)")
    n = len({m["seed"] for m in models})
    ax.legend(fontsize=8, title=f"variant ({n} seeds each)", title_fontsize=8)
    finish(fig, "michel_heads", "Removing single heads at evaluation time: the paper and ours")


if __name__ == "__main__":
    heads()
    positions()
    attention_score()
    norm_placement()
    locality()
    michel()
