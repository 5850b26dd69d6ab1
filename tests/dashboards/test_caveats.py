"""Issue 21, item 5: the report warns where a reader would be misled (variants near chance or not yet converged,
parameter counts that differ by more than a stated ratio, intervals from too few seeds, a family its seeds
cannot resolve), and marks a variant best only where the family's tests support it.

Each warning fires on a store built to trigger it and stays silent on one built not to; the thresholds are
checked against their definitions (a uniform guess's loss from scipy's log-softmax of constant logits, the fall
of a piecewise-linear or straight curve in closed form, the exact test's smallest p by enumeration)."""

from __future__ import annotations

import dataclasses
import html
import math

import numpy as np
import pytest
from scipy import special

from dashboards import caveats
from dashboards.compare import compare, format_changes
from dashboards.render import to_html, to_latex, to_markdown, to_terminal
from dashboards.report import make_report
from dashboards.table import build
from record import stats, vocabulary
from record.runs import load_runs, output_classes
from record.spec.analysis_parts import Warn
from tests.dashboards.test_report import fill, flips

ENCODER10 = {"model.arch": "encoder", "model.n_classes": "10", "model.vocab_size": "32", "model.classifier": "mean"}
STILL_FALLING = [(20, 2.9), (40, 2.7), (60, 2.55), (80, 2.4), (100, 2.25)]  # -6.25% over steps 80-100


def uniform_guess_loss(classes: int) -> float:
    """The cross-entropy of a model that outputs the same logit for every class (scipy, not ln C by hand)."""
    return float(-special.log_softmax(np.zeros(classes))[0])


def kinds(table) -> set[str]:
    return {c.kind for c in table.caveats}


# --- the issue's example, and its opposite ----------------------------------------------------------------------


def issue_example(uri: str, study: str = "issue21", submission: int = 1) -> dict:
    """Two variants near chance loss (10 classes) after 100 steps, still falling, one with 2.4x the parameters
    of the other, three seeds: the report the issue saw bold a 'best' at p = 0.69 without a word of warning."""
    rng = np.random.default_rng(21)
    values = {v: {s: 2.25 + 0.03 * rng.standard_normal() for s in range(3)} for v in ("small", "big")}
    fill(
        uri, study, values, metric="final/val_loss", direction="minimize", submission=submission,
        params={v: ENCODER10 for v in values}, cost={"cost/wall_time_s": 10.0},
        extra={(v, s): {"cost/n_params": 2400.0 if v == "big" else 1000.0} for v in values for s in range(3)},
        curves={(v, s): STILL_FALLING for v in values for s in range(3)},
    )  # fmt: skip
    return values


def test_the_issues_example_warns_of_everything_and_bolds_nothing(store):
    issue_example(store)
    table = build(load_runs(store, "issue21"))
    assert kinds(table) == {"chance", "convergence", "params", "seeds", "resolution"}
    assert not any(r.best for r in table.rows)
    text = {c.kind: c.text for c in table.caveats}
    chance = uniform_guess_loss(10)
    assert f"ln 10 = {chance:.3g}" in text["chance"] and text["chance"].startswith("every variant is near chance")
    assert "big has 2.4x the parameters of small (2,400 vs 1,000)" in text["params"]
    assert "over the last 20% of training steps" in text["convergence"]
    assert "rests on 3 seeds (warn.min_seeds 5)" in text["seeds"]
    assert f"smallest p is {flips([1, 2, 3]):.3g}" in text["resolution"]  # 2/2^3 by enumeration: 0.25
    # in every rendering that carries notes, and in the HTML report above the table
    # in every rendering that carries notes
    for c in table.caveats:
        assert c.text in to_markdown(table) and c.text in to_terminal(table)
        assert html.escape(c.text) in to_html(table)
    assert to_markdown(table).count("- **warning**: ") == 5 and to_terminal(table).count("WARNING: ") == 5
    assert to_latex(table).count(r"\textbf{Warning:}") == 5
    for r in table.as_records():  # CSV and JSON name the warnings that concern each variant
        assert r["warnings"].split("; ") == ["chance", "convergence", "params", "seeds"]


@pytest.mark.slow
def test_the_report_shows_the_warnings_above_its_table(store, tmp_path):
    issue_example(store)
    report = make_report(store, "issue21", out_dir=tmp_path / "r", log=False)
    page = report.html
    assert len(report.table.caveats) == 5
    for c in report.table.caveats:
        assert page.index(html.escape(c.text)) < page.index('class="ablation"')
    assert report.files["markdown"].read_text() == to_markdown(report.table)


def test_a_clean_study_gets_no_warning_and_its_resolved_best_in_bold(store):
    """Far from chance, levelled off, parameter counts within 1.5x (1.4x), 8 seeds: nothing to warn of; the
    better variant is different (better) after Holm, and only then bold."""
    rng = np.random.default_rng(8)
    base = {s: 0.50 + 0.01 * rng.standard_normal() for s in range(8)}
    values = {"small": base, "big": {s: v - 0.05 + 0.005 * rng.standard_normal() for s, v in base.items()}}
    fill(
        store, "clean", values, metric="final/val_loss", direction="minimize", params={v: ENCODER10 for v in values},
        cost={"cost/wall_time_s": 10.0},
        extra={(v, s): {"cost/n_params": 1400.0 if v == "big" else 1000.0} for v in values for s in range(8)},
    )  # fmt: skip
    table = build(load_runs(store, "clean"))
    assert table.caveats == [] and table.warnings == []
    assert "warning" not in to_markdown(table).lower() and "WARNING" not in to_terminal(table)
    big = next(r for r in table.rows if r.variant == "big")
    assert big.contrast.verdict == "different (better)" and big.best and table.ranking.variant == "big"
    assert f"**{big.summary.mean:.4g} ±" in to_markdown(table)


def test_the_thresholds_are_settings_of_the_study(store):
    """The issue's example under warn: {chance_fraction: 0.99, converged_fraction: 0.1, param_ratio: 3,
    min_seeds: 3}: the loss is 98% of chance, falls 6% and carries 2.4x the parameters, so nothing but the
    family's resolution (not a setting: 3 seeds cannot reach 0.05) is left to warn of."""
    issue_example(store)
    runs = load_runs(store, "issue21")
    table = build(runs)
    assert kinds(table) == {"chance", "convergence", "params", "seeds", "resolution"}
    loose = table.analysis.model_copy(
        update={"warn": Warn(chance_fraction=0.99, converged_fraction=0.1, param_ratio=3, min_seeds=3)}
    )
    assert kinds(build(runs, analysis=loose)) == {"resolution"}


def test_compare_lists_the_warnings_of_each_conclusion(store):
    issue_example(store, "cmp", 1)
    rng = np.random.default_rng(2)
    values = {v: {s: 0.5 + 0.01 * rng.standard_normal() for s in range(8)} for v in ("small", "big")}
    fill(store, "cmp", values, metric="final/val_loss", direction="minimize", submission=2)
    _, _, changes = compare(store, "cmp@1", "cmp@2")
    (change,) = changes
    assert any(w.startswith("cmp@1: every variant is near chance") for w in change.warnings)
    assert any(w.startswith("cmp@1: parameter counts differ") for w in change.warnings)
    assert all(w.startswith("cmp@1: ") for w in change.warnings)  # submission 2 has nothing to warn of
    text = format_changes("cmp@1", "cmp@2", "final/val_loss", changes)
    assert "Warnings ([n] after a contrast" in text and "[1]" in text.splitlines()[1]
    assert "  [1] cmp@1: " in text
    head, row = text.splitlines()[:2]  # each heading starts where its column does (the headings are wider)
    assert [head.index(h) for h in ("cmp@1 (Δ", "cmp@2 (Δ)", "changed")] == [
        row.index(change.a), row.index(change.b, row.index(change.a) + len(change.a)), row.index(" no ") + 1
    ]  # fmt: skip


# --- near chance ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "params,classes",
    [
        (ENCODER10, 10),
        ({**ENCODER10, "model.classifier": "token"}, None),  # tagging: the loss sums over a sequence's tokens
        # an encoder-decoder's targets hold the task's symbols and the end of sequence, never padding, the start
        # or the separator (models.tasks.batches: tgt_out is the target and EOS)
        ({"model.arch": "encoder_decoder", "model.vocab_size": "13", "model.tgt_vocab_size": "None"}, 10),
        ({"model.arch": "encoder_decoder", "model.vocab_size": "13", "model.tgt_vocab_size": "40"}, 37),
        ({"model.arch": "encoder_decoder", "model.vocab_size": "13", "model.tgt_vocab_size": "13"}, 10),
        ({"model.arch": "decoder", "model.vocab_size": "256", "model.n_classes": "None"}, 256),
        ({}, None),  # an older run without params: unknown, no warning
    ],
)
def test_the_classes_an_older_runs_loss_is_over(params, classes):
    """Runs recorded before their task declared its classes: the one adapter works them out from the params."""
    from record.recorded import legacy_output_classes

    assert legacy_output_classes(params) == classes


def test_an_encoder_decoder_that_learned_nothing_of_its_input_is_near_chance():
    """norm_placement's Post-LN cell without warm-up at 4 layers and lr 1e-2 (2026-11-26): 2.354 nats on reversal
    over 10 symbols, above ln 10 = 2.30, what a guess that ignores the input scores; over its 14-token vocabulary
    (ln 14 = 2.64) it sat at 89% and was not warned of. Its targets hold 11 tokens (the symbols and the end)."""
    from models.tasks import make_task
    from record.spec.run import resolve_run

    task = make_task({"name": "reverse", "symbols": 10})
    run = resolve_run({"task": {"name": "reverse", "symbols": 10}, "model": {"d_model": 16, "n_heads": 2}})
    assert task.output_classes(run.model) == 11 == output_classes({"output_classes": 11.0})
    classes = {"post, no warm-up": 11, "pre": 11}
    c = caveats.near_chance({"post, no warm-up": (2.354, 9), "pre": (0.026, 9)}, classes, "final/val_loss", Warn())
    assert c is not None and c.variants == ("post, no warm-up",) and "ln 11" in c.text


def answer_tokens(task: dict) -> set[int]:
    """The tokens the answers of an answer-scored task hold, read from its own examples (the loss mask marks the
    targets that are scored), not from the task's params."""
    from models.tasks import make_task
    from models.tasks.recall import _examples as recall_examples
    from models.tasks.retrieval import _examples as retrieval_examples

    made = make_task(task)
    params = dataclasses.asdict(made.params)
    examples = {"recall": recall_examples, "retrieval": retrieval_examples}[task["name"]]
    found: set[int] = set()
    for example in examples(**{**params, "seed": 0, "size": 2000}):
        targets = example["tokens"][1:]
        found |= {t for t, scored in zip(targets, example["loss_mask"]) if scored}
    return found


@pytest.mark.parametrize(
    "task",
    [
        {"name": "recall"},  # the task's default: 16 values, 16 keys (a vocabulary of 36 with the special tokens)
        {"name": "recall", "values": 8, "keys": 20},
        {"name": "retrieval", "symbols": 12},
    ],
)
def test_an_answer_scored_decoder_is_judged_over_what_its_answers_hold(store, task):
    """Zoology's multi-query recall (Arora et al. 2023) scores a decoder on its answers only, each one of the
    values; a model that has learned which tokens are values but not which value a key holds guesses among them:
    ln(values), not ln(vocabulary). Counted over the recall task's 36 tokens, such a model (ln 16 = 2.77) sat at
    77% of ln 36 and was not warned of. The row's params are those a run of the task logs (the run file's task
    keys as written), read back from a real store."""
    from models.tasks import make_task
    from record.spec.run import resolve_run

    answers = answer_tokens(task)
    run = resolve_run({"task": task, "model": {"arch": "decoder", "d_model": 16, "n_heads": 2, "n_layers": 1}})
    params = {k: str(v) for k, v in run.params().items() if k.startswith(("model.", "task."))}
    assert int(params["model.vocab_size"]) == make_task(task).vocab_size > len(answers)
    guess = uniform_guess_loss(len(answers))
    values = {"guesses": {s: guess + 0.01 * s for s in range(5)}, "learns": {s: 0.3 + 0.01 * s for s in range(5)}}
    fill(store, "answers", values, metric="final/val_loss", direction="minimize", params={v: params for v in values})
    (c,) = [c for c in build(load_runs(store, "answers")).caveats if c.kind == "chance"]
    assert c.variants == ("guesses",) and f"ln {len(answers)} = {guess:.3g}" in c.text


def test_the_classes_are_read_from_what_the_runs_task_declared(store):
    """A researcher's own task (a plugin) declares its classes; the report reads them from its runs, with no entry
    in the comparing code: 5 answer classes, although its decoder's vocabulary (its params) holds 300 tokens."""
    params = {"model.arch": "decoder", "model.vocab_size": "300", "task.name": "my_own_task"}
    guess = uniform_guess_loss(5)
    values = {"guesses": {s: guess + 0.01 * s for s in range(5)}, "learns": {s: 0.3 + 0.01 * s for s in range(5)}}
    tags = {v: {vocabulary.TAG_OUTPUT_CLASSES: "5"} for v in values}
    fill(
        store,
        "own",
        values,
        metric="final/val_loss",
        direction="minimize",
        params={v: params for v in values},
        tags=tags,
    )
    (c,) = [c for c in build(load_runs(store, "own")).caveats if c.kind == "chance"]
    assert c.variants == ("guesses",) and f"ln 5 = {guess:.3g}" in c.text


def test_near_chance_by_its_definition():
    warn = Warn()
    ln10 = uniform_guess_loss(10)
    classes = {"a": 10}
    # a loss at 0.9 ln C is near chance, just below it is not
    assert caveats.near_chance({"a": (0.9 * ln10, 3)}, classes, "final/val_loss", warn) is not None
    assert caveats.near_chance({"a": (0.9 * ln10 - 1e-6, 3)}, classes, "final/val_loss", warn) is None
    # a perplexity: exp of the loss
    assert caveats.near_chance({"a": (math.exp(0.95 * ln10), 3)}, classes, "test/ppl", warn) is not None
    assert caveats.near_chance({"a": (math.exp(0.5 * ln10), 3)}, classes, "test/ppl", warn) is None
    # an accuracy within 10% of the way from 1/C to 1: 0.1 + 0.1 * 0.9 = 0.19
    assert caveats.near_chance({"a": (0.19, 3)}, classes, "test/accuracy", warn) is not None
    assert caveats.near_chance({"a": (0.2, 3)}, classes, "test/accuracy", warn) is None
    # an exact match (every token of a sequence right): 1/C is what a uniform guess gets at most, and said so
    c = caveats.near_chance({"a": (0.19, 3)}, classes, "test/exact_match", warn)
    assert c is not None and "a uniform guess gets at most 1/10 = 0.1" in c.text
    assert "at most" not in caveats.near_chance({"a": (0.19, 3)}, classes, "test/accuracy", warn).text
    # metrics without a chance level, variants without a value or without a known class count
    assert caveats.near_chance({"a": (5.0, 3)}, classes, "cost/wall_time_s", warn) is None
    assert caveats.near_chance({"a": (ln10, 0)}, classes, "final/val_loss", warn) is None
    assert caveats.near_chance({"a": (ln10, 3)}, {"a": None}, "final/val_loss", warn) is None


def test_one_variant_near_chance_is_named_alone(store):
    rng = np.random.default_rng(5)
    values = {
        "learns": {s: 0.4 + 0.02 * rng.standard_normal() for s in range(5)},
        "stuck": {s: 2.28 + 0.01 * rng.standard_normal() for s in range(5)},
    }
    fill(store, "one", values, metric="final/val_loss", direction="minimize", params={v: ENCODER10 for v in values})
    (c,) = [c for c in build(load_runs(store, "one")).caveats if c.kind == "chance"]
    mean = np.mean(list(values["stuck"].values()))
    assert c.variants == ("stuck",) and c.text.startswith(f"near chance on final/val_loss: stuck {mean:.3g}, ")
    assert "learns" not in c.text


# --- convergence -------------------------------------------------------------------------------------------


def test_the_fall_of_a_curve_over_its_last_steps_in_closed_form():
    # piecewise linear: at step 80 the curve is 1.2 + (0.9 - 1.2) * 5/25 = 1.14; it ends at 0.9
    curve = [(25, 2.0), (50, 1.5), (75, 1.2), (100, 0.9)]
    assert caveats.recent_ends(curve, 0.2) == pytest.approx((1.14, 0.9))
    assert caveats.recent_ends([(25, 1.0), (50, 0.6), (75, 0.5), (100, 0.5)], 0.2) == pytest.approx((0.5, 0.5))
    assert caveats.recent_ends([(100, 2.3)], 0.2) is None  # one validation: nothing to compare
    assert caveats.recent_ends([(90, 2.4), (100, 2.3)], 0.2) is None  # no point before the window
    # a straight training loss 2 - 0.01 step with alternating noise that a least-squares line averages out
    line = [(s, 2 - 0.01 * s + (0.05 if s % 2 else -0.05)) for s in range(0, 101)]
    slope = np.polyfit([s for s, _ in line if s >= 80], [v for s, v in line if s >= 80], 1)[0]
    start = slope * 80 + np.polyfit([s for s, _ in line if s >= 80], [v for s, v in line if s >= 80], 1)[1]
    assert caveats.trend_ends(line, 0.2) == pytest.approx((start, start + slope * 20))
    v0, v1 = caveats.trend_ends(line, 0.2)
    assert (v0 - v1) / v0 == pytest.approx(0.2 / 1.2, rel=0.05)


@pytest.mark.slow
def test_not_converged_fires_on_falling_curves_and_reads_the_training_loss_where_validation_is_sparse(store):
    values = {v: {s: 0.5 for s in range(5)} for v in ("flat", "falling", "sparse", "unjudged")}
    curves = {("falling", s): [(25, 2.0), (50, 1.5), (75, 1.2), (100, 0.9)] for s in range(5)}
    curves |= {(v, s): [(100, 0.5)] for v in ("sparse", "unjudged") for s in range(5)}  # validated once
    train = {("sparse", s): [(x, 2 - 0.01 * x) for x in range(0, 101, 5)] for s in range(5)}
    fill(
        store, "conv", values, metric="final/val_loss", direction="minimize", curves=curves, train_curves=train,
    )  # fmt: skip
    table = build(load_runs(store, "conv"))
    (c,) = [c for c in table.caveats if c.kind == "convergence"]
    assert c.variants == ("falling", "sparse")
    assert "falling: val/loss fell " in c.text and "sparse: train/loss fell 17% (mean of 5 seeds" in c.text
    assert any(n.startswith("not checked for convergence: unjudged") for n in table.notes)
    # the study's own window and threshold: over the last half, 'falling' fell about 40%, 'sparse' 33%
    loose = table.analysis.model_copy(update={"warn": Warn(converged_window=0.5, converged_fraction=0.6)})
    assert "convergence" not in kinds(build(load_runs(store, "conv"), analysis=loose))


# --- parameter counts -----------------------------------------------------------------------------------------


def test_param_ratio_by_its_definition():
    warn = Warn()
    over = caveats.param_ratio([("b vs a", "b", "a", 1501.0, 1000.0)], warn)
    assert over is not None and over.contrasts == ("b vs a",) and "b has 1.5x" in over.text
    assert caveats.param_ratio([("b vs a", "b", "a", 1500.0, 1000.0)], warn) is None  # "more than" 1.5x
    assert caveats.param_ratio([("b vs a", "b", "a", 1000.0, 2400.0)], warn).text.count("a has 2.4x") == 1
    assert caveats.param_ratio([("b vs a", "b", "a", math.nan, 1000.0)], warn) is None


def test_a_grid_axis_that_changes_the_size_is_named(store):
    """n_layers 4 has twice the parameters of n_layers 2: the rows that change it and its main effect are named;
    the norm axis (same size) is not."""
    values, settings, extra = {}, {}, {}
    for layers in ("2", "4"):
        for norm in ("pre", "post"):
            name = f"n_layers={layers} norm={norm}"
            settings[name] = {"model.n_layers": layers, "model.norm": norm}
            values[name] = {s: 0.5 + 0.01 * s for s in range(5)}
            extra |= {(name, s): {"cost/n_params": 1000.0 * int(layers) / 2} for s in range(5)}
    fill(
        store, "grid", values, kind="grid", settings=settings, metric="final/val_loss", direction="minimize",
        cost={"cost/wall_time_s": 1.0}, extra=extra,
    )  # fmt: skip
    table = build(load_runs(store, "grid"))
    (c,) = [c for c in table.caveats if c.kind == "params"]
    base = "n_layers=2 norm=pre"
    assert set(c.contrasts) == {
        f"n_layers=4 norm=pre vs {base}",
        f"n_layers=4 norm=post vs {base}",
        "model.n_layers: 4 vs 2",
    }
    assert "model.n_layers=4 has 2x the parameters of model.n_layers=2 (2,000 vs 1,000)" in c.text


# --- seeds ---------------------------------------------------------------------------------------------------


def test_few_seeds_for_the_intervals_printed():
    warn = Warn()
    rows = [("a", ("a",), 3), ("b", ("b",), 5), ("b vs a", ("b", "a"), 3)]
    c = caveats.few_seeds(rows, warn, "permutation")
    assert c is not None and c.variants == ("a", "b") and c.contrasts == ("b vs a",)
    assert "the intervals of a, b vs a rest on 3 seeds" in c.text and "t-test" not in c.text
    assert "so do the paired t-test's p-values" in caveats.few_seeds(rows, warn, "t").text
    assert caveats.few_seeds([("a", ("a",), 5), ("b vs a", ("b", "a"), 5)], warn, "permutation") is None
    assert caveats.few_seeds(rows, Warn(min_seeds=3), "permutation") is None


def contrast(n: int, shift: float = 0.05, seed: int = 0) -> stats.Contrast:
    rng = np.random.default_rng(seed)
    base = {s: float(rng.standard_normal()) for s in range(n)}
    return stats.paired_contrast(base, {s: v + shift + 0.01 * s for s, v in base.items()}, a="b", b="a", n_boot=99)


def measured_as(c: stats.Contrast, **changes) -> stats.Contrast:
    """The contrast with its measurement changed (a label, a margin), placed as it was."""
    return stats.Contrast(dataclasses.replace(c.measured, **changes), c.standing)


def test_a_family_its_seeds_cannot_resolve():
    """The exact test's smallest p is 2/2^n: 3 seeds (0.25) cannot pass Holm's first step 0.05/1; 6 can
    (0.031); 6 seeds with 2 contrasts cannot (0.031 > 0.025), 7 can (0.016). The t-test can reach any p."""
    assert caveats.unresolvable([contrast(3)], 0.05, "permutation") is not None
    assert caveats.unresolvable([contrast(6)], 0.05, "permutation") is None
    two = [contrast(6), contrast(6, seed=1)]
    c = caveats.unresolvable(two, 0.05, "permutation")
    assert c is not None and "(7 seeds can)" in c.text and f"{flips(np.arange(1, 7)):.3g}" in c.text
    assert caveats.unresolvable([contrast(7), contrast(7, seed=1)], 0.05, "permutation") is None
    assert caveats.unresolvable([contrast(3)], 0.05, "t") is None


def test_paired_contrasts_their_seeds_cannot_resolve_beside_contrasts_that_can():
    """A family of paired contrasts beside contrasts with many more seeds (16: their exact floor is 3e-5). Where
    those come out first, Holm's step for a pair rises (stats.holm_best_steps): with 4 of them and 4 pairs, a pair
    can face 0.05/4 at best, and then each pair rejected first lifts the others. 8 seeds (2/2^8 = 0.0078 <=
    0.0125) can resolve the pairs whatever the first step (0.05/8) says; 5 seeds (0.0625 > 0.05/4) cannot, and the
    caveat names the pairs only, with the step they could at best face."""
    effects = [measured_as(contrast(16, seed=9), label=f"effect {k}") for k in range(4)]
    eight = [measured_as(contrast(8, seed=s), label=f"pair {s}") for s in range(4)]
    assert caveats.unresolvable(eight + effects, 0.05, "permutation") is None
    pairs = [measured_as(contrast(5, seed=s), label=f"pair {s}") for s in range(4)]
    c = caveats.unresolvable(pairs + effects, 0.05, "permutation")
    assert c is not None and c.contrasts == tuple(p.label for p in pairs)
    assert f"smallest p is {2 / 2**5:.3g}, above 0.05/4, the largest step Holm can give it" in c.text
    assert "(8 seeds can" in c.text  # 2/2^8 <= 0.05/4 < 2/2^7
    assert not c.concerns("effect 0") and c.concerns(pairs[0].label)


# --- best ---------------------------------------------------------------------------------------------------


def pair(a: str, b: str, verdict: str, in_family: bool = True) -> stats.Contrast:
    """A contrast of 8 seeds whose corrected tests give ``verdict`` (lower is better)."""
    estimate = -0.1 if "better" in verdict else 0.1 if "worse" in verdict else 0.0
    margin = 1.0 if "equivalent" in verdict else None
    m = stats.Measured(
        label=f"{a} vs {b}", kind="pair", a=a, b=b, n=8, estimate=estimate, ci_t=stats.NAN2, p=0.01, method="exact",
        margin=margin,
    )  # fmt: skip
    p_holm = 0.01 if verdict.startswith("different") else 0.5
    corrected = stats.Corrected(alpha=0.05, p_holm=p_holm, p_tost_holm=0.01 if "equivalent" in verdict else stats.NAN)
    c = stats.Contrast(m, stats.Standing(in_family=in_family), corrected)
    assert c.verdict == verdict
    return c


def test_best_only_where_the_family_shows_it_better_than_every_other_variant():
    means = {"base": 0.5, "x": 0.4, "y": 0.45}  # lower is better: x has the best mean
    # the default family (each against the baseline) says nothing about x against y
    default = [pair("x", "base", "different (better)"), pair("y", "base", "different (better)")]
    b = caveats.best_variant(means, default, "minimize")
    assert b.variant is None and (b.leader, b.against, b.why) == ("x", "y", "no test of the pair in the family")
    # with x against y declared and resolved, x is best
    declared = default + [pair("y", "x", "different (worse)")]
    assert caveats.best_variant(means, declared, "minimize").variant == "x"
    # not resolved, or resolved the wrong way (a mean can lead while the test says otherwise), is not best
    b = caveats.best_variant(means, default + [pair("x", "y", "not resolved")], "minimize")
    assert b.variant is None and b.why == "not resolved"
    assert caveats.best_variant(means, default + [pair("x", "y", "different (worse)")], "minimize").variant is None
    # the baseline is best when every variant is different (worse) than it
    worse = [pair("x", "base", "different (worse)"), pair("y", "base", "different (worse), equivalent within ±1")]
    assert caveats.best_variant({"base": 0.9, "x": 0.5, "y": 0.6}, worse, "maximize").variant == "base"
    # ties and single variants have no best
    assert (
        caveats.best_variant({"a": 0.5, "b": 0.5}, [pair("a", "b", "different (better)")], "minimize").variant is None
    )
    assert caveats.best_variant({"a": 0.5}, [], "minimize").variant is None


def test_equivalence_its_seeds_cannot_show():
    """The exact two one-sided tests cannot go below 1/2^n (differences well inside the margin on every seed reach
    exactly that: the independent check below); Holm over the contrasts with a margin starts at 0.05/k. 5 seeds
    and 3 contrasts with a margin: 1/32 = 0.031 > 0.0167, so no equivalence whatever the data, 6 seeds can (0.0156).
    An untestable contrast with a margin stays in Holm's family (p 1, as ``correct`` counts it)."""
    for n in (4, 5, 6):  # the floor, from the test itself
        assert stats.tost_p(np.full(n, 0.001), margin=1.0) == pytest.approx(0.5**n)

    def margined(n: int, seed: int) -> stats.Contrast:
        return measured_as(contrast(n, seed=seed), label=f"c{seed}", margin=0.05)

    c = caveats.unshowable_equivalence([margined(5, s) for s in range(3)], 0.05, "permutation")
    assert c is not None and c.contrasts == ("c0", "c1", "c2")
    assert "smallest p is 0.0312, above Holm's first step 0.05/3" in c.text and "(6 seeds can)" in c.text
    assert caveats.unshowable_equivalence([margined(6, s) for s in range(3)], 0.05, "permutation") is None
    assert caveats.unshowable_equivalence([margined(5, 0)], 0.05, "permutation") is None  # 0.031 <= 0.05/1
    untestable = measured_as(margined(5, 1), label="u", n=0, method="untestable: no paired seed")
    c = caveats.unshowable_equivalence([margined(5, 0), untestable], 0.05, "permutation")  # 0.031 > 0.05/2
    assert c is not None and c.contrasts == ("c0",) and "Holm's first step 0.05/2" in c.text
    assert caveats.unshowable_equivalence([contrast(3)], 0.05, "permutation") is None  # no margin, no equivalence
    assert caveats.unshowable_equivalence([margined(3, 0)], 0.05, "t") is None  # the t form can reach any p
    effect = measured_as(margined(12, 9), label="effect")  # 12 seeds: 1/2^12, below 0.05/2
    # the contrast shown equivalent first lifts the pair's step to 0.05/1: 0.031 can pass it
    assert caveats.unshowable_equivalence([margined(5, 0), effect], 0.05, "permutation") is None


def test_the_warning_marks_of_a_contrast_are_in_their_order():
    from dashboards.compare import Change

    changes = [
        Change("x", "not resolved", "not resolved", 0.1, 0.2, ["a@1: one", "a@2: two"]),
        Change("y", "not resolved", "not resolved", 0.1, 0.2, ["a@2: three", "a@1: one"]),  # [3] met before [1]
    ]
    rows = format_changes("a@1", "a@2", "m", changes).splitlines()[1:3]
    assert rows[0].endswith("[1][2]") and rows[1].endswith("[1][3]"), rows


def test_a_conclusion_the_other_table_leaves_unresolved_is_not_called_refuted():
    """Issue 65: decoding_long said the 400-step result "does not hold" where the longer budget only failed to
    resolve it. compare says what the change is, no more: only opposite decisions reverse."""
    from dashboards.compare import Change

    how = lambda a, b: Change("x", a, b, 0.0, 0.0).how  # noqa: E731
    assert how("different (worse)", "not resolved") == "not resolved in the second (no refutation)"
    assert how("different (worse), equivalent within ±0.1", "not resolved; equivalence not testable here") == (
        "not resolved in the second (no refutation)"
    )
    assert how("not resolved", "different (better)") == "resolved in the second"
    assert how("different (better)", "different (worse); equivalence not testable here") == "REVERSED"
    assert how("not resolved", "not resolved") == "no" and how("untestable", "not resolved") == "YES"
    text = format_changes("long@1", "long@2", "m", [Change("x", "different (worse)", "not resolved", 0.1, 0.02)])
    assert "not resolved in the second (no refutation)" in text.splitlines()[1] and "only REVERSED" in text


def test_a_ratio_just_over_the_threshold_is_printed_over_it():
    """1.51 was printed "1.5x" under "differ by more than 1.5x": the warning contradicted itself."""
    c = caveats.param_ratio([("a vs b", "a", "b", 1510.0, 1000.0)], Warn())
    assert c is not None and "a has 1.51x the parameters of b" in c.text
    assert caveats.param_ratio([("a vs b", "a", "b", 1500.0, 1000.0)], Warn()) is None  # not more than 1.5


def test_a_report_warns_where_two_variants_are_one_model_family(store):
    """Luong's general (q W k) over projected q and k is dot with W folded into the query projection: a table that
    compares them measures over-parameterisation, and says so, from the runs' own params (as the dry run did before
    the runs). Over the states themselves (qk_projections false) the comparison is Luong's, and nothing is said."""
    rng = np.random.default_rng(11)
    base = {s: 1.0 + 0.01 * rng.standard_normal() for s in range(5)}
    values = {"dot": base, "general": {s: v + 0.01 for s, v in base.items()}}
    model = {"model.arch": "decoder", "model.d_model": "64", "model.qk_projections": "True"}
    params = {v: {**model, "model.score": v} for v in values}
    fill(store, "fam", values, metric="final/val_loss", direction="minimize", params=params)
    table = build(load_runs(store, "fam"))
    found = [c for c in table.caveats if c.kind == "family"]
    assert len(found) == 1 and found[0].variants == ("dot", "general") and found[0].concerns("general vs dot")
    assert "one bilinear family" in found[0].text and "qk_projections: false" in found[0].text
    assert "one bilinear family" in to_markdown(table)
    luong = {v: {**p, "model.qk_projections": "False"} for v, p in params.items()}
    fill(store, "luong", values, metric="final/val_loss", direction="minimize", params=luong)
    assert not [c for c in build(load_runs(store, "luong")).caveats if c.kind == "family"]


def test_a_report_warns_where_scores_are_compared_where_q_and_k_coincide(store):
    """In self-attention over the states themselves (qk_projections false) q and k are one tensor and a token scores
    itself |x|^2: a table that compares scores there says so, from the runs' own params (as the dry run did before
    the runs), concerning the contrasts between those variants. Luong's setting (an encoder_decoder's cross-attention
    scoring the source states themselves, cross_score with cross_qk_projections false) gets neither warning; the
    cross-attention's general against dot over projected q and k is dot reparameterised, and said so."""
    rng = np.random.default_rng(12)
    base = {s: 1.0 + 0.01 * rng.standard_normal() for s in range(5)}
    values = {v: {s: x + 0.01 * i for s, x in base.items()} for i, v in enumerate(("dot", "general", "additive"))}
    raw = {"model.arch": "decoder", "model.d_model": "64", "model.qk_projections": "False"}
    fill(store, "raw", values, metric="final/val_loss", direction="minimize", params={v: {**raw, "model.score": v} for v in values})  # fmt: skip
    table = build(load_runs(store, "raw"))
    found = [c for c in table.caveats if c.kind == "self_states"]
    assert len(found) == 1 and found[0].variants == ("dot", "general", "additive")
    assert found[0].concerns("general vs dot") and found[0].concerns("additive vs dot")
    assert "q and k are one tensor" in found[0].text and "model.cross_score" in found[0].text
    assert found[0].text in to_markdown(table) and not [c for c in table.caveats if c.kind == "family"]
    assert all("self_states" in r["warnings"].split("; ") for r in table.as_records())

    ed = {"model.arch": "encoder_decoder", "model.d_model": "64", "model.score": "dot", "model.qk_projections": "True"}
    luong = {v: {**ed, "model.cross_score": v, "model.cross_qk_projections": "False"} for v in values}
    fill(store, "luong_cross", values, metric="final/val_loss", direction="minimize", params=luong)
    assert not [c for c in build(load_runs(store, "luong_cross")).caveats if c.kind in ("family", "self_states")]
    projected = {v: {**ed, "model.cross_score": v, "model.cross_qk_projections": "True"} for v in values}
    fill(store, "projected_cross", values, metric="final/val_loss", direction="minimize", params=projected)
    (family,) = [c for c in build(load_runs(store, "projected_cross")).caveats if c.kind == "family"]
    assert family.variants == ("dot", "general") and "dot reparameterised" in family.text
