"""Multi-query associative recall (Arora et al. 2023, "Zoology"; an induction-head task): a decoder reads
key-value pairs, then queries of some of the keys, and must answer each with its value.

    k1 v1 k2 v2 ... kn vn  q1 a1 q2 a2 ...      loss only on the answers a_i = value of key q_i
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from models.config import ConfigError
from models.tasks.base import FIRST_SYMBOL, SyntheticParams, Task, generate, split_seed, split_size


@dataclass(frozen=True)
class RecallParams(SyntheticParams):
    keys: int = 16  # size of the key vocabulary
    values: int = 16  # size of the value vocabulary
    pairs: int = 8  # key-value pairs per sequence (distinct keys)
    queries: int = 4  # queries per sequence (distinct keys among the pairs)

    def check(self) -> None:
        if self.pairs < 1 or self.pairs > self.keys:
            raise ConfigError(
                f"pairs={self.pairs} must be between 1 and keys={self.keys} (keys are distinct)",
                field="pairs",
                value=self.pairs,
                fix=f"give 1 <= pairs <= {self.keys}, or raise keys",
                related=("keys",),
            )
        if not 1 <= self.queries <= self.pairs:
            raise ConfigError(
                f"queries={self.queries} must be between 1 and pairs={self.pairs}",
                field="queries",
                value=self.queries,
                fix=f"give 1 <= queries <= {self.pairs}, or raise pairs",
                related=("pairs",),
            )
        if self.values < 2:
            raise ConfigError(
                f"values={self.values} must be at least 2", field="values", value=self.values, fix="give values >= 2"
            )


def _examples(keys: int, values: int, pairs: int, queries: int, seed: int, size: int, **_):
    rng = random.Random(seed)
    for _ in range(size):
        ks = rng.sample(range(keys), pairs)
        vs = [rng.randrange(values) for _ in ks]
        tokens, mask = [], []
        for k, v in zip(ks, vs):
            tokens += [FIRST_SYMBOL + k, FIRST_SYMBOL + keys + v]
            mask += [0, 0]
        for i in rng.sample(range(pairs), queries):
            tokens += [FIRST_SYMBOL + ks[i], FIRST_SYMBOL + keys + vs[i]]
            mask += [0, 1]
        yield {"tokens": tokens, "loss_mask": mask[1:]}  # aligned with the targets tokens[1:]


class RecallTask(Task):
    answer_mask = True  # only the answer tokens are scored (loss_mask): exact match per sequence
    name = "recall"
    kind = "lm"
    archs = ("decoder",)
    Params = RecallParams

    def output_classes(self, model) -> int:
        """Only the answers are scored, each one of the values: a model that knows which tokens are values but
        not which one is asked guesses among them (ln values), not among the vocabulary."""
        return self.params.values

    @property
    def vocab_size(self) -> int:
        return FIRST_SYMBOL + self.params.keys + self.params.values

    @property
    def max_length(self) -> int:
        return 2 * (self.params.pairs + self.params.queries)

    def build(self, split: str, cache_dir: str | None = None):
        from datasets import Features, Sequence, Value

        p = self.params
        features = Features({"tokens": Sequence(Value("int32")), "loss_mask": Sequence(Value("int32"))})
        return generate(
            self, split, _examples, cache_dir, features, seed=split_seed(p, split), size=split_size(p, split)
        )
