"""Each contrast's verdict for a reader: the verdict in words with its numbers, why it is not decided, and the
next step as a command to copy (``readings``), which every rendering leads with. The words come from the tests
only: "equivalent" only after a margin test that passed, seed counts only as measured, "not testable here" from
record/testable.py (docs/statistics.md, "Verdicts").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from dashboards.table import Table
from record import stats
from record.testable import NOT_TESTABLE

MAX_SEEDS_ADVISED = 100  # beyond, "add seeds" is no advice: the difference is small against the seeds' spread


# --- the readings of a table --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reading:
    """One contrast of the family, for a reader: its verdict, that verdict in words with its numbers, why (for
    every verdict short of a decision), and the next step ("" when decided)."""

    label: str
    verdict: str
    sentence: str
    why: str = ""
    next_step: str = ""


def readings(t: Table) -> list[Reading]:
    """A reading per contrast of the table's family, in its order, then the exploratory ones (added or changed
    after results: marked so)."""
    out = [reading(t, c) for c in t.family]
    for c in t.exploratory:
        r = reading(t, c)
        why = "; ".join(x for x in (f"exploratory: {c.exploratory}", r.why) if x)
        out.append(Reading(r.label, r.verdict, f"exploratory: {r.sentence}", why, r.next_step))
    return out


def reading(t: Table, c: stats.Contrast) -> Reading:
    if c.verdict == NOT_TESTABLE:  # what the test alone said, beside why it cannot answer the question
        alone = f"the test alone: Δ {c.estimate:+.3g}, Holm p {stats_p(c.p_holm)}"
        sentence = f"{c.label}: {NOT_TESTABLE} on {t.metric} ({alone})"
        return Reading(c.label, c.verdict, sentence, c.untestable_here, c.make_testable)
    if not c.testable:
        why = c.method.split(": ", 1)[-1]
        return Reading(c.label, c.verdict, f"{c.label}: untestable", why, f"train its cells: {command(t)}")
    if c.verdict.startswith("different") or c.verdict.startswith("equivalent"):
        return Reading(c.label, c.verdict, decided_sentence(t, c))
    why, seeds = unresolved_why(t, c)
    if seeds is not None and seeds <= c.n:  # the seeds had the power for the declared difference: more add little
        why += (
            f" ({seeds} seeds have {t.analysis.power:.0%} power for it: a difference that large is unlikely)"
            if t.detect
            else ""
        )
        seeds = None
    step = f'{command(t)} --seeds {seeds} --amend "{seeds} seeds: {why_more(c)}"' if seeds else ""
    if seeds and c.label in t.decided_at:  # a seed plan: its maximum is what an amendment raises
        step = f'raise seeds.max to {seeds} in {t.source}, then {command(t)} --amend "max {seeds}: {why_more(c)}"'
    if not step and t.margin is None:
        step = f"declare analysis.margins.{t.metric} to test equivalence"
    return Reading(c.label, c.verdict, unresolved_sentence(t, c), why, step)


def command(t: Table) -> str:
    return f"ablate sweep {t.source}"


def why_more(c: stats.Contrast) -> str:
    """The reason an amendment that adds seeds gives (seeds changed after results are an amendment)."""
    return f"{c.n} could not resolve {c.label}"


def seed_count(c: stats.Contrast) -> str:
    """ "lower in 6 of 7 seeds", counted from the per-seed differences (never assumed from a p-value)."""
    d = np.asarray(c.differences, dtype=float)
    if not len(d):
        return ""
    lower = d.mean() < 0
    return f"{'lower' if lower else 'higher'} in {int((d < 0).sum() if lower else (d > 0).sum())} of {len(d)} seeds"


def interval_text(c: stats.Contrast, confidence: float, test: str) -> str:
    """The t interval, labelled as not the test's own where the verdict's test is the exact one."""
    lo, hi = c.ci_t
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "no interval" if c.n > 1 else "one seed"
    own = "" if test == "t" else " (t interval, not the exact test's)"
    return f"{confidence:.0%} CI [{lo:+.3g}, {hi:+.3g}]{own}"


def decided_sentence(t: Table, c: stats.Contrast) -> str:
    a = t.analysis
    parts = [f"Δ {c.estimate:+.3g}", interval_text(c, a.confidence, a.test)]
    if c.verdict.startswith("different"):
        parts += [seed_count(c), f"Holm p {stats_p(c.p_holm)}"]
    if "equivalent" in c.verdict:
        parts.append(f"TOST Holm p {stats_p(c.p_tost_holm)} within ±{c.margin:.3g}")
    return f"{c.label}: {c.verdict} on {t.metric} ({'; '.join(p for p in [*parts, t.decided_at.get(c.label)] if p)})"


def unresolved_sentence(t: Table, c: stats.Contrast) -> str:
    a = t.analysis
    parts = [f"Δ {c.estimate:+.3g}", interval_text(c, a.confidence, a.test), f"Holm p {stats_p(c.p_holm)}"]
    return f"{c.label}: not resolved on {t.metric} ({'; '.join(p for p in [*parts, t.decided_at.get(c.label)] if p)})"


def stats_p(p: float) -> str:
    return "–" if not math.isfinite(p) else f"{p:.2g}"


def unresolved_why(t: Table, c: stats.Contrast) -> tuple[str, int | None]:
    """Why a contrast is not resolved, and the seeds that could resolve it: the exact test's floor above Holm's
    step, else the difference these seeds could detect against the one observed (or declared in ``detect``)."""
    a, size = t.analysis, max(1, len(t.family))
    step = a.alpha / size
    floor = c.min_p if math.isfinite(c.min_p) else 0.0
    if floor > step:
        need = stats.smallest_exact_n(step)
        why = f"{c.n} seeds: the exact test's smallest p is {floor:.3g}, above Holm's first step {a.alpha:g}/{size}"
        return why, max(need, _power_seeds(t, c) or 0)
    if not math.isfinite(c.mde):
        return "no spread in the paired differences: the seeds' power is unknown", None
    why = f"these {c.n} seeds detect |Δ| ≥ {c.mde:.3g} with {a.power:.0%} power; |Δ| = {abs(c.estimate):.3g}"
    if t.detect:
        why += f"; the declared difference is {t.detect:g}"
    return why, _power_seeds(t, c)


def _power_seeds(t: Table, c: stats.Contrast) -> int | None:
    """Seeds for the declared difference (``detect``), else for a difference of the observed size; None when the
    spread is unknown or more than MAX_SEEDS_ADVISED would be needed."""
    if c.seeds_needed is not None:
        return c.seeds_needed if c.seeds_needed <= MAX_SEEDS_ADVISED else None
    target = abs(c.estimate)
    if len(c.differences) < 2 or not target > 0:
        return None
    a = t.analysis
    need = stats.seeds_needed(
        c.differences, target, alpha=a.alpha, power=a.power, test=a.test, family_size=len(t.family)
    )
    return need if need is not None and need <= MAX_SEEDS_ADVISED else None


def lead_lines(t: Table) -> list[str]:
    """What a reader must know first: each contrast's verdict in words, why, and the next step."""
    out = []
    for r in readings(t):
        out.append(r.sentence)
        if r.why:
            out.append(f"  why: {r.why}")
        if r.next_step:
            out.append(f"  next: {r.next_step}")
    return out


def as_dict(r: Reading) -> dict[str, Any]:
    return {"contrast": r.label, "verdict": r.verdict, "sentence": r.sentence, "why": r.why, "next": r.next_step}


__all__ = ["Reading", "lead_lines", "readings"]
