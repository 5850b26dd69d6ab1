"""A submission of a study: its MLflow parent run (the design, the summary) and its leases.

A submission is alive while it renews its lease in the claims store (``ablations.claims``); several
submissions of one study may run at once: each trains the cells it claims and waits for the others'."""

from __future__ import annotations

import json
import os
import re
import socket
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ablations import tracking
from ablations.claims import RENEW_S, Claim, Claims
from ablations.sweep.plan import Plan
from record import vocabulary
from record.recorded import RecordedDesign
from record.spec import Study

SUBMISSION_PREFIX = "submission:"


def submission_key(run_id: str) -> str:
    """The claims row that says a submission is alive (its lease is renewed while its driver runs)."""
    return SUBMISSION_PREFIX + run_id


SUBMISSION_CODE = "-"  # submission rows are not tied to a code fingerprint


def alive(claims: Claims, study: str, run_id: str) -> bool:
    """Whether the submission that opened parent run ``run_id`` still holds its lease (the store's clock)."""
    row = claims.state(study, submission_key(run_id), SUBMISSION_CODE)
    return row is not None and row["state"] == "claimed" and row["left"] > 0


def live_submissions(study: Study, uri: str, claims: Claims) -> list:
    """The parent runs of this study's submissions that are alive now."""
    running = vocabulary.running_runs(uri, study.name, vocabulary.KIND_STUDY)
    return [r for r in running if alive(claims, study.name, r.info.run_id)]


def live_notes(study: Study, uri: str, claims_url: str | None = None) -> list[str]:
    """For a dry run: the submissions of this study that are alive now (read only: nothing is created)."""
    from ablations import claims as cl

    url = cl.claims_url(uri, claims_url)
    if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).exists():
        return []
    claims = Claims(url)
    return [
        f"submission {r.data.tags.get(vocabulary.TAG_SUBMISSION)} of {study.name!r} is running (pid "
        f"{r.data.tags.get(vocabulary.TAG_DRIVER_PID)} on {r.data.tags.get(vocabulary.TAG_DRIVER_HOST)}): a new submission trains the cells "
        "it has not claimed and waits for the rest"
        for r in live_submissions(study, uri, claims)
    ]


class Keeper(threading.Thread):
    """Renews this submission's leases (its own row and every cell it holds) while its driver lives."""

    def __init__(self, claims: Claims, held: list[Claim], out) -> None:
        super().__init__(daemon=True, name="ablate-leases")
        self.claims, self.held, self.out = claims, held, out
        self.lock = threading.Lock()
        self.stopped = threading.Event()

    def hold(self, claim: Claim) -> None:
        with self.lock:
            self.held.append(claim)

    def drop(self, claim: Claim) -> None:
        with self.lock:
            self.held = [c for c in self.held if c != claim]

    def run(self) -> None:
        while not self.stopped.wait(RENEW_S):
            with self.lock:
                held = list(self.held)
            try:
                lost, ended = self.claims.renew(held)
            except Exception as err:  # the store is unreachable: the leases may expire; the fence guards results
                self.out(f"warning: could not renew this submission's claims ({type(err).__name__}); retrying")
                continue
            for c in ended:
                self.drop(c)
            for c in lost:
                self.drop(c)
                if not c.cell_id.startswith(SUBMISSION_PREFIX):
                    self.out(f"warning: the claim on cell {c.cell_id} expired and was taken by another submission")

    def stop(self) -> None:
        self.stopped.set()


@dataclass
class Submission:
    uri: str
    run_id: str
    submission: int

    def finish(self, status: str, counts: dict[str, int], rows: list[dict], table: str) -> None:
        from mlflow.entities import Metric

        c = vocabulary.client(self.uri)
        now = int(time.time() * 1000)
        c.log_batch(
            self.run_id,
            metrics=[Metric("cells_" + re.sub(r"\W+", "_", k).strip("_"), float(v), now, 0) for k, v in counts.items()],
        )
        c.log_text(self.run_id, table + "\n", "summary.txt")
        c.log_text(self.run_id, json.dumps(rows, indent=1, default=str), "cells.json")
        vocabulary.end_run(self.uri, self.run_id, status)


def end_dead_submissions(study: str, uri: str, claims: Claims, parents: list | None = None) -> int:
    """The parent runs of submissions that died without ending them (their lease is gone): KILLED. Every submission
    does it first, the ones with nothing left to train too (those once left such a run RUNNING for good: found by
    the fault soak, benchmarks/soak.py). ``parents``: the study's parent runs, if already read. Returns how many."""
    if parents is None:
        parents = vocabulary.running_runs(uri, study, vocabulary.KIND_STUDY)
    ended = 0
    for run in parents:
        if run.info.status == "RUNNING" and not alive(claims, study, run.info.run_id):
            vocabulary.mark_killed(uri, run, "the driver stopped before the submission ended")
            ended += 1
    return ended


def design_record(study: Study, code: str | None = None, registration: int | None = None) -> dict:
    """What a report needs to know about the design (logged as design.json; ``record.recorded``); ``code``: the
    fingerprint of the code whose results count (None: any code's, ``reuse_results: any_code``), so the report
    takes the cells' results as this submission did."""
    return RecordedDesign.of(study, code, registration).to_json()


def open_submission(
    study: Study, uri: str, p: Plan, claims: Claims, fingerprint: str, code: str | None, registration: int | None
) -> tuple[Submission, Claim]:
    """The parent run of this submission and the claim that says it is alive. Parent runs left RUNNING by
    submissions whose lease expired are marked KILLED; live ones are left alone."""
    from mlflow.entities import Param

    c = vocabulary.client(uri)
    exp_id = tracking.experiment_id(uri, study.name)
    previous = vocabulary.search_all(uri, [exp_id], vocabulary.kind_filter(vocabulary.KIND_STUDY))
    end_dead_submissions(study.name, uri, claims, previous)
    # numbered by the claims store: several submissions at once never share a number (their RUNNING runs are
    # told apart by it when one of them ends); counted per experiment, whose id and creation time tell apart two
    # stores beside one claims.db, or a store started again
    number = claims.next_number(
        study.name,
        1 + max([int(r.data.tags.get(vocabulary.TAG_SUBMISSION, 0)) for r in previous] or [0]),
        store=f"{exp_id}@{c.get_experiment(exp_id).creation_time}",
    )
    tags = {
        vocabulary.TAG_KIND: vocabulary.KIND_STUDY,
        vocabulary.TAG_STUDY: study.name,
        vocabulary.TAG_SUBMISSION: str(number),
        vocabulary.TAG_DESIGN: study.design,
        vocabulary.TAG_DRIVER_HOST: socket.gethostname(),
        vocabulary.TAG_DRIVER_PID: str(os.getpid()),
        vocabulary.TAG_CLAIMS_OWNER: claims.owner,
        vocabulary.TAG_CODE: fingerprint,
        vocabulary.TAG_CELLS: str(len(study.cells)),
        vocabulary.TAG_CELLS_TO_TRAIN: str(len(p.todo)),
        vocabulary.TAG_STATUS: vocabulary.STATUS_RUNNING,
        vocabulary.TAG_PLUGINS: plugins_tag(),
        **tracking.code_version(),
    }
    run = c.create_run(exp_id, tags=tags, run_name=f"{study.name} #{number}")
    params = [
        Param("design", study.design),
        Param("axes", ",".join(study.axes)[:6000]),
        Param("seeds", ",".join(map(str, study.seeds))),
        Param("metric", study.metric),
        Param("direction", study.direction),
        Param("resources", study.resources.describe()),
    ]
    c.log_batch(run.info.run_id, params=params)
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "study.yaml"
        copy.write_text(Path(study.source).read_text())
        c.log_artifact(run.info.run_id, str(copy))
    c.log_dict(run.info.run_id, design_record(study, code, registration), vocabulary.DESIGN_ARTIFACT)
    if study.description:
        c.set_tag(run.info.run_id, vocabulary.TAG_NOTE, study.description)
    mine = claims.claim(study.name, submission_key(run.info.run_id), SUBMISSION_CODE)
    return Submission(uri, run.info.run_id, number), mine


def plugins_tag() -> str:
    """The plugins this submission loaded (module, path, digest), for ``ablate report`` to load them again."""
    import json

    from models import plugins

    return json.dumps([{"module": r.module, "path": r.path, "digest": r.digest} for r in plugins.refs()])
