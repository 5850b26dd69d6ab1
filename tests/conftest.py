"""Shared fixtures. Every test owns its state: MLflow stores, servers and Ray clusters live in tmp dirs,
on free loopback ports, and are stopped by their PID."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from ablations import localcluster

ROOT = Path(__file__).resolve().parents[1]

# Quiet, loopback-only, and nothing left in the system temp folder or the home folder.
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # before anything imports ray: loopback only
os.environ.pop("MLFLOW_TRACKING_URI", None)
# Ray Train's storage (data-parallel trials) defaults to .ablate/ray_results of the working folder: the checkout.
# The session gives it a temp folder of its own instead, removed at the end (a test that sets it keeps its own).
_RAY_STORAGE = pytest.StashKey[str]()


# --- the session: Ctrl-C and SIGTERM stop it, and every process it started, at once ---------------------
#
# Every process the suite starts (subprocesses, Ray's daemons and workers, servers) inherits a marker in its
# environment; whatever still carries it when the session ends, or is interrupted, is killed. Lightning turns
# Ctrl-C inside training into sys.exit(1) (and SIGTERM into a SystemExit): ablations.train.fit gives both back
# as KeyboardInterrupt, so pytest stops instead of failing one test and carrying on.
#
# With pytest-xdist (`make test` runs two workers) the controller's SESSION_MARK reaches the workers and all they
# start: a signal to the controller kills the whole run. Each worker also has a WORKER_MARK of its own, and kills
# only what carries it when it ends (the other worker goes on).
SESSION_MARK = "ABLATE_TEST_SESSION"
WORKER_MARK = "ABLATE_TEST_WORKER"
_own = SESSION_MARK  # the marker whose processes this process kills: SESSION_MARK, or WORKER_MARK in a worker
_terms = 0


def marked_processes(var: str, value: str) -> list[int]:
    """PIDs of the live processes started with ``var=value`` in their environment (Linux: read from /proc)."""
    return localcluster.marked(value, var)


def session_processes(mark: str | None = None) -> list[int]:
    """PIDs of the live processes that carry this session's marker (or ``mark``)."""
    return marked_processes(SESSION_MARK, mark or os.environ.get(SESSION_MARK, ""))


def kill_session_processes() -> None:
    """Kill what this process started: the whole session's processes, or in an xdist worker its own."""
    for pid in marked_processes(_own, os.environ.get(_own, "")):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _on_sigterm(signum, frame) -> None:
    global _terms
    _terms += 1
    kill_session_processes()
    if _terms > 1:  # a second SIGTERM: no more waiting for clean-ups
        os._exit(143)
    raise KeyboardInterrupt("SIGTERM")


def pytest_configure(config) -> None:
    global _own
    from ablations.process import exit_quickly

    exit_quickly()  # each test process ends without collecting its libraries' garbage (seconds with torch loaded)
    # A session started where Ctrl-C is ignored (a background job of a non-interactive shell: `make test &`) would
    # pass that on to every subprocess: an ignored signal stays ignored across exec, so the tests that send Ctrl-C
    # to an `ablate` command would see it ignored. Tests emulate a terminal: Ctrl-C is handled again.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
    if hasattr(config, "workerinput"):  # an xdist worker: the controller's session marker stays
        _own = WORKER_MARK
    os.environ[_own] = f"{os.getpid()}-{time.time_ns()}"
    if not os.environ.get("ABLATE_RAY_STORAGE"):
        config.stash[_RAY_STORAGE] = os.environ["ABLATE_RAY_STORAGE"] = tempfile.mkdtemp(prefix="tests-ray-results-")
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)


@pytest.hookimpl(hookwrapper=True)
def pytest_collection(session):
    """Collecting imports torch, Lightning, MLflow, Ray and the rest once per test process: with the garbage
    collector paused, and what it built frozen (ablations.process)."""
    from ablations.process import collector_paused

    with collector_paused():
        yield


# --- the order: the longest tests first, shared out between the test processes ------------------------------
#
# The suite is CPU-bound on two cores, and its cost is concentrated: about 40 tests (real clusters, servers,
# killed drivers) take most of it. xdist's worksteal hands each process a contiguous share of the collection (the
# first half to one, the second to the other), and a process that runs dry steals the tail of the other's queue.
# Sorted longest-first, the first process would hold every long test and the other only short ones: at the end
# one long test runs while the other process idles. So the measured tests (tests/durations.json: the seconds each
# took in a whole run here; `python -m tests.durations` measures them one at a time) are dealt out longest first,
# each to whichever share has the least so far (greedy longest-processing-time), each share sorted longest first
# and filled up with unmeasured tests: both processes start on their own long tests, and what either steals at
# the end is short.
DURATIONS = ROOT / "tests" / "durations.json"


def deal_longest_first(items: list, cost: dict[str, float], shares: int) -> list:
    """``items`` reordered into ``shares`` contiguous runs of (nearly) equal length and equal measured cost, each
    longest first: the split xdist's worksteal makes between ``shares`` processes."""
    measured = sorted((i for i in items if i.nodeid in cost), key=lambda i: -cost[i.nodeid])
    rest = [i for i in items if i.nodeid not in cost]
    rest.sort(key=lambda item: item.get_closest_marker("slow") is None)  # slow before the rest, stable otherwise
    sizes = [len(items) // shares + (k < len(items) % shares) for k in range(shares)]
    runs: list[list] = [[] for _ in range(shares)]
    totals = [0.0] * shares
    for item in measured:
        open_ = [k for k in range(shares) if len(runs[k]) < sizes[k]]
        k = min(open_, key=lambda k: totals[k])
        runs[k].append(item)
        totals[k] += cost[item.nodeid]
    for k in range(shares):  # unmeasured tests fill up each share, in collection order, slow ones first
        while len(runs[k]) < sizes[k]:
            runs[k].append(rest.pop(0))
    return [item for run in runs for item in run]


def pytest_collection_modifyitems(config, items) -> None:
    import json

    try:
        cost = json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        return
    # the order xdist schedules by is the workers' collection (each worker knows how many there are)
    shares = config.workerinput["workercount"] if hasattr(config, "workerinput") else 1
    items[:] = deal_longest_first(items, cost, shares)


def pytest_unconfigure(config) -> None:
    # Disconnect from the shared local Ray first: a driver whose Ray was killed under it waits 60 s for its GCS at
    # exit ("Failed to connect to GCS within 60 seconds"), in every test process that used one.
    if "ray" in sys.modules:
        import ray

        with contextlib.suppress(Exception):
            if ray.is_initialized():
                ray.shutdown()
    kill_session_processes()
    if _RAY_STORAGE in config.stash:
        shutil.rmtree(config.stash[_RAY_STORAGE], ignore_errors=True)


def _sigint_state() -> tuple:
    """This thread's Ctrl-C handler, and whether SIGINT is blocked: what the subprocesses a test starts inherit
    (an ignored or blocked SIGINT stays so across exec: such a child would never see the test's Ctrl-C)."""
    return signal.getsignal(signal.SIGINT), signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])


@pytest.fixture(autouse=True)
def _sigint_left_as_found():
    """A test that leaves Ctrl-C handled differently (Ray Tune's handler, Lightning's SIG_IGN) fails, and the
    handler is put back: the next test's subprocesses and the session's own Ctrl-C depend on it."""
    before = _sigint_state()
    on_term = signal.getsignal(signal.SIGTERM)
    yield
    # `ablate.main.main` called in-process makes SIGTERM a KeyboardInterrupt, as a command should: the session's
    # own handler (which kills what the session started first) is put back silently.
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is not on_term:
        signal.signal(signal.SIGTERM, on_term)
    after = _sigint_state()
    if after != before:
        signal.signal(signal.SIGINT, before[0])
        signal.pthread_sigmask(signal.SIG_BLOCK if before[1] else signal.SIG_UNBLOCK, [signal.SIGINT])
        pytest.fail(f"the test left SIGINT as {after} (it was {before})", pytrace=False)


@pytest.fixture(autouse=True)
def _one_thread():
    import torch

    torch.set_num_threads(1)  # 2 cores: tests must not fight over them
    yield


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct ports nothing holds, between Ray's worker ports and the ephemeral range: a port picked by
    binding port 0 is an ephemeral one, which another test's outgoing connection may take before its server binds
    it (a Ray head's runtime-env agent lost its port so once, and the head exited with it)."""
    return localcluster.free_ports(n, host)


def free_port(host: str = "127.0.0.1") -> int:
    return free_ports(1, host)[0]


def wait_for_http(url: str, timeout: float = 60.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{url}: the server exited with code {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status < 500:
                    return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"{url} did not answer within {timeout} s")


def stop(proc: subprocess.Popen, timeout: float = 20.0) -> None:
    """SIGTERM the process group by PID, then SIGKILL what is left."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=timeout)


@contextlib.contextmanager
def mlflow_server(tmp: Path, extra_args: list[str] | None = None, env: dict[str, str] | None = None):
    """A real ``mlflow server`` on 127.0.0.1 and a free port, with a SQLite backend in ``tmp``."""
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--backend-store-uri",
        f"sqlite:///{tmp / 'server.db'}",
        "--artifacts-destination",
        str(tmp / "server-artifacts"),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
        *(extra_args or []),
    ]
    log = open(tmp / "mlflow-server.log", "w")  # noqa: SIM115  (closed in finally, after the server)
    proc = subprocess.Popen(
        cmd,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        cwd=tmp,
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **(env or {})},
    )
    try:
        wait_for_http(f"http://127.0.0.1:{port}/health", proc=proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(proc)
        log.close()


@pytest.fixture
def local_ray():
    """A local Ray (2 CPUs, loopback) shared by the tests that ask for it: run_study and run_search join a Ray this
    process is already connected to (ablations.cluster.connect) instead of starting and stopping their own, and its
    worker processes keep torch and Lightning imported between tests. Started on first use, stopped at the end of
    the session, or by ``own_ray`` before a test that needs a cluster of its own."""
    import ray

    from ablations.cluster import connect

    if not ray.is_initialized():
        connect(num_cpus=2)
    yield


@pytest.fixture
def own_ray():
    """No shared Ray in this process: the test starts or joins a cluster of its own."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
    yield


def postgres_reachable() -> bool:
    """This machine's PostgreSQL on 127.0.0.1:5432 (trust authentication) answers."""
    try:
        with socket.create_connection(("127.0.0.1", 5432), timeout=1):
            return True
    except OSError:
        return False


@contextlib.contextmanager
def fresh_postgres_database(prefix: str):
    """A new, empty PostgreSQL database for one test (skipped when none is reachable); its URL for SQLAlchemy,
    MLflow and the claims store. Dropped afterwards, whoever is still connected."""
    import uuid

    if not postgres_reachable():
        pytest.skip("no PostgreSQL reachable on 127.0.0.1:5432")
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    psql = ["psql", "-h", "127.0.0.1", "-U", "postgres", "-d", "postgres", "-q", "-c"]
    subprocess.run([*psql, f"CREATE DATABASE {name}"], check=True, capture_output=True)
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    finally:
        from ablations.claims import engine

        engine.cache_clear()  # its pooled connections would hold the database open
        subprocess.run([*psql, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"], capture_output=True)


@pytest.fixture(params=["sqlite", "postgresql"])
def new_database(request, tmp_path):
    """A new, empty database, once on SQLite (a file in the test's tmp dir) and once on PostgreSQL (skipped when
    none is reachable): its URL for SQLAlchemy, MLflow, Optuna and the claims store."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'new.db'}"
        return
    with fresh_postgres_database("ablate_new") as url:
        yield url


@pytest.fixture(scope="session")
def _empty_store(tmp_path_factory) -> Path:
    """An empty SQLite MLflow store, created by MLflow once per test process: its schema migrations took about
    1.5 s here, paid again by every test that opened a new store."""
    from mlflow import MlflowClient

    path = tmp_path_factory.mktemp("empty-store") / "mlflow.db"
    MlflowClient(f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture
def store(tmp_path: Path, _empty_store: Path) -> str:
    """A fresh SQLite MLflow store for one test: a copy of the empty store MLflow created for this process."""
    shutil.copyfile(_empty_store, tmp_path / "mlflow.db")
    return f"sqlite:///{tmp_path / 'mlflow.db'}"
