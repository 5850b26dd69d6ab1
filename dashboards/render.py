"""The ablation table rendered for the terminal, Markdown, LaTeX (booktabs), CSV and HTML from one ``Table``
(dashboards/table.py builds it): the same numbers in each, after the verdicts that lead every rendering
(dashboards/verdicts.py). docs/statistics.md explains every number."""

from __future__ import annotations

import csv
import html
import io
import math
from typing import Any

from dashboards import verdicts
from dashboards.table import COSTS, FAILED_MARK, Table, VariantRow
from record import stats

# --- formatting ------------------------------------------------------------------------------------------


PATH_HEAD = ["look", "contrast", "seeds", "Δ", "t CI", "sequential p (Holm)", "alpha spent", "state"]
SEQUENTIAL_P = (
    "a seed plan's family: the closed Holm test over each contrast's group-sequential exact sign-flip test, the p "
    "shown the smallest of alpha x (0.01, 0.02, 0.05, ... 20) down to which it rejects; see the seed plan note"
)


def number_text(x: float, digits: int = 4) -> str:
    if x is None or not math.isfinite(x):
        return "–"
    if x != 0 and (abs(x) >= 1e5 or abs(x) < 1e-3):
        return f"{x:.2e}"
    return f"{x:.{digits}g}"


def signed_text(x: float) -> str:
    return "–" if not math.isfinite(x) else f"{x:+.3g}"


def _pm(r: VariantRow) -> str:
    s = r.summary
    mark = FAILED_MARK if r.failed_any else ""
    if s.n == 0:
        return "–" + mark
    if s.n < 2:
        return f"{number_text(s.mean)}{mark} (n=1)"
    if not s.spread:
        return f"{number_text(s.mean)}{mark} (no spread, n={s.n})"
    return f"{number_text(s.mean)}{mark} ± {number_text((s.ci_t[1] - s.ci_t[0]) / 2, 2)}"


def success_text(o: stats.Successes, c: stats.Contrast | None = None) -> str:
    if o.cells == 0:
        return "–"
    lo, hi = o.ci
    text = f"{o.successes}/{o.cells} [{lo:.2g}, {hi:.2g}]"
    if c is not None and c.in_family and math.isfinite(c.p_rate_holm) and c.p_rate < 1:
        text += f" (p {c.p_rate_holm:.2g})"
    return text


UNSHARED_MARK = "‡"  # a t interval that excludes 0 beside an exact test that does not resolve the contrast


def diff_text(c: stats.Contrast | None) -> str:
    if c is None:
        return ""
    if c.n == 0:
        return "– (no paired seed)"
    if c.all_imputed:  # its spread is the other side's alone: an interval would look measured
        return f"{signed_text(c.estimate)} (imputed: every seed of {c.all_imputed} failed; no interval)"
    imputed = f" ({c.imputed} of {c.n} imputed)" if c.imputed else ""
    if c.n < 2:
        return f"{signed_text(c.estimate)} (n=1){imputed}"
    if not c.spread:
        return f"{signed_text(c.estimate)} (same in all {c.n} seeds){imputed}"
    if not math.isfinite(c.ci_t[0]):
        return signed_text(c.estimate) + imputed
    lo, hi = c.ci_t
    mark = UNSHARED_MARK if unshared(c) else ""
    return f"{signed_text(c.estimate)} [{signed_text(lo)}, {signed_text(hi)}]{mark}{imputed}"


def unshared(c: stats.Contrast) -> bool:
    """The t interval excludes 0 while the verdict's exact test does not resolve the contrast: the interval is
    not the test's, and says more than the seeds can."""
    lo, hi = c.ci_t
    exact = not c.method.startswith("paired t")
    return exact and c.verdict == "not resolved" and math.isfinite(lo) and (lo > 0 or hi < 0)


def p_text(c: stats.Contrast | None) -> str:
    if c is None:
        return ""
    if not c.in_family and not c.exploratory:
        return "–"
    if not c.testable:
        return "1 (untestable)"
    text = number_text(c.p_holm, 3)
    if math.isfinite(c.p_tost_holm):  # the evidence an "equivalent" rests on, beside the difference test's
        text += f"; TOST {number_text(c.p_tost_holm, 3)}"
    return text


def verdict_text(c: stats.Contrast | None) -> str:
    """The verdict, marked where the contrast is exploratory (outside the confirmatory family)."""
    if c is None:
        return ""
    return f"exploratory: {c.verdict}" if c.exploratory else c.verdict


def mde_text(c: stats.Contrast | None) -> str:
    if c is None:
        return ""
    if c.mde == math.inf:
        return f"none (n={c.n})"
    return number_text(c.mde, 2)


def header(t: Table) -> list[str]:
    arrow = "↑" if t.direction == "maximize" else "↓"
    pct = f"{t.analysis.confidence:.0%}"
    needs = [f"seeds for Δ {number_text(t.detect, 3)}"] if t.detect else []
    learned = ["not learned"] if t.analysis.never_learned else []
    return [
        "variant",
        "changed",
        *(["tuned"] if t.tuned else []),
        f"success [{pct} CI]",
        f"{t.metric} {arrow} (mean ± {pct} CI)",
        f"Δ vs baseline [{pct} t CI]",
        "p (Holm)",
        "verdict",
        "detectable Δ",
        *needs,
        "diverged",
        "failed",
        *learned,
        *[label for _, label in COSTS],
    ]


def cells_text(t: Table, r: VariantRow) -> list[str]:
    c = r.contrast
    needs = [("" if c is None else str(c.seeds_needed) if c.seeds_needed is not None else "–")] if t.detect else []
    learned = [str(r.outcomes.not_learned)] if t.analysis.never_learned else []
    return [
        r.variant,
        r.changed,
        *([r.tuned] if t.tuned else []),
        success_text(r.outcomes, c),
        _pm(r),
        diff_text(c) + (f" {r.marks}" if r.marks else ""),
        p_text(c),
        verdict_text(c),
        mde_text(c),
        *needs,
        str(r.outcomes.diverged),
        str(r.outcomes.failed),
        *learned,
        *[_cost(key, r.costs.get(key, math.nan)) for key, _ in COSTS],
    ]


def _cost(key: str, x: float) -> str:
    if not math.isfinite(x):
        return "–"
    if key in ("cost/n_params", "cost/tokens_per_s"):
        return f"{x:,.0f}"
    return number_text(x, 3)


def family_text(t: Table) -> str:
    """The family's size and what is in it (declared, or the default: each variant against the baseline, or a
    grid's main effects and interactions)."""
    parts = []
    pairs = [c for c in t.family if c.kind == "pair"]
    every = {c.a for c in pairs} == {r.variant for r in t.rows} - {t.baseline} and all(c.b == t.baseline for c in pairs)
    if pairs:
        parts.append("each variant against the baseline" if every else f"{len(pairs)} declared pair(s)")
    for kind, word in (("main", "main effect(s)"), ("interaction", "interaction(s)")):
        k = sum(c.kind == kind for c in t.family)
        if k:
            parts.append(f"{k} {word}")
    default = " (the default)" if t.analysis.contrasts is None and t.family else ""
    return f"{len(t.family)} contrast(s): {', '.join(parts) or 'nothing declared'}{default}"


def smallest_p_text(t: Table) -> str:
    ns = sorted({c.n for c in t.family if c.n > 0})
    if not ns:
        return ""
    if t.analysis.test == "t":
        return "the t-test can reach any p from 2 seeds; its normality cannot be checked on so few"
    shown = ", ".join(f"{stats.min_p(n):.3g} with {n} seed{'s' if n != 1 else ''}" for n in ns[:4])
    return f"smallest attainable p: {shown} (2/2^n)"


def legend(t: Table) -> list[str]:
    """The caption, sentence by sentence (joined with spaces for LaTeX and HTML, one per line elsewhere)."""
    a = t.analysis
    pct = f"{a.confidence:.0%}"
    better = "higher" if t.direction == "maximize" else "lower"
    test = stats.TESTS[a.test]
    lines = [
        f"success = cells that finished{' and learned' if a.never_learned else ''} out of cells, with the exact "
        f"{pct} Clopper-Pearson interval (p: Fisher's exact test against the baseline, Holm-corrected over the "
        "family, shown where below 1).",
        f"Mean over the successful seeds ± the half-width of the {pct} Student-t interval; {FAILED_MARK}: some seeds "
        "failed and the mean is over the successes only (see success).",
        f"Δ = variant − baseline ({t.baseline}) over the seeds both have; failure rule: "
        f"{a.describe_rule(t.metric, t.worst if math.isfinite(t.worst) else None)}; "
        f"{pct} t interval, which assumes normal differences (the exact test does not, so at few seeds an "
        f"interval can exclude 0 while the test cannot resolve it: {UNSHARED_MARK} marks such an interval, which is "
        'not the verdict\'s); "same in all n seeds": no spread, no interval; "k of n imputed": seeds whose value '
        "was imputed for a failure under the rule; where every seed of a side was imputed, no interval is shown "
        "(its spread would be the other side's alone).",
        f"p: {test}, two-sided, Holm-corrected over the family of {family_text(t)}"
        + (f" ({SEQUENTIAL_P})" if any("group-sequential" in c.method for c in t.family) else "")
        + (f"; {smallest_p_text(t)}" if smallest_p_text(t) else "")
        + "; after Δ, where the verdict is different: * ≤ 0.05, ** ≤ 0.01, *** ≤ 0.001"
        + (
            "; TOST: the two one-sided tests of equivalence within the margin, Holm-corrected over the contrasts "
            "with a margin (equivalent where it is at most alpha)."
            if t.margin is not None
            else "."
        ),
        f"verdict at alpha {a.alpha:g}: different (better / worse), "
        + (f"equivalent within {t.margin} (TOST, Holm), " if t.margin is not None else "")
        + "not resolved (neither), untestable (no paired seed; p = 1 in the family), not testable here (the "
        "miniature leaves no room for the expected effect, or a variant has not converged by the declared "
        "criterion: the test still runs and counts in the family; see Verdicts)"
        + ("" if t.margin is not None else f"; declare analysis.margins.{t.metric} to test equivalence")
        + ".",
        *(
            [
                f"{stats.NO_EQUIVALENCE} (after a verdict): the margin reaches past the metric's end from the "
                "comparator's value, so one of the two one-sided tests cannot fail and no equivalence is claimed."
            ]
            if any(c.equivalence_untestable_here for c in t.family)
            else []
        ),
        f"detectable Δ: the smallest difference these seeds detect with {a.power:.0%} power at Holm's strictest "
        f"level {a.alpha:g}/{max(1, len(t.family))}, from the observed paired spread (none: the test cannot reach "
        "that level with these seeds)"
        + (f"; seeds for Δ {number_text(t.detect, 3)}: the seeds that difference needs." if t.detect else "."),
        best_text(t, better),
        f"BCa bootstrap intervals (CSV, JSON) under-cover below {stats.BOOT_UNDER_COVERS_BELOW} seeds.",
    ]
    return lines


def best_text(t: Table, better: str) -> str:
    """Who is bold and why, or why nobody is: "best" needs the family's tests, not the largest mean."""
    b = t.ranking
    if b.variant is not None:
        return (
            f"{b.variant} in bold: the best mean ({better} is better, failed seeds counted under the rule), and "
            f"different (better) from every other variant by the family's tests (Holm, alpha {t.analysis.alpha:g})."
        )
    if b.leader is None:
        return "No variant is marked best: nothing to rank."
    why = {
        "no test of the pair in the family": "no test of that pair is in the family; declare it in "
        "analysis.contrasts.pairs to test it",
        "the same mean": "the same mean",
    }.get(b.why, f"verdict: {b.why}")
    return (
        f"No variant is established as best, so none is bold: the best mean ({better} is better, failed seeds "
        f"counted under the rule), {b.leader}'s, is not shown better than {b.against} ({why})."
    )


def contrasts_rows(t: Table, contrasts: list[stats.Contrast]) -> tuple[list[str], list[list[str]]]:
    pct = f"{t.analysis.confidence:.0%}"
    head = ["contrast", "Δ", f"{pct} CI", "test", "p (Holm)", "verdict", "detectable Δ", "seeds"]
    body = []
    for c in contrasts:
        ci = diff_text(c)
        body.append(
            [
                c.label,
                signed_text(c.estimate),
                ci.split(" ", 1)[1] if " " in ci else "–",
                c.method,
                p_text(c),
                verdict_text(c),
                mde_text(c),
                str(c.n),
            ]
        )
    return head, body


def lead(t: Table) -> list[str]:
    """The verdicts first (``dashboards/verdicts.py``): each contrast's verdict in words, why, the next step; then
    the registration they were judged under."""
    lines = verdicts.lead_lines(t)
    registered = registration_lines(t)
    return (["Verdicts:", *lines, ""] if lines else []) + ([*registered, ""] if registered else [])


def registration_lines(t: Table) -> list[str]:
    """When the study's declaration was registered, and every amendment with its reason (``ablations.register``)."""
    if not t.registrations:
        return []
    first, out = t.registrations[0], []
    seen = sum(first.finished.values())
    when = "after results existed: " + f"{seen} cell(s) had finished" if seen else "before any result"
    sha, _, changes = first.git_commit.partition("+")  # "+changes": the file differed from its commit
    commit = f", study file at commit {sha[:12]}" if sha else ""
    commit += " with uncommitted changes (the registered declaration is not that commit's file)" if changes else ""
    out.append(f"Registered {_when(first.created)}, {when} (declaration {first.hash}{commit}).")
    for r in t.registrations[1:]:
        seen = sum(r.finished.values())
        out.append(f"Amendment {r.version}, {_when(r.created)}: {r.reason} (changed {', '.join(r.changed)}; "
                   f"{seen} cell(s) had results by then).")  # fmt: skip
    if not all(r.verified for r in t.registrations):
        out.append("WARNING: a registration record no longer has its hash: it was edited, and is not trusted.")
    return out


def _when(seconds: float) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def to_terminal(t: Table) -> str:
    head = header(t)
    body = [cells_text(t, r) for r in t.rows]
    k = t.value_column
    body = [[c + (" *best*" if i == k and r.best else "") for i, c in enumerate(row)] for row, r in zip(body, t.rows)]
    out = _aligned(head, body, k)
    if t.extra:
        h, b = contrasts_rows(t, t.extra)
        out += ["", "Declared contrasts:", *_aligned(h, b, 1)]
    warned = ["", *(f"WARNING: {w}" for w in t.warnings)] if t.warnings else []
    return "\n".join(lead(t) + out + warned + ["", *legend(t), *t.notes])


def _aligned(head: list[str], body: list[list[str]], k: int) -> list[str]:
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    line = lambda cells: "  ".join(c.ljust(w) if i < k else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))  # noqa: E731
    return [line(head), "  ".join("-" * w for w in widths), *[line(b) for b in body]]


def _md_table(head: list[str], body: list[list[str]], k: int) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] * k + ["---:"] * (len(head) - k)) + "|"]
    return out + ["| " + " | ".join(x.replace("|", "\\|") for x in row) + " |" for row in body]


def to_markdown(t: Table) -> str:
    body = []
    for r in t.rows:
        c = cells_text(t, r)
        if r.best:
            c[t.value_column] = f"**{c[t.value_column]}**"
        body.append(c)
    out = _md_table(header(t), body, t.value_column)
    if t.extra:
        out += ["", "Declared contrasts:", "", *_md_table(*contrasts_rows(t, t.extra), 1)]
    if t.path:
        out += ["", "Seed plan, look by look:", "", *_md_table(PATH_HEAD, t.path, 1)]
    warned = [f"- **warning**: {w}" for w in t.warnings]
    body = out + [""] + warned + [f"- {x}" for x in legend(t)] + [f"- note: {n}" for n in t.notes]
    return "\n".join(markdown_lead(t) + body) + "\n"


def markdown_lead(t: Table) -> list[str]:
    out = []
    for r in verdicts.readings(t):
        out.append(f"- **{r.sentence}**")
        out += [f"  - {word}: {text}" for word, text in r.notes]
    registered = [f"- {line}" for line in registration_lines(t)]
    return (["**Verdicts**", "", *out, ""] if out else []) + (
        ["**Registration**", "", *registered, ""] if registered else []
    )


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
        ("^", r"\^{}"),
        ("±", r"$\pm$"),
        ("Δ", r"$\Delta$"),
        ("↑", r"$\uparrow$"),
        ("↓", r"$\downarrow$"),
        ("≤", r"$\leq$"),
        ("†", r"$^\dagger$"),
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
    if t.extra:
        h, b = contrasts_rows(t, t.extra)
        out += [r"\midrule", r"\multicolumn{" + str(len(head)) + r"}{l}{Declared contrasts} \\"]
        for row in b:
            cells = [_tex(x) for x in row[:2]] + [_tex(row[2]), _tex(row[4]), _tex(row[5])]
            out.append(" & ".join(cells + [""] * (len(head) - len(cells))) + r" \\")
    out += [
        r"\bottomrule",
        r"\end{tabular}",
        r"\caption{"
        + _tex(f"{t.study}. Verdicts: " + " ".join(r.sentence + "." for r in verdicts.readings(t)) + " ")
        + _tex(" ".join(registration_lines(t)) + " ")
        + _tex(" ".join(legend(t)))
        + "".join(r" \textbf{Warning:} " + _tex(w) + "." for w in t.warnings)
        + "".join(r" \textit{Note:} " + _tex(n) + "." for n in t.notes)  # as every other rendering has them
        + "}",
        r"\label{tab:" + t.study.replace("_", "-") + "}",
        r"\end{table}",
    ]
    return "\n".join(out) + "\n"


def to_csv(t: Table) -> str:
    return records_csv(t.as_records())


def records_csv(records: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(records[0]) if records else ["variant"])
    w.writeheader()
    w.writerows(records)
    return buf.getvalue()


def to_html(t: Table, links: dict[str, str] | None = None, *, lead: bool = True) -> str:
    """A <table> (the report embeds it), after the verdicts unless ``lead`` is false; ``links``: variant -> URL of
    its runs in MLflow."""
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
    extra = ""
    if t.extra:
        h, b = contrasts_rows(t, t.extra)
        extra = (
            "<h3>Declared contrasts</h3><table class='contrasts'><thead><tr>"
            + "".join(f"<th>{html.escape(x)}</th>" for x in h)
            + "</tr></thead><tbody>"
            + "".join("<tr>" + "".join(f"<td>{html.escape(x)}</td>" for x in row) + "</tr>" for row in b)
            + "</tbody></table>"
        )
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in t.notes)
    caption = "".join(f"<li>{html.escape(x)}</li>" for x in legend(t))
    warned = "".join(f"<li>{html.escape(w)}</li>" for w in t.warnings)
    return (
        (html_lead(t) if lead else "")
        + (f'<div class="warnings"><b>Read with care:</b><ul>{warned}</ul></div>' if warned else "")
        + f'<table class="ablation"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>{extra}'
        f'<ul class="legend">{caption}</ul>' + (f"<ul class='notes'>{notes}</ul>" if notes else "")
    )


def html_lead(t: Table) -> str:
    items = []
    for r in verdicts.readings(t):
        more = "".join(f"<br><span class='{word}'>{word}: {html.escape(text)}</span>" for word, text in r.notes)
        items.append(f"<li><b>{html.escape(r.sentence)}</b>{more}</li>")
    registered = "".join(f"<li>{html.escape(line)}</li>" for line in registration_lines(t))
    return (f'<div class="verdicts"><h3>Verdicts</h3><ul>{"".join(items)}</ul></div>' if items else "") + (
        f'<div class="registration"><h3>Registration</h3><ul>{registered}</ul></div>' if registered else ""
    )


RENDERERS = {"terminal": to_terminal, "markdown": to_markdown, "latex": to_latex, "csv": to_csv, "html": to_html}
