"""Malformed files are refused with one line that says why, by every command, before any YAML object is built:
binary files, other encodings, huge or deeply nested documents, alias bombs, tags that would build objects,
duplicate keys, several documents."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from record.spec import SpecError, load_run, load_search, load_study
from record.spec.yamlfile import MAX_BYTES, MAX_DEPTH, MAX_NODES, parse
from tests.conftest import ROOT

GOOD_RUN = "task: {name: copy}\nmodel: {d_model: 16, n_heads: 2}\n"


def alias_bomb(levels: int = 9) -> str:
    """The "billion laughs": each level repeats the previous one 9 times (9**9 values once expanded)."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


MALFORMED: list[tuple[str, bytes, str]] = [
    ("binary", bytes(range(256)) * 8, "is a binary file"),
    ("utf16", GOOD_RUN.encode("utf-16"), "is UTF-16 text; save it as UTF-8"),
    ("utf16-no-bom", GOOD_RUN.encode("utf-16-le"), "is UTF-16 text (no byte-order mark)"),
    ("utf32", GOOD_RUN.encode("utf-32"), "is UTF-32 text"),
    ("latin1", "task: {name: caf\xe9}\n".encode("latin-1"), "is not UTF-8 text (byte 0xe9 at line 1)"),
    ("huge", b"# padding\n" * (MAX_BYTES // 10 + 1), f"is over {MAX_BYTES:,} bytes"),
    ("deep-flow", b"task: " + b"[" * 5000 + b"]" * 5000, f"nests deeper than {MAX_DEPTH} levels"),
    ("deep-block", "".join(f"{'  ' * i}k{i}:\n" for i in range(MAX_DEPTH + 5)).encode(), "nests deeper than"),
    ("alias-bomb", alias_bomb().encode(), f"expands to more than {MAX_NODES:,} values"),
    ("python-tag", b"task: !!python/object/apply:os.system ['echo hi']\n", "uses the YAML tag"),
    ("custom-tag", b"task: !include other.yaml\n", "uses the YAML tag '!include'"),
    ("self-alias", b"task: &t [1, *t]\n", "anchor that refers to itself"),
    ("duplicate-key", b"task: {name: copy}\nseed: 1\nseed: 2\n", "seed appears twice (lines 2 and 3)"),
    ("two-documents", GOOD_RUN.encode() + b"---\n" + GOOD_RUN.encode(), "a second YAML document starts here"),
    ("list-key", b"task: {name: copy}\n? [a, b]\n: 1\n", "a key must be a name, not a list or a mapping"),
]


@pytest.mark.parametrize(("kind", "content", "words"), MALFORMED, ids=[m[0] for m in MALFORMED])
@pytest.mark.parametrize("loader", [load_run, load_study, load_search], ids=["run", "study", "search"])
def test_malformed_files_are_refused_with_one_line(tmp_path, loader, kind, content, words):
    path = tmp_path / "file.yaml"
    path.write_bytes(content)
    with pytest.raises(SpecError) as err:
        loader(path)
    line = str(err.value)
    assert "\n" not in line and line.startswith(str(path)) and words in line, line


@pytest.mark.slow
@pytest.mark.parametrize("command", ["run", "sweep", "search"])
def test_every_command_refuses_them_with_exit_2_and_one_line(tmp_path, command):
    files = {kind: content for kind, content, _ in MALFORMED if kind in ("utf16", "alias-bomb", "python-tag")}
    for kind, content in files.items():
        path = tmp_path / f"{kind}.yaml"
        path.write_bytes(content)
        out = subprocess.run(
            [sys.executable, "-m", "ablate", command, str(path)],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
        )
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"error: {path}"), (kind, out.stderr)
        assert not (tmp_path / ".ablate").exists()  # nothing was started or recorded


def test_lines_of_keys_and_list_items():
    doc = parse("model:\n  n_heads: 2\nlist:\n  - a\n  - {x: 1}\nbase: &b {y: 1}\nother:\n  <<: *b\n  z: 2\n")
    assert doc.line(("model", "n_heads")) == 2
    assert doc.line(("list", 1)) == 5 and doc.line(("list", 1, "x")) == 5
    assert doc.line(("model", "missing")) == 1  # the nearest enclosing key the file holds
    assert doc.data["other"] == {"y": 1, "z": 2}  # merge keys still work


def test_a_plain_configuration_reads_as_before():
    text = "a: 3e-4\nb: 1.5\nc: 10\nd: 1_000\ne: '3e-4'\nf: [1, {g: null}]\nh: true\n"
    assert parse(text).data == yaml.safe_load(text.replace("3e-4\n", "3.0e-4\n", 1))
