"""Decisive studies: a seed plan's looks, replayed from the store (record/spec/seedplan.py).

At look k every variant has the seeds the plan gave it so far (``first``, then ``batch`` more for each look at which
one of its contrasts was open). Each declared contrast is tested by the group-sequential exact sign-flip test over
the looks it has had (``stats.sequential``: whether its per-seed differences crossed the boundaries that spend a
level over the looks), and the closed Holm test over the family decides at the study's alpha; equivalence is the two
one-sided tests in the same sequential form. A contrast is decided when it comes out different or equivalent
(or the miniature cannot test it); the others stay open, and their variants get the next batch. Replaying the
looks from what the store holds gives the same decisions every time, so a submission killed between batches
resumes at the same look, and a decision is never re-opened (the registration records the plan; changing it is
an amendment).

The sweep asks ``wanted`` which cells to train next (``ablate.running`` composes the two); the report shows the path
(``path_rows``) and each contrast's verdict at the look that decided it (``table``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from dashboards.load import StudyRuns, load_runs
from dashboards.table import Table, build
from record import stats
from record.spec.analysis import Analysis
from record.spec.seedplan import SeedPlan
from record.stats import plans

DECIDED = ("different", "equivalent", "not testable here")
QUICK_BOOT = 199  # the looks' BCa intervals are not what decides: fewer resamples


@dataclass
class Look:
    """One look of a plan: the seeds each variant had, the alpha it tested at, the family's contrasts then, and
    which of them it left open."""

    index: int
    seeds: dict[str, int]
    alpha: float
    contrasts: list[stats.Contrast]
    open: list[str] = field(default_factory=list)  # labels
    sizes: dict[str, tuple[int, ...]] = field(default_factory=dict)  # per contrast: its paired seeds at its looks

    def open_variants(self, variants: list[str]) -> set[str]:
        out: set[str] = set()
        for c in self.contrasts:
            if c.label in self.open:
                out |= {c.a, c.b} if c.kind == "pair" else set(variants)
        return out


def plan_of(runs: StudyRuns) -> SeedPlan | None:
    return runs.design.plan


def path(runs: StudyRuns, plan: SeedPlan, analysis: Analysis | None = None) -> tuple[list[Look], dict[str, int]]:
    """The looks the store's results allow, in order, and the seeds each variant needs for the next one (equal to
    the last look's when the plan has ended)."""
    analysis = analysis or runs.design.analysis
    variants = list(runs.variants)
    upto = dict.fromkeys(variants, plan.first)
    looks, spent = plan.looks(), plan.cumulative(analysis.alpha)
    done: list[Look] = []
    for k in range(len(looks)):
        if not _complete(runs, upto):
            break
        look = _judge(runs, [*(x.seeds for x in done), upto], plan, analysis, done[-1] if done else None)
        look.alpha = spent[k]
        done.append(look)
        if not look.open or k == len(looks) - 1:
            break
        upto = {v: (looks[k + 1] if v in look.open_variants(variants) else n) for v, n in upto.items()}
    return done, upto


def ended(plan: SeedPlan, looks: list[Look]) -> bool:
    """No contrast open, or the last look taken."""
    return bool(looks) and (not looks[-1].open or len(looks) == len(plan.looks()))


def wanted(
    uri: str, study: str, variants: list[str], plan: SeedPlan, analysis: Analysis
) -> tuple[set[tuple[str, int]], bool]:
    """What the sweep trains next: (variant, seed) of every cell the plan needs now, and whether the plan has ended.
    Before any result: every variant's first batch."""
    try:
        runs = load_runs(uri, study)
    except LookupError:  # no cell yet
        return {(v, s) for v in variants for s in range(plan.first)}, False
    looks, upto = path(runs, plan, analysis)
    upto = {**dict.fromkeys(variants, plan.first), **upto}
    return {(v, s) for v, n in upto.items() for s in range(n)}, ended(plan, looks)


def _complete(runs: StudyRuns, upto: dict[str, int]) -> bool:
    """Every cell the look needs has an outcome (not running, not trained only by other code)."""
    cells = runs.cells
    for v, n in upto.items():
        states = dict(zip(cells.loc[cells["variant"] == v, "seed"], cells.loc[cells["variant"] == v, "state"]))
        if any(states.get(s) in (None, "running", "killed", "other code") for s in range(n)):
            return False
    return True


def _judge(
    runs: StudyRuns, history: list[dict[str, int]], plan: SeedPlan, analysis: Analysis, before: Look | None
) -> Look:
    """The family at a look: each contrast on the seeds the plan gave its variants, tested over the looks it has
    had; a contrast decided at an earlier look as that look saw it (its seeds frozen); the closed test at alpha."""
    upto = history[-1]
    cells = runs.cells
    keep = [s < upto.get(v, 0) for v, s in zip(cells["variant"], cells["seed"])]
    seen = dataclasses.replace(runs, cells=cells[keep].reset_index(drop=True))
    table = build(seen, analysis=analysis, curves=False, n_boot=QUICK_BOOT)
    frozen = {c.label: c for c in before.contrasts if c.label not in before.open} if before else {}
    sizes = {label: before.sizes[label] for label in frozen} if before else {}
    family = []
    for c in table.family:
        c = frozen.get(c.label) or _in_seed_order(c)
        sizes.setdefault(c.label, _sizes(c, history, list(runs.variants)))
        family.append(c)
    family = plans.decided(family, sizes, plan, analysis.alpha, table.direction)
    still = [c.label for c in family if c.label not in frozen and not c.verdict.startswith(DECIDED)]
    return Look(len(history) - 1, dict(upto), analysis.alpha, family, still, sizes)


def _in_seed_order(c: stats.Contrast) -> stats.Contrast:
    order = sorted(range(len(c.seeds)), key=lambda i: c.seeds[i])
    return dataclasses.replace(
        c, seeds=tuple(c.seeds[i] for i in order), differences=tuple(c.differences[i] for i in order)
    )


def _sizes(c: stats.Contrast, history: list[dict[str, int]], variants: list[str]) -> tuple[int, ...]:
    """The contrast's paired seeds at each look it has had (the seeds its variants had then; repeats dropped)."""
    involved = [c.a, c.b] if c.kind == "pair" else variants
    if not c.testable:
        return ()
    return tuple(sorted({sum(s < min(upto.get(v, 0) for v in involved) for s in c.seeds) for upto in history} - {0}))


def table(runs: StudyRuns, **options) -> Table:
    """The ablation table; for a study with a seed plan, each contrast of its family as the look that decided it
    saw it (its verdict, estimate, interval and p at that look's alpha), or as the last look saw it, open."""
    full = build(runs, **options)
    plan = plan_of(runs)
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
    full.contrasts = [final.get(c.label, c) if c.in_family else c for c in full.contrasts]
    for r in full.rows:
        if r.contrast is not None and r.contrast.label in final:
            r.contrast = final[r.contrast.label]
    full.notes.append(_path_note(plan, looks, full.analysis.alpha))
    full.path = path_rows(looks)
    full.plan, full.looks = plan.as_dict(), [look_record(look) for look in looks]
    return full


def _secondary(full: Table, plan: SeedPlan, decides: str) -> Table:
    """Another metric of a planned study: the plan's looks and boundaries judged the metric it decides on, so this
    one's contrasts are the fixed-sample tests over the seeds the plan trained, said as such (replaying the looks
    here would show the decision metric's verdicts under this metric's name)."""
    full.notes.append(
        f"seed plan: its looks decide on {decides}, not on {full.metric}: each contrast here is the fixed-sample "
        "exact test over the seeds the plan trained (its seed counts followed the other metric; a secondary result)"
    )
    full.plan = {**plan.as_dict(), "decides_on": decides}
    return full


def look_record(look: Look) -> dict:
    """A look as docs/results/recompute.py replays it: the seeds each variant had, the alpha spent, the contrasts
    it left open and those the miniature cannot test (a declared rule on the values, not a p-value)."""
    untestable = [c.label for c in look.contrasts if c.verdict == "not testable here"]
    return {"seeds": look.seeds, "alpha": look.alpha, "open": look.open, "not_testable": untestable}


def decided_at(label: str, looks: list[Look]) -> Look | None:
    """The first look that left the contrast decided (None: open at every look)."""
    return next((look for look in looks if label not in look.open), None)


def _final(c: stats.Contrast, looks: list[Look], plan: SeedPlan, full: stats.Contrast | None) -> stats.Contrast:
    look = decided_at(c.label, looks)
    if look is None:
        seen = next(x for x in looks[-1].contrasts if x.label == c.label)
        where = "open at the maximum" if len(looks) == len(plan.looks()) else "open"
        at = f"{where}, look {len(looks)} of {len(plan.looks())} ({seen.n} seeds of at most {plan.max})"
        if full is not None and math.isfinite(full.mde):
            at += f"; at these seeds the family's test detects |Δ| >= {full.mde:.3g}"
        return dataclasses.replace(seen, verdict="not resolved", look=at)
    seen = next(x for x in look.contrasts if x.label == c.label)
    at = (
        f"decided at look {look.index + 1} of {len(plan.looks())} ({seen.n} seeds of at most {plan.max}, alpha spent "
        f"{look.alpha:.3g})"
    )
    return dataclasses.replace(seen, look=at)


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


__all__ = [
    "Look",
    "decided_at",
    "ended",
    "path",
    "path_rows",
    "plan_of",
    "saved",
    "table",
    "wanted",
]
