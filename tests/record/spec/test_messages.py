"""Refusals read as a user reads them: what each says is true of the file. The line it names holds the key it
names; a "did you mean X?", followed, gives a file that loads; what it says the runs log, they log; the key it
blames is the one the file (or the variant) set. Each of these was doubtful or false before (issue 53)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from models.tasks import make_task
from record.spec import SpecError, load_run, load_search, load_study
from record.spec.metrics import better, intermediate_metrics, logged_metrics

BASE = {
    "task": {"name": "reverse", "train_size": 200, "max_len": 6},
    "model": {"d_model": 64, "n_heads": 4, "n_layers": 1, "d_ff": 32},
    "training": {"max_steps": 10, "val_every": 10, "batch_size": 16},
}


def write(tmp_path: Path, data: dict, name: str = "file.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def refusal(loader, path: Path, *args) -> list[SpecError]:
    with pytest.raises(SpecError) as info:
        loader(path, *args)
    return info.value.every()


def line_holds(path: Path, line: int, text: str) -> bool:
    return text in path.read_text().splitlines()[line - 1]


def study(**over) -> dict:
    return {"name": "t", "base": BASE, "design": {"grid": {"model.norm": ["pre", "post"]}}, **over}


# --- a value a study compares: one per run --------------------------------------------------------------------


@pytest.mark.parametrize(("metric", "extreme"), [("val/loss", "lowest"), ("val/token_acc", "highest")])
def test_a_validation_metric_in_a_study_is_offered_as_its_last_and_best_value(tmp_path, metric, extreme):
    """It said "not a metric these runs log": false, the runs log it at every validation."""
    path = write(tmp_path, study(metric=metric))
    (err,) = refusal(load_study, path)
    name = metric.removeprefix("val/")
    assert err.message == (
        f"{metric!r} is logged at every validation, and a study compares one value per run: write final/val_{name} "
        f"(the last) or best/val_{name} (the {extreme})"
    )
    assert line_holds(path, err.line, "metric:")
    run = load_run(write(tmp_path, BASE, "run.yaml"))
    assert metric in intermediate_metrics(run)  # logged at every validation: true
    assert {f"final/val_{name}", f"best/val_{name}"} <= logged_metrics(run)  # the two offered are logged
    assert better(f"best/val_{name}") == ("minimize" if extreme == "lowest" else "maximize")
    for offered in (f"final/val_{name}", f"best/val_{name}"):  # followed, the study loads
        assert load_study(write(tmp_path, study(metric=offered))).metric == offered


def test_a_validation_metric_as_a_search_objective_is_offered_as_its_summaries(tmp_path):
    space = {"training.lr": {"type": "float", "low": 1e-3, "high": 1e-2}}
    path = write(tmp_path, {"name": "s", "base": BASE, "space": space, "n_trials": 2, "metric": "val/loss"})
    (err,) = refusal(load_search, path)
    assert err.message.startswith("'val/loss' is logged at every validation, and a search's objective is one value")
    assert "final/val_loss (the last) or best/val_loss (the lowest)" in err.message


# --- choices: "did you mean", followed, loads -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("section", "key", "wrong", "meant"),
    [
        ("model", "positions", "rotray", "rotary"),
        ("model", "norm", "Pre", "pre"),
        ("model", "score", "cosin", "cosine"),
        ("model", "ffn", "swigl", "swiglu"),
        ("training", "schedule", "warmup_cosin", "warmup_cosine"),
        ("task", "name", "revrse", "reverse"),
    ],
)
def test_a_misspelt_choice_says_what_it_meant_and_that_loads(tmp_path, section, key, wrong, meant):
    data = {**BASE, section: {**BASE[section], key: wrong}}
    path = write(tmp_path, data)
    (err,) = refusal(load_run, path)
    assert f"{key}={wrong!r} is not a valid" in err.message and f"; did you mean {meant!r}? valid: " in err.message
    assert err.key == f"{section}.{key}" and line_holds(path, err.line, f"{key}: {wrong}")
    load_run(write(tmp_path, {**BASE, section: {**BASE[section], key: meant}}))


def test_a_misspelt_choice_of_a_search_file_says_what_it_meant(tmp_path):
    space = {"training.lr": {"type": "float", "low": 1e-3, "high": 1e-2}}
    path = write(tmp_path, {"name": "s", "base": BASE, "space": space, "n_trials": 2, "sampler": "tpee"})
    (err,) = refusal(load_search, path)
    assert err.message == "'tpee' is not a valid choice; did you mean 'tpe'? valid: tpe, random, cmaes, gp, nsga2"


def test_a_task_without_a_name_is_told_it_needs_one_not_that_none_is_wrong(tmp_path):
    """It said "name=None is not a valid task": the file gives no name, None or other."""
    (err,) = refusal(load_run, write(tmp_path, {"task": {"train_size": 10}}))
    assert err.key == "task.name" and err.message.startswith("is required: a task needs a name")
    assert "None" not in err.message
    (err,) = refusal(load_run, write(tmp_path, {"task": {"nme": "copy"}}))
    assert (err.key, err.message) == ("task.nme", "unknown key; did you mean task.name?")


# --- the key that is blamed is the key that was set --------------------------------------------------------------


def test_a_variant_refused_for_a_key_it_did_not_set_is_blamed_on_the_key_it_set(tmp_path):
    """n_heads: 3 with the base's d_model: 64 named model.d_model, which the study does not vary."""
    path = write(tmp_path, study(design={"grid": {"model.n_heads": [2, 3]}}))
    errors = refusal(load_study, path)
    assert [(e.key, e.message.split(";")[0]) for e in errors] == [
        ("variant 'n_heads=3'", "model.n_heads: d_model=64 is not divisible by n_heads=3")
    ]
    assert line_holds(path, errors[0].line, "model.n_heads:")


def test_a_key_of_a_variant_item_is_told_the_keys_an_item_has(tmp_path):
    path = write(tmp_path, study(design={"variants": [{"name": "a", "set": {}, "TRAIN_SIZE": 3}]}))
    (err,) = refusal(load_study, path)
    assert (err.key, err.message) == ("design.variants[0].TRAIN_SIZE", "unknown key; valid: name, set")


def test_an_axis_with_a_dot_left_out_is_told_the_key_and_that_loads(tmp_path):
    path = write(tmp_path, study(design={"grid": {"modeln_heads": [2, 4]}}))
    (err,) = refusal(load_study, path)
    assert err.message == "unknown axis 'modeln_heads'; did you mean model.n_heads?"
    assert len(load_study(write(tmp_path, study(design={"grid": {"model.n_heads": [2, 4]}}))).cells) == 2


def test_every_bad_set_option_is_named_at_once_in_the_order_given(tmp_path):
    """Two bad options were reported one per try: the first unknown section stopped the others, and a model's
    first mistake hid its second."""
    path = write(tmp_path, BASE)
    sets = ["model.n_hedas=3", "trainin.lr=2", "oops", "model.n_heads=3", "model.norm=mid", "training.lr=-1"]
    errors = refusal(load_run, path, sets)
    assert [(e.source, e.key) for e in errors] == [("--set", s if s != "oops" else "'oops'") for s in sets]
    said = {e.key: e.message for e in errors}
    assert said["model.n_hedas=3"] == "unknown key; did you mean model.n_heads?"
    assert said["trainin.lr=2"] == "unknown key; did you mean training?"
    assert said["model.n_heads=3"].startswith("d_model=64 is not divisible by n_heads=3")
    assert said["model.norm=mid"] == "norm='mid' is not a valid choice; valid: 'pre', 'post'"
    assert load_run(path, ["model.n_heads=2", "training.lr=2"]).model.n_heads == 2  # fixed as said, it loads


# --- what a message says of the file ---------------------------------------------------------------------------


def test_a_duplicate_key_names_the_two_lines_that_hold_it(tmp_path):
    path = tmp_path / "file.yaml"
    path.write_text("task: {name: reverse}\nseed: 1\nmodel: {}\nseed: 2\n")
    (err,) = refusal(load_run, path)
    assert err.message == "seed appears twice (lines 2 and 4); keep one"
    assert line_holds(path, 2, "seed:") and line_holds(path, 4, "seed:")


def test_the_vocabulary_a_message_gives_is_the_tasks(tmp_path):
    (err,) = refusal(load_run, write(tmp_path, {**BASE, "model": {**BASE["model"], "vocab_size": 5}}))
    vocab = make_task(BASE["task"]).vocab_size
    assert err.message == f"5 is smaller than the vocabulary of task 'reverse' ({vocab}); remove it to use the task's"


def test_a_value_count_over_the_limit_mentions_aliases_only_when_there_are_some(tmp_path):
    flat = tmp_path / "flat.yaml"
    flat.write_text("task: {name: reverse}\nmodel: {norm: [" + ", ".join(["1"] * 20_001) + "]}\n")
    (err,) = refusal(load_run, flat)
    assert err.message == "expands to more than 20,000 values; a configuration file does not need that many"
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("a: &a [" + ", ".join(["x"] * 200) + "]\nb: [" + ", ".join(["*a"] * 200) + "]\n")
    (err,) = refusal(load_run, bomb)
    assert "(aliases repeat a large anchor)" in err.message


def test_a_value_is_named_as_the_file_writes_it(tmp_path):
    """`metric: null` was said as "None must be text", `seed: yes` as "True": Python's words, not the file's."""
    (err,) = refusal(load_study, write(tmp_path, study(metric=None)))
    assert (err.key, err.message) == ("metric", "null must be text")
    (err,) = refusal(load_run, write(tmp_path, {**BASE, "seed": True}))
    assert (err.key, err.message) == ("seed", "true must be an integer")
    space = {"training.warmup_steps": {"type": "int", "low": 0, "high": 9, "lw": 1}}
    (err,) = refusal(load_search, write(tmp_path, {"name": "s", "base": BASE, "space": space, "n_trials": 2}))
    assert err.message.startswith("unknown key for an int parameter; valid: high, log, low")
