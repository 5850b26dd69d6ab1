"""The commands that train: ``run``, ``sweep``, ``search``, and the local ``cluster`` and ``demo`` they use."""

from __future__ import annotations

import argparse
import sys

from ablate import options
from ablate.exits import FAILED, OK, error, interrupted, ready


def run(args: argparse.Namespace) -> int:
    from record.spec import SpecError, load_run

    try:
        config = load_run(args.config, args.set)
    except SpecError as err:
        return error(err)
    if (refused := ready(args.tracking_uri)) is not None:
        return refused
    from ablations.process import import_paused, training_modules

    import_paused(training_modules(args.tracking_uri))  # torch, Lightning, MLflow: with the collector paused
    from ablations.train import Tracking, train
    from models.tasks import DataUnavailable

    where = Tracking(uri=args.tracking_uri, experiment=args.experiment)
    print(
        f"training {config.model.describe()} on {config.task.describe()} for {config.training.max_steps} steps "
        f"(seed {config.seed})"
    )
    try:
        result = train(config, where, progress=not args.no_progress)
    except DataUnavailable as err:
        return error(f"{args.config}: task.source: {err}")
    except KeyboardInterrupt:
        return interrupted("the run is recorded as killed")
    except Exception as err:  # recorded in MLflow as failed, with the traceback as an artifact
        return error(f"the run failed: {type(err).__name__}: {err}", FAILED)
    from ablations.ui import print_summary

    print_summary(result)
    return OK


def run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="a run file, e.g. ablations/runs/quickstart.yaml")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a key, e.g. --set model.n_heads=8 --set training.lr=3e-4 (repeatable)",
    )
    options.tracking_uri(p)
    p.add_argument("--experiment", default=None, help="MLflow experiment (default: the run's name)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def sweep(args: argparse.Namespace) -> int:
    from record.spec import SpecError, load_study

    try:
        study = load_study(args.study, seeds=args.seeds)
    except SpecError as err:
        return error(err)
    if args.pilot is not None and not args.dry_run:
        return error("--pilot SUBMISSION says what a dry run plans from: add --dry-run")
    if (refused := ready(args.tracking_uri, address=args.address, trains=not args.dry_run)) is not None:
        return refused
    if args.amend is not None:  # the command's reason stands for the file's
        import dataclasses

        study = dataclasses.replace(study, amend=args.amend)
    return _dry_run(study, args) if args.dry_run else _submit(study, args)


def _dry_run(study, args: argparse.Namespace) -> int:
    from ablations.sweep.preview import dry_run

    problems = dry_run(
        study,
        tracking_uri=args.tracking_uri,
        claims_url=args.claims,
        reuse_any_code=args.reuse_any_code,
    )
    if pilot := _pilot(study, args.tracking_uri, args.pilot):
        print(pilot)
    return max([OK] + [error(problem, FAILED) for problem in problems])  # 1 where one would stop it


def _submit(study, args: argparse.Namespace) -> int:
    from ablations import sweep as sweeps

    try:
        _import_driver(args, "ray.tune")  # inside: Ctrl-C and a bad URI get the messages below, as in run_study
        result = sweeps.run_study(
            study,
            address=args.address,
            tracking_uri=args.tracking_uri,
            max_concurrent=args.max_concurrent,
            num_cpus=args.cpus,
            claims_url=args.claims,
            reuse_any_code=args.reuse_any_code,
        )
    except ValueError as err:
        return error(str(err))
    except KeyboardInterrupt:
        return interrupted("run the same command again to train the missing cells")
    print()
    print(sweeps.format_rows(study, result.rows))
    counts = ", ".join(f"{n} {s}" for s, n in sorted(result.counts.items()) if n)
    print(f"\n{study.name}: {counts}")
    from ablations.ui import browse_hint

    flag = "" if args.tracking_uri is None else " --tracking-uri " + args.tracking_uri
    print(f"report: ablate report {study.name}{flag}   browse: {browse_hint(result.tracking_uri, study.name)}")
    return OK if result.complete else FAILED


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


def _import_driver(args: argparse.Namespace, *modules: str) -> None:
    from ablations.cluster import import_for_driver
    from ablations.process import tracking_modules

    import_for_driver(args.address, [*tracking_modules(args.tracking_uri), *modules])


def sweep_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("study", help="a study file, e.g. ablations/studies/quickstart.yaml")
    p.add_argument("--dry-run", action="store_true", help="list the cells and what is done; start nothing")
    options.address_and_cpus(p)
    p.add_argument("--max-concurrent", type=options.count, default=None, help="trials at once (default: the study's)")
    p.add_argument("--seeds", type=options.seeds, help="override the study's seeds: a count (3) or a list (0,1,2)")
    p.add_argument(
        "--pilot",
        type=options.count,
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


def search(args: argparse.Namespace) -> int:
    from record.spec import SpecError, load_search

    try:
        spec = load_search(args.spec)
    except SpecError as err:
        return error(err)
    if args.n_trials is not None:
        spec.set_trials(args.n_trials)
    # a search's dry run says an address that does not answer in its own words
    if (refused := ready(args.tracking_uri, address=args.address, trains=not args.dry_run)) is not None:
        return refused
    if args.dry_run:
        from ablations.search.preview import describe_search

        problems = describe_search(spec, args.storage, args.tracking_uri, args.address, args.cpus)
        return max([OK] + [error(problem, FAILED) for problem in problems])  # 1 where one would stop it
    from ablations.search import format_outcome, run_search

    try:
        _import_driver(args, "optuna")
        result = run_search(
            spec, address=args.address, tracking_uri=args.tracking_uri, storage=args.storage, num_cpus=args.cpus
        )
    except ValueError as err:
        return error(str(err))
    except KeyboardInterrupt:
        return interrupted("run the same command again to resume the search")
    print(format_outcome(spec, result, storage_given=args.storage is not None))
    return OK if result.best else FAILED


def search_options(p: argparse.ArgumentParser) -> None:
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
        "--n-trials", type=options.count, default=None, help="override the spec's n_trials (the total for the study)"
    )
    options.address_and_cpus(p)


def cluster(args: argparse.Namespace) -> int:
    """``ablate cluster up``: the address alone on stdout (``export RAY_ADDRESS=$(ablate cluster up)``), how to use
    and stop it on stderr. ``ablate cluster down ADDRESS``: exactly that cluster's processes."""
    from ablations import localcluster

    if args.action == "down":
        return _cluster_down(args.address)
    if args.address is not None:
        return error("ablate cluster up takes no address: it prints the one it starts (ablate cluster down ADDRESS)")
    if args.host and not args.token:
        return error(f"--host {args.host}: a cluster other machines reach needs --token (Ray's token authentication)")
    try:
        started = localcluster.up(
            args.workers,
            cpus_per_node=args.cpus_per_node,
            token=args.token,
            host=args.host,
            dashboard=args.dashboard,
            gpus=args.gpus,
        )
    except localcluster.ClusterError as err:
        return error(str(err), FAILED)
    except KeyboardInterrupt:
        return interrupted("what was started is stopped")
    print(started.address, flush=True)
    print("\n".join(_how_to_use(started)), file=sys.stderr)
    return OK


def _cluster_down(address: str | None) -> int:
    from ablations import localcluster

    if address is None:
        running = ", ".join(c.address for c in localcluster.clusters()) or "none"
        return error(f"ablate cluster down ADDRESS: name the cluster to stop (started here: {running})")
    try:
        stopped = localcluster.down(address)
    except localcluster.ClusterError as err:
        return error(str(err))
    print(f"stopped the Ray cluster at {address} ({len(stopped)} processes)", file=sys.stderr)
    return OK


def _how_to_use(started) -> list[str]:
    nodes = f"{len(started.nodes)} node{'s' if len(started.nodes) > 1 else ''} of {started.cpus_per_node} CPU"
    said = [f"a Ray cluster of {nodes} (the head and {len(started.nodes) - 1} more) at {started.address}"]
    if started.loopback:
        said.append("on loopback only: nothing outside this machine reaches it; no token")
        said.append(f"submit to it:  ablate sweep STUDY --address {started.address}   (or export RAY_ADDRESS=...)")
    else:
        said += [
            f"Ray's token authentication: every port refuses a request without the token in {started.token_file} "
            "(this user only: whoever has it runs code here)",
            f"from another machine (over a private network): export RAY_AUTH_TOKEN=<the token>; then ablate sweep "
            f"STUDY --address {started.address} --tracking-uri <an MLflow server every node reaches>, or add a "
            f"node: RAY_AUTH_MODE=token ray start --address={started.address} --block",
        ]
    said.append(f"stop it:       ablate cluster down {started.address}   (its processes only; never `ray stop`)")
    return said


def cluster_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["up", "down"], help="up: start one and print its address; down: stop it")
    p.add_argument("address", nargs="?", default=None, help="down: the address `up` printed (HOST:PORT)")
    p.add_argument("--workers", type=options.whole, default=0, help="up: nodes besides the head (default 0)")
    p.add_argument(
        "--cpus-per-node",
        type=options.count,
        default=None,
        help="up: CPUs of each node (default: this machine's, shared)",
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
        type=options.whole,
        default=None,
        help="up: GPUs the head declares to Ray (default: those it finds; declared ones that are not there let a "
        "machine without GPUs try a study's GPU placement, its trials training on the CPU)",
    )


def demo(args: argparse.Namespace) -> int:
    from ablations.demo import demo as train_variants

    train_variants(steps=args.steps)
    return OK


def demo_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps", type=options.count, default=30, help="optimisation steps per variant (default 30)")
