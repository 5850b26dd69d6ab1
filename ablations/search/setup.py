"""Optuna's side of a search: the storage (RDB with heartbeats, or a journal file), the sampler, the pruner.

The storage keeps no sampler or pruner: the driver and every trial process build the same ones from the spec.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
import warnings
from pathlib import Path

import tenacity

from ablations import stores, tracking
from record import vocabulary
from record.spec import SearchSpec


def storage_url(spec: SearchSpec, override: str | None = None) -> str:
    return (
        override
        or spec.storage
        or os.environ.get("ABLATE_OPTUNA_STORAGE")
        or f"sqlite:///{tracking.home() / 'optuna.db'}"
    )


# a trial whose heartbeat stops for a minute is failed, and asked again once (a retry that stops too is not)
HEARTBEAT = {"heartbeat_interval": 10, "grace_period": 60}
STALE_RETRIES = 1


def open_storage(url: str):
    """An Optuna storage: RDB (SQLite, PostgreSQL, ...) with heartbeats, or a journal file (journal:PATH)."""
    import optuna

    if url.startswith("journal:"):
        from optuna.storages.journal import JournalFileBackend

        path = local_file(url).resolve()
        path.parent.mkdir(parents=True, exist_ok=True)
        return optuna.storages.JournalStorage(JournalFileBackend(str(path)))
    # two processes creating one new storage's tables at once: the one that lost the race tries again
    for attempt in tenacity.Retrying(
        retry=tenacity.retry_if_exception(_lost_the_schema_race),
        stop=tenacity.stop_after_attempt(SCHEMA_ATTEMPTS),
        wait=tenacity.wait_incrementing(0.2, 0.2),
        reraise=True,
    ):
        with attempt, warnings.catch_warnings(), vocabulary.first_use(url):  # first_use: an SQLite database's folder
            warnings.simplefilter("ignore")  # Optuna marks heartbeats experimental
            return optuna.storages.RDBStorage(
                url,
                **HEARTBEAT,
                heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(STALE_RETRIES),
                engine_kwargs={"pool_pre_ping": True} if not url.startswith("sqlite") else None,
            )
    raise AssertionError("unreachable: tenacity reraises the last error")


def heartbeat_stale_ids(storage, study_name: str) -> list[int]:
    """The trials whose heartbeat stopped (what ``optuna.storages.fail_stale_trials`` would fail), read without
    failing them, for a dry run. Optuna has no public read of them: ``_get_stale_trial_ids`` stayed private when
    optuna/optuna#3442 added it; this is the one place that reaches for it."""
    return list(storage._get_stale_trial_ids(storage.get_study_id_from_name(study_name)))  # noqa: SLF001


def local_file(url: str) -> Path | None:
    """The file of a journal or SQLite storage, however the URL spells it (None for a server's URL)."""
    if url.startswith("journal:"):
        return Path(url.removeprefix("journal:")).expanduser()
    return stores.sqlite_file(url)


def storage_problem(url: str) -> str | None:
    """Before a search opens its storage (the driver, once; and its dry run): what would make an existing one
    unusable, said before anything is written to it. None for a storage that is not there yet."""
    return inspect_storage(url)[0]


def inspect_storage(url: str) -> tuple[str | None, str]:
    """``storage_problem``, and what an existing RDB storage holds, from one look at it: "optuna" (Optuna's
    tables), "none" (not there, or no Optuna tables yet: a search makes them), "foreign" (``_schema``),
    "journal", or "unknown" (a busy SQLite file, not read)."""
    path = local_file(url)
    if path is not None and not path.exists():
        return None, "none"
    if url.startswith("journal:"):
        return journal_problem(path), "journal"
    tables, version, refused = stores.tables_of(url)
    if refused is not None:  # a server that refuses, a database that is not there, a driver not installed: one line
        if "locked" in refused:
            return None, "unknown"  # a busy SQLite file (another search writing): Optuna waits on it
        return f"{refused}, or name the right one (--storage, ABLATE_OPTUNA_STORAGE)", "none"
    schema = _schema(tables, version)
    return (FOREIGN if schema == "foreign" else None), schema


def journal_problem(path: Path) -> str | None:
    """Optuna reads past a line of a journal that does not decode (another process may be writing it); a write
    after it would make the file unreadable to every process. A finished line that is not JSON: not a journal."""
    with path.open("rb") as f:
        for number, line in enumerate(f, 1):
            if not line.endswith(b"\n"):  # being written
                break
            try:
                json.loads(line)
            except ValueError:
                return f"is not an Optuna journal: its line {number} is not JSON"
    return None


FOREIGN = "is another program's database (it has an alembic_version table, not Optuna's): give Optuna its own"


def _schema(tables: list[str], version: str | None) -> str:
    """Optuna keeps its schema's version in a table named alembic_version, as MLflow and every other Alembic user
    does, so a database whose alembic_version holds another program's revision (not one of Optuna's, v3.2.0.a and
    the like) cannot take Optuna's tables (Optuna would add them, then refuse them): "foreign"."""
    if version and not re.match(r"v\d+\.\d+\.\d+\.", version):
        return "foreign"
    return "optuna" if "version_info" in tables else "none"


# Optuna creates a new storage's schema (its tables, then Alembic's version row) on first use. Our processes take
# vocabulary.first_use's lock for it; a process that does not (optuna-dashboard, a script of the user's) can still
# collide with ours, and the loser fails on a table or row the winner has just made. The schema is there once the
# winner is done: the loser opens it again.
SCHEMA_ATTEMPTS = 6


def _lost_the_schema_race(err: Exception) -> bool:
    from sqlalchemy import exc

    if isinstance(err, exc.IntegrityError):  # the version row, or PostgreSQL's catalogue entry of a new table
        return True
    return isinstance(err, exc.DBAPIError) and "already exists" in str(err)  # a table (PostgreSQL, SQLite)


def make_sampler(spec: SearchSpec, seed: int | None = None):
    """The spec's sampler, seeded with ``seed`` (default: the spec's). Model-based samplers start with
    ``spec.startup_trials`` random trials."""
    import optuna

    with warnings.catch_warnings():  # TPE's group option is marked experimental: not news to a user
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return _sampler(spec, spec.seed if seed is None else seed)


def _sampler(spec: SearchSpec, seed: int):
    import optuna

    s, n = spec.sampler, spec.startup_trials
    if s == "tpe":
        return optuna.samplers.TPESampler(
            seed=seed, n_startup_trials=n, multivariate=True, group=True, constant_liar=True
        )
    if s == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if s == "cmaes":
        return optuna.samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False)
    if s == "gp":
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=n)
    return optuna.samplers.NSGAIISampler(seed=seed, population_size=n)  # n: its population, fitted to the budget


def process_seed(seed: int) -> int:
    """A sampler seed for a process that joins or resumes a study: derived from the spec's seed and this process,
    so that two processes (or a resumed one) do not replay the same proposals."""
    import hashlib

    key = f"{seed}:{socket.gethostname()}:{os.getpid()}:{time.time_ns()}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:4], "big") % (2**31 - 1)


def make_pruner(p: str, warmup_trials: int = 2, warmup_steps: int = 0):
    """The pruner named ``p``, judging no trial before ``warmup_trials`` have finished or before step
    ``warmup_steps``. The storage keeps no pruner: the driver and every trial must build the same one."""
    import optuna

    if p == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=warmup_trials, n_warmup_steps=warmup_steps)
    if p == "successive_halving":
        return warmed_up(optuna.pruners.SuccessiveHalvingPruner, warmup_trials, warmup_steps)(
            min_resource=max(1, warmup_steps)
        )
    if p == "hyperband":
        return warmed_up(optuna.pruners.HyperbandPruner, warmup_trials, warmup_steps)(min_resource=max(1, warmup_steps))
    if p == "wilcoxon":  # its own warm-up counts reported values (2), not steps
        return warmed_up(optuna.pruners.WilcoxonPruner, warmup_trials, warmup_steps)()
    return optuna.pruners.NopPruner()


def warmed_up(kind: type, trials: int, steps: int) -> type:
    """Optuna's pruner class ``kind``, deciding nothing before ``trials`` trials have completed or before step
    ``steps``: successive halving, Hyperband and Wilcoxon have no such warm-up (successive halving pruned the
    second of eight trials with none completed). The pruner is still asked at every step, so that it keeps its
    own records (successive halving's rungs), then overruled while warming up; a subclass, so that what Optuna
    checks by type (TPE's Hyperband brackets) still holds."""
    from optuna.trial import TrialState

    class WarmedUp(kind):
        def prune(self, study, trial) -> bool:
            decision = super().prune(study, trial)
            if trial.last_step is None or trial.last_step < steps:
                return False
            return decision and len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))) >= trials

    WarmedUp.__name__ = WarmedUp.__qualname__ = kind.__name__
    return WarmedUp


def trial_id(storage, study_name: str, number: int) -> int:
    """The storage's id of trial ``number`` of a study (public storage API: the trial objects keep theirs private)."""
    study_id = storage.get_study_id_from_name(study_name)
    return storage.get_trial_id_from_study_id_trial_number(study_id, number)
