"""How many seeds a study needs, from an earlier submission used as a pilot (``ablate sweep --dry-run``).

For each contrast of the declared family, the spread of its paired differences in the pilot (failed seeds
under the failure rule, as in the tables) gives the seeds needed to detect ``analysis.detect[metric]`` with
``analysis.power`` at Holm's strictest level alpha / (family size), and never fewer than the seeds at which the
study's test can reach that level at all (dashboards.stats.seeds_needed).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ablations.secrets import redact_url
from ablations.spec.analysis import Analysis
from dashboards import stats
from dashboards.load import NoResults, load_study
from dashboards.render import number_text
from dashboards.table import Table, build


@dataclass(frozen=True)
class SeedPlan:
    contrast: str
    pilot_seeds: int  # paired seeds in the pilot
    sd: float  # of the pilot's paired differences
    needed: int | None  # None: the pilot has fewer than two paired seeds


def plan_from_table(table: Table) -> list[SeedPlan]:
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
        out.append(SeedPlan(c.label, c.n, c.sd, needed))
    return out


def pilot_plan(
    uri: str, study: str, analysis: Analysis | None = None, *, metric: str | None = None, submission: int | None = None
) -> str | None:
    """A few lines for a dry run: the seeds the study needs, from its earlier submissions in the store at ``uri``
    (or one submission). ``analysis``: the study file's section (default: the one the pilot recorded).
    None when the store holds no earlier cell of the study."""
    try:
        runs = load_study(uri, study, submission=submission)
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


__all__ = ["SeedPlan", "pilot_plan", "plan_from_table"]
