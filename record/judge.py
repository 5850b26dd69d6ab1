"""A study's family of contrasts judged from its cells, as every verdict is: each cell's outcome, each variant's
values under the failure rule, the declared contrasts (pairs and a grid's effects) tested, the ones the miniature
cannot test marked (``record.testable``), those changed after results marked exploratory (``record.exploratory``),
and Holm's correction. The report's table (``dashboards/table.py``: ``frame_of`` and ``corrected``, between which
it judges convergence from the curves) and a seed plan's looks (``record.looks``: ``judge``) both judge through it,
so a sweep decides its next seeds by the verdicts its report will show.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, field
from typing import Any

from record import stats, testable
from record.exploratory import exploratory
from record.runs import NONFINITE, OTHER_CODE, StudyRuns, output_classes
from record.spec.analysis import Analysis
from record.spec.metrics import better, majority_metric
from record.vocabulary import AXIS_PREFIX


def metric_direction(metric: str) -> str:
    """The direction of a metric other than the study's (``record.spec.metrics.better``: losses, perplexities,
    error rates and costs go down; accuracies and throughputs up); one with none of its own (when a run stopped)
    is read as lower-is-better, and the table says so."""
    return better(metric) or "minimize"


def as_float(v: Any) -> float:
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
        if not math.isfinite(as_float(row.get(metric))):
            return "diverged" if metric in str(row.get(NONFINITE) or "").split(",") else "failed"
        for m, (threshold, direction) in never_learned.items():
            v = as_float(row.get(m))
            if math.isfinite(v) and (v >= threshold if direction == "minimize" else v <= threshold):
                return "not_learned"
        return "success"
    return state if state in ("diverged", "killed") else "failed"


@dataclass
class Frame:
    """What ``build`` works from: the cells with their outcomes, and each variant's values under the failure rule
    (``values``), with the seeds whose value was imputed for a failure (``imputed``)."""

    cells: Any
    variants: list[str]
    values: dict[str, dict[Any, float]]
    imputed: dict[str, set[Any]]
    worst: float


def decision_metric(runs: StudyRuns, metric: str | None) -> tuple[str, str, list[str]]:
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


def baseline_of(runs: StudyRuns, baseline: str | None) -> str:
    baseline = baseline or runs.baseline
    if baseline not in runs.variants:
        close = difflib.get_close_matches(str(baseline), runs.variants, 1, 0.6)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ValueError(
            f"baseline {baseline!r} is not a variant of {runs.name!r}; {hint}variants: {', '.join(runs.variants)}"
        )
    return baseline


def frame_of(runs: StudyRuns, metric: str, direction: str, analysis: Analysis, notes: list[str]) -> Frame:
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
    return Frame(cells, variants, values, imputed, worst)


def _fill(analysis: Analysis, metric: str, worst: float, notes: list[str]) -> float | None:
    """The value a failed seed takes under the failure rule (None: left out)."""
    if analysis.failure_rule == "value" and metric in analysis.failure_values:
        return float(analysis.failure_values[metric])
    if analysis.failure_rule == "exclude":
        return None
    if analysis.failure_rule == "value":
        notes.append(f"analysis.failure_values has no value for {metric}: failed seeds take the worst observed")
    return worst


def grid(runs: StudyRuns, frame: Frame) -> tuple[list[str], bool, dict[str, list[str]]]:
    """The design's axes present in the cells, whether it is a grid, and each axis's levels in the study's order."""
    cells = frame.cells
    axes = [a for a in runs.design.axes if AXIS_PREFIX + a in cells.columns]
    is_grid = runs.design.kind == "grid" and len(axes) >= 1
    order = cells["variant"].map({v: i for i, v in enumerate(frame.variants)})
    ordered = cells.assign(_order=order).sort_values("_order")
    return axes, is_grid, {a: list(dict.fromkeys(str(x) for x in ordered[AXIS_PREFIX + a])) for a in axes}


def contrasts_of(
    runs: StudyRuns,
    frame: Frame,
    baseline: str,
    analysis: Analysis,
    n_boot: int,
    metric: str,
    falls: testable.Falls | None = None,
) -> list[stats.Contrast]:
    """Every row's contrast against the baseline, the family's other pairs, and a grid's factorial effects (in
    the family where declared, or by default), each placed where the study puts it (``Placing``), before Holm's
    correction. ``falls``: the convergence criterion's judged falls, per variant (none: not judged)."""
    axes, is_grid, levels = grid(runs, frame)
    family = analysis.family(frame.variants, baseline, axes, is_grid)
    explore = _explored(runs, frame, family, levels)  # outside the confirmatory family: not counted in its size
    size = max(1, family.size({a: len(v) for a, v in levels.items()}) - len(explore))
    common = dict(
        test=analysis.test,
        confidence=analysis.confidence,
        margin=None if (m := analysis.margin(metric)) is None else stats.MarginOf(*m),
        power=analysis.power,
        detect=analysis.detect.get(metric),
        family_size=size,
        n_boot=n_boot,
    )
    declared = set(family.pairs)

    def pair(a: str, b: str) -> stats.Contrast:
        values = frame.values
        return stats.paired_contrast(
            values.get(b, {}), values.get(a, {}), a=a, b=b, in_family=(a, b) in declared, **common
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
    placing = Placing(runs, frame, analysis, metric, explore, falls or testable.Falls())
    return [c.placed(placing.standing(c)) for c in contrasts]


def _explored(runs: StudyRuns, frame: Frame, family, levels: dict[str, list[str]]) -> dict[str, str]:
    """The family's contrasts added or changed after results of their cells existed (``record.exploratory``)."""
    involved = {f"{a} vs {b}": (a, b) for a, b in family.pairs}
    for label in stats.effect_labels(levels, family.main, family.interactions):
        involved[label] = tuple(frame.variants)  # an effect compares every variant's cells
    return exploratory(runs.registrations, involved)


EMPTY = stats.Successes(0, 0, stats.NAN2)


def outcomes_of(frame: Frame, analysis: Analysis) -> dict[str, stats.Successes]:
    cells = frame.cells
    out = {}
    for v in frame.variants:
        kinds = list(cells.loc[cells["variant"] == v, "_outcome"])
        out[v] = stats.successes(
            [k for k in kinds if k != "pending"], analysis.confidence, pending=kinds.count("pending")
        )
    return out


class Placing:
    """Where the study puts each measured contrast (``stats.Standing``): in its confirmatory family as declared,
    unless added or changed after results (exploratory); a pair's failures (the success-rate test, the seeds
    imputed under the failure rule); and, in the family, what the miniature cannot test (``record/testable.py``:
    no room in the metric for the effect the study expects, or a variant not converged by the declared
    criterion)."""

    def __init__(
        self, runs: StudyRuns, frame: Frame, analysis: Analysis, metric: str, explore: dict, falls: testable.Falls
    ):
        self.runs, self.frame, self.analysis, self.metric, self.explore = runs, frame, analysis, metric, explore
        self.outcomes = outcomes_of(frame, analysis)
        self.still = testable.not_converged(falls, analysis.converged) if analysis.converged and falls else {}
        self.steps = mean_of(frame.cells, "cost/steps")
        self._levels: dict[tuple, tuple[float, testable.Bounds | None]] = {}

    def standing(self, c: stats.Contrast) -> stats.Standing:
        explored = c.in_family and c.label in self.explore
        in_family = c.in_family and not explored
        problem = self._problem(c) if in_family else None
        untestable, make = problem or ("", "")
        level, span = self._comparator(c) if c.margin is not None else (math.nan, None)
        vacuous = None
        if c.margin is not None:
            vacuous = testable.margin_problem(c.margin, level, span, self.metric, c.margin_scale, c.margin_text)
        no_equivalence, make_equivalence = vacuous or ("", "")
        return stats.Standing(
            in_family=in_family, exploratory=self.explore[c.label] if explored else "", untestable_here=untestable,
            make_testable=make, comparator=level, equivalence_untestable_here=no_equivalence,
            make_equivalence_testable=make_equivalence, **(self._failures(c) if c.kind == "pair" else {}),
        )  # fmt: skip

    def _comparator(self, c: stats.Contrast) -> tuple[float, testable.Bounds | None]:
        """The comparator's mean on the metric (a pair's b, a main effect's reference level; nan for an
        interaction) and the span the metric can take on its task; read once per comparator (a seed plan's
        looks judge the family again after every batch)."""
        if c.kind == "interaction":
            return math.nan, None
        key = (c.kind, c.label.split(": ", 1)[0] if c.kind == "main" else "", c.b)
        if key not in self._levels:
            self._levels[key] = comparator_level(self.frame, c, self.metric)
        return self._levels[key]

    def _failures(self, c: stats.Contrast) -> dict[str, Any]:
        ia, ib = self.frame.imputed.get(c.a, set()), self.frame.imputed.get(c.b, set())
        every = next((v for v, i in ((c.a, ia), (c.b, ib)) if c.seeds and set(c.seeds) <= i), "")
        p_rate = stats.rate_test(self.outcomes.get(c.a, EMPTY), self.outcomes.get(c.b, EMPTY))
        return dict(p_rate=p_rate, imputed=len(set(c.seeds) & (ia | ib)), all_imputed=every)

    def _problem(self, c: stats.Contrast) -> tuple[str, str] | None:
        if self.still:
            involved = (c.a, c.b) if c.kind == "pair" else self.frame.variants
            problem = testable.convergence_problem(involved, self.still, self.analysis.converged, self.steps)
            if problem:
                return problem
        expect = next(
            (
                e
                for e in self.analysis.expect
                if e.name == c.label and (e.metric or self.runs.design.metric) == self.metric
            ),
            None,
        )
        if expect is None or c.kind == "interaction":
            return None
        level, span = self._comparator(c)
        return testable.room_problem(expect, level, span, self.metric)


def comparator_level(frame: Frame, c: stats.Contrast, metric: str) -> tuple[float, testable.Bounds | None]:
    """The mean of a pair's comparator (b), or of a main effect's reference level, over its successful cells, and
    the span the metric can take on its task (``record.testable.bounds``)."""
    cells = frame.cells
    ok = cells[cells["_outcome"] == "success"]
    if c.kind == "pair":
        comparator = ok[ok["variant"] == c.b]
    else:
        axis = c.label.split(": ", 1)[0]
        comparator = ok[ok[AXIS_PREFIX + axis].astype(str) == c.b]
    rows = comparator.to_dict("records")
    classes = next((k for k in map(output_classes, rows) if k is not None), None)
    majority = mean_of(comparator, majority_metric(metric))
    span = testable.bounds(metric, classes, majority if math.isfinite(majority) else None)
    return mean_of(comparator, metric), span


def mean_of(cells: Any, column: str) -> float:
    x = stats.finite(cells[column]) if column in cells.columns else stats.finite([])
    return float(x.mean()) if x.size else math.nan


FINISHED = ("success", "not_learned")  # outcomes of cells whose runs trained to the end


def stats_error(runs: StudyRuns, metric: str) -> ValueError:
    known = sorted(c for c in runs.cells.columns if "/" in c and not c.startswith(("train/", AXIS_PREFIX)))
    close = difflib.get_close_matches(metric, known, 3, 0.6)
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    shown = ", ".join(known[:30]) + (" ..." if len(known) > 30 else "")
    return ValueError(f"no run of {runs.name!r} has the metric {metric!r}; {hint}metrics there: {shown}")


@dataclass
class Judged:
    """The family's judgment: the metric and its direction, the baseline, the cells' frame, every contrast (the
    family's and the others, corrected), and the notes said on the way."""

    metric: str
    direction: str
    baseline: str
    frame: Frame
    contrasts: list[stats.Contrast]
    notes: list[str] = field(default_factory=list)

    @property
    def family(self) -> list[stats.Contrast]:
        return [c for c in self.contrasts if c.in_family]


def corrected(
    runs: StudyRuns,
    frame: Frame,
    baseline: str,
    analysis: Analysis,
    metric: str,
    direction: str,
    *,
    n_boot: int = stats.BOOT_RESAMPLES,
    falls: testable.Falls | None = None,
) -> list[stats.Contrast]:
    """Every contrast tested, the untestable marked (``falls``: the convergence criterion's judged falls, per
    variant; none: not judged), Holm's correction over the family and the verdicts."""
    contrasts = contrasts_of(runs, frame, baseline, analysis, n_boot, metric, falls)
    return stats.correct(contrasts, analysis.alpha, direction)


def verdicts_by_rule(
    runs: StudyRuns,
    analysis: Analysis,
    metric: str,
    baseline: str,
    judged: list[stats.Contrast],
    falls: testable.Falls | None = None,
) -> dict[str, dict[str, str]]:
    """Each family contrast's verdict under every failure rule the study can use (worst, exclude, and value where
    ``failure_values`` gives the metric one): label -> {rule: verdict}; ``judged``: the family under the declared
    rule, already judged. A failure rule decides what a failed seed counts as, and a verdict that holds under one
    rule only rests on that choice (issue 65)."""
    rules = ["worst", "exclude"] + (["value"] if metric in analysis.failure_values else [])
    out: dict[str, dict[str, str]] = {c.label: {analysis.failure_rule: c.verdict} for c in judged if c.in_family}
    for rule in rules:
        if rule == analysis.failure_rule:
            continue
        # the seeds a difference needs (detect) decide no verdict and cost a simulation each: not asked again
        under = analysis.model_copy(update={"failure_rule": rule, "detect": {}})
        for c in judge(runs, under, metric, baseline=baseline, n_boot=RULES_BOOT, falls=falls).family:
            out.setdefault(c.label, {})[rule] = c.verdict
    order = [analysis.failure_rule, *rules]  # "value" declared without a value for this metric is "worst" here
    return {label: dict(sorted(v.items(), key=lambda x: order.index(x[0]))) for label, v in out.items()}


RULES_BOOT = 199  # the other rules' verdicts are what is compared, not their intervals: fewer resamples


def judge(
    runs: StudyRuns,
    analysis: Analysis | None = None,
    metric: str | None = None,
    *,
    baseline: str | None = None,
    n_boot: int = stats.BOOT_RESAMPLES,
    falls: testable.Falls | None = None,
) -> Judged:
    """The family of ``runs`` judged under ``analysis`` (default: the one its design recorded)."""
    analysis = analysis or runs.design.analysis
    metric, direction, notes = decision_metric(runs, metric)
    baseline = baseline_of(runs, baseline)
    frame = frame_of(runs, metric, direction, analysis, notes)
    contrasts = corrected(runs, frame, baseline, analysis, metric, direction, n_boot=n_boot, falls=falls)
    return Judged(metric, direction, baseline, frame, contrasts, notes)


__all__ = [
    "EMPTY",
    "FINISHED",
    "Frame",
    "Judged",
    "as_float",
    "baseline_of",
    "contrasts_of",
    "corrected",
    "decision_metric",
    "frame_of",
    "grid",
    "judge",
    "Placing",
    "mean_of",
    "metric_direction",
    "outcome",
    "outcomes_of",
    "stats_error",
    "verdicts_by_rule",
]
