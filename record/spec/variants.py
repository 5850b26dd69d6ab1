"""A study's design (``Design``: a grid, one at a time, or named variants) expanded into variants: each
variant's label, its settings and where each setting is in the file; the constraints that match it; and the
mistakes the model finds in a variant, blamed on the line that caused them (the design's setting, or the base's
line, or the base itself when every variant has the mistake).

Imports no ray, mlflow or optuna.
"""

from __future__ import annotations

import itertools
from typing import Any

from pydantic import Field, field_validator, model_validator

from record.spec.common import KeyedError, Origin, Strict, short
from record.spec.errors import SpecError
from record.spec.run import resolve_run

DESIGNS = ("grid", "one_at_a_time", "variants")


class OneAtATime(Strict):
    baseline: dict[str, Any] = Field(default_factory=dict)
    axes: dict[str, list[Any]] = Field(min_length=1)

    @field_validator("axes")
    @classmethod
    def _values(cls, v):
        for key, values in v.items():
            if not values:
                raise KeyedError((key,), "must be a non-empty list of values")
        return v


class VariantItem(Strict):
    name: str = Field(min_length=1)
    set: dict[str, Any] = Field(default_factory=dict)


class Design(Strict):
    """Exactly one of: a full factorial ``grid``, ``one_at_a_time`` changes from a baseline, named ``variants``."""

    grid: dict[str, list[Any]] | None = None
    one_at_a_time: OneAtATime | None = None
    variants: list[VariantItem] | None = Field(None, min_length=1)

    @model_validator(mode="after")
    def _one(self) -> Design:
        given = [k for k in DESIGNS if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"needs exactly one of {', '.join(DESIGNS)} (got {len(given)})")
        if self.grid is not None:
            if not self.grid:
                raise KeyedError(("grid",), "is empty: name at least one axis with its values")
            for key, values in self.grid.items():
                if not values:
                    raise KeyedError(("grid", key), "must be a non-empty list of values")
        if self.variants is not None:
            names: set[str] = set()
            for i, v in enumerate(self.variants):
                if v.name in names:
                    raise KeyedError(("variants", i, "name"), f"{v.name!r} is used twice")
                names.add(v.name)
        return self

    @property
    def kind(self) -> str:
        return next(k for k in DESIGNS if getattr(self, k) is not None)


def label(settings: dict[str, Any]) -> str:
    return " ".join(f"{short(k)}={v}" for k, v in settings.items()) or "base"


def expand(design: Design) -> tuple[list[str], list[tuple[str, dict, dict]]]:
    """(axes, [(variant label, settings, where each setting is in the file (key None: the variant))])."""
    if design.grid is not None:
        axes = list(design.grid)
        out = []
        for combo in itertools.product(*(design.grid[k] for k in axes)):
            settings = dict(zip(axes, combo))
            where = {None: ("design", "grid"), **{k: ("design", "grid", k) for k in axes}}
            out.append((label(settings), settings, where))
        return axes, out
    if design.one_at_a_time is not None:
        body = design.one_at_a_time
        base_where = {k: ("design", "one_at_a_time", "baseline", k) for k in body.baseline}
        axes = list(body.axes)
        out = [("baseline", dict(body.baseline), {None: ("design", "one_at_a_time", "baseline"), **base_where})]
        for k in axes:
            for i, v in enumerate(body.axes[k]):
                settings = {**body.baseline, k: v}
                if settings != body.baseline:
                    path = ("design", "one_at_a_time", "axes", k, i)
                    out.append((f"{short(k)}={v}", settings, {**base_where, None: path, k: path}))
        return axes, out
    out, axes = [], []
    for i, item in enumerate(design.variants or []):
        for k in item.set:
            if k not in axes:
                axes.append(k)
        where = {None: ("design", "variants", i), **{k: ("design", "variants", i, "set", k) for k in item.set}}
        out.append((item.name, dict(item.set), where))
    return axes, out


def matches(run_data: dict[str, Any], when: dict[str, Any]) -> bool:
    for key, value in when.items():
        node: Any = run_data
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node != value:
            return False
    return True


def base_errors(base: dict[str, Any], seed: int, name: str) -> set[str]:
    """The mistakes of the base run itself: every variant that keeps the base's value has them."""
    try:
        resolve_run({**base, "seed": seed, "name": name}, Origin(None))
    except SpecError as err:
        return {str(e) for e in err.every()}
    return set()


def variant_error(
    err: SpecError, variant: str, settings: dict, where: dict, origin: Origin, base_origin: Origin, in_base: set[str]
) -> SpecError:
    """A variant the model refuses, blamed on the line that caused it: the design's setting of the key (or of
    another key the refusal reads, ``SpecError.involves``: n_heads beside the base's d_model), else the base's line
    of the key; a mistake of the base itself is the base's, with no variant to skip."""
    key = err.key or ""
    if key == "seed":  # every cell's seed is one of the study's seeds, whatever its base says
        return origin.error(("seeds",), err.message)
    named = [k for k in err.involves if k in settings]
    if key and key not in settings and not named and str(err) in in_base and base_origin.doc is not None:
        message, shown = err.message, None  # as ``ablate run`` names it
    else:  # the key the variant set, when the refusal names another (d_model beside the design's n_heads)
        said = key if key in settings or not named else named[0]
        message, shown = f"{said + ': ' if said else ''}{err.message}", f"variant {variant!r}"
        if key in settings or named or not key or base_origin.doc is None:
            path = where.get(key if key in settings else (named[0] if named else None), where[None])
            return origin.error(path, message, key=shown)
    blamed = base_origin.error(tuple(key.split(".")), message, key=shown)
    if blamed.source != origin.source:  # the base is another file: say which study it serves
        return SpecError(blamed.source, blamed.key, f"{message} (base of {origin.source})", blamed.line)
    return blamed


FIX = "(fix it, add a constraint that skips it, or set skip_invalid: true)"
