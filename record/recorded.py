"""What a submission records of its study (design.json) and what a cell's run records, read back as typed values:
the one place that says how each is written and read. A cell's settings are recorded once, in the design (each
variant's settings, each cell's variant); its run holds its whole configuration as params for MLflow's UI, and the
tags of the vocabulary (``record.vocabulary``). The sweep writes these records, the report reads them back."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_serializer, model_validator

from record import vocabulary
from record.spec import Study
from record.spec.analysis import Analysis, from_design
from record.spec.decides import BY_ITS_FIELDS, EVERY, ITS_OWN, NONE, decides
from record.spec.declaration import digest
from record.spec.seedplan import SeedPlan

Setting = str | int | float | bool | None  # a design value: the sweep writes strings, older sweeps wrote some as given
ANALYSED_SCHEMA = 1  # declaration.json's version
SCHEMA = 2  # design.json's version; 1: every design.json written before it said its version (read the same way)


class RecordedDesign(BaseModel):
    """A submission's design.json: what the report needs to know about the study, as that submission ran it. Its
    JSON is this record's own serialisation (``to_json``); every version of it is read through one adapter
    (``_any_version``). Each field says whether it decides verdicts (``record.spec.decides``)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    schema_: int = Field(SCHEMA, alias="schema", json_schema_extra=decides(NONE))
    kind: str = Field("", json_schema_extra=decides(EVERY))  # the design: grid, one_at_a_time, list
    axes: list[str] = Field(default_factory=list, json_schema_extra=decides(EVERY))
    metric: str = Field("final/val_loss", json_schema_extra=decides(EVERY))
    direction: str = Field("minimize", json_schema_extra=decides(EVERY))
    # name -> the settings that define it
    variants: dict[str, dict[str, Setting]] = Field(default_factory=dict, json_schema_extra=decides(ITS_OWN))
    # cell id -> variant (its name in this design); a cell keeps its id when the design grows (a new axis at the
    # base's value), but its label changes
    cells: dict[str, str] = Field(default_factory=dict, json_schema_extra=decides(ITS_OWN))
    seeds: list[int] = Field(default_factory=list, json_schema_extra=decides(EVERY))
    skipped: list[dict[str, Any]] = Field(default_factory=list, json_schema_extra=decides(NONE))
    analysis: Analysis = Field(default_factory=Analysis, json_schema_extra=decides(BY_ITS_FIELDS))
    # whose results count: the code's fingerprint (None: any code's)
    code: str | None = Field(None, json_schema_extra=decides(EVERY))
    vary_data: bool = Field(False, json_schema_extra=decides(EVERY))
    tuning: dict[str, Any] = Field(default_factory=dict, json_schema_extra=decides(EVERY))
    # the study file (the report's next steps are commands on it)
    source: str = Field("", json_schema_extra=decides(NONE))
    budget: dict[str, Any] = Field(default_factory=dict, json_schema_extra=decides(EVERY))
    # the version of the study's registration this submission ran under
    registration: int | None = Field(None, json_schema_extra=decides(NONE))
    plan: SeedPlan | None = Field(None, json_schema_extra=decides(EVERY))

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
            plan=study.plan,
        )

    @model_validator(mode="before")
    @classmethod
    def _any_version(cls, data: Any) -> Any:
        """design.json as any version of the sweep wrote it: the variants as a list of {name, settings}, the
        analysis with its defaults left out; keys it lacks take their defaults, nulls where a mapping belongs too."""
        if not isinstance(data, dict):
            return data
        if int(data.get("schema", 1)) > SCHEMA:
            raise ValueError(
                f"design.json of version {data['schema']} is newer than this code reads (up to {SCHEMA}): "
                "update this installation to report on it"
            )
        data = {k: v for k, v in data.items() if v is not None or k in ("code", "registration", "plan")}
        if isinstance(data.get("variants"), list):
            data["variants"] = {v["name"]: dict(v.get("settings", {})) for v in data["variants"]}
        if "analysis" in data and not isinstance(data["analysis"], Analysis):
            data["analysis"] = from_design(data)
        return data

    @field_serializer("variants")
    def _variants_listed(self, variants: dict[str, dict[str, Setting]]) -> list[dict[str, Any]]:
        return [{"name": v, "settings": s} for v, s in variants.items()]

    @field_serializer("analysis")
    def _analysis_declared(self, analysis: Analysis) -> dict[str, Any]:
        return analysis.model_dump(mode="json", exclude_defaults=True)

    def to_json(self) -> dict[str, Any]:
        return {**self.model_dump(mode="json", by_alias=True), "schema": SCHEMA}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RecordedDesign:
        """A design.json of any version (one without a version is of version 1)."""
        return cls.model_validate({"schema": 1, **data})

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


class LookRecord(BaseModel):
    """A look of a seed plan as declaration.json records it: the seeds each variant had, the alpha spent, the
    contrasts it left open, those the miniature cannot test, and those whose margin cannot show equivalence
    there (open unless their difference is decided)."""

    seeds: dict[str, int]
    alpha: float
    open: list[str]
    not_testable: list[str]
    no_equivalence: list[str] = Field(default_factory=list)


class PlanRecord(SeedPlan):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    decides_on: str | None = None  # a table of another metric: the metric the plan's looks decide on


class RegistrationRef(BaseModel):
    version: int
    hash: str


class AnalysedUnder(BaseModel):
    """declaration.json: what a table was analysed under, its own serialisation (``to_json``), versioned; what
    docs/results/recompute.py recomputes every number of the table from, with the per-seed values of seeds.csv."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_: int = Field(ANALYSED_SCHEMA, alias="schema")
    study: str
    metric: str
    direction: str
    baseline: str
    variants: list[str]
    analysis: Analysis
    family: list[str]  # the confirmatory family's labels
    exploratory: dict[str, str]  # label -> why it is outside the family
    levels: dict[str, list[str]]  # a grid's axes and their levels
    settings: dict[str, dict[str, str]]  # variant -> its levels of the grid's axes
    registration: RegistrationRef | None
    plan: PlanRecord | None  # a seed plan's looks, replayed by recompute.py: what was trained when, what stayed open
    looks: list[LookRecord]

    @field_serializer("plan")
    def _plan_as_declared(self, plan: PlanRecord | None) -> dict[str, Any] | None:
        return None if plan is None else plan.model_dump(mode="json", exclude_none=True)  # decides_on where given

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude_none=False)


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
    output_classes: int | None = None  # the classes its loss is over, as its task declared (None: unknown)

    @classmethod
    def of(cls, run) -> CellRun:
        tags = run.data.tags
        seed = tags.get(vocabulary.TAG_SEED, "")
        declared = tags.get(vocabulary.TAG_OUTPUT_CLASSES)
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
            output_classes=(int(declared) if declared else None)
            if declared is not None
            else legacy_output_classes(run.data.params),
        )


# --- runs recorded before their task declared its classes (the scoring.classes tag) ---------------------------

NEVER_TARGETS = 3  # padding, the start and the separator: what no sequence-to-sequence target holds
ANSWER_CHOICES = {"recall": "values", "retrieval": "symbols"}  # the task param that counted an answer's tokens


def legacy_output_classes(params: dict[str, str]) -> int | None:
    """What ``models.tasks.Task.output_classes`` declares, worked out from an older run's params as the report did
    before runs recorded it (the one adapter for those stores; a new task needs no entry here)."""

    def count(key: str) -> int | None:
        try:
            n = int(str(params.get(key)))
        except ValueError:
            return None
        return n if n >= 2 else None

    arch = str(params.get("model.arch", ""))
    if arch == "encoder":
        return None if str(params.get("model.classifier")) == "token" else count("model.n_classes")
    if arch == "encoder_decoder":
        vocabulary_size = count("model.tgt_vocab_size") or count("model.vocab_size")
        return None if vocabulary_size is None else max(2, vocabulary_size - NEVER_TARGETS)
    if arch != "decoder":
        return None
    task = str(params.get("task.name", ""))
    if task not in ANSWER_CHOICES:
        return count("model.vocab_size")
    from models.tasks import TASKS  # a run file that left the count out took the task's default

    key = ANSWER_CHOICES[task]
    given = params.get(f"task.{key}")
    return count(f"task.{key}") if given is not None else getattr(TASKS[task].Params(), key)


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


__all__ = [
    "CellRun",
    "legacy_output_classes",
    "RecordedDesign",
    "Registration",
    "recorded_plugins",
    "registrations",
    "submission_number",
]
