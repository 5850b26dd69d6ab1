"""What a contrast's seeds could detect, and how many seeds a difference needs: the exact sign-flip test's own power
(simulated up to EXACT_POWER_MAX_N seeds), the t-test's beyond (statsmodels TTestPower)."""

from __future__ import annotations

import functools
import itertools
import math
import warnings
from collections.abc import Sequence

import numpy as np

from record.stats.family import min_p, smallest_exact_n
from record.stats.summaries import NAN, finite, has_spread

# the exact test's power is simulated up to this many seeds; beyond, the t-test's is used, which the exact test's
# approaches (the effect each needs for 80% power differed by 1-2% at 12 and 14 seeds, 24% at 6 and 8)
EXACT_POWER_MAX_N = 12
POWER_DRAWS = 4_000  # normal samples per power evaluation (standard error 0.006 at power 0.8): the same every time


def _t_power(effect_size: float, n: int, level: float) -> float:
    """The power of the two-sided paired t-test (statsmodels TTestPower). scipy's noncentral t (which
    statsmodels uses) returns nan over wide ranges of large noncentrality at few degrees of freedom (scipy
    1.17: from an effect size of about 5 at 2 seeds), so there the same power is integrated directly:
    P(|T| > c) with T = (Z + δ) / sqrt(V / df), V ~ chi2(df), δ = effect_size sqrt(n)."""
    from statsmodels.stats.power import TTestPower

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p = float(TTestPower().power(effect_size=effect_size, nobs=n, alpha=level, alternative="two-sided"))
    return p if math.isfinite(p) else t_power_integral(effect_size, n, level)


def t_power_integral(effect_size: float, n: int, level: float) -> float:
    """The two-sided paired t-test's power by integration over the chi-distributed spread (see _t_power)."""
    return noncentral_power_integral(effect_size * math.sqrt(n), n - 1, level)


def noncentral_power_integral(nc: float, df: float, level: float) -> float:
    """P(|T| > t_{1-level/2, df}) for T = (Z + nc) / sqrt(V / df), V ~ chi2(df): a two-sided t-test's power at
    noncentrality ``nc``, integrated over the chi-distributed spread with scipy's quad."""
    from scipy import stats as sps
    from scipy.integrate import quad

    c = float(sps.t.ppf(1 - level / 2, df))

    def given(u: float) -> float:  # u = sqrt(V), chi-distributed; the rejection edge is at u = nc sqrt(df) / c
        s = c * u / math.sqrt(df)
        return float((sps.norm.sf(s - nc) + sps.norm.cdf(-s - nc)) * sps.chi.pdf(u, df))

    scale = math.sqrt(df) / c  # where the rejection edge moves: u around (nc +- a few) * scale
    top = float(sps.chi.ppf(1 - 1e-15, df)) + (nc + 10) * scale
    points = sorted({min(max(0.0, nc + k) * scale, top) for k in (-5, -1, 0, 1, 5, 10)} - {0.0, top})
    return float(quad(given, 0, top, points=points, limit=400)[0])


@functools.cache
def _sign_patterns(n: int) -> np.ndarray:
    return np.array(list(itertools.product([1.0, -1.0], repeat=n))).T  # (n, 2^n): every sign flip


def sign_flip_power(effect_size: float, n: int, level: float, draws: int = POWER_DRAWS) -> float:
    """The power of the two-sided exact sign-flip test at ``level`` for n normal paired differences whose mean is
    ``effect_size`` standard deviations (the test is scale-free): the share of ``draws`` simulated samples whose
    exact p (every 2^n flip, as ``sign_flip_p``) is at most ``level``. The same draws for every effect size, so
    the power grows with it and the same question gets the same answer. The t-test's power overstated it at few
    seeds: at 6 seeds and level 0.05, 0.62 where TTestPower says 0.80. The p-values are ``sign_flip_p``'s,
    computed here for all draws at once: scipy's permutation test on the same 4,000 draws took 0.4-1.1 s against
    1-39 ms here (6-12 seeds, 2026-11-26), and brentq evaluates the power some twenty times."""
    d = np.random.default_rng(n).standard_normal((draws, n)) + effect_size
    flips, rejected = _sign_patterns(n), 0
    for chunk in np.array_split(d, max(1, draws * 2**n // 2_000_000)):  # bounded memory
        sums, observed = chunk @ flips, chunk.sum(axis=1, keepdims=True)
        tol = 1e-9 * np.abs(chunk).sum(axis=1, keepdims=True)
        p = 2 * np.minimum((sums >= observed - tol).mean(axis=1), (sums <= observed + tol).mean(axis=1))
        rejected += int((p <= level * (1 + 1e-9)).sum())
    return rejected / draws


def power_of(effect_size: float, n: int, level: float, test: str = "permutation") -> float:
    """The two-sided test's power: the exact sign-flip test's simulated up to EXACT_POWER_MAX_N seeds, the
    t-test's (statsmodels TTestPower) for the t-test and beyond."""
    if test != "t" and n <= EXACT_POWER_MAX_N:
        return sign_flip_power(effect_size, n, level)
    return _t_power(effect_size, n, level)


@functools.lru_cache(maxsize=256)
def _detectable_effect(n: int, level: float, power: float, test: str) -> float:
    """The effect size (in standard deviations) the test detects with ``power``: scipy's brentq on power_of."""
    from scipy.optimize import brentq

    hi = 1.0
    while power_of(hi, n, level, test) < power and hi < 1e6:
        hi *= 2
    if not power_of(hi, n, level, test) >= power:
        return math.inf
    return float(brentq(lambda es: power_of(es, n, level, test) - power, 1e-9, hi, xtol=1e-6))


def detectable(sd: float, n: int, level: float, power: float = 0.8, test: str = "permutation") -> float:
    """The smallest |mean difference| a two-sided test at ``level`` detects with ``power`` from n paired seeds
    whose differences have standard deviation ``sd`` (``power_of``: the exact test's own power up to
    EXACT_POWER_MAX_N seeds, the t-test's beyond, solved for the effect size with scipy's brentq). inf when no
    difference can be detected: one seed, or the exact test's smallest p is above the level. nan when the
    spread is unknown (no spread observed)."""
    if n < 2 or min_p(n, test) > level:
        return math.inf
    if not (math.isfinite(sd) and sd > 0):
        return NAN
    return _detectable_effect(n, level, power, "t" if test == "t" else "permutation") * sd


def seeds_needed(
    pilot_differences: Sequence[float],
    difference: float,
    *,
    alpha: float = 0.05,
    power: float = 0.8,
    test: str = "permutation",
    family_size: int = 1,
) -> int | None:
    """How many seeds detect a true mean paired difference of ``difference`` with ``power``, at Holm's strictest
    level alpha / family_size, from the spread of a pilot's paired differences (an earlier submission):
    ``power_of`` (the exact test's own power up to EXACT_POWER_MAX_N seeds; statsmodels TTestPower gives the
    first guess), and at least the seeds at which the test can reach that level at all.
    None when the pilot has fewer than two finite differences (no spread to go on)."""
    if not difference > 0:
        raise ValueError(f"difference: must be positive (got {difference})")
    d = finite(pilot_differences)
    if len(d) < 2:
        return None
    level = alpha / max(1, family_size)
    floor = smallest_exact_n(level, test)
    if not has_spread(d):
        return floor
    es = difference / float(np.std(d, ddof=1))
    from statsmodels.stats.power import TTestPower
    from statsmodels.tools import sm_exceptions  # noqa: F401 - its import sets "always": imported before the filter

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        guess = TTestPower().solve_power(effect_size=es, nobs=None, alpha=level, power=power, alternative="two-sided")
    guess = float(np.atleast_1d(guess)[0])
    n = max(2, math.ceil(guess) - 1) if math.isfinite(guess) else 2  # nan: a huge effect, the solver gave up
    while not _t_power(es, n, level) >= power:  # the smallest whole number of seeds that reaches the t-test's power
        n += 1
    n = max(floor, n)
    while not power_of(es, n, level, test) >= power:  # from there up: the exact test's power is lower at few seeds
        n += 1
    return n
