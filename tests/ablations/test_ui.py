"""`ablate ui` serves the MLflow UI of the store on loopback, and stops by its PID."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request

import pytest

from ablations.train import Tracking, train
from tests.ablations.test_train import short_copy
from tests.conftest import ROOT, free_port, stop, wait_for_http


@pytest.mark.slow
def test_ablate_ui_serves_the_store_on_loopback(tmp_path, store):
    result = train(short_copy(), Tracking(store, "ui-check"))
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ablations.cli", "ui", "--tracking-uri", store, "--port", str(port)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        text=True,
    )
    try:
        wait_for_http(f"http://127.0.0.1:{port}/health", proc=proc)
        url = f"http://127.0.0.1:{port}/api/2.0/mlflow/runs/get?run_id={result.run_id}"
        with urllib.request.urlopen(url, timeout=10) as r:
            run = json.load(r)["run"]
        assert run["info"]["status"] == "FINISHED"
        # the UI page itself
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as r:
            assert r.status == 200 and b"<html" in r.read().lower()
        # bound to loopback only: the server is not reachable on another local address
        out = subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True)
        if out.returncode == 0 and out.stdout.strip():
            assert all(line.split()[3].startswith("127.0.0.1:") for line in out.stdout.strip().splitlines())
    finally:
        stop(proc)
    assert proc.returncode is not None


def test_ablate_ui_without_runs_says_so(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "ablations.cli", "ui", "--tracking-uri", f"sqlite:///{tmp_path}/none.db"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2 and "no runs yet" in out.stdout


@pytest.mark.slow
def test_ablate_ui_optuna_serves_the_search_storage_on_loopback(tmp_path):
    import optuna

    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = optuna.create_study(study_name="lr_search", storage=storage)
    study.optimize(lambda t: (t.suggest_float("lr", 0, 1) - 0.3) ** 2, n_trials=3)
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ablations.cli", "ui", "--optuna", "--storage", storage, "--port", str(port)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        text=True,
    )
    try:
        wait_for_http(f"http://127.0.0.1:{port}/api/studies", proc=proc)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies", timeout=10) as r:
            studies = json.load(r)["study_summaries"]
        assert [s["study_name"] for s in studies] == ["lr_search"]
        out = subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True)
        if out.returncode == 0 and out.stdout.strip():
            assert all(line.split()[3].startswith("127.0.0.1:") for line in out.stdout.strip().splitlines())
    finally:
        stop(proc)


def test_ablate_ui_optuna_without_searches_says_so(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "ablations.cli", "ui", "--optuna", "--storage", f"sqlite:///{tmp_path}/none.db"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2 and "no searches yet" in out.stdout
