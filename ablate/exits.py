"""The ``ablate`` command's exit codes, the only place they are defined, and how an error is said."""

from __future__ import annotations

import sys

OK = 0  # done (a diverged run is a result)
FAILED = 1  # failed while running, or a store that does not answer
BAD_INPUT = 2  # a mistake in a file or an option (an address that does not answer): nothing started or logged
INTERRUPTED = 130  # Ctrl-C or SIGTERM: what ran is recorded as killed


def error(message, code: int = BAD_INPUT) -> int:
    """Say ``message`` on stderr (a SpecError: every mistake found with it) and give the exit code."""
    for line in getattr(message, "every", lambda: [message])():
        print(f"error: {line}", file=sys.stderr)
    return code


def interrupted(what_now: str = "") -> int:
    """Ctrl-C or SIGTERM: said in one line with what to do now, no traceback."""
    print(f"\ninterrupted{': ' + what_now if what_now else ''}", file=sys.stderr)
    return INTERRUPTED


def ready(tracking_uri: str | None, **asked) -> int | None:
    """None when what the command needs from outside will do (``ablations.preflight``), else its exit code."""
    from ablations.preflight import outside_problem

    problem = outside_problem(tracking_uri, **asked)
    return None if problem is None else error(problem.line, BAD_INPUT if problem.given else FAILED)
