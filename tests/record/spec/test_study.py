"""Study files: designs expand into the right cells, and malformed files are refused before anything starts."""

from __future__ import annotations

import math
import subprocess
import sys
from datetime import date
from pathlib import Path

import pytest
import yaml

from record.spec import SpecError, load_study
from tests.conftest import ROOT

BASE = {
    "task": {"name": "reverse", "train_size": 200, "max_len": 6},
    "model": {"d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32},
    "training": {"max_steps": 10, "val_every": 10, "batch_size": 16},
}


def write(tmp_path: Path, **study) -> Path:
    data = {"name": "t", "base": BASE, "design": {"grid": {"model.norm": ["pre", "post"]}}, **study}
    data = {k: v for k, v in data.items() if v is not None}  # None: without the key
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def refused(tmp_path: Path, **study) -> SpecError:
    path = write(tmp_path, **study)
    with pytest.raises(SpecError) as info:
        load_study(path)
    assert str(path) in str(info.value)  # every message names the file
    return info.value


# --- designs ---------------------------------------------------------------------------------------


def test_grid_is_the_full_factorial_times_seeds(tmp_path):
    study = load_study(
        write(
            tmp_path,
            design={"grid": {"model.norm": ["pre", "post"], "model.positions": ["sinusoidal", "learned", "rotary"]}},
            seeds=[0, 1],
        )
    )
    assert len(study.cells) == 2 * 3 * 2
    combos = {(c.run.model.norm, c.run.model.positions, c.seed) for c in study.cells}
    assert len(combos) == 12
    assert len({c.cell_id for c in study.cells}) == 12


def test_one_at_a_time_varies_each_axis_alone_from_the_baseline(tmp_path):
    study = load_study(
        write(
            tmp_path,
            design={
                "one_at_a_time": {
                    "baseline": {"model.norm": "pre", "model.positions": "sinusoidal"},
                    "axes": {"model.norm": ["post"], "model.positions": ["learned", "sinusoidal"]},
                }
            },
        )
    )
    got = sorted((c.run.model.norm, c.run.model.positions) for c in study.cells)
    # the baseline once (positions=sinusoidal repeats it and is folded into it), then one change at a time
    assert got == [("post", "sinusoidal"), ("pre", "learned"), ("pre", "sinusoidal")]
    assert "baseline" in study.variants


def test_variants_apply_their_overrides_and_the_budget(tmp_path):
    study = load_study(
        write(
            tmp_path,
            design={
                "variants": [
                    {"name": "small", "set": {"model.n_heads": 1}},
                    {"name": "wide", "set": {"model.n_heads": 4, "model.d_model": 32}},
                ]
            },
            budget={"steps": 7},
            seeds=3,
        )
    )
    assert study.variants == ["small", "wide"]
    wide = next(c for c in study.cells if c.variant == "wide")
    assert (wide.run.model.n_heads, wide.run.model.d_model, wide.run.training.max_steps) == (4, 32, 7)
    assert study.seeds == [0, 1, 2]


def test_trial_threads_follow_the_cpus_of_a_worker_not_the_run_file(tmp_path):
    base = {**BASE, "resources": {"threads": 8}}
    one = load_study(write(tmp_path, base=base))
    assert {c.run.resources.threads for c in one.cells} == {1}
    ddp = load_study(write(tmp_path, base=base, resources={"cpus": 4, "workers": 2}))
    assert {c.run.resources.threads for c in ddp.cells} == {2}
    four = load_study(write(tmp_path, base=base, resources={"cpus": 4}))
    assert {c.run.resources.threads for c in four.cells} == {4}
    assert [c.cell_id for c in one.cells] == [c.cell_id for c in four.cells]  # threads: not in the cell id
    # (the workers are: each rank loads a batch, test_data_parallel_workers_are_part_of_a_cell_s_identity)


def test_adding_a_seed_or_a_value_keeps_the_existing_cell_ids(tmp_path):
    before = {c.cell_id for c in load_study(write(tmp_path, seeds=[0])).cells}
    after = load_study(
        write(
            tmp_path,
            seeds=[0, 1],
            design={
                "grid": {
                    "model.norm": [
                        "pre",
                        "post",
                    ],
                    "model.n_heads": [2],
                }
            },
        )
    )
    assert before <= {c.cell_id for c in after.cells}
    assert len(after.cells) == 4


def test_constraints_skip_cells_with_their_reason(tmp_path):
    study = load_study(
        write(tmp_path, constraints=[{"skip": {"model.norm": "post"}, "reason": "known to diverge"}], seeds=2)
    )
    assert {c.run.model.norm for c in study.cells} == {"pre"}
    assert [(s.variant, s.reason) for s in study.skipped] == [("norm=post", "known to diverge")] * 2


def test_invalid_model_cells_are_skipped_only_when_asked(tmp_path):
    design = {"grid": {"model.n_heads": [2, 3]}}  # 16 is not divisible by 3
    err = refused(tmp_path, design=design)
    assert "n_heads=3" in str(err) and "skip_invalid" in str(err)
    study = load_study(write(tmp_path, design=design, skip_invalid=True))
    assert [c.run.model.n_heads for c in study.cells] == [2]
    assert "n_heads" in study.skipped[0].reason


def test_every_refused_variant_is_named_at_once_and_a_mistake_of_the_base_once_as_the_base_s(tmp_path):
    base = {**BASE, "training": {**BASE["training"], "lr": -1.0}}
    design = {"grid": {"model.norm": ["pre", "post"], "model.n_heads": [2, 3, 5]}}  # d_model 16: 3 and 5 refused
    err = refused(tmp_path, base=base, design=design)
    lines = (tmp_path / "study.yaml").read_text().splitlines()
    lr_line = next(i + 1 for i, text in enumerate(lines) if text.strip().startswith("lr:"))
    # lr=-1 is every variant's mistake: once, on its line, as ``ablate run`` says it, with no variant to skip
    assert (err.key, err.line, err.message) == ("base.training.lr", lr_line, "lr=-1.0 must be > 0")
    variants = [e for e in err.every() if e is not err]
    refused_variants = {f"variant 'n_heads={h} norm={n}'" for h in (3, 5) for n in ("pre", "post")}  # safe_dump sorts
    assert sorted(e.key for e in variants) == sorted(refused_variants)
    assert all("model.n_heads: d_model=16 is not divisible by n_heads=" in e.message for e in variants)
    n_heads_line = next(i + 1 for i, text in enumerate(lines) if text.strip().startswith("model.n_heads:"))
    assert {e.line for e in variants} == {n_heads_line}  # the design's axis, not the base
    # the way out (fix, constraint, skip_invalid) once, after the last
    assert [e.message.endswith("set skip_invalid: true)") for e in err.every()] == [False] * 4 + [True]
    # a separate base file: its own line, and the study it serves
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(base))
    err = refused(tmp_path, base="base.yaml")
    assert (err.source, err.key, err.every()) == (str(tmp_path / "base.yaml"), "training.lr", [err])
    assert err.message == f"lr=-1.0 must be > 0 (base of {tmp_path / 'study.yaml'})"


# --- malformed files: clear messages naming the file and the key --------------------------------------


def test_unknown_axis_is_refused_with_suggestions(tmp_path):
    err = refused(tmp_path, design={"grid": {"model.norms": ["pre"]}})
    assert err.key.startswith("design.grid") and "model.norms" in str(err) and "model.norm" in err.message


def test_every_unknown_axis_and_key_of_a_study_is_named_at_once(tmp_path):
    variants = [
        {"name": "a", "set": {"model.postions": "learned", "training.l": 3}},
        {"name": "b", "set": {"model.norm": "post"}},
    ]
    err = refused(
        tmp_path,
        design={"variants": variants},
        constraints=[{"skip": {"model.nrom": "post"}, "reason": "r"}],
    )
    assert [e.key for e in err.every()] == [  # in the file's order (constraints come first in it)
        "constraints[0].skip.model.nrom",
        "design.variants[0].set.model.postions",
        "design.variants[0].set.training.l",
    ]
    assert [e.line for e in err.every()] == sorted(e.line for e in err.every())
    hints = [e.message for e in err.every()]
    assert "did you mean model.norm?" in hints[0]
    assert "did you mean model.positions?" in hints[1] and "did you mean training.lr?" in hints[2]
    err = refused(tmp_path, metrc="final/val_loss", design={"budget": 3, "grid": {"model.norm": ["pre"]}})
    assert [(e.key, e.message) for e in err.every()] == [
        ("design.budget", "unknown key; did you mean budget? (budget belongs at the top level of the file)"),
        ("metrc", "unknown key; did you mean metric?"),
    ]


def test_the_files_keys_values_axes_and_analysis_are_judged_in_one_pass(tmp_path):
    # a value (direction), an unknown key (metirc), unknown axes of the design and of a constraint, and the
    # analysis section's mistakes: one try names them all, in the file's order
    err = refused(
        tmp_path,
        direction="maximise",
        metirc="final/val_loss",
        design={"grid": {"model.nrom": ["pre"], "model.lr": [0.1]}},
        constraints=[{"skip": {"model.postions": "learned"}, "reason": "r"}],
        analysis={"failure_rule": "drop", "contrast": "baseline", "warn": {"chance_fractoin": 0.9}},
    )
    assert [e.key for e in err.every()] == [  # safe_dump sorts the keys: analysis, base, constraints, design, ...
        "analysis.contrast",
        "analysis.failure_rule",
        "analysis.warn.chance_fractoin",
        "constraints[0].skip.model.postions",
        "design.grid.model.lr",
        "design.grid.model.nrom",
        "direction",
        "metirc",
    ]
    assert [e.line for e in err.every()] == sorted(e.line for e in err.every())
    hints = " | ".join(e.message for e in err.every())
    for hint in ("'contrasts'", "use one of: worst, exclude, value", "'chance_fraction'", "model.positions",
                 "training.lr", "model.norm", "'maximize'", "metric?"):  # fmt: skip
        assert hint in hints
    # a misspelt required key: the typo, not only "design: is required"
    err = refused(tmp_path, design=None, desing={"grid": {"model.norm": ["pre"]}}, seed=2)
    assert {(e.key, e.message) for e in err.every()} == {
        ("desing", "unknown key; did you mean design?"),
        ("design", "is required"),
        ("seed", "unknown key; did you mean seeds?"),
    }


def test_the_designs_axes_and_the_bases_keys_are_judged_beside_every_other_mistake(tmp_path):
    variants = [{"name": "a", "set": {"model.n_head": 2}}, {"name": "a", "set": {"training.lrr": 0.1}}]
    err = refused(tmp_path, design={"variants": variants}, constraints=[{"refuse": {"training.warmup_step": 0}}])
    assert [e.key for e in err.every()] == [  # a wrong value of the design does not hide its unknown axes
        "constraints[0].reason",
        "constraints[0].refuse.training.warmup_step",
        "design.variants[0].set.model.n_head",
        "design.variants[1].name",
        "design.variants[1].set.training.lrr",
    ]
    # the inline base's misspelt keys, in the same pass as the study's own
    base = {**BASE, "task": {**BASE["task"], "symbol": 10}, "trainig": {}}
    err = refused(tmp_path, base=base, metrc="final/val_loss", design={"grid": {"model.nrom": ["pre"]}})
    assert [(e.key, e.message.split("; ")[-1]) for e in err.every()] == [
        ("base.task.symbol", "did you mean task.symbols?"),
        ("base.trainig", "did you mean training?"),
        ("design.grid.model.nrom", "did you mean model.norm?"),
        ("metrc", "did you mean metric?"),
    ]
    # a base file that is not there: beside the rest, not instead of it; a base that names no file
    err = refused(tmp_path, base="../nope.yaml", seeds=0, metrc="x")
    assert [e.key for e in err.every()] == ["base", "metrc", "seeds"] and "not found" in err.message
    err = refused(tmp_path, base="")
    assert err.message == "'' is not a run file: name one (base: ../runs/quickstart.yaml)"
    # an analysis that is not a mapping is said once; a run's section at the top is the base's
    err = refused(tmp_path, analysis="baseline", model={"norm": "post"})
    assert [(e.key, e.message) for e in err.every()] == [
        ("analysis", "must be a mapping of keys to values (got str)"),
        ("model", "unknown key; a section of the base run: put it under base:, or vary its keys (model.arch) in "
         "the design or space"),
    ]  # fmt: skip


def test_a_variant_is_blamed_on_the_setting_the_message_names_and_refusals_come_with_the_models(tmp_path):
    design = {"grid": {"model.norm": ["pre", "post"], "model.pattern": ["full", "local"]}}
    err = refused(tmp_path, design=design, constraints=[{"refuse": {"model.norm": "post"}, "reason": "no post"}])
    lines = (tmp_path / "study.yaml").read_text().splitlines()
    pattern_line = next(i + 1 for i, text in enumerate(lines) if text.strip().startswith("model.pattern:"))
    assert sorted((e.key, e.line == pattern_line) for e in err.every()) == [
        ("constraints[0]", False),
        ("constraints[0]", False),
        ("variant 'norm=pre pattern=local'", True),  # "pattern 'local' ... needs window": the pattern axis
    ]
    assert {e.message for e in err.every() if e.key == "constraints[0]"} == {
        f"variant 'norm=post pattern={p}' is refused: no post" for p in ("full", "local")
    }


@pytest.mark.parametrize(
    "base,axis,values",
    [  # the refusal is at the base's key, and reads the variant's: the design's line is blamed
        (
            {"training": {**BASE["training"], "sampling": "scheduled"}},
            "model.decoding",
            ["autoregressive", "uniform_copy"],
        ),
        ({"model": {**BASE["model"], "positions": "rotary"}}, "model.n_heads", [2, 16]),  # head_dim 1 is odd
    ],
)
def test_a_variant_is_blamed_on_its_setting_of_any_key_the_refusal_reads(tmp_path, base, axis, values):
    err = refused(tmp_path, base={**BASE, **base}, design={"grid": {axis: values}})
    lines = (tmp_path / "study.yaml").read_text().splitlines()
    axis_line = next(i + 1 for i, text in enumerate(lines) if text.strip().startswith(f"{axis}:"))
    assert [(e.key, e.line) for e in err.every()] == [(f"variant '{axis.split('.')[1]}={values[1]}'", axis_line)]


def test_a_tune_section_and_the_analysis_names_are_judged_all_at_once(tmp_path):
    tune = {
        "name": "x",
        "n_trials": 0,
        "space": {
            "model.norm": {"type": "categorical", "choices": ["pre", "post"]},
            "training.lrr": {"type": "float", "low": 0.001, "high": 0.01},
        },
    }
    err = refused(tmp_path, tune=tune, metrc="final/val_loss")
    assert [e.key for e in err.every()] == [  # with the file's own, in one pass (before: four)
        "metrc",
        "tune.n_trials",
        "tune.name",
        "tune.space.model.norm",
        "tune.space.training.lrr",
    ]
    analysis = {
        "contrasts": {"pairs": [["norm=post", "norm=pro"]]},
        "margins": {"final/val_los": 0.1},
        "detect": {"test/exact_mach": 0.1},
    }
    err = refused(tmp_path, analysis=analysis)
    assert [e.key for e in err.every()] == [
        "analysis.contrasts.pairs[0]",
        "analysis.detect.test/exact_mach",
        "analysis.margins.final/val_los",
    ]
    assert "'norm=pro' is not a variant (did you mean 'norm=pre'?)" in err.message


def test_a_tune_section_is_judged_only_with_a_base_without_mistakes(tmp_path):
    tune = {"space": {"training.lr": {"type": "float", "low": 1e-4, "high": 1e-2, "log": True}}, "n_trials": 4}
    err = refused(tmp_path, base={"model": BASE["model"]}, tune=tune, name="a b")  # no task; a bad name
    assert [e.key for e in err.every()] == ["base.task", "name"]  # not again as the tune's, nor the name twice
    # a key the one_at_a_time baseline fixes is not an axis: it may be tuned
    design = {"one_at_a_time": {"baseline": {"training.lr": 1e-3}, "axes": {"model.norm": ["post"]}}}
    assert load_study(write(tmp_path, design=design, tune=tune)).tune is not None


def test_bad_override_value_is_refused_naming_the_variant(tmp_path):
    err = refused(tmp_path, design={"grid": {"model.norm": ["pre", "sideways"]}})
    assert "sideways" in str(err) and "norm" in str(err)


@pytest.mark.parametrize("design", [{"grid": {}}, {"variants": []}, {"one_at_a_time": {"axes": {}}}, {}])
def test_empty_design_is_refused(tmp_path, design):
    err = refused(tmp_path, design=design)
    assert err.key.startswith("design")


def test_impossible_cells_refused_by_a_constraint(tmp_path):
    err = refused(tmp_path, constraints=[{"refuse": {"model.norm": "post"}, "reason": "post-LN is out of scope"}])
    assert "post-LN is out of scope" in str(err)


def test_every_cell_skipped_is_refused(tmp_path):
    err = refused(tmp_path, constraints=[{"skip": {"model.n_heads": 2}, "reason": "no"}])
    assert err.message == "leaves no cell to run: every cell is skipped (norm=pre: no; norm=post: no)"  # and why


def test_more_cells_than_the_limit_is_refused(tmp_path):
    err = refused(
        tmp_path,
        design={"grid": {"training.lr": [1e-3, 2e-3, 3e-3], "model.norm": ["pre", "post"]}},
        seeds=5,
        max_cells=20,
    )
    assert "30 cells" in str(err) and "max_cells=20" in str(err)


@pytest.mark.parametrize(
    ("study", "key"),
    [
        ({"resources": {"cpus": 0}}, "resources.cpus"),
        ({"resources": {"cpu": 1}}, "resources.cpu"),
        ({"resources": {"cpus": 1, "workers": 2}}, "resources.cpus"),
        ({"seeds": [0, 0]}, "seeds"),
        ({"direction": "up"}, "direction"),
        ({"budget": {"epochs": 3}}, "budget.epochs"),
        ({"retries": -1}, "retries"),
        ({"name": "has space"}, "name"),
        ({"colour": "red"}, "colour"),
        ({"base": "missing.yaml"}, "base"),
    ],
)
def test_bad_keys_are_named(tmp_path, study, key):
    assert refused(tmp_path, **study).key == key


def test_every_catalogue_study_loads():
    names = {p.stem for p in (ROOT / "ablations" / "studies").glob("*.yaml")}
    assert {"quickstart", "heads", "norm_placement", "positions", "attention_score", "locality"} <= names
    for name in names:
        study = load_study(ROOT / "ablations" / "studies" / f"{name}.yaml")
        assert study.name == name and study.cells


@pytest.mark.slow
def test_dry_run_lists_cells_without_starting_ray(tmp_path):
    path = write(tmp_path, seeds=2)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "ablate",
            "sweep",
            str(path),
            "--dry-run",
            "--tracking-uri",
            f"sqlite:///{tmp_path}/m.db",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    study = load_study(path)
    for cell in study.cells:
        assert cell.cell_id in out.stdout
    assert "4 cells" in out.stdout and "to train" in out.stdout
    assert "Ray:" not in out.stdout  # nothing was started
    assert not (tmp_path / "m.db").exists() and not (tmp_path / ".ablate").exists()  # nothing was written
    # 2 seeds: the exact test's smallest p is 2/2^2 = 0.5, so the plan says so before anything runs
    assert f"warning: {path}: with 2 seeds the exact test's smallest p is 0.5" in out.stdout
    assert "use at least 6 seeds (seeds: 6)" in out.stdout


def test_a_family_its_seeds_cannot_resolve_is_named_before_the_runs(tmp_path):
    """The exact sign-flip test's smallest p is 2/2^n (independent: enumerate the 2^n sign flips of n equal
    differences), for pairs and factorial effects alike (each effect is tested within each seed), against Holm's
    first step: a 3 x 2 grid, 2 pairs + 2 interaction terms = 4, so 0.05/4 = 0.0125 needs 8 seeds (0.0078), 7
    cannot (0.0156). (The interaction by OLS with one pooled variance could reach any p; attention_score's did,
    6e-18, beside exact tests that could not.)"""
    from itertools import product

    from ablations.sweep import unresolvable_warning

    def smallest_p(n: int) -> float:  # every sign flip of n equal positive differences: |sum| >= n only at 2 of them
        return sum(abs(sum(signs)) >= n for signs in product((1, -1), repeat=n)) / 2**n

    grid = {"model.norm": ["pre", "post"], "model.n_heads": [1, 2, 4]}
    pairs = [["n_heads=1 norm=post", "n_heads=1 norm=pre"], ["n_heads=4 norm=post", "n_heads=4 norm=pre"]]
    analysis = {"contrasts": {"pairs": pairs, "interactions": [["model.norm", "model.n_heads"]]}}
    for seeds in (7, 8):
        study = load_study(write(tmp_path, design={"grid": grid}, seeds=seeds, analysis=analysis))
        warning = unresolvable_warning(study)
        if smallest_p(seeds) > 0.05 / 4:
            assert warning is not None and "above Holm's first step 0.05/4" in warning
            assert "for the family of 4: none of its contrasts can come out different" in warning
            assert f"smallest p is {smallest_p(seeds):.3g}" in warning and "(seeds: 8)" in warning
            assert "declare fewer contrasts" in warning
        else:
            assert warning is None
    assert smallest_p(7) > 0.0125 >= smallest_p(8)  # so both branches ran
    t_test = {**analysis, "test": "t"}  # the t-test can reach any p
    assert unresolvable_warning(load_study(write(tmp_path, design={"grid": grid}, seeds=3, analysis=t_test))) is None
    # without declared contrasts, a grid of two axes tests its main effects and interactions: 1 + 2 + 2 = 5
    warning = unresolvable_warning(load_study(write(tmp_path, design={"grid": grid}, seeds=6)))
    assert "above Holm's first step 0.05/5" in warning and "(seeds: 8)" in warning  # 2/2^7 > 0.01


def test_cli_refuses_a_malformed_study_with_exit_2(tmp_path):
    path = write(tmp_path, design={"grid": {"model.norms": ["pre"]}})
    out = subprocess.run(
        [sys.executable, "-m", "ablate", "sweep", str(path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert out.returncode == 2
    assert str(path) in out.stderr and "design.grid" in out.stderr
    assert not (tmp_path / ".ablate").exists()  # nothing was started or recorded


@pytest.mark.parametrize("given", ["a", "", "2,x", "-1", "0", "1,,2", "1,1"])
def test_a_bad_seeds_option_is_refused_by_name_before_anything_starts(given, capsys):
    from ablate.main import build_parser

    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["sweep", "study.yaml", "--seeds", given])
    assert info.value.code == 2
    assert (
        f"argument --seeds: {given!r}: give a count of seeds (3) or a list of different seeds (0,1,2)"
        in capsys.readouterr().err
    )
    assert build_parser().parse_args(["sweep", "s.yaml", "--seeds", "3"]).seeds == [0, 1, 2]
    assert build_parser().parse_args(["sweep", "s.yaml", "--seeds", "0,4"]).seeds == [0, 4]


def test_output_piped_into_a_reader_that_left_ends_quietly(tmp_path):
    # `ablate report quickstart | head`: the reader closes the pipe before the command writes; no traceback
    proc = subprocess.Popen(
        [sys.executable, "-m", "ablate", "sweep", str(write(tmp_path)), "--dry-run"]
        + ["--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
    )  # fmt: skip
    proc.stdout.close()  # before the command has imported anything, let alone written
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 1, err
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


@pytest.mark.slow
@pytest.mark.parametrize(
    ("command", "resources", "words"),
    [("sweep", {"cpus": 2}, "needs 2 CPUs"), ("search", {"cpus": 1, "gpus": 1}, "needs 1 GPU")],
)
def test_a_trial_the_local_ray_could_never_hold_is_refused_before_anything_starts(tmp_path, command, resources, words):
    """It would otherwise wait forever for resources that never come."""
    if "gpus" in resources:
        import torch

        if torch.cuda.is_available():
            pytest.skip("this machine has a GPU: a trial asking for one fits")
    if command == "sweep":
        path = write(tmp_path, resources=resources)
    else:
        path = tmp_path / "search.yaml"
        spec = {"name": "s", "base": BASE, "space": {"training.lr": {"type": "float", "low": 1e-4, "high": 1e-2}}}
        path.write_text(yaml.safe_dump({**spec, "n_trials": 2, "resources": resources}))
    store = tmp_path / "m.db"
    cmd = [
        sys.executable,
        "-m",
        "ablate",
        command,
        str(path),
        "--cpus",
        "1",
        "--tracking-uri",
        f"sqlite:///{store}",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert out.returncode == 2 and words in out.stderr and "wait forever" in out.stderr, out.stdout + out.stderr
    assert "Ray:" not in out.stdout and not (tmp_path / ".ablate").exists()  # nothing was started
    if store.exists():  # nothing was recorded
        from mlflow import MlflowClient

        assert [e.name for e in MlflowClient(f"sqlite:///{store}").search_experiments()] == ["Default"]


# --- analysis and data per seed ------------------------------------------------------------------------


def test_the_analysis_section_is_checked_against_the_study_with_its_line(tmp_path):
    err = refused(tmp_path, analysis={"contrasts": {"pairs": [["norm=post", "norm=pr"]]}})
    assert err.key == "analysis.contrasts.pairs[0]" and "did you mean 'norm=pre'" in err.message
    assert err.line == line_of(write(tmp_path, analysis={"contrasts": {"pairs": [["norm=post", "norm=pr"]]}}))
    assert refused(tmp_path, analysis={"failure_rule": "worse"}).key == "analysis.failure_rule"
    study = load_study(write(tmp_path, analysis={"test": "t", "margins": {"final/val_loss": 0.01}}))
    from ablations.sweep.submission import design_record

    assert design_record(study)["analysis"] == {"test": "t", "margins": {"final/val_loss": 0.01}}


def test_an_expectation_or_convergence_criterion_that_names_nothing_real_is_refused_with_its_line(tmp_path):
    """analysis.expect and analysis.converged are checked like every other key, before any cell runs: a contrast
    that is not in the family, a metric the runs do not log, a malformed value; each error names the key and line."""
    expect = [{"contrast": ["norm=post", "norm=pr"], "value": -0.2}]
    path = write(tmp_path, analysis={"expect": expect})
    err = refused(tmp_path, analysis={"expect": expect})
    assert err.key == "analysis.expect[0].contrast" and "did you mean 'norm=post vs norm=pre'" in err.message
    lines = path.read_text().splitlines()
    assert err.line == 1 + next(i for i, x in enumerate(lines) if "contrast:" in x)
    err = refused(tmp_path, analysis={"expect": [{"contrast": ["norm=post", "norm=pre"], "value": 0}]})
    assert err.key == "analysis.expect[0].value" and "other than 0" in err.message
    bad_metric = [{"contrast": ["norm=post", "norm=pre"], "value": 0.1, "metric": "test/acuracy"}]
    err = refused(tmp_path, analysis={"expect": bad_metric})
    assert err.key == "analysis.expect[0].metric" and "not a metric" in err.message
    assert refused(tmp_path, analysis={"expect": [{"contrast": "x", "value": 1, "sorce": "p"}]}).key == (
        "analysis.expect[0].sorce"
    )
    assert refused(tmp_path, analysis={"converged": {"window": 2}}).key == "analysis.converged.window"
    err = refused(tmp_path, analysis={"converged": {"fraction": 0.1, "windw": 0.2}})
    assert err.key == "analysis.converged.windw" and "did you mean 'window'" in err.message
    # a one-axis grid's family: its pairs against the baseline; its main effect is not in it
    err = refused(tmp_path, analysis={"expect": [{"contrast": "model.norm: post vs pre", "value": 0.1}]})
    assert "is not a contrast of the family" in err.message and "norm=post vs norm=pre" in err.message
    ok = {"expect": [{"contrast": ["norm=post", "norm=pre"], "value": 0.1, "source": "Xiong et al. 2020"}]}
    assert load_study(write(tmp_path, analysis={**ok, "converged": {}})).analysis.converged.window == 0.2


def line_of(path: Path) -> int:
    """The line of the first contrast pair in the dumped study (read from the text)."""
    lines = path.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "pairs:")
    return start + 2


def test_seeds_can_vary_the_data(tmp_path):
    """vary_data: each seed also draws the task's data (task.data_seed = seed); by default only the training
    order and the initial weights change with the seed."""
    fixed = load_study(write(tmp_path, seeds=2))
    assert {c.run.task_spec["data_seed"] for c in fixed.cells} == {0}
    varied = load_study(write(tmp_path, seeds=2, vary_data=True))
    assert {(c.seed, c.run.task_spec["data_seed"]) for c in varied.cells} == {(0, 0), (1, 1)}
    data = [c.run.task.build("train")[:3]["tgt"] for c in varied.cells if c.variant == "norm=pre"]
    assert data[0] != data[1]  # the examples themselves differ


# --- metrics known before anything trains ---------------------------------------------------------------------


def test_a_metric_no_run_logs_is_refused_with_the_nearest_names(tmp_path):
    """A typo in the study's metric (final/val_los) was caught only by `ablate report`, after all the compute."""
    err = refused(tmp_path, metric="final/val_los")
    assert err.key == "metric" and "did you mean final/val_loss?" in err.message
    listed = refused(tmp_path, metric="test/accuracy").message  # not a classifier: every name it could be
    assert "the runs log:" in listed and "test/exact_match" in listed
    margin = refused(tmp_path, analysis={"margins": {"final/val_lss": 0.1}})
    assert margin.key == "analysis.margins.final/val_lss" and "did you mean 'final/val_loss'" in margin.message
    assert load_study(write(tmp_path, metric="test_long/exact_match")).metric == "test_long/exact_match"


def test_one_run_has_one_id_however_its_values_are_spelt(tmp_path):
    """grad_clip: 1 (its default 1.0 as a whole number), eval_batch_size equal to batch_size, head_dim equal to
    d_model / n_heads, d_ff equal to 4 * d_model: each is the same run as leaving it out, and had its own id
    (trained twice; two variants of one model compared as different). A value that changes the run still does."""

    def cell_id(model=None, training=None) -> str:
        base = {
            **BASE,
            "model": {**BASE["model"], **(model or {})},
            "training": {**BASE["training"], **(training or {})},
        }
        return load_study(write(tmp_path, base=base)).cells[0].cell_id

    plain = cell_id()
    assert cell_id(training={"grad_clip": 1, "diverge_factor": 4, "eval_batch_size": 16}) == plain
    assert cell_id(model={"head_dim": 8, "tie_embeddings": True}) == plain  # 16 / 2; what null means here
    assert cell_id(model={"d_ff": None}) == cell_id(model={"d_ff": 64})  # 4 x d_model
    assert len({plain, cell_id(training={"grad_clip": 2}), cell_id(training={"eval_batch_size": 8})}) == 3


def test_a_local_corpus_is_part_of_a_cell_s_identity_by_its_contents(tmp_path):
    """A cell's id named a corpus by its path: an edited corpus kept its cells (their old results were reused), the
    same file spelt another way got new ones. The contents decide; an id, once known, stays for the submission."""
    corpus = tmp_path / "data" / "corpus.txt"
    corpus.parent.mkdir()
    corpus.write_text("the cat sat on the mat. " * 400)
    text = {
        "task": {"name": "text", "source": str(corpus), "block_size": 16},
        "model": {"d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32},
        "training": {"max_steps": 10, "val_every": 10, "batch_size": 8},
    }
    ids = lambda study: [c.cell_id for c in study.cells]  # noqa: E731
    before = load_study(write(tmp_path, base=text))
    spelt = {**text, "task": {**text["task"], "source": str(tmp_path / "data" / "." / "corpus.txt")}}
    assert ids(load_study(write(tmp_path, base=spelt))) == ids(before)
    held = ids(before)
    corpus.write_text("a dog ran in the park! " * 400)  # edited: other data
    assert not set(ids(load_study(write(tmp_path, base=text)))) & set(held)
    corpus.unlink()
    assert ids(before) == held  # known ids do not move when the file changes or goes mid-sweep


def test_data_parallel_workers_are_part_of_a_cell_s_identity(tmp_path):
    """Each data-parallel rank loads a batch, so two workers train on twice the global batch: another result. A
    study moved from one worker to two reused the one-worker results (the cell id left the workers out)."""
    one = load_study(write(tmp_path))
    two = load_study(write(tmp_path, resources={"cpus": 2, "workers": 2}))
    assert [c.seed for c in one.cells] == [c.seed for c in two.cells]
    assert not {c.cell_id for c in one.cells} & {c.cell_id for c in two.cells}
    assert [c.cell_id for c in one.cells] == [c.run.config_hash() for c in one.cells]  # one worker: ids as before
    assert load_study(write(tmp_path, resources={"cpus": 2})).cells[0].cell_id == one.cells[0].cell_id


def test_the_direction_follows_the_metric_and_one_that_ranks_it_backwards_is_refused(tmp_path):
    """Without ``direction`` a study minimised whatever its metric: test/exact_match too, so its report called the
    variant with fewer exact matches better. Each metric the runs log now knows its direction."""
    from record.spec.metrics import better, logged_metrics

    assert load_study(write(tmp_path, metric="test/exact_match")).direction == "maximize"
    assert load_study(write(tmp_path, metric="test/ppl")).direction == "minimize"
    assert load_study(write(tmp_path)).direction == "minimize"  # final/val_loss
    err = refused(tmp_path, metric="test/token_acc", direction="minimize")
    assert err.key == "direction" and "ranks 'test/token_acc' backwards (higher is better): write maximize" in str(err)
    # every metric a run logs has a direction, but the two that say when it stopped; perplexity (exp of the loss)
    # and the decoded error rate fall, accuracies and throughput rise
    run = load_study(write(tmp_path)).cells[0].run
    assert {m for m in logged_metrics(run) if better(m) is None} == {"diverged_step", "stopped_step"}
    assert {better(m) for m in ("final/val_ppl", "test/error_at_3", "cost/peak_memory_mb")} == {"minimize"}
    assert {better(m) for m in ("best/val_exact_match", "test/token_acc", "cost/tokens_per_s", "cost/mfu")} == {
        "maximize"
    }


def test_a_claim_names_a_declared_contrast_or_is_refused_with_its_line(tmp_path):
    """Issue 65: "Vaswani's both halves" read section 3.2.1's sentence off scaled against unscaled dot, a contrast it
    is not about. A claim quotes its paper with the contrast that tests it, and a contrast the family does not
    declare is refused before anything runs, on the claim's line; a claim moves no verdict (decides nothing)."""
    from record.spec.analysis import Analysis
    from record.spec.decides import NONE, marks

    claim = {"contrast": ["norm=post", "norm=pr"], "source": "Xiong et al. 2020", "sentence": "Post-LN needs warm-up"}
    path = write(tmp_path, analysis={"claims": [claim]})
    err = refused(tmp_path, analysis={"claims": [claim]})
    assert err.key == "analysis.claims[0].contrast" and "did you mean 'norm=post vs norm=pre'" in err.message
    lines = path.read_text().splitlines()
    assert err.line == 1 + next(i for i, x in enumerate(lines) if "contrast:" in x)
    assert refused(
        tmp_path, analysis={"claims": [{**claim, "contrast": ["norm=post", "norm=pre"], "sentence": ""}]}
    ).key == ("analysis.claims[0].sentence")
    err = refused(tmp_path, analysis={"claims": [{**claim, "contrast": ["norm=post", "norm=pre"], "quote": "x"}]})
    assert err.key == "analysis.claims[0].quote" and "valid keys: contrast, metric, source, sentence" in err.message
    fine = load_study(write(tmp_path, analysis={"claims": [{**claim, "contrast": ["norm=post", "norm=pre"]}]}))
    assert fine.analysis.claims[0].name == "norm=post vs norm=pre" and marks(Analysis)["claims"] == NONE


def test_a_margin_on_its_scale_is_checked_before_the_runs(tmp_path):
    """Issue 65: margins: {metric: {relative: r}} or {log: m}; exactly one, r a fraction, each mistake said once
    with its key; the registration hash of a study without one is unchanged (defaults are not serialised)."""
    from record.spec.analysis_parts import Margin

    err = refused(tmp_path, analysis={"margins": {"final/val_loss": {"relatve": 0.05}}})
    assert (
        err.key.startswith("analysis.margins")
        and "final/val_loss.relatve: Extra inputs are not permitted" in err.message
    )
    err = refused(tmp_path, analysis={"margins": {"final/val_loss": {"relative": 0.05, "log": 0.05}}})
    assert "give exactly one of relative (e.g. 0.05) or log (e.g. 0.05)" in err.message
    assert "less than 1" in refused(tmp_path, analysis={"margins": {"final/val_loss": {"relative": 1.5}}}).message
    study = load_study(write(tmp_path, analysis={"margins": {"final/val_loss": {"relative": 0.05}}}))
    m = study.analysis.margins["final/val_loss"]
    assert isinstance(m, Margin) and study.analysis.margin("final/val_loss") == (math.log1p(0.05), "log", m.text)


def test_the_metrics_a_study_expects_are_the_metrics_a_run_logs(tmp_path, store):
    """What the study file is checked against is what training records: one short run of each kind of task."""
    from ablations.train import Tracking, train
    from record.spec import resolve_run
    from record.spec.metrics import logged_metrics

    tiny = {"d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32}
    training = {"max_steps": 4, "val_every": 2, "batch_size": 8, "warmup_steps": 0}
    for task in (
        {"name": "reverse", "train_size": 40, "val_size": 8, "test_size": 40, "max_len": 5},  # every length
        {"name": "recall", "train_size": 40, "val_size": 8, "test_size": 8},
        {"name": "listops", "train_size": 40, "val_size": 8, "test_size": 8, "max_len": 40},
    ):
        run = resolve_run({"task": task, "model": tiny, "training": training})
        result = train(run, Tracking(store, task["name"]))
        logged = {k for k in result.metrics if not k.startswith("cost/")}
        expected = {k for k in logged_metrics(run) if not k.startswith("cost/")} - {"diverged_step", "stopped_step"}
        assert logged == expected, (task["name"], logged ^ expected)
        costs = {k for k in result.metrics if k.startswith("cost/")}
        assert costs <= logged_metrics(run), costs - logged_metrics(run)


@pytest.mark.parametrize(
    ("key", "word", "reads"),
    [
        (3, "3", "a number"),
        (1.5, "1.5", "a number"),
        (True, "true", "true/false"),
        (None, "null", "nothing"),
        (date(2020, 1, 1), "2020-01-01", "a date"),
    ],
)
def test_a_key_yaml_reads_as_a_number_or_true_or_null_is_named_once(tmp_path, key, word, reads):
    """`3:`, `true:` or `null:` as an axis of a design or a parameter of a search: one line each, which says how
    YAML read it and how to write it (it was named two or three times, once per check that refused it)."""
    from record.spec import load_search

    said = f"this key reads as {reads} ({word}), not as text: write it in quotes"

    def line(path: Path) -> int:  # where the file says it
        return next(i for i, text in enumerate(path.read_text().splitlines(), 1) if text.strip().startswith(word))

    err = refused(tmp_path, design={"grid": {"model.norm": ["pre"], key: [1]}})
    study = tmp_path / "study.yaml"
    assert [str(e) for e in err.every()] == [f"{study}:{line(study)}: design.grid[{word}]: {said}"]
    path = tmp_path / "search.yaml"
    space = {key: {"type": "int", "low": 1, "high": 2}, "training.lr": {"type": "float", "low": 0.1, "high": 0.2}}
    path.write_text(yaml.safe_dump({"name": "s", "base": BASE, "n_trials": 2, "space": space}))
    with pytest.raises(SpecError) as info:
        load_search(path)
    assert [str(e) for e in info.value.every()] == [f"{path}:{line(path)}: space[{word}]: {said}"]
    # ... and anywhere else, once (each of these was also named as an unknown key, or by pydantic's "Keys should
    # be strings" under a key path that said 1 for true)
    base = {**BASE, "model": {**BASE["model"], key: 1}}
    grid = {"grid": {"model.norm": ["pre"]}}
    for data, where in (
        ({"name": "t", "base": BASE, "design": grid, key: 1}, f"[{word}]"),
        ({"name": "t", "base": base, "design": grid}, f"base.model[{word}]"),
        ({"name": "t", "base": BASE, "design": grid, "budget": {key: 1}}, f"budget[{word}]"),
    ):
        study.write_text(yaml.safe_dump(data))
        with pytest.raises(SpecError) as info:
            load_study(study)
        assert [str(e) for e in info.value.every()] == [f"{study}:{line(study)}: {where}: {said}"]
    lr = {"type": "float", "low": 0.1, "high": 0.2}
    for param, where in (
        ({**lr, key: 1}, f"space.training.lr[{word}]"),
        ({**lr, "when": {key: "x"}}, f"space.training.lr.when[{word}]"),
    ):
        space = {"model.norm": {"type": "categorical", "choices": ["pre", "post"]}, "training.lr": param}
        path.write_text(yaml.safe_dump({"name": "s", "base": BASE, "n_trials": 2, "space": space}))
        with pytest.raises(SpecError) as info:
            load_search(path)
        assert [str(e) for e in info.value.every()] == [f"{path}:{line(path)}: {where}: {said}"]


def test_refused_variants_the_metric_and_the_analysis_names_come_in_one_pass(tmp_path):
    """The second pass names every variant the model refuses, the metric no run logs and the names the analysis
    gives that the study lacks, at once (the metric and the analysis each waited for the variants to be fixed). A
    refused variant is still a name the analysis may give."""
    design = {"variants": [{"name": "base", "set": {}}, {"name": "heads3", "set": {"model.n_heads": 3}}]}
    analysis = {"contrasts": {"pairs": [["bas", "heads3"], ["heads3", "base"]]}}
    err = refused(tmp_path, design=design, metric="test/exact_mtch", analysis=analysis)
    said = [(e.key, e.message) for e in err.every()]
    assert [key for key, _ in said] == ["analysis.contrasts.pairs[0]", "variant 'heads3'", "metric"]  # file order
    assert said[0][1].startswith("'bas' is not a variant (did you mean 'base'?)")
    assert "d_model=16 is not divisible by n_heads=3" in said[1][1] and said[1][1].endswith("skip_invalid: true)")
    assert said[2][1] == "'test/exact_mtch' is not a metric these runs log; did you mean test/exact_match?"


def test_a_study_whose_every_variant_is_refused_gets_no_false_analysis_error(tmp_path):
    """With no valid cell there are no metrics to judge the analysis's by: only the variants are named (the
    analysis's margin on test/loss was called unknown beside them)."""
    design = {"variants": [{"name": "h3", "set": {"model.n_heads": 3}}, {"name": "h5", "set": {"model.n_heads": 5}}]}
    err = refused(tmp_path, design=design, analysis={"margins": {"test/loss": 0.1}})
    assert [e.key for e in err.every()] == ["variant 'h3'", "variant 'h5'"]


def test_a_margin_its_seeds_cannot_show_is_named_before_the_runs(tmp_path):
    """Two pairs against the baseline with a margin on the study's metric: the exact two one-sided tests cannot go
    below 1/2^n (independent: tost_p of differences well inside the margin), against Holm's first step 0.05/2.
    5 seeds (0.031) cannot show equivalence whatever the data, 6 (0.016) can; without a margin nothing is said."""
    import numpy as np

    from ablations.sweep import unresolvable_warning
    from record.stats import tost_p

    design = {"variants": [{"name": n, "set": {"model.norm": v}} for n, v in (("a", "pre"), ("b", "post"))]}
    design["variants"].append({"name": "c", "set": {"training.lr": 0.002}})
    analysis = {"margins": {"final/val_loss": 0.01}}
    for seeds in (5, 6):
        floor = tost_p(np.full(seeds, 0.001), margin=1.0)
        warning = unresolvable_warning(load_study(write(tmp_path, design=design, seeds=seeds, analysis=analysis)))
        said = next((x for x in warning.splitlines() if x.startswith("warning:") and "equivalent" in x), "")
        reach = warning.splitlines()[-1]  # issue 65: where a loss's margin reaches past its floor, said first
        assert reach.startswith("note: ") and "±0.01 on final/val_loss reaches past a perfect loss of 0" in reach
        assert "where the comparator's final/val_loss is below 0.01: no equivalence can be shown there" in reach
        if floor > 0.05 / 2:
            assert f"with {seeds} seeds the exact two one-sided tests' smallest p is {floor:.3g}" in said
            assert "can come out equivalent within ±0.01 on final/val_loss whatever the data" in said
            assert said.endswith("use at least 6 seeds (seeds: 6)")
        else:
            assert "equivalent" not in said
    assert tost_p(np.full(5, 0.001), margin=1.0) > 0.025 >= tost_p(np.full(6, 0.001), margin=1.0)  # both branches
    plain = unresolvable_warning(load_study(write(tmp_path, design=design, seeds=5)))
    assert "equivalent" not in (plain or "")


# --- seed plans (issue 49) ---------------------------------------------------------------------------


PAIR = {"contrasts": {"pairs": [["norm=post", "norm=pre"]]}}


def test_a_seed_plan_declares_its_looks_and_trains_up_to_its_maximum(tmp_path):
    study = load_study(write(tmp_path, seeds={"first": 7, "batch": 2, "max": 12}, analysis=PAIR))
    assert study.plan.looks() == [7, 9, 11, 12]  # the last batch is what is left up to max
    assert sorted({c.seed for c in study.cells}) == list(range(12))  # cells exist up to max; the plan picks
    spent = study.plan.cumulative(0.05)
    assert spent[-1] == 0.05 and all(a < b for a, b in zip(spent, spent[1:]))


@pytest.mark.parametrize(
    ("seeds", "analysis", "where", "says"),
    [
        ({"first": 8, "batch": 2, "max": 12}, None, "seeds", "declare analysis.contrasts"),
        (
            {"first": 4, "batch": 2, "max": 12},
            PAIR,
            "seeds.first",
            "from 7 seeds (its smallest p, 2/2^n); use first: 7",
        ),
        ({"first": 8, "batch": 2, "max": 6}, PAIR, "seeds", "max=6 is below first=8"),
        ({"first": 8, "batch": 5, "max": 10}, PAIR, "seeds", "batch=5 is more than max - first = 2"),
        ({"first": 8, "batch": 2, "max": 12}, {**PAIR, "test": "t"}, "analysis.test", "no exact sequential form"),
        ({"first": 8, "batch": 0, "max": 12}, PAIR, "seeds", "batch"),
        ({"first": 8, "max": 12}, PAIR, "seeds", "batch"),
    ],
)
def test_a_seed_plan_that_cannot_work_is_refused_with_its_numbers(tmp_path, seeds, analysis, where, says):
    """A plan without declared contrasts, a first batch below the exact test's smallest useful sample at the
    first look (0.05 spent as Pocock by 4 of 12 seeds: 0.0226, reached from 2/2^7; 6 of 12 spend 0.0310 < 2/2^6),
    a maximum below the first
    batch, a batch that never fits, the t-test: refused before anything runs."""
    err = refused(tmp_path, seeds=seeds, analysis=analysis)
    assert where in str(err) and says in str(err), str(err)
