"""Registered studies: what decides a study's verdicts is recorded before its first cell, and every later change is
an amendment with its reason, its diff, and how many cells had results when it was made.

The first submission of a study registers its declaration (``record.spec.declaration``): a row in the claims
store, inserted atomically (two submissions registering one new study at once end with one registration), mirrored
as a run of kind ``registration`` in the study's experiment (``registration.json``), so that a team on a shared
server sees it and the report reads it. A later submission whose declaration differs is refused before anything
runs, with the diff, unless it says it is an amendment (``--amend "why"`` or ``amend:`` in the file). A record
whose declaration no longer has its hash was edited: it is reported and refused, never trusted.
"""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from ablations import tracking
from ablations.claims import Registry
from record import vocabulary
from record.recorded import Registration, registrations
from record.spec import Study
from record.spec.declaration import changed_keys, declaration, diff_text, digest


class NotRegistered(ValueError):
    """The submission differs from the registered declaration and says no reason (or the record is not
    trustworthy): refused before anything runs."""


def register(
    study: Study, uri: str, claims_url: str, amend: str | None = None, *, out: Callable[[str], None] = print
) -> tuple[Registration, bool]:
    """(the registration this submission runs under, whether this submission recorded it): the study's registered
    one when its declaration is the same; a new registration for a new study; an amendment when it differs and
    ``amend`` says why. Raises NotRegistered (a ValueError) with the diff otherwise."""
    amend = amend if amend is not None else study.amend  # the command's reason, else the file's
    if amend is not None and not amend.strip():
        raise NotRegistered("--amend needs a reason: say why the declaration changes (it is shown in every report)")
    declared = declaration(study)
    registry, store = Registry(claims_url), _store_key(uri, study.name)
    history = _history(registry, store, study, uri)
    while True:  # a version another submission records at the same moment is read back, and decided again
        latest = history[-1] if history else None
        if latest is not None and latest.hash == digest(declared):
            return latest, False
        if latest is not None and amend is None:
            raise NotRegistered(_refusal(study, latest, declared))
        entry = _entry(study, uri, declared, latest, amend)
        created = registry.add(study.name, store, entry.version, entry.hash, json.dumps(entry.to_json()))
        if created is not None:
            entry = Registration.from_json({**entry.to_json(), "created": created})
            _mirror(uri, study.name, entry)
            out(_said(study, entry))
            return entry, True
        history = _history(registry, store, study, uri)


def status(study: Study, uri: str, amend: str | None = None) -> str:
    """What a submission would do about the registration, read from the tracking store only (a dry run writes
    nothing): register it, run under it, amend it, or be refused with the diff."""
    from ablations import stores

    history = registrations(uri, study.name) if stores.store_exists(uri) else []
    declared = declaration(study)
    if not history:
        return f"registration: none yet; the first submission registers declaration {digest(declared)}"
    latest = history[-1]
    if not all(r.verified for r in history):
        return "registration: edited (a record no longer has its hash): not trusted; a submission is refused"
    if latest.hash == digest(declared):
        return f"registration: version {latest.version} ({latest.hash}), unchanged"
    if amend:
        return f"registration: amendment {latest.version + 1} ({', '.join(changed_keys(latest.declaration, declared))}): {amend}"
    return "refused: " + _refusal(study, latest, declared)


def _store_key(uri: str, study: str) -> str:
    """The study's experiment in its store (id@creation time), as submissions are numbered: two stores beside one
    claims store register apart."""
    c = vocabulary.client(uri)
    exp_id = tracking.experiment_id(uri, study)
    return f"{exp_id}@{c.get_experiment(exp_id).creation_time}"


def _history(registry: Registry, store: str, study: Study, uri: str) -> list[Registration]:
    """The versions recorded for the study, checked: every one must still have its hash, and every one is in the
    tracking store too (one that a submission recorded before it stopped is mirrored now)."""
    mirrored = {r.version: r for r in registrations(uri, study.name)}
    rows = registry.entries(study.name, store)
    if not rows and mirrored:  # a claims store started afresh beside a store that holds the registration
        for entry in mirrored.values():
            _trusted(study.name, entry, entry.hash)
            registry.add(study.name, store, entry.version, entry.hash, json.dumps(entry.to_json()))
        rows = registry.entries(study.name, store)
    entries = [Registration.from_json({**json.loads(r["record"]), "created": r["created"]}) for r in rows]
    entries = [e for e, r in zip(entries, rows) if _trusted(study.name, e, r["hash"])]
    for entry in entries:
        seen = mirrored.get(entry.version)
        if seen is None:
            _mirror(uri, study.name, entry)
        elif not seen.verified or seen.hash != entry.hash:
            raise NotRegistered(
                f"the registration of {study.name!r} in the tracking store (version {entry.version}) does not match "
                f"the claims store's (hash {seen.hash} recorded, {digest(seen.declaration)} computed, {entry.hash} "
                "registered): it was edited, and is not trusted; restore it or register the study under a new name"
            )
    return entries


def _trusted(study: str, entry: Registration, hash: str) -> bool:
    if entry.hash != hash or not entry.verified:
        raise NotRegistered(
            f"the registration of {study!r} (version {entry.version}) in the claims store does not match its hash: it "
            "was edited, and is not trusted; restore it or register the study under a new name"
        )
    return True


def _entry(study: Study, uri: str, declared: dict, latest: Registration | None, amend: str | None) -> Registration:
    """The next version: the registration (none before), or an amendment of ``latest``."""
    code, commit = tracking.code_fingerprint(), _git_commit(study.source)
    if latest is None:  # a study registered after its cells ran (before registration existed): the results were seen
        finished = _finished(uri, study.name)
        return Registration(version=0, hash=digest(declared), declaration=declared, created=0.0, code=code,
                            git_commit=commit, finished=finished)  # fmt: skip
    return Registration(
        version=latest.version + 1,
        hash=digest(declared),
        declaration=declared,
        created=0.0,
        reason=amend or "",
        diff=diff_text(latest.declaration, declared),
        changed=changed_keys(latest.declaration, declared),
        finished=_finished(uri, study.name),
        code=code,
        git_commit=commit,
    )


def _finished(uri: str, study: str) -> dict[str, int]:
    """variant -> its cells with a result (any code's) in the store: what had been seen when an amendment was made."""
    counts: Counter = Counter()
    for runs in vocabulary.cell_runs(uri, study).values():
        result = vocabulary.result_run(runs)
        if result is not None:
            counts[result.data.tags.get(vocabulary.TAG_VARIANT, "?")] += 1
    return dict(counts)


def _git_commit(path: str) -> str:
    """The last commit of the study file, with "+changes" when it differs from it; "" outside a repository."""
    folder = Path(path).resolve().parent
    try:
        run = lambda *args: subprocess.run(  # noqa: E731
            ["git", *args], cwd=folder, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        commit = run("log", "-1", "--format=%H", "--", str(Path(path).resolve()))
        dirty = run("status", "--porcelain", "--", str(Path(path).resolve()))
    except (OSError, subprocess.SubprocessError):
        return ""
    return f"{commit}{'+changes' if dirty else ''}" if commit else ""


def _mirror(uri: str, study: str, entry: Registration) -> None:
    """The version as a run of the study's experiment: what a team on the same server and the report read."""
    c = vocabulary.client(uri)
    tags = {
        vocabulary.TAG_KIND: vocabulary.KIND_REGISTRATION,
        vocabulary.TAG_STUDY: study,
        vocabulary.TAG_VERSION: str(entry.version),
        vocabulary.TAG_DECLARATION_HASH: entry.hash,
        vocabulary.TAG_NOTE: entry.reason or "the study's registration",
    }
    name = "registration" if entry.version == 0 else f"amendment {entry.version}"
    run = c.create_run(tracking.experiment_id(uri, study), run_name=name, tags=tags)
    c.log_dict(run.info.run_id, entry.to_json(), vocabulary.REGISTRATION_ARTIFACT)
    c.set_terminated(run.info.run_id, "FINISHED")


def _refusal(study: Study, latest: Registration, declared: dict) -> str:
    keys = ", ".join(changed_keys(latest.declaration, declared))
    return (
        f"{study.source}: the study differs from its registered declaration (version {latest.version}) in {keys}; an "
        f'amendment must say why: ablate sweep {study.source} --amend "why" (or amend: "why" in the file). It is '
        f"recorded with the cells finished by then, and every report shows it.\n{diff_text(latest.declaration, declared)}"
    )


def _said(study: Study, entry: Registration) -> str:
    if entry.version == 0:
        return f"registered {study.name!r}: declaration {entry.hash}, before its first cell"
    seen = sum(entry.finished.values())
    return f"amendment {entry.version} of {study.name!r} ({', '.join(entry.changed)}), {seen} cell(s) finished: {entry.reason}"


__all__ = ["NotRegistered", "register", "status"]
