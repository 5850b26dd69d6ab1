"""A seed plan's study in the report: each contrast of its family as the look that decided it saw it (its verdict,
estimate, interval and p at that look's alpha), the path look by look, and what the plan saved. The looks themselves
are replayed by ``record.looks``, which the sweep asks which cells come next.
"""

from __future__ import annotations

import math

from dashboards.table import Table, build
from record import stats
from record.looks import Look, decided_at, path
from record.recorded import LookRecord, PlanRecord
from record.runs import StudyRuns
from record.spec.seedplan import SeedPlan


def table(runs: StudyRuns, **options) -> Table:
    """The ablation table; for a study with a seed plan, each contrast of its family as the look that decided it
    saw it (its verdict, estimate, interval and p at that look's alpha), or as the last look saw it, open."""
    full = build(runs, **options)
    plan = runs.design.plan
    if plan is None:
        return full
    if full.metric != runs.design.metric:
        return _secondary(full, plan, runs.design.metric)
    looks, _ = path(runs, plan)
    if not looks:
        full.notes.append("seed plan: no look yet (the first batch has not finished)")
        return full
    whole = {c.label: c for c in full.contrasts}
    final = {c.label: _final(c, looks, plan, whole.get(c.label)) for c in looks[-1].contrasts}
    full.decided_at = {label: at for label, (_, at) in final.items()}
    final = {label: c for label, (c, _) in final.items()}
    full.contrasts = [final.get(c.label, c) if c.in_family else c for c in full.contrasts]
    for r in full.rows:
        if r.contrast is not None and r.contrast.label in final:
            r.contrast = final[r.contrast.label]
    full.notes.append(_path_note(plan, looks, full.analysis.alpha))
    full.path = path_rows(looks)
    full.plan, full.looks = PlanRecord(**plan.as_dict()), [look_record(look) for look in looks]
    return full


def _secondary(full: Table, plan: SeedPlan, decides: str) -> Table:
    """Another metric of a planned study: the plan's looks and boundaries judged the metric it decides on, so this
    one's contrasts are the fixed-sample tests over the seeds the plan trained, said as such (replaying the looks
    here would show the decision metric's verdicts under this metric's name)."""
    full.notes.append(
        f"seed plan: its looks decide on {decides}, not on {full.metric}: each contrast here is the fixed-sample "
        "exact test over the seeds the plan trained (its seed counts followed the other metric; a secondary result)"
    )
    full.plan = PlanRecord(**plan.as_dict(), decides_on=decides)
    return full


def look_record(look: Look) -> LookRecord:
    """A look as docs/results/recompute.py replays it: the seeds each variant had, the alpha spent, the contrasts
    it left open and those the miniature cannot test (a declared rule on the values, not a p-value)."""
    untestable = [c.label for c in look.contrasts if c.verdict == "not testable here"]
    vacuous = [c.label for c in look.contrasts if c.equivalence_untestable_here]
    return LookRecord(
        seeds=look.seeds, alpha=look.alpha, open=look.open, not_testable=untestable, no_equivalence=vacuous
    )


def _final(
    c: stats.Contrast, looks: list[Look], plan: SeedPlan, full: stats.Contrast | None
) -> tuple[stats.Contrast, str]:
    """The contrast as the look that decided it saw it (else as the last look saw it, open), and that look."""
    look = decided_at(c.label, looks)
    if look is None:
        seen = next(x for x in looks[-1].contrasts if x.label == c.label)
        where = "open at the maximum" if len(looks) == len(plan.looks()) else "open"
        at = f"{where}, look {len(looks)} of {len(plan.looks())} ({seen.n} seeds of at most {plan.max})"
        if full is not None and math.isfinite(full.mde):
            at += f"; at these seeds the family's test detects |Δ| >= {full.mde:.3g}"
        return seen, at
    seen = next(x for x in look.contrasts if x.label == c.label)
    at = (
        f"decided at look {look.index + 1} of {len(plan.looks())} ({seen.n} seeds of at most {plan.max}, alpha spent "
        f"{look.alpha:.3g})"
    )
    return seen, at


def saved(plan: SeedPlan, looks: list[Look]) -> tuple[int, int]:
    """Seeds trained over every variant, and what the fixed design at ``max`` seeds per variant trains."""
    return sum(looks[-1].seeds.values()), plan.max * len(looks[-1].seeds)


def _path_note(plan: SeedPlan, looks: list[Look], alpha: float) -> str:
    spent = ", ".join(f"{a:.3g} by {n} seeds" for n, a in zip(plan.looks(), plan.cumulative(alpha)))
    trained, fixed = saved(plan, looks)
    return (
        f"seed plan ({plan.spending} spending of alpha {alpha:g}: {spent}): each contrast is tested by the "
        f"group-sequential exact sign-flip test over its looks, the family by the closed Holm test, so stopping "
        f"early keeps the family-wise error at {alpha:g}; its p and verdict are those of the look that decided it. "
        f"{trained} seeds trained of the {fixed} a fixed design at {plan.max} seeds per variant trains "
        f"({1 - trained / fixed:.0%} saved)"
    )


def path_rows(looks: list[Look]) -> list[list[str]]:
    """The path, contrast by contrast and look by look: seeds, estimate, interval, the closed Holm test's p,
    and whether it stayed open."""
    rows, shown = [], set()
    for look in looks:
        for c in look.contrasts:
            if c.label in shown:  # decided at an earlier look: its row there is final
                continue
            if c.label not in look.open:
                shown.add(c.label)
            lo, hi = c.ci_t
            ci = "–" if not (math.isfinite(lo) and math.isfinite(hi)) else f"[{lo:+.3g}, {hi:+.3g}]"
            state = "open" if c.label in look.open else c.verdict
            rows.append([str(look.index + 1), c.label, str(c.n), f"{c.estimate:+.3g}", ci, f"{c.p_holm:.3g}",
                         f"{look.alpha:.3g}", state])  # fmt: skip
    return rows


__all__ = ["look_record", "path_rows", "saved", "table"]
