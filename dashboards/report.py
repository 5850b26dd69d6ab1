"""``ablate report STUDY``: the answer to the question a study asks, with its uncertainty, in one self-contained
HTML file that leads with each verdict in words (why, and the next step), then the ablation table, factorial
effects, the figures (compressed PNG inside the page: the 4-cell quickstart's page with plotly.js inside weighed
4.9 MB and rendered blank for 15 s), the study file and links to every run; the interactive plots beside it
(plots.html), and the table as Markdown, LaTeX and CSV. Everything is logged as artifacts of the study's latest
parent run (``report/``), so the report opens inside the MLflow UI, next to the runs it summarises."""

from __future__ import annotations

import base64
import html
import json
import math
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from dashboards import export, looks
from dashboards.plots import all_figures
from dashboards.render import (
    PATH_HEAD,
    html_lead,
    mde_text,
    number_text,
    p_text,
    records_csv,
    signed_text,
    to_csv,
    to_html,
    to_latex,
    to_markdown,
    to_terminal,
    verdict_text,
)
from dashboards.table import Table
from record import stats, vocabulary
from record.runs import StudyRuns, client, load_runs
from record.secrets import redact_url

CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px auto;max-width:1200px;color:#222}
h1{font-size:1.6em;margin-bottom:0} .sub{color:#666;margin-top:4px}
table{border-collapse:collapse;font-size:0.9em;margin:12px 0} th,td{padding:4px 10px;text-align:right}
th{border-bottom:2px solid #333;border-top:2px solid #333} td:first-child,td:nth-child(2),th:first-child,
th:nth-child(2){text-align:left} tr.baseline td{border-bottom:1px solid #999} tbody tr:last-child td{border-bottom:2px solid #333}
.legend,.notes{color:#555;font-size:0.85em} ul.legend{padding-left:18px} pre{background:#f6f6f6;padding:10px;overflow-x:auto;font-size:0.85em}
.cells td{font-size:0.85em} a{color:#1f5fa8}
.warnings{background:#fff4e5;border-left:4px solid #e08a00;padding:6px 12px;margin:12px 0;font-size:0.9em}
.warnings ul{margin:4px 0;padding-left:18px}
.verdicts{background:#eef5ff;border-left:4px solid #1f5fa8;padding:6px 12px;margin:12px 0}
.verdicts ul{margin:4px 0;padding-left:18px} .verdicts li{margin:4px 0} .why,.next{color:#444;font-size:0.9em}
img{max-width:100%}
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
        return f"{redact_url(runs.uri).rstrip('/')}/{path}"
    return f"/{path}"


EFFECTS_LEGEND = (
    "Main effects: the metric at a level minus at the reference level, averaged over the other axes' combinations; "
    "interactions: the difference of differences. Each is computed within every seed from that seed's own cells "
    "and tested like a paired difference (the same exact sign-flip test, interval and power as the pairs, so the "
    "family holds tests of one kind); a seed without every cell of an effect stays out of it; failed seeds enter "
    "under the failure rule. p: Holm-corrected with the family when the effect is in it (declared in "
    "analysis.contrasts, or by default on a grid of two axes or more; otherwise '–': not in the family, no verdict). "
    "Where analysis.margins gives the metric a margin, 'TOST' beside it is the equivalence test's p (two one-sided "
    "tests against ±margin, Holm-corrected over the contrasts with a margin): what an 'equivalent' verdict rests on."
)


def _effect_cells(t: Table, c: stats.Contrast) -> list[str]:
    lo, hi = c.ci_t
    ci = "–" if not (math.isfinite(lo) and math.isfinite(hi)) else f"[{lo:+.3g}, {hi:+.3g}]"
    factor, _, levels = c.label.partition(": ")
    return [factor, levels, signed_text(c.estimate), ci, p_text(c), verdict_text(c), mde_text(c), str(c.n), c.note]


EFFECT_HEAD = ["factor", "levels", "effect", "CI", "p (Holm)", "verdict", "detectable Δ", "seeds", "note"]


def effects_html(t: Table) -> str:
    if not t.effects:
        return ""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in EFFECT_HEAD)
    rows = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in _effect_cells(t, e)) + "</tr>" for e in t.effects
    )
    return (
        f"<h2>Factorial effects on {html.escape(t.metric)}</h2><p class='legend'>{html.escape(EFFECTS_LEGEND)}</p>"
        f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"
    )


def effects_markdown(t: Table) -> str:
    head = f"Effects on {t.metric}\n\n| " + " | ".join(EFFECT_HEAD) + " |\n|---|---|" + "---:|" * 6 + "---|\n"
    body = "".join("| " + " | ".join(c.replace("|", "\\|") for c in _effect_cells(t, e)) + " |\n" for e in t.effects)
    return head + body + "\n" + EFFECTS_LEGEND + "\n"


PAIRING_LEGEND = (
    "What pairing by seed bought: r is the correlation between the two variants' values across the seeds both "
    "have (the same seed gives both the same initialisation draw and data order, and the same data when the study "
    "varies its data by seed); sd of Δ is the spread of the paired differences, sd unpaired the spread the "
    "difference would have had from independent runs (sqrt(var a + var b)). Their ratio: 0.2 means pairing "
    "removed four fifths of the noise; near or above 1, pairing bought nothing."
)


def pairing_rows(t: Table) -> list[list[str]]:
    rows = []
    for c in t.contrasts:
        if c.kind != "pair" or not (c.in_family or c.b == t.baseline):
            continue
        ratio = c.sd / c.sd_unpaired if c.sd_unpaired and math.isfinite(c.sd) and c.sd_unpaired > 0 else math.nan
        r = "–" if not math.isfinite(c.correlation) else f"{c.correlation:+.2f}"
        rows.append([c.label, str(c.n), r, number_text(c.sd, 3), number_text(c.sd_unpaired, 3), number_text(ratio, 2)])
    return rows


PAIRING_HEAD = ["contrast", "seeds", "r", "sd of Δ", "sd unpaired", "ratio"]


def pairing_html(t: Table) -> str:
    rows = pairing_rows(t)
    if not rows:
        return ""
    head = "".join(f"<th>{h}</th>" for h in PAIRING_HEAD)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(x)}</td>" for x in r) + "</tr>" for r in rows)
    return (
        f"<h2>Pairing</h2><p class='legend'>{html.escape(PAIRING_LEGEND)}</p>"
        f"<table class='pairing'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
    )


def plan_html(t: Table) -> str:
    """A seed plan's path: each contrast at each look (``dashboards.looks``)."""
    rows = t.path
    if not rows:
        return ""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in PATH_HEAD)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(x)}</td>" for x in r) + "</tr>" for r in rows)
    legend = (
        "Each look tests the declared family on the seeds the plan had given each variant: each contrast by the "
        "group-sequential exact sign-flip test over the looks it has had (alpha spent by the spending function), "
        "the family by the closed Holm test at the study's alpha; a contrast decided at a look gets no more seeds."
    )
    return f"<h2>Seed plan</h2><p class='legend'>{legend}</p><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def seeds_html(t: Table) -> str:
    """How many seeds a stated difference needs, per declared contrast (analysis.detect)."""
    if not t.detect:
        return (
            "<h2>Seeds needed</h2><p class='legend'>Declare the difference that matters in the study file "
            f"(analysis: {{detect: {{{html.escape(t.metric)}: 0.01}}}}) to see how many seeds each contrast "
            "needs to detect it.</p>"
        )
    rows = [
        [c.label, str(c.n), number_text(c.sd, 3), "–" if c.seeds_needed is None else str(c.seeds_needed)]
        for c in t.contrasts
        if c.kind == "pair" and (c.in_family or c.b == t.baseline)
    ]
    a = t.analysis
    body = "".join("<tr>" + "".join(f"<td>{html.escape(x)}</td>" for x in r) + "</tr>" for r in rows)
    return (
        f"<h2>Seeds needed</h2><p class='legend'>Seeds each contrast needs to detect Δ = {number_text(t.detect, 3)} "
        f"with {a.power:.0%} power at Holm's strictest level {a.alpha:g}/{max(1, len(t.family))}, from the spread of "
        "its paired differences here (statsmodels TTestPower; at least the seeds at which the "
        f"{html.escape(stats.TESTS[a.test])} can reach that level).</p><table><thead><tr><th>contrast</th>"
        f"<th>seeds now</th><th>sd of Δ</th><th>seeds needed</th></tr></thead><tbody>{body}</tbody></table>"
    )


def analysis_html(t: Table) -> str:
    import yaml

    text = yaml.safe_dump({"analysis": t.analysis.model_dump(mode="json")}, sort_keys=False)
    return f"<h2>Analysis</h2><p class='legend'>The settings these statistics used (docs/statistics.md).</p><pre>{html.escape(text)}</pre>"


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


FIGURE_TITLES = {
    "curves": "Learning curves",
    "differences": "Differences from the baseline",
    "error_by_position": "Decoded error by target position",
}


def figures_html(pngs: list[Path]) -> str:
    """The static figures inside the page (PNG as data URIs: one file that renders at once, offline)."""
    parts = []
    for path in pngs:
        data = base64.b64encode(path.read_bytes()).decode("ascii")
        title = html.escape(FIGURE_TITLES.get(path.stem, path.stem))
        parts.append(f"<h3>{title}</h3><img alt='{title}' src='data:image/png;base64,{data}'>")
    return "".join(parts) or "<p>No metric histories to plot.</p>"


def interactive_html(runs: StudyRuns, table: Table) -> str:
    """The interactive plots (plotly, self-contained: plotly.js inside), as a page of their own."""
    parts, first = [], True
    for title, fig in all_figures(runs, table):
        chart = fig.to_html(full_html=False, include_plotlyjs=first, config={"displaylogo": False})
        parts.append(f"<h3>{html.escape(title)}</h3>{chart}")
        first = False
    body = "".join(parts) or "<p>No metric histories to plot.</p>"
    return f"""<!DOCTYPE html><html><head><meta charset="utf-8"><title>{html.escape(runs.name)}: plots</title>
<style>{CSS}</style></head><body><h1>{html.escape(runs.name)}: interactive plots</h1>{body}</body></html>"""


def render_html(runs: StudyRuns, table: Table, study_text: str, description: str, pngs: list[Path] = ()) -> str:
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
generated {stamp} from {html.escape(redact_url(runs.uri))}.</p>
{html_lead(table)}
<h2>Ablation table</h2>
{to_html(table, links, lead=False)}
{effects_html(table)}
{plan_html(table)}
{pairing_html(table)}
{seeds_html(table)}
{analysis_html(table)}
<h2>Plots</h2>
<p class="legend">Interactive versions (zoom, hover): plots.html, beside this file among the run's artifacts.</p>
{figures_html(list(pngs))}
{cells_html(runs, table.metric)}
<h2>Study file</h2><pre>{html.escape(study_text or "(not recorded)")}</pre>
</body></html>"""


def _study_text(runs: StudyRuns) -> str:
    parent = runs.latest_parent
    if parent is None:
        return ""
    with tempfile.TemporaryDirectory(prefix="ablate-") as tmp:  # MLflow's own default folder is never removed
        try:
            return Path(client(runs.uri).download_artifacts(parent.info.run_id, "study.yaml", tmp)).read_text()
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
    runs = load_runs(uri, study, submission=submission)
    table = looks.table(runs, metric=metric, baseline=baseline)
    parent = runs.latest_parent
    description = parent.data.tags.get(vocabulary.TAG_NOTE, "") if parent is not None else ""
    out_dir = Path(out_dir or Path(".ablate") / "reports" / study)
    out_dir.mkdir(parents=True, exist_ok=True)
    from dashboards.static import save_pngs

    pngs = save_pngs(runs, table, out_dir)  # the same figures as PNG, for papers and Markdown, and in the page
    page = render_html(runs, table, _study_text(runs), description, pngs)
    files = {
        "html": out_dir / "report.html",
        "plots": out_dir / "plots.html",
        "markdown": out_dir / "table.md",
        "latex": out_dir / "table.tex",
        "csv": out_dir / "table.csv",
        "json": out_dir / "table.json",
        "contrasts": out_dir / "contrasts.csv",
    }
    files["html"].write_text(page)
    files["plots"].write_text(interactive_html(runs, table))
    files["markdown"].write_text(to_markdown(table))
    files["latex"].write_text(to_latex(table))
    files["csv"].write_text(to_csv(table))
    files["json"].write_text(json.dumps(table.as_records(), indent=1, default=str))
    files["contrasts"].write_text(records_csv(table.contrast_records()))
    files.update(export.write(table, out_dir))  # every seed's value, and what it was analysed under
    if table.effects:
        files["effects"] = out_dir / "effects.md"
        files["effects"].write_text(effects_markdown(table))
    else:  # an earlier report's, in a reused folder
        (out_dir / "effects.md").unlink(missing_ok=True)
    for path in pngs:
        files[path.stem] = path
    parent_id = None
    if log and parent is not None:
        parent_id = parent.info.run_id
        c = client(uri)
        for path in files.values():
            c.log_artifact(parent_id, str(path), "report")
    return Report(table, runs, page, files, parent_id)


__all__ = ["Report", "make_report", "to_terminal"]
