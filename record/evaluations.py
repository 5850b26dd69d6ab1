"""What the evaluation of trained models records for comparing to read (``ablate heads``): each finished cell's
scores with each attention head removed, and its pruning curves, as JSON artifacts of the cell's own run. The
running side evaluates (``ablations.evaluate``, ``ablations.pruning``) and writes them once; the comparing side
(``dashboards.heads``, ``dashboards.pruning``) reads them and judges."""

from __future__ import annotations

import json
import math
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from record import vocabulary
from record.runs import load_runs

Head = tuple[str, int]  # (attention module, head)


@dataclass(kw_only=True)
class HeadScores:
    """One trained model on ``metric`` with every head and with each head removed alone; for a loss, also each
    sequence's summed loss and scored tokens (with every head, and without each head), for the paired test."""

    metric: str
    full: float
    without: dict[Head, float]
    nll: list[float] | None = None
    weight: list[float] | None = None
    without_nll: dict[Head, list[float]] | None = None

    def to_json(self) -> dict[str, Any]:
        heads = lambda d: None if d is None else [[m, h, v] for (m, h), v in d.items()]  # noqa: E731
        return {**asdict(self), "without": heads(self.without), "without_nll": heads(self.without_nll)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> HeadScores:
        heads = lambda rows: None if rows is None else {(m, int(h)): v for m, h, v in rows}  # noqa: E731
        return cls(**{**data, "without": heads(data["without"]), "without_nll": heads(data.get("without_nll"))})


@dataclass(kw_only=True)
class ModelPruning:
    """One trained model: its pruning curves and its one-head-per-module changes."""

    variant: str
    seed: int
    run_id: str
    heads: int  # attention heads of the model
    fractions: list[float]
    by_importance: list[float]  # the metric after removing each fraction of heads, least important first
    at_random: list[float]  # the same, averaged over the random orders
    random_orders: list[list[float]] = field(default_factory=list)
    one_head: dict[str, float] = field(default_factory=dict)  # module -> change with only its best head kept
    one_head_kept: dict[str, int] = field(default_factory=dict)  # module -> the head kept (chosen on validation)
    full: float = math.nan  # the metric with every head

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ModelPruning:
        return cls(**data)


def lower_is_better(metric: str) -> bool:
    return metric.endswith(("loss", "ppl", "perplexity"))


def artifact(kind: str, metric: str) -> str:
    """Where a cell's run holds an evaluation: ``evaluation/heads-val_loss.json``, ``evaluation/pruning-...``."""
    return f"{vocabulary.EVALUATION_FOLDER}/{kind}-{metric.replace('/', '_')}.json"


def record(uri: str, run_id: str, kind: str, metric: str, result: dict[str, Any], code: str) -> None:
    """Keep ``result`` with the cell's run, with the fingerprint of the ``code`` that evaluated it."""
    vocabulary.client(uri).log_text(run_id, json.dumps({"code": code, "result": result}), artifact(kind, metric))


def recorded(uri: str, run_id: str, kind: str, metric: str, code: str | None = None) -> dict[str, Any] | None:
    """An evaluation the cell's run holds (evaluated by ``code``, when given), or None."""
    c = vocabulary.client(uri)
    name = artifact(kind, metric)
    if not any(f.path == name for f in c.list_artifacts(run_id, vocabulary.EVALUATION_FOLDER)):
        return None
    with tempfile.TemporaryDirectory(prefix="ablate-") as tmp:
        held = json.loads(Path(c.download_artifacts(run_id, name, tmp)).read_text())
    return held["result"] if code is None or held.get("code") == code else None


def finished_cells(uri: str, study: str) -> tuple[list[tuple[str, int, str]], str]:
    """([(variant, seed, run_id)] of every finished cell, by variant in the study's order then seed; the study's
    analysis.test)."""
    runs = load_runs(uri, study)
    done = runs.cells[runs.cells["state"] == "finished"]
    if not len(done):
        raise LookupError(f"study {study!r} has no finished cell to evaluate")
    order = {v: i for i, v in enumerate(runs.variants)}
    cells = sorted(zip(done["variant"], done["seed"], done["run_id"]), key=lambda c: (order.get(c[0], 0), int(c[1])))
    return [(v, int(seed), run_id) for v, seed, run_id in cells], runs.design.analysis.test


def recorded_cells(
    uri: str, study: str, kind: str, metric: str
) -> tuple[list[tuple[str, int, str, dict[str, Any]]], str]:
    """([(variant, seed, run_id, the evaluation its run recorded)] of every finished cell (``ablations.evaluate``),
    the study's analysis.test)."""
    cells, test = finished_cells(uri, study)
    out = []
    for variant, seed, run_id in cells:
        data = recorded(uri, run_id, kind, metric)
        if data is None:
            raise LookupError(
                f"run {run_id} ({variant}, seed {seed}) has no {kind} evaluation on {metric}: "
                f"`ablate heads {study}` evaluates it"
            )
        out.append((variant, seed, run_id, data))
    return out, test


__all__ = [
    "HeadScores",
    "ModelPruning",
    "artifact",
    "finished_cells",
    "lower_is_better",
    "record",
    "recorded",
    "recorded_cells",
]
