"""Declaring work: run, study and search files as pydantic models, checked before anything starts.

Nothing here imports ray, mlflow or optuna. Every problem in a file is a ``SpecError``: one line with the
file, the line, the key, what is wrong and the fix; the mistakes found in one pass (every unknown key) travel
together (``SpecError.every``).
"""

from ablations.spec.common import Budget, Origin, Resources
from ablations.spec.errors import SpecError
from ablations.spec.run import RunConfig, load_run, read_yaml, resolve_run
from ablations.spec.search import Param, SearchSpec, load_search
from ablations.spec.study import Cell, Skipped, Study, load_study
from ablations.spec.yamlfile import load_yaml

__all__ = [
    "Budget",
    "Cell",
    "Origin",
    "Param",
    "Resources",
    "RunConfig",
    "SearchSpec",
    "Skipped",
    "SpecError",
    "Study",
    "load_run",
    "load_search",
    "load_study",
    "load_yaml",
    "read_yaml",
    "resolve_run",
]
