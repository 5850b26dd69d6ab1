"""``ablate compare A B``: which conclusions changed between two studies, or two submissions of one study
(``name@2``), for example before and after a code change. A conclusion is the verdict on a variant against
the baseline: better, worse (significant after Holm's correction) or no significant difference."""

from __future__ import annotations

import math
from dataclasses import dataclass

from dashboards.load import load_study
from dashboards.table import Table, build


@dataclass
class Change:
    variant: str
    a: str
    b: str
    diff_a: float
    diff_b: float

    @property
    def changed(self) -> bool:
        return self.a != self.b


def verdict(table: Table, variant: str, alpha: float = 0.05) -> tuple[str, float]:
    row = next((r for r in table.rows if r.variant == variant), None)
    if row is None or row.paired is None or row.paired.n < 2 or not math.isfinite(row.paired.p_holm):
        return "not enough seeds", math.nan if row is None or row.paired is None else row.paired.mean_diff
    d, p = row.paired.mean_diff, row.paired.p_holm
    if p >= alpha:
        return "no significant difference", d
    good = d > 0 if table.direction == "maximize" else d < 0
    return ("better" if good else "worse") + " than the baseline", d


def parse(ref: str) -> tuple[str, int | None]:
    name, _, sub = ref.partition("@")
    if sub and not sub.isdigit():
        raise ValueError(f"{ref!r}: write a study as NAME or NAME@SUBMISSION (a number)")
    return name, int(sub) if sub else None


def compare(uri: str, ref_a: str, ref_b: str, metric: str | None = None) -> tuple[Table, Table, list[Change]]:
    (name_a, sub_a), (name_b, sub_b) = parse(ref_a), parse(ref_b)
    runs_a, runs_b = load_study(uri, name_a, submission=sub_a), load_study(uri, name_b, submission=sub_b)
    metric = metric or runs_a.design.get("metric")
    ta, tb = build(runs_a, metric), build(runs_b, metric)
    changes = []
    for variant in [v for v in runs_a.variants if v in set(runs_b.variants)]:
        if variant in (ta.baseline, tb.baseline):
            continue
        (va, da), (vb, db) = verdict(ta, variant), verdict(tb, variant)
        changes.append(Change(variant, va, vb, da, db))
    return ta, tb, changes


def format_changes(ref_a: str, ref_b: str, metric: str, changes: list[Change]) -> str:
    if not changes:
        return f"{ref_a} and {ref_b} share no variant besides the baseline: nothing to compare"
    w = max(len(c.variant) for c in changes)
    wa = max(len(c.a) for c in changes) + 12
    lines = [f"{'variant':<{w}}  {ref_a + ' (Δ ' + metric + ')':<{wa}}  {ref_b + ' (Δ)':<{wa}}  changed"]
    for c in changes:
        a, b = f"{c.a} ({c.diff_a:+.3g})", f"{c.b} ({c.diff_b:+.3g})"
        lines.append(f"{c.variant:<{w}}  {a:<{wa}}  {b:<{wa}}  {'YES' if c.changed else 'no'}")
    n = sum(c.changed for c in changes)
    lines.append(f"\n{n} of {len(changes)} conclusion(s) changed between {ref_a} and {ref_b}")
    return "\n".join(lines)
