"""The ``ablate`` command. It only parses, calls and prints; the logic lives in importable functions.

Heavy libraries (torch, lightning, ray, mlflow) are imported inside the commands, so ``ablate --help``
answers at once. Exit codes: 0 done (a diverged run is a result), 1 failed while running, 2 bad input
(nothing was started or logged).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import threading
from pathlib import Path

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2


def error(message, code: int = EXIT_BAD_INPUT) -> int:
    for line in getattr(message, "every", lambda: [message])():  # a SpecError: every mistake found with it
        print(f"error: {line}", file=sys.stderr)
    return code


def ready(args: argparse.Namespace) -> int | None:
    """None when what the command needs from outside will do (``ablations.preflight``), else its exit code."""
    from ablations.preflight import outside_problem

    refused = outside_problem(args)
    return None if refused is None else error(*refused)


def _demo(args: argparse.Namespace) -> int:
    from ablations.demo import demo

    demo(steps=args.steps)
    return EXIT_OK


def _run(args: argparse.Namespace) -> int:
    from ablations.spec import SpecError, load_run

    try:
        run = load_run(args.config, args.set)
    except SpecError as err:
        return error(err)
    if (refused := ready(args)) is not None:
        return refused
    from ablations.process import import_paused, training_modules

    import_paused(training_modules(args.tracking_uri))  # torch, Lightning, MLflow: with the collector paused
    from ablations.train import Tracking, train
    from models.tasks import DataUnavailable

    where = Tracking(uri=args.tracking_uri, experiment=args.experiment)
    print(
        f"training {run.model.describe()} on {run.task.describe()} for {run.training.max_steps} steps (seed {run.seed})"
    )
    try:
        result = train(run, where, progress=not args.no_progress)
    except DataUnavailable as err:
        return error(f"{args.config}: task.source: {err}")
    except KeyboardInterrupt:
        print("\ninterrupted: the run is recorded as killed", file=sys.stderr)
        return 130
    except Exception as err:  # recorded in MLflow as failed, with the traceback as an artifact
        return error(f"the run failed: {type(err).__name__}: {err}", EXIT_FAILED)
    from ablations.ui import print_summary

    print_summary(result)
    return EXIT_OK


def _sweep(args: argparse.Namespace) -> int:
    from ablations.spec import SpecError, load_study

    try:
        study = load_study(args.study, seeds=args.seeds)
    except SpecError as err:
        return error(err)
    if (refused := ready(args)) is not None:
        return refused
    from ablations import sweep

    if args.amend is not None:  # the command's reason stands for the file's
        import dataclasses

        study = dataclasses.replace(study, amend=args.amend)
    if args.pilot is not None and not args.dry_run:
        return error("--pilot SUBMISSION says what a dry run plans from: add --dry-run")
    if args.dry_run:
        from ablations.sweep.preview import dry_run

        problems = dry_run(
            study,
            tracking_uri=args.tracking_uri,
            claims_url=args.claims,
            reuse_any_code=args.reuse_any_code,
            next_cells=_decider(study, args.tracking_uri, create=False),
        )
        if pilot := _pilot(study, args.tracking_uri, args.pilot):
            print(pilot)
        return max([EXIT_OK] + [error(problem, EXIT_FAILED) for problem in problems])  # 1 where one would stop it
    try:
        _import_driver(args, "ray.tune")  # inside: Ctrl-C and a bad URI get the messages below, as in run_study
        result = sweep.run_study(
            study,
            address=args.address,
            tracking_uri=args.tracking_uri,
            max_concurrent=args.max_concurrent,
            num_cpus=args.cpus,
            claims_url=args.claims,
            reuse_any_code=args.reuse_any_code,
            next_cells=_decider(study, args.tracking_uri),
        )
    except ValueError as err:
        return error(str(err))
    except KeyboardInterrupt:
        print("\ninterrupted: run the same command again to train the missing cells", file=sys.stderr)
        return 130
    print()
    print(sweep.format_rows(study, result.rows))
    counts = ", ".join(f"{n} {s}" for s, n in sorted(result.counts.items()) if n)
    print(f"\n{study.name}: {counts}")
    from ablations.ui import browse_hint

    flag = "" if args.tracking_uri is None else " --tracking-uri " + args.tracking_uri
    print(f"report: ablate report {study.name}{flag}   browse: {browse_hint(result.tracking_uri, study.name)}")
    return EXIT_OK if result.complete else EXIT_FAILED


def _decider(study, tracking_uri: str | None, create: bool = True):
    """A seed plan's looks, decided by the comparing side (dashboards/sequential.py), for the sweep to ask which
    cells come next; None without a plan."""
    if study.plan is None:
        return None
    from ablations import tracking
    from dashboards.sequential import wanted

    uri = tracking.resolve_uri(tracking_uri, create=create)
    return lambda: wanted(uri, study.name, study.variants, study.plan, study.analysis)


def _pilot(study, tracking_uri: str | None, submission: int | None = None) -> str | None:
    """An earlier submission as a pilot: how many seeds the declared difference needs, or what a seed plan is
    expected to train (comparing, composed here)."""
    from ablations import stores, tracking
    from dashboards.plan import pilot_plan, sequential_plan

    uri = tracking.resolve_uri(tracking_uri, create=False)
    exists = stores.store_exists(uri)
    if study.plan is not None:
        return sequential_plan(uri if exists else None, study, submission=submission)
    if not exists:
        return None
    return pilot_plan(uri, study.name, study.analysis, metric=study.metric, submission=submission)


def _report(args: argparse.Namespace) -> int:
    from ablations import tracking
    from dashboards.load import NoResults
    from dashboards.render import RENDERERS
    from dashboards.report import make_report

    uri = tracking.resolve_uri(args.tracking_uri)
    for line in _recorded_plugins(uri, args.study):
        print(f"note: {line}", file=sys.stderr)
    try:
        report = make_report(
            uri,
            args.study,
            metric=args.metric,
            baseline=args.baseline,
            submission=args.submission,
            out_dir=args.out,
            log=not args.no_log,
        )
    except (NoResults, ValueError) as err:
        return error(str(err))
    table = RENDERERS[args.format](report.table)  # alone on stdout: `--format csv > table.csv` is the table
    print(table, end="" if table.endswith("\n") else "\n")
    beside = ", ".join(sorted(p.name for k, p in report.files.items() if k != "html"))
    print(f"report: {report.files['html'].resolve()}  (beside it: {beside})", file=sys.stderr)
    if report.parent_run_id:
        from ablations.ui import browse_hint

        hint = browse_hint(uri, args.study, report.parent_run_id)
        print(f"in MLflow: {hint}  (the parent run's artifacts: report/report.html)", file=sys.stderr)
    return EXIT_OK


def _recorded_plugins(uri: str, study: str) -> list[str]:
    """The plugins the study's last submission loaded, loaded here too where their files are (their warnings speak
    in the report); what could not be, said."""
    import json

    from ablations import records, stores
    from models import plugins

    if not stores.store_exists(uri):
        return []
    exp = records.client(uri).get_experiment_by_name(study)
    if exp is None:
        return []
    runs = records.search_all(uri, [exp.experiment_id], records.kind_filter(records.KIND_STUDY))
    last = max(runs, key=lambda r: r.info.start_time, default=None)
    said = []
    for ref in json.loads(last.data.tags.get(records.TAG_PLUGINS, "[]")) if last is not None else []:
        try:
            plugins.load([ref["path"] or ref["module"]], what="the study's last submission")
        except plugins.PluginError as err:
            said.append(f"{err} (its warnings are not in this report; --plugin names it)")
    return said


def _heads(args: argparse.Namespace) -> int:
    """``ablate heads``: each head removed alone; with ``--prune``, pruning curves and one head per module."""
    from ablations import tracking
    from dashboards.heads import check_options, format_heads, head_ablation, save_heads
    from dashboards.load import NoResults
    from dashboards.pruning import format_pruning, save_pruning, study_pruning

    uri = tracking.resolve_uri(args.tracking_uri)
    try:
        check_options(uri, args.study, args.metric, args.prune)  # before minutes of evaluation
        effects, info = head_ablation(uri, args.study, args.metric)
        text = format_heads(effects, info)
        print(text)
        saved = [save_heads(uri, args.study, text, effects, args.out)]
        if args.prune:
            print(f"pruning every model's heads 10% at a time, measured on {args.prune} ...", flush=True)
            models, info = study_pruning(uri, args.study, args.prune)
            print(format_pruning(models, info))
            saved.append(save_pruning(uri, args.study, models, info, args.out))
    except (NoResults, LookupError, ValueError) as err:
        return error(str(err))
    for written, parent, logged in saved:
        if written:
            print("written: " + ", ".join(str(p) for p in written))
        if parent:
            print(f"logged to MLflow: run {parent}, artifacts {', '.join(logged)}")
    return EXIT_OK


def _compare(args: argparse.Namespace) -> int:
    from ablations import tracking
    from dashboards.compare import compare, format_changes
    from dashboards.load import NoResults

    uri = tracking.resolve_uri(args.tracking_uri)
    try:
        a, _, changes = compare(uri, args.a, args.b, args.metric)
    except (NoResults, ValueError) as err:
        return error(str(err))
    print(format_changes(args.a, args.b, a.metric, changes))
    return EXIT_OK


def _count(text: str) -> int:
    """A whole number from 1 up (trials, CPUs, steps); argparse names the option."""
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number from 1 up")
    return int(text)


def _port(text: str) -> int:
    if not text.strip().isdigit() or not 0 < int(text) < 65536:
        raise argparse.ArgumentTypeError(f"{text!r}: give a port from 1 to 65535")
    return int(text)


def _seeds(text: str) -> list[int]:
    """``--seeds``: a count (3: seeds 0, 1, 2) or a list of non-negative seeds (0,4,7); argparse names it."""
    parts = [p.strip() for p in text.split(",")]
    seeds = [int(p) for p in parts] if all(p.isdigit() for p in parts) else []
    if not seeds or seeds == [0] or len(set(seeds)) < len(seeds):
        raise argparse.ArgumentTypeError(f"{text!r}: give a count of seeds (3) or a list of different seeds (0,1,2)")
    return list(range(seeds[0])) if len(parts) == 1 else seeds


def _import_driver(args: argparse.Namespace, *modules: str) -> None:
    from ablations.cluster import import_for_driver
    from ablations.process import tracking_modules

    import_for_driver(args.address, [*tracking_modules(args.tracking_uri), *modules])


def _search(args: argparse.Namespace) -> int:
    from ablations.spec import SpecError, load_search

    try:
        spec = load_search(args.spec)
    except SpecError as err:
        return error(err)
    if args.n_trials is not None:
        spec.set_trials(args.n_trials)
    if (refused := ready(args)) is not None:
        return refused
    if args.dry_run:
        from ablations.search.preview import describe_search

        problems = describe_search(spec, args.storage, args.tracking_uri, args.address, args.cpus)
        return max([EXIT_OK] + [error(problem, EXIT_FAILED) for problem in problems])  # 1 where one would stop it
    from ablations.search import format_outcome, run_search

    try:
        _import_driver(args, "optuna")
        result = run_search(
            spec, address=args.address, tracking_uri=args.tracking_uri, storage=args.storage, num_cpus=args.cpus
        )
    except ValueError as err:
        return error(str(err))
    except KeyboardInterrupt:
        print("\ninterrupted: run the same command again to resume the search", file=sys.stderr)
        return 130
    print(format_outcome(spec, result, storage_given=args.storage is not None))
    return EXIT_OK if result.best else EXIT_FAILED


def _ui(args: argparse.Namespace) -> int:
    from ablations.ui import serve_mlflow, serve_optuna

    if args.optuna and (args.experiment or args.run):
        return error("an experiment or --run opens MLflow's UI, not optuna-dashboard: leave out --optuna, or them")
    if args.storage and not args.optuna:
        return error("--storage is the searches' Optuna storage: add --optuna to open optuna-dashboard on it")
    if not args.optuna and (refused := ready(args)) is not None:
        return refused
    try:
        if args.optuna:
            return serve_optuna(args.storage, args.host, args.port)
        return serve_mlflow(args.tracking_uri, args.host, args.port, experiment=args.experiment, run_id=args.run)
    except ValueError as err:  # a --host it cannot serve on
        return error(str(err))


def add_tracking_uri(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--tracking-uri",
        default=None,
        help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else the SQLite store in .ablate/)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ablate", description="Ablation studies of Transformers.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    adders = (
        _add_run,
        _add_sweep,
        _add_search,
        _add_report,
        _add_heads,
        _add_compare,
        _add_ui,
        _add_cluster,
        _add_demo,
    )
    for add in adders:
        add(sub)
    return parser


def _command(sub, name: str, help: str, func) -> argparse.ArgumentParser:
    """A subcommand whose ``--help`` says what it does, as ``ablate --help`` does."""
    p = sub.add_parser(name, help=help, description=help)
    p.set_defaults(func=func)
    p.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="MODULE_OR_PATH",
        help="load a plugin first: your own components, tasks or report warnings (a module name, or a path to a .py "
        "file or a package folder); repeatable. Installed plugins (entry points 'ablate.plugins') load by themselves",
    )
    return p


def _load_plugins(args: argparse.Namespace) -> int | None:
    """Installed plugins, then those of --plugin (paths relative to here), before anything is read; the exit code of
    a plugin that cannot be loaded, else None."""
    if args.command in ("cluster", "ui"):  # they read no component
        return None
    from models import plugins

    plugins.load_installed()
    try:
        plugins.load(args.plugin, Path.cwd(), what="--plugin")
    except plugins.PluginError as err:
        return error(str(err))
    return None


def _add_address_and_cpus(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--address", default=None, help="Ray cluster to use (default: $RAY_ADDRESS, else a local Ray on 127.0.0.1)"
    )
    add_tracking_uri(p)
    p.add_argument("--cpus", type=_count, default=None, help="CPUs of the local Ray (default: all)")


def _add_run(sub) -> None:
    p = _command(sub, "run", "train one configuration (a run file) and record it in MLflow", _run)
    p.add_argument("config", help="a run file, e.g. ablations/runs/quickstart.yaml")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a key, e.g. --set model.n_heads=8 --set training.lr=3e-4 (repeatable)",
    )
    add_tracking_uri(p)
    p.add_argument("--experiment", default=None, help="MLflow experiment (default: the run's name)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _add_sweep(sub) -> None:
    p = _command(sub, "sweep", "run every cell of a study on Ray, each exactly once, recorded in MLflow", _sweep)
    p.add_argument("study", help="a study file, e.g. ablations/studies/quickstart.yaml")
    p.add_argument("--dry-run", action="store_true", help="list the cells and what is done; start nothing")
    _add_address_and_cpus(p)
    p.add_argument("--max-concurrent", type=_count, default=None, help="trials at once (default: the study's)")
    p.add_argument("--seeds", type=_seeds, help="override the study's seeds: a count (3) or a list (0,1,2)")
    p.add_argument(
        "--pilot",
        type=_count,
        metavar="SUBMISSION",
        default=None,
        help="with --dry-run: the earlier submission whose spread says the seeds needed (default: all of them)",
    )
    p.add_argument(
        "--claims",
        default=None,
        help="where cells are claimed (default: $ABLATE_CLAIMS_URL, else beside a SQLite MLflow store, else the "
        "PostgreSQL Optuna storage, else .ablate/claims.db); a cluster of several machines needs PostgreSQL",
    )
    p.add_argument(
        "--reuse-any-code",
        action="store_true",
        help="count results trained by other code (another code fingerprint) as done (default: train them again)",
    )
    p.add_argument(
        "--amend",
        metavar="WHY",
        default=None,
        help="the study differs from its registered declaration on purpose: why (recorded, shown in every report)",
    )


def _add_search(sub) -> None:
    help = "an Optuna search over run-configuration keys, trials on Ray, tracked in MLflow"
    p = _command(sub, "search", help, _search)
    p.add_argument("spec", help="a search file, e.g. ablations/searches/quickstart_lr.yaml")
    p.add_argument(
        "--dry-run", action="store_true", help="the space, the trials and what the storage holds; start nothing"
    )
    p.add_argument(
        "--storage",
        default=None,
        help="Optuna storage URL or journal:PATH (default: the spec's, else .ablate/optuna.db)",
    )
    p.add_argument(
        "--n-trials", type=_count, default=None, help="override the spec's n_trials (the total for the study)"
    )
    _add_address_and_cpus(p)


def _add_report(sub) -> None:
    help = "the ablation table with seed statistics, and an HTML report logged to MLflow"
    p = _command(sub, "report", help, _report)
    p.add_argument("study", help="the study's name (its MLflow experiment)")
    p.add_argument("--metric", default=None, help="default: the study's metric")
    p.add_argument("--baseline", default=None, help="the variant to compare against (default: the study's first)")
    p.add_argument("--submission", type=_count, default=None, help="only the cells of this submission")
    p.add_argument(
        "--format",
        default="markdown",
        choices=["markdown", "terminal", "latex", "csv", "html"],
        help="what to print (every format is written to the report folder)",
    )
    p.add_argument("--out", type=Path, default=None, help="report folder (default: .ablate/reports/STUDY)")
    p.add_argument("--no-log", action="store_true", help="do not log the report to the study's parent run")
    add_tracking_uri(p)


def _add_heads(sub) -> None:
    help = "remove one attention head at a time in every trained seed (Michel et al. 2019)"
    p = _command(sub, "heads", help, _heads)
    p.add_argument("study", help="a study whose runs kept their weights (tracking: {checkpoint: true})")
    p.add_argument(
        "--metric",
        default="val/loss",
        help="a validation or test metric (significance tests for losses), e.g. val/loss",
    )
    p.add_argument("--out", type=Path, default=None, help="also write heads.md and heads.json to this folder")
    p.add_argument(
        "--prune",
        metavar="METRIC",
        default=None,
        help="also prune heads 10%% at a time by importance and at random, and keep one head per module (Michel "
        "et al. section 4 and Table 2), measured on a test metric, e.g. --prune test/loss",
    )
    add_tracking_uri(p)


def _add_compare(sub) -> None:
    help = "which conclusions changed between two studies or submissions (NAME@N)"
    p = _command(sub, "compare", help, _compare)
    p.add_argument("a", help="a study name, or NAME@SUBMISSION")
    p.add_argument("b", help="a study name, or NAME@SUBMISSION")
    p.add_argument("--metric", default=None, help="default: the first study's metric")
    add_tracking_uri(p)


def _add_ui(sub) -> None:
    help = (
        "the MLflow UI on the tracking store (--optuna: optuna-dashboard on the searches), on 127.0.0.1 unless --host"
    )
    p = _command(sub, "ui", help, _ui)
    p.add_argument("experiment", nargs="?", default=None, help="open this study's (or run's) experiment")
    p.add_argument("--run", default=None, help="open this run of the experiment")
    p.add_argument("--tracking-uri", default=None, help="default: $MLFLOW_TRACKING_URI, else .ablate/mlflow.db")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument(
        "--port",
        type=_port,
        default=None,
        help="default 5000 (MLflow; $ABLATE_UI_PORT), 8080 (--optuna), else a free one",
    )
    p.add_argument("--optuna", action="store_true", help="start optuna-dashboard on the searches' storage instead")
    p.add_argument("--storage", default=None, help="with --optuna: the Optuna storage (default .ablate/optuna.db)")


def _cluster(args: argparse.Namespace) -> int:
    """``ablate cluster up``: the address alone on stdout (``export RAY_ADDRESS=$(ablate cluster up)``), how to use
    and stop it on stderr. ``ablate cluster down ADDRESS``: exactly that cluster's processes."""
    from ablations import localcluster

    if args.action == "down":
        if args.address is None:
            running = ", ".join(c.address for c in localcluster.clusters()) or "none"
            return error(f"ablate cluster down ADDRESS: name the cluster to stop (started here: {running})")
        try:
            stopped = localcluster.down(args.address)
        except localcluster.ClusterError as err:
            return error(str(err))
        print(f"stopped the Ray cluster at {args.address} ({len(stopped)} processes)", file=sys.stderr)
        return EXIT_OK
    if args.address is not None:
        return error("ablate cluster up takes no address: it prints the one it starts (ablate cluster down ADDRESS)")
    if args.host and not args.token:
        return error(f"--host {args.host}: a cluster other machines reach needs --token (Ray's token authentication)")
    try:
        cluster = localcluster.up(
            args.workers,
            cpus_per_node=args.cpus_per_node,
            token=args.token,
            host=args.host,
            dashboard=args.dashboard,
            gpus=args.gpus,
        )
    except localcluster.ClusterError as err:
        return error(str(err), EXIT_FAILED)
    except KeyboardInterrupt:
        print("\ninterrupted: what was started is stopped", file=sys.stderr)
        return 130
    print(cluster.address, flush=True)
    nodes = f"{len(cluster.nodes)} node{'s' if len(cluster.nodes) > 1 else ''} of {cluster.cpus_per_node} CPU"
    said = [f"a Ray cluster of {nodes} (the head and {len(cluster.nodes) - 1} more) at {cluster.address}"]
    if cluster.loopback:
        said.append("on loopback only: nothing outside this machine reaches it; no token")
        said.append(f"submit to it:  ablate sweep STUDY --address {cluster.address}   (or export RAY_ADDRESS=...)")
    else:
        said += [
            f"Ray's token authentication: every port refuses a request without the token in {cluster.token_file} "
            "(this user only: whoever has it runs code here)",
            f"from another machine (over a private network): export RAY_AUTH_TOKEN=<the token>; then ablate sweep "
            f"STUDY --address {cluster.address} --tracking-uri <an MLflow server every node reaches>, or add a "
            f"node: RAY_AUTH_MODE=token ray start --address={cluster.address} --block",
        ]
    said.append(f"stop it:       ablate cluster down {cluster.address}   (its processes only; never `ray stop`)")
    print("\n".join(said), file=sys.stderr)
    return EXIT_OK


def _add_cluster(sub) -> None:
    help = "start (up) or stop (down) a Ray cluster of several nodes on this machine, on loopback unless --token"
    p = _command(sub, "cluster", help, _cluster)
    p.add_argument("action", choices=["up", "down"], help="up: start one and print its address; down: stop it")
    p.add_argument("address", nargs="?", default=None, help="down: the address `up` printed (HOST:PORT)")
    p.add_argument("--workers", type=_whole, default=0, help="up: nodes besides the head (default 0)")
    p.add_argument(
        "--cpus-per-node", type=_count, default=None, help="up: CPUs of each node (default: this machine's, shared)"
    )
    p.add_argument(
        "--token",
        action="store_true",
        help="up: a head other machines reach, on this machine's address (or --host), with Ray's token "
        "authentication (the token in a file only you read)",
    )
    p.add_argument("--host", default=None, help="up --token: the address other machines reach the head at")
    p.add_argument("--dashboard", action="store_true", help="up: also start Ray's dashboard (on the head's address)")
    p.add_argument(
        "--gpus",
        type=_whole,
        default=None,
        help="up: GPUs the head declares to Ray (default: those it finds; declared ones that are not there let a "
        "machine without GPUs try a study's GPU placement, its trials training on the CPU)",
    )


def _whole(text: str) -> int:
    """A whole number from 0 up; argparse names the option."""
    if not text.strip().isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number from 0 up")
    return int(text)


def _add_demo(sub) -> None:
    p = _command(sub, "demo", "train a few model variants for a few steps on random copy data (no tracking)", _demo)
    p.add_argument("--steps", type=_count, default=30, help="optimisation steps per variant (default 30)")


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
    from ablations import secrets

    secrets.guard(args)
    if not hasattr(args, "func"):
        parser.print_help()
        return EXIT_BAD_INPUT
    if (refused := _load_plugins(args)) is not None:
        return refused
    try:
        if args.command in ("report", "compare", "heads") and (refused := ready(args)) is not None:
            return refused  # (run, sweep, search and ui ask once their own input is known good)
        return args.func(args)
    except KeyboardInterrupt:  # where a command has no word of its own for it (report, compare, heads): no traceback
        print("\ninterrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `ablate report | head`: the reader has what it wanted; no traceback, no more output
        with contextlib.suppress(OSError, ValueError):  # a stream without a file (a test's capture)
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except Exception as err:  # a database that stopped answering mid-work: its line, not a library's traceback
        from ablations.stores import away

        if (line := away(err)) is None:
            raise
        print(f"error: {line}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
