"""Writing to MLflow: where the store is, experiments, and one run's params, metrics, tags and artifacts.

The names of what is recorded (run kinds, tags, states) live in ``record.vocabulary``.

- Metrics per step, written by a background thread in batches (``log_batch``), so that training never
  waits for the store; summary metrics at the end (best_*, final_*, test splits, cost_*).
- Artifacts: the resolved configuration (config.yaml), the traceback of a failure, optionally the
  checkpoint. Dataset lineage through ``log_inputs``.

Embedded default: with no tracking URI (flag or MLFLOW_TRACKING_URI), a SQLite store and local artifacts
under ``.ablate/`` in the working directory.
"""

from __future__ import annotations

import functools
import itertools
import os
import queue
import sqlite3
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit
from urllib.request import url2pathname

import tenacity

from record.secrets import redact
from record.vocabulary import (
    MLFLOW_STATUS,
    STATUS_RUNNING,
    TAG_EXPERIMENT_KIND,
    TAG_LOGGING_ERRORS,
    TAG_LOGGING_SECONDS,
    TAG_METRICS_LOST,
    TAG_PARENT,
    TAG_STATUS,
    TAG_TRACKING_SECONDS,
    client,
    status_tag,
)

if TYPE_CHECKING:
    from record.spec import RunConfig

# A run's hooks are called at every logging point with (step, metrics): a search's pruner, Tune's reports.
Hook = Callable[[int, dict[str, float]], None]


@dataclass
class Tracking:
    """Where a run is recorded. ``uri`` None: MLFLOW_TRACKING_URI, else the embedded store in .ablate/.

    Here rather than beside ``ablations.train.train``: the processes that only drive training (a data-parallel
    trial's Tune actor and Ray Train controller, a search's trial task) describe runs without importing torch and
    Lightning (about 6.5 CPU-seconds per process on 2 cores)."""

    uri: str | None = None
    experiment: str | None = None
    parent_run_id: str | None = None
    run_name: str | None = None
    tags: dict[str, str] = field(default_factory=dict)


@dataclass(kw_only=True)
class RunResult:
    run_id: str
    status: str  # finished | diverged | failed | killed
    detail: str
    metrics: dict[str, float]
    tracking_uri: str
    experiment: str


def experiment_name(run: RunConfig, where: Tracking) -> str:
    return where.experiment or run.tracking.experiment or run.name or "runs"


HOME_DIR = ".ablate"  # the embedded default's folder, in the working directory
MAX_BATCH = 1000  # metrics per log_batch call (MLflow's limit)
MAX_PARAMS = 100  # params per log_batch call (MLflow's limit)


def home(root: str | Path | None = None) -> Path:
    return (Path(root) if root else Path.cwd()).resolve() / HOME_DIR


def embedded_uri(root: str | Path | None = None) -> str:
    return f"sqlite:///{home(root) / 'mlflow.db'}"


def resolve_uri(uri: str | None = None, root: str | Path | None = None, *, create: bool = True) -> str:
    """The flag, else MLFLOW_TRACKING_URI, else the embedded SQLite store under .ablate/ (its folder is made
    unless ``create`` is false: a dry run writes nothing)."""
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI")
    if not uri and create:
        home(root).mkdir(parents=True, exist_ok=True)
    uri = uri or embedded_uri(root)
    if create:
        _follow_once(uri)
    return uri


@functools.cache
def _follow_once(uri: str) -> None:
    """Once per process and store: a trial worker resolves the store for every cell it trains."""
    if old := follow_moved_store(uri):
        print(f"the store moved from {old}: its artifact paths now point beside it", file=sys.stderr)


MOVABLE = (("experiments", "artifact_location"), ("runs", "artifact_uri"), ("logged_models", "artifact_location"))


def follow_moved_store(uri: str) -> str | None:
    """A SQLite store copied to another folder or machine with its artifacts folder beside it (a long study continued
    elsewhere): MLflow keeps absolute artifact paths, so those under an artifacts root that no longer exists are
    rewritten to the one beside the store. Returns the old root when it did; a store in place is never touched."""
    db = Path(uri.removeprefix("sqlite:///"))
    here = db.parent / "artifacts"
    if not uri.startswith("sqlite:///") or not db.is_file() or not here.is_dir():
        return None
    con = sqlite3.connect(db, timeout=60)
    try:
        try:
            located = con.execute("SELECT name, artifact_location FROM experiments").fetchall()
        except sqlite3.OperationalError:  # no MLflow tables yet
            return None
        roots = {loc[: -len(name) - 1] for name, loc in located if loc and loc.endswith(f"/artifacts/{name}")}
        gone = [r for r in roots if r != here.as_uri() and not Path(url2pathname(urlsplit(r).path)).exists()]
        tables = {t for (t,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        with con:
            for old, (table, column) in itertools.product(gone, MOVABLE):
                if table in tables:
                    con.execute(
                        f"UPDATE {table} SET {column} = ? || substr({column}, ?) WHERE substr({column}, 1, ?) = ?",
                        (here.as_uri(), len(old) + 1, len(old), old),
                    )
        return gone[0] if gone else None
    finally:
        con.close()


def ray_storage() -> str:
    """Where Ray Train keeps a data-parallel trial's state: ABLATE_RAY_STORAGE (a path or URI every node of a
    cluster reaches), else .ablate/ray_results on this machine."""
    return os.environ.get("ABLATE_RAY_STORAGE") or str(home() / "ray_results")


def artifact_root(uri: str) -> str | None:
    """Where new experiments keep artifacts: beside a SQLite store (.ablate/artifacts for the embedded
    default); the server's choice (proxied artifacts) for a tracking server."""
    if uri.startswith("sqlite:///"):
        return (Path(uri[len("sqlite:///") :]).parent / "artifacts").as_uri()
    return None


def experiment_id(uri: str, name: str) -> str:
    """The experiment's id, created (with local artifacts for the embedded store) if it does not exist."""
    from mlflow.exceptions import MlflowException

    c = client(uri)
    exp = c.get_experiment_by_name(name)
    if exp is not None:
        if exp.lifecycle_stage == "deleted":
            c.restore_experiment(exp.experiment_id)
        return exp.experiment_id
    location = artifact_root(uri)
    try:
        # MLflow's UI opens experiments of unknown kind on its GenAI pages; ours are model training
        return c.create_experiment(
            name,
            artifact_location=f"{location}/{name}" if location else None,
            tags={TAG_EXPERIMENT_KIND: "custom_model_development"},
        )
    except MlflowException:  # created meanwhile by another process
        exp = c.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


@functools.lru_cache(maxsize=1)
def code_version() -> dict[str, str]:
    """git sha and dirty flag of the project's code (not of the working directory)."""
    repo = Path(__file__).resolve().parents[1]
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()
        dirty = bool(
            subprocess.run(
                ["git", "status", "--porcelain", "--untracked-files=no"],
                cwd=repo,
                capture_output=True,
                text=True,
                check=True,
                timeout=10,
            ).stdout.strip()
        )
    except (OSError, subprocess.SubprocessError):
        return {"code_version": "unknown"}
    return {
        "git_sha": sha,
        "git_dirty": str(dirty).lower(),
        "mlflow.source.git.commit": sha,
        "code_version": sha[:12] + ("-dirty" if dirty else ""),
    }


# The code that shapes a result: the model, its components, the tasks, the training loop, and the libraries
# that run them. A change to any of these makes the same configuration another cell.
FINGERPRINTED = ("models", "ablations/train.py", "ablations/parallel.py")  # parallel: the data-parallel path
FINGERPRINTED_LIBRARIES = ("torch", "lightning")


@functools.lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """A hash of the code that shapes a result (FINGERPRINTED sources, byte for byte, and the versions of
    FINGERPRINTED_LIBRARIES): 12 hex digits. Unlike the git sha it ignores everything else (docs, the CLI,
    the sweep driver) and sees uncommitted edits."""
    import hashlib
    from importlib.metadata import PackageNotFoundError, version

    repo = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for entry in FINGERPRINTED:
        path = repo / entry
        files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
        for f in files:
            h.update(str(f.relative_to(repo)).encode() + b"\0" + f.read_bytes() + b"\0")
    for lib in FINGERPRINTED_LIBRARIES:
        try:
            h.update(f"{lib}=={version(lib)}".encode())
        except PackageNotFoundError:
            h.update(f"{lib} missing".encode())
    return h.hexdigest()[:12]


class MetricWriter:
    """Metrics go into a queue; a daemon thread sends them with log_batch every ``interval`` seconds or every
    ``MAX_BATCH`` metrics. Nothing is dropped: a batch the store refuses (unreachable, locked) is kept and sent
    again with growing pauses while training goes on; ``close()`` keeps trying for ``flush_timeout`` seconds,
    and only what is still unsent then is counted as ``lost`` (the run says so). Time spent sending is measured."""

    def __init__(self, uri: str, run_id: str, interval: float = 2.0, flush_timeout: float = 120.0) -> None:
        self.uri, self.run_id, self.interval, self.flush_timeout = uri, run_id, interval, flush_timeout
        self._queue: queue.Queue = queue.Queue()
        self._retry: list = []  # a batch the store refused, sent again first
        self._stop = threading.Event()
        self.seconds_sending = 0.0
        self.sent = 0
        self.lost = 0
        self.errors: list[str] = []
        self._thread = threading.Thread(target=self._loop, name="mlflow-metrics", daemon=True)
        self._thread.start()

    def log(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        for key, value in metrics.items():
            self._queue.put(Metric(key, float(value), now, int(step)))

    def _batch(self) -> list:
        if self._retry:
            return self._retry
        items = []
        while len(items) < MAX_BATCH:
            try:
                items.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return items

    def _send(self, items: list) -> bool:
        """One attempt; a refused batch is kept for the next one."""
        t = time.perf_counter()
        try:
            client(self.uri).log_batch(self.run_id, metrics=items, synchronous=True)
        except Exception as err:  # the store is unreachable or busy: keep the batch, say why once
            message = f"{type(err).__name__}: {err}"[:300]
            if message not in self.errors:
                self.errors.append(message)
            self._retry = items
            return False
        finally:
            self.seconds_sending += time.perf_counter() - t
        self._retry = []
        self.sent += len(items)
        return True

    def _loop(self) -> None:
        pause = self.interval
        while not self._stop.is_set():
            self._stop.wait(pause)
            sent = True
            while items := self._batch():
                if not self._send(items):
                    sent = False
                    break
            pause = self.interval if sent else min(30.0, pause * 2)  # back off while the store is away

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        deadline, pause = time.monotonic() + self.flush_timeout, 0.5
        while items := self._batch():
            if self._send(items):
                continue
            if time.monotonic() > deadline:
                self.lost = len(self._retry) + self._queue.qsize()
                self._retry = []
                break
            time.sleep(pause)
            pause = min(10.0, pause * 2)


@dataclass(kw_only=True)
class RunLogger:
    """One MLflow run: created, filled and ended through the conventions above."""

    uri: str
    experiment: str
    run_name: str | None = None
    parent_run_id: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    run_id: str | None = None
    writer: MetricWriter | None = None
    seconds_writing: float = 0.0  # in the foreground: creating, filling and ending the run

    def start(self, params: dict[str, Any], config: dict[str, Any]) -> str:
        from mlflow.entities import Param, RunTag

        t = time.perf_counter()
        c = client(self.uri)
        tags = {**code_version(), **{k: str(v) for k, v in self.tags.items()}, TAG_STATUS: STATUS_RUNNING}
        if self.parent_run_id:
            tags[TAG_PARENT] = self.parent_run_id
        run = c.create_run(experiment_id(self.uri, self.experiment), tags=tags, run_name=self.run_name)
        self.run_id = run.info.run_id
        items = [Param(k, str(v)) for k, v in params.items()]
        for i in range(0, len(items), MAX_PARAMS):
            c.log_batch(
                self.run_id,
                params=items[i : i + MAX_PARAMS],
                tags=[RunTag("mlflow.runName", run.info.run_name)] if i == 0 else (),
            )
        import yaml

        c.log_text(self.run_id, yaml.safe_dump(config, sort_keys=False), "config.yaml")
        self.writer = MetricWriter(self.uri, self.run_id)
        self.seconds_writing += time.perf_counter() - t
        return self.run_id

    def log_datasets(self, datasets: dict[str, Any], name: str, digests: dict[str, str]) -> None:
        """Lineage of each split (a Hugging Face dataset) through log_inputs, with the digest of its content."""
        import mlflow.data
        from mlflow.entities import Dataset, DatasetInput, InputTag

        t = time.perf_counter()
        inputs = []
        for split, ds in datasets.items():
            with warnings.catch_warnings():  # MLflow's hint about integer columns in model schemas
                warnings.simplefilter("ignore")
                d = mlflow.data.from_huggingface(ds, name=f"{name}/{split}", digest=digests[split]).to_dict()
            context = {"train": "training", "validation": "validation"}.get(split, "testing")
            inputs.append(
                DatasetInput(Dataset(**d), tags=[InputTag("mlflow.data.context", context), InputTag("split", split)])
            )
        # Trials of one study log the same dataset at the same moment; MLflow's SQL store checks, then inserts,
        # so one of two concurrent inserts fails on its unique key. Once the other has committed, the retry
        # finds the dataset and only links it to this run.
        for attempt in tenacity.Retrying(
            retry=tenacity.retry_if_exception(_duplicate_key),
            stop=tenacity.stop_after_attempt(5),
            wait=tenacity.wait_incrementing(0.2, 0.2),
            reraise=True,
        ):
            with attempt:
                client(self.uri).log_inputs(self.run_id, datasets=inputs)
        self.seconds_writing += time.perf_counter() - t

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.writer.log(metrics, step)

    def set_tags(self, tags: dict[str, Any]) -> None:
        from mlflow.entities import RunTag

        client(self.uri).log_batch(self.run_id, tags=[RunTag(k, redact(str(v))[:5000]) for k, v in tags.items()])

    def log_text(self, text: str, artifact_file: str) -> None:
        client(self.uri).log_text(self.run_id, redact(text), artifact_file)

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        client(self.uri).log_artifact(self.run_id, str(path), artifact_path)

    def end(self, status: str, detail: str = "", summary: dict[str, float] | None = None, step: int = 0) -> None:
        """Send the remaining metrics and the summary, tag the status detail, terminate the run."""
        t = time.perf_counter()
        if self.writer is not None:
            if summary:
                self.writer.log(summary, step)
            self.writer.close()
        if self.writer is not None and self.writer.lost:  # nothing is lost silently: the run says so
            lost = f"{self.writer.lost} metric value(s) could not be logged ({self.writer.errors[-1]})"
            detail = f"{detail}; {lost}" if detail else lost
        tags = {TAG_STATUS: status_tag(status, detail)}
        if self.writer is not None:
            tags[TAG_LOGGING_SECONDS] = f"{self.writer.seconds_sending:.3f}"
            if self.writer.lost:
                tags[TAG_METRICS_LOST] = str(self.writer.lost)
            if self.writer.errors:
                tags[TAG_LOGGING_ERRORS] = "; ".join(self.writer.errors)[:5000]
        # what writing to MLflow cost this run in the foreground (set-up, lineage, closing), in seconds
        tags[TAG_TRACKING_SECONDS] = f"{self.seconds_writing + time.perf_counter() - t:.3f}"
        self.set_tags(tags)
        client(self.uri).set_terminated(self.run_id, MLFLOW_STATUS[status])


DUPLICATE_KEY = ("UNIQUE constraint", "duplicate key")  # SQLite's and PostgreSQL's words, in a server's answer


def _duplicate_key(err: BaseException) -> bool:
    """An insert that lost a race on a unique key: trials of one study log the same dataset at once, and MLflow's SQL
    store checks, then inserts. In this process MLflow chains the database's IntegrityError; from a tracking server
    only the error's text comes back."""
    from sqlalchemy.exc import IntegrityError

    chain, seen = err, 0
    while chain is not None and seen < 10:
        if isinstance(chain, IntegrityError):
            return True
        chain, seen = chain.__cause__ or chain.__context__, seen + 1
    return any(words in str(err) for words in DUPLICATE_KEY)
