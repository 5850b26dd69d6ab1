"""A catalogue study packed onto one GPU (issue 69): the same study submitted with 1, 4, 8 and 16 cells per GPU
(``resources: {cpus: 1, gpus: 1/k}``), each level in a store of its own, reporting cells per minute, the GPU's
utilisation and memory, and the memory of one cell three ways (the dry run's calibration on the CPU, the same step's
allocator peak on the GPU, and what ``nvidia-smi`` shows per trial process), against the same study's committed
2-core CPU wall time (docs/results/README.md).

    python benchmarks/packing.py                      # a CUDA machine: norm_placement at 16, 8, 4, 1 per GPU
    python benchmarks/packing.py --smoke              # any machine: a 4-cell study at 2 per GPU on a local Ray whose
                                                      # head declares one GPU (ablate cluster up --gpus 1)

Each level is one ``ablate sweep`` of the study with the seeds of its first look fixed, stopped (Ctrl-C, what a
person does) at its time limit: the levels after the first show the rate, not the whole study. Cells per minute:
the cells finished between the first cell's start and the last one's end (Ray's start, the driver's imports and the
calibration excluded; reported apart as the level's start-up). ``benchmarks/gpu.py --only packed`` runs it as a
section of the GPU session.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

STUDY = "norm_placement"
LEVELS = (16, 1, 4, 8)  # the whole study packed first: the rate of the others needs only their first minutes
# Seconds per level, start-up included: on an H200 with 16 CPUs (2026-11-28) a level's start-up (Ray, the driver's
# imports and calibration, the trial processes' imports and CUDA) took 39-47 s before its first cell started
LIMITS = {16: 150.0, 1: 80.0, 4: 100.0, 8: 100.0}
SMOKE = {"levels": (2,), "limits": {2: 150.0}, "seeds": 2, "steps": 5, "grid": {"model.norm": ["pre", "post"]}}


def cpu_reference(study: str, readme: Path = ROOT / "docs" / "results" / "README.md") -> dict[str, Any] | None:
    """The study's committed wall time on 2 cores: its row of the wall table (cells, seconds)."""
    row = re.search(
        rf"^\| \[{re.escape(study)}\]\([^)]*\) \| [^|]*?\((\d+) cells[^|]*\| [\d,]+ \| ([\d,]+) s",
        readme.read_text(),
        re.M,
    )
    if row is None:
        return None
    cells, seconds = int(row.group(1)), float(row.group(2).replace(",", ""))
    return {"cells": cells, "seconds": seconds, "cells_per_min": 60 * cells / seconds, "source": str(readme.name)}


def derived_study(src: Path, folder: Path, gpus: float, seeds: int, smoke: bool) -> Path:
    """The study with the seeds of its first look fixed and ``gpus`` per trial (smoke: tiny)."""
    data = yaml.safe_load(src.read_text())
    data["seeds"] = seeds
    data["resources"] = {"cpus": 1, "gpus": gpus}
    if isinstance(data.get("base"), str):
        data["base"] = str((src.parent / data["base"]).resolve())
    if smoke:
        data["design"] = {"grid": SMOKE["grid"]}
        data["budget"] = {"steps": SMOKE["steps"]}
        data.pop("analysis", None)
    path = folder / src.name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


class GpuSampler:
    """``nvidia-smi`` once a second in a thread: the GPU's utilisation and memory, and each process's memory."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float, float]] = []  # (time, utilisation %, memory used MiB)
        self.per_process: dict[int, float] = {}  # pid -> the most MiB it held
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.available = shutil.which("nvidia-smi") is not None

    def __enter__(self) -> GpuSampler:
        if self.available:
            self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop_event.set()
        if self.available:
            self.thread.join(timeout=10)

    def _query(self, what: str) -> list[list[str]]:
        args = ["nvidia-smi", f"--query-{what}", "--format=csv,noheader,nounits"]
        out = subprocess.run(args, capture_output=True, text=True, timeout=10).stdout
        return [[x.strip() for x in line.split(",")] for line in out.splitlines() if line.strip()]

    def _run(self) -> None:
        while not self.stop_event.is_set():
            try:
                util, used = self._query("gpu=utilization.gpu,memory.used")[0][:2]
                self.samples.append((time.time(), float(util), float(used)))
                for pid, mb in self._query("compute-apps=pid,used_memory"):
                    self.per_process[int(pid)] = max(self.per_process.get(int(pid), 0.0), float(mb))
            except (OSError, subprocess.SubprocessError, ValueError, IndexError):
                pass
            self.stop_event.wait(1.0)

    def between(self, start: float, end: float) -> dict[str, Any]:
        inside = [s for s in self.samples if start <= s[0] <= end]
        if not inside:
            return {}
        return {
            "gpu_util_mean_pct": statistics.fmean(s[1] for s in inside),
            "gpu_memory_peak_mib": max(s[2] for s in inside),
            "process_memory_max_mib": max(self.per_process.values()) if self.per_process else None,
            "processes": len(self.per_process),
            "samples": len(inside),
        }


def read_cells(uri: str, study: str) -> list[dict[str, Any]]:
    from mlflow import MlflowClient

    from benchmarks.sweep import cell_runs
    from record import vocabulary

    if MlflowClient(uri).get_experiment_by_name(study) is None:
        return []
    return [
        {
            "state": vocabulary.cell_state(r),
            "start": r.info.start_time / 1000,
            "end": (r.info.end_time or 0) / 1000,
            "peak_memory_mb": r.data.metrics.get("cost/peak_memory_mb"),
            "detail": r.data.tags.get(vocabulary.TAG_STATUS, ""),
            "device": r.data.tags.get(vocabulary.TAG_DEVICE),
        }
        for r in cell_runs(uri, study)
    ]


def sweep(study: Path, uri: str, address: str | None, limit: float, log: Path) -> tuple[float, float, int, bool]:
    """``ablate sweep`` until it ends or ``limit`` passes (then Ctrl-C, as a person would): (start, end, exit, cut)."""
    # the command line as a module: a GPU machine may hold this checkout without the package installed
    cmd = [sys.executable, "-m", "ablate", "sweep", str(study), "--tracking-uri", uri]
    cmd += ["--address", address] if address else []
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    start = time.time()
    with open(log, "w") as out:
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": path},
        )
        cut = False
        try:
            proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            cut = True
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return start, time.time(), proc.returncode, cut


def level(study: Path, name: str, k: int, limit: float, folder: Path, address: str | None) -> dict[str, Any]:
    """One submission of the study at ``k`` cells per GPU, in a store of its own."""
    uri = f"sqlite:///{folder}/mlflow.db"
    log = folder / "sweep.log"
    with GpuSampler() as gpu:
        start, end, code, cut = sweep(study, uri, address, limit, log)
    if keep := os.environ.get("ABLATE_PACKING_LOGS"):  # the session script's: each level's last lines come back
        with open(keep, "a") as f:
            f.write(f"== {k} per GPU\n" + "\n".join(log.read_text().splitlines()[-40:]) + "\n")
    if not Path(uri.removeprefix("sqlite:///")).exists() or not (cells := read_cells(uri, name)):
        tail = "\n".join(log.read_text().splitlines()[-25:])
        why = "its time ran out before a cell started" if cut else f"it ended with exit {code}"
        raise RuntimeError(f"the sweep at {k} per GPU recorded no cell: {why}; the end of its output:\n{tail}")
    done = [c for c in cells if c["state"] in ("finished", "diverged")]
    first = min((c["start"] for c in cells), default=end)
    last = max((c["end"] for c in done), default=end)
    span = max(last - first, 1e-9)
    calibration = [line for line in log.read_text().splitlines() if line.startswith("packing:")]
    return {
        "cells_per_gpu": k,
        "limit_s": limit,
        "cut": cut,
        "exit": code,
        "cells_done": len(done),
        "cells_started": len(cells),
        "wall_s": round(end - start, 1),
        "startup_s": round(first - start, 1),
        "cells_span_s": round(span, 1),
        "cells_per_min": 60 * len(done) / span if done else 0.0,
        "cell_peak_allocated_mb": max((c["peak_memory_mb"] or 0 for c in done), default=None),
        "devices": sorted({c["device"] for c in done if c["device"]}),
        "not_done": dict(Counter(f"{c['state']}: {c['detail'][:200]}" for c in cells if c not in done)),
        "packing_lines": calibration,
        **gpu.between(first, last),
    }


def gpu_calibration(study: Path) -> dict[str, Any]:
    """The memory of the study's largest model's step, on the CPU (tensor bytes: what the dry run counts) and on the
    GPU (the allocator's peak, reserved), side by side."""
    import torch

    from ablations.packing import _distinct_models, step_memory_mb
    from record.spec import load_study

    label, run = _distinct_models(load_study(study))[0]
    out = {"variant": label, "cpu_tensor_mb": step_memory_mb(run, torch.device("cpu"))}
    if torch.cuda.is_available():
        out["gpu_reserved_mb"] = step_memory_mb(run, torch.device("cuda"))
    return out


def measure(
    study: str = STUDY,
    levels: tuple[int, ...] = LEVELS,
    limits: dict[int, float] | None = None,
    *,
    smoke: bool = False,
    address: str | None = None,
    time_left: Callable[[], float] = lambda: float("inf"),
    on_level: Callable[[dict], None] = lambda r: None,
) -> dict[str, Any]:
    """Every level in order while time is left (a level is given at most its limit and what is left)."""
    limits = limits or (SMOKE["limits"] if smoke else LIMITS)
    src = ROOT / "ablations" / "studies" / f"{study}.yaml"
    plan = yaml.safe_load(src.read_text()).get("seeds")
    seeds = SMOKE["seeds"] if smoke else plan["first"] if isinstance(plan, dict) else plan
    result: dict[str, Any] = {"study": study, "seeds": seeds, "levels": [], "cpu": cpu_reference(study)}
    with tempfile.TemporaryDirectory(prefix="packing-") as tmp:
        first = derived_study(src, Path(tmp), 1 / levels[0], seeds, smoke)
        result["calibration"] = gpu_calibration(first)
        on_level(result)
        for k in levels:
            left = time_left()
            if left < 20:
                break
            folder = Path(tmp) / f"k{k}"
            folder.mkdir()
            path = derived_study(src, folder, 1 / k, seeds, smoke)
            row = level(path, study, k, min(limits[k], left - 5), folder, address)
            result["levels"].append(row)
            on_level(result)
            print(
                f"packed {k} per GPU: {row['cells_done']} cells in {row['cells_span_s']:.0f} s "
                f"({row['cells_per_min']:.1f} a minute; start-up {row['startup_s']:.0f} s), GPU "
                f"{row.get('gpu_util_mean_pct', float('nan')):.0f}% busy, {row.get('gpu_memory_peak_mib', 0):.0f} MiB",
                flush=True,
            )
    return result


def markdown(r: dict[str, Any], device: str, title: str = "A packed study") -> list[str]:
    cpu = r.get("cpu") or {}
    lines = [
        f"**{title}** ({r['study']}, seeds {r['seeds']}: each level one `ablate sweep` with "
        "`resources: {cpus: 1, gpus: 1/k}` in a store of its own, stopped at its limit), on " + device + ":",
        "",
        "| cells per GPU | cells done (of started) | cells a minute | vs 2-core CPU | start-up s | GPU busy | "
        "GPU memory peak | per process max | cell's allocated peak |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for x in r["levels"]:
        vs = f"{x['cells_per_min'] / cpu['cells_per_min']:.1f}x" if cpu else "-"
        util = x.get("gpu_util_mean_pct")
        lines.append(
            f"| {x['cells_per_gpu']} | {x['cells_done']} ({x['cells_started']}){' cut' if x['cut'] else ''} | "
            f"{x['cells_per_min']:.1f} | {vs} | {x['startup_s']:.0f} | {'-' if util is None else f'{util:.0f}%'} | "
            f"{_mib(x.get('gpu_memory_peak_mib'))} | {_mib(x.get('process_memory_max_mib'))} | "
            f"{_mib(x.get('cell_peak_allocated_mb'))} |"
        )
    if cpu:
        lines += [
            "",
            f"2-core CPU: {cpu['cells']} cells in {cpu['seconds']:,.0f} s ({cpu['cells_per_min']:.1f} a minute; "
            f"docs/results/README.md's wall table, 2 trials at a time).",
        ]
    cal = r.get("calibration") or {}
    if cal:
        gpu = f", on the GPU {cal['gpu_reserved_mb']:.1f} MB (allocator reserved)" if "gpu_reserved_mb" in cal else ""
        lines += [
            "",
            f"One calibration step of {cal['variant']}: on the CPU {cal['cpu_tensor_mb']:.1f} MB of tensors{gpu}.",
        ]
    said = next((x["packing_lines"] for x in r["levels"] if x.get("packing_lines")), [])
    if said:
        lines += ["", "The dry run and the submission said:", ""] + [f"    {line}" for line in said]
    return lines


def _mib(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f} MiB"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="a 4-cell study at 2 per declared GPU, on any machine")
    parser.add_argument("--study", default=STUDY)
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    if args.smoke:
        r = smoke_run(args.study)
    else:
        r = measure(args.study)
    print("\n".join(markdown(r, "this machine")))
    if args.out:
        args.out.write_text(json.dumps(r, indent=1))
    return r


def smoke_run(study: str = STUDY) -> dict[str, Any]:
    """Through the same code on a machine without a GPU: a local Ray whose head declares one GPU."""
    from ablations import localcluster

    cluster = localcluster.up(0, cpus_per_node=2, gpus=1)
    try:
        return measure(study, SMOKE["levels"], smoke=True, address=cluster.address)
    finally:
        localcluster.stop(cluster)


if __name__ == "__main__":
    main()
