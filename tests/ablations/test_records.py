"""A new store opened by several processes at once: MLflow and Optuna create a database's schema on first use,
without a lock of their own, and all but one of the openers failed (5 of 6 on a new PostgreSQL database here; an
``ablate search`` beside a script that polled its new SQLite storage, in this suite)."""

from __future__ import annotations

import multiprocessing
import threading

from ablations import records
from ablations.search.setup import open_storage

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
        records.client(url)
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
