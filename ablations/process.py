"""What our processes spend on Python's garbage collector, for objects that live until the process ends.

Importing torch, Lightning, MLflow, datasets and Ray builds about half a million objects that live until the
process ends. While they are built, the collector walks every one of them again and again (a full collection
each time the heap grows by a quarter), and at exit it walks them all once more, for memory the operating system
takes back at once. On a 2-core machine a process that imports what a trial worker imports spent 9.9 CPU-seconds,
2.1 of them in its exit, and 6.3 with both measures below (benchmarks/results/collector.md); every ``ablate``
command, trial worker and data-parallel rank paid it.

- ``exit_quickly()`` registers ``gc.freeze()`` as an exit handler: the last collections skip what is alive at
  exit. The rest of the exit is unchanged: every other exit handler still runs (MLflow's flush of asynchronous
  logging, Ray's shutdown, ``weakref.finalize`` callbacks such as temporary folders, logging's flush), the
  standard streams are flushed, and objects freed by reference counting are finalized as before. What is skipped
  is the finalization of objects held only in reference cycles at exit, which Python does not promise either
  (the data model, ``object.__del__``: "It is not guaranteed that __del__() methods are called for objects that
  still exist when the interpreter exits").
- ``import_paused(modules)`` imports with the collector paused (``collector_paused``), then freezes what exists: the
  pattern the gc module's documentation gives for long-lived objects built up front. Later collections skip the
  libraries' objects; what becomes garbage later is collected as before. A reference cycle that was already
  garbage when the freeze came is never collected: a few objects of the imports, once per process.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import importlib
import sys
from collections.abc import Iterable, Iterator

from ablations.stores import database_kind

_registered = False


def exit_quickly() -> None:
    """Skip the last garbage collections when this process exits (once per process; idempotent)."""
    global _registered
    if not _registered:
        atexit.register(gc.freeze)
        _registered = True


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """The garbage collector paused while the block runs (it builds objects that live on: imports, a test
    session's collection), then what the process holds frozen."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


def import_paused(modules: Iterable[str]) -> None:
    """Import ``modules`` with the collector paused (nothing happens when every one is imported already)."""
    todo = [name for name in modules if name not in sys.modules]
    if todo:
        with collector_paused():
            for name in todo:
                importlib.import_module(name)


def tracking_modules(uri: str | None) -> list[str]:
    """What a process that writes to the MLflow store at ``uri`` imports (MLflow's SQL store for a database;
    ``uri`` None: MLFLOW_TRACKING_URI, else the embedded SQLite store, as ablations.tracking resolves it)."""
    from ablations.tracking import resolve_uri

    store = database_kind(resolve_uri(uri, create=False))
    return ["mlflow", *(["mlflow.store.tracking.sqlalchemy_store"] if store else [])]


def training_modules(uri: str | None) -> list[str]:
    """What a process that trains imports: torch and Lightning (through ablations.train), datasets, the tracking."""
    return ["ablations.train", "datasets", *tracking_modules(uri)]


def trial_modules(uri: str | None, workers: int) -> list[str]:
    """What a trial's own process imports: what trains (``training_modules``) for a trial in one process; only the
    tracking for one that drives data-parallel workers (they train, it imports no torch)."""
    return training_modules(uri) if workers <= 1 else tracking_modules(uri)
