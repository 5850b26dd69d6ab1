"""What the run, study and search files share: where a value came from (file, line, --set), the translation of
pydantic's errors into one line a person can act on, resources and budgets per trial, and the dotted keys a
design or a search may set.

Imports no ray, mlflow or optuna.
"""

from __future__ import annotations

import re
import typing
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from models.errors import did_you_mean
from record.spec.errors import (
    MAX_FOUND,
    NOT_TEXT,
    SpecError,
    closest,
    dotted,
    found,
    more,
    suggest,
    unknown_key_message,
    yaml_word,
)
from record.spec.yamlfile import Document

NAME = re.compile(r"[\w.\-]+")


class Strict(BaseModel):
    """Every file section: unknown keys are errors, types are not coerced ("3" is not 3, true is not 1)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


# --- where a value came from -----------------------------------------------------------------------------


@dataclass
class Origin:
    """The file a configuration came from (with the line of every key) and the keys ``--set`` overrode.

    ``prefix`` is where this data sits in the file (a study's inline base run sits under ``base``)."""

    source: str | None
    doc: Document | None = None
    overrides: dict[tuple, str] = field(default_factory=dict)  # key path -> "--set model.n_heads=3"
    prefix: tuple = ()
    label: str = ""  # what the data is, when it is not the file itself: "variant 'post'"

    @classmethod
    def of(cls, source: str | Origin | None) -> Origin:
        return source if isinstance(source, Origin) else cls(source)

    def under(self, *path: Any, label: str | None = None) -> Origin:
        return Origin(
            self.source, self.doc, self.overrides, (*self.prefix, *path), self.label if label is None else label
        )

    def _in_file(self, path: tuple) -> Any:
        """What the file itself holds at ``path`` (None if nothing)."""
        node: Any = self.doc.data if self.doc is not None else None
        for part in (*self.prefix, *path):
            node = node.get(part) if isinstance(node, dict) else None
        return node

    def _mapping_at(self, path: tuple) -> bool:
        """Whether the file itself holds a mapping at ``path`` (a section; not a value an override made one)."""
        return isinstance(self._in_file(path), dict)

    def error(
        self, path: Sequence[Any], message: str, *, key: str | None = None, involves: Sequence[tuple] = ()
    ) -> SpecError:
        """A SpecError at ``path`` (relative to this data): its key, its line, and ``--set`` if overridden there or
        at one of the other keys the refusal reads (``involves``: paths relative to this data, the model's
        ``ConfigError.fields``)."""
        path = tuple(path)
        keys = tuple(dotted((*self.prefix, *p)) for p in involves)
        for n in range(len(path), 0, -1):
            if path[:n] in self.overrides:
                return SpecError("--set", self.overrides[path[:n]], message, involves=keys)
        for over, item in self.overrides.items():  # --set model.n_heads.x=1 (or name.x=1) made it a mapping
            if over[: len(path)] == path and len(over) > len(path) and (len(path) > 1 or not self._mapping_at(path)):
                return SpecError("--set", item, message, involves=keys)
        for other in map(tuple, involves):  # the refusal read a value --set gave (n_heads=3 beside the file's d_model)
            if other in self.overrides:
                return SpecError("--set", self.overrides[other], message, involves=keys)
        full = (*self.prefix, *path)
        line = self.doc.line(full) if self.doc is not None else None
        shown = key if key is not None else dotted(full)
        if self.label:
            shown = f"{self.label}: {shown}" if shown else self.label
        return SpecError(self.source, shown or None, message, line, involves=keys)


# --- pydantic errors -> one line -------------------------------------------------------------------------

_KINDS = {"int_type": "an integer", "float_type": "a number", "bool_type": "true or false", "string_type": "text"}


def _message(e: dict[str, Any], valid: Iterable[str], section: str, fields: Sequence[str] = ()) -> str:
    kind, value, ctx = e["type"], e.get("input"), e.get("ctx") or {}
    shown = yaml_word(value) if value is None or isinstance(value, bool) else repr(value)  # null, as the file says
    if kind == "extra_forbidden":  # ``fields``: the keys the mapping that holds it may have
        here = [f"{section}.{f}" if section else f for f in fields if f != "key"]
        return unknown_key_message(str(e["loc"][-1]), [*valid, *here], section)
    if kind == "missing":
        return "is required"
    if kind in _KINDS:
        return f"{shown} must be {_KINDS[kind]}"
    if kind in ("int_from_float", "int_parsing"):
        return f"{shown} must be an integer"
    if kind in ("dict_type", "model_type", "model_attributes_type"):
        return f"must be a mapping of keys to values (got {type(value).__name__})"
    if kind == "list_type":
        return f"must be a list (got {type(value).__name__})"
    if kind == "greater_than":
        return f"{shown} must be more than {ctx.get('gt')}"
    if kind == "greater_than_equal":
        if ctx.get("ge") == 0 and isinstance(value, int):
            return f"{shown} must be a non-negative integer"
        if ctx.get("ge") == 1 and isinstance(value, int):
            return f"{shown} must be a positive integer"
        return f"{shown} must be at least {ctx.get('ge')}"
    if kind in ("less_than", "less_than_equal"):
        return f"{shown} must be {'below' if kind == 'less_than' else 'at most'} {ctx.get('lt', ctx.get('le'))}"
    if kind == "literal_error":
        expected = ctx.get("expected", "")
        choices = re.findall(r"'([^']*)'", expected)
        hint = did_you_mean(value, choices)
        return f"{shown} is not a valid choice{hint}{' ' if hint else '; '}valid: {', '.join(choices) or expected}"
    if kind in ("too_short", "string_too_short"):
        return "must not be empty"
    if kind in ("value_error", "assertion_error"):
        err = ctx.get("error")
        return str(err) if err is not None else e["msg"]
    return e["msg"]


def validate(model: type[BaseModel], data: Any, origin: Origin, valid: Iterable[str] = (), path: tuple = ()):
    """``model.model_validate(data)``; every error pydantic finds becomes a SpecError with its file, line, key and
    a hint (raised as one: the first, carrying the others, ``SpecError.every``).

    ``valid``: every dotted key of the file (for "did you mean"); ``path``: where ``data`` sits in it."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        valid = list(valid)
        errors = err.errors(include_url=False)
        said = [_spec_error(e, origin, valid, path, model) for e in errors[:MAX_FOUND]]
        raise found(said + ([more(origin.source)] if len(errors) > MAX_FOUND else [])) from None


def _model_at(model: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    """The section model that holds the key at ``loc`` (``design.variants[0].x``: VariantItem), None if it is none."""
    for part in loc[:-1]:
        if isinstance(part, int):  # an item of a list
            continue
        field = model.model_fields.get(part) if isinstance(part, str) else None
        inner = _model_in(field.annotation) if field is not None else None
        if inner is None:
            return None
        model = inner
    return model


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The model in a field's type: ``VariantItem`` in ``list[VariantItem] | None``."""
    stack = [annotation]
    while stack:
        kind = stack.pop()
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            return kind
        stack += typing.get_args(kind)
    return None


def _spec_error(
    e: dict[str, Any], origin: Origin, valid: Iterable[str], path: tuple, model: type[BaseModel] | None = None
) -> SpecError:
    loc = tuple(p for p in e["loc"] if p not in ("function-after", "function-before"))
    if e["type"] in ("value_error", "assertion_error") and isinstance(_error_path(e), tuple):
        loc = loc + _error_path(e)
    if loc and loc[-1] == "[key]":  # a mapping's key that is not text (`3:`): named once, as check_axes does
        return origin.error((*path, *loc[:-2], e.get("input")), key_not_text(e.get("input")))
    if e["type"] == "invalid_key":  # the same in a model's own keys (`true: 1` at the top: pydantic's loc says 1)
        return origin.error((*path, *loc[:-1], e.get("input")), key_not_text(e.get("input")))
    full = (*path, *loc)
    section = ".".join(str(p) for p in full[:-1] if not isinstance(p, int)) if e["type"] == "extra_forbidden" else ""
    holder = _model_at(model, loc) if model is not None and e["type"] == "extra_forbidden" else None
    return origin.error(full, _message(e, valid, section, list(holder.model_fields) if holder else ()))


def key_not_text(key: Any) -> str:
    """`3:`, `yes:`, `null:` or `2020-01-01:` as a key: YAML reads a number, true/false, nothing or a date.
    (``errors.found`` drops the other errors at a key named so: "unknown key" says nothing more.)"""
    if key is None or isinstance(key, bool):
        read = "nothing" if key is None else "true/false"
    else:
        read = "a number" if isinstance(key, (int, float)) else f"a {type(key).__name__}"
    return f"{NOT_TEXT}{read} ({yaml_word(key)}), not as text: write it in quotes"


def _error_path(e: dict[str, Any]):
    """A validator may name the key it judged: ``KeyedError(("low",), "...")``."""
    err = (e.get("ctx") or {}).get("error")
    return getattr(err, "path", None)


class KeyedError(ValueError):
    """Raised inside a model validator to blame a key below the model: ``KeyedError(("low",), "must be ...")``."""

    def __init__(self, path: tuple, message: str) -> None:
        super().__init__(message)
        self.path = path


def check_name(value: Any, what: str) -> Any:
    if value is not None and (not isinstance(value, str) or not NAME.fullmatch(value)):
        raise ValueError(f"{value!r} must be letters, digits, '_', '-' or '.' ({what})")
    return value


# --- resources and budgets per trial ------------------------------------------------------------------------


class Resources(Strict):
    """What one trial gets: CPUs and GPUs (fractions allowed) and data-parallel workers (DDP when > 1)."""

    cpus: float = Field(1.0, gt=0)
    gpus: float = Field(0.0, ge=0)
    workers: int = Field(1, ge=1)
    share_gpus: bool = False  # data-parallel workers may share a GPU (slow, and NCCL refuses it: gloo only)
    # each GPU's memory, for the packing check (ablations/packing.py); default: read from the GPU itself
    gpu_memory_gb: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _fits(self) -> Resources:
        if self.gpu_memory_gb is not None and not self.gpus:
            raise KeyedError(
                ("gpu_memory_gb",),
                "says how much memory each GPU holds, for packing cells onto GPUs, but no trial asks for a GPU "
                "(resources.gpus is 0): remove it, or set resources.gpus",
            )
        if self.workers > 1 and self.cpus < self.workers:
            raise KeyedError(
                ("cpus",), f"{self.cpus:g} CPUs cannot feed {self.workers} workers; give at least one per worker"
            )
        per_worker = self.gpus / self.workers
        if self.workers > 1 and self.gpus and per_worker != int(per_worker) and not self.share_gpus:
            raise KeyedError(
                ("gpus",),
                f"{self.gpus:g} GPU(s) for {self.workers} data-parallel workers would put {per_worker:g} GPU on each: "
                f"ranks would share a GPU; give each worker whole GPUs (gpus: {self.workers}) or set "
                "resources.share_gpus: true",
            )
        return self

    @property
    def per_worker_cpus(self) -> float:
        return self.cpus / self.workers

    @property
    def per_worker_gpus(self) -> float:
        return self.gpus / self.workers

    def describe(self) -> str:
        parts = [f"{self.cpus:g} CPU"]
        if self.gpus:
            parts.append(f"{self.gpus:g} GPU")
        if self.workers > 1:
            parts.append(f"{self.workers} workers (DDP)")
        return ", ".join(parts)


class Budget(Strict):
    """Per trial: optimisation steps and/or seconds of training."""

    steps: int | None = Field(None, ge=1)
    time: float | None = Field(None, gt=0)

    def overrides(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.steps is not None:
            out["training.max_steps"] = self.steps
        if self.time is not None:
            out["training.max_time"] = float(self.time)
        return out

    def as_dict(self) -> dict[str, float]:
        return {k: v for k, v in (("steps", self.steps), ("time", self.time)) if v is not None}


def trial_overrides(resources: Resources, budget: Budget) -> dict[str, Any]:
    """What a study or search sets in every trial's run: its budget, and torch threads that follow the CPUs of a
    worker whatever the run file says (2 trials x 2 threads on 2 cores would each run at half speed)."""
    return {"resources.threads": max(1, int(resources.per_worker_cpus)), **budget.overrides()}


# --- the keys a design or a search may set ---------------------------------------------------------------


def check_axes(origin: Origin, keys: Iterable[tuple[tuple, Any]], valid: list[str]) -> None:
    """Every (path, key) must name a dotted key of the base's run; else one SpecError for all that do not."""
    errors = []
    for path, key in keys:
        if len(errors) >= MAX_FOUND:
            errors.append(more(origin.source))
            break
        if isinstance(key, str) and key in valid:
            continue
        if not isinstance(key, str):
            errors.append(origin.error(path, key_not_text(key)))
            continue
        section, _, leaf = str(key).rpartition(".")
        hint = suggest(leaf, valid, section=section)
        if not hint and (whole := closest(key, valid, 0.8)):  # a dot left out or doubled: modeln_heads
            hint = "did you mean " + " or ".join(whole) + "?"
        if not hint:
            near = [k for k in valid if key.split(".")[-1] in k] or valid
            hint = "valid keys look like " + ", ".join(near[:12]) + (" ..." if len(near) > 12 else "")
        errors.append(origin.error(path, f"unknown axis {key!r}; {hint}"))
    if errors:
        raise found(errors)


def short(key: str) -> str:
    """model.norm -> norm (for variant labels)."""
    return key.split(".", 1)[1] if "." in key else key


def settings_overrides(settings: dict[str, Any]) -> list[tuple[list[str], Any]]:
    return [(k.split("."), v) for k, v in settings.items()]


def mapping(origin: Origin, path: tuple, value: Any) -> dict:
    if not isinstance(value, dict):
        raise origin.error(path, f"must be a mapping of keys to values (got {type(value).__name__})")
    return value


def join(items: Iterable[Any]) -> str:
    return ", ".join(str(i) for i in items)
