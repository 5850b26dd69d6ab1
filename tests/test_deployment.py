"""The deployment: docker-compose.yml checked as a file (and by docker-compose where installed), and the same
topology started as processes on 127.0.0.1 (no Docker engine runs here): PostgreSQL, MLflow with basic auth
through platform/mlflow/entrypoint.sh, a Ray head and a worker node; a study and a search run against them
with credentials, and requests without credentials or with a wrong password are refused."""

from __future__ import annotations

import base64
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from contextlib import contextmanager

import pytest
import yaml

from tests.conftest import ROOT, free_port, stop, wait_for_http
from tests.ray_nodes import ray_cluster

COMPOSE = ROOT / "docker-compose.yml"
ENTRYPOINT = ROOT / "platform" / "mlflow" / "entrypoint.sh"


def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def test_compose_services_ports_volumes_and_health_checks():
    c = compose()
    services = c["services"]
    assert {"postgres", "mlflow", "ray-head", "ray-worker", "ray-worker-gpu", "optuna-dashboard", "ablate"} <= set(
        services
    )
    for name, svc in services.items():
        for port in svc.get("ports", []):  # every published port binds to localhost unless the user opts in
            assert port.startswith("${BIND_ADDRESS:-127.0.0.1}:"), (name, port)
    for name in ("postgres", "mlflow", "ray-head"):
        assert services[name]["healthcheck"]["test"], name
    assert services["mlflow"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert services["ray-worker"]["depends_on"]["ray-head"]["condition"] == "service_healthy"
    assert "ray-head:6379" in services["ray-worker"]["command"]
    assert services["ray-worker"]["shm_size"] and services["ray-head"]["shm_size"]
    gpu = services["ray-worker-gpu"]
    assert gpu["profiles"] == ["gpu"] and gpu["deploy"]["resources"]["reservations"]["devices"][0]["driver"] == "nvidia"
    assert (
        services["ablate"]["profiles"] == ["cli"]
        and services["ablate"]["environment"]["RAY_ADDRESS"] == "ray-head:6379"
    )
    assert "--app-name" not in str(services["mlflow"])  # basic auth is set by the entrypoint script
    assert services["mlflow"]["entrypoint"][-1].endswith("platform/mlflow/entrypoint.sh")
    assert set(c["volumes"]) == {"postgres-data", "mlflow-artifacts"}
    assert any("postgres-data:" in v for v in services["postgres"]["volumes"])
    assert any("init.sh" in v for v in services["postgres"]["volumes"])


def test_every_variable_is_in_env_example_and_secrets_have_no_default():
    text = COMPOSE.read_text()
    example = (ROOT / ".env.example").read_text()
    declared = set(re.findall(r"^#?\s*([A-Z_]+)=", example, re.M))
    used = set(re.findall(r"\$\{([A-Z_]+)", text))
    assert used <= declared | {
        "ABLATE_IMAGE",
        "POSTGRES_PORT",
        "MLFLOW_PORT",
        "RAY_DASHBOARD_PORT",
        "RAY_CLIENT_PORT",
        "OPTUNA_DASHBOARD_PORT",
    }, used - declared
    for secret in ("POSTGRES_PASSWORD", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_FLASK_SERVER_SECRET_KEY"):
        assert re.search(rf"\${{{secret}:\?", text), f"{secret} must be required (:?), never defaulted"
        assert re.search(rf"^{secret}=$", example, re.M), f"{secret} must be empty in .env.example"
    assert ".env" in (ROOT / ".gitignore").read_text().split()


@pytest.mark.skipif(
    shutil.which("docker-compose") is None,
    reason="docker-compose is not installed (Debian: apt-get install docker-compose; `make test` does)",
)
def test_docker_compose_validates_the_file(tmp_path):
    env = tmp_path / ".env"
    env.write_text(
        (ROOT / ".env.example")
        .read_text()
        .replace("PASSWORD=\n", "PASSWORD=x" * 1 + "y" * 16 + "\n")
        .replace("SECRET_KEY=\n", "SECRET_KEY=" + "z" * 24 + "\n")
    )
    out = subprocess.run(
        [
            "docker-compose",
            "-f",
            str(COMPOSE),
            "--env-file",
            str(env),
            "--profile",
            "gpu",
            "--profile",
            "cli",
            "config",
            "-q",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    empty = tmp_path / "empty.env"
    empty.write_text("")
    out = subprocess.run(
        ["docker-compose", "-f", str(COMPOSE), "--env-file", str(empty), "config", "-q"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert out.returncode != 0 and "POSTGRES" in out.stderr + out.stdout  # no password, no deployment


@pytest.mark.parametrize(("password", "words"), [("", "not set"), ("password1234", "well-known"), ("short", "12")])
def test_mlflow_entrypoint_refuses_missing_and_weak_passwords(tmp_path, password, words):
    env = {
        "PATH": os.environ["PATH"],
        "MLFLOW_BACKEND_STORE_URI": f"sqlite:///{tmp_path}/m.db",
        "MLFLOW_AUTH_DATABASE_URI": f"sqlite:///{tmp_path}/a.db",
        "MLFLOW_FLASK_SERVER_SECRET_KEY": "k" * 32,
        "MLFLOW_AUTH_ADMIN_PASSWORD": password,
        "PYTHON": sys.executable,
    }
    out = subprocess.run(["sh", str(ENTRYPOINT)], capture_output=True, text=True, env=env, timeout=30)
    assert out.returncode == 2 and words in out.stderr, out.stderr


def test_study_files_cannot_run_code(tmp_path):
    from ablations.spec import SpecError
    from ablations.study import load_study

    marker = tmp_path / "pwned"
    path = tmp_path / "evil.yaml"
    path.write_text(
        f"name: evil\nbase: !!python/object/apply:os.system ['touch {marker}']\n"
        "design: {grid: {model.norm: [pre]}}\n"
    )
    with pytest.raises(SpecError, match="not valid YAML"):
        load_study(path)
    assert not marker.exists()
    path.write_text("name: evil\nbase: {task: {name: copy}}\ndesign: {grid: {model.score: ['os:system']}}\n")
    with pytest.raises(SpecError, match="os:system.*valid"):
        load_study(path)  # components come from the registries by name, never by import path


# --- the topology as processes ---------------------------------------------------------------------------


def postgres_reachable() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", 5432), timeout=1):
            return True
    except OSError:
        return False


@contextmanager
def databases(*names: str):
    import psycopg

    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as conn:
        for n in names:
            conn.execute(f"CREATE DATABASE {n}")
    try:
        yield {n: f"postgresql://postgres@127.0.0.1:5432/{n}" for n in names}
    finally:
        with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as conn:
            for n in names:
                conn.execute(f"DROP DATABASE IF EXISTS {n} WITH (FORCE)")


def status(url: str, auth: tuple[str, str] | None) -> int:
    req = urllib.request.Request(f"{url}/api/2.0/mlflow/experiments/search?max_results=5")
    if auth:
        req.add_header("Authorization", "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as err:
        return err.code


@pytest.mark.slow
@pytest.mark.skipif(not postgres_reachable(), reason="no PostgreSQL reachable on 127.0.0.1:5432 (compose's postgres)")
def test_the_compose_topology_as_processes_with_credentials(tmp_path, monkeypatch):
    import optuna
    from mlflow import MlflowClient

    from ablations.search import load_search, run_search
    from ablations.study import load_study
    from ablations.sweep import run_study

    tag = uuid.uuid4().hex[:8]
    user, password = "admin", secrets.token_urlsafe(18)
    with databases(f"mlflow_{tag}", f"mlflow_auth_{tag}", f"optuna_{tag}") as db:
        port = free_port()
        env = {
            **os.environ,
            "PYTHON": sys.executable,
            "MLFLOW_HOST": "127.0.0.1",
            "MLFLOW_PORT": str(port),
            "MLFLOW_WORKERS": "1",
            "MLFLOW_BACKEND_STORE_URI": db[f"mlflow_{tag}"],
            "MLFLOW_AUTH_DATABASE_URI": db[f"mlflow_auth_{tag}"],
            "MLFLOW_AUTH_ADMIN_USERNAME": user,
            "MLFLOW_AUTH_ADMIN_PASSWORD": password,
            "MLFLOW_FLASK_SERVER_SECRET_KEY": secrets.token_hex(16),
            "MLFLOW_ARTIFACTS_DESTINATION": str(tmp_path / "artifacts"),
            "MLFLOW_AUTH_CONFIG_PATH": str(tmp_path / "basic_auth.ini"),
        }
        log = open(tmp_path / "mlflow.log", "w")  # noqa: SIM115  (closed below)
        server = subprocess.Popen(
            ["sh", str(ENTRYPOINT)], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=tmp_path
        )
        url = f"http://127.0.0.1:{port}"
        try:
            wait_for_http(f"{url}/health", timeout=120, proc=server)
            assert status(url, None) == 401  # no credentials
            assert status(url, (user, password + "x")) == 401  # a wrong password
            assert status(url, (user, password)) == 200

            # the cluster's nodes do not know the credentials: the driver forwards them to the trials
            for k in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
                monkeypatch.delenv(k, raising=False)
            with ray_cluster(tmp_path, nodes=2, cpus_per_node=1, dashboard=False) as cluster:
                monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", user)
                monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", password)
                base = {
                    "task": {"name": "reverse", "train_size": 200, "max_len": 5},
                    "model": {"d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32},
                    "training": {"max_steps": 20, "val_every": 10, "batch_size": 16},
                }
                study_path = tmp_path / "deployed.yaml"
                study_path.write_text(
                    yaml.safe_dump(
                        {
                            "name": "deployed",
                            "base": base,
                            "seeds": 2,
                            "design": {"grid": {"model.norm": ["pre", "post"]}},
                        }
                    )
                )
                result = run_study(
                    load_study(study_path), address=cluster.address, tracking_uri=url, out=lambda _: None
                )
                assert result.complete and result.counts["finished"] == 4
                search_path = tmp_path / "deployed_search.yaml"
                search_path.write_text(
                    yaml.safe_dump(
                        {
                            "name": "deployed_search",
                            "base": base,
                            "n_trials": 2,
                            "concurrency": 2,
                            "pruner": "none",
                            "sampler": "random",
                            "space": {"training.lr": {"type": "float", "low": 1e-4, "high": 1e-2, "log": True}},
                        }
                    )
                )
                found = run_search(
                    load_search(search_path),
                    address=cluster.address,
                    tracking_uri=url,
                    storage=db[f"optuna_{tag}"],
                    out=lambda _: None,
                )
                assert found.best
            c = MlflowClient(url)  # with the credentials from the environment
            exp = c.get_experiment_by_name("deployed")
            cells = c.search_runs([exp.experiment_id], "tags.kind = 'cell'")
            assert len(cells) == 4 and all(r.info.status == "FINISHED" for r in cells)
            assert len({r.data.tags["ray_node"] for r in cells}) >= 1
            assert "config.yaml" in {a.path for a in c.list_artifacts(cells[0].info.run_id)}  # served artifacts
            trials = optuna.load_study(study_name="deployed_search", storage=db[f"optuna_{tag}"]).trials
            assert len(trials) == 2 and all(t.state.name == "COMPLETE" for t in trials)
            monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "wrong-password-123")
            with pytest.raises(Exception, match="401|Unauthorized|credentials"):
                MlflowClient(url).search_experiments()
        finally:
            stop(server)
            log.close()
