"""A study read back from what its report exported beside its table (``seeds.csv``: every cell's value and outcome;
``declaration.json``: the design, the analysis, the family, a seed plan's looks), without its store: so that a
committed table can be judged again under rules written after it (``docs/results/rejudge.py``). What the files do
not hold is not judged: the loss curves (no convergence check), the runs' output classes (no chance level or
ceiling but a loss's 0 and an accuracy's 0 and 1), the registrations (the exported exploratory marks are kept)."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

from record.recorded import RecordedDesign
from record.runs import StudyRuns
from record.spec.analysis import Analysis
from record.vocabulary import AXIS_PREFIX

# an exported outcome -> the state a store would hold (record.judge.outcome reads it back to the same outcome)
STATES = {"success": "finished", "not_learned": "finished", "diverged": "diverged", "killed": "killed",
          "failed": "failed", "pending": "running"}  # fmt: skip


def exported_runs(folder: Path) -> StudyRuns:
    """The study of ``folder`` as ``record.runs.load_runs`` would give it from its store, as far as the files go."""
    import pandas as pd

    declared = json.loads((folder / "declaration.json").read_text())
    with open(folder / "seeds.csv", newline="") as f:
        rows = [_cell(row, declared["metric"]) for row in csv.DictReader(f)]
    plan = dict(declared.get("plan") or {}) or None
    decides_on = plan.pop("decides_on", None) if plan else None  # a table of another metric than the plan's
    design = RecordedDesign(
        kind="grid" if declared.get("levels") else "variants",
        axes=list(declared.get("levels") or {}),
        metric=decides_on or declared["metric"],
        direction=declared["direction"],
        variants={v: declared.get("settings", {}).get(v, {}) for v in declared["variants"]},
        analysis=Analysis.model_validate(declared["analysis"]),
        plan=plan,
        source=f"ablations/studies/{declared['study']}.yaml",
    )
    cells = pd.DataFrame(rows)
    return StudyRuns(declared["study"], uri="", experiment_id="", design=design, cells=cells)


def exploratory_of(folder: Path) -> dict[str, str]:
    """The contrasts the export marked exploratory (added or changed after results), with why."""
    return dict(json.loads((folder / "declaration.json").read_text()).get("exploratory") or {})


def _cell(row: dict[str, str], metric: str) -> dict[str, Any]:
    value = float(row["value"]) if row.get("value") not in ("", None) else math.nan
    seed = int(row["seed"]) if row["seed"].lstrip("-").isdigit() else row["seed"]
    axes = {k: v for k, v in row.items() if k.startswith(AXIS_PREFIX)}
    return {"variant": row["variant"], "seed": seed, "cell_id": row["cell_id"], "run_id": row["cell_id"],
            "state": STATES.get(row["outcome"], "failed"), metric: value, "detail": row.get("detail", ""),
            **axes}  # fmt: skip
