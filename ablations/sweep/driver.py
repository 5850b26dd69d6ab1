"""``ablate sweep STUDY``: every cell of a study as a Ray Tune trial, recorded in MLflow exactly once.

A submission:
1. checks the study (nothing starts if anything is wrong) and reads the study's experiment: cells with a
   finished or diverged run are done and never trained again; runs left RUNNING by a submission that
   died (driver killed, machine restarted) are marked KILLED; the rest is to do (``ablations.sweep.plan``);
2. opens a parent run for the submission (``ablations.sweep.submission``) and runs the cells left to do as
   Tune trials (``ablations.sweep.trial``) on a local Ray (loopback) or on a cluster, with the study's
   resources per trial and worker processes reused between trials (``ablations.sweep.raytune``);
3. prints progress while it runs and a summary table from MLflow at the end.

Tune retries a trial that raised or whose process or node died, ``retries`` times. A diverged run is a
result, not a failure.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ablations import claims as cl
from ablations import tracking
from ablations.claims import Claim, Claims
from ablations.packing import check_before, check_on_cluster
from ablations.register import register
from ablations.shell import close_ray, cluster_address, open_ray, refuse_unreachable
from ablations.sweep.placement import describe_cluster, trial_slots
from ablations.sweep.plan import Plan, format_rows, plan, seed_plan_cells, summarize, unresolvable_warning
from ablations.sweep.raytune import run_tune
from ablations.sweep.submission import Keeper, end_dead_submissions, open_submission
from ablations.sweep.trial import TrialContext
from models import plugins
from record import vocabulary
from record.secrets import Credentials
from record.spec import Cell, Study
from record.spec.equivalence import warning_lines


@dataclass(kw_only=True)
class StudyResult:
    study: str
    parent_run_id: str | None
    counts: dict[str, int]
    rows: list[dict[str, Any]]
    tracking_uri: str

    @property
    def complete(self) -> bool:
        """Every cell has a result: finished, diverged or failed."""
        return not any(n for s, n in self.counts.items() if s.startswith(("to train", "killed", "running")))


POLL_S = 5.0  # how often a submission looks at cells another submission holds


def run_study(
    study: Study,
    *,
    address: str | None = None,
    tracking_uri: str | None = None,
    max_concurrent: int | None = None,
    num_cpus: int | None = None,
    claims_url: str | None = None,
    reuse_any_code: bool = False,
    out: Callable[[str], None] = print,
) -> StudyResult:
    """Run the cells of a study that MLflow does not hold yet (trained by this code, unless ``reuse_any_code``);
    return the summary from MLflow. Cells are claimed first (``ablations.claims``): several submissions of one
    study may run at once, each training what it claims and waiting for the rest. A study with a seed plan trains
    in batches: after each, its looks say which (variant, seed) the plan needs now and whether it has ended
    (``seed_plan_cells``: the family judged as the report judges it, ``record.looks``)."""
    from ablations.cluster import check_fits

    address = cluster_address(address)
    uri = tracking.resolve_uri(tracking_uri, create=False)
    fix = "give an MLflow server every node reaches (--tracking-uri, or MLFLOW_TRACKING_URI)"
    refuse_unreachable(address, [uri], fix)  # before the store is made or read
    uri = tracking.resolve_uri(tracking_uri)
    _warn(study, out)
    fingerprint = tracking.code_fingerprint()
    reuse_any_code = reuse_any_code or study.reuse_any_code
    code = None if reuse_any_code else fingerprint
    claims = Claims(cl.claims_url(uri, claims_url))
    packing: list = []  # a packing study's calibration, once (ablations.packing)

    def fits() -> None:
        check_fits(address, num_cpus, study.resources.cpus, study.resources.gpus)
        if not packing:
            packing.append(check_before(study, address, out))

    registered = None
    if study.tune:  # each variant's own search first; the cells then run at each variant's best parameters
        fits()  # before the searches, and before anything is recorded
        registered = register(study, uri, claims.url, out=out)
        from ablations.search.tuned import tune_study

        study = tune_study(study, uri=uri, address=address, num_cpus=num_cpus, storage=None, out=out)
    next_cells = seed_plan_cells(study, uri)
    p = _planned(study, plan(study, uri, code), next_cells)
    if p.todo:
        fits()  # before anything is recorded
    registration, recorded = registered or register(study, uri, claims.url, out=out)  # before any cell runs
    _mark_stale(study, p, claims, uri, out)
    if not p.todo and not recorded:  # (a new registration or amendment is recorded by a submission, with its design)
        counts, rows = summarize(_Submission(study, uri, code, claims, out, next_cells).scope(), uri, code)
        out(f"all {len(study.cells)} cells of {study.name!r} are done in MLflow; nothing to train")
        return StudyResult(study=study.name, parent_run_id=None, counts=counts, rows=rows, tracking_uri=uri)
    run = _Submission(study, uri, code, claims, out, next_cells)
    run.calibration = packing[0] if packing else None
    run.address = address
    run.open(p, fingerprint, reuse_any_code, registration.version)
    return run.train(p.todo, address, num_cpus, max_concurrent)


def _planned(study: Study, p: Plan, next_cells) -> Plan:
    """A seed plan's cells to train now: those of the look it has reached (all of them without a plan)."""
    if next_cells is None:
        return p
    wanted, _ = next_cells()
    return Plan([c for c in p.todo if (c.variant, c.seed) in wanted], p.done, p.stale)


def _warn(study: Study, out: Callable[[str], None]) -> None:
    """Said before anything runs: the seeds cannot resolve the family; variants that are one model, or that
    compare scores where q and k coincide."""
    if warning := unresolvable_warning(study):
        out(warning)
    for line in warning_lines(study):  # one model family under two names; scores where q and k coincide
        out(line)


def _mark_stale(study: Study, p: Plan, claims: Claims, uri: str, out: Callable[[str], None]) -> None:
    claims.expire_dead_local_owners(study.name)  # a killed driver on this machine: its cells are free at once
    end_dead_submissions(study.name, uri, claims)  # and its parent run ends, even when nothing is left to train
    stale = _stale(study, p, claims)
    for run in stale:
        vocabulary.mark_killed(uri, run, "its submission ended (driver stopped) before the trial finished")
    if stale:
        out(f"marked {len(stale)} run(s) left RUNNING by an earlier submission as KILLED")


class _Submission:
    """One submission of a study: its parent run and liveness claim, the cells it claims and trains in rounds
    (waiting for the cells other submissions hold), and its end, recorded whatever stopped it."""

    def __init__(
        self, study: Study, uri: str, code: str | None, claims: Claims, out: Callable[[str], None], next_cells=None
    ):
        self.study, self.uri, self.code, self.claims, self.out = study, uri, code, claims, out
        self.next_cells = next_cells  # a seed plan's: the cells of the next look (None: every cell at once)
        self.key = code or cl.ANY_CODE  # what its cells' claims are keyed by (ablations.claims)
        self.held: dict[str, Claim] = {}
        self.conn = None
        self.calibration = None  # a packing study's (ablations.packing), checked on a cluster once connected
        self.address: str | None = None  # the cluster's (None: a local Ray)

    def open(self, p: Plan, fingerprint: str, reuse_any_code: bool, registration: int) -> None:
        """The parent run, the claim that says it is alive, and what every trial is given."""
        study = self.study
        opened = open_submission(study, self.uri, p, self.claims, fingerprint, self.code, registration)
        self.parent, self.alive = opened
        self.keeper = Keeper(self.claims, [self.alive] if self.alive else [], self.out)
        self.keeper.start()
        self.ctx = TrialContext(
            uri=self.uri,
            study=study.name,
            parent_run_id=self.parent.run_id,
            submission=self.parent.submission,
            resources=study.resources,
            storage=tracking.ray_storage(),
            metric=study.metric,
            code=tracking.code_version(),
            fingerprint=fingerprint,
            reuse_any_code=reuse_any_code,
            claims_url=self.claims.url,
            owner=self.claims.owner,
            credentials=Credentials.from_environ(),
            plugins=plugins.refs(travelled=self.address is not None),  # a cluster's workers import Ray's copies
        )
        self.out(
            f"submission {self.parent.submission} of {study.name!r}: {len(p.todo)} cells to train, {len(p.done)} "
            f"already done (MLflow parent run {self.parent.run_id})"
        )

    def train(self, todo: list[Cell], address: str | None, num_cpus: int | None, limit: int | None) -> StudyResult:
        """Claim, train and release in rounds until no cell is left without a result; then the end."""
        status = vocabulary.STATUS_FAILED
        try:
            pending, tried = list(todo), set()
            while pending:
                mine = [cell for cell in pending if cell.cell_id not in tried and self._claim(cell)]
                if mine:
                    self._train(mine, address, num_cpus, limit)
                    tried |= {cell.cell_id for cell in mine}
                key = self.key
                pending = _still_pending(self.study, self.uri, self.code, pending, tried, self.claims, key, self.out)
                if pending and not mine:
                    time.sleep(POLL_S)
                if not pending:  # a seed plan's next look: the batch its open contrasts need
                    pending = [c for c in self._next_batch() if c.cell_id not in tried]
            status = vocabulary.STATUS_FINISHED
        except KeyboardInterrupt:
            status = vocabulary.STATUS_KILLED
            raise
        finally:
            counts, rows = self._end(status)
        return StudyResult(
            study=self.study.name, parent_run_id=self.parent.run_id, counts=counts, rows=rows, tracking_uri=self.uri
        )

    def _next_batch(self) -> list[Cell]:
        """The cells a seed plan needs now that are not done (none without a plan, or once it has ended)."""
        if self.next_cells is None:
            return []
        wanted, ended = self.next_cells()
        todo = [c for c in plan(self.study, self.uri, self.code).todo if (c.variant, c.seed) in wanted]
        if todo:
            self.out(f"seed plan: the next look needs {len(todo)} more cell(s)")
        elif ended:
            self.out("seed plan: every declared contrast is decided, or the plan is at its maximum")
        return todo

    def scope(self) -> Study:
        """The cells the summary counts: a seed plan's trained or wanted ones, not every seed up to its maximum."""
        if self.next_cells is None:
            return self.study
        wanted, _ = self.next_cells()
        return dataclasses.replace(self.study, cells=[c for c in self.study.cells if (c.variant, c.seed) in wanted])

    def _claim(self, cell: Cell) -> bool:
        claim = self.claims.claim(self.study.name, cell.cell_id, self.key)
        if claim is not None:
            self.held[cell.cell_id] = claim
            self.keeper.hold(claim)
        return claim is not None

    def _train(self, mine: list[Cell], address: str | None, num_cpus: int | None, limit: int | None) -> None:
        """The claimed cells as Tune trials; Ray only once there is something to train (not to wait for others).
        Each claim is given back after: a failed or lost cell may be tried again by a later submission."""
        study, limit = self.study, limit or self.study.max_concurrent
        if self.conn is None:
            stores = {"the MLflow store": self.uri, "the claims store": self.claims.url}
            stores["Ray Train's storage"] = self.ctx.storage
            self.conn = open_ray(address, num_cpus, study.resources, stores, dashboard=study.resources.workers > 1)
            if address is not None:
                try:
                    check_on_cluster(study.resources, self.calibration, self.out)
                except BaseException:
                    self.conn.close()
                    raise
            self.slots = trial_slots(study.resources, limit)
            self.out(f"Ray: {self.conn.describe()} ({describe_cluster()}); up to {self.slots} trial(s) at once")
        self.ctx.tokens = {c: k.token for c, k in self.held.items()}
        run_tune(study, mine, self.ctx, self.slots, limit, self.out)
        for cell in mine:
            self.keeper.drop(self.held[cell.cell_id])
            self.claims.release(self.held.pop(cell.cell_id))

    def _end(self, status: str) -> tuple[dict[str, int], list[dict[str, Any]]]:
        """Ray first, then the claims, the runs this submission left RUNNING, and the parent run's summary."""
        study, uri = self.scope(), self.uri
        self.keeper.stop()
        close_ray(self.conn, self.out)
        for claim in self.held.values():
            self.claims.release(claim)
        this_submission = {vocabulary.TAG_SUBMISSION: str(self.parent.submission)}
        for run in vocabulary.running_runs(uri, study.name, vocabulary.KIND_CELL, **this_submission):
            vocabulary.mark_killed(uri, run, "the submission stopped before the trial finished")
        if status == vocabulary.STATUS_FINISHED:
            _failed_on_every_attempt(study, uri, self.code, self.parent.submission, study.retries)
        vocabulary.mark_outcomes(uri, study.name, [c.cell_id for c in study.cells], self.code)
        counts, rows = summarize(study, uri, self.code)
        if status == vocabulary.STATUS_FINISHED and any(
            n for s, n in counts.items() if s.startswith(("to train", "killed"))
        ):
            status = vocabulary.STATUS_KILLED  # Tune was interrupted (Ctrl-C) and returned
        if status != vocabulary.STATUS_FINISHED:
            self.out("the submission did not finish: run the same command again to train the missing cells")
        self.parent.finish(status, counts, rows, format_rows(study, rows))
        if self.alive is not None:
            self.claims.release(self.alive)
        return counts, rows


def _stale(study: Study, p, claims: Claims) -> list:
    """Runs left RUNNING whose cell no live submission holds, under any code (a RUNNING run of a held cell is
    someone's trial, whatever code that submission runs, and so is one whose holder has passed its fence and is
    writing it: a ``done`` claim within its write window; marked killed, that result was lost and its cell held for
    the window, then trained again)."""
    out = []
    for run in p.stale:
        rows = claims.cell_rows(study.name, run.data.tags.get(vocabulary.TAG_CELL_ID, ""))
        if not any(r["left"] > 0 and (r["state"] == "claimed" or r["run_id"] == run.info.run_id) for r in rows):
            out.append(run)
    return out


def _still_pending(study, uri, code, pending, tried, claims: Claims, key, out) -> list:
    """The cells still without a result that this submission has not tried yet (held by another submission).
    ``key``: what this submission's claims are keyed by (its code's fingerprint, or ``claims.ANY_CODE``)."""
    done = {
        cell_id for cell_id, runs in vocabulary.cell_runs(uri, study.name).items() if vocabulary.result_run(runs, code)
    }
    left = [c for c in pending if c.cell_id not in done and c.cell_id not in tried]
    if left:
        owners, writing = set(), 0
        for cell in left:
            row = claims.state(study.name, cell.cell_id, key)
            if row is not None and row["state"] == "done":  # claimed done, but its run is not a result in MLflow
                elsewhere = vocabulary.run_missing(uri, row["run_id"])  # another store shares these claims
                if not claims.reopen_lost(study.name, cell.cell_id, key, row["run_id"], at_once=elsewhere):
                    writing += 1
            elif row is not None or (row := claims.rival(study.name, cell.cell_id, key)) is not None:
                owners.add(row["owner"].rsplit(":", 1)[0])
        if owners:
            out(f"waiting for {len(left)} cell(s) another submission is training ({', '.join(sorted(owners))})")
        elif writing:
            out(
                f"waiting for {writing} cell(s) whose result another submission is writing to MLflow "
                f"(reopened if it is not there within {cl.WRITE_WINDOW_S:.0f} s of their end)"
            )
    return left


def _failed_on_every_attempt(study: Study, uri: str, code, submission: int, retries: int) -> None:
    """A cell whose every attempt in this submission was killed (its process or node died each time: out of
    memory?) ends as failed, with the reason, not as killed."""
    for runs in vocabulary.cell_runs(uri, study.name).values():
        mine = [r for r in runs if r.data.tags.get(vocabulary.TAG_SUBMISSION) == str(submission)]
        if not mine or vocabulary.result_run(runs, code) or len(mine) < retries + 1:
            continue
        if all(vocabulary.cell_state(r) == vocabulary.STATUS_KILLED for r in mine):
            vocabulary.end_run(
                uri,
                mine[-1].info.run_id,
                vocabulary.STATUS_FAILED,
                f"its process or node died on every attempt ({len(mine)}): out of memory, or a lost node?",
            )
