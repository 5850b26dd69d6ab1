"""Run files: malformed ones are refused with one line naming the file, the key and the valid values,
before anything starts; good ones resolve against their task."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from models.config import ModelConfig
from record.spec import SpecError, load_run, resolve_run
from tests.conftest import ROOT

GOOD = {"task": {"name": "copy"}, "model": {"d_model": 32, "n_heads": 2}}


def line_of(text: str, path: tuple[str, ...]) -> int | None:
    """The 1-based line of a key path in block YAML written by yaml.safe_dump, found by reading the text: each key
    is searched for below its parent, one indentation level deeper (None when the file does not hold it)."""
    lines = text.splitlines()
    start, indent = 0, 0
    found = None
    for key in path:
        found = None
        for i in range(start, len(lines)):
            if lines[i].startswith(" " * indent + f"{key}:"):
                found = i
                break
            if i > start and lines[i].strip() and len(lines[i]) - len(lines[i].lstrip()) < indent:
                break  # left the parent's block
        if found is None:
            return None
        start, indent = found + 1, indent + 2
    return found + 1


MALFORMED = [
    # (the run file's content, a --set override or None, the key path blamed (None: the override), the message)
    ({"task": {"name": "copy"}, "modle": {}}, None, ("modle",), r"modle: unknown key; did you mean model\?"),
    ({"model": {}}, None, ("task",), r"task: is required \(for example task: \{name: copy\}\)"),
    ({"task": {"name": "translate"}}, None, ("task", "name"), r"task.name: name='translate' is not a valid task"),
    ({"task": {"name": ["a"]}}, None, ("task", "name"), r"task.name: name=\['a'\] is not a valid task"),
    ({"task": {"name": "copy", "lenght": 5}}, None, ("task", "lenght"), r"task.lenght: unknown key; valid: name"),
    ({"task": {"name": "copy", "max_len": "ten"}}, None, ("task", "max_len"), r"max_len='ten' must be of type int"),
    (
        {**GOOD, "model": {"arch": "decoder"}},
        None,
        ("model", "arch"),
        r"model.arch: 'decoder' does not fit task 'copy', which needs arch 'encoder_decoder'",
    ),
    ({**GOOD, "model": {"score": "mlp"}}, None, ("model", "score"), r"model.score: score='mlp' is not a valid choice"),
    (
        {**GOOD, "model": {"n_head": 4}},
        None,
        ("model", "n_head"),
        r"model.n_head: unknown key; did you mean model.n_heads\?",
    ),
    ({**GOOD, "model": {"postions": "x"}}, None, ("model", "postions"), r"did you mean model.positions\?"),
    (
        {**GOOD, "model": {"lr": 0.1}},
        None,
        ("model", "lr"),
        r"did you mean training.lr\? \(lr belongs under training:\)",
    ),
    # on the line of the key it names first (it was the model: line)
    (
        {**GOOD, "model": {"pattern": "local"}},
        None,
        ("model", "pattern"),
        r"model.pattern: pattern 'local' or 'dilated' needs window",
    ),
    (  # on the line of the field at fault (a respelling's field), not of the key the message starts with
        {**GOOD, "model": {"d_model": 32, "n_heads": 2, "pattern": "local", "layer_windows": [2, 2]}},
        None,
        ("model", "layer_windows"),
        r"model.layer_windows: pattern: local, layer_windows: \[2, 2\] resolves to the same attention as pattern: "
        r"local, window: 2: write that",
    ),
    (  # a key missing (window) beside the one the file wrote that needs it (it was the model: line)
        {**GOOD, "model": {"d_model": 32, "n_heads": 2, "layer_patterns": ["local", "full"]}},
        None,
        ("model", "layer_patterns"),
        r"model.layer_patterns: pattern 'local' or 'dilated' needs window",
    ),
    (
        {**GOOD, "model": {"pattern": "full"}},
        "model.pattern=local",
        None,
        r"^--set: model.pattern=local: pattern 'local'",
    ),
    # a section given whole would replace the file's keys: one key at a time
    (
        GOOD,
        "model={n_heads: 4}",
        None,
        r"^--set: model={n_heads: 4}: would replace the whole model section, the file's keys with it: set one key at a time \(--set model.n_heads=4\)",
    ),
    # a refusal the LightningModule made only once training had started
    (
        {**GOOD, "model": {"decoding": "mask_predict"}, "training": {"sampling": "scheduled"}},
        None,
        ("training", "sampling"),
        r"'scheduled' feeds a decoder its own earlier predictions; decoding='mask_predict' has none",
    ),
    (GOOD, "name.x=1", None, r"^--set: name.x=1: \{'x': 1\} must be text"),
    ({**GOOD, "model": {"window": 4}}, None, ("model", "window"), r"model.window: window=4 requires pattern"),
    (
        {**GOOD, "model": {"positions": "rotary", "score": "additive"}},
        None,
        ("model", "positions"),
        r"model.positions: positions='rotary' .* additive",
    ),
    (
        {**GOOD, "model": {"d_model": 30, "n_heads": 4}},
        None,
        ("model", "d_model"),
        r"model.d_model: d_model=30 is not divisible by n_heads=4",
    ),
    (  # the default d_model refuses the file's n_heads: the line to change is the one the file holds
        {**GOOD, "model": {"n_heads": 3}},
        None,
        ("model", "n_heads"),
        r"model.n_heads: d_model=\d+ is not divisible by n_heads=3",
    ),
    (
        {**GOOD, "model": {"vocab_size": 5}},
        None,
        ("model", "vocab_size"),
        r"model.vocab_size: 5 is smaller than the vocabulary of task 'copy' \(14\)",
    ),
    (
        {**GOOD, "model": {"positions": "learned", "max_len": 8}},
        None,
        ("model", "max_len"),
        r"model.max_len: 8 is shorter than the longest sequence of task 'copy' \(21\)",
    ),
    (
        {"task": {"name": "listops"}, "model": {"n_classes": 3}},
        None,
        ("model", "n_classes"),
        r"model.n_classes: 3 differs from the 10 classes of task 'listops'",
    ),
    ({**GOOD, "training": {"lr": "fast"}}, None, ("training", "lr"), r"training.lr: lr='fast' must be a number"),
    (
        {**GOOD, "training": {"schedule": "linear"}},
        None,
        ("training", "schedule"),
        r"training.schedule: schedule='linear' is not a valid choice; valid: 'noam'",
    ),
    ({**GOOD, "training": {"max_step": 10}}, None, ("training", "max_step"), r"did you mean training.max_steps\?"),
    (
        {"task": {"name": "listops"}, "training": {"sampling": "scheduled"}},
        None,
        ("training", "sampling"),
        r"training.sampling: 'scheduled' feeds predictions back to a decoder",
    ),
    ({**GOOD, "seed": -1}, None, ("seed",), r"seed: -1 must be a non-negative integer"),
    ({**GOOD, "seed": True}, None, ("seed",), r"seed: true must be an integer"),
    ({**GOOD, "name": "my run!"}, None, ("name",), r"name: 'my run!' must be letters, digits"),
    (
        {**GOOD, "tracking": {"log_every": 0}},
        None,
        ("tracking", "log_every"),
        r"log_every: 0 must be a positive integer",
    ),
    ({**GOOD, "resources": {"gpus": 1}}, None, ("resources", "gpus"), r"resources.gpus: unknown key; valid: threads"),
    ({**GOOD, "training": []}, None, ("training",), r"training: must be a mapping of keys to values \(got list\)"),
    (GOOD, "model.n_heads", None, r"--set: 'model.n_heads': is not KEY=VALUE"),
    (GOOD, "modle.n_heads=4", None, r"--set: modle.n_heads=4: unknown key; did you mean model\?"),
    (GOOD, "model.n_heads=3", None, r"--set: model.n_heads=3: d_model=32 is not divisible by n_heads=3"),
    (GOOD, "task.name=[a]", None, r"--set: task.name=\[a\]: name=\['a'\] is not a valid task"),
    (GOOD, "model.n_heads.x=1", None, r"--set: model.n_heads.x=1: n_heads=\{'x': 1\} must be"),  # not the file
    (GOOD, "training.lr=[1", None, r"--set: training.lr=\[1: the value '\[1' is not valid YAML"),
    (GOOD, "training.lrr=0.1", None, r"--set: training.lrr=0.1: unknown key; did you mean training.lr\?"),
]


@pytest.mark.parametrize("content,override,path,message", MALFORMED, ids=[m[3][:40] for m in MALFORMED])
def test_malformed_run_files_are_refused_with_one_clear_line(tmp_path, content, override, path, message):
    """One line: FILE:LINE: KEY: what is wrong and the fix (--set: ITEM: ... for an override)."""
    file = tmp_path / "run.yaml"
    text = yaml.safe_dump(content)
    file.write_text(text)
    with pytest.raises(SpecError) as err:
        load_run(file, [override] if override else None)
    line = str(err.value)
    assert "\n" not in line
    if path is None:
        assert line.startswith("--set: "), line
    else:
        n = line_of(text, path)
        assert line.startswith(f"{file}:{n}: " if n else f"{file}: "), line
        assert err.value.line == n
    assert re.search(message, line), line


def test_unreadable_and_invalid_yaml_files(tmp_path):
    with pytest.raises(SpecError, match=r"missing.yaml: cannot read the file"):
        load_run(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("task: {name: copy\nmodel: [")
    with pytest.raises(SpecError, match=r"bad.yaml:\d+: is not valid YAML at line \d+, column \d+"):
        load_run(bad)
    listy = tmp_path / "list.yaml"
    listy.write_text("- task\n")
    with pytest.raises(SpecError, match=r"list.yaml: must be a YAML mapping"):
        load_run(listy)


def test_resolution_fills_what_the_task_determines():
    run = resolve_run({"task": {"name": "listops", "max_depth": 5, "max_len": 600}, "model": {"positions": "learned"}})
    assert run.model.arch == "encoder" and run.model.n_classes == 10 and run.model.max_len == 600
    assert run.model.vocab_size == run.task.vocab_size
    params = run.params()
    assert params["task.name"] == "listops" and params["model.arch"] == "encoder" and "seed" in params
    assert not any(k.startswith(("tracking", "resources", "name")) for k in params)  # operational fields stay out
    same = resolve_run(
        {
            "task": {"name": "listops", "max_depth": 5, "max_len": 600},
            "model": {"positions": "learned"},
            "tracking": {"log_every": 3},
            "name": "other",
        }
    )
    assert same.config_hash() == run.config_hash()
    assert resolve_run({**GOOD, "seed": 1}).config_hash() != resolve_run(GOOD).config_hash()


def test_params_show_every_field_as_it_trains_and_leave_the_identity_alone():
    """MLflow's params are what a reader compares runs by: a field left out shows what it means (head_dim 'None'
    hid the head size the heads studies vary), a field the config's dictionary leaves out at its default shows it,
    and a field this model refuses stays empty. The run's identity is untouched: the same model spelt with its
    head size given has the same params and the same config_hash."""
    from dataclasses import fields

    from models.training import TrainingConfig

    run = resolve_run({**GOOD, "model": {"d_model": 32, "n_heads": 4}})
    params = run.params()
    assert {k for k in params if k.startswith("model.")} == {f"model.{f.name}" for f in fields(ModelConfig)}
    assert {k for k in params if k.startswith("training.")} == {f"training.{f.name}" for f in fields(TrainingConfig)}
    assert params["model.head_dim"] == run.model.head_size == 8 and params["model.d_ff"] == run.model.ff_size
    assert params["training.eval_batch_size"] == run.training.batch_size
    assert params["training.beam_size"] == 1 and params["training.compile"] is False  # left out of its dictionary
    assert params["model.dilated_heads"] is None  # no dilated layer: refused if given
    spelt = resolve_run({**GOOD, "model": {"d_model": 32, "n_heads": 4, "head_dim": 8, "d_ff": 128}})
    assert spelt.params() == params and spelt.config_hash() == run.config_hash()


def test_overrides_apply_before_validation(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(GOOD))
    run = load_run(path, ["model.n_heads=4", "training.lr=3e-4", "seed=7", "task.max_len=5"])
    assert run.model.n_heads == 4 and run.training.lr == 3e-4 and run.seed == 7
    assert run.task.params.max_len == 5


def test_cli_exits_2_with_one_line_and_logs_nothing(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({**GOOD, "model": {"score": "mlp"}}))
    out = subprocess.run(
        [sys.executable, "-m", "ablate", "run", str(path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    n = line_of(path.read_text(), ("model", "score"))
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}:{n}: model.score: score='mlp' is not a valid"), lines
    assert not (tmp_path / ".ablate").exists()  # no store was even created


def test_a_key_yaml_does_not_read_as_text_is_named_as_such_in_a_run_file(tmp_path):
    """`3:` in model and `yes:` at the top of a run file: each named once, by what YAML read (a copy of the data
    through JSON had made them "3" and "true", named as unknown keys, the top one without its line)."""
    path = tmp_path / "run.yaml"
    path.write_text("task: {name: copy}\nmodel: {3: 1, d_model: 32, n_heads: 2}\nyes: 2\n")
    with pytest.raises(SpecError) as info:
        load_run(path, ["training.max_steps=3"])  # with an override, as without
    assert [str(e) for e in info.value.every()] == [
        f"{path}:2: model[3]: this key reads as a number (3), not as text: write it in quotes",
        f"{path}:3: [true]: this key reads as true/false (true), not as text: write it in quotes",
    ]


def test_every_misspelt_key_of_a_file_is_named_at_once_in_the_files_order(tmp_path, capsys):
    """One pass over a file names every key no section knows, each with its line and the nearest valid name, so
    a user fixes them all before the next try (and no value is judged until the keys are right)."""
    from ablate.main import main

    data = {
        "lrr": 3,
        "task": {"name": "copy", "max_lenn": 5},
        "model": {"postions": "learned", "lr": 0.1, "n_heads": -1},
        "training": {"max_step": 3},
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    text = path.read_text()
    expected = [
        (("lrr",), "lrr: unknown key; did you mean training.lr?"),  # a close name in another section
        (("task", "max_lenn"), "task.max_lenn: unknown key; did you mean task.max_len?"),
        (("model", "postions"), "model.postions: unknown key; did you mean model.positions?"),
        (("model", "lr"), "model.lr: unknown key; did you mean training.lr?"),
        (("training", "max_step"), "training.max_step: unknown key; did you mean training.max_steps?"),
    ]
    with pytest.raises(SpecError) as info:
        load_run(path)
    assert [e.key for e in info.value.every()] == [".".join(k) for k, _ in expected]
    assert main(["run", str(path)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == len(expected), lines
    for line, (key, words) in zip(lines, expected):
        assert line.startswith(f"error: {path}:{line_of(text, key)}: {words}"), line

    # fixed, the values are judged: the model's and the training's (which does not depend on the task) together
    path.write_text(yaml.safe_dump({**GOOD, "model": {"n_heads": -1}, "training": {"lr": -1}}))
    with pytest.raises(SpecError) as info:
        load_run(path)
    assert [(e.key, e.message.split(" ")[0]) for e in info.value.every()] == [
        ("model.n_heads", "n_heads=-1"),
        ("training.lr", "lr=-1"),
    ]
    # overrides are blamed on --set, each of them; set aside, they no longer hide the file's own mistakes
    with pytest.raises(SpecError) as info:
        load_run(path, ["model.n_head=2", "training.l=3"])
    assert [(e.source, e.key) for e in info.value.every()] == [
        (str(path), "model.n_heads"),
        (str(path), "training.lr"),
        ("--set", "model.n_head=2"),
        ("--set", "training.l=3"),
    ]
    assert "did you mean model.n_heads?" in info.value.also[1].message
    assert "did you mean training.lr?" in info.value.also[2].message


def test_catalogue_run_files_are_valid():
    files = sorted((ROOT / "ablations" / "runs").glob("*.yaml"))
    assert files
    for path in files:
        load_run(path)


def test_yaml_reads_exponents_without_a_dot_as_floats():
    from record.spec import load_yaml

    assert load_yaml("a: 3e-4\nb: 1.5\nc: 10\nd: 1_000\ne: '3e-4'") == {
        "a": 3e-4,
        "b": 1.5,
        "c": 10,
        "d": 1000,
        "e": "3e-4",
    }


def test_spec_error_without_a_file():
    err = SpecError(None, "model.window", "window=4 requires pattern 'local'")
    assert str(err) == "model.window: window=4 requires pattern 'local'"
    assert Path(__file__).exists()


def test_a_task_given_whole_by_set_is_another_task(tmp_path):
    """`--set task={name: copy}` on a file of the reverse task: the copy task, without reverse's keys; the model
    and training sections given whole are refused instead (test_malformed_run_files_are_refused_with_one_clear_line)."""
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({**GOOD, "task": {"name": "reverse", "max_len": 5, "train_size": 64}}))
    run = load_run(path, ["task={name: copy}"])
    assert run.task_spec["name"] == "copy" and run.task_spec["train_size"] != 64


def test_options_are_judged_together_and_only_the_one_at_fault_is_named(tmp_path):
    """`--set model.pattern=local model.window=2 model.dilation=2`: a dilation needs pattern dilated, and that is the
    one mistake. Each option was also tried alone, which named three false ones beside it (a window with the file's
    full pattern, local without its window, the dilation against full)."""
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(GOOD))
    with pytest.raises(SpecError) as info:
        load_run(path, ["model.pattern=local", "model.window=2", "model.dilation=2"])
    assert [(e.source, e.key) for e in info.value.every()] == [("--set", "model.dilation=2")]
    assert "got pattern='local'" in info.value.message
    assert load_run(path, ["model.pattern=local", "model.window=2"]).model.window == 2
