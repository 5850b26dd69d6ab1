"""What fuzzing the loaders found (benchmarks/fuzz.py), each with the smallest input that showed it: a traceback, a
hang, an error of several lines or of 200,000 characters, a file accepted that training would refuse. Each is now
refused with one line that names the file, the line and the key, in well under a second."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from record.spec import SpecError, load_run, load_search, load_study
from record.spec.yamlfile import MAX_BYTES, parse

RUN = "task: {name: reverse}\nmodel: {d_model: 16, n_heads: 2, n_layers: 1, d_ff: 32}\n"
BASE = "  task: {name: reverse}\n  model: {d_model: 16, n_heads: 2, n_layers: 1, d_ff: 32}\n"
STUDY = "name: t\nbase:\n" + BASE + "design:\n  grid:\n    model.norm: [pre, post]\n"
SEARCH = "name: s\nbase:\n" + BASE + "space:\n  training.lr: {type: float, low: 0.001, high: 0.01}\nn_trials: 2\n"


def refused(loader, tmp_path: Path, content: str | bytes, *, name: str = "file.yaml", **kw) -> list[str]:
    """The lines of the refusal, each checked: one line, starting with the file, and no hang (the bugs found took
    minutes; the one-second bound is benchmarks/fuzz.py's to measure: a suite has no speed thresholds)."""
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    start = time.process_time()
    with pytest.raises(SpecError) as info:
        loader(path, **kw)
    assert time.process_time() - start < 30.0  # a hang, not a speed
    lines = [str(e) for e in info.value.every()]
    for line in lines:
        assert "\n" not in line and len(line) < 1500 and line.startswith((str(tmp_path), "--set")), line
    return lines


def test_a_control_character_is_refused_with_its_line_not_a_traceback(tmp_path):
    # PyYAML's reader raised outside the loader's error handling (the fuzzer wrote a comment holding a bell)
    lines = refused(load_run, tmp_path, RUN + "seed: 1  # \x07\n")
    assert lines == [f"{tmp_path}/file.yaml:3: holds the control character U+0007 at line 3, column 12; a "
                     "configuration file holds printable text only"]  # fmt: skip
    assert refused(load_run, tmp_path, "task: {name: re\x9everse}\n")[0].startswith(f"{tmp_path}/file.yaml:1: holds")


@pytest.mark.parametrize(
    ("value", "kind"),
    [('!!bool "yes\\n\'"', "true or false"), ("!!int abc", "an integer"), ("!!timestamp 2020-13-45", "a date")],
)
def test_a_tag_that_cannot_read_its_value_is_refused_with_its_line(tmp_path, value, kind):
    # KeyError, ValueError from PyYAML's constructors: a traceback
    lines = refused(load_run, tmp_path, RUN + f"seed: {value}\n")
    assert lines[0].startswith(f"{tmp_path}/file.yaml:3: the value ") and f"cannot be read as {kind}" in lines[0]


def test_an_integer_beyond_64_bits_is_refused_where_a_float_would_overflow(tmp_path):
    # training.sampling_k is a float: canonical() raised OverflowError converting 10**800 for the cell id
    lines = refused(load_run, tmp_path, RUN + "training: {sampling_k: " + "9" * 800 + "}\n")
    assert lines == [f"{tmp_path}/file.yaml:3: the integer {'9' * 40}... at line 3 is beyond what any setting takes "
                     "(64 bits): fix it, or quote it to make it text"]  # fmt: skip
    assert parse("a: 9223372036854775807").data == {"a": 2**63 - 1}


@pytest.mark.parametrize("base", ["x" * 300, "runs/a\x00b.yaml"], ids=["too-long", "nul"])
def test_a_base_that_is_no_path_is_refused_not_a_traceback(tmp_path, base):
    # OSError (file name too long) and ValueError (embedded null byte) from Path.is_dir()
    study = STUDY.replace("base:\n" + BASE, f"base: {base!r}\n".replace("\\x00", "\\0").replace("'", '"'))
    lines = refused(load_study, tmp_path, study)
    assert lines[0].startswith(f"{tmp_path}/file.yaml:2: base: ") and "is not a run file" in lines[0], lines


def test_a_huge_seed_count_is_refused_not_built(tmp_path):
    # seeds: 10**30 raised OverflowError in range(); 10**11 would have built a list of 10**11 seeds
    for seeds in ("1" + "0" * 11, "9223372036854775807"):
        lines = refused(load_study, tmp_path, STUDY + f"seeds: {seeds}\n")
        assert lines == [
            f"{tmp_path}/file.yaml:8: seeds: {seeds} seeds are more than a study runs: give at most 10,000"
        ]


def test_a_seed_no_training_takes_is_refused_on_the_seeds_line(tmp_path):
    # accepted before, then every cell failed in seed_everything (numpy takes seeds below 2**32); the refusal
    # blamed the base's line, which sets no seed
    lines = refused(load_study, tmp_path, STUDY + "seeds: [0, 5000000000]\n")
    assert lines == [f"{tmp_path}/file.yaml:8: seeds: 5000000000 must be at most 4294967295"]
    assert refused(load_run, tmp_path, RUN + "seed: 4294967296\n") == [
        f"{tmp_path}/file.yaml:3: seed: 4294967296 must be at most 4294967295"
    ]


def test_a_search_base_with_text_for_a_number_is_refused_on_the_base_line(tmp_path):
    # int("xxx") in the pruner's warm-up, before the base was judged: ValueError; then, once judged, it was blamed
    # on the line of `space:`, which does not set it
    lines = refused(load_search, tmp_path, SEARCH.replace("  model:", "  training: {val_every: xxx}\n  model:"))
    assert lines == [f"{tmp_path}/file.yaml:4: base.training.val_every: val_every='xxx' must be an integer"]
    (tmp_path / "run.yaml").write_text("task: {name: reverse}\ntraining: {val_every: xxx}\n")
    search = SEARCH.replace("base:\n" + BASE, "base: run.yaml\n")
    lines = refused(load_search, tmp_path, search)
    assert lines == [f"{tmp_path}/run.yaml:2: training.val_every: val_every='xxx' must be an integer (base of "
                     f"{tmp_path}/file.yaml)"]  # fmt: skip


def test_thousands_of_unknown_keys_are_refused_in_a_second_not_in_minutes(tmp_path):
    # each unknown key searched every valid key for what it meant: 20,000 of them took 163 s; now the first 20 are
    # named (and 25 looked for)
    keys = ", ".join(f"k{i}: {i}" for i in range(5_000))
    lines = refused(load_run, tmp_path, RUN + f"resources: {{{keys}}}\n")
    assert len(lines) == 21 and lines[-1] == f"{tmp_path}/file.yaml: more mistakes follow; fix these first"
    assert lines[0] == f"{tmp_path}/file.yaml:3: resources.k0: unknown key; valid: threads"


@pytest.mark.parametrize("key", ["n_layers", "n_heads", "n_decoder_layers"])
def test_a_layer_or_head_count_no_model_has_is_refused_not_a_hang(tmp_path, key):
    # n_layers: 100000000 hung the checks that walk every layer (and n_heads every head)
    lines = refused(
        load_run, tmp_path, RUN.replace("n_heads: 2" if key == "n_heads" else "n_layers: 1", f"{key}: 100000000")
    )
    assert lines == [f"{tmp_path}/file.yaml:2: model.{key}: {key}=100000000 is more than a model here can have (at "
                     "most 256)"]  # fmt: skip


def test_a_value_of_thousands_of_items_is_quoted_short_in_its_error(tmp_path):
    # the refusal quoted every item: one line of 200,000 characters (20,000 items)
    items = ", ".join(str(i % 10) for i in range(15_000))
    lines = refused(load_run, tmp_path, RUN.replace("d_ff: 32", f"norm: [{items}]"))
    assert len(lines) == 1 and "characters left out)..." in lines[0] and lines[0].endswith("valid: 'pre', 'post'")


def test_a_set_option_holding_a_line_break_is_shown_on_one_line(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(RUN)
    with pytest.raises(SpecError) as info:
        load_run(path, ["bad\nkey=1"])
    assert str(info.value).startswith("--set: bad\\nkey=1: unknown key") and "\n" not in str(info.value)


def test_a_file_of_the_largest_size_is_refused_or_read_within_a_second(tmp_path):
    # a 400 KB file took 2 to 4 s to read (PyYAML's Python parser): libyaml's parser, and files up to 100 KB
    flat = "model: {norm: [" + ", ".join(["1"] * (MAX_BYTES // 3 - 20)) + "]}\n"
    assert len(flat) <= MAX_BYTES
    lines = refused(load_run, tmp_path, flat)
    assert lines == [
        f"{tmp_path}/file.yaml:1: expands to more than 20,000 values; a configuration file does not need that many"
    ]  # fmt: skip  (no alias in it: the message does not say there are)
    lines = refused(load_run, tmp_path, "# padding\n" * (MAX_BYTES // 10 + 1))
    assert "is over 100,000 bytes" in lines[0]


def test_a_null_key_in_a_search_parameter_is_refused_not_a_traceback(tmp_path):
    # sorting the parameter's unknown keys compared None with text: TypeError
    search = SEARCH.replace("{type: float, low: 0.001, high: 0.01}", "{type: float, low: 0.001, high: 0.01, null: 1}")
    lines = refused(load_search, tmp_path, search)
    assert lines == [f"{tmp_path}/file.yaml:6: space.training.lr[null]: this key reads as nothing (null), not as "
                     "text: write it in quotes"]  # fmt: skip
