"""`ablate ui` serves the MLflow UI of the store on loopback, and stops by its PID. It runs in the test's own
folder: `ablate ui` writes its servers' logs to .ablate/logs of the folder it runs in."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from mlflow import MlflowClient

from ablations.train import Tracking, train
from tests.ablations.test_train import short_copy
from tests.conftest import free_port, stop, wait_for_http


@pytest.mark.slow
def test_ablate_ui_serves_the_store_on_loopback(tmp_path, store):
    result = train(short_copy(), Tracking(store, "ui-check"))
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ablate", "ui", "--tracking-uri", store, "--port", str(port)],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        text=True,
    )
    try:
        wait_for_http(f"http://127.0.0.1:{port}/health", proc=proc)
        # no experiment named: the list of experiments in the model-training view, not MLflow's GenAI home
        assert proc.stdout.readline().startswith("MLflow UI on ")
        assert (
            proc.stdout.readline().strip()
            == f"open http://127.0.0.1:{port}/#/experiments?workflowType=machine_learning"
        )
        url = f"http://127.0.0.1:{port}/api/2.0/mlflow/runs/get?run_id={result.run_id}"
        with urllib.request.urlopen(url, timeout=10) as r:
            run = json.load(r)["run"]
        assert run["info"]["status"] == "FINISHED"
        # the UI page itself
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as r:
            assert r.status == 200 and b"<html" in r.read().lower()
        # bound to loopback only: the server is not reachable on another local address
        out = subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True)
        if out.returncode == 0 and out.stdout.strip():
            assert all(line.split()[3].startswith("127.0.0.1:") for line in out.stdout.strip().splitlines())
    finally:
        stop(proc)
    assert proc.returncode is not None


def wait_for_line(log, prefix: str, proc, timeout: float = 120) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in log.read_text().splitlines():
            if line.startswith(prefix):
                return line
        assert proc.poll() is None, log.read_text()
        time.sleep(0.3)
    raise AssertionError(f"no line starting with {prefix!r}:\n{log.read_text()}")


@pytest.mark.slow
def test_ablate_ui_opens_the_experiment_on_the_port_it_uses_and_stops_on_sigterm(tmp_path, store):
    """The default port is taken: another is used, and the printed link says which; the link opens the study's
    experiment in MLflow's model-training view; SIGTERM to `ablate ui` stops the server and its workers."""
    result = train(short_copy(), Tracking(store, "ui-sigterm"))
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    log = tmp_path / "ui.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ablate",
                "ui",
                "ui-sigterm",
                "--run",
                result.run_id,
                "--tracking-uri",
                store,
            ],
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "ABLATE_UI_PORT": str(busy.getsockname()[1])},
        )
    try:
        line = wait_for_line(log, "open http://127.0.0.1:", proc)
        port = int(line.split(":")[2].split("/")[0])
        assert port != busy.getsockname()[1] and f"port {busy.getsockname()[1]} is in use" in log.read_text()
        exp = MlflowClient(store).get_experiment_by_name("ui-sigterm")
        assert line.endswith(f"/#/experiments/{exp.experiment_id}/runs/{result.run_id}?workflowType=machine_learning")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as r:
            assert r.status == 200
        printed = log.read_text()  # one voice: the server's access lines, notes and warnings go to its own log
        assert "Warning" not in printed and "Uvicorn" not in printed and "GET /health" not in printed, printed
        assert "(the server's own log: " in printed
        group = os.getpgid(proc.pid)
        servers = [
            int(p)
            for p in subprocess.run(
                ["pgrep", "-f", "--", f"--port {port}"], capture_output=True, text=True
            ).stdout.split()
        ]
        assert servers and all(os.getpgid(p) != group for p in servers)  # the server has its own group
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        time.sleep(1)
        left = subprocess.run(["pgrep", "-f", "--", f"--port {port}"], capture_output=True, text=True).stdout.split()
        assert not left, left
        with pytest.raises(OSError):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=3)
    finally:
        busy.close()
        if proc.poll() is None:
            proc.kill()


def test_ablate_ui_without_runs_says_so(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "ablate", "ui", "--tracking-uri", f"sqlite:///{tmp_path}/none.db"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr == (
        f"error: nothing recorded at sqlite:///{tmp_path}/none.db yet (no MLflow store there): train first (ablate "
        "sweep STUDY, ablate run RUN.yaml), or name the store that holds it (--tracking-uri, MLFLOW_TRACKING_URI)\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing made, not even .ablate/


@pytest.mark.slow
def test_ablate_ui_optuna_serves_the_search_storage_on_loopback(tmp_path):
    import optuna

    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = optuna.create_study(study_name="lr_search", storage=storage)
    study.optimize(lambda t: (t.suggest_float("lr", 0, 1) - 0.3) ** 2, n_trials=3)
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ablate", "ui", "--optuna", "--storage", storage, "--port", str(port)],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        text=True,
    )
    try:
        wait_for_http(f"http://127.0.0.1:{port}/api/studies", proc=proc)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies", timeout=10) as r:
            studies = json.load(r)["study_summaries"]
        assert [s["study_name"] for s in studies] == ["lr_search"]
        out = subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True)
        if out.returncode == 0 and out.stdout.strip():
            assert all(line.split()[3].startswith("127.0.0.1:") for line in out.stdout.strip().splitlines())
    finally:
        stop(proc)


@pytest.mark.slow
def test_ablate_ui_started_in_the_background_stops_on_ctrl_c(tmp_path):
    """`ablate ui &` in a script: the shell starts a background job with SIGINT ignored, and Python then installs no
    handler for it; Ctrl-C (SIGINT to its PID) stopped nothing. It stops the server and its group, as in the
    foreground."""
    import optuna

    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    optuna.create_study(study_name="s", storage=storage).optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=1)
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ablate", "ui", "--optuna", "--storage", storage, "--port", str(port)],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),  # as a background job of a script
    )
    try:
        wait_for_http(f"http://127.0.0.1:{port}/api/studies", proc=proc)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
        with pytest.raises(OSError):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies", timeout=3)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_ablate_ui_optuna_without_searches_says_so(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "ablate", "ui", "--optuna", "--storage", f"sqlite:///{tmp_path}/none.db"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2 and "no searches yet" in out.stdout


def test_a_port_a_stopped_server_left_in_time_wait_is_free_again():
    """A server that closed a browser's connection leaves its port in TIME_WAIT for a minute: the UI, restarted,
    moved to a random port ("port 5000 is in use") though nothing listened there. Bound as servers bind it
    (SO_REUSEADDR), the port is free; one another program listens on is not."""
    from ablations.ui import _bound, choose_port

    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = server.accept()
    accepted.close()  # the server closes first: its side of the connection waits in TIME_WAIT
    time.sleep(0.2)
    client.close()
    server.close()
    with socket.socket() as plain, pytest.raises(OSError):  # what the UI checked before
        plain.bind(("127.0.0.1", port))
    assert _bound("127.0.0.1", port) == port and choose_port("127.0.0.1", port, "mlflow") == (port, "")
    with socket.create_server(("127.0.0.1", 0)) as listening:
        taken = listening.getsockname()[1]
        assert _bound("127.0.0.1", taken) is None
        assert choose_port("127.0.0.1", taken, "mlflow") == (
            None,
            f"port {taken} on 127.0.0.1 is in use; pick another with --port",
        )


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--port", "0"], "argument --port: '0': give a port from 1 to 65535"),
        (["--port", "70000"], "argument --port: '70000': give a port from 1 to 65535"),
        (["--host", "no-such-host.invalid"], "error: --host no-such-host.invalid: not an address to serve on"),
        (["--run", "nosuchrun"], "error: no run 'nosuchrun' in sqlite:///"),
        (["--storage", "sqlite:///o.db"], "error: --storage is the searches' Optuna storage: add --optuna"),
        (["Defaul"], "(did you mean 'Default'?); experiments there: Default"),
        (["quickstart", "--optuna"], "error: an experiment or --run opens MLflow's UI, not optuna-dashboard"),
    ],
)
def test_ui_options_it_cannot_use_are_one_line(args, said, tmp_path, store, monkeypatch, capsys):
    """Each was a traceback (OverflowError, gaierror), a wait of 120 s then a link to port 0, a link to a run
    that is not there, or an option silently ignored. The command's own entry point, in this process (a new
    process per case cost 2-4 s of imports); an exception it lets through fails the test as a traceback would."""
    from ablate.main import main

    monkeypatch.chdir(tmp_path)
    try:
        code = main(["ui", "--tracking-uri", store, *args])
    except SystemExit as exit_:  # argparse's refusals
        code = exit_.code
    err = capsys.readouterr().err
    assert code == 2 and said in err.splitlines()[-1] and "Traceback" not in err, err
    assert not (tmp_path / ".ablate").exists()  # nothing started, nothing written


def _unprivileged_port_start() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_unprivileged_port_start") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 1024


@pytest.mark.skipif(_unprivileged_port_start() <= 80, reason="this kernel lets any user serve on port 80")
def test_a_port_this_user_may_not_serve_on_is_blamed_on_port_not_on_host():
    """Port 80 for a user without the privilege: it said '--host 127.0.0.1: cannot serve there (Permission
    denied)'. As root, the check runs in a forked child that gives up root first (nobody's uid)."""
    from ablations.ui import CannotBind, _bound

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no exec, no imports; it writes what the check said and leaves at once
        try:
            if os.geteuid() == 0:
                os.setgid(65534)
                os.setuid(65534)
            try:
                said = f"bound {_bound('127.0.0.1', 80)}"
            except CannotBind as err:
                said = str(err)
            os.write(write, said.encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        said = f.read()
    os.waitpid(pid, 0)
    assert said == "--port 80: not allowed here (Permission denied): pick one from 1024 up", said
