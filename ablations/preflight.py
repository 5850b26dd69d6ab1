"""What a command needs from outside, asked in seconds once its own input is known good: the Ray cluster it names
answers, then its tracking store (Ray's driver and MLflow's client wait minutes on what does not answer, then end
in a traceback). A mistake in a file or an option is said first: it is what the user can fix at once."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """Why a command cannot go on; ``given`` when what the user gave is at fault (an address, a store with nothing
    recorded), not a store that does not answer."""

    line: str
    given: bool


def outside_problem(
    tracking_uri: str | None, *, address: str | None = None, reads: bool = False, trains: bool = False
) -> Problem | None:
    """None when the Ray cluster at ``address`` (or $RAY_ADDRESS; asked when ``trains``) answers and the tracking
    store will do (one with something recorded when the command only ``reads`` it), else what is wrong."""
    from ablations import stores, tracking
    from ablations.cluster import check_answers

    address = address or os.environ.get("RAY_ADDRESS")
    if address and trains:
        try:
            check_answers(address)
        except ValueError as err:
            return Problem(str(err), given=True)
    uri = tracking.resolve_uri(tracking_uri, create=False)
    if problem := stores.usable(uri):
        return Problem(problem, given=False)
    if reads and (nothing := stores.nothing_recorded(uri)):
        return Problem(nothing, given=True)
    return None
