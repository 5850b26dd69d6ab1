"""A study's results from MLflow, as a tidy table: one row per cell (variant x seed), nothing else read.

The conventions (record/vocabulary.py, DESIGN.md): one experiment per study; a parent run per submission
(tag ``kind=study``, the design as the artifact ``design.json``); a child run per attempt of a cell (tag
``kind=cell``, with ``variant``, ``seed``, ``cell_id`` and ``status_detail``; its settings from the design,
``record.recorded``). A cell's row
is its result run (finished or diverged) when it has one, else its latest attempt (failed, killed, ...).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import dataclass, field
from typing import Any

from record.recorded import CellRun, RecordedDesign, Registration, registrations, submission_number
from record.secrets import redact_url
from record.vocabulary import (
    AXIS_PREFIX,
    DESIGN_ARTIFACT,
    KIND_CELL,
    KIND_STUDY,
    TAG_SUBMISSION,
    client,
    counted_run,
    kind_filter,
    name_hint,
    same_code,
    search_all,
)

os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # no progress bars in reports


# what a cell's row keeps of its run's params (the flattened run configuration), as ``params.<key>``: the model's
# every field (variants that are one model family under two names, dashboards/caveats.py) and the task's
TASK_PARAMS = "task."
OUTPUT_CLASSES = "output_classes"  # the column of the classes a cell's loss is over (its task's declaration)
MODEL_PARAMS = "model."
PARAMS_PREFIX = "params."
OTHER_CODE = "other code"  # a cell's state when only other code than its study's latest submission trained it
NONFINITE = "nonfinite"  # a cell's column: the metrics its run logged as nan or infinite, comma-separated


class NoResults(LookupError):
    """The store holds nothing to compare for this study (a clear message, never an empty table)."""


@dataclass
class StudyRuns:
    """What a report needs: the design, the cells (a pandas DataFrame) and where they came from."""

    name: str
    uri: str
    experiment_id: str
    design: RecordedDesign  # what the latest submission recorded of the study
    cells: Any  # pandas.DataFrame, one row per cell
    parents: list[Any] = field(default_factory=list)  # submission runs, oldest first
    registrations: list[Registration] = field(default_factory=list)  # its registration and amendments, oldest first
    histories: dict[str, dict[str, list]] = field(default_factory=dict, repr=False)  # metric -> run -> points

    def history(self, key: str, run_ids: list[str]) -> dict[str, list[tuple[int, float, float]]]:
        """run_id -> [(step, value, seconds)] of one metric (``metric_history``), each run read once per study
        (the table's checks and the report's plots share them)."""
        cache = self.histories.setdefault(key, {})
        missing = [r for r in dict.fromkeys(run_ids) if r not in cache]
        if missing:
            cache.update(metric_history(self.uri, missing, key))
        return {r: cache[r] for r in run_ids}

    @property
    def variants(self) -> list[str]:
        """In the study's order (the baseline first), then variants only older submissions had."""
        order = list(self.design.variants)
        seen = list(dict.fromkeys(self.cells["variant"])) if len(self.cells) else []
        return order + [v for v in seen if v not in order]

    @property
    def baseline(self) -> str:
        return self.variants[0]

    @property
    def latest_parent(self):
        return self.parents[-1] if self.parents else None


def _design(uri: str, parents: list) -> RecordedDesign:
    """The latest submission's design.json; a submission recorded before it: its parent run's params."""
    c = client(uri)
    for parent in reversed(parents):
        with tempfile.TemporaryDirectory(prefix="ablate-") as tmp:  # MLflow's own default folder is never removed
            try:
                path = c.download_artifacts(parent.info.run_id, DESIGN_ARTIFACT, tmp)
            except Exception:  # an older submission without it
                continue
            with open(path) as f:
                return RecordedDesign.from_json(json.load(f))
    return RecordedDesign.from_params(parents[-1].data.params) if parents else RecordedDesign()


def load_runs(uri: str, study: str, *, submission: int | None = None) -> StudyRuns:
    """The cells of a study (all submissions, or one) from the MLflow store at ``uri``."""
    import pandas as pd

    c = client(uri)
    exp = c.get_experiment_by_name(study)
    if exp is None:  # the experiments a sweep made (not MLflow's Default, a search's or a single run's)
        experiments = {e.experiment_id: e.name for e in c.search_experiments()}
        made = {r.info.experiment_id for r in search_all(uri, list(experiments), kind_filter(KIND_STUDY))}
        names = sorted(experiments[i] for i in made)
        raise NoResults(
            f"no study {study!r} in {redact_url(uri)}{name_hint(study, names)}; studies there: {', '.join(names) or 'none'}"
        )
    parents = sorted(
        search_all(uri, [exp.experiment_id], kind_filter(KIND_STUDY)),
        key=submission_number,
    )
    filt = kind_filter(KIND_CELL, **({TAG_SUBMISSION: str(submission)} if submission is not None else {}))
    runs = sorted(search_all(uri, [exp.experiment_id], filt), key=lambda r: r.info.start_time)
    if not runs and submission is not None:  # the submissions there are, not "run ablate sweep"
        numbers = [str(submission_number(p)) for p in parents]
        there = f"its submissions: {', '.join(numbers)}" if numbers else "it has no submission yet"
        raise NoResults(f"submission {submission} of study {study!r} trained no cell in {redact_url(uri)}; {there}")
    if not runs:
        raise NoResults(f"study {study!r} has no cell runs in {redact_url(uri)} yet: run `ablate sweep` first")
    by_cell: dict[str, list] = {}
    for run in runs:
        by_cell.setdefault(CellRun.of(run).cell_id, []).append(run)
    design = _design(uri, parents)
    # whose results count: the latest submission's code (None: any code's, or an older record); NAME@N: the cells
    # that submission trained, whatever code trained them
    code = design.code if submission is None else None
    rows = []
    for cell_id, attempts in by_cell.items():
        own = [r for r in attempts if same_code(r, code)]
        if own:  # as the sweep takes it: the first result of that code, else its latest attempt
            rows.append(_row(cell_id, counted_run(own, code), own))
        else:  # trained only by other code (the code changed since): no outcome of this study's code yet (its
            # metrics are there, without values: a study no cell of which the new code has trained is a table of
            # cells without an outcome, not a metric "no run has")
            run = attempts[-1]
            rows.append(
                {
                    **_row(cell_id, run, own, metrics=False),
                    **dict.fromkeys(run.data.metrics, math.nan),
                    "state": OTHER_CODE,
                }
            )
    for row in rows:  # the latest design's name of each cell, whatever its runs were tagged
        row["variant"] = design.cells.get(row["cell_id"], row["variant"])
        # a cell's settings are recorded once, in the design (axes added after a cell ran are at the base's value)
        row.update({AXIS_PREFIX + k: v for k, v in design.axis_values(row["variant"]).items()})
    cells = pd.DataFrame(rows)
    return StudyRuns(study, uri, exp.experiment_id, design, cells, parents, registrations=registrations(uri, study))


def _row(cell_id: str, run, attempts: list, metrics: bool = True) -> dict[str, Any]:
    r = CellRun.of(run)
    row: dict[str, Any] = {
        "variant": r.variant,
        "seed": r.seed,
        "cell_id": cell_id,
        "state": r.state,
        "detail": r.detail,
        "attempts": len(attempts),
        "run_id": r.run_id,
        "submission": r.submission,
        "ray_node": r.ray_node,
        "start_time": r.start_time,
        "end_time": r.end_time,
        OUTPUT_CLASSES: r.output_classes,
    }
    row.update({PARAMS_PREFIX + k: v for k, v in r.params.items() if k.startswith((MODEL_PARAMS, TASK_PARAMS))})
    if metrics:
        row.update(r.metrics)
        row[NONFINITE] = ",".join(k for k, v in r.metrics.items() if not math.isfinite(v))
    return row


def output_classes(row: dict[str, Any]) -> int | None:
    """How many classes a cell's loss is over, as its task declared it with the run (``Task.output_classes``;
    ``record.recorded.legacy_output_classes`` for older runs): None where unknown."""
    n = row.get(OUTPUT_CLASSES)
    return int(n) if isinstance(n, int | float) and math.isfinite(n) and n >= 2 else None


def metric_history(uri: str, run_ids: list[str], key: str) -> dict[str, list[tuple[int, float, float]]]:
    """run_id -> [(step, value, seconds since the run's first point)] for one metric."""
    c = client(uri)
    out = {}
    for run_id in run_ids:
        points = sorted(c.get_metric_history(run_id, key), key=lambda m: (m.step, m.timestamp))
        t0 = points[0].timestamp if points else 0
        out[run_id] = [(m.step, m.value, (m.timestamp - t0) / 1000) for m in points if math.isfinite(m.value)]
    return out
