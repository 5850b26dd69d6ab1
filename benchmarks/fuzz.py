"""Fuzzing of every file the platform reads: run, study and search files, and ``ablate run``'s ``--set`` options.

Mutations of the valid files of the catalogue (ablations/runs, ablations/studies, ablations/searches), drawn by
hypothesis: keys renamed (misspelt, to another section's name, to a number, true, null or a date), moved,
deleted and duplicated; values of every wrong type, out of range, huge, empty, deeply nested, shared through
anchors (billion laughs included); and, on the text, YAML tags, merge keys, duplicated and re-indented lines,
bytes that are not UTF-8, other encodings, truncation, several documents. Each input must be either accepted,
and then pass what ``ablate sweep --dry-run`` / ``ablate search --dry-run`` check without a store (the run's
``ablate run`` summary), or refused by a ``SpecError`` (exit status 2) whose every line names the file (or
``--set``), and the line and the key wherever the file has them. Anything else is a failure: another exception
(a traceback), more than a second for one input, or a file written where the loaders ran (no store is touched).

    python benchmarks/fuzz.py                       # 10,000 inputs of each kind (run, study, search, set)
    python benchmarks/fuzz.py --examples 500 --kinds study search --seed 3
    python benchmarks/fuzz.py --cli 20              # also 20 per kind through the real `ablate` command

The suite (tests/record/spec/test_fuzz.py) runs a few hundred of each kind with a fixed seed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import hypothesis  # noqa: E402
import yaml  # noqa: E402
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

KINDS = ("run", "study", "search", "set")
LIMIT_S = 1.0  # each input is accepted or refused within this much CPU time
WALL_S = 5.0  # and this much time by the clock: a wait (a store, a lock) shows here; a busy machine (the suite on
# two cores beside it) stretches the clock, which is why the second of the issue is counted in CPU time


def catalogue(kind: str) -> list[Path]:
    """The valid files a kind's inputs are mutations of."""
    folder = {"run": "runs", "set": "runs", "study": "studies", "search": "searches"}[kind]
    return sorted((ROOT / "ablations" / folder).glob("*.yaml"))


def _vocabulary() -> tuple[list[str], list[Any]]:
    """Every key name and every scalar value of the catalogue, and the dotted keys a run may hold: the names and
    values a mutation borrows, so that a renamed key or a replaced value is often one the loaders know."""
    from record.spec.run import run_keys

    keys: set[str] = set()
    values: list[Any] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                keys.add(str(k))
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)
        elif node is not None and not (isinstance(node, str) and len(node) > 60):
            values.append(node)

    for kind in ("run", "study", "search"):
        for path in catalogue(kind):
            walk(yaml.safe_load(path.read_text()))
    dotted = run_keys({"task": {"name": "reverse"}}) + run_keys({"task": {"name": "listops"}})
    keys |= set(dotted) | {k.rsplit(".", 1)[-1] for k in dotted}
    return sorted(keys), sorted(set(values), key=repr)


KEYS, VALUES = _vocabulary()
RUN_KEYS = __import__("record.spec.run", fromlist=["run_keys"]).run_keys({"task": {"name": "reverse"}})

# --- values ---------------------------------------------------------------------------------------------------

EDGE_NUMBERS = [0, -1, 1, 2, 3, 7, 2**31, 2**63, 10**30, -(10**30), 0.0, -0.0, 0.5, 1e-300, 1e308, -1e308, 1.5]
EDGE_TEXT = [
    "",
    " ",
    "rotray",
    "val/loss",
    "final/val_loss",
    "best/val_loss",
    "test/",
    "/",
    "../runs/quickstart.yaml",
    "../runs/missing.yaml",
    ".",
    "..",
    "/dev/zero",
    "/etc/passwd",
    "null",
    "yes",
    "3",
    "1e-3",
    "~",
    "-",
    "a b",
    "é",
    "\u202e",
    "\x7f",
    "x" * 300,
]


def scalars() -> st.SearchStrategy:
    return st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.sampled_from(EDGE_NUMBERS),
        st.floats(),
        st.text(max_size=12),
        st.sampled_from(EDGE_TEXT),
        st.dates(),
        st.datetimes(),
        st.sampled_from(VALUES),
    )


def plain_keys() -> st.SearchStrategy:
    return st.one_of(st.sampled_from(KEYS), st.text(max_size=8))


def values() -> st.SearchStrategy:
    """A value of any type: scalars, and small lists and mappings of them."""
    return st.recursive(
        scalars(),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(plain_keys(), inner, max_size=4),
        max_leaves=8,
    )


def huge(kind: str, n: int) -> Any:
    """A value of ``n`` items, built rather than drawn (hypothesis keeps its draws small)."""
    if kind == "text":
        return "x" * n
    if kind == "list":
        return list(range(n))
    if kind == "mapping":
        return {f"k{i}": i for i in range(n)}
    return int("9" * min(n, 4000))  # a number of n digits (Python refuses to print more than 4300)


def nested(kind: str, depth: int, leaf: Any) -> Any:
    for _ in range(depth):
        leaf = [leaf] if kind == "list" else {"a": leaf}
    return leaf


def bomb(levels: int, width: int) -> Any:
    """A billion laughs: each level a list of ``width`` references to the one below (YAML anchors and aliases)."""
    node: Any = ["lol"]
    for _ in range(levels):
        node = [node] * width
    return node


# --- mutations of the data ------------------------------------------------------------------------------------


def slots(tree: Any, path: tuple = (), seen: set | None = None) -> list[tuple]:
    """The path of every key of every mapping and every item of every list, the root's included (a node shared
    twice, or its own ancestor, is walked once; at most 2,000 paths)."""
    seen = set() if seen is None else seen
    out = [path]
    if isinstance(tree, (dict, list)) and id(tree) not in seen and len(seen) < 2000:
        seen.add(id(tree))
        for k, v in tree.items() if isinstance(tree, dict) else enumerate(tree):
            out += slots(v, (*path, k), seen)
    return out


def containers(tree: Any, path: tuple = ()) -> list[tuple]:
    return [p for p in slots(tree, path) if isinstance(get(tree, p), (dict, list))]


def get(tree: Any, path: tuple) -> Any:
    for part in path:
        tree = tree[part]
    return tree


def misspell(draw, word: str) -> str:
    if not word:
        return "x"
    i = draw(st.integers(0, len(word) - 1))
    how = draw(st.sampled_from(["drop", "double", "swap", "case", "char"]))
    if how == "drop":
        return word[:i] + word[i + 1 :]
    if how == "double":
        return word[:i] + word[i] + word[i:]
    if how == "swap" and i + 1 < len(word):
        return word[:i] + word[i + 1] + word[i] + word[i + 2 :]
    if how == "case":
        return word.upper()
    return word[:i] + draw(st.sampled_from("aeiorstxyz_.-")) + word[i + 1 :]


def new_key(draw, old: Any) -> Any:
    return draw(
        st.one_of(
            st.just(misspell(draw, str(old))),
            st.sampled_from(KEYS),
            st.text(max_size=10),
            st.integers(-3, 3),
            st.booleans(),
            st.none(),
            st.floats(allow_nan=False),
            st.dates(),
            st.just(f"{old}.{draw(st.sampled_from(KEYS))}"),
        )
    )


def new_value(draw, old: Any) -> Any:
    how = draw(st.sampled_from(["any", "any", "any", "huge", "nested", "wrap", "empty", "edge", "bomb", "number"]))
    if how == "huge":
        return huge(draw(st.sampled_from(["text", "list", "mapping", "int"])), draw(st.sampled_from([1000, 20000])))
    if how == "nested":
        return nested(draw(st.sampled_from(["list", "mapping"])), draw(st.integers(2, 80)), old)
    if how == "wrap":
        return draw(st.sampled_from([[old], {"a": old}, {str(old): old}, [old, old]]))
    if how == "empty":
        return draw(st.sampled_from([None, "", [], {}, [None], {"": None}]))
    if how == "edge":
        return draw(st.sampled_from(EDGE_NUMBERS + EDGE_TEXT))
    if how == "bomb":
        return bomb(draw(st.integers(2, 9)), draw(st.integers(2, 10)))
    if how == "number" and isinstance(old, (int, float)) and not isinstance(old, bool):
        near = [-old, old * 1000, old + 1, old - 1, -1, 0]
        with contextlib.suppress(OverflowError, ValueError):  # a huge int, an infinite or NaN float
            near += [old / 3, float(old), int(old)]
        return draw(st.sampled_from(near))
    return draw(values())


def _put(mapping: dict, key: Any, value: Any, before: bool) -> dict:
    items = list(mapping.items())
    items = [(key, value), *items] if before else [*items, (key, value)]
    return dict(items)


def mutate(draw, tree: Any) -> Any:
    """One mutation of the data, at a drawn place."""
    places = slots(tree)
    path = draw(st.sampled_from(places))
    op = draw(st.sampled_from(["delete", "rename", "move", "copy", "value", "value", "value", "share", "swap", "add"]))
    if not path:
        if op in ("value", "delete"):
            return draw(st.sampled_from([None, [], "text", 3, [tree]]))
        path = (draw(st.sampled_from([k for k in tree] or [0])),) if isinstance(tree, dict) and tree else ()
        if not path:
            return tree
    parent, key = get(tree, path[:-1]), path[-1]
    if op == "delete":
        del parent[key]
    elif op == "rename" and isinstance(parent, dict):
        value = parent.pop(key)
        parent[new_key(draw, key)] = value
    elif op in ("move", "copy"):
        value = parent[key] if op == "copy" else parent.pop(key)
        into = [p for p in containers(tree) if isinstance(get(tree, p), dict)]
        if into:
            target = get(tree, draw(st.sampled_from(into)))
            name = key if isinstance(parent, dict) else draw(st.sampled_from(KEYS))
            target[name if op == "move" or draw(st.booleans()) else misspell(draw, str(name))] = value
    elif op == "share":  # the same object twice: the dump writes an anchor and an alias
        other = draw(st.sampled_from(places))
        if other and other[:-1] != path[: len(other) - 1]:
            with contextlib.suppress(KeyError, IndexError, TypeError):
                get(tree, other[:-1])[other[-1]] = parent[key]
    elif op == "swap":
        other = draw(st.sampled_from(places))
        if other and not _inside(path, other):
            with contextlib.suppress(KeyError, IndexError, TypeError):
                a, b = get(tree, other[:-1]), parent
                a[other[-1]], b[key] = b[key], a[other[-1]]
    elif op == "add" and isinstance(get(tree, path), dict):
        node = get(tree, path)
        node[draw(plain_keys())] = draw(values())
    else:
        parent[key] = new_value(draw, parent[key])
    return tree


def _inside(a: tuple, b: tuple) -> bool:
    n = min(len(a), len(b))
    return a[:n] == b[:n]


# --- mutations of the text ------------------------------------------------------------------------------------

TAGS = [
    "!!python/object/apply:os.system ['true']",
    "!!python/name:os.system",
    "!!binary aGVsbG8=",
    "!!set {a, b}",
    "!!omap [{a: 1}]",
    "!!pairs [{a: 1}]",
    "!custom x",
    "!!str 3",
    "!!int '3'",
    "!!float 1",
    "!!timestamp 2020-01-01",
    "!!null ''",
    "!!bool yes",
    "!<tag:yaml.org,2002:str> x",
    "!!map {a: 1}",
    "!!seq [1]",
    "&a x",
    "*a",
    "*missing",
    "&a [*a]",
    "{<<: {a: 1}}",
    "{<<: [1, 2]}",
    "[",
    "{a: ",
    "'unclosed",
    '"\\xff"',
    "|",
    ">-\n  folded",
    "@",
    "`",
    "%",
]


def text_mutation(draw, raw: bytes) -> bytes:
    lines = raw.split(b"\n")
    i = draw(st.integers(0, max(0, len(lines) - 1)))
    how = draw(
        st.sampled_from(
            [
                "tag",
                "tag",
                "duplicate",
                "indent",
                "dedent",
                "tab",
                "bytes",
                "encoding",
                "truncate",
                "documents",
                "merge",
            ]
            + ["bom", "directive", "nul", "crlf", "comment"]
        )
    )
    line = lines[i]
    if how == "tag":
        tag = draw(st.sampled_from(TAGS)).encode()
        head, sep, _ = line.partition(b": ")
        lines[i] = head + b": " + tag if sep else line + b" " + tag
    elif how == "duplicate":
        lines.insert(i, line)
    elif how in ("indent", "dedent"):
        n = draw(st.integers(1, 4))
        lines[i] = b" " * n + line if how == "indent" else line[n:]
    elif how == "tab":
        lines[i] = b"\t" + line
    elif how == "bytes":
        at = draw(st.integers(0, len(line)))
        lines[i] = line[:at] + draw(st.sampled_from([b"\xff", b"\xc3\x28", b"\xe9", b"\x80\x80", b"\xed\xa0\x80"]))
        lines[i] += line[at:]
    elif how == "encoding":
        text = raw.decode("utf-8", "replace") + draw(st.sampled_from(["", "# é ü ø\n"]))
        codec = draw(st.sampled_from(["utf-16", "utf-16-le", "utf-16-be", "utf-32", "latin-1", "cp1252"]))
        return text.encode(codec, "replace")
    elif how == "truncate":
        return raw[: draw(st.integers(0, len(raw)))]
    elif how == "documents":
        lines.insert(i, draw(st.sampled_from([b"---", b"...", b"--- !!str", b"--- |"])))
    elif how == "merge":
        lines[i] = line.replace(b"'<<'", b"<<")
        lines.insert(i, b" " * (len(line) - len(line.lstrip())) + b"<<: {name: x, seed: 1}")
    elif how == "bom":
        return b"\xef\xbb\xbf" + raw
    elif how == "directive":
        lines.insert(0, draw(st.sampled_from([b"%YAML 1.2", b"%YAML 9.9", b"%TAG ! tag:example.com,2000:", b"%FOO"])))
        lines.insert(1, b"---")
    elif how == "nul":
        lines[i] = line + b"\x00"
    elif how == "crlf":
        return raw.replace(b"\n", b"\r\n")
    else:
        lines[i] = line + b" # " + draw(st.text(max_size=5)).encode()
    return b"\n".join(lines)


DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)  # libyaml's: five times faster


def dump(tree: Any, flow: bool | None) -> bytes:
    text = yaml.dump(tree, Dumper=DUMPER, sort_keys=False, allow_unicode=True, default_flow_style=flow, width=4096)
    return text.encode()


@st.composite
def files(draw, kind: str) -> tuple[str, bytes]:
    """(name of the catalogue file it came from, the mutated file's bytes)."""
    path = draw(st.sampled_from(catalogue(kind)))
    tree = yaml.safe_load(path.read_text())
    if kind == "study" and isinstance(tree.get("base"), str) and draw(st.booleans()):  # the run inline
        tree["base"] = yaml.safe_load((path.parent / tree["base"]).read_text())
    for _ in range(draw(st.integers(0 if kind != "run" else 1, 3))):
        tree = mutate(draw, tree)
    raw = dump(tree, draw(st.sampled_from([False, False, None, True])))
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 1, 2]))):
        raw = text_mutation(draw, raw)
    return path.name, raw


@st.composite
def overrides(draw) -> list[str]:
    """``--set`` options for the catalogue's run file."""
    keys = RUN_KEYS
    out = []
    for _ in range(draw(st.integers(1, 4))):
        key = draw(
            st.one_of(
                st.sampled_from(keys),
                st.sampled_from(keys).map(lambda k: misspell(draw, k)),
                st.sampled_from(["", ".", "model.", ".lr", "model..lr", "model.n_heads.x", "task", "model", "x"]),
                st.text(max_size=8),
            )
        )
        how = draw(st.sampled_from(["yaml", "yaml", "raw", "tag", "none"]))
        if how == "yaml":
            value = yaml.dump(draw(values()), Dumper=DUMPER, default_flow_style=True, width=4096).strip()
            value = value.removesuffix("\n...").strip()
        elif how == "raw":
            value = draw(st.text(max_size=12))
        elif how == "tag":
            value = draw(st.sampled_from(TAGS))
        else:
            out.append(key)  # no '='
            continue
        out.append(f"{key}={value}")
    return out


# --- the oracle -----------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    kind: str
    accepted: bool
    lines: list[str] = field(default_factory=list)  # the error lines, as `ablate` prints them
    seconds: float = 0.0  # CPU time
    wall: float = 0.0
    failure: str | None = None  # what is wrong, when it is


class Workdir:
    """A folder laid out as the catalogue is (runs/ beside studies/ and searches/), where every input is written
    and loaded, with the working directory there: a loader that wrote a store (.ablate/, mlruns/, a database)
    would leave a file behind, which ``check`` reports."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="abl-fuzz-"))
        for sub in ("runs", "studies", "searches"):
            (self.root / sub).mkdir()
        shutil.copy(ROOT / "ablations" / "runs" / "quickstart.yaml", self.root / "runs" / "quickstart.yaml")
        self.before = self.listing()

    def listing(self) -> set[str]:
        return {str(p.relative_to(self.root)) for p in self.root.rglob("*")}

    def path(self, kind: str) -> Path:
        sub = {"run": "runs", "set": "runs", "study": "studies", "search": "searches"}[kind]
        return self.root / sub / "fuzzed.yaml"

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def accept(kind: str, path: Path, sets: list[str] | None, store: str) -> None:
    """Load the file, then do what the command's dry run (``ablate run``: what it says before it trains) does
    without a store; any exception propagates."""
    noise: list[str] = []
    if kind in ("run", "set"):
        from record.spec import load_run

        run = load_run(path, sets)
        run.config_hash(), run.params(), run.to_dict()
        noise += [run.model.describe(), run.task.describe(), str(run.training.max_steps)]
    elif kind == "study":
        from ablations.sweep.preview import dry_run
        from record.spec import load_study

        study = load_study(path)
        dry_run(study, tracking_uri=store, claims_url=None, reuse_any_code=False, out=noise.append)
    else:
        from ablations.search.preview import describe_search
        from record.spec import load_search

        spec = load_search(path)
        describe_search(
            spec, storage=store.replace("mlflow", "optuna"), tracking_uri=store, num_cpus=2, out=noise.append
        )


def check(kind: str, raw: bytes, work: Workdir, sets: list[str] | None = None) -> Outcome:
    """Write the input, load it in this process, and judge the outcome (see the module's docstring)."""
    from record.spec import SpecError

    path = work.path(kind)
    path.write_bytes(raw)
    store = f"sqlite:///{work.root}/mlflow.db"  # never created: a dry run reads a store only when it is there
    out = Outcome(kind, False)
    # this thread's CPU time: a test process's other threads (a library's background work) are not the loader's
    start, cpu = time.perf_counter(), time.thread_time()
    here = os.getcwd()
    os.chdir(work.root)
    try:
        accept(kind, path, sets, store)
        out.accepted = True
    except SpecError as err:
        out.lines = [str(e) for e in err.every()]
        out.failure = judge(err, path, work, raw)
    except Exception:  # noqa: BLE001  (a traceback: the failure fuzzing looks for)
        out.failure = "traceback: " + "".join(traceback.format_exc(limit=-3)).strip().replace("\n", " | ")[-1500:]
    finally:
        os.chdir(here)
        out.seconds, out.wall = time.thread_time() - cpu, time.perf_counter() - start
    if out.failure is None and (out.seconds > LIMIT_S or out.wall > WALL_S):
        out.failure = f"took {out.seconds:.2f} CPU s, {out.wall:.2f} s (more than {LIMIT_S:g} CPU s or {WALL_S:g} s)"
    written = {p for p in work.listing() - work.before if not p.endswith("fuzzed.yaml")}
    if written:
        out.failure = (out.failure or "") + f" wrote {sorted(written)}"
        for name in sorted(written, reverse=True):  # the next input starts clean
            p = work.root / name
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
    return out


def judge(err, path: Path, work: Workdir, raw: bytes) -> str | None:
    """What is wrong with a refusal, or None: every line is one line, names the file it blames (the input, the
    base run it names, or ``--set``) and, where the file is a readable mapping and the line has a key, the line."""
    for e in err.every():
        text = str(e)
        if len(text) > 1500:
            return f"an error line of {len(text):,} characters: {text[:300]!r}"
        if "\n" in text or "\r" in text:
            return f"an error of several lines: {text!r}"
        if not e.source:
            return f"an error that names no file: {text!r}"
        if e.source != "--set" and not Path(e.source).resolve().is_relative_to(work.root.resolve()):
            return f"an error that names another file: {text!r}"
        if not text.startswith(e.source):
            return f"an error that does not start with its file: {text!r}"
        if not e.message.strip():
            return f"an error that says nothing: {text!r}"
        if e.source != "--set" and e.key and e.line is None and _in_file(Path(e.source), e.key):
            return f"an error with a key but no line: {text!r}"
    return None


def _in_file(path: Path, key: str) -> bool:
    """Whether the file (a readable YAML mapping) holds the top-level key that ``key`` (dotted, perhaps after a
    variant's label) starts with: then the error can name its line (a key the file lacks has none)."""
    from record.spec.yamlfile import YamlFileError, decode, parse

    try:
        data = parse(decode(path.read_bytes())).data
    except (YamlFileError, OSError):
        return False
    top = re.split(r"[.\[]", key.rpartition(": ")[2])[0]
    return isinstance(data, dict) and top in {str(k) for k in data}


# --- running --------------------------------------------------------------------------------------------------


@dataclass
class Tally:
    kind: str
    examples: int = 0
    accepted: int = 0
    refused: int = 0
    slowest: float = 0.0  # CPU time
    slowest_wall: float = 0.0
    seconds: float = 0.0
    failures: dict[str, tuple[str, bytes, list[str] | None, str]] = field(default_factory=dict)  # signature -> example

    def add(self, outcome: Outcome, name: str, raw: bytes, sets: list[str] | None) -> None:
        self.examples += 1
        self.accepted += outcome.accepted
        self.refused += not outcome.accepted and outcome.failure is None
        self.slowest = max(self.slowest, outcome.seconds)
        self.slowest_wall = max(self.slowest_wall, outcome.wall)
        if outcome.failure is not None:
            signature = outcome.failure.split(" | ")[-1][:160]
            self.failures.setdefault(signature, (name, raw, sets, outcome.failure))


def run_kind(kind: str, examples: int, seed: int | None, work: Workdir, raise_failures: bool = False) -> Tally:
    """``examples`` inputs of ``kind``; failures collected (or, ``raise_failures``, raised for hypothesis to
    shrink to a minimal input)."""
    tally = Tally(kind)
    if kind == "set":  # the catalogue's run file as it is, with the options drawn
        strategy = st.tuples(st.just(("quickstart.yaml", b"")), overrides())
    else:
        strategy = st.tuples(files(kind), st.none())

    def body(example) -> None:
        (name, raw), sets = example
        if kind == "set":
            raw = (ROOT / "ablations" / "runs" / "quickstart.yaml").read_bytes()
        outcome = check(kind, raw, work, sets)
        tally.add(outcome, name, raw, sets)
        if raise_failures and outcome.failure is not None:
            raise AssertionError(f"{kind} input from {name} {sets or ''}: {outcome.failure}\n{raw[:3000]!r}")

    test = settings(
        max_examples=examples,
        deadline=None,
        database=None,  # nothing written (hypothesis would keep its examples in .hypothesis/ of the working folder)
        derandomize=seed is None,
        phases=[Phase.generate, Phase.shrink] if raise_failures else [Phase.generate],
        suppress_health_check=list(HealthCheck),
        print_blob=False,
    )(given(strategy)(body))
    if seed is not None:
        test = hypothesis.seed(seed)(test)
    for path in catalogue("run" if kind == "set" else kind):  # imports, first reads: not an input's time
        check(kind, path.read_bytes(), work, [] if kind == "set" else None)
    start = time.perf_counter()
    test()
    tally.seconds = time.perf_counter() - start
    return tally


def through_cli(kind: str, raw: bytes, sets: list[str] | None, work: Workdir) -> str | None:
    """The input through the real ``ablate`` command: exit 0 (accepted) or 2 with ``error:`` lines and no traceback."""
    path = work.path(kind)
    path.write_bytes(raw)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if kind in ("run", "set"):  # a run file that is accepted would train: check it without training
        return _run_file_cli(path, sets, work, env)
    command = "sweep" if kind == "study" else "search"
    argv = [sys.executable, "-m", "ablate", command, str(path), "--dry-run"]
    argv += ["--tracking-uri", f"sqlite:///{work.root}/mlflow.db"]
    out = subprocess.run(argv, cwd=work.root, capture_output=True, env=env, timeout=120)
    return _cli_verdict(out, path)


def _run_file_cli(path: Path, sets: list[str] | None, work: Workdir, env: dict) -> str | None:
    """``ablate run`` refuses a bad file with 2 before it starts; an accepted one would train, so it is given a
    tracking store that does not exist where none can be made (a file in place of its folder): the command stops
    with 1 after the checks, having trained nothing."""
    blocker = work.root / "blocked"
    blocker.write_text("")
    # an argument is a C string: it ends at its first NUL, as a shell would pass it (Popen refuses one that holds it)
    argv = [sys.executable, "-m", "ablate", "run", str(path), *[f"--set={s}".split("\x00")[0] for s in sets or []]]
    argv += ["--tracking-uri", f"sqlite:///{blocker}/mlflow.db"]
    out = subprocess.run(argv, cwd=work.root, capture_output=True, env=env, timeout=120)
    blocker.unlink()
    if out.returncode == 1 and b"Traceback" not in out.stderr:
        return None  # accepted by the checks, stopped by the store
    return _cli_verdict(out, path)


def _cli_verdict(out: subprocess.CompletedProcess, path: Path) -> str | None:
    err = out.stderr.decode("utf-8", "replace")
    if b"Traceback" in out.stderr or b"Traceback" in out.stdout:
        return f"a traceback from the command: {err[-1500:]}"
    if out.returncode not in (0, 2):
        return f"exit status {out.returncode}: {err[-500:]}"
    if out.returncode == 2:
        lines = [line for line in err.splitlines() if line.strip()]
        if not lines or not all(line.startswith("error: ") for line in lines):
            return f"exit 2 without error lines: {err[-500:]}"
    return None


def report(tallies: list[Tally], out: Callable[[str], None] = print) -> None:
    out("| kind | inputs | accepted | refused (SpecError, exit 2) | failures | slowest input (CPU, clock) | time |")
    out("|---|---|---|---|---|---|---|")
    for t in tallies:
        out(
            f"| {t.kind} | {t.examples:,} | {t.accepted:,} | {t.refused:,} | {len(t.failures)} | "
            f"{t.slowest * 1000:.0f} ms, {t.slowest_wall * 1000:.0f} ms | {t.seconds:.0f} s |"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=10_000, help="inputs per kind (default 10,000)")
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    parser.add_argument("--seed", type=int, default=0, help="hypothesis's seed (default 0)")
    parser.add_argument("--cli", type=int, default=0, help="also run this many inputs per kind through `ablate`")
    parser.add_argument("--verbose", action="store_true", help="print each failure whole")
    parser.add_argument("--save", type=Path, default=None, help="write each failure's input to this folder")
    args = parser.parse_args(argv)
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    work = Workdir()
    tallies = []
    try:
        for kind in args.kinds:
            tally = run_kind(kind, args.examples, args.seed, work)
            tallies.append(tally)
            print(
                f"{kind}: {tally.examples} inputs in {tally.seconds:.0f} s, {len(tally.failures)} failures", flush=True
            )
            for i, (signature, (name, raw, sets, failure)) in enumerate(tally.failures.items()):
                print(f"  FAILURE ({name}{' ' + json.dumps(sets) if sets else ''}): {signature}")
                if args.verbose:
                    print(f"    {failure}")
                if args.save:
                    args.save.mkdir(parents=True, exist_ok=True)
                    (args.save / f"{kind}-{i}.yaml").write_bytes(raw)
                    if sets:
                        (args.save / f"{kind}-{i}.set.json").write_text(json.dumps(sets))
        if args.cli:
            rng = random.Random(args.seed)
            for kind in args.kinds:
                bad = []
                for _ in range(args.cli):
                    raw, sets = _cli_input(kind, rng)
                    if (problem := through_cli(kind, raw, sets, work)) is not None:
                        bad.append(problem)
                print(f"{kind} through `ablate`: {args.cli} inputs, {len(bad)} failures", *bad[:3], sep="\n  ")
    finally:
        work.close()
    print()
    report(tallies)
    return 1 if any(t.failures for t in tallies) else 0


def _cli_input(kind: str, rng: random.Random) -> tuple[bytes, list[str] | None]:
    """A mutated input for the command, drawn with hypothesis's ``example`` (outside a test)."""
    import warnings

    from hypothesis.errors import NonInteractiveExampleWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NonInteractiveExampleWarning)
        _, raw = files("run" if kind == "set" else kind).example()
        sets = overrides().example() if kind == "set" else None
    if kind == "set":
        raw = (ROOT / "ablations" / "runs" / "quickstart.yaml").read_bytes()
    return raw, sets


if __name__ == "__main__":
    sys.exit(main())
