"""What every task shares: token conventions and parameters checked strictly (``batches`` pads them into
tensors, ``data`` holds the DataModule).

A task is one module in models/tasks/ with one ``Task`` subclass registered in ``models.tasks.TASKS``.
It says which archs it fits, its vocabulary and classes, and builds its splits as Hugging Face
``datasets`` (generated with ``Dataset.from_generator``: cached by fingerprint, the same on every run
with the same parameters). The run's seed only changes the order in which training examples are seen.

Kinds of examples (one per task):
  seq2seq   {"src": [...], "tgt": [...]}                      encoder_decoder; targets end with EOS
  lm        {"tokens": [...], "loss_mask": [...] (optional)}   decoder; mask aligned with tokens[1:]: the answer
            tokens (scored, and exact match over them); or "score_mask": the tokens scored, no exact match
  classify  {"tokens": [...], "label": int}                    encoder
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import operator
import types
import typing
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Annotated, Any, ClassVar

from annotated_types import Ge
from pydantic import ConfigDict, TypeAdapter, ValidationError
from typing_extensions import TypedDict

from models.config import ConfigError
from models.errors import Refusal, refusal, refusals_of
from models.fields import Number

PAD, BOS, EOS, SEP = 0, 1, 2, 3
FIRST_SYMBOL = 4  # task symbols start here
NEVER_TARGETS = (PAD, BOS, SEP)  # the special tokens a sequence-to-sequence target never holds (EOS it does)


# What each type a task's parameter is annotated with takes, strictly (True is not an int); a number written as an
# int is kept as given. Any other type (a mapping of files, say) is the task's ``check`` to refuse.
_TYPES: dict[Any, Any] = {int: int, float: Number, str: str, bool: bool, type(None): type(None)}


@dataclass(frozen=True)
class TaskParams:
    """Base of each task's parameters. Subclasses add fields (a plain ``dataclass``: a plugin's task too) and override
    ``check``. Each field's annotation is its type, validated by pydantic (``_validator``) as the model's and the
    training's are, with its range where an ``Annotated`` one says it (``SyntheticParams``)."""

    data_seed: int = 0  # generates (or splits) the data; the run's seed only shuffles the training order

    def __post_init__(self) -> None:
        validate, refusals, order = _validator(type(self))
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        try:
            validate(values)
        except ValidationError as err:
            raise refusal(err, values, refusals, order, type(self).__name__) from None
        self.check()

    def check(self) -> None:
        """Cross-field checks of the task; raise ConfigError naming the field and the fix."""


@functools.cache
def _validator(cls: type) -> tuple[Any, dict[str, tuple[Refusal, ...]], list[str]]:
    """The pydantic validator of ``cls``'s fields (a TypedDict of them, strict), each field's refusals (those its
    annotation declares, then ``must be of type int``) and their order: every field's type, then the ranges."""
    hints = typing.get_type_hints(cls, include_extras=True)
    fields_ = {}
    refusals = refusals_of(cls)
    for f in fields(cls):
        hint = hints[f.name]
        bare = typing.get_args(hint)[0] if typing.get_origin(hint) is Annotated else hint
        kinds = typing.get_args(bare) if isinstance(bare, types.UnionType) else (bare,)
        taken = Any if any(k not in _TYPES for k in kinds) else functools.reduce(operator.or_, map(_TYPES.get, kinds))
        metadata = getattr(hint, "__metadata__", ())
        fields_[f.name] = Annotated[(taken, *metadata)] if metadata else taken
        kind = " | ".join(getattr(k, "__name__", str(k)).replace("NoneType", "None") for k in kinds)
        refusals[f.name] = (
            *refusals.get(f.name, ()),
            Refusal(f"{{name}}={{value!r}} must be of type {kind}", f"give a value of type {kind}"),
        )
    shape = TypedDict(cls.__name__, fields_)
    shape.__pydantic_config__ = ConfigDict(strict=True)
    names = [f.name for f in fields(cls)]
    return TypeAdapter(shape).validate_python, refusals, [*names, *(f"{n}:greater_than_equal" for n in names)]


SplitSize = Annotated[
    int, Ge(1), Refusal("{name}={value} must be at least 1", "give an integer >= 1", ("greater_than_equal",))
]


@dataclass(frozen=True)
class SyntheticParams(TaskParams):
    """Generated tasks: how many examples per split."""

    train_size: SplitSize = 10_000
    val_size: SplitSize = 500
    test_size: SplitSize = 500


class Task:
    """A task: its parameters, what model it fits, its data."""

    name: ClassVar[str]
    kind: ClassVar[str]  # seq2seq | lm | classify
    archs: ClassVar[tuple[str, ...]]
    Params: ClassVar[type[TaskParams]] = TaskParams
    splits: ClassVar[tuple[str, ...]] = ("train", "validation", "test")
    answer_mask: ClassVar[bool] = False  # lm tasks that mark answer tokens (loss_mask): exact match is scored

    def __init__(self, params: TaskParams) -> None:
        self.params = params

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Task:
        names = [f.name for f in fields(cls.Params)]
        unknown = sorted(set(data) - set(names))
        if unknown:
            raise ConfigError(
                f"unknown key(s) {unknown} for task {cls.name!r}; valid keys: {sorted(names)}",
                field=unknown[0],
                value=data[unknown[0]],
                fix=f"remove {unknown[0]} or correct its name",
                related=unknown[1:],
            )
        return cls(cls.Params(**data))

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, **dataclasses.asdict(self.params)}

    # what the model must provide
    @property
    def vocab_size(self) -> int:
        raise NotImplementedError

    @property
    def n_classes(self) -> int | None:
        return None

    @property
    def max_length(self) -> int:
        """The longest sequence (source or target, with BOS/EOS) the model is given, over all splits."""
        raise NotImplementedError

    def build(self, split: str, cache_dir: str | None = None):
        """The split as a ``datasets.Dataset`` (generated, cached by fingerprint)."""
        raise NotImplementedError

    def output_classes(self, model: Any) -> int | None:
        """How many classes a run's loss is over, for its chance level (a uniform guess scores ln C), recorded with
        every run for comparing to read: an encoder's classes; the tokens an encoder-decoder's target can hold (its
        target vocabulary less ``NEVER_TARGETS``); a decoder's vocabulary. None for token tagging (its loss sums
        over a sequence's tokens, not one choice). A task scored on part of its tokens overrides it (recall: its
        answers are values). ``model``: the run's ModelConfig."""
        if model.arch == "encoder":
            return None if model.classifier == "token" else _at_least_two(model.n_classes)
        if model.arch == "encoder_decoder":
            return max(2, (model.tgt_vocab_size or model.vocab_size) - len(NEVER_TARGETS))
        return _at_least_two(model.vocab_size)

    def target_positions(self, split: str) -> int:
        """seq2seq: the most target positions (end of sequence included) of the split, whose decoded error is
        logged position by position after training (``<split>/error_at_<k>``); 0: none."""
        return 0

    def describe(self) -> str:
        return f"{self.name}: " + ", ".join(f"{k}={v}" for k, v in dataclasses.asdict(self.params).items())

    def lineage(self, split: str) -> dict[str, Any]:
        """What identifies the data of a split (logged to MLflow as the dataset's source)."""
        return {"task": self.name, "split": split, **dataclasses.asdict(self.params)}

    @classmethod
    def anchored(cls, spec: dict[str, Any], folder: Path) -> dict[str, Any]:
        """``spec`` (a task section as written) with its relative local paths made absolute against ``folder``, the
        folder of the run or study file that wrote them; as it is for a task that reads no files."""
        return spec

    @classmethod
    def content_spec(cls, spec: dict[str, Any]) -> dict[str, Any]:
        """``spec`` as it enters a run's identity (``RunConfig.config_hash``): each local file it reads named by the
        digest of its contents, not by its path (an edited file is other data, one file at two paths the same)."""
        return spec


def _at_least_two(n: int | None) -> int | None:
    return n if n is not None and n >= 2 else None


@functools.cache
def data_code() -> str:
    """A digest of the code that makes the tasks' data (this package's sources): part of every split's cache
    fingerprint. ``datasets`` hashes a generator by its module and name only, so a fixed ListOps evaluator or
    sort order read the old examples from the cache."""
    h = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def _module_code(module: str) -> str:
    """A digest of a module's source when it is not one of this package's (a plugin's task: its edits are other
    data, which ``datasets``' fingerprint of the generator's name alone would not see); "" for this package's."""
    if module.startswith("models.tasks."):
        return ""
    import sys

    path = getattr(sys.modules.get(module), "__file__", None)
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16] if path else ""


def generate(owner: Task, split: str, generator, cache_dir: str | None, features, **kwargs):
    """Dataset.from_generator with everything that defines the data in gen_kwargs (the cache fingerprint): the
    split, the task's parameters, what the caller adds, and the code that makes the data (``data_code``)."""
    from datasets import Dataset, disable_progress_bars

    disable_progress_bars()
    code = data_code() + "".join(_module_code(m) for m in {type(owner).__module__, generator.__module__})
    gen_kwargs = {"split": split, **dataclasses.asdict(owner.params), **kwargs, "data_code": code}
    return Dataset.from_generator(
        generator, features=features, gen_kwargs=gen_kwargs, cache_dir=cache_dir, keep_in_memory=cache_dir is None
    )


def split_seed(params: TaskParams, split: str) -> int:
    """A different, fixed random stream per split."""
    return params.data_seed * 1_000 + {"train": 1, "validation": 2, "test": 3, "test_long": 4}.get(split, 5)


def split_size(params: SyntheticParams, split: str) -> int:
    return {"train": params.train_size, "validation": params.val_size}.get(split, params.test_size)
