"""Tuned ablations: each variant's own search (the same space and budget for all), then its cells at its best
parameters."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any

from ablations.search.driver import run_search
from record.spec import Cell, SearchSpec, Study, resolve_run
from record.spec.overrides import apply_overrides
from record.spec.tuning import Tuning
from record.vocabulary import TUNED_SETTING


def tune_study(
    study: Study,
    *,
    uri: str,
    address: str | None,
    num_cpus: int | None,
    storage: str | None,
    out: Callable[[str], None] = print,
) -> Study:
    """Searches are Optuna studies named ``STUDY.tune.VARIANT.seedN``, tracked in the MLflow experiment
    ``STUDY.tuning``; they resume like any search, so a resubmitted study finds them done and gets the same cells
    (whose ids include the tuned values), trained exactly once. N is the tuning seed: a study given more seeds tunes
    again on its new tuning seed (its old one may now be a cell's: named without it, the old searches were reused).

    The searches train on a seed none of the study's cells uses (``tuning_seed``): the value chosen on a seed
    is not then judged on that seed. Each chosen value's position in its range is reported; a value at the
    edge of its range means the optimum may lie outside it."""
    best: dict[str, dict[str, Any]] = {}
    tuning: dict[str, dict[str, Any]] = {}
    for variant, spec in variant_searches(study):
        out(describe(variant, spec))
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
        tuning[variant] = positions(spec, best[variant])
        out(f"  best for {variant!r} (tuned on {tuned_on(study)}): {shown(best[variant], tuning[variant])}")
    return tuned_study(study, best, tuning)


def variant_searches(study: Study) -> list[tuple[str, SearchSpec]]:
    """Each variant's search: the study's ``tune:`` section over the variant's run, on the tuning seed."""
    seed = tuning_seed(study)
    searches = []
    for variant in study.variants:
        cell = next(c for c in study.cells if c.variant == variant)
        base = cell.run.to_dict()
        base.pop("name", None)
        base["seed"] = seed
        if study.vary_data:
            base["task"] = {**base["task"], "data_seed": seed}
        slug = re.sub(r"[^\w.\-]+", "_", variant).strip("_") or "variant"
        searches.append((variant, study.tune.spec(study.source, f"{study.name}.tune.{slug}.{seeds_slug(study)}", base)))
    return searches


def seeds_slug(study: Study) -> str:
    """The tuning seeds in a search's name: ``seedN``, or ``seedsN-M`` when each trial trains several."""
    seed, k = tuning_seed(study), study.tune.seeds_per_trial
    return f"seed{seed}" if k == 1 else f"seeds{seed}-{seed + k - 1}"


def tuned_on(study: Study) -> str:
    """The tuning seeds, as said beside each variant's best values."""
    seed, k = tuning_seed(study), study.tune.seeds_per_trial
    return f"seed {seed}" if k == 1 else f"seeds {seed}-{seed + k - 1}, the mean of {k} per trial"


def positions(spec: SearchSpec, best: dict[str, Any]) -> dict[str, Any]:
    """Where each chosen value lies in its range (``position``)."""
    return {p.key: position(p, best[p.key]) for p in spec.space if p.key in best}


def describe(variant: str, spec: SearchSpec) -> str:
    return (
        f"tuning {variant!r}: {spec.n_trials} trial(s) of {', '.join(p.key for p in spec.space)} "
        f"({spec.sampler}, {spec.pruner} pruner) on {', '.join(m for m, _ in spec.objectives)}"
        + (f", the mean of {spec.seeds_per_trial} seeds per trial" if spec.seeds_per_trial > 1 else "")
    )


def shown(best: dict[str, Any], tuning: dict[str, Any]) -> str:
    return ", ".join(
        (f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}") + _where(tuning.get(k)) for k, v in best.items()
    )


def tuned_study(study: Study, best: dict[str, dict[str, Any]], tuning: dict[str, dict[str, Any]]) -> Study:
    """The study's cells at each variant's best values (their ids include them)."""
    cells = []
    for cell in study.cells:
        data = cell.run.to_dict()
        tuned = apply_overrides(data, [(k.split("."), v) for k, v in best[cell.variant].items()])
        run = resolve_run(tuned, f"{study.source} (variant {cell.variant!r}, tuned)")
        settings = {**cell.settings, **{f"{TUNED_SETTING}{k}": v for k, v in best[cell.variant].items()}}
        cells.append(Cell(cell.variant, settings, cell.seed, run, cell.workers))
    tuned = Tuning(tuning_seed(study), tuning, study.tune.seeds_per_trial)
    return dataclasses.replace(study, cells=cells, tuning=tuned)


def preview_tuning(
    study: Study, storage: str | None, out: Callable[[str], None] = print
) -> tuple[Study | None, list[str]]:
    """A tuned study's dry run: each variant's search as its storage holds it (read only). The study at the best
    values where every search has asked all its trials (its cells, and which are done, are then known), else
    None: a cell's id includes its tuned values. With it, what would stop a variant's search (said, and returned)."""
    from ablations.search.preview import finished_best, storage_state
    from ablations.search.setup import storage_url

    best: dict[str, dict[str, Any]] = {}
    tuning: dict[str, dict[str, Any]] = {}
    problems: list[str] = []
    for variant, spec in variant_searches(study):
        url = storage_url(spec, storage)
        line, problem = storage_state(spec, url)
        out(describe(variant, spec))
        for said in (line, problem and f"it would stop: {problem}"):
            if said:
                out(f"  {said}")
        if problem:
            problems.append(f"variant {variant!r}'s search: {problem}")
        found = None if problem else finished_best(spec, url)
        if found is not None:
            best[variant] = found
            tuning[variant] = positions(spec, found)
            out(f"  best for {variant!r} (tuned on {tuned_on(study)}): {shown(found, tuning[variant])}")
    return (tuned_study(study, best, tuning) if len(best) == len(study.variants) else None), problems


EDGE = 0.05  # a chosen value within 5% of either end of its range is "at the edge"


def tuning_seed(study: Study) -> int:
    """A seed none of the study's cells trains with (and, with ``seeds_per_trial``, the seeds after it)."""
    return max(study.seeds) + 1


def position(p, value: Any) -> dict[str, Any]:
    """Where ``value`` lies in the range of parameter ``p``: 0 at low, 1 at high (on the log scale for a log
    range), and whether that is at an edge: within EDGE of an end, or the lowest or highest value the search can
    propose (with a step that does not divide the range, below ``high``: 150 of 0-200 in steps of 75 was "at 75%
    of its range", not at its edge). Categorical parameters have no position."""
    import math

    if p.type == "categorical":
        return {"value": value}
    lo, hi, v = float(p.low), float(p.high), float(value)
    frac = (math.log(v) - math.log(lo)) / (math.log(hi) - math.log(lo)) if p.log else (v - lo) / (hi - lo)
    step = p.step if p.step is not None else (1 if p.type == "int" and not p.log else None)
    top = lo + math.floor((hi - lo) / step + 1e-9) * step if step else hi  # the highest value it can propose
    tol = 1e-9 * max(1.0, abs(top))
    edge = "low" if frac <= EDGE or v <= lo + tol else "high" if frac >= 1 - EDGE or v >= top - tol else None
    return {"value": value, "low": lo, "high": hi, "log": p.log, "position": round(frac, 4), "edge": edge}


def _where(pos: dict[str, Any] | None) -> str:
    if not pos or "position" not in pos:
        return ""
    note = f" (at {pos['position']:.0%} of its {'log ' if pos['log'] else ''}range"
    if pos["edge"]:
        beyond = "below" if pos["edge"] == "low" else "above"
        note += f": at the {pos['edge']} edge, the optimum may lie {beyond} it; widen the range"
    return note + ")"
