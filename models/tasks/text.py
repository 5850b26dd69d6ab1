"""Byte- or character-level language modelling on a text corpus (decoder).

``source`` names the corpus:
  pydoc           built in, needs no network: the English help topics that ship with every CPython
                  (``pydoc_data.topics``, about 460 KB)
  PATH            a local text file, or a folder whose files are read in sorted order
  hf:NAME[:CONFIG]  ``datasets.load_dataset(NAME, CONFIG)`` (its "text" column) when the hub is reachable

The corpus is split by position (the first 90% trains, then validation, then test), cut into blocks of
``block_size`` + 1 tokens; ``max_chars`` caps the corpus read.

``long_block_size`` adds a split ``test_long``: the test text in longer blocks, scored only where the model
predicts from positions it never saw in training (position ``block_size`` and beyond): length generalisation
of a causal language model (Press et al. 2022 evaluate ALiBi so), with no in-distribution positions mixed in.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections import Counter
from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path

from models.config import ConfigError
from models.errors import not_a_choice
from models.tasks.base import FIRST_SYMBOL, Task, TaskParams, generate


class DataUnavailable(RuntimeError):
    """The corpus cannot be read (missing file, no network for a hub dataset)."""


@dataclass(frozen=True)
class TextParams(TaskParams):
    source: str = "pydoc"
    level: str = "byte"  # byte | char
    block_size: int = 128
    val_fraction: float = 0.05
    test_fraction: float = 0.05
    max_chars: int | None = None
    long_block_size: int | None = None  # test_long: blocks this long, scored beyond block_size only

    def check(self) -> None:
        if self.level not in ("byte", "char"):
            raise ConfigError(
                not_a_choice("level", self.level, ("byte", "char")),
                field="level",
                value=self.level,
                fix="use 'byte' or 'char'",
            )
        if self.block_size < 2:
            raise ConfigError(
                f"block_size={self.block_size} must be at least 2",
                field="block_size",
                value=self.block_size,
                fix="give block_size >= 2",
            )
        if not (0 < self.val_fraction < 0.5 and 0 < self.test_fraction < 0.5):
            field = "val_fraction" if not 0 < self.val_fraction < 0.5 else "test_fraction"
            raise ConfigError(
                "val_fraction and test_fraction must each be in (0, 0.5)",
                field=field,
                value=getattr(self, field),
                fix=f"give {field} in (0, 0.5)",
            )
        if self.long_block_size is not None and self.long_block_size <= self.block_size:
            raise ConfigError(
                f"long_block_size={self.long_block_size} must exceed block_size={self.block_size} (it tests longer "
                "sequences than training saw)",
                field="long_block_size",
                value=self.long_block_size,
                fix=f"give long_block_size > {self.block_size}, or remove it",
                related=("block_size",),
            )
        if self.data_seed != 0:
            raise ConfigError(
                f"data_seed={self.data_seed} draws a synthetic task's data; the text task splits its corpus by position "
                "(the same data for every seed): remove it (or vary_data from the study)",
                field="data_seed",
                value=self.data_seed,
                fix="remove data_seed",
            )
        if self.max_chars is not None and self.max_chars < 1000:
            raise ConfigError(
                f"max_chars={self.max_chars} must be at least 1000",
                field="max_chars",
                value=self.max_chars,
                fix="give max_chars >= 1000, or remove it",
            )
        if self.source != "pydoc" and not self.source.startswith("hf:") and not Path(self.source).exists():
            raise ConfigError(
                f"source={self.source!r} is neither 'pydoc', 'hf:NAME[:CONFIG]' nor an existing file or folder",
                field="source",
                value=self.source,
                fix="name an existing file or folder, 'pydoc' or 'hf:NAME[:CONFIG]'",
            )


def corpus_files(source: str) -> list[Path]:
    """The files a local ``source`` (a file, or a folder read in sorted order) is read from; none for the built-in
    corpus and hub datasets."""
    if source == "pydoc" or source.startswith("hf:"):
        return []
    path = Path(source)
    return [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())


@lru_cache(maxsize=64)
def _digest(stamps: tuple[tuple[str, int, int], ...]) -> str:
    h = hashlib.sha256()
    for name, _, _ in stamps:
        with open(name, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        h.update(b"\0")
    return h.hexdigest()[:16]


def files_digest(source: str) -> str | None:
    """The digest of a local corpus's bytes, file by file in reading order (read again when a file's size or time
    changes); None for the built-in corpus, hub datasets and paths with no files."""
    stamps = []
    for p in corpus_files(source):
        st = p.stat()
        stamps.append((str(p), st.st_size, st.st_mtime_ns))
    return _digest(tuple(stamps)) if stamps else None


def read_corpus(source: str, max_chars: int | None = None) -> str:
    if source == "pydoc":
        from pydoc_data.topics import topics

        text = "\n\n".join(topics[k] for k in sorted(topics))
    elif source.startswith("hf:"):
        name, _, config = source[3:].partition(":")
        try:
            from datasets import load_dataset

            ds = load_dataset(name, config or None, split="train")
        except Exception as err:  # offline, unknown name, ...
            raise DataUnavailable(
                f"could not load {name!r} from the Hugging Face hub ({type(err).__name__}: {err}); use a local "
                "file or folder (task.source: path/to/text) or the built-in corpus (task.source: pydoc)"
            ) from err
        text = "\n".join(ds["text"])
    else:
        files = corpus_files(source)
        if not files:
            raise DataUnavailable(f"source={source!r}: no files to read")
        text = "\n".join(p.read_text(encoding="utf-8", errors="replace") for p in files)
    return text[:max_chars] if max_chars else text


def _examples(split: str, digest: str, **params):
    """Blocks of block_size + 1 tokens (the digest of the corpus enters the cache fingerprint); test_long's
    blocks of long_block_size + 1 carry a score_mask that scores only the predictions made from positions
    block_size and beyond."""
    task = TextTask(TextParams(**{k: v for k, v in params.items() if k in TextParams.__dataclass_fields__}))
    p = task.params
    ids = task.split_ids(split)
    block = p.long_block_size if split == "test_long" else p.block_size
    beyond = [j >= p.block_size for j in range(block)]  # aligned with tokens[1:]
    for start in range(0, len(ids) - block, block):
        example = {"tokens": ids[start : start + block + 1]}
        if split == "test_long":
            example["score_mask"] = beyond
        yield example


class TextTask(Task):
    name = "text"
    kind = "lm"
    archs = ("decoder",)
    Params = TextParams

    @cached_property
    def corpus(self) -> str:
        return read_corpus(self.params.source, self.params.max_chars)

    @cached_property
    def alphabet(self) -> list[str]:
        return sorted(set(self.corpus))

    def encode(self, text: str) -> list[int]:
        if self.params.level == "byte":
            return [FIRST_SYMBOL + b for b in text.encode("utf-8")]
        index = {c: i for i, c in enumerate(self.alphabet)}
        return [FIRST_SYMBOL + index[c] for c in text]

    @property
    def vocab_size(self) -> int:
        return FIRST_SYMBOL + (256 if self.params.level == "byte" else len(self.alphabet))

    @property
    def splits(self) -> tuple[str, ...]:  # type: ignore[override]
        return ("train", "validation", "test") + (("test_long",) if self.params.long_block_size else ())

    @property
    def max_length(self) -> int:
        return max(self.params.block_size, self.params.long_block_size or 0)

    def split_ids(self, split: str) -> list[int]:
        ids = self.encode(self.corpus)
        n = len(ids)
        a = int(n * (1 - self.params.val_fraction - self.params.test_fraction))
        b = int(n * (1 - self.params.test_fraction))
        return {"train": ids[:a], "validation": ids[a:b], "test": ids[b:], "test_long": ids[b:]}[split]

    def unigram_entropy(self, split: str = "validation") -> float:
        """Entropy (nats) of the split's tokens under their own unigram distribution: a model that
        ignores context cannot do better."""
        counts = Counter(self.split_ids(split))
        total = sum(counts.values())
        return -sum(c / total * math.log(c / total) for c in counts.values())

    def build(self, split: str, cache_dir: str | None = None):
        from datasets import Features, Sequence, Value

        features = {"tokens": Sequence(Value("int32"))}
        if split == "test_long":
            features["score_mask"] = Sequence(Value("bool"))
        ids = self.split_ids(split)
        block, name = (
            (self.params.long_block_size, "long_block_size")
            if split == "test_long"
            else (self.params.block_size, "block_size")
        )
        if len(ids) <= block:
            raise DataUnavailable(
                f"the {split} split of source={self.params.source!r} has {len(ids)} tokens, fewer than one block "
                f"of {name}={block}; use a larger corpus or a smaller {name}"
            )
        features = Features(features)
        return generate(self, split, _examples, cache_dir, features, digest=self.digest)

    @cached_property
    def digest(self) -> str:
        return hashlib.sha256(self.corpus.encode("utf-8")).hexdigest()[:16]

    @classmethod
    def anchored(cls, spec: dict, folder: Path) -> dict:
        source = spec.get("source")
        if not isinstance(source, str) or not source or source == "pydoc" or source.startswith("hf:"):
            return spec
        expanded = Path(source).expanduser()
        if not expanded.is_absolute():
            expanded = Path(os.path.normpath(Path(folder).absolute() / expanded))
        return {**spec, "source": str(expanded)}

    @classmethod
    def content_spec(cls, spec: dict) -> dict:
        """A local corpus by the digest of its files (``files_digest``); the built-in and hub ones by name."""
        source = spec.get("source")
        digest = files_digest(source) if isinstance(source, str) else None
        return {**spec, "source": f"sha256:{digest}"} if digest is not None else spec
