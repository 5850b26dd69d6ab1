"""Ctrl-C and SIGTERM stop the test suite at once, and every process it started.

A small session runs in a subprocess with this suite's conftest: one test starts a long-lived process of its own
and then trains a model in-process with Lightning (which, left alone, turns Ctrl-C into a failed test and
carries on). The session is interrupted while it trains: it must end within seconds, report the interruption,
not run the next test, and leave no process behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT, session_processes

INNER = """
import os, subprocess, sys
from pathlib import Path

from record.spec import resolve_run
from ablations.train import Tracking, train


def test_trains_for_a_long_time(tmp_path):
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    Path(os.environ["MARK_FILE"]).write_text(os.environ["ABLATE_TEST_SESSION"])
    run = resolve_run({
        "task": {"name": "copy", "train_size": 200},
        "model": {"d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32},
        "training": {"max_steps": 1_000_000, "val_every": 1_000_000, "batch_size": 8},
    })
    training = Path(os.environ["MARK_FILE"] + ".training")

    def inside_the_loop(step, metrics):  # called with the metrics of every 10th step, from Lightning's loop
        if step >= 20 and not training.exists():
            training.write_text(str(step))

    train(run, Tracking(f"sqlite:///{tmp_path}/m.db", "long"), log=False, hooks=[inside_the_loop])


def test_never_reached():
    Path(os.environ["MARK_FILE"] + ".next").write_text("ran")
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sig", "workers"),
    [(signal.SIGINT, 0), (signal.SIGTERM, 0), (signal.SIGINT, 1), (signal.SIGTERM, 1)],
    ids=["ctrl-c", "sigterm", "ctrl-c, xdist", "sigterm, xdist"],
)
def test_an_interrupted_session_stops_at_once_and_leaves_no_process(tmp_path, sig, workers):
    """Ctrl-C reaches the terminal's whole process group (with xdist: the controller and its worker); SIGTERM
    (`kill`, a CI time limit) reaches the controller alone, which must stop its workers and all they started."""
    (tmp_path / "test_inner.py").write_text(INNER)
    mark_file = tmp_path / "mark"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}  # not a worker of ours
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider", "-q", str(tmp_path)]
        + (["-n", str(workers)] if workers else []),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**env, "PYTHONPATH": str(ROOT), "MARK_FILE": str(mark_file)},
        start_new_session=True,  # its own process group, as a terminal gives it
    )
    try:
        deadline = time.monotonic() + 120
        while not mark_file.exists() and time.monotonic() < deadline:
            assert proc.poll() is None, proc.stdout.read()
            time.sleep(0.2)
        assert mark_file.exists(), "the inner test never started"
        mark = mark_file.read_text()
        assert len(session_processes(mark)) >= 1  # its sleeper carries the session's marker
        while not (tmp_path / "mark.training").exists() and time.monotonic() < deadline:
            assert proc.poll() is None, proc.stdout.read()
            time.sleep(0.1)
        assert (tmp_path / "mark.training").exists(), "the inner test never reached step 20"  # inside the loop
        sent = time.monotonic()
        if sig == signal.SIGINT:
            os.killpg(proc.pid, sig)  # the terminal's Ctrl-C
        else:
            proc.send_signal(sig)
        out, _ = proc.communicate(timeout=60)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0 and ("Interrupted" in out or "KeyboardInterrupt" in out), out
    assert not (tmp_path / "mark.next").exists(), out  # the suite did not carry on
    time.sleep(0.5)
    assert session_processes(mark) == [], "processes left behind"
    print(f"stopped {took:.1f} s after {sig.name}")
