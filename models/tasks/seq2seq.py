"""Synthetic sequence-to-sequence tasks: copy, reverse and sort a sequence of symbols (encoder_decoder).

Training, validation and test sequences have lengths in [min_len, max_len]; the ``test_long`` split holds
longer ones, [long_min_len, long_max_len], never seen in training: length generalisation, which is what
the positions ablation needs.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from models.config import ConfigError
from models.tasks.base import FIRST_SYMBOL, SyntheticParams, Task, generate, split_seed, split_size


@dataclass(frozen=True)
class Seq2SeqParams(SyntheticParams):
    symbols: int = 10
    min_len: int = 1
    max_len: int = 10
    long_min_len: int | None = None  # default max_len + 1
    long_max_len: int | None = None  # default 2 * max_len

    def check(self) -> None:
        if self.symbols < 2:
            raise ConfigError(f"symbols={self.symbols} must be at least 2")
        if not 1 <= self.min_len <= self.max_len:
            raise ConfigError(f"min_len={self.min_len} and max_len={self.max_len} need 1 <= min_len <= max_len")
        lo, hi = self.long_range
        if not self.max_len < lo <= hi:
            raise ConfigError(
                f"long_min_len={lo} and long_max_len={hi} need max_len={self.max_len} < long_min_len <= long_max_len"
            )

    @property
    def long_range(self) -> tuple[int, int]:
        lo = self.long_min_len if self.long_min_len is not None else self.max_len + 1
        hi = self.long_max_len if self.long_max_len is not None else max(2 * self.max_len, lo)
        return lo, hi


def _target(name: str, src: list[int]) -> list[int]:
    if name == "copy":
        return list(src)
    if name == "reverse":
        return src[::-1]
    return sorted(src)


def _examples(
    split: str, task: str, symbols: int, min_len: int, max_len: int, lo: int, hi: int, seed: int, size: int, **_
):
    rng = random.Random(seed)
    a, b = (lo, hi) if split == "test_long" else (min_len, max_len)
    for _ in range(size):
        src = [FIRST_SYMBOL + rng.randrange(symbols) for _ in range(rng.randint(a, b))]
        yield {"src": src, "tgt": _target(task, src)}


class Seq2SeqTask(Task):
    kind = "seq2seq"
    archs = ("encoder_decoder",)
    Params = Seq2SeqParams
    splits = ("train", "validation", "test", "test_long")

    @property
    def vocab_size(self) -> int:
        return FIRST_SYMBOL + self.params.symbols

    @property
    def max_length(self) -> int:
        return self.params.long_range[1] + 1  # BOS or EOS added to the target

    def build(self, split: str, cache_dir: str | None = None):
        from datasets import Features, Sequence, Value

        p = self.params
        lo, hi = p.long_range
        features = Features({"src": Sequence(Value("int32")), "tgt": Sequence(Value("int32"))})
        return generate(
            self,
            split,
            _examples,
            cache_dir,
            features,
            task=self.name,
            lo=lo,
            hi=hi,
            seed=split_seed(p, split),
            size=split_size(p, split),
        )


class CopyTask(Seq2SeqTask):
    name = "copy"


class ReverseTask(Seq2SeqTask):
    name = "reverse"


class SortTask(Seq2SeqTask):
    name = "sort"
