"""Sweeps on real Ray clusters with real MLflow stores: one finished run per cell, exactly once, whatever breaks.

Every Ray here is started by the test, on loopback and free ports, and stopped by its PID.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml
from mlflow import MlflowClient

from ablations.sweep import run_study
from record.spec import load_study
from record.vocabulary import KIND_CELL, KIND_STUDY, cell_state, client
from tests import reliability
from tests.conftest import ROOT
from tests.ray_nodes import ray_cluster

pytestmark = pytest.mark.slow

TINY = {"d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32}
REVERSE = {
    "task": {"name": "reverse", "train_size": 300, "max_len": 5},
    "model": TINY,
    "training": {"max_steps": 20, "val_every": 10, "batch_size": 16, "eval_batch_size": 64},
}


def write_study(tmp_path: Path, name: str = "s", **study) -> Path:
    data = {
        "name": name,
        "base": REVERSE,
        "design": {"grid": {"model.norm": ["pre", "post"]}},
        "seeds": 1,
        "metric": "final/val_loss",
        "resources": {"cpus": 1},
        **study,
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def runs_of(uri: str, study: str, kind: str = KIND_CELL) -> list:
    # polled while an `ablate` process may be creating the store: opened as the commands open it, under their
    # lock (two processes creating one new SQLite store's schema at once leave it half-migrated)
    c = client(uri)
    exp = c.get_experiment_by_name(study)
    return c.search_runs([exp.experiment_id], f"tags.kind = '{kind}'", max_results=1000) if exp else []


def by_cell(runs: list) -> dict[str, list]:
    out: dict[str, list] = {}
    for r in runs:
        out.setdefault(r.data.tags["cell_id"], []).append(r)
    return out


def assert_exactly_once(uri: str, study) -> dict[str, object]:
    """Every cell of the study has exactly one result run (finished or diverged) in MLflow."""
    cells = by_cell(runs_of(uri, study.name))
    assert set(cells) == {c.cell_id for c in study.cells}
    results = {}
    for cell_id, runs in cells.items():
        done = [r for r in runs if cell_state(r) in ("finished", "diverged")]
        assert len(done) == 1, (cell_id, [(r.info.status, r.data.tags.get("status_detail")) for r in runs])
        results[cell_id] = done[0]
    return results


# --- a local Ray, started on demand ------------------------------------------------------------------


def test_study_end_to_end_on_local_ray_exactly_once(tmp_path, store, local_ray):
    path = write_study(tmp_path, seeds=2)
    study = load_study(path)
    lines: list[str] = []
    # one trial at a time: Tune runs the cells in one actor, which imports torch and Lightning once (two trials at
    # once on one Ray: test_failures_are_results)
    result = run_study(study, tracking_uri=store, num_cpus=2, max_concurrent=1, out=lines.append)
    assert result.complete and result.counts["finished"] == 4, "\n".join(lines)
    assert any("4/4 cells done" in line for line in lines)  # progress on the terminal

    c = MlflowClient(store)
    parents = runs_of(store, "s", KIND_STUDY)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    parent = parents[0]
    assert parent.data.metrics["cells_finished"] == 4
    assert {a.path for a in c.list_artifacts(parent.info.run_id)} >= {"study.yaml", "summary.txt", "cells.json"}
    results = assert_exactly_once(store, study)
    for cell in study.cells:
        run = results[cell.cell_id]
        tags = run.data.tags
        assert tags["mlflow.parentRunId"] == parent.info.run_id
        assert (tags["study"], tags["variant"], tags["seed"]) == ("s", cell.variant, str(cell.seed))
        assert tags["status_detail"].startswith("finished")
        assert not any(k.startswith("axis.") for k in tags)  # its settings are recorded once, in design.json
        assert tags["ray_node"] and tags["ray_node_ip"] == "127.0.0.1"
        assert run.data.params["model.norm"] == cell.run.model.norm
        assert "final/val_loss" in run.data.metrics and "test/exact_match" in run.data.metrics
        history = c.get_metric_history(run.info.run_id, "val/loss")
        assert [m.step for m in history] == [10, 20]
    from record.recorded import RecordedDesign

    design = RecordedDesign.from_json(
        json.loads((Path(c.download_artifacts(parent.info.run_id, "design.json", str(tmp_path)))).read_text())
    )
    assert {c_id: design.axis_values(v)["model.norm"] for c_id, v in design.cells.items()} == {
        cell.cell_id: cell.run.model.norm for cell in study.cells
    }
    first_ids = {r.info.run_id for r in runs_of(store, "s")}

    # the same command again: nothing to train, nothing recorded
    lines.clear()
    again = run_study(study, tracking_uri=store, num_cpus=2, out=lines.append)
    assert again.parent_run_id is None and any("nothing to train" in line for line in lines)
    assert {r.info.run_id for r in runs_of(store, "s")} == first_ids

    # one more seed: only its two cells are trained, in a second submission (one that takes any code's results:
    # its claims are under the key "any", and its trials' results pass the fence under that key)
    with pytest.raises(ValueError, match="differs from its registered declaration .* in seeds"):
        run_study(load_study(path, seeds=[0, 1, 2]), tracking_uri=store, num_cpus=2, out=lines.append)
    bigger = dataclasses.replace(load_study(path, seeds=[0, 1, 2]), amend="a third seed")  # an amendment says why
    run_study(bigger, tracking_uri=store, num_cpus=2, max_concurrent=1, out=lines.append, reuse_any_code=True)
    from record.recorded import registrations

    amendment = registrations(store, "s")[-1]  # recorded with what had been seen: two results per variant
    assert (amendment.version, amendment.reason, amendment.changed) == (1, "a third seed", ["seeds"])
    assert amendment.finished == {cell.variant: 2 for cell in study.cells} and amendment.after_results
    runs = runs_of(store, "s")
    assert len(runs) == 6 and first_ids < {r.info.run_id for r in runs}
    assert Counter(r.data.tags["submission"] for r in runs) == {"1": 4, "2": 2}
    assert_exactly_once(store, bigger)
    from ablations.claims import ANY_CODE, Claims, claims_url

    claims = Claims(claims_url(store))
    new_cells = [cell for cell in bigger.cells if cell.seed == 2]
    assert [claims.state("s", cell.cell_id, ANY_CODE)["state"] for cell in new_cells] == ["done", "done"]

    # the code is part of a result's identity: every run says which code trained it, and after a change to the
    # model, the tasks or the training loop (another fingerprint) nothing is done until it trains again, unless
    # results of other code are reused on purpose
    from ablations import tracking
    from ablations.sweep import plan

    assert {r.data.tags["code_fingerprint"] for r in runs} == {tracking.code_fingerprint()}
    assert plan(bigger, store, tracking.code_fingerprint()).todo == []
    assert len(plan(bigger, store, "0123456789ab").todo) == 6  # code that trained none of them
    assert plan(bigger, store, None).todo == []  # reuse_results: any_code (or --reuse-any-code)


def test_failures_are_results(tmp_path, store, local_ray):
    """A trial that raises (its data vanished), one that diverges, one whose process is SIGKILLed."""
    corpus, vanishing = tmp_path / "corpus.txt", tmp_path / "vanishing.txt"
    words = [
        "the",
        "of",
        "and",
        "to",
        "in",
        "is",
        "was",
        "for",
        "on",
        "that",
        "with",
        "as",
        "by",
        "at",
        "from",
        "it",
        "an",
        "be",
        "this",
        "are",
        "or",
        "which",
    ]
    text = " ".join(words[(i * 7 + i // 3) % len(words)] for i in range(4000))
    corpus.write_text(text)
    vanishing.write_text(text + " the end")  # other data: a corpus is part of a cell's id by its contents
    base = {
        "task": {"name": "text", "source": str(corpus), "block_size": 32},
        "model": TINY,
        "training": {"max_steps": 30, "val_every": 15, "batch_size": 16, "warmup_steps": 0},
    }
    path = write_study(
        tmp_path,
        "faults",
        base=base,
        retries=1,
        design={
            "variants": [
                {"name": "ok", "set": {}},
                # a rate that makes the weights overflow after one step: non-finite on any CPU (at lr 30 whether
                # the tiny model's loss left the finite range within 30 steps depended on the machine's kernels)
                {"name": "diverges", "set": {"training.lr": 1e30, "training.grad_clip": None}},
                {"name": "vanishes", "set": {"task.source": str(vanishing)}},
                {"name": "victim", "set": {"training.max_steps": 1500, "training.val_every": 500}},
            ]
        },
    )
    study = load_study(path)  # checked while every file exists
    vanishing.unlink()  # ... and then the data of one cell disappears

    killer, killed = reliability.kill_while_training(store, "faults", "tags.variant = 'victim'")
    lines: list[str] = []
    result = run_study(study, tracking_uri=store, num_cpus=2, out=lines.append)
    killer.join(timeout=5)
    log = "\n".join(lines)
    assert killed, "the victim was never seen training\n" + log
    assert result.complete, log
    assert result.counts == {"finished": 2, "diverged": 1, "failed": 1, "skipped": 0}, log
    figures = reliability.count(store, "faults", [c.cell_id for c in study.cells])
    assert figures["lost"] == 0 and figures["duplicated"] == 0
    reliability.record(
        "a trial that raises; a worker SIGKILLed mid-trial",
        "1 raise (twice: retried), 1 SIGKILL, 1 divergence",
        figures,
    )

    cells = by_cell(runs_of(store, "faults"))
    state = {
        c.variant: [
            (r.data.tags["attempt"], cell_state(r)) for r in sorted(cells[c.cell_id], key=lambda r: r.info.start_time)
        ]
        for c in study.cells
    }
    assert state["ok"] == [("1", "finished")]
    assert state["diverges"] == [("1", "diverged")]
    assert state["vanishes"] == [("1", "failed"), ("2", "failed")]  # retried once, then recorded as failed
    assert state["victim"] == [("1", "killed"), ("2", "finished")]  # Ray rescheduled it; the lost run is marked
    c = MlflowClient(store)
    vanished = cells[next(x.cell_id for x in study.cells if x.variant == "vanishes")][0]
    assert "vanishing.txt" in vanished.data.tags["status_detail"]
    assert "traceback.txt" in {a.path for a in c.list_artifacts(vanished.info.run_id)}
    assert (
        "vanishing.txt" in Path(c.download_artifacts(vanished.info.run_id, "traceback.txt", str(tmp_path))).read_text()
    )
    diverged = cells[next(x.cell_id for x in study.cells if x.variant == "diverges")][0]
    assert "non-finite" in diverged.data.tags["status_detail"]

    # the data comes back: the next submission trains the failed cell only
    vanishing.write_text(text + " the end")
    before = {r.info.run_id for r in runs_of(store, "faults")}
    again = run_study(study, tracking_uri=store, num_cpus=2, out=lines.append)
    new = [r for r in runs_of(store, "faults") if r.info.run_id not in before]
    assert [r.data.tags["variant"] for r in new] == ["vanishes"] and cell_state(new[0]) == "finished"
    assert again.counts == {"finished": 3, "diverged": 1, "skipped": 0}


def wait_for(driver, log: Path, store: str, study: str, condition, what: str, timeout: float = 300) -> None:
    """Poll the store until ``condition(runs)`` holds, while the driver is alive."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition(runs_of(store, study)):
            return
        assert driver.poll() is None, log.read_text()
        time.sleep(0.3)
    pytest.fail(f"the study never had {what}\n" + log.read_text())


def test_driver_killed_then_the_same_command_again(tmp_path, store):
    """SIGKILL the driver mid-study; the same command again trains only what is missing."""
    path = write_study(
        tmp_path,
        "crash",
        seeds=2,
        max_concurrent=1,
        base={**REVERSE, "training": {**REVERSE["training"], "max_steps": 300, "val_every": 150}},
    )
    study = load_study(path)
    command = [sys.executable, "-m", "ablate", "sweep", str(path), "--tracking-uri", store, "--cpus", "2"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with open(tmp_path / "first.log", "w") as log:
        driver = subprocess.Popen(
            command, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env
        )
    try:
        log = tmp_path / "first.log"
        running = lambda runs: any(r.info.status == "RUNNING" for r in runs)  # noqa: E731
        finished = lambda runs: any(r.info.status == "FINISHED" for r in runs)  # noqa: E731
        both = lambda runs: finished(runs) and running(runs)  # noqa: E731
        wait_for(driver, log, store, "crash", both, "a finished and a running cell")  # kill it then
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait(timeout=30)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(driver.pid, signal.SIGKILL)  # whatever Ray the driver started
    time.sleep(2)
    finished_before = {
        r.data.tags["cell_id"]: r.info.run_id for r in runs_of(store, "crash") if r.info.status == "FINISHED"
    }
    assert 0 < len(finished_before) < 4

    again = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, env=env, timeout=600)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "marked 1 run(s) left RUNNING" in again.stdout
    results = assert_exactly_once(store, study)
    figures = reliability.count(store, "crash", [c.cell_id for c in study.cells])
    assert figures["lost"] == 0 and figures["duplicated"] == 0
    reliability.record("the driver SIGKILLed mid-sweep, then the same command", "1 SIGKILL of the driver", figures)
    for cell_id, run_id in finished_before.items():  # finished cells were not trained again
        assert results[cell_id].info.run_id == run_id
    runs = runs_of(store, "crash")
    assert sum(r.info.status == "KILLED" for r in runs) == 1  # the run the dead driver left behind
    assert len(runs) == 4 + 1
    parents = sorted(runs_of(store, "crash", KIND_STUDY), key=lambda r: int(r.data.tags["submission"]))
    assert [p.info.status for p in parents] == ["KILLED", "FINISHED"]
    assert {r.data.tags["mlflow.parentRunId"] for r in runs} <= {p.info.run_id for p in parents}


def test_sigterm_stops_a_sweep_as_ctrl_c_does(tmp_path, store):
    """SIGTERM (`kill`, a scheduler's time limit) stops `ablate sweep` the way Ctrl-C does: exit 130, the running
    cells and the submission recorded as killed. Ray's driver replaces a SIGTERM handler twice (a Python one that
    calls sys.exit, and its C++ failure handler, which printed "*** SIGTERM received ***" with a stack dump and
    aborted the command with exit 134 after its clean-up): ablations.cluster.connect puts the command's back."""
    path = write_study(
        tmp_path, "term", base={**REVERSE, "training": {**REVERSE["training"], "max_steps": 5000, "val_every": 500}}
    )
    command = [sys.executable, "-m", "ablate", "sweep", str(path), "--tracking-uri", store, "--cpus", "2"]
    log = tmp_path / "sweep.log"
    with open(log, "w") as out:
        driver = subprocess.Popen(
            command, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
    try:
        training = lambda runs: any(r.info.status == "RUNNING" and r.data.metrics for r in runs)  # noqa: E731
        wait_for(driver, log, store, "term", training, "a cell that trains")
        driver.send_signal(signal.SIGTERM)
        assert driver.wait(timeout=120) == 130, log.read_text()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(driver.pid, signal.SIGKILL)
    text = log.read_text()
    assert "SIGTERM received" not in text and "logging.cc" not in text, text  # none of Ray's handlers spoke
    assert "run the same command again" in text
    cells = runs_of(store, "term")
    assert len(cells) >= 1 and all(r.info.status == "KILLED" for r in cells), [r.info.status for r in cells]
    (parent,) = runs_of(store, "term", KIND_STUDY)
    assert parent.info.status == "KILLED"


def test_a_dead_submissions_parent_run_ends_when_nothing_is_left_to_train(tmp_path, store):
    """A submission killed after its last cell had its result, before it ended its parent run: the next submission
    found nothing to train and returned at once, and that parent run stayed RUNNING for good (found by the fault
    soak, benchmarks/soak.py). Every submission ends dead submissions' parent runs first, whatever is left."""
    from ablations import tracking
    from ablations.claims import claims_url
    from ablations.register import register
    from record import vocabulary

    study = load_study(write_study(tmp_path, "ended"))
    register(study, store, claims_url(store), out=lambda _: None)
    c = client(store)
    exp = tracking.experiment_id(store, "ended")
    for cell in study.cells:  # every cell has its result, by this code
        tags = {vocabulary.TAG_KIND: KIND_CELL, vocabulary.TAG_STUDY: "ended", vocabulary.TAG_CELL_ID: cell.cell_id}
        tags |= {vocabulary.TAG_CODE: tracking.code_fingerprint(), vocabulary.TAG_STATUS: "finished"}
        c.set_terminated(c.create_run(exp, tags={**tags, vocabulary.TAG_SUBMISSION: "1"}).info.run_id, "FINISHED")
    # the killed submission's parent run: RUNNING, and no lease in the claims store says it is alive
    tags = {vocabulary.TAG_KIND: KIND_STUDY, vocabulary.TAG_STUDY: "ended", vocabulary.TAG_SUBMISSION: "1"}
    parent = c.create_run(exp, tags={**tags, vocabulary.TAG_STATUS: "running"}).info.run_id
    lines: list[str] = []
    result = run_study(study, tracking_uri=store, out=lines.append)
    assert result.parent_run_id is None and any("nothing to train" in line for line in lines), lines
    ended = c.get_run(parent)
    assert ended.info.status == "KILLED"
    assert ended.data.tags["status_detail"] == "killed: the driver stopped before the submission ended"


# --- a cluster of several nodes -----------------------------------------------------------------------


def test_two_nodes_and_one_of_them_stops_during_the_study(tmp_path, store, own_ray):
    path = write_study(
        tmp_path,
        "nodes",
        seeds=3,
        base={**REVERSE, "training": {**REVERSE["training"], "max_steps": 120, "val_every": 60}},
    )
    study = load_study(path)
    with ray_cluster(tmp_path, nodes=2, cpus_per_node=1, dashboard=False) as cluster:

        def stop_second_node() -> None:  # once each node has finished a cell
            c = client(store)  # beside the driver creating the store: under its lock
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                exp = c.get_experiment_by_name("nodes")
                runs = c.search_runs([exp.experiment_id], "attributes.status = 'FINISHED'") if exp else []
                if len({r.data.tags.get("ray_node") for r in runs if r.data.tags.get("kind") == KIND_CELL}) >= 2:
                    cluster.stop_node(1)
                    return
                time.sleep(0.5)

        stopper = threading.Thread(target=stop_second_node, daemon=True)
        stopper.start()
        lines: list[str] = []
        result = run_study(study, address=cluster.address, tracking_uri=store, out=lines.append)
        stopper.join(timeout=120)
        assert cluster.nodes[1].poll() is not None, "the second node was not stopped during the study"
    assert result.complete and result.counts["finished"] == 6, "\n".join(lines)
    results = assert_exactly_once(store, study)
    figures = reliability.count(store, study.name, [c.cell_id for c in study.cells])
    assert figures["lost"] == 0 and figures["duplicated"] == 0
    reliability.record("a node lost mid-study", "1 of 2 nodes stopped", figures)
    nodes = Counter(r.data.tags["ray_node"] for r in results.values())
    assert len(nodes) == 2, nodes  # trials ran on both nodes
    assert {r.data.tags["ray_node_ip"] for r in results.values()} == {"127.0.0.1"}
    # the working directory travelled through Ray's runtime environment, not this checkout's path
    assert {r.data.tags["code_dir"] for r in results.values()} != {str(ROOT)}


def test_a_trial_with_two_data_parallel_workers(tmp_path, store):
    """One MLflow run from rank 0 alone; the final evaluation (step 25, after training, on rank 0 alone) must not
    wait for the other rank: the CLI runs with a time limit, so a hang fails the test."""
    path = write_study(
        tmp_path,
        "ddp",
        design={"variants": [{"name": "ddp", "set": {}}]},
        resources={"cpus": 2, "workers": 2},
        base={**REVERSE, "training": {**REVERSE["training"], "max_steps": 25, "val_every": 10}},
    )
    cmd = [sys.executable, "-m", "ablate", "sweep", str(path), "--cpus", "2", "--tracking-uri", store]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "<- ddp | seed 0: finished" in out.stdout  # rank 0's result reached Tune
    runs = runs_of(store, "ddp")
    assert len(runs) == 1  # one MLflow run, from rank 0 alone
    run = runs[0]
    assert run.data.tags["workers"] == "2" and cell_state(run) == "finished"
    # the hash tagged is of what was trained, two ranks' global batch included: not that of one worker's cell
    assert run.data.tags["config_hash"] == run.data.tags["cell_id"] == load_study(path).cells[0].cell_id
    assert run.data.tags["config_hash"] != load_study(path).cells[0].run.config_hash()
    history = MlflowClient(store).get_metric_history(run.info.run_id, "val/loss")
    assert [m.step for m in history] == [10, 20, 25]  # each point once: no other rank logged


def test_a_cell_killed_on_every_attempt_ends_failed_with_the_reason(tmp_path, store, local_ray):
    """Its process is SIGKILLed (as an out-of-memory kill would) and there is no retry left: the cell is a failure
    with its reason, not "killed" (which a later submission would take for an interruption)."""
    path = write_study(
        tmp_path,
        "doomed",
        retries=0,
        design={"variants": [{"name": "doomed", "set": {"training.max_steps": 5000, "training.val_every": 1000}}]},
    )
    study = load_study(path)
    killer, killed = reliability.kill_while_training(store, "doomed", f"tags.kind = '{KIND_CELL}'")
    lines: list[str] = []
    result = run_study(study, tracking_uri=store, num_cpus=2, out=lines.append)
    killer.join(timeout=5)
    assert killed, "\n".join(lines)
    assert result.counts == {"failed": 1, "skipped": 0}, "\n".join(lines)
    (run,) = runs_of(store, "doomed")
    assert run.info.status == "FAILED"
    assert "died on every attempt (1)" in run.data.tags["status_detail"]
    figures = reliability.count(store, "doomed", [c.cell_id for c in study.cells])
    assert figures == {"cells": 1, "lost": 0, "duplicated": 0, "failed": 1}
    reliability.record("a cell whose worker is SIGKILLed on every attempt", "1 SIGKILL, no retry left", figures)
