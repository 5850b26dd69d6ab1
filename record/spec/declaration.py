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

from record.spec.study import Study

# the keys of a declaration, in the order a reader compares them
KEYS = ("study", "metric", "direction", "design", "axes", "variants", "runs", "seeds", "budget", "vary_data")
KEYS += ("analysis", "tune")


def declaration(study: Study) -> dict[str, Any]:
    """The canonical declaration of ``study`` (as loaded, before any tuning): plain JSON values, sorted."""
    variants: dict[str, dict[str, str]] = {}
    runs: dict[str, str] = {}
    for cell in study.cells:
        if cell.variant not in variants:
            variants[cell.variant] = {k: str(v) for k, v in sorted(cell.settings.items())}
            runs[cell.variant] = _run_digest(cell.run.result_config())
    return {
        "study": study.name,
        "metric": study.metric,
        "direction": study.direction,
        "design": study.design,
        "axes": list(study.axes),
        "variants": variants,
        "runs": runs,
        "seeds": study.plan.as_dict() if study.plan else study.seeds,
        "budget": study.budget.as_dict(),
        "vary_data": study.vary_data,
        "analysis": study.analysis.model_dump(mode="json", exclude_defaults=True),
        "tune": study.tune.body if study.tune else None,
    }


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


__all__ = ["KEYS", "changed_keys", "declaration", "diff_text", "digest"]
