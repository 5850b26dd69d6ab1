"""One registry per kind of component: the only place where a component's name is bound to its code.

``ModelConfig`` takes its valid choices from these registries (never from a copy of their names), so adding
a variant is one class and one ``@REGISTRY.register("name")`` line in any module imported before the config
is built (a researcher's own module included)::

    from models.attention import SCORES, DotScore

    @SCORES.register("my_score")
    class MyScore(DotScore): ...

    ModelConfig(score="my_score")

The built-in components are declared at the bottom of this module with the module that defines them and
their traits (``models.traits``: the flags and checks the config reads). ``REGISTRY[name]`` imports that
module on first use, whose ``@REGISTRY.register`` line then binds the name to the class; until then
``REGISTRY.traits(name)`` answers from the declaration. So validating a config (what a study's driver does
for every variant) imports no torch, and building a model loads exactly the components it uses. A test
(tests/models/test_registry.py) checks that every declaration names the module that registers it and
traits equal to the class's own.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from models import plugins


@dataclass(frozen=True)
class Declared:
    """A built-in component not imported yet: the module whose ``register`` line binds it, and its traits."""

    module: str
    traits: type | None = None


class Registry(Mapping):
    """A name -> component mapping for one kind of component (scores, patterns, positions, ...)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Any] = {}
        self.builtins: dict[str, Declared] = {}  # what ``declare`` said, kept after the class replaces it

    def declare(self, name: str, module: str, traits: type | None = None) -> None:
        """A built-in component: ``module`` registers it when imported; ``traits`` answer for it until then."""
        self.builtins[name] = Declared(module, traits)
        self._entries.setdefault(name, self.builtins[name])

    def register(self, name: str) -> Callable[[Any], Any]:
        """Decorator: ``@SCORES.register("dot")`` binds the class (or factory) to the name."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"a {self.kind} needs a non-empty string name (got {name!r})")

        def bind(component: Any) -> Any:
            current = self._entries.get(name)
            if isinstance(current, Declared):
                if getattr(component, "__module__", None) != current.module:
                    raise ValueError(
                        f"{self.kind} {name!r} is already registered (built in, from {current.module}); pick another name"
                    )
            elif current is not None and current is not component:
                raise ValueError(f"{self.kind} {name!r} is already registered ({current!r}); pick another name")
            self._entries[name] = component
            return component

        return bind

    def unregister(self, name: str) -> None:
        """Remove a component (tests that register toy components clean up after themselves)."""
        self._entries.pop(name, None)

    def names(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def traits(self, name: str) -> Any:
        """What the config reads of a component (flags, ``check``) without importing it: the class itself
        once loaded, else its declared traits (``None`` for a component without any, e.g. a norm)."""
        entry = self._entries[name]
        return entry.traits if isinstance(entry, Declared) else entry

    def __getitem__(self, name: str) -> Any:
        entry = self._entries[name]
        if isinstance(entry, Declared):
            importlib.import_module(entry.module)
            entry = self._entries[name]
            if isinstance(entry, Declared):
                raise LookupError(f"{self.kind} {name!r} is declared in {entry.module}, which did not register it")
        return entry

    def __contains__(self, name: object) -> bool:
        return name in self._entries  # without importing a declared component

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {list(self._entries)})"


SCORES = Registry("score")
PATTERNS = Registry("pattern")
POSITIONS = Registry("positions")
NORMS = Registry("norm_type")
FEED_FORWARDS = Registry("ffn")


ALL = {"score": SCORES, "pattern": PATTERNS, "positions": POSITIONS, "norm_type": NORMS, "ffn": FEED_FORWARDS}
"""The config field each registry serves -> the registry."""


def _declare_builtins() -> None:
    from models import traits as t

    score, pattern, positions = t.ScoreTraits, t.PatternTraits, t.PositionsTraits
    for registry, module, names in (
        (
            SCORES,
            "models.attention",
            {"dot": score, "dot_unscaled": score, "general": score, "cosine": score, "additive": t.AdditiveTraits},
        ),
        (PATTERNS, "models.patterns", {"full": pattern, "local": t.LocalTraits, "dilated": t.DilatedTraits}),
        (
            POSITIONS,
            "models.positions",
            {
                "sinusoidal": t.SinusoidalTraits,
                "learned": t.LearnedTraits,
                "none": positions,
                "rotary": t.RotaryTraits,
                "alibi": t.ALiBiTraits,
            },
        ),
        (NORMS, "models.blocks", dict.fromkeys(("layernorm", "rmsnorm"))),
        (FEED_FORWARDS, "models.blocks", dict.fromkeys(("relu", "gelu", "swiglu"))),
    ):
        for name, traits in names.items():
            registry.declare(name, module, traits)


_declare_builtins()
for _kind, _registry in ALL.items():  # what a plugin adds is counted as its own (models.plugins)
    plugins.track(_kind, _registry)
