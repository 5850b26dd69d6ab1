"""Tuned ablations: each variant's own search (the same space and budget for all), then its cells at its best
parameters."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any

from ablations.records import TUNED_SETTING
from ablations.search.driver import run_search
from ablations.spec import Cell, Study, load_search, resolve_run
from ablations.spec.run import apply_overrides


def tune_study(
    study: Study,
    *,
    uri: str,
    address: str | None,
    num_cpus: int | None,
    storage: str | None,
    out: Callable[[str], None] = print,
) -> Study:
    """Searches are Optuna studies named ``STUDY.tune.VARIANT``, tracked in the MLflow experiment ``STUDY.tuning``;
    they resume like any search, so a resubmitted study finds them done and gets the same cells (whose ids
    include the tuned values), trained exactly once."""
    best: dict[str, dict[str, Any]] = {}
    for variant in study.variants:
        cell = next(c for c in study.cells if c.variant == variant)
        base = cell.run.to_dict()
        base.pop("name", None)
        base.pop("seed", None)
        slug = re.sub(r"[^\w.\-]+", "_", variant).strip("_") or "variant"
        spec = load_search(study.source, {**study.tune, "name": f"{study.name}.tune.{slug}"}, base=base)
        out(
            f"tuning {variant!r}: {spec.n_trials} trial(s) of {', '.join(p.key for p in spec.space)} "
            f"({spec.sampler}, {spec.pruner} pruner) on {', '.join(m for m, _ in spec.objectives)}"
        )
        result = run_search(
            spec,
            address=address,
            tracking_uri=uri,
            storage=storage,
            num_cpus=num_cpus,
            experiment=f"{study.name}.tuning",
            out=lambda line: out("  " + line),
        )
        if not result.best:
            raise RuntimeError(f"tuning {variant!r} completed no trial; see the MLflow experiment {study.name}.tuning")
        best[variant] = result.best[0]["params"]
        shown = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in best[variant].items())
        out(f"  best for {variant!r}: {shown}")
    cells = []
    for cell in study.cells:
        data = cell.run.to_dict()
        tuned = apply_overrides(data, [(k.split("."), v) for k, v in best[cell.variant].items()])
        run = resolve_run(tuned, f"{study.source} (variant {cell.variant!r}, tuned)")
        settings = {**cell.settings, **{f"{TUNED_SETTING}{k}": v for k, v in best[cell.variant].items()}}
        cells.append(Cell(cell.variant, settings, cell.seed, run))
    return dataclasses.replace(study, cells=cells)
