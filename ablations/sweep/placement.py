"""Where trials can run: slots counted from CPUs and GPUs per node, and placements refused before anything
starts when they cannot work (more GPUs than any node has, stores only this machine can reach on a cluster of
several machines)."""

from __future__ import annotations

import math
import os
import socket
from urllib.parse import parse_qs, urlsplit

from ablations import stores
from ablations.cluster import DoesNotFit, is_loopback_address
from record.secrets import redact_url
from record.spec import Resources

EPS = 1e-9


def is_local(url: str) -> bool:
    """A store only this machine reaches: a SQLite or file store, a journal file, a path on local disk, and a
    server or database at a loopback address (a tunnel's end: on a worker, 127.0.0.1 is the worker)."""
    if os.environ.get("ABLATE_RAY_STORAGE") and url == os.environ["ABLATE_RAY_STORAGE"]:
        return False  # declared shared by the user
    if url.split(":", 1)[0] in stores.HOSTED:  # databricks: MLflow's hosted service
        return False
    return url.startswith(("sqlite:", "file:", "journal:")) or "://" not in url or _at_loopback(url)


def _at_loopback(url: str) -> bool:
    """A server or database at 127.0.0.1, localhost or ::1, or a database through a Unix socket (no host, or
    ``?host=/var/run/postgresql``): on a worker, each is the worker's own."""
    if url.startswith(("sqlite:", "file:")) or "://" not in url:
        return False
    parts = urlsplit(url)
    host = parts.hostname or parse_qs(parts.query).get("host", [""])[0]
    if not host:
        return not parts.scheme.startswith(("http", "ray"))  # a database with no host: this machine's socket
    return host.startswith("/") or is_loopback_address(f"{host}:0")


def _nodes() -> list[dict]:
    import ray

    return [n for n in ray.nodes() if n.get("Alive")]


def describe_cluster() -> str:
    nodes = _nodes()
    cpus = sum(n["Resources"].get("CPU", 0) for n in nodes)
    gpus = sum(n["Resources"].get("GPU", 0) for n in nodes)
    return f"{cpus:g} CPUs" + (f", {gpus:g} GPUs" if gpus else "") + f", {len(nodes)} node(s)"


def node_slots(node: dict[str, float], r: Resources) -> int:
    """Trials of ``r`` that fit on one node at once (a data-parallel trial's workers are counted alone)."""
    cpus = r.per_worker_cpus if r.workers > 1 else r.cpus
    gpus = r.per_worker_gpus if r.workers > 1 else r.gpus
    n = math.floor(node.get("CPU", 0) / cpus + EPS)
    if gpus:
        n = min(n, math.floor(node.get("GPU", 0) / gpus + EPS))
    return n


def trial_slots(r: Resources, limit: int | None = None, nodes: list[dict] | None = None) -> int:
    """Trials at once on the cluster: per node, floor(CPUs / cpus) and floor(GPUs / gpus), summed (a trial
    with gpus 0.25 on 2 GPUs: 8); data-parallel trials need all their workers placed."""
    per_node = sum(node_slots(n["Resources"], r) for n in (_nodes() if nodes is None else nodes))
    slots = per_node // r.workers if r.workers > 1 else per_node
    slots = max(1, slots)
    return min(slots, limit) if limit else slots


def _check_workers(r: Resources, nodes: list[dict]) -> None:
    """A data-parallel trial starts when all its workers are placed at once (across nodes): refuse one that needs
    more workers than the whole cluster holds, which would wait for ever."""
    if r.workers <= 1:
        return
    held = sum(node_slots(n["Resources"], r) for n in nodes)
    if held < r.workers:
        each = f"{r.per_worker_cpus:g} CPU" + (f", {r.per_worker_gpus:g} GPU" if r.gpus else "")
        per_node = "; ".join(
            f"{n['Resources'].get('CPU', 0):g} CPU, {n['Resources'].get('GPU', 0):g} GPU: {node_slots(n['Resources'], r)}"
            for n in nodes
        )
        raise DoesNotFit(
            f"a trial's {r.workers} data-parallel workers each need {each} ({r.describe()}), but the cluster holds "
            f"{held} such worker(s) at once (per node: {per_node}); lower resources.workers to {held} or add nodes"
        )


def check_placement(r: Resources, stores: dict[str, str], nodes: list[dict] | None = None) -> None:
    """Refuse, with the numbers, what could never run or would split across machines. ``stores``: what the
    trials write to, by name ("the MLflow store": URI, ...), checked when the cluster spans several machines.
    ``nodes``: Ray's description of the alive nodes (default: the connected cluster's)."""
    nodes = _nodes() if nodes is None else nodes
    gpus_per_node = [n["Resources"].get("GPU", 0) for n in nodes]
    need = r.per_worker_gpus if r.workers > 1 else r.gpus
    if need and need > max(gpus_per_node or [0]) + EPS:
        what = f"each of its {r.workers} workers needs {need:g}" if r.workers > 1 else f"each trial needs {need:g}"
        raise DoesNotFit(
            f"{what} GPU(s) (resources.gpus={r.gpus:g}), but no node of the cluster has that many "
            f"(GPUs per node: {', '.join(f'{g:g}' for g in gpus_per_node) or 'none'}); lower resources.gpus"
        )
    if not any(node_slots(n["Resources"], r) for n in nodes):
        raise DoesNotFit(
            f"no node can hold a trial of {r.describe()} (per node: "
            + "; ".join(f"{n['Resources'].get('CPU', 0):g} CPU, {n['Resources'].get('GPU', 0):g} GPU" for n in nodes)
            + "): lower resources.cpus or resources.gpus"
        )
    _check_workers(r, nodes)
    hosts = {n.get("NodeManagerHostname") for n in nodes}
    if hosts <= {socket.gethostname()}:
        return  # every node is this machine: local files are shared
    fixes = {
        "the MLflow store": "use an MLflow server: --tracking-uri http://...",
        "the claims store": "set ABLATE_CLAIMS_URL=postgresql://...",
        "the Optuna storage": "use --storage postgresql://...",
        "Ray Train's storage": "set ABLATE_RAY_STORAGE to a path every node shares",
    }
    loopback = "a loopback address reaches this machine only (a tunnel's end): name it as every node reaches it"
    local = [
        f"{name} {redact_url(url)} ({loopback if _at_loopback(url) else fixes.get(name, 'use a shared store')})"
        for name, url in stores.items()
        if is_local(url) and (name != "Ray Train's storage" or r.workers > 1)
    ]
    if local:
        raise DoesNotFit(
            f"the Ray cluster spans {len(hosts)} machines ({', '.join(sorted(h or '?' for h in hosts))}), which "
            "cannot reach what only this machine holds: " + "; ".join(local)
        )
