"""Retrieval at a distance: after ``length`` random symbols and a query marker, a decoder must output the
symbol that stood ``distance`` positions before the marker. It measures the reach of local and dilated
attention (L layers of window w reach L * w positions; dilation d stretches that to L * w * d).

    x_0 ... x_{n-1}  SEP  answer = x_{n - distance}      loss only on the answer
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from models.config import ConfigError
from models.tasks.base import FIRST_SYMBOL, SEP, SyntheticParams, Task, generate, split_seed, split_size


@dataclass(frozen=True)
class RetrievalParams(SyntheticParams):
    symbols: int = 16
    length: int = 64  # symbols before the marker
    distance: int = 32  # how far back the answer stands (1 = the last symbol before the marker)

    def check(self) -> None:
        if self.symbols < 2:
            raise ConfigError(
                f"symbols={self.symbols} must be at least 2",
                field="symbols",
                value=self.symbols,
                fix="give symbols >= 2",
            )
        if not 1 <= self.distance <= self.length:
            raise ConfigError(
                f"distance={self.distance} must be between 1 and length={self.length}",
                field="distance",
                value=self.distance,
                fix=f"give 1 <= distance <= {self.length}, or raise length",
                related=("length",),
            )


def _examples(symbols: int, length: int, distance: int, seed: int, size: int, **_):
    rng = random.Random(seed)
    for _ in range(size):
        xs = [FIRST_SYMBOL + rng.randrange(symbols) for _ in range(length)]
        tokens = [*xs, SEP, xs[length - distance]]
        yield {"tokens": tokens, "loss_mask": [0] * length + [1]}


class RetrievalTask(Task):
    answer_mask = True  # only the answer tokens are scored (loss_mask): exact match per sequence
    name = "retrieval"
    kind = "lm"
    archs = ("decoder",)
    Params = RetrievalParams

    def output_classes(self, model) -> int:
        """Only the answers are scored, each one of the symbols: a model that knows which tokens are symbols but
        not which one is asked guesses among them (ln symbols), not among the vocabulary."""
        return self.params.symbols

    @property
    def vocab_size(self) -> int:
        return FIRST_SYMBOL + self.params.symbols

    @property
    def max_length(self) -> int:
        return self.params.length + 2

    def build(self, split: str, cache_dir: str | None = None):
        from datasets import Features, Sequence, Value

        p = self.params
        features = Features({"tokens": Sequence(Value("int32")), "loss_mask": Sequence(Value("int32"))})
        return generate(
            self, split, _examples, cache_dir, features, seed=split_seed(p, split), size=split_size(p, split)
        )
