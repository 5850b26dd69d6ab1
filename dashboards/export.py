"""Every seed's value, exported beside each table: ``seeds.csv`` (one row per cell: variant, seed, cell id, outcome and
why, the metric as logged, the value it entered the comparisons with) and ``declaration.json`` (what the table was
analysed under: metric, direction, baseline, the analysis, the family and the exploratory contrasts, the grid's
levels, the registration, a seed plan and its looks). docs/results/recompute.py recomputes every p-value and interval of the table's
``contrasts.csv`` from these two files alone, with numpy and scipy."""

from __future__ import annotations

import json
from pathlib import Path

from dashboards.render import records_csv
from dashboards.table import Table
from record.recorded import AnalysedUnder, RegistrationRef
from record.vocabulary import AXIS_PREFIX

SEED_FIELDS = ("variant", "seed", "cell_id", "outcome", "detail", "value", "rule_value", "imputed")


def analysed_under(t: Table) -> AnalysedUnder:
    """What ``t`` was analysed under, as a script needs it (``record.recorded.AnalysedUnder``)."""
    latest = t.registrations[-1] if t.registrations else None
    return AnalysedUnder(
        study=t.study,
        metric=t.metric,
        direction=t.direction,
        baseline=t.baseline,
        variants=[r.variant for r in t.rows],
        analysis=t.analysis,
        family=[c.label for c in t.family],
        exploratory={c.label: c.exploratory for c in t.exploratory},
        levels=t.levels,
        settings=_settings(t),
        registration=None if latest is None else RegistrationRef(version=latest.version, hash=latest.hash),
        plan=t.plan,
        looks=t.looks,
    )


def _settings(t: Table) -> dict[str, dict[str, str]]:
    """Each variant's levels of the grid's axes (what a factorial effect groups its cells by)."""
    out: dict[str, dict[str, str]] = {}
    for r in t.seeds:
        out.setdefault(r["variant"], {a: str(r.get(f"{AXIS_PREFIX}{a}")) for a in t.levels})
    return out


def write(t: Table, folder: Path) -> dict[str, Path]:
    """seeds.csv and declaration.json in ``folder``."""
    seeds, decl = folder / "seeds.csv", folder / "declaration.json"
    axes = [f"{AXIS_PREFIX}{a}" for a in t.levels]
    rows = [{k: ("" if r.get(k) is None else r.get(k)) for k in (*SEED_FIELDS, *axes)} for r in t.seeds]
    seeds.write_text(records_csv(rows) if rows else ",".join(SEED_FIELDS) + "\n")
    decl.write_text(json.dumps(analysed_under(t).to_json(), indent=1) + "\n")
    return {"seeds": seeds, "declaration": decl}


__all__ = ["SEED_FIELDS", "analysed_under", "write"]
