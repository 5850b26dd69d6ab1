"""The commands that read what was recorded: ``report``, ``heads``, ``compare``, and the ``ui`` to browse it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ablate import options
from ablate.exits import OK, error, ready


def report(args: argparse.Namespace) -> int:
    from ablations import tracking
    from dashboards.render import RENDERERS
    from dashboards.report import make_report
    from record.runs import NoResults

    uri = tracking.resolve_uri(args.tracking_uri)
    for line in _recorded_plugins(uri, args.study):
        print(f"note: {line}", file=sys.stderr)
    try:
        made = make_report(
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
    table = RENDERERS[args.format](made.table)  # alone on stdout: `--format csv > table.csv` is the table
    print(table, end="" if table.endswith("\n") else "\n")
    beside = ", ".join(sorted(p.name for k, p in made.files.items() if k != "html"))
    print(f"report: {made.files['html'].resolve()}  (beside it: {beside})", file=sys.stderr)
    if made.parent_run_id:
        from ablations.ui import browse_hint

        hint = browse_hint(uri, args.study, made.parent_run_id)
        print(f"in MLflow: {hint}  (the parent run's artifacts: report/report.html)", file=sys.stderr)
    return OK


def _recorded_plugins(uri: str, study: str) -> list[str]:
    """The plugins the study's last submission loaded, loaded here too where their files are (their warnings speak
    in the report); what could not be, said."""
    from ablations import stores
    from models import plugins
    from record.recorded import recorded_plugins

    said = []
    for ref in recorded_plugins(uri, study) if stores.store_exists(uri) else []:
        try:
            plugins.load([ref["path"] or ref["module"]], what="the study's last submission")
        except plugins.PluginError as err:
            said.append(f"{err} (its warnings are not in this report; --plugin names it)")
    return said


def report_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("study", help="the study's name (its MLflow experiment)")
    p.add_argument("--metric", default=None, help="default: the study's metric")
    p.add_argument("--baseline", default=None, help="the variant to compare against (default: the study's first)")
    p.add_argument("--submission", type=options.count, default=None, help="only the cells of this submission")
    p.add_argument(
        "--format",
        default="markdown",
        choices=["markdown", "terminal", "latex", "csv", "html"],
        help="what to print (every format is written to the report folder)",
    )
    p.add_argument("--out", type=Path, default=None, help="report folder (default: .ablate/reports/STUDY)")
    p.add_argument("--no-log", action="store_true", help="do not log the report to the study's parent run")
    options.tracking_uri(p)


def heads(args: argparse.Namespace) -> int:
    """``ablate heads``: each head removed alone; with ``--prune``, pruning curves and one head per module. The
    models are evaluated on the running side (``ablations.evaluate``, ``ablations.pruning``), which records what it
    measures with each cell's run; the comparing side reads it and judges."""
    from ablations import tracking
    from ablations.evaluate import check_options, evaluate_study_heads
    from ablations.pruning import evaluate_study_pruning
    from dashboards.heads import format_heads, head_ablation, save_heads
    from dashboards.pruning import format_pruning, save_pruning, study_pruning
    from record.runs import NoResults

    uri = tracking.resolve_uri(args.tracking_uri)
    try:
        check_options(uri, args.study, args.metric, args.prune)  # before minutes of evaluation
        evaluate_study_heads(uri, args.study, args.metric)
        effects, info = head_ablation(uri, args.study, args.metric)
        text = format_heads(effects, info)
        print(text)
        saved = [save_heads(uri, args.study, text, effects, args.out)]
        if args.prune:
            print(f"pruning every model's heads 10% at a time, measured on {args.prune} ...", flush=True)
            evaluate_study_pruning(uri, args.study, args.prune)
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
    return OK


def heads_options(p: argparse.ArgumentParser) -> None:
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
    options.tracking_uri(p)


def compare(args: argparse.Namespace) -> int:
    from ablations import tracking
    from dashboards.compare import compare as changes_between
    from dashboards.compare import format_changes
    from record.runs import NoResults

    uri = tracking.resolve_uri(args.tracking_uri)
    try:
        a, _, changes = changes_between(uri, args.a, args.b, args.metric)
    except (NoResults, ValueError) as err:
        return error(str(err))
    print(format_changes(args.a, args.b, a.metric, changes))
    return OK


def compare_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("a", help="a study name, or NAME@SUBMISSION")
    p.add_argument("b", help="a study name, or NAME@SUBMISSION")
    p.add_argument("--metric", default=None, help="default: the first study's metric")
    options.tracking_uri(p)


def ui(args: argparse.Namespace) -> int:
    from ablations.ui import serve_mlflow, serve_optuna

    if args.optuna and (args.experiment or args.run):
        return error("an experiment or --run opens MLflow's UI, not optuna-dashboard: leave out --optuna, or them")
    if args.storage and not args.optuna:
        return error("--storage is the searches' Optuna storage: add --optuna to open optuna-dashboard on it")
    if not args.optuna and (refused := ready(args.tracking_uri, reads=True)) is not None:
        return refused
    try:
        if args.optuna:
            return serve_optuna(args.storage, args.host, args.port)
        return serve_mlflow(args.tracking_uri, args.host, args.port, experiment=args.experiment, run_id=args.run)
    except ValueError as err:  # a --host it cannot serve on
        return error(str(err))


def ui_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("experiment", nargs="?", default=None, help="open this study's (or run's) experiment")
    p.add_argument("--run", default=None, help="open this run of the experiment")
    p.add_argument("--tracking-uri", default=None, help="default: $MLFLOW_TRACKING_URI, else .ablate/mlflow.db")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument(
        "--port",
        type=options.port,
        default=None,
        help="default 5000 (MLflow; $ABLATE_UI_PORT), 8080 (--optuna), else a free one",
    )
    p.add_argument("--optuna", action="store_true", help="start optuna-dashboard on the searches' storage instead")
    p.add_argument("--storage", default=None, help="with --optuna: the Optuna storage (default .ablate/optuna.db)")
