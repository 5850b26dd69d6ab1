"""What a submission records of its study (design.json) and what a cell's run records, read back as typed values:
the one place that says how each is written and read. A cell's settings are recorded once, in the design (each
variant's settings, each cell's variant); its run holds its whole configuration as params for MLflow's UI, and the
tags of the vocabulary (``record.vocabulary``). The sweep writes these records, the report reads them back."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from record import vocabulary
from record.spec import Study
from record.spec.analysis import Analysis, from_design
from record.spec.declaration import digest


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
    registration: int | None = None  # the version of the study's registration this submission ran under
    plan: dict[str, Any] | None = None  # a seed plan's first, batch, max, spending (record/spec/seedplan.py)

    @classmethod
    def of(cls, study: Study, code: str | None, registration: int | None = None) -> RecordedDesign:
        """What a submission of ``study`` records; ``code``: the fingerprint of the code whose results count;
        ``registration``: the version of the study's registration it runs under."""
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
            registration=registration,
            plan=study.plan.as_dict() if study.plan else None,
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
            "registration": self.registration,
            "plan": self.plan,
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
            registration=data.get("registration"),
            plan=data.get("plan"),
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
        return {k: v for k, v in self.variants.get(variant, {}).items() if not k.startswith(vocabulary.TUNED_SETTING)}

    def tuned_values(self, variant: str) -> dict[str, str]:
        """What a tuned study's search chose for a variant (keys without the prefix)."""
        settings = self.variants.get(variant, {})
        return {
            k.removeprefix(vocabulary.TUNED_SETTING): v
            for k, v in settings.items()
            if k.startswith(vocabulary.TUNED_SETTING)
        }


@dataclass(frozen=True, kw_only=True)
class CellRun:
    """One run of a cell, read back from MLflow: which cell it is, its state, and what it recorded."""

    run_id: str
    cell_id: str
    variant: str
    seed: int | str
    submission: str
    state: str  # finished | diverged | failed | killed | running (``vocabulary.cell_state``)
    detail: str
    ray_node: str
    start_time: int
    end_time: int | None
    metrics: dict[str, float]
    params: dict[str, str]

    @classmethod
    def of(cls, run) -> CellRun:
        tags = run.data.tags
        seed = tags.get(vocabulary.TAG_SEED, "")
        return cls(
            run_id=run.info.run_id,
            cell_id=tags.get(vocabulary.TAG_CELL_ID, run.info.run_id),
            variant=tags.get(vocabulary.TAG_VARIANT, "?"),
            seed=int(seed) if seed.lstrip("-").isdigit() else seed,
            submission=tags.get(vocabulary.TAG_SUBMISSION, ""),
            state=vocabulary.cell_state(run),
            detail=tags.get(vocabulary.TAG_STATUS, ""),
            ray_node=tags.get(vocabulary.TAG_RAY_NODE, ""),
            start_time=run.info.start_time,
            end_time=run.info.end_time,
            metrics=dict(run.data.metrics),
            params=dict(run.data.params),
        )


@dataclass(frozen=True, kw_only=True)
class Registration:
    """A study's registration (version 0) or an amendment (1, 2, ...): the declaration that decides its verdicts,
    recorded before the cells it governs (``ablations.register``; ``record.spec.declaration``)."""

    version: int
    hash: str
    declaration: dict[str, Any]
    created: float  # seconds since the epoch, by the claims store's clock
    reason: str = ""  # an amendment's
    diff: str = ""  # from the version before
    changed: list[str] = field(default_factory=list)  # the declaration's keys that changed
    finished: dict[str, int] = field(default_factory=dict)  # variant -> its cells with a result when it was made
    code: str = ""  # the code fingerprint of the submission that made it
    git_commit: str = ""  # the study file's commit, where it had one

    @property
    def verified(self) -> bool:
        """Whether the declaration still has the hash recorded with it (else it was edited: not trusted)."""
        return digest(self.declaration) == self.hash

    @property
    def after_results(self) -> bool:
        return any(n > 0 for n in self.finished.values())

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Registration:
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)


def registrations(uri: str, study: str) -> list[Registration]:
    """A study's registration and amendments as its tracking store holds them, oldest first."""
    import json
    import tempfile

    c = vocabulary.client(uri)
    out = []
    # A mirror is finished only once its artifact is written: one another submission is still writing (or one
    # whose writer stopped half-way) is not read; the claims store holds the version, and _history mirrors it.
    for run in vocabulary.runs_in_status(uri, study, vocabulary.KIND_REGISTRATION, "FINISHED"):
        with tempfile.TemporaryDirectory(prefix="ablate-") as tmp:
            path = c.download_artifacts(run.info.run_id, vocabulary.REGISTRATION_ARTIFACT, tmp)
            with open(path) as f:
                out.append(Registration.from_json(json.load(f)))
    by_version: dict[int, Registration] = {}
    for r in out:  # two submissions that mirrored one version at once: the same record twice
        by_version.setdefault(r.version, r)
    return [by_version[v] for v in sorted(by_version)]


def recorded_plugins(uri: str, study: str) -> list[dict[str, Any]]:
    """The plugins the study's last submission loaded (their module, path and digest), as its parent run says; ``uri``
    a store that exists."""
    import json

    exp = vocabulary.client(uri).get_experiment_by_name(study)
    if exp is None:
        return []
    runs = vocabulary.search_all(uri, [exp.experiment_id], vocabulary.kind_filter(vocabulary.KIND_STUDY))
    last = max(runs, key=lambda r: r.info.start_time, default=None)
    return json.loads(last.data.tags.get(vocabulary.TAG_PLUGINS, "[]")) if last is not None else []


def submission_number(run) -> int:
    """A parent run's submission number (0 where none was recorded)."""
    return int(run.data.tags.get(vocabulary.TAG_SUBMISSION, 0))


__all__ = ["CellRun", "RecordedDesign", "Registration", "recorded_plugins", "registrations", "submission_number"]
