"""What a submission records of its study (design.json) and what a cell's run records, read back as typed values:
the one place that says how each is written and read. A cell's settings are recorded once, in the design (each
variant's settings, each cell's variant); its run holds its whole configuration as params for MLflow's UI, and the
tags of the vocabulary (``ablations.records``). The sweep writes these records, the report reads them back."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ablations import records
from ablations.spec import Study
from ablations.spec.analysis import Analysis, from_design


@dataclass(frozen=True, kw_only=True)
class RecordedDesign:
    """A submission's design.json: what the report needs to know about the study, as that submission ran it."""

    kind: str = ""
    axes: list[str] = field(default_factory=list)
    metric: str = "final/val_loss"
    direction: str = "minimize"
    variants: dict[str, dict[str, str]] = field(default_factory=dict)  # name -> the settings that define it
    cells: dict[str, str] = field(default_factory=dict)  # cell id -> variant (its name in this design)
    seeds: list[int] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)
    analysis: Analysis = field(default_factory=Analysis)
    code: str | None = None  # whose results count: the code's fingerprint (None: any code's)
    vary_data: bool = False
    tuning: dict[str, Any] = field(default_factory=dict)
    source: str = ""  # the study file (the report's next steps are commands on it)
    budget: dict[str, float] = field(default_factory=dict)

    @classmethod
    def of(cls, study: Study, code: str | None) -> RecordedDesign:
        """What a submission of ``study`` records; ``code``: the fingerprint of the code whose results count."""
        return cls(
            kind=study.design,
            axes=list(study.axes),
            metric=study.metric,
            direction=study.direction,
            variants={c.variant: {k: str(x) for k, x in c.settings.items()} for c in study.cells},
            cells={c.cell_id: c.variant for c in study.cells},
            seeds=study.seeds,
            skipped=[vars(s) for s in study.skipped],
            analysis=study.analysis,
            code=code,
            vary_data=study.vary_data,
            tuning=study.tuning.as_dict() if study.tuning else {},
            source=study.source,
            budget=study.budget.as_dict(),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "kind": self.kind,
            "axes": self.axes,
            "metric": self.metric,
            "direction": self.direction,
            "variants": [{"name": v, "settings": s} for v, s in self.variants.items()],
            "seeds": self.seeds,
            "skipped": self.skipped,
            # a cell keeps its id when the design grows (a new axis at the base's value), but its label changes
            "cells": self.cells,
            "analysis": self.analysis.model_dump(mode="json", exclude_defaults=True),
            "vary_data": self.vary_data,
            "tuning": self.tuning,
            "source": self.source,
            "budget": self.budget,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RecordedDesign:
        """A design.json as any version of the sweep wrote it (keys it lacks take their defaults)."""
        analysis = from_design(data)
        return cls(
            kind=data.get("kind", ""),
            axes=list(data.get("axes", [])),
            metric=data.get("metric", "final/val_loss"),
            direction=data.get("direction", "minimize"),
            variants={v["name"]: dict(v.get("settings", {})) for v in data.get("variants", [])},
            cells=dict(data.get("cells", {})),
            seeds=list(data.get("seeds", [])),
            skipped=list(data.get("skipped", [])),
            analysis=analysis,
            code=data.get("code"),
            vary_data=bool(data.get("vary_data", False)),
            tuning=dict(data.get("tuning") or {}),
            source=data.get("source", ""),
            budget=dict(data.get("budget") or {}),
        )

    @classmethod
    def from_params(cls, params: dict[str, str]) -> RecordedDesign:
        """A submission recorded before design.json: what its parent run's params say."""
        return cls(
            kind=params.get("design", ""),
            axes=[a for a in params.get("axes", "").split(",") if a],
            metric=params.get("metric", "final/val_loss"),
            direction=params.get("direction", "minimize"),
        )

    def axis_values(self, variant: str) -> dict[str, str]:
        """The design's values of a variant (what a tuned study's searches chose left out)."""
        return {k: v for k, v in self.variants.get(variant, {}).items() if not k.startswith(records.TUNED_SETTING)}

    def tuned_values(self, variant: str) -> dict[str, str]:
        """What a tuned study's search chose for a variant (keys without the prefix)."""
        settings = self.variants.get(variant, {})
        return {
            k.removeprefix(records.TUNED_SETTING): v for k, v in settings.items() if k.startswith(records.TUNED_SETTING)
        }


@dataclass(frozen=True, kw_only=True)
class CellRun:
    """One run of a cell, read back from MLflow: which cell it is, its state, and what it recorded."""

    run_id: str
    cell_id: str
    variant: str
    seed: int | str
    submission: str
    state: str  # finished | diverged | failed | killed | running (``records.cell_state``)
    detail: str
    ray_node: str
    start_time: int
    end_time: int | None
    metrics: dict[str, float]
    params: dict[str, str]

    @classmethod
    def of(cls, run) -> CellRun:
        tags = run.data.tags
        seed = tags.get(records.TAG_SEED, "")
        return cls(
            run_id=run.info.run_id,
            cell_id=tags.get(records.TAG_CELL_ID, run.info.run_id),
            variant=tags.get(records.TAG_VARIANT, "?"),
            seed=int(seed) if seed.lstrip("-").isdigit() else seed,
            submission=tags.get(records.TAG_SUBMISSION, ""),
            state=records.cell_state(run),
            detail=tags.get(records.TAG_STATUS, ""),
            ray_node=tags.get(records.TAG_RAY_NODE, ""),
            start_time=run.info.start_time,
            end_time=run.info.end_time,
            metrics=dict(run.data.metrics),
            params=dict(run.data.params),
        )


def submission_number(run) -> int:
    """A parent run's submission number (0 where none was recorded)."""
    return int(run.data.tags.get(records.TAG_SUBMISSION, 0))


__all__ = ["CellRun", "RecordedDesign", "submission_number"]
