"""``ablate compare A B``: which conclusions changed between two studies, or two submissions of one study
(``name@2``), for example before and after a code change. A conclusion is the verdict of a contrast, from
the same tests and corrections as the tables (record/stats/): "different (better|worse)", "equivalent
within ±m", "not resolved", "untestable" or, for a contrast outside the declared family, "not in the family". A
conclusion comes with the warnings of either table that concern it (dashboards/caveats.py): a variant near
chance or not converged, parameter counts that differ, intervals from too few seeds, a family its seeds cannot
resolve.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from dashboards.table import Table, build
from record.runs import load_runs


@dataclass
class Change:
    variant: str  # the contrast's label for contrasts that are not a row ("a vs b", an effect)
    a: str
    b: str
    diff_a: float
    diff_b: float
    warnings: list[str] = field(default_factory=list)  # "<ref>[ and <ref>]: <warning>", from either table

    @property
    def changed(self) -> bool:
        return self.a != self.b

    @property
    def how(self) -> str:
        """What the change means, never more than the tests say: a decided contrast that the other table leaves
        unresolved is not refuted by it (a longer budget that cannot resolve what a shorter one decided says
        nothing against it); only opposite decisions reverse."""
        if not self.changed:
            return "no"
        decided = lambda v: v.startswith(("different", "equivalent"))  # noqa: E731
        difference = lambda v: v.split(";")[0].split(",")[0]  # noqa: E731  ("different (worse), equivalent ...")
        if {difference(self.a), difference(self.b)} == {"different (better)", "different (worse)"}:
            return "REVERSED"
        if decided(self.a) and not decided(self.b):
            return "not resolved in the second (no refutation)"
        if decided(self.b) and not decided(self.a):
            return "resolved in the second"
        return "YES"


def verdict_of(table: Table, variant: str) -> tuple[str, float]:
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
    runs_a, runs_b = load_runs(uri, name_a, submission=sub_a), load_runs(uri, name_b, submission=sub_b)
    metric = metric or runs_a.design.metric
    ta = build(runs_a, metric)
    # each variant against the same baseline in both: a study whose first variant differs asked "y vs x" where
    # the other asked "y vs base", and the two were set side by side as one contrast that "changed"
    tb = build(runs_b, metric, baseline=ta.baseline if ta.baseline in runs_b.variants else None)

    def warned(label_a: str, label_b: str) -> list[str]:
        mine = {c.text: [ref_a] for c in ta.caveats if c.concerns(label_a)}
        for c in tb.caveats:
            if c.concerns(label_b):
                mine.setdefault(c.text, []).append(ref_b)
        return [f"{' and '.join(refs)}: {text}" for text, refs in mine.items()]

    changes = []
    for variant in [v for v in runs_a.variants if v in set(runs_b.variants)]:
        if variant in (ta.baseline, tb.baseline) or ta.baseline != tb.baseline:
            continue
        (va, da), (vb, db) = verdict_of(ta, variant), verdict_of(tb, variant)
        if va == "absent" or vb == "absent":
            continue
        changes.append(
            Change(variant, va, vb, da, db, warned(f"{variant} vs {ta.baseline}", f"{variant} vs {tb.baseline}"))
        )
    rows = {f"{r.variant} vs {ta.baseline}" for r in ta.rows}
    others_b = {c.label: c for c in tb.contrasts if c.in_family}
    for c in ta.contrasts:
        if c.in_family and c.label not in rows and c.label in others_b:
            o = others_b[c.label]
            changes.append(Change(c.label, c.verdict, o.verdict, c.estimate, o.estimate, warned(c.label, c.label)))
    return ta, tb, changes


def format_changes(ref_a: str, ref_b: str, metric: str, changes: list[Change]) -> str:
    if not changes:
        return f"{ref_a} and {ref_b} share no contrast besides the baseline: nothing to compare"
    warnings = list(dict.fromkeys(x for c in changes for x in c.warnings))
    head = ("contrast", f"{ref_a} (Δ {metric})", f"{ref_b} (Δ)", "changed", "")
    rows = [
        (c.variant, f"{c.a} ({c.diff_a:+.3g})", f"{c.b} ({c.diff_b:+.3g})", c.how,
         "".join(f"[{i}]" for i in sorted(warnings.index(x) + 1 for x in c.warnings)))
        for c in changes
    ]  # fmt: skip
    widths = [max(len(r[i]) for r in (head, *rows)) for i in range(4)]  # every column as wide as its widest
    lines = ["  ".join(f"{v:<{w}}" for v, w in zip(r, [*widths, 0])).rstrip() for r in (head, *rows)]
    n = sum(c.changed for c in changes)
    lines.append(
        f"\n{n} of {len(changes)} conclusion(s) changed between {ref_a} and {ref_b} (verdicts from each table's "
        "tests after Holm's correction; 'not resolved' is not 'no difference', and a verdict one table decided "
        "and the other leaves unresolved is not refuted by it: only REVERSED is opposite decisions)"
    )
    if warnings:
        lines.append("\nWarnings ([n] after a contrast: the warnings that concern it):")
        lines += [f"  [{i}] {x}" for i, x in enumerate(warnings, 1)]
    return "\n".join(lines)
