"""Evaluation of trained models, on the running side (``ablate heads``): each finished cell's kept weights loaded
and evaluated with every attention head, then with each single head's output gated to zero (Michel et al. 2019,
``Transformer.set_head_mask``). What it measures is recorded with the cell's run (``record.evaluations``), once:
comparing reads it, and a second ``ablate heads`` evaluates nothing again."""

from __future__ import annotations

import functools
import hashlib
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml

from record import evaluations, vocabulary
from record.evaluations import HeadScores
from record.spec import resolve_run

T = TypeVar("T")

KEPT_NOTHING = (
    "run {run_id} kept no weights (checkpoint/model.pt and config.yaml): train the study with "
    "`tracking: {{checkpoint: true}}` in its base run"
)


def trained_run(run_id: str, uri: str):
    """The resolved run configuration a trained run kept (config.yaml). LookupError if it kept none."""
    with tempfile.TemporaryDirectory() as tmp:
        try:
            path = vocabulary.client(uri).download_artifacts(run_id, "config.yaml", tmp)
        except Exception as err:
            raise LookupError(KEPT_NOTHING.format(run_id=run_id)) from err
        return resolve_run(yaml.safe_load(Path(path).read_text()), f"run {run_id}")


def load_trained(run_id: str, uri: str):
    """(the resolved run, its data (set up), the LitTransformer with the run's kept weights, in eval mode)."""
    import torch

    from models.lightning import LitTransformer
    from models.tasks import TaskDataModule

    run = trained_run(run_id, uri)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            weights = vocabulary.client(uri).download_artifacts(run_id, "checkpoint/model.pt", tmp)
        except Exception as err:
            raise LookupError(KEPT_NOTHING.format(run_id=run_id)) from err
        state = torch.load(weights, map_location="cpu", weights_only=True)
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
            logits, targets = module.scored_logits(batch)
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


def each_head(module, score: Callable[[], T]) -> tuple[T, dict[tuple[str, int], T]]:
    """``score()`` with every head, and with each head of each attention module gated off alone."""
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


def evaluate_heads(run_id: str, uri: str, metric: str) -> tuple[float, dict[tuple[str, int], float]]:
    """(the metric with every head, {(module, head): the metric without that head}) for one trained run."""
    _, data, module = load_trained(run_id, uri)
    split, key = metric.split("/", 1)
    loader = data.val_dataloader() if split == "val" else data.loader(split)
    return each_head(module, lambda: module.evaluate(loader, split)[f"{split}/{key}"])


def head_scores(run_id: str, uri: str, metric: str) -> HeadScores:
    """One trained model with each head removed; for a loss, per sequence (what the paired test compares)."""
    split, key = metric.split("/", 1)
    if key != "loss":
        full, without = evaluate_heads(run_id, uri, metric)
        return HeadScores(metric=metric, full=full, without=without)
    _, data, module = load_trained(run_id, uri)
    loader = data.val_dataloader() if split == "val" else data.loader(split)
    (nll, weight), without = each_head(module, lambda: sequence_losses(module, loader))
    total = float(weight.sum())
    return HeadScores(
        metric=metric,
        full=float(nll.sum()) / total,
        without={k: float(v[0].sum()) / total for k, v in without.items()},
        nll=nll.tolist(),
        weight=weight.tolist(),
        without_nll={k: v[0].tolist() for k, v in without.items()},
    )


def each_model(cells: list[tuple[str, int, str]], what: str, work: Callable[[str, int, str], T]) -> list[T]:
    """``work(variant, seed, run_id)`` for every trained cell, with a progress line per model (minutes each)."""
    out, start = [], time.monotonic()
    for i, (variant, seed, run_id) in enumerate(cells, 1):
        out.append(work(variant, int(seed), run_id))
        print(
            f"  [{time.monotonic() - start:.0f}s] {what}: {i}/{len(cells)} models ({variant}, seed {seed})", flush=True
        )
    return out


@functools.cache
def evaluation_code() -> str:
    """A fingerprint of the code that evaluates trained models: the code that shapes a result (the model among it)
    and these modules. An evaluation recorded by other code is made again."""
    from ablations import tracking

    h = hashlib.sha256(tracking.code_fingerprint().encode())
    for module in (Path(__file__), Path(__file__).with_name("pruning.py")):
        h.update(module.read_bytes())
    return h.hexdigest()[:16]


def to_evaluate(uri: str, study: str, kind: str, metric: str) -> list[tuple[str, int, str]]:
    """The finished cells whose run holds no evaluation of ``kind`` on ``metric`` by this code."""
    cells, _ = evaluations.finished_cells(uri, study)
    return [c for c in cells if evaluations.recorded(uri, c[2], kind, metric, evaluation_code()) is None]


def evaluate_study_heads(uri: str, study: str, metric: str) -> int:
    """Every finished cell's heads removed one at a time, recorded with its run; the models evaluated now (those
    this code evaluated before are read back, not evaluated again)."""
    todo = to_evaluate(uri, study, "heads", metric)

    def work(variant: str, seed: int, run_id: str) -> None:
        scores = head_scores(run_id, uri, metric).to_json()
        evaluations.record(uri, run_id, "heads", metric, scores, evaluation_code())

    each_model(todo, "heads removed one at a time", work)
    return len(todo)


def check_options(uri: str, study: str, metric: str, prune: str | None = None) -> None:
    """Before any model is evaluated: ``metric`` (--metric) and ``prune`` (--prune) must be what the trained runs
    evaluate (val/<name>, <test split>/<name>); pruning measures on another split than the one that chooses the
    heads (validation). Raises ValueError naming the option, with the names there are."""
    from record.spec.metrics import split_names, unknown_metric

    cells, _ = evaluations.finished_cells(uri, study)
    try:
        run = trained_run(cells[0][2], uri)
    except LookupError:  # no config kept: load_trained says what to do
        return
    splits = ["val"] + [s for s in run.task.splits if s not in ("train", "validation")]
    known = [f"{split}/{name}" for split in splits for name in split_names(run)]
    measured = [m for m in known if not m.startswith("val/")]  # --prune: never the split that chooses the heads
    for option, value, allowed in (("--metric", metric, known), ("--prune", prune, measured)):
        if value is not None and (problem := unknown_metric(value, allowed)):
            if value in known:  # a validation metric for --prune
                problem = f"pruning chooses its heads on the validation split: measure on another ({', '.join(allowed[:3])}, ...)"
            raise ValueError(f"{option} {value}: {problem.replace(' these runs log', ' these runs evaluate')}")


__all__ = [
    "check_options",
    "each_head",
    "each_model",
    "evaluate_heads",
    "evaluate_study_heads",
    "head_scores",
    "load_trained",
    "sequence_losses",
    "trained_run",
]
