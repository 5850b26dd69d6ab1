"""Atomic cell claims on real stores (SQLite here, PostgreSQL on 127.0.0.1 when it answers): one holder at a
time, leases by the store's clock, fencing tokens checked when a result is written."""

from __future__ import annotations

import multiprocessing
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ablations.claims import ANY_CODE, Claims, Fence

STUDY, CODE = "s", "abc123"


@pytest.fixture
def url(new_database):
    return new_database


def test_one_holder_leases_expire_and_stale_tokens_are_fenced_out(url):
    a, b = Claims(url, "host:1:a", lease_s=1.0), Claims(url, "host:2:b", lease_s=1.0)
    first = a.claim(STUDY, "c1", CODE)
    assert first is not None and first.token == 1
    assert b.claim(STUDY, "c1", CODE) is None  # held
    assert a.claim(STUDY, "c1", "other-code") is not None  # a cell trained by other code is another cell
    time.sleep(1.3)  # a's lease expires (it did not renew): b takes the cell over
    second = b.claim(STUDY, "c1", CODE)
    assert second is not None and second.token == 2
    assert a.renew([first]) == ([first], [])  # a learns that it lost the cell
    assert not a.finish(first, "run-a")  # a's late result is refused: its token is stale
    assert Fence(url, "host:2:b", second)("run-b")  # b writes its result
    row = b.state(STUDY, "c1", CODE)
    assert (row["state"], row["run_id"], row["token"]) == ("done", "run-b", 2)
    assert a.claim(STUDY, "c1", CODE) is None and b.claim(STUDY, "c1", CODE) is None  # done: nobody trains it
    assert b.renew([second]) == ([], [second])  # ended, not lost


def test_a_submission_taking_any_code_s_results_and_one_of_a_given_code_do_not_both_train_a_cell(url):
    """``reuse_results: any_code`` claims under ANY_CODE. Two such submissions of other code trained a cell twice
    (each claimed under its own fingerprint), and so did one beside a submission of a given code (whose result it
    would take). Submissions of two given codes still each train it: other code is another cell."""
    a, b, c = Claims(url, "host:1:a"), Claims(url, "host:2:b"), Claims(url, "host:3:c")
    held = a.claim(STUDY, "c1", ANY_CODE)
    assert held is not None
    assert b.claim(STUDY, "c1", ANY_CODE) is None  # the same key: held
    assert b.claim(STUDY, "c1", CODE) is None  # the any-code holder's result may be this code's: wait for it
    assert b.rival(STUDY, "c1", CODE)["owner"] == "host:1:a"  # what the waiting submission names
    a.release(held)  # it failed, or was interrupted
    mine = b.claim(STUDY, "c1", CODE)
    assert mine is not None and a.rival(STUDY, "c1", CODE) is None  # b's own key is no rival of itself
    assert a.claim(STUDY, "c1", ANY_CODE) is None  # b's result will count for a: a waits
    assert c.claim(STUDY, "c1", "other-code") is not None  # a given other code: another cell, trained
    assert b.finish(mine, "run-b")  # done: its result is in MLflow, where the any-code submission finds it
    assert c.claim(STUDY, "c2", CODE) is not None and a.claim(STUDY, "c3", ANY_CODE) is not None  # other cells


def test_a_released_cell_is_free_at_once_and_a_lost_result_is_reopened_after_its_window(url, monkeypatch):
    a, b = Claims(url, "host:1:a"), Claims(url, "host:2:b")
    held = a.claim(STUDY, "c1", CODE)
    a.release(held)  # it failed: anyone may try it again
    again = b.claim(STUDY, "c1", CODE)
    assert again is not None and again.token == 2
    assert b.finish(again, "run-b")
    assert not a.reopen_lost(STUDY, "c1", CODE, "run-b")  # inside the write window: b may still be writing
    import ablations.claims as claims

    monkeypatch.setattr(claims, "WRITE_WINDOW_S", 0.0)
    third = a.claim(STUDY, "c2", CODE)
    assert a.finish(third, "run-lost")
    time.sleep(0.1)
    assert a.reopen_lost(STUDY, "c2", CODE, "run-lost")  # its run never reached MLflow: open again
    assert b.claim(STUDY, "c2", CODE) is not None


def test_leases_follow_the_stores_clock_not_the_clients(url, monkeypatch):
    """A client whose clock runs an hour ahead cannot take a cell whose lease has not expired by the store."""
    holder = Claims(url, "host:1:a", lease_s=30.0)
    assert holder.claim(STUDY, "c1", CODE) is not None
    monkeypatch.setattr(time, "time", lambda: 1e10)  # the client's clock: far in the future
    assert Claims(url, "host:2:b").claim(STUDY, "c1", CODE) is None


def test_a_dead_process_of_this_machine_loses_its_claims_at_once(url):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host = socket.gethostname()
    Claims(url, f"{host}:{dead.pid}:x", lease_s=600).claim(STUDY, "c1", CODE)
    Claims(url, f"elsewhere:{dead.pid}:y", lease_s=600).claim(STUDY, "c2", CODE)  # another machine: its lease
    Claims(url, f"{host}:{os.getpid()}:z", lease_s=600).claim(STUDY, "c3", CODE)  # alive
    other = Claims(url, f"{host}:{os.getpid()}:w")
    assert other.expire_dead_local_owners(STUDY) == 1
    assert other.claim(STUDY, "c1", CODE) is not None
    assert other.claim(STUDY, "c2", CODE) is None and other.claim(STUDY, "c3", CODE) is None


def _claim_all(url: str, owner: str, cells: int, start: float, out: str, code: str) -> None:
    while time.time() < start:
        time.sleep(0.001)
    c = Claims(url, owner, lease_s=600)  # the first use creates the table: all eight at once
    number = c.next_number(STUDY, at_least=3)  # submissions 1 and 2 are in MLflow already
    got = [i for i in range(cells) if c.claim(STUDY, f"c{i}", code) is not None]
    Path(out).write_text(f"{number};" + ",".join(map(str, got)))


@pytest.mark.slow
def test_concurrent_claimers_get_each_cell_exactly_once(url, tmp_path):
    """Eight processes race to create the table, to number their submissions and for the same 40 cells, at the
    same moment; half of them take any code's results (ANY_CODE: a rival of the others' code, checked in the same
    transaction as the claim)."""
    ctx = multiprocessing.get_context("spawn")
    start = time.time() + 3.0
    procs = [
        ctx.Process(
            target=_claim_all,
            args=(url, f"host:{i}:p", 40, start, str(tmp_path / f"{i}.txt"), ANY_CODE if i % 2 else CODE),
        )
        for i in range(8)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    written = [(tmp_path / f"{i}.txt").read_text().split(";") for i in range(8)]
    assert sorted(int(number) for number, _ in written) == list(range(3, 11))  # eight numbers, none shared
    granted = [int(x) for _, cells in written for x in cells.split(",") if x]
    assert sorted(granted) == list(range(40))  # every cell once, none twice


def _one_study(tmp_path: Path):
    import yaml

    from record.spec import load_study

    spec = tmp_path / "s.yaml"
    spec.write_text(
        yaml.safe_dump(
            {"name": "s", "seeds": 2, "base": {"task": {"name": "reverse"}}, "design": {"variants": [{"name": "a"}]}}
        )
    )
    return load_study(spec)


def test_a_result_claimed_for_another_store_is_reopened_at_once_and_one_being_written_is_waited_for(tmp_path):
    """Two MLflow stores in one folder share its claims.db (and .ablate/claims.db serves every server store of a
    machine): a cell done for store A, or for a store deleted and started again, is not a result in store B. Its
    run is not in B at all, so nobody is writing it there: B trains it now instead of waiting out the write
    window (600 s, silently, before). A done cell whose run B holds but has not ended keeps its window."""
    from mlflow import MlflowClient

    from ablations import tracking
    from ablations.claims import claims_url
    from ablations.sweep.driver import _still_pending
    from record.vocabulary import run_missing

    study = _one_study(tmp_path)
    store = f"sqlite:///{tmp_path / 'b.db'}"
    claims = Claims(claims_url(store), "host:1:a")
    assert claims.url == f"sqlite:///{tmp_path / 'claims.db'}"  # beside the store: any store of this folder
    fingerprint = tracking.code_fingerprint()
    other, writing = study.cells[:2]
    c = MlflowClient(store)
    exp = c.create_experiment("s")
    running = c.create_run(exp, tags={"kind": "cell", "cell_id": writing.cell_id}).info.run_id  # not yet ended
    assert run_missing(store, "0" * 32) and not run_missing(store, running)  # SQLite says "no such run"
    for cell, run_id in ((other, "0" * 32), (writing, running)):  # "0" * 32: a run of store A
        assert claims.finish(claims.claim("s", cell.cell_id, fingerprint), run_id)
    said = []
    left = _still_pending(study, store, fingerprint, [other, writing], set(), claims, fingerprint, said.append)
    assert left == [other, writing]  # neither is a result in this store
    assert claims.state("s", other.cell_id, fingerprint)["state"] == "open"  # free now: this store trains it
    assert claims.state("s", writing.cell_id, fingerprint)["state"] == "done"  # its holder may still be writing
    assert said == [
        "waiting for 1 cell(s) whose result another submission is writing to MLflow "
        "(reopened if it is not there within 600 s of their end)"
    ]


@pytest.mark.slow
def test_each_store_beside_one_claims_db_numbers_its_submissions_from_1(tmp_path):
    from mlflow import MlflowClient

    from ablations import tracking
    from ablations.claims import claims_url
    from ablations.sweep.plan import plan
    from ablations.sweep.submission import open_submission

    study = _one_study(tmp_path)
    fingerprint = tracking.code_fingerprint()
    numbers = []
    for name in ("a.db", "a.db", "b.db"):  # two submissions to store a, then the first to store b
        store = f"sqlite:///{tmp_path / name}"
        claims = Claims(claims_url(store))
        parent, _ = open_submission(study, store, plan(study, store, fingerprint), claims, fingerprint, fingerprint, 0)
        assert MlflowClient(store).get_run(parent.run_id).data.tags["submission"] == str(parent.submission)
        numbers.append(parent.submission)
    assert claims.url == f"sqlite:///{tmp_path / 'claims.db'}"  # one claims store for both
    assert numbers == [1, 2, 1]


def test_a_run_whose_holder_is_writing_it_is_not_taken_for_stale(tmp_path, store):
    """A submission that starts while another has passed its fence (its claim ``done``, in the write window) and is
    ending its run saw that run RUNNING and marked it killed: the result was lost, and the cell held for the window,
    then trained again. A run a live claim holds, claimed or being written, is someone's; another is stale."""
    from ablations import tracking
    from ablations.sweep import driver
    from ablations.sweep.plan import plan
    from record import vocabulary
    from record.spec import load_study
    from tests.ablations.sweep.test_sweep import write_study

    study = load_study(write_study(tmp_path, "writing", design={"grid": {"model.norm": ["pre"]}}, seeds=2))
    url = f"sqlite:///{tmp_path / 'claims.db'}"
    claims, other = Claims(url, "host:1:a"), Claims(url, "host:2:b")
    c, exp = vocabulary.client(store), tracking.experiment_id(store, study.name)
    runs = []
    for cell in study.cells:  # both cells' runs RUNNING: the first being written, the second left by a dead driver
        tags = {
            vocabulary.TAG_KIND: vocabulary.KIND_CELL,
            vocabulary.TAG_STUDY: study.name,
            vocabulary.TAG_CELL_ID: cell.cell_id,
        }
        runs.append(c.create_run(exp, tags={**tags, vocabulary.TAG_CODE: CODE}).info.run_id)
    writer = claims.claim(study.name, study.cells[0].cell_id, CODE)
    assert claims.finish(writer, runs[0])  # past its fence, writing its run
    stale = driver._stale(study, plan(study, store, CODE), other)
    assert [r.info.run_id for r in stale] == [runs[1]]
    # a submission of other code held the second cell: its trial's run is not stale to this one (whose claims are
    # under another key; it marked that live run killed)
    Claims(url, "host:3:c").claim(study.name, study.cells[1].cell_id, "other-code")
    assert driver._stale(study, plan(study, store, CODE), other) == []


def test_a_retry_of_the_holder_s_own_trial_after_its_fence_passes_again(url):
    """The fence passed (the cell ``done``), then the run failed to end; Ray Tune retries the trial with the same
    token. Its fence was refused: the retrained run was marked killed as "taken over by another submission", and
    nobody could claim the cell for the write window. The holder's own retry passes; another holder still cannot."""
    a, b = Claims(url, "host:1:a"), Claims(url, "host:2:b")
    held = a.claim(STUDY, "c1", CODE)
    assert Fence(url, "host:1:a", held)("run-1")  # then its run failed to end: the trial is retried
    assert Fence(url, "host:1:a", held)("run-2")  # the retry's result is written
    row = a.state(STUDY, "c1", CODE)
    assert (row["state"], row["run_id"], row["token"]) == ("done", "run-2", held.token)
    assert not Fence(url, "host:2:b", held)("run-3")  # the token alone is not enough: another owner is refused
    assert b.claim(STUDY, "c1", CODE) is None


def test_claims_wait_through_a_postgresql_restart_and_then_say_so_in_one_line(monkeypatch):
    """Found by benchmarks/soak.py: a sweep driver ended with psycopg's traceback ("the database system is shutting
    down") when PostgreSQL restarted under its claims. A claims transaction now waits for a database briefly away,
    within a lease's margin over its renewal, and the leases it holds survive; a database away for longer ends the
    command with one line saying what to do."""
    import threading

    from sqlalchemy.exc import OperationalError

    from ablations import claims as claims_module
    from ablations.claims import LEASE_S, PATIENCE_S, RENEW_S
    from ablations.stores import away
    from tests.ablations.search.test_search import database_away
    from tests.conftest import fresh_postgres_database

    assert RENEW_S + PATIENCE_S < LEASE_S  # a renewal that waited the whole patience still finds its leases held
    with fresh_postgres_database("ablate_claims_restart") as url:
        name = url.rsplit("/", 1)[1]
        mine, rival = Claims(url, owner="a"), Claims(url, owner="b")
        held = mine.claim("s", "c1", "code")
        database_away(name, True)
        back = threading.Timer(3.0, database_away, args=(name, False))
        back.start()
        try:
            assert mine.renew([held]) == ([], [])  # waited for it, then renewed
        finally:
            back.join()
        assert rival.claim("s", "c1", "code") is None and mine.finish(held, "run-1")
        monkeypatch.setattr(claims_module, "PATIENCE_S", 1.0)
        database_away(name, True)
        try:
            with pytest.raises(OperationalError) as info:
                mine.claim("s", "c2", "code")
        finally:
            database_away(name, False)
    line = away(info.value)
    assert line.startswith("a database stopped answering (") and line.endswith("once it answers; it resumes")
    assert "\n" not in line and away(ValueError("x")) is None
