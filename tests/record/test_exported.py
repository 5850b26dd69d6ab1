"""A committed table judged again from its exported files alone (record.exported): with the rules it was written
under, every family contrast's difference, Holm p and verdict come back as committed; under the current rules,
docs/results/rejudge.py names what changes (issue 65: margins past the metric's floor)."""

from __future__ import annotations

import csv
import subprocess
import sys

import pytest

from dashboards.looks import table
from record.exported import exported_runs
from tests.conftest import ROOT

RESULTS = ROOT / "docs" / "results"


def committed(folder) -> dict[str, dict[str, str]]:
    with open(folder / "contrasts.csv", newline="") as f:
        return {row["label"]: row for row in csv.DictReader(f)}


def test_a_table_without_a_margin_comes_back_as_committed_from_its_files():
    folder = RESULTS / "decoding"  # a seed plan, no margin: nothing the current rules change
    t = table(exported_runs(folder), curves=False)
    before = committed(folder)
    assert t.family and {c.label for c in t.family} <= set(before)
    for c in t.family:
        row = before[c.label]
        assert c.verdict == row["verdict"]
        assert c.estimate == pytest.approx(float(row["diff"]), rel=1e-9, abs=1e-12)
        assert c.p_holm == pytest.approx(float(row["p_holm"]), rel=1e-9)


def test_rejudge_names_the_equivalences_a_floor_made_automatic():
    done = subprocess.run(
        [sys.executable, str(RESULTS / "rejudge.py"), "norm_placement_long"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    rows = [x for x in done.stdout.splitlines() if x.startswith("| norm_placement_long |")]
    assert rows and all("equivalence not testable here" in x.split(" | ")[3] for x in rows)
    was = [x.split(" | ")[2] for x in rows]
    assert "different (worse), equivalent within ±0.01" in was  # the audit's automatic equivalence, now refused
