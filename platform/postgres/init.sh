#!/bin/sh
# The PostgreSQL roles and databases of the platform, one role per service, none a superuser:
#   role mlflow (password MLFLOW_DB_PASSWORD) owns the databases mlflow (runs, metrics) and mlflow_auth (users)
#   role optuna (password OPTUNA_DB_PASSWORD) owns the database optuna (studies, trials)
# and no other role may connect to those databases (CONNECT is revoked from PUBLIC). Only the superuser
# (POSTGRES_USER, the postgres container's alone) may do anything else.
#
# The postgres image runs this once, on a new volume (/docker-entrypoint-initdb.d). It is safe to run again:
# it then only sets the passwords again and restores the ownership and the grants, which is how the database
# passwords are rotated, and how a volume made before these roles existed is brought to them (the tables,
# sequences and types already in a database pass to its role; platform/README.md):
#   docker compose up -d postgres && docker compose exec postgres sh /docker-entrypoint-initdb.d/init.sh
# ABLATE_DB_PREFIX (default: none) prefixes every role and database name: several deployments on one server,
# or tests on a shared one. Passwords travel in the environment (psql's \getenv), never on a command line.
set -eu
fail() { echo "postgres init: $*" >&2; exit 2; }
for v in MLFLOW_DB_PASSWORD OPTUNA_DB_PASSWORD; do
  eval "val=\${$v:-}"
  [ -n "$val" ] || fail "$v is not set (see .env.example)"
  [ "${#val}" -ge 12 ] || fail "$v must have at least 12 characters"
done
[ "$MLFLOW_DB_PASSWORD" != "$OPTUNA_DB_PASSWORD" ] || fail "MLFLOW_DB_PASSWORD and OPTUNA_DB_PASSWORD must differ"
prefix="${ABLATE_DB_PREFIX:-}"
case "$prefix" in *[!a-z0-9_]*) fail "ABLATE_DB_PREFIX may hold only a-z, 0-9 and _ (got '$prefix')";; esac

psql -X -q -v ON_ERROR_STOP=1 --username "${POSTGRES_USER:-postgres}" --dbname postgres \
  -v mlflow="${prefix}mlflow" -v mlflow_auth="${prefix}mlflow_auth" \
  -v optuna_role="${prefix}optuna" -v optuna="${prefix}optuna" <<'SQL'
\getenv mlflow_password MLFLOW_DB_PASSWORD
\getenv optuna_password OPTUNA_DB_PASSWORD
-- the roles: log in, own what they are given, nothing more
SELECT format('CREATE ROLE %I LOGIN', :'mlflow') WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = :'mlflow') \gexec
SELECT format('CREATE ROLE %I LOGIN', :'optuna_role') WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = :'optuna_role') \gexec
ALTER ROLE :"mlflow" WITH LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS PASSWORD :'mlflow_password';
ALTER ROLE :"optuna_role" WITH LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS PASSWORD :'optuna_password';
-- the databases, each owned by its service's role (an owner may create tables in its public schema)
SELECT format('CREATE DATABASE %I OWNER %I', :'mlflow', :'mlflow') WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = :'mlflow') \gexec
SELECT format('CREATE DATABASE %I OWNER %I', :'mlflow_auth', :'mlflow') WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = :'mlflow_auth') \gexec
SELECT format('CREATE DATABASE %I OWNER %I', :'optuna', :'optuna_role') WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = :'optuna') \gexec
ALTER DATABASE :"mlflow" OWNER TO :"mlflow";
ALTER DATABASE :"mlflow_auth" OWNER TO :"mlflow";
ALTER DATABASE :"optuna" OWNER TO :"optuna_role";
-- nobody else connects: every role is a member of PUBLIC, and PUBLIC may connect to a new database
REVOKE ALL ON DATABASE :"mlflow" FROM PUBLIC;
REVOKE ALL ON DATABASE :"mlflow_auth" FROM PUBLIC;
REVOKE ALL ON DATABASE :"optuna" FROM PUBLIC;
SQL
# what is already in each database (an older volume, or tables made by another role) passes to its owner
for pair in "mlflow:mlflow" "mlflow_auth:mlflow" "optuna:optuna"; do
  psql -X -q -v ON_ERROR_STOP=1 --username "${POSTGRES_USER:-postgres}" --dbname "${prefix}${pair%%:*}" \
    -v role="${prefix}${pair#*:}" <<'SQL'
SELECT format('ALTER %s %I.%I OWNER TO %I',
              CASE c.relkind WHEN 'S' THEN 'SEQUENCE' WHEN 'v' THEN 'VIEW' WHEN 'm' THEN 'MATERIALIZED VIEW' ELSE 'TABLE' END,
              n.nspname, c.relname, :'role')
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'v', 'm', 'S') AND c.relowner <> :'role'::regrole
  -- a serial or identity column's sequence follows its table
  AND NOT (c.relkind = 'S' AND EXISTS (SELECT FROM pg_depend d WHERE d.objid = c.oid AND d.deptype IN ('a', 'i')))
\gexec
SELECT format('ALTER TYPE %I.%I OWNER TO %I', n.nspname, t.typname, :'role')
FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
WHERE n.nspname = 'public' AND t.typtype IN ('e', 'd', 'c') AND t.typowner <> :'role'::regrole
  AND NOT EXISTS (SELECT FROM pg_class c WHERE c.reltype = t.oid)  -- a table's row type follows the table
\gexec
SQL
done
echo "postgres init: roles ${prefix}mlflow (databases ${prefix}mlflow, ${prefix}mlflow_auth) and ${prefix}optuna (database ${prefix}optuna) ready"
