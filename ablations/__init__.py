"""Declaring and running ablation studies: specs, training runs, sweeps on Ray, Optuna searches, MLflow."""
