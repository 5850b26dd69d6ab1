"""The layer under both running (``ablations``) and comparing (``dashboards``): what a study declares
(``record.spec``), the names and records it leaves in MLflow (``record.vocabulary``, ``record.recorded``), the
masking of secrets, and the statistics (``record.stats``). It imports no Ray; only ``record.vocabulary`` and
``record.recorded`` talk to MLflow, and only inside their functions."""
