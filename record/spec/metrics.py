"""The summary metrics a run will log, known before it trains: a study's ``metric`` (or an analysis margin, a
search objective) that no run logs is a typo caught before any compute, with the names that do exist.

A run logs, for every split its task evaluates:
- ``best/val_<name>`` and ``final/val_<name>``: the best and the last validation (names of
  ``models.training.metric_names``: loss, ppl, token_acc, exact_match, accuracy, length_acc);
- ``<split>/<name>`` for the test splits (``test``, ``test_long``, ...), evaluated once after training, and for
  seq2seq tasks ``<split>/error_at_<k>``: the decoded error rate at target position k (1 = the first token);
- ``cost/<name>`` (COST) and, when it stops early, ``diverged_step`` or ``stopped_step``;
- for a classification task, ``data/<split>_majority`` (``val`` for validation): what always answering the
  split's most frequent class scores, a property of the data, not a result.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

from record.spec.common import Origin
from record.spec.errors import closest
from record.spec.run import RunConfig

# what ablations.train summarises under cost/ (models.lightning's cost_summary, plus the run's wall time)
COST = (
    "tokens_per_s",
    "step_time_ms",
    "train_tokens",
    "train_time_s",
    "peak_memory_mb",
    "n_params",
    "flops_per_token",
    "achieved_flops_per_s",
    "mfu",
    "wall_time_s",
    "steps",
)


# the direction in which each logged metric gets better, by its name without the split or prefix (val_loss: loss)
HIGHER_IS_BETTER = frozenset(
    {"accuracy", "token_acc", "exact_match", "length_acc", "tokens_per_s", "achieved_flops_per_s", "mfu"}
)
LOWER_IS_BETTER = frozenset(
    {"loss", "ppl"}  # perplexity is exp(loss)
    | {"step_time_ms", "train_tokens", "train_time_s", "peak_memory_mb", "n_params", "flops_per_token", "wall_time_s"}
    | {"steps"}
)


def _name(metric: str) -> str:
    """A metric's name without its split or prefix: loss for final/val_loss, test/loss and val/loss."""
    name = metric.rpartition("/")[2]
    return name.removeprefix("val_") if metric.partition("/")[0] in ("best", "final") else name


def better(metric: str) -> str | None:
    """``minimize`` or ``maximize``: the direction in which ``metric`` (any name ``logged_metrics`` gives) gets
    better; None where it has none (``diverged_step``, ``stopped_step``: when a run stopped) or is not ours."""
    name = _name(metric)
    if name in LOWER_IS_BETTER or re.fullmatch(r"error_at_\d+", name):
        return "minimize"
    if name in HIGHER_IS_BETTER:
        return "maximize"
    return None


def direction_problem(metric: str, direction: str | None) -> str | None:
    """What is wrong with ranking ``metric`` in ``direction`` (None: it follows the metric), or None."""
    known = better(metric)
    if direction is not None and known is not None and direction != known:
        word = "lower" if known == "minimize" else "higher"
        return (
            f"direction {direction} ranks {metric!r} backwards ({word} is better): write {known}, or leave direction "
            "out (it follows the metric)"
        )
    return None


def metric_split(split: str) -> str:
    """The name a split goes by in metric names: ``val`` for validation (final/val_loss), else its own."""
    return "val" if split == "validation" else split


def majority_metric(metric: str) -> str:
    """The ``data/<split>_majority`` of the split ``metric`` is measured on: data/val_majority for
    final/val_accuracy and best/val_accuracy, data/test_majority for test/accuracy."""
    prefix = metric.partition("/")[0]
    return f"data/{'val' if prefix in ('best', 'final', 'val') else prefix}_majority"


def in_order(names: Iterable[str]) -> list[str]:
    """Sorted with the numbers in them as numbers: ``error_at_2`` before ``error_at_10``."""
    return sorted(names, key=lambda k: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", k)])


def split_names(run: RunConfig) -> list[str]:
    """The metric names (without prefix) of one evaluated split of this run."""
    from models.training import metric_names

    task = run.task
    exact = task.kind == "seq2seq" or (task.kind == "lm" and task.answer_mask)
    length = (
        run.model.arch == "encoder_decoder" and getattr(run.model, "decoding", "autoregressive") != "autoregressive"
    )
    return metric_names(task.kind, exact=exact, length=length)


def logged_metrics(run: RunConfig) -> set[str]:
    """Every summary metric this run will log (when it trains to the end)."""
    names = split_names(run)
    out = {f"{prefix}/val_{n}" for prefix in ("best", "final") for n in names}
    for split in run.task.splits:
        if split not in ("train", "validation"):
            out |= {f"{split}/{n}" for n in names}
            out |= {f"{split}/error_at_{k}" for k in range(1, run.task.target_positions(split) + 1)}
    out |= {f"cost/{n}" for n in COST}
    if run.task.kind == "classify":
        out |= {f"data/{metric_split(s)}_majority" for s in run.task.splits if s != "train"}
    return out | {"diverged_step", "stopped_step"}


def unknown_metric(metric: str, known: Iterable[str], one_value: str = "") -> str | None:
    """None if ``metric`` is logged; else what to say: the closest names, or every one. ``one_value`` says what
    compares one value per run ("a study compares one value per run"): a metric reported at every validation
    (``val/loss``) is then offered as its two summaries, the last and the best."""
    known = sorted(known)
    if metric in known:
        return None
    name = metric.removeprefix("val/")
    final, best = f"final/val_{name}", f"best/val_{name}"
    if one_value and metric.startswith("val/") and final in known and best in known:
        extreme = {"minimize": "lowest", "maximize": "highest"}.get(better(final) or "", "best")
        return (
            f"{metric!r} is logged at every validation, and {one_value}: write {final} (the last) or {best} (the "
            f"{extreme})"
        )
    close = closest(metric, known, 0.6)
    hint = f"did you mean {' or '.join(close)}?" if close else "the runs log: " + ", ".join(in_order(known))
    return f"{metric!r} is not a metric these runs log; {hint}"


def intermediate_metrics(run: RunConfig) -> set[str]:
    """What a run reports at each validation (a search's ``prune_on``)."""
    return {f"val/{n}" for n in split_names(run)}


def variant_metrics(origin: Origin, metric: str, runs: Iterable[tuple[str, RunConfig]]) -> set[str]:
    """The metrics every variant's runs log, from (variant, run) pairs; a study's ``metric`` must be one of them
    (a typo in it would otherwise be found by ``ablate report``, after all the compute)."""
    per_variant: dict[str, set[str]] = {}
    for variant, run in runs:
        if variant not in per_variant:
            per_variant[variant] = logged_metrics(run)
    missing = [v for v, names in per_variant.items() if metric not in names]
    if missing:
        problem = unknown_metric(metric, per_variant[missing[0]], "a study compares one value per run") or ""
        if len(missing) < len(per_variant):
            problem += f" (the runs of {', '.join(repr(v) for v in missing)} do not log it)"
        raise origin.error(("metric",), problem)
    return set.intersection(*per_variant.values())


def pruned_on(given: str | None, metric: str, direction: str, reported: set[str]) -> tuple[str, str | None]:
    """A search's ``prune_on`` (``given``, or by default the objective's own validation metric: val/token_acc for
    final/val_token_acc or test/token_acc, else val/loss for an objective that falls) and what is wrong with it:
    Optuna's pruners compare it in the objective's ``direction``, so one that moves the other way would stop the
    best trials (val/loss for an objective that maximises exact match)."""
    along = [m for m in in_order(reported) if better(m) == direction]
    own = f"val/{_name(metric)}"
    prune_on = given or (own if own in reported else "val/loss")
    if prune_on not in reported:
        return prune_on, unknown_metric(prune_on, reported)
    if better(prune_on) not in (None, direction):
        moves = "falls" if better(prune_on) == "minimize" else "rises"
        if given is None:
            return prune_on, (
                f"the objective {metric!r} is to {direction} and no validation metric is its own: give prune_on (one "
                f"that moves with it: {', '.join(along)}), or pruner: none"
            )
        return prune_on, (
            f"{prune_on!r} gets better as it {moves}, but the objective {metric!r} is to {direction}: Optuna's pruner "
            f"would stop the best trials; prune on a validation metric that moves with it ({', '.join(along)})"
        )
    return prune_on, None


def chance_kind(metric: str) -> str | None:
    """loss | ppl | accuracy: a metric whose uniform-guess level is known from the number of classes."""
    name = metric.rsplit("/", 1)[-1]
    if name.endswith("loss"):
        return "loss"
    if name.endswith(("ppl", "perplexity")):
        return "ppl"
    if name.endswith("length_acc"):  # over predicted lengths, not classes
        return None
    if name.endswith(("accuracy", "acc", "exact_match")):
        return "accuracy"
    return None


def chance_share(value: float, kind: str, classes: int) -> float:
    """How far ``value`` sits from perfect towards a uniform guess over ``classes``: 1 at chance, 0 perfect. A
    uniform guess scores a loss of ln C, a perplexity of C and an accuracy of 1/C (an exact match of a whole
    sequence at most 1/C); a loss share is value / ln C, an accuracy's (1 − value) / (1 − 1/C)."""
    if kind == "loss":
        return value / math.log(classes)
    if kind == "ppl":
        return math.log(max(value, 1e-300)) / math.log(classes)
    return (1 - value) / (1 - 1 / classes)
