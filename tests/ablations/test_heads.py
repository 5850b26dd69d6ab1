"""Removing single heads at evaluation time (Michel et al. 2019) from weights kept in MLflow."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from ablations.heads import evaluate_heads, head_ablation, model_heads
from ablations.study import load_study
from ablations.sweep import run_study
from tests.conftest import ROOT


@pytest.mark.slow
def test_head_removal_equals_zeroing_its_output_projection(tmp_path, store):
    path = tmp_path / "mh.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "mh",
                "seeds": 2,
                "design": {"variants": [{"name": "trained", "set": {}}]},
                "base": {
                    "task": {"name": "reverse", "train_size": 300, "max_len": 5},
                    "model": {"d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32},
                    "training": {"max_steps": 40, "val_every": 20, "batch_size": 16},
                    "tracking": {"checkpoint": True},
                },
            }
        )
    )
    result = run_study(load_study(path), tracking_uri=store, num_cpus=2, out=lambda _: None)
    assert result.complete
    run_id = result.rows[0]["run_id"]
    full, without = evaluate_heads(run_id, store, "val/loss")
    modules = {m for m, _ in without}
    assert "layers.0.attn" in modules and len(without) == 2 * len(modules)  # every head of every module
    assert any(abs(v - full) > 1e-6 for v in without.values())  # heads matter

    # the oracle: removing head h is zeroing its columns of the output projection (no gates involved)
    from mlflow import MlflowClient

    from ablations.spec import resolve_run
    from models.lightning import LitTransformer
    from models.tasks import TaskDataModule

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
    heads = {(e.module, e.head): e for e in model_heads(run_id, seed, store, "val/loss").heads}
    assert set(heads) == set(without)
    for key, value in without.items():
        assert heads[key].change == pytest.approx(value - full, rel=1e-4, abs=1e-7)
        assert 0.0 <= heads[key].p <= heads[key].p_holm <= 1.0

    models, info = head_ablation(store, "mh")
    assert info["seeds"] == 2 and [m.seed for m in models] == [0, 1]
    assert all(len(m.heads) == len(without) and m.sequences > 0 for m in models)
    out = subprocess.run(
        [sys.executable, "-m", "ablations.cli", "heads", "mh", "--tracking-uri", store],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert out.returncode == 0 and "| layers.0.attn |" in out.stdout, out.stderr
    assert "significant (p < 0.01)" in out.stdout
    seeds = [line.split("|")[1].strip() for line in out.stdout.splitlines() if re.match(r"\| \d+ \| \d", line)]
    assert seeds == ["0", "1"]  # one row per trained model


def test_heads_without_checkpoints_is_a_clear_error(tmp_path, store):
    from tests.dashboards.test_report import three_variants

    three_variants(store)
    with pytest.raises(LookupError, match="checkpoint: true"):
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
    from ablations.heads import sequence_losses
    from ablations.spec import resolve_run
    from models.lightning import LitTransformer
    from models.tasks import TaskDataModule

    run = resolve_run({"task": task, "model": {"d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32}})
    data = TaskDataModule(run.task, 8, 0, 16)
    data.setup()
    torch.manual_seed(0)
    module = LitTransformer(run.model, run.training, run.task.kind).eval()
    nll, weight = sequence_losses(module, data.val_dataloader())
    assert len(nll) == len(data.rows["validation"]) and (weight >= 0).all()
    expected = module.evaluate(data.val_dataloader(), "val")["val/loss"]
    assert nll.sum() / weight.sum() == pytest.approx(expected, rel=1e-6)
