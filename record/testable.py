"""The fourth verdict, *not testable here*: the miniature leaves no room for the effect a study declares it is
looking for (``analysis.expect``), or its cells have not converged by a declared criterion
(``analysis.converged``). Computed from the study file and the cells, never typed; docs/statistics.md,
"Verdicts". record/judge.py marks the contrasts with it before Holm's correction."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from record.spec.analysis_parts import Converged, Expect, Margin
from record.spec.metrics import chance_kind
from record.stats.contrasts import NO_EQUIVALENCE

NOT_TESTABLE = "not testable here"


# --- room for the expected effect ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Bounds:
    """How far a metric can move on a task: from ``low`` to ``high``, each named for a reader (None: unknown)."""

    low: float | None
    low_name: str
    high: float | None
    high_name: str


def bounds(metric: str, classes: int | None, majority: float | None) -> Bounds | None:
    """The span an accuracy, loss or perplexity can take where a model that learned nothing sits at one end: an
    accuracy from the majority class's share (or a uniform guess's 1/C; 0 for an exact match of whole sequences)
    to 1; a loss from 0 to ln C, a perplexity from 1 to C (a uniform guess). None for other metrics."""
    kind = chance_kind(metric)
    if kind == "accuracy":
        if metric.endswith("exact_match"):
            return Bounds(0.0, "no sequence right", 1.0, "a perfect score")
        if majority is not None and (classes is None or majority >= 1 / classes):
            return Bounds(majority, "the majority class's share", 1.0, "a perfect score")
        if classes is not None:
            return Bounds(1 / classes, f"a uniform guess's 1/{classes}", 1.0, "a perfect score")
        return Bounds(0.0, "0", 1.0, "a perfect score")
    if kind == "loss":
        chance = math.log(classes) if classes else None
        return Bounds(0.0, "a perfect loss of 0", chance, f"a uniform guess's ln {classes}")
    if kind == "ppl":
        return Bounds(1.0, "a perfect perplexity of 1", float(classes) if classes else None, "a uniform guess's")
    return None


def room_problem(expect: Expect, comparator: float, span: Bounds | None, metric: str) -> tuple[str, str] | None:
    """(why the contrast is not testable, what would make it testable) when the room from the comparator's value
    to the metric's end in the expected direction is smaller than the expected effect; None when there is room
    or it cannot be judged."""
    if span is None or not math.isfinite(comparator):
        return None
    end, name = (span.high, span.high_name) if expect.value > 0 else (span.low, span.low_name)
    if end is None:
        return None
    room = end - comparator if expect.value > 0 else comparator - end
    if room >= abs(expect.value):
        return None
    source = f" ({expect.source})" if expect.source else ""
    why = (
        f"no room for the expected {expect.value:+.3g}{source}: the comparator scores {comparator:.3g} on {metric} "
        f"and {name} is {end:.3g}, {max(room, 0):.3g} away"
    )
    need = end - abs(expect.value) if expect.value > 0 else end + abs(expect.value)
    side = "below" if expect.value > 0 else "above"
    return why, f"a task, length or budget at which the comparator scores {side} {need:.3g}"


def _reach(margin: float, scale: str, end: float, side: str) -> float | None:
    """The comparator's value from which a margin reaches past ``end`` on ``side`` (below: a floor, above: a
    ceiling), on the margin's scale; None where it never does (a ratio never reaches a floor of 0)."""
    if scale == "log":
        return None if end <= 0 else end * math.exp(margin) if side == "below" else end / math.exp(margin)
    return end + margin if side == "below" else end - margin


def _ends(span: Bounds) -> list[tuple[float, str, str]]:
    """(end, its name, the side it bounds) of each known end of the metric."""
    out = [(span.low, span.low_name, "below")] if span.low is not None else []
    return out + ([(span.high, span.high_name, "above")] if span.high is not None else [])


def margin_problem(
    margin: float, comparator: float, span: Bounds | None, metric: str, scale: str = "absolute", text: str = ""
) -> tuple[str, str] | None:
    """(why no equivalence can be shown, what would make it testable) when the margin reaches past an end of the
    metric from the comparator's value: no variant can differ from it by the margin on that side, so one of the
    two one-sided tests cannot fail and "equivalent" would say only "not worse (or better) by m". None when the
    margin fits on both sides, or it cannot be judged. ``scale`` log: the margin is on the log values (a relative
    margin, ``text`` as declared), and so is the room (a loss's floor of 0 is infinitely far)."""
    if span is None or not math.isfinite(comparator) or (scale == "log" and comparator <= 0):
        return None
    for end, name, side in _ends(span):
        reach = _reach(margin, scale, end, side)
        if reach is None or (comparator > reach if side == "below" else comparator < reach):
            continue
        room = abs(comparator - end)
        if scale == "log":
            factor = comparator / end if side == "below" else end / comparator
            apart, fits = f"a factor {factor:.3g}", f"a factor {factor:.3g} (relative {factor - 1:.3g})"
        else:
            apart, fits = f"{room:.3g}", f"{room:.3g}"
        why = (
            f"the margin {text or f'±{margin:.3g}'} reaches past {name}: the comparator scores {comparator:.3g} on "
            f"{metric}, {apart} from it, so no variant can score the margin {side} it and one of the two one-sided "
            "tests cannot fail"
        )
        beyond = "above" if side == "below" else "below"
        return (
            why,
            f"a margin below {fits}, or a task, length or budget at which the comparator scores {beyond} {reach:.3g}",
        )
    return None


def margin_warning(margin: float | Margin, metric: str) -> str | None:
    """Before any run: where a margin on a metric with a hard end (``bounds`` without a task's classes: a loss's
    0, a perplexity's 1, an accuracy's 0 and 1) cannot show equivalence, said so that it can be changed before
    anything trains. A margin on the log scale (relative) never reaches a loss's floor of 0."""
    span = bounds(metric, None, None)
    if span is None:
        return None
    value, scale = (margin.on_log, "log") if isinstance(margin, Margin) else (float(margin), "absolute")
    wheres = []
    for end, name, side in _ends(span):
        reach = _reach(value, scale, end, side)
        if reach is not None:
            wheres.append(f"{name} where the comparator's {metric} is {side} {reach:.3g}")
    if not wheres:
        return None
    return (
        f"the margin {Margin.shown(margin)} on {metric} reaches past {', or '.join(wheres)}: no equivalence can be "
        f"shown there (one of the two one-sided tests cannot fail; the report says '{NO_EQUIVALENCE}')"
    )


# --- convergence --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Falls:
    """Per variant, over the last window of each finished seed's loss curve: the fall relative to the loss, the
    fall itself, and the curve's last value (whose spread over the seeds a fall is weighed against)."""

    relative: dict[str, list[float]] = field(default_factory=dict)
    absolute: dict[str, list[float]] = field(default_factory=dict)
    last: dict[str, list[float]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return any(self.relative.values())

    def spread(self, variant: str) -> float | None:
        """The standard deviation of the final loss over the variant's seeds (None with fewer than two)."""
        x = self.last.get(variant, [])
        return float(np.std(x, ddof=1)) if len(x) >= 2 else None

    def against_spread(self, variant: str) -> float | None:
        """The mean fall as a multiple of the seeds' spread of the final loss (None where it has no spread)."""
        spread, fall = self.spread(variant), self.absolute.get(variant, [])
        if spread is None or not fall:
            return None
        mean = float(np.mean(fall))
        return mean / spread if spread > 0 else (math.inf if mean > 0 else 0.0)

    def settled(self, variant: str) -> bool:
        """Still falling, but by less than its seeds' final losses differ: more steps would not move the
        comparison beyond the noise it is judged against (a loss near its floor, say)."""
        ratio = self.against_spread(variant)
        return ratio is not None and ratio <= 1


def not_converged(falls: Falls, criterion: Converged) -> dict[str, float]:
    """variant -> its mean fall over the criterion's window (relative to the loss, or as a multiple of the seeds'
    spread: ``criterion.against``), for the variants still falling by more than the criterion's fraction."""
    out = {}
    for variant, fs in falls.relative.items():
        if not fs:
            continue
        measured = float(np.mean(fs)) if criterion.against == "value" else falls.against_spread(variant)
        if measured is not None and measured > criterion.fraction:
            out[variant] = measured
    return out


def convergence_problem(
    variants: Iterable[str], still: dict[str, float], criterion: Converged, steps: float | None
) -> tuple[str, str] | None:
    """(why, what would make it testable) when a variant of the contrast has not converged by the declared
    criterion; None when all have (or none was judged)."""
    moving = [v for v in variants if v in still]
    if not moving:
        return None
    if criterion.against == "value":
        said = "; ".join(f"{v}'s loss fell {still[v]:.0%}" for v in moving)
    else:
        said = "; ".join(f"{v}'s loss fell {still[v]:.3g} times its seeds' spread" for v in moving)
    why = (
        f"not converged: over the last {criterion.window:.0%} of training ({said}; analysis.converged.fraction "
        f"{criterion.fraction:g}{'' if criterion.against == 'value' else ' of the spread'})"
    )
    longer = f"budget.steps: {2 * round(steps)}" if steps and math.isfinite(steps) else "a larger budget.steps"
    return why, f"a longer budget ({longer})"


__all__ = [
    "NOT_TESTABLE",
    "NO_EQUIVALENCE",
    "margin_warning",
    "Bounds",
    "Falls",
    "bounds",
    "convergence_problem",
    "margin_problem",
    "not_converged",
    "room_problem",
]
