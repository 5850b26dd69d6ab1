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
import math
from dataclasses import dataclass, field
from typing import Any

from dashboards import caveats
from record import stats
from record.judge import (
    FINISHED,
    Frame,
    as_float,
    baseline_of,
    corrected,
    decision_metric,
    frame_of,
    grid,
    outcomes_of,
    verdicts_by_rule,
)
from record.recorded import LookRecord, PlanRecord, RecordedDesign
from record.runs import MODEL_PARAMS, PARAMS_PREFIX, StudyRuns, output_classes
from record.spec.analysis import Analysis
from record.testable import Falls
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
    plan: PlanRecord | None = None  # the seed plan, as declared (and the metric its looks decide on, when another)
    looks: list[LookRecord] = field(default_factory=list)  # per look: seeds per variant, alpha, open, not testable
    decided_at: dict[str, str] = field(default_factory=dict)  # a seed plan's contrast: the look that decided it
    design_metric: str = ""  # the study's own metric (a table may be of another): what a claim without one means
    by_rule: dict[str, dict[str, str]] = field(default_factory=dict)  # with failures: each verdict under each rule

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
    def margin(self) -> str | None:
        """How the metric's equivalence margin reads ("±0.01", "±0.05 of the comparator (ratio)"); None: none."""
        m = self.analysis.margin(self.metric)
        return None if m is None else m[2]

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
        nothing = stats.Measured(
            label="", kind="pair", a="", b="", n=0, estimate=nan, ci_t=stats.NAN2, p=nan, method=""
        )
        c = stats.Contrast(nothing, stats.Standing(in_family=False))
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
        "margin": nan if c.margin is None else c.margin,
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
    metric, direction, notes = decision_metric(runs, metric)
    baseline = baseline_of(runs, baseline)
    frame = frame_of(runs, metric, direction, analysis, notes)
    falls = _judged_falls(runs, frame.cells, analysis) if curves and analysis.converged else Falls()
    contrasts = corrected(runs, frame, baseline, analysis, metric, direction, n_boot=n_boot, falls=falls)
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
        runs.registrations, seed_records(frame, metric), grid(runs, frame)[2] if grid(runs, frame)[1] else {},
        design_metric=runs.design.metric, by_rule=_by_rule(runs, frame, analysis, metric, baseline, falls, contrasts),
    )  # fmt: skip


def _by_rule(
    runs: StudyRuns, frame: Frame, analysis: Analysis, metric: str, baseline: str, falls: Falls, judged: list
) -> dict:
    """Where some cell failed, each verdict under every failure rule (``record.judge.verdicts_by_rule``); a seed
    plan's verdicts are its looks', which one rule decided, so it has none."""
    failed = frame.cells["_outcome"].isin(["diverged", "failed", "killed", "not_learned"]).any()
    if not failed or runs.design.plan is not None:
        return {}
    return verdicts_by_rule(runs, analysis, metric, baseline, judged, falls)


def seed_records(frame: Frame, metric: str) -> list[dict[str, Any]]:
    """One record per cell: its variant, seed and cell id, its outcome and why, the metric as its run logged it,
    and the value it entered the comparisons with (``rule_value``: its own, one imputed for a failure under the
    rule, or none: left out)."""
    out = []
    for row in frame.cells.to_dict("records"):
        v, s = row["variant"], row["seed"]
        logged = as_float(row.get(metric))
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


def _rows(
    runs: StudyRuns,
    frame: Frame,
    contrasts: list[stats.Contrast],
    baseline: str,
    metric: str,
    analysis: Analysis,
    n_boot: int,
) -> list[VariantRow]:
    cells, outcomes = frame.cells, outcomes_of(frame, analysis)
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
            notes.append(f"{r.variant}: failed on every seed ({failure_counts(o)})")
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


def _judged_falls(runs: StudyRuns, cells: Any, analysis: Analysis) -> Falls:
    """The falls the declared convergence criterion judges (its own window)."""
    falls, _, _ = _falls(runs, cells, analysis.converged.window)
    return falls


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
        v: next((k for k in map(output_classes, sub.to_dict("records")) if k is not None), None)
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


def _falls(runs: StudyRuns, cells: Any, window: float) -> tuple[Falls, dict[str, str], set[str]]:
    """Each finished cell's val/loss over the last ``window`` of its steps (the training loss's trend where
    validation was too sparse to tell): its fall, relative and absolute, and its last value, per variant; the
    curve used; the variants with a finished cell that no curve could judge."""
    done = cells[cells["_outcome"].isin(FINISHED)]
    ids = list(done["run_id"])
    val = runs.history("val/loss", ids) if ids else {}
    falls = Falls()
    curve: dict[str, str] = {}
    unjudged: set[str] = set()
    sparse = [r for r in ids if caveats.recent_ends(val.get(r, []), window) is None]
    train = runs.history("train/loss", sparse) if sparse else {}
    for variant, run_id in zip(done["variant"], done["run_id"]):
        ends = caveats.recent_ends(val.get(run_id, []), window)
        key = "val/loss"
        if ends is None:
            ends, key = caveats.trend_ends(train.get(run_id, []), window), "train/loss"
        if ends is None or ends[0] == 0:
            unjudged.add(variant)
            continue
        start, end = ends
        falls.relative.setdefault(variant, []).append((start - end) / abs(start))
        falls.absolute.setdefault(variant, []).append(start - end)
        falls.last.setdefault(variant, []).append(end)
        curve[variant] = key if curve.get(variant, key) == key else "val/loss and train/loss"
    return falls, curve, unjudged


def failure_counts(o: stats.Successes) -> str:
    """ "6 diverged, 1 failed": a variant's failures by kind."""
    parts = [(o.diverged, "diverged"), (o.failed, "failed"), (o.not_learned, "did not learn")]
    return ", ".join(f"{n} {w}" for n, w in parts if n)
