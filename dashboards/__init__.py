"""Comparing results: reads MLflow, computes seed statistics, writes tables, plots and reports."""
