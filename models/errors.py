"""The model's error type, in a module of its own so that ``models.traits`` and ``models.config`` share it."""

from __future__ import annotations

import difflib
import functools
from collections.abc import Iterable, Sequence
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
