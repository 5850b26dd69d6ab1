"""What a search leaves behind: its counts and best trials, the MLflow parent run's summary, Optuna's plots."""

from __future__ import annotations

import contextlib
import json
import time
from collections import Counter
from typing import Any

from record import vocabulary
from record.spec import SearchSpec


def counts(study) -> dict[str, int]:
    return dict(Counter(t.state.name for t in study.get_trials(deepcopy=False)))


def best_trials(study, spec: SearchSpec) -> list[dict[str, Any]]:
    """The best trial (several on a Pareto front): number, params, values."""
    try:
        trials = study.best_trials
    except Exception:  # no completed trial yet
        return []
    return [
        {"number": t.number, "params": t.params, "values": dict(zip([m for m, _ in spec.objectives], t.values))}
        for t in trials
    ]


def finish_parent(uri: str, parent_id: str, spec: SearchSpec, study, status: str) -> tuple[dict, list]:
    """The search's parent run: trial counts, the best trial's values and params, best.json, the plots."""
    from mlflow.entities import Metric, RunTag

    c = vocabulary.client(uri)
    n, best = counts(study), best_trials(study, spec)
    now = int(time.time() * 1000)
    metrics = [Metric(f"trials_{k.lower()}", float(v), now, 0) for k, v in n.items()]
    tags = []
    if best:
        top = best[0]
        metrics += [Metric(f"best/{m}", float(v), now, 0) for m, v in top["values"].items()]
        tags += [RunTag("best_trial", str(top["number"]))] + [
            RunTag(f"best.{k}", str(v)) for k, v in top["params"].items()
        ]
    c.log_batch(parent_id, metrics=metrics, tags=tags)
    c.log_text(parent_id, json.dumps({"counts": n, "best": best}, indent=1, default=str), "best.json")
    with contextlib.suppress(Exception):
        page = plots_html(study, spec)
        if page:
            c.log_text(parent_id, page, "optuna_plots.html")
    vocabulary.end_run(uri, parent_id, status)
    return n, best


def plots_html(study, spec: SearchSpec) -> str:
    """Optuna's plots in one self-contained page: history, parallel coordinates, parameter importances
    (PED-ANOVA and fANOVA), and the Pareto front when there are several objectives."""
    import optuna.visualization as vis
    from optuna.importance import FanovaImportanceEvaluator, PedAnovaImportanceEvaluator
    from optuna.trial import TrialState

    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if len(complete) < 2:
        return ""
    names = [m for m, _ in spec.objectives]
    figs = []
    if len(names) == 1:
        figs.append(("optimisation history", vis.plot_optimization_history(study, target_name=names[0])))
        figs.append(("parallel coordinates", vis.plot_parallel_coordinate(study, target_name=names[0])))
        if len({k for t in complete for k in t.params}) > 0 and len(complete) >= 3:
            for label, ev in (
                ("PED-ANOVA", PedAnovaImportanceEvaluator()),
                ("fANOVA", FanovaImportanceEvaluator(seed=0)),
            ):
                with contextlib.suppress(Exception):
                    figs.append(
                        (
                            f"parameter importance ({label})",
                            vis.plot_param_importances(study, evaluator=ev, target_name=names[0]),
                        )
                    )
        if any(t.intermediate_values for t in complete):
            figs.append(("intermediate values", vis.plot_intermediate_values(study)))
    else:
        figs.append(("Pareto front", vis.plot_pareto_front(study, target_names=names)))
        for i, n in enumerate(names):
            figs.append(
                (
                    f"history of {n}",
                    vis.plot_optimization_history(study, target=lambda t, i=i: t.values[i], target_name=n),
                )
            )
    parts, first = [], True
    for title, fig in figs:
        parts.append(f"<h2>{title}</h2>" + fig.to_html(full_html=False, include_plotlyjs=first))
        first = False
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{spec.name}: Optuna plots</title></head>"
        f"<body style='font-family:sans-serif;max-width:1200px;margin:auto'><h1>{spec.name}</h1>{''.join(parts)}"
        "</body></html>"
    )


def format_best(best: list[dict[str, Any]]) -> str:
    if not best:
        return "no trial completed"
    lines = []
    for b in best:
        values = ", ".join(f"{k}={v:.4g}" for k, v in b["values"].items())
        params = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in b["params"].items())
        lines.append(f"trial {b['number']}: {values}\n  {params}")
    return "\n".join(lines)


def format_outcome(spec: SearchSpec, result, storage_given: bool = False) -> str:
    """What ``ablate search`` prints at its end: the trials' states, the best, where the search is kept."""
    from record.secrets import redact_url

    states = ", ".join(f"{n} {s.lower()}" for s, n in sorted(result.counts.items()))
    best = "best" if len(spec.objectives) == 1 else "best (the Pareto front: no trial is better in every objective)"
    return (
        f"\n{spec.name}: {states}\n{best}:\n{format_best(result.best)}\n"
        f"Optuna storage: {redact_url(result.storage)}   (ablate ui --optuna{' --storage URL' if storage_given else ''})\n"
        + (
            f"MLflow: parent run {result.parent_run_id} in experiment {spec.name!r} (ablate ui); Optuna's plots are "
            "its artifact optuna_plots.html"
            if result.parent_run_id
            else f"MLflow: no parent run of this search in experiment {spec.name!r}"
        )
    )


def last_parent(uri: str, experiment: str, name: str) -> str | None:
    """The latest parent run of search ``name`` in ``experiment`` (None if none): where a search with nothing left
    to ask points, instead of opening one more."""
    c = vocabulary.client(uri)
    exp = c.get_experiment_by_name(experiment)
    if exp is None:
        return None
    runs = vocabulary.search_all(
        uri, [exp.experiment_id], vocabulary.kind_filter(vocabulary.KIND_SEARCH, **{vocabulary.TAG_STUDY: name})
    )
    return max(runs, key=lambda r: r.info.start_time).info.run_id if runs else None
