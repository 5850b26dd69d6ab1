"""``ablate report STUDY``: the answer to the question a study asks, with its uncertainty, in one self-contained
HTML file (interactive plots, the ablation table, factorial effects, the study file, links to every run),
plus the table as Markdown, LaTeX and CSV. Everything is logged as artifacts of the study's latest parent
run (``report/``), so the report opens inside the MLflow UI, next to the runs it summarises."""

from __future__ import annotations

import html
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

from dashboards import stats
from dashboards.load import StudyRuns, client, load_study
from dashboards.plots import all_figures
from dashboards.table import Table, build, to_csv, to_html, to_latex, to_markdown, to_terminal

CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px auto;max-width:1200px;color:#222}
h1{font-size:1.6em;margin-bottom:0} .sub{color:#666;margin-top:4px}
table{border-collapse:collapse;font-size:0.9em;margin:12px 0} th,td{padding:4px 10px;text-align:right}
th{border-bottom:2px solid #333;border-top:2px solid #333} td:first-child,td:nth-child(2),th:first-child,
th:nth-child(2){text-align:left} tr.baseline td{border-bottom:1px solid #999} tbody tr:last-child td{border-bottom:2px solid #333}
.legend,.notes{color:#555;font-size:0.85em} pre{background:#f6f6f6;padding:10px;overflow-x:auto;font-size:0.85em}
.cells td{font-size:0.85em} a{color:#1f5fa8}
"""


@dataclass
class Report:
    table: Table
    runs: StudyRuns
    html: str
    files: dict[str, Path]  # kind -> path written
    parent_run_id: str | None


def run_link(runs: StudyRuns, run_id: str) -> str:
    """The run's page in the MLflow UI: absolute on a server, relative to the UI's origin otherwise."""
    path = f"#/experiments/{runs.experiment_id}/runs/{run_id}"
    if runs.uri.startswith(("http://", "https://")):
        return f"{runs.uri.rstrip('/')}/{path}"
    return f"/{path}"


def factorial_effects(runs: StudyRuns, metric: str) -> list[stats.Effect]:
    """Main effects and two-way interactions of a full factorial design (grid studies with 2+ axes)."""
    axes = [a for a in runs.design.get("axes", []) if f"axis.{a}" in runs.cells.columns]
    if runs.design.get("kind") != "grid" or len(axes) < 1:
        return []
    df = runs.cells[runs.cells["state"] == "finished"].rename(columns={f"axis.{a}": a for a in axes})
    if metric not in df.columns or not len(df):
        return []
    effects = stats.main_effects(df, axes, metric)
    if len(axes) > 1:
        effects += stats.interactions(df, axes, metric)
    return effects


EFFECTS_LEGEND = (
    "Main effects: the mean of the metric at a level minus at the reference level, averaged over the other "
    "axes, per seed; interactions: the difference of differences. Means over seeds with 95% Student-t intervals."
)


def _effect_cells(e: stats.Effect) -> list[str]:
    lo, hi = e.ci_t
    ci = "–" if not (math.isfinite(lo) and math.isfinite(hi)) else f"[{lo:+.3g}, {hi:+.3g}]"
    return [e.factor, f"{e.level} vs {e.reference}", f"{e.estimate:+.4g}", ci, str(e.n)]


def effects_html(effects: list[stats.Effect], metric: str) -> str:
    if not effects:
        return ""
    rows = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in _effect_cells(e)) + "</tr>" for e in effects)
    return (
        f"<h2>Factorial effects</h2><p class='legend'>{EFFECTS_LEGEND}</p><table><thead><tr><th>factor</th>"
        f"<th>levels</th><th>effect on {html.escape(metric)}</th><th>95% CI</th><th>seeds</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>"
    )


def effects_markdown(effects: list[stats.Effect], metric: str) -> str:
    head = f"| factor | levels | effect on {metric} | 95% CI | seeds |\n|---|---|---:|---:|---:|\n"
    body = "".join("| " + " | ".join(c.replace("|", "\\|") for c in _effect_cells(e)) + " |\n" for e in effects)
    return head + body + "\n" + EFFECTS_LEGEND + "\n"


def cells_html(runs: StudyRuns, metric: str) -> str:
    rows = []
    df = runs.cells.sort_values(["variant", "seed"], key=lambda c: c.map(str))
    for _, r in df.iterrows():
        value = r.get(metric, math.nan)
        shown = f"{value:.4g}" if isinstance(value, float) and math.isfinite(value) else "–"
        rows.append(
            f"<tr><td>{html.escape(str(r['variant']))}</td><td>{r['seed']}</td><td>{html.escape(r['state'])}</td>"
            f"<td>{shown}</td><td>{r['attempts']}</td><td><a target='_top' href='{html.escape(run_link(runs, r['run_id']))}'>"
            f"{r['run_id'][:8]}</a></td><td style='text-align:left'>{html.escape(str(r['detail'])[:120])}</td></tr>"
        )
    return (
        "<h2>Cells</h2><table class='cells'><thead><tr><th>variant</th><th>seed</th><th>state</th>"
        f"<th>{html.escape(metric)}</th><th>attempts</th><th>run</th><th>detail</th></tr></thead><tbody>"
        + "".join(rows)
        + "</tbody></table>"
    )


def render_html(runs: StudyRuns, table: Table, study_text: str, description: str, effects: list[stats.Effect]) -> str:
    figs = all_figures(runs, table)
    parts, first = [], True
    for title, fig in figs:
        parts.append(
            f"<h3>{html.escape(title)}</h3>"
            + fig.to_html(full_html=False, include_plotlyjs=first, config={"displaylogo": False})
        )
        first = False
    links = {}
    for variant in runs.variants:
        sub = runs.cells[runs.cells["variant"] == variant]
        if len(sub):
            links[variant] = run_link(runs, sub.iloc[0]["run_id"])
    stamp = time.strftime("%Y-%m-%d %H:%M", time.localtime())
    n_sub = len(runs.parents)
    return f"""<!DOCTYPE html><html><head><meta charset="utf-8"><title>{html.escape(runs.name)}: ablation report</title>
<style>{CSS}</style></head><body>
<h1>{html.escape(runs.name)}</h1>
<p class="sub">{html.escape(description)}</p>
<p class="sub">{len(runs.cells)} cells over {n_sub} submission(s); metric {html.escape(table.metric)}
({"higher" if table.direction == "maximize" else "lower"} is better); baseline {html.escape(table.baseline)};
generated {stamp} from {html.escape(runs.uri)}.</p>
<h2>Ablation table</h2>
{to_html(table, links)}
{effects_html(effects, table.metric)}
<h2>Plots</h2>
{"".join(parts) or "<p>No metric histories to plot.</p>"}
{cells_html(runs, table.metric)}
<h2>Study file</h2><pre>{html.escape(study_text or "(not recorded)")}</pre>
</body></html>"""


def _study_text(runs: StudyRuns) -> str:
    parent = runs.latest_parent
    if parent is None:
        return ""
    try:
        return Path(client(runs.uri).download_artifacts(parent.info.run_id, "study.yaml")).read_text()
    except Exception:
        return ""


def make_report(
    uri: str,
    study: str,
    *,
    metric: str | None = None,
    baseline: str | None = None,
    submission: int | None = None,
    out_dir: Path | None = None,
    log: bool = True,
) -> Report:
    """Build the table and the report, write them to ``out_dir`` and log them to the latest parent run."""
    runs = load_study(uri, study, submission=submission)
    table = build(runs, metric, baseline=baseline)
    parent = runs.latest_parent
    description = parent.data.tags.get("mlflow.note.content", "") if parent is not None else ""
    effects = factorial_effects(runs, table.metric)
    page = render_html(runs, table, _study_text(runs), description, effects)
    out_dir = Path(out_dir or Path(".ablate") / "reports" / study)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {
        "html": out_dir / "report.html",
        "markdown": out_dir / "table.md",
        "latex": out_dir / "table.tex",
        "csv": out_dir / "table.csv",
        "json": out_dir / "table.json",
    }
    files["html"].write_text(page)
    files["markdown"].write_text(to_markdown(table))
    files["latex"].write_text(to_latex(table))
    files["csv"].write_text(to_csv(table))
    files["json"].write_text(json.dumps(table.as_records(), indent=1, default=str))
    if effects:
        files["effects"] = out_dir / "effects.md"
        files["effects"].write_text(effects_markdown(effects, table.metric))
    else:  # an earlier report's, in a reused folder
        (out_dir / "effects.md").unlink(missing_ok=True)
    from dashboards.static import save_pngs

    for path in save_pngs(runs, table, out_dir):  # the same figures as PNG, for papers and Markdown
        files[path.stem] = path
    parent_id = None
    if log and parent is not None:
        parent_id = parent.info.run_id
        c = client(uri)
        for path in files.values():
            c.log_artifact(parent_id, str(path), "report")
    return Report(table, runs, page, files, parent_id)


__all__ = ["Report", "make_report", "to_terminal"]
