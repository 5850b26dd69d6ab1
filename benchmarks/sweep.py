"""What running cells as Ray trials costs, measured side by side in one process.

overhead: the same cells (the quickstart run, about 30 s each on one thread) run one after another with
  ``ablate run``'s code path (``ablations.train.train`` in this process), against ``ablate sweep`` with one
  trial at a time on a local Ray started for it. Reported: both wall times, the ratio, and the fixed cost
  per trial (the extra wall time divided by the number of cells, Ray's start included).
scale: many tiny cells (a few steps each) on the local cluster, as many at once as the CPUs allow. Reported:
  cells per minute, that MLflow holds each cell exactly once, and the time spent writing to MLflow
  (foreground: creating, filling and closing runs; background: sending metrics).

    python benchmarks/sweep.py overhead [--cells 4] [--steps 1350] [--repeats 1]
    python benchmarks/sweep.py scale [--cells 200]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # loopback-only Ray (set before ray loads)


def write_study(folder: Path, name: str, base: dict, seeds: int, max_concurrent: int | None) -> Path:
    study = {
        "name": name,
        "base": base,
        "design": {"variants": [{"name": "base", "set": {}}]},
        "seeds": seeds,
        "metric": "final/val_loss",
        "resources": {"cpus": 1},
        "max_cells": 10_000,
    }
    if max_concurrent:
        study["max_concurrent"] = max_concurrent
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(study))
    return path


def cell_runs(uri: str, name: str) -> list:
    from mlflow import MlflowClient

    from record.vocabulary import KIND_CELL, search_all

    exp = MlflowClient(uri).get_experiment_by_name(name)
    return search_all(uri, [exp.experiment_id], f"tags.kind = '{KIND_CELL}'")


def overhead(args: argparse.Namespace, tmp: Path) -> tuple[dict, list[str]]:
    import torch

    from ablations.sweep import run_study
    from ablations.train import Tracking, train
    from record.spec import load_run, load_study

    base = load_run(ROOT / "ablations" / "runs" / "quickstart.yaml").to_dict()
    base.pop("name")
    base["training"]["max_steps"] = args.steps
    base["resources"]["threads"] = 1  # what a 1-CPU trial gets
    uri = f"sqlite:///{tmp}/overhead.db"
    rows: dict[str, list] = {"sequential": [], "sweep": [], "startup": [], "teardown": []}
    for repeat in range(args.repeats):
        study = load_study(write_study(tmp, f"overhead{repeat}", base, args.cells, 1))
        torch.set_num_threads(1)
        t = time.perf_counter()
        for cell in study.cells:  # ablate run, one after another
            train(cell.run, Tracking(uri, f"sequential{repeat}"))
        rows["sequential"].append(time.perf_counter() - t)
        t, t_epoch = time.perf_counter(), time.time()
        result = run_study(study, tracking_uri=uri, num_cpus=os.cpu_count(), out=lambda _: None)
        rows["sweep"].append(time.perf_counter() - t)
        assert result.counts.get("finished") == args.cells, result.counts
        runs = cell_runs(uri, study.name)
        # one-time costs: Ray and the first worker process start before the first cell's run opens, and
        # Ray stops after the last one closes
        rows["startup"].append(min(r.info.start_time for r in runs) / 1000 - t_epoch)
        rows["teardown"].append(t_epoch + rows["sweep"][-1] - max(r.info.end_time for r in runs) / 1000)
    med = {k: statistics.median(v) for k, v in rows.items()}
    seq, swp = med["sequential"], med["sweep"]
    per_trial = (swp - med["startup"] - med["teardown"] - seq) / args.cells
    trial = seq / args.cells
    results = {
        "cells": args.cells,
        "steps": args.steps,
        "repeats": args.repeats,
        "wall_s": rows,
        "medians": med,
        "ratio": swp / seq,
        "fixed_cost_per_trial_s": per_trial,
        "trial_s": trial,
    }
    lines = [
        "## Overhead: `ablate sweep`, one trial at a time, against the same cells one after another",
        "",
        f"{args.cells} cells of the quickstart run ({args.steps} steps, 1 thread, about {trial:.0f} s each) in one "
        f"process; median of {args.repeats} repeat(s), the two paths alternating.",
        "",
        "| path | wall time s | ratio | once per submission s (Ray start + first worker / Ray stop) | "
        "fixed cost per trial s |",
        "|---|---:|---:|---:|---:|",
        f"| `ablate run` code path, sequential | {seq:.1f} | 1.00 | - | - |",
        f"| `ablate sweep`, max_concurrent 1 | {swp:.1f} | **{swp / seq:.3f}** | {med['startup']:.1f} / "
        f"{med['teardown']:.1f} | **{per_trial:.2f}** |",
    ]
    return results, lines


def scale(args: argparse.Namespace, tmp: Path) -> tuple[dict, list[str]]:
    from ablations.sweep import run_study
    from record.spec import load_study

    base = {
        "task": {"name": "reverse", "train_size": 200, "max_len": 5},
        "model": {"d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32},
        "training": {"max_steps": 5, "val_every": 5, "batch_size": 16, "eval_batch_size": 100},
    }
    uri = f"sqlite:///{tmp}/scale.db"
    study = load_study(write_study(tmp, "scale", base, args.cells, None))
    t = time.perf_counter()
    result = run_study(study, tracking_uri=uri, num_cpus=os.cpu_count(), out=lambda _: None)
    wall = time.perf_counter() - t
    runs = cell_runs(uri, "scale")
    ids = [r.data.tags["cell_id"] for r in runs]
    once = len(ids) == len(set(ids)) == args.cells and all(r.info.status == "FINISHED" for r in runs)
    fg = sum(float(r.data.tags.get("tracking_seconds", 0)) for r in runs)
    bg = sum(float(r.data.tags.get("logging_seconds", 0)) for r in runs)
    trial = statistics.median((r.info.end_time - r.info.start_time) / 1000 for r in runs)
    results = {
        "cells": args.cells,
        "wall_s": wall,
        "cells_per_min": args.cells / wall * 60,
        "exactly_once": once,
        "counts": result.counts,
        "runs": len(runs),
        "mlflow_foreground_s": fg,
        "mlflow_background_s": bg,
        "median_run_s": trial,
    }
    lines = [
        f"## Scale: {args.cells} tiny cells (5 steps each) on a local Ray with {os.cpu_count()} CPUs",
        "",
        "| cells | wall time s | cells per minute | MLflow runs | exactly once | median run s | "
        "MLflow writes, foreground s (per cell) | metric sending, background s |",
        "|---:|---:|---:|---:|---|---:|---:|---:|",
        f"| {args.cells} | {wall:.1f} | {args.cells / wall * 60:.1f} | {len(runs)} | {'yes' if once else 'NO'} | "
        f"{trial:.2f} | {fg:.1f} ({fg / max(1, len(runs)):.2f}) | {bg:.1f} |",
    ]
    return results, lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["overhead", "scale"])
    parser.add_argument("--cells", type=int, default=None)
    parser.add_argument("--steps", type=int, default=1350)  # about 30 s on one thread
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    args.cells = args.cells or (4 if args.what == "overhead" else 200)
    with tempfile.TemporaryDirectory(prefix="abl-bench-") as tmp:
        results, lines = (overhead if args.what == "overhead" else scale)(args, Path(tmp))
    command = "python benchmarks/sweep.py " + " ".join(argv if argv is not None else sys.argv[1:])
    results = {"command": command, "cpus": os.cpu_count(), **results}
    text = "\n".join([f"Command: `{command}`", "", *lines]) + "\n"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"sweep_{args.what}.json").write_text(json.dumps(results, indent=2))
    (args.out / f"sweep_{args.what}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
