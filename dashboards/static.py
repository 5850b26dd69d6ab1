"""Static figures (PNG, matplotlib) of a report, for documents that cannot run JavaScript: the learning curves
per variant (mean and min-max band over seeds) and the forest plot of the differences from the baseline."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from dashboards.plots import PALETTE, curves, forest_label
from dashboards.table import Table
from record.runs import StudyRuns


def _finish(ax, xlabel: str, ylabel: str, title: str, title_size: float | None = None) -> None:
    """Labels, title, legend and grid of one panel: every figure here dresses its axes alike."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=title_size)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)


def _save(fig, path: Path, plt) -> Path:
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def save_pngs(runs: StudyRuns, table: Table, out_dir: Path, curve_key: str = "val/loss") -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    data = curves(runs, curve_key)
    if data:
        fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
        for i, variant in enumerate(v for v in runs.variants if v in data):
            seeds = data[variant]
            steps = sorted({p[0] for c in seeds for p in c})
            grid = np.array([[dict((p[0], p[1]) for p in c).get(s, np.nan) for s in steps] for c in seeds])
            colour = PALETTE[i % len(PALETTE)]
            ax.plot(steps, np.nanmean(grid, 0), color=colour, label=f"{variant} (n={len(seeds)})")
            if len(seeds) > 1:
                ax.fill_between(steps, np.nanmin(grid, 0), np.nanmax(grid, 0), color=colour, alpha=0.15)
        _finish(ax, "step", curve_key, f"{runs.name}: {curve_key} (mean over seeds, band min-max)")
        written.append(_save(fig, out_dir / "curves.png", plt))
    rows = [r for r in table.rows if r.contrast is not None and r.contrast.n > 0]
    if rows:
        fig, ax = plt.subplots(figsize=(7, 0.8 + 0.45 * len(rows)), dpi=120)
        y = np.arange(len(rows))[::-1]
        d = np.array([r.contrast.estimate for r in rows])
        lo = np.array([r.contrast.ci_t[0] if math.isfinite(r.contrast.ci_t[0]) else r.contrast.estimate for r in rows])
        hi = np.array([r.contrast.ci_t[1] if math.isfinite(r.contrast.ci_t[1]) else r.contrast.estimate for r in rows])
        ax.errorbar(d, y, xerr=[d - lo, hi - d], fmt="o", color=PALETTE[0], capsize=3)
        ax.axvline(0, color="grey", ls="--", lw=1)
        ax.set_yticks(y, [forest_label(r) for r in rows], fontsize=8)
        better = "right" if table.direction == "maximize" else "left"
        pct = f"{table.analysis.confidence:.0%}"
        ax.set_xlabel(f"Δ {table.metric} vs {table.baseline} ({pct} t interval; better to the {better})")
        ax.grid(alpha=0.3, axis="x")
        written.append(_save(fig, out_dir / "differences.png", plt))
    path = _error_by_position(runs, out_dir, plt)
    if path is not None:
        written.append(path)
    return written


def error_by_position(runs: StudyRuns) -> dict[str, dict[str, list[tuple[int, float, int]]]]:
    """split -> variant -> [(target position k, mean decoded error over the variant's finished cells, cells)] of
    the ``<split>/error_at_<k>`` metrics (seq2seq tasks); empty when the runs log none."""
    cells = runs.cells[runs.cells["state"] == "finished"] if len(runs.cells) else runs.cells
    out: dict[str, dict[str, list[tuple[int, float, int]]]] = {}
    for split in sorted({c.split("/")[0] for c in cells.columns if "/error_at_" in c}):
        ks = sorted(int(c.rsplit("_", 1)[1]) for c in cells.columns if c.startswith(f"{split}/error_at_"))
        for variant in (v for v in runs.variants if v in set(cells["variant"])):
            mine = cells[cells["variant"] == variant]
            points = [
                (k, float(col.mean()), int(col.notna().sum())) for k in ks for col in [mine[f"{split}/error_at_{k}"]]
            ]
            out.setdefault(split, {})[variant] = [p for p in points if p[2] > 0]
    return out


def _error_by_position(runs: StudyRuns, out_dir: Path, plt) -> Path | None:
    """error_by_position.png: ``error_by_position`` drawn, one panel per test split. Exposure bias (Bengio et al.
    2015) shows as an error that grows along the sequence."""
    data = error_by_position(runs)
    if not data:
        return None
    fig, axes = plt.subplots(1, len(data), figsize=(5 * len(data), 3.6), dpi=120, squeeze=False)
    for ax, (split, variants) in zip(axes[0], data.items()):
        for i, (variant, points) in enumerate(variants.items()):
            ax.plot(
                [k for k, _, _ in points],
                [m for _, m, _ in points],
                "o-",
                ms=3,
                color=PALETTE[i % len(PALETTE)],
                label=variant,
            )
        title = f"{runs.name}: {split}, error by position (mean over seeds)"
        _finish(ax, "target position (1 = first token; the last: end of sequence)", "decoded error rate", title, 9)
    return _save(fig, out_dir / "error_by_position.png", plt)


def pruning_png(curves: dict[str, list[dict]], metric: str, path: Path) -> Path:
    """Michel et al.'s Figure 3 in miniature: the metric against the share of heads removed, least important first
    and in random order, one panel line pair per variant (``curves``: variant -> the rows of
    ``dashboards.pruning.compare_orders``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    for i, (variant, rows) in enumerate(curves.items()):
        colour = PALETTE[i % len(PALETTE)]
        x = [100 * r["fraction"] for r in rows]
        name = f"{variant}: " if variant else ""
        ax.plot(x, [r["importance"] for r in rows], "o-", color=colour, label=f"{name}by importance")
        ax.plot(x, [r["random"] for r in rows], "s--", color=colour, alpha=0.6, label=f"{name}random order")
    _finish(ax, "attention heads removed (%)", metric, f"pruning heads: {metric} (mean over seeds)")
    return _save(fig, path, plt)
