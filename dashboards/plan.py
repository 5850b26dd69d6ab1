"""How many seeds a study needs, from an earlier submission used as a pilot (``ablate sweep --dry-run``).

For each contrast of the declared family, the spread of its paired differences in the pilot (failed seeds
under the failure rule, as in the tables) gives the seeds needed to detect ``analysis.detect[metric]`` with
``analysis.power`` at Holm's strictest level alpha / (family size), and never fewer than the seeds at which the
study's test can reach that level at all (record.stats.seeds_needed).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dashboards.render import number_text
from dashboards.table import Table, build
from record import stats
from record.runs import NoResults, load_runs
from record.secrets import redact_url
from record.spec.analysis import Analysis


@dataclass(frozen=True)
class SeedsNeeded:
    contrast: str
    pilot_seeds: int  # paired seeds in the pilot
    sd: float  # of the pilot's paired differences
    needed: int | None  # None: the pilot has fewer than two paired seeds


def plan_from_table(table: Table) -> list[SeedsNeeded]:
    """The seeds each contrast of the table's family needs for the table's ``analysis.detect[metric]``."""
    difference = table.detect
    if not difference:
        return []
    a = table.analysis
    size = max(1, len(table.family))
    out = []
    for c in table.family:
        if c.kind != "pair":
            continue  # factorial effects pool every cell: their power is not a paired-seed count
        needed = stats.seeds_needed(
            c.differences, difference, alpha=a.alpha, power=a.power, test=a.test, family_size=size
        ) if c.n >= 2 else None  # fmt: skip
        out.append(SeedsNeeded(c.label, c.n, c.sd, needed))
    return out


def pilot_plan(
    uri: str, study: str, analysis: Analysis | None = None, *, metric: str | None = None, submission: int | None = None
) -> str | None:
    """A few lines for a dry run: the seeds the study needs, from its earlier submissions in the store at ``uri``
    (or one submission). ``analysis``: the study file's section (default: the one the pilot recorded).
    None when the store holds no earlier cell of the study."""
    try:
        runs = load_runs(uri, study, submission=submission)
    except NoResults:
        return None
    table = build(runs, metric, analysis=analysis, curves=False)  # the seeds plan needs no curves
    if not table.detect:
        return (
            f"seeds: declare analysis.detect.{table.metric} (the difference that matters) to have the pilot "
            f"({len(runs.cells)} cells in {redact_url(uri)}) say how many seeds each contrast needs"
        )
    a = table.analysis
    head = (
        f"seeds needed to detect Δ {number_text(table.detect, 3)} in {table.metric} with {a.power:.0%} power at "
        f"{a.alpha:g}/{max(1, len(table.family))} (Holm's strictest step; {stats.TESTS[a.test]}), from the "
        f"spread of the paired differences in the earlier submission(s):"
    )
    lines = [head]
    for p in plan_from_table(table):
        need = "unknown (fewer than 2 paired seeds in the pilot)" if p.needed is None else str(p.needed)
        sd = "" if not math.isfinite(p.sd) else f", sd of Δ {number_text(p.sd, 3)}"
        lines.append(f"  {p.contrast}: {need} (pilot: {p.pilot_seeds} seeds{sd})")
    return "\n".join(lines)


PLAN_DRAWS = 1_000  # simulated studies behind a dry run's expected seeds (about +-0.1 seed)


def sequential_plan(uri: str | None, study, *, submission: int | None = None, draws: int = PLAN_DRAWS) -> str:
    """A dry run's lines for a study with a seed plan: its looks and what each spends, the most it can train (seeds
    and compute), and, from a pilot's spread (an earlier submission, or the study's own first batch) and the declared
    difference, the seeds each variant is expected to train (``record.stats.plans.simulate``)."""
    plan, variants, a = study.plan, study.variants, study.analysis
    spent = ", ".join(f"{x:.3g} by {n}" for n, x in zip(plan.looks(), plan.cumulative(a.alpha)))
    lines = [
        f"seed plan: looks at {plan.looks()} seeds per variant; alpha {a.alpha:g} spent ({plan.spending}): {spent}",
        f"  at most: {plan.max} seeds per variant, {plan.max * len(variants)} trials{_compute(study, plan.max)}",
    ]
    table = _pilot_table(uri, study, submission)
    if isinstance(table, str):
        return "\n".join([*lines, f"  expected seeds: {table}"])
    expected, contrasts = _expected(table, plan, variants, draws)
    if not expected:
        return "\n".join([*lines, f"  expected seeds: {contrasts}"])
    per_variant = ", ".join(f"{v} {n:.1f}" for v, n in expected.items())
    total = sum(expected.values())
    return "\n".join([
        *lines,
        f"  expected ({draws:,} simulated studies, {contrasts}): {per_variant} seeds; {total:.0f} trials"
        f"{_compute(study, total / len(variants))}, {1 - total / (plan.max * len(variants)):.0%} fewer than the "
        "maximum",
    ])  # fmt: skip


def _compute(study, seeds_per_variant: float) -> str:
    """The trials' budget over ``seeds_per_variant`` seeds of every variant: steps and/or seconds."""
    trials, budget = seeds_per_variant * len(study.variants), study.budget
    out = []
    if budget.steps:
        out.append(f"{trials * budget.steps:,.0f} steps")
    if budget.time:
        out.append(f"{trials * budget.time / 3600:.2g} h of training")
    return f" ({' and '.join(out)} at the budget's {budget.as_dict()} per trial)" if out else ""


def _pilot_table(uri: str | None, study, submission: int | None) -> Table | str:
    """The pilot's table under the study's analysis, or why there is none."""
    if uri is None:
        return "no store yet: the first batch is the pilot; dry-run again after it"
    try:
        runs = load_runs(uri, study.name, submission=submission)
    except NoResults as err:
        return f"no pilot ({err}): the first batch is one; dry-run again after it (or --pilot SUBMISSION)"
    table = build(runs, study.metric, analysis=study.analysis, curves=False)
    if not table.detect:
        return f"declare analysis.detect.{table.metric} (the difference that matters) to have the pilot say them"
    return table


def _expected(table: Table, plan, variants: list[str], draws: int) -> tuple[dict[str, float], str]:
    """Per variant, the seeds the plan is expected to train against the declared difference, the family's
    contrasts simulated as independent with the pilot's spread; and how the effects were read."""
    from record.stats.plans import simulate

    family = [c for c in table.family if c.n >= 2 and math.isfinite(c.sd) and c.sd > 0]
    if not family:
        return {}, "the pilot has fewer than 2 paired seeds of every declared contrast"
    effects = [table.detect / c.sd for c in family]
    sim = simulate(plan, table.analysis.alpha, effects, draws=draws)
    seeds = {v: np.full(draws, float(plan.first)) for v in variants}
    for j, c in enumerate(family):
        for v in [c.a, c.b] if c.kind == "pair" else variants:
            if v in seeds:
                seeds[v] = np.maximum(seeds[v], sim.n[:, j])
    said = ", ".join(f"{c.label} {e:.2g} sd, power {p:.2f}" for c, e, p in zip(family, effects, sim.power))
    return {v: float(x.mean()) for v, x in seeds.items()}, f"the declared Δ {number_text(table.detect, 3)} is {said}"


__all__ = ["SeedsNeeded", "pilot_plan", "plan_from_table", "sequential_plan"]
