"""A study's ``tune:`` section: the search every variant gets before its seeds run (``Tune``), its mistakes, and
what the searches chose (``Tuning``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from record.spec.common import Budget, Origin, Resources
from record.spec.errors import SpecError
from record.spec.search import SearchSpec, load_search


@dataclass(frozen=True)
class Tune:
    """A study's ``tune:`` section, checked with its base: the search every variant gets before its seeds run,
    with the study's resources and budget where the section gives none."""

    body: dict[str, Any]  # the search file's keys but its name

    def spec(self, source: str, name: str, base: dict[str, Any]) -> SearchSpec:
        """The search of one variant (its base) under ``name``."""
        return load_search(source, {**self.body, "name": name}, base=base)

    @property
    def seeds_per_trial(self) -> int:
        """Seeds each trial trains (the tuning seed and the next ones), its objective their mean."""
        return int(self.body.get("seeds_per_trial", 1))


@dataclass(frozen=True)
class Tuning:
    """What a tuned study's searches chose: the tuning seed, and each variant's chosen values' place in their
    ranges (variant -> key -> position)."""

    seed: int
    variants: dict[str, dict[str, Any]]
    seeds_per_trial: int = 1  # the tuning seeds: seed and the next ones, each trial their mean

    def as_dict(self) -> dict[str, Any]:
        several = {"seeds_per_trial": self.seeds_per_trial} if self.seeds_per_trial > 1 else {}
        return {"seed": self.seed, **several, "variants": self.variants}


def tune_errors(origin: Origin, data: dict[str, Any], base: dict[str, Any], axes: set[str]) -> list[SpecError]:
    """The ``tune:`` section's mistakes, all at once and beside the file's others: the keys the study sets, the
    keys the design fixes, and the search's own (checked with the base; each variant's again with its settings)."""
    tune = data.get("tune")
    if not isinstance(tune, dict):
        return []  # absent, or not a mapping (the file's schema says so)
    set_here = ("name", "base", "storage")
    errors = [
        origin.error(("tune", k), "is set by the study (each variant gets its own search); remove it")
        for k in set_here
        if k in tune
    ]
    if isinstance(tune.get("objectives"), list) and len(tune["objectives"]) > 1:
        errors.append(
            origin.error(
                ("tune", "objectives"),
                "a tuned study runs each variant at one best value, and several objectives have a Pareto front of "
                "them (the first was taken): give one objective (`ablate search` explores the front)",
            )
        )
    space = tune.get("space") if isinstance(tune.get("space"), dict) else {}
    errors += [
        origin.error(("tune", "space", k), "is also an axis of the design: a variant cannot both fix it and tune it")
        for k in space
        if k in axes
    ]
    search = {k: v for k, v in tune.items() if k not in set_here}
    try:
        load_search(origin.under("tune"), {**search, "name": "tune"}, base=base)  # the study's name is judged apart
    except SpecError as err:
        errors += err.every()
    return errors


def parse_tune(
    origin: Origin,
    name: str,
    section: dict[str, Any] | None,
    resources: Resources,
    budget: Budget,
    base: dict[str, Any],
) -> Tune | None:
    """A study's ``tune:`` section (checked by ``tune_errors``): the search every variant gets, with the study's
    resources and budget, before its seeds run."""
    if section is None:
        return None
    tune = dict(section)
    tune.setdefault("resources", resources.model_dump(include={"cpus", "gpus", "gpu_memory_gb"}, exclude_none=True))
    tune.setdefault("budget", budget.as_dict())
    load_search(origin.under("tune"), {**tune, "name": f"{name}.tune"}, base=base)
    return Tune(tune)
