"""Issue 72: every field of the study record says whether it decides verdicts, and what a late change makes
exploratory follows from the marks: a new key cannot escape the exploratory marking silently (before, it was a set
of strings in record/exploratory.py that a new analysis key was simply not in)."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, Field

from record import exploratory
from record.recorded import RecordedDesign
from record.spec.analysis import Analysis
from record.spec.decides import EVERY, ITS_OWN, MARKS, NONE, decides, keys_marked, marks
from record.spec.declaration import Declaration
from record.spec.study import StudyFile

RECORD = (StudyFile, Declaration, Analysis, RecordedDesign)


@pytest.mark.parametrize("model", RECORD, ids=lambda m: m.__name__)
def test_every_field_of_the_record_says_whether_it_decides_verdicts(model):
    unmarked = [name for name, mark in marks(model).items() if mark not in MARKS]
    assert not unmarked, f"{model.__name__}: give each a mark of record.spec.decides: {unmarked}"


def test_an_unmarked_field_is_found():
    class Later(BaseModel):
        margin: float = Field(0.1, json_schema_extra=decides(EVERY))
        new_key: float = 0.0

    assert marks(Later) == {"margin": EVERY, "new_key": None}


def test_what_a_late_change_makes_exploratory_follows_from_the_marks():
    assert keys_marked(Analysis, EVERY, "analysis.") <= exploratory.EVERY_CONTRAST
    assert keys_marked(Declaration, EVERY) <= exploratory.EVERY_CONTRAST
    per_contrast = keys_marked(Declaration, ITS_OWN) | keys_marked(Analysis, ITS_OWN, "analysis.")
    assert per_contrast == set(exploratory.PER_CONTRAST), "teach record.exploratory._changed_for the new key"
    assert not keys_marked(Analysis, NONE, "analysis.") & exploratory.EVERY_CONTRAST


def test_the_declaration_and_design_json_agree_on_what_decides():
    """A key both records hold is marked alike in both (the design's ``kind`` is the declaration's ``design``)."""
    design = {("design" if k == "kind" else k): m for k, m in marks(RecordedDesign).items()}
    shared = set(design) & set(marks(Declaration))
    assert shared >= {"metric", "direction", "design", "axes", "variants", "seeds", "budget", "vary_data"}
    assert {k: design[k] for k in shared} == {k: marks(Declaration)[k] for k in shared}


def test_what_the_declaration_holds_is_what_the_study_file_marks_as_deciding():
    """The registration hashes the declaration: a field of the study file that decides verdicts is in it (the
    design's kind, the base and the constraints through the variants and the runs they expand to)."""
    file = marks(StudyFile)
    deciding = {k for k, m in file.items() if m != NONE}
    through_the_runs = {"base", "constraints", "skip_invalid", "reuse_results"}
    assert deciding - through_the_runs <= set(marks(Declaration))
    assert {k for k, m in marks(Declaration).items() if m == NONE} == {"study"}
