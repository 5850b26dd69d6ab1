"""One variant's values (mean, spread, Student-t and BCa intervals) and its successes out of its cells (the exact
Clopper-Pearson interval; Fisher's exact test of two rates)."""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

NAN = math.nan
NAN2 = (NAN, NAN)
BOOT_RESAMPLES = 9_999
BOOT_UNDER_COVERS_BELOW = 20  # BCa covered 73% / 80% / 91% / 92% at 3 / 5 / 10 / 20 seeds (docs/statistics.md)


def finite(values: Iterable[float | None]) -> np.ndarray:
    x = np.asarray([float(v) for v in values if v is not None], dtype=float)
    return x[np.isfinite(x)]


def has_spread(x: np.ndarray) -> bool:
    """Whether values differ at all (a ceiling or a constant difference has no spread)."""
    return len(x) > 1 and float(np.ptp(x)) > 1e-12 * max(1.0, float(np.max(np.abs(x))))


# --- one variant's values -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Summary:
    n: int
    mean: float
    std: float
    sem: float
    ci_t: tuple[float, float]  # nan without spread: zero width would claim certainty
    ci_boot: tuple[float, float]  # BCa bootstrap (under-covers below BOOT_UNDER_COVERS_BELOW values)

    @property
    def spread(self) -> bool:
        return self.n > 1 and math.isfinite(self.std) and self.std > 0


def t_interval(x: np.ndarray, confidence: float = 0.95) -> tuple[float, float]:
    """Student-t interval of the mean; nan with fewer than two values or no spread."""
    from scipy import stats as sps

    if len(x) < 2 or not has_spread(x):
        return NAN2
    lo, hi = sps.t.interval(confidence, len(x) - 1, loc=float(x.mean()), scale=float(sps.sem(x)))
    return float(lo), float(hi)


def bca_interval(
    x: np.ndarray, confidence: float = 0.95, n_resamples: int = BOOT_RESAMPLES, seed: int = 0
) -> tuple[float, float]:
    """BCa bootstrap interval of the mean (scipy.stats.bootstrap); nan below three values or without spread."""
    from scipy import stats as sps

    if len(x) < 3 or not has_spread(x):
        return NAN2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # degenerate resamples: the interval is then nan, which we keep
        ci = sps.bootstrap(
            (x,), np.mean, method="BCa", confidence_level=confidence, n_resamples=n_resamples, rng=seed
        ).confidence_interval
    return float(ci.low), float(ci.high)


def describe(
    values: Iterable[float], *, confidence: float = 0.95, n_boot: int = BOOT_RESAMPLES, seed: int = 0
) -> Summary:
    x = finite(values)
    if len(x) == 0:
        return Summary(0, NAN, NAN, NAN, NAN2, NAN2)
    std = float(np.std(x, ddof=1)) if len(x) > 1 else NAN
    sem = std / math.sqrt(len(x)) if len(x) > 1 else NAN
    if len(x) > 1 and not has_spread(x):
        std = sem = 0.0
    return Summary(
        len(x), float(x.mean()), std, sem, t_interval(x, confidence), bca_interval(x, confidence, n_boot, seed)
    )


# --- successes ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Successes:
    """A variant's outcomes: successes out of the cells that have an outcome."""

    successes: int
    cells: int
    ci: tuple[float, float]  # exact Clopper-Pearson interval of the success rate
    diverged: int = 0
    failed: int = 0  # failed or killed
    not_learned: int = 0  # finished, but not better than the never_learned threshold
    pending: int = 0  # running, or finished without the metric: no outcome yet (not in ``cells``)

    @property
    def failures(self) -> int:
        return self.cells - self.successes

    @property
    def rate(self) -> float:
        return self.successes / self.cells if self.cells else NAN


def success_interval(successes: int, cells: int, confidence: float = 0.95) -> tuple[float, float]:
    """The exact (Clopper-Pearson) interval of a success rate."""
    from scipy import stats as sps

    if cells == 0:
        return NAN2
    ci = sps.binomtest(successes, cells).proportion_ci(confidence_level=confidence, method="exact")
    return float(ci.low), float(ci.high)


def successes(outcomes: Iterable[str], confidence: float = 0.95, *, pending: int = 0) -> Successes:
    """From each cell's outcome: success | diverged | failed | killed | not_learned."""
    outcomes = list(outcomes)
    k, n = sum(o == "success" for o in outcomes), len(outcomes)
    return Successes(
        k,
        n,
        success_interval(k, n, confidence),
        diverged=sum(o == "diverged" for o in outcomes),
        failed=sum(o in ("failed", "killed") for o in outcomes),
        not_learned=sum(o == "not_learned" for o in outcomes),
        pending=pending,
    )


def rate_test(a: Successes, b: Successes) -> float:
    """Fisher's exact test (two-sided) of two success rates; 1 when either has no cell."""
    from scipy import stats as sps

    if a.cells == 0 or b.cells == 0:
        return 1.0
    table = [[a.successes, a.failures], [b.successes, b.failures]]
    return float(sps.fisher_exact(table).pvalue)
