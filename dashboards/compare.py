"""``ablate compare A B``: which conclusions changed between two studies, or two submissions of one study
(``name@2``), for example before and after a code change. A conclusion is the verdict of a contrast, from
the same tests and corrections as the tables (dashboards/stats.py): "different (better|worse)", "equivalent
within ±m", "not resolved", "untestable" or, for a contrast outside the declared family, "not in the family".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dashboards.load import load_study
from dashboards.table import Table, build


@dataclass
class Change:
    variant: str  # the contrast's label for contrasts that are not a row ("a vs b", an effect)
    a: str
    b: str
    diff_a: float
    diff_b: float

    @property
    def changed(self) -> bool:
        return self.a != self.b


def verdict(table: Table, variant: str) -> tuple[str, float]:
    """(verdict, Δ) of a variant against the table's baseline."""
    row = next((r for r in table.rows if r.variant == variant), None)
    if row is None or row.contrast is None:
        return "absent", math.nan
    return row.contrast.verdict, row.contrast.estimate


def parse(ref: str) -> tuple[str, int | None]:
    name, _, sub = ref.partition("@")
    if sub and not sub.isdigit():
        raise ValueError(f"{ref!r}: write a study as NAME or NAME@SUBMISSION (a number)")
    return name, int(sub) if sub else None


def compare(uri: str, ref_a: str, ref_b: str, metric: str | None = None) -> tuple[Table, Table, list[Change]]:
    """Both tables (each with its own submission's analysis settings) and the verdict of every contrast they
    share: each variant against the baseline, then the other declared contrasts and effects."""
    (name_a, sub_a), (name_b, sub_b) = parse(ref_a), parse(ref_b)
    runs_a, runs_b = load_study(uri, name_a, submission=sub_a), load_study(uri, name_b, submission=sub_b)
    metric = metric or runs_a.design.get("metric")
    ta, tb = build(runs_a, metric), build(runs_b, metric)
    changes = []
    for variant in [v for v in runs_a.variants if v in set(runs_b.variants)]:
        if variant in (ta.baseline, tb.baseline):
            continue
        (va, da), (vb, db) = verdict(ta, variant), verdict(tb, variant)
        if va == "absent" or vb == "absent":
            continue
        changes.append(Change(variant, va, vb, da, db))
    rows = {f"{r.variant} vs {ta.baseline}" for r in ta.rows}
    others_b = {c.label: c for c in tb.contrasts if c.in_family}
    for c in ta.contrasts:
        if c.in_family and c.label not in rows and c.label in others_b:
            o = others_b[c.label]
            changes.append(Change(c.label, c.verdict, o.verdict, c.estimate, o.estimate))
    return ta, tb, changes


def format_changes(ref_a: str, ref_b: str, metric: str, changes: list[Change]) -> str:
    if not changes:
        return f"{ref_a} and {ref_b} share no contrast besides the baseline: nothing to compare"
    w = max(len(c.variant) for c in changes)
    wa = max(len(c.a) for c in changes) + 12
    lines = [f"{'contrast':<{w}}  {ref_a + ' (Δ ' + metric + ')':<{wa}}  {ref_b + ' (Δ)':<{wa}}  changed"]
    for c in changes:
        a, b = f"{c.a} ({c.diff_a:+.3g})", f"{c.b} ({c.diff_b:+.3g})"
        lines.append(f"{c.variant:<{w}}  {a:<{wa}}  {b:<{wa}}  {'YES' if c.changed else 'no'}")
    n = sum(c.changed for c in changes)
    lines.append(
        f"\n{n} of {len(changes)} conclusion(s) changed between {ref_a} and {ref_b} (verdicts from each table's "
        "tests after Holm's correction; 'not resolved' is not 'no difference')"
    )
    return "\n".join(lines)
