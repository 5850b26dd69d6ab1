"""The tests of a paired difference: the exact sign-flip permutation test (or the paired t-test), the two one-sided
tests of equivalence, Hedges' g."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import special

from record.stats.family import EXACT_MAX_N, MC_RESAMPLES
from record.stats.summaries import NAN, has_spread

TESTS = {"permutation": "exact paired sign-flip permutation test", "t": "paired t-test"}


def _mean_stat(x: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(x, axis=axis)


def resamples_for(level: float) -> int:
    """Monte Carlo resamples whose smallest attainable p (2 / (R + 1)) is a fifth of ``level`` or less."""
    return max(MC_RESAMPLES, math.ceil(10 / level))


def sign_flip_p(
    d: Sequence[float] | np.ndarray,
    alternative: str = "two-sided",
    *,
    n_resamples: int = MC_RESAMPLES,
    seed: int = 0,
) -> float | np.ndarray:
    """The paired sign-flip permutation test of mean(d) = 0 (scipy.stats.permutation_test, one sample,
    permutation_type='samples'): exact (all 2^n flips) for n <= EXACT_MAX_N, Monte Carlo beyond. ``d`` may be
    2-D (one row per contrast, the same flips for every row). No difference: nan."""
    from scipy import stats as sps

    d = np.asarray(d, dtype=float)
    n = d.shape[-1]
    if n == 0:
        return NAN if d.ndim == 1 else np.full(d.shape[:-1], NAN)
    if n == 1:  # scipy refuses one observation; its two flips (x, -x) give these p-values
        x = d[..., 0]
        p = np.where(x == 0, 1.0, 1.0 if alternative == "two-sided" else 0.5)
        if alternative == "greater":
            p = np.where(x < 0, 1.0, p)
        elif alternative == "less":
            p = np.where(x > 0, 1.0, p)
        return float(p) if d.ndim == 1 else p
    resamples = max(n_resamples, 2**n) if n <= EXACT_MAX_N else n_resamples
    rows = int(np.prod(d.shape[:-1])) if d.ndim > 1 else 1
    batch = max(1, min(resamples, 4_000_000 // max(1, n * rows)))  # bounded memory (batch=None holds them all)
    res = sps.permutation_test(
        (d,),
        _mean_stat,
        permutation_type="samples",
        vectorized=True,
        n_resamples=resamples,
        batch=batch,
        alternative=alternative,
        axis=-1,
        rng=seed,
    )
    p = np.minimum(np.asarray(res.pvalue, dtype=float), 1.0)
    return float(p) if d.ndim == 1 else p


def paired_p(d: np.ndarray, test: str = "permutation", *, n_resamples: int = MC_RESAMPLES) -> tuple[float, str]:
    """(two-sided p, how it was computed) for mean(d) = 0. The t-test is undefined without spread (a constant
    difference, a ceiling): there the exact sign-flip p is used, and the label says so."""
    from scipy import stats as sps

    n = len(d)
    if n == 0:
        return 1.0, "untestable: no paired seed"
    if test == "t":
        if n >= 2 and has_spread(d):
            return float(sps.ttest_1samp(d, 0.0).pvalue), "paired t-test"
        return float(sign_flip_p(d, n_resamples=n_resamples)), "sign-flip (t undefined without spread)"
    exact = "exact" if n <= EXACT_MAX_N else f"Monte Carlo, {n_resamples:,} resamples"
    return float(sign_flip_p(d, n_resamples=n_resamples)), f"sign-flip ({exact})"


def paired_p_many(
    rows: Sequence[np.ndarray], test: str = "permutation", *, n_resamples: int = MC_RESAMPLES
) -> list[tuple[float, str]]:
    """``paired_p`` for many contrasts over the same n (``ablate heads``: one row of per-sequence differences
    per head). The Monte Carlo sign-flip test runs once for all rows, with the same flips; every other case is
    ``paired_p`` row by row."""
    rows = [np.asarray(r, dtype=float) for r in rows]
    n = {len(r) for r in rows}
    if test == "permutation" and len(n) == 1 and n.pop() > EXACT_MAX_N:
        p = sign_flip_p(np.vstack(rows), n_resamples=n_resamples)
        label = f"sign-flip (Monte Carlo, {n_resamples:,} resamples)"
        return [(float(x), label) for x in p]
    return [paired_p(r, test, n_resamples=n_resamples) for r in rows]


def tost_p(d: np.ndarray, margin: float, test: str = "permutation", *, n_resamples: int = MC_RESAMPLES) -> float:
    """Two one-sided tests of |mean(d)| < margin: the larger of the p-values of H0: mean <= -m and H0: mean >= m.
    The t form is statsmodels' ttost_paired; the permutation form runs the sign-flip test on d + m
    (alternative greater) and d - m (less). 1 with no paired seed."""
    n = len(d)
    if n == 0 or not margin > 0:
        return 1.0
    if test == "t" and n >= 2 and has_spread(d):
        from statsmodels.stats.weightstats import ttost_paired

        return float(ttost_paired(d, np.zeros_like(d), -margin, margin)[0])
    low = sign_flip_p(d + margin, "greater", n_resamples=n_resamples)
    high = sign_flip_p(d - margin, "less", n_resamples=n_resamples)
    return float(max(low, high))


def hedges_correction(df: int) -> float:
    """Hedges' small-sample correction J(df) = Γ(df/2) / (√(df/2) Γ((df-1)/2)) (Hedges 1981), exact form."""
    if df < 2:
        return NAN
    return float(math.exp(special.gammaln(df / 2) - special.gammaln((df - 1) / 2)) / math.sqrt(df / 2))


def hedges_g(d: np.ndarray) -> float:
    """Hedges' g of paired differences: mean / sd, times J(n - 1). nan below three pairs or without spread.
    (No scipy or statsmodels function computes it for paired data; the formula is one line.)"""
    if len(d) < 3 or not has_spread(d):
        return NAN
    return float(d.mean() / np.std(d, ddof=1) * hedges_correction(len(d) - 1))
