"""Figures of the fault tests (README, "Reliability"): each scenario's faults injected, cells, cells lost and
cells duplicated, counted from the MLflow store the scenario left. Written to the JSON file named by
ABLATE_RELIABILITY_OUT when it is set (docs/reliability.md is made from one such run)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections import Counter
from pathlib import Path

from mlflow import MlflowClient

from record.vocabulary import KIND_CELL, RESULT_STATES, STATUS_FAILED, cell_state, client


def count(store: str, study: str, cell_ids: list[str]) -> dict[str, int]:
    """cells, lost (no result and no recorded failure), duplicated (more than one result) of a study's cells."""
    c = MlflowClient(store)
    exp = c.get_experiment_by_name(study)
    runs = c.search_runs([exp.experiment_id], f"tags.kind = '{KIND_CELL}'", max_results=5000)
    results = Counter(r.data.tags["cell_id"] for r in runs if cell_state(r) in RESULT_STATES)
    failed = {r.data.tags["cell_id"] for r in runs if cell_state(r) == STATUS_FAILED}
    return {
        "cells": len(cell_ids),
        "lost": sum(1 for cell in cell_ids if results[cell] == 0 and cell not in failed),
        "duplicated": sum(1 for cell in cell_ids if results[cell] > 1),
        "failed": sum(1 for cell in cell_ids if results[cell] == 0 and cell in failed),
    }


def record(scenario: str, faults: str, figures: dict[str, int]) -> None:
    out = os.environ.get("ABLATE_RELIABILITY_OUT")
    if not out:
        return
    path = Path(out)
    data = json.loads(path.read_text()) if path.exists() else {}
    data[scenario] = {"faults": faults, **figures}
    path.write_text(json.dumps(data, indent=1))


def kill_while_training(
    store: str, experiment: str, where: str, times: int = 1, timeout: float = 240.0
) -> tuple[threading.Thread, list[int]]:
    """A fault: a thread that SIGKILLs the process of a RUNNING run of ``experiment`` that matches the MLflow
    filter ``where`` as soon as it has logged a training loss (as an out-of-memory kill or a lost worker would),
    ``times`` distinct processes in all. Returns the started thread and the pids it killed."""
    killed: list[int] = []

    def kill() -> None:
        c = client(store)  # as the commands open it (a new SQLite store's schema under their lock)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and len(killed) < times:
            exp = c.get_experiment_by_name(experiment)
            for run in c.search_runs([exp.experiment_id], f"{where} and attributes.status = 'RUNNING'") if exp else []:
                pid = int(run.data.tags.get("pid", 0))
                if pid and pid not in killed and c.get_metric_history(run.info.run_id, "train/loss"):
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                    break
            time.sleep(0.3)

    thread = threading.Thread(target=kill, daemon=True)
    thread.start()
    return thread, killed
