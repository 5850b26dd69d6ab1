"""The MLflow record: the one place that names what is written and read.

Writers (ablations/tracking.py, the sweep and search drivers) and readers (dashboards/) import these names;
no other module defines them.

- Run kinds (tag ``kind``): one parent run per submission of a study (``study``) or per search process
  (``search``); one child run per attempt of a cell (``cell``) or per Optuna trial (``trial``).
- Tags of a cell: study, variant, seed, cell_id, submission, attempt, code version, ray_node, status_detail. A
  cell's settings are recorded once, in its submission's design.json (``record.recorded``); its params hold its
  whole configuration.
- States: a run's ``status_detail`` tag is ``<state>`` or ``<state>: <reason>``; finished and diverged runs
  are results (MLflow status FINISHED), failed and killed ones are not (FAILED, KILLED).
- Params: the flattened resolved run configuration (``flatten``), result-affecting fields only.
- The cell ledger: a cell's runs, oldest first; its result is the first finished or diverged one.

Nothing here imports mlflow at module level: the names are cheap to import everywhere.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterable
from pathlib import Path
from typing import Any

# --- run kinds (tag "kind") ----------------------------------------------------------------------------
TAG_KIND = "kind"
KIND_STUDY, KIND_CELL = "study", "cell"  # a submission of a study; one attempt of one cell
KIND_SEARCH, KIND_TRIAL = "search", "trial"  # a search process; one Optuna trial
KIND_REGISTRATION = "registration"  # a study's registration or one of its amendments (ablations.register)

# --- tags ------------------------------------------------------------------------------------------------
TAG_STUDY, TAG_VARIANT, TAG_SEED, TAG_CELL_ID = "study", "variant", "seed", "cell_id"
TAG_SUBMISSION, TAG_ATTEMPT = "submission", "attempt"
TAG_STATUS = "status_detail"
TAG_CODE = "code_fingerprint"  # the hash of the code that shapes a result (tracking.code_fingerprint)
TAG_CLAIM = "claim_token"  # the fencing token under which a cell's run was trained
TAG_PARENT = "mlflow.parentRunId"
TAG_NOTE = "mlflow.note.content"  # MLflow's description of a run (a study's parent: the study's description)
TAG_EXPERIMENT_KIND = "mlflow.experimentKind"  # MLflow's view of an experiment (ours: model training)
TAG_CONFIG_HASH = "config_hash"  # the hash of what a run trains (a cell's equals its cell id)
TAG_TASK, TAG_ARCH, TAG_WORKERS = "task", "arch", "workers"
TAG_PID, TAG_HOST, TAG_CODE_DIR = "pid", "host", "code_dir"  # the process that trains, and the code it runs
TAG_DEVICE = "device"  # what a run trains on: the GPU's name, or "cpu (<architecture>)"
# what comparing needs of a run's task: the classes its loss is over (its chance level), as the task declares it
TAG_OUTPUT_CLASSES = "scoring.classes"
TAG_PLUGIN_PREFIX = "plugin."  # plugin.<module>: the source digest of a plugin whose components the run uses
TAG_PLUGINS = "plugins"  # a submission's: the plugins it loaded, as JSON (module, path, digest)
PLUGINS_ARTIFACT = "plugins.json"  # those plugins' source files and digests, where they were imported from
TAG_RAY_NODE, TAG_RAY_NODE_IP, TAG_RAY_TRAIN_RUN = "ray_node", "ray_node_ip", "ray_train_run"
TAG_TRIAL, TAG_OPTUNA_STATE = "trial", "optuna_state"  # a search trial's number, and what Optuna was told
TAG_STORAGE, TAG_SAMPLER, TAG_PRUNER = "storage", "sampler", "pruner"  # a search's parent run
TAG_DESIGN, TAG_CELLS, TAG_CELLS_TO_TRAIN = "design", "cells", "cells_to_train"  # a submission's parent run
TAG_DRIVER_HOST, TAG_DRIVER_PID, TAG_CLAIMS_OWNER = "driver_host", "driver_pid", "claims_owner"
# what writing to MLflow cost a run, and what it could not write
TAG_LOGGING_SECONDS, TAG_TRACKING_SECONDS = "logging_seconds", "tracking_seconds"
TAG_METRICS_LOST, TAG_LOGGING_ERRORS = "metrics_lost", "logging_errors"
TAG_VERSION, TAG_DECLARATION_HASH = "version", "declaration_hash"  # a registration's, and what a submission ran
TAG_OUTCOME = "outcome"  # a cell's run: "counted" (what its study's latest submission counts), or "superseded"
OUTCOME_COUNTED, OUTCOME_SUPERSEDED = "counted", "superseded"
AXIS_PREFIX = "axis."  # a cell's row in a report: axis.<dotted key>, the value of a design axis (from design.json)
PARAM_PREFIX = "param."  # param.<dotted key>: a search trial's parameters
TUNED_SETTING = "tuned:"  # the prefix of a tuned value in a variant's settings (design.json)

# --- artifacts of a study's parent run -------------------------------------------------------------------
DESIGN_ARTIFACT = "design.json"  # kind, axes, variants [{name, settings}], seeds, metric, direction, cells
REGISTRATION_ARTIFACT = "registration.json"  # a registration run's: the declaration, its hash, time, reason, ...
EVALUATION_FOLDER = "evaluation"  # a cell run's evaluations of its trained model (record.evaluations: ablate heads)

# --- states ------------------------------------------------------------------------------------------------
STATUS_FINISHED, STATUS_DIVERGED, STATUS_FAILED, STATUS_KILLED = "finished", "diverged", "failed", "killed"
STATUS_PRUNED = "pruned"  # stopped early by a search's pruner: a result, not a failure
STATUS_RUNNING = "running"
RESULT_STATES = (STATUS_FINISHED, STATUS_DIVERGED)  # a cell with one of these is done
MLFLOW_STATUS = {
    STATUS_PRUNED: "FINISHED",
    STATUS_FINISHED: "FINISHED",
    STATUS_DIVERGED: "FINISHED",
    STATUS_FAILED: "FAILED",
    STATUS_KILLED: "KILLED",
}


def status_tag(status: str, detail: str = "") -> str:
    """The value of ``status_detail``: ``finished``, ``diverged: loss rose ...``, ``failed: ValueError ...``
    (an error's text is masked: it may quote a storage URL with its password)."""
    from record.secrets import redact

    return status if not detail else f"{status}: {redact(detail)}"


def parse_status(tag: str) -> tuple[str, str]:
    """``status_detail`` -> (state, reason)."""
    state, _, detail = tag.partition(": ")
    return state, detail


def cell_state(run) -> str:
    """finished | diverged | failed | killed | running, from an MLflow run of a cell (or trial)."""
    detail = run.data.tags.get(TAG_STATUS, "")
    if run.info.status == "RUNNING":
        return STATUS_RUNNING
    if run.info.status == "FINISHED" and detail.startswith(RESULT_STATES):
        return detail.split(":", 1)[0]
    return STATUS_KILLED if run.info.status == "KILLED" else STATUS_FAILED


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"model": {"n_heads": 4}} -> {"model.n_heads": 4}: the params of a run."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


def kind_filter(kind: str, **tags: str) -> str:
    """An MLflow search filter for runs of one kind with the given tags."""
    parts = [f"tags.{TAG_KIND} = '{kind}'"] + [f"tags.{k} = '{v}'" for k, v in tags.items()]
    return " and ".join(parts)


# --- the store ---------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=8)
def client(uri: str):
    """An MlflowClient on ``uri``; a new database store's tables are created under a lock (``first_use``)."""
    import logging

    from mlflow import MlflowClient

    for name in ("mlflow.store.db.utils", "alembic"):  # a new store's schema migration is not news to a user
        logging.getLogger(name).setLevel(logging.WARNING)
    if not uri.startswith(LOCKED_SCHEMES):
        return MlflowClient(tracking_uri=uri)
    with first_use(uri):  # the client creates the store's tables as it is built
        c = MlflowClient(tracking_uri=uri)
        c.search_experiments(max_results=1)
    return c


LOCKED_SCHEMES = ("sqlite:///", "postgresql")
SCHEMA_LOCK = 0x61626C73  # "abls": the PostgreSQL advisory lock under which a new store's schema is created
_OPENED: set[str] = set()  # stores whose first use (schema) this process has been through


@contextlib.contextmanager
def first_use(uri: str):
    """MLflow and Optuna create a new database's schema on first use, without a lock: several processes opening one
    new store at once (ten submissions of a study, the searches of a study on several machines) collide, and all
    but one fail ("table ... already exists", a duplicate key in PostgreSQL's catalogue: 5 of 6 processes here).
    So the first use goes through a lock: SQLite, a file lock beside the database; PostgreSQL, an advisory lock in
    the database. Other stores (an MLflow server, which made its schema when it started) as they are. A store this
    process has already opened is not locked again (a search's trial worker opens its storage for every trial)."""
    if uri in _OPENED or not uri.startswith(LOCKED_SCHEMES):
        yield
        return
    lock = _file_lock(Path(uri.removeprefix("sqlite:///"))) if uri.startswith("sqlite:///") else _advisory_lock(uri)
    with lock:
        yield
    _OPENED.add(uri)  # only when the block succeeded: its schema is there


@contextlib.contextmanager
def _file_lock(db: Path):
    import fcntl

    db.parent.mkdir(parents=True, exist_ok=True)
    with open(db.with_name(db.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@contextlib.contextmanager
def _advisory_lock(url: str):
    """PostgreSQL's session advisory lock SCHEMA_LOCK, held on a connection of its own for the block. A database
    that cannot be reached (or a URL SQLAlchemy cannot use) is left to the store's own client, which says so in
    its words."""
    import sqlalchemy
    from sqlalchemy.pool import NullPool

    eng = conn = None
    try:
        eng = sqlalchemy.create_engine(url, poolclass=NullPool)
        conn = eng.connect()
        conn.exec_driver_sql(f"SELECT pg_advisory_lock({SCHEMA_LOCK})")
    except Exception:  # unreachable, refused, no driver: the store's client says so when it opens the store
        if conn is not None:
            conn.close()
        conn = None
    try:
        yield
    finally:
        if conn is not None:
            conn.close()  # ends the session, and with it the lock
        if eng is not None:
            eng.dispose()


def search_all(uri: str, experiment_ids: list[str], filter_string: str) -> list:
    """Every run matching the filter (paged)."""
    c = client(uri)
    runs, token = [], None
    while True:
        page = c.search_runs(experiment_ids, filter_string, max_results=1000, page_token=token)
        runs += list(page)
        token = page.token
        if not token:
            return runs


def runs_in_status(uri: str, experiment: str, kind: str, status: str, **tags: str) -> list:
    """The runs of ``kind`` (with ``tags``) in ``experiment`` whose MLflow status is ``status`` (RUNNING, FINISHED...)."""
    exp = client(uri).get_experiment_by_name(experiment)
    if exp is None:
        return []
    return search_all(uri, [exp.experiment_id], kind_filter(kind, **tags) + f" and attributes.status = '{status}'")


def running_runs(uri: str, experiment: str, kind: str, **tags: str) -> list:
    """The runs of ``kind`` (with ``tags``) in ``experiment`` whose MLflow status is still RUNNING."""
    return runs_in_status(uri, experiment, kind, "RUNNING", **tags)


# --- the cell ledger -----------------------------------------------------------------------------------------


def same_code(run, code: str | None) -> bool:
    """Whether a run was trained by the code with fingerprint ``code`` (None: any code)."""
    return code is None or run.data.tags.get(TAG_CODE) == code


def cell_runs(uri: str, study: str, cell_id: str | None = None) -> dict[str, list]:
    """cell_id -> its runs (every attempt of every submission), oldest first; one cell's only, if given."""
    exp = client(uri).get_experiment_by_name(study)
    if exp is None:
        return {}
    out: dict[str, list] = {}
    query = kind_filter(KIND_CELL, **({TAG_CELL_ID: cell_id} if cell_id else {}))
    for run in sorted(search_all(uri, [exp.experiment_id], query), key=lambda r: r.info.start_time):
        out.setdefault(run.data.tags.get(TAG_CELL_ID, ""), []).append(run)
    return out


def result_run(runs: Iterable, code: str | None = None):
    """A cell's result: its first finished or diverged run (trained by the code ``code``, unless None), else None."""
    return next((r for r in runs if cell_state(r) in RESULT_STATES and same_code(r, code)), None)


def counted_run(runs: list, code: str | None):
    """The run a cell's outcome is read from: its first result by ``code`` (None: any), else its latest attempt by
    that code; None when that code never ran it."""
    own = [r for r in runs if same_code(r, code)]
    return result_run(own) or (own[-1] if own else None)


def mark_outcomes(uri: str, study: str, cell_ids: Iterable[str], code: str | None) -> None:
    """Tag each cell's counted run ``outcome=counted`` and its other runs (killed attempts, a failed attempt Tune
    retried, other code's results) ``outcome=superseded``, so that MLflow's filter ``tags.outcome = "counted"``
    shows one run per cell: ``tags.kind = "cell"`` also returned killed attempts with partial curves."""
    c = client(uri)
    by_cell = cell_runs(uri, study)
    for cell_id in cell_ids:
        runs = by_cell.get(cell_id, [])
        counted = counted_run(runs, code)
        for run in runs:
            value = OUTCOME_COUNTED if run is counted else OUTCOME_SUPERSEDED
            if run.info.status != "RUNNING" and run.data.tags.get(TAG_OUTCOME) != value:
                _set_tag_once_raced(c, run.info.run_id, TAG_OUTCOME, value)


def _set_tag_once_raced(c, run_id: str, key: str, value: str) -> None:
    """``set_tag``, where another submission ending at the same moment may set the same tag first: MLflow's SQL store
    inserts a new tag, and PostgreSQL refused the second insert (a duplicate key: seen with ten submissions at once).
    Written by the other, the tag holds a value; this one's is set again over it."""
    from mlflow.exceptions import MlflowException

    try:
        c.set_tag(run_id, key, value)
    except MlflowException as err:
        if "duplicate key" not in str(err) and "UNIQUE constraint" not in str(err):
            raise
        c.set_tag(run_id, key, value)  # an update now: the row exists


def run_missing(uri: str, run_id: str | None) -> bool:
    """Whether the store at ``uri`` says it has no run ``run_id``. Any other answer (the run, a refusal: an MLflow
    server with authentication refuses runs it does not know with 403, an unreachable store) is not "missing"."""
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import RESOURCE_DOES_NOT_EXIST, ErrorCode

    if not run_id:
        return True
    try:
        client(uri).get_run(run_id)
    except MlflowException as err:
        return err.error_code == ErrorCode.Name(RESOURCE_DOES_NOT_EXIST)
    return False


def end_run(uri: str, run_id: str, status: str, detail: str = "") -> None:
    """Tag a run's state and terminate it with the matching MLflow status."""
    from mlflow.entities import RunTag

    c = client(uri)
    c.log_batch(run_id, tags=[RunTag(TAG_STATUS, status_tag(status, detail))])
    c.set_terminated(run_id, MLFLOW_STATUS[status])


def mark_killed(uri: str, run, reason: str) -> None:
    """A run whose process or submission stopped before it ended."""
    end_run(uri, run.info.run_id, STATUS_KILLED, reason)


def name_hint(study: str, names: list[str]) -> str:
    """A study's file given for its name (ablations/studies/heads.yaml: the name is heads), or a close name."""
    import difflib
    from pathlib import Path

    if study.endswith((".yaml", ".yml")):
        stem = Path(study).stem
        return f" (give the study's name, not its file{f': {stem}' if stem in names else ''})"
    close = difflib.get_close_matches(study, names, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""
