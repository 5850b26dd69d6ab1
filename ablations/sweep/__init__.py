"""Grid studies on Ray Tune: every cell exactly once, recorded in MLflow (``ablate sweep``).

``plan`` compares a study with what MLflow holds, ``submission`` owns the parent run and the leases,
``placement`` counts trial slots and refuses impossible placements, ``trial`` trains one cell in a Tune
trial, ``driver`` runs a submission, ``raytune`` its claimed cells as one Tune run.
"""

from ablations.sweep.driver import StudyResult, run_study
from ablations.sweep.plan import Plan, describe_plan, format_rows, plan, summarize, unresolvable_warning
from ablations.sweep.submission import live_notes

__all__ = [
    "Plan",
    "StudyResult",
    "describe_plan",
    "format_rows",
    "live_notes",
    "plan",
    "run_study",
    "summarize",
    "unresolvable_warning",
]
