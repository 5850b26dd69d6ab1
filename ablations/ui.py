"""``ablate ui``: the MLflow UI on the tracking store, bound to loopback unless the user says otherwise."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from ablations import tracking


def mlflow_server_command(uri: str, host: str, port: int) -> list[str]:
    """The ``mlflow server`` command line for a store (SQLite: artifacts served from beside it)."""
    cmd = [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--backend-store-uri",
        uri,
        "--host",
        host,
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    root = tracking.artifact_root(uri)
    if root:
        cmd += ["--default-artifact-root", root]
    return cmd


def lean_server_env() -> dict[str, str]:
    """Two processes instead of ten (no job runner), as measured here (STACK_NOTES)."""
    return {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


def serve_mlflow(uri: str | None, host: str = "127.0.0.1", port: int = 5000) -> int:
    uri = tracking.resolve_uri(uri)
    if uri.startswith(("http://", "https://")):
        print(f"the tracking store is a server already: open {uri}")
        return 0
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///") :]).exists():
        print(f"no runs yet: {uri} does not exist (run `ablate run ablations/runs/quickstart.yaml` first)")
        return 2
    if host not in ("127.0.0.1", "localhost", "::1"):
        print(f"warning: binding to {host} exposes the UI (and the store) beyond this machine", file=sys.stderr)
    print(
        f"MLflow UI on {uri}\nopen http://{'127.0.0.1' if host in ('127.0.0.1', 'localhost') else host}:{port} "
        "(Ctrl-C stops it)",
        flush=True,
    )
    return _serve(mlflow_server_command(uri, host, port), lean_server_env())


def optuna_dashboard_command(storage: str, host: str, port: int) -> list[str]:
    """optuna-dashboard on an Optuna storage (a URL, or journal:PATH for a journal file)."""
    target = storage.removeprefix("journal:") if storage.startswith("journal:") else storage
    code = "import sys; from optuna_dashboard._cli import main; sys.argv[0] = 'optuna-dashboard'; sys.exit(main())"
    return [sys.executable, "-c", code, target, "--host", host, "--port", str(port)]


def serve_optuna(storage: str | None, host: str = "127.0.0.1", port: int = 8080) -> int:
    """``ablate ui --optuna``: optuna-dashboard on the searches' storage (loopback unless told otherwise)."""
    url = storage or os.environ.get("ABLATE_OPTUNA_STORAGE") or f"sqlite:///{tracking.home() / 'optuna.db'}"
    if url.startswith("sqlite:///") and not Path(url[len("sqlite:///") :]).exists():
        print(
            f"no searches yet: {url} does not exist (run `ablate search ablations/searches/quickstart_lr.yaml` first)"
        )
        return 2
    if host not in ("127.0.0.1", "localhost", "::1"):
        print(
            f"warning: binding to {host} exposes the dashboard (and the storage) beyond this machine", file=sys.stderr
        )
    print(f"optuna-dashboard on {url}\nopen http://{host}:{port} (Ctrl-C stops it)", flush=True)
    return _serve(optuna_dashboard_command(url, host, port), dict(os.environ))


def _serve(command: list[str], env: dict[str, str]) -> int:
    """Run a server in the foreground until it exits or Ctrl-C stops it."""
    proc = subprocess.Popen(command, env=env)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        proc.wait(timeout=30)
        return 0
