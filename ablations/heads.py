"""``ablate heads STUDY``: remove one attention head at a time at evaluation time (Michel et al. 2019, "Are
Sixteen Heads Really Better than One?") in every trained seed of a study, and report what each head costs.

Each finished cell's weights (``tracking: {checkpoint: true}``) and resolved configuration come back from
MLflow; the model is evaluated on a split with all heads, then with each single head's output gated to zero
(``Transformer.set_head_mask``).

As in the paper, a head's effect is judged within its own trained model: for a loss metric, the per-sequence
losses with and without the head are compared by a paired t-test over the split's sequences (p < 0.01, as the
paper; Holm-corrected within the model as well). Heads are not the same from seed to seed (head 2 of one
model has no counterpart in another), so seeds are summarised per module: its least and its most important
head, and how many of its heads matter. The tables are logged to the study's latest parent run as
``heads/heads.md`` and ``heads/heads.json``.
"""

from __future__ import annotations

import json
import math
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from ablations import tracking
from ablations.spec import resolve_run
from dashboards import stats
from dashboards.load import load_study

ALPHA = 0.01  # Michel et al.'s significance level


@dataclass
class HeadEffect:
    """One head of one trained model."""

    seed: int
    module: str
    head: int
    change: float  # the metric without this head minus with every head
    p: float  # paired t-test over the split's sequences (loss metrics), else nan
    p_holm: float = math.nan  # Holm-corrected over the model's heads


@dataclass
class ModelHeads:
    variant: str
    seed: int
    run_id: str
    full: float  # the metric with every head
    sequences: int
    heads: list[HeadEffect]


def _load(run_id: str, uri: str):
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
    module.eval()
    return run, data, module


def sequence_losses(module, loader) -> tuple[Any, Any]:
    """(summed negative log-likelihood, scored tokens) per sequence, in the loader's order; the split's loss is
    their ratio of sums (for classification, one 'token' per sequence)."""
    import torch
    import torch.nn.functional as F

    nll, weight = [], []
    with torch.no_grad():
        for batch in loader:
            logits, targets = module._inputs(batch)  # noqa: SLF001  (the module's own scoring)
            if targets.dim() == 1:  # classification: one label per sequence
                nll.append(F.cross_entropy(logits.float(), targets, reduction="none"))
                weight.append(torch.ones_like(nll[-1]))
                continue
            per_token = F.cross_entropy(
                logits.float().transpose(1, 2), targets, ignore_index=-100, reduction="none"
            )  # (B, T)
            nll.append(per_token.sum(1))
            weight.append((targets != -100).sum(1).float())
    return torch.cat(nll).double().numpy(), torch.cat(weight).double().numpy()


def evaluate_heads(run_id: str, uri: str, metric: str) -> tuple[float, dict[tuple[str, int], float]]:
    """(the metric with every head, {(module, head): the metric without that head}) for one trained run."""
    _, data, module = _load(run_id, uri)
    split, key = metric.split("/", 1)
    loader = data.val_dataloader() if split == "val" else data.loader(split)

    def score() -> float:
        return module.evaluate(loader, split)[f"{split}/{key}"]

    return _each_head(module, score)


def _each_head(module, score) -> tuple[Any, dict[tuple[str, int], Any]]:
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


def model_heads(run_id: str, seed: int, uri: str, metric: str, variant: str = "") -> ModelHeads:
    """Every head of one trained model: its effect on ``metric`` and, for a loss, its paired p-value."""
    from scipy import stats as sps

    split, key = metric.split("/", 1)
    if key != "loss":
        full, without = evaluate_heads(run_id, uri, metric)
        heads = [HeadEffect(seed, m, h, v - full, math.nan) for (m, h), v in without.items()]
        return ModelHeads(variant, seed, run_id, full, 0, heads)
    _, data, module = _load(run_id, uri)
    loader = data.val_dataloader() if split == "val" else data.loader(split)
    (nll, w), without = _each_head(module, lambda: sequence_losses(module, loader))
    full = float(nll.sum() / w.sum())
    scored = w > 0  # sequences with something scored (the others would enter the test as zeros)
    heads = []
    for (m, h), (nll_h, _) in without.items():
        d = (nll_h - nll)[scored]  # per sequence, paired
        p = float(sps.ttest_1samp(d, 0.0).pvalue) if d.std() > 0 else (1.0 if not d.any() else 0.0)
        heads.append(HeadEffect(seed, m, h, float(nll_h.sum() / w.sum()) - full, p))
    for e, q in zip(heads, stats.holm([e.p for e in heads])):
        e.p_holm = q
    return ModelHeads(variant, seed, run_id, full, int(scored.sum()), heads)


def head_ablation(uri: str, study: str, metric: str = "val/loss") -> tuple[list[ModelHeads], dict[str, Any]]:
    """Every head of every finished cell's model, by variant then seed."""
    runs = load_study(uri, study)
    done = runs.cells[runs.cells["state"] == "finished"]
    if not len(done):
        raise LookupError(f"study {study!r} has no finished cell to evaluate")
    order = {v: i for i, v in enumerate(runs.variants)}
    cells = sorted(zip(done["variant"], done["seed"], done["run_id"]), key=lambda c: (order.get(c[0], 0), int(c[1])))
    models = [model_heads(run_id, int(seed), uri, metric, variant) for variant, seed, run_id in cells]
    return models, {"study": study, "metric": metric, "seeds": len({m.seed for m in models})}


def _worse(metric: str) -> int:
    """+1 when a larger value is worse (losses), -1 when a smaller one is."""
    return 1 if metric.endswith(("loss", "perplexity", "ppl", "bits")) else -1


def format_heads(models: list[ModelHeads], info: dict[str, Any]) -> str:
    """Markdown: per model, the significant heads; per module, the least and most important head over seeds.
    Models of different variants (other architectures, say) are reported apart."""
    variants = list(dict.fromkeys(m.variant for m in models))
    parts = []
    for variant in variants:
        mine = [m for m in models if m.variant == variant]
        title = f"{info['study']}" + (f", variant {variant}" if len(variants) > 1 else "")
        parts.append(_format_variant(title, mine, info["metric"]))
    return "\n".join(parts)


def _format_variant(title: str, models: list[ModelHeads], metric: str) -> str:
    sign = _worse(metric)
    tested = any(math.isfinite(e.p) for m in models for e in m.heads)
    lines = [
        f"{title}: {metric}, {len(models)} trained seed(s), {len(models[0].heads)} heads each; each head removed "
        "alone at evaluation time.",
        "",
    ]
    if tested:
        lines += [
            f"Per model: the heads whose removal changes {metric} significantly (paired t-test over the "
            f"{models[0].sequences} scored sequences of the split, p < {ALPHA} as in Michel et al., and after Holm's "
            "correction over the model's heads), and how many of those help when removed.",
            "",
            f"| seed | {metric} with every head | significant (p < {ALPHA}) | after Holm | of which better without |"
            " largest harm | largest gain |",
            "|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for m in models:
            sig = [e for e in m.heads if e.p < ALPHA]
            holm = [e for e in m.heads if e.p_holm < ALPHA]
            better = [e for e in sig if sign * e.change < 0]
            harm = max(m.heads, key=lambda e: sign * e.change)
            gain = min(m.heads, key=lambda e: sign * e.change)
            gained = f"{gain.change:+.3g} ({gain.module}[{gain.head}])" if sign * gain.change < 0 else "none"
            lines.append(
                f"| {m.seed} | {m.full:.4g} | {len(sig)}/{len(m.heads)} | {len(holm)} | {len(better)} | "
                f"{harm.change:+.3g} ({harm.module}[{harm.head}]) | {gained} |"
            )
        lines.append("")
    lines += [
        "Per module, over seeds (a module's heads differ from seed to seed, so each seed's least and most "
        "important head of the module are taken): mean over seeds with the 95% t interval"
        + (f", and the module's heads with p < {ALPHA} in each seed." if tested else "."),
        "",
        "| module | least important head | most important head |"
        + (f" heads with p < {ALPHA}, per seed |" if tested else ""),
        "|---|---:|---:|" + ("---|" if tested else ""),
    ]
    rows = []
    for module in dict.fromkeys(e.module for e in models[0].heads):
        least, most, sig = [], [], []
        for m in models:
            harms = [sign * e.change for e in m.heads if e.module == module]
            least.append(sign * min(harms))
            most.append(sign * max(harms))
            sig.append(f"{sum(e.p < ALPHA for e in m.heads if e.module == module)}/{len(harms)}")
        rows.append((module, stats.describe(least), stats.describe(most), sig))
    rows.sort(key=lambda r: -sign * r[2].mean)
    for module, least, most, sig in rows:
        lines.append(f"| {module} | {_pm(least)} | {_pm(most)} |" + (f" {', '.join(sig)} |" if tested else ""))
    return "\n".join(lines) + "\n"


def _pm(s: stats.Summary) -> str:
    if s.n < 2 or not math.isfinite(s.ci_t[0]):
        return f"{s.mean:+.3g}"
    return f"{s.mean:+.3g} [{s.ci_t[0]:+.3g}, {s.ci_t[1]:+.3g}]"


def heads_json(models: list[ModelHeads]) -> str:
    rows = [
        {**{k: v for k, v in asdict(m).items() if k != "heads"}, "heads": [asdict(e) for e in m.heads]} for m in models
    ]
    return json.dumps(rows, indent=1)


def log_heads(uri: str, study: str, text: str, models: list[ModelHeads]) -> str | None:
    runs = load_study(uri, study)
    parent = runs.latest_parent
    if parent is None:
        return None
    c = tracking.client(uri)
    c.log_text(parent.info.run_id, text, "heads/heads.md")
    c.log_text(parent.info.run_id, heads_json(models), "heads/heads.json")
    return parent.info.run_id
