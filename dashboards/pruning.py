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

Each model is pruned on the running side (``ablations.pruning``), which records its curves with the cell's run;
this module reads them. Seeds are summarised as every table does (record/stats/): at each pruned fraction the importance order is
compared with the random orders by the study's paired test over seeds (the sign-flip permutation test by default,
``analysis.test``), with Holm's correction over the fractions.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

from record import evaluations, stats
from record.evaluations import ModelPruning, lower_is_better
from record.runs import load_runs

ALPHA = 0.05  # the level of the pruning curves' tests, Holm over the fractions


def study_pruning(uri: str, study: str, metric: str = "test/loss") -> tuple[list[ModelPruning], dict[str, Any]]:
    """Every finished cell's pruned model of ``study`` as its run recorded it (``ablations.pruning``), by variant
    then seed."""
    recorded, test = evaluations.recorded_cells(uri, study, "pruning", metric)
    models = [ModelPruning.from_json(data) for _, _, _, data in recorded]
    orders = len(models[0].random_orders) if models else 0
    return models, {"study": study, "metric": metric, "test": test, "orders": orders}


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
        good = (r["diff"] < 0) == lower_is_better(metric)
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
        f"{info.get('orders') or len(models[0].random_orders)} orders per model); mean over {len(models)} seed(s). Δ = importance − "
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
