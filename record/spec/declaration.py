"""What decides a study's verdicts, in one canonical form: the declaration a study registers before its first cell
(``ablations.register``), whose hash a later submission compares with its own. Changes that cannot move a verdict
(the description, resources, concurrency, retries, the tracking address) are not in it; everything else is: the
design and the runs it expands to (base, model, training and budget), the seeds, the metric and its direction,
the analysis (contrasts, margins, expected effects, convergence criterion, ...), the tuning."""

from __future__ import annotations

import difflib
import hashlib
import json
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

from record.spec.decides import BY_ITS_FIELDS, EVERY, ITS_OWN, NONE, decides
from record.spec.seedplan import SeedPlan
from record.spec.study import Study


class Declaration(BaseModel):
    """A study's declaration, typed: each field says whether it decides verdicts (``record.spec.decides``); its
    JSON (``as_json``) is what a registration records and hashes, so its fields and their spelling stay as they
    were first registered (a new field would change every registered hash)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    study: str = Field(json_schema_extra=decides(NONE))
    metric: str = Field(json_schema_extra=decides(EVERY))
    direction: str = Field(json_schema_extra=decides(EVERY))
    design: str = Field(json_schema_extra=decides(EVERY))
    axes: list[str] = Field(json_schema_extra=decides(EVERY))
    variants: dict[str, dict[str, str]] = Field(json_schema_extra=decides(ITS_OWN))  # name -> its settings
    runs: dict[str, str] = Field(json_schema_extra=decides(ITS_OWN))  # name -> the digest of what it trains
    seeds: list[int] | SeedPlan = Field(json_schema_extra=decides(EVERY))
    budget: dict[str, Any] = Field(json_schema_extra=decides(EVERY))
    vary_data: bool = Field(json_schema_extra=decides(EVERY))
    # the analysis section as declared (its defaults left out); each of its keys has its own mark (``Analysis``)
    analysis: dict[str, Any] = Field(json_schema_extra=decides(BY_ITS_FIELDS))
    tune: dict[str, Any] | None = Field(json_schema_extra=decides(EVERY))

    @classmethod
    def of(cls, study: Study) -> Declaration:
        """The declaration of ``study`` (as loaded, before any tuning)."""
        variants: dict[str, dict[str, str]] = {}
        runs: dict[str, str] = {}
        for cell in study.cells:
            if cell.variant not in variants:
                variants[cell.variant] = {k: str(v) for k, v in sorted(cell.settings.items())}
                runs[cell.variant] = _run_digest(cell.run.result_config())
        return cls(
            study=study.name,
            metric=study.metric,
            direction=study.direction,
            design=study.design,
            axes=list(study.axes),
            variants=variants,
            runs=runs,
            seeds=study.plan or study.seeds,
            budget=study.budget.as_dict(),
            vary_data=study.vary_data,
            analysis=study.analysis.model_dump(mode="json", exclude_defaults=True),
            tune=study.tune.body if study.tune else None,
        )

    def as_json(self) -> dict[str, Any]:
        # python mode: ``digest``'s json.dumps spells an infinite budget and any other value as it always did
        return self.model_dump()


# the keys of a declaration, in the order a reader compares them
KEYS = tuple(Declaration.model_fields)


def declaration(study: Study) -> dict[str, Any]:
    """The canonical declaration of ``study`` (as loaded, before any tuning): plain JSON values."""
    return Declaration.of(study).as_json()


def _run_digest(config: dict[str, Any]) -> str:
    """What a variant trains, whatever seed: its run's result-deciding configuration without the seed (and the data
    seed a study's ``vary_data`` draws from it)."""
    config = {k: v for k, v in config.items() if k != "seed"}
    config["task"] = {k: v for k, v in config["task"].items() if k != "data_seed"}
    return digest(config)


def digest(data: Any) -> str:
    """A stable hash of JSON-able data (sorted keys)."""
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


def changed_keys(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """The keys whose values differ (``analysis.margins`` within the analysis)."""
    out = []
    for key in KEYS:
        a, b = old.get(key), new.get(key)
        if key == "analysis" and isinstance(a, dict) and isinstance(b, dict):
            out += [f"analysis.{k}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
        elif a != b:
            out.append(key)
    return out


def diff_text(old: dict[str, Any], new: dict[str, Any]) -> str:
    """A readable diff of two declarations (YAML, the registered one first)."""
    dump = lambda d: yaml.safe_dump({k: d.get(k) for k in KEYS}, sort_keys=False, width=100).splitlines()  # noqa: E731
    lines = difflib.unified_diff(dump(old), dump(new), "registered", "this submission", lineterm="", n=1)
    return "\n".join(lines)


__all__ = ["KEYS", "Declaration", "changed_keys", "declaration", "diff_text", "digest"]
