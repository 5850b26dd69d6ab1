#!/bin/sh
# optuna-dashboard behind MLflow's credentials (docker-compose's `optuna-dashboard` service and the KubeRay
# manifests' Deployment; the tests run this same script as a process). Every request must carry HTTP basic
# credentials that MLflow accepts (the dashboard asks MLflow, GET /api/2.0/mlflow/users/current, and keeps a
# yes for OPTUNA_DASHBOARD_AUTH_CACHE_S seconds, 30 by default, so a changed password counts within that);
# any MLflow user may look, only MLflow administrators may change anything (create or delete studies, notes).
# Changes must come from the dashboard's own page (a request with another Origin is refused: no cross-site
# requests riding on a browser's remembered credentials). The credentials never reach optuna-dashboard.
#   OPTUNA_STORAGE          postgresql://optuna:PASSWORD@postgres:5432/optuna  (the optuna role)
#   MLFLOW_TRACKING_URI     the MLflow server that knows the users, e.g. http://mlflow:5000
#   OPTUNA_DASHBOARD_HOST   default 127.0.0.1 (the container sets 0.0.0.0); OPTUNA_DASHBOARD_PORT (8080)
set -eu
fail() { echo "optuna-dashboard: $*" >&2; exit 2; }
[ -n "${OPTUNA_STORAGE:-}" ] || fail "OPTUNA_STORAGE is not set (see .env.example)"
[ -n "${MLFLOW_TRACKING_URI:-}" ] || fail "MLFLOW_TRACKING_URI is not set: the MLflow server whose users may look"
exec "${PYTHON:-python}" - <<'PY'
import base64, hashlib, json, os, sys, threading, time, urllib.error, urllib.parse, urllib.request
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import optuna
import optuna_dashboard

MLFLOW = os.environ["MLFLOW_TRACKING_URI"].rstrip("/")
CACHE_S = float(os.environ.get("OPTUNA_DASHBOARD_AUTH_CACHE_S", "30"))
READ_ONLY = {"GET", "HEAD", "OPTIONS"}
_cache: dict[str, tuple[float, bool]] = {}  # sha256 of the Authorization header -> (valid until, is admin)
_lock = threading.Lock()


class Unavailable(Exception):
    pass


def mlflow_user(header: str) -> bool | None:
    """None: MLflow refuses these credentials; else whether they are an MLflow administrator's."""
    key = hashlib.sha256(header.encode()).hexdigest()
    now = time.monotonic()
    with _lock:
        hit = _cache.get(key)
    if hit and hit[0] > now:
        return hit[1]
    req = urllib.request.Request(f"{MLFLOW}/api/2.0/mlflow/users/current", headers={"Authorization": header})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            is_admin = bool(json.load(r)["user"].get("is_admin"))
    except urllib.error.HTTPError as err:
        if err.code in (401, 403):
            return None
        raise Unavailable(f"MLflow answered {err.code}") from None
    except (OSError, ValueError, KeyError) as err:
        raise Unavailable(type(err).__name__) from None
    with _lock:
        if len(_cache) > 1000:
            _cache.clear()
        _cache[key] = (now + CACHE_S, is_admin)
    return is_admin


def answer(start_response, status: str, text: str, challenge: bool = False):
    headers = [("Content-Type", "text/plain; charset=utf-8")]
    if challenge:
        headers.append(("WWW-Authenticate", 'Basic realm="optuna-dashboard (MLflow credentials)", charset="UTF-8"'))
    start_response(status, headers)
    return [text.encode()]


def guarded(app):
    def wrapper(environ, start_response):
        header = environ.pop("HTTP_AUTHORIZATION", "")
        if not header.startswith("Basic "):
            return answer(start_response, "401 Unauthorized", "log in with your MLflow user\n", challenge=True)
        try:
            is_admin = mlflow_user(header)
        except Unavailable as err:
            return answer(start_response, "503 Service Unavailable", f"cannot check credentials with MLflow ({err})\n")
        if is_admin is None:
            return answer(start_response, "401 Unauthorized", "MLflow refuses these credentials\n", challenge=True)
        if environ["REQUEST_METHOD"] not in READ_ONLY:
            if not is_admin:
                return answer(start_response, "403 Forbidden", "only MLflow administrators may change studies\n")
            origin = environ.get("HTTP_ORIGIN")
            if origin and urllib.parse.urlsplit(origin).netloc != environ.get("HTTP_HOST"):
                return answer(start_response, "403 Forbidden", "cross-origin change refused\n")
        return app(environ, start_response)

    return wrapper


class Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class Quiet(WSGIRequestHandler):
    def log_request(self, code="-", size="-"):  # one line per request, never a header
        sys.stderr.write(f"{self.address_string()} {self.command} {self.path.split('?')[0]} {code}\n")


# Optuna's own storage creates its tables in a new database (the dashboard alone would not, and would stop
# until the first search ran); the optuna role owns the database, so it may.
app = guarded(optuna_dashboard.wsgi(optuna.storages.RDBStorage(os.environ["OPTUNA_STORAGE"])))
host, port = os.environ.get("OPTUNA_DASHBOARD_HOST", "127.0.0.1"), int(os.environ.get("OPTUNA_DASHBOARD_PORT", "8080"))
with make_server(host, port, app, server_class=Server, handler_class=Quiet) as server:
    users = urllib.parse.urlsplit(MLFLOW).hostname
    print(f"optuna-dashboard on http://{host}:{port}, for the MLflow users of {users}", file=sys.stderr, flush=True)
    server.serve_forever()
PY
