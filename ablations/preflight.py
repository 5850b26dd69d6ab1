"""What a command needs from outside, asked in seconds once its own input is known good: the Ray cluster it names
answers, then its tracking store (Ray's driver and MLflow's client wait minutes on what does not answer, then end
in a traceback). A mistake in a file or an option is said first: it is what the user can fix at once."""

from __future__ import annotations

import argparse
import os

FAILED, BAD_INPUT = 1, 2  # the command's exit codes (ablations.cli)


def outside_problem(args: argparse.Namespace) -> tuple[str, int] | None:
    """For the parsed command line ``args``: None when both will do, else the line that says why and the exit code."""
    from ablations import stores, tracking
    from ablations.cluster import check_answers

    command, dry_run = args.command, getattr(args, "dry_run", False)
    address = getattr(args, "address", None) or os.environ.get("RAY_ADDRESS")
    if address and command in ("sweep", "search") and not dry_run:  # a search's dry run says it in its own words
        try:
            check_answers(address)
        except ValueError as err:
            return str(err), BAD_INPUT
    uri = tracking.resolve_uri(args.tracking_uri, create=False)
    if problem := stores.usable(uri):
        return problem, FAILED
    if command in ("report", "compare", "heads", "ui") and (nothing := stores.nothing_recorded(uri)):
        return nothing, BAD_INPUT
    return None
