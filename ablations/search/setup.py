"""Optuna's side of a search: the storage (RDB with heartbeats, or a journal file), the sampler, the pruner.

The storage keeps no sampler or pruner: the driver and every trial process build the same ones from the spec.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from pathlib import Path

from ablations import records, tracking
from ablations.spec import SearchSpec


def storage_url(spec: SearchSpec, override: str | None = None) -> str:
    return (
        override
        or spec.storage
        or os.environ.get("ABLATE_OPTUNA_STORAGE")
        or f"sqlite:///{tracking.home() / 'optuna.db'}"
    )


def open_storage(url: str):
    """An Optuna storage: RDB (SQLite, PostgreSQL, ...) with heartbeats, or a journal file (journal:PATH)."""
    import optuna

    if url.startswith("journal:"):
        from optuna.storages.journal import JournalFileBackend

        path = Path(url.removeprefix("journal:")).expanduser().resolve()
        path.parent.mkdir(parents=True, exist_ok=True)
        return optuna.storages.JournalStorage(JournalFileBackend(str(path)))
    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    with (
        warnings.catch_warnings(),
        records.sqlite_first_use(url) if url.startswith("sqlite:///") else contextlib.nullcontext(),
    ):
        warnings.simplefilter("ignore")  # Optuna marks heartbeats experimental
        return optuna.storages.RDBStorage(
            url,
            heartbeat_interval=10,
            grace_period=60,
            heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=1),
            engine_kwargs={"pool_pre_ping": True} if not url.startswith("sqlite") else None,
        )


def make_sampler(spec: SearchSpec):
    import optuna

    with warnings.catch_warnings():  # TPE's group option is marked experimental: not news to a user
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return _sampler(spec)


def _sampler(spec: SearchSpec):
    import optuna

    s = spec.sampler
    if s == "tpe":
        return optuna.samplers.TPESampler(seed=spec.seed, multivariate=True, group=True, constant_liar=True)
    if s == "random":
        return optuna.samplers.RandomSampler(seed=spec.seed)
    if s == "cmaes":
        return optuna.samplers.CmaEsSampler(seed=spec.seed, warn_independent_sampling=False)
    if s == "gp":
        return optuna.samplers.GPSampler(seed=spec.seed)
    return optuna.samplers.NSGAIISampler(seed=spec.seed)


def make_pruner(p: str):
    """The pruner named ``p``. The storage keeps no pruner: the driver and every trial must build the same one."""
    import optuna

    if p == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=0)
    if p == "successive_halving":
        return optuna.pruners.SuccessiveHalvingPruner()
    if p == "hyperband":
        return optuna.pruners.HyperbandPruner()
    if p == "wilcoxon":
        return optuna.pruners.WilcoxonPruner()
    return optuna.pruners.NopPruner()


def trial_id(storage, study_name: str, number: int) -> int:
    """The storage's id of trial ``number`` of a study (public storage API: the trial objects keep theirs private)."""
    study_id = storage.get_study_id_from_name(study_name)
    return storage.get_trial_id_from_study_id_trial_number(study_id, number)
