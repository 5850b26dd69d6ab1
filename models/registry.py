"""One registry per kind of component: the only place where a component's name is bound to its code.

``ModelConfig`` takes its valid choices from these registries (never from a copy of their names), so adding
a variant is one class and one ``@REGISTRY.register("name")`` line in any module imported before the config
is built (a researcher's own module included)::

    from models.attention import SCORES, DotScore

    @SCORES.register("my_score")
    class MyScore(DotScore): ...

    ModelConfig(score="my_score")

The registries are filled by the modules that define the components (``models.attention``,
``models.patterns``, ``models.positions``, ``models.blocks``), which ``models/__init__.py`` imports, so they
are full whenever anything of ``models`` is imported. This module imports nothing of ``models``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Registry(dict):
    """A name -> component mapping for one kind of component (scores, patterns, positions, ...)."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind

    def register(self, name: str) -> Callable[[Any], Any]:
        """Decorator: ``@SCORES.register("dot")`` binds the class (or factory) to the name."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"a {self.kind} needs a non-empty string name (got {name!r})")

        def bind(component: Any) -> Any:
            if name in self and self[name] is not component:
                raise ValueError(f"{self.kind} {name!r} is already registered ({self[name]!r}); pick another name")
            self[name] = component
            return component

        return bind

    def unregister(self, name: str) -> None:
        """Remove a component (tests that register toy components clean up after themselves)."""
        self.pop(name, None)

    def names(self) -> tuple[str, ...]:
        return tuple(self)


SCORES = Registry("score")
PATTERNS = Registry("pattern")
POSITIONS = Registry("positions")
NORMS = Registry("norm_type")
FEED_FORWARDS = Registry("ffn")


ALL = {"score": SCORES, "pattern": PATTERNS, "positions": POSITIONS, "norm_type": NORMS, "ffn": FEED_FORWARDS}
"""The config field each registry serves -> the registry."""
