"""Reading a configuration file: a small UTF-8 YAML mapping, or one line that says why not, in well under a second.

Refused before any YAML is built: files over ``MAX_BYTES``, binary files, other encodings (UTF-16 and UTF-32,
with or without a byte-order mark, Latin-1, ...), control characters. Refused while composing, before any Python object exists:
nesting deeper than ``MAX_DEPTH``, documents that expand to more than ``MAX_NODES`` values through aliases
(the "billion laughs"), anchors that refer to themselves, tags that would build objects (``!!python/...``,
any ``!custom`` tag), duplicate keys and several documents in one file.

What is kept: the data (plain dicts, lists and scalars) and the line of every key and list item, so that an
error can point at the line to fix (``Document.line``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

import yaml

MAX_BYTES = (
    100_000  # a configuration file, not a dataset (the catalogue's largest is 3 KB); read in well under a second
)
MAX_DEPTH = 50  # levels of nesting
MAX_NODES = 20_000  # values after expanding aliases

Path_ = tuple  # a key path: ("model", "n_heads"), ("design", "variants", 2, "set")

# the tags a plain configuration may carry (implicit ones included: 3e-4 is a float, 2024-01-01 a timestamp)
PLAIN_TAGS = {
    f"tag:yaml.org,2002:{t}" for t in ("str", "int", "float", "bool", "null", "map", "seq", "timestamp", "merge")
}


class YamlFileError(ValueError):
    """The file cannot be read as a configuration; ``line`` is 1-based when known."""

    def __init__(self, message: str, line: int | None = None) -> None:
        super().__init__(message)
        self.message, self.line = message, line


class Loader(yaml.SafeLoader):
    """yaml.SafeLoader (no code, no arbitrary objects) that also reads 3e-4 as a float, not a string
    (YAML 1.1 wants 3.0e-4; researchers write 3e-4)."""


Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
    |\.[0-9_]+(?:[eE][-+][0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


try:
    from yaml.cyaml import CParser
except ImportError:  # PyYAML built without libyaml
    CParser = None

if CParser is not None:

    class _FastLoader(CParser, yaml.constructor.SafeConstructor, yaml.resolver.Resolver):
        """``Loader`` on libyaml's parser (a 400 KB file took 4 s to compose in Python, 0.4 s here), with the same
        resolvers and constructors."""

        def __init__(self, stream: str) -> None:
            CParser.__init__(self, stream)
            yaml.constructor.SafeConstructor.__init__(self)
            yaml.resolver.Resolver.__init__(self)

    _FastLoader.yaml_implicit_resolvers = Loader.yaml_implicit_resolvers
_LOADER = Loader if CParser is None else _FastLoader
STR, NULL, MERGE = (f"tag:yaml.org,2002:{t}" for t in ("str", "null", "merge"))


@dataclass
class Document:
    """A parsed file: its data and the line of each key path."""

    source: str
    data: Any
    lines: dict[Path_, int] = field(default_factory=dict)

    def line(self, path: Path_ | list) -> int | None:
        """The line of ``path``, else of its nearest enclosing key that the file holds."""
        path = tuple(path)
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path[:-1]
        return None


# --- bytes -> text -----------------------------------------------------------------------------------------

_BOMS = [
    (b"\xff\xfe\x00\x00", "UTF-32"),
    (b"\x00\x00\xfe\xff", "UTF-32"),
    (b"\xff\xfe", "UTF-16"),
    (b"\xfe\xff", "UTF-16"),
]


def decode(raw: bytes) -> str:
    """UTF-8 text (a UTF-8 byte-order mark is allowed), else YamlFileError naming what the file looks like."""
    if len(raw) > MAX_BYTES:
        raise YamlFileError(f"is over {MAX_BYTES:,} bytes; a configuration file is smaller (is this the right file?)")
    for bom, name in _BOMS:
        if raw.startswith(bom):
            raise YamlFileError(f"is {name} text; save it as UTF-8")
    if b"\x00" in raw:
        sample = raw[:4096]
        zeros_odd = sample[1::2].count(0) > len(sample) // 4
        zeros_even = sample[0::2].count(0) > len(sample) // 4
        if zeros_odd != zeros_even:
            raise YamlFileError("is UTF-16 text (no byte-order mark); save it as UTF-8")
        raise YamlFileError("is a binary file, not YAML text")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        raise YamlFileError(
            f"is not UTF-8 text (byte 0x{raw[err.start]:02x} at line {line}); save it as UTF-8", line
        ) from None


# --- text -> checked node graph -> data ------------------------------------------------------------------


def _check_graph(root: yaml.Node) -> dict[Path_, int]:
    """Depth, size after aliases, tags and duplicate keys, on the composed node graph (no object built yet).
    Returns the line of every key path (first occurrence of a shared node)."""
    walk = _Walk()
    # iterative post-order walk; aliases make the graph a DAG (PyYAML shares the aliased node object)
    stack: list[tuple[yaml.Node, Path_, int, bool]] = [(root, (), 1, False)]
    while stack:
        node, path, depth, done = stack.pop()
        if done:
            walk.leave(node)
        elif walk.enter(node, depth):
            stack.append((node, path, depth, True))
            stack += walk.children(node, path, depth)
    return walk.lines


class _Walk:
    """The state of ``_check_graph``'s walk: the nodes on the current path (an anchor that refers to itself), each
    checked node's size after aliases, and the line of every key path."""

    def __init__(self) -> None:
        self.lines: dict[Path_, int] = {}
        self.sizes: dict[int, int] = {}  # id(node) -> values it expands to
        self.on_path: set[int] = set()
        self.visited = 0

    def enter(self, node: yaml.Node, depth: int) -> bool:
        """Check a node on the way down; False for an alias of a node already checked."""
        key, line = id(node), node.start_mark.line + 1
        if key in self.on_path:
            raise YamlFileError("has an anchor that refers to itself", line)
        if node.tag not in PLAIN_TAGS:
            raise YamlFileError(
                f"uses the YAML tag {node.tag!r}; a configuration file holds plain values only "
                "(numbers, text, true/false, lists, mappings)",
                line,
            )
        if depth > MAX_DEPTH:
            raise YamlFileError(f"nests deeper than {MAX_DEPTH} levels", line)
        if node.tag == INT and len(node.value) > 18 and _too_large(node):
            shown = node.value if len(node.value) <= 40 else node.value[:40] + "..."
            raise YamlFileError(
                f"the integer {shown} at line {line} is beyond what any setting takes (64 bits): "
                "fix it, or quote it to make it text",
                line,
            )
        self.visited += 1
        if self.visited > 4 * MAX_NODES:  # distinct nodes: a huge flat file (already bounded by MAX_BYTES)
            raise YamlFileError(f"holds more than {4 * MAX_NODES:,} values")
        if key in self.sizes:
            return False
        self.on_path.add(key)
        return True

    def leave(self, node: yaml.Node) -> None:
        """A node's size once its children's are known: at most MAX_NODES values after aliases."""
        key = id(node)
        self.on_path.discard(key)
        if isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        else:
            children = list(node.value) if isinstance(node, yaml.SequenceNode) else []
        self.sizes[key] = 1 + sum(self.sizes[id(c)] for c in children)
        if self.sizes[key] > MAX_NODES:
            why = " (aliases repeat a large anchor)" if self.visited <= MAX_NODES else ""
            raise YamlFileError(
                f"expands to more than {MAX_NODES:,} values{why}; a configuration file does not need that many",
                node.start_mark.line + 1,
            )

    def children(self, node: yaml.Node, path: Path_, depth: int) -> list[tuple[yaml.Node, Path_, int, bool]]:
        """A node's children to walk, with their key paths; a mapping's keys are checked for duplicates."""
        out: list[tuple[yaml.Node, Path_, int, bool]] = []
        if isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                self.lines.setdefault((*path, i), item.start_mark.line + 1)
                out.append((item, (*path, i), depth + 1, False))
        if not isinstance(node, yaml.MappingNode):
            return out
        seen: dict[Any, int] = {}
        for k, v in node.value:
            name = k.value if isinstance(k, yaml.ScalarNode) else None
            if name == "<<":  # a merge key: its mapping's keys join this one
                out += [(k, (*path, "<key>"), depth + 1, False), (v, path, depth + 1, False)]
                continue
            line = k.start_mark.line + 1
            if name is None:  # `? [a, b]`: a list or a mapping as a key
                raise YamlFileError("a key must be a name, not a list or a mapping", line)
            if name in seen:
                where = ".".join(str(p) for p in (*path, name))
                raise YamlFileError(f"{where} appears twice (lines {seen[name]} and {line}); keep one", line)
            seen[name] = line
            key = _scalar_key(k)
            self.lines.setdefault((*path, key), line)
            out += [(k, (*path, "<key>"), depth + 1, False), (v, (*path, key), depth + 1, False)]
        return out


def _scalar_key(node: yaml.ScalarNode) -> Any:
    """The key as the data will hold it (YAML keys are mostly strings; ``1: x`` is an int key, ``2020-01-01: x`` a
    date, ``"1": x`` a string), read from its node's tag."""
    if node.tag == STR:
        return node.value
    value = _construct(node)
    return value if isinstance(value, (str, int, float, bool, date)) or value is None else node.value


_CONSTRUCTOR = yaml.constructor.SafeConstructor()
INT = "tag:yaml.org,2002:int"


def _too_large(node: yaml.ScalarNode) -> bool:
    """An integer beyond 64 bits (or beyond the 4,300 digits Python reads): no setting takes one, and a float
    setting given one fails to convert it (an OverflowError, not a message)."""
    value = _construct(node)
    return not isinstance(value, int) or not -(2**63) <= value < 2**63


def _construct(node: yaml.ScalarNode) -> Any:
    """A plain scalar's value, or the node's text if its tag cannot read it (``!!int abc``: ``_unreadable`` says)."""
    try:
        return _CONSTRUCTOR.yaml_constructors[node.tag](_CONSTRUCTOR, node)
    except (yaml.YAMLError, ValueError, TypeError, KeyError, AttributeError, OverflowError):
        return node.value


def _unreadable(node: yaml.Node) -> YamlFileError | None:
    """The first scalar below ``node`` that its tag cannot read (``!!int abc``, ``!!bool maybe``, an integer of
    more than 4,300 digits), as the error that names its line; None if there is none."""
    stack, seen = [node], set()
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        if isinstance(n, yaml.ScalarNode):
            if n.tag not in (STR, NULL, MERGE) and _construct(n) is n.value:
                kind = {"int": "an integer", "float": "a number", "bool": "true or false"}.get(n.tag[18:], "a date")
                shown = n.value if len(n.value) <= 40 else n.value[:40] + "..."
                return YamlFileError(
                    f"the value {shown!r} at line {n.start_mark.line + 1} cannot be read as {kind}: fix it, or "
                    "quote it to make it text",
                    n.start_mark.line + 1,
                )
        elif isinstance(n, yaml.SequenceNode):
            stack += reversed(n.value)
        else:
            stack += [x for pair in reversed(n.value) for x in reversed(pair)]
    return None


def _flow_depth_guard(text: str) -> None:
    """PyYAML composes recursively: thousands of nested [ or { cost seconds before Python's recursion limit
    stops them. Count the nesting of flow brackets first (quoted brackets may over-count: still refused
    only past MAX_DEPTH)."""
    depth = 0
    for m in re.finditer(r"[\[\]{}]", text):
        depth += 1 if m.group() in "[{" else -1
        if depth > MAX_DEPTH:
            raise YamlFileError(f"nests deeper than {MAX_DEPTH} levels", text.count("\n", 0, m.start()) + 1)


# what YAML allows in a file (YAML 1.1, section 5.1, as PyYAML's reader checks it)
_NOT_PRINTABLE = re.compile("[^\x09\x0a\x0d\x20-\x7e\x85\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _printable(text: str) -> None:
    """A control character (a bell, an escape, a C1 control code) is refused with its line and column, before
    PyYAML's reader, which refuses it with a position counted in characters, from outside its error handling."""
    m = _NOT_PRINTABLE.search(text)
    if m:
        line = text.count("\n", 0, m.start()) + 1
        column = m.start() - (text.rfind("\n", 0, m.start()) + 1) + 1
        raise YamlFileError(
            f"holds the control character U+{ord(m.group()):04X} at line {line}, column {column}; a configuration "
            "file holds printable text only",
            line,
        )


def parse(text: str, source: str = "<text>") -> Document:
    """YAML text -> Document; YamlFileError for anything that is not one plain YAML document."""
    _flow_depth_guard(text)
    _printable(text)
    loader = _LOADER(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return Document(source, None)
        lines = _check_graph(node)
        try:
            data = loader.construct_document(node)
        except (ValueError, TypeError, KeyError, AttributeError, OverflowError):  # a tag that cannot read its value
            raise _unreadable(node) or YamlFileError("holds a value its YAML tag cannot read") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        if "expected a single document" in str(err):
            problem = "a second YAML document starts here (---); keep one document per file"
        raise YamlFileError(f"is not valid YAML{where}: {problem}", mark.line + 1 if mark else None) from None
    except RecursionError:
        raise YamlFileError(f"nests deeper than {MAX_DEPTH} levels") from None
    finally:
        loader.dispose()
    return Document(source, data, lines)


def load_yaml(text: str) -> Any:
    """The data of a YAML text (checked as a configuration file)."""
    return parse(text).data


def read(path: str | Path) -> Document:
    """Read and parse a configuration file (OSError and YamlFileError propagate)."""
    with open(path, "rb") as f:
        raw = f.read(MAX_BYTES + 1)  # never more: a huge file is refused without reading it whole
    return parse(decode(raw), str(path))
