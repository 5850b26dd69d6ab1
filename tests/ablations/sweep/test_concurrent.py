"""Ten submissions of one study started at the same moment from different processes: each cell is trained
exactly once, and every submission ends with the full table. On SQLite (one machine), and on PostgreSQL as if
from ten machines (each process names itself another host: no process can see whether another is alive, only
the leases in the store, timed by the store's clock). The store is new: the ten also race to create its schema."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections import Counter

import pytest
import yaml
from mlflow import MlflowClient

from record.vocabulary import KIND_CELL, KIND_STUDY, RESULT_STATES, cell_state
from tests import reliability
from tests.conftest import ROOT, fresh_postgres_database
from tests.ray_nodes import ray_cluster

pytestmark = pytest.mark.slow

SUBMISSIONS = 10
STUDY = {
    "name": "together",
    "base": {
        "task": {"name": "reverse", "train_size": 200, "max_len": 5},
        "model": {"d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32},
        "training": {"max_steps": 20, "val_every": 10, "batch_size": 16, "eval_batch_size": 64},
    },
    "design": {"grid": {"model.norm": ["pre", "post"]}},
    "seeds": 2,
    "resources": {"cpus": 1},
}


@contextlib.contextmanager
def backend_store(tmp_path, backend: str):
    """The MLflow store the submissions share: SQLite (claims beside it, claims.db) or a fresh PostgreSQL database."""
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'mlflow.db'}"
    else:
        with fresh_postgres_database("ablate_together") as url:
            yield url


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_ten_submissions_at_once_train_each_cell_exactly_once(tmp_path, backend):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "ABLATE_", "RAY_ADDRESS"))}
    env["PYTHONPATH"] = str(ROOT)
    path = tmp_path / "together.yaml"
    path.write_text(yaml.safe_dump(STUDY))
    with backend_store(tmp_path, backend) as store:
        if backend == "postgresql":
            env["ABLATE_CLAIMS_URL"] = store
        with ray_cluster(tmp_path, nodes=1, cpus_per_node=2, dashboard=False) as cluster:
            command = [sys.executable, "-m", "ablate", "sweep", str(path), "--tracking-uri", store]
            command += ["--address", cluster.address]
            procs = []
            for i in range(SUBMISSIONS):
                own = {**env, "ABLATE_HOST": f"machine-{i}"} if backend == "postgresql" else env
                log = open(tmp_path / f"submission-{i}.log", "w")  # noqa: SIM115  (closed below)
                procs.append(
                    (subprocess.Popen(command, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, env=own), log)
                )
            started = time.monotonic()
            for proc, log in procs:
                proc.wait(timeout=900)
                log.close()
            took = time.monotonic() - started
        outputs = [(tmp_path / f"submission-{i}.log").read_text() for i in range(SUBMISSIONS)]
        assert [p.returncode for p, _ in procs] == [0] * SUBMISSIONS, "\n\n".join(outputs)

        c = MlflowClient(store)
        exp = c.get_experiment_by_name("together")
        runs = c.search_runs([exp.experiment_id], f"tags.kind = '{KIND_CELL}'", max_results=1000)
        per_cell = Counter(r.data.tags["cell_id"] for r in runs)
        results = Counter(r.data.tags["cell_id"] for r in runs if cell_state(r) in RESULT_STATES)
        assert len(results) == 4 and set(results.values()) == {1}  # every cell has exactly one result
        assert set(per_cell.values()) == {1}, per_cell  # and was trained exactly once: no second run at all
        parents = c.search_runs([exp.experiment_id], f"tags.kind = '{KIND_STUDY}'", max_results=1000)
        numbers = sorted(int(r.data.tags["submission"]) for r in parents)
        assert numbers == list(range(1, len(parents) + 1)), numbers  # no two submissions share a number
        assert all(r.info.status == "FINISHED" for r in parents)
        for out in outputs:  # every submission ends with the full table: four cells, all finished
            assert out.count(" finished ") >= 4 and "together: 4 finished" in out, out
        figures = reliability.count(store, "together", list(per_cell))
        assert figures == {"cells": 4, "lost": 0, "duplicated": 0, "failed": 0}
        reliability.record(
            f"{SUBMISSIONS} submissions at once ({backend})", f"{SUBMISSIONS} simultaneous submissions", figures
        )
        waited = sum("waiting for" in out or "nothing to train" in out for out in outputs)
        print(f"{backend}: {SUBMISSIONS} submissions in {took:.0f} s; {waited} waited for or reused others' cells")
