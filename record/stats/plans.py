"""A seed plan's decisions, given its contrasts' per-seed differences: the alpha each look spends (Lan and DeMets
1983), the closed Holm test over the family's group-sequential exact tests (``record.stats.sequential``) at a grid of
levels, and simulated studies of what a plan costs and keeps. Pure: the sweep (which cells come next) and the
report (each contrast's verdict at the look that decided it) both decide through it.

A plan is any object with ``first``, ``batch``, ``max``, ``spending``, ``looks()`` and ``spend(t, alpha)``
(``record.spec.seedplan.SeedPlan``).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from record.stats import sequential as gs
from record.stats.contrasts import Contrast, Corrected, holm
from record.stats.family import smallest_exact_n
from record.stats.power import power_of


class SeedPlanLike(Protocol):
    first: int
    batch: int
    max: int
    spending: str

    def looks(self) -> list[int]: ...

    def spend(self, t: float, alpha: float) -> float: ...


def spend(spending: str, t: float, alpha: float) -> float:
    """The alpha the ``spending`` function has spent by information fraction ``t`` (Lan and DeMets 1983)."""
    if t >= 1:
        return alpha
    if t <= 0:
        return 0.0
    if spending == "pocock":
        return alpha * math.log(1 + (math.e - 1) * t)
    from scipy.stats import norm

    return float(2 - 2 * norm.cdf(norm.ppf(1 - alpha / 2) / math.sqrt(t)))


GRID = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 4, 10, 20)  # multiples of alpha at which the shown p is sought


def decided(
    family: list[Contrast], sizes: dict[str, tuple], plan: SeedPlanLike, alpha: float, direction: str
) -> list[Contrast]:
    """The family's verdicts by the closed test over the contrasts' group-sequential tests (``sizes``: each
    contrast's paired seeds at the looks it had), at alpha and, for the p shown (p_holm, p_tost_holm), at the GRID's
    multiples of alpha: the smallest level down to which it rejects."""
    levels = sorted({min(1.0, alpha * g) for g in GRID})
    at = levels.index(alpha)
    p = closed_p(family, sizes, plan, levels, at, 0)
    margins = [c for c in family if c.margin is not None]
    p_tost = dict(zip([c.label for c in margins], closed_p(margins, sizes, plan, levels, at, 1)))
    procedure = f"group-sequential ({plan.spending})"
    rated = [c for c in family if math.isfinite(c.p_rate)]  # failure rates: Holm over the family, as fixed designs
    p_rate = dict(zip([c.label for c in rated], holm([c.p_rate for c in rated])))
    return [
        c.corrected_by(
            Corrected(
                alpha=alpha,
                direction=direction,
                p_holm=p_c,
                p_tost_holm=p_tost.get(c.label, math.nan),
                p_rate_holm=p_rate.get(c.label, math.nan),
                procedure=procedure,
            )
        )  # fmt: skip
        for c, p_c in zip(family, p)
    ]


def closed_p(
    family: list[Contrast], sizes: dict[str, tuple], plan: SeedPlanLike, levels: list[float], at: int, side: int
) -> list[float]:
    """Per contrast, the smallest of ``levels`` from which up to levels[at] (alpha) the closed test rejects it, or
    the first level above alpha at which it does (1 if none): at most alpha exactly when rejected at alpha.
    ``side`` 0: the test of a difference; 1: the two one-sided tests of equivalence within the margin."""
    m = len(family)
    if not m:
        return []
    crossing = np.stack([_crossings(c, sizes[c.label], plan, tuple(levels), m, side) for c in family], axis=2)
    rejected = [gs.closed(list(crossing[k][:, None, :]))[0] for k in range(len(levels))]  # per level: (m,)
    out = []
    for i in range(m):
        if rejected[at][i]:
            k = at
            while k > 0 and rejected[k - 1][i]:
                k -= 1
            out.append(levels[k])
        else:
            out.append(next((levels[k] for k in range(at + 1, len(levels)) if rejected[k][i]), 1.0))
    return out


def _crossings(c: Contrast, sizes: tuple, plan: SeedPlanLike, levels: tuple, m: int, side: int) -> np.ndarray:
    """(levels x m): whether the contrast crossed at level / s (s = 1..m, the closed test's intersections)."""
    if not sizes or not c.testable:
        return np.zeros((len(levels), m), dtype=bool)
    d = tuple(float(x) for x in (c.on_scale if side and c.on_scale else c.differences))
    return _crossed(d, sizes, plan.max, plan.spending, levels, m, side, (c.margin or 0.0) if side else 0.0)


@functools.lru_cache(maxsize=4096)
def _crossed(
    d: tuple, sizes: tuple, n_max: int, spending: str, levels: tuple, m: int, side: int, margin: float
) -> np.ndarray:
    """Cached: the sweep asks for the path after every round, and the looks before the last do not change."""
    t = [n / n_max for n in sizes]
    cumulative = [[spend(spending, x, level / s) for x in t] for level in levels for s in range(1, m + 1)]
    x = np.asarray(d)[None, : sizes[-1]]
    if not side:
        return gs.crossed(x, sizes, cumulative, 0)[:, 0].reshape(len(levels), m)
    both = gs.crossed(x + margin, sizes, cumulative, 1) & gs.crossed(x - margin, sizes, cumulative, -1)
    return both[:, 0].reshape(len(levels), m)


@dataclass
class Simulated:
    """What a plan did over simulated studies: per contrast, how often it came out different (its power; under no
    difference, a false rejection) and the mean seeds it used; how often any true null was rejected."""

    power: list[float]
    seeds: list[float]
    family_error: float
    draws: int
    n: np.ndarray = field(repr=False, default_factory=lambda: np.zeros((0, 0)))  # draws x contrasts: seeds used


def simulate(
    plan: SeedPlanLike,
    alpha: float,
    effects: list[float],
    *,
    margin: float | None = None,
    draws: int = 2_000,
    seed: int = 0,
) -> Simulated:
    """``draws`` studies of len(effects) contrasts whose per-seed paired differences are normal with mean
    ``effects`` (in standard deviations of a difference; 0: no difference), decided as ``path`` decides: at each
    look, the closed Holm test over the family's group-sequential exact tests (and, with ``margin``, their two one-sided tests of
    equivalence), a decided contrast's seeds frozen."""
    rng = np.random.default_rng(seed)
    m, looks = len(effects), plan.looks()
    d = rng.standard_normal((draws, m, looks[-1])) + np.asarray(effects)[None, :, None]
    last = np.zeros((draws, m), dtype=int)  # the index of the last look each contrast had
    open_ = np.ones((draws, m), dtype=bool)
    rejected = np.zeros((draws, m), dtype=bool)
    for k in range(len(looks)):
        last = np.where(open_, k, last)
        rows = open_.any(axis=1)
        now, decided = _decide(d[rows], last[rows], plan, alpha, margin)
        now, decided = now & open_[rows], decided & open_[rows]
        rejected[rows] |= now
        open_[rows] &= ~decided
    n_at = np.asarray(looks)[last]
    truth = np.asarray(effects) == 0
    return Simulated(
        power=[float(x) for x in rejected.mean(axis=0)],
        seeds=[float(x) for x in n_at.mean(axis=0)],
        family_error=float((rejected & truth[None, :]).any(axis=1).mean()),
        draws=draws,
        n=n_at,
    )


def _decide(
    x: np.ndarray, at: np.ndarray, plan: SeedPlanLike, alpha: float, margin: float | None
) -> tuple[np.ndarray, np.ndarray]:
    """One look over simulated studies: which contrasts the closed test finds different, and which are decided
    (different or, with a margin, equivalent)."""
    levels = [alpha / s for s in range(1, x.shape[1] + 1)]  # the closed test's intersections
    now = gs.closed(_crossing(x, at, plan, levels, 0))
    if margin is None:
        return now, now
    tost = _crossing(x + margin, at, plan, levels, 1) & _crossing(x - margin, at, plan, levels, -1)
    return now, now | gs.closed(tost)


def _crossing(d: np.ndarray, last: np.ndarray, plan: SeedPlanLike, levels: list[float], side: int) -> np.ndarray:
    """(levels x draws x contrasts): whether each contrast crossed a boundary at each level over the looks it had."""
    looks, out = plan.looks(), np.zeros((len(levels), *last.shape), dtype=bool)
    for j in range(last.shape[1]):
        for k in np.unique(last[:, j]):
            rows, sizes = last[:, j] == k, looks[: k + 1]
            cumulative = [[plan.spend(n / plan.max, level) for n in sizes] for level in levels]
            out[:, rows, j] = gs.crossed(d[rows, j], sizes, cumulative, side)
    return out


def fixed_seeds(alpha: float, m: int, effect: float, power: float) -> int:
    """The seeds a fixed design needs for ``power`` against ``effect`` at Holm's first step alpha / m (the exact
    test's own power, ``stats.power_of``)."""
    n = smallest_exact_n(alpha / m)
    while power_of(effect, n, alpha / m) < power and n < 64:
        n += 1
    return n


__all__ = ["GRID", "SeedPlanLike", "Simulated", "closed_p", "decided", "fixed_seeds", "simulate", "spend"]
