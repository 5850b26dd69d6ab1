"""Plots of a study (plotly figures, interactive in the HTML report): learning curves per variant (mean and
band over seeds, by step and by wall time), a forest plot of the differences from the baseline with their
intervals, and quality against cost with the Pareto front."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dashboards.table import COSTS, Table
from record.runs import StudyRuns
from record.spec.metrics import better

PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22"]


def _rgba(hex_colour: str, alpha: float) -> str:
    r, g, b = (int(hex_colour[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


def curves(runs: StudyRuns, key: str) -> dict[str, list[list[tuple[int, float, float]]]]:
    """variant -> one curve per finished or diverged seed: [(step, value, seconds)]."""
    cells = runs.cells
    done = cells[cells["state"].isin(["finished", "diverged"])]
    history = runs.history(key, list(done["run_id"]))
    out: dict[str, list] = {}
    for variant, run_id in zip(done["variant"], done["run_id"]):
        if history.get(run_id):
            out.setdefault(variant, []).append(history[run_id])
    return out


def learning_curves(runs: StudyRuns, key: str = "val/loss", by: str = "step"):
    """Mean over seeds with a band (min to max) per variant, against steps or wall-clock seconds."""
    import plotly.graph_objects as go

    fig = go.Figure()
    data = curves(runs, key)
    for i, variant in enumerate(v for v in runs.variants if v in data):
        colour = PALETTE[i % len(PALETTE)]
        seeds = data[variant]
        if by == "step":
            steps = sorted({p[0] for c in seeds for p in c})
            grid = np.array([[dict((p[0], p[1]) for p in c).get(s, np.nan) for s in steps] for c in seeds])
            x = steps
        else:  # interpolate every seed onto a common time axis, up to the shortest seed's end
            end = min(c[-1][2] for c in seeds)
            x = list(np.linspace(0, end, 50)) if end > 0 else [0.0]
            grid = np.array([np.interp(x, [p[2] for p in c], [p[1] for p in c]) for c in seeds])
        with np.errstate(all="ignore"):
            mean, lo, hi = np.nanmean(grid, 0), np.nanmin(grid, 0), np.nanmax(grid, 0)
        if len(seeds) > 1:
            fig.add_trace(
                go.Scatter(
                    x=list(x) + list(x)[::-1],
                    y=list(hi) + list(lo)[::-1],
                    fill="toself",
                    fillcolor=_rgba(colour, 0.15),
                    line={"width": 0},
                    hoverinfo="skip",
                    showlegend=False,
                    legendgroup=variant,
                )
            )
        fig.add_trace(
            go.Scatter(
                x=x,
                y=mean,
                mode="lines",
                name=f"{variant} (n={len(seeds)})",
                line={"color": colour},
                legendgroup=variant,
            )
        )
    fig.update_layout(
        title=f"{key} by {'step' if by == 'step' else 'wall-clock seconds'} (mean over seeds, band: min to max)",
        xaxis_title="step" if by == "step" else "seconds",
        yaxis_title=key,
        template="plotly_white",
        height=420,
    )
    return fig


def forest(table: Table):
    """Each variant's difference from the baseline with its t interval (paired over seeds, failed seeds under the
    failure rule); a difference without spread has no interval and says so in its label."""
    import plotly.graph_objects as go

    rows = [r for r in table.rows if r.contrast is not None and r.contrast.n > 0]
    names = [forest_label(r) for r in rows]
    diffs = [r.contrast.estimate for r in rows]
    lo = [r.contrast.estimate - r.contrast.ci_t[0] if math.isfinite(r.contrast.ci_t[0]) else 0 for r in rows]
    hi = [r.contrast.ci_t[1] - r.contrast.estimate if math.isfinite(r.contrast.ci_t[1]) else 0 for r in rows]
    fig = go.Figure(
        go.Scatter(
            x=diffs,
            y=names,
            mode="markers",
            marker={"size": 10, "color": PALETTE[0]},
            error_x={"type": "data", "symmetric": False, "array": hi, "arrayminus": lo},
            hovertemplate="%{y}: %{x:.4g}<extra></extra>",
        )
    )
    fig.add_vline(x=0, line_dash="dash", line_color="grey")
    better = "right" if table.direction == "maximize" else "left"
    fig.update_layout(
        title=f"Δ {table.metric} against {table.baseline} ({table.analysis.confidence:.0%} CI; better to the {better})",
        xaxis_title=f"Δ {table.metric}",
        template="plotly_white",
        height=160 + 40 * max(1, len(rows)),
        yaxis={"autorange": "reversed"},
    )
    return fig


def forest_label(r) -> str:
    """A row's label in the forest plots: the variant, its marks, and why it has no interval bar."""
    c = r.contrast
    why = " (n=1)" if c.n == 1 else " (no spread)" if not c.spread else ""
    return f"{r.variant} {r.marks}".strip() + why


def pareto_front(points: list[tuple[float, float]], maximize_quality: bool, cost_lower_is_better: bool) -> list[int]:
    """Indices of the points no other point beats on both quality and cost."""

    def better_or_equal(a, b) -> bool:
        q = a[0] >= b[0] if maximize_quality else a[0] <= b[0]
        c = a[1] <= b[1] if cost_lower_is_better else a[1] >= b[1]
        return q and c

    front = []
    for i, p in enumerate(points):
        if not any(j != i and better_or_equal(q, p) and q != p for j, q in enumerate(points)):
            front.append(i)
    return front


def quality_vs_cost(table: Table, cost: str = "cost/wall_time_s"):
    import plotly.graph_objects as go

    label = dict(COSTS).get(cost, cost)
    rows = [r for r in table.rows if r.summary.n and math.isfinite(r.costs.get(cost, math.nan))]
    pts = [(r.summary.mean, r.costs[cost]) for r in rows]
    lower_is_better = better(cost) != "maximize"
    front = sorted(pareto_front(pts, table.direction == "maximize", lower_is_better), key=lambda i: pts[i][1])
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=[p[1] for p in pts],
            y=[p[0] for p in pts],
            mode="markers+text",
            text=[r.variant for r in rows],
            textposition="top center",
            name="variants",
            marker={"size": 10, "color": [PALETTE[1] if i in front else PALETTE[0] for i in range(len(rows))]},
        )
    )
    if len(front) > 1:
        fig.add_trace(
            go.Scatter(
                x=[pts[i][1] for i in front],
                y=[pts[i][0] for i in front],
                mode="lines",
                name="Pareto front",
                line={"dash": "dot", "color": PALETTE[1]},
            )
        )
    fig.update_layout(
        title=f"{table.metric} against {label} (red: the Pareto front)",
        xaxis_title=label,
        yaxis_title=table.metric,
        template="plotly_white",
        height=420,
    )
    return fig


def all_figures(runs: StudyRuns, table: Table, curve_keys: list[str] | None = None) -> list[tuple[str, Any]]:
    """(title, figure) for the report; curves only for metrics the runs have."""
    figs: list[tuple[str, Any]] = []
    have = set(runs.cells.columns)
    keys = curve_keys or [k for k in ("val/loss", "train/loss") if k in have or k.startswith("val/")]
    for key in keys:
        for by in ("step", "time"):
            fig = learning_curves(runs, key, by)
            if fig.data:
                figs.append((f"{key} by {by}", fig))
    if any(r.contrast is not None for r in table.rows):
        figs.append(("differences", forest(table)))
    for cost in ("cost/wall_time_s", "cost/n_params"):
        if any(math.isfinite(r.costs.get(cost, math.nan)) for r in table.rows):
            figs.append((f"quality against {dict(COSTS)[cost]}", quality_vs_cost(table, cost)))
    return figs
