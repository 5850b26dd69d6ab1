#!/bin/sh
# Starts the MLflow tracking server with the basic-auth app (docker-compose's `mlflow` service; the tests run
# this same script as a process). Everything comes from the environment; nothing has a default password.
#   MLFLOW_BACKEND_STORE_URI   postgresql://USER:PASSWORD@HOST:5432/mlflow
#   MLFLOW_AUTH_DATABASE_URI   where users and permissions live (the same Postgres, another database)
#   MLFLOW_AUTH_ADMIN_USERNAME / MLFLOW_AUTH_ADMIN_PASSWORD   the first admin (ignored once it exists)
#   MLFLOW_FLASK_SERVER_SECRET_KEY   signs the UI's sessions
#   MLFLOW_ARTIFACTS_DESTINATION     default /mlartifacts (a volume); MLFLOW_HOST (0.0.0.0), MLFLOW_PORT (5000)
set -eu
fail() { echo "mlflow entrypoint: $*" >&2; exit 2; }
for v in MLFLOW_BACKEND_STORE_URI MLFLOW_AUTH_DATABASE_URI MLFLOW_AUTH_ADMIN_PASSWORD MLFLOW_FLASK_SERVER_SECRET_KEY; do
  eval "val=\${$v:-}"
  [ -n "$val" ] || fail "$v is not set (see .env.example)"
done
case "$MLFLOW_AUTH_ADMIN_PASSWORD" in
  password|password1234|admin|changeme|mlflow|secret) fail "MLFLOW_AUTH_ADMIN_PASSWORD is a well-known default: choose another";;
esac
[ "${#MLFLOW_AUTH_ADMIN_PASSWORD}" -ge 12 ] || fail "MLFLOW_AUTH_ADMIN_PASSWORD must have at least 12 characters"
[ "${#MLFLOW_FLASK_SERVER_SECRET_KEY}" -ge 16 ] || fail "MLFLOW_FLASK_SERVER_SECRET_KEY must have at least 16 characters"
export MLFLOW_AUTH_ADMIN_USERNAME="${MLFLOW_AUTH_ADMIN_USERNAME:-admin}"
config="${MLFLOW_AUTH_CONFIG_PATH:-/tmp/mlflow-basic-auth.ini}"
umask 077
cat > "$config" <<INI
[mlflow]
default_permission = ${MLFLOW_AUTH_DEFAULT_PERMISSION:-READ}
database_uri = ${MLFLOW_AUTH_DATABASE_URI}
admin_username = ${MLFLOW_AUTH_ADMIN_USERNAME}
authorization_function = mlflow.server.auth:authenticate_request_basic_auth
INI
export MLFLOW_AUTH_CONFIG_PATH="$config"
export MLFLOW_SERVER_ENABLE_JOB_EXECUTION="${MLFLOW_SERVER_ENABLE_JOB_EXECUTION:-false}"
exec "${PYTHON:-python}" -m mlflow server --app-name basic-auth \
  --backend-store-uri "$MLFLOW_BACKEND_STORE_URI" \
  --artifacts-destination "${MLFLOW_ARTIFACTS_DESTINATION:-/mlartifacts}" \
  --host "${MLFLOW_HOST:-0.0.0.0}" --port "${MLFLOW_PORT:-5000}" --workers "${MLFLOW_WORKERS:-2}"
