#!/bin/sh
# Starts the MLflow tracking server with the basic-auth app (docker-compose's `mlflow` service and the KubeRay
# manifests' `mlflow` Deployment; the tests run this same script as a process), then makes sure the workers'
# MLflow user exists, is not an administrator, and has the password the environment gives it. Everything comes
# from the environment; nothing has a default password.
#   MLFLOW_BACKEND_STORE_URI   postgresql://mlflow:PASSWORD@postgres:5432/mlflow  (the mlflow role, not the superuser)
#   MLFLOW_AUTH_DATABASE_URI   where users and permissions live (the same role, database mlflow_auth)
#   MLFLOW_AUTH_ADMIN_USERNAME / MLFLOW_AUTH_ADMIN_PASSWORD   the administrator (created on the first start;
#                              afterwards its password must match the database's: rotate it as platform/README.md says)
#   MLFLOW_WORKER_USERNAME / MLFLOW_WORKER_PASSWORD   the user of Ray workers and the ablate CLI: created, or its
#                              password set again, on every start (rotation = change it and restart); never an admin
#   MLFLOW_FLASK_SERVER_SECRET_KEY   signs the UI's sessions
#   MLFLOW_ALLOWED_HOSTS       the Host headers served (MLflow's DNS-rebinding guard), e.g. mlflow,mlflow:5000;
#                              MLFLOW_EXTRA_ALLOWED_HOSTS adds more; localhost and 127.0.0.1 are always served
#   MLFLOW_ARTIFACTS_DESTINATION     default /mlartifacts (a volume); MLFLOW_HOST (0.0.0.0), MLFLOW_PORT (5000)
#   MLFLOW_READY_FILE          written once the users are in place (the compose health check waits for it)
#   MLFLOW_AUTH_CACHE_TTL_SECONDS   how long a server worker remembers credentials it has checked (default 60; 0:
#                              check every request). Checking one costs a scrypt hash, about 0.1 CPU-second, and
#                              a trial sends hundreds of requests; a password changed or a user deleted through
#                              MLflow's API is still accepted by the other workers for up to this long (a restart,
#                              as rotation does, forgets every credential at once)
set -eu
fail() { echo "mlflow entrypoint: $*" >&2; exit 2; }
weak() {
  case "$2" in
    password|password1234|admin|changeme|mlflow|secret) fail "$1 is a well-known default: choose another";;
  esac
  [ "${#2}" -ge 12 ] || fail "$1 must have at least 12 characters"
}
for v in MLFLOW_BACKEND_STORE_URI MLFLOW_AUTH_DATABASE_URI MLFLOW_AUTH_ADMIN_PASSWORD MLFLOW_FLASK_SERVER_SECRET_KEY; do
  eval "val=\${$v:-}"
  [ -n "$val" ] || fail "$v is not set (see .env.example)"
done
weak MLFLOW_AUTH_ADMIN_PASSWORD "$MLFLOW_AUTH_ADMIN_PASSWORD"
[ "${#MLFLOW_FLASK_SERVER_SECRET_KEY}" -ge 16 ] || fail "MLFLOW_FLASK_SERVER_SECRET_KEY must have at least 16 characters"
export MLFLOW_AUTH_ADMIN_USERNAME="${MLFLOW_AUTH_ADMIN_USERNAME:-admin}"
if [ -n "${MLFLOW_WORKER_USERNAME:-}" ] || [ -n "${MLFLOW_WORKER_PASSWORD:-}" ]; then
  [ -n "${MLFLOW_WORKER_USERNAME:-}" ] || fail "MLFLOW_WORKER_USERNAME is not set (MLFLOW_TRACKING_USERNAME in .env)"
  [ -n "${MLFLOW_WORKER_PASSWORD:-}" ] || fail "MLFLOW_WORKER_PASSWORD is not set (MLFLOW_TRACKING_PASSWORD in .env)"
  weak MLFLOW_WORKER_PASSWORD "$MLFLOW_WORKER_PASSWORD"
  [ "$MLFLOW_WORKER_USERNAME" != "$MLFLOW_AUTH_ADMIN_USERNAME" ] \
    || fail "the workers' MLflow user must not be the administrator ($MLFLOW_AUTH_ADMIN_USERNAME): give it its own name"
  [ "$MLFLOW_WORKER_PASSWORD" != "$MLFLOW_AUTH_ADMIN_PASSWORD" ] || fail "the workers' and the administrator's passwords must differ"
fi
port="${MLFLOW_PORT:-5000}"
hosts="${MLFLOW_ALLOWED_HOSTS:-}${MLFLOW_EXTRA_ALLOWED_HOSTS:+,$MLFLOW_EXTRA_ALLOWED_HOSTS}"
hosts="${hosts#,}${hosts:+,}localhost,localhost:*,127.0.0.1,127.0.0.1:*"
case ",$hosts," in *,\*,*) fail "MLFLOW_ALLOWED_HOSTS must not hold '*' (it turns off the DNS-rebinding guard): list the names";; esac
cache_ttl="${MLFLOW_AUTH_CACHE_TTL_SECONDS:-60}"
case "$cache_ttl" in
  ''|*[!0-9]*) fail "MLFLOW_AUTH_CACHE_TTL_SECONDS must be a whole number of seconds (0 checks every request): got '$cache_ttl'";;
esac
config="${MLFLOW_AUTH_CONFIG_PATH:-/tmp/mlflow-basic-auth.ini}"
ready="${MLFLOW_READY_FILE:-/tmp/mlflow-ready}"
rm -f "$ready"
umask 077
cat > "$config" <<INI
[mlflow]
default_permission = ${MLFLOW_AUTH_DEFAULT_PERMISSION:-READ}
database_uri = ${MLFLOW_AUTH_DATABASE_URI}
admin_username = ${MLFLOW_AUTH_ADMIN_USERNAME}
authorization_function = mlflow.server.auth:authenticate_request_basic_auth
auth_cache_ttl_seconds = ${cache_ttl}
INI
export MLFLOW_AUTH_CONFIG_PATH="$config"
export MLFLOW_SERVER_ENABLE_JOB_EXECUTION="${MLFLOW_SERVER_ENABLE_JOB_EXECUTION:-false}"
export MLFLOW_BACKEND_STORE_URI  # read by `mlflow server` from the environment: no password in the process list
"${PYTHON:-python}" -m mlflow server --app-name basic-auth \
  --artifacts-destination "${MLFLOW_ARTIFACTS_DESTINATION:-/mlartifacts}" \
  --allowed-hosts "$hosts" \
  --host "${MLFLOW_HOST:-0.0.0.0}" --port "$port" --workers "${MLFLOW_WORKERS:-2}" &
server=$!
trap 'kill -TERM "$server" 2>/dev/null' TERM INT

# Once the server answers: the workers' user, through MLflow's own REST API, as the administrator.
MLFLOW_SERVER_PID="$server" MLFLOW_LOCAL_URL="http://127.0.0.1:$port" "${PYTHON:-python}" - <<'PY' || { kill -TERM "$server" 2>/dev/null; wait "$server" || true; exit 2; }
import base64, json, os, sys, time, urllib.error, urllib.parse, urllib.request

url, pid = os.environ["MLFLOW_LOCAL_URL"], int(os.environ["MLFLOW_SERVER_PID"])
admin = (os.environ["MLFLOW_AUTH_ADMIN_USERNAME"], os.environ["MLFLOW_AUTH_ADMIN_PASSWORD"])
deadline = time.monotonic() + float(os.environ.get("MLFLOW_START_TIMEOUT", "300"))


def call(method, path, body=None, params=""):
    req = urllib.request.Request(f"{url}/api/2.0/mlflow/{path}{params}", method=method)
    req.add_header("Authorization", "Basic " + base64.b64encode(":".join(admin).encode()).decode())
    if body is not None:
        req.add_header("Content-Type", "application/json")
        req.data = json.dumps(body).encode()
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as err:
        return err.code, {}


while True:
    try:
        os.kill(pid, 0)
    except OSError:
        sys.exit("mlflow entrypoint: the MLflow server exited while starting (its log is above)")
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5):
            break
    except OSError:
        if time.monotonic() > deadline:
            sys.exit("mlflow entrypoint: the MLflow server did not answer in time (MLFLOW_START_TIMEOUT)")
        time.sleep(0.5)

name, password = os.environ.get("MLFLOW_WORKER_USERNAME"), os.environ.get("MLFLOW_WORKER_PASSWORD")
if name:
    status, found = call("GET", "users/get", params=f"?username={urllib.parse.quote(name)}")
    if status == 401:
        sys.exit(
            "mlflow entrypoint: MLflow refuses the administrator's password (MLFLOW_AUTH_ADMIN_PASSWORD): the "
            "database holds another one (it was changed in the UI?). Put the current one in .env, or rotate it as "
            "platform/README.md says"
        )
    if status == 404:
        status, _ = call("POST", "users/create", {"username": name, "password": password})
        action = "created"
    elif status == 200:
        status, _ = call("PATCH", "users/update-password", {"username": name, "password": password})
        if status == 200 and found["user"].get("is_admin"):
            status, _ = call("PATCH", "users/update-admin", {"username": name, "is_admin": False})
        action = "updated"
    if status != 200:
        sys.exit(f"mlflow entrypoint: could not set up the MLflow user {name!r} (HTTP {status})")
    print(f"mlflow entrypoint: MLflow user {name!r} {action} (not an administrator)", file=sys.stderr, flush=True)
PY
: > "$ready"
status=0
wait "$server" || status=$?
if kill -0 "$server" 2>/dev/null; then  # a signal interrupted the wait: wait for the server to stop
  status=0
  wait "$server" || status=$?
fi
exit "$status"
