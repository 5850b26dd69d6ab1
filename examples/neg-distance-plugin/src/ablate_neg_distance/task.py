"""A task of one's own: ``first_last``. Is the first symbol of a sequence equal to its last? An encoder classifies
random sequences of ``min_len`` to ``max_len`` symbols, half of them with equal ends: the answer needs the first
and the last position together, which a model with positions must bring into one place."""

from __future__ import annotations

import random
from dataclasses import dataclass

from models.config import ConfigError
from models.tasks import TASKS
from models.tasks.base import FIRST_SYMBOL, SEP, SyntheticParams, Task, generate, split_seed, split_size


@dataclass(frozen=True)
class FirstLastParams(SyntheticParams):
    symbols: int = 8
    min_len: int = 4
    max_len: int = 12

    def check(self) -> None:
        if not 2 <= self.min_len <= self.max_len:
            raise ConfigError(
                f"min_len={self.min_len} and max_len={self.max_len} need 2 <= min_len <= max_len",
                field="min_len",
                value=self.min_len,
                fix="give 2 <= min_len <= max_len",
                related=("max_len",),
            )
        if self.symbols < 2:
            raise ConfigError(
                f"symbols={self.symbols} must be at least 2", field="symbols", value=self.symbols, fix="give 2 or more"
            )


def _examples(symbols: int, min_len: int, max_len: int, seed: int, size: int, **_):
    rng = random.Random(seed)
    for i in range(size):
        xs = [rng.randrange(symbols) for _ in range(rng.randint(min_len, max_len))]
        same = i % 2 == 0  # balanced classes: chance is one half
        xs[-1] = xs[0] if same else rng.choice([s for s in range(symbols) if s != xs[0]])
        yield {"tokens": [SEP, *(FIRST_SYMBOL + x for x in xs)], "label": int(same)}


@TASKS.register
class FirstLastTask(Task):
    name = "first_last"
    kind = "classify"
    archs = ("encoder",)
    Params = FirstLastParams

    @property
    def vocab_size(self) -> int:
        return FIRST_SYMBOL + self.params.symbols

    @property
    def n_classes(self) -> int:
        return 2

    @property
    def max_length(self) -> int:
        return self.params.max_len + 1

    def build(self, split: str, cache_dir: str | None = None):
        from datasets import Features, Sequence, Value

        p = self.params
        features = Features({"tokens": Sequence(Value("int32")), "label": Value("int32")})
        return generate(
            self, split, _examples, cache_dir, features, seed=split_seed(p, split), size=split_size(p, split)
        )
