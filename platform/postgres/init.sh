#!/bin/sh
# Runs once, when the postgres volume is new: the databases of the MLflow backend, MLflow's users, and Optuna.
set -eu
for db in mlflow mlflow_auth optuna; do
  psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname postgres -c "CREATE DATABASE $db"
done
