"""``ablate search SPEC --dry-run``: what a search would do, and what its Optuna storage already holds. It starts
no Ray and writes nothing: a storage that is not there is not created, one that is is only read."""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from ablations import tracking
from ablations.search.driver import counted_trials, describe_sampler, stale_trials
from ablations.search.setup import storage_url
from ablations.secrets import redact_url
from ablations.spec import SearchSpec


def _local_file(url: str) -> Path | None:
    """The file of a SQLite or journal storage (None for a server's URL)."""
    if url.startswith("journal:"):
        return Path(url.removeprefix("journal:")).expanduser()
    if url.startswith("sqlite:///"):
        return Path(url.removeprefix("sqlite:///"))
    return None


def storage_state(spec: SearchSpec, url: str) -> tuple[str, str | None]:
    """What the storage holds for this search, and a problem that would stop it (None if none)."""
    import optuna

    shown = redact_url(url)
    goal = f" of {spec.n_trials}" if spec.n_trials else ""
    path = _local_file(url)
    if path is not None and not path.exists():
        return f"Optuna storage {shown}: not there yet (the search creates it); every trial{goal} to ask", None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if url.startswith("journal:"):
                from optuna.storages.journal import JournalFileBackend

                storage = optuna.storages.JournalStorage(JournalFileBackend(str(path)))
            else:  # read only: no tables made
                storage = optuna.storages.RDBStorage(url, skip_table_creation=True)
            study = optuna.load_study(study_name=spec.name, storage=storage)
    except KeyError:
        return f"Optuna storage {shown}: no study {spec.name!r} yet; every trial{goal} to ask", None
    except Exception as err:  # noqa: BLE001  (said, not raised: the dry run names what the search would meet)
        while err.__cause__ or err.__context__:  # the database's own words, not Optuna's wrapping of them
            err = err.__cause__ or err.__context__
        reason = str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__
        if "version_info" in reason:  # a database without Optuna's tables: the search makes them
            return (
                f"Optuna storage {shown}: no Optuna tables yet (the search makes them); every trial{goal} to ask",
                None,
            )
        return "", f"the Optuna storage {shown} cannot be read: {reason}"
    states = Counter(t.state.name.lower() for t in study.get_trials(deepcopy=False))
    held = ", ".join(f"{n} {s}" for s, n in sorted(states.items())) or "no trials"
    line = f"Optuna storage {shown}: study {spec.name!r} holds {held}"
    stale = stale_trials(study)  # failed and asked again when the search starts: the retry counts instead
    if spec.n_trials:
        line += f"; {max(spec.n_trials - counted_trials(study) + len(stale), 0)} of {spec.n_trials} to ask"
    if stale:
        line += f" ({len(stale)} left running by a process that stopped: failed, and asked again)"
    known = study.user_attrs.get("objectives")
    if known and [tuple(o) for o in known] != spec.objectives:
        return line, (
            f"the Optuna study {spec.name!r} in {shown} was created with objectives {known}; this spec has "
            f"{spec.objectives}: give the search another name"
        )
    return line, None


def describe_search(
    spec: SearchSpec,
    storage: str | None = None,
    tracking_uri: str | None = None,
    out: Callable[[str], None] = print,
) -> str | None:
    """Print the search's plan; return a problem that would stop it (or None)."""
    from ablations.spec.common import Origin
    from ablations.spec.metrics import in_order, logged_metrics
    from ablations.spec.run import resolve_run

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
    line, problem = storage_state(spec, storage_url(spec, storage))
    if line:
        out(line)
    uri = tracking.resolve_uri(tracking_uri, create=False)
    there = "" if tracking.store_exists(uri) else " (no store yet: the search creates it)"
    out(f"MLflow: experiment {spec.name!r} in {redact_url(uri)}{there}")
    return problem
