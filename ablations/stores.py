"""Where the records live, asked before any work: is an MLflow store there yet (a dry run must not create one),
and can it be reached at all (MLflow's client retries a store that does not answer for minutes)."""

from __future__ import annotations

import os
from pathlib import Path

DATABASES = ("sqlite", "postgresql", "mysql", "mssql")  # MLflow's SQL stores (mlflow.store.db.db_types)
HOSTED = ("databricks", "databricks-uc", "uc")  # MLflow's tracking URIs of a hosted service (no "://" needed)


def database_kind(uri: str) -> str | None:
    """The kind of database a store's URI names (``postgresql+psycopg://`` -> postgresql), None for a server."""
    scheme = uri.split(":", 1)[0].split("+", 1)[0].lower() if "://" in uri else ""
    return scheme if scheme in DATABASES else None


def patiently(call, patience: float):
    """``call()``, tried again while a database raises errors of its own (a PostgreSQL restart cutting its
    connections, never a refused write or a conflict) for up to ``patience`` seconds; then the last error is raised,
    so nothing waits forever."""
    import tenacity
    from optuna.exceptions import StorageInternalError
    from sqlalchemy.exc import OperationalError

    for attempt in tenacity.Retrying(
        retry=tenacity.retry_if_exception_type((StorageInternalError, OperationalError)),
        stop=tenacity.stop_after_delay(patience),
        wait=tenacity.wait_exponential(multiplier=0.25, max=4.0),
        reraise=True,
    ):
        with attempt:
            return call()
    raise AssertionError("unreachable: tenacity reraises the last error")


def away(err: BaseException) -> str | None:
    """The one line for a database that stopped answering while a command worked (after ``patiently`` gave up),
    None for any other error."""
    from optuna.exceptions import StorageInternalError
    from sqlalchemy.exc import OperationalError

    if not isinstance(err, (OperationalError, StorageInternalError)):
        return None
    cause = getattr(err, "orig", None) or err.__cause__ or err
    words = " ".join(str(cause).split())[:300]
    return f"a database stopped answering ({words}): submit the same command again once it answers; it resumes"


def sqlite_file(url: str) -> Path | None:
    """The file of a SQLite URL, however it is spelt (``sqlite+pysqlite:///``, ``?timeout=5``); None otherwise."""
    from sqlalchemy.engine import make_url

    try:
        parsed = make_url(url)
    except Exception:  # noqa: BLE001  (not a URL SQLAlchemy reads: opening it names the problem)
        return None
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database)


def store_exists(uri: str) -> bool:
    """Whether the store holds MLflow's tables yet. False for a SQLite file not there and for a database without
    them: MLflow creates them in a database it opens, so a dry run, which writes nothing, must not open it. A
    server is there (``store_problem`` asks whether it answers)."""
    if database_kind(uri) is None:
        return True
    path = sqlite_file(uri)
    if path is not None and not path.exists():
        return False
    tables, _, refusal = tables_of(uri, 10.0)
    return refusal is not None or "experiments" in tables  # one that refuses: store_problem's to say why


def nothing_recorded(uri: str) -> str | None:
    """For a command that only reads the store (report, compare, heads, ui): a store with nothing in it yet, said
    in one line, and not made (opening it would create an empty one, which the next command would then read)."""
    from record.secrets import redact_url

    if store_exists(uri):
        return None
    return (
        f"nothing recorded at {redact_url(uri)} yet (no MLflow store there): train first (ablate sweep STUDY, "
        "ablate run RUN.yaml), or name the store that holds it (--tracking-uri, MLFLOW_TRACKING_URI)"
    )


def usable(uri: str) -> str | None:
    """``store_problem``, waited out for ABLATE_STORE_WAIT seconds (unset: not at all) where the store may yet come
    up: a job started beside its MLflow server or database, which MLflow's own retries used to ride out."""
    import math
    import sys

    import tenacity

    text = os.environ.get("ABLATE_STORE_WAIT", "").strip()
    wait = 0.0
    if text:
        try:
            wait = float(text)
        except ValueError:
            wait = math.nan
        if not (0 <= wait <= 86400):  # nan too
            return f"ABLATE_STORE_WAIT={text!r} is not a number of seconds from 0 to 86400: give one (120), or unset it"
    problem = store_problem(uri)
    if not problem or not wait or not any(w in problem for w in WAIT_FOR):
        return problem
    print(f"waiting up to {wait:g} s (ABLATE_STORE_WAIT) for the tracking store: {problem}", file=sys.stderr)
    asking = tenacity.Retrying(
        retry=tenacity.retry_if_result(bool),  # a problem: ask again
        stop=tenacity.stop_after_delay(wait),
        wait=tenacity.wait_fixed(2),
        retry_error_callback=lambda state: state.outcome.result(),  # out of time: the problem that remains
    )
    return asking(store_problem, uri)


WAIT_FOR = ("does not answer", "cannot be reached", "is not ready")  # what may yet come up: worth waiting for


def store_problem(uri: str, timeout: float = 10.0) -> str | None:
    """Why the MLflow store at ``uri`` cannot be used, in one line, or None. Asked once, before any work: MLflow's
    client retries a server that does not answer (or a proxy's 502-504) for minutes (4 minutes for a refused port,
    measured) and a database for more than one, then ends in a traceback; a path it takes for its retired file
    store; a file that is not a database, or Optuna's, it fails on or adds its tables to. Any other HTTP answer will
    do (a refusal of the credentials is MLflow's to name)."""
    from urllib.parse import urlsplit

    from record.secrets import redact_url

    kind = database_kind(uri)
    where = redact_url(uri)
    fix = "name the right one (--tracking-uri, MLFLOW_TRACKING_URI)"
    parts = urlsplit(uri)
    path_like = parts.scheme == "file" or (not parts.scheme and uri not in HOSTED)  # mlruns, ./mlruns, x.db
    if path_like and os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").strip().lower() in ("true", "1"):
        return None  # the user kept MLflow's retired file store on purpose: MLflow's to judge
    if path_like:
        path = Path(parts.path if parts.scheme else uri).expanduser().resolve()
        if path.is_dir():  # an mlruns folder: MLflow 3 refuses to open its file store
            return (
                f"{where}: a folder, not a tracking URI: give sqlite:///{path / 'mlflow.db'} for a SQLite store (a "
                "folder of MLflow's retired file store, mlruns: convert it with mlflow migrate-filestore)"
            )
        return f"{where}: a path, not a tracking URI: give sqlite:///{path} for a SQLite store, or http://HOST:PORT"
    if kind is None and parts.scheme in ("http", "https"):
        return _server_problem(uri, where, fix, timeout)
    if kind is None:
        return _scheme_problem(uri, parts.scheme, where, fix)  # databricks and other schemes: MLflow's client judges
    path = sqlite_file(uri)
    if path is not None and not path.exists():
        return None  # made on first use
    tables, version, refusal = tables_of(uri, timeout)
    if refusal is not None:
        if path is not None:  # a SQLite file: only one that is not a database (a busy one is MLflow's to wait on)
            return (
                f"{where}: the file cannot be read as a database (file is not a database): {fix}"
                if "not a database" in refusal
                else None
            )
        return f"{where}: the database {refusal}, or {fix}"
    if "experiments" not in tables and (version or "version_info" in tables):  # Optuna's: v3.2.0.a and the like
        return (
            f"{where} is another program's database (Optuna's, or another Alembic user's), not an MLflow store: {fix}"
        )
    return None


def _scheme_problem(uri: str, scheme: str, where: str, fix: str) -> str | None:
    """A URI MLflow's client refuses to open (a scheme no store of MLflow's or of a plugin takes, a typo such as
    sqllite:///): the client is built here, before any work, instead of failing later with a traceback."""
    import difflib

    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException
    from mlflow.tracking.registry import UnsupportedModelRegistryStoreURIException

    try:
        MlflowClient(uri)
    except UnsupportedModelRegistryStoreURIException as err:
        schemes = [s for s in err.supported_uri_schemes if s and s != "file"]  # its retired file store: refused above
        close = difflib.get_close_matches(scheme, schemes, n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]}:?)" if close else ""
        return f"{where}: MLflow has no store for the scheme {scheme!r}{hint}; it takes {', '.join(schemes)}: {fix}"
    except MlflowException as err:
        first = err.message.strip().splitlines()[0]
        said = ". ".join(first.split(". ")[:2]).rstrip(".")  # MLflow's first two sentences
        return f"{where}: {said}: {fix}"
    return None


def _server_problem(uri: str, where: str, fix: str, timeout: float) -> str | None:
    import requests

    try:
        answer = requests.get(uri.rstrip("/") + "/health", timeout=timeout, allow_redirects=False)
    except requests.exceptions.SSLError:  # MLflow's own TLS settings (MLFLOW_TRACKING_INSECURE_TLS...) decide
        return None
    except requests.Timeout:
        return f"{where}: the MLflow server does not answer (no answer in {timeout:g} s): start it, or {fix}"
    except requests.RequestException as err:
        return f"{where}: the MLflow server does not answer ({reason(err)}): start it, or {fix}"
    if answer.status_code in (502, 503, 504):  # a proxy whose MLflow is down: MLflow's client retries these for minutes
        return f"{where}: the MLflow server does not answer (HTTP {answer.status_code} from what stands before it): start it, or {fix}"
    return None


def tables_of(url: str, timeout: float = 10.0) -> tuple[list[str], str | None, str | None]:
    """A database's tables and Alembic revision, or why it cannot be opened (``refusal``: "cannot be reached
    (Connection refused): start it", for the caller to finish with the way to name another). The one opening of a
    database to look at it: MLflow's stores and Optuna's storages alike."""
    import sqlalchemy

    try:
        parsed = sqlalchemy.engine.make_url(url)
        psycopg = parsed.get_backend_name() == "postgresql" and parsed.get_driver_name() in ("psycopg", "psycopg2")
        engine = sqlalchemy.create_engine(url, connect_args={"connect_timeout": int(timeout)} if psycopg else {})
    except ImportError as err:  # a database whose driver is not installed (MySQLdb, pyodbc, pg8000)
        return [], None, f"cannot be opened: its driver is not installed (No module named {err.name!r}): install it"
    except Exception as err:  # noqa: BLE001  (a URL SQLAlchemy cannot read: a port that is not a number)
        return (
            [],
            None,
            f"cannot be opened ({reason(err)}): write the URL as dialect+driver://user:password@host:port/db",
        )
    try:
        with engine.connect() as connection:
            tables = sqlalchemy.inspect(connection).get_table_names()
            version = (
                connection.execute(sqlalchemy.text("SELECT version_num FROM alembic_version")).scalar()
                if "alembic_version" in tables
                else None
            )
        return tables, version, None
    except Exception as err:  # noqa: BLE001  (any driver's refusal: its first line says why)
        return [], None, refusal(err)
    finally:
        engine.dispose()


UNREACHABLE = ("connection refused", "timed out", "timeout expired", "could not translate host name", "name or service",
               "no route to host", "network is unreachable", "could not connect")  # fmt: skip


STARTING = ("is starting up", "in recovery mode", "is shutting down", "not yet accepting connections")  # PostgreSQL's


def refusal(err: BaseException) -> str:
    """Why a database refused a connection, and what to do: "cannot be reached (...): start it", "... does not
    exist ...: create it", or "cannot be opened (...): check the user and password"."""
    words = reason(err)
    low = words.lower()
    if "does not exist" in low or "unknown database" in low:
        return f"cannot be opened ({words}): create it"
    if any(w in low for w in UNREACHABLE):
        return f"cannot be reached ({words}): start it"
    if any(w in low for w in STARTING):
        return f"is not ready ({words}): wait for it (ABLATE_STORE_WAIT waits for the tracking store)"
    if "password" in low or "authentication" in low or "access denied" in low:
        return f"cannot be opened ({words}): check the user and password in the URL"
    return f"cannot be opened ({words}): check it"


def reason(err: BaseException) -> str:
    """What went wrong, in a few words: the operating system's (Connection refused), else the driver's first line."""
    seen: BaseException | None = err
    while seen is not None:
        for e in (seen, getattr(seen, "reason", None), getattr(seen, "orig", None)):
            if isinstance(e, OSError) and e.strerror:
                return e.strerror
        seen = seen.__cause__ or seen.__context__
    text = str(getattr(err, "orig", None) or err).strip().splitlines()
    first = text[0] if text else type(err).__name__
    return first.removeprefix("connection failed: ")
