"""A study's cells against what MLflow holds: what is done, what is left, and the summary table.

MLflow is the record of what has been done: a cell with a finished or diverged run is done and never trained
again; runs left RUNNING by a submission that died are stale (marked KILLED by the next submission).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from record import testable, vocabulary
from record.spec import Cell, Study


@dataclass
class Plan:
    todo: list[Cell]
    done: dict[str, Any]  # cell_id -> its finished/diverged run
    stale: list[Any]  # runs left RUNNING by a submission that died


def plan(study: Study, uri: str, code: str | None = None) -> Plan:
    """What is done (a result trained by the code ``code``; None: by any code) and what is left."""
    runs = vocabulary.cell_runs(uri, study.name)
    todo, done, stale = [], {}, []
    for cell in study.cells:
        cell_runs = runs.get(cell.cell_id, [])
        result = vocabulary.result_run(cell_runs, code)
        if result is not None:
            done[cell.cell_id] = result
        else:
            todo.append(cell)
        stale += [r for r in cell_runs if r.info.status == "RUNNING"]
    return Plan(todo, done, stale)


def unresolvable_warning(study: Study) -> str | None:
    """Before any run: a warning when the study's seeds cannot resolve its family's contrasts (pairs and factorial
    effects alike, each tested by the exact test within each seed), and one when they cannot show them equivalent
    within the metric's declared margin (the exact tests' smallest p above Holm's first step), or None."""
    analysis = study.analysis
    levels = {a: len({repr(c.settings.get(a)) for c in study.cells}) for a in study.axes}
    family = analysis.family(study.variants, study.variants[0], study.axes, study.design == "grid")
    size = family.size(levels)
    seeds = min(sum(c.variant == v for c in study.cells) for v in study.variants)
    said = [analysis.unresolvable(size, seeds), analysis.unshowable_equivalence(size, seeds, study.metric)]
    notes = [testable.margin_warning(m, metric) for metric, m in analysis.margins.items()]
    lines = [f"warning: {study.source}: {why}" for why in said if why]
    return "\n".join(lines + [f"note: {study.source}: {why}" for why in notes if why]) or None


def describe_plan(study: Study, p: Plan, out: Callable[[str], None] = print, *, tuned: bool = True) -> None:
    """The cells and their states. ``tuned`` false: a tuned study whose searches have not all ended, whose cells'
    ids (they hold the tuned values) and states are known only then."""
    width = max(len(c.variant) for c in study.cells)
    states = f"{len(p.done)} done in MLflow, {len(p.todo)} to train" if tuned else "trained once every search has ended"
    out(
        f"study {study.name!r} ({study.design}, {len(study.variants)} variants x {len(study.seeds)} seeds): "
        f"{len(study.cells)} cells, {states}"
    )
    budget = study.budget.as_dict() or "from the run file"
    out(f"each trial: {study.resources.describe()}; budget {budget}; metric {study.metric} ({study.direction})")
    if study.metrics:
        out("the runs log: " + ", ".join(m for m in study.metrics if not m.startswith("cost/")) + ", cost/*")
    out(f"{'variant':<{width}}  seed  cell id           state")
    for cell in study.cells:
        state = f"done ({vocabulary.cell_state(p.done[cell.cell_id])})" if cell.cell_id in p.done else "to train"
        cell_id = cell.cell_id if tuned else "(once tuned)".ljust(16)
        out(f"{cell.variant:<{width}}  {cell.seed:>4}  {cell_id}  {state if tuned else 'to train after tuning'}")
    for s in study.skipped:
        out(f"{s.variant:<{width}}  {s.seed:>4}  {'-' * 16}  skipped: {s.reason}")
    if p.stale:
        out(f"{len(p.stale)} run(s) left RUNNING by an earlier submission will be marked KILLED")
    if warning := unresolvable_warning(study):
        out(warning)


def summarize(study: Study, uri: str, code: str | None = None) -> tuple[dict[str, int], list[dict[str, Any]]]:
    """One row per cell from MLflow: its final state (its result by the code ``code``, else its latest attempt),
    metric and run."""
    runs = vocabulary.cell_runs(uri, study.name)
    rows, counts = [], Counter()
    for cell in study.cells:
        every = runs.get(cell.cell_id, [])
        cell_runs = [r for r in every if vocabulary.same_code(r, code)]
        result = vocabulary.result_run(cell_runs)
        run = result or (cell_runs[-1] if cell_runs else None)
        state = vocabulary.cell_state(run) if run is not None else "to train"
        other = vocabulary.result_run(every) if run is None else None
        if other is not None:  # a result exists, trained by other code: not this code's, and said so
            run, state = other, "to train (other code)"
        counts[state] += 1
        value = run.data.metrics.get(study.metric) if run is not None else None
        rows.append(
            {
                "variant": cell.variant,
                "seed": cell.seed,
                "cell_id": cell.cell_id,
                "state": state,
                study.metric: value,
                "attempts": len(cell_runs),
                "run_id": run.info.run_id if run else "",
            }
        )
    counts["skipped"] = len(study.skipped)
    return dict(counts), rows


def format_rows(study: Study, rows: list[dict[str, Any]]) -> str:
    width = max([len(r["variant"]) for r in rows] + [7])
    lines = [f"{'variant':<{width}}  seed  {'state':<9}  {study.metric:>20}  attempts  run"]
    for r in rows:
        v = r[study.metric]
        value = f"{v:.4g}" if isinstance(v, (int, float)) else "-"
        lines.append(
            f"{r['variant']:<{width}}  {r['seed']:>4}  {r['state']:<9}  {value:>20}  {r['attempts']:>8}  {r['run_id']}"
        )
    return "\n".join(lines)


def seed_plan_cells(study: Study, uri: str) -> Callable[[], tuple[set[tuple[str, int]], bool]] | None:
    """A seed plan's next cells, asked after every batch: which (variant, seed) its looks need now and whether it
    has ended, decided from the store's results as the report will judge them (``record.looks``). None: no plan."""
    if study.plan is None:
        return None

    def next_cells() -> tuple[set[tuple[str, int]], bool]:
        from record.looks import wanted

        return wanted(uri, study.name, study.variants, study.plan, study.analysis)

    return next_cells
