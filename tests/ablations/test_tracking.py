"""Nothing is lost silently: metrics written while the MLflow server is away arrive when it is back, and what
cannot be written at all marks the run. A real `mlflow server`, paused with SIGSTOP (unreachable, as a network
partition makes it: connections hang)."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest
from mlflow import MlflowClient

from ablations.tracking import RunLogger
from tests.conftest import mlflow_server


def server_pid(port: str) -> list[int]:
    out = subprocess.run(["pgrep", "-f", "--", f"--port {port}"], capture_output=True, text=True).stdout.split()
    return [int(p) for p in out]


@pytest.mark.slow
def test_metrics_written_while_the_store_is_away_arrive_and_what_cannot_marks_the_run(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    with mlflow_server(tmp_path) as uri:
        pids = server_pid(uri.rsplit(":", 1)[1])
        assert pids
        group = os.getpgid(pids[0])
        c = MlflowClient(uri)

        # away for a few seconds: nothing dropped
        logger = RunLogger(uri=uri, experiment="lost", run_name="patient")
        logger.start({"a": 1}, {"a": 1})
        logger.writer.interval = 0.2
        logger.log_metrics({"m": 0.0}, 0)
        time.sleep(1)
        os.killpg(group, signal.SIGSTOP)
        try:
            for step in range(1, 6):
                logger.log_metrics({"m": float(step)}, step)
                time.sleep(1)
        finally:
            os.killpg(group, signal.SIGCONT)
        logger.end("finished")
        history = c.get_metric_history(logger.run_id, "m")
        assert sorted(m.step for m in history) == [0, 1, 2, 3, 4, 5]
        run = c.get_run(logger.run_id)
        assert run.data.tags["status_detail"] == "finished" and "metrics_lost" not in run.data.tags
        assert "logging_errors" in run.data.tags  # it was away, and the run says so

        # away for longer than the writer waits at the end: the run is marked with how much was lost
        logger = RunLogger(uri=uri, experiment="lost", run_name="marked")
        logger.start({"a": 1}, {"a": 1})
        logger.writer.flush_timeout = 3
        os.killpg(group, signal.SIGSTOP)
        try:
            logger.log_metrics({"m": 1.0, "n": 2.0}, 1)
            logger.writer.close()  # gives up after flush_timeout
        finally:
            os.killpg(group, signal.SIGCONT)
        assert logger.writer.lost == 2
        logger.end("finished")
        run = c.get_run(logger.run_id)
        assert run.data.tags["metrics_lost"] == "2"
        assert run.data.tags["status_detail"].startswith("finished: 2 metric value(s) could not be logged")


def test_a_store_moved_with_its_artifacts_is_followed(tmp_path, capsys):
    """A long study stopped on one machine and continued on another (docs/results/run.sh): the SQLite store and its
    artifacts folder are copied to another path. MLflow keeps absolute artifact paths, so the study's design was
    read there as a submission without one (no analysis); the first command on the moved store points them beside it, and leaves a store in place as
    it is."""
    import shutil

    from ablations import tracking
    from record.runs import load_runs
    from tests.dashboards.test_report import fill

    first = tmp_path / "first" / ".store"
    first.mkdir(parents=True)
    values = {"a": {0: 0.5, 1: 0.6}, "b": {0: 0.4, 1: 0.45}}
    fill(f"sqlite:///{first}/mlflow.db", "moved", values, analysis={"margins": {"test/acc": 0.05}})
    assert tracking.follow_moved_store(f"sqlite:///{first}/mlflow.db") is None  # in place: untouched
    elsewhere = tmp_path / "elsewhere" / ".store"
    shutil.copytree(first, elsewhere)
    shutil.rmtree(tmp_path / "first")
    uri = f"sqlite:///{elsewhere}/mlflow.db"
    assert load_runs(uri, "moved").design.analysis.margins == {}  # design.json under a folder that is gone
    assert tracking.resolve_uri(uri) == uri
    assert f"the store moved from {(first / 'artifacts').as_uri()}" in capsys.readouterr().err
    assert load_runs(uri, "moved").design.analysis.margins == {"test/acc": 0.05}
    c = MlflowClient(uri)
    exp = c.get_experiment_by_name("moved")
    assert exp.artifact_location == f"{(elsewhere / 'artifacts').as_uri()}/moved"
    run = c.search_runs([exp.experiment_id], max_results=1)[0]
    c.log_text(run.info.run_id, "more", "later.txt")  # a later cell's artifacts land beside the moved store
    assert (elsewhere / "artifacts" / "moved" / run.info.run_id / "artifacts" / "later.txt").read_text() == "more"
    assert tracking.follow_moved_store(uri) is None
