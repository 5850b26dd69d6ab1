"""``ablate``: the table from command to function, and what every command does first (secrets masked, plugins
loaded, a store that does not answer said in one line)."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from ablate import comparing, options, running
from ablate.exits import BAD_INPUT, FAILED, error, interrupted, ready


class Command(NamedTuple):
    run: Callable[[argparse.Namespace], int]
    options: Callable[[argparse.ArgumentParser], None]
    help: str
    reads: bool = False  # reads the tracking store only: asked before the command whether it holds anything
    components: bool = True  # reads components: plugins are loaded first


COMMANDS: dict[str, Command] = {
    "run": Command(running.run, running.run_options, "train one configuration (a run file) and record it in MLflow"),
    "sweep": Command(
        running.sweep,
        running.sweep_options,
        "run every cell of a study on Ray, each exactly once, recorded in MLflow",
    ),
    "search": Command(
        running.search,
        running.search_options,
        "an Optuna search over run-configuration keys, trials on Ray, tracked in MLflow",
    ),
    "report": Command(
        comparing.report,
        comparing.report_options,
        "the ablation table with seed statistics, and an HTML report logged to MLflow",
        reads=True,
    ),
    "heads": Command(
        comparing.heads,
        comparing.heads_options,
        "remove one attention head at a time in every trained seed (Michel et al. 2019)",
        reads=True,
    ),
    "compare": Command(
        comparing.compare,
        comparing.compare_options,
        "which conclusions changed between two studies or submissions (NAME@N)",
        reads=True,
    ),
    "ui": Command(
        comparing.ui,
        comparing.ui_options,
        "the MLflow UI on the tracking store (--optuna: optuna-dashboard on the searches), on 127.0.0.1 unless --host",
        components=False,
    ),
    "cluster": Command(
        running.cluster,
        running.cluster_options,
        "start (up) or stop (down) a Ray cluster of several nodes on this machine, on loopback unless --token",
        components=False,
    ),
    "demo": Command(
        running.demo,
        running.demo_options,
        "train a few model variants for a few steps on random copy data (no tracking)",
    ),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ablate", description="Ablation studies of Transformers.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, command in COMMANDS.items():
        p = sub.add_parser(name, help=command.help, description=command.help)  # --help says what it does
        command.options(p)
        options.plugin(p)
    return parser


def _load_plugins(args: argparse.Namespace) -> int | None:
    """Installed plugins, then those of --plugin (paths relative to here), before anything is read; the exit code of
    a plugin that cannot be loaded, else None."""
    if not COMMANDS[args.command].components:
        return None
    from models import plugins

    plugins.load_installed()
    try:
        plugins.load(args.plugin, Path.cwd(), what="--plugin")
    except plugins.PluginError as err:
        return error(str(err))
    return None


def _sigterm(signum, frame) -> None:
    """SIGTERM stops a command the way Ctrl-C does: runs are recorded as killed, servers and Ray stopped."""
    raise KeyboardInterrupt("SIGTERM")


def main(argv: list[str] | None = None) -> int:
    import signal

    from ablations.process import exit_quickly

    exit_quickly()  # the command ends without collecting its libraries' garbage (2 CPU-seconds with torch loaded)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _sigterm)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return BAD_INPUT
    from record import secrets

    if hasattr(args, "tracking_uri"):
        args.tracking_uri = secrets.guard(args.tracking_uri, getattr(args, "storage", None))
    else:
        secrets.guard(storage=getattr(args, "storage", None))
    if (refused := _load_plugins(args)) is not None:
        return refused
    return _call(COMMANDS[args.command], args)


def _call(command: Command, args: argparse.Namespace) -> int:
    """The command, its outside world asked first where it only reads (the others ask once their own input is known
    good); what no command has a word of its own for, said in one line."""
    try:
        if command.reads and (refused := ready(args.tracking_uri, reads=True)) is not None:
            return refused
        return command.run(args)
    except KeyboardInterrupt:
        return interrupted()
    except BrokenPipeError:  # `ablate report | head`: the reader has what it wanted; no traceback, no more output
        with contextlib.suppress(OSError, ValueError):  # a stream without a file (a test's capture)
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return FAILED
    except Exception as err:  # a database that stopped answering mid-work: its line, not a library's traceback
        from ablations.stores import away

        if (line := away(err)) is None:
            raise
        return error(line, FAILED)
