"""Starting the deployment's programs as processes on 127.0.0.1 (tests/deployment/test_services.py):
platform/postgres/init.sh on this machine's PostgreSQL under a throwaway prefix, MLflow through
platform/mlflow/entrypoint.sh with a container's environment translated to this machine, and HTTP requests with
an explicit Host header (as the other containers address a service)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from contextlib import contextmanager
from pathlib import Path

from tests.conftest import free_port, stop
from tests.deployment.resolve import ROOT, local_database_url, on_this_machine

INIT = ROOT / "platform" / "postgres" / "init.sh"
SUPERUSER = "postgresql://postgres@127.0.0.1:5432/postgres"  # this machine's PostgreSQL (trust authentication)


def run_init(postgres_env: dict[str, str], prefix: str) -> None:
    """platform/postgres/init.sh with the postgres container's environment, on this machine's server."""
    env = {
        "PATH": os.environ["PATH"],
        **postgres_env,
        "PGHOST": "127.0.0.1",
        "PGPORT": "5432",
        "ABLATE_DB_PREFIX": prefix,
    }
    out = subprocess.run(["sh", str(INIT)], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr


def drop_prefixed(prefix: str) -> None:
    import psycopg

    with psycopg.connect(SUPERUSER, autocommit=True) as conn:
        like = prefix.replace("_", r"\_") + "%"
        for (db,) in conn.execute("SELECT datname FROM pg_database WHERE datname LIKE %s", (like,)).fetchall():
            conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        for (role,) in conn.execute("SELECT rolname FROM pg_roles WHERE rolname LIKE %s", (like,)).fetchall():
            conn.execute(f'DROP ROLE IF EXISTS "{role}"')


@contextmanager
def roles_and_databases(postgres_env: dict[str, str]):
    prefix = f"t{uuid.uuid4().hex[:8]}_"
    try:
        run_init(postgres_env, prefix)
        yield prefix
    finally:
        drop_prefixed(prefix)


def request(url: str, path: str, *, host: str | None = None, auth=None, method="GET", body=None, headers=None):
    req = urllib.request.Request(f"{url}{path}", method=method, headers=dict(headers or {}))
    if host:
        req.add_header("Host", host)
    if auth:
        req.add_header("Authorization", "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode())
    if body is not None:
        req.add_header("Content-Type", "application/json")
        req.data = json.dumps(body).encode()
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            data = r.read()
            return r.status, data, dict(r.headers)
    except urllib.error.HTTPError as err:
        return err.code, err.read(), dict(err.headers)


@contextmanager
def started_mlflow(argv: list[str], env: dict[str, str], prefix: str, tmp: Path):
    """MLflow's container command and environment as a process here: the postgres service's URLs to this
    machine's server under ``prefix``; artifacts, the auth config and the ready file in ``tmp``; 127.0.0.1 and a
    free port instead of 0.0.0.0:5000."""
    port = free_port()
    tmp.mkdir(parents=True, exist_ok=True)
    translated = {
        **env,
        "MLFLOW_BACKEND_STORE_URI": local_database_url(env["MLFLOW_BACKEND_STORE_URI"], prefix),
        "MLFLOW_AUTH_DATABASE_URI": local_database_url(env["MLFLOW_AUTH_DATABASE_URI"], prefix),
        "MLFLOW_ARTIFACTS_DESTINATION": str(tmp / "artifacts"),
        "MLFLOW_AUTH_CONFIG_PATH": str(tmp / "basic_auth.ini"),
        "MLFLOW_READY_FILE": str(tmp / "ready"),
        "MLFLOW_HOST": "127.0.0.1",
        "MLFLOW_PORT": str(port),
        "MLFLOW_WORKERS": "1",
        "PYTHON": sys.executable,
    }
    base = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    log = open(tmp / "mlflow.log", "w")  # noqa: SIM115  (closed in finally, after the server)
    proc = subprocess.Popen(
        on_this_machine(argv),
        env={**base, **translated},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        cwd=tmp,
    )
    try:
        deadline = time.monotonic() + 120
        while not (tmp / "ready").exists():  # the entrypoint writes it once its users are in place
            if proc.poll() is not None:
                raise RuntimeError(f"MLflow exited with {proc.returncode}: {(tmp / 'mlflow.log').read_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError("MLflow was not ready within 120 s")
            time.sleep(0.3)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(proc)
        log.close()


def wait_for_answer(url: str, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    """Until the server answers anything at all (a 401 included)."""
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: the server exited with code {proc.returncode}")
        try:
            request(url, "/")
            return
        except urllib.error.URLError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} did not answer within {timeout} s") from None
            time.sleep(0.3)


def command_lines_showing(*values: str) -> list[str]:
    """The command lines of this machine's processes that contain any of ``values`` (secrets belong in the
    environment or a file, never in the process list, which every user of the host can read)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(v in cmdline for v in values):
            found.append(f"{proc.name}: {cmdline[:200]}")
    return found
