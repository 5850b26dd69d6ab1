"""The model's error type, in a module of its own so that ``models.traits`` and ``models.config`` share it."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any


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
