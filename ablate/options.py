"""The options several commands share, and the types that check an option's value (argparse names the option)."""

from __future__ import annotations

import argparse


def count(text: str) -> int:
    """A whole number from 1 up (trials, CPUs, steps)."""
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number from 1 up")
    return int(text)


def whole(text: str) -> int:
    """A whole number from 0 up."""
    if not text.strip().isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number from 0 up")
    return int(text)


def port(text: str) -> int:
    if not text.strip().isdigit() or not 0 < int(text) < 65536:
        raise argparse.ArgumentTypeError(f"{text!r}: give a port from 1 to 65535")
    return int(text)


def seeds(text: str) -> list[int]:
    """``--seeds``: a count (3: seeds 0, 1, 2) or a list of non-negative seeds (0,4,7)."""
    parts = [p.strip() for p in text.split(",")]
    given = [int(p) for p in parts] if all(p.isdigit() for p in parts) else []
    if not given or given == [0] or len(set(given)) < len(given):
        raise argparse.ArgumentTypeError(f"{text!r}: give a count of seeds (3) or a list of different seeds (0,1,2)")
    return list(range(given[0])) if len(parts) == 1 else given


def tracking_uri(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--tracking-uri",
        default=None,
        help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else the SQLite store in .ablate/)",
    )


def address_and_cpus(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--address", default=None, help="Ray cluster to use (default: $RAY_ADDRESS, else a local Ray on 127.0.0.1)"
    )
    tracking_uri(p)
    p.add_argument("--cpus", type=count, default=None, help="CPUs of the local Ray (default: all)")


def plugin(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="MODULE_OR_PATH",
        help="load a plugin first: your own components, tasks or report warnings (a module name, or a path to a .py "
        "file or a package folder); repeatable. Installed plugins (entry points 'ablate.plugins') load by themselves",
    )
