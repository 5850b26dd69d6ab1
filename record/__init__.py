"""The layer under both running (``ablations``) and comparing (``dashboards``): what a study declares
(``record.spec``), the names and records it leaves in MLflow (``record.vocabulary``, ``record.recorded``), the
masking of secrets, the statistics (``record.stats``, pure) and the judgment of a study's family from its cells
(``record.judge``, ``record.looks``). It imports no Ray; the modules that read or write a store
(``record.vocabulary``, ``recorded``, ``runs``, ``evaluations``) import MLflow inside their functions."""
