"""A researcher's own data as a task: the rows of a JSON lines, CSV or text file, or of any Hugging Face ``datasets``
builder, tokenised by bytes or characters. One task per kind of example (``models.tasks.base``):

  data_seq2seq   src_column -> tgt_column     encoder_decoder   {"src": enc(src), "tgt": enc(tgt)} (EOS added in batches)
  data_classify  text_column, label_column    encoder           {"tokens": [SEP, *enc(text)], "label": class id}
  data_lm        text_column                  decoder           {"tokens": [BOS, *enc(text), EOS]}: a row a sequence

``source`` says where the rows are:
  PATH                                        one local file; validation and test are cut from it (below)
  {train: PATH, validation: PATH, test: PATH} a file per split (a split left out is cut from train)
  {builder: NAME, name: CONFIG, data_files: ..., data_dir: ..., split: ..., revision: ..., KEY: VALUE}
                                              ``datasets.load_dataset(NAME, CONFIG, data_files=..., ...)``: a packaged
                                              builder (json, csv, parquet, text, ...), a local folder of data files, or
                                              a hub dataset; other keys are the builder's own (delimiter, field, ...).
                                              Its splits train, validation and test are read (a split left out is cut
                                              from train); any other is ignored (``describe`` names it)
A file's format is its extension, else ``format``: ``.jsonl``/``.json`` JSON lines (or one JSON array of objects),
``.csv``, ``.tsv`` (Python's csv module: every value text, as written), ``.txt`` one row per non-empty line in the
column ``text``. Relative paths in a run, study or base file are read from that file's folder (``anchored``).

Splits cut from train: its rows are shuffled by ``data_seed``; the first round(n * val_fraction) go to validation, the
next round(n * test_fraction) to test, the rest stay in train (each split in the source's order). Rows are cut, not
deduplicated: a row written twice may fall in two splits. A fraction or data seed that cuts nothing is refused.

Tokens: ``level: byte``, FIRST_SYMBOL + each UTF-8 byte (vocab_size FIRST_SYMBOL + 256); ``level: char``,
FIRST_SYMBOL + the character's place among the sorted characters of every split's text (vocab_size FIRST_SYMBOL +
their number). Text values are text, or integers written in decimal. Labels (text, integers or booleans, written
``true``/``false``) become class ids in sorted order of the training labels: integers by value first, then text by
code point; ``n_classes`` is their number. ``max_length`` is the longest sequence the model is given, over all splits.

Everything is checked when the task is made (``resolve_run``: before anything trains), each refusal a ConfigError
naming the key and the fix: a missing file or column (with the columns the row has), a value that is no text, an empty
split, a label unseen in training, fewer than two classes, an empty source sequence, a sequence longer than
``max_len``. A hub dataset that cannot be loaded (offline) raises ``SourceUnavailable``, both a ConfigError and a
``DataUnavailable``.

Identity: a run's ``config_hash`` names every local file by the digest of its bytes (``content_spec``): an edited file
is other data, the same file at two paths the same data. A split's cache fingerprint (``generate``) holds the digest
of the rows as read, so an edited file (or hub dataset) is generated again.
"""

from __future__ import annotations

import csv
import dataclasses
import glob
import hashlib
import importlib.util
import io
import json
import os
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, ClassVar

from models.config import ConfigError
from models.errors import not_a_choice
from models.tasks.base import BOS, EOS, FIRST_SYMBOL, SEP, Task, TaskParams, generate
from models.tasks.text import DataUnavailable

SPLITS = ("train", "validation", "test")
FORMATS = ("jsonl", "json", "csv", "tsv", "text")
EXTENSIONS = {".jsonl": "jsonl", ".json": "json", ".csv": "csv", ".tsv": "tsv", ".txt": "text", ".text": "text"}
BUILDER_KEYS = ("builder", "name", "data_files", "data_dir", "split", "revision")  # the rest: the builder's own
NOT_BUILDER_ARGS = (  # load_dataset's operational arguments: not the data's, and the task chooses them
    "cache_dir", "keep_in_memory", "streaming", "num_proc", "token", "download_mode", "download_config",
    "verification_mode", "storage_options", "save_infos", "features",
)  # fmt: skip
SOURCE_FORMS = (
    "a file (source: data.jsonl), a file per split (source: {train: train.csv, validation: dev.csv}) or a datasets "
    "builder (source: {builder: json, data_files: {train: a.jsonl, validation: b.jsonl}})"
)


class SourceUnavailable(ConfigError, DataUnavailable):
    """A source that cannot be loaded where the task is made (a hub dataset offline): a refusal of ``source`` (a run
    file names its line) and a ``DataUnavailable`` (what the command line says of unreadable data)."""


def _refused(message: str, *, field: str, value: Any, fix: str, related: tuple[str, ...] = ()) -> ConfigError:
    """A refusal whose text says the fix after the problem (what a person reads; a program reads ``fix``)."""
    return ConfigError(f"{message}: {fix}", field=field, value=value, fix=fix, related=related)


# --- parameters -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DataParams(TaskParams):
    """Where the rows are, how they are tokenised and split (each kind adds the columns it reads)."""

    source: str | dict | None = None  # a file, {split: file}, or {builder: NAME, ...}
    format: str | None = None  # jsonl | json | csv | tsv | text; default: each file's extension
    level: str = "byte"  # byte | char
    val_fraction: float = 0.1  # of train's rows, cut to validation when the source has no validation split
    test_fraction: float = 0.1  # likewise for test
    max_len: int | None = None  # the longest sequence allowed (tokens the model is given); longer is refused

    def check(self) -> None:
        _check_source(self.source)
        if self.format is not None and self.format not in FORMATS:
            raise ConfigError(
                not_a_choice("format", self.format, FORMATS),
                field="format",
                value=self.format,
                fix=f"use one of {', '.join(FORMATS)}, or remove format (each file's extension decides)",
            )
        if self.format is not None and isinstance(self.source, dict) and "builder" in self.source:
            raise ConfigError(
                f"format={self.format!r} names a file format, and the builder {self.source['builder']!r} reads the "
                "files (remove format)",
                field="format",
                value=self.format,
                fix="remove format",
                related=("source",),
            )
        if self.level not in ("byte", "char"):
            raise ConfigError(
                not_a_choice("level", self.level, ("byte", "char")),
                field="level",
                value=self.level,
                fix="use 'byte' or 'char'",
            )
        for name in ("val_fraction", "test_fraction"):
            if not 0 < getattr(self, name) < 0.5:
                raise ConfigError(
                    f"{name}={getattr(self, name)} must be in (0, 0.5)",
                    field=name,
                    value=getattr(self, name),
                    fix=f"give {name} in (0, 0.5)",
                )
        if self.max_len is not None and self.max_len < 2:
            raise ConfigError(
                f"max_len={self.max_len} must be at least 2",
                field="max_len",
                value=self.max_len,
                fix="give max_len >= 2, or remove it",
            )
        for f in dataclasses.fields(self):
            if f.name.endswith("_column") and not getattr(self, f.name):
                raise ConfigError(
                    f"{f.name} must name a column", field=f.name, value=getattr(self, f.name), fix="name a column"
                )


def _check_source(source: Any) -> None:
    def refuse(message: str, fix: str = f"give {SOURCE_FORMS}") -> ConfigError:
        return ConfigError(message if fix in message else f"{message}: {fix}", field="source", value=source, fix=fix)

    if source is None:
        raise refuse(f"a data task needs a source: {SOURCE_FORMS}")
    if isinstance(source, str):
        if not source.strip():
            raise refuse("source='' names no file")
        return
    if not isinstance(source, dict):
        raise refuse(f"source={source!r} is neither a path nor a mapping: give {SOURCE_FORMS}")
    if "builder" in source:
        if not isinstance(source["builder"], str) or not source["builder"]:
            raise refuse(
                f"source.builder={source['builder']!r} must name a datasets builder",
                "name a builder (json, csv, parquet, text), a local folder or a hub dataset",
            )
        operational = sorted(k for k in source if k in NOT_BUILDER_ARGS)
        if operational:
            raise refuse(
                f"source.{operational[0]} is load_dataset's, not the data's: the task chooses it (remove it)",
                f"remove source.{operational[0]}",
            )
        for key in ("name", "data_dir", "split", "revision"):
            if source.get(key) is not None and not isinstance(source[key], str):
                raise refuse(f"source.{key}={source[key]!r} must be text", f"give source.{key} as text")
        files = source.get("data_files")
        if files is not None and not _files_shape(files):
            raise refuse(
                f"source.data_files={files!r} must be a path, a list of paths, or a mapping of split to paths",
                "give data_files: a.jsonl, [a.jsonl, b.jsonl] or {train: a.jsonl, validation: b.jsonl}",
            )
        return
    unknown = sorted(str(k) for k in source if k not in SPLITS)
    if unknown:
        raise refuse(
            f"source: unknown split(s) {unknown}; a file per split takes the keys {', '.join(SPLITS)} (or "
            "'builder' for a datasets builder)",
            f"use {', '.join(SPLITS)}, or source: {{builder: ...}}",
        )
    if "train" not in source:
        raise refuse("source names files per split without train: every task trains on a train file")
    for split, path in source.items():
        if not isinstance(path, str) or not path.strip():
            raise refuse(f"source.{split}={path!r} must be the path of a file", f"give source.{split} as a path")


def _files_shape(files: Any) -> bool:
    if isinstance(files, str):
        return bool(files)
    if isinstance(files, list):
        return bool(files) and all(isinstance(f, str) and f for f in files)
    if isinstance(files, dict):
        return bool(files) and all(isinstance(k, str) and _files_shape(v) for k, v in files.items())
    return False


@dataclass(frozen=True)
class DataSeq2SeqParams(DataParams):
    src_column: str = "source"
    tgt_column: str = "target"


@dataclass(frozen=True)
class DataClassifyParams(DataParams):
    text_column: str = "text"
    label_column: str = "label"


@dataclass(frozen=True)
class DataLMParams(DataParams):
    text_column: str = "text"


# --- paths: anchored to the file that wrote them, named by their contents ------------------------------------------


def _is_url(path: str) -> bool:
    return "://" in path


def _anchor(path: Any, folder: Path) -> Any:
    """A relative local path made absolute against ``folder`` (``~`` expanded); anything else as it is."""
    if not isinstance(path, str) or not path or _is_url(path):
        return path
    expanded = os.path.expanduser(path)
    return expanded if os.path.isabs(expanded) else os.path.normpath(Path(folder).absolute() / expanded)


def _map_files(files: Any, fn) -> Any:
    if isinstance(files, list):
        return [fn(f) for f in files]
    if isinstance(files, dict):
        return {k: _map_files(v, fn) for k, v in files.items()}
    return fn(files)


def _local_builder(builder: str) -> bool:
    return os.path.isdir(os.path.expanduser(builder))


def _packaged(builder: str) -> bool:
    """A builder that ships with ``datasets`` (json, csv, parquet, text, ...)."""
    if not builder.isidentifier():
        return False
    try:
        return importlib.util.find_spec(f"datasets.packaged_modules.{builder}") is not None
    except ImportError:
        return False


def anchored_source(source: Any, folder: Path) -> Any:
    """``source`` with its relative local paths made absolute against ``folder``: a file, the files per split, a
    builder's local folder, its ``data_dir``, and its ``data_files`` (those of a builder given a ``data_dir`` or a
    local folder are read there, as ``datasets`` does, and stay as written)."""
    if isinstance(source, str):
        return _anchor(source, folder)
    if not isinstance(source, dict):
        return source
    if "builder" not in source:
        return {k: _anchor(v, folder) for k, v in source.items()}
    out = dict(source)
    builder = source["builder"]
    if isinstance(builder, str) and builder and not _packaged(builder) and (Path(folder) / builder).is_dir():
        out["builder"] = _anchor(builder, folder)
    if source.get("data_dir") is not None:
        out["data_dir"] = _anchor(source["data_dir"], folder)
    elif source.get("data_files") is not None and not (isinstance(builder, str) and _local_builder(out["builder"])):
        out["data_files"] = _map_files(source["data_files"], lambda f: _anchor(f, folder))
    return out


def _base_folder(source: dict) -> str:
    """Where a builder's relative ``data_files`` are read: its ``data_dir``, its local folder, else here."""
    if source.get("data_dir"):
        return os.path.expanduser(source["data_dir"])
    builder = source.get("builder")
    return os.path.expanduser(builder) if isinstance(builder, str) and _local_builder(builder) else "."


def _matches(pattern: str, base: str) -> list[str]:
    """The local files a data_files entry names (a glob matches its files, in sorted order)."""
    if not isinstance(pattern, str) or _is_url(pattern):
        return []
    path = os.path.join(base, os.path.expanduser(pattern))
    if glob.has_magic(path):
        return sorted(p for p in glob.glob(path, recursive=True) if os.path.isfile(p))
    return [path] if os.path.isfile(path) else []


def _folder_files(folder: str) -> list[str]:
    """Every file under ``folder`` that ``datasets`` would see (hidden ones left out), in sorted order."""
    out = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        out += [os.path.join(root, f) for f in sorted(files) if not f.startswith(".")]
    return out


def source_files(source: Any) -> list[str]:
    """Every local file ``source`` reads (none for a hub dataset): what the load cache is keyed on."""
    if isinstance(source, str):
        return [source] if os.path.isfile(source) else []
    if not isinstance(source, dict):
        return []
    if "builder" not in source:
        return [p for p in source.values() if isinstance(p, str) and os.path.isfile(p)]
    out: list[str] = []
    base = _base_folder(source)
    if source.get("data_files") is not None:
        _map_files(source["data_files"], lambda f: out.extend(_matches(f, base)))
    elif base != ".":
        out += _folder_files(base)
    return out


@lru_cache(maxsize=256)
def _digest(stamps: tuple[tuple[str, int, int], ...], root: str | None) -> str:
    """The digest of the files' bytes in order (read again when a file's size or time changes); with ``root``, also
    their names under it (a folder's files: which file holds a row decides its split)."""
    h = hashlib.sha256()
    for name, _, _ in stamps:
        if root is not None:
            h.update(Path(os.path.relpath(name, root)).as_posix().encode() + b"\0")
        with open(name, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        h.update(b"\0")
    return "sha256:" + h.hexdigest()[:16]


def _stamps(paths: list[str]) -> tuple[tuple[str, int, int], ...]:
    out = []
    for p in paths:
        st = os.stat(p)
        out.append((p, st.st_size, st.st_mtime_ns))
    return tuple(out)


def files_digest(paths: list[str], root: str | None = None) -> str | None:
    """``sha256:<digest>`` of the files' bytes (and their names under ``root``, when given); None for no files (a path
    that is gone is named as written)."""
    try:
        return _digest(_stamps(paths), root) if paths else None
    except OSError:
        return None


def content_source(source: Any) -> Any:
    """``source`` as it enters a run's identity: each local file (or a folder's files, or the files a data_files
    pattern matches) named by the digest of its bytes; a hub dataset by its name, config and revision."""
    if isinstance(source, str):
        return files_digest(source_files(source)) or source
    if not isinstance(source, dict):
        return source
    if "builder" not in source:
        return {k: files_digest(source_files(v)) or v if isinstance(v, str) else v for k, v in source.items()}
    out = dict(source)
    base = _base_folder(source)
    if source.get("data_files") is not None:
        out["data_files"] = _map_files(source["data_files"], lambda f: files_digest(_matches(f, base)) or f)
        if source.get("data_dir") is not None:
            out.pop("data_dir")  # read through data_files' digests
    elif base != ".":
        digest = files_digest(_folder_files(base), root=base)
        if digest is not None:
            out["data_dir" if source.get("data_dir") else "builder"] = digest
    if _local_builder(str(source.get("builder"))) and out.get("builder") == source.get("builder"):
        out["builder"] = "local folder"  # its files are named above
    return out


# --- reading rows ---------------------------------------------------------------------------------------------


@dataclass
class Raw:
    """One split as read: its rows, where each came from (for messages), and where the split came from."""

    rows: list[dict]
    places: list[str]
    origin: str  # "file a.jsonl", "the builder's train split"


def _format_of(path: str, given: str | None) -> str:
    if given is not None:
        return given
    fmt = EXTENSIONS.get(Path(path).suffix.lower())
    if fmt is None:
        raise _refused(
            f"cannot tell the format of {path!r} from its extension {Path(path).suffix!r}; known: "
            f"{', '.join(EXTENSIONS)}",
            field="format",
            value=None,
            fix=f"set format to one of {', '.join(FORMATS)}",
            related=("source",),
        )
    return fmt


def _read_file(path: str, given_format: str | None, split: str) -> Raw:
    shown = os.path.basename(path)
    if not os.path.isfile(path):
        why = "is a folder, not a file" if os.path.isdir(path) else "does not exist"
        raise _refused(
            f"the {split} file {path!r} {why}",
            field="source",
            value=path,
            fix="name an existing file (a relative path is read from the folder of the run or study file), or a "
            "folder of data files as source: {builder: path/to/folder}",
        )
    fmt = _format_of(path, given_format)
    text = _utf8_text(path)
    if fmt in ("json", "jsonl") and text.lstrip().startswith("["):  # one JSON array of objects
        rows, places = _json_array_rows(text, path, shown)
    elif fmt in ("json", "jsonl"):
        rows, places = _json_lines_rows(text, path, shown)
    elif fmt in ("csv", "tsv"):
        rows, places = _delimited_rows(text, "," if fmt == "csv" else "\t", path, shown)
    else:
        rows, places = _text_rows(text, shown)
    return Raw(rows, places, f"file {path!r}")


def _utf8_text(path: str) -> str:
    """The text of the file at ``path`` (a byte order mark dropped, line ends kept); refused if it is not UTF-8."""
    try:
        with open(path, encoding="utf-8-sig", newline="") as f:
            return f.read()
    except UnicodeDecodeError as err:
        raise _refused(
            f"{path!r} is not UTF-8 text ({err})",
            field="source",
            value=path,
            fix="save the file as UTF-8",
        ) from None


def _json_array_rows(text: str, path: str, shown: str) -> tuple[list[dict], list[str]]:
    """The rows of a file holding one JSON array of objects, and where each came from."""
    try:
        items = json.loads(text)
    except json.JSONDecodeError as err:
        raise _bad_json(path, f"line {err.lineno}", err) from None
    rows = [_object(item, f"item {i} of {shown}", path) for i, item in enumerate(items)]
    return rows, [f"item {i} of {shown}" for i in range(len(items))]


def _json_lines_rows(text: str, path: str, shown: str) -> tuple[list[dict], list[str]]:
    """The rows of a JSON lines file (an object per non-blank line), and where each came from."""
    rows: list[dict] = []
    places: list[str] = []
    for n, line in enumerate(_lines(text), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as err:
            raise _bad_json(path, f"line {n}", err) from None
        rows.append(_object(item, f"line {n} of {shown}", path))
        places.append(f"line {n} of {shown}")
    return rows, places


def _delimited_rows(text: str, delimiter: str, path: str, shown: str) -> tuple[list[dict], list[str]]:
    """The rows of a CSV or TSV file, keyed by its header's column names, and where each came from."""
    rows: list[dict] = []
    places: list[str] = []
    reader = csv.reader(io.StringIO(text), delimiter=delimiter)
    header = next(reader, None)
    if header is None:
        return rows, places
    if len(set(header)) < len(header):
        twice = sorted({h for h in header if header.count(h) > 1})
        raise _refused(
            f"the header of {path!r} names column(s) {twice} twice",
            field="source",
            value=path,
            fix="give each column its own name",
        )
    for record in reader:
        if not record:  # a blank line
            continue
        if len(record) != len(header):
            raise _refused(
                f"line {reader.line_num} of {path!r} has {len(record)} fields and its header {len(header)} ({header})",
                field="source",
                value=path,
                fix="give every row one field per column (quote a value that holds the delimiter)",
            )
        rows.append(dict(zip(header, record)))
        places.append(f"line {reader.line_num} of {shown}")
    return rows, places


def _text_rows(text: str, shown: str) -> tuple[list[dict], list[str]]:
    """A row (column ``text``) per non-empty line of a text file, and where each came from."""
    rows: list[dict] = []
    places: list[str] = []
    for n, line in enumerate(_lines(text), 1):
        if line:
            rows.append({"text": line})
            places.append(f"line {n} of {shown}")
    return rows, places


def _lines(text: str) -> list[str]:
    """The lines of a file read with its line ends kept (\\n, \\r\\n or \\r; not the other breaks str.splitlines
    knows, which JSON text may hold)."""
    lines = re.split(r"\r\n|\r|\n", text)
    return lines[:-1] if lines and lines[-1] == "" else lines


def _bad_json(path: str, where: str, err: json.JSONDecodeError) -> ConfigError:
    return _refused(
        f"{where} of {path!r} is not JSON ({err.msg})",
        field="source",
        value=path,
        fix="write one JSON object per line (JSON lines), or one JSON array of objects",
    )


def _object(item: Any, place: str, path: str) -> dict:
    if not isinstance(item, dict):
        raise _refused(
            f"{place} is {type(item).__name__} {item!r:.60}, not an object of named columns",
            field="source",
            value=path,
            fix='write each row as an object: {"column": value, ...}',
        )
    return item


def _read_builder(source: dict) -> tuple[dict[str, Raw], list[str]]:
    """The splits a ``datasets`` builder gives (train, validation, test), and the names of the others."""
    builder = source["builder"]
    _check_builder_files(source)
    loaded = _load_builder(source)
    # a DatasetDict: split -> Dataset; one Dataset (source.split picked it): the training rows
    splits = dict(loaded) if isinstance(loaded, dict) else {"train": loaded}
    if "train" not in splits:
        raise _refused(
            f"the datasets builder {builder!r} gave the splits {sorted(splits)}, none named train",
            field="source",
            value=source,
            fix="name the splits train, validation and test (data_files: {train: ..., validation: ...}), or pick "
            "the training rows with source.split",
        )
    out = {
        name: Raw(
            splits[name].to_list(),
            [f"row {i} of the builder's {name} split" for i in range(len(splits[name]))],
            f"the {name} split of builder {builder!r}",
        )
        for name in SPLITS
        if name in splits
    }
    return out, sorted(set(splits) - set(SPLITS))


def _check_builder_files(source: dict) -> None:
    """Refuses a builder's files before ``datasets`` reads them: none named, a missing data_dir, a pattern matching
    nothing."""
    builder = source["builder"]
    if _packaged(builder) and source.get("data_files") is None and source.get("data_dir") is None:
        raise _refused(
            f"the datasets builder {builder!r} reads files, and source names none (it would read the working "
            "directory's)",
            field="source",
            value=source,
            fix="give source.data_files (data_files: {train: a.jsonl, validation: b.jsonl}) or source.data_dir",
        )
    if source.get("data_dir") is not None and not os.path.isdir(os.path.expanduser(source["data_dir"])):
        raise _refused(
            f"source.data_dir={source['data_dir']!r} is not a folder",
            field="source",
            value=source,
            fix="name an existing folder",
        )
    if source.get("data_files") is not None:
        base = _base_folder(source)
        for pattern in _flat(source["data_files"]):
            if not _is_url(pattern) and not _matches(pattern, base):
                raise _refused(
                    f"source.data_files: {pattern!r} matches no file" + (f" in {base!r}" if base != "." else ""),
                    field="source",
                    value=source,
                    fix="name existing files (a relative path is read from the folder of the run or study file)",
                )


def _load_builder(source: dict) -> Any:
    """What ``datasets.load_dataset`` gives for the builder ``source`` names; a refusal, or ``SourceUnavailable`` for a
    hub dataset, if it cannot."""
    builder = source["builder"]
    extra = {k: v for k, v in source.items() if k not in BUILDER_KEYS}
    args = {k: source[k] for k in ("data_files", "data_dir", "split", "revision") if source.get(k) is not None}
    local = _local_builder(builder)
    try:
        from datasets import disable_progress_bars, load_dataset

        disable_progress_bars()
        loaded = load_dataset(builder, source.get("name"), **args, **extra)
    except Exception as err:  # offline, an unknown name, a file the builder cannot parse, an unknown argument
        said = f"{type(err).__name__}: {err}"
        if err.__cause__ is not None:  # datasets wraps a parse error in DatasetGenerationError
            said += f"; {type(err.__cause__).__name__}: {err.__cause__}"
        if local or _packaged(builder):
            raise _refused(
                f"the datasets builder {builder!r} could not read the data ({said})",
                field="source",
                value=source,
                fix="correct the files or the builder's arguments (source.builder, source.data_files, ...)",
            ) from None
        raise SourceUnavailable(
            f"could not load {builder!r} from the Hugging Face hub ({said}); use a local file (task.source: "
            "path/to/data.jsonl) or a builder on local files (task.source: {builder: json, data_files: ...})",
            field="source",
            value=source,
            fix="use a local file, or a builder on local files",
        ) from err
    return loaded


def _flat(files: Any) -> list[str]:
    if isinstance(files, list):
        return [f for item in files for f in _flat(item)]
    if isinstance(files, dict):
        return [f for v in files.values() for f in _flat(v)]
    return [files]


# --- the rows of each split, checked and tokenised ---------------------------------------------------------------


@dataclass(frozen=True)
class Loaded:
    """A source read, split, checked and tokenised (cached by the parameters and the files' stamps)."""

    examples: dict[str, list[dict]]  # split -> examples of the task's kind
    places: dict[str, list[str]]  # split -> where each example's row came from
    classes: tuple[str, ...]  # classify: the class names, in the order of their ids
    alphabet: tuple[str, ...]  # char level: the characters, in the order of their tokens
    lengths: dict[str, list[int]]  # split -> each example's length as the model is given it (max_length)
    digest: str  # of the examples and the classes: in each split's cache fingerprint
    cut: tuple[str, ...]  # the splits cut from train
    ignored: tuple[str, ...]  # a builder's other splits


def _text(value: Any, place: str, column: str, key: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    what = "missing (null)" if value is None else f"{type(value).__name__} {value!r:.40}"
    raise _refused(
        f"{place}: column {column!r} is {what}, not text",
        field=key,
        value=column,
        related=("source",),
        fix=f"write every value of column {column!r} as text (or an integer), or name another column",
    )


def _label(value: Any, place: str, column: str, key: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str) and value:
        return value
    what = "missing (empty)" if value in (None, "") else f"{type(value).__name__} {value!r:.40}"
    raise _refused(
        f"{place}: label column {column!r} is {what}; a label is text, an integer or a boolean",
        field=key,
        value=column,
        related=("source",),
        fix=f"give every row a label in column {column!r}, or remove the rows without one",
    )


def label_order(name: str) -> tuple:
    """The sort key of a class name: integers by value first, then text by code point."""
    return (0, int(name), "") if re.fullmatch(r"-?\d+", name) else (1, 0, name)


def _columns(raw: Raw, task: str, params: DataParams) -> list[tuple[str, ...]]:
    """Each row's values of the columns the task reads, as text (a label as its class name)."""
    keys = DATA_TASKS[task].columns
    out = []
    for row, place in zip(raw.rows, raw.places):
        values = []
        for key in keys:
            column = getattr(params, key)
            if column not in row:
                have = ", ".join(repr(str(c)) for c in row)
                raise _refused(
                    f"{place} has no column {column!r} ({key}); its columns: {have}",
                    field=key,
                    value=column,
                    related=("source",),
                    fix=f"set {key} to one of its columns ({have})",
                )
            read = _label if key == "label_column" else _text
            values.append(read(row[column], place, column, key))
        out.append(tuple(values))
    return out


def _raw_splits(params: DataParams) -> tuple[dict[str, Raw], list[str]]:
    source = params.source
    if isinstance(source, str):
        return {"train": _read_file(source, params.format, "source")}, []
    if "builder" in source:
        return _read_builder(source)
    return {split: _read_file(path, params.format, split) for split, path in source.items()}, []


def _refuse_unread(params: DataParams, given: set[str], origin: str) -> None:
    """A fraction for a split the source gives, a data seed where nothing is cut: unread, refused."""
    defaults = {f.name: f.default for f in dataclasses.fields(params)}
    for split, key in (("validation", "val_fraction"), ("test", "test_fraction")):
        if split in given and getattr(params, key) != defaults[key]:
            raise ConfigError(
                f"{key}={getattr(params, key)} cuts {split} rows from train, and the source gives a {split} split "
                f"({origin}): it changes nothing (remove {key})",
                field=key,
                value=getattr(params, key),
                fix=f"remove {key}",
                related=("source",),
            )
    if given >= set(SPLITS) and params.data_seed != 0:
        raise ConfigError(
            f"data_seed={params.data_seed} shuffles the rows cut from train, and the source gives every split: it "
            "changes nothing (remove data_seed, or the study's vary_data)",
            field="data_seed",
            value=params.data_seed,
            fix="remove data_seed",
            related=("source",),
        )


def _cut(params: DataParams, rows: dict[str, list], places: dict[str, list[str]], origin: str) -> tuple[str, ...]:
    """Validation and test, where the source lacks them, cut from train's rows shuffled by data_seed."""
    missing = tuple(s for s in ("validation", "test") if s not in rows)
    if not missing:
        return ()
    n = len(rows["train"])
    order = list(range(n))
    random.Random(params.data_seed).shuffle(order)
    start = 0
    for split in missing:
        key = "val_fraction" if split == "validation" else "test_fraction"
        size = int(n * getattr(params, key) + 0.5)
        if size == 0:
            raise _refused(
                f"cutting {split} from the {n} training rows of {origin} leaves it empty ({n} x {key}="
                f"{getattr(params, key)} rounds to 0)",
                field=key,
                value=getattr(params, key),
                fix=f"give more rows, a larger {key}, or a {split} file",
                related=("source",),
            )
        taken = sorted(order[start : start + size])
        rows[split] = [rows["train"][i] for i in taken]
        places[split] = [places["train"][i] for i in taken]
        start += size
    kept = sorted(order[start:])
    if not kept:
        raise _refused(
            f"cutting {', '.join(missing)} from the {n} training rows of {origin} leaves train empty",
            field="source",
            value=params.source,
            fix="give more rows, or smaller val_fraction and test_fraction",
        )
    rows["train"] = [rows["train"][i] for i in kept]
    places["train"] = [places["train"][i] for i in kept]
    return missing


def load(task: str, params: DataParams) -> Loaded:
    """The source of ``params`` read, split, checked and tokenised for ``task``: cached while the parameters and the
    files' sizes and times stay the same."""
    key = json.dumps({"task": task, **dataclasses.asdict(params)}, sort_keys=True)
    try:
        stamps = _stamps(source_files(params.source))
    except OSError:
        stamps = ()
    return _load(key, stamps)


@lru_cache(maxsize=8)
def _load(key: str, stamps: tuple) -> Loaded:
    spec = json.loads(key)
    task = spec.pop("task")
    cls = DATA_TASKS[task]
    params = cls.Params(**spec)
    raw, ignored = _raw_splits(params)
    origin = raw["train"].origin
    _refuse_unread(params, set(raw), origin)
    rows = {split: _columns(r, task, params) for split, r in raw.items()}
    places = {split: r.places for split, r in raw.items()}
    for split in rows:
        if not rows[split]:
            raise _refused(
                f"the {split} split ({raw[split].origin}) has no rows",
                field="source",
                value=params.source,
                fix=f"give the {split} split rows",
            )
    cut = _cut(params, rows, places, origin)
    rows = {s: rows[s] for s in SPLITS}
    classes: tuple[str, ...] = ()
    if cls.kind == "classify":
        classes = _classes(params, rows, places, origin)
    texts = [t for split in SPLITS for row in rows[split] for t in (row if cls.kind != "classify" else row[:1])]
    alphabet = tuple(sorted(set("".join(texts)))) if params.level == "char" else ()
    enc = _encoder(params.level, alphabet)
    class_id = {c: i for i, c in enumerate(classes)}
    examples: dict[str, list[dict]] = {}
    lengths: dict[str, list[int]] = {}
    for split in SPLITS:
        examples[split], lengths[split] = [], []
        for row, place in zip(rows[split], places[split]):
            example, length = _example(cls.kind, row, f"{place} ({split})", params, enc, class_id)
            examples[split].append(example)
            lengths[split].append(length)
    if params.max_len is not None:
        _within(params.max_len, lengths, places)
    blob = json.dumps([examples, classes], sort_keys=True).encode()
    digest = hashlib.sha256(blob).hexdigest()[:16]
    return Loaded(examples, places, classes, alphabet, lengths, digest, cut, tuple(ignored))


def _encoder(level: str, alphabet: tuple[str, ...]) -> Callable[[str], list[int]]:
    """The function that turns text into tokens at ``level`` (byte, or char over ``alphabet``)."""
    index = {c: i for i, c in enumerate(alphabet)}

    def enc(text: str) -> list[int]:
        if level == "byte":
            return [FIRST_SYMBOL + b for b in text.encode("utf-8")]
        return [FIRST_SYMBOL + index[c] for c in text]

    return enc


def _example(
    kind: str,
    row: tuple[str, ...],
    where: str,
    params: DataParams,
    enc: Callable[[str], list[int]],
    class_id: dict[str, int],
) -> tuple[dict, int]:
    """One row as an example of the task's ``kind``, and its length as the model is given it."""
    if kind == "seq2seq":
        src, tgt = enc(row[0]), enc(row[1])
        if not src:
            raise _refused(
                f"{where}: the source (column {params.src_column!r}) is empty; the encoder needs at least one token",
                field="src_column",
                value=params.src_column,
                related=("source",),
                fix="remove the rows with an empty source",
            )
        return {"src": src, "tgt": tgt}, max(len(src), len(tgt) + 1)  # the target with its BOS (input) or EOS (output)
    if kind == "classify":
        tokens = [SEP, *enc(row[0])]
        return {"tokens": tokens, "label": class_id[row[1]]}, len(tokens)
    tokens = [BOS, *enc(row[0]), EOS]
    return {"tokens": tokens}, len(tokens) - 1  # the model reads tokens[:-1]


def _classes(params: DataParams, rows: dict[str, list], places: dict[str, list[str]], origin: str) -> tuple[str, ...]:
    classes = tuple(sorted({row[1] for row in rows["train"]}, key=label_order))
    if len(classes) < 2:
        raise _refused(
            f"every training row of {origin} has the label {classes[0]!r}: nothing to tell apart",
            field="label_column",
            value=params.label_column,
            related=("source",),
            fix="give training rows of at least two labels",
        )
    known = set(classes)
    for split in ("validation", "test"):
        for row, place in zip(rows[split], places[split]):
            if row[1] not in known:
                raise _refused(
                    f"{place} ({split}) has the label {row[1]!r}, which no training row has (training labels: "
                    f"{', '.join(map(repr, classes))})",
                    field="label_column",
                    value=params.label_column,
                    related=("source",),
                    fix=f"add training rows labelled {row[1]!r}, or remove that label's rows from {split} (a rare "
                    "label can fall out of train when the splits are cut: another data_seed, or more of its rows)",
                )
    return classes


def _within(max_len: int, lengths: dict[str, list[int]], places: dict[str, list[str]]) -> None:
    over = [(n, place, split) for split in SPLITS for n, place in zip(lengths[split], places[split]) if n > max_len]
    if over:
        n, place, split = over[0]
        longest = max(o[0] for o in over)
        raise _refused(
            f"{place} ({split}) is {n} tokens long as the model is given it, more than max_len={max_len} ({len(over)} "
            f"row(s) are; the longest {longest})",
            field="max_len",
            value=max_len,
            related=("source",),
            fix=f"raise max_len to {longest} or more, or shorten or remove the longer rows",
        )


def _examples(split: str, task: str, digest: str, data_code: str, **params):
    """A split's examples (the digest of the rows as read, and the code, in the cache fingerprint)."""
    cls = DATA_TASKS[task]
    names = {f.name for f in dataclasses.fields(cls.Params)}
    yield from load(task, cls.Params(**{k: v for k, v in params.items() if k in names})).examples[split]


# --- the tasks --------------------------------------------------------------------------------------------------


class DataTask(Task):
    """Rows of the researcher's own data (module docstring); read and checked when made."""

    splits = SPLITS
    columns: ClassVar[tuple[str, ...]]  # the params naming the columns read, in the order of a row's values

    def __init__(self, params: TaskParams) -> None:
        super().__init__(params)
        self.data = load(self.name, params)  # read and checked now: refused before anything trains

    @property
    def vocab_size(self) -> int:
        return FIRST_SYMBOL + (256 if self.params.level == "byte" else len(self.data.alphabet))

    @property
    def max_length(self) -> int:
        return max(n for split in SPLITS for n in self.data.lengths[split])

    def features(self):
        from datasets import Features, Sequence, Value

        return Features({"tokens": Sequence(Value("int32"))})

    def build(self, split: str, cache_dir: str | None = None):
        return generate(self, split, _examples, cache_dir, self.features(), task=self.name, digest=self.data.digest)

    def describe(self) -> str:
        sizes = ", ".join(
            f"{s} {len(self.data.examples[s])}{' (cut from train)' if s in self.data.cut else ''}" for s in SPLITS
        )
        ignored = f"; splits not read: {', '.join(self.data.ignored)}" if self.data.ignored else ""
        return f"{super().describe()} (rows: {sizes}{ignored})"

    def lineage(self, split: str) -> dict[str, Any]:
        return {**super().lineage(split), "digest": self.data.digest}

    @classmethod
    def anchored(cls, spec: dict[str, Any], folder: Path) -> dict[str, Any]:
        return {**spec, "source": anchored_source(spec["source"], folder)} if "source" in spec else spec

    @classmethod
    def content_spec(cls, spec: dict[str, Any]) -> dict[str, Any]:
        """The files by their contents (``content_source``); a ``format`` every file's extension implies as left out
        (json and jsonl are one reader); ``max_len`` left out: it refuses data, and data it accepts is the same."""
        out = {k: v for k, v in spec.items() if k != "max_len"}
        if "source" in spec:
            out["source"] = content_source(spec["source"])
        given = spec.get("format")
        if isinstance(given, str):
            paths = [spec["source"]] if isinstance(spec.get("source"), str) else []
            if isinstance(spec.get("source"), dict) and "builder" not in spec["source"]:
                paths = [p for p in spec["source"].values() if isinstance(p, str)]
            same = {"json": "jsonl"}.get
            implied = {same(f, f) for f in (EXTENSIONS.get(Path(p).suffix.lower()) for p in paths)}
            out["format"] = None if implied == {same(given, given)} else same(given, given)
        return out


class DataSeq2SeqTask(DataTask):
    name = "data_seq2seq"
    kind = "seq2seq"
    archs = ("encoder_decoder",)
    Params = DataSeq2SeqParams
    columns = ("src_column", "tgt_column")

    def features(self):
        from datasets import Features, Sequence, Value

        return Features({"src": Sequence(Value("int32")), "tgt": Sequence(Value("int32"))})

    def target_positions(self, split: str) -> int:
        return max(len(e["tgt"]) for e in self.data.examples[split]) + 1  # with the end of sequence


class DataClassifyTask(DataTask):
    name = "data_classify"
    kind = "classify"
    archs = ("encoder",)
    Params = DataClassifyParams
    columns = ("text_column", "label_column")

    @property
    def n_classes(self) -> int:
        return len(self.data.classes)

    @property
    def classes(self) -> tuple[str, ...]:
        """The class names, in the order of their ids."""
        return self.data.classes

    def features(self):
        from datasets import ClassLabel, Features, Sequence, Value

        return Features({"tokens": Sequence(Value("int32")), "label": ClassLabel(names=list(self.data.classes))})


class DataLMTask(DataTask):
    name = "data_lm"
    kind = "lm"
    archs = ("decoder",)
    Params = DataLMParams
    columns = ("text_column",)


DATA_TASKS: dict[str, type[DataTask]] = {t.name: t for t in (DataSeq2SeqTask, DataClassifyTask, DataLMTask)}
