"""A contrast (a paired difference, or a factorial effect computed within each seed) with its test, intervals,
equivalence test and power; Holm's correction over the family, and the verdict words.

A contrast is built in three stages, each a typed value made once: ``Measured`` (what the seeds' values say:
``seed_contrast``), ``Standing`` (where the study puts it: its family, an exploratory mark, what the miniature
cannot test, its failures: ``record.judge``) and ``Corrected`` (the family's correction: Holm's, ``correct``, or a
seed plan's closed group-sequential test, ``record.stats.plans``). ``Contrast`` holds the three and reads their
fields as its own; its verdict is computed from them in one place, ``verdict``.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from record.stats.family import EXACT_MAX_N, MC_RESAMPLES, min_p
from record.stats.paired import hedges_g, paired_p, resamples_for, tost_p
from record.stats.power import detectable, seeds_needed
from record.stats.summaries import BOOT_RESAMPLES, NAN, NAN2, bca_interval, finite, has_spread, t_interval


@dataclass(frozen=True, kw_only=True)
class Measured:
    """What the seeds' values say of one comparison: a pair of variants (Δ = a − b over the seeds both have) or a
    factorial effect. Built once, by ``seed_contrast``."""

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
    margin: float | None = None  # the declared equivalence margin, on its scale (none: equivalence is not tested)
    margin_scale: str = "absolute"  # absolute (the metric's units) | log (the per-seed contrast of log values)
    margin_text: str = ""  # how the margin reads as declared ("±0.05 of the comparator (ratio)"); "": ±margin
    on_scale: tuple[float, ...] = ()  # a log-scale margin's: each seed's contrast of log values, which TOST tests
    p_tost: float = NAN
    mde: float = NAN  # the smallest |Δ| detectable at the family's strictest level with the stated power
    seeds_needed: int | None = None  # for the analysis' detect difference
    note: str = ""


@dataclass(frozen=True)
class MarginOf:
    """A declared equivalence margin as its test runs it: ``value`` on ``scale`` (absolute: the metric's units;
    log: the contrast of log values, where a relative margin r is log(1 + r)), and how it reads."""

    value: float
    scale: str = "absolute"
    text: str = ""


@dataclass(frozen=True, kw_only=True)
class Standing:
    """Where the study puts a contrast: in its confirmatory family or not, exploratory (added or changed after
    results), not testable by this miniature (no room, not converged), and what its failures say."""

    in_family: bool = True
    exploratory: str = ""  # why it is outside the confirmatory family: added or changed after results
    untestable_here: str = ""  # why the verdict is "not testable here" (no room, not converged); "" when testable
    make_testable: str = ""  # what would make it testable
    p_rate: float = NAN  # Fisher's exact test of the two success rates (pairs)
    imputed: int = 0  # pairs: the seeds with a value imputed for a failure (either side), under the failure rule
    all_imputed: str = ""  # pairs: the side (a or b) every one of whose values here was imputed, if any
    comparator: float = NAN  # the comparator's mean (a pair's b, a main effect's reference level)
    # why no equivalence can be shown here: the margin reaches past the metric's end from the comparator's level
    equivalence_untestable_here: str = ""
    make_equivalence_testable: str = ""


@dataclass(frozen=True, kw_only=True)
class Corrected:
    """The family's correction of a contrast's tests, at ``alpha``, read in ``direction``."""

    alpha: float
    direction: str = "minimize"
    p_holm: float = NAN
    p_tost_holm: float = NAN
    p_rate_holm: float = NAN
    procedure: str = ""  # how the family was corrected, when not by Holm over fixed samples


@dataclass(frozen=True)
class Contrast:
    """One comparison, its stages held whole: ``Measured`` and ``Standing`` fields read as the contrast's own
    (``c.estimate``, ``c.in_family``); ``p_holm``, ``p_tost_holm``, ``p_rate_holm`` nan and ``verdict`` "" until
    it is corrected."""

    measured: Measured
    standing: Standing = Standing()
    corrected: Corrected | None = None

    @property
    def testable(self) -> bool:
        return self.n > 0 and not self.measured.method.startswith("untestable")

    @property
    def method(self) -> str:
        procedure = self.corrected.procedure if self.corrected else ""
        return f"{self.measured.method}; {procedure}" if procedure else self.measured.method

    @property
    def p_holm(self) -> float:
        return self.corrected.p_holm if self.corrected else NAN

    @property
    def p_tost_holm(self) -> float:
        return self.corrected.p_tost_holm if self.corrected else NAN

    @property
    def p_rate_holm(self) -> float:
        return self.corrected.p_rate_holm if self.corrected else NAN

    @property
    def verdict(self) -> str:
        return verdict(self)

    def placed(self, standing: Standing) -> Contrast:
        """This measurement where the study puts it (uncorrected: a standing changes the family)."""
        return Contrast(self.measured, standing)

    def corrected_by(self, correction: Corrected) -> Contrast:
        return Contrast(self.measured, self.standing, correction)


def _read_through(cls: type, stages: dict[str, type]) -> None:
    """Give ``cls`` a read-only property for each field of its stages (``c.estimate`` is ``c.measured.estimate``):
    a reader asks a contrast, not the stage that set the value."""
    for stage, kind in stages.items():
        for f in dataclasses.fields(kind):
            if f.name not in vars(cls):
                setattr(cls, f.name, property(operator.attrgetter(f"{stage}.{f.name}"), doc=f"{stage}.{f.name}"))


_read_through(Contrast, {"measured": Measured, "standing": Standing})


def _seed_order(s: Any) -> tuple[int, Any]:
    """Numbers by value (an int and a numpy integer alike), anything else by its text after them."""
    return (0, float(s)) if isinstance(s, numbers.Real) else (1, str(s))


def measure(
    per_seed: dict[Any, float],
    *,
    label: str,
    kind: str = "pair",
    a: str = "",
    b: str = "",
    test: str = "permutation",
    confidence: float = 0.95,
    margin: float | MarginOf | None = None,
    scaled: dict[Any, float] | None = None,
    power: float = 0.8,
    level: float | None = None,
    detect: float | None = None,
    family_size: int = 1,
    n_boot: int = BOOT_RESAMPLES,
    seed: int = 0,
    missing: str = "both",
    correlation: float = NAN,
    sd_unpaired: float = NAN,
    also: str = "",
) -> Measured:
    """What one value per seed says: a paired difference, or a factorial effect computed within each seed (the
    difference of differences of one seed's own cells). Every kind goes through the same test, so a Holm family
    holds tests of one kind. ``level``: where the detectable difference is stated (default (1 - confidence) /
    family_size, Holm's strictest step); ``missing``: what a seed lacks when none enters; ``correlation`` and
    ``sd_unpaired``: a pair's, from its two sides; ``also``: a note of the caller's; ``scaled``: each seed's
    contrast of log values, which a log-scale ``margin`` tests."""
    alpha = 1 - confidence
    level = alpha / max(1, family_size) if level is None else level
    seeds = tuple(sorted((s for s, v in per_seed.items() if finite([v]).size), key=_seed_order))
    d = np.array([float(per_seed[s]) for s in seeds])
    n = len(d)
    m = margin if isinstance(margin, MarginOf) or margin is None else MarginOf(float(margin))
    named = dict(label=label, kind=kind, a=a, b=b, margin=None if m is None else m.value)
    if m is not None:
        named.update(margin_scale=m.scale, margin_text=m.text)
    if n == 0:
        return Measured(
            **named, n=0, estimate=NAN, ci_t=NAN2, p=1.0, method=f"untestable: no seed has {missing}",
            p_tost=NAN if m is None else 1.0, min_p=1.0, mde=math.inf,
            note=also or f"no seed has a value for {missing}",
        )  # fmt: skip
    resamples = resamples_for(level) if n > EXACT_MAX_N else MC_RESAMPLES
    p, method = paired_p(d, test, n_resamples=resamples)
    spread = has_spread(d)
    sd = float(np.std(d, ddof=1)) if n > 1 and spread else (0.0 if n > 1 else NAN)
    needed = None
    if detect is not None and n >= 2:
        needed = seeds_needed(d, detect, alpha=alpha, power=power, test=test, family_size=family_size)
    exact = test if spread else "permutation"
    p_tost, on_scale, unscaled = _tost(d, seeds, m, scaled, test, resamples)
    return Measured(
        **named, n=n, estimate=float(d.mean()), ci_t=t_interval(d, confidence), p=p, method=method,
        seeds=seeds, differences=tuple(float(v) for v in d), ci_boot=bca_interval(d, confidence, n_boot, seed),
        spread=spread or n < 2, sd=sd, min_p=min_p(n, exact, resamples), hedges_g=hedges_g(d),
        correlation=correlation, sd_unpaired=sd_unpaired,
        p_tost=p_tost, on_scale=on_scale,
        mde=detectable(sd, n, level, power, exact), seeds_needed=needed, note=_note(n, spread, also, unscaled),
    )  # fmt: skip


def _tost(
    d: np.ndarray, seeds: tuple, m: MarginOf | None, scaled: dict | None, test: str, resamples: int
) -> tuple[float, tuple[float, ...], str]:
    """(the two one-sided tests' p against the margin on its scale, the per-seed values tested where that is the
    log scale, and why there is none: a log scale needs every value positive)."""
    if m is None:
        return NAN, (), ""
    if m.scale == "absolute":
        return tost_p(d, m.value, test, n_resamples=resamples), (), ""
    x = [float((scaled or {}).get(s, math.nan)) for s in seeds]
    if not all(math.isfinite(v) for v in x):
        return NAN, (), "no equivalence test: a margin on the log scale needs a positive value in every cell"
    x = np.asarray(x)
    return tost_p(x, m.value, test, n_resamples=resamples), tuple(float(v) for v in x), ""


def _note(n: int, spread: bool, also: str, more: str = "") -> str:
    notes = [more] if more else []
    if n > 1 and not spread:
        notes.append(
            f"the same difference in all {n} seeds: no interval; smallest attainable p {min_p(n, 'permutation'):.3g}"
        )
    if n == 1:
        notes.append("one paired seed")
    return "; ".join(x for x in (*notes, also) if x)


def seed_contrast(per_seed: dict[Any, float], *, in_family: bool = True, **options: Any) -> Contrast:
    """A contrast from one value per seed (``measure``'s options), in the family unless told otherwise."""
    return Contrast(measure(per_seed, **options), Standing(in_family=in_family))


def paired_contrast(
    comparator: dict[Any, float],
    variant: dict[Any, float],
    *,
    label: str = "",
    a: str = "",
    b: str = "",
    **options: Any,
) -> Contrast:
    """variant − comparator over the seeds where both have a finite value (``measure``'s options), with the
    correlation between the paired runs and the spread the difference would have had unpaired."""
    from scipy import stats as sps

    seeds = [s for s in set(comparator) & set(variant) if finite([comparator[s]]).size and finite([variant[s]]).size]
    seeds.sort(key=_seed_order)
    x = np.array([float(variant[s]) for s in seeds])
    y = np.array([float(comparator[s]) for s in seeds])
    corr = NAN
    if len(seeds) >= 3 and has_spread(x) and has_spread(y):
        corr = float(sps.pearsonr(x, y).statistic)
    sd_unpaired = float(math.sqrt(np.var(x, ddof=1) + np.var(y, ddof=1))) if len(seeds) > 1 else NAN
    per_seed = dict(zip(seeds, x - y))
    if on_log_scale(options.get("margin")):
        options["scaled"] = {s: math.log(v / c) for s, v, c in zip(seeds, x, y) if v > 0 and c > 0}
    return seed_contrast(
        per_seed, label=label or f"{a} vs {b}", a=a, b=b, correlation=corr, sd_unpaired=sd_unpaired, **options
    )


def on_log_scale(margin: Any) -> bool:
    """A margin tested on the contrast of log values (a relative or log margin)."""
    return isinstance(margin, MarginOf) and margin.scale == "log"


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


NO_EQUIVALENCE = "equivalence not testable here"  # record.testable says why


def verdict(c: Contrast) -> str:
    """The verdict words, from the corrected tests only ("" before the family is corrected): the one place they
    are decided."""
    if c.corrected is None:
        return ""
    if not c.in_family and not c.exploratory:
        return "not in the family"
    if not c.testable:
        return "untestable"
    if c.untestable_here:  # the test still runs and counts in the family; its words would claim too much
        return "not testable here"
    m, alpha = c.margin, c.corrected.alpha
    if c.p_holm <= alpha:
        if c.kind == "interaction":
            word = "different"
        else:
            better = c.estimate < 0 if c.corrected.direction == "minimize" else c.estimate > 0
            word = f"different ({'better' if better else 'worse'})"
    else:
        word = "not resolved"
    if m is None:
        return word
    if c.equivalence_untestable_here:  # one of its two one-sided tests cannot fail: it would claim too much
        return f"{word}; {NO_EQUIVALENCE}"
    if math.isfinite(c.p_tost_holm) and c.p_tost_holm <= alpha:
        within = f"equivalent within {c.margin_text or f'±{m:.3g}'}"
        return within if word == "not resolved" else f"{word}, {within}"
    return word


def correct(contrasts: list[Contrast], alpha: float, direction: str = "minimize") -> list[Contrast]:
    """Holm over the contrasts in the family: the difference tests; apart, the equivalence tests of those with a
    margin and the success-rate tests of the pairs. The exploratory contrasts (added or changed after results) are
    corrected the same way among themselves, outside the confirmatory family. Contrasts in neither keep nan."""
    p_holm: dict[int, float] = {}
    p_tost: dict[int, float] = {}
    p_rate: dict[int, float] = {}
    for group in (
        [i for i, c in enumerate(contrasts) if c.in_family],
        [i for i, c in enumerate(contrasts) if c.exploratory],
    ):
        p_holm.update(zip(group, holm([contrasts[i].p for i in group])))
        with_margin = [i for i in group if contrasts[i].margin is not None]
        p_tost.update(zip(with_margin, holm([contrasts[i].p_tost for i in with_margin])))
        with_rate = [i for i in group if math.isfinite(contrasts[i].p_rate)]
        p_rate.update(zip(with_rate, holm([contrasts[i].p_rate for i in with_rate])))
    return [
        c.corrected_by(
            Corrected(
                alpha=alpha,
                direction=direction,
                p_holm=p_holm.get(i, NAN),
                p_tost_holm=p_tost.get(i, NAN),
                p_rate_holm=p_rate.get(i, NAN),
            )
        )  # fmt: skip
        for i, c in enumerate(contrasts)
    ]
