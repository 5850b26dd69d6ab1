"""Search files: malformed ones are refused before anything starts, with the file, the line and the key;
conditional parameters are asked only when their condition holds."""

from __future__ import annotations

import optuna
import pytest
import yaml

from record.spec import SpecError, load_search
from tests.ablations.search.test_search import SPACE, TINY, write_spec
from tests.conftest import ROOT


def refused(tmp_path, **spec) -> SpecError:
    path = write_spec(tmp_path, **spec)
    with pytest.raises(SpecError) as info:
        load_search(path)
    assert str(path) in str(info.value)
    return info.value


@pytest.mark.parametrize(
    ("spec", "key", "words"),
    [
        ({"space": {}}, "space", "empty"),
        ({"space": {"training.lrr": {"type": "float", "low": 0.1, "high": 1}}}, "space.training.lrr", "unknown axis"),
        ({"space": {"training.lr": {"type": "real", "low": 0.1, "high": 1}}}, "space.training.lr.type", "float, int"),
        ({"space": {"training.lr": {"type": ["a"], "low": 0.1, "high": 1}}}, "space.training.lr.type", "float, int"),
        ({"space": {"training.lr": {"type": "float", "low": 1, "high": 0.1}}}, "space.training.lr", "below"),
        (
            {"space": {"training.lr": {"type": "float", "low": 0, "high": 1, "log": True}}},
            "space.training.lr.low",
            "log",
        ),
        ({"space": {"model.norm": {"type": "categorical", "choices": []}}}, "space.model.norm.choices", "non-empty"),
        (
            {"space": {**SPACE, "model.window": {"type": "int", "low": 2, "high": 8, "when": {"training.lr": 1}}}},
            "space.model.window.when.training.lr",
            "categorical",
        ),
        ({"sampler": "bayes"}, "sampler", "tpe"),
        (
            {
                "pruner": "median",
                "objectives": [{"metric": "final/val_loss"}, {"metric": "cost/tokens_per_s", "direction": "maximize"}],
            },
            "pruner",
            "single",
        ),
        ({"n_trials": None}, "n_trials", "an end"),
        ({"resources": {"cpus": 1, "workers": 2}}, "resources.cpus", "one per worker"),
        ({"prune_on": "train/loss"}, "prune_on", "validation"),
        (
            {"space": {"model.pattern": {"type": "categorical", "choices": ["full", "local"]}}},
            "space.model.pattern",  # the parameter whose value the model refuses (it was "space (model)")
            "window",
        ),
        ({"colour": 1}, "colour", "unknown key"),
        # a direction that ranks its metric backwards (perplexity is exp(loss)), and a pruner that would stop the
        # best trials: val/token_acc rises as the objective's loss falls (Optuna prunes in the objective's direction)
        ({"objectives": [{"metric": "test/ppl", "direction": "maximize"}]}, "objectives[0].direction", "backwards"),
        ({"metric": "final/val_token_acc", "direction": "minimize"}, "direction", "write maximize"),
        ({"pruner": "median", "prune_on": "val/token_acc"}, "prune_on", "would stop the best trials"),
    ],
)
def test_malformed_search_specs_are_refused_before_anything_starts(tmp_path, spec, key, words):
    err = refused(tmp_path, **spec)
    assert err.key == key and words in str(err), str(err)


def test_every_mistake_of_a_search_files_structure_is_named_at_once_in_the_files_order(tmp_path):
    space = {
        "model.nrom": {"type": "categorical", "choices": ["pre", "post"]},
        "training.l": {"type": "float", "low": 0.1, "high": 1},
        **SPACE,
    }
    err = refused(tmp_path, space=space)
    assert [(e.key, e.message.split("; ")[1]) for e in err.every()] == [
        ("space.model.nrom", "did you mean model.norm?"),
        ("space.training.l", "did you mean training.lr?"),
    ]
    # the file's keys and values, the space's keys and every parameter's mistakes, together (safe_dump sorts keys)
    space = {
        "model.n_head": {"type": "int", "low": 1, "high": 4},
        "model.norm": {"type": "categorical", "choices": []},
        "training.lr": {"type": "float", "low": 1, "high": 0.1},
        "training.warmup_steps": {"type": "intt", "low": 0, "high": 10},
    }
    err = refused(tmp_path, space=space, sampler="tpee", n_trails=3)
    assert [e.key for e in err.every()] == [
        "n_trails",
        "sampler",
        "space.model.n_head",
        "space.model.norm.choices",
        "space.training.lr",
        "space.training.warmup_steps.type",
    ]
    assert [e.line for e in err.every()] == sorted(e.line for e in err.every())
    hints = [e.message for e in err.every()]
    assert "did you mean n_trials?" in hints[0] and "did you mean 'tpe'?" in hints[1]
    assert "did you mean model.n_heads?" in hints[2]
    # a file without its base and with a misspelt name: both, not one per try
    err = refused(tmp_path, base=None, name=None, nmae="x")
    assert {(e.key, e.message) for e in err.every()} == {
        ("nmae", "unknown key; did you mean name?"),
        ("name", "is required"),
        ("base", "is required"),
    }


def test_an_objective_without_a_direction_takes_its_metric_s(tmp_path):
    """Each metric the runs log knows whether it gets better up or down (record.spec.metrics.better): an
    objective need not say it, and the Optuna study is made in that direction."""
    both = [{"metric": "final/val_token_acc"}, {"metric": "cost/n_params"}]
    spec = load_search(write_spec(tmp_path, objectives=both, pruner="none", sampler="nsga2"))
    assert spec.objectives == [("final/val_token_acc", "maximize"), ("cost/n_params", "minimize")]
    assert load_search(write_spec(tmp_path)).objectives == [("final/val_loss", "minimize")]
    # the pruner compares prune_on in the objective's direction: by default it is the objective's own validation
    # metric (val/loss, pruned as if it should rise, stopped the trials with the lowest loss of a search that
    # maximised exact match)
    spec = load_search(write_spec(tmp_path, metric="test/exact_match", pruner="median"))
    assert (spec.directions, spec.prune_on) == (["maximize"], "val/exact_match")
    assert load_search(write_spec(tmp_path, pruner="median")).prune_on == "val/loss"
    err = refused(tmp_path, metric="cost/tokens_per_s", pruner="median")
    assert err.key == "prune_on" and "give prune_on (one that moves with it: val/exact_match, val/token_acc)" in str(
        err
    )


def test_every_catalogue_search_loads():
    paths = sorted((ROOT / "ablations" / "searches").glob("*.yaml"))
    assert {p.stem for p in paths} >= {"quickstart_lr", "locality_window"}
    for path in paths:
        assert load_search(path).name == path.stem


def test_conditional_parameters_are_asked_only_when_their_condition_holds(tmp_path):
    spec = load_search(
        write_spec(
            tmp_path,
            space={
                "model.pattern": {"type": "categorical", "choices": ["full", "local", "dilated"]},
                "model.window": {"type": "int", "low": 2, "high": 8, "when": {"model.pattern": ["local", "dilated"]}},
                "model.dilation": {"type": "int", "low": 2, "high": 3, "when": {"model.pattern": "dilated"}},
            },
        )
    )
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen = set()
    for _ in range(30):
        trial = study.ask()
        params = spec.suggest(trial)
        seen.add(params["model.pattern"])
        assert ("model.window" in params) == (params["model.pattern"] != "full")
        assert ("model.dilation" in params) == (params["model.pattern"] == "dilated")
        study.tell(trial, 0.0)
    assert seen == {"full", "local", "dilated"}


def test_tune_section_is_checked_with_the_study(tmp_path):
    from record.spec import load_study

    path = tmp_path / "t.yaml"
    base = {"name": "t", "base": TINY, "design": {"grid": {"model.norm": ["pre", "post"]}}}
    path.write_text(
        yaml.safe_dump(
            {**base, "tune": {"space": {"model.norm": {"type": "categorical", "choices": ["pre"]}}, "n_trials": 2}}
        )
    )
    with pytest.raises(SpecError, match="tune.space.model.norm.*also an axis"):
        load_study(path)
    path.write_text(yaml.safe_dump({**base, "tune": {"space": SPACE}}))
    with pytest.raises(SpecError, match="tune.n_trials.*an end"):
        load_study(path)
    two = [{"metric": "final/val_loss"}, {"metric": "cost/tokens_per_s"}]  # a Pareto front: which point to run?
    path.write_text(yaml.safe_dump({**base, "tune": {"space": SPACE, "n_trials": 4, "objectives": two}}))
    with pytest.raises(SpecError, match="tune.objectives: a tuned study runs each variant at one best value"):
        load_study(path)


def test_values_of_a_range_that_make_no_valid_run_are_said_before_the_search_starts(tmp_path):
    # n_heads from 1 to 8 with d_model 64: the trials that draw 3, 5, 6 or 7 would be refused one by one
    base = {**TINY, "model": {**TINY["model"], "d_model": 64}}
    space = {"model.n_heads": {"type": "int", "low": 1, "high": 8}}
    (warning,) = load_search(write_spec(tmp_path, base=base, space=space)).warnings
    refused = [h for h in range(1, 9) if 64 % h]  # the oracle: the model's own rule, d_model divisible by n_heads
    assert warning.startswith(f"space.model.n_heads: {', '.join(map(str, refused))} make no valid run (")
    assert f"choices {[h for h in range(1, 9) if h not in refused]} leaves them out" in warning
    # a value valid with another parameter's other end is not refused: 6 divides 96
    space["model.d_model"] = {"type": "categorical", "choices": [64, 96]}
    (warning,) = load_search(write_spec(tmp_path, base=base, space=space)).warnings
    assert warning.startswith(f"space.model.n_heads: {', '.join(str(h) for h in range(1, 9) if 64 % h and 96 % h)} ")
    space = {"model.n_heads": {"type": "categorical", "choices": [1, 2, 4, 8]}}
    assert load_search(write_spec(tmp_path, base=base, space=space)).warnings == []
    # d_model tried only at its ends (32, 256): 3 heads may fit between (48, 96), so nothing is said
    space = {
        "model.n_heads": {"type": "categorical", "choices": [2, 3, 4]},
        "model.d_model": {"type": "int", "low": 32, "high": 256},
    }
    assert load_search(write_spec(tmp_path, base=base, space=space)).warnings == []
    # 3 heads fit only the middle choice of d_model (96): every combination is tried, not only the ends
    space = {
        "model.n_heads": {"type": "categorical", "choices": [1, 2, 3, 4]},
        "model.d_model": {"type": "categorical", "choices": [32, 96, 64]},
    }
    assert load_search(write_spec(tmp_path, base=base, space=space)).warnings == []


def test_a_search_names_every_when_its_base_and_the_parameter_an_end_refuses(tmp_path):
    space = {
        "model.pattern": {"type": "categorical", "choices": ["full", "local"]},
        "model.window": {"type": "int", "low": 8, "high": 2, "when": {"model.patern": "local"}},  # two mistakes
        "model.dilation": {"type": "int", "low": 2, "high": 3, "when": {"model.pattern": "dilated"}},
        "model.positions": {"type": "cat", "choices": ["learned"]},  # its type is wrong, not its choices
    }
    err = refused(tmp_path, space=space)
    assert [(e.key, e.message.split(";")[0]) for e in err.every()] == [
        ("space.model.dilation.when.model.pattern", "'dilated' is not one of its choices ['full', 'local']"),
        ("space.model.positions.type", "'cat' is not a valid choice"),
        ("space.model.window", "low=8 must be below high=2"),
        ("space.model.window.when.model.patern", "must name a categorical parameter of the space"),
    ]
    # the base's misspelt keys, on their own lines; without a base, the parameters are still judged
    base = {**TINY, "model": {**TINY["model"], "n_layrs": 2}}
    err = refused(tmp_path, base=base, sampler="tpee", training={"lr": 0.1})
    assert [e.key for e in err.every()] == ["base.model.n_layrs", "sampler", "training"]
    assert "a section of the base run: put it under base:" in err.every()[2].message  # not "training.lr?"
    err = refused(tmp_path, base=None, space={"training.lr": {"type": "float", "low": 2, "high": 1}})
    assert [e.key for e in err.every()] == ["space.training.lr", "base"]
    # an end that makes no valid run is blamed on the parameter that has it
    err = refused(tmp_path, space={"model.n_heads": {"type": "int", "low": 1, "high": 1000}})
    assert err.key == "space.model.n_heads" and "n_heads=1000" in err.message and "high end" in err.message


def test_an_int_parameter_steps_by_whole_numbers(tmp_path):
    err = refused(tmp_path, space={"training.warmup_steps": {"type": "int", "low": 0, "high": 10, "step": 0.5}})
    assert (err.key, err.message) == (
        "space.training.warmup_steps.step",
        "0.5 must be a whole number for an int parameter",
    )


def test_n_trials_from_the_command_line_fits_the_startup_trials_again(tmp_path):
    """README: a model-based sampler's random startup trials are a quarter of n_trials, at least 2, unless the file
    gives them. `--n-trials 20` on a file of 12 kept the file's 3 (and `--n-trials 2` was called random search)."""
    from record.spec import load_search

    spec = load_search(ROOT / "ablations" / "searches" / "quickstart_lr.yaml")
    assert (spec.sampler, spec.n_trials, spec.startup_trials) == ("tpe", 12, 3)
    for n, startup in ((20, 5), (2, 2), (100, 10)):
        spec.set_trials(n)
        assert (spec.n_trials, spec.startup_trials) == (n, startup)
    given = yaml.safe_load((ROOT / "ablations" / "searches" / "quickstart_lr.yaml").read_text())
    path = tmp_path / "given.yaml"
    path.write_text(
        yaml.safe_dump({**given, "base": str(ROOT / "ablations" / "runs" / "quickstart.yaml"), "startup_trials": 4})
    )
    spec = load_search(path)
    spec.set_trials(40)
    assert spec.startup_trials == 4  # the file's, kept
