"""``ablate sweep STUDY --dry-run``: the cells, what MLflow already holds of them, and (a tuned study) what each
variant's search holds. It starts no Ray and writes nothing: a store that is not there is not created."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from ablations import stores, tracking
from ablations.sweep.plan import Plan, describe_plan, plan, seed_plan_cells
from ablations.sweep.submission import live_notes
from record.secrets import redact_url
from record.spec import Study
from record.spec.equivalence import warning_lines


def dry_run(
    study: Study,
    *,
    tracking_uri: str | None,
    claims_url: str | None,
    reuse_any_code: bool,
    out: Callable[[str], None] = print,
) -> list[str]:
    """What the sweep would do, said through ``out``; returned: what would stop it (a tuned variant's search).
    A seed plan's cells are narrowed to those of the look it has reached."""
    from ablations.register import status

    uri = tracking.resolve_uri(tracking_uri, create=False)
    problems: list[str] = []
    said = status(study, uri, study.amend)
    if said.startswith("refused: "):  # the sweep would stop here
        problems.append(said.removeprefix("refused: "))
    else:
        out(said)
    for line in warning_lines(study):  # one model family under two names; scores where q and k coincide
        out(line)
    problems += _packing(study, out)
    if study.tune:  # the searches come first, and the cells' ids hold the values they choose
        from ablations.search.tuned import preview_tuning

        tuned, problems = preview_tuning(study, storage=None, out=out)
        if tuned is None:
            describe_plan(study, Plan(todo=list(study.cells), done={}, stale=[]), out, tuned=False)
            return problems
        study = tuned
    if not stores.store_exists(uri):  # a dry run writes nothing, not even an empty store
        first = study if study.plan is None else _first_batch(study)
        describe_plan(first, Plan(todo=list(first.cells), done={}, stale=[]), out)
        out(f"(no store yet at {redact_url(uri)}: every cell is to train)")
        return problems
    code = None if reuse_any_code or study.reuse_any_code else tracking.code_fingerprint()
    p = plan(study, uri, code)
    if (next_cells := seed_plan_cells(study, uri)) is not None:  # the look it has reached, not every seed to max
        wanted, _ = next_cells()
        p = Plan([c for c in p.todo if (c.variant, c.seed) in wanted], p.done, p.stale)
        out(f"seed plan: the cells of the look it has reached ({len(wanted)} of {len(study.cells)} up to its maximum)")
    describe_plan(study, p, out)
    for note in live_notes(study, uri, claims_url):
        out(f"note: {note}")
    return problems


def _packing(study: Study, out: Callable[[str], None]) -> list[str]:
    """Cells sharing a GPU: how many at once, the memory one needs (a calibration step), and whether they fit."""
    from ablations.cluster import DoesNotFit
    from ablations.packing import check_before
    from ablations.shell import cluster_address

    try:
        check_before(study, cluster_address(None), out)
    except DoesNotFit as err:
        return [str(err)]
    return []


def _first_batch(study: Study) -> Study:
    first = study.plan.first
    return dataclasses.replace(study, cells=[c for c in study.cells if c.seed < first])
