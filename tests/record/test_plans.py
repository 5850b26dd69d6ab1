"""The group-sequential exact sign-flip test and the seed plan's simulated error and power
(record/stats/sequential.py, dashboards/looks.py): checked against the fixed exact test (scipy's
permutation test), the closed form of the conditional null (every sign pattern enumerated), statsmodels' Holm and
binomial intervals from scipy."""

from __future__ import annotations

import itertools
import re

import numpy as np
import pytest
from scipy.stats import binomtest

from record import stats
from record.spec.seedplan import SeedPlan
from record.stats import sequential as gs
from record.stats.plans import fixed_seeds, simulate

ALPHA = 0.05


def _all_signs(absd: np.ndarray) -> np.ndarray:
    """Every sign pattern of |d| as a row: the whole conditional null distribution."""
    signs = np.array(list(itertools.product([1.0, -1.0], repeat=len(absd))))
    return signs * absd[None, :]


@pytest.mark.parametrize("n", [6, 9, 12])
def test_one_look_is_the_fixed_exact_test(n):
    """With a single look the boundary is the fixed exact test at alpha: it rejects exactly when scipy's
    permutation test (every sign flip) gives p <= alpha."""
    rng = np.random.default_rng(n)
    for _ in range(40):
        d = rng.standard_normal(n) + rng.choice([0.0, 0.8, 1.5])
        p = stats.sign_flip_p(d)
        assert gs.crossed(d, [n], [[ALPHA]])[0, 0] == (p <= ALPHA)


@pytest.mark.parametrize("spending", ["pocock", "obrien_fleming"])
def test_every_look_spends_exactly_its_alpha_over_the_enumerated_null(spending):
    """Given the absolute differences, every sign pattern is equally likely under no difference (Mehta et al.
    1994): over all 2^n of them, the share that crossed by look k is the alpha spent by then, to the pattern
    (2 / 2^n at n seeds), never more, so the error cannot exceed alpha whatever the distribution."""
    plan = SeedPlan(first=6, batch=2, max=10, spending=spending)
    looks, spent = plan.looks(), plan.cumulative(ALPHA)
    rows = _all_signs(np.abs(np.random.default_rng(1).standard_normal(10)))
    for k in range(len(looks)):
        unit = 2 / 2 ** looks[k]  # a pattern of the first n seeds and its negation: the test's smallest step
        share = gs.crossed(rows, looks[: k + 1], [spent[: k + 1]])[0].mean()
        assert share <= spent[k] + 1e-12
        assert share > spent[k] - unit  # all the alpha spent, less what one tied pair of patterns would exceed


def test_the_looks_share_alpha_where_separate_tests_each_take_a_slice():
    """Spending alpha over correlated looks rejects more than testing each look at its own increment of alpha
    (the union bound), at no more than alpha: the gain of the group-sequential boundary."""
    plan = SeedPlan(first=6, batch=1, max=10)
    looks, spent = plan.looks(), plan.cumulative(ALPHA)
    rows = _all_signs(np.abs(np.random.default_rng(2).standard_normal(10)))
    sequential = gs.crossed(rows, looks, [spent])[0].mean()
    increments = np.diff([0.0, *spent])
    separate = np.zeros(len(rows), dtype=bool)
    for n, a in zip(looks, increments):
        separate |= gs.crossed(rows[:, :n], [n], [[a]])[0]
    assert separate.mean() < sequential <= ALPHA


def test_heavy_tailed_differences_keep_the_error_at_alpha():
    """Cauchy differences (no mean, no variance): the test conditions on |d|, so the error over the looks stays
    at alpha within its binomial interval."""
    plan = SeedPlan(first=6, batch=2, max=12)
    d = np.random.default_rng(3).standard_cauchy((2_000, plan.max))
    rate = gs.crossed(d, plan.looks(), [plan.cumulative(ALPHA)])[0]
    assert binomtest(int(rate.sum()), len(rate)).proportion_ci(0.95).low <= ALPHA


def _every_intersection(at: list[np.ndarray]) -> np.ndarray:
    """The closed test spelt out: H_i rejected when every intersection holding it has a member crossing at
    alpha / |I| (at[|I| - 1])."""
    m = len(at)
    out = np.ones(m, dtype=bool)
    for size in range(1, m + 1):
        for subset in itertools.combinations(range(m), size):
            if not any(at[size - 1][j] for j in subset):
                out[list(subset)] = False
    return out


def test_the_closed_test_rejects_what_every_intersection_rejects():
    rng = np.random.default_rng(4)
    for m in (2, 3, 5):
        for _ in range(200):
            at = [rng.random(m) < q for q in sorted(rng.random(m))]  # any crossings, monotone or not
            assert gs.closed([a[None, :] for a in at])[0].tolist() == _every_intersection(at).tolist()


def test_with_one_look_the_closed_test_is_statsmodels_holm():
    """One look: crossing at a level is p <= level, and the closed test is Holm's procedure."""
    rng = np.random.default_rng(5)
    for _ in range(20):
        d = rng.standard_normal((4, 10)) + rng.choice([0.0, 0.8, 1.6], size=(4, 1))
        holm = np.array(stats.holm([stats.sign_flip_p(x) for x in d])) <= ALPHA
        at = [gs.crossed(d, [10], [[ALPHA / s]])[0][None, :] for s in range(1, 5)]
        assert gs.closed(at)[0].tolist() == holm.tolist()


def test_a_planned_family_rejects_no_true_null_more_often_than_alpha():
    """Decisions after every batch, Holm over three contrasts (two without a difference), 2,000 simulated studies:
    the family-wise error is at most alpha within its binomial interval."""
    plan = SeedPlan(first=9, batch=1, max=12)
    sim = simulate(plan, ALPHA, [0.0, 0.0, 1.2], draws=2_000)
    errors = round(sim.family_error * sim.draws)
    assert binomtest(errors, sim.draws).proportion_ci(0.95).low <= ALPHA
    assert sim.seeds[0] > sim.seeds[2]  # the true difference stops earlier than the nulls


def test_a_plan_reaches_the_fixed_designs_power_with_fewer_seeds():
    """At the declared difference (1 standard deviation of the paired differences), the plan is as powerful as
    the fixed design that needs ``fixed_seeds`` for 80% power, on fewer seeds on average."""
    n_fixed = fixed_seeds(ALPHA, 1, 1.0, 0.8)
    fixed_power = stats.power_of(1.0, n_fixed, ALPHA)
    sim = simulate(SeedPlan(first=7, batch=3, max=n_fixed + 2), ALPHA, [1.0], draws=2_000)
    hits = round(sim.power[0] * sim.draws)
    assert binomtest(hits, sim.draws).proportion_ci(0.95).high >= fixed_power
    assert sim.seeds[0] < n_fixed


def test_a_dry_run_plans_a_seed_plan_from_a_pilot_submission(store):
    """The most a plan trains (seeds, trials, steps), and from the chosen pilot's paired spread and the declared
    difference, the seeds each variant is expected to train: between the first batch and the maximum, more for a
    contrast whose declared difference is small against its spread."""
    from types import SimpleNamespace

    from dashboards.plan import sequential_plan
    from record.spec.analysis import parse_analysis
    from record.spec.common import Budget
    from tests.dashboards.test_report import fill

    rng = np.random.default_rng(7)
    base = {s: 0.5 + 0.05 * rng.standard_normal() for s in range(8)}
    values = {
        "base": base,
        "tight": {s: v + 0.004 * rng.standard_normal() for s, v in base.items()},  # Δ 0.01 is 2.5 sd: decided soon
        "loose": {s: v + 0.02 * rng.standard_normal() for s, v in base.items()},  # 0.5 sd: open to the maximum
    }
    fill(store, "planned", values, submission=1)
    fill(store, "planned", {v: {s: x + 1.0 for s, x in by.items()} for v, by in values.items()}, submission=2)
    analysis = parse_analysis({"detect": {"test/acc": 0.01}, "contrasts": {"pairs": "baseline"}})
    study = SimpleNamespace(
        name="planned", plan=SeedPlan(first=7, batch=2, max=12), variants=list(values), analysis=analysis,
        metric="test/acc", budget=Budget(steps=200),
    )  # fmt: skip
    text = sequential_plan(store, study, submission=1, draws=400)
    assert "looks at [7, 9, 11, 12] seeds per variant" in text
    assert "at most: 12 seeds per variant, 36 trials (7,200 steps" in text
    for label in ("tight vs base", "loose vs base"):
        sd = np.std([values[label.split()[0]][s] - base[s] for s in range(8)], ddof=1)
        assert f"{label} {0.01 / sd:.2g} sd" in text
    expected = {
        v: float(x)
        for v, x in re.findall(r"(\w+) (\d+\.\d)\b", text.split("power")[-1].split("): ")[1].split(" seeds")[0])
    }
    assert 7 <= expected["tight"] < expected["loose"] <= 12 and expected["base"] == expected["loose"]
    assert "no pilot (submission 5" in sequential_plan(store, study, submission=5, draws=100)


def test_the_benchmark_reports_a_plan_as_powerful_as_the_fixed_design(tmp_path):
    """benchmarks/sequential.py at a small size: the plan it picks had the fixed design's power in its search, and
    its ratio is the expected seeds over the fixed design's (the fixed design's power by ``stats.power_of``)."""
    import importlib.util

    from tests.conftest import ROOT

    spec = importlib.util.spec_from_file_location("sequential_bench", ROOT / "benchmarks" / "sequential.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    r = bench.row(1.3, draws=200, confirm=400, quick=True)
    assert r["fixed_seeds"] == fixed_seeds(ALPHA, 1, 1.3, 0.8) and r["fixed_power"] >= 0.8
    plan = SeedPlan(**r["plan"])
    assert simulate(plan, ALPHA, [1.3], draws=200).power[0] >= r["fixed_power"]  # the search's own studies
    assert r["ratio"] == pytest.approx(r["expected_seeds"] / r["fixed_seeds"], abs=1e-3)
    family = bench.family_error(400)
    text = bench.markdown([r], family, "python benchmarks/sequential.py --quick", 1.0)
    assert f"**{r['ratio']}x**" in text and "family-wise error" in text
