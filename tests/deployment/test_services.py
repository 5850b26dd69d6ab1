"""The programs docker-compose.yml and the KubeRay manifests start, run as processes on 127.0.0.1 with the
arguments and environment the files give them (tests/deployment/resolve.py; no Docker engine or Kubernetes
runs here): PostgreSQL's roles from platform/postgres/init.sh on the machine's PostgreSQL, MLflow through
platform/mlflow/entrypoint.sh addressed as the other containers address it (``Host: mlflow:5000``),
optuna-dashboard behind MLflow's credentials, a Ray head that requires its token, and a study and a search run
through the whole topology with the roles' credentials, after which no output or record holds a password."""

from __future__ import annotations

import base64
import configparser
import contextlib
import hashlib
import hmac
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from urllib.parse import quote

import pytest
import yaml

from tests.conftest import free_port, free_ports, postgres_reachable, stop, wait_for_http
from tests.deployment.processes import (
    SUPERUSER,
    command_lines_showing,
    drop_prefixed,
    request,
    roles_and_databases,
    run_init,
    started_mlflow,
    wait_for_answer,
)
from tests.deployment.resolve import (
    compose,
    compose_argv,
    compose_env,
    env_values,
    k8s_argv,
    k8s_containers,
    k8s_env,
    local_database_url,
    on_this_machine,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not postgres_reachable(), reason="no PostgreSQL reachable on 127.0.0.1:5432 (compose's postgres)"
    ),
]

# --- PostgreSQL: the roles of init.sh ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def deployment():
    """The .env values (fresh secrets), docker-compose.yml resolved with them, and init.sh's roles and databases
    under a prefix of this module's own; dropped at the end."""
    values = env_values()
    services = compose(values)["services"]
    with roles_and_databases(compose_env(services["postgres"])) as prefix:
        yield values, services, prefix


def scram_matches(verifier: str, password: str) -> bool:
    """Whether a PostgreSQL SCRAM-SHA-256 verifier (pg_authid.rolpassword) was made from ``password`` (RFC 5802,
    section 3: StoredKey = H(HMAC(SaltedPassword, "Client Key")), ServerKey = HMAC(SaltedPassword, "Server Key"))."""
    method, rest = verifier.split("$", 1)
    iterations_salt, keys = rest.split("$")
    iterations, salt = iterations_salt.split(":")
    stored, server = (base64.b64decode(k) for k in keys.split(":"))
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), base64.b64decode(salt), int(iterations))
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    return (
        method == "SCRAM-SHA-256"
        and hashlib.sha256(client_key).digest() == stored
        and hmac.new(salted, b"Server Key", hashlib.sha256).digest() == server
    )


def test_each_role_owns_only_its_databases_and_is_refused_the_others(deployment):
    import psycopg

    values, services, prefix = deployment
    owned = {"mlflow": {"mlflow", "mlflow_auth"}, "optuna": {"optuna"}}
    databases = {db for dbs in owned.values() for db in dbs}
    with psycopg.connect(SUPERUSER, autocommit=True) as conn:
        for role, dbs in owned.items():
            row = conn.execute(
                "SELECT rolsuper, rolcreatedb, rolcreaterole, rolreplication, rolbypassrls, rolcanlogin, rolpassword "
                "FROM pg_authid WHERE rolname = %s",
                (prefix + role,),
            ).fetchone()
            assert row[:6] == (False, False, False, False, False, True), role
            assert scram_matches(row[6], values[f"{role.upper()}_DB_PASSWORD"]), f"{role}: not the .env password"
            mine = conn.execute(
                "SELECT datname FROM pg_database d JOIN pg_roles r ON d.datdba = r.oid WHERE r.rolname = %s",
                (prefix + role,),
            ).fetchall()
            assert {name for (name,) in mine} == {prefix + db for db in dbs}
    for role, dbs in owned.items():
        for db in databases:
            url = f"postgresql://{prefix}{role}@127.0.0.1:5432/{prefix}{db}"
            if db in dbs:
                with psycopg.connect(url, autocommit=True) as conn:  # an owner may create tables
                    conn.execute("CREATE TABLE probe (x int)")
                    conn.execute("DROP TABLE probe")
            else:
                with pytest.raises(psycopg.OperationalError, match="CONNECT privilege|permission denied"):
                    psycopg.connect(url).close()
    # every URL the compose file gives a service names one of these roles, on its own database
    for name, svc in services.items():
        for key, value in compose_env(svc).items():
            if value.startswith("postgresql"):
                local = local_database_url(value, prefix)
                role = local.split("://")[1].split(":")[0]
                assert local.rsplit("/", 1)[1] in {prefix + db for db in owned[role.removeprefix(prefix)]}, (name, key)
                psycopg.connect(local).close()


def test_running_init_again_rotates_the_passwords_and_keeps_the_grants(deployment):
    import psycopg

    values, services, prefix = deployment
    env = compose_env(services["postgres"])
    rotated = {**env, "OPTUNA_DB_PASSWORD": "rotated-" + uuid.uuid4().hex}
    try:
        run_init(rotated, prefix)
        with psycopg.connect(SUPERUSER) as conn:
            (verifier,) = conn.execute(
                "SELECT rolpassword FROM pg_authid WHERE rolname = %s", (prefix + "optuna",)
            ).fetchone()
            acl = conn.execute(
                "SELECT datacl::text FROM pg_database WHERE datname = %s", (prefix + "optuna",)
            ).fetchone()
        assert scram_matches(verifier, rotated["OPTUNA_DB_PASSWORD"])
        assert not scram_matches(verifier, values["OPTUNA_DB_PASSWORD"])
        assert acl[0] == f"{{{prefix}optuna=CTc/{prefix}optuna}}"  # the owner alone; PUBLIC has nothing
    finally:
        run_init(env, prefix)


def test_an_older_volume_passes_to_the_roles(deployment, tmp_path):
    """A volume made before the roles existed: the superuser created the databases, and MLflow and Optuna their
    tables, sequences and types in them. Running init.sh hands all of it to the roles, which then work."""
    import optuna
    import psycopg
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    values, services, _ = deployment
    prefix = f"t{uuid.uuid4().hex[:8]}_"
    try:
        with psycopg.connect(SUPERUSER, autocommit=True) as conn:
            for db in ("mlflow", "mlflow_auth", "optuna"):
                conn.execute(f'CREATE DATABASE "{prefix}{db}"')
        as_superuser = "postgresql://postgres@127.0.0.1:5432/" + prefix
        optuna.storages.RDBStorage(as_superuser + "optuna")  # Optuna's tables, sequences and enum types
        SqlAlchemyStore(as_superuser + "mlflow", str(tmp_path / "artifacts"))  # MLflow's
        run_init(compose_env(services["postgres"]), prefix)
        for db, role in (("mlflow", "mlflow"), ("mlflow_auth", "mlflow"), ("optuna", "optuna")):
            with psycopg.connect(as_superuser + db) as conn:
                others = conn.execute(
                    "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                    "WHERE n.nspname = 'public' AND c.relowner <> %s::regrole "
                    "UNION ALL SELECT t.typname FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace "
                    "WHERE n.nspname = 'public' AND t.typowner <> %s::regrole",
                    (prefix + role, prefix + role),
                ).fetchall()
            assert others == [], (db, others)
        as_role = f"postgresql://{prefix}optuna@127.0.0.1:5432/{prefix}optuna"
        study = optuna.create_study(study_name="after-upgrade", storage=as_role)
        study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
        assert len(optuna.load_study(study_name="after-upgrade", storage=as_role).trials) == 2
        store = SqlAlchemyStore(f"postgresql://{prefix}mlflow@127.0.0.1:5432/{prefix}mlflow", str(tmp_path / "a"))
        assert store.get_experiment(store.create_experiment("after-upgrade")).name == "after-upgrade"
    finally:
        drop_prefixed(prefix)


# --- MLflow: as compose and the KubeRay manifests start it -----------------------------------------------------


def check_mlflow(url: str, admin: tuple[str, str], worker: tuple[str, str]) -> None:
    """Addressed as the containers address it, MLflow asks for credentials; a foreign Host is refused; the
    workers' user writes experiments but is no administrator."""
    search = "/api/2.0/mlflow/experiments/search?max_results=5"
    assert request(url, search, host="mlflow:5000")[0] == 401  # no credentials
    assert request(url, search, host="mlflow:5000", auth=(worker[0], worker[1] + "x"))[0] == 401
    assert request(url, search, host="mlflow:5000", auth=worker)[0] == 200
    assert request(url, search, host="mlflow:5000", auth=admin)[0] == 200
    assert request(url, search, host="mlflow", auth=worker)[0] == 200
    assert request(url, search, host=url.removeprefix("http://"), auth=worker)[0] == 200  # the published port
    for foreign in ("evil.example.org", "evil.example.org:5000", "mlflow.evil.example.org:5000"):
        assert request(url, search, host=foreign, auth=worker)[0] == 403, foreign  # DNS-rebinding guard

    status, data, _ = request(url, "/api/2.0/mlflow/users/current", host="mlflow:5000", auth=worker)
    assert status == 200 and json.loads(data)["user"] == {
        **json.loads(data)["user"],
        "username": worker[0],
        "is_admin": False,
    }
    new_user = {"username": f"u{uuid.uuid4().hex[:6]}", "password": uuid.uuid4().hex}
    assert (
        request(url, "/api/2.0/mlflow/users/create", host="mlflow:5000", auth=worker, method="POST", body=new_user)[0]
        == 403
    )
    status, data, _ = request(
        url, "/api/2.0/mlflow/experiments/create", host="mlflow:5000", auth=worker, method="POST",
        body={"name": f"written-by-ray-{uuid.uuid4().hex[:6]}"},
    )  # fmt: skip
    assert status == 200, data
    experiment = json.loads(data)["experiment_id"]
    status, data, _ = request(
        url, "/api/2.0/mlflow/runs/create", host="mlflow:5000", auth=worker, method="POST",
        body={"experiment_id": experiment, "start_time": int(time.time() * 1000)},
    )  # fmt: skip
    assert status == 200, data
    run = json.loads(data)["run"]["info"]["run_id"]
    metric = {"run_id": run, "key": "val_loss", "value": 1.5, "timestamp": int(time.time() * 1000), "step": 1}
    assert (
        request(url, "/api/2.0/mlflow/runs/log-metric", host="mlflow:5000", auth=worker, method="POST", body=metric)[0]
        == 200
    )


@pytest.fixture(scope="module")
def compose_mlflow(deployment, tmp_path_factory):
    values, services, prefix = deployment
    svc = services["mlflow"]
    with started_mlflow(compose_argv(svc), compose_env(svc), prefix, tmp_path_factory.mktemp("mlflow")) as url:
        yield url


def test_mlflow_as_compose_starts_it_serves_its_service_name_with_credentials(deployment, compose_mlflow):
    values, _, _ = deployment
    admin = (values["MLFLOW_ADMIN_USERNAME"], values["MLFLOW_ADMIN_PASSWORD"])
    worker = (values["MLFLOW_TRACKING_USERNAME"], values["MLFLOW_TRACKING_PASSWORD"])
    check_mlflow(compose_mlflow, admin, worker)
    secrets_ = [values[k] for k in ("MLFLOW_DB_PASSWORD", "MLFLOW_ADMIN_PASSWORD", "MLFLOW_TRACKING_PASSWORD")]
    assert command_lines_showing(*secrets_) == []  # the server's processes hold them in their environment only


def test_mlflow_as_the_kuberay_manifests_start_it_and_a_rotated_worker_password(tmp_path):
    values = env_values()  # the Secret ablate-secrets, made --from-env-file=.env
    containers = k8s_containers()
    admin = (values["MLFLOW_ADMIN_USERNAME"], values["MLFLOW_ADMIN_PASSWORD"])
    worker = (values["MLFLOW_TRACKING_USERNAME"], values["MLFLOW_TRACKING_PASSWORD"])
    with roles_and_databases(k8s_env(containers["postgres"], values)) as prefix:
        mlflow = containers["mlflow"]
        argv = k8s_argv(mlflow)
        with started_mlflow(argv, k8s_env(mlflow, values), prefix, tmp_path / "first") as url:
            check_mlflow(url, admin, worker)
        # each server worker remembers the credentials it checked for a minute (MLflow's auth cache; a scrypt
        # hash per request otherwise): the key as MLflow's config reader reads it from the file the entrypoint wrote
        ini = configparser.ConfigParser()
        ini.read(tmp_path / "first" / "basic_auth.ini")
        assert ini.getint("mlflow", "auth_cache_ttl_seconds", fallback=0) == 60
        # rotation: a new password in the Secret, MLflow restarted; the old one stops working
        rotated = {**values, "MLFLOW_TRACKING_PASSWORD": "rotated-" + uuid.uuid4().hex}
        with started_mlflow(argv, k8s_env(mlflow, rotated), prefix, tmp_path / "second") as url:
            search = "/api/2.0/mlflow/experiments/search?max_results=1"
            assert request(url, search, host="mlflow:5000", auth=worker)[0] == 401
            assert (
                request(url, search, host="mlflow:5000", auth=(worker[0], rotated["MLFLOW_TRACKING_PASSWORD"]))[0]
                == 200
            )
            assert request(url, search, host="mlflow:5000", auth=admin)[0] == 200


# --- optuna-dashboard behind MLflow's credentials ----------------------------------------------------------------


def test_optuna_dashboard_as_compose_starts_it_asks_for_mlflow_credentials(deployment, compose_mlflow, tmp_path):
    values, services, prefix = deployment
    svc = services["optuna-dashboard"]
    env = compose_env(svc)
    assert env["MLFLOW_TRACKING_URI"] == "http://mlflow:5000" and env["OPTUNA_DASHBOARD_HOST"] == "0.0.0.0"
    port = free_port()
    translated = {
        **env,
        "OPTUNA_STORAGE": local_database_url(env["OPTUNA_STORAGE"], prefix),
        "MLFLOW_TRACKING_URI": compose_mlflow,  # the service name mlflow:5000, here
        "OPTUNA_DASHBOARD_HOST": "127.0.0.1",
        "OPTUNA_DASHBOARD_PORT": str(port),
        "PYTHON": sys.executable,
    }
    base = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "OPTUNA_"))}
    log = open(tmp_path / "dashboard.log", "w")  # noqa: SIM115  (closed in finally)
    proc = subprocess.Popen(
        on_this_machine(compose_argv(svc)),
        env={**base, **translated},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        cwd=tmp_path,
    )
    url = f"http://127.0.0.1:{port}"
    admin = (values["MLFLOW_ADMIN_USERNAME"], values["MLFLOW_ADMIN_PASSWORD"])
    worker = (values["MLFLOW_TRACKING_USERNAME"], values["MLFLOW_TRACKING_PASSWORD"])
    try:
        wait_for_answer(url, proc)
        status, _, headers = request(url, "/api/studies")
        assert status == 401 and headers.get("WWW-Authenticate", "").startswith("Basic")
        assert request(url, "/api/studies", auth=(worker[0], "not-the-password"))[0] == 401
        assert request(url, "/", auth=worker)[0] == 200
        status, data, _ = request(url, "/api/studies", auth=worker)
        assert status == 200 and json.loads(data) == {"study_summaries": []}
        study = {"study_name": f"made-in-the-dashboard-{uuid.uuid4().hex[:6]}", "directions": ["minimize"]}
        assert request(url, "/api/studies", auth=worker, method="POST", body=study)[0] == 403  # looks only
        cross = {"Origin": "http://evil.example.org"}
        assert request(url, "/api/studies", auth=admin, method="POST", body=study, headers=cross)[0] == 403
        assert request(url, "/api/studies", auth=admin, method="POST", body=study)[0] == 201
        status, data, _ = request(url, "/api/studies", auth=worker)
        assert [s["study_name"] for s in json.loads(data)["study_summaries"]] == [study["study_name"]]
        assert values["OPTUNA_DB_PASSWORD"] not in (tmp_path / "dashboard.log").read_text()
        assert command_lines_showing(values["OPTUNA_DB_PASSWORD"]) == []
    finally:
        stop(proc)
        log.close()


# --- Ray: the head as compose starts it requires the token --------------------------------------------------------


def grpc_status(port: int, method: str, request_bytes: bytes, token: str | None) -> str:
    import grpc

    metadata = [("authorization", f"Bearer {token}")] if token is not None else None
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary(method, request_serializer=lambda b: b, response_deserializer=lambda b: b)
        try:
            call(request_bytes, metadata=metadata, timeout=20)
            return "OK"
        except grpc.RpcError as err:
            return err.code().name


def test_the_ray_head_as_compose_starts_it_requires_the_token(deployment, tmp_path):
    from ray.core.generated import ray_client_pb2

    values, services, _ = deployment
    svc = services["ray-head"]
    env = compose_env(svc)
    token = values["RAY_AUTH_TOKEN"]
    assert env["RAY_AUTH_MODE"] == "token" and env["RAY_AUTH_TOKEN"] == token
    gcs, client, dashboard, *extra = free_ports(11)
    ports = {"--port": gcs, "--ray-client-server-port": client, "--dashboard-port": dashboard}
    argv = []
    for word in on_this_machine(compose_argv(svc)):
        flag, _, value = word.partition("=")
        if flag in ports:
            word = f"{flag}={ports[flag]}"
        elif flag == "--dashboard-host":
            assert value == "0.0.0.0"  # inside its container, for the published port: 127.0.0.1 here
            word = f"{flag}=127.0.0.1"
        argv.append(word)
    assert "--block" in argv and f"--port={gcs}" in argv and f"--ray-client-server-port={client}" in argv
    temp_dir = tempfile.mkdtemp(prefix="abl-tok-", dir="/tmp")  # Unix socket paths must stay short
    argv += [
        "--node-ip-address=127.0.0.1",
        f"--temp-dir={temp_dir}",
        "--num-gpus=0",
        "--disable-usage-stats",
        f"--node-manager-port={extra[0]}",
        f"--object-manager-port={extra[1]}",
        f"--dashboard-agent-grpc-port={extra[2]}",
        f"--dashboard-agent-listen-port={extra[3]}",
        f"--runtime-env-agent-port={extra[4]}",
        f"--metrics-export-port={extra[5]}",
    ]
    loopback = {  # keeps every listener on 127.0.0.1 (tests/ray_nodes.py); then the compose environment
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_enable_metrics_collection": "0",
        "AUTOSCALER_METRIC_PORT": str(extra[6]),
        "DASHBOARD_METRIC_PORT": str(extra[7]),
    }
    log = open(tmp_path / "ray-head.log", "w")  # noqa: SIM115  (closed in finally)
    head = subprocess.Popen(
        argv, env={**os.environ, **loopback, **env}, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    jobs = f"http://127.0.0.1:{dashboard}/api/jobs/"
    try:
        wait_for_http(f"http://127.0.0.1:{dashboard}/api/gcs_healthz", timeout=90, proc=head)  # public
        # the job API (dashboard port)
        assert request(jobs, "")[0] == 401
        assert request(jobs, "", headers={"Authorization": "Bearer not-the-token"})[0] == 403
        assert request(jobs, "", headers={"Authorization": f"Bearer {token}"})[0] == 200
        assert command_lines_showing(token) == []
        # the client port and the GCS
        ping = ray_client_pb2.ClusterInfoRequest(type=ray_client_pb2.ClusterInfoType.PING).SerializeToString()
        for port, method, body in (
            (client, "/ray.rpc.RayletDriver/ClusterInfo", ping),
            (gcs, "/ray.rpc.NodeInfoGcsService/GetAllNodeInfo", b""),
        ):
            assert grpc_status(port, method, body, None) == "UNAUTHENTICATED", method
            assert grpc_status(port, method, body, "not-the-token") == "UNAUTHENTICATED", method
            assert grpc_status(port, method, body, token) == "OK", method
        # a real driver with the token joins as the ablate container does (RAY_ADDRESS=ray-head:6379)
        code = "import ray, sys; ray.init(sys.argv[1], logging_level='error'); print(ray.get(ray.remote(lambda: 6 * 7).remote()))"
        # (without it, the same driver waits for its connection timeout: the probes above say why, at once)
        out = subprocess.run(
            [sys.executable, "-c", code, f"127.0.0.1:{gcs}"],
            env={**os.environ, **loopback, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token, "HOME": temp_dir},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0 and out.stdout.strip().endswith("42"), out.stderr[-2000:]
    finally:
        head.send_signal(signal.SIGTERM)  # `ray start --block` stops its node's processes
        with contextlib.suppress(subprocess.TimeoutExpired):
            head.wait(timeout=30)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(head.pid, signal.SIGKILL)  # anything left of the group
        log.close()
        shutil.rmtree(temp_dir, ignore_errors=True)


# --- the whole topology ----------------------------------------------------------------------------------------
#
# One sweep and one search through the compose topology, as a user on the cluster runs them (the ``ablate`` CLI
# with ``--address``), with the roles' credentials; then every output and record is searched for the passwords
# (issue 19, item 3): the commands' stdout and stderr (their error paths too: stores that cannot be reached), every
# file they, Ray's nodes and Ray Tune wrote (.ablate/, the nodes' session logs, Ray Tune's results, MLflow's
# artifacts) and a dump of the MLflow and Optuna databases (params, tags, run names, Optuna attributes). The nodes
# do not know the credentials: the driver hands them to the trials in their arguments (record.secrets.Credentials),
# the likeliest place for a leak. The masking (record/secrets.py) is applied where ablations/ prints or records.

BASE = {
    "task": {"name": "reverse", "train_size": 200, "max_len": 5},
    "model": {"d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32},
    "training": {"max_steps": 20, "val_every": 10, "batch_size": 16},
}


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
        found += lines(f"{folder.name}/{path.relative_to(folder)}", text)
    return found


def test_a_study_and_a_search_through_the_topology_with_the_roles_credentials_print_and_record_no_password(
    deployment, compose_mlflow, tmp_path, own_ray
):
    import optuna
    from mlflow import MlflowClient

    from record import vocabulary
    from tests.ray_nodes import ray_cluster

    values, services, prefix = deployment
    cli_env = compose_env(services["ablate"])  # what the CLI container gets
    user, password = cli_env["MLFLOW_TRACKING_USERNAME"], cli_env["MLFLOW_TRACKING_PASSWORD"]
    storage = local_database_url(cli_env["ABLATE_OPTUNA_STORAGE"], prefix)  # postgresql://optuna...:PW@ (the role)
    assert values["OPTUNA_DB_PASSWORD"] in storage
    needles = {
        "MLflow password": password,
        "PostgreSQL password of optuna": values["OPTUNA_DB_PASSWORD"],
        "MLflow admin password": values["MLFLOW_ADMIN_PASSWORD"],
    }
    url = compose_mlflow
    host = url.removeprefix("http://")
    work, short_tmp = tmp_path / "work", Path(tempfile.mkdtemp(prefix="abl-top-", dir="/tmp"))  # Ray: short paths
    work.mkdir()
    study = {"name": "deployed", "base": BASE, "seeds": 2, "design": {"grid": {"model.norm": ["pre", "post"]}}}
    (work / "study.yaml").write_text(yaml.safe_dump(study))
    search = {
        "name": "deployed_search",
        "base": BASE,
        "n_trials": 2,
        "concurrency": 2,
        "pruner": "none",
        "sampler": "random",
        "space": {"training.lr": {"type": "float", "low": 1e-4, "high": 1e-2, "log": True}},
    }
    (work / "search.yaml").write_text(yaml.safe_dump(search))
    # the cluster's nodes, and the sweep, know no credentials (the sweep's are in its tracking URI)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("MLFLOW_", "ABLATE_OPTUNA", "ABLATE_RAY_STORAGE", "RAY_ADDRESS"))
    }
    env.update(TMPDIR=str(short_tmp), MLFLOW_HTTP_REQUEST_MAX_RETRIES="0", MLFLOW_HTTP_REQUEST_TIMEOUT="30")
    with_mlflow_env = {**env, "MLFLOW_TRACKING_USERNAME": user, "MLFLOW_TRACKING_PASSWORD": password}
    outputs: dict[str, str] = {}
    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(_environment(env))
            cluster = stack.enter_context(ray_cluster(tmp_path, nodes=2, cpus_per_node=1, dashboard=False))
            on = ["--address", cluster.address]
            runs = {
                # the tracking URI carries the password (no MLFLOW_TRACKING_* in the environment)
                "sweep": (["sweep", "study.yaml", "--tracking-uri", f"http://{user}:{password}@{host}", *on], env),
                # the storage URL carries the PostgreSQL password; MLflow's comes from the environment
                "search": (
                    ["search", "search.yaml", "--storage", storage, "--tracking-uri", url, *on],
                    with_mlflow_env,
                ),
                # error paths: stores that cannot be reached, named with their passwords
                "sweep, unreachable tracking": (
                    ["sweep", "study.yaml", "--tracking-uri", f"http://{user}:{password}@127.0.0.1:9", *on],
                    env,
                ),
                "search, unreachable storage": (
                    ["search", "search.yaml", "--storage", storage.replace("127.0.0.1:5432", "127.0.0.1:9"), *on]
                    + ["--tracking-uri", url],
                    with_mlflow_env,
                ),
            }
            for name, (args, run_env) in runs.items():
                out = subprocess.run(
                    [sys.executable, "-m", "ablate", *args],
                    cwd=work, env=run_env, capture_output=True, text=True, timeout=600,
                )  # fmt: skip
                outputs[f"{name}: stdout"], outputs[f"{name}: stderr"] = out.stdout, out.stderr
                if "unreachable" in name:
                    assert out.returncode != 0, f"{name} should fail:\n{out.stdout[-2000:]}"
                else:
                    assert out.returncode == 0, f"{name} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
            # the nodes' session logs, before the cluster's temp folder goes
            found = where_found(needles, {}, Path(cluster.temp_dir))
        # the records, as the workers' user reads them
        with _environment({"MLFLOW_TRACKING_USERNAME": user, "MLFLOW_TRACKING_PASSWORD": password}):
            # this server refuses (403) a run it does not know instead of saying it has none: a claim done for such
            # a run keeps its write window (ablations.sweep.driver._still_pending); only "no such run" reopens it
            c = MlflowClient(url)
            cells = c.search_runs([c.get_experiment_by_name("deployed").experiment_id], "tags.kind = 'cell'")
            assert len(cells) == 4 and all(r.info.status == "FINISHED" for r in cells)
            assert not vocabulary.run_missing(url, "0" * 32) and not vocabulary.run_missing(url, cells[0].info.run_id)
            assert "config.yaml" in {a.path for a in c.list_artifacts(cells[0].info.run_id)}  # served artifacts
        wrong = {"MLFLOW_TRACKING_USERNAME": user, "MLFLOW_TRACKING_PASSWORD": "wrong-password-123"}
        with _environment(wrong), pytest.raises(Exception, match="401|Unauthorized|credentials"):
            MlflowClient(url).search_experiments()
        trials = optuna.load_study(study_name="deployed_search", storage=storage).trials
        assert len(trials) == 2 and all(t.state.name == "COMPLETE" for t in trials)
        # everything MLflow and Optuna stored, as PostgreSQL holds it
        for db in ("mlflow", "mlflow_auth", "optuna"):
            dump = subprocess.run(
                ["pg_dump", "--data-only", "-h", "127.0.0.1", "-U", "postgres", f"{prefix}{db}"],
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert dump.returncode == 0, dump.stderr
            outputs[f"database {db}"] = dump.stdout
        assert "deployed" in outputs["database mlflow"] and "deployed_search" in outputs["database optuna"]
        found += where_found(needles, outputs, tmp_path) + where_found(needles, {}, short_tmp)
        assert not found, "secrets printed or recorded:\n" + "\n".join(found)
    finally:
        shutil.rmtree(short_tmp, ignore_errors=True)
        with contextlib.suppress(Exception):
            optuna.delete_study(study_name="deployed_search", storage=storage)


@contextlib.contextmanager
def _environment(values: dict[str, str]):
    """This process's environment replaced by ``values`` for MLFLOW_* and ABLATE_OPTUNA* (the nodes Ray starts
    from here inherit it), then given back."""
    saved = dict(os.environ)
    for k in [k for k in os.environ if k.startswith(("MLFLOW_", "ABLATE_OPTUNA"))]:
        del os.environ[k]
    os.environ.update({k: v for k, v in values.items() if k.startswith(("MLFLOW_", "ABLATE_OPTUNA"))})
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)
