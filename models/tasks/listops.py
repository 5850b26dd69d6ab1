"""ListOps (Nangia and Bowman 2018; the Long Range Arena's long version, Tay et al. 2021), our own
generator: nested lists of operators over digits, classified by their value (10 classes, encoder).

    [MAX 2 9 [MIN 4 7 ] 0 ]  ->  9

Operators: MIN, MAX, MED (median, rounded down like LRA's int(np.median)), SM (sum modulo 10).
Trees grow like LRA's: at each node below ``max_depth``, a digit with probability 1 - ``operator_p``,
otherwise an operator with 2 to ``max_args`` arguments. Sequences are drawn until their length in tokens
falls within [min_len, max_len] (LRA: 500 to 2000 tokens, max_depth 10, max_args 10).
Tokens: a leading SEP (a CLS position), the operators with their opening bracket, "]", the digits.
"""

from __future__ import annotations

import dataclasses
import random
import statistics
from dataclasses import dataclass

from models.config import ConfigError
from models.tasks.base import FIRST_SYMBOL, SEP, SyntheticParams, Task, generate, split_seed, split_size

OPERATORS = ("[MIN", "[MAX", "[MED", "[SM")
VOCAB = (*OPERATORS, "]", *(str(d) for d in range(10)))
TOKEN = {word: FIRST_SYMBOL + i for i, word in enumerate(VOCAB)}


@dataclass(frozen=True)
class ListOpsParams(SyntheticParams):
    max_depth: int = 4
    max_args: int = 5
    min_len: int = 20
    max_len: int = 100
    operator_p: float = 0.25  # LRA's VALUE_P: probability that a node below max_depth is an operator

    def check(self) -> None:
        if self.max_depth < 2 or self.max_args < 2:  # the root is always an operator: depth 1 was depth 2's data
            field = "max_depth" if self.max_depth < 2 else "max_args"
            raise ConfigError(
                f"max_depth={self.max_depth} must be >= 2 and max_args={self.max_args} >= 2",
                field=field,
                value=getattr(self, field),
                fix=f"give {field} >= 2",
                related=("max_args",) if field == "max_depth" else ("max_depth",),
            )
        if not 5 <= self.min_len <= self.max_len:
            raise ConfigError(
                f"min_len={self.min_len} and max_len={self.max_len} need 5 <= min_len <= max_len",
                field="min_len",
                value=self.min_len,
                fix="give 5 <= min_len <= max_len",
                related=("max_len",),
            )
        longest = 1 + longest_tree(self.max_depth, self.max_args)  # with the separator
        if self.min_len > longest:  # no tree is that long: generating would never end
            raise ConfigError(
                f"min_len={self.min_len} is longer than any expression of max_depth={self.max_depth} and max_args="
                f"{self.max_args} ({longest} tokens at most): lower min_len, or raise max_depth or max_args",
                field="min_len",
                value=self.min_len,
                fix=f"lower min_len to {longest} or less, or raise max_depth or max_args",
                related=("max_depth", "max_args"),
            )
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        if self.operator_p != defaults["operator_p"] and self.max_depth < 3:  # depth 1 is an operator, the last digits
            raise ConfigError(
                f"operator_p={self.operator_p} decides operator or digit below the root and above max_depth; with "
                f"max_depth={self.max_depth} there is no such node (remove operator_p, or raise max_depth)",
                field="operator_p",
                value=self.operator_p,
                fix="remove operator_p, or raise max_depth to 3 or more",
                related=("max_depth",),
            )
        if self.max_len != defaults["max_len"] and self.max_len > longest:
            raise ConfigError(
                f"max_len={self.max_len} is above the longest expression of max_depth={self.max_depth} and max_args="
                f"{self.max_args} ({longest} tokens with its start token): it bounds nothing (remove it, or "
                f"lower it to {longest} or less)",
                field="max_len",
                value=self.max_len,
                fix=f"remove max_len, or give {longest} or less",
                related=("max_depth", "max_args"),
            )
        if not 0.0 < self.operator_p < 1.0:
            raise ConfigError(
                f"operator_p={self.operator_p} must be in (0, 1)",
                field="operator_p",
                value=self.operator_p,
                fix="give a number in (0, 1)",
            )


def longest_tree(max_depth: int, max_args: int, depth: int = 1) -> int:
    """The most words ``tree`` can write: an operator and its bracket around max_args children below max_depth."""
    if depth >= max_depth:
        return 1
    return 2 + max_args * longest_tree(max_depth, max_args, depth + 1)


def tree(rng: random.Random, depth: int, max_depth: int, max_args: int, operator_p: float):
    """A digit, or (operator, [children])."""
    if depth == 1 or (depth < max_depth and rng.random() < operator_p):
        op = OPERATORS[rng.randrange(len(OPERATORS))]
        return op, [tree(rng, depth + 1, max_depth, max_args, operator_p) for _ in range(rng.randint(2, max_args))]
    return rng.randrange(10)


def evaluate(node) -> int:
    if isinstance(node, int):
        return node
    op, args = node
    values = [evaluate(a) for a in args]
    if op == "[MIN":
        return min(values)
    if op == "[MAX":
        return max(values)
    if op == "[MED":
        return int(statistics.median(values))
    return sum(values) % 10


def words(node) -> list[str]:
    if isinstance(node, int):
        return [str(node)]
    op, args = node
    return [op, *(w for a in args for w in words(a)), "]"]


def _examples(max_depth: int, max_args: int, min_len: int, max_len: int, operator_p: float, seed: int, size: int, **_):
    rng = random.Random(seed)
    made = 0
    while made < size:
        t = tree(rng, 1, max_depth, max_args, operator_p)
        ws = words(t)
        if min_len <= len(ws) + 1 <= max_len:
            made += 1
            yield {"tokens": [SEP, *(TOKEN[w] for w in ws)], "label": evaluate(t)}


class ListOpsTask(Task):
    name = "listops"
    kind = "classify"
    archs = ("encoder",)
    Params = ListOpsParams

    @property
    def vocab_size(self) -> int:
        return FIRST_SYMBOL + len(VOCAB)

    @property
    def n_classes(self) -> int:
        return 10

    @property
    def max_length(self) -> int:
        return self.params.max_len

    def build(self, split: str, cache_dir: str | None = None):
        from datasets import ClassLabel, Features, Sequence, Value

        p = self.params
        features = Features({"tokens": Sequence(Value("int32")), "label": ClassLabel(num_classes=10)})
        return generate(
            self, split, _examples, cache_dir, features, seed=split_seed(p, split), size=split_size(p, split)
        )
