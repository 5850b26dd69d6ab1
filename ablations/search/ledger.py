"""What the Optuna study holds of each trial, for every process on it: who asked it (``HOST_ATTR``, ``PID_ATTR``),
which trials count towards ``n_trials`` (a lost trial's retry instead of it; not a surplus one), and how a trial's
end is told (a diverged one just worse than the worst completed)."""

from __future__ import annotations

import math
import os
import socket
import warnings
from typing import Any

from record import vocabulary
from record.spec import SearchSpec

HOST_ATTR, PID_ATTR = "ablate:host", "ablate:pid"  # user attributes of a trial: the process that asked it
FAILURE_ATTR = "ablate:failure"  # why a trial failed (its MLflow run, when it began one, says it too)
SURPLUS_ATTR = "ablate:surplus"  # a trial asked beyond n_trials by a process that raced another: failed, not counted


def gone_here(host, pid) -> bool:
    """Whether ``pid`` was a process of this machine (``host``) other than this one, and no longer exists. A process
    of another machine is never judged gone by its pid."""
    if host != socket.gethostname() or not str(pid).isdigit() or int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def stale_trials(study) -> list:
    """RUNNING trials whose driver is gone: asked on this machine by a process that no longer exists."""
    from optuna.trial import TrialState

    return [
        t
        for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        if isinstance(t.user_attrs.get(PID_ATTR), int)
        and gone_here(t.user_attrs.get(HOST_ATTR), t.user_attrs[PID_ATTR])
    ]


def counted_trials(study) -> int:
    return len(counted_numbers(study))


def counted_numbers(study) -> list[int]:
    """The numbers of the trials asked so far, failed ones included (a search whose trials all fail ends), except
    those that did not end by themselves (a dead process, Ctrl-C, a stale heartbeat): they are asked again, and
    the retry counts instead; and except surplus trials (``surplus``)."""
    import optuna
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    retried = {t.user_attrs.get("retry_of") for t in trials}
    with warnings.catch_warnings():  # Optuna marks its retry bookkeeping experimental
        warnings.simplefilter("ignore")
        for t in trials:  # trials whose heartbeat stopped, asked again by Optuna's own callback
            retried.update(optuna.storages.RetryHeartbeatStaleTrialCallback.retry_history(t))
    return [
        t.number
        for t in trials
        if t.state != TrialState.WAITING
        and not (t.state == TrialState.FAIL and t.number in retried)
        and not t.user_attrs.get(SURPLUS_ATTR)
    ]


def surplus(study, number: int, n_trials: int | None) -> bool:
    """Whether trial ``number`` lies beyond ``n_trials``: two processes on one study that both counted n - 1 trials
    both ask one (counting and asking are two steps); Optuna numbers trials in the order they were asked, so the
    later one is the surplus, and each process reaches the same answer."""
    return n_trials is not None and sum(k <= number for k in counted_numbers(study)) > n_trials


def fail_and_ask_again(study, number: int, params: dict[str, Any]) -> None:
    """A trial that did not end by itself (its process died, or Ctrl-C): failed, and queued again with the same
    parameters; the retry, not the lost trial, counts towards ``n_trials``."""
    from optuna.trial import TrialState

    study.tell(number, state=TrialState.FAIL)
    study.enqueue_trial(params, user_attrs={"retry_of": number}, skip_if_exists=False)


def worst_values(study, spec: SearchSpec) -> list[float] | None:
    """Just worse than the worst value each objective reached in a completed trial (one step of the float, so a
    diverged trial told it never ties with a completed one: with one completed trial, Optuna's best_trials held
    both, the diverged one first, and a tuned study ran its cells at the parameters that diverged). None before
    any trial completed."""
    from optuna.trial import TrialState

    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if not complete:
        return None
    out = []
    for i, (_, direction) in enumerate(spec.objectives):
        values = [t.values[i] for t in complete]
        out.append(
            math.nextafter(max(values), math.inf) if direction == "minimize" else math.nextafter(min(values), -math.inf)
        )
    return out


def note_failure(study, number: int, reason: str) -> None:
    """A running trial's failure reason as its user attribute (Optuna's Study has no public way to set one on a
    trial it did not hand out, so its storage's, as Optuna's own Trial does)."""
    from ablations.search.setup import trial_id

    storage = study._storage
    storage.set_trial_user_attr(trial_id(storage, study.study_name, number), FAILURE_ATTR, reason[:500])


def tell(study, number: int, result: dict[str, Any], spec: SearchSpec | None = None) -> str:
    """Tell Optuna how a trial ended. A diverged trial is told as the worst value any completed trial reached (the
    sampler learns where not to go; ``diverged: fail`` in the spec, or no completed trial yet: FAIL). A trial that
    another process has already ended (it took it for lost, and asks it again) is left as that process left it."""
    from optuna.trial import TrialState

    status, values = result["status"], result.get("values")
    if number not in {t.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}:
        return "ended by another process"  # a search started again took it for lost; its retry is the result
    if status == vocabulary.STATUS_PRUNED:
        study.tell(number, state=TrialState.PRUNED)
        return "PRUNED"
    if status == vocabulary.STATUS_FINISHED and values and all(v is not None and math.isfinite(v) for v in values):
        study.tell(number, values if len(values) > 1 else values[0])
        return "COMPLETE"
    if status == vocabulary.STATUS_DIVERGED and spec is not None and spec.diverged == "worst":
        worst = worst_values(study, spec)
        if worst is not None:
            study.tell(number, worst if len(worst) > 1 else worst[0])
            return "COMPLETE (diverged: told the worst value)"
    if result.get("reason"):  # in the storage too: a trial that failed before its MLflow run began has only this
        note_failure(study, number, str(result["reason"]))
    study.tell(number, state=TrialState.FAIL)  # failed, diverged before any trial completed, or no objective value
    return "FAIL"
