"""``ablate heads STUDY --prune``: Michel et al. (2019), "Are Sixteen Heads Really Better than One?", beyond one
head at a time, in every trained seed of a study.

- **Pruning curves** (section 4, Figure 3). Heads are removed 10% at a time (of all the model's attention heads,
  every module together), in order of increasing importance

      I_h = E_x | dL(x) / d xi_h |

  where xi_h gates head h's output and L(x) is the loss of one sequence (Michel's eq. 2, after Molchanov et al.
  2017), normalised by its l2 norm within each module as the paper does. Importance is estimated on the
  validation split with the heads removed so far, and estimated again before every step (iterative pruning). The
  same model is also pruned in random orders, the baseline a pruning order must beat. The metric is measured on
  the test split, which never chooses a head.
- **One head per module** (Table 2). Each module in turn keeps one of its heads and loses the others (every other
  module whole). The head kept is the best one on the validation split; its change of the metric is measured
  on the test split.

Seeds are summarised as every table does (record/stats.py): at each pruned fraction the importance order is
compared with the random orders by the study's paired test over seeds (the sign-flip permutation test by default,
``analysis.test``), with Holm's correction over the fractions.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dashboards.heads import each_model, load_trained, trained_cells
from record import stats
from record.runs import load_runs

FRACTIONS = tuple(round(0.1 * i, 1) for i in range(10))  # 0%, 10%, ..., 90% of the heads removed
RANDOM_ORDERS = 5
ALPHA = 0.05  # the level of the pruning curves' tests, Holm over the fractions


@dataclass(kw_only=True)
class ModelPruning:
    """One trained model: its pruning curves and its one-head-per-module changes."""

    variant: str
    seed: int
    run_id: str
    heads: int  # attention heads of the model
    fractions: list[float]
    by_importance: list[float]  # the metric after removing each fraction of heads, least important first
    at_random: list[float]  # the same, averaged over RANDOM_ORDERS random orders
    random_orders: list[list[float]] = field(default_factory=list)
    one_head: dict[str, float] = field(default_factory=dict)  # module -> change with only its best head kept
    one_head_kept: dict[str, int] = field(default_factory=dict)  # module -> the head kept (chosen on validation)
    full: float = math.nan  # the metric with every head


def _all_heads(model) -> list[tuple[str, int]]:
    return [(name, h) for name, attn in model.attention_modules() for h in range(attn.n_heads)]


def _gates(model, removed: set[tuple[str, int]]) -> dict[str, list[float]]:
    return {
        name: [0.0 if (name, h) in removed else 1.0 for h in range(a.n_heads)] for name, a in model.attention_modules()
    }


def head_importance(module, loader, removed: set[tuple[str, int]]) -> dict[tuple[str, int], float]:
    """Michel et al.'s I_h over the loader's sequences (heads in ``removed`` gated off), normalised by the l2 norm
    within each module. One gate per sequence and head (``Transformer.set_head_mask`` with (B, H) tensors), so one
    backward pass gives every sequence's own dL(x)/d xi_h."""
    import torch
    import torch.nn.functional as F

    model = module.model
    base = _gates(model, removed)
    sums = {name: torch.zeros(len(g), dtype=torch.float64) for name, g in base.items()}
    count = 0
    was_training = module.training
    module.eval()
    try:
        for batch in loader:
            rows = next(iter(batch.values())).shape[0]
            gates = {
                name: torch.tensor(g, dtype=torch.float32).repeat(rows, 1).requires_grad_(True)
                for name, g in base.items()
            }
            model.set_head_mask(gates)
            logits, targets = module.scored_logits(batch)
            if targets.dim() == 1:  # classification: one loss per sequence
                per_seq = F.cross_entropy(logits.float(), targets, reduction="none")
            else:
                tok = F.cross_entropy(logits.float().transpose(1, 2), targets, ignore_index=-100, reduction="none")
                per_seq = tok.sum(1) / (targets != -100).sum(1).clamp(min=1)
            grads = torch.autograd.grad(per_seq.sum(), list(gates.values()))
            for name, g in zip(gates, grads):
                sums[name] += g.abs().sum(0).double()
            count += rows
    finally:
        model.set_head_mask(None)
        module.train(was_training)
    out = {}
    for name, total in sums.items():
        mean = total / max(count, 1)
        norm = float(mean.norm()) or 1.0
        out.update({(name, h): float(v) / norm for h, v in enumerate(mean)})
    return out


def _score(module, loader, split: str, key: str, removed: set[tuple[str, int]]) -> float:
    """The metric with the heads in ``removed`` gated off; sequences are decoded only for exact match."""
    module.model.set_head_mask(_gates(module.model, removed))
    try:
        return module.evaluate(loader, split, decode_batches=None if key == "exact_match" else 0)[f"{split}/{key}"]
    finally:
        module.model.set_head_mask(None)


def prune_model(
    run_id: str, seed: int, uri: str, metric: str, variant: str = "", *, orders: int = RANDOM_ORDERS
) -> ModelPruning:
    """The pruning curves and one-head-per-module changes of one trained model; ``metric`` is measured on its
    split (test/loss, say), importance and the head kept per module are chosen on validation."""
    split, key = metric.split("/", 1)
    if split in ("val", "validation"):
        raise ValueError(
            f"{metric}: pruning chooses heads on the validation split, so measure on another one "
            "(test/loss, test/exact_match, ...)"
        )
    _, data, module = load_trained(run_id, uri)
    val, test = data.val_dataloader(), data.loader(split)
    model = module.model
    heads = _all_heads(model)
    targets = [round(f * len(heads)) for f in FRACTIONS]

    removed: set[tuple[str, int]] = set()
    by_importance = []
    for target in targets:
        if target > len(removed):
            importance = head_importance(module, val, removed)
            order = sorted((h for h in heads if h not in removed), key=lambda h: importance[h])
            removed |= set(order[: target - len(removed)])
        by_importance.append(_score(module, test, split, key, removed))

    rng = random.Random(seed)
    random_orders = []
    for _ in range(orders):
        order = heads[:]
        rng.shuffle(order)
        random_orders.append([_score(module, test, split, key, set(order[:t])) for t in targets])
    at_random = [sum(c[i] for c in random_orders) / len(random_orders) for i in range(len(targets))]

    full = by_importance[0]
    one_head, kept = {}, {}
    better = min if _lower_is_better(metric) else max
    for name, attn in model.attention_modules():
        others = [(name, h) for h in range(attn.n_heads)]
        if len(others) < 2:
            continue
        on_val = {h: _score(module, val, "val", key, set(others) - {(name, h)}) for h in range(attn.n_heads)}
        best = better(on_val, key=on_val.get)
        kept[name] = best
        one_head[name] = _score(module, test, split, key, set(others) - {(name, best)}) - full
    return ModelPruning(
        variant=variant,
        seed=seed,
        run_id=run_id,
        heads=len(heads),
        fractions=list(FRACTIONS),
        by_importance=by_importance,
        at_random=at_random,
        random_orders=random_orders,
        one_head=one_head,
        one_head_kept=kept,
        full=full,
    )


def _lower_is_better(metric: str) -> bool:
    return metric.endswith(("loss", "ppl", "perplexity"))


def study_pruning(uri: str, study: str, metric: str = "test/loss") -> tuple[list[ModelPruning], dict[str, Any]]:
    """Every finished cell's model of ``study``, by variant then seed."""
    cells, test = trained_cells(uri, study)
    models = each_model(cells, "pruned", lambda v, s, r: prune_model(r, s, uri, metric, v))
    return models, {"study": study, "metric": metric, "test": test, "orders": RANDOM_ORDERS}


def compare_orders(
    models: list[ModelPruning], metric: str, test: str = "permutation", alpha: float = ALPHA
) -> list[dict]:
    """At each pruned fraction: the mean metric by importance and at random over seeds, their paired difference
    (importance - random) with its t interval, the study's paired test over seeds and Holm over the fractions
    that remove heads."""
    import numpy as np

    rows = []
    for i, f in enumerate(models[0].fractions):
        imp = np.array([m.by_importance[i] for m in models])
        rnd = np.array([m.at_random[i] for m in models])
        d = imp - rnd
        summary = stats.describe(d)
        p, method = stats.paired_p(d, test) if f > 0 else (math.nan, "")
        rows.append(
            {
                "fraction": f,
                "importance": float(imp.mean()),
                "random": float(rnd.mean()),
                "diff": float(d.mean()),
                "ci": list(summary.ci_t),
                "p": p,
                "method": method,
                "seeds": len(models),
            }
        )
    tested = [r for r in rows if r["fraction"] > 0]
    for r, q in zip(tested, stats.holm([r["p"] for r in tested])):
        r["p_holm"] = q
        good = (r["diff"] < 0) == _lower_is_better(metric)
        r["verdict"] = (
            "not resolved" if q > alpha else f"different ({'importance better' if good else 'random better'})"
        )
    return rows


def format_pruning(models: list[ModelPruning], info: dict[str, Any]) -> str:
    """Markdown: the pruning curves (importance order against random orders) and one head per module, per variant."""
    parts = []
    for variant in dict.fromkeys(m.variant for m in models):
        mine = [m for m in models if m.variant == variant]
        parts.append(_format_variant(variant, mine, info))
    return "\n".join(parts)


def _format_variant(variant: str, models: list[ModelPruning], info: dict[str, Any]) -> str:
    metric = info["metric"]
    rows = compare_orders(models, metric, info.get("test", "permutation"))
    title = info["study"] + (f", variant {variant}" if variant else "")
    lines = [
        f"### {title}: pruning heads (Michel et al. 2019, section 4)",
        "",
        f"{metric} after removing a fraction of the {models[0].heads} attention heads, least important first "
        "(importance on the validation split, estimated again before each step) or in random order (mean of "
        f"{info.get('orders', RANDOM_ORDERS)} orders per model); mean over {len(models)} seed(s). Δ = importance − "
        f"random, paired by seed, with the 95% t interval; p: {rows[1]['method'] if len(rows) > 1 else ''}, "
        "Holm over the fractions.",
        "",
        "| heads removed | by importance | at random | Δ [95% CI] | p (Holm) | verdict |",
        "|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        ci = r["ci"]
        interval = f" [{ci[0]:+.3g}, {ci[1]:+.3g}]" if all(math.isfinite(x) for x in ci) else ""
        p = f"{r['p_holm']:.3g}" if "p_holm" in r else "–"
        lines.append(
            f"| {r['fraction']:.0%} | {r['importance']:.4g} | {r['random']:.4g} | {r['diff']:+.3g}{interval} | {p} | "
            f"{r.get('verdict', '–')} |"
        )
    tested = sum("p_holm" in r for r in rows)
    floor = stats.holm_floor(len(models), ALPHA, tested) if tested and info.get("test", "permutation") != "t" else None
    if floor:  # an interval that excludes 0 beside "not resolved" is this, not a contradiction
        lines += [
            "",
            f"**Too few seeds:** {floor}: no fraction can come out different whatever the data; at least "
            f"{stats.smallest_exact_n(ALPHA / tested)} seeds can (`ablate sweep STUDY --seeds N` trains only the new ones).",
        ]
    lines += [
        "",
        f"One head per module (Michel et al. Table 2): each module keeps only its best head on the validation split; "
        f"the change of {metric} on the test split (every other module whole), mean over seeds with the 95% t interval.",
        "",
        "| module | change with one head | the head kept (its index), per seed |",
        "|---|---:|---|",
    ]
    for name in models[0].one_head:
        s = stats.describe([m.one_head[name] for m in models])
        interval = f" [{s.ci_t[0]:+.3g}, {s.ci_t[1]:+.3g}]" if s.n > 1 and math.isfinite(s.ci_t[0]) else ""
        kept = ", ".join(str(m.one_head_kept[name]) for m in models)
        lines.append(f"| {name} | {s.mean:+.3g}{interval} | {kept} |")
    return "\n".join(lines) + "\n"


def pruning_json(models: list[ModelPruning]) -> str:
    return json.dumps([asdict(m) for m in models], indent=1)


def save_pruning(
    uri: str, study: str, models: list[ModelPruning], info: dict[str, Any], out: Path | None = None
) -> tuple[list[Path], str | None, list[str]]:
    """pruning.md, pruning.json and pruning.png (the curves) in ``out`` (when given) and under ``heads/`` of the
    study's latest parent run: (the files written to ``out``, the parent run's id or None, the artifacts logged)."""
    import tempfile

    from dashboards.static import pruning_png
    from record import vocabulary

    metric = info["metric"]
    variants = dict.fromkeys(m.variant for m in models)
    curves = {v: compare_orders([m for m in models if m.variant == v], metric, info["test"]) for v in variants}
    logged: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = out or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        paths = [folder / "pruning.md", folder / "pruning.json"]
        paths[0].write_text(format_pruning(models, info))
        paths[1].write_text(pruning_json(models))
        paths.append(pruning_png(curves, metric, folder / "pruning.png"))
        parent = load_runs(uri, study).latest_parent
        if parent is not None:
            c = vocabulary.client(uri)
            for path in paths:
                c.log_artifact(parent.info.run_id, str(path), "heads")
                logged.append(f"heads/{path.name}")
    return (paths if out else []), (parent.info.run_id if parent is not None else None), logged
