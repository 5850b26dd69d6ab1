"""Statistics for ablation tables, ``ablate compare``, ``ablate heads`` and the HTML report: one module, so
the same rules hold everywhere. docs/statistics.md explains every number.

- Successes: a variant's cells that finished and learned, out of its cells, with the exact (Clopper-Pearson)
  interval (``scipy.stats.binomtest``); a success rate against its comparator by Fisher's exact test.
- Paired contrasts (a variant against a comparator over the seeds both have): the mean difference; the exact
  paired sign-flip permutation test (``scipy.stats.permutation_test``, every one of the 2^n sign flips for
  n <= 16 seeds, Monte Carlo beyond), or the paired t-test; the Student-t and BCa bootstrap intervals;
  Hedges' g; equivalence by two one-sided tests (TOST) against a margin; the smallest difference the seeds
  could detect and the seeds a stated difference needs (the exact test's own power, simulated, up to 12 seeds;
  ``statsmodels`` TTestPower for the t-test and beyond); the correlation between
  the paired runs (what pairing bought).
- Factorial effects of a grid: main effects and interactions computed within each seed from its own cells (the
  difference, or the difference of differences) and tested like a paired difference, so that a Holm family
  holds tests of one kind; a seed without every cell of an effect stays out of it, as a pair's seed without
  both values does.
- Holm's correction (``statsmodels.stats.multitest``) over exactly the declared family; a contrast with no
  data counts in it with p = 1 (it never silently leaves the family).
- Verdicts: the words "different (better|worse)", "equivalent within ±m", "not resolved" and "untestable" come
  from the tests only; "not testable here" (dashboards/verdicts.py) from the room and convergence checks.

statsmodels and scipy.stats are imported inside the functions that need them (about a second and 0.8 s): a driver
that only plans its cells (holm_floor, smallest_exact_n) does not pay for them.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import special

from ablations.spec.family import (  # noqa: F401  (the family's names and floors, part of this module's interface)
    EXACT_MAX_N,
    MC_RESAMPLES,
    effect_labels,
    holm_best_steps,
    holm_floor,
    interaction_label,
    main_label,
    min_p,
    smallest_exact_n,
)

NAN = math.nan
NAN2 = (NAN, NAN)
BOOT_RESAMPLES = 9_999
# the exact test's power is simulated up to this many seeds; beyond, the t-test's is used, which the exact test's
# approaches (the effect each needs for 80% power differed by 1-2% at 12 and 14 seeds, 24% at 6 and 8)
EXACT_POWER_MAX_N = 12
POWER_DRAWS = 4_000  # normal samples per power evaluation (standard error 0.006 at power 0.8): the same every time
BOOT_UNDER_COVERS_BELOW = 20  # BCa covered 73% / 80% / 91% / 92% at 3 / 5 / 10 / 20 seeds (docs/statistics.md)
TESTS = {"permutation": "exact paired sign-flip permutation test", "t": "paired t-test"}


def finite(values: Iterable[float | None]) -> np.ndarray:
    x = np.asarray([float(v) for v in values if v is not None], dtype=float)
    return x[np.isfinite(x)]


def _spread(x: np.ndarray) -> bool:
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

    if len(x) < 2 or not _spread(x):
        return NAN2
    lo, hi = sps.t.interval(confidence, len(x) - 1, loc=float(x.mean()), scale=float(sps.sem(x)))
    return float(lo), float(hi)


def bca_interval(
    x: np.ndarray, confidence: float = 0.95, n_resamples: int = BOOT_RESAMPLES, seed: int = 0
) -> tuple[float, float]:
    """BCa bootstrap interval of the mean (scipy.stats.bootstrap); nan below three values or without spread."""
    from scipy import stats as sps

    if len(x) < 3 or not _spread(x):
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
    if len(x) > 1 and not _spread(x):
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


# --- paired tests -------------------------------------------------------------------------------------------


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
        if n >= 2 and _spread(d):
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
    if test == "t" and n >= 2 and _spread(d):
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
    if len(d) < 3 or not _spread(d):
        return NAN
    return float(d.mean() / np.std(d, ddof=1) * hedges_correction(len(d) - 1))


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
    if not _spread(d):
        return floor
    es = difference / float(np.std(d, ddof=1))
    from statsmodels.stats.power import TTestPower

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


# --- contrasts ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Contrast:
    """One comparison: a pair of variants (Δ = a − b over the seeds both have) or a factorial effect."""

    label: str
    kind: str  # pair | main | interaction
    a: str
    b: str
    n: int  # paired seeds (pairs) or seeds with data (effects)
    estimate: float
    ci_t: tuple[float, float]
    p: float  # two-sided, uncorrected; 1 when untestable
    method: str  # how p was computed
    seeds: tuple[Any, ...] = ()
    differences: tuple[float, ...] = ()  # per seed: the paired difference, or the effect within that seed
    ci_boot: tuple[float, float] = NAN2
    spread: bool = True  # False: every seed gave the same difference (no interval can be estimated)
    sd: float = NAN  # of the per-seed differences (or effects)
    min_p: float = NAN  # the smallest p the test can give here
    hedges_g: float = NAN
    correlation: float = NAN  # between the paired runs' values, across seeds
    sd_unpaired: float = NAN  # sqrt(var(a) + var(b)): the spread of Δ had the runs not been paired
    margin: float = NAN
    p_tost: float = NAN
    mde: float = NAN  # the smallest |Δ| detectable at the family's strictest level with the stated power
    seeds_needed: int | None = None  # for the analysis' detect difference
    p_rate: float = NAN  # Fisher's exact test of the two success rates (pairs)
    in_family: bool = True
    p_holm: float = NAN
    p_tost_holm: float = NAN
    p_rate_holm: float = NAN
    verdict: str = ""
    note: str = ""
    imputed: int = 0  # pairs: the seeds with a value imputed for a failure (either side), under the failure rule
    all_imputed: str = ""  # pairs: the side (a or b) every one of whose values here was imputed, if any
    untestable_here: str = ""  # why the verdict is "not testable here" (no room, not converged); "" when testable
    make_testable: str = ""  # what would make it testable

    @property
    def testable(self) -> bool:
        return self.n > 0 and not self.method.startswith("untestable")


def _seed_order(s: Any) -> tuple[str, Any]:
    return (str(type(s)), s)


def seed_contrast(
    per_seed: dict[Any, float],
    *,
    label: str,
    kind: str = "pair",
    a: str = "",
    b: str = "",
    test: str = "permutation",
    confidence: float = 0.95,
    margin: float | None = None,
    power: float = 0.8,
    level: float | None = None,
    detect: float | None = None,
    family_size: int = 1,
    n_boot: int = BOOT_RESAMPLES,
    seed: int = 0,
    missing: str = "both",
) -> Contrast:
    """A contrast from one value per seed: a paired difference, or a factorial effect computed within each seed
    (the difference of differences of one seed's own cells). Every kind goes through the same test, so a Holm
    family holds tests of one kind. ``level``: where the detectable difference is stated (default
    (1 - confidence) / family_size, Holm's strictest step); ``missing``: what a seed lacks when none enters."""
    alpha = 1 - confidence
    level = alpha / max(1, family_size) if level is None else level
    seeds = tuple(sorted((s for s, v in per_seed.items() if finite([v]).size), key=_seed_order))
    d = np.array([float(per_seed[s]) for s in seeds])
    n = len(d)
    margin = NAN if margin is None else float(margin)
    if n == 0:
        return Contrast(
            label, kind, a, b, 0, NAN, NAN2, 1.0, f"untestable: no seed has {missing}", margin=margin,
            p_tost=1.0 if math.isfinite(margin) else NAN, min_p=1.0, mde=math.inf,
            note=f"no seed has a value for {missing}",
        )  # fmt: skip
    resamples = resamples_for(level) if n > EXACT_MAX_N else MC_RESAMPLES
    p, method = paired_p(d, test, n_resamples=resamples)
    spread = _spread(d)
    sd = float(np.std(d, ddof=1)) if n > 1 and spread else (0.0 if n > 1 else NAN)
    notes = []
    if n > 1 and not spread:
        notes.append(
            f"the same difference in all {n} seeds: no interval; smallest attainable p {min_p(n, 'permutation'):.3g}"
        )
    if n == 1:
        notes.append("one paired seed")
    needed = None
    if detect is not None and n >= 2:
        needed = seeds_needed(d, detect, alpha=alpha, power=power, test=test, family_size=family_size)
    exact = test if spread else "permutation"
    return Contrast(
        label, kind, a, b, n, float(d.mean()), t_interval(d, confidence), p, method,
        seeds=seeds, differences=tuple(float(v) for v in d), ci_boot=bca_interval(d, confidence, n_boot, seed),
        spread=spread or n < 2, sd=sd, min_p=min_p(n, exact, resamples), hedges_g=hedges_g(d), margin=margin,
        p_tost=tost_p(d, margin, test, n_resamples=resamples) if math.isfinite(margin) else NAN,
        mde=detectable(sd, n, level, power, exact), seeds_needed=needed, note="; ".join(notes),
    )  # fmt: skip


def paired_contrast(
    comparator: dict[Any, float],
    variant: dict[Any, float],
    *,
    label: str = "",
    a: str = "",
    b: str = "",
    **options: Any,
) -> Contrast:
    """variant − comparator over the seeds where both have a finite value (``seed_contrast``'s options), with the
    correlation between the paired runs and the spread the difference would have had unpaired."""
    from scipy import stats as sps

    seeds = [s for s in set(comparator) & set(variant) if finite([comparator[s]]).size and finite([variant[s]]).size]
    seeds.sort(key=_seed_order)
    x = np.array([float(variant[s]) for s in seeds])
    y = np.array([float(comparator[s]) for s in seeds])
    c = seed_contrast(dict(zip(seeds, x - y)), label=label or f"{a} vs {b}", a=a, b=b, **options)
    corr = NAN
    if len(seeds) >= 3 and _spread(x) and _spread(y):
        corr = float(sps.pearsonr(x, y).statistic)
    sd_unpaired = float(math.sqrt(np.var(x, ddof=1) + np.var(y, ddof=1))) if len(seeds) > 1 else NAN
    return dataclasses.replace(c, correlation=corr, sd_unpaired=sd_unpaired)


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm-adjusted p-values, in the order given (statsmodels multipletests, method='holm'). A nan counts as
    p = 1: a contrast without an answer stays in the family, which therefore never shrinks."""
    if not len(pvalues):
        return []
    from statsmodels.stats.multitest import multipletests

    p = np.array([float(x) if x is not None and math.isfinite(float(x)) else 1.0 for x in pvalues])
    if len(p) == 1:  # a family of one: nothing to correct (multipletests would also run a full gc.collect())
        return [float(p[0])]
    return [float(v) for v in multipletests(p, method="holm")[1]]


def verdict(c: Contrast, alpha: float, direction: str = "minimize") -> str:
    """The verdict words, from the corrected tests only."""
    if not c.in_family:
        return "not in the family"
    if not c.testable:
        return "untestable"
    if c.untestable_here:  # the test still runs and counts in the family; its words would claim too much
        return "not testable here"
    m = c.margin
    equivalent = math.isfinite(m) and math.isfinite(c.p_tost_holm) and c.p_tost_holm <= alpha
    within = f"equivalent within ±{m:.3g}"
    if c.p_holm <= alpha:
        if c.kind == "interaction":
            word = "different"
        else:
            better = c.estimate < 0 if direction == "minimize" else c.estimate > 0
            word = f"different ({'better' if better else 'worse'})"
        return word + (f", {within}" if equivalent else "")
    return within if equivalent else "not resolved"


def correct(contrasts: list[Contrast], alpha: float, direction: str = "minimize") -> list[Contrast]:
    """Holm over the contrasts in the family: the difference tests; apart, the equivalence tests of those with a
    margin and the success-rate tests of the pairs. The verdict of each. Contrasts outside the family keep nan."""
    fam = [i for i, c in enumerate(contrasts) if c.in_family]
    p_holm = dict(zip(fam, holm([contrasts[i].p for i in fam])))
    with_margin = [i for i in fam if math.isfinite(contrasts[i].margin)]
    p_tost = dict(zip(with_margin, holm([contrasts[i].p_tost for i in with_margin])))
    with_rate = [i for i in fam if math.isfinite(contrasts[i].p_rate)]
    p_rate = dict(zip(with_rate, holm([contrasts[i].p_rate for i in with_rate])))
    out = []
    for i, c in enumerate(contrasts):
        c = dataclasses.replace(
            c, p_holm=p_holm.get(i, NAN), p_tost_holm=p_tost.get(i, NAN), p_rate_holm=p_rate.get(i, NAN)
        )
        out.append(dataclasses.replace(c, verdict=verdict(c, alpha, direction)))
    return out


# --- factorial effects --------------------------------------------------------------------------------------


def _levels(df: Any, factor: str) -> list[str]:
    return list(dict.fromkeys(str(x) for x in df[factor]))


Weights = dict[tuple[str, ...], float]  # cell (the levels of every factor) -> its weight in a contrast


def _main_weights(cells: set[tuple], i: int, level: str, ref: str) -> tuple[Weights, int, int]:
    """The main effect of factor ``i`` (level against ref), averaged over the other factors' combinations where
    both cells were run: (weights, combinations used, combinations there are)."""
    weights: Weights = {}
    total = {k[:i] + k[i + 1 :] for k in cells if k[i] in (level, ref)}
    used = [k[:i] + k[i + 1 :] for k in cells if k[i] == level and k[:i] + (ref,) + k[i + 1 :] in cells]
    for rest in used:
        weights[rest[:i] + (level,) + rest[i:]] = 1 / len(used)
        weights[rest[:i] + (ref,) + rest[i:]] = -1 / len(used)
    return weights, len(used), len(total)


def _interaction_weights(cells: set[tuple], i: int, j: int, ab: tuple[str, str], ref: tuple[str, str]):
    """The interaction of factors i and j (levels ``ab`` against ``ref``): the difference of differences,
    averaged over the remaining factors' combinations where all four corners were run."""

    def at(key: tuple, x: str, y: str) -> tuple:
        k = list(key)
        k[i], k[j] = x, y
        return tuple(k)

    rest = lambda k: tuple(x for n, x in enumerate(k) if n not in (i, j))  # noqa: E731
    total = {rest(k) for k in cells if k[i] in (ab[0], ref[0]) and k[j] in (ab[1], ref[1])}
    corners = [((ab[0], ab[1]), 1), ((ref[0], ab[1]), -1), ((ab[0], ref[1]), -1), ((ref[0], ref[1]), 1)]
    used = [k for k in cells if (k[i], k[j]) == ab and all(at(k, x, y) in cells for (x, y), _ in corners)]
    weights: Weights = {}
    for key in used:
        for (x, y), w in corners:
            weights[at(key, x, y)] = weights.get(at(key, x, y), 0) + w / len(used)
    return weights, len(used), len(total)


def _per_seed(values: dict[tuple, dict[Any, float]], weights: Weights) -> dict[Any, float]:
    """Each seed's own contrast: the weighted sum of its cells' values, for the seeds that have every cell."""
    seeds = set.intersection(*(set(values.get(k, {})) for k in weights)) if weights else set()
    return {s: sum(w * values[k][s] for k, w in weights.items()) for s in seeds}


def factorial_effects(
    df: Any,
    factors: list[str],
    metric: str,
    seed_col: str = "seed",
    *,
    declared_main: Sequence[str] | None = None,
    declared_interactions: Sequence[tuple[str, str]] | None = None,
    **options: Any,
) -> list[Contrast]:
    """Main effects (each level against the first, averaged over the other axes' combinations) and two-way
    interactions (the difference of differences, averaged over the remaining axes), each computed within every
    seed from that seed's own cells and tested like a paired difference (``seed_contrast``: the same exact test,
    intervals and power as the pairs, so one Holm family holds tests of one kind; a pooled OLS variance gave an
    interaction p of 6e-18 where the cells' spreads differed 64-fold). A seed enters an effect when it has every
    cell of it; an effect averages only over the combinations where all its cells were run (the note says how
    many). ``declared_*``: those in the family (None: none); ``options``: ``seed_contrast``'s."""
    rows = df[[*factors, seed_col, metric]]
    values: dict[tuple, dict[Any, float]] = {}
    for *key, s, y in rows.itertuples(index=False, name=None):
        if finite([y]).size:
            values.setdefault(tuple(str(k) for k in key), {})[s] = float(y)
    if not values:
        return []
    cells, levels = set(values), {f: _levels(df, f) for f in factors}
    declared_inter = {frozenset(p) for p in (declared_interactions or ())}
    out = []
    for i, f in enumerate(factors):
        for level in levels[f][1:]:
            weights, used, total = _main_weights(cells, i, level, levels[f][0])
            label = main_label(f, level, levels[f][0])
            c = _effect(values, weights, label, "main", level, levels[f][0], options)
            out.append(_noted(c, used, total, f in set(declared_main or ())))
    for i, j in itertools.combinations(range(len(factors)), 2):
        fi, fj = factors[i], factors[j]
        ref = (levels[fi][0], levels[fj][0])
        for ab in itertools.product(levels[fi][1:], levels[fj][1:]):
            weights, used, total = _interaction_weights(cells, i, j, ab, ref)
            label = interaction_label(fi, fj, ab, ref)
            c = _effect(values, weights, label, "interaction", " x ".join(ab), " x ".join(ref), options)
            out.append(_noted(c, used, total, frozenset((fi, fj)) in declared_inter))
    return out


def _effect(values, weights: Weights, label: str, kind: str, a: str, b: str, options: dict) -> Contrast:
    per_seed = _per_seed(values, weights)
    return seed_contrast(per_seed, label=label, kind=kind, a=a, b=b, missing="every cell of it", **options)


def _noted(c: Contrast, used: int, total: int, in_family: bool) -> Contrast:
    note = c.note
    if used == 0:
        note = "no combination of the other axes has every cell"
    elif used < total:
        extra = f"averaged over the {used} of {total} combinations of the other axes where every cell was run"
        note = "; ".join(x for x in (c.note, extra) if x)
    return dataclasses.replace(c, in_family=in_family, note=note)
