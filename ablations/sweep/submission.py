"""A submission of a study: its MLflow parent run (the design, the summary), its heartbeat, and the check that no
other submission of the same study is alive (two would train the same cells)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ablations import records, tracking
from ablations.spec import Study
from ablations.sweep.plan import Plan

HEARTBEAT_S = 10.0  # a submission's parent run records a heartbeat this often
STALE_AFTER_S = 60.0  # a submission on another machine without a heartbeat for this long has died


class SubmissionRunning(ValueError):
    """Another submission of the same study is alive: two would train the same cells."""


def _alive(run) -> bool:
    """Whether the driver of a RUNNING parent run is still there (its pid on this machine, else its heartbeat)."""
    tags = run.data.tags
    if tags.get("driver_host") == socket.gethostname() and tags.get("driver_pid", "").isdigit():
        try:
            os.kill(int(tags["driver_pid"]), 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    beat = run.data.metrics.get("heartbeat", run.info.start_time / 1000)
    return time.time() - beat < STALE_AFTER_S


def check_no_live_submission(study: Study, uri: str) -> None:
    exp = records.client(uri).get_experiment_by_name(study.name)
    if exp is None:
        return
    query = records.kind_filter(records.KIND_STUDY) + " and attributes.status = 'RUNNING'"
    for run in records.search_all(uri, [exp.experiment_id], query):
        if _alive(run):
            t = run.data.tags
            raise SubmissionRunning(
                f"submission {t.get('submission')} of {study.name!r} is still running (pid {t.get('driver_pid')} on "
                f"{t.get('driver_host')}, MLflow run {run.info.run_id}); two submissions would train the same "
                "cells: wait for it to end, or stop it, then run the same command again"
            )


class Heartbeat(threading.Thread):
    """Tells later submissions on other machines that this one is alive."""

    def __init__(self, uri: str, run_id: str) -> None:
        super().__init__(daemon=True, name="ablate-heartbeat")
        self.uri, self.run_id, self.stopped = uri, run_id, threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(HEARTBEAT_S):
            with contextlib.suppress(Exception):  # a slow or unreachable store must not stop the study
                records.client(self.uri).log_metric(self.run_id, "heartbeat", time.time())

    def stop(self) -> None:
        self.stopped.set()


@dataclass
class Submission:
    uri: str
    run_id: str
    submission: int

    def finish(self, status: str, counts: dict[str, int], rows: list[dict], table: str) -> None:
        from mlflow.entities import Metric

        c = records.client(self.uri)
        now = int(time.time() * 1000)
        c.log_batch(
            self.run_id, metrics=[Metric(f"cells_{k.replace(' ', '_')}", float(v), now, 0) for k, v in counts.items()]
        )
        c.log_text(self.run_id, table + "\n", "summary.txt")
        c.log_text(self.run_id, json.dumps(rows, indent=1, default=str), "cells.json")
        records.end_run(self.uri, self.run_id, status)


def design_record(study: Study) -> dict:
    """What a report needs to know about the design (logged as design.json)."""
    return {
        "kind": study.design,
        "axes": study.axes,
        "metric": study.metric,
        "direction": study.direction,
        "variants": [
            {"name": v, "settings": {k: str(x) for k, x in s.items()}}
            for v, s in dict((c.variant, c.settings) for c in study.cells).items()
        ],
        "seeds": study.seeds,
        "skipped": [vars(s) for s in study.skipped],
        # a cell keeps its id when the design grows (a new axis at the base's value), but its label changes
        "cells": {c.cell_id: c.variant for c in study.cells},
        "analysis": study.analysis or {},  # how the report compares (dashboards/analysis.py)
        "vary_data": study.vary_data,
    }


def open_submission(study: Study, uri: str, p: Plan) -> Submission:
    from mlflow.entities import Param

    c = records.client(uri)
    exp_id = tracking.experiment_id(uri, study.name)
    previous = records.search_all(uri, [exp_id], records.kind_filter(records.KIND_STUDY))
    for run in previous:  # a submission that died without finishing (check_no_live_submission ran first)
        if run.info.status == "RUNNING":
            records.mark_killed(uri, run, "the driver stopped before the submission ended")
    number = 1 + max([int(r.data.tags.get(records.TAG_SUBMISSION, 0)) for r in previous] or [0])
    tags = {
        records.TAG_KIND: records.KIND_STUDY,
        records.TAG_STUDY: study.name,
        records.TAG_SUBMISSION: str(number),
        "design": study.design,
        "driver_host": socket.gethostname(),
        "driver_pid": str(os.getpid()),
        "cells": str(len(study.cells)),
        "cells_to_train": str(len(p.todo)),
        records.TAG_STATUS: records.STATUS_RUNNING,
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
    c.log_dict(run.info.run_id, design_record(study), records.DESIGN_ARTIFACT)
    if study.description:
        c.set_tag(run.info.run_id, "mlflow.note.content", study.description)
    return Submission(uri, run.info.run_id, number)
