"""The ablation table, as in the papers: the baseline row, then each variant with what it changed, its metric
over seeds with a 95% interval, its difference from the baseline (paired by seed) with Holm-corrected
significance marks, failure and divergence counts, and cost. The best mean is in bold.

Rendered for the terminal, Markdown, LaTeX (booktabs), CSV and HTML from one ``Table``.
"""

from __future__ import annotations

import csv
import html
import io
import math
from dataclasses import dataclass, field
from typing import Any

from dashboards import stats
from dashboards.load import StudyRuns

COSTS = [
    ("cost/n_params", "params"),
    ("cost/tokens_per_s", "tokens/s"),
    ("cost/wall_time_s", "wall s"),
    ("cost/peak_memory_mb", "peak MB"),
]


@dataclass
class VariantRow:
    variant: str
    changed: str
    summary: stats.Summary
    paired: stats.Paired | None  # None for the baseline
    rates: stats.Rates
    costs: dict[str, float]
    best: bool = False
    tuned: str = ""  # a tuned study: the parameters this variant's own search chose ("lr=0.0042")

    @property
    def marks(self) -> str:
        p = self.paired.p_holm if self.paired is not None else math.nan
        if not math.isfinite(p):
            return ""
        return "***" if p < 0.001 else "**" if p < 0.01 else "*" if p < 0.05 else ""


@dataclass
class Table:
    study: str
    metric: str
    direction: str
    baseline: str
    rows: list[VariantRow]
    notes: list[str] = field(default_factory=list)

    @property
    def tuned(self) -> bool:
        return any(r.tuned for r in self.rows)

    @property
    def value_column(self) -> int:
        """Where the metric's column is: after variant, changed (and tuned)."""
        return 3 if self.tuned else 2

    def as_records(self) -> list[dict[str, Any]]:
        """One flat dict per variant (CSV, JSON, and what the tests read)."""
        out = []
        for r in self.rows:
            s, p = r.summary, r.paired
            rec = {
                "variant": r.variant,
                "changed": r.changed,
                **({"tuned": r.tuned} if self.tuned else {}),
                "n": s.n,
                "mean": s.mean,
                "std": s.std,
                "ci_low": s.ci_t[0],
                "ci_high": s.ci_t[1],
                "boot_low": s.ci_boot[0],
                "boot_high": s.ci_boot[1],
                "diff": p.mean_diff if p else math.nan,
                "diff_low": p.ci_t[0] if p else math.nan,
                "diff_high": p.ci_t[1] if p else math.nan,
                "n_paired": p.n if p else 0,
                "p_t": p.p_t if p else math.nan,
                "p_wilcoxon": p.p_wilcoxon if p else math.nan,
                "p_holm": p.p_holm if p else math.nan,
                "effect_size": p.effect_size if p else math.nan,
                "marks": r.marks,
                "cells": r.rates.n,
                "finished": r.rates.finished,
                "diverged": r.rates.diverged,
                "failed": r.rates.failed,
                "best": r.best,
            }
            rec.update({label: r.costs.get(key, math.nan) for key, label in COSTS})
            out.append(rec)
        return out


TUNED = "tuned:"  # the prefix of what a tuned study's search chose, in a variant's settings


def _short(key: str) -> str:
    return key.removeprefix(TUNED).split(".", 1)[-1]


def _changed(design: dict[str, Any], variant: str, baseline: str) -> str:
    settings = {v["name"]: v.get("settings", {}) for v in design.get("variants", [])}
    mine, base = settings.get(variant), settings.get(baseline, {})
    if variant == baseline:
        return "(baseline)"
    if mine is None:
        return "?"
    diff = {k: v for k, v in mine.items() if base.get(k) != v and not k.startswith(TUNED)}
    return ", ".join(f"{_short(k)}={v}" for k, v in diff.items()) or "-"


def _tuned(design: dict[str, Any], variant: str) -> str:
    settings = next((v.get("settings", {}) for v in design.get("variants", []) if v["name"] == variant), {})
    return ", ".join(f"{_short(k)}={_value(str(v))}" for k, v in settings.items() if k.startswith(TUNED))


def _value(v: str) -> str:
    """A tuned float to 3 significant digits; integers and names as they are."""
    if v.lstrip("-").isdigit():
        return v
    try:
        return f"{float(v):.3g}"
    except ValueError:
        return v


LOWER_IS_BETTER = ("loss", "perplexity", "bits", "wall_time", "step_time", "memory", "n_params", "flops_per_token")


def metric_direction(metric: str) -> str:
    """The direction of a metric other than the study's: losses, perplexities and costs go down."""
    return "minimize" if any(word in metric for word in LOWER_IS_BETTER) else "maximize"


def build(runs: StudyRuns, metric: str | None = None, *, baseline: str | None = None, n_boot: int = 10_000) -> Table:
    """The ablation table of a study's cells (see the module docstring)."""
    direction = runs.design.get("direction", "minimize")
    if metric and metric != runs.design.get("metric"):
        direction = metric_direction(metric)
    metric = metric or runs.design.get("metric", "final/val_loss")
    cells = runs.cells
    notes = []
    if metric not in cells.columns:
        raise stats_error(runs, metric)
    baseline = baseline or runs.baseline
    if baseline not in runs.variants:
        raise ValueError(
            f"baseline {baseline!r} is not a variant of {runs.name!r}; variants: {', '.join(runs.variants)}"
        )

    def values(variant: str) -> dict[int, float]:
        sub = cells[(cells["variant"] == variant) & cells["state"].isin(["finished"])]
        return {int(s): float(v) for s, v in zip(sub["seed"], sub[metric]) if v == v}

    base_values = values(baseline)
    rows, comparisons = [], {}
    for variant in runs.variants:
        sub = cells[cells["variant"] == variant]
        if not len(sub):
            continue
        vals = values(variant)
        finished = sub[sub["state"] == "finished"]
        missing = int(finished[metric].isna().sum()) if len(finished) else 0
        if missing:
            notes.append(f"{variant}: {missing} finished run(s) without {metric}")
        costs = {key: float(finished[key].mean()) for key, _ in COSTS if key in finished.columns and len(finished)}
        paired = None
        if variant != baseline:
            paired = stats.paired(base_values, vals, n_boot=n_boot)
            comparisons[variant] = paired
        rows.append(
            VariantRow(
                variant,
                _changed(runs.design, variant, baseline),
                stats.describe(vals.values(), n_boot=n_boot),
                paired,
                stats.rates(sub["state"]),
                costs,
                tuned=_tuned(runs.design, variant),
            )
        )
    for variant, p in stats.holm_adjust(comparisons).items():
        next(r for r in rows if r.variant == variant).paired = p
    means = [r.summary.mean for r in rows if r.summary.n and math.isfinite(r.summary.mean)]
    if means:
        best = max(means) if direction == "maximize" else min(means)
        for r in rows:
            r.best = r.summary.n > 0 and r.summary.mean == best
    for r in rows:
        if r.summary.n == 1:
            notes.append(f"{r.variant}: one seed only, no interval")
        elif r.summary.n == 0:
            notes.append(f"{r.variant}: no finished run with {metric}")
    return Table(runs.name, metric, direction, baseline, rows, notes)


def stats_error(runs: StudyRuns, metric: str) -> ValueError:
    known = sorted(c for c in runs.cells.columns if "/" in c and not c.startswith(("train/", "axis.")))
    return ValueError(f"no run of {runs.name!r} has the metric {metric!r}; metrics there: {', '.join(known[:30])}")


# --- formatting ------------------------------------------------------------------------------------------


def _num(x: float, digits: int = 4) -> str:
    if x is None or not math.isfinite(x):
        return "–"
    if x != 0 and (abs(x) >= 1e5 or abs(x) < 1e-3):
        return f"{x:.2e}"
    return f"{x:.{digits}g}"


def _pm(s: stats.Summary) -> str:
    if s.n == 0:
        return "–"
    if s.n < 2:
        return f"{_num(s.mean)} (n=1)"
    return f"{_num(s.mean)} ± {_num((s.ci_t[1] - s.ci_t[0]) / 2, 2)}"


def _diff(p: stats.Paired | None) -> str:
    if p is None:
        return ""
    if p.n == 0:
        return "–"
    if p.n < 2:
        return f"{p.mean_diff:+.3g} (n=1)"
    return f"{p.mean_diff:+.3g} [{p.ci_t[0]:+.3g}, {p.ci_t[1]:+.3g}]"


def _p(p: stats.Paired | None) -> str:
    return "" if p is None or not math.isfinite(p.p_holm) else f"{p.p_holm:.3g}"


def header(t: Table) -> list[str]:
    arrow = "↑" if t.direction == "maximize" else "↓"
    return [
        "variant",
        "changed",
        *(["tuned"] if t.tuned else []),
        f"{t.metric} {arrow} (mean ± 95% CI)",
        "Δ vs baseline [95% CI]",
        "p (Holm)",
        "n",
        "diverged",
        "failed",
        *[label for _, label in COSTS],
    ]


def cells_text(t: Table, r: VariantRow) -> list[str]:
    return [
        r.variant,
        r.changed,
        *([r.tuned] if t.tuned else []),
        _pm(r.summary),
        _diff(r.paired) + (f" {r.marks}" if r.marks else ""),
        _p(r.paired),
        f"{r.rates.finished}/{r.rates.n}",
        str(r.rates.diverged),
        str(r.rates.failed),
        *[_cost(key, r.costs.get(key, math.nan)) for key, _ in COSTS],
    ]


def _cost(key: str, x: float) -> str:
    if not math.isfinite(x):
        return "–"
    if key in ("cost/n_params", "cost/tokens_per_s"):
        return f"{x:,.0f}"
    return _num(x, 3)


def legend(t: Table) -> str:
    return (
        f"Mean over seeds with the 95% Student-t interval; Δ = variant − baseline ({t.baseline}) over the seeds "
        "both have, paired t-test p-values Holm-corrected across variants (* < 0.05, ** < 0.01, *** < 0.001); "
        f"n = finished cells / cells; best mean in bold ({'higher' if t.direction == 'maximize' else 'lower'} "
        "is better)."
    )


def to_terminal(t: Table) -> str:
    head = header(t)
    body = [cells_text(t, r) for r in t.rows]
    k = t.value_column
    body = [[c + (" *best*" if i == k and r.best else "") for i, c in enumerate(row)] for row, r in zip(body, t.rows)]
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    line = lambda cells: "  ".join(c.ljust(w) if i < k else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))  # noqa: E731
    out = [line(head), "  ".join("-" * w for w in widths), *[line(b) for b in body]]
    return "\n".join(out + ["", legend(t), *t.notes])


def to_markdown(t: Table) -> str:
    head = header(t)
    k = t.value_column
    out = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] * k + ["---:"] * (len(head) - k)) + "|"]
    for r in t.rows:
        c = cells_text(t, r)
        if r.best:
            c[t.value_column] = f"**{c[t.value_column]}**"
        out.append("| " + " | ".join(x.replace("|", "\\|") for x in c) + " |")
    return "\n".join(out + ["", legend(t)] + [f"- {n}" for n in t.notes]) + "\n"


def _tex(s: str) -> str:
    for a, b in (
        ("\\", r"\textbackslash{}"),
        ("&", r"\&"),
        ("%", r"\%"),
        ("$", r"\$"),
        ("#", r"\#"),
        ("_", r"\_"),
        ("{", r"\{"),
        ("}", r"\}"),
        ("±", r"$\pm$"),
        ("Δ", r"$\Delta$"),
        ("↑", r"$\uparrow$"),
        ("↓", r"$\downarrow$"),
        ("–", "--"),
        ("−", "-"),
    ):
        s = s.replace(a, b)
    return s


def to_latex(t: Table) -> str:
    head = header(t)
    out = [
        r"\begin{table}[t]",
        r"\centering",
        r"\small",
        r"\begin{tabular}{" + "l" * t.value_column + "r" * (len(head) - t.value_column) + "}",
        r"\toprule",
        " & ".join(_tex(h) for h in head) + r" \\",
        r"\midrule",
    ]
    for i, r in enumerate(t.rows):
        c = [_tex(x) for x in cells_text(t, r)]
        if r.best:
            c[t.value_column] = r"\textbf{" + c[t.value_column] + "}"
        out.append(" & ".join(c) + r" \\")
        if i == 0 and r.variant == t.baseline:
            out.append(r"\midrule")
    out += [
        r"\bottomrule",
        r"\end{tabular}",
        r"\caption{" + _tex(f"{t.study}: " + legend(t)) + "}",
        r"\label{tab:" + t.study.replace("_", "-") + "}",
        r"\end{table}",
    ]
    return "\n".join(out) + "\n"


def to_csv(t: Table) -> str:
    records = t.as_records()
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(records[0]) if records else ["variant"])
    w.writeheader()
    w.writerows(records)
    return buf.getvalue()


def to_html(t: Table, links: dict[str, str] | None = None) -> str:
    """A <table> (the report embeds it); ``links``: variant -> URL of its runs in MLflow."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header(t))
    rows = []
    for r in t.rows:
        c = [html.escape(x) for x in cells_text(t, r)]
        if links and r.variant in links:
            c[0] = f'<a href="{html.escape(links[r.variant])}">{c[0]}</a>'
        if r.best:
            c[t.value_column] = f"<b>{c[t.value_column]}</b>"
        cls = ' class="baseline"' if r.variant == t.baseline else ""
        rows.append(f"<tr{cls}>" + "".join(f"<td>{x}</td>" for x in c) + "</tr>")
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in t.notes)
    return (
        f'<table class="ablation"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'
        f'<p class="legend">{html.escape(legend(t))}</p>' + (f"<ul class='notes'>{notes}</ul>" if notes else "")
    )


RENDERERS = {"terminal": to_terminal, "markdown": to_markdown, "latex": to_latex, "csv": to_csv, "html": to_html}
