"""The deployment files, read as docker-compose and Kubernetes read them (tests/deployment/resolve.py, checked
against ``docker-compose config`` where it is installed): who gets which secret, Ray's token, where the
dashboards listen, and the entrypoints' refusals. The programs they start run as processes on 127.0.0.1 in
tests/deployment/test_services.py (no Docker engine or Kubernetes runs here)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from urllib.parse import urlsplit

import pytest
import yaml

from tests.deployment.resolve import (
    COMPOSE,
    ENV_EXAMPLE,
    MissingVariable,
    compose,
    compose_argv,
    compose_env,
    env_values,
    interpolate,
    k8s_argv,
    k8s_containers,
    k8s_env,
    write_env_file,
)

ROOT = COMPOSE.parent
ENTRYPOINT = ROOT / "platform" / "mlflow" / "entrypoint.sh"
RAY_NODES = {"ray-head", "ray-worker", "ray-worker-gpu"}

# Who holds which secret: the threat model of platform/README.md, as the files must implement it.
COMPOSE_HOLDERS = {
    "POSTGRES_PASSWORD": {"postgres"},
    "MLFLOW_DB_PASSWORD": {"postgres", "mlflow"},
    "OPTUNA_DB_PASSWORD": {"postgres", "optuna-dashboard", "ablate", *RAY_NODES},
    "MLFLOW_ADMIN_PASSWORD": {"mlflow"},
    "MLFLOW_TRACKING_PASSWORD": {"mlflow", "ablate", *RAY_NODES},
    "MLFLOW_FLASK_SERVER_SECRET_KEY": {"mlflow"},
    "RAY_AUTH_TOKEN": {"ablate", *RAY_NODES},
}
K8S_RAY = {"ray-head", "ray-worker-cpu", "ray-worker-gpu"}
K8S_HOLDERS = {
    "POSTGRES_PASSWORD": {"postgres"},
    "MLFLOW_DB_PASSWORD": {"postgres", "mlflow"},
    "OPTUNA_DB_PASSWORD": {"postgres", "optuna-dashboard", *K8S_RAY},
    "MLFLOW_ADMIN_PASSWORD": {"mlflow"},
    "MLFLOW_TRACKING_PASSWORD": {"mlflow", *K8S_RAY},
    "MLFLOW_FLASK_SERVER_SECRET_KEY": {"mlflow"},
    "RAY_AUTH_TOKEN": {"ray-autoscaler", *K8S_RAY},
}


def test_the_cli_service_runs_and_ships_the_mounted_code():
    """The `ablate` service mounts the repository where the image installed the package (editable), so that the
    driver imports and fingerprints the code edited on the host, and ships it to the workers (what travels is
    cluster.ROOT, the folder of the imported package, by construction: here, the mount). Mounted beside it (/workspace/project), the image's copy ran and travelled: edits were
    silently ignored."""
    dockerfile = (ROOT / "platform" / "Dockerfile").read_text()
    installed = re.findall(r"^WORKDIR (\S+)", dockerfile, re.M)[-1]
    assert re.search(r"pip install [^\n]*-e \.", dockerfile)  # editable: the package is the folder's code
    service = yaml.safe_load(COMPOSE.read_text())["services"]["ablate"]
    assert service["volumes"] == [f"./:{installed}"] and service["working_dir"] == installed
    # the editable install maps the packages the image holds when it installs: every one pyproject names
    packages = re.search(r"include = \[([^\]]*)\]", (ROOT / "pyproject.toml").read_text()).group(1)
    for package in re.findall(r'"(\w+)\*"', packages):
        assert re.search(rf"^COPY {package} {package}$", dockerfile, re.M), f"the image does not copy {package}/"


def test_env_example_names_every_variable_compose_reads():
    """platform/README.md: .env.example holds every credential and setting compose reads (set, or commented with
    its default)."""
    read = set(re.findall(r"\$\{([A-Z_][A-Z0-9_]*)", COMPOSE.read_text()))
    named = set(re.findall(r"^#? *([A-Z_][A-Z0-9_]*)=", ENV_EXAMPLE.read_text(), re.M))
    assert read and not read - named, sorted(read - named)


def test_compose_services_ports_volumes_and_health_checks():
    raw = yaml.safe_load(COMPOSE.read_text())
    services = compose(env_values())["services"]
    assert set(services) == {"postgres", "mlflow", "optuna-dashboard", "ablate"} | RAY_NODES
    for name, svc in raw["services"].items():
        for port in svc.get("ports", []):  # every published port binds to localhost unless the user opts in
            assert port.startswith("${BIND_ADDRESS:-127.0.0.1}:"), (name, port)
    assert "BIND_ADDRESS=127.0.0.1" in ENV_EXAMPLE.read_text().splitlines()  # the secure default
    for name in ("postgres", "mlflow", "ray-head"):
        assert services[name]["healthcheck"]["test"], name
    assert "/tmp/mlflow-ready" in str(services["mlflow"]["healthcheck"]["test"])  # healthy once its users exist
    assert services["mlflow"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert services["ray-worker"]["depends_on"]["ray-head"]["condition"] == "service_healthy"
    assert services["optuna-dashboard"]["depends_on"]["mlflow"]["condition"] == "service_healthy"
    assert "--address=ray-head:6379" in compose_argv(services["ray-worker"])
    assert services["ray-worker"]["shm_size"] and services["ray-head"]["shm_size"]
    gpu = services["ray-worker-gpu"]
    assert gpu["profiles"] == ["gpu"] and gpu["deploy"]["resources"]["reservations"]["devices"][0]["driver"] == "nvidia"
    assert (
        services["ablate"]["profiles"] == ["cli"] and compose_env(services["ablate"])["RAY_ADDRESS"] == "ray-head:6379"
    )
    assert "--app-name" not in str(services["mlflow"])  # basic auth is set by the entrypoint script
    assert compose_argv(services["mlflow"])[-1] == "/workspace/platform/mlflow/entrypoint.sh"
    assert set(raw["volumes"]) == {"postgres-data", "mlflow-artifacts"}
    assert any("postgres-data:" in v for v in services["postgres"]["volumes"])
    assert any("init.sh:/docker-entrypoint-initdb.d/" in v for v in services["postgres"]["volumes"])


def test_every_variable_is_in_env_example_and_secrets_have_no_default():
    text = COMPOSE.read_text()
    example = ENV_EXAMPLE.read_text()
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
    for secret in COMPOSE_HOLDERS:
        for use in re.findall(rf"\${{{secret}(\W)", text):
            assert use == ":", f"{secret} must be required (${{{secret}:?...}}), never defaulted"
        assert re.search(rf"^{secret}=$", example, re.M), f"{secret} must be empty in .env.example"
    with pytest.raises(MissingVariable, match="RAY_AUTH_TOKEN"):
        compose({k: v for k, v in env_values().items() if k != "RAY_AUTH_TOKEN"})
    assert ".env" in (ROOT / ".gitignore").read_text().split()


def test_the_compose_reading_is_compose_s_own():
    """tests/deployment/resolve.py against docker-compose's own substitution (``docker-compose config``)."""
    env = {"A": "a", "EMPTY": ""}
    assert interpolate("$${A} ${A} ${A:-x} ${EMPTY:-d} ${EMPTY-d} ${UNSET-d} ${A:+r} ${UNSET:+r}|", env) == (
        "${A} a a d  d r |"
    )
    with pytest.raises(MissingVariable, match="EMPTY: say so"):
        interpolate("${EMPTY:?say so}", env)
    assert interpolate("${EMPTY?fine}", env) == ""


@pytest.mark.skipif(
    shutil.which("docker-compose") is None,
    reason="docker-compose is not installed (Debian: apt-get install docker-compose; `make test` does)",
)
def test_docker_compose_validates_the_file_and_resolves_it_as_the_tests_do(tmp_path):
    values = env_values()
    env_file = write_env_file(tmp_path / ".env", values)
    base = ["docker-compose", "-f", str(COMPOSE), "--env-file", str(env_file)]
    clean = {k: v for k, v in os.environ.items() if k not in values}  # compose would prefer the shell's values
    out = subprocess.run(
        [*base, "--profile", "gpu", "--profile", "cli", "config"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        env=clean,
    )
    assert out.returncode == 0, out.stderr
    theirs = yaml.safe_load(out.stdout)["services"]
    ours = compose(values)["services"]
    assert set(theirs) == set(ours)
    for name, svc in ours.items():
        assert compose_env(theirs[name]) == compose_env(svc), name
        assert compose_argv(theirs[name]) == compose_argv(svc), name
    empty = write_env_file(tmp_path / "empty.env", {})
    out = subprocess.run(
        ["docker-compose", "-f", str(COMPOSE), "--env-file", str(empty), "config", "-q"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        env=clean,
    )
    assert out.returncode != 0 and "set " in out.stderr + out.stdout  # no password, no deployment


def holders(definitions: dict[str, str], values: dict[str, str]) -> dict[str, set[str]]:
    """For each secret of .env, the services (or containers) whose resolved definition contains its value."""
    return {
        secret: {name for name, text in definitions.items() if values[secret] in text} for secret in COMPOSE_HOLDERS
    }


def test_compose_gives_each_service_only_its_own_credentials():
    values = env_values()
    services = compose(values)["services"]
    found = holders({n: repr(s) for n, s in services.items()}, values)
    assert found == COMPOSE_HOLDERS
    superuser = values["POSTGRES_USER"]
    for name, svc in services.items():
        for value in compose_env(svc).values():
            if value.startswith("postgresql"):  # nobody but postgres connects as the superuser
                assert name != "postgres" and urlsplit(value).username not in (superuser, None), (name, value)
    mlflow = compose_env(services["mlflow"])
    for name in RAY_NODES | {"ablate"}:
        env = compose_env(services[name])
        # the MLflow user the entrypoint creates (never an admin) is the one Ray and the CLI use
        assert (
            env["MLFLOW_TRACKING_USERNAME"] == mlflow["MLFLOW_WORKER_USERNAME"] != mlflow["MLFLOW_AUTH_ADMIN_USERNAME"]
        )
        assert env["MLFLOW_TRACKING_PASSWORD"] == mlflow["MLFLOW_WORKER_PASSWORD"]
        assert urlsplit(env["ABLATE_OPTUNA_STORAGE"]).username == "optuna"
    assert urlsplit(compose_env(services["optuna-dashboard"])["OPTUNA_STORAGE"]).username == "optuna"
    for key in ("MLFLOW_BACKEND_STORE_URI", "MLFLOW_AUTH_DATABASE_URI"):
        assert urlsplit(mlflow[key]).username == "mlflow"


def test_kuberay_manifests_give_each_container_only_its_own_credentials():
    values = env_values()
    containers = k8s_containers()
    assert set(containers) == {"postgres", "mlflow", "optuna-dashboard", "ray-autoscaler"} | K8S_RAY
    for name, c in containers.items():
        assert "envFrom" not in c, f"{name}: takes the whole Secret; name each key it needs"
    envs = {n: k8s_env(c, values) for n, c in containers.items()}
    found = holders({n: repr(e) + repr(k8s_argv(containers[n])) for n, e in envs.items()}, values)
    assert found == K8S_HOLDERS
    for name, env in envs.items():
        for value in env.values():
            if value.startswith("postgresql"):
                assert urlsplit(value).username in ("mlflow", "optuna"), (name, value)
    mlflow = envs["mlflow"]
    for name in K8S_RAY:
        assert envs[name]["MLFLOW_TRACKING_USERNAME"] == mlflow["MLFLOW_WORKER_USERNAME"]
        assert envs[name]["MLFLOW_TRACKING_USERNAME"] != mlflow["MLFLOW_AUTH_ADMIN_USERNAME"]
        assert envs[name]["MLFLOW_TRACKING_URI"] == "http://mlflow:5000"
    assert "mlflow:5000" in mlflow["MLFLOW_ALLOWED_HOSTS"].split(",")


def test_ray_requires_its_token_everywhere_and_dashboards_are_guarded():
    values = env_values()
    services = compose(values)["services"]
    for name, svc in services.items():
        argv = compose_argv(svc)
        if "ray" in argv or name == "ablate":  # every Ray node, and the driver that joins them
            env = compose_env(svc)
            assert env["RAY_AUTH_MODE"] == "token" and env["RAY_AUTH_TOKEN"] == values["RAY_AUTH_TOKEN"], name
        assert "optuna-dashboard" not in argv, f"{name}: optuna-dashboard runs only behind platform/optuna/dashboard.sh"
    assert compose_argv(services["optuna-dashboard"])[-1] == "/workspace/platform/optuna/dashboard.sh"
    assert compose_env(services["optuna-dashboard"])["MLFLOW_TRACKING_URI"] == "http://mlflow:5000"
    for name, c in k8s_containers().items():
        if name in K8S_RAY or name == "ray-autoscaler":
            env = k8s_env(c, values)
            assert env["RAY_AUTH_MODE"] == "token" and env["RAY_AUTH_TOKEN"] == values["RAY_AUTH_TOKEN"], name
    assert k8s_containers()["ray-head"]["rayStartParams"]["dashboard-host"] == "127.0.0.1"
    cluster = yaml.safe_load((ROOT / "platform" / "ray" / "cluster.yaml").read_text())
    assert "--env=RAY_AUTH_MODE=token" in cluster["docker"]["run_options"]
    head = shlex.split(cluster["head_start_ray_commands"][-1])
    assert "--dashboard-host=127.0.0.1" in head


def entrypoint_env(tmp_path, **extra: str) -> dict[str, str]:
    return {
        "PATH": os.environ["PATH"],
        "MLFLOW_BACKEND_STORE_URI": f"sqlite:///{tmp_path}/m.db",
        "MLFLOW_AUTH_DATABASE_URI": f"sqlite:///{tmp_path}/a.db",
        "MLFLOW_FLASK_SERVER_SECRET_KEY": "k" * 32,
        "MLFLOW_AUTH_ADMIN_PASSWORD": "a-long-admin-password",
        "PYTHON": sys.executable,
        **extra,
    }


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ({"MLFLOW_AUTH_ADMIN_PASSWORD": ""}, "not set"),
        ({"MLFLOW_AUTH_ADMIN_PASSWORD": "password1234"}, "well-known"),
        ({"MLFLOW_AUTH_ADMIN_PASSWORD": "short"}, "12"),
        ({"MLFLOW_WORKER_USERNAME": "ray", "MLFLOW_WORKER_PASSWORD": "short"}, "MLFLOW_WORKER_PASSWORD must have"),
        ({"MLFLOW_WORKER_USERNAME": "ray"}, "MLFLOW_WORKER_PASSWORD is not set"),
        ({"MLFLOW_WORKER_USERNAME": "admin", "MLFLOW_WORKER_PASSWORD": "another-long-one"}, "must not be the admin"),
        ({"MLFLOW_WORKER_USERNAME": "ray", "MLFLOW_WORKER_PASSWORD": "a-long-admin-password"}, "must differ"),
        ({"MLFLOW_ALLOWED_HOSTS": "mlflow,*"}, "must not hold '*'"),
        ({"MLFLOW_AUTH_CACHE_TTL_SECONDS": "1m"}, "MLFLOW_AUTH_CACHE_TTL_SECONDS must be a whole number of seconds"),
    ],
)
def test_mlflow_entrypoint_refuses_missing_weak_and_shared_credentials(tmp_path, extra, words):
    env = entrypoint_env(tmp_path, **extra)
    out = subprocess.run(["sh", str(ENTRYPOINT)], capture_output=True, text=True, env=env, timeout=30)
    assert out.returncode == 2 and words in out.stderr, out.stderr
    assert not (tmp_path / "m.db").exists()  # refused before anything started


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ({"MLFLOW_DB_PASSWORD": ""}, "MLFLOW_DB_PASSWORD is not set"),
        ({"OPTUNA_DB_PASSWORD": "short"}, "OPTUNA_DB_PASSWORD must have at least 12"),
        ({"OPTUNA_DB_PASSWORD": "the-same-password"}, "must differ"),
        ({"ABLATE_DB_PREFIX": "x; DROP"}, "ABLATE_DB_PREFIX may hold only"),
    ],
)
def test_postgres_init_refuses_missing_and_shared_passwords(extra, words):
    env = {"PATH": os.environ["PATH"], "MLFLOW_DB_PASSWORD": "the-same-password", "OPTUNA_DB_PASSWORD": "x" * 16}
    out = subprocess.run(
        ["sh", str(ROOT / "platform" / "postgres" / "init.sh")],
        capture_output=True,
        text=True,
        env={**env, **extra, "PGHOST": "/nonexistent"},  # never reaches a server
        timeout=30,
    )
    assert out.returncode == 2 and words in out.stderr, out.stderr


def test_study_files_cannot_run_code(tmp_path):
    from record.spec import SpecError, load_study

    marker = tmp_path / "pwned"
    path = tmp_path / "evil.yaml"
    path.write_text(
        f"name: evil\nbase: !!python/object/apply:os.system ['touch {marker}']\n"
        "design: {grid: {model.norm: [pre]}}\n"
    )
    with pytest.raises(SpecError, match="YAML"):  # a safe loader: no tags that construct objects
        load_study(path)
    assert not marker.exists()
    path.write_text("name: evil\nbase: {task: {name: copy}}\ndesign: {grid: {model.score: ['os:system']}}\n")
    with pytest.raises(SpecError, match="os:system"):
        load_study(path)  # components come from the registries by name, never by import path


def test_the_threat_model_covers_every_published_port_and_every_secret():
    readme = (ROOT / "platform" / "README.md").read_text()
    ports_table = readme.split("### Ports")[1].split("###")[0]
    holders_table = readme.split("### Who holds which secret")[1].split("###")[0]
    rotate = readme.split("### Rotate")[1].split("###")[0]
    services = compose(env_values())["services"]
    published = {p.rsplit(":", 1)[1] for s in services.values() for p in s.get("ports", [])}
    assert published == {"5432", "5000", "8080", "8265", "10001"}
    for port in published | {"6379"}:
        assert f"| {port} |" in ports_table, f"port {port} is missing from the threat model"
    example = ENV_EXAMPLE.read_text()
    secrets_in_env = set(re.findall(r"^([A-Z_]+)=$", example, re.M))
    assert secrets_in_env == set(COMPOSE_HOLDERS)
    for secret in secrets_in_env:
        assert f"`{secret}`" in holders_table, f"{secret}: who holds it?"
        assert f"`{secret}`" in rotate, f"{secret}: how is it rotated?"
