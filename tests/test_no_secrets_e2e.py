"""No secret is printed or recorded (issue 19, item 3): a sweep against a tracking URI that carries the MLflow
password, and a search against an Optuna storage URL that carries the PostgreSQL password, both through the
``ablate`` CLI on the deployment's MLflow (platform/mlflow/entrypoint.sh) and PostgreSQL roles
(platform/postgres/init.sh); then every output and record is searched for the passwords: the commands' stdout
and stderr (their error paths too: an unreachable store), every file they or Ray wrote (.ablate/, Ray's
session logs, Ray Tune's results, MLflow's artifacts) and a dump of the MLflow and Optuna databases (params,
tags, run names, Optuna attributes).

The masking (ablations/secrets.py) is applied where ablations/ prints or records (the CLI's streams, the
search's storage tag and progress line, run tags and text artifacts, error messages)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from urllib.parse import quote

import pytest
import yaml

from tests.conftest import postgres_reachable
from tests.deployment.processes import roles_and_databases, started_mlflow
from tests.deployment.resolve import compose, compose_argv, compose_env, env_values, local_database_url

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not postgres_reachable(), reason="no PostgreSQL reachable on 127.0.0.1:5432"),
]

BASE = {
    "task": {"name": "reverse", "train_size": 200, "max_len": 5},
    "model": {"d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32},
    "training": {"max_steps": 20, "val_every": 10, "batch_size": 16},
}


def ablate(args: list[str], cwd: Path, env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ablations.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def where_found(needles: dict[str, str], texts: dict[str, str], folder: Path) -> list[str]:
    """Every place (an output's name, a file's path) holding any of the needles, raw or URL-encoded, with the
    line it is in (the needle itself replaced by its name, so that the report does not repeat it)."""
    forms = {f"<{name}>": value for name, secret in needles.items() for value in {secret, quote(secret, safe="")}}

    def lines(where: str, text: str) -> list[str]:
        hits = []
        for line in text.splitlines():
            if any(v in line for v in forms.values()):
                for label, v in forms.items():
                    line = line.replace(v, label)
                hits.append(f"{where}: {line.strip()[:300]}")
        return hits

    found = [hit for where, text in texts.items() for hit in lines(where, text)]
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and not p.is_symlink()):
        try:
            text = path.read_bytes().decode("utf-8", "replace")
        except OSError:
            continue
        found += lines(str(path.relative_to(folder)), text)
    return found


@pytest.fixture
def short_tmp():
    """TMPDIR of the commands (Ray's session logs, Ray Tune's results): Ray's Unix sockets need a short path."""
    path = Path(tempfile.mkdtemp(prefix="abl-e2e-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_sweep_and_a_search_print_and_record_no_password(tmp_path, short_tmp):
    values = env_values()
    services = compose(values)["services"]
    cli_env = compose_env(services["ablate"])  # what the CLI container gets
    user, password = cli_env["MLFLOW_TRACKING_USERNAME"], cli_env["MLFLOW_TRACKING_PASSWORD"]
    needles = {
        "MLflow password": password,
        "PostgreSQL password of optuna": values["OPTUNA_DB_PASSWORD"],
        "MLflow admin password": values["MLFLOW_ADMIN_PASSWORD"],
    }
    work = tmp_path / "work"
    work.mkdir()
    study = {"name": "secret_sweep", "base": BASE, "seeds": 1, "design": {"grid": {"model.norm": ["pre", "post"]}}}
    (work / "study.yaml").write_text(yaml.safe_dump(study))
    search = {
        "name": "secret_search",
        "base": BASE,
        "n_trials": 2,
        "concurrency": 1,
        "pruner": "none",
        "sampler": "random",
        "space": {"training.lr": {"type": "float", "low": 1e-4, "high": 1e-2, "log": True}},
    }
    (work / "search.yaml").write_text(yaml.safe_dump(search))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "ABLATE_OPTUNA", "RAY_ADDRESS"))}
    env.update(TMPDIR=str(short_tmp), MLFLOW_HTTP_REQUEST_MAX_RETRIES="0", MLFLOW_HTTP_REQUEST_TIMEOUT="30")
    with_mlflow_env = {**env, "MLFLOW_TRACKING_USERNAME": user, "MLFLOW_TRACKING_PASSWORD": password}
    outputs: dict[str, str] = {}
    with roles_and_databases(compose_env(services["postgres"])) as prefix:
        svc = services["mlflow"]
        with started_mlflow(compose_argv(svc), compose_env(svc), prefix, tmp_path / "mlflow") as url:
            host = url.removeprefix("http://")
            storage = local_database_url(cli_env["ABLATE_OPTUNA_STORAGE"], prefix)  # postgresql://optuna...:PW@
            assert values["OPTUNA_DB_PASSWORD"] in storage
            unreachable = storage.replace("127.0.0.1:5432", "127.0.0.1:9")
            runs = {
                # the tracking URI carries the password (no MLFLOW_TRACKING_* in the environment)
                "sweep": (["sweep", "study.yaml", "--tracking-uri", f"http://{user}:{password}@{host}"], env),
                # the storage URL carries the PostgreSQL password; MLflow's comes from the environment
                "search": (["search", "search.yaml", "--storage", storage, "--tracking-uri", url], with_mlflow_env),
                # error paths: stores that cannot be reached, named with their passwords
                "sweep, unreachable tracking": (
                    ["sweep", "study.yaml", "--tracking-uri", f"http://{user}:{password}@127.0.0.1:9"],
                    env,
                ),
                "search, unreachable storage": (
                    ["search", "search.yaml", "--storage", unreachable, "--tracking-uri", url],
                    with_mlflow_env,
                ),
            }
            for name, (args, run_env) in runs.items():
                out = ablate([*args, "--cpus", "2"], work, run_env)
                outputs[f"{name}: stdout"], outputs[f"{name}: stderr"] = out.stdout, out.stderr
                if "unreachable" in name:
                    assert out.returncode != 0, f"{name} should fail:\n{out.stdout[-2000:]}"
                else:
                    assert out.returncode == 0, f"{name} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
        # the records: everything MLflow and Optuna stored, as PostgreSQL holds it
        for db in ("mlflow", "mlflow_auth", "optuna"):
            dump = subprocess.run(
                ["pg_dump", "--data-only", "-h", "127.0.0.1", "-U", "postgres", f"{prefix}{db}"],
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert dump.returncode == 0, dump.stderr
            outputs[f"database {db}"] = dump.stdout
        assert "secret_sweep" in outputs["database mlflow"] and "secret_search" in outputs["database optuna"]
    found = where_found(needles, outputs, tmp_path) + where_found(needles, {}, short_tmp)
    assert not found, "secrets printed or recorded:\n" + "\n".join(found)
