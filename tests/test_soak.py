"""benchmarks/soak.py --short, the fault soak at the suite's size: a study and a search on the team deployment's
PostgreSQL and MLflow server and a two-node loopback Ray, while its drawn schedule kills both drivers, a trial
worker, a Ray node and the MLflow server and restarts PostgreSQL. Its targets (0 lost, 0 duplicated, 0 metrics
missing, 0 runs left RUNNING) are checked, and its figures are counted again here, independently, by SQL on the
stores' own databases (MLflow's backend store and Optuna's storage) before the soak stops them."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from collections import Counter

import pytest

from tests.conftest import ROOT, postgres_reachable


def soak_module():
    spec = importlib.util.spec_from_file_location("soak_bench", ROOT / "benchmarks" / "soak.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def dsn(url: str) -> str:
    """A SQLAlchemy URL of PostgreSQL as libpq reads it."""
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


def read_stores(deployment, cells: list[str]) -> dict:
    """What the stores hold, read with SQL from their databases (not through MLflow's or Optuna's clients, nor the
    soak's counting): every run of the two experiments with its status, tags and metric points, and every trial of
    the search with its state and value."""
    import psycopg

    with psycopg.connect(dsn(deployment.mlflow_database), connect_timeout=10) as conn:
        runs = {}
        rows = conn.execute(
            "SELECT r.run_uuid, r.status, e.name FROM runs r JOIN experiments e ON e.experiment_id = r.experiment_id "
            "WHERE e.name IN ('soak', 'soak_search') AND r.lifecycle_stage = 'active'"
        ).fetchall()
        for run_id, status, experiment in rows:
            runs[run_id] = {"status": status, "experiment": experiment, "tags": {}, "points": {}, "latest": {}}
        for run_id, key, value in conn.execute("SELECT run_uuid, key, value FROM tags").fetchall():
            if run_id in runs:
                runs[run_id]["tags"][key] = value
        for run_id, key, step in conn.execute("SELECT run_uuid, key, step FROM metrics").fetchall():
            if run_id in runs:
                runs[run_id]["points"].setdefault(key, set()).add(step)
        for run_id, key, value in conn.execute("SELECT run_uuid, key, value FROM latest_metrics").fetchall():
            if run_id in runs:
                runs[run_id]["latest"][key] = value
    with psycopg.connect(dsn(deployment.storage), connect_timeout=10) as conn:
        trials = conn.execute(
            "SELECT t.number, t.state, v.value FROM trials t JOIN studies s ON s.study_id = t.study_id "
            "LEFT JOIN trial_values v ON v.trial_id = t.trial_id AND v.objective = 0 WHERE s.study_name = 'soak_search'"
        ).fetchall()
    return {"cells": cells, "runs": runs, "trials": trials}


@pytest.mark.slow
def test_the_short_soak_meets_its_targets_as_the_stores_hold_them(tmp_path):
    soak = soak_module()
    own = soak.postgres_binaries() is not None and soak._can_run_as_postgres()
    if not own and not postgres_reachable():
        pytest.skip(
            "no PostgreSQL: neither server binaries (initdb, postgres) to start one nor a server on 127.0.0.1:5432"
        )
    from ablations.localcluster import marked
    from record.spec import load_study

    seen: dict = {}

    def check(deployment) -> None:
        seen["deployment"] = deployment
        seen.update(read_stores(deployment, [c.cell_id for c in load_study(deployment.study_path).cells]))

    said: list[str] = []
    figures = soak.soak(soak.SHORT, soak.SEED, tmp_path / "results", check=check, say=said.append)
    text = "\n".join(said)

    # written where it was asked, and what it says is what it returned
    assert json.loads((tmp_path / "results" / "soak.json").read_text())["targets"] == figures["targets"]
    assert "Targets: 0 lost met, 0 duplicated met" in (tmp_path / "results" / "soak.md").read_text()
    assert figures["targets"] == dict.fromkeys(soak.targets(figures), True), text
    assert not figures["timed out"], text

    # every kind of fault was dealt and fired, and the drivers that stopped were submitted again until done
    assert Counter(f["kind"] for r in figures["rounds"] for f in r["faults"] if "at" in f) == Counter(soak.KINDS), text
    submissions = [s for subs in figures["drivers"].values() for s in subs]
    assert any(s.get("stopped_by") for s in submissions), text
    assert all(subs[-1]["rc"] == 0 for subs in figures["drivers"].values()), text

    # the study, counted again from MLflow's database: one result per cell, or a failure with its reason
    runs = seen["runs"]
    cell_runs = [r for r in runs.values() if r["experiment"] == "soak" and r["tags"].get("kind") == "cell"]
    results = Counter(r["tags"]["cell_id"] for r in cell_runs if r["status"] == "FINISHED")
    failed = {
        c
        for c in seen["cells"]
        if not results[c] and any(r["tags"].get("cell_id") == c and r["tags"].get("status_detail") for r in cell_runs)
    }
    assert set(results) <= set(seen["cells"])
    study = figures["study"]
    assert study["cells"] == len(seen["cells"]) == 4
    assert study["lost"] == sum(1 for c in seen["cells"] if not results[c] and c not in failed) == 0
    assert study["duplicated"] == sum(1 for n in results.values() if n > 1) == 0
    assert study["failed"] == len(failed)

    # the search, counted again from Optuna's database and MLflow's: each complete trial has exactly one finished
    # run, which logged the value Optuna holds; nothing is left RUNNING in either
    trial_runs = [r for r in runs.values() if r["experiment"] == "soak_search" and r["tags"].get("kind") == "trial"]
    complete = {number: value for number, state, value in seen["trials"] if state == "COMPLETE"}
    search = figures["search"]
    assert search["complete"] == len(complete)
    assert len(complete) + search["failed"] == soak.SHORT.trials
    for number, value in complete.items():
        finished = [r for r in trial_runs if r["tags"].get("trial") == str(number) and r["status"] == "FINISHED"]
        assert len(finished) == 1, f"trial {number}: {len(finished)} finished runs"
        assert math.isclose(finished[0]["latest"]["final/val_loss"], value, rel_tol=1e-6)
    assert [n for n, state, _ in seen["trials"] if state == "RUNNING"] == []
    # every driver has ended, so a run still RUNNING would have no process
    assert [(r["experiment"], r["tags"].get("kind")) for r in runs.values() if r["status"] == "RUNNING"] == []

    # every finished run holds its summary and every point of its histories (30 steps, validation every 10)
    expected = {"val/loss": {10, 20, 30}, "train/loss": {0, 10, 20}}
    for r in [*cell_runs, *trial_runs]:
        if r["status"] == "FINISHED" and r["tags"].get("status_detail", "").startswith("finished"):
            assert set(soak.SUMMARY) <= set(r["latest"]), r["tags"].get("mlflow.runName")
            for key, steps in expected.items():
                assert steps <= r["points"].get(key, set()), (key, r["tags"].get("mlflow.runName"))
            assert not r["tags"].get("metrics_lost")
    assert study["runs with metrics missing"] == search["runs with metrics missing"] == 0

    # and nothing the soak started is left: no process of its Ray cluster, none with its folder
    deployment = seen["deployment"]
    assert marked(deployment.cluster_mark) == []
    assert not deployment.folder.exists()
    assert soak.alive_with(str(deployment.folder)) == []
