"""How our processes end (ablations.process): the last garbage collections are skipped, nothing else is."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from mlflow import MlflowClient

from tests.conftest import ROOT

SCRIPT = """
import atexit, gc, sys, tempfile
import mlflow
from ablations.process import exit_quickly

atexit.register(lambda: print("earlier handler ran; frozen objects:", gc.get_freeze_count(), flush=True))
exit_quickly()
exit_quickly()  # once per process, however often it is asked
atexit.register(lambda: print("later handler ran; frozen objects:", gc.get_freeze_count(), flush=True))
folder = tempfile.TemporaryDirectory()  # removed by its weakref.finalize at exit
print("folder", folder.name, flush=True)
mlflow.set_tracking_uri(sys.argv[1])
mlflow.set_experiment("ending")
run = mlflow.start_run()  # never ended: MLflow's exit handler ends it
print("run", run.info.run_id, flush=True)
for step in range(20):
    mlflow.log_metric("m", float(step), step=step)
# (metrics queued with synchronous=False and never flushed: MLflow's exit loses the last few with or without the
# freeze, 296-299 of 300 in runs here, so they say nothing of it)
"""


def test_a_process_that_exits_quickly_runs_every_exit_handler(tmp_path: Path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", SCRIPT, uri], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    # every exit handler ran, in Python's order (the last registered first); the freeze came between them
    assert done.stdout.index("later handler ran") < done.stdout.index("earlier handler ran")
    assert lines["later"].endswith("frozen objects: 0")
    assert int(lines["earlier"].rsplit(" ", 1)[1]) > 10_000  # what the last collections no longer walk
    assert not Path(lines["folder"]).exists()  # weakref.finalize callbacks still run
    c = MlflowClient(uri)  # read back through MLflow
    assert sorted(p.step for p in c.get_metric_history(lines["run"], "m")) == list(range(20))
    assert c.get_run(lines["run"]).info.status == "FINISHED"  # ended by MLflow's own exit handler


PAUSED = """
import gc, sys
from ablations.process import import_paused

seen = []
gc.callbacks.append(lambda phase, info: phase == "start" and seen.append(info["generation"]))
assert "http.server" not in sys.modules and gc.get_freeze_count() == 0
import_paused(["http.server", "json"])  # about 14 collections when imported with the collector on
print("collections while importing:", len(seen))
print("enabled after:", gc.isenabled(), "frozen:", gc.get_freeze_count() > 0)
frozen = gc.get_freeze_count()
import_paused(["http.server"])  # imported already: nothing to do
print("frozen again:", gc.get_freeze_count() != frozen)
cycle = [];  cycle.append(cycle); del cycle  # garbage made after the imports is collected as before
print("collected:", gc.collect() > 0)
"""


def test_imports_with_the_collector_paused_leave_it_on_and_later_garbage_collected():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", PAUSED], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "collections while importing: 0",
        "enabled after: True frozen: True",
        "frozen again: False",
        "collected: True",
    ]


def test_a_training_process_imports_the_sql_store_only_for_a_database(monkeypatch):
    from ablations.process import tracking_modules, training_modules, trial_modules

    store = "mlflow.store.tracking.sqlalchemy_store"
    assert store in training_modules("sqlite:////tmp/x.db") and "ablations.train" in training_modules(None)
    assert store in tracking_modules("postgresql+psycopg2://u@127.0.0.1/db")
    assert tracking_modules("http://127.0.0.1:5000") == ["mlflow"]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "https://mlflow.example.org")
    assert tracking_modules(None) == ["mlflow"]  # None: as ablations.tracking resolves it
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    assert store in tracking_modules(None)  # the embedded SQLite store
    # a trial that drives data-parallel workers imports only the tracking: its workers train (no torch in it)
    assert trial_modules(None, 1) == training_modules(None) and trial_modules(None, 2) == tracking_modules(None)


DRIVER = """
import gc, os, sys
from ablations.cluster import import_for_driver

seen = []
gc.callbacks.append(lambda phase, info: phase == "start" and seen.append(info["generation"]))
import_for_driver(None, ["mlflow", "ray.tune"])  # what `ablate sweep` imports before it connects
print("collections while importing (about 530 with the collector on):", len(seen) < 5)
print("enabled after:", gc.isenabled(), "frozen:", gc.get_freeze_count() > 100_000)
print("imported:", all(m in sys.modules for m in ("ray", "ray.tune", "mlflow")), "torch:", "torch" in sys.modules)
print("loopback settings before ray:", os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"])
"""


def test_a_driver_imports_ray_after_its_loopback_settings_with_the_collector_paused():
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run([sys.executable, "-c", DRIVER], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "collections while importing (about 530 with the collector on): True",
        "enabled after: True frozen: True",
        "imported: True torch: False",  # a sweep's driver imports no torch (tests/test_architecture.py)
        "loopback settings before ray: 0",
    ]
