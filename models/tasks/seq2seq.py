"""Synthetic sequence-to-sequence tasks: copy, reverse and sort a sequence of symbols (encoder_decoder).

Training, validation and test sequences have lengths in [min_len, max_len]; the ``test_long`` split holds
longer ones, [long_min_len, long_max_len], never seen in training: length generalisation, which is what
the positions ablation needs.

The splits are disjoint (``disjoint``, the default): every possible sequence belongs to one split by a hash of
its symbols, a share ``heldout`` of them (at every length alike) to validation and test, the rest to training.
Without it, short sequences are drawn so often that a third of a test set can appear verbatim in training,
and a test score measures memory as much as the rule.

Validation and test hold each sequence once (``_distinct``): a length is drawn uniformly among those with a
sequence left, then an unused member of it. Drawn with replacement, the one length-1 sequence of a split was 53 of
the 500 test examples (10.6%) and decided whole contrasts; a split whose lengths run out holds fewer examples.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from functools import lru_cache

from models.config import ConfigError
from models.tasks.base import FIRST_SYMBOL, SyntheticParams, Task, generate, split_seed, split_size


@dataclass(frozen=True)
class Seq2SeqParams(SyntheticParams):
    symbols: int = 10
    min_len: int = 1
    max_len: int = 10
    long_min_len: int | None = None  # default max_len + 1
    long_max_len: int | None = None  # default 2 * max_len
    disjoint: bool = True  # no sequence of validation or test appears in training
    heldout: float = 0.2  # the share of sequences (by hash) that validation and test draw from, half each

    def check(self) -> None:
        if self.symbols < 2:
            raise ConfigError(
                f"symbols={self.symbols} must be at least 2",
                field="symbols",
                value=self.symbols,
                fix="give symbols >= 2",
            )
        if not 1 <= self.min_len <= self.max_len:
            raise ConfigError(
                f"min_len={self.min_len} and max_len={self.max_len} need 1 <= min_len <= max_len",
                field="min_len",
                value=self.min_len,
                fix="give 1 <= min_len <= max_len",
                related=("max_len",),
            )
        if not 0.0 < self.heldout < 1.0:
            raise ConfigError(
                f"heldout={self.heldout} must be in (0, 1)",
                field="heldout",
                value=self.heldout,
                fix="give a number in (0, 1)",
            )
        if self.disjoint:
            for split in ("train", "validation", "test"):
                bounds = _bounds(split, self.heldout)
                lengths = range(self.min_len, self.max_len + 1)
                if all(self.symbols**n <= ENUMERATE_UP_TO and not _members(self.symbols, n, *bounds) for n in lengths):
                    raise ConfigError(
                        f"no sequence of lengths {self.min_len}..{self.max_len} over {self.symbols} symbols falls in "
                        f"the {split} split's share of the hash (disjoint splits, heldout={self.heldout}): raise "
                        "max_len, symbols or heldout, or set disjoint: false",
                        field="disjoint",
                        value=True,
                        fix="raise max_len, symbols or heldout, or set disjoint: false",
                        related=("max_len", "symbols", "heldout", "min_len"),
                    )
        lo, hi = self.long_range
        if not self.max_len < lo <= hi:
            raise ConfigError(
                f"long_min_len={lo} and long_max_len={hi} need max_len={self.max_len} < long_min_len <= long_max_len",
                field="long_min_len",
                value=lo,
                fix=f"give {self.max_len} < long_min_len <= long_max_len",
                related=("long_max_len", "max_len"),
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


def _share(src: list[int]) -> float:
    """Where a sequence falls in [0, 1), by a hash of its symbols: the same on every machine and run."""
    digest = hashlib.blake2b(",".join(map(str, src)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def _bounds(split: str, heldout: float) -> tuple[float, float]:
    """The part of [0, 1) whose sequences belong to ``split``: validation and test share ``heldout``."""
    return {"validation": (0.0, heldout / 2), "test": (heldout / 2, heldout)}.get(split, (heldout, 1.0))


ENUMERATE_UP_TO = 20_000  # lengths with at most this many sequences are enumerated, not sampled


@lru_cache(maxsize=64)
def _members(symbols: int, length: int, lo: float, hi: float) -> tuple[tuple[int, ...], ...]:
    """Every sequence of a short length whose share falls in [lo, hi)."""
    out = []
    for code in range(symbols**length):
        src = [FIRST_SYMBOL + (code // symbols**i) % symbols for i in range(length)]
        if lo <= _share(src) < hi:
            out.append(tuple(src))
    return tuple(out)


def _draw(rng: random.Random, symbols: int, a: int, b: int, bounds: tuple[float, float] | None) -> list[int]:
    """A sequence of uniform length in [a, b] and uniform symbols; with ``bounds``, one of its split (a length
    with no sequence in the split is drawn again)."""
    while True:
        n = rng.randint(a, b)
        if bounds is None:
            return [FIRST_SYMBOL + rng.randrange(symbols) for _ in range(n)]
        if symbols**n <= ENUMERATE_UP_TO:
            members = _members(symbols, n, *bounds)
            if members:
                return list(members[rng.randrange(len(members))])
            continue
        while True:  # a long length: a share of its many sequences, found by drawing
            src = [FIRST_SYMBOL + rng.randrange(symbols) for _ in range(n)]
            if bounds[0] <= _share(src) < bounds[1]:
                return src


def _distinct(rng: random.Random, symbols: int, a: int, b: int, bounds: tuple[float, float], size: int):
    """Up to ``size`` different sequences whose share falls in ``bounds``, of uniform length in [a, b] among the
    lengths that still have one unused (short lengths run out: each of their sequences appears once)."""
    left = {n: None for n in range(a, b + 1)}  # length -> its unused members, shuffled (enumerated lengths)
    seen: set[tuple[int, ...]] = set()
    repeats = dict.fromkeys(left, 0)
    while len(seen) < size and left:
        n = rng.choice(sorted(left))
        if symbols**n <= ENUMERATE_UP_TO:
            if left[n] is None:
                left[n] = list(_members(symbols, n, *bounds))
                rng.shuffle(left[n])
            if not left[n]:
                del left[n]
                continue
            src = left[n].pop()
        else:
            src = tuple(_draw(rng, symbols, n, n, bounds))
            if src in seen:  # rare: a long length holds thousands of the split's sequences
                repeats[n] += 1
                if repeats[n] > 1_000:  # so many drawn again: taken as used up (a split asked for most of them)
                    del left[n]
                continue
        seen.add(src)
        yield list(src)


def _examples(
    split: str,
    task: str,
    symbols: int,
    min_len: int,
    max_len: int,
    lo: int,
    hi: int,
    seed: int,
    size: int,
    disjoint: bool = True,
    heldout: float = 0.2,
    **_,
):
    rng = random.Random(seed)
    a, b = (lo, hi) if split == "test_long" else (min_len, max_len)
    if split == "train":
        bounds = _bounds(split, heldout) if disjoint else None
        sources = (_draw(rng, symbols, a, b, bounds) for _ in range(size))
    else:  # held out: every sequence once (without disjoint splits, drawn from every sequence)
        sources = _distinct(
            rng, symbols, a, b, _bounds(split, heldout) if disjoint and split != "test_long" else (0.0, 1.0), size
        )
    for src in sources:
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

    def target_positions(self, split: str) -> int:
        return (self.params.long_range[1] if split == "test_long" else self.params.max_len) + 1

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
