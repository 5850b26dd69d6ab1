"""A contrast (a paired difference, or a factorial effect computed within each seed) with its test, intervals,
equivalence test and power; Holm's correction over the family, and the verdict words."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from record.stats.family import EXACT_MAX_N, MC_RESAMPLES, min_p
from record.stats.paired import hedges_g, paired_p, resamples_for, tost_p
from record.stats.power import detectable, seeds_needed
from record.stats.summaries import BOOT_RESAMPLES, NAN, NAN2, bca_interval, finite, has_spread, t_interval


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
    exploratory: str = ""  # why it is outside the confirmatory family: added or changed after results
    look: str = ""  # a seed plan's: the look that decided it ("decided at look 2 of 4 (10 seeds, alpha 0.0055)")
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
    spread = has_spread(d)
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
    if len(seeds) >= 3 and has_spread(x) and has_spread(y):
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
    if not c.in_family and not c.exploratory:
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
    margin and the success-rate tests of the pairs. The exploratory contrasts (added or changed after results) are
    corrected the same way among themselves, outside the confirmatory family. The verdict of each. Contrasts in
    neither keep nan."""
    p_holm: dict[int, float] = {}
    p_tost: dict[int, float] = {}
    p_rate: dict[int, float] = {}
    for group in (
        [i for i, c in enumerate(contrasts) if c.in_family],
        [i for i, c in enumerate(contrasts) if c.exploratory],
    ):
        p_holm.update(zip(group, holm([contrasts[i].p for i in group])))
        with_margin = [i for i in group if math.isfinite(contrasts[i].margin)]
        p_tost.update(zip(with_margin, holm([contrasts[i].p_tost for i in with_margin])))
        with_rate = [i for i in group if math.isfinite(contrasts[i].p_rate)]
        p_rate.update(zip(with_rate, holm([contrasts[i].p_rate for i in with_rate])))
    out = []
    for i, c in enumerate(contrasts):
        c = dataclasses.replace(
            c, p_holm=p_holm.get(i, NAN), p_tost_holm=p_tost.get(i, NAN), p_rate_holm=p_rate.get(i, NAN)
        )
        out.append(dataclasses.replace(c, verdict=verdict(c, alpha, direction)))
    return out
