"""Removing single heads at evaluation time (Michel et al. 2019) from weights kept in MLflow."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch
import yaml

from ablations.evaluate import evaluate_heads, head_scores
from ablations.sweep import run_study
from dashboards.heads import head_ablation, model_heads
from record.spec import load_study


@pytest.mark.slow
def test_head_removal_equals_zeroing_its_output_projection(tmp_path, store, local_ray, capsys):
    path = tmp_path / "mh.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "mh",
                "seeds": 2,
                "design": {"variants": [{"name": "trained", "set": {}}]},
                "base": {
                    "task": {"name": "reverse", "train_size": 300, "max_len": 5, "val_size": 120, "test_size": 120},
                    "model": {"d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32},
                    "training": {"max_steps": 40, "val_every": 20, "batch_size": 16},
                    "tracking": {"checkpoint": True},
                },
            }
        )
    )
    # one trial at a time: Tune gives both cells one actor, which imports torch and Lightning once
    result = run_study(load_study(path), tracking_uri=store, num_cpus=2, max_concurrent=1, out=lambda _: None)
    assert result.complete
    run_id = result.rows[0]["run_id"]
    full, without = evaluate_heads(run_id, store, "val/loss")
    modules = {m for m, _ in without}
    assert "layers.0.attn" in modules and len(without) == 2 * len(modules)  # every head of every module
    assert any(abs(v - full) > 1e-6 for v in without.values())  # heads matter

    # the oracle: removing head h is zeroing its columns of the output projection (no gates involved)
    from mlflow import MlflowClient

    from models.lightning import LitTransformer
    from models.tasks import TaskDataModule
    from record.spec import resolve_run

    c = MlflowClient(store)
    config = yaml.safe_load(Path(c.download_artifacts(run_id, "config.yaml", str(tmp_path))).read_text())
    state = torch.load(c.download_artifacts(run_id, "checkpoint/model.pt", str(tmp_path)), weights_only=True)
    run = resolve_run(config)
    data = TaskDataModule(run.task, run.training.batch_size, run.seed, run.training.eval_batch_size)
    data.setup()
    module = LitTransformer(run.model, run.training, run.task.kind)
    module.model.load_state_dict(state)
    attn = dict(module.model.attention_modules())["layers.0.attn"]
    with torch.no_grad():
        attn.out_proj.weight[:, attn.head_dim : 2 * attn.head_dim] = 0  # head 1 of layers.0.attn
        expected = module.evaluate(data.val_dataloader(), "val")["val/loss"]
    assert without[("layers.0.attn", 1)] == pytest.approx(expected, rel=1e-5)

    # per-sequence losses (for the paired test) add up to the module's own validation loss, head by head
    seed = int(result.rows[0]["seed"])
    heads = {(e.module, e.head): e for e in model_heads(head_scores(run_id, store, "val/loss"), "", seed, run_id).heads}
    assert set(heads) == set(without)
    for key, value in without.items():
        assert heads[key].change == pytest.approx(value - full, rel=1e-4, abs=1e-7)
        assert 0.0 <= heads[key].p <= heads[key].p_holm <= 1.0

    # the command's entry point, in this process (its own process cost about 10 CPU-seconds of imports here)
    from ablate.main import main

    code = main(["heads", "mh", "--tracking-uri", store, "--prune", "test/loss", "--out", str(tmp_path / "out")])
    out = capsys.readouterr()
    assert code == 0 and "| layers.0.attn |" in out.out, out.err
    assert "matter (Holm p ≤ 0.01)" in out.out  # issue 14: counted after Holm only (was raw p < 0.01)
    seeds = [line.split("|")[1].strip() for line in out.out.splitlines() if re.match(r"\| \d+ \| \d", line)]
    assert seeds == ["0", "1"]  # one row per trained model
    # what the command measured (head_ablation), as it wrote it: every head of both trained models
    import json

    models = json.loads((tmp_path / "out" / "heads.json").read_text())
    assert [m["seed"] for m in models] == [0, 1]
    assert all(len(m["heads"]) == len(without) and m["sequences"] > 0 for m in models)

    # --prune (Michel et al. section 4 and Table 2): the curves start at the model with every head, in both orders
    pruned = json.loads((tmp_path / "out" / "pruning.json").read_text())
    assert [m["seed"] for m in pruned] == [0, 1] and all(m["heads"] == 6 for m in pruned)  # enc self, dec self, cross
    test_loss = {
        r.info.run_id: r.data.metrics["test/loss"]
        for r in c.search_runs([c.get_experiment_by_name("mh").experiment_id])
        if "test/loss" in r.data.metrics
    }
    for m in pruned:
        assert m["fractions"][:2] == [0.0, 0.1] and len(m["by_importance"]) == len(m["at_random"]) == 10
        assert (
            m["by_importance"][0] == pytest.approx(m["at_random"][0]) == pytest.approx(test_loss[m["run_id"]], rel=1e-5)
        )
        assert set(m["one_head"]) == {"layers.0.attn", "dec_layers.0.attn", "dec_layers.0.cross"}
    assert "| 50% |" in out.out and "One head per module" in out.out
    assert "**Too few seeds:** with 2 seeds the exact test's smallest p is 0.5" in out.out
    parent = c.search_runs([c.get_experiment_by_name("mh").experiment_id], "tags.kind = 'study'")[0]
    logged = {a.path for a in c.list_artifacts(parent.info.run_id, "heads")}
    assert {"heads/pruning.md", "heads/pruning.json", "heads/pruning.png"} <= logged
    # issue 72: the running side recorded what it measured with each cell's run, once; comparing read it from there
    from ablations.evaluate import evaluate_study_heads
    from ablations.pruning import evaluate_study_pruning

    for m in models:
        held = {a.path for a in c.list_artifacts(m["run_id"], "evaluation")}
        assert held == {"evaluation/heads-val_loss.json", "evaluation/pruning-test_loss.json"}
    assert evaluate_study_heads(store, "mh", "val/loss") == 0 == evaluate_study_pruning(store, "mh", "test/loss")
    # an evaluation recorded by other code (the evaluation fixed since, say) is made again
    from record import evaluations

    held = evaluations.recorded(store, models[0]["run_id"], "heads", "val/loss")
    evaluations.record(store, models[0]["run_id"], "heads", "val/loss", held, code="other code")
    assert evaluate_study_heads(store, "mh", "val/loss") == 1

    # the options are judged before any model is evaluated, with the names the runs evaluate
    from ablations.evaluate import check_options

    check_options(store, "mh", "val/loss", "test/exact_match")  # what the runs evaluate: fine
    for metric, prune, said in [
        ("test/exact_matc", None, "--metric test/exact_matc: 'test/exact_matc' is not a metric these runs evaluate; "
         "did you mean test/exact_match?"),
        ("val/loss", "test/los", "--prune test/los: 'test/los' is not a metric these runs evaluate; did you mean "
         "test/loss?"),
        ("val/loss", "val/loss", "--prune val/loss: pruning chooses its heads on the validation split: measure on "
         "another (test/"),
    ]:  # fmt: skip
        with pytest.raises(ValueError) as info:
            check_options(store, "mh", metric, prune)
        assert str(info.value).startswith(said), info.value


def test_heads_without_checkpoints_is_a_clear_error(tmp_path, store):
    from ablations.evaluate import evaluate_study_heads
    from tests.dashboards.test_report import three_variants

    three_variants(store)
    with pytest.raises(LookupError, match="checkpoint: true"):
        evaluate_study_heads(store, "abl", "val/loss")
    with pytest.raises(LookupError, match="`ablate heads abl` evaluates it"):  # nothing recorded to compare
        head_ablation(store, "abl")


@pytest.mark.parametrize(
    "task",
    [
        {"name": "recall", "train_size": 64, "pairs": 4, "queries": 2},  # a decoder scored on the answers only
        {"name": "listops", "train_size": 64, "max_len": 24},  # an encoder classifying sequences
        {"name": "reverse", "train_size": 64, "max_len": 5},  # an encoder-decoder
    ],
)
def test_per_sequence_losses_add_up_to_the_modules_own_loss(task):
    """The paired test of ``ablate heads`` compares per-sequence losses; summed, they are the split's loss as
    the module computes it (masks, padding and classification included)."""
    from ablations.evaluate import sequence_losses
    from models.lightning import LitTransformer
    from models.tasks import TaskDataModule
    from record.spec import resolve_run

    run = resolve_run({"task": task, "model": {"d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32}})
    data = TaskDataModule(run.task, 8, 0, 16)
    data.setup()
    torch.manual_seed(0)
    module = LitTransformer(run.model, run.training, run.task.kind).eval()
    nll, weight = sequence_losses(module, data.val_dataloader())
    assert len(nll) == len(data.rows["validation"]) and (weight >= 0).all()
    expected = module.evaluate(data.val_dataloader(), "val")["val/loss"]
    assert nll.sum() / weight.sum() == pytest.approx(expected, rel=1e-6)


def flips(d) -> float:
    """The two-sided sign-flip p-value by enumerating all 2^n sign patterns."""
    import itertools

    import numpy as np

    d = np.asarray(d, dtype=float)
    means = np.array([np.mean(d * np.array(s)) for s in itertools.product([1, -1], repeat=len(d))])
    tol = 1e-12 * max(1.0, abs(d.mean()))
    return float(min(1.0, 2 * min(np.mean(means >= d.mean() - tol), np.mean(means <= d.mean() + tol))))


def test_heads_are_judged_by_the_shared_tests_and_corrections():
    """Issue 14: ``ablate heads`` gave a constant difference p = 0 and counted 'better without' at the raw
    p < 0.01. Now each head gets every table's paired test (record.stats.paired_p) and Holm's correction
    over the model's heads (statsmodels), and only corrected results are counted."""
    import numpy as np
    from statsmodels.stats.multitest import multipletests

    from dashboards.heads import judge_heads

    nll = np.array([2.0, 3.0, 1.0, 4.0, 2.5, 9.0])  # per-sequence summed losses with every head
    weight = np.array([4.0, 5.0, 2.0, 6.0, 5.0, 0.0])  # the last sequence has nothing scored: left out
    without = {
        ("enc.attn", 0): nll + np.array([0.5, 0.7, 0.2, 0.9, 0.6, 0.0]),  # matters in every sequence
        ("enc.attn", 1): nll + 0.1,  # a constant difference: the exact test, not p = 0
        ("enc.attn", 2): nll.copy(),  # does nothing: p = 1
        ("enc.attn", 3): nll + np.array([-0.3, 0.1, -0.2, 0.05, -0.1, 0.0]),  # mixed
    }
    full, sequences, heads = judge_heads(nll, weight, without, seed=0)
    assert sequences == 5 and full == pytest.approx(nll.sum() / weight.sum())
    by = {e.head: e for e in heads}
    for h, e in by.items():
        d = (without[("enc.attn", h)] - nll)[:5]
        assert e.p == pytest.approx(flips(d)) and "exact" in e.method
        assert e.change == pytest.approx(without[("enc.attn", h)].sum() / weight.sum() - full)
    assert by[1].p == pytest.approx(2 / 2**5) and by[2].p == 1.0
    assert [e.p_holm for e in heads] == pytest.approx(list(multipletests([e.p for e in heads], method="holm")[1]))
    assert all(e.verdict == "not resolved" for e in heads)  # 5 sequences: 2/32 > 0.01 whatever happens


def test_better_without_is_counted_after_holm_only():
    import numpy as np

    from dashboards.heads import ModelHeads, format_heads, judge_heads

    rng = np.random.default_rng(0)
    n = 400
    nll = rng.uniform(1.0, 2.0, n)
    weight = np.ones(n)

    def noise() -> np.ndarray:  # mean exactly 0, sd exactly 0.05
        e = rng.normal(0.0, 1.0, n)
        return (e - e.mean()) / e.std(ddof=1) * 0.05

    without = {("dec.attn", h): nll + noise() for h in range(20)}  # 20 heads that do nothing on average
    without[("dec.attn", 0)] = nll + 0.2 + noise()  # removing it hurts
    # removing it helps a little: t = 2.82, raw p = 0.005, but 19 x 0.005 after Holm
    without[("dec.attn", 1)] = nll - 2.82 * 0.05 / math.sqrt(n) + noise()
    _, sequences, heads = judge_heads(nll, weight, without, seed=0, test="t")
    by = {e.head: e for e in heads}
    assert by[1].p < 0.01 < by[1].p_holm and by[1].verdict == "not resolved"
    assert by[0].verdict == "different (worse without)"
    text = format_heads([ModelHeads("", 0, "r", 1.5, sequences, heads)], {"study": "s", "metric": "val/loss"})
    row = next(line for line in text.splitlines() if line.startswith("| 0 |"))
    matter = sum(e.p_holm <= 0.01 for e in heads)
    assert f"| {matter}/20 | 0 |" in row  # no head counted as better without: head 1 is not significant after Holm
    assert "paired t-test" in text and "matter (Holm p ≤ 0.01)" in text


def test_head_importance_is_each_sequences_own_gradient_and_zero_for_a_silent_head():
    """Michel et al. (2019), eq. 2: I_h = E_x |dL(x)/d xi_h|, normalised within each module. Recomputed here one
    sequence at a time with a plain (H,) gate; and the property pruning relies on: a head whose output never
    reaches the model (its columns of the output projection zeroed) has importance 0, so it goes first."""
    import torch.nn.functional as F

    from ablations.pruning import head_importance
    from models.lightning import LitTransformer
    from models.tasks import TaskDataModule
    from record.spec import resolve_run

    run = resolve_run(
        {
            "task": {"name": "reverse", "train_size": 32, "val_size": 24, "max_len": 5},
            "model": {"d_model": 16, "n_heads": 4, "n_layers": 1, "d_ff": 32},
        }
    )
    data = TaskDataModule(run.task, 8, 0, 8)
    data.setup()
    torch.manual_seed(0)
    module = LitTransformer(run.model, run.training, run.task.kind).eval()
    attn = dict(module.model.attention_modules())["dec_layers.0.cross"]
    with torch.no_grad():
        attn.out_proj.weight[:, 2 * attn.head_dim : 3 * attn.head_dim] = 0  # head 2 of the cross-attention is silent
    got = head_importance(module, data.val_dataloader(), removed={("layers.0.attn", 1)})

    sums = {name: torch.zeros(a.n_heads, dtype=torch.float64) for name, a in module.model.attention_modules()}
    n = 0
    for batch in data.val_dataloader():
        for i in range(batch["src"].shape[0]):
            one = {k: v[i : i + 1] for k, v in batch.items()}
            gates = {name: torch.ones(a.n_heads, requires_grad=True) for name, a in module.model.attention_modules()}
            with torch.no_grad():
                gates["layers.0.attn"][1] = 0.0  # removed
            module.model.set_head_mask(gates)
            logits, targets = module.scored_logits(one)
            loss = F.cross_entropy(logits[0].float(), targets[0], ignore_index=-100)
            for name, g in zip(gates, torch.autograd.grad(loss, list(gates.values()))):
                sums[name] += g.abs().double()
            n += 1
    module.model.set_head_mask(None)
    for name, total in sums.items():
        mean = total / n
        for h, v in enumerate(mean / mean.norm()):
            assert got[(name, h)] == pytest.approx(float(v), rel=1e-4, abs=1e-9)
    assert got[("dec_layers.0.cross", 2)] == 0.0
    assert min(got, key=got.get) in {("dec_layers.0.cross", 2), ("layers.0.attn", 1)}


@pytest.mark.parametrize("seeds", [3, 9])
def test_the_pruning_table_says_when_its_seeds_cannot_resolve_any_fraction(seeds):
    """Holm over the 9 fractions that remove heads: the first step is 0.05/9, and the exact sign-flip test over n
    seeds cannot go below 2/2^n (0.25 at 3 seeds, 0.0039 at 9). Below that, every row reads "not resolved" whatever
    the data, even beside an interval that excludes 0: the table says so, and how many seeds can."""
    from ablations.pruning import FRACTIONS
    from dashboards.pruning import format_pruning
    from record.evaluations import ModelPruning

    models = [
        ModelPruning(
            variant="",
            seed=s,
            run_id=f"r{s}",
            heads=6,
            fractions=list(FRACTIONS),
            by_importance=[1.0 + f for f in FRACTIONS],
            at_random=[1.0 + 1.5 * f + 0.001 * s for f in FRACTIONS],  # importance better on every seed
            one_head={"layers.0.attn": 0.1},
            one_head_kept={"layers.0.attn": s % 2},
        )
        for s in range(seeds)
    ]
    text = format_pruning(models, {"study": "s", "metric": "test/loss", "test": "permutation"})
    smallest = 2 / 2**seeds
    assert (smallest > 0.05 / 9) == (seeds == 3)  # the independent arithmetic
    warning = (
        f"**Too few seeds:** with {seeds} seeds the exact test's smallest p is {smallest:.3g}, above Holm's first "
        "step 0.05/9: no fraction can come out different whatever the data; at least 9 seeds can"
    )
    assert (warning in text) == (seeds == 3), text
    assert ("different (importance better)" in text) == (seeds == 9)  # nine seeds do resolve it
    assert "| the head kept (its index), per seed |" in text
