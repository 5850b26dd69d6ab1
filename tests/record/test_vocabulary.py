"""A new store opened by several processes at once: MLflow and Optuna create a database's schema on first use,
without a lock of their own, and all but one of the openers failed (5 of 6 on a new PostgreSQL database here; an
``ablate search`` beside a script that polled its new SQLite storage, in this suite)."""

from __future__ import annotations

import multiprocessing
import threading

from ablations.search.setup import open_storage
from record import vocabulary

OPENERS = 6


def said(err: Exception) -> str:
    return f"{type(err).__name__}: {(str(err).splitlines() or [''])[0]}"


def at_once(*openers) -> list[str]:
    """Run the openers together from one start line, in threads of this process (each opens the store with its own
    engine and connections); what each ended with: "ok" or its error."""
    start, outcomes = threading.Barrier(len(openers)), [""] * len(openers)

    def go(i, opener):
        start.wait()
        try:
            opener()
            outcomes[i] = "ok"
        except Exception as err:
            outcomes[i] = said(err)

    threads = [threading.Thread(target=go, args=(i, f)) for i, f in enumerate(openers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return outcomes


def _open_mlflow(url: str, start, outcomes) -> None:
    start.wait()
    try:
        vocabulary.client(url)
        outcomes.put("ok")
    except Exception as err:
        outcomes.put(said(err))


def test_a_new_mlflow_store_opened_by_several_processes_at_once(new_database):
    """Processes (forked from this one, each before its first client of the store): threads of one process did not
    collide here, processes did (without the lock, most failed on PostgreSQL, and some on SQLite)."""
    from mlflow import MlflowClient

    fork = multiprocessing.get_context("fork")
    start, outcomes = fork.Barrier(OPENERS), fork.Queue()
    procs = [fork.Process(target=_open_mlflow, args=(new_database, start, outcomes)) for _ in range(OPENERS)]
    for p in procs:
        p.start()
    seen = [outcomes.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    assert seen == ["ok"] * OPENERS
    MlflowClient(new_database).create_experiment("usable")  # the schema is whole


def test_a_new_optuna_storage_opened_by_several_at_once_even_beside_an_opener_that_takes_no_lock(new_database):
    import optuna

    def outsider():  # optuna-dashboard, or a script: Optuna's own storage, without our lock
        optuna.storages.RDBStorage(new_database)

    ours = [lambda: open_storage(new_database)] * OPENERS
    outcomes = at_once(outsider, *ours)
    assert outcomes[1:] == ["ok"] * OPENERS, outcomes  # the outsider may lose; ours open it again
    optuna.create_study(study_name="usable", storage=open_storage(new_database)).ask()


def test_mlflows_filter_for_a_studys_outcomes_returns_one_run_per_cell(tmp_path):
    """Tried as a new user would, ``tags.kind = "cell"`` returned killed attempts with partial curves beside the
    results (a variant grouped in the UI held 5 runs, 2 of them killed). A submission's end tags each cell's counted
    run, so ``tags.outcome = "counted"`` is one run per cell: its result, or its latest attempt when it has none."""
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path}/m.db"
    c = MlflowClient(uri)
    exp = c.create_experiment("s")
    ends = {"a": ["KILLED", "FINISHED"], "b": ["FAILED", "FINISHED"], "c": ["KILLED", "FAILED"]}
    ids = {}
    for cell, statuses in ends.items():
        for i, status in enumerate(statuses):
            detail = {"FINISHED": "finished", "FAILED": "failed: boom", "KILLED": "killed"}[status]
            tags = {
                vocabulary.TAG_KIND: vocabulary.KIND_CELL,
                vocabulary.TAG_CELL_ID: cell,
                vocabulary.TAG_STATUS: detail,
            }
            run = c.create_run(exp, tags=tags, start_time=1000 * (len(ids) + 1))
            c.set_terminated(run.info.run_id, status)
            ids[(cell, i)] = run.info.run_id
    vocabulary.mark_outcomes(uri, "s", ["a", "b", "c"], code=None)
    counted = c.search_runs([exp], f"tags.kind = 'cell' and tags.{vocabulary.TAG_OUTCOME} = 'counted'")
    assert sorted(r.info.run_id for r in counted) == sorted([ids[("a", 1)], ids[("b", 1)], ids[("c", 1)]])
    every = c.search_runs([exp], "tags.kind = 'cell'")
    assert len(every) == 6 and sum(r.data.tags[vocabulary.TAG_OUTCOME] == "superseded" for r in every) == 3
