"""The model's error type, in a module of its own so that ``models.traits`` and ``models.config`` share it, and
the one translation of pydantic's refusals into it (``refusal``).

The model, training and task configs are validated by pydantic, as the study files are (``record.spec``): each
field's type and range in its annotation (``models.fields``), the rules between fields in a model validator
(``models.checks``). Whatever pydantic refuses reaches a person as a ConfigError that names the field, its value
and the fix, the spec layer adds the file and the line (``record.spec.run._section``), and the refusal comes
before torch is imported: validating imports none.
"""

from __future__ import annotations

import difflib
import functools
import re
import typing
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


def not_a_choice(field: str, value: Any, choices: Iterable[str], *, what: str = "a valid choice") -> str:
    """``positions='rotray' is not a valid choice; did you mean 'rotary'? valid: 'sinusoidal', ...``: the message of
    a refused choice, with the closest choice when one is close (difflib)."""
    choices = list(choices)
    valid = ", ".join(repr(c) for c in choices)
    hint = did_you_mean(value, choices)
    return f"{field}={value!r} is not {what}{hint}{' ' if hint else '; '}valid: {valid}"


def did_you_mean(value: Any, choices: Iterable[str]) -> str:
    """``; did you mean 'rotary'?`` for a misspelt text among ``choices``, else ""."""
    if not isinstance(value, str):
        return ""
    lowered = {str(c).lower(): c for c in choices}
    close = difflib.get_close_matches(value.lower(), list(lowered), n=1, cutoff=0.6)
    return f"; did you mean {lowered[close[0]]!r}?" if close else ""


class ConfigError(ValueError):
    """A configuration that cannot be built, said to a person and to a program.

    ``str(err)`` is the message a person reads: it names the field, the value and the fix. A program reads the
    same facts from the attributes, never from the text: ``field`` is the key at fault as written in its section
    (``n_heads``, ``layer_windows``; an entry of a list is blamed on its list), ``value`` the value it was given,
    ``fix`` what would make it valid, and ``related`` the other keys the refusal reads (``d_model=128 is not
    divisible by n_heads=3``: field ``d_model``, related ``("n_heads",)``), so that a file that wrote only one of
    them is blamed on that one's line.
    """

    def __init__(self, message: str, *, field: str, value: Any, fix: str, related: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.message, self.field, self.value, self.fix = message, field, value, fix
        self.related = tuple(related)

    @property
    def fields(self) -> tuple[str, ...]:
        """Every key the refusal reads, the one at fault first."""
        return (self.field, *self.related)

    def __reduce__(self):  # keyword-only fields: pickled by keyword (a refusal crosses process boundaries in Ray)
        rebuild = functools.partial(type(self), field=self.field, value=self.value, fix=self.fix, related=self.related)
        return rebuild, (self.message,)


# --- pydantic's refusals -> ConfigError: the one translation ---------------------------------------------------


@dataclass(frozen=True)
class Refusal:
    """How a field's own refusal reads, declared in its annotation beside its type (``models.fields``).

    ``message`` and ``fix`` are templates: ``{name}`` is the key at fault (``layer_windows[1]`` for an entry of a
    list), ``{value}`` its value (a list as a list) and pydantic's context (``{ge}``, ``{le}``, ``{valid}`` the
    valid choices) the bound it broke; a message left out is the plain one for pydantic's error type
    (``_PLAIN``). ``when``: the pydantic error types it speaks for (None: every one); ``whole``: it names the
    field's whole value, not the entry at fault; ``tag``: it speaks only for the branch of a union so tagged
    (``head_dilations``: one list for every layer, or one per layer)."""

    message: str | None = None
    fix: str | None = None
    when: tuple[str, ...] | None = None
    whole: bool = False
    tag: str | None = None

    def speaks_for(self, error: dict[str, Any]) -> bool:
        return (self.when is None or error["type"] in self.when) and (self.tag is None or self.tag in error["loc"])


_CHOICE_FIX = "use one of {valid}"
_PLAIN = {  # pydantic's error type -> (message, fix) of a field whose annotation says nothing more
    "int_type": ("{name}={value!r} must be an integer", "give an integer"),
    "float_type": ("{name}={value!r} must be a number", "give a number"),
    "bool_type": ("{name}={value!r} must be true or false", "write true or false"),
    "string_type": ("{name}={value!r} must be text", "give text"),
    "tuple_type": ("{name}={value!r} must be a list", "give a list"),
    "greater_than_equal": ("{name}={value!r} must be >= {ge}", "give a value >= {ge}"),
    "greater_than": ("{name}={value!r} must be > {gt}", "give a value > {gt}"),
    "less_than_equal": ("{name}={value!r} must be <= {le}", "give a value <= {le}"),
    "less_than": ("{name}={value!r} must be < {lt}", "give a value < {lt}"),
    "literal_error": ("{choice}", _CHOICE_FIX),
    "not_a_choice": ("{choice}", _CHOICE_FIX),
}
_CALL = {  # pydantic's refusals of the call itself: the TypeError a dataclass raises for them
    "unexpected_keyword_argument": "got an unexpected keyword argument {key!r}",
    "missing_argument": "missing a required argument: {key!r}",
}


def refusal(
    err: Any,
    given: Mapping[str, Any],
    refusals: Mapping[str, Sequence[Refusal]],
    order: Sequence[str] = (),
    owner: str = "config",
) -> Exception:
    """The exception a config's constructor raises for pydantic's ``ValidationError`` ``err``: the ConfigError of
    its first mistake in ``order`` (field names, or ``field:error_type`` to place one kind of refusal of a field
    apart; the others after, in pydantic's order). A check that raised a ConfigError (a cross-field rule, a
    component's own ``check``) gives that one unchanged; any other exception a check raised is given back as it
    was. ``given``: the values the constructor was called with; ``refusals``: each field's ``Refusal`` s, from
    its annotation (``refusals_of``)."""
    errors = err.errors(include_url=False)
    rank = {key: i for i, key in enumerate(order)}

    def position(item: tuple[int, dict[str, Any]]) -> tuple[int, int]:
        i, e = item
        field = str(e["loc"][0]) if e["loc"] else ""
        if e["type"] in _CALL:  # the call itself first, as a dataclass refuses it before any value
            return -1, i
        return rank.get(f"{field}:{e['type']}", rank.get(field, len(rank))), i

    e = min(enumerate(errors), key=position)[1]
    raised = (e.get("ctx") or {}).get("error")
    if isinstance(raised, BaseException):
        return raised  # a ConfigError of a check, or what a component's check raised
    if e["type"] in _CALL:
        key = e["loc"][0] if e["loc"] else "?"
        return TypeError(f"{owner}.__init__() " + _CALL[e["type"]].format(key=key))
    field = str(e["loc"][0])
    at = next((p for p in e["loc"][1:] if isinstance(p, int)), None)
    said = next((r for r in refusals.get(field, ()) if r.speaks_for(e)), Refusal())
    whole = said.whole or at is None
    value = shown(given.get(field, e.get("input"))) if whole else _entry(given.get(field), at, e.get("input"))
    name = field if whole else f"{field}[{at}]"
    context = {k: _number(v) for k, v in (e.get("ctx") or {}).items()}
    plain = _PLAIN.get(e["type"], ("{name}={value!r}: " + e["msg"], "give a valid value"))
    message, fix = said.message or plain[0], said.fix or plain[1]
    if e["type"] in ("literal_error", "not_a_choice"):
        choices = context.get("choices") or re.findall(r"'([^']*)'", str(context.get("expected", "")))
        context["valid"] = ", ".join(repr(c) for c in choices)
        context["choice"] = not_a_choice(name, value, choices) + _plugin_hint(context.get("component"))
    fill = {**context, "name": name, "value": value}
    return ConfigError(message.format(**fill), field=field, value=value, fix=fix.format(**fill))


def refusals_of(cls: type) -> dict[str, tuple[Refusal, ...]]:
    """Each field's ``Refusal`` s, read from its annotation (the outermost ``Annotated``)."""
    hints = typing.get_type_hints(cls, include_extras=True)
    return {
        name: tuple(m for m in getattr(hint, "__metadata__", ()) if isinstance(m, Refusal))
        for name, hint in hints.items()
    }


def _plugin_hint(component: str | None) -> str:
    if component is None:
        return ""
    from models.plugins import unknown_hint

    return f"; {unknown_hint(component)}"


def shown(value: Any) -> Any:
    """A value as the file wrote it: lists as lists (the config holds tuples)."""
    return [shown(v) for v in value] if isinstance(value, (tuple, list)) else value


def _entry(whole: Any, at: int, fallback: Any) -> Any:
    try:
        return shown(whole[at])
    except (TypeError, IndexError, KeyError):
        return fallback


def _number(value: Any) -> Any:
    """A bound as written (1, not 1.0: pydantic gives float bounds of float fields as floats)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value
