"""A seed plan's looks, replayed from a study's runs (record/spec/seedplan.py).

At look k every variant has the seeds the plan gave it so far (``first``, then ``batch`` more for each look at which
one of its contrasts was open). The family is judged as the report judges it (``record.judge``) on the seeds each
variant had, each contrast tested by the group-sequential exact sign-flip test over the looks it has had, and the
closed Holm test decides at the study's alpha (``record.stats.plans``). A contrast is decided when it comes out
different or equivalent (or the miniature cannot test it); the others stay open, and their variants get the next
batch. Replaying the looks from what the store holds gives the same decisions every time, so a submission killed
between batches resumes at the same look, and a decision is never re-opened. The sweep asks ``wanted`` which cells
to train next (``ablations.sweep``); the report shows each contrast as the look that decided it saw it
(``dashboards.looks``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from record import stats
from record.judge import judge
from record.runs import StudyRuns, load_runs
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
    judged = judge(seen, analysis, n_boot=QUICK_BOOT)
    frozen = {c.label: c for c in before.contrasts if c.label not in before.open} if before else {}
    sizes = {label: before.sizes[label] for label in frozen} if before else {}
    family = []
    for c in judged.family:
        c = frozen.get(c.label) or c
        sizes.setdefault(c.label, _sizes(c, history, list(runs.variants)))
        family.append(c)
    family = plans.decided(family, sizes, plan, analysis.alpha, judged.direction)
    still = [c.label for c in family if c.label not in frozen and not c.verdict.startswith(DECIDED)]
    return Look(len(history) - 1, dict(upto), analysis.alpha, family, still, sizes)


def _sizes(c: stats.Contrast, history: list[dict[str, int]], variants: list[str]) -> tuple[int, ...]:
    """The contrast's paired seeds at each look it has had (the seeds its variants had then; repeats dropped)."""
    involved = [c.a, c.b] if c.kind == "pair" else variants
    if not c.testable:
        return ()
    return tuple(sorted({sum(s < min(upto.get(v, 0) for v in involved) for s in c.seeds) for upto in history} - {0}))


def decided_at(label: str, looks: list[Look]) -> Look | None:
    """The first look that left the contrast decided (None: open at every look)."""
    return next((look for look in looks if label not in look.open), None)


__all__ = ["DECIDED", "Look", "decided_at", "ended", "path", "wanted"]
