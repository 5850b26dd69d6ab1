"""``ablate search SPEC --dry-run``: what a search would do, and what its Optuna storage already holds. It starts
no Ray and writes nothing: a storage that is not there is not created, one that is is only read."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from pathlib import Path

from ablations import stores, tracking
from ablations.search.driver import describe_sampler, other_objectives, preflight
from ablations.search.ledger import counted_trials, stale_trials
from ablations.search.results import counts
from ablations.search.setup import local_file, storage_url
from record.secrets import redact_url
from record.spec import SearchSpec


def _root(err: BaseException) -> BaseException:
    """The database's own words, not Optuna's wrapping of them (a context raised ``from None`` stays hidden)."""
    while (below := err.__cause__ or (None if err.__suppress_context__ else err.__context__)) is not None:
        err = below
    return err


def _open(url: str, path: Path | None):
    """The storage, read only (no tables made), or a line that says why the search would not use it as it is:
    ``storage_problem``, the search's own check, or "" for a database without Optuna's tables."""
    import optuna

    from ablations.search.setup import HEARTBEAT, inspect_storage

    problem, schema = inspect_storage(url)
    if problem:
        return None, problem
    if url.startswith("journal:"):
        from optuna.storages.journal import JournalFileBackend

        return optuna.storages.JournalStorage(JournalFileBackend(str(path))), None
    if schema == "none":
        return None, ""
    return optuna.storages.RDBStorage(url, skip_table_creation=True, **HEARTBEAT), None


def _lost(study, storage) -> tuple[int, int]:
    """Trials the search will fail when it starts: (asked again, not asked again). Left running by a process of
    this machine that stopped, or (RDB storages) whose heartbeat stopped: retried once, as ``open_storage``'s
    callback does."""
    import optuna

    from ablations.search.setup import STALE_RETRIES, heartbeat_stale_ids

    lost = {t.number for t in stale_trials(study)}
    final = 0
    if isinstance(storage, optuna.storages.RDBStorage):  # what optuna.storages.fail_stale_trials fails; read here
        for trial_id in heartbeat_stale_ids(storage, study.study_name):
            trial = storage.get_trial(trial_id)
            if len(optuna.storages.RetryHeartbeatStaleTrialCallback.retry_history(trial)) < STALE_RETRIES:
                lost.add(trial.number)
            elif trial.number not in lost:
                final += 1
    return len(lost), final


def storage_state(spec: SearchSpec, url: str) -> tuple[str, str | None]:
    """What the storage holds for this search, and a problem that would stop it (None if none)."""
    import optuna

    shown = redact_url(url)
    every = f"; every trial of {spec.n_trials} to ask" if spec.n_trials else ""
    path = local_file(url)
    if path is not None and not path.exists():
        return f"Optuna storage {shown}: not there yet (the search creates it){every}", None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            storage, refusal = _open(url, path)
            if storage is None:
                if refusal:
                    return "", f"the Optuna storage {shown} {refusal}"
                return f"Optuna storage {shown}: no Optuna tables yet (the search makes them){every}", None
            if spec.name not in {s.study_name for s in storage.get_all_studies()}:
                return f"Optuna storage {shown}: no study {spec.name!r} yet{every}", None
            study = optuna.load_study(study_name=spec.name, storage=storage)
            again, failed = _lost(study, storage)
    except Exception as err:  # noqa: BLE001  (said, not raised: the dry run names what the search would meet)
        err = _root(err)
        words = str(err).strip().splitlines()[0][:200] if str(err).strip() else ""
        reason = f"{words} ({type(err).__name__})" if words else type(err).__name__
        return "", f"the Optuna storage {shown} cannot be read: {reason}"
    held = ", ".join(f"{n} {s.lower()}" for s, n in sorted(counts(study).items())) or "no trials"
    line = f"Optuna storage {shown}: study {spec.name!r} holds {held}"
    if spec.n_trials:  # a lost trial asked again: its retry counts instead
        line += f"; {max(spec.n_trials - counted_trials(study) + again, 0)} of {spec.n_trials} to ask"
    if again or failed:
        line += f" ({again + failed} left running by a process that stopped or whose heartbeat did: failed"
        line += f", {again} asked again)" if failed else ", and asked again)"
    return line, other_objectives(study, spec, url)


def finished_best(spec: SearchSpec, url: str) -> dict | None:
    """The best trial's parameters of a search that would ask no more trials (all of its trials counted, none to
    be asked again), read only; None otherwise (what would stop it, ``storage_state`` says)."""
    import optuna

    from ablations.search.results import best_trials

    path = local_file(url)
    if not spec.n_trials or (path is not None and not path.exists()):
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            storage, _ = _open(url, path)
            if storage is None or spec.name not in {s.study_name for s in storage.get_all_studies()}:
                return None
            study = optuna.load_study(study_name=spec.name, storage=storage)
            again, _ = _lost(study, storage)
            if counted_trials(study) - again < spec.n_trials:
                return None
            best = best_trials(study, spec)
    except Exception:  # noqa: BLE001  (storage_state names it)
        return None
    return best[0]["params"] if best else None


def describe_search(
    spec: SearchSpec,
    storage: str | None = None,
    tracking_uri: str | None = None,
    address: str | None = None,
    num_cpus: int | None = None,
    out: Callable[[str], None] = print,
) -> list[str]:
    """Print the search's plan; return every problem that would stop it: what the storage holds, and what
    ``run_search`` checks before it starts."""
    from record.spec.common import Origin
    from record.spec.metrics import in_order, logged_metrics
    from record.spec.run import resolve_run

    pruner = "no" if spec.pruner == "none" else spec.pruner
    trials = f"{spec.n_trials} trials" if spec.n_trials else "trials until the timeout"
    timeout = f", stopping after {spec.timeout:g} s" if spec.timeout else ""
    out(
        f"search {spec.name!r}: {describe_sampler(spec)}, {pruner} pruner; {trials}, {spec.concurrency} at a time"
        f"{timeout}"
    )
    objectives = ", ".join(f"{m} ({d})" for m, d in spec.objectives)
    budget = spec.budget.as_dict() or "from the base run"
    noun = "objective" if len(spec.objectives) == 1 else "objectives"
    out(f"each trial: {spec.resources.describe()}; budget {budget}; {noun} {objectives}")
    width = max(len(p.key) for p in spec.space)
    out("space:")
    for p in spec.space:
        out(f"  {p.key:<{width}}  {p.describe()}")
    run = resolve_run({**spec.run_data(spec.assign(lambda p: p.end(0))), "name": spec.name}, Origin(None))
    out(
        "the runs log: " + ", ".join(m for m in in_order(logged_metrics(run)) if not m.startswith("cost/")) + ", cost/*"
    )
    for warning in spec.warnings:
        out(f"warning: {warning}")
    url = storage_url(spec, storage)
    line, problem = storage_state(spec, url)
    if line:
        out(line)
    uri = tracking.resolve_uri(tracking_uri, create=False)
    there = "" if stores.store_exists(uri) else " (no store yet: the search creates it)"
    out(f"MLflow: experiment {spec.name!r} in {redact_url(uri)}{there}")
    problems = [problem] if problem else []
    try:
        preflight(spec, address or os.environ.get("RAY_ADDRESS") or None, uri, url, num_cpus)
    except ValueError as err:
        problems.append(str(err))
    return problems
