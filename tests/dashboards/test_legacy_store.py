"""A store written by an earlier version of the code (tests/fixtures/legacy_store.tar.gz: a real sweep of
tests/fixtures/legacy_study.yaml at fc37efa, with diverged cells) is still read and reported the same: the table
and every contrast equal what that version printed (tests/fixtures/legacy_expected)."""

from __future__ import annotations

import csv
import io
import sqlite3
import tarfile

from dashboards.render import records_csv, to_markdown
from dashboards.table import build
from record.runs import load_runs
from tests.conftest import ROOT
from tests.fixtures.make_legacy_store import EXPECTED, FIXTURE_ROOT

ARCHIVE = ROOT / "tests" / "fixtures" / "legacy_store.tar.gz"


def relocated_store(folder) -> str:
    """The fixture's store unpacked into ``folder``, its absolute artifact paths moved there."""
    with tarfile.open(ARCHIVE) as tar:
        tar.extractall(folder, filter="data")
    db = sqlite3.connect(folder / "mlflow.db")
    old, new = f"{FIXTURE_ROOT}/store", str(folder)
    with db:
        db.execute("UPDATE experiments SET artifact_location = replace(artifact_location, ?, ?)", (old, new))
        db.execute("UPDATE runs SET artifact_uri = replace(artifact_uri, ?, ?)", (old, new))
    db.close()
    return f"sqlite:///{folder}/mlflow.db"


def test_a_store_written_by_earlier_code_is_reported_the_same(tmp_path):
    """The same rows and numbers, and every statement the earlier code made (the next steps now say that more
    seeds after results are an amendment; a note says the study was never registered)."""
    uri = relocated_store(tmp_path)
    table = build(load_runs(uri, "legacy"))
    now, then = to_markdown(table), (EXPECTED / "table.md").read_text()
    assert [x for x in now.splitlines() if x.startswith("|")] == [x for x in then.splitlines() if x.startswith("|")]
    kept = [x for x in then.splitlines() if "next: ablate sweep" not in x]
    assert [x for x in kept if x not in now.splitlines()] == []
    assert "- note: not registered: no declaration of this study was recorded before its results" in now
    old = list(csv.DictReader(io.StringIO((EXPECTED / "contrasts.csv").read_bytes().decode())))
    new = list(csv.DictReader(io.StringIO(records_csv(table.contrast_records()))))
    assert [{k: r[k] for k in old[0]} for r in new] == old  # every column the earlier code wrote, unchanged
    assert len(table.rows) == 4 and sum(r.outcomes.diverged for r in table.rows) == 6  # the store is the real one
