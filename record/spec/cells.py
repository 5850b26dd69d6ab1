"""A study's cells: each variant x seed resolved into a run (``Cell``), skipped by a constraint (``Skipped``), or
refused by the model with the fix (``Cells`` gathers them variant by variant)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from record.spec.common import Origin, settings_overrides, trial_overrides
from record.spec.errors import SpecError
from record.spec.overrides import apply_overrides
from record.spec.run import RunConfig, anchored_task, resolve_run
from record.spec.variants import base_errors, matches, variant_error


@dataclass(frozen=True)
class Cell:
    """One trial of a study: a variant, a seed, and the resolved run."""

    variant: str  # human readable: "norm=post warmup_steps=0", "baseline", or a variant's name
    settings: dict[str, Any]  # the axis values that define the variant
    seed: int
    run: RunConfig
    workers: int = 1  # data-parallel ranks, each loading a batch: the global batch is workers x batch_size

    @cached_property
    def cell_id(self) -> str:  # computed once: a corpus edited or removed mid-sweep does not move its cells
        return self.run.config_hash(workers=self.workers)


@dataclass(frozen=True)
class Skipped:
    variant: str
    seed: int
    reason: str


class Cells:
    """The cells of a study, variant by variant: those that resolve, those a constraint skips, and the mistakes of
    those the model refuses (every variant's at once, each with the fix). ``file`` is the study's checked
    ``StudyFile`` (record/spec/study.py, which imports this module), ``base`` its base run from ``base_origin``."""

    def __init__(self, file: Any, origin: Origin, base: dict[str, Any], base_origin: Origin) -> None:
        self.file, self.origin, self.base, self.base_origin = file, origin, base, base_origin
        self.cells: list[Cell] = []
        self.skipped: list[Skipped] = []
        self.invalid: list[SpecError] = []
        self.named: set[str] = set()  # the variants refused: names the analysis may still give
        self.seen: set[str] = set()
        self.in_base: set[str] | None = None
        self.every_trial = trial_overrides(file.resources, file.budget)

    @property
    def labels(self) -> set[str]:
        return {c.variant for c in self.cells}

    def add_variant(self, label: str, settings: dict[str, Any], where: Any, seeds: list[int]) -> None:
        file, origin = self.file, self.origin
        run_data = apply_overrides(self.base, settings_overrides({**settings, **self.every_trial}))
        run_data = anchored_task(run_data, Path(str(origin.source)).parent)  # a path an axis gives: the study's
        reason = None
        for i, c in enumerate(file.constraints):
            if matches(run_data, c.when):
                if c.action == "refuse":  # named beside the variants the model refuses
                    self.invalid.append(origin.error(("constraints", i), f"variant {label!r} is refused: {c.reason}"))
                    self.named.add(label)
                    return
                reason = c.reason
                break
        for seed in seeds:
            if reason is not None:
                self.skipped.append(Skipped(label, seed, reason))
            elif not self._add(label, settings, where, seed, run_data):
                return

    def _add(self, label: str, settings: dict[str, Any], where: Any, seed: int, run_data: dict[str, Any]) -> bool:
        """One cell; False when the variant is refused (its mistakes said once, not per seed)."""
        file, base = self.file, self.base
        if file.vary_data:  # the seed also draws the data: synthetic tasks regenerate (text refuses: split by position)
            run_data = apply_overrides(run_data, [(["task", "data_seed"], seed)])
        try:
            run = resolve_run({**run_data, "seed": seed, "name": file.name}, Origin(None))
        except SpecError as err:
            if file.skip_invalid:
                self.skipped.append(Skipped(label, seed, f"{err.key}: {err.message}"))
                return True
            if self.in_base is None:
                self.in_base = base_errors(apply_overrides(base, settings_overrides(self.every_trial)), seed, file.name)
            origins = (self.origin, self.base_origin)
            self.invalid += [variant_error(e, label, settings, where, *origins, self.in_base) for e in err.every()]
            self.named.add(label)
            return False
        cell = Cell(label, settings, seed, run, file.resources.workers)
        if cell.cell_id not in self.seen:  # a one_at_a_time value equal to the baseline's is one cell
            self.seen.add(cell.cell_id)
            self.cells.append(cell)
        return True
