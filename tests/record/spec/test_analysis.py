"""The ``analysis:`` section of a study file: defaults, and bad input refused with the key and the fix."""

from __future__ import annotations

import subprocess
import sys

import pytest

from record.spec.analysis import Analysis, AnalysisError, check_analysis, from_design, parse_analysis

VARIANTS = ["norm=pre warmup=0", "norm=post warmup=0", "norm=pre warmup=100", "norm=post warmup=100"]
AXES = ["model.norm", "training.warmup_steps"]
METRICS = {"final/val_loss", "test/exact_match"}


def test_defaults():
    a = parse_analysis(None)
    assert (a.test, a.alpha, a.failure_rule, a.power, a.contrasts) == ("permutation", 0.05, "worst", 0.8, None)
    w = a.warn  # issue 21: when the report warns a reader
    assert (w.chance_fraction, w.converged_window, w.converged_fraction, w.param_ratio, w.min_seeds) == (
        0.9,
        0.2,
        0.05,
        1.5,
        5,
    )
    assert a.confidence == pytest.approx(0.95)
    # the default family: each variant against the baseline; on a grid of two axes or more, its main effects and
    # interactions (the questions a factorial design asks: a new user's 2 x 2 grid got no verdict for them)
    f = a.family(VARIANTS, VARIANTS[0], AXES[:1], is_grid=True)
    assert (f.pairs, f.main, f.interactions, f.default) == ([(v, VARIANTS[0]) for v in VARIANTS[1:]], [], [], True)
    f = a.family(VARIANTS, VARIANTS[0], AXES, is_grid=True)
    assert (f.pairs, f.main, f.interactions) == ([], AXES, [tuple(AXES)]) and f.size({a: 2 for a in AXES}) == 3
    f = a.family(VARIANTS, VARIANTS[0], AXES, is_grid=False)
    assert (f.pairs, f.main, f.interactions) == ([(v, VARIANTS[0]) for v in VARIANTS[1:]], [], [])
    assert from_design({}) == Analysis() and from_design({"analysis": None}) == Analysis()  # older studies


def test_a_full_section_round_trips_through_design_json():
    data = {
        "test": "t",
        "alpha": 0.01,
        "failure_rule": "value",
        "failure_values": {"test/exact_match": 0.0},
        "never_learned": {"final/val_loss": 2.3},
        "margins": {"final/val_loss": 0.005},
        "contrasts": {"pairs": [[VARIANTS[1], VARIANTS[2]]], "main_effects": True, "interactions": [AXES]},
        "power": 0.9,
        "detect": {"final/val_loss": 0.01},
    }
    a = parse_analysis(data)
    check_analysis(a, VARIANTS, AXES, METRICS, kind="grid")
    f = a.family(VARIANTS, VARIANTS[0], AXES, is_grid=True)
    assert (f.pairs, f.main, f.interactions, f.default) == ([(VARIANTS[1], VARIANTS[2])], AXES, [tuple(AXES)], False)
    assert f.size({AXES[0]: 2, AXES[1]: 3}) == 1 + 1 + 2 + 2
    assert from_design({"analysis": a.model_dump(mode="json")}) == a
    warn = parse_analysis({"warn": {"param_ratio": 2, "min_seeds": 3}})
    assert (warn.warn.param_ratio, warn.warn.min_seeds, warn.warn.chance_fraction) == (2, 3, 0.9)
    # the study loader records only what the file sets; the report reads the rest back as defaults
    assert warn.model_dump(mode="json", exclude_defaults=True) == {"warn": {"param_ratio": 2.0, "min_seeds": 3}}
    assert from_design({"analysis": {"warn": {"param_ratio": 2.0, "min_seeds": 3}}}) == warn
    every = parse_analysis({"contrasts": {"pairs": "baseline", "interactions": True}})
    assert every.family(["x"], "x", ["a", "b", "c"], True).interactions == [("a", "b"), ("a", "c"), ("b", "c")]


@pytest.mark.parametrize(
    "data,message",
    [
        ({"failure_rule": "drop"}, r"analysis\.failure_rule: .*'worst', 'exclude' or 'value'.*'drop'.*fix: use one of"),
        ({"test": "wilcoxon"}, r"analysis\.test: .*'wilcoxon'.*fix: use one of: permutation, t"),
        ({"alpha": 0.7}, r"analysis\.alpha: .*0\.5.*fix"),
        ({"power": 1.5}, r"analysis\.power: .*fix"),
        ({"margins": {"final/val_loss": -0.1}}, r"analysis\.margins: final/val_loss: must be positive"),
        ({"detect": {"final/val_loss": 0}}, r"analysis\.detect: final/val_loss: must be positive"),
        ({"failure_rule": "value"}, r"analysis\.failure_rule: value needs failure_values"),
        ({"failure_values": {"final/val_loss": 3}}, r"analysis\.failure_values: only used with failure_rule value"),
        ({"contrast": {}}, r"analysis\.contrast: unknown key; did you mean 'contrasts'\? valid keys: test, alpha"),
        ({"contrasts": {"pair": []}}, r"analysis\.contrasts\.pair: unknown key; did you mean 'pairs'\?"),
        ({"contrasts": {}}, r"analysis\.contrasts: declares no contrast"),
        (
            {"contrasts": {"pairs": [["a"]]}},
            r"analysis\.contrasts\.pairs: item 0 .* not a pair \[variant, comparator\]",
        ),
        ({"contrasts": {"pairs": "all"}}, r"analysis\.contrasts\.pairs: must be a list .* or 'baseline'"),
        ({"contrasts": {"main_effects": "yes"}}, r"analysis\.contrasts\.main_effects: must be true, false or a list"),
        ("worst", r"analysis: must be a mapping"),
        ({"warn": {"param_ratio": 1}}, r"analysis\.warn\.param_ratio: .*greater than 1.*fix: use a ratio above 1"),
        ({"warn": {"chance_fraction": 1.2}}, r"analysis\.warn\.chance_fraction: .*less than 1.*fix: use a fraction"),
        ({"warn": {"converged_window": 0}}, r"analysis\.warn\.converged_window: .*fix: use a fraction of the training"),
        ({"warn": {"converged_fraction": -0.1}}, r"analysis\.warn\.converged_fraction: .*fix: use a relative"),
        ({"warn": {"min_seeds": 1}}, r"analysis\.warn\.min_seeds: .*at least 2"),
        ({"warn": {"min_seeds": 4.5}}, r"analysis\.warn\.min_seeds: .*integer.*fix: use a whole number"),
        (
            {"warn": {"min_seed": 3}},
            r"analysis\.warn\.min_seed: unknown key; did you mean 'min_seeds'\? valid keys: chance",
        ),
        ({"warn": 1.5}, r"analysis\.warn: .*fix: write a mapping of settings"),
    ],
)
def test_bad_values_are_refused_with_the_key_and_the_fix(data, message):
    with pytest.raises(ValueError, match=message):
        parse_analysis(data)


@pytest.mark.parametrize(
    "data,kwargs,message",
    [
        (
            {"contrasts": {"pairs": [[VARIANTS[1], VARIANTS[0]], ["post_ln", VARIANTS[0]]]}},
            {},
            r"analysis\.contrasts\.pairs\[1\]: 'post_ln' is not a variant; variants: norm=pre warmup=0, .*; fix: use the "
            r"variant names",
        ),
        (
            {"contrasts": {"pairs": [["norm=post warmup=O", VARIANTS[0]]]}},
            {},
            r"pairs\[0\]: 'norm=post warmup=O' is not a variant \(did you mean 'norm=post warmup=0'\?\)",
        ),
        ({"contrasts": {"pairs": [[VARIANTS[1], VARIANTS[1]]]}}, {}, r"pairs\[0\]: compares .* with itself"),
        (
            {"contrasts": {"pairs": [[VARIANTS[1], VARIANTS[0]], [VARIANTS[0], VARIANTS[1]]]}},
            {},
            r"pairs\[1\]: the same contrast as pairs\[0\]",
        ),
        (
            {"margins": {"final/val_los": 0.01}},
            {"metrics": METRICS},
            r"analysis\.margins\.final/val_los: 'final/val_los' is not a metric \(did you mean 'final/val_loss'\?\); "
            r"metrics: final/val_loss, test/exact_match; fix",
        ),
        (
            {"detect": {"test/bleu": 0.5}},
            {"metrics": METRICS},
            r"analysis\.detect\.test/bleu: 'test/bleu' is not a metric",
        ),
        ({"never_learned": {"acc": 0.1}}, {"metrics": METRICS}, r"analysis\.never_learned\.acc: 'acc' is not a metric"),
        (
            {"contrasts": {"main_effects": ["model.nrom"]}},
            {},
            r"main_effects\[0\]: 'model.nrom' is not an axis .*axes:",
        ),
        ({"contrasts": {"interactions": [["model.norm", "lr"]]}}, {}, r"interactions\[0\]: 'lr' is not an axis"),
        (
            {"contrasts": {"main_effects": True}},
            {"kind": "one_at_a_time"},
            r"analysis\.contrasts: main effects and interactions need a full grid.*'one_at_a_time'; declare pairs",
        ),
    ],
)
def test_names_the_study_does_not_have_are_refused(data, kwargs, message):
    a = parse_analysis(data)
    with pytest.raises(ValueError, match=message):
        check_analysis(a, VARIANTS, AXES, kwargs.get("metrics"), kind=kwargs.get("kind"))


def test_metrics_are_not_checked_when_unknown():
    check_analysis(parse_analysis({"margins": {"anything/at_all": 0.1}}), VARIANTS, AXES, None)


def test_the_module_imports_no_heavy_library():
    code = "import sys, record.spec.analysis; print(sorted(m for m in ('ray', 'mlflow', 'optuna', 'torch') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_errors_carry_the_key_as_a_path_for_the_files_line():
    """A study loader turns ``err.path`` into the line of the study file (it names the file itself)."""
    cases = [
        (lambda: parse_analysis({"failure_rule": "drop"}), ("analysis", "failure_rule")),
        (lambda: parse_analysis({"contrasts": {"pair": []}}), ("analysis", "contrasts", "pair")),
        (lambda: parse_analysis({"failure_rule": "value"}), ("analysis", "failure_rule")),
        (
            lambda: check_analysis(parse_analysis({"contrasts": {"pairs": [[VARIANTS[1], "nope"]]}}), VARIANTS, AXES),
            ("analysis", "contrasts", "pairs", 0),
        ),
        (
            lambda: check_analysis(parse_analysis({"margins": {"x/y": 0.1}}), VARIANTS, AXES, METRICS),
            ("analysis", "margins", "x/y"),
        ),
    ]
    for call, path in cases:
        with pytest.raises(AnalysisError) as err:
            call()
        assert err.value.path == path
        assert str(err.value).startswith(".".join(str(p) for p in path).replace(".0", "[0]") + ": ")
        assert err.value.message and not err.value.message.startswith("analysis")
