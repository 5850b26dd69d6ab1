"""Pruning of trained models, on the running side (``ablate heads --prune``; Michel et al. 2019, section 4 and
Table 2): each finished cell's heads removed 10% at a time by importance I_h = E_x |dL(x)/d xi_h| (re-estimated
on the validation split before every step) and in random orders, and each module kept to its best head. The
curves are recorded with the cell's run (``record.evaluations.ModelPruning``); ``dashboards.pruning`` compares
them over seeds."""

from __future__ import annotations

import random

from ablations.evaluate import each_model, evaluation_code, load_trained, to_evaluate
from record import evaluations
from record.evaluations import ModelPruning, lower_is_better

FRACTIONS = tuple(round(0.1 * i, 1) for i in range(10))  # 0%, 10%, ..., 90% of the heads removed
RANDOM_ORDERS = 5


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
    better = min if lower_is_better(metric) else max
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


def evaluate_study_pruning(uri: str, study: str, metric: str = "test/loss") -> int:
    """Every finished cell's model pruned, recorded with its run; the models pruned now (those this code pruned
    before are read back, not pruned again)."""
    todo = to_evaluate(uri, study, "pruning", metric)

    def work(variant: str, seed: int, run_id: str) -> None:
        pruned = prune_model(run_id, seed, uri, metric, variant)
        evaluations.record(uri, run_id, "pruning", metric, pruned.to_json(), evaluation_code())

    each_model(todo, "pruned", work)
    return len(todo)


__all__ = ["FRACTIONS", "RANDOM_ORDERS", "evaluate_study_pruning", "head_importance", "prune_model"]
