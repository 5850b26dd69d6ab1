"""``ablate heads STUDY``: remove one attention head at a time at evaluation time (Michel et al. 2019, "Are
Sixteen Heads Really Better than One?") in every trained seed of a study, and report what each head costs.

Each finished cell's weights (``tracking: {checkpoint: true}``) and resolved configuration come back from
MLflow; the model is evaluated on the validation split with all heads, then with each single head's output
gated to zero (``Transformer.set_head_mask``). The drop of the metric per head is summarised over seeds
(mean, 95% t interval), the heads sorted by how much removing them hurts. The table is logged to the
study's latest parent run as ``heads/heads.md`` and ``heads/heads.json``.
"""

from __future__ import annotations

import json
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ablations import tracking
from ablations.spec import resolve_run
from dashboards import stats
from dashboards.load import load_study


@dataclass
class HeadEffect:
    module: str
    head: int
    drop: stats.Summary  # metric with the head removed minus with every head, over seeds


def evaluate_heads(run_id: str, uri: str, metric: str) -> tuple[float, dict[tuple[str, int], float]]:
    """(the metric with every head, {(module, head): the metric without that head}) for one trained run."""
    import torch

    from models.lightning import LitTransformer
    from models.tasks import TaskDataModule

    c = tracking.client(uri)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            config = yaml.safe_load(Path(c.download_artifacts(run_id, "config.yaml", tmp)).read_text())
            weights = c.download_artifacts(run_id, "checkpoint/model.pt", tmp)
        except Exception as err:
            raise LookupError(
                f"run {run_id} kept no weights (checkpoint/model.pt and config.yaml): train the study "
                "with `tracking: {checkpoint: true}` in its base run"
            ) from err
        state = torch.load(weights, map_location="cpu", weights_only=True)
    run = resolve_run(config, f"run {run_id}")
    data = TaskDataModule(run.task, run.training.batch_size, run.seed, run.training.eval_batch_size)
    data.setup()
    module = LitTransformer(run.model, run.training, run.task.kind)
    module.model.load_state_dict(state)
    split, key = metric.split("/", 1)
    loader = data.val_dataloader() if split == "val" else data.loader(split)

    def score() -> float:
        with torch.no_grad():
            return module.evaluate(loader, split)[f"{split}/{key}"]

    full = score()
    out = {}
    for name, attn in module.model.attention_modules():
        for h in range(attn.n_heads):
            gates = [1.0] * attn.n_heads
            gates[h] = 0.0
            module.model.set_head_mask({name: gates})
            out[(name, h)] = score()
        module.model.set_head_mask(None)
    return full, out


def head_ablation(uri: str, study: str, metric: str = "val/loss") -> tuple[list[HeadEffect], dict[str, Any]]:
    runs = load_study(uri, study)
    done = runs.cells[runs.cells["state"] == "finished"]
    if not len(done):
        raise LookupError(f"study {study!r} has no finished cell to evaluate")
    drops: dict[tuple[str, int], list[float]] = {}
    fulls = []
    for run_id in done["run_id"]:
        full, without = evaluate_heads(run_id, uri, metric)
        fulls.append(full)
        for k, v in without.items():
            drops.setdefault(k, []).append(v - full)
    effects = [HeadEffect(m, h, stats.describe(v)) for (m, h), v in drops.items()]
    worse_is_higher = metric.endswith(("loss", "perplexity", "bits_per_token"))
    effects.sort(key=lambda e: -e.drop.mean if worse_is_higher else e.drop.mean)
    return effects, {"study": study, "metric": metric, "seeds": len(fulls), "with_all_heads": stats.describe(fulls)}


def format_heads(effects: list[HeadEffect], info: dict[str, Any]) -> str:
    full = info["with_all_heads"]
    lines = [
        f"{info['study']}: {info['metric']} with every head {full.mean:.4g} (over {info['seeds']} seeds); "
        "the change when one head is removed, mean over seeds with 95% t interval",
        "",
        "| module | head | change | 95% CI |",
        "|---|---:|---:|---:|",
    ]
    for e in effects:
        ci = "–" if not math.isfinite(e.drop.ci_t[0]) else f"[{e.drop.ci_t[0]:+.3g}, {e.drop.ci_t[1]:+.3g}]"
        lines.append(f"| {e.module} | {e.head} | {e.drop.mean:+.4g} | {ci} |")
    return "\n".join(lines) + "\n"


def log_heads(uri: str, study: str, text: str, effects: list[HeadEffect]) -> str | None:
    runs = load_study(uri, study)
    parent = runs.latest_parent
    if parent is None:
        return None
    c = tracking.client(uri)
    c.log_text(parent.info.run_id, text, "heads/heads.md")
    rows = [
        {
            "module": e.module,
            "head": e.head,
            "mean": e.drop.mean,
            "ci_low": e.drop.ci_t[0],
            "ci_high": e.drop.ci_t[1],
            "n": e.drop.n,
        }
        for e in effects
    ]
    c.log_text(parent.info.run_id, json.dumps(rows, indent=1), "heads/heads.json")
    return parent.info.run_id
