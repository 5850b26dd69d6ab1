"""A tracking store that cannot be reached is named in one line before any work, by every command that uses one
(MLflow's client retried a refused port for 4 minutes and a PostgreSQL server for 1.5, then printed a
traceback); a dry run creates no store, on SQLite or on PostgreSQL (MLflow makes its tables in any database it
opens)."""

from __future__ import annotations

import http.server
import threading

import pytest
import sqlalchemy

from ablate.main import main
from ablations import stores
from tests.conftest import ROOT, free_port, postgres_reachable

STUDY = str(ROOT / "ablations" / "studies" / "quickstart.yaml")
SEARCH = str(ROOT / "ablations" / "searches" / "quickstart_lr.yaml")
RUN = str(ROOT / "ablations" / "runs" / "quickstart.yaml")
COMMANDS = [
    ["sweep", STUDY],
    ["sweep", STUDY, "--dry-run"],
    ["search", SEARCH],
    ["search", SEARCH, "--dry-run"],
    ["run", RUN],
    ["report", "quickstart"],
    ["compare", "quickstart", "quickstart"],
    ["heads", "quickstart"],
    ["ui", "quickstart"],
]


@pytest.fixture
def credentials_restored(monkeypatch):
    """The CLI moves a URL's credentials into MLFLOW_TRACKING_USERNAME/PASSWORD of this process: put back after."""
    for name in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_URI"):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(a for a in c if "/" not in a))
def test_a_server_that_does_not_answer_is_named_before_any_work(command, capsys, credentials_restored):
    port = free_port()  # nothing listens there
    assert main([*command, "--tracking-uri", f"http://alice:s3cret-pw@127.0.0.1:{port}"]) == 1
    out, err = capsys.readouterr()
    assert err.splitlines() == [
        f"error: http://127.0.0.1:{port}: the MLflow server does not answer (Connection refused): start it, or name "
        "the right one (--tracking-uri, MLFLOW_TRACKING_URI)"
    ]
    assert out == "" and "s3cret-pw" not in err


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(a for a in c if "/" not in a))
def test_a_scheme_no_mlflow_store_takes_is_one_line_with_the_nearest(command, capsys, tmp_path, monkeypatch):
    """`--tracking-uri sqllite:///...` passed every check and ended in MLflow's traceback
    (UnsupportedModelRegistryStoreURIException) once the command opened the store."""
    monkeypatch.chdir(tmp_path)
    assert main([*command, "--tracking-uri", f"sqllite:///{tmp_path / 'mlflow.db'}"]) == 1
    out, err = capsys.readouterr()
    (line,) = err.splitlines()  # one line: the scheme, the nearest one, MLflow's list (its version's), the fix
    assert line.startswith(
        f"error: sqllite:///{tmp_path / 'mlflow.db'}: MLflow has no store for the scheme 'sqllite' (did you mean "
        "sqlite:?); it takes "
    )
    assert "postgresql, mysql, sqlite" in line and line.endswith(
        ": name the right one (--tracking-uri, MLFLOW_TRACKING_URI)"
    )
    assert out == "" and sorted(p.name for p in tmp_path.iterdir()) == []  # before any work: nothing written


def test_a_uri_mlflow_refuses_in_its_own_words_is_one_line():
    assert stores.store_problem("postgres://u@127.0.0.1/db").startswith(
        "postgres://u@127.0.0.1/db: MLflow has no store for the scheme 'postgres' (did you mean postgresql:?)"
    )
    said = stores.store_problem("uc")  # a scheme MLflow knows and refuses with its own reason
    assert said.startswith("uc: Detected Unity Catalog tracking URI 'uc'") and "\n" not in said
    assert stores.store_problem("databricks") is None  # one it takes: MLflow's to judge


def _serving(status: int):
    """A server that is not MLflow's, answering every GET with ``status`` (a redirect to nowhere for 302)."""

    class Answer(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(status)
            self.send_header("Location", f"http://127.0.0.1:{free_port()}/login")  # followed, it would refuse
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.mark.parametrize(("status", "answers"), [(404, True), (401, True), (302, True), (502, False), (503, False)])
def test_an_http_answer_is_a_server_unless_a_proxy_says_its_server_is_down(status, answers):
    """Whether it is MLflow, and takes the credentials, is MLflow's client's to say; but 502-504 (a proxy whose
    MLflow is down) are what MLflow's client retries for minutes, and a redirect (an identity provider's login) is
    not followed."""
    server = _serving(status)
    try:
        uri = f"http://127.0.0.1:{server.server_address[1]}"
        said = stores.store_problem(uri)
        if answers:
            assert said is None
        else:
            assert said == (
                f"{uri}: the MLflow server does not answer (HTTP {status} from what stands before it): start it, or "
                "name the right one (--tracking-uri, MLFLOW_TRACKING_URI)"
            )
    finally:
        server.shutdown()
        server.server_close()


def test_a_database_that_refuses_says_why_and_what_to_do(capsys, credentials_restored):
    port = free_port()
    fix = "name the right one (--tracking-uri, MLFLOW_TRACKING_URI)"
    # through the CLI: a database's URL keeps its user and password (MLflow's SQL store logs in with them, so they
    # stay in the URL: only a server's go to MLFLOW_TRACKING_*); the password is masked in what is printed
    assert (
        main(["report", "x", "--tracking-uri", f"postgresql+psycopg://ablate:s3cret-pw@127.0.0.1:{port}/mlflow"]) == 1
    )
    assert capsys.readouterr().err == (
        f"error: postgresql+psycopg://ablate:***@127.0.0.1:{port}/mlflow: the database cannot be reached (connection "
        f'to server at "127.0.0.1", port {port} failed: Connection refused): start it, or {fix}\n'
    )
    assert stores.store_problem(f"mysql://u@127.0.0.1:{port}/x") == (
        f"mysql://u@127.0.0.1:{port}/x: the database cannot be opened: its driver is not installed (No module named "
        f"'MySQLdb'): install it, or {fix}"
    )
    assert "cannot be opened (" in stores.store_problem("postgresql://u@h:abc/db")  # a port that is not a number
    assert stores.store_problem("sqlite:////no/such/folder/mlflow.db") is None  # this machine's file: MLflow's
    if postgres_reachable():
        said = stores.store_problem("postgresql+psycopg://postgres@127.0.0.1:5432/ablate_no_such_database")
        assert 'database "ablate_no_such_database" does not exist): create it, or ' in said, said


def test_a_dry_run_on_a_new_database_writes_nothing(new_database, capsys, tmp_path):
    """`ablate sweep --dry-run` on a database MLflow has not used: every cell to train, and no table made (MLflow
    migrates a database it opens: the dry run made its 40 tables in an empty PostgreSQL database)."""
    assert main(["sweep", STUDY, "--dry-run", "--tracking-uri", new_database]) == 0
    assert "(no store yet at " in capsys.readouterr().out
    file = stores.sqlite_file(new_database)
    if file is not None:
        assert not file.exists()
        return
    engine = sqlalchemy.create_engine(new_database)
    try:
        with engine.connect() as connection:
            assert sqlalchemy.inspect(connection).get_table_names() == []
    finally:
        engine.dispose()


@pytest.mark.parametrize("dry_run", [False, True], ids=["search", "search --dry-run"])
def test_an_optuna_storage_that_cannot_be_reached_is_one_line(dry_run, capsys, tmp_path, monkeypatch):
    """The search's storage, as the tracking store: the refusal in one line, no traceback, the password hidden."""
    monkeypatch.chdir(tmp_path)  # the embedded MLflow store: here, not in the repository
    port = free_port()
    url = f"postgresql+psycopg://optuna:s3cret-pw@127.0.0.1:{port}/optuna"
    code = main(["search", SEARCH, "--storage", url, *(["--dry-run"] if dry_run else [])])
    err = capsys.readouterr().err
    assert code == (1 if dry_run else 2)
    assert err.splitlines() == [
        f"error: the Optuna storage postgresql+psycopg://optuna:***@127.0.0.1:{port}/optuna cannot be reached "
        f'(connection to server at "127.0.0.1", port {port} failed: Connection refused): start it, or name the right '
        "one (--storage, ABLATE_OPTUNA_STORAGE)"
    ]


@pytest.mark.parametrize("command", [["sweep", STUDY], ["search", SEARCH], ["search", SEARCH, "--dry-run"]])
@pytest.mark.parametrize("address", ["127.0.0.1:{port}", "ray://127.0.0.1:{port}"])
def test_a_ray_address_where_nothing_listens_is_one_line(command, address, capsys, tmp_path, monkeypatch):
    """Ray's driver waited 5 min 30 s for 127.0.0.1:9, printing C++ warnings; the sweep then said only that it did
    not finish. Now: one line, exit 2 (1 from a dry run, as its other refusals), nothing written."""
    monkeypatch.chdir(tmp_path)
    address = address.format(port=free_port())
    code = main([*command, "--address", address, "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"])
    err = capsys.readouterr().err
    assert code == (1 if "--dry-run" in command else 2)
    assert err.splitlines()[-1] == (
        f"error: no Ray cluster answers at {address} (Connection refused): start it (ray start --head), or name the "
        "right one (--address, RAY_ADDRESS)"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", [["report", "quickstart"], ["compare", "a", "b"], ["heads", "quickstart"]])
def test_a_command_that_reads_makes_no_store_where_there_is_none(command, capsys, tmp_path, monkeypatch):
    """`ablate report` in a folder with nothing recorded said "no study 'quickstart' ...; studies there: none" and
    left an empty 1 MB store in .ablate/, which `ablate ui` then served as if it were the user's."""
    monkeypatch.chdir(tmp_path)
    assert main(command) == 2
    assert capsys.readouterr().err.startswith(f"error: nothing recorded at sqlite:///{tmp_path}/.ablate/mlflow.db yet")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_path_a_file_that_is_not_a_database_or_optuna_s_database_is_not_taken_for_a_store(tmp_path):
    """MLflow read a path as its retired file store ("maintenance mode ... migrate-filestore"), printed a
    traceback for a file that is not a database, and would add its tables to Optuna's (both keep their schema's
    version in alembic_version)."""
    import optuna

    (tmp_path / "runs").mkdir()
    assert stores.store_problem(str(tmp_path / "mlflow.db")) == (
        f"{tmp_path / 'mlflow.db'}: a path, not a tracking URI: give sqlite:///{tmp_path / 'mlflow.db'} for a SQLite "
        "store, or http://HOST:PORT"
    )
    assert stores.store_problem(str(tmp_path / "runs")).startswith(
        f"{tmp_path / 'runs'}: a folder, not a tracking URI: give sqlite:///{tmp_path / 'runs' / 'mlflow.db'}"
    )
    (tmp_path / "notes.db").write_text("not a database " * 100)
    assert "the file cannot be read as a database (file is not a database)" in stores.store_problem(
        f"sqlite:///{tmp_path / 'notes.db'}"
    )
    optuna.create_study(study_name="s", storage=f"sqlite:///{tmp_path / 'optuna.db'}")
    said = stores.store_problem(f"sqlite:///{tmp_path / 'optuna.db'}")
    assert said.endswith("is another program's database (Optuna's, or another Alembic user's), not an MLflow store: "
                         "name the right one (--tracking-uri, MLFLOW_TRACKING_URI)")  # fmt: skip
    assert stores.store_problem("databricks") is None  # MLflow's own schemes are MLflow's to judge
    assert stores.store_problem(f"file:{tmp_path / 'mlflow.db'}").endswith(f"give sqlite:///{tmp_path / 'mlflow.db'} "
                                                                       "for a SQLite store, or http://HOST:PORT")  # fmt: skip


def test_a_dashboard_address_given_for_the_cluster_s_is_named_as_such():
    """Ray's docs set RAY_ADDRESS=http://127.0.0.1:8265 for `ray job submit`: it is not the cluster's address."""
    from ablations.cluster import check_answers

    with pytest.raises(ValueError, match=r"^http://127.0.0.1:8265 is an address of Ray's dashboard .* host:6379"):
        check_answers("http://127.0.0.1:8265")


def test_with_store_wait_a_store_that_comes_up_in_time_is_used(monkeypatch, capsys):
    """ABLATE_STORE_WAIT: a job started beside its MLflow server waits for it (MLflow's own retries did), and one
    that never comes is named after the wait; without it, the answer is at once (the tests above)."""
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    monkeypatch.setenv("ABLATE_STORE_WAIT", "30")
    server: list = []

    def come_up():  # the server starts a second after the command, between two of its polls (every 2 s)
        import time

        time.sleep(1)

        class Up(http.server.BaseHTTPRequestHandler):  # noqa: E306
            def do_GET(self):  # noqa: N802
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        server.append(http.server.ThreadingHTTPServer(("127.0.0.1", port), Up))
        server[0].serve_forever()

    thread = threading.Thread(target=come_up, daemon=True)
    thread.start()
    try:
        assert stores.usable(uri) is None
        assert capsys.readouterr().err.startswith(
            f"waiting up to 30 s (ABLATE_STORE_WAIT) for the tracking store: {uri}"
        )
    finally:
        for _ in range(50):  # the server is up (or the thread gone), then stopped: nothing serves on after the test
            if server or not thread.is_alive():
                break
            thread.join(timeout=0.1)
        if server:
            server[0].shutdown()  # returns once serve_forever has (the thread then ends)
            server[0].server_close()
        thread.join(timeout=5)
    monkeypatch.setenv("ABLATE_STORE_WAIT", "1")
    assert "does not answer (Connection refused)" in stores.usable(f"http://127.0.0.1:{free_port()}")
    capsys.readouterr()
    # the value is judged whether or not the store answers, and before any wait: not a number, below 0, for ever
    for text in ("soon", "nan", "-5", "1e9", "inf"):
        monkeypatch.setenv("ABLATE_STORE_WAIT", text)
        assert stores.usable("databricks") == (
            f"ABLATE_STORE_WAIT={text!r} is not a number of seconds from 0 to 86400: give one (120), or unset it"
        )
    assert capsys.readouterr().err == ""  # nothing said of waiting


def test_a_database_still_starting_up_is_waited_for():
    """PostgreSQL answers "the database system is starting up" while it starts: the job started beside it is
    what ABLATE_STORE_WAIT is for, but that answer read as "cannot be opened ...: check it", never waited for."""
    starting = stores.refusal(Exception("connection failed: FATAL:  the database system is starting up"))
    assert starting == (
        "is not ready (FATAL:  the database system is starting up): wait for it (ABLATE_STORE_WAIT waits for the "
        "tracking store)"
    )
    assert any(word in f"the database {starting}" for word in stores.WAIT_FOR)
    assert not any(word in stores.refusal(Exception('FATAL:  role "x" does not exist')) for word in stores.WAIT_FOR)


def test_a_bare_folder_name_is_a_path_and_the_file_store_is_kept_when_the_user_says_so(tmp_path, monkeypatch):
    """`--tracking-uri mlruns` got MLflow's "maintenance mode" traceback (only ./mlruns was caught); a user who
    kept the file store on purpose (MLFLOW_ALLOW_FILE_STORE=true, MLflow's own switch) was refused it."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mlruns").mkdir()
    assert stores.store_problem("mlruns").startswith(f"mlruns: a folder, not a tracking URI: give sqlite:///{tmp_path}")
    assert stores.store_problem("runs.db").startswith("runs.db: a path, not a tracking URI")
    assert stores.store_problem("databricks") is None  # MLflow's own scheme-only URIs are not paths
    said = stores.store_problem("databricks-uc")  # nor this one, which MLflow 3 refuses as a tracking URI, in its words
    assert "a path" not in said and said.startswith("databricks-uc: Detected Unity Catalog tracking URI")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    assert stores.store_problem("mlruns") is None and stores.store_problem(f"file:{tmp_path / 'mlruns'}") is None


def test_an_optuna_storage_whose_driver_is_not_installed_is_one_line(capsys, tmp_path, monkeypatch):
    """MySQL without its driver: the search and `ablate ui --optuna` ended in a ModuleNotFoundError traceback."""
    monkeypatch.chdir(tmp_path)
    said = (
        "error: the Optuna storage mysql://u:***@127.0.0.1:1/x cannot be opened: its driver is not installed (No "
        "module named 'MySQLdb'): install it, or name the right one (--storage, ABLATE_OPTUNA_STORAGE)"
    )
    for command in (["search", SEARCH, "--storage"], ["ui", "--optuna", "--storage"]):
        assert main([*command, "mysql://u:pw@127.0.0.1:1/x"]) == 2
        assert capsys.readouterr().err.splitlines() == [said]
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_mistake_the_user_can_fix_is_said_before_what_is_outside(capsys, tmp_path, monkeypatch):
    """The tracking store was asked first, by every command: a study with a typo, against a store that is down,
    said only that the store was down (exit 1); `ui --storage` without --optuna said "nothing recorded"; a Ray
    dashboard's address with the default stores was told the cluster could not reach them."""
    monkeypatch.chdir(tmp_path)
    down = f"http://127.0.0.1:{free_port()}"
    study = tmp_path / "typo.yaml"
    study.write_text("name: t\nbase: " + str(ROOT / "ablations" / "runs" / "quickstart.yaml") + "\nseeds: 2\n"
                     "design: {grid: {model.norm: [pre, post]}}\nmetrc: test/loss\n")  # fmt: skip
    assert main(["sweep", str(study), "--tracking-uri", down]) == 2
    assert "metrc: unknown key; did you mean metric?" in capsys.readouterr().err
    assert main(["ui", "--storage", "sqlite:///o.db"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: --storage is the searches' Optuna storage: add --optuna to open optuna-dashboard on it"
    ]
    for command in (["sweep", STUDY], ["search", SEARCH]):
        assert main([*command, "--address", "http://10.0.0.5:8265"]) == 2
        assert (
            capsys.readouterr()
            .err.splitlines()[-1]
            .startswith(
                "error: http://10.0.0.5:8265 is an address of Ray's dashboard (its Jobs API), not of the cluster"
            )
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["typo.yaml"]
