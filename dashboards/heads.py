"""``ablate heads STUDY``: remove one attention head at a time at evaluation time (Michel et al. 2019, "Are
Sixteen Heads Really Better than One?") in every trained seed of a study, and report what each head costs.

Each finished cell's model is evaluated on the running side (``ablations.evaluate``: its kept weights, every head,
then each single head gated to zero), which records the scores with the cell's run (``record.evaluations``);
this module reads them and judges.

As in the paper, a head's effect is judged within its own trained model: for a loss metric, the per-sequence
losses with and without the head are compared by the study's paired test over the split's sequences, with the
rules of every table (record/stats/): the sign-flip permutation test by default (Monte Carlo over
hundreds of sequences, with enough resamples to reach the corrected level) or the paired t-test
(``analysis.test``), a head with no spread in its differences tested exactly rather than given p = 0, and
Holm's correction over the model's heads before anything is counted (at p <= 0.01, the paper's level). Heads
are not the same from seed to seed (head 2 of one model has no counterpart in another), so seeds are
summarised per module: its least and its most important head, and how many of its heads matter. The tables
are logged to the study's latest parent run as ``heads/heads.md`` and ``heads/heads.json``.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from record import evaluations, stats, vocabulary
from record.evaluations import HeadScores
from record.runs import load_runs

ALPHA = 0.01  # Michel et al.'s significance level


@dataclass(kw_only=True)
class HeadEffect:
    """One head of one trained model."""

    seed: int
    module: str
    head: int
    change: float  # the metric without this head minus with every head
    p: float  # the study's paired test over the split's sequences (loss metrics), else nan
    p_holm: float = math.nan  # Holm-corrected over the model's heads
    method: str = ""  # how p was computed
    verdict: str = ""  # from the corrected test: different (worse|better) without the head, or not resolved


@dataclass
class ModelHeads:
    variant: str
    seed: int
    run_id: str
    full: float  # the metric with every head
    sequences: int
    heads: list[HeadEffect]


def judge_heads(
    nll: Any,
    weight: Any,
    without: dict[tuple[str, int], Any],
    seed: int,
    *,
    test: str = "permutation",
    alpha: float = ALPHA,
) -> tuple[float, int, list[HeadEffect]]:
    """(the loss with every head, scored sequences, each head's effect) from per-sequence summed losses ``nll``
    and scored tokens ``weight`` with every head, and ``without[(module, head)]``: the per-sequence losses
    without that head. Each head: the paired test of the per-sequence differences (record.stats.paired_p,
    every table's test), Holm over the model's heads, and the verdict at ``alpha``."""
    import numpy as np

    nll, weight = np.asarray(nll, dtype=float), np.asarray(weight, dtype=float)
    full = float(nll.sum() / weight.sum())
    scored = weight > 0  # sequences with something scored (the others would enter the test as zeros)
    keys = list(without)
    level = alpha / max(1, len(keys))  # Holm's strictest step: the Monte Carlo test must be able to reach it
    resamples = stats.resamples_for(level)
    diffs = [np.asarray(without[k], dtype=float)[scored] - nll[scored] for k in keys]
    heads = []
    for (m, h), (p, method) in zip(keys, stats.paired_p_many(diffs, test, n_resamples=resamples)):
        change = float(np.asarray(without[(m, h)], dtype=float).sum() / weight.sum()) - full
        heads.append(HeadEffect(seed=seed, module=m, head=h, change=change, p=p, method=method))
    for e, q in zip(heads, stats.holm([e.p for e in heads])):
        e.p_holm = q
        e.verdict = (
            "not resolved"
            if q > alpha
            else ("different (worse without)" if e.change > 0 else "different (better without)")
        )
    return full, int(scored.sum()), heads


def model_heads(
    scores: HeadScores, variant: str, seed: int, run_id: str, *, test: str = "permutation", alpha: float = ALPHA
) -> ModelHeads:
    """Every head of one trained model, from its recorded scores: its effect on the metric and, for a loss, its
    paired test (``test``: the study's analysis.test) with Holm's correction over the model's heads."""
    if scores.nll is None:
        heads = [
            HeadEffect(seed=seed, module=m, head=h, change=v - scores.full, p=math.nan)
            for (m, h), v in scores.without.items()
        ]
        return ModelHeads(variant, seed, run_id, scores.full, 0, heads)
    full, sequences, heads = judge_heads(scores.nll, scores.weight, scores.without_nll, seed, test=test, alpha=alpha)
    return ModelHeads(variant, seed, run_id, full, sequences, heads)


def head_ablation(
    uri: str, study: str, metric: str = "val/loss", *, alpha: float = ALPHA
) -> tuple[list[ModelHeads], dict[str, Any]]:
    """Every head of every finished cell's model, by variant then seed, judged with the study's analysis.test."""
    recorded, test = evaluations.recorded_cells(uri, study, "heads", metric)
    models = [model_heads(HeadScores.from_json(data), v, s, r, test=test, alpha=alpha) for v, s, r, data in recorded]
    return models, {
        "study": study,
        "metric": metric,
        "seeds": len({m.seed for m in models}),
        "test": test,
        "alpha": alpha,
    }


def _worse(metric: str) -> int:
    """+1 when a larger value is worse (losses), -1 when a smaller one is."""
    return 1 if metric.endswith(("loss", "perplexity", "ppl", "bits")) else -1


def format_heads(models: list[ModelHeads], info: dict[str, Any]) -> str:
    """Markdown: per model, the heads that matter after Holm's correction; per module, the least and most
    important head over seeds. Models of different variants (other architectures, say) are reported apart."""
    variants = list(dict.fromkeys(m.variant for m in models))
    parts = []
    for variant in variants:
        mine = [m for m in models if m.variant == variant]
        title = f"{info['study']}" + (f", variant {variant}" if len(variants) > 1 else "")
        parts.append(_format_variant(title, mine, info["metric"], info.get("alpha", ALPHA)))
    return "\n".join(parts)


def _format_variant(title: str, models: list[ModelHeads], metric: str, alpha: float = ALPHA) -> str:
    sign = _worse(metric)
    tested = any(math.isfinite(e.p) for m in models for e in m.heads)
    lines = [
        f"{title}: {metric}, {len(models)} trained seed(s), {len(models[0].heads)} heads each; each head removed "
        "alone at evaluation time.",
        "",
    ]
    if tested:
        methods = sorted({e.method for m in models for e in m.heads if e.method})
        lines += [
            f"Per model: the heads whose removal changes {metric} (the paired test over the {models[0].sequences} "
            f"scored sequences of the split: {'; '.join(methods)}; Holm-corrected over the model's "
            f"{len(models[0].heads)} heads, p ≤ {alpha:g} as in Michel et al.), and how many of those help when "
            "removed. Counts are after the correction only.",
            "",
            f"| seed | {metric} with every head | matter (Holm p ≤ {alpha:g}) | of which better without |"
            " largest harm | largest gain |",
            "|---:|---:|---:|---:|---:|---:|",
        ]
        for m in models:
            matter = [e for e in m.heads if e.p_holm <= alpha]
            better = [e for e in matter if sign * e.change < 0]
            harm = max(m.heads, key=lambda e: sign * e.change)
            gain = min(m.heads, key=lambda e: sign * e.change)
            gained = f"{gain.change:+.3g} ({gain.module}[{gain.head}])" if sign * gain.change < 0 else "none"
            lines.append(
                f"| {m.seed} | {m.full:.4g} | {len(matter)}/{len(m.heads)} | {len(better)} | "
                f"{harm.change:+.3g} ({harm.module}[{harm.head}]) | {gained} |"
            )
        lines.append("")
    lines += [
        "Per module, over seeds (a module's heads differ from seed to seed, so each seed's least and most "
        "important head of the module are taken): mean over seeds with the 95% t interval"
        + (f", and the module's heads that matter (Holm p ≤ {alpha:g}) in each seed." if tested else "."),
        "",
        "| module | least important head | most important head |"
        + (f" heads that matter (Holm p ≤ {alpha:g}), per seed |" if tested else ""),
        "|---|---:|---:|" + ("---|" if tested else ""),
    ]
    rows = []
    for module in dict.fromkeys(e.module for e in models[0].heads):
        least, most, sig = [], [], []
        for m in models:
            harms = [sign * e.change for e in m.heads if e.module == module]
            least.append(sign * min(harms))
            most.append(sign * max(harms))
            sig.append(f"{sum(e.p_holm <= alpha for e in m.heads if e.module == module)}/{len(harms)}")
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


def save_heads(
    uri: str, study: str, text: str, models: list[ModelHeads], out: Path | None = None
) -> tuple[list[Path], str | None, list[str]]:
    """heads.md and heads.json in ``out`` (when given) and under ``heads/`` of the study's latest parent run:
    (the files written to ``out``, the parent run's id or None, the artifacts logged there)."""
    written = []
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        written = [out / "heads.md", out / "heads.json"]
        written[0].write_text(text)
        written[1].write_text(heads_json(models))
    parent = load_runs(uri, study).latest_parent
    if parent is None:
        return written, None, []
    c = vocabulary.client(uri)
    c.log_text(parent.info.run_id, text, "heads/heads.md")
    c.log_text(parent.info.run_id, heads_json(models), "heads/heads.json")
    return written, parent.info.run_id, ["heads/heads.md", "heads/heads.json"]
