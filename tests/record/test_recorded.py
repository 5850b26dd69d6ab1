"""design.json is the study record's own serialisation, versioned, and every version reads through one adapter."""

from __future__ import annotations

import json

from record.recorded import SCHEMA, RecordedDesign
from record.spec import load_study
from tests.conftest import ROOT


def planned() -> RecordedDesign:
    return RecordedDesign.of(load_study(ROOT / "ablations" / "studies" / "heads_planned.yaml"), "c0de", 2)


def test_design_json_round_trips_through_json_text():
    design = planned()
    written = json.loads(json.dumps(design.to_json()))
    assert written["schema"] == SCHEMA
    assert written["plan"] == {"first": 8, "batch": 2, "max": 14, "spending": "pocock"}
    assert written["variants"][0] == {"name": "h2 dk32", "settings": {}}  # the form every version wrote
    assert RecordedDesign.from_json(written) == design
    assert RecordedDesign.from_json(written).plan.looks() == [8, 10, 12, 14]


def test_a_design_json_written_before_versions_reads_as_version_one():
    """Older sweeps wrote no version, and some wrote null where a mapping belongs."""
    old = planned().to_json()
    del old["schema"]
    old.update(analysis=None, tuning=None, budget=None)
    read = RecordedDesign.from_json(old)
    assert read.schema_ == 1
    assert (read.analysis, read.tuning, read.budget) == (type(read.analysis)(), {}, {})
    assert read.variants == planned().variants and read.plan == planned().plan
    assert RecordedDesign.from_json({}).metric == "final/val_loss"
