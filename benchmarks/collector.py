"""What Python's garbage collector costs a trial worker's process (ablations.process): one process imports what
a sweep's trial worker imports (Ray Tune, then the training entry with torch and Lightning, datasets, MLflow's SQL
store) and exits, three ways, alternating, one process per measurement:

- plain: as Python does by default;
- exit_quickly: ``gc.freeze()`` at exit (what every ``ablate`` command and test process now does);
- paused imports: the training modules imported with the collector paused (``import_paused``), then
  ``exit_quickly`` (what every trial worker and data-parallel rank now does).

and, apart, what an ``ablate sweep`` driver imports before it connects (MLflow and its SQL store, Ray, Ray Tune),
both with ``exit_quickly``: plainly, and with the collector paused (``ablations.cluster.import_for_driver``, what
``ablate sweep`` and ``ablate search`` now do).

CPU seconds (user + system) and wall seconds of the whole process, and the CPU seconds it had spent when its
exit began. Medians.

    python benchmarks/collector.py [--repeats 8]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from processes import ROOT, alternating

CODE = """\
import atexit, time
atexit.register(lambda: print(time.process_time()))  # registered first: the last exit handler to run
from ablations import process
import ray.tune
{body}
"""
URI = "sqlite:////tmp/unused.db"  # names the store's kind only: nothing is opened
DRIVER = """\
import atexit, time
atexit.register(lambda: print(time.process_time()))
from ablations import cluster, process
process.exit_quickly()
{body}
"""
DRIVER_MODULES = f"process.tracking_modules({URI!r}) + ['ray.tune']"
VARIANTS = {
    "plain": CODE.format(body=f"for m in process.training_modules({URI!r}): __import__(m)"),
    "exit_quickly": CODE.format(
        body=f"for m in process.training_modules({URI!r}): __import__(m)\nprocess.exit_quickly()"
    ),
    "paused imports + exit_quickly": CODE.format(
        body=f"process.exit_quickly()\nprocess.import_paused(process.training_modules({URI!r}))"
    ),
    "driver: exit_quickly": DRIVER.format(
        body=f"cluster.prepare_environment(None)\nfor m in ['ray', *{DRIVER_MODULES}]: __import__(m)"
    ),
    "driver: import_for_driver + exit_quickly": DRIVER.format(
        body=f"cluster.import_for_driver(None, {DRIVER_MODULES})"
    ),
}
BASELINE = {name: "driver: exit_quickly" if name.startswith("driver") else "plain" for name in VARIANTS}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        measured = alternating(VARIANTS, args.repeats, tmp)
    # (CPU seconds, wall seconds, CPU seconds when the exit began: the last line the process printed)
    rows = {name: [(cpu, wall, float(out.split()[-1])) for cpu, wall, out in runs] for name, runs in measured.items()}

    def med(name: str, i: int) -> float:
        return statistics.median(r[i] for r in rows[name])

    result = {
        "repeats": args.repeats,
        "cpu_s": {name: med(name, 0) for name in rows},
        "wall_s": {name: med(name, 1) for name in rows},
        "cpu_before_exit_s": {name: med(name, 2) for name in rows},
        "raw": rows,
    }
    result["exit_cpu_s"] = {name: result["cpu_s"][name] - result["cpu_before_exit_s"][name] for name in rows}
    result["cpu_ratio"] = {name: result["cpu_s"][name] / result["cpu_s"][BASELINE[name]] for name in rows}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "collector.json").write_text(json.dumps(result, indent=2) + "\n")
    md = [
        "# The garbage collector in a trial worker's process: imports and exit",
        "",
        f"Command: `python benchmarks/collector.py --repeats {args.repeats}`; medians of {args.repeats} alternating "
        f"processes each; {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d')}. Each process imports what a sweep's "
        "trial worker imports (Ray Tune, then `ablations.process.training_modules`: torch and Lightning through "
        "`ablations.train`, datasets, MLflow and its SQL store), then exits; the `driver` rows import what an "
        "`ablate sweep` driver imports before it connects (MLflow and its SQL store, Ray, Ray Tune), and compare "
        "with the first of them.",
        "",
        "| | CPU s in all | CPU s before the exit | CPU s of the exit | wall s | CPU against its baseline |",
        "|---|---|---|---|---|---|",
        *(
            f"| {name} | {result['cpu_s'][name]:.2f} | {result['cpu_before_exit_s'][name]:.2f} | "
            f"{result['exit_cpu_s'][name]:.2f} | {result['wall_s'][name]:.2f} | {result['cpu_ratio'][name]:.2f}x |"
            for name in rows
        ),
        "",
    ]
    (args.out / "collector.md").write_text("\n".join(md))
    print("\n".join(md))
    return result


if __name__ == "__main__":
    main()
