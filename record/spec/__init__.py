"""Declaring work: run, study and search files as pydantic models, checked before anything starts.

Nothing here imports ray, mlflow or optuna. Every problem in a file is a ``SpecError``: one line with the
file, the line, the key, what is wrong and the fix; the mistakes found in one pass (every unknown key) travel
together (``SpecError.every``).
"""

from record.spec.cells import Cell, Skipped
from record.spec.common import Budget, Origin, Resources
from record.spec.errors import SpecError
from record.spec.overrides import load_run
from record.spec.run import RunConfig, read_yaml, resolve_run
from record.spec.search import SearchSpec, load_search
from record.spec.space import Param
from record.spec.study import Study, load_study
from record.spec.yamlfile import load_yaml

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
