"""Seed statistics for ablation tables.

- ``describe``: a variant's metric over its seeds: mean, sample standard deviation, and two 95% intervals
  of the mean, Student's t (exact for normal data) and the percentile bootstrap (Efron and Tibshirani 1993;
  no normality assumed, but optimistic for very few seeds).
- ``paired``: a variant against the baseline over the seeds both have (the same seed gives both the same
  data order and initialisation draw, so pairing removes that variance): mean difference with its t and
  bootstrap intervals, the paired t-test and the Wilcoxon signed-rank test (two-sided), and Cohen's d_z.
- ``holm``: Holm's step-down correction (Holm 1979) of the p-values of several variants against one
  baseline; it controls the family-wise error rate without assuming independence.
- ``main_effects`` / ``interactions``: for full factorial designs, each level against the reference level
  averaged over the other axes, and the difference of differences of two axes, estimated per seed and
  summarised over seeds with a t interval.
- ``rates``: failure and divergence rates of a variant's cells.

Non-finite values (a diverged run's nan) are dropped before anything is computed; an estimate that needs
two values and has fewer is nan, never zero.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats as sps

NAN = math.nan
NAN2 = (NAN, NAN)


@dataclass(frozen=True)
class Summary:
    n: int
    mean: float
    std: float
    sem: float
    ci_t: tuple[float, float]
    ci_boot: tuple[float, float]


def _finite(values: Iterable[float]) -> np.ndarray:
    x = np.asarray([float(v) for v in values if v is not None], dtype=float)
    return x[np.isfinite(x)]


def _t_interval(x: np.ndarray, confidence: float) -> tuple[float, float]:
    if len(x) < 2:
        return NAN2
    sem = float(np.std(x, ddof=1) / math.sqrt(len(x)))
    if sem == 0:
        return float(x.mean()), float(x.mean())
    lo, hi = sps.t.interval(confidence, len(x) - 1, loc=float(x.mean()), scale=sem)
    return float(lo), float(hi)


def _boot_interval(x: np.ndarray, confidence: float, n_boot: int, seed: int) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean."""
    if len(x) < 2:
        return NAN2
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, len(x), size=(n_boot, len(x)))].mean(axis=1)
    a = (1 - confidence) / 2
    return float(np.quantile(means, a)), float(np.quantile(means, 1 - a))


def describe(values: Iterable[float], *, confidence: float = 0.95, n_boot: int = 10_000, seed: int = 0) -> Summary:
    x = _finite(values)
    if len(x) == 0:
        return Summary(0, NAN, NAN, NAN, NAN2, NAN2)
    std = float(np.std(x, ddof=1)) if len(x) > 1 else NAN
    sem = std / math.sqrt(len(x)) if len(x) > 1 else NAN
    return Summary(
        len(x), float(x.mean()), std, sem, _t_interval(x, confidence), _boot_interval(x, confidence, n_boot, seed)
    )


@dataclass(frozen=True)
class Paired:
    n: int
    seeds: tuple[int, ...]
    mean_diff: float
    ci_t: tuple[float, float]
    ci_boot: tuple[float, float]
    p_t: float
    p_wilcoxon: float
    effect_size: float
    p_holm: float = NAN


def paired(
    baseline: dict[int, float],
    variant: dict[int, float],
    *,
    confidence: float = 0.95,
    n_boot: int = 10_000,
    seed: int = 0,
) -> Paired:
    """variant - baseline over the seeds where both have a finite value."""
    seeds = tuple(
        sorted(s for s in set(baseline) & set(variant) if _finite([baseline[s]]).size and _finite([variant[s]]).size)
    )
    d = np.array([float(variant[s]) - float(baseline[s]) for s in seeds])
    if len(d) == 0:
        return Paired(0, (), NAN, NAN2, NAN2, NAN, NAN, NAN)
    mean = float(d.mean())
    if len(d) < 2:
        return Paired(1, seeds, mean, NAN2, NAN2, NAN, NAN, NAN)
    sd = float(np.std(d, ddof=1))
    if np.all(d == 0):
        p_t, p_w, effect = NAN, 1.0, 0.0
    else:
        a = np.array([float(baseline[s]) for s in seeds])
        b = np.array([float(variant[s]) for s in seeds])
        with warnings.catch_warnings():  # scipy warns about precision when differences are nearly equal
            warnings.simplefilter("ignore", RuntimeWarning)
            p_t = float(sps.ttest_rel(b, a).pvalue) if sd > 0 else NAN
            p_w = float(sps.wilcoxon(b, a).pvalue)
        effect = mean / sd if sd > 0 else NAN
    return Paired(
        len(d), seeds, mean, _t_interval(d, confidence), _boot_interval(d, confidence, n_boot, seed), p_t, p_w, effect
    )


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values, in the order given; nan stays nan and does not count."""
    idx = [i for i, p in enumerate(pvalues) if isinstance(p, (int, float)) and math.isfinite(p)]
    m = len(idx)
    out = [NAN] * len(pvalues)
    running = 0.0
    for rank, i in enumerate(sorted(idx, key=lambda i: pvalues[i])):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        out[i] = running
    return out


def holm_adjust(comparisons: dict[str, Paired], use: str = "p_t") -> dict[str, Paired]:
    names = list(comparisons)
    adjusted = holm([getattr(comparisons[n], use) for n in names])
    return {n: dataclasses.replace(comparisons[n], p_holm=p) for n, p in zip(names, adjusted)}


@dataclass(frozen=True)
class Rates:
    n: int
    finished: int
    diverged: int
    failed: int
    divergence_rate: float
    failure_rate: float


def rates(states: Iterable[str]) -> Rates:
    states = list(states)
    n = len(states)
    f, d, x = (sum(s == k for s in states) for k in ("finished", "diverged", "failed"))
    return Rates(n, f, d, x, d / n if n else NAN, x / n if n else NAN)


@dataclass(frozen=True)
class Effect:
    factor: str
    level: str
    reference: str
    n: int
    estimate: float
    ci_t: tuple[float, float]


def _levels(df: Any, factor: str) -> list[str]:
    return list(dict.fromkeys(str(x) for x in df[factor]))


def _effect(factor: str, level: str, reference: str, per_seed: list[float], confidence: float) -> Effect:
    x = _finite(per_seed)
    return Effect(factor, level, reference, len(x), float(x.mean()) if len(x) else NAN, _t_interval(x, confidence))


def _cell_means(df: Any, factors: list[str], metric: str, seed_col: str) -> dict:
    """seed -> {(level of each factor): value} over finite values."""
    out: dict = {}
    for _, row in df.iterrows():
        v = row[metric]
        if v is None or not np.isfinite(float(v)):
            continue
        key = tuple(str(row[f]) for f in factors)
        out.setdefault(row[seed_col], {})[key] = float(v)
    return out


def main_effects(
    df: Any, factors: list[str], metric: str, seed_col: str = "seed", confidence: float = 0.95
) -> list[Effect]:
    cells = _cell_means(df, factors, metric, seed_col)
    effects = []
    for i, factor in enumerate(factors):
        levels = _levels(df, factor)
        ref = levels[0]
        for level in levels[1:]:
            per_seed = []
            for values in cells.values():
                diffs = []
                for key, v in values.items():  # pair each cell at `level` with the same others at `ref`
                    if key[i] != level:
                        continue
                    other = key[:i] + (ref,) + key[i + 1 :]
                    if other in values:
                        diffs.append(v - values[other])
                if diffs:
                    per_seed.append(float(np.mean(diffs)))
            effects.append(_effect(factor, level, ref, per_seed, confidence))
    return effects


def _with(key: tuple, i: int, x: str, j: int, y: str) -> tuple:
    k = list(key)
    k[i], k[j] = x, y
    return tuple(k)


def interactions(
    df: Any, factors: list[str], metric: str, seed_col: str = "seed", confidence: float = 0.95
) -> list[Effect]:
    cells = _cell_means(df, factors, metric, seed_col)
    effects = []
    for i in range(len(factors)):
        for j in range(i + 1, len(factors)):
            li, lj = _levels(df, factors[i]), _levels(df, factors[j])
            for a in li[1:]:
                for b in lj[1:]:
                    per_seed = []
                    for values in cells.values():
                        dd = []
                        for key in values:
                            if key[i] != a or key[j] != b:
                                continue

                            corners = [
                                _with(key, i, x, j, y) for x, y in ((a, b), (li[0], b), (a, lj[0]), (li[0], lj[0]))
                            ]
                            if all(c in values for c in corners):
                                y = [values[c] for c in corners]
                                dd.append((y[0] - y[1]) - (y[2] - y[3]))
                        if dd:
                            per_seed.append(float(np.mean(dd)))
                    effects.append(
                        _effect(
                            f"{factors[i]} x {factors[j]}", f"{a} x {b}", f"{li[0]} x {lj[0]}", per_seed, confidence
                        )
                    )
    return effects
