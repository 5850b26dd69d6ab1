"""Recompute every p-value and interval of an ablation table from its per-seed export alone, with numpy and scipy.

    python docs/results/recompute.py FOLDER

FOLDER holds what ``ablate report`` writes beside each table: ``seeds.csv`` (every cell's value and outcome),
``declaration.json`` (the metric, the analysis, the family) and ``contrasts.csv`` (the table's numbers). Each
contrast is computed again from the seeds (paired differences, or a factorial effect within each seed; the exact
sign-flip test or the t-test; Holm over the family, and over the exploratory contrasts apart; the two one-sided
tests against a margin) and compared with the table. Exit 0 when every number agrees, 1 otherwise.

A study with a seed plan (``plan`` and ``looks`` in declaration.json) is replayed look by look: each variant's seeds
at each look, each declared contrast's group-sequential sign-flip test over its looks (boundaries by enumerating every
sign pattern, Mehta et al. 1994; alpha spent by Lan and DeMets' functions), the closed Holm test over the family, the
contrasts it decided frozen at that look, the next batch for the variants of those still open. The replayed looks must
be the exported ones, and each family contrast's numbers those of the look that decided it (or of the last look).
"""

from __future__ import annotations

import csv
import itertools
import json
import math
import sys
from pathlib import Path

import numpy as np
from scipy import stats

EXACT_MAX_N, MC_RESAMPLES = 16, 99_999  # as the report runs the sign-flip test (record/stats)
CHECKED = ("diff", "diff_low", "diff_high", "p", "p_holm", "p_tost", "p_tost_holm")


def read(folder: Path) -> tuple[dict, dict, list[dict]]:
    """(variant -> seed -> value, the declaration, the table's contrasts)."""
    values: dict[str, dict] = {}
    with open(folder / "seeds.csv", newline="") as f:
        for row in csv.DictReader(f):
            if row["rule_value"] != "":
                seed = int(row["seed"]) if row["seed"].lstrip("-").isdigit() else row["seed"]
                values.setdefault(row["variant"], {})[seed] = float(row["rule_value"])
    declared = json.loads((folder / "declaration.json").read_text())
    with open(folder / "contrasts.csv", newline="") as f:
        contrasts = list(csv.DictReader(f))
    return values, declared, contrasts


def spread(x: np.ndarray) -> bool:
    return len(x) > 1 and float(np.ptp(x)) > 1e-12 * max(1.0, float(np.max(np.abs(x))))


def sign_flip(d: np.ndarray, alternative: str = "two-sided", level: float = 0.05) -> float:
    """The paired sign-flip test of mean(d) = 0: every 2^n flip up to 16 seeds, Monte Carlo (seeded) beyond."""
    n = len(d)
    if n == 1:  # its two flips, (x, -x)
        x = d[0]
        if x == 0 or alternative == "two-sided":
            return 1.0
        return 1.0 if (alternative == "greater" and x < 0) or (alternative == "less" and x > 0) else 0.5
    resamples = max(MC_RESAMPLES, 2**n) if n <= EXACT_MAX_N else max(MC_RESAMPLES, math.ceil(10 / level))
    res = stats.permutation_test(
        (d,), lambda x, axis=-1: np.mean(x, axis=axis), permutation_type="samples", vectorized=True,
        n_resamples=resamples, batch=max(1, min(resamples, 4_000_000 // n)), alternative=alternative, axis=-1, rng=0,
    )  # fmt: skip
    return float(min(res.pvalue, 1.0))


def tests(d: np.ndarray, test: str, margin: float, level: float) -> tuple[float, float]:
    """(two-sided p, the two one-sided tests' p against ±margin, nan without one)."""
    if len(d) == 0:
        return 1.0, (1.0 if math.isfinite(margin) else math.nan)
    t = test == "t" and len(d) >= 2 and spread(d)
    p = float(stats.ttest_1samp(d, 0.0).pvalue) if t else sign_flip(d, level=level)
    if not math.isfinite(margin):
        return p, math.nan
    if t:
        low = stats.ttest_1samp(d, -margin, alternative="greater").pvalue
        high = stats.ttest_1samp(d, margin, alternative="less").pvalue
        return p, float(max(low, high))
    return p, max(sign_flip(d + margin, "greater", level), sign_flip(d - margin, "less", level))


def holm(p: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values, by their definition."""
    order, m, out, running = sorted(range(len(p)), key=lambda i: p[i]), len(p), [0.0] * len(p), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    return out


def effects(values: dict, declared: dict) -> dict[str, dict]:
    """label -> seed -> a factorial effect within that seed (main effects, two-way interactions)."""
    levels, variants = declared["levels"], declared["variants"]
    axes = list(levels)
    key = {v: tuple(declared["settings"][v][a] for a in axes) for v in variants if v in declared["settings"]}
    cells = {key[v]: values[v] for v in key if values.get(v)}
    out = {}
    for i, f in enumerate(axes):
        for level in levels[f][1:]:
            pairs = [(k, k[:i] + (levels[f][0],) + k[i + 1 :]) for k in cells if k[i] == level]
            weights = [({k: 1.0, r: -1.0}) for k, r in pairs if r in cells]
            out[f"{f}: {level} vs {levels[f][0]}"] = per_seed(cells, weights)
    for i, j in itertools.combinations(range(len(axes)), 2):
        ri, rj = levels[axes[i]][0], levels[axes[j]][0]
        for a, b in itertools.product(levels[axes[i]][1:], levels[axes[j]][1:]):
            weights = []
            for k in (k for k in cells if (k[i], k[j]) == (a, b)):
                ws = {at(k, i, j, x, y): w for x, y, w in ((a, b, 1.0), (ri, b, -1.0), (a, rj, -1.0), (ri, rj, 1.0))}
                if all(c in cells for c in ws):
                    weights.append(ws)
            out[f"{axes[i]} x {axes[j]}: {a} x {b} vs {ri} x {rj}"] = per_seed(cells, weights)
    return out


def at(key: tuple, i: int, j: int, x: str, y: str) -> tuple:
    """The cell of ``key`` with axis i at x and axis j at y."""
    return tuple(x if n == i else y if n == j else v for n, v in enumerate(key))


def per_seed(cells: dict, weights: list[dict]) -> dict:
    """The mean over the other axes' combinations of each weighted sum, in the seeds that have every cell."""
    if not weights:
        return {}
    used = {c for w in weights for c in w}
    seeds = set.intersection(*(set(cells[c]) for c in used))
    return {s: sum(sum(wt * cells[c][s] for c, wt in w.items()) for w in weights) / len(weights) for s in seeds}


def margin_of(declared: dict) -> tuple[float, bool]:
    """(the metric's margin as its test runs it, whether on the log scale: {relative: r} is log(1 + r), {log: m}
    is m; a number is absolute; nan: none)."""
    m = declared["analysis"]["margins"].get(declared["metric"])
    if m is None:
        return math.nan, False
    if isinstance(m, dict):
        return (math.log1p(m["relative"]) if m.get("relative") is not None else float(m["log"])), True
    return float(m), False


def logged(values: dict) -> dict:
    """Every value's log (a log-scale margin tests the contrast of log values); a value <= 0 has none."""
    return {v: {s: math.log(x) if x > 0 else math.nan for s, x in by.items()} for v, by in values.items()}


def contrast_by_seed(values: dict, declared: dict, row: dict, by_effect: dict) -> dict:
    if row["kind"] == "pair":
        a, b = values.get(row["a"], {}), values.get(row["b"], {})
        return {s: a[s] - b[s] for s in set(a) & set(b)}
    return by_effect.get(row["label"], {})


def recompute(values: dict, declared: dict, table: list[dict]) -> dict[str, dict]:
    """label -> the contrast's numbers, computed again."""
    analysis = declared["analysis"]
    margin, on_log = margin_of(declared)
    level = analysis["alpha"] / max(1, len(declared["family"]))
    logs = logged(values) if on_log else values
    by_seed = effects(values, declared) if declared["levels"] else {}
    by_seed_log = effects(logs, declared) if declared["levels"] and on_log else by_seed
    out = {}
    for row in table:
        d_by = contrast_by_seed(values, declared, row, by_seed)
        order = sorted(d_by, key=lambda s: (str(type(s)), s))
        d = np.array([d_by[s] for s in order])
        t_by = contrast_by_seed(logs, declared, row, by_seed_log)
        t = np.array([t_by.get(s, math.nan) for s in order])
        p, p_tost = tests(d, analysis["test"], margin, level)
        if on_log:
            p_tost = tests(t, analysis["test"], margin, level)[1] if np.isfinite(t).all() else math.nan
        lo = hi = math.nan
        if len(d) >= 2 and spread(d):
            lo, hi = stats.t.interval(1 - analysis["alpha"], len(d) - 1, loc=d.mean(), scale=stats.sem(d))
        out[row["label"]] = {
            "diff": d.mean() if len(d) else math.nan,
            "diff_low": lo,
            "diff_high": hi,
            "p": p,
            "p_tost": p_tost,
        }
    for group in (declared["family"], list(declared["exploratory"])):
        for key, name in (("p", "p_holm"), ("p_tost", "p_tost_holm")):
            members = [label for label in group if label in out and math.isfinite(out[label][key])]
            for label, adjusted in zip(members, holm([out[label][key] for label in members])):
                out[label][name] = adjusted
    return out


# --- seed plans: the looks replayed ------------------------------------------------------------------------------

GRID = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 4, 10, 20)  # multiples of alpha at which the report's shown p is sought


def spend(spending: str, t: float, alpha: float) -> float:
    """The alpha spent by information fraction t (seeds / max): Lan and DeMets' Pocock-type or O'Brien-Fleming-type."""
    if t >= 1:
        return alpha
    if spending == "pocock":
        return alpha * math.log(1 + (math.e - 1) * t)
    return float(2 - 2 * stats.norm.cdf(stats.norm.ppf(1 - alpha / 2) / math.sqrt(t)))


def every_sign(n: int) -> np.ndarray:
    """(n, R) sign patterns: all 2^n up to EXACT_MAX_N seeds; beyond, the report's own draw (numpy, seed 0)."""
    if n > EXACT_MAX_N:
        return np.random.default_rng(0).choice([-1.0, 1.0], size=(n, MC_RESAMPLES))
    return np.where((np.arange(2**n)[None, :] >> np.arange(n)[:, None]) & 1, -1.0, 1.0)


def sequential_crossed(d: np.ndarray, sizes: list[int], spent: list[float], side: int) -> bool:
    """Whether d crossed a boundary at one of its looks (after sizes[k] seeds, alpha spent[k] by then). At each look
    the boundary is the most extreme sign patterns not already past an earlier one, as many as the alpha spent
    allows, ties never split. side 0: |sum|; 1: large sums; -1: small sums."""
    signs = every_sign(sizes[-1])
    total = signs.shape[1]
    tol = 1e-9 * np.abs(d[: sizes[-1]]).sum()
    past = np.zeros(total, dtype=bool)
    for n, alpha in zip(sizes, spent):
        sums = np.abs(d[:n]) @ signs[:n]
        stat, seen = (np.abs(sums), abs(d[:n].sum())) if side == 0 else (side * sums, side * d[:n].sum())
        allowed = math.floor(alpha * total + 1e-9) - int(past.sum())
        alive = np.sort(stat[~past])[::-1]
        if allowed >= len(alive):
            bound = -math.inf
        elif allowed < 0:
            bound = math.inf
        else:
            bound = alive[allowed] + tol  # only patterns strictly above the (allowed + 1)-th cross
        if seen > bound:
            return True
        past |= stat > bound
    return False


def closed_rejects(crossing: np.ndarray) -> np.ndarray:
    """The closed test with Bonferroni intersections (Holm's): crossing[i, s - 1] says whether hypothesis i crossed
    at alpha / s. H_i is rejected when, for every s, it crossed at alpha / s or m - s + 1 others did."""
    m = crossing.shape[0]
    others = crossing.sum(axis=0)[None, :] - crossing
    need = m - np.arange(1, m + 1) + 1
    return (crossing | (others >= need[None, :])).all(axis=1)


def shown_p(members: list, plan: dict, alpha: float, side: int) -> list[float]:
    """Per member (d, sizes, margin): the smallest GRID level from which up to alpha the closed test rejects it, or
    the first level above alpha at which it does, 1 if none (as the report shows a sequential p)."""
    m = len(members)
    if not m:
        return []
    levels = sorted({min(1.0, alpha * g) for g in GRID})
    rejected = []
    for level in levels:
        crossing = np.zeros((m, m), dtype=bool)
        for i, (d, sizes, margin) in enumerate(members):
            if not sizes:  # no paired seeds: it never crosses
                continue
            for s in range(1, m + 1):
                spent = [spend(plan["spending"], n / plan["max"], level / s) for n in sizes]
                if side == 0:
                    crossing[i, s - 1] = sequential_crossed(d, sizes, spent, 0)
                else:
                    crossing[i, s - 1] = sequential_crossed(d + margin, sizes, spent, 1) and sequential_crossed(
                        d - margin, sizes, spent, -1
                    )
        rejected.append(closed_rejects(crossing))
    at, out = levels.index(alpha), []
    for i in range(m):
        if rejected[at][i]:
            k = at
            while k > 0 and rejected[k - 1][i]:
                k -= 1
            out.append(levels[k])
        else:
            out.append(next((levels[k] for k in range(at + 1, len(levels)) if rejected[k][i]), 1.0))
    return out


def differences(values: dict, declared: dict, row: dict, upto: dict) -> tuple[np.ndarray, list]:
    """The contrast's per-seed differences (seed order) on the seeds each variant had by a look, and those seeds."""
    seen = {v: {s: x for s, x in values.get(v, {}).items() if s < upto.get(v, 0)} for v in declared["variants"]}
    if row["kind"] == "pair":
        a, b = seen.get(row["a"], {}), seen.get(row["b"], {})
        by = {s: a[s] - b[s] for s in set(a) & set(b)}
    else:
        by = effects(seen, declared).get(row["label"], {})
    order = sorted(by)
    return np.array([by[s] for s in order]), order


def replay(values: dict, declared: dict, table: list[dict]) -> tuple[dict[str, dict], list[str]]:
    """label -> a family contrast's numbers at the look that decided it (or the last), and every way the replayed
    looks differ from the exported ones."""
    plan, analysis, exported = declared["plan"], declared["analysis"], declared["looks"]
    alpha, rows = analysis["alpha"], {r["label"]: r for r in table if r["label"] in declared["family"]}
    margin, on_log = margin_of(declared)
    logs = logged(values) if on_log else values
    level = alpha / max(1, len(rows))
    looks = [plan["first"]]
    while looks[-1] < plan["max"]:
        looks.append(min(looks[-1] + plan["batch"], plan["max"]))
    upto, history, wrong = dict.fromkeys(declared["variants"], plan["first"]), [], []
    frozen: dict[str, tuple] = {}  # a decided contrast: its differences and sizes at the look that decided it
    decided_p: dict[str, tuple[float, float]] = {}  # and its shown p, p_tost there
    for k, look in enumerate(exported):
        history.append(dict(upto))
        if upto != look["seeds"]:
            wrong.append(f"look {k + 1}: seeds {upto} replayed, {look['seeds']} exported")
        now = dict(frozen)
        for label, row in rows.items():
            if label not in frozen:
                d, seeds = differences(values, declared, row, upto)
                involved = [row["a"], row["b"]] if row["kind"] == "pair" else declared["variants"]
                counts = {sum(s < min(h.get(v, 0) for v in involved) for s in seeds) for h in history}
                now[label] = (d, sorted(counts - {0}) if len(d) else [], differences(logs, declared, row, upto)[0])
        labels = list(rows)
        p = dict(zip(labels, shown_p([(*now[x][:2], 0.0) for x in labels], plan, alpha, 0)))
        with_margin = [x for x in labels if math.isfinite(margin)]
        tested = [(now[x][2], now[x][1], margin) for x in with_margin]  # on the margin's scale
        p_tost = dict(zip(with_margin, shown_p(tested, plan, alpha, 1)))
        still = []
        for label in labels:
            if label in frozen:
                continue
            equivalent = p_tost.get(label, 1.0) <= alpha and label not in look.get("no_equivalence", [])
            decided = p[label] <= alpha or equivalent or label in look["not_testable"]
            if decided:
                frozen[label] = now[label]
                decided_p[label] = (p[label], p_tost.get(label, math.nan))
            else:
                still.append(label)
        if still != look["open"]:
            wrong.append(f"look {k + 1}: open {still} replayed, {look['open']} exported")
        if not still:
            break
        grow = {v for x in still for v in ([rows[x]["a"], rows[x]["b"]] if rows[x]["kind"] == "pair" else upto)}
        upto = {v: (looks[k + 1] if v in grow and k + 1 < len(looks) else n) for v, n in upto.items()}
    out = {}
    for label in rows:
        d, _, t = frozen.get(label, now[label])
        p_holm, p_tost_holm = decided_p.get(label, (p[label], p_tost.get(label, math.nan)))
        out[label] = numbers(d, analysis["test"], margin, level, alpha) | {"p_holm": p_holm, "p_tost_holm": p_tost_holm}
        if on_log:  # the equivalence test ran on the log values
            finite = len(t) and np.isfinite(t).all()
            out[label]["p_tost"] = tests(t, analysis["test"], margin, level)[1] if finite else math.nan
    return out, wrong


def numbers(d: np.ndarray, test: str, margin: float, level: float, alpha: float) -> dict:
    """A contrast's estimate, t interval and unadjusted tests on its differences."""
    p, p_tost = tests(d, test, margin, level)
    lo = hi = math.nan
    if len(d) >= 2 and spread(d):
        lo, hi = stats.t.interval(1 - alpha, len(d) - 1, loc=d.mean(), scale=stats.sem(d))
    return {"diff": d.mean() if len(d) else math.nan, "diff_low": lo, "diff_high": hi, "p": p, "p_tost": p_tost}


def same(x: str, y: float) -> bool:
    a = float(x) if x not in ("", None) else math.nan
    return (math.isnan(a) and math.isnan(y)) or math.isclose(a, y, rel_tol=1e-9, abs_tol=1e-12)


def main(folder: str) -> int:
    values, declared, table = read(Path(folder))
    again, wrong = recompute(values, declared, table), []
    # a planned study's table of another metric than the plan decides on holds fixed-sample tests: no looks to replay
    if declared.get("plan") and declared["plan"].get("decides_on", declared["metric"]) == declared["metric"]:
        planned, wrong = replay(values, declared, table)
        again.update(planned)
    wrong += [
        f"{row['label']}: {key} {row[key]} in the table, {again[row['label']].get(key, math.nan)!r} recomputed"
        for row in table
        for key in CHECKED
        if key in row and not same(row[key], again[row["label"]].get(key, math.nan))
    ]
    print("\n".join(wrong) if wrong else f"all {len(table)} contrasts reproduced ({len(CHECKED)} numbers each)")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))
