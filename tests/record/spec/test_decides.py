"""Issue 72: every field of the study record says whether it decides verdicts, and what a late change makes
exploratory follows from the marks: a new key cannot escape the exploratory marking silently (before, it was a set
of strings in record/exploratory.py that a new analysis key was simply not in)."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, Field

from record import exploratory
from record.recorded import RecordedDesign, Registration
from record.spec.analysis import Analysis
from record.spec.decides import EVERY, ITS_OWN, MARKS, NONE, decides, keys_marked, marks
from record.spec.declaration import Declaration, digest
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


def test_the_keys_that_decide_their_own_contrasts_are_each_read_by_exploratory():
    per_contrast = keys_marked(Declaration, ITS_OWN) | keys_marked(Analysis, ITS_OWN, "analysis.")
    assert per_contrast == set(exploratory.PER_CONTRAST), "teach record.exploratory._changed_for the new key"


def amended_after_results(changed: str, value) -> list[Registration]:
    """A registration before any result, then an amendment after results that changes one analysis key."""
    before = {"study": "s", "design": "variants", "axes": [], "variants": {"base": {}, "wide": {}}, "analysis": {}}
    key = changed.removeprefix("analysis.")
    after = {**before, "analysis": {key: value}}
    made = lambda version, declared, finished, changed: Registration(  # noqa: E731
        version=version, hash=digest(declared), declaration=declared, created=0.0, finished=finished, changed=changed
    )
    return [made(0, before, {}, []), made(1, after, {"base": 3, "wide": 3}, [changed])]


@pytest.mark.parametrize(
    "changed,value,moves",
    [
        ("analysis.margins", {"final/val_loss": 0.05}, True),  # marked: every contrast
        ("analysis.failure_rule", "exclude", True),
        ("analysis.power", 0.9, False),  # marked: no verdict
        ("analysis.warn", {"param_ratio": 2.0}, False),
    ],
)
def test_a_late_change_makes_contrasts_exploratory_as_its_key_is_marked(changed, value, moves):
    """A change after results of what decides every verdict makes the contrast exploratory; of what decides none,
    it does not. The marks give the answer: record.exploratory holds no list of keys of its own."""
    mark = marks(Analysis)[changed.removeprefix("analysis.")]
    assert (mark == EVERY) == moves and (mark == NONE) == (not moves)
    found = exploratory.exploratory(amended_after_results(changed, value), {"wide vs base": ("wide", "base")})
    assert bool(found) == moves, found
    if moves:
        assert found["wide vs base"].startswith(f"amendment 1 changed {changed} after results")


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
