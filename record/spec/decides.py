"""Whether a declared field decides verdicts: every field of the study record says so, and what a late change of it
makes exploratory follows from the mark (``record/exploratory.py``), so a new key cannot escape it silently."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

EVERY = "every contrast"  # a change moves every verdict (the metric, the seeds, the test, a margin)
ITS_OWN = "its contrasts"  # a change moves the verdicts of the contrasts it names (a variant, the family, expect)
NONE = "no verdict"  # read by no verdict (the name, the power a plan aims at, the warnings' thresholds)
BY_ITS_FIELDS = "by its fields"  # a section whose own fields are marked (the analysis)
MARKS = (EVERY, ITS_OWN, NONE, BY_ITS_FIELDS)


def decides(mark: str) -> dict[str, Any]:
    """``Field(..., json_schema_extra=decides(EVERY))``: the mark of one field."""
    assert mark in MARKS, mark
    return {"decides": mark}


def marks(model: type[BaseModel]) -> dict[str, str | None]:
    """field -> its mark (None: unmarked, a defect ``tests/record/spec/test_decides.py`` finds)."""
    out = {}
    for name, info in model.model_fields.items():
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        out[name] = extra.get("decides")
    return out


def keys_marked(model: type[BaseModel], mark: str, prefix: str = "") -> set[str]:
    return {prefix + name for name, m in marks(model).items() if m == mark}


__all__ = ["BY_ITS_FIELDS", "EVERY", "ITS_OWN", "MARKS", "NONE", "decides", "keys_marked", "marks"]
