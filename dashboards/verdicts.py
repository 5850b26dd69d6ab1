"""Each contrast's verdict for a reader: the verdict in words with its numbers, why it is not decided, and the
next step as a command to copy (``readings``), which every rendering leads with. The words come from the tests
only: "equivalent" only after a margin test that passed, seed counts only as measured, "not testable here" from
record/testable.py (docs/statistics.md, "Verdicts").
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from dashboards.table import Table, failure_counts
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
    claims: tuple[str, ...] = ()  # the papers' sentences this contrast tests (analysis.claims), quoted
    rules: str = ""  # where the verdict flips with the failure rule: the verdict under each

    @property
    def notes(self) -> list[tuple[str, str]]:
        """What follows the sentence, each under its word: the claims it tests, a flip between failure rules, why,
        the next step."""
        said = [("claim", x) for x in self.claims] + [("failure rules", self.rules)]
        said += [("why", self.why), ("next", self.next_step)]
        return [(word, text) for word, text in said if text]


def readings(t: Table) -> list[Reading]:
    """A reading per contrast of the table's family, in its order, then the exploratory ones (added or changed
    after results: marked so)."""
    out = [reading(t, c) for c in t.family]
    for c in t.exploratory:
        r = reading(t, c)
        why = "; ".join(x for x in (f"exploratory: {c.exploratory}", r.why) if x)
        out.append(dataclasses.replace(r, sentence=f"exploratory: {r.sentence}", why=why))
    return out


def reading(t: Table, c: stats.Contrast) -> Reading:
    """The contrast's reading, its verdict line ending with what the failure-rate test says where it differs."""
    r = _reading(t, c)
    fails = failure_text(t, c)
    sentence = f"{r.sentence}; {fails}" if fails else r.sentence
    return dataclasses.replace(r, sentence=sentence, claims=claims_of(t, c), rules=rules_text(t, c))


def rules_text(t: Table, c: stats.Contrast) -> str:
    """ "the verdict flips with the rule: worst: not resolved; exclude: different (worse)" where the failure rules
    disagree and one of them decides (each rule's verdict over the same family), else "": "not resolved" under one
    rule and "untestable" under another decide nothing either way."""
    under = t.by_rule.get(c.label, {})
    decides = any(v.startswith(("different", "equivalent")) for v in under.values())
    if len(set(under.values())) < 2 or not decides:
        return ""
    each = "; ".join(
        f"{rule}{' (declared)' if rule == t.analysis.failure_rule else ''}: {v}" for rule, v in under.items()
    )
    return f"the verdict flips with the failure rule: {each}"


def claims_of(t: Table, c: stats.Contrast) -> tuple[str, ...]:
    """The claims the study maps to this contrast on this table's metric, each with where it comes from."""
    design = t.design_metric or t.metric
    return tuple(
        f'{x.source}: "{x.sentence}" (tested here: {c.verdict})'
        for x in t.analysis.claims
        if x.name == c.label and (x.metric or design) == t.metric
    )


def failure_text(t: Table, c: stats.Contrast) -> str:
    """ "post fails more: 6 of 14 seeds (6 diverged) against 0 of 14, Fisher Holm p 0.032" where the pair's success
    rates differ at alpha (Fisher's exact test, Holm over the family), else "": failures the metric hid under the
    failure rule say so in the verdict line."""
    if c.kind != "pair" or not (c.p_rate_holm <= t.analysis.alpha):
        return ""
    rows = {r.variant: r.outcomes for r in t.rows}
    a, b = rows.get(c.a), rows.get(c.b)
    if a is None or b is None:
        return ""
    more, other = (c.a, c.b) if a.failures * b.cells > b.failures * a.cells else (c.b, c.a)
    o, p = rows[more], rows[other]
    return (
        f"{more} fails more: {o.failures} of {o.cells} seeds ({failure_counts(o)}) against {p.failures} of "
        f"{p.cells} for {other}, Fisher Holm p {stats_p(c.p_rate_holm)}"
    )


def _reading(t: Table, c: stats.Contrast) -> Reading:
    if c.verdict == NOT_TESTABLE:  # what the test alone said, beside why it cannot answer the question
        alone = f"the test alone: Δ {c.estimate:+.3g}, Holm p {stats_p(c.p_holm)}"
        sentence = f"{c.label}: {NOT_TESTABLE} on {t.metric} ({alone})"
        return Reading(c.label, c.verdict, sentence, c.untestable_here, c.make_testable)
    if not c.testable:
        why = c.method.split(": ", 1)[-1]
        return Reading(c.label, c.verdict, f"{c.label}: untestable", why, f"train its cells: {command(t)}")
    if c.verdict.startswith("different") or c.verdict.startswith("equivalent"):
        if c.equivalence_untestable_here:
            return Reading(c.label, c.verdict, decided_sentence(t, c), *_no_equivalence(c))
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
    if c.equivalence_untestable_here:
        why, make = f"{why}; {_no_equivalence(c)[0]}", c.make_equivalence_testable
        step = f"{step}; or, for equivalence, {make}" if step else make
    return Reading(c.label, c.verdict, unresolved_sentence(t, c), why, step)


def _no_equivalence(c: stats.Contrast) -> tuple[str, str]:
    return f"{stats.NO_EQUIVALENCE}: {c.equivalence_untestable_here}", c.make_equivalence_testable


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
        level = f" of {c.b}'s {c.comparator:.3g}" if math.isfinite(c.comparator) else ""
        parts.append(f"TOST Holm p {stats_p(c.p_tost_holm)} within {c.margin_text or f'±{c.margin:.3g}'}{level}")
    return f"{c.label}: {c.verdict} on {t.metric} ({'; '.join(p for p in [*parts, t.decided_at.get(c.label)] if p)})"


def unresolved_sentence(t: Table, c: stats.Contrast) -> str:
    a = t.analysis
    parts = [f"Δ {c.estimate:+.3g}", interval_text(c, a.confidence, a.test), f"Holm p {stats_p(c.p_holm)}"]
    return f"{c.label}: {c.verdict} on {t.metric} ({'; '.join(p for p in [*parts, t.decided_at.get(c.label)] if p)})"


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
        out += [f"  {word}: {text}" for word, text in r.notes]
    return out


def as_dict(r: Reading) -> dict[str, Any]:
    return {
        "contrast": r.label, "verdict": r.verdict, "sentence": r.sentence, "why": r.why, "next": r.next_step,
        "claims": list(r.claims), "failure_rules": r.rules,
    }  # fmt: skip


__all__ = ["Reading", "lead_lines", "readings"]
