"""What a seed plan saves: expected seeds against the fixed design of the same power, by simulation (not timed).

For each declared difference (in standard deviations of the per-seed paired differences), the fixed design is the
fewest seeds at which the exact sign-flip test reaches 80% power at alpha 0.05. Plans (both spending functions, a
grid of first / batch / max) are simulated as ``record.stats.plans.simulate`` decides them (the group-sequential
exact test at every look, decisions final); the cheapest whose power is at least the fixed design's, less the
search's noise, is re-simulated on more studies and reported: its power and expected seeds at the declared
difference, at 1.5 times it, and under no difference, where its error is also shown. The re-simulated power can
fall a little below the fixed design's: the search picked the plan on its own studies.

    python benchmarks/sequential.py            # writes results/sequential.{json,md}
    python benchmarks/sequential.py --quick    # fewer simulated studies, a smaller grid
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from record import stats  # noqa: E402
from record.spec.seedplan import SeedPlan  # noqa: E402
from record.stats.family import smallest_exact_n  # noqa: E402
from record.stats.plans import fixed_seeds, simulate  # noqa: E402

ALPHA, POWER = 0.05, 0.8
EFFECTS = (0.8, 1.0, 1.3)
MAX_SEEDS = 16  # the exact test enumerates every sign pattern up to 16 seeds


def candidates(n_fixed: int, quick: bool) -> list[SeedPlan]:
    out = []
    for spending in ("pocock", "obrien_fleming"):
        for top in range(n_fixed, min(n_fixed + (3 if quick else 5), MAX_SEEDS) + 1):
            for first in range(max(4, n_fixed // 2), top):
                for batch in (1, 2, 3):
                    if batch > top - first:
                        continue
                    plan = SeedPlan(first=first, batch=batch, max=top, spending=spending)
                    if first >= smallest_exact_n(plan.spend(first / top, ALPHA)):
                        out.append(plan)
    return out


def cheapest(effect: float, n_fixed: int, fixed_power: float, draws: int, quick: bool) -> tuple[SeedPlan, int]:
    """The plan of least expected seeds whose simulated power is at least the fixed design's (the same simulated
    studies for every plan; the winner is then re-simulated on others, which is what is reported)."""
    best, tried = None, 0
    for plan in candidates(n_fixed, quick):
        tried += 1
        sim = simulate(plan, ALPHA, [effect], draws=draws)
        if sim.power[0] >= fixed_power and (best is None or sim.seeds[0] < best[1]):
            best = (plan, sim.seeds[0])
    return best[0], tried


def row(effect: float, draws: int, confirm: int, quick: bool) -> dict:
    n_fixed = fixed_seeds(ALPHA, 1, effect, POWER)
    fixed_power = stats.power_of(effect, n_fixed, ALPHA)
    plan, tried = cheapest(effect, n_fixed, fixed_power, draws, quick)
    at = simulate(plan, ALPHA, [effect], draws=confirm, seed=1)
    larger = simulate(plan, ALPHA, [1.5 * effect], draws=confirm, seed=2)
    null = simulate(plan, ALPHA, [0.0], draws=confirm, seed=3)
    return {
        "effect": effect,
        "fixed_seeds": n_fixed,
        "fixed_power": round(fixed_power, 3),
        "plan": plan.as_dict(),
        "looks": plan.looks(),
        "plans_tried": tried,
        "power": round(at.power[0], 3),
        "expected_seeds": round(at.seeds[0], 2),
        "ratio": round(at.seeds[0] / n_fixed, 3),
        "power_at_1.5x": round(larger.power[0], 3),
        "ratio_at_1.5x": round(larger.seeds[0] / n_fixed, 3),
        "ratio_under_null": round(null.seeds[0] / n_fixed, 3),
        "error_under_null": round(null.family_error, 4),
        "draws": confirm,
        "search_draws": draws,
    }


def family_error(confirm: int) -> dict:
    """A family of three contrasts, none different, decided after every batch: the family-wise error."""
    plan = SeedPlan(first=9, batch=1, max=12)
    sim = simulate(plan, ALPHA, [0.0, 0.0, 0.0], draws=confirm, seed=4)
    from scipy.stats import binomtest

    errors = round(sim.family_error * sim.draws)
    ci = binomtest(errors, sim.draws).proportion_ci(0.95)
    return {"plan": plan.as_dict(), "contrasts": 3, "draws": sim.draws, "family_error": sim.family_error,
            "ci95": [round(ci.low, 4), round(ci.high, 4)]}  # fmt: skip


def markdown(rows: list[dict], family: dict, command: str, seconds: float) -> str:
    lines = [
        "# Seed plans against fixed designs (simulated, not timed)",
        "",
        f"`{command}` ({seconds:.0f} s). Effects in standard deviations of the per-seed paired differences; "
        f"alpha {ALPHA}, the fixed design the fewest seeds with {POWER:.0%} power for the exact sign-flip test; each "
        f"plan the cheapest of a grid with at least its power on {rows[0]['search_draws']:,} studies, re-simulated on "
        f"{rows[0]['draws']:,} studies.",
        "",
        "| declared Δ | fixed seeds (power) | plan | looks | power | expected seeds | ratio | at 1.5×Δ: power, ratio "
        "| no difference: ratio, error |",
        "|---:|---:|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        p = r["plan"]
        lines.append(
            f"| {r['effect']} | {r['fixed_seeds']} ({r['fixed_power']}) | first {p['first']}, batch {p['batch']}, "
            f"max {p['max']}, {p['spending']} | {r['looks']} | {r['power']} | {r['expected_seeds']} | "
            f"**{r['ratio']}x** | {r['power_at_1.5x']}, {r['ratio_at_1.5x']}x | {r['ratio_under_null']}x, "
            f"{r['error_under_null']} |"
        )
    lo, hi = family["ci95"]
    lines += [
        "",
        f"Family of {family['contrasts']} contrasts, none different, plan {family['plan']}, decisions after every "
        f"batch: family-wise error {family['family_error']:.4f} over {family['draws']:,} studies (95% interval "
        f"[{lo}, {hi}]), alpha {ALPHA}.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer studies and a smaller grid (a smoke run)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    draws, confirm = (300, 600) if args.quick else (1_000, 4_000)
    start = time.monotonic()
    rows = []
    for effect in EFFECTS[:1] if args.quick else EFFECTS:
        rows.append(row(effect, draws, confirm, args.quick))
        print(json.dumps(rows[-1]), flush=True)
    family = family_error(confirm)
    print(json.dumps(family), flush=True)
    seconds = time.monotonic() - start
    command = "python benchmarks/sequential.py" + (" --quick" if args.quick else "")
    name = "sequential_quick" if args.quick else "sequential"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{name}.json").write_text(json.dumps({"rows": rows, "family": family, "command": command}, indent=1))
    (args.out / f"{name}.md").write_text(markdown(rows, family, command, seconds))
    print(f"wrote {args.out / name}.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
