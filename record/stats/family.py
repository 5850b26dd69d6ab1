"""The correction family of a study, from its declaration: which contrasts Holm's correction runs over, how they
are named, and what the exact test can reach with a number of seeds (2 / 2^n). A property of the declared design:
the study loader and the dry run judge it before anything runs (``record.spec.analysis``), and the report's
statistics (``record.stats``) use the same names and floors."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

EXACT_MAX_N = 16  # up to 2^16 = 65,536 sign flips are enumerated: the permutation p-value is exact
MC_RESAMPLES = 99_999  # beyond, a Monte Carlo permutation test with at least this many resamples


@dataclass(frozen=True)
class Family:
    """The contrasts Holm's correction runs over, resolved for one study: its pairs, the axes whose main effects
    and the pairs of axes whose interactions are in it, and whether it is the default (nothing declared)."""

    pairs: list[tuple[str, str]]
    main: list[str]
    interactions: list[tuple[str, str]]
    default: bool

    def size(self, levels: dict[str, int]) -> int:
        """Pairs, each main effect's levels - 1 and each interaction's (levels - 1) x (levels - 1) terms."""
        size = len(self.pairs) + sum(levels[a] - 1 for a in self.main)
        return max(1, size + sum((levels[a] - 1) * (levels[b] - 1) for a, b in self.interactions))


def min_p(n: int, test: str = "permutation", n_resamples: int = MC_RESAMPLES) -> float:
    """The smallest two-sided p-value a test can give with n paired seeds: 2 / 2^n for the exact sign-flip
    test, 2 / (R + 1) for its Monte Carlo form, 0 for the t-test (n >= 2)."""
    if n < 1:
        return 1.0
    if test == "t" and n >= 2:
        return 0.0
    if n <= EXACT_MAX_N:
        return min(1.0, 2.0 / 2**n)
    return 2.0 / (n_resamples + 1)


def holm_best_steps(floors: Sequence[float], alpha: float) -> list[float]:
    """For each test of a Holm family whose p cannot go below its ``floors`` entry (the exact test's 2/2^n; 0 for a
    t-test): the largest step Holm can give it, alpha / (m - k), where k is the most other tests that can be
    rejected before it (the smallest floors first, each within its own step). A test whose floor is above its
    best step cannot be rejected whatever the data; one below may be, where the others come out first."""
    m, steps = len(floors), []
    for j, floor in enumerate(floors):
        k = 0
        for other in sorted(f for i, f in enumerate(floors) if i != j and f <= floor):
            if other <= alpha / (m - k):
                k += 1
        steps.append(alpha / (m - k))
    return steps


def holm_floor(
    n: int,
    alpha: float,
    family_size: int,
    smallest: float | None = None,
    *,
    step: float | None = None,
    what: str = "exact test's",
) -> str | None:
    """Why a contrast over ``n`` seeds cannot come out different in a Holm family of ``family_size`` whatever the
    data (the test's smallest p, ``smallest`` or the exact test's 2/2^n, above ``step``: the largest step Holm can
    give it, ``holm_best_steps``; by default its first step, alpha / family_size), or None when it can."""
    smallest = min_p(n) if smallest is None else smallest
    step = alpha / family_size if step is None else step
    if smallest <= step:
        return None
    seeds = f"with {n} seed{'s' if n != 1 else ''} the {what} smallest p is {smallest:.3g}"
    if round(alpha / step) == family_size:
        return f"{seeds}, above Holm's first step {alpha:g}/{family_size}"
    return (
        f"{seeds}, above {alpha:g}/{round(alpha / step)}, the largest step Holm can give it (the others rejected first)"
    )


def smallest_exact_n(level: float, test: str = "permutation", *, tails: int = 2) -> int:
    """The fewest seeds at which the test can reach ``level`` at all (tails / 2^n <= level for the sign-flip test:
    2 / 2^n two-sided; 1 / 2^n for the two one-sided tests of equivalence, ``tails=1``)."""
    if test == "t":
        return 2
    return max(2, math.ceil(math.log2(tails / level) - 1e-12))


def main_label(factor: str, level: str, ref: str) -> str:
    """A main effect's label: "model.norm: post vs pre" (what ``analysis.expect`` names it by)."""
    return f"{factor}: {level} vs {ref}"


def interaction_label(fi: str, fj: str, ab: tuple[str, str], ref: tuple[str, str]) -> str:
    return f"{fi} x {fj}: {ab[0]} x {ab[1]} vs {ref[0]} x {ref[1]}"


def effect_labels(
    levels: dict[str, list[str]], main: Iterable[str], interactions: Iterable[tuple[str, str]]
) -> list[str]:
    """The labels of the main effects of ``main`` and the interactions of ``interactions`` (each level against an
    axis's first), in ``factorial_effects``' order."""
    out = [main_label(f, x, levels[f][0]) for f in main for x in levels[f][1:]]
    for fi, fj in interactions:
        ref = (levels[fi][0], levels[fj][0])
        out += [interaction_label(fi, fj, ab, ref) for ab in itertools.product(levels[fi][1:], levels[fj][1:])]
    return out


__all__ = [
    "EXACT_MAX_N",
    "MC_RESAMPLES",
    "Family",
    "effect_labels",
    "holm_best_steps",
    "holm_floor",
    "interaction_label",
    "main_label",
    "min_p",
    "smallest_exact_n",
]
