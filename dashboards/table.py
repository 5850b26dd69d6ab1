"""The ablation table, as in the papers: the baseline row, then each variant with what it changed; its successes
out of its cells (exact interval); its metric over the successful seeds; its difference from the baseline
(paired by seed, failed seeds included under the study's failure rule) with the declared test, Holm's
correction over the declared family, the verdict, and the smallest difference its seeds could detect;
failure counts and cost. The declared contrasts that are not a row (pairs of two variants, factorial effects)
follow in ``Table.contrasts``. A variant is bold as best only when the family's tests show it better than every
other, and ``Table.caveats`` warns where a reader would be misled (dashboards/caveats.py). docs/statistics.md
explains every number.

Building only: dashboards/render.py renders a ``Table`` for the terminal, Markdown, LaTeX, CSV and HTML.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from dataclasses import dataclass, field
from typing import Any

from dashboards import caveats, testable
from dashboards.exploratory import exploratory
from dashboards.load import MODEL_PARAMS, NONFINITE, OTHER_CODE, PARAMS_PREFIX, StudyRuns
from record import stats
from record.recorded import RecordedDesign
from record.spec.analysis import Analysis
from record.spec.metrics import better, majority_metric
from record.vocabulary import AXIS_PREFIX

COSTS = [
    ("cost/n_params", "params"),
    ("cost/tokens_per_s", "tokens/s"),
    ("cost/wall_time_s", "wall s"),
    ("cost/peak_memory_mb", "peak MB"),
]
FAILED_MARK = "†"  # a variant with failed seeds: its mean is over the successes only


@dataclass
class VariantRow:
    variant: str
    changed: str
    summary: stats.Summary  # the metric over the successful seeds
    contrast: stats.Contrast | None  # against the baseline; None for the baseline itself
    outcomes: stats.Successes
    costs: dict[str, float]
    rule_mean: float = math.nan  # the mean with failed seeds under the failure rule (what "best" compares)
    finished: int = 0  # cells whose run finished (learned or not, with the metric or without)
    best: bool = False
    tuned: str = ""  # a tuned study: the parameters this variant's own search chose ("lr=0.0042")

    @property
    def failed_any(self) -> bool:
        return self.outcomes.failures > 0

    @property
    def marks(self) -> str:
        """Stars after Δ by the Holm p (conventional levels), only where the verdict, at the study's alpha, says
        "different": with alpha 0.01 a p of 0.03 got a star beside "not resolved"."""
        p = self.contrast.p_holm if self.contrast is not None else math.nan
        if not math.isfinite(p) or "different" not in self.contrast.verdict:
            return ""
        return "***" if p <= 0.001 else "**" if p <= 0.01 else "*" if p <= 0.05 else ""


@dataclass
class Table:
    study: str
    metric: str
    direction: str
    baseline: str
    rows: list[VariantRow]
    analysis: Analysis = field(default_factory=Analysis)
    contrasts: list[stats.Contrast] = field(default_factory=list)  # every contrast: rows', other pairs, effects
    worst: float = math.nan  # the worst value observed (the failure rule "worst")
    notes: list[str] = field(default_factory=list)
    caveats: list[caveats.Caveat] = field(default_factory=list)  # warnings for a reader (dashboards/caveats.py)
    ranking: caveats.Best = field(default_factory=lambda: caveats.Best(None, None))  # who is bold, or why none
    source: str = ""  # the study file (its next steps are commands on it)
    registrations: list = field(default_factory=list)  # its registration and amendments (record.recorded)
    seeds: list[dict[str, Any]] = field(default_factory=list)  # every cell's value and outcome (``seed_records``)
    levels: dict[str, list[str]] = field(default_factory=dict)  # a grid's axes and their levels, in order
    path: list[list[str]] = field(default_factory=list)  # a seed plan's looks (dashboards.render.PATH_HEAD)
    plan: dict[str, Any] | None = None  # the seed plan (record.spec.seedplan), as declared
    looks: list[dict[str, Any]] = field(default_factory=list)  # per look: seeds per variant, alpha, open, not testable

    @property
    def warnings(self) -> list[str]:
        return [c.text for c in self.caveats]

    @property
    def tuned(self) -> bool:
        return any(r.tuned for r in self.rows)

    @property
    def value_column(self) -> int:
        """Where the metric's column is: after variant, changed (and tuned), success."""
        return 4 if self.tuned else 3

    @property
    def family(self) -> list[stats.Contrast]:
        return [c for c in self.contrasts if c.in_family]

    @property
    def exploratory(self) -> list[stats.Contrast]:
        """Declared contrasts added or changed after results of their cells existed: tested apart from the family."""
        return [c for c in self.contrasts if c.exploratory]

    @property
    def extra(self) -> list[stats.Contrast]:
        """Declared pair contrasts that are not a row's (a row's is variant vs baseline)."""
        rows = {id(r.contrast) for r in self.rows if r.contrast is not None}
        return [c for c in self.contrasts if c.kind == "pair" and (c.in_family or c.exploratory) and id(c) not in rows]

    @property
    def effects(self) -> list[stats.Contrast]:
        return [c for c in self.contrasts if c.kind != "pair"]

    @property
    def margin(self) -> float:
        return self.analysis.margins.get(self.metric, math.nan)

    @property
    def detect(self) -> float | None:
        return self.analysis.detect.get(self.metric)

    def as_records(self) -> list[dict[str, Any]]:
        """One flat dict per variant (CSV, JSON, and what the tests read)."""
        out = []
        for r in self.rows:
            s, c, o = r.summary, r.contrast, r.outcomes
            rec = {
                "variant": r.variant,
                "changed": r.changed,
                **({"tuned": r.tuned} if self.tuned else {}),
                "n": s.n,
                "mean": s.mean,
                "std": s.std,
                "ci_low": s.ci_t[0],
                "ci_high": s.ci_t[1],
                "boot_low": s.ci_boot[0],
                "boot_high": s.ci_boot[1],
                "successes": o.successes,
                "cells": o.cells,
                "success_low": o.ci[0],
                "success_high": o.ci[1],
                "finished": r.finished,
                "diverged": o.diverged,
                "failed": o.failed,
                "not_learned": o.not_learned,
                "pending": o.pending,
                "failure_rule": self.analysis.failure_rule,
                "rule_mean": r.rule_mean,
                **contrast_fields(c),
                "marks": r.marks,
                "best": r.best,
                "warnings": "; ".join(c.kind for c in self.caveats if r.variant in c.variants),
            }
            rec.update({label: r.costs.get(key, math.nan) for key, label in COSTS})
            out.append(rec)
        return out

    def contrast_records(self) -> list[dict[str, Any]]:
        """Every contrast (rows', the other declared pairs, factorial effects), flat."""
        return [{"label": c.label, "kind": c.kind, "a": c.a, "b": c.b, **contrast_fields(c)} for c in self.contrasts]


def contrast_fields(c: stats.Contrast | None) -> dict[str, Any]:
    nan = math.nan
    if c is None:
        c = stats.Contrast("", "pair", "", "", 0, nan, stats.NAN2, nan, "", in_family=False)
        none = True
    else:
        none = False
    return {
        "diff": c.estimate,
        "diff_low": c.ci_t[0],
        "diff_high": c.ci_t[1],
        "diff_boot_low": c.ci_boot[0],
        "diff_boot_high": c.ci_boot[1],
        "n_paired": c.n,
        "spread": c.spread if not none else "",
        "test": c.method,
        "p": c.p if not none else nan,
        "min_p": c.min_p,
        "p_holm": c.p_holm,
        "in_family": c.in_family if not none else "",
        "exploratory": c.exploratory,
        "verdict": c.verdict,
        "margin": c.margin,
        "p_tost": c.p_tost,
        "p_tost_holm": c.p_tost_holm,
        "p_success": c.p_rate,
        "p_success_holm": c.p_rate_holm,
        "hedges_g": c.hedges_g,
        "sd_diff": c.sd,
        "correlation": c.correlation,
        "sd_unpaired": c.sd_unpaired,
        "detectable": c.mde,
        "seeds_needed": c.seeds_needed if c.seeds_needed is not None else "",
        "imputed": c.imputed if not none else "",
        "not_testable": c.untestable_here,
        "note": c.note,
    }


def _short(key: str) -> str:
    return key.split(".", 1)[-1]


def _changed(design: RecordedDesign, variant: str, baseline: str) -> str:
    if variant == baseline:
        return "(baseline)"
    if variant not in design.variants:
        return "?"
    mine, base = design.axis_values(variant), design.axis_values(baseline)
    diff = [f"{_short(k)}={v}" for k, v in mine.items() if base.get(k) != v]
    # what another baseline (--baseline) sets and this variant leaves at the study's base run
    diff += [f"{_short(k)}=(base run's)" for k in base if k not in mine]
    return ", ".join(diff) or "-"


def _tuned(design: RecordedDesign, variant: str) -> str:
    return ", ".join(f"{_short(k)}={_value(str(v))}" for k, v in design.tuned_values(variant).items())


def _value(v: str) -> str:
    """A tuned float to 3 significant digits; integers and names as they are."""
    if v.lstrip("-").isdigit():
        return v
    try:
        return f"{float(v):.3g}"
    except ValueError:
        return v


def metric_direction(metric: str) -> str:
    """The direction of a metric other than the study's (``record.spec.metrics.better``: losses, perplexities,
    error rates and costs go down; accuracies and throughputs up); one with none of its own (when a run stopped)
    is read as lower-is-better, and the table says so."""
    return better(metric) or "minimize"


def _float(v: Any) -> float:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return math.nan
    return x


def outcome(row: Any, metric: str, never_learned: dict[str, tuple[float, str]]) -> str:
    """A cell's outcome: success | diverged | failed | killed | not_learned | pending (running, or trained only by
    other code: no outcome of this code yet). A finished run whose decision metric is non-finite diverged (its
    outputs did, whatever the metric is called); one without the metric at all failed to give a result."""
    state = str(row.get("state", ""))
    if state in ("running", OTHER_CODE):
        return "pending"
    if state == "finished":
        if not math.isfinite(_float(row.get(metric))):
            return "diverged" if metric in str(row.get(NONFINITE) or "").split(",") else "failed"
        for m, (threshold, direction) in never_learned.items():
            v = _float(row.get(m))
            if math.isfinite(v) and (v >= threshold if direction == "minimize" else v <= threshold):
                return "not_learned"
        return "success"
    return state if state in ("diverged", "killed") else "failed"


@dataclass
class _Frame:
    """What ``build`` works from: the cells with their outcomes, and each variant's values under the failure rule
    (``values``), with the seeds whose value was imputed for a failure (``imputed``)."""

    cells: Any
    variants: list[str]
    values: dict[str, dict[Any, float]]
    imputed: dict[str, set[Any]]
    worst: float


def build(
    runs: StudyRuns,
    metric: str | None = None,
    *,
    baseline: str | None = None,
    analysis: Analysis | None = None,
    n_boot: int = stats.BOOT_RESAMPLES,
    curves: bool = True,
) -> Table:
    """The ablation table of a study's cells (see the module docstring). ``analysis``: how to compare (default:
    the ``analysis`` section the submission recorded in design.json, or the defaults); ``curves``: read the
    cells' loss curves from MLflow to check convergence (a dry run's pilot needs none)."""
    analysis = analysis or runs.design.analysis
    metric, direction, notes = _decision_metric(runs, metric)
    baseline = _baseline(runs, baseline)
    frame = _frame(runs, metric, direction, analysis, notes)
    contrasts = _contrasts(runs, frame, baseline, analysis, n_boot, metric)
    falls = _judged_falls(runs, frame.cells, analysis) if curves and analysis.converged else {}
    contrasts = _judge(runs, frame, contrasts, metric, analysis, falls)
    contrasts = stats.correct(contrasts, analysis.alpha, direction)
    rows = _rows(runs, frame, contrasts, baseline, metric, analysis, n_boot)
    ranking = caveats.best_variant(
        {r.variant: r.rule_mean for r in rows}, [c for c in contrasts if c.in_family], direction
    )
    for r in rows:
        r.best = r.variant == ranking.variant
    found = _caveats(runs, frame.cells, rows, contrasts, metric, analysis, notes, curves)
    notes += _row_notes(rows, frame.cells, metric) + _contrast_notes(contrasts) + _registration_notes(runs, contrasts)
    source = runs.design.source or f"ablations/studies/{runs.name}.yaml"
    return Table(
        runs.name, metric, direction, baseline, rows, analysis, contrasts, frame.worst, notes, found, ranking, source,
        runs.registrations, seed_records(frame, metric), _grid(runs, frame)[2] if _grid(runs, frame)[1] else {},
    )  # fmt: skip


def seed_records(frame: _Frame, metric: str) -> list[dict[str, Any]]:
    """One record per cell: its variant, seed and cell id, its outcome and why, the metric as its run logged it,
    and the value it entered the comparisons with (``rule_value``: its own, one imputed for a failure under the
    rule, or none: left out)."""
    out = []
    for row in frame.cells.to_dict("records"):
        v, s = row["variant"], row["seed"]
        logged = _float(row.get(metric))
        out.append(
            {
                "variant": v,
                "seed": s,
                "cell_id": row["cell_id"],
                "outcome": row["_outcome"],
                "detail": row.get("detail", ""),
                "value": logged if math.isfinite(logged) else None,
                "rule_value": frame.values.get(v, {}).get(s),
                "imputed": s in frame.imputed.get(v, set()),
                **{k: row[k] for k in row if k.startswith(AXIS_PREFIX)},  # the cell's levels of the design's axes
            }
        )
    return out


def _decision_metric(runs: StudyRuns, metric: str | None) -> tuple[str, str, list[str]]:
    """The metric compared, its direction, and a note when it has none of its own."""
    study_metric, direction = runs.design.metric, runs.design.direction
    if metric and metric != study_metric:
        direction = metric_direction(metric)
    metric = metric or study_metric
    if metric not in runs.cells.columns:
        raise stats_error(runs, metric)
    notes = []
    if better(metric) is None and metric != study_metric:
        notes.append(
            f"{metric} has no direction of its own (it says when a run stopped): 'better' reads lower as better"
        )
    return metric, direction, notes


def _baseline(runs: StudyRuns, baseline: str | None) -> str:
    baseline = baseline or runs.baseline
    if baseline not in runs.variants:
        close = difflib.get_close_matches(str(baseline), runs.variants, 1, 0.6)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ValueError(
            f"baseline {baseline!r} is not a variant of {runs.name!r}; {hint}variants: {', '.join(runs.variants)}"
        )
    return baseline


def _frame(runs: StudyRuns, metric: str, direction: str, analysis: Analysis, notes: list[str]) -> _Frame:
    """Each cell's outcome, and each variant's values with failed seeds entered under the failure rule."""
    cells = runs.cells
    study_metric, study_direction = runs.design.metric, runs.design.direction
    never = {
        m: (t, (study_direction or "minimize") if m == study_metric else metric_direction(m))
        for m, t in analysis.never_learned.items()
    }
    for key in ("margins", "detect", "never_learned", "failure_values"):
        notes += [
            f"analysis.{key} names {m!r}, which no run of this study logged"
            for m in getattr(analysis, key)
            if m not in cells.columns
        ]
    kinds = [outcome(row, metric, never) for row in cells.to_dict("records")]
    cells = cells.assign(_outcome=kinds)
    # the values cells reached by finishing (learned or not); a diverged run's last value is not a measurement
    observed = stats.finite(cells.loc[cells["_outcome"].isin(FINISHED), metric])
    worst = float(observed.max() if direction == "minimize" else observed.min()) if observed.size else math.nan
    fill = _fill(analysis, metric, worst, notes)
    variants = [v for v in runs.variants if (cells["variant"] == v).any()]
    values, imputed = {}, {}
    for v in variants:
        sub = cells[cells["variant"] == v]
        values[v], imputed[v] = {}, set()
        for seed, kind, value in zip(sub["seed"], sub["_outcome"], sub[metric]):
            if kind == "success":
                values[v][seed] = float(value)
            elif kind != "pending" and fill is not None and math.isfinite(fill):
                values[v][seed] = fill
                imputed[v].add(seed)
    if analysis.failure_rule != "exclude" and any(k not in ("success", "pending") for k in kinds) and not observed.size:
        notes.append(f"no finished cell has {metric}: failed seeds have no worst value to take")
    return _Frame(cells, variants, values, imputed, worst)


def _fill(analysis: Analysis, metric: str, worst: float, notes: list[str]) -> float | None:
    """The value a failed seed takes under the failure rule (None: left out)."""
    if analysis.failure_rule == "value" and metric in analysis.failure_values:
        return float(analysis.failure_values[metric])
    if analysis.failure_rule == "exclude":
        return None
    if analysis.failure_rule == "value":
        notes.append(f"analysis.failure_values has no value for {metric}: failed seeds take the worst observed")
    return worst


def _grid(runs: StudyRuns, frame: _Frame) -> tuple[list[str], bool, dict[str, list[str]]]:
    """The design's axes present in the cells, whether it is a grid, and each axis's levels in the study's order."""
    cells = frame.cells
    axes = [a for a in runs.design.axes if AXIS_PREFIX + a in cells.columns]
    is_grid = runs.design.kind == "grid" and len(axes) >= 1
    order = cells["variant"].map({v: i for i, v in enumerate(frame.variants)})
    ordered = cells.assign(_order=order).sort_values("_order")
    return axes, is_grid, {a: list(dict.fromkeys(str(x) for x in ordered[AXIS_PREFIX + a])) for a in axes}


def _contrasts(
    runs: StudyRuns, frame: _Frame, baseline: str, analysis: Analysis, n_boot: int, metric: str
) -> list[stats.Contrast]:
    """Every row's contrast against the baseline, the family's other pairs, and a grid's factorial effects (in
    the family where declared, or by default), before Holm's correction."""
    axes, is_grid, levels = _grid(runs, frame)
    family = analysis.family(frame.variants, baseline, axes, is_grid)
    explore = _explored(runs, frame, family, levels)  # outside the confirmatory family: not counted in its size
    size = max(1, family.size({a: len(v) for a, v in levels.items()}) - len(explore))
    common = dict(
        test=analysis.test,
        confidence=analysis.confidence,
        margin=analysis.margins.get(metric),
        power=analysis.power,
        detect=analysis.detect.get(metric),
        family_size=size,
        n_boot=n_boot,
    )
    outcomes = _outcomes(frame, analysis)
    declared = set(family.pairs)

    def pair(a: str, b: str) -> stats.Contrast:
        c = stats.paired_contrast(frame.values.get(b, {}), frame.values.get(a, {}), a=a, b=b, **common)
        ia, ib = frame.imputed.get(a, set()), frame.imputed.get(b, set())
        every = next((v for v, i in ((a, ia), (b, ib)) if c.seeds and set(c.seeds) <= i), "")
        p_rate = stats.rate_test(outcomes.get(a, EMPTY), outcomes.get(b, EMPTY))
        return dataclasses.replace(
            c, in_family=(a, b) in declared, p_rate=p_rate, imputed=len(set(c.seeds) & (ia | ib)), all_imputed=every
        )

    contrasts = [pair(v, baseline) for v in frame.variants if v != baseline]
    contrasts += [pair(a, b) for a, b in family.pairs if b != baseline or a not in frame.variants]
    if is_grid:
        df = frame.cells.rename(columns={AXIS_PREFIX + a: a for a in axes})
        df = df[df["variant"].isin(frame.variants)]
        df = df.assign(_value=[frame.values[v].get(s, math.nan) for v, s in zip(df["variant"], df["seed"])])
        contrasts += stats.factorial_effects(
            df, axes, "_value", declared_main=family.main, declared_interactions=family.interactions, **common
        )
    return [
        dataclasses.replace(c, in_family=False, exploratory=explore[c.label])
        if c.in_family and c.label in explore
        else c
        for c in contrasts
    ]


def _explored(runs: StudyRuns, frame: _Frame, family, levels: dict[str, list[str]]) -> dict[str, str]:
    """The family's contrasts added or changed after results of their cells existed (``dashboards.exploratory``)."""
    involved = {f"{a} vs {b}": (a, b) for a, b in family.pairs}
    for label in stats.effect_labels(levels, family.main, family.interactions):
        involved[label] = tuple(frame.variants)  # an effect compares every variant's cells
    return exploratory(runs.registrations, involved)


EMPTY = stats.Successes(0, 0, stats.NAN2)


def _outcomes(frame: _Frame, analysis: Analysis) -> dict[str, stats.Successes]:
    cells = frame.cells
    out = {}
    for v in frame.variants:
        kinds = list(cells.loc[cells["variant"] == v, "_outcome"])
        out[v] = stats.successes(
            [k for k in kinds if k != "pending"], analysis.confidence, pending=kinds.count("pending")
        )
    return out


def _rows(
    runs: StudyRuns,
    frame: _Frame,
    contrasts: list[stats.Contrast],
    baseline: str,
    metric: str,
    analysis: Analysis,
    n_boot: int,
) -> list[VariantRow]:
    cells, outcomes = frame.cells, _outcomes(frame, analysis)
    mine = {c.a: c for c in contrasts if c.kind == "pair" and c.b == baseline}
    rows = []
    for v in frame.variants:
        sub = cells[cells["variant"] == v]
        ok = sub[sub["_outcome"] == "success"]
        costs = {key: float(ok[key].mean()) for key, _ in COSTS if key in ok.columns and len(ok)}
        rv = list(frame.values[v].values())
        rows.append(
            VariantRow(
                v,
                _changed(runs.design, v, baseline),
                stats.describe(ok[metric], confidence=analysis.confidence, n_boot=n_boot),
                mine.get(v) if v != baseline else None,
                outcomes[v],
                costs,
                rule_mean=sum(rv) / len(rv) if rv else math.nan,
                finished=int((sub["state"] == "finished").sum()),
                tuned=_tuned(runs.design, v),
            )
        )
    return rows


def _row_notes(rows: list[VariantRow], cells: Any, metric: str) -> list[str]:
    notes = []
    for r in rows:
        o = r.outcomes
        if o.pending:
            notes.append(
                f"{r.variant}: {o.pending} cell(s) without an outcome yet (running, or trained only by other code "
                "than the latest submission's)"
            )
        sub = cells[(cells["variant"] == r.variant) & (cells["state"] == "finished")]
        unvalued = int((~sub["_outcome"].isin(FINISHED)).sum())
        if unvalued:
            notes.append(f"{r.variant}: {unvalued} finished run(s) without a finite {metric}, counted as failures")
        if o.cells and o.successes == 0:
            notes.append(f"{r.variant}: failed on every seed ({_failures(o)})")
        elif r.summary.n == 1:
            notes.append(f"{r.variant}: one successful seed only, no interval")
        if r.best and r.failed_any:
            notes.append(f"{r.variant} is best {FAILED_MARK} although {o.failures} of {o.cells} seeds failed")
    return notes


def _registration_notes(runs: StudyRuns, contrasts: list[stats.Contrast]) -> list[str]:
    notes = []
    if not runs.registrations:
        notes.append(
            "not registered: no declaration of this study was recorded before its results (its submissions predate "
            "registration); its next submission registers it, after these results"
        )
    if any(c.exploratory for c in contrasts):
        notes.append(
            "exploratory contrasts were added or changed after results of their cells existed: tested and shown, "
            "Holm-corrected among themselves, outside the confirmatory family"
        )
    return notes


def _contrast_notes(contrasts: list[stats.Contrast]) -> list[str]:
    return [
        f"{c.label}: untestable ({c.method.split(': ', 1)[-1]}); counted in the family with p = 1"
        for c in contrasts
        if c.in_family and not c.testable
    ]


# --- not testable here ---------------------------------------------------------------------------------------


def _judge(
    runs: StudyRuns,
    frame: _Frame,
    contrasts: list[stats.Contrast],
    metric: str,
    analysis: Analysis,
    falls: dict[str, list[float]],
) -> list[stats.Contrast]:
    """Mark the family's contrasts the miniature cannot test (``dashboards/testable.py``): no room in the metric
    for the effect the study expects, or a variant not converged by the declared criterion."""
    still = testable.not_converged(falls, analysis.converged) if analysis.converged else {}
    steps = _mean(frame.cells, "cost/steps")
    out = []
    for c in contrasts:
        problem = None
        if c.in_family and still:
            involved = (c.a, c.b) if c.kind == "pair" else frame.variants
            problem = testable.convergence_problem(involved, still, analysis.converged, steps)
        if c.in_family and problem is None:
            problem = _room(runs, frame, c, metric, analysis)
        if problem:
            c = dataclasses.replace(c, untestable_here=problem[0], make_testable=problem[1])
        out.append(c)
    return out


def _room(runs: StudyRuns, frame: _Frame, c: stats.Contrast, metric: str, analysis: Analysis) -> tuple[str, str] | None:
    """The room check of an expectation declared for this contrast on this metric (pairs and main effects)."""
    expect = next(
        (e for e in analysis.expect if e.name == c.label and (e.metric or runs.design.metric) == metric), None
    )
    if expect is None or c.kind == "interaction":
        return None
    cells = frame.cells
    ok = cells[cells["_outcome"] == "success"]
    if c.kind == "pair":
        comparator = ok[ok["variant"] == c.b]
    else:
        axis = c.label.split(": ", 1)[0]
        comparator = ok[ok[AXIS_PREFIX + axis].astype(str) == c.b]
    rows = comparator.to_dict("records")
    classes = next((k for k in map(caveats.output_classes, rows) if k is not None), None)
    majority = _mean(comparator, majority_metric(metric))
    span = testable.bounds(metric, classes, majority if math.isfinite(majority) else None)
    return testable.room_problem(expect, _mean(comparator, metric), span, metric)


def _mean(cells: Any, column: str) -> float:
    x = stats.finite(cells[column]) if column in cells.columns else stats.finite([])
    return float(x.mean()) if x.size else math.nan


def _judged_falls(runs: StudyRuns, cells: Any, analysis: Analysis) -> dict[str, list[float]]:
    """The falls the declared convergence criterion judges (its own window)."""
    falls, _, _ = _falls(runs, cells, analysis.converged.window)
    return falls


FINISHED = ("success", "not_learned")  # outcomes of cells whose runs trained to the end


def _caveats(
    runs: StudyRuns,
    cells: Any,
    rows: list[VariantRow],
    contrasts: list[stats.Contrast],
    metric: str,
    analysis: Analysis,
    notes: list[str],
    curves: bool,
) -> list[caveats.Caveat]:
    """The warnings of dashboards/caveats.py, from the table's rows and contrasts and the cells behind them."""
    warn = analysis.warn
    found: list[caveats.Caveat | None] = []
    variants = [r.variant for r in rows]
    by_variant = {v: cells[cells["variant"] == v] for v in variants}
    classes = {
        v: next((k for k in map(caveats.output_classes, sub.to_dict("records")) if k is not None), None)
        for v, sub in by_variant.items()
    }
    found.append(caveats.near_chance({r.variant: (r.summary.mean, r.summary.n) for r in rows}, classes, metric, warn))
    if curves:
        falls, curve, unjudged = _falls(runs, cells, warn.converged_window)
        caveat, note = caveats.not_converged(falls, curve, warn, [v for v in variants if v in unjudged])
        found.append(caveat)
        if note:
            notes.append(note)
    found.append(caveats.param_ratio(_compared_params(cells, by_variant, contrasts), warn))
    models = _models(by_variant)
    found.append(caveats.same_family(models))
    found.append(caveats.coinciding_scores(models))  # scores compared in self-attention where q and k are one tensor
    intervals = [(r.variant, (r.variant,), r.summary.n) for r in rows if r.summary.n >= 2 and r.summary.spread]
    intervals += [
        (c.label, (c.a, c.b), c.n)
        for c in contrasts
        if c.kind == "pair" and c.n >= 2 and c.spread and math.isfinite(c.ci_t[0])
    ]
    found.append(caveats.few_seeds(intervals, warn, analysis.test))
    found.append(caveats.unresolvable([c for c in contrasts if c.in_family], analysis.alpha, analysis.test))
    found.append(caveats.unshowable_equivalence([c for c in contrasts if c.in_family], analysis.alpha, analysis.test))
    means = {r.variant: (r.summary.mean, r.summary.n) for r in rows}
    found += caveats.own_warnings(caveats.TableView(means, tuple(contrasts), models, cells, metric))
    out = [c for c in found if c is not None]
    effects = tuple(c.label for c in contrasts if c.kind != "pair")
    for i, c in enumerate(out):  # a variant's caveat concerns its contrasts and every factorial effect
        if c.kind in ("chance", "convergence"):
            mine = tuple(x.label for x in contrasts if x.kind == "pair" and {x.a, x.b} & set(c.variants))
            out[i] = dataclasses.replace(c, contrasts=mine + effects)
    return out


def _compared_params(cells: Any, by_variant: dict[str, Any], contrasts: list[stats.Contrast]) -> list[tuple]:
    """(label, a, b, a's mean parameters, b's) of each pair and each factorial main effect: the parameter ratio's
    input (dashboards/caveats.py)."""
    params = {}
    for v, sub in by_variant.items():
        x = stats.finite(sub["cost/n_params"]) if "cost/n_params" in sub.columns else stats.finite([])
        params[v] = float(x.mean()) if x.size else math.nan
    compared = [
        (c.label, c.a, c.b, params.get(c.a, math.nan), params.get(c.b, math.nan)) for c in contrasts if c.kind == "pair"
    ]
    for c in contrasts:
        axis = c.label.split(": ", 1)[0]
        if c.kind == "main" and "cost/n_params" in cells.columns and AXIS_PREFIX + axis in cells.columns:
            level_of = cells[AXIS_PREFIX + axis].astype(str)
            at = {level: stats.finite(cells.loc[level_of == level, "cost/n_params"]) for level in (c.a, c.b)}
            mean = {k: float(x.mean()) if x.size else math.nan for k, x in at.items()}
            compared.append((c.label, f"{axis}={c.a}", f"{axis}={c.b}", mean[c.a], mean[c.b]))
    return compared


def _models(by_variant: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Each variant's model fields, from its first cell's params (as MLflow keeps them: text)."""
    prefix = f"{PARAMS_PREFIX}{MODEL_PARAMS}"
    out = {}
    for v, sub in by_variant.items():
        if len(sub):
            row = sub.iloc[0]
            out[v] = {k.removeprefix(prefix): str(row[k]) for k in sub.columns if k.startswith(prefix)}
    return out


def _falls(runs: StudyRuns, cells: Any, window: float) -> tuple[dict[str, list[float]], dict[str, str], set[str]]:
    """variant -> the relative fall of each finished cell's val/loss over the last ``window`` of its steps (the
    training loss's trend where validation was too sparse to tell); the curve used; the variants with a
    finished cell that no curve could judge."""
    done = cells[cells["_outcome"].isin(FINISHED)]
    ids = list(done["run_id"])
    val = runs.history("val/loss", ids) if ids else {}
    falls: dict[str, list[float]] = {}
    curve: dict[str, str] = {}
    unjudged: set[str] = set()
    sparse = [r for r in ids if caveats.recent_fall(val.get(r, []), window) is None]
    train = runs.history("train/loss", sparse) if sparse else {}
    for variant, run_id in zip(done["variant"], done["run_id"]):
        fall = caveats.recent_fall(val.get(run_id, []), window)
        key = "val/loss"
        if fall is None:
            fall, key = caveats.trend_fall(train.get(run_id, []), window), "train/loss"
        if fall is None:
            unjudged.add(variant)
            continue
        falls.setdefault(variant, []).append(fall)
        curve[variant] = key if curve.get(variant, key) == key else "val/loss and train/loss"
    return falls, curve, unjudged


def _failures(o: stats.Successes) -> str:
    parts = [(o.diverged, "diverged"), (o.failed, "failed"), (o.not_learned, "did not learn")]
    return ", ".join(f"{n} {w}" for n, w in parts if n)


def stats_error(runs: StudyRuns, metric: str) -> ValueError:
    known = sorted(c for c in runs.cells.columns if "/" in c and not c.startswith(("train/", AXIS_PREFIX)))
    close = difflib.get_close_matches(metric, known, 3, 0.6)
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    shown = ", ".join(known[:30]) + (" ..." if len(known) > 30 else "")
    return ValueError(f"no run of {runs.name!r} has the metric {metric!r}; {hint}metrics there: {shown}")
