"""The types of the configs' fields, each with its range and its refusal, and ``config``, the decorator that makes a
config a frozen pydantic dataclass whose refusals are ConfigErrors.

A field says what it takes in its annotation: ``n_layers: Count``, ``dropout: Probability``, ``arch:
Literal[ARCHS]``. Validation is strict (``True`` is not an integer nor ``1`` a boolean; a number given as an
integer is kept as written, so a config's dictionary, hence its cell id, stays as before); a field of lists
(``layer_windows``, ``global_tokens``) takes the lists YAML gives and holds tuples, so that a config hashes. A
field's ``Refusal`` says how its refusal reads (``models.errors``, where every one of pydantic's refusals becomes a
ConfigError). A component's name is checked against its registry when the config is built (``Component``):
plugins add to the registries at run time. Pure Python (no torch).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Annotated, Any, Literal

from annotated_types import Ge, Gt, Le, Lt, MinLen
from pydantic import AfterValidator, BeforeValidator, ConfigDict, Discriminator, Tag, ValidationError, WrapValidator
from pydantic.dataclasses import dataclass as pydantic_dataclass
from pydantic_core import PydanticCustomError

from models.errors import ConfigError, Refusal, refusal, refusals_of
from models.registry import ALL as REGISTRIES

STRICT = ConfigDict(strict=True, extra="forbid")
MOST_LAYERS = 256  # layers and heads: twice the largest models' (PaLM: 118 layers); checks walk every one
PLUGIN_FIX = "use one of {valid}, or load the plugin that has it"


def config(*, order: Sequence[str] = ()) -> Callable[[type], type]:
    """Decorator: ``cls`` as a frozen pydantic dataclass (``dataclasses.fields``, ``replace``, hashing and pickling
    as a dataclass's) whose constructor raises the ConfigError of its first mistake (``models.errors.refusal``;
    ``order``: the fields in the order their mistakes are said, the others after)."""

    def make(cls: type) -> type:
        cls = pydantic_dataclass(frozen=True, config=STRICT)(cls)
        build = cls.__init__
        names = [f.name for f in dataclasses.fields(cls)]

        @functools.wraps(build)
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            given = _by_name(type(self), names, args, kwargs)
            try:
                build(self, **given)
            except ValidationError as err:
                raise refusal(err, given, _refusals(type(self)), order, type(self).__name__) from None

        cls.__init__ = __init__
        return cls

    return make


def _by_name(cls: type, names: list[str], args: tuple, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The arguments by field name (a refusal names the field, not the position), refused as a dataclass would."""
    if len(args) > len(names):
        raise TypeError(f"{cls.__name__}.__init__() takes {len(names) + 1} positional arguments but more were given")
    twice = sorted(set(names[: len(args)]) & set(kwargs))
    if twice:
        raise TypeError(f"{cls.__name__}.__init__() got multiple values for argument {twice[0]!r}")
    return {**dict(zip(names, args)), **kwargs}


@functools.cache
def _refusals(cls: type) -> dict[str, tuple[Refusal, ...]]:
    return refusals_of(cls)


# --- values as given ----------------------------------------------------------------------------------------


def _as_given(value: Any, handler: Any) -> Any:
    """A number is checked as a float, and kept as written: 1 stays 1 (``record.spec.configs.canonical`` writes a
    whole number of a float field as that float for the cell id; the config's dictionary keeps what was given)."""
    checked = handler(value)
    return value if type(value) is int else checked


def tuples(value: Any) -> Any:
    """Lists (from YAML or JSON) to tuples, nested lists too, so that the config stays hashable."""
    return tuple(tuples(v) for v in value) if isinstance(value, (list, tuple)) else value


Number = Annotated[float, WrapValidator(_as_given)]  # an int or a float (not a bool), kept as given
AsTuple = BeforeValidator(tuples)
_Positive = Annotated[int, Ge(1)]


# --- the model's fields -------------------------------------------------------------------------------------

_POSITIVE = "{name}={value!r} must be a positive integer"
Size = Annotated[int, Ge(1), Refusal(_POSITIVE, "give a positive integer")]
OptionalSize = Annotated[_Positive | None, Refusal(_POSITIVE, "give a positive integer or remove it")]
_AT_MOST = Refusal(
    "{name}={value} is more than a model here can have (at most {le:,})", "give at most {le:,}", ("less_than_equal",)
)
Count = Annotated[int, Ge(1), Le(MOST_LAYERS), _AT_MOST, Refusal(_POSITIVE, "give a positive integer")]
OptionalCount = Annotated[
    Annotated[int, Ge(1), Le(MOST_LAYERS)] | None,
    _AT_MOST,
    Refusal(_POSITIVE, "give a positive integer or remove it"),
]
Probability = Annotated[
    Number, Ge(0), Lt(1), Refusal("{name}={value!r} must be a number in [0, 1)", "give a number in [0, 1)")
]


def choice(names: Sequence[str]) -> Any:
    """One of ``names``, fixed (``Literal``); the refusal lists them, with the closest to what was written."""
    return Annotated[Literal[tuple(names)], Refusal(fix=PLUGIN_FIX)]


def _registered(kind: str) -> Callable[[Any], Any]:
    """The names ``REGISTRIES[kind]`` holds when the config is built (plugins add to them at run time)."""

    def check(value: Any) -> Any:
        names = REGISTRIES[kind].names()
        if not isinstance(value, str) or value not in names:
            raise PydanticCustomError("not_a_choice", "not a registered name", {"choices": names, "component": kind})
        return value

    return check


def Component(kind: str, *, optional: bool = False) -> Any:  # noqa: N802 (a type)
    """The name of a registered component of ``kind`` (``models.registry.ALL``'s keys); ``optional``: or null."""
    name = Annotated[str, BeforeValidator(_registered(kind))]
    return Annotated[name | None if optional else name, Refusal(fix=PLUGIN_FIX)]


def per_layer(what: str) -> Any:
    """One positive integer per layer, null where a layer does not read it (``models.layer_checks.per_layer``)."""
    return Annotated[
        tuple[_Positive | None, ...] | None,
        AsTuple,
        Refusal(
            "{name}={value} must be a list with one entry per layer" + what,
            "give a list with one entry per layer",
            ("tuple_type",),
            whole=True,
        ),
        Refusal(_POSITIVE, "give a positive integer"),
    ]


def _shape(value: Any) -> str:
    """head_dilations: one list for every dilated layer, or one list (or null) per layer."""
    nested = isinstance(value, tuple) and any(v is None or isinstance(v, tuple) for v in value)
    return "per layer" if nested else "one list"


_HEADS = "{name}={value} must be a list of positive integers (one dilation per head)"
_Row = tuple[_Positive, ...]
HeadDilations = Annotated[
    Annotated[
        Annotated[_Row, Tag("one list")] | Annotated[tuple[_Row | None, ...], Tag("per layer")],
        Discriminator(_shape),
    ]
    | None,
    AsTuple,
    Refusal(_HEADS, "give a list of positive integers", whole=True, tag="one list"),
    Refusal(_HEADS, "give a list of positive integers", tag="per layer"),
]


def _sorted_once(value: tuple[int, ...]) -> tuple[int, ...]:
    if list(value) != sorted(set(value)):
        shown = list(value)
        raise ConfigError(
            f"global_tokens={shown} names the same positions as {sorted(set(value))}: write that (sorted, each once)",
            field="global_tokens",
            value=shown,
            fix=f"write global_tokens={sorted(set(value))}",
        )
    return value


GlobalTokens = Annotated[
    Annotated[tuple[Annotated[int, Ge(0)], ...], MinLen(1), AfterValidator(_sorted_once)] | None,
    AsTuple,
    Refusal(
        "{name}={value} must be a non-empty list of positions (integers >= 0), e.g. [0]",
        "give a non-empty list of integers >= 0",
        whole=True,
    ),
]
PadId = Annotated[int, Ge(0), Refusal("{name}={value!r} must be a non-negative integer", "give an integer >= 0")]
PositiveNumber = Annotated[
    Number, Gt(0), Refusal("{name}={value!r} must be a positive number", "give a number above 0")
]


# --- the training's fields ----------------------------------------------------------------------------------

Betas = Annotated[
    tuple[Annotated[Number, Ge(0), Lt(1)], Annotated[Number, Ge(0), Lt(1)]],
    AsTuple,
    Refusal(
        "{name}={value!r} must be two numbers in [0, 1)", "give two numbers in [0, 1), e.g. [0.9, 0.98]", whole=True
    ),
]
