"""Optuna searches on Ray (``ablate search``) and tuned ablations.

``setup`` builds Optuna's storage, sampler and pruner; ``trial`` trains one trial in a Ray worker;
``driver`` asks, runs and tells, ``runs`` opens and ends its MLflow runs; ``results`` writes what a search leaves; ``tuned`` tunes each variant of a
study before its cells run.
"""

from ablations.search.driver import SearchResult, counted_trials, run_search
from ablations.search.results import format_best, format_outcome
from ablations.search.setup import make_pruner, make_sampler, open_storage, storage_url

__all__ = [
    "SearchResult",
    "counted_trials",
    "format_best",
    "format_outcome",
    "make_pruner",
    "make_sampler",
    "open_storage",
    "run_search",
    "storage_url",
]
