"""Grid studies on Ray Tune: every cell exactly once, recorded in MLflow (``ablate sweep``).

``plan`` compares a study with what MLflow holds, ``submission`` owns the parent run, ``trial`` trains one
cell in a Tune trial, ``driver`` runs a submission.
"""

from ablations.sweep.driver import StudyResult, run_study
from ablations.sweep.plan import Plan, describe_plan, format_rows, plan, summarize
from ablations.sweep.submission import SubmissionRunning, check_no_live_submission

__all__ = [
    "Plan",
    "StudyResult",
    "SubmissionRunning",
    "check_no_live_submission",
    "describe_plan",
    "format_rows",
    "plan",
    "run_study",
    "summarize",
]
