"""How a model or training config is written down: once for a run's identity (``canonical``: one spelling per
meaning, so that one run has one id) and once for a reader (``effective``: every field as the run trains it,
MLflow's params)."""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from dataclasses import fields
from typing import Any

from models.config import ConfigError


def canonical(config: Any) -> dict[str, Any]:
    """A config's ``to_dict()`` with each value in one spelling: a whole number given for a field of type float
    as that float (grad_clip: 1 is 1.0), and a value equal to what leaving the field out means (``implied()``) as
    left out (eval_batch_size equal to batch_size, d_ff equal to 4 * d_model: None). Each spelling had its own
    cell id: the same run trained twice, or two variants of one model compared as different."""
    floats, float_tuples = _float_fields(type(config))
    implied = config.implied()
    out = config.to_dict()
    for key, value in out.items():
        if key in implied and value is not None and value == implied[key]:
            out[key] = None
        elif key in floats and isinstance(value, int) and not isinstance(value, bool):
            out[key] = float(value)
        elif key in float_tuples and isinstance(value, list):
            out[key] = [float(v) for v in value]
    return out


def effective(config: Any) -> dict[str, Any]:
    """Every field of a model or training config as it trains: a field left out shows what leaving it out means
    (``implied()``: head_dim d_model / n_heads, eval_batch_size the batch size), and a field ``to_dict`` leaves
    out at its default shows that default (MLflow's params showed 'None' for the one and nothing for the other)."""
    out = config.to_dict()
    for f in fields(config):
        out.setdefault(f.name, getattr(config, f.name))
    for key, value in config.implied().items():
        if out.get(key) is None and value is not None:
            try:  # a key this model refuses (dilated_heads without a dilated layer, a decoder-only model's
                dataclasses.replace(config, **{key: value})  # n_decoder_layers) is not part of it: nothing shown
            except ConfigError:
                continue
            out[key] = value
    return out


@functools.cache
def _float_fields(cls: type) -> tuple[frozenset[str], frozenset[str]]:
    """The fields of a dataclass typed float (or float | None, however the annotation spells the union), and those
    typed tuple[float, ...]."""
    floats, tuples = set(), set()
    for name, kind in typing.get_type_hints(cls).items():
        kinds = typing.get_args(kind) if typing.get_origin(kind) in (typing.Union, types.UnionType) else (kind,)
        if float in kinds and int not in kinds:
            floats.add(name)
        elif typing.get_origin(kind) is tuple and set(typing.get_args(kind)) == {float}:
            tuples.add(name)
    return frozenset(floats), frozenset(tuples)
