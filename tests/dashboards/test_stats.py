"""Seed statistics against scipy, numpy and the definitions, on fixed data."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from dashboards import stats

X = [0.812, 0.797, 0.825, 0.805, 0.818, 0.801]


def test_describe_matches_numpy_and_scipy():
    s = stats.describe(X)
    x = np.array(X)
    assert s.n == 6 and s.mean == pytest.approx(x.mean()) and s.std == pytest.approx(x.std(ddof=1))
    assert s.sem == pytest.approx(sps.sem(x))
    assert s.ci_t == pytest.approx(sps.t.interval(0.95, 5, loc=x.mean(), scale=sps.sem(x)))
    ref = sps.bootstrap((x,), np.mean, method="percentile", n_resamples=20_000, random_state=1).confidence_interval
    width = x.max() - x.min()
    assert s.ci_boot[0] == pytest.approx(ref.low, abs=0.03 * width)
    assert s.ci_boot[1] == pytest.approx(ref.high, abs=0.03 * width)


def test_describe_with_too_few_or_missing_values_gives_nan_never_zero():
    one = stats.describe([0.5, math.nan, math.inf])  # non-finite values are dropped
    assert one.n == 1 and one.mean == 0.5 and math.isnan(one.std) and all(map(math.isnan, one.ci_t + one.ci_boot))
    none = stats.describe([])
    assert none.n == 0 and math.isnan(none.mean)


def test_paired_uses_common_seeds_and_matches_scipy():
    base = {0: 0.80, 1: 0.82, 2: 0.79, 3: 0.81, 4: 0.83, 9: 0.5}
    var = {0: 0.84, 1: 0.85, 2: 0.80, 3: 0.86, 4: 0.85, 7: 0.9, 2.5: 0.1}
    p = stats.paired(base, var)
    seeds = [0, 1, 2, 3, 4]
    a, b = np.array([base[s] for s in seeds]), np.array([var[s] for s in seeds])
    d = b - a
    assert p.seeds == tuple(seeds) and p.n == 5
    assert p.mean_diff == pytest.approx(d.mean())
    assert p.ci_t == pytest.approx(sps.t.interval(0.95, 4, loc=d.mean(), scale=sps.sem(d)))
    assert p.p_t == pytest.approx(sps.ttest_rel(b, a).pvalue)
    assert p.p_wilcoxon == pytest.approx(sps.wilcoxon(b, a).pvalue)
    assert p.effect_size == pytest.approx(d.mean() / d.std(ddof=1))
    assert p.ci_boot[0] <= p.mean_diff <= p.ci_boot[1]


def test_paired_edge_cases():
    same = stats.paired({0: 1.0, 1: 2.0}, {0: 1.0, 1: 2.0})
    assert same.mean_diff == 0 and same.p_wilcoxon == 1.0 and same.effect_size == 0.0
    alone = stats.paired({0: 1.0}, {0: 2.0, 1: 3.0})
    assert alone.n == 1 and alone.mean_diff == 1.0 and math.isnan(alone.p_t)
    nothing = stats.paired({0: 1.0}, {1: 2.0})
    assert nothing.n == 0 and math.isnan(nothing.mean_diff)


def holm_by_definition(p: list[float]) -> list[float]:
    m, order = len(p), sorted(range(len(p)), key=lambda i: p[i])
    out, running = [0.0] * m, 0.0
    for rank, i in enumerate(order):
        running = max(running, (m - rank) * p[i])
        out[i] = min(1.0, running)
    return out


def test_holm_matches_its_definition_and_keeps_nan_out():
    p = [0.01, 0.04, 0.03, 0.005, 0.5]
    assert stats.holm(p) == pytest.approx(holm_by_definition(p))
    with_nan = stats.holm([0.01, math.nan, 0.04])
    assert math.isnan(with_nan[1]) and with_nan[0] == pytest.approx(0.02) and with_nan[2] == pytest.approx(0.04)


def test_holm_matches_statsmodels_when_installed():
    multitest = pytest.importorskip("statsmodels.stats.multitest", reason="statsmodels is not installed")
    p = [0.01, 0.04, 0.03, 0.005, 0.5]
    assert stats.holm(p) == pytest.approx(list(multitest.multipletests(p, method="holm")[1]))


def test_holm_adjust_sets_p_holm():
    comps = {
        "a": stats.paired({0: 1, 1: 2, 2: 3}, {0: 1.5, 1: 2.6, 2: 3.4}),
        "b": stats.paired({0: 1, 1: 2, 2: 3}, {0: 1.1, 1: 1.9, 2: 3.05}),
    }
    adjusted = stats.holm_adjust(comps)
    assert [adjusted[k].p_holm for k in "ab"] == pytest.approx(holm_by_definition([comps["a"].p_t, comps["b"].p_t]))


def test_rates():
    r = stats.rates(["finished", "diverged", "failed", "finished", "killed"])
    assert (r.n, r.finished, r.diverged, r.failed) == (5, 2, 1, 1)
    assert r.divergence_rate == pytest.approx(0.2) and r.failure_rate == pytest.approx(0.2)
    assert math.isnan(stats.rates([]).failure_rate)


def factorial(seeds: int, noise: float = 0.01) -> pd.DataFrame:
    """y = 1 + 0.3 [A=a1] + 0.2 [A=a2] - 0.4 [B=b1] + 0.15 [A=a1, B=b1] + seed noise."""
    rng = np.random.default_rng(0)
    rows = []
    for seed in range(seeds):
        for a in ("a0", "a1", "a2"):
            for b in ("b0", "b1"):
                y = 1 + 0.3 * (a == "a1") + 0.2 * (a == "a2") - 0.4 * (b == "b1") + 0.15 * (a == "a1" and b == "b1")
                rows.append({"A": a, "B": b, "seed": seed, "y": y + noise * rng.standard_normal()})
    return pd.DataFrame(rows)


def test_main_effects_and_interactions_recover_the_model():
    df = factorial(4)
    main = {(e.factor, e.level): e for e in stats.main_effects(df, ["A", "B"], "y")}
    assert main[("A", "a1")].estimate == pytest.approx(0.3 + 0.15 / 2, abs=0.02)  # averaged over B
    assert main[("A", "a2")].estimate == pytest.approx(0.2, abs=0.02)
    assert main[("B", "b1")].estimate == pytest.approx(-0.4 + 0.15 / 3, abs=0.02)  # averaged over A
    inter = {e.level: e for e in stats.interactions(df, ["A", "B"], "y")}
    assert inter["a1 x b1"].estimate == pytest.approx(0.15, abs=0.03)
    assert inter["a2 x b1"].estimate == pytest.approx(0.0, abs=0.03)
    assert inter["a1 x b1"].ci_t[0] < 0.15 < inter["a1 x b1"].ci_t[1]
    # against an explicit pandas computation: per seed, mean at the level minus mean at the reference
    per_seed = df.groupby(["seed", "A"])["y"].mean().unstack()
    d = per_seed["a1"] - per_seed["a0"]
    assert main[("A", "a1")].estimate == pytest.approx(d.mean())
    assert main[("A", "a1")].ci_t == pytest.approx(sps.t.interval(0.95, len(d) - 1, loc=d.mean(), scale=sps.sem(d)))
    assert main[("A", "a1")].n == 4


def test_factorial_with_missing_cells_and_one_seed():
    df = factorial(3)
    df.loc[(df["seed"] == 0) & (df["A"] == "a1"), "y"] = np.nan  # a failed cell
    main = {(e.factor, e.level): e for e in stats.main_effects(df, ["A", "B"], "y")}
    assert main[("A", "a1")].n == 2  # seed 0 has nothing to compare at a1
    one = {(e.factor, e.level): e for e in stats.main_effects(factorial(1), ["A", "B"], "y")}
    assert one[("A", "a1")].n == 1 and all(map(math.isnan, one[("A", "a1")].ci_t))
