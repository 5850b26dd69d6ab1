"""A search's space: its parameters (``Param``), read from the file's ``space:`` mapping (``parse_space``), and the
values of a discrete parameter that make no valid run whatever the others are (``refused_values``, said as a
warning; ``spec`` there is a ``record.spec.search.SearchSpec``, not imported: search.py imports this module)."""

from __future__ import annotations

import itertools
import math
from typing import Any, Literal

from pydantic import Field, model_validator

from record.spec.common import KeyedError, Origin, Strict, check_axes, key_not_text, mapping, validate
from record.spec.errors import MAX_FOUND, SpecError, found, more
from record.spec.run import resolve_run

_ALLOWED = {
    "float": {"type", "low", "high", "log", "step", "when"},
    "int": {"type", "low", "high", "log", "step", "when"},
    "categorical": {"type", "choices", "when"},
}


class Param(Strict):
    """One key of the space: a float or int range (log scale or a step), or categorical choices; ``when``
    makes it conditional on categorical parameters (a value, or a list of values)."""

    key: str = ""  # the dotted run key (set from the space's mapping)
    type: Literal["float", "int", "categorical"]
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    choices: tuple[Any, ...] = ()
    when: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _keys(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("choices"), list):  # whatever the type (a typo in it
            data = {**data, "choices": tuple(data["choices"])}  # is named once, not with the choices too)
        if isinstance(data, dict) and isinstance(data.get("type"), str) and data.get("type") in _ALLOWED:
            extra = sorted(set(data) - _ALLOWED[data["type"]] - {"key"}, key=str)  # `null:` among them too
            if extra:
                raise KeyedError(
                    (extra[0],),
                    f"unknown key for {'an' if data['type'] == 'int' else 'a'} {data['type']} parameter; valid: {', '.join(sorted(_ALLOWED[data['type']]))}",
                )
        return data

    @model_validator(mode="after")
    def _range(self) -> Param:
        if self.type == "categorical":
            if not self.choices:
                raise KeyedError(("choices",), "must be a non-empty list of values")
            return self
        for name in ("low", "high"):
            v = getattr(self, name)
            if v is None or (self.type == "int" and v != int(v)):
                raise KeyedError((name,), f"{v!r} must be {'an integer' if self.type == 'int' else 'a number'}")
        if not self.low < self.high:
            raise ValueError(f"low={self.low:g} must be below high={self.high:g}")
        if self.log and self.low <= 0:
            raise KeyedError(("low",), f"a log scale needs low > 0 (got {self.low:g})")
        if self.step is not None and (self.step <= 0 or self.log):
            raise KeyedError(("step",), f"{self.step!r} must be a positive number, and cannot go with log: true")
        if self.type == "int" and self.step is not None and self.step != int(self.step):
            raise KeyedError(("step",), f"{self.step!r} must be a whole number for an int parameter")
        return self

    def describe(self) -> str:
        """In words, for ``ablate search --dry-run``: "int from 1 to 4; only when model.norm == 'pre'"."""
        if self.type == "categorical":
            what = f"categorical, one of {list(self.choices)}"
        else:
            low, high = (int(self.low), int(self.high)) if self.type == "int" else (self.low, self.high)
            scale = ", log scale" if self.log else f", step {self.step:g}" if self.step is not None else ""
            what = f"{self.type} from {low:g} to {high:g}{scale}"
        when = " and ".join(f"{k} {'in' if isinstance(v, list) else '=='} {v!r}" for k, v in self.when.items())
        return what + (f"; only when {when}" if when else "")

    def active(self, params: dict[str, Any]) -> bool:
        """Whether the conditions hold: each ``when`` key has its value (or one of a list of values)."""
        return all(params.get(k) in (v if isinstance(v, list) else [v]) for k, v in self.when.items())

    def end(self, pick: int) -> Any:
        """The value at the low (0) or high (-1) end of the range."""
        if self.type == "categorical":
            return self.choices[pick]
        value = self.low if pick == 0 else self.high
        return int(value) if self.type == "int" else value


def suggest_param(p: Param, trial) -> Any:
    """The parameter's value, asked of an Optuna trial (passed in: this module imports no optuna)."""
    if p.type == "float":
        return trial.suggest_float(p.key, p.low, p.high, log=p.log, step=p.step)
    if p.type == "int":
        return trial.suggest_int(p.key, int(p.low), int(p.high), log=p.log, step=int(p.step or 1))
    return trial.suggest_categorical(p.key, list(p.choices))


def parse_space(origin: Origin, body: dict[str, Any], valid: list[str] | None) -> list[Param]:
    """The space's parameters, in the order a trial asks them. Every unknown key (unless ``valid`` is None: no
    base to judge them by), every parameter's mistakes and every ``when`` that names no categorical parameter
    or none of its choices, at once."""
    space, errors = [], []
    try:
        check_axes(origin, [(("space", key), key) for key in body] if valid is not None else [], valid or [])
    except SpecError as err:
        errors += err.every()
    for key, spec in body.items():
        if len(errors) >= MAX_FOUND:
            errors.append(more(origin.source))
            break
        if not isinstance(key, str):  # named once (check_axes, pydantic), not again as the parameter's key
            errors.append(origin.error(("space", key), key_not_text(key)))
            continue
        try:
            mapping(origin, ("space", key), spec)
            space.append(validate(Param, {**spec, "key": key}, origin, (), ("space", key)))
        except SpecError as err:
            errors += err.every()
    for key, spec in body.items():  # read from the file: a parameter's `when` is judged even if the rest is wrong
        when = spec.get("when") if isinstance(spec, dict) else None
        for k, v in when.items() if isinstance(when, dict) else ():
            named = body.get(k) if isinstance(body.get(k), dict) else {}
            where, choices = ("space", key, "when", k), named.get("choices")
            if named.get("type") != "categorical":
                errors.append(origin.error(where, "must name a categorical parameter of the space"))
            elif isinstance(choices, list):
                for one in v if isinstance(v, list) else [v]:
                    if one not in choices:
                        errors.append(origin.error(where, f"{one!r} is not one of its choices {choices}"))
    if errors:
        raise found(errors)
    keys = {p.key: p for p in space}
    ordered: list[Param] = []  # conditions first: a parameter comes after the ones its `when` names
    while len(ordered) < len(space):
        ready = [p for p in space if p not in ordered and all(keys[k] in ordered for k in p.when)]
        if not ready:
            raise origin.error(("space",), "the `when` conditions form a cycle")
        ordered += ready
    return ordered


def refused_values(spec: Any, most: int = 64, combinations: int = 512) -> list[str]:
    """The values of a discrete parameter (its choices, or an int range of at most ``most`` values) that make no
    valid run with any combination of the others' values (their choices, every value of an int range of at most
    16, the ends of the rest): a trial that draws one is refused, and counts towards n_trials (``n_heads`` from 1 to
    8 with d_model 64: 3, 5, 6 and 7). Not judged: a parameter whose others have more than ``combinations``
    combinations, and a value whose refusal names another parameter tried only at its ends (it may fit between)."""
    said = []
    for p in spec.space:
        values = _values(p, most)
        others = [q for q in spec.space if q is not p]
        every = [_values(q, 16) for q in others]
        tried = [v or [q.end(0), q.end(-1)] for q, v in zip(others, every)]
        if values is None or math.prod(len(t) for t in tried) > combinations:
            continue
        at_ends = [q.key.rsplit(".", 1)[-1] for q, v in zip(others, every) if v is None]
        refused: dict[Any, str] = {}
        for value in values:
            reasons = []
            for pick in itertools.product(*tried):
                chosen = dict(zip((q.key for q in others), pick), **{p.key: value})
                params = spec.assign(lambda q, chosen=chosen: chosen[q.key])
                try:
                    resolve_run({**spec.run_data(params), "name": spec.name}, Origin(None))
                    break
                except SpecError as err:
                    reasons.append(err.message)
            else:
                if not any(f"{leaf}=" in r for r in reasons for leaf in at_ends):
                    refused[value] = reasons[0]
        if refused:
            kept = [v for v in values if v not in refused]
            said.append(
                f"space.{p.key}: {', '.join(map(str, refused))} {'makes' if len(refused) == 1 else 'make'} no valid "
                f"run ({next(iter(refused.values()))}); a trial that draws one is refused and counts towards n_trials"
                + (f" (type: categorical with choices {kept} leaves them out)" if kept and p.type == "int" else "")
            )
    return said


def _values(p: Any, most: int) -> list[Any] | None:
    """Every value a discrete parameter can take (None for a float, or for an int range of more than ``most``)."""
    if p.type == "categorical":
        return list(p.choices)
    if p.type == "float" or (p.high - p.low) / (p.step or 1) + 1 > most:
        return None
    return list(range(int(p.low), int(p.high) + 1, int(p.step or 1)))
