"""A randomized fault soak (issue 53): a study and a search on the team deployment's stores and a two-node Ray, while
a fault schedule drawn from a fixed seed kills drivers, trial workers, a Ray node and the MLflow server, and restarts
PostgreSQL; every driver that stops is submitted again. Afterwards, counted from the stores through MLflow's and
Optuna's clients: cells and trials lost, duplicated, recorded failed (with their reasons), metrics missing from a
finished run, and runs left RUNNING with no process.

    python benchmarks/soak.py                # 40 cells, 30 trials, 6 rounds -> results/soak.md, results/soak.json
    python benchmarks/soak.py --short        # what the suite runs (tests/test_soak.py) -> results/quick/
    python benchmarks/soak.py --seed 7       # another schedule (the default seed is fixed: 53)

The seed fixes the schedule (which faults, in which round, at what share of the work, with what pauses); when each
fault lands on a process is up to the machine, so two runs of one seed differ in their details, not in their targets.

Everything runs on this machine, on 127.0.0.1 and free ports, and every process is stopped by its PID:
- PostgreSQL: a throwaway server of this machine's binaries (initdb; as the ``postgres`` user when run as root) with
  platform/postgres/init.sh's roles and databases; the fault stops it (fast or immediate shutdown) and starts it
  again. Without the binaries, ``--postgres shared`` uses the server on 127.0.0.1:5432 under a prefix of its own, and
  a "restart" there only terminates the roles' connections (pg_terminate_backend): it says so in its figures.
- MLflow: docker-compose.yml's ``mlflow`` service (platform/mlflow/entrypoint.sh: basic auth, the PostgreSQL backend,
  proxied artifacts), one server worker; the fault SIGKILLs it and starts it again after a pause.
- Ray: ``ablate cluster up --workers 1`` (ablations.localcluster), one CPU per node; the fault SIGKILLs the second
  node with everything it runs (as a lost machine) and starts a node again after a pause.
- ``ablate sweep`` and ``ablate search`` at once, with the compose ``ablate`` service's environment (the workers'
  MLflow user, the optuna role's storage, which also holds the sweep's claims); a fault SIGKILLs or SIGTERMs one.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import pwd
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # tests.deployment.resolve: the deployment files read as compose reads them

import yaml  # noqa: E402

SEED = 53
KINDS = ("sweep driver", "search driver", "trial worker", "Ray node", "MLflow server", "PostgreSQL")
TINY = {"d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32}
STUDY, SEARCH = "soak", "soak_search"
SUMMARY = ("final/val_loss", "best/val_loss", "test/exact_match", "cost/steps")  # every finished run logs these
LOG_EVERY = 10  # the run files' tracking.log_every (its default): train/loss at steps 0, 10, 20, ...


@dataclass(frozen=True)
class Size:
    mode: str
    grid: dict[str, list]
    seeds: int
    trials: int
    rounds: int
    steps: int
    val_every: int
    down: tuple[float, float]  # how long the MLflow server or the Ray node stays away (seconds, drawn)
    extra: float  # the chance of a second fault in a round
    span: tuple[float, float]  # the rounds fire at shares of the work drawn within this range

    @property
    def cells(self) -> int:
        n = self.seeds
        for values in self.grid.values():
            n *= len(values)
        return n


FULL = Size(
    mode="full",
    grid={"model.norm": ["pre", "post"], "model.positions": ["sinusoidal", "learned"]},
    seeds=10,
    trials=30,
    rounds=6,
    steps=60,
    val_every=20,
    down=(4.0, 20.0),
    extra=0.5,
    span=(0.05, 0.75),
)
SHORT = Size(
    mode="short",
    grid={"model.norm": ["pre", "post"]},
    seeds=2,
    trials=3,
    rounds=2,
    steps=30,
    val_every=10,
    down=(1.0, 3.0),
    extra=0.0,
    span=(0.0, 0.45),
)


# --- the schedule --------------------------------------------------------------------------------------------------


@dataclass
class Fault:
    kind: str
    delay: float  # seconds after its round fires
    signal: str = ""  # a driver's: SIGKILL or SIGTERM
    pause: float = 0.0  # a driver: before it is submitted again; MLflow, a node, PostgreSQL: how long it is away
    mode: str = ""  # PostgreSQL's shutdown: fast or immediate
    # what happened, filled in when it fires
    at: float | None = None
    said: str = ""


@dataclass
class Round:
    number: int
    share: float  # fires once this share of the cells and trials is done
    faults: list[Fault]
    fired_at: float | None = None
    progress: float | None = None


def draw_schedule(seed: int, size: Size) -> list[Round]:
    """Every kind of fault at least once, dealt over the rounds in a random order, and a second one in a round with
    the chance ``size.extra``; each with its delay, signal, pause and shutdown mode drawn too."""
    rng = random.Random(seed)
    kinds = list(KINDS)
    rng.shuffle(kinds)
    dealt: list[list[str]] = [[] for _ in range(size.rounds)]
    for i, kind in enumerate(kinds):
        dealt[i % size.rounds].append(kind)
    for kinds_of_round in dealt:
        if rng.random() < size.extra:
            kinds_of_round.append(rng.choice([k for k in KINDS if k not in kinds_of_round]))
    low, high = size.span
    width = (high - low) / size.rounds
    rounds = []
    for i, kinds_of_round in enumerate(dealt):
        faults = []
        for kind in kinds_of_round:
            fault = Fault(kind, delay=round(rng.uniform(0.0, 2.0), 2))
            if kind.endswith("driver"):
                fault.signal = rng.choice(["SIGKILL", "SIGKILL", "SIGTERM"])
                fault.pause = round(rng.uniform(0.5, 3.0), 2)
            elif kind in ("MLflow server", "Ray node"):
                fault.pause = round(rng.uniform(*size.down), 2)
            elif kind == "PostgreSQL":
                fault.mode = rng.choice(["fast", "immediate"])
                fault.pause = round(rng.uniform(0.5, 3.0), 2)
            faults.append(fault)
        rounds.append(Round(i + 1, round(low + width * (i + rng.uniform(0.1, 0.9)), 3), faults))
    return rounds


# --- processes -----------------------------------------------------------------------------------------------------


def descendants(pid: int) -> list[int]:
    """The processes under ``pid`` (Linux /proc), deepest last."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def kill_tree(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    """``sig`` to a process started in a session of its own, its process group and every process under it."""
    pids = [proc.pid, *descendants(proc.pid)]
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def stop_gently(proc: subprocess.Popen, timeout: float = 30.0) -> None:
    """SIGTERM to its process group, then SIGKILL to what is left of it."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=timeout)
    kill_tree(proc)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def alive_with(text: str) -> list[int]:
    """The live processes whose command line holds ``text`` (a folder of the soak's: what it left running)."""
    needle, pids = text.encode(), []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if int(entry.name) != os.getpid() and needle in (entry / "cmdline").read_bytes() and alive(int(entry.name)):
                pids.append(int(entry.name))
        except (OSError, ValueError):
            continue
    return pids


def wait_until(check: Callable[[], bool], timeout: float, what: str, step: float = 0.2) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} within {timeout:.0f} s")
        time.sleep(step)


# --- PostgreSQL ----------------------------------------------------------------------------------------------------


def postgres_binaries() -> Path | None:
    """The folder of this machine's PostgreSQL server programs (initdb, postgres), or None."""
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3]))
    return versions[-1].parent if versions else None


class OwnPostgres:
    """A throwaway PostgreSQL server in ``folder`` on a free port: trust on its Unix socket (for init.sh, as the
    postgres image's is), passwords (SCRAM) on 127.0.0.1. Run as the ``postgres`` user when this process is root
    (PostgreSQL refuses to run as root)."""

    restart_is_real = True

    def __init__(self, folder: Path, port: int) -> None:
        self.folder, self.port, self.bin = folder, port, postgres_binaries()
        self.data, self.log = folder / "data", folder / "postgres.log"
        self.proc: subprocess.Popen | None = None
        self.prefix = ""
        self.as_user: list[str] = []
        if os.geteuid() == 0:
            self.as_user = ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups", "--"]

    def _own(self, path: Path) -> None:
        if self.as_user:
            user = pwd.getpwnam("postgres")
            os.chown(path, user.pw_uid, user.pw_gid)

    def create(self, superuser_password: str) -> None:
        self.folder.mkdir(parents=True)
        self._own(self.folder)
        pwfile = self.folder / "pw"
        pwfile.write_text(superuser_password)
        self._own(pwfile)
        out = subprocess.run(
            [*self.as_user, str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", f"--pwfile={pwfile}",
             "--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8", "--no-sync", "--locale=C.UTF-8"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        pwfile.unlink()
        if out.returncode:
            raise RuntimeError(f"initdb failed: {out.stderr[-2000:]}")

    def start(self) -> None:
        with open(self.log, "a") as log:
            self.proc = subprocess.Popen(
                [*self.as_user, str(self.bin / "postgres"), "-D", str(self.data), "-p", str(self.port),
                 "-k", str(self.folder), "-c", "listen_addresses=127.0.0.1", "-c", "max_connections=200"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        wait_until(self.ready, 60, "PostgreSQL did not accept connections")

    def ready(self) -> bool:
        import psycopg

        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"PostgreSQL exited: {self.log.read_text()[-2000:]}")
        try:
            psycopg.connect(self.superuser(), connect_timeout=2).close()
        except psycopg.OperationalError:
            return False
        return True

    def superuser(self, database: str = "postgres") -> str:
        return f"host={self.folder} port={self.port} user=postgres dbname={database}"

    def init_env(self) -> dict[str, str]:
        """Where platform/postgres/init.sh's psql finds this server: its socket (trust), as in the container."""
        return {"PGHOST": str(self.folder), "PGPORT": str(self.port)}

    def url(self, compose_url: str) -> str:
        return translate(compose_url, self.port, self.prefix)

    def stop(self, mode: str = "fast", timeout: float = 60.0) -> None:
        """SIGINT (fast shutdown: connections ended, a checkpoint) or SIGQUIT (immediate: no checkpoint; the next
        start recovers from the WAL, as after a crash) to the postmaster, by its PID."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGQUIT if mode == "immediate" else signal.SIGINT)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_tree(self.proc)
            self.proc.wait(timeout=10)

    def restart(self, mode: str, pause: float) -> str:
        self.stop(mode)
        time.sleep(pause)
        self.start()
        return f"{mode} shutdown, started again after {pause:g} s"

    def close(self) -> None:
        self.stop("fast")


class SharedPostgres:
    """The machine's PostgreSQL on 127.0.0.1:5432 (trust authentication), the roles and databases under a prefix of
    this soak's own, dropped at the end. It cannot be restarted from here: a "restart" terminates every connection
    of the prefixed roles (pg_terminate_backend), which is what clients see of a restart, without the downtime."""

    restart_is_real = False

    def __init__(self, prefix: str) -> None:
        self.port, self.prefix = 5432, prefix

    def create(self, superuser_password: str) -> None:
        pass

    def start(self) -> None:
        pass

    def superuser(self, database: str = "postgres") -> str:
        return f"host=127.0.0.1 port=5432 user=postgres dbname={database}"

    def init_env(self) -> dict[str, str]:
        return {"PGHOST": "127.0.0.1", "PGPORT": "5432", "ABLATE_DB_PREFIX": self.prefix}

    def url(self, compose_url: str) -> str:
        return translate(compose_url, self.port, self.prefix)

    def restart(self, mode: str, pause: float) -> str:
        import psycopg

        like = self.prefix.replace("_", r"\_") + "%"
        with psycopg.connect(self.superuser(), autocommit=True) as conn:
            n = conn.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE usename LIKE %s", (like,)
            ).fetchone()[0]
        return f"simulated: {n} connection(s) terminated (the shared server cannot be restarted from here)"

    def close(self) -> None:
        import psycopg

        with psycopg.connect(self.superuser(), autocommit=True) as conn:
            like = self.prefix.replace("_", r"\_") + "%"
            for (db,) in conn.execute("SELECT datname FROM pg_database WHERE datname LIKE %s", (like,)).fetchall():
                conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
            for (role,) in conn.execute("SELECT rolname FROM pg_roles WHERE rolname LIKE %s", (like,)).fetchall():
                conn.execute(f'DROP ROLE IF EXISTS "{role}"')


def translate(url: str, port: int, prefix: str = "", mlflow: str = "") -> str:
    """A URL of a compose service as this machine reaches it: ``postgres:5432`` is 127.0.0.1:``port`` (roles and
    databases under ``prefix``), ``mlflow:5000`` is ``mlflow``."""
    parts = urlsplit(url)
    if parts.hostname == "mlflow":
        return mlflow
    if parts.hostname != "postgres":
        return url
    user = f"{prefix}{parts.username}" + (f":{parts.password}" if parts.password is not None else "")
    return urlunsplit((parts.scheme, f"{user}@127.0.0.1:{port}", f"/{prefix}{parts.path.lstrip('/')}", "", ""))


# --- MLflow --------------------------------------------------------------------------------------------------------


class MLflowServer:
    """docker-compose.yml's mlflow service as a process: its entrypoint, arguments and environment, with the
    PostgreSQL URLs, the paths and the port translated to this machine (tests/deployment/resolve.py reads the file)."""

    def __init__(self, argv: list[str], env: dict[str, str], folder: Path, port: int) -> None:
        self.argv, self.env, self.folder, self.port = argv, env, folder, port
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen | None = None
        folder.mkdir(parents=True, exist_ok=True)

    def start(self, timeout: float = 180.0) -> None:
        ready = self.folder / "ready"
        ready.unlink(missing_ok=True)  # the last start's: the entrypoint removes it too, but not before we look
        with open(self.folder / "mlflow.log", "a") as log:
            self.proc = subprocess.Popen(
                self.argv, env=self.env, cwd=self.folder, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip

        def up() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"MLflow exited: {(self.folder / 'mlflow.log').read_text()[-2000:]}")
            return ready.exists()

        wait_until(up, timeout, "MLflow was not ready")  # the entrypoint writes it once its users are in place

    def kill(self) -> None:
        if self.proc is not None:
            kill_tree(self.proc)
            self.proc.wait(timeout=30)

    def close(self) -> None:
        if self.proc is not None:
            stop_gently(self.proc, timeout=20)


# --- Ray -----------------------------------------------------------------------------------------------------------


def start_node(cluster) -> None:
    """One more node of a loopback cluster ``ablate cluster up`` started (a lost node's machine back), as ``up``
    starts its nodes: ``python -m ablations.localcluster node start``, in a session of its own, on free ports, with
    the cluster's mark (``ablate cluster down`` stops it with the others)."""
    from ablations.localcluster import MARK, QUIET, Node, free_ports, start_time

    nm, om, dag, dal, rte, met, aut, dsh = free_ports(8)
    env = {**os.environ, **QUIET, MARK: cluster.mark, "RAY_AUTH_MODE": "disabled"}
    env |= {
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "AUTOSCALER_METRIC_PORT": str(aut),
        "DASHBOARD_METRIC_PORT": str(dsh),
    }
    env.pop("RAY_ADDRESS", None)
    log = Path(cluster.temp_dir) / f"node{len(cluster.nodes)}.log"
    args = [
        sys.executable, "-m", "ablations.localcluster", "node", "start", f"--address={cluster.address}",
        "--num-gpus=0", "--block", "--node-ip-address=127.0.0.1", f"--num-cpus={cluster.cpus_per_node}",
        f"--object-store-memory={256 * 2**20}", f"--temp-dir={cluster.temp_dir}", "--disable-usage-stats",
        f"--node-manager-port={nm}", f"--object-manager-port={om}", f"--dashboard-agent-grpc-port={dag}",
        f"--dashboard-agent-listen-port={dal}", f"--runtime-env-agent-port={rte}", f"--metrics-export-port={met}",
    ]  # fmt: skip
    with open(log, "w") as out:
        proc = subprocess.Popen(
            args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=log.parent,
            start_new_session=True,
        )  # fmt: skip
    cluster.nodes.append(Node(proc.pid, start_time(proc.pid) or "", str(log)))
    cluster.save()

    def started() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"a Ray node did not start: {log.read_text()[-2000:]}")
        return "Ray runtime started" in log.read_text(errors="replace")

    wait_until(started, 120, "a Ray node did not start")


def kill_node(node) -> int:
    """SIGKILL a node's ``ray start --block`` with every process under it (raylet, agents, workers): a lost machine.
    Returns how many processes were killed."""
    pids = [node.pid, *descendants(node.pid)]
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(node.pid, signal.SIGKILL)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(node.pid, 0)
    return len(pids)


def trial_processes(mark: str) -> list[int]:
    """Ray workers of the cluster (its mark in their environment) running a trial: a sweep's Tune trainable or a
    search's trial task (Ray names a worker's process after what it runs)."""
    from ablations.localcluster import marked

    out = []
    for pid in marked(mark):
        try:
            title = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
        except OSError:
            continue
        if title.startswith(("ray::ImplicitFunc.train", "ray::run_trial")):
            out.append(pid)
    return out


# --- the commands --------------------------------------------------------------------------------------------------


@dataclass
class Submission:
    number: int
    started: float
    ended: float | None = None
    rc: int | None = None
    stopped_by: str = ""  # the fault that stopped it ("SIGKILL", "SIGTERM"), or "" when it ended by itself
    said: list[str] = field(default_factory=list)  # its last lines when it failed by itself


class Driver:
    """One ``ablate`` command (a sweep or a search), submitted again whenever it stops before it is done."""

    def __init__(self, name: str, argv: list[str], cwd: Path, env: dict[str, str], clock: Callable[[], float]):
        self.name, self.argv, self.cwd, self.env, self.clock = name, argv, cwd, env, clock
        self.proc: subprocess.Popen | None = None
        self.submissions: list[Submission] = []
        self.lock = threading.Lock()
        self.done = False
        self.resubmit_at: float | None = None
        self.pending_pause = 2.0  # before the next submission, once this one has stopped

    def log(self, n: int) -> Path:
        return self.cwd / f"{self.name}-{n}.log"

    def submit(self) -> None:
        n = len(self.submissions) + 1
        with open(self.log(n), "w") as out:
            self.proc = subprocess.Popen(
                self.argv, cwd=self.cwd, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        self.submissions.append(Submission(n, self.clock()))
        self.resubmit_at = None

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: str, pause: float) -> int | None:
        """Send ``sig`` to the command (its process only, as an out-of-memory kill or a scheduler would); it is
        submitted again ``pause`` seconds after it has stopped. None when it is not running."""
        with self.lock:
            if not self.running():
                return None
            self.submissions[-1].stopped_by = sig
            self.pending_pause = pause
            self.proc.send_signal(getattr(signal, sig))
            return self.proc.pid

    def check(self, max_submissions: int) -> None:
        """Called every few tenths of a second: records an ended submission; submits again what is not done."""
        with self.lock:
            if self.done or self.proc is None:
                return
            rc = self.proc.poll()
            sub = self.submissions[-1]
            if rc is not None and sub.rc is None:
                sub.rc, sub.ended = rc, self.clock()
                if rc == 0:
                    self.done = True
                    return
                if not sub.stopped_by:
                    lines = self.log(sub.number).read_text(errors="replace").strip().splitlines()
                    sub.said = lines[-6:]
                pause = self.pending_pause if sub.stopped_by else 2.0
                self.pending_pause = 2.0
                self.resubmit_at = time.monotonic() + pause
            if rc is not None and self.resubmit_at is not None and time.monotonic() >= self.resubmit_at:
                if len(self.submissions) >= max_submissions:
                    self.done = True  # gave up: the figures say so
                    return
                self.submit()

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            kill_tree(self.proc)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=30)


# --- the work ------------------------------------------------------------------------------------------------------


def base_run(size: Size) -> dict:
    return {
        "task": {"name": "reverse", "train_size": 200, "max_len": 5},
        "model": TINY,
        "training": {"max_steps": size.steps, "val_every": size.val_every, "batch_size": 16, "eval_batch_size": 64},
    }


def write_files(folder: Path, size: Size) -> tuple[Path, Path]:
    study = {
        "name": STUDY,
        "description": "benchmarks/soak.py: tiny cells trained while faults are injected",
        "base": base_run(size),
        "design": {"grid": size.grid},
        "seeds": size.seeds,
        "metric": "final/val_loss",
        "direction": "minimize",
        "resources": {"cpus": 1},
        "retries": 2,
    }
    search = {
        "name": SEARCH,
        "base": base_run(size),
        "space": {
            "training.lr": {"type": "float", "low": 1e-3, "high": 1e-2, "log": True},
            "model.norm": {"type": "categorical", "choices": ["pre", "post"]},
        },
        "objectives": [{"metric": "final/val_loss", "direction": "minimize"}],
        "n_trials": size.trials,
        "concurrency": 2,
        "sampler": "tpe",
        "pruner": "none",
        "resources": {"cpus": 1},
    }
    (folder / "study.yaml").write_text(yaml.safe_dump(study, sort_keys=False))
    (folder / "search.yaml").write_text(yaml.safe_dump(search, sort_keys=False))
    return folder / "study.yaml", folder / "search.yaml"


class Progress:
    """The share of the work done: the larger of the study's (cells done in the claims) and the search's (trials
    ended in Optuna), so that a round drawn below 100% fires while both commands still run, whichever is faster.
    Read from PostgreSQL, cheaply and without MLflow; the last value while the server is away."""

    def __init__(self, dsn: str, cells: int, trials: int) -> None:
        self.dsn, self.cells, self.trials, self.last = dsn, cells, trials, 0.0

    def share(self) -> float:
        import psycopg

        with contextlib.suppress(psycopg.Error), psycopg.connect(self.dsn, connect_timeout=2) as conn:
            cells = conn.execute(
                "SELECT count(*) FROM ablate_claims WHERE study = %s AND state = 'done' AND code <> '-' "
                "AND cell_id <> '#submissions'",
                (STUDY,),
            ).fetchone()[0]
            trials = conn.execute(
                "SELECT count(*) FROM trials t JOIN studies s ON s.study_id = t.study_id "
                "WHERE s.study_name = %s AND t.state IN ('COMPLETE', 'PRUNED')",
                (SEARCH,),
            ).fetchone()[0]
            self.last = max(cells / self.cells, trials / self.trials)
        return self.last


# --- counting from the stores --------------------------------------------------------------------------------------


def expected_points(steps: int, val_every: int) -> dict[str, list[int]]:
    """The metric points a run of ``steps`` steps logs: every validation and the last step; every LOG_EVERY-th step of
    training."""
    val = sorted({*range(val_every, steps + 1, val_every), steps})
    return {"val/loss": val, "train/loss": list(range(0, steps, LOG_EVERY))}


def missing_metrics(client, run, steps: int, val_every: int) -> list[str]:
    """What a finished run lacks: a summary metric, or a point of a metric's history (``key@step``); and the values
    it says it could not log (tag metrics_lost)."""
    missing = [k for k in SUMMARY if k not in run.data.metrics]
    for key, points in expected_points(steps, val_every).items():
        logged = {m.step for m in client.get_metric_history(run.info.run_id, key)}
        missing += [f"{key}@{s}" for s in points if s not in logged]
    if run.data.tags.get("metrics_lost"):
        missing.append(f"metrics_lost={run.data.tags['metrics_lost']}")
    return missing


def runs_missing_metrics(client, results: list, size: Size) -> dict[str, list[str]]:
    """run id -> what a finished result run lacks (a diverged one stops early: not counted)."""
    missing = {}
    for r in results:
        finished = r.data.tags.get("status_detail", "").startswith("finished")
        if finished and (lacks := missing_metrics(client, r, size.steps, size.val_every)):
            missing[r.info.run_id] = lacks
    return missing


def pid_alive_tag(run) -> bool:
    pid = run.data.tags.get("pid") or run.data.tags.get("driver_pid") or ""
    return pid.isdigit() and alive(int(pid))


def count_study(client, study_path: Path, size: Size) -> dict:
    """A study's cells as MLflow holds them: lost (no result, no recorded failure), duplicated (more than one result),
    failed (with the reasons), results missing metrics, and runs left RUNNING with no process."""
    from record.spec import load_study
    from record.vocabulary import KIND_CELL, KIND_STUDY, RESULT_STATES, STATUS_FAILED, cell_state

    cells = [c.cell_id for c in load_study(study_path).cells]
    exp = client.get_experiment_by_name(STUDY)
    runs = search_all(client, exp.experiment_id) if exp else []
    by_cell: dict[str, list] = {}
    for r in runs:
        if r.data.tags.get("kind") == KIND_CELL:
            by_cell.setdefault(r.data.tags.get("cell_id", ""), []).append(r)
    results = {c: [r for r in by_cell.get(c, []) if cell_state(r) in RESULT_STATES] for c in cells}
    failed = {
        c: sorted(by_cell[c], key=lambda r: r.info.start_time)[-1].data.tags.get("status_detail", "")
        for c in cells
        if not results[c] and any(cell_state(r) == STATUS_FAILED for r in by_cell.get(c, []))
    }
    missing = runs_missing_metrics(client, [r for c in cells for r in results[c]], size)
    parents = [r for r in runs if r.data.tags.get("kind") == KIND_STUDY]
    return {
        "cells": len(cells),
        "with a result": sum(bool(results[c]) for c in cells),
        "lost": sum(1 for c in cells if not results[c] and c not in failed),
        "duplicated": sum(1 for c in cells if len(results[c]) > 1),
        "failed": len(failed),
        "failed reasons": dict(Counter(failed.values())),
        "runs with metrics missing": len(missing),
        "metrics missing": missing,
        "cell runs": len([r for r in runs if r.data.tags.get("kind") == KIND_CELL]),
        "killed attempts": sum(r.info.status == "KILLED" for rs in by_cell.values() for r in rs),
        "submissions": len(parents),
        "submissions by status": dict(Counter(r.info.status for r in parents)),
        "orphan RUNNING runs": [r.info.run_id for r in runs if r.info.status == "RUNNING" and not pid_alive_tag(r)],
    }


def count_search(client, storage: str, size: Size) -> dict:
    """A search's trials as Optuna and MLflow hold them: the trials that count towards n_trials (a lost trial's retry
    instead of it), lost (fewer than n_trials, or a counted trial without its run in MLflow), duplicated (a trial with
    more than one result run, a result run of a trial that is not a result in Optuna, or a lost trial whose retry
    and itself both ended as results), failed with their reasons, finished runs missing metrics, and trials or runs
    left RUNNING with no process."""
    import optuna
    from optuna.trial import TrialState

    from ablations.search.ledger import FAILURE_ATTR, counted_numbers
    from record.vocabulary import KIND_SEARCH, KIND_TRIAL

    study = optuna.load_study(study_name=SEARCH, storage=storage)
    trials = study.get_trials(deepcopy=False)
    trials_by_number = {t.number: t for t in trials}
    counted = counted_numbers(study)
    exp = client.get_experiment_by_name(SEARCH)
    runs = search_all(client, exp.experiment_id) if exp else []
    by_trial: dict[int, list] = {}
    for r in runs:
        if r.data.tags.get("kind") == KIND_TRIAL and r.data.tags.get("trial", "").isdigit():
            by_trial.setdefault(int(r.data.tags["trial"]), []).append(r)
    state = {t.number: t.state for t in trials}
    results = {n: [r for r in by_trial.get(n, []) if r.info.status == "FINISHED"] for n in state}
    result_states = (TrialState.COMPLETE, TrialState.PRUNED)
    lost = max(0, size.trials - len(counted)) + sum(1 for n in counted if state[n] in result_states and not results[n])
    duplicated = sum(1 for n in state if len(results[n]) > 1)
    duplicated += sum(1 for n in state if results[n] and state[n] not in result_states)
    retried = Counter(t.user_attrs.get("retry_of") for t in trials if t.state in result_states)
    duplicated += sum(1 for n, k in retried.items() if n is not None and (k > 1 or state.get(n) in result_states))
    failed = {}
    for n in counted:
        if state[n] == TrialState.FAIL:
            last = sorted(by_trial.get(n, []), key=lambda r: r.info.start_time)
            before = "failed before its run started: " + trials_by_number[n].user_attrs.get(FAILURE_ATTR, "no reason")
            failed[n] = last[-1].data.tags.get("status_detail", "") if last else before
    missing = runs_missing_metrics(client, [r for n in counted for r in results[n]], size)
    parents = [r for r in runs if r.data.tags.get("kind") == KIND_SEARCH]
    return {
        "n_trials": size.trials,
        "counted": len(counted),
        "complete": sum(state[n] == TrialState.COMPLETE for n in counted),
        "lost": lost,
        "duplicated": duplicated,
        "failed": len(failed),
        "failed reasons": dict(Counter(failed.values())),
        "runs with metrics missing": len(missing),
        "metrics missing": missing,
        "trials asked": len(trials),
        "asked again (lost with a process)": sum(1 for t in trials if "retry_of" in t.user_attrs),
        "trial runs": sum(len(v) for v in by_trial.values()),
        "killed attempts": sum(r.info.status == "KILLED" for rs in by_trial.values() for r in rs),
        "search processes": len(parents),
        "orphan RUNNING runs": [r.info.run_id for r in runs if r.info.status == "RUNNING" and not pid_alive_tag(r)],
        "orphan RUNNING trials": [t.number for t in trials if t.state == TrialState.RUNNING],
    }


def search_all(client, experiment_id: str) -> list:
    runs, token = [], None
    while True:
        page = client.search_runs([experiment_id], max_results=1000, page_token=token)
        runs += list(page)
        token = page.token
        if not token:
            return runs


@contextlib.contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """This process's environment with ``values`` for the block (MLflow's client reads its credentials from it)."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# --- the soak ------------------------------------------------------------------------------------------------------


@dataclass
class Deployment:
    """What the soak started, for a check of the stores before they go (tests/test_soak.py)."""

    tracking_uri: str
    storage: str
    credentials: dict[str, str]
    study_path: Path
    search_path: Path
    mlflow_database: str  # the MLflow server's backend store (PostgreSQL), as the server's own role reaches it
    folder: Path  # the soak's folder: the stores' files, the logs (removed at the end unless kept)
    cluster_mark: str  # in the environment of every process of the Ray cluster (ablations.localcluster.MARK)


def run(
    size: Size,
    seed: int = SEED,
    *,
    postgres: str = "auto",
    keep: bool = False,
    check: Callable[[Deployment], None] | None = None,
    out: Callable[[str], None] = print,
) -> dict:
    """The soak; returns its figures. ``check`` is called with the deployment once the work is done and counted,
    before anything is stopped."""
    from ablations import localcluster
    from ablations.localcluster import free_ports
    from tests.deployment.resolve import compose, compose_argv, compose_env, env_values, on_this_machine

    t0 = time.monotonic()
    clock = lambda: round(time.monotonic() - t0, 1)  # noqa: E731
    say = lambda text: out(f"[{clock():6.1f}s] {text}")  # noqa: E731
    schedule = draw_schedule(seed, size)
    root = Path(tempfile.mkdtemp(prefix="abl-soak-", dir="/tmp"))  # short: Unix socket paths, Ray's temp dir
    root.chmod(0o711)  # the postgres user reaches its own folder inside
    work = root / "work"
    work.mkdir()
    timings: dict[str, float] = {}
    values = env_values()
    services = compose(values)["services"]
    if postgres == "auto":
        postgres = "own" if postgres_binaries() is not None and _can_run_as_postgres() else "shared"
    pg_port, ml_port = free_ports(2)
    pg = (
        OwnPostgres(root / "pg", pg_port)
        if postgres == "own"
        else SharedPostgres(f"soak{random.randrange(16**6):06x}_")
    )
    mlflow_url = f"http://127.0.0.1:{ml_port}"
    cluster = server = None
    drivers: list[Driver] = []
    figures: dict = {}
    try:
        # PostgreSQL, then MLflow on it; the Ray cluster meanwhile
        ray_box: dict = {}

        def ray_up() -> None:
            try:
                ray_box["cluster"] = localcluster.up(1, cpus_per_node=1)
            except BaseException as err:  # said by the main thread
                ray_box["error"] = err

        ray_thread = threading.Thread(target=ray_up, daemon=True)
        ray_thread.start()
        pg.create(values["POSTGRES_PASSWORD"])
        pg.start()
        say(f"PostgreSQL ({postgres}) on 127.0.0.1:{pg_port}")
        init = {**compose_env(services["postgres"]), **pg.init_env(), "PATH": os.environ["PATH"]}
        done = subprocess.run(["sh", str(ROOT / "platform/postgres/init.sh")], env=init, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"platform/postgres/init.sh failed: {done.stderr}")
        svc = services["mlflow"]
        mlflow_env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")},
            **{k: translate(v, pg_port, pg.prefix) for k, v in compose_env(svc).items()},
            "MLFLOW_ARTIFACTS_DESTINATION": str(root / "mlflow" / "artifacts"),
            "MLFLOW_AUTH_CONFIG_PATH": str(root / "mlflow" / "basic_auth.ini"),
            "MLFLOW_READY_FILE": str(root / "mlflow" / "ready"),
            "MLFLOW_HOST": "127.0.0.1",
            "MLFLOW_PORT": str(ml_port),
            "MLFLOW_WORKERS": "1",
            "PYTHON": sys.executable,
        }
        server = MLflowServer(on_this_machine(compose_argv(svc)), mlflow_env, root / "mlflow", ml_port)
        server.start()
        say(f"MLflow on {mlflow_url}")
        ray_thread.join()
        if "error" in ray_box:
            raise ray_box["error"]
        cluster = ray_box["cluster"]
        timings["start the deployment"] = clock()
        say(f"deployment up: PostgreSQL ({postgres}) :{pg_port}, MLflow {mlflow_url}, Ray {cluster.address} (2 nodes)")

        # the commands, with the compose `ablate` service's environment
        cli = compose_env(services["ablate"])
        storage = translate(cli["ABLATE_OPTUNA_STORAGE"], pg_port, pg.prefix)
        credentials = {k: cli[k] for k in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")}
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("MLFLOW_", "ABLATE_OPTUNA", "ABLATE_CLAIMS", "RAY_ADDRESS", "RAY_AUTH"))
        }
        (root / "tmp").mkdir()
        env |= {
            "MLFLOW_TRACKING_URI": mlflow_url,
            **credentials,
            "ABLATE_OPTUNA_STORAGE": storage,  # the sweep's claims live there too (ablations.claims.claims_url)
            "ABLATE_RAY_STORAGE": str(root / "ray_results"),
            "RAY_ADDRESS": cluster.address,
            "TMPDIR": str(root / "tmp"),
            "PYTHONPATH": str(ROOT),
        }
        study_path, search_path = write_files(work, size)
        ablate = [sys.executable, "-m", "ablate"]
        sweep = Driver("sweep", [*ablate, "sweep", "study.yaml"], work, env, clock)
        search = Driver("search", [*ablate, "search", "search.yaml"], work, env, clock)
        drivers = [sweep, search]
        max_submissions = 4 + 3 * size.rounds
        for d in drivers:
            d.submit()
        say(f"submitted: ablate sweep ({size.cells} cells) and ablate search ({size.trials} trials)")

        progress = Progress(pg.url(cli["ABLATE_OPTUNA_STORAGE"]).replace("+psycopg", ""), size.cells, size.trials)
        nodes_lost = []
        fault_log: list[dict] = []

        def inject(fault: Fault) -> None:
            time.sleep(fault.delay)
            fault.at = clock()
            if fault.kind.endswith("driver"):
                order = [sweep, search] if fault.kind == "sweep driver" else [search, sweep]
                target = next((d for d in order if d.running()), None)
                pid = target.signal(fault.signal, fault.pause) if target else None
                fault.said = (
                    f"{fault.signal} to ablate {target.name} (pid {pid}); submitted again {fault.pause:g} s after it stopped"
                    if pid
                    else "no driver running: nothing to stop"
                )
            elif fault.kind == "trial worker":
                deadline, pids = time.monotonic() + 60, []
                while not (pids := trial_processes(cluster.mark)) and time.monotonic() < deadline:
                    time.sleep(0.3)
                if pids:
                    pid = random.Random(seed).choice(sorted(pids))
                    title = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                    fault.said = f"SIGKILL to a trial worker ({title}, pid {pid})"
                else:
                    fault.said = "no trial running for 60 s: nothing to kill"
            elif fault.kind == "Ray node":
                live = [n for n in cluster.nodes[1:] if alive(n.pid)]
                if live:
                    node = live[-1]
                    n = kill_node(node)
                    nodes_lost.append(node.pid)
                    time.sleep(fault.pause)
                    start_node(cluster)
                    fault.said = f"SIGKILL to a Ray node and its {n - 1} processes; a new node after {fault.pause:g} s"
                else:
                    fault.said = "no second node alive: nothing to stop"
            elif fault.kind == "MLflow server":
                server.kill()
                killed = time.monotonic()
                time.sleep(fault.pause)
                server.start()
                away = time.monotonic() - killed
                fault.said = (
                    f"SIGKILL to the MLflow server; started again after {fault.pause:g} s, ready {away:.0f} s after it"
                    " was killed"
                )
            elif fault.kind == "PostgreSQL":
                fault.said = pg.restart(fault.mode, fault.pause)
            say(f"  {fault.kind}: {fault.said}")

        # the rounds, each once its share of the work is done and the round before it is over
        deadline = time.monotonic() + (3600 if size.mode == "full" else 900)
        pending = list(schedule)
        active: list[threading.Thread] = []
        while time.monotonic() < deadline:
            for d in drivers:
                d.check(max_submissions)
            if all(d.done for d in drivers) and not any(t.is_alive() for t in active):
                break
            if pending and not any(t.is_alive() for t in active):
                share = progress.share()
                if share >= pending[0].share or all(d.done for d in drivers):
                    r = pending.pop(0)
                    r.fired_at, r.progress = clock(), round(share, 3)
                    say(f"round {r.number} at {share:.0%} of the work: {', '.join(f.kind for f in r.faults)}")
                    active = [threading.Thread(target=inject, args=(f,), daemon=True) for f in r.faults]
                    for t in active:
                        t.start()
            time.sleep(0.3)
        timed_out = time.monotonic() >= deadline
        timings["the work, faults included"] = round(clock() - timings["start the deployment"], 1)
        for d in drivers:
            say(f"ablate {d.name}: {len(d.submissions)} submission(s), exit codes {[s.rc for s in d.submissions]}")

        # counted from the stores
        with environment(credentials):
            from mlflow import MlflowClient

            client = MlflowClient(mlflow_url)
            figures["study"] = count_study(client, study_path, size)
            figures["search"] = count_search(client, storage, size)
            timings["count from the stores"] = round(clock() - sum(timings.values()), 1)
            if check is not None:
                check(
                    Deployment(
                        mlflow_url, storage, credentials, study_path, search_path,
                        mlflow_env["MLFLOW_BACKEND_STORE_URI"], root, cluster.mark,
                    )
                )  # fmt: skip
        figures["rounds"] = [
            {
                "round": r.number,
                "at share": r.share,
                "fired at s": r.fired_at,
                "progress": r.progress,
                "faults": [{k: v for k, v in asdict(f).items() if v not in ("", None)} for f in r.faults],
            }
            for r in schedule
        ]
        figures["drivers"] = {
            d.name: [{k: v for k, v in asdict(s).items() if v not in ("", None, [])} for s in d.submissions]
            for d in drivers
        }
        figures["timed out"] = timed_out
        fault_log.extend(f for r in figures["rounds"] for f in r["faults"])
        figures["faults"] = dict(Counter(f["kind"] for f in fault_log if "at" in f))
        figures["postgres"] = (
            "a throwaway server of this machine's binaries, restarted"
            if pg.restart_is_real
            else "the machine's server on 127.0.0.1:5432: restarts simulated by terminating the connections"
        )
    finally:
        for d in drivers:
            d.close()
        if cluster is not None:
            localcluster.stop(cluster, grace=15)
        if server is not None:
            server.close()
        with contextlib.suppress(Exception):
            pg.close()
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
        else:
            out(f"kept: {root}")
    timings["stop everything"] = round(clock() - sum(timings.values()), 1)
    figures["timings s"] = timings
    figures["wall s"] = clock()
    return figures


def _can_run_as_postgres() -> bool:
    if os.geteuid() != 0:
        return True
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        return False
    return shutil.which("setpriv") is not None


# --- the report ----------------------------------------------------------------------------------------------------


def targets(figures: dict) -> dict[str, bool]:
    s, q = figures["study"], figures["search"]
    return {
        "0 lost": s["lost"] == 0 and q["lost"] == 0,
        "0 duplicated": s["duplicated"] == 0 and q["duplicated"] == 0,
        "0 metrics missing": s["runs with metrics missing"] == 0 and q["runs with metrics missing"] == 0,
        "0 orphan RUNNING": not (s["orphan RUNNING runs"] or q["orphan RUNNING runs"] or q["orphan RUNNING trials"]),
    }


def report(figures: dict, command: str) -> str:
    s, q = figures["study"], figures["search"]
    met = targets(figures)
    rows = [
        ("cells / trials", s["cells"], f"{q['counted']} counted of n_trials {q['n_trials']}"),
        ("lost", s["lost"], q["lost"]),
        ("duplicated", s["duplicated"], q["duplicated"]),
        ("recorded failed, with the reason", s["failed"], q["failed"]),
        ("finished runs missing metrics", s["runs with metrics missing"], q["runs with metrics missing"]),
        ("runs left RUNNING with no process", len(s["orphan RUNNING runs"]), len(q["orphan RUNNING runs"])),
        ("attempts killed by the faults (then retried)", s["killed attempts"], q["killed attempts"]),
        ("submissions / search processes", s["submissions"], q["search processes"]),
    ]
    lines = [
        f"# Fault soak ({figures['mode']})",
        "",
        f"`{command}`: seed {figures['seed']}, {figures['date']}, {figures['machine']}. "
        f"{figures['wall s']:.0f} s in all ({', '.join(f'{k} {v:g} s' for k, v in figures['timings s'].items())}).",
        "",
        "Targets: " + ", ".join(f"{k} {'met' if v else 'MISSED'}" for k, v in met.items()) + ".",
        "",
        "| counted from the stores | study | search |",
        "|---|---:|---:|",
        *[f"| {a} | {b} | {c} |" for a, b, c in rows],
        "",
    ]
    reasons = {**s["failed reasons"], **q["failed reasons"]}
    if reasons:
        lines += ["Failures recorded, with their reasons:", ""]
        lines += [f"- {n} x {reason[:300]}" for reason, n in reasons.items()]
        lines.append("")
    lines += ["| round | at | faults |", "|---:|---|---|"]
    for r in figures["rounds"]:
        at = "not fired" if r["fired at s"] is None else f"{r['fired at s']:.0f} s, {r['progress']:.0%} of the work"
        faults = "; ".join(f"{f['kind']}: {f.get('said', 'not fired')}" for f in r["faults"])
        lines.append(f"| {r['round']} | {at} | {faults} |")
    lines += ["", "| command | submissions | how each ended |", "|---|---:|---|"]
    for name, subs in figures["drivers"].items():
        ends = ", ".join(f"{x.get('stopped_by') or 'exit'} {x.get('rc')}" for x in subs)
        lines.append(f"| ablate {name} | {len(subs)} | {ends} |")
    stopped = [(name, x) for name, subs in figures["drivers"].items() for x in subs if x.get("said")]
    if stopped:
        lines += ["", "Submissions that stopped by themselves, and their last words:", ""]
        for name, x in stopped:
            lines.append(f"- ablate {name} #{x['number']} (exit {x['rc']}): " + " / ".join(x["said"])[-600:])
    lines += ["", f"PostgreSQL: {figures['postgres']}.", ""]
    return "\n".join(lines)


def soak(
    size: Size,
    seed: int = SEED,
    out: Path | None = None,
    *,
    postgres: str = "auto",
    keep: bool = False,
    check: Callable[[Deployment], None] | None = None,
    say: Callable[[str], None] = print,
) -> dict:
    """The soak of ``size``, its figures with the targets met or missed, written to ``out``/soak.json and soak.md
    (default benchmarks/results/, benchmarks/results/quick/ for the short size)."""
    out = out or (ROOT / "benchmarks" / "results" / ("quick" if size.mode == "short" else ""))
    out.mkdir(parents=True, exist_ok=True)
    command = (
        "python benchmarks/soak.py"
        + (" --short" if size.mode == "short" else "")
        + (f" --seed {seed}" if seed != SEED else "")
    )
    say(f"fault soak ({size.mode}, seed {seed}): {size.cells} cells, {size.trials} trials, {size.rounds} rounds")
    for r in draw_schedule(seed, size):
        say(f"  round {r.number} at {r.share:.0%}: {', '.join(f.kind for f in r.faults)}")
    figures = run(size, seed, postgres=postgres, keep=keep, check=check, out=say)
    figures = {
        "mode": size.mode,
        "seed": seed,
        "command": command,
        "date": datetime.date.today().isoformat(),
        "machine": f"{os.cpu_count()} CPU cores ({platform.machine()}), {platform.python_version()}",
        "sizes": asdict(size),
        "targets": {},
        **figures,
    }
    figures["targets"] = targets(figures)
    (out / "soak.json").write_text(json.dumps(figures, indent=1, default=str) + "\n")
    text = report(figures, command)
    (out / "soak.md").write_text(text)
    say(text)
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=SEED, help=f"draws the fault schedule (default {SEED})")
    parser.add_argument("--short", action="store_true", help="the suite's size: 4 cells, 3 trials, 2 rounds")
    parser.add_argument("--out", type=Path, help="where soak.md and soak.json go (default benchmarks/results/, "
                        "benchmarks/results/quick/ with --short)")  # fmt: skip
    parser.add_argument(
        "--postgres",
        choices=["auto", "own", "shared"],
        default="auto",
        help="own: a throwaway server of this machine's binaries (auto when it has them); shared: the server on "
        "127.0.0.1:5432, restarts simulated",
    )
    parser.add_argument("--keep", action="store_true", help="keep the soak's folder (logs, the stores' files)")
    args = parser.parse_args()
    figures = soak(SHORT if args.short else FULL, args.seed, args.out, postgres=args.postgres, keep=args.keep)
    return 0 if all(figures["targets"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
