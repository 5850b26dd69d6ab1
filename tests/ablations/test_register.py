"""Registered studies (issue 48): the declaration recorded before the first cell, every later change an amendment
with its reason, diff and the cells finished by then; concurrent registrations end with one; an edited record is
refused, never trusted. Real SQLite stores (MLflow and claims), real processes for the race."""

from __future__ import annotations

import json
import multiprocessing
import sqlite3
from pathlib import Path

import pytest
import yaml
from mlflow import MlflowClient

from ablations.register import NotRegistered, register, status
from record import vocabulary
from record.recorded import registrations
from record.spec import load_study
from record.spec.declaration import declaration, digest
from tests.record.spec.test_study import BASE


def write(tmp_path: Path, **changes) -> Path:
    data = {
        "name": "reg",
        "description": "one",
        "base": BASE,
        "design": {"grid": {"model.norm": ["pre", "post"]}},
        "seeds": 2,
        "analysis": {"margins": {"final/val_loss": 0.05}},
        **changes,
    }
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump({k: v for k, v in data.items() if v is not None}))
    return path


def claims_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'claims.db'}"


def test_the_first_submission_registers_and_an_unchanged_one_runs_under_it(tmp_path, store):
    study = load_study(write(tmp_path))
    said: list[str] = []
    entry, recorded = register(study, store, claims_url(tmp_path), out=said.append)
    assert (entry.version, recorded, entry.reason) == (0, True, "") and entry.hash == digest(declaration(study))
    assert entry.created > 0 and "registered 'reg'" in said[0]
    assert entry.declaration["analysis"] == {"margins": {"final/val_loss": 0.05}} and entry.declaration["seeds"] == [
        0,
        1,
    ]
    # the tracking store holds it, as a run of the study's experiment a team on the same server sees
    mirrored = registrations(store, "reg")
    assert [r.to_json() for r in mirrored] == [entry.to_json()] and mirrored[0].verified
    c = MlflowClient(store)
    runs = c.search_runs([c.get_experiment_by_name("reg").experiment_id], "tags.kind = 'registration'")
    assert len(runs) == 1 and runs[0].data.tags[vocabulary.TAG_DECLARATION_HASH] == entry.hash
    # what cannot move a verdict needs no amendment: the description, the resources, the retries
    same = load_study(write(tmp_path, description="two", resources={"cpus": 2}, retries=3))
    again, recorded = register(same, store, claims_url(tmp_path))
    assert (again.version, recorded) == (0, False)
    assert status(same, store) == f"registration: version 0 ({entry.hash}), unchanged"


def test_a_changed_declaration_is_refused_with_its_diff_unless_it_is_an_amendment(tmp_path, store):
    register(load_study(write(tmp_path)), store, claims_url(tmp_path))
    grown = load_study(write(tmp_path, seeds=4, analysis={"margins": {"final/val_loss": 0.02}}))
    with pytest.raises(NotRegistered) as info:
        register(grown, store, claims_url(tmp_path))
    said = str(info.value)
    assert "differs from its registered declaration (version 0) in seeds, analysis.margins" in said
    assert "-    final/val_loss: 0.05" in said and "+    final/val_loss: 0.02" in said and '--amend "why"' in said
    assert status(grown, store).startswith("refused: ") and len(registrations(store, "reg")) == 1  # nothing written
    with pytest.raises(NotRegistered, match="--amend needs a reason"):
        register(grown, store, claims_url(tmp_path), amend="  ")
    entry, recorded = register(grown, store, claims_url(tmp_path), amend="two seeds cannot resolve the family")
    assert (entry.version, recorded, entry.reason) == (1, True, "two seeds cannot resolve the family")
    assert entry.changed == ["seeds", "analysis.margins"] and entry.finished == {} and "+- 3" in entry.diff
    assert [r.version for r in registrations(store, "reg")] == [0, 1]
    # the amendment in the file is as good as the command's
    in_file = load_study(write(tmp_path, seeds=5, amend="a fifth seed: a failed cell"))
    assert register(in_file, store, claims_url(tmp_path))[0].version == 2


def _register_at_once(path: str, store: str, claims: str, out: multiprocessing.Queue) -> None:
    entry, recorded = register(load_study(path), store, claims, out=lambda _: None)
    out.put((entry.version, entry.hash, recorded))


def test_submissions_registering_one_new_study_at_once_end_with_one_registration(tmp_path, store):
    path = write(tmp_path)
    ctx = multiprocessing.get_context("spawn")
    answers = ctx.Queue()
    procs = [
        ctx.Process(target=_register_at_once, args=(str(path), store, claims_url(tmp_path), answers)) for _ in range(4)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    got = [answers.get(timeout=10) for _ in procs]
    assert {(v, h) for v, h, _ in got} == {(0, digest(declaration(load_study(path))))}
    assert sum(recorded for _, _, recorded in got) == 1  # one recorded it, the others ran under it
    assert len(registrations(store, "reg")) == 1


def test_a_registration_another_submission_is_still_mirroring_is_not_read(tmp_path, store):
    """Ten submissions at once on PostgreSQL once saw a mirror between its run and its artifact, and one of them
    stopped on the missing registration.json. A run caught there is passed over; the version stays readable."""
    study = load_study(write(tmp_path))
    entry, _ = register(study, store, claims_url(tmp_path))
    c = MlflowClient(store)
    exp_id = c.get_experiment_by_name("reg").experiment_id
    tags = {vocabulary.TAG_KIND: vocabulary.KIND_REGISTRATION, vocabulary.TAG_VERSION: "0"}
    c.create_run(exp_id, run_name="registration", tags=tags)  # created, its artifact not yet written
    assert [r.to_json() for r in registrations(store, "reg")] == [entry.to_json()]
    again, recorded = register(study, store, claims_url(tmp_path))
    assert (again.version, again.hash, recorded) == (0, entry.hash, False)


def test_an_edited_registration_is_reported_and_not_trusted(tmp_path, store):
    study = load_study(write(tmp_path))
    register(study, store, claims_url(tmp_path))
    db = sqlite3.connect(tmp_path / "claims.db")
    record = json.loads(db.execute("select record from ablate_registrations").fetchone()[0])
    record["declaration"]["analysis"] = {"margins": {"final/val_loss": 0.5}}  # a wider margin, after the fact
    with db:
        db.execute("update ablate_registrations set record = ?", (json.dumps(record),))
    with pytest.raises(NotRegistered, match="does not match its hash: it was edited, and is not trusted"):
        register(study, store, claims_url(tmp_path))


def test_a_registration_store_that_cannot_be_reached_refuses_the_submission(tmp_path, store):
    unreachable = "postgresql+psycopg://nobody@127.0.0.1:9/none?connect_timeout=2"  # nothing listens on port 9
    with pytest.raises(Exception) as info:
        register(load_study(write(tmp_path)), store, unreachable)
    assert "9" in str(info.value) and registrations(store, "reg") == []  # refused, nothing registered
