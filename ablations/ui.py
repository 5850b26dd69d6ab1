"""``ablate ui``: the MLflow UI (or optuna-dashboard) on the store, bound to loopback unless the user says
otherwise. The server runs in its own process group; Ctrl-C and SIGTERM stop the whole group. Links are
printed once the server answers, with the port it actually uses."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

from ablations import tracking
from record import vocabulary
from record.secrets import redact, redact_url

DEFAULT_PORTS = {"mlflow": 5000, "optuna": 8080}


def print_summary(result) -> None:
    """What ``ablate run`` prints at the end: the run's status, its final and test metrics, and where to see it."""
    status = result.status + (f" ({result.detail})" if result.detail else "")
    print(f"\nstatus: {status}")
    from record.spec.metrics import in_order

    shown = [
        k for k in in_order(result.metrics) if k.startswith(("final/", "test", "best/val_exact", "best/val_acc"))
    ]  # 2 before 10
    shown += [
        k
        for k in ("cost/tokens_per_s", "cost/wall_time_s", "cost/n_params", "cost/peak_memory_mb")
        if k in result.metrics
    ]
    width = max((len(k) for k in shown), default=0)
    for key in shown:
        print(f"  {key:<{width}}  {result.metrics[key]:.6g}")
    print(f"\nMLflow run {result.run_id} in experiment {result.experiment!r} ({redact_url(result.tracking_uri)})")
    print(f"browse: {browse_hint(result.tracking_uri, result.experiment, result.run_id)}")


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


def experiment_link(base: str, experiment_id: str | None = None, run_id: str | None = None) -> str:
    """A page of MLflow's UI in its model-training view (MLflow 3 opens on its GenAI pages): an experiment, a run
    of it, or (no experiment) the list of experiments."""
    page = "#/experiments" + (f"/{experiment_id}" if experiment_id else "") + (f"/runs/{run_id}" if run_id else "")
    return f"{base.rstrip('/')}/{page}?workflowType=machine_learning"


def browse_hint(uri: str, experiment: str, run_id: str | None = None) -> str:
    """What to type (or open) to see an experiment or a run: a server's URL, else ``ablate ui ...``."""
    if uri.startswith(("http://", "https://")):
        exp = vocabulary.client(uri).get_experiment_by_name(experiment)
        return experiment_link(uri, exp.experiment_id, run_id) if exp else uri
    flag = "" if uri == tracking.resolve_uri(None, create=False) else f" --tracking-uri {redact_url(uri)}"
    return f"ablate ui {experiment}" + (f" --run {run_id}" if run_id else "") + flag


class CannotBind(ValueError):
    """The host given to ``--host`` is not an address of this machine (or not one at all), or the port is one this
    user may not serve on."""


def _bound(host: str, port: int) -> int | None:
    """The port, bound as the servers bind it (SO_REUSEADDR: a port a stopped server left in TIME_WAIT is free,
    and it took the UI to another port after every restart), then let go; None when another program holds it."""
    try:
        family, kind, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as err:
        raise CannotBind(f"--host {host}: not an address to serve on ({err.strerror})") from None
    with socket.socket(family, kind) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(address)
        except OSError as err:
            if err.errno == errno.EADDRINUSE:
                return None
            if err.errno == errno.EACCES:  # a port below 1024 without the privilege to serve there
                raise CannotBind(f"--port {port}: not allowed here ({err.strerror}): pick one from 1024 up") from None
            raise CannotBind(f"--host {host}: cannot serve there ({err.strerror})") from None
        return s.getsockname()[1]


def choose_port(host: str, asked: int | None, kind: str) -> tuple[int | None, str]:
    """The port to serve on: the one asked for (refused if taken), else the default, else a free one."""
    if asked is not None:
        if _bound(host, asked):
            return asked, ""
        return None, f"port {asked} on {host} is in use; pick another with --port"
    default = DEFAULT_PORTS[kind]
    if kind == "mlflow" and "ABLATE_UI_PORT" in os.environ:
        text = os.environ["ABLATE_UI_PORT"].strip()
        if not text.isdigit() or not 0 < int(text) < 65536:
            return None, f"ABLATE_UI_PORT={text!r} is not a port: give a number from 1 to 65535, or unset it"
        default = int(text)
    if _bound(host, default):
        return default, ""
    port = _bound(host, 0)
    return port, f"port {default} is in use; serving on {port}"


def _shown_host(host: str) -> str:
    if host in ("127.0.0.1", "localhost", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":  # every IPv6 address: this machine's is the one to open
        return "[::1]"
    return f"[{host}]" if ":" in host else host  # an IPv6 address, as a URL writes it


def serve_mlflow(
    uri: str | None,
    host: str = "127.0.0.1",
    port: int | None = None,
    *,
    experiment: str | None = None,
    run_id: str | None = None,
) -> int:
    uri = tracking.resolve_uri(uri, create=False)  # a store with nothing recorded: the CLI said so already
    if uri.startswith(("http://", "https://")):
        print(f"the tracking store is a server already: open {browse_hint(uri, experiment) if experiment else uri}")
        return 0
    exp_id = None
    if run_id:  # its experiment, which the link needs (without one it read #/experiments/runs/ID)
        from mlflow.exceptions import MlflowException

        try:
            run_experiment = vocabulary.client(uri).get_run(run_id).info.experiment_id
        except MlflowException:
            print(f"error: no run {run_id!r} in {redact_url(uri)}", file=sys.stderr)
            return 2
        exp_id = run_experiment
    if experiment:
        exp = vocabulary.client(uri).get_experiment_by_name(experiment)
        if exp is None:
            names = sorted(e.name for e in vocabulary.client(uri).search_experiments())
            print(
                f"error: no experiment {experiment!r} in {redact_url(uri)}{vocabulary.name_hint(experiment, names)}; "
                f"experiments there: {', '.join(names)}",
                file=sys.stderr,
            )
            return 2
        if run_id and exp.experiment_id != exp_id:
            print(f"error: run {run_id!r} is not in experiment {experiment!r}: give the run alone", file=sys.stderr)
            return 2
        exp_id = exp.experiment_id
    port, note = choose_port(host, port, "mlflow")
    if port is None:
        print(f"error: {note}", file=sys.stderr)
        return 2
    if host not in ("127.0.0.1", "localhost", "::1"):
        print(f"warning: binding to {host} exposes the UI (and the store) beyond this machine", file=sys.stderr)
    base = f"http://{_shown_host(host)}:{port}"
    links = [f"open {experiment_link(base, exp_id, run_id)}"]
    return serve(
        mlflow_server_command(uri, host, port),
        lean_server_env(),
        ready=f"{base}/health",
        lines=[f"MLflow UI on {redact_url(uri)}", *([note] if note else []), *links, "(Ctrl-C stops it)"],
        name="mlflow-ui",
    )


def optuna_dashboard_command(storage: str, host: str, port: int) -> list[str]:
    """optuna-dashboard's own command on an Optuna storage (a URL, or journal:PATH for a journal file)."""
    target = storage.removeprefix("journal:") if storage.startswith("journal:") else storage
    beside = Path(sys.executable).with_name("optuna-dashboard")  # installed with this Python
    program = str(beside) if beside.exists() else shutil.which("optuna-dashboard") or "optuna-dashboard"
    return [program, target, "--host", host, "--port", str(port), "--quiet"]


def serve_optuna(storage: str | None, host: str = "127.0.0.1", port: int | None = None) -> int:
    """``ablate ui --optuna``: optuna-dashboard on the searches' storage (loopback unless told otherwise)."""
    url = storage or os.environ.get("ABLATE_OPTUNA_STORAGE") or f"sqlite:///{tracking.home() / 'optuna.db'}"
    if url.startswith("sqlite:///") and not Path(url[len("sqlite:///") :]).exists():
        print(
            f"no searches yet: {redact_url(url)} does not exist (run `ablate search ablations/searches/quickstart_lr.yaml` first)"
        )
        return 2
    from ablations.search.setup import storage_problem

    if problem := storage_problem(url):  # an MLflow store, say: optuna-dashboard would fail with a traceback
        print(f"error: the Optuna storage {redact_url(url)} {problem}", file=sys.stderr)
        return 2
    port, note = choose_port(host, port, "optuna")
    if port is None:
        print(f"error: {note}", file=sys.stderr)
        return 2
    if host not in ("127.0.0.1", "localhost", "::1"):
        print(
            f"warning: binding to {host} exposes the dashboard (and the storage) beyond this machine", file=sys.stderr
        )
    base = f"http://{_shown_host(host)}:{port}"
    return serve(
        optuna_dashboard_command(url, host, port),
        dict(os.environ),
        ready=f"{base}/api/studies",
        lines=[
            f"optuna-dashboard on {redact_url(url)}",
            *([note] if note else []),
            f"open {base}",
            "(Ctrl-C stops it)",
        ],
        name="optuna-dashboard",
    )


class _Stop(Exception):
    """SIGTERM, turned into an exception in the main thread."""


def serve(
    command: list[str], env: dict[str, str], *, ready: str, lines: list[str], name: str, timeout: float = 120
) -> int:
    """Run a server in its own process group until it exits, Ctrl-C (SIGINT, even if ignored when it started) or
    SIGTERM, which stop the whole group.
    ``lines`` are printed once ``ready`` answers. The server's own output (access lines, its libraries' warnings
    and notes) goes to a log file, not the terminal: one voice. If the server fails, the log's end is printed."""

    def on_term(signum, frame):
        raise _Stop

    log_path = tracking.home() / "logs" / f"{name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    previous = signal.signal(signal.SIGTERM, on_term)
    # Ctrl-C too, even where the shell started it with SIGINT ignored (`ablate ui &` in a script: a background job
    # ignores SIGINT, and Python then installs no handler): it stops the server as in the foreground
    previous_int = signal.signal(signal.SIGINT, on_term)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(command, env=env, start_new_session=True, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_ready(proc, ready, timeout)
        if proc.poll() is None:
            print("\n".join([*lines, f"(the server's own log: {log_path})"]), flush=True)
            proc.wait()
        if proc.returncode:
            tail = log_path.read_text(errors="replace").splitlines()[-20:]
            print(f"error: the server exited with code {proc.returncode}; the end of {log_path}:", file=sys.stderr)
            print(redact("\n".join(tail)), file=sys.stderr)
        return proc.returncode
    except (KeyboardInterrupt, _Stop):
        return 0
    finally:
        _stop_group(proc)
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)


def _wait_ready(proc: subprocess.Popen, ready: str, timeout: float) -> None:
    """Until ``ready`` answers, the server exits, or ``timeout`` seconds pass."""
    import tenacity

    def answer() -> None:
        if proc.poll() is None:  # a server that exited answers nothing: stop asking
            with urllib.request.urlopen(ready, timeout=2):
                pass

    asking = tenacity.Retrying(
        retry=tenacity.retry_if_exception_type(OSError),
        stop=tenacity.stop_after_delay(timeout),
        wait=tenacity.wait_fixed(0.3),
        retry_error_callback=lambda state: None,  # out of time: the caller sees the server still starting
    )
    asking(answer)


def _stop_group(proc: subprocess.Popen, grace: float = 20.0) -> None:
    """SIGTERM the server's process group, SIGKILL what is left after ``grace`` seconds."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=grace)
        except ProcessLookupError:
            pass
    with contextlib.suppress(ProcessLookupError, PermissionError):  # workers may outlive the leader
        os.killpg(proc.pid, signal.SIGKILL)
