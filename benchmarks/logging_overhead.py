"""What tracking costs a training run: the same run with MLflow tracking (SQLite store, and an
``mlflow server`` over HTTP) against the same run with no tracking at all, alternating, in one process.

Tracking = per-step metrics computed every ``log_every`` steps and queued, a background thread sending
them in batches (log_batch), params, tags, the config artifact, dataset lineage, summary metrics.
The figure that matters is the training loop's time per step (cost/step_time_ms, measured by the module
around each step); the set-up and tear-down of the run are reported separately.

    python benchmarks/logging_overhead.py [--repeats 3] [--steps 400]
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)

    import torch
    from conftest import mlflow_server

    from ablations.train import Tracking, train
    from record.spec import load_run, resolve_run

    torch.set_num_threads(1)
    base = load_run(ROOT / "ablations" / "runs" / "quickstart.yaml").to_dict()
    base["training"]["max_steps"] = args.steps
    base["resources"]["threads"] = 1
    quiet = resolve_run({**base, "tracking": {"log_every": 10**9}})  # no training metrics at all
    tracked = resolve_run(base)  # log_every 10 (the default)

    rows: dict[str, list[dict]] = {"none": [], "sqlite": [], "server": []}
    with tempfile.TemporaryDirectory() as tmp, mlflow_server(Path(tmp)) as server_uri:
        sqlite_uri = f"sqlite:///{tmp}/bench.db"
        train(tracked, Tracking(sqlite_uri, "warmup"))  # create the tables, warm the caches
        for _ in range(args.repeats):
            for name, run, where, log in (
                ("none", quiet, None, False),
                ("sqlite", tracked, Tracking(sqlite_uri, "bench"), True),
                ("server", tracked, Tracking(server_uri, "bench"), True),
            ):
                t = time.perf_counter()
                result = train(run, where, log=log)
                wall = time.perf_counter() - t
                m = result.metrics
                sending = 0.0
                if log:
                    from mlflow import MlflowClient

                    tags = MlflowClient(where.uri).get_run(result.run_id).data.tags
                    sending = float(tags.get("logging_seconds", 0))
                rows[name].append(
                    {
                        "step_ms": m["cost/step_time_ms"],
                        "train_s": m["cost/train_time_s"],
                        "wall_s": wall,
                        "sending_s": sending,
                    }
                )
    med = {k: {f: statistics.median(r[f] for r in v) for f in v[0]} for k, v in rows.items()}
    results = {
        "command": "python benchmarks/logging_overhead.py"
        + (f" --repeats {args.repeats}" if args.repeats != 3 else "")
        + (f" --steps {args.steps}" if args.steps != 400 else ""),
        "steps": args.steps,
        "repeats": args.repeats,
        "cpus": os.cpu_count(),
        "medians": med,
        "runs": rows,
    }
    lines = [
        "# Tracking overhead",
        "",
        f"Command: `{results['command']}`  ",
        f"The quickstart run ({args.steps} steps, 1 thread), medians of {args.repeats} alternating repeats.",
        "",
        "| tracking | step time ms | overhead per step | run wall time s | of which set-up + tear-down s | background sending s |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    none = med["none"]
    for name, label in (
        ("none", "none"),
        ("sqlite", "MLflow, SQLite store"),
        ("server", "MLflow, `mlflow server` over HTTP"),
    ):
        m = med[name]
        over = (m["step_ms"] / none["step_ms"] - 1) * 100
        extra = m["wall_s"] - m["train_s"] - (none["wall_s"] - none["train_s"])
        lines.append(
            f"| {label} | {m['step_ms']:.2f} | {over:+.1f}% | {m['wall_s']:.2f} | {extra:+.2f} | {m['sending_s']:.3f} |"
        )
    text = "\n".join(lines) + "\n"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "logging_overhead.json").write_text(json.dumps(results, indent=2))
    (args.out / "logging_overhead.md").write_text(text)
    print(text)
    return results


if __name__ == "__main__":
    main()
