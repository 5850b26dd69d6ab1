"""A seed plan on a real local Ray and a real MLflow store: batches only where a contrast is open, a submission
killed between batches resumes at the same look, no seed trains twice, and a finished plan trains nothing more."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest

from ablate.main import main
from dashboards.looks import path_rows
from dashboards.looks import table as sequential_table
from record.looks import path
from record.runs import load_runs as load_runs
from record.vocabulary import cell_state
from tests.ablations.sweep.test_sweep import REVERSE, runs_of, wait_for, write_study
from tests.conftest import ROOT

pytestmark = pytest.mark.slow

PLAN = {"first": 7, "batch": 2, "max": 9}  # looks at 7 and 9 seeds; Pocock: 0.05/2 spent 0.0209 by 7 >= 2/2^7


def test_a_plan_trains_seeds_only_where_a_contrast_is_open_and_resumes_after_a_kill(
    tmp_path, store, monkeypatch, capsys
):
    path_ = write_study(
        tmp_path,
        "planned",
        base={**REVERSE, "training": {**REVERSE["training"], "max_steps": 30, "lr": 3.0e-3}},
        design={"variants": [
            {"name": "base", "set": {"training.lr": 3.0e-3}},
            {"name": "near", "set": {"training.val_every": 15}},  # validates more rarely, trains alike: stays open
            {"name": "far", "set": {"training.lr": 1.0e-5}},  # hardly trains: decided at the first look
        ]},
        seeds=PLAN,
        analysis={"contrasts": {"pairs": "baseline"}},
    )  # fmt: skip
    command = [sys.executable, "-m", "ablate", "sweep", str(path_), "--tracking-uri", store, "--cpus", "2"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    log = tmp_path / "first.log"
    with open(log, "w") as out:
        driver = subprocess.Popen(
            command, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env
        )
    try:  # killed once the second look's batch is training
        second = lambda runs: any(int(r.data.tags["seed"]) >= 7 for r in runs)  # noqa: E731
        wait_for(driver, log, store, "planned", second, "a cell of the second look", timeout=400)
        assert "seed plan: the next look needs 4 more cell(s)" in log.read_text()
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait(timeout=30)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(driver.pid, signal.SIGKILL)
    time.sleep(2)
    monkeypatch.chdir(tmp_path)  # the commands that start no Ray run in this process: no interpreter to start
    assert main([*command[3:], "--dry-run"]) == 0
    dry = capsys.readouterr().out
    assert "seed plan: the cells of the look it has reached (25 of 27 up to its maximum)" in dry, dry
    assert "at most: 9 seeds per variant, 27 trials" in dry

    again = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, env=env, timeout=600)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "every declared contrast is decided, or the plan is at its maximum" in again.stdout
    counted = [r for r in runs_of(store, "planned") if cell_state(r) in ("finished", "diverged")]
    trained = Counter((r.data.tags["variant"], int(r.data.tags["seed"])) for r in counted)
    assert max(trained.values()) == 1  # no seed twice
    seeds = Counter(v for v, _ in trained)
    assert seeds == {"base": 9, "near": 9, "far": 7}  # far decided at the first look: no second batch

    runs = load_runs(store, "planned")
    looks, _ = path(runs, runs.design.plan)
    assert [sorted(look.open) for look in looks] == [["near vs base"], ["near vs base"]]
    table = sequential_table(runs)
    far = next(c for c in table.family if c.label == "far vs base")
    near = next(c for c in table.family if c.label == "near vs base")
    assert far.verdict == "different (worse)" and table.decided_at[far.label].startswith(
        "decided at look 1 of 2 (7 seeds"
    )
    assert far.n == 7  # its verdict is the first look's, on 7 seeds, though base trained 9
    assert near.verdict == "not resolved" and table.decided_at[near.label].startswith(
        "open at the maximum, look 2 of 2"
    )
    assert any("25 seeds trained of the 27" in n for n in table.notes)
    rows = [(r[0], r[1], r[-1]) for r in path_rows(looks)]  # a decided contrast's row at its deciding look, no later
    assert rows == [("1", "near vs base", "open"), ("1", "far vs base", "different (worse)"),
                    ("2", "near vs base", "open")], rows  # fmt: skip

    assert main(command[3:]) == 0
    assert "nothing to train" in capsys.readouterr().out
    assert len([r for r in runs_of(store, "planned") if cell_state(r) in ("finished", "diverged")]) == 25
