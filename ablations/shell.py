"""What a sweep and a search share around their work (the submission shell): where they run and record, checked
before anything is written; the Ray connection, with the placement checks; and its close, before the records
that end a submission are written (a trial still starting would otherwise open its run after them)."""

from __future__ import annotations

import os
from collections.abc import Callable

from ablations.cluster import Connection, check_answers, connect, is_loopback_address
from record.secrets import redact_url
from record.spec import Resources


def cluster_address(address: str | None) -> str | None:
    """The cluster to join: ``--address``, else RAY_ADDRESS; None: a local Ray on loopback."""
    return address or os.environ.get("RAY_ADDRESS") or None


def refuse_unreachable(address: str | None, stores: list[str], fix: str, *, ask: bool = True) -> None:
    """A remote cluster cannot write to a file or a server at this machine's 127.0.0.1: refused before anything
    is written, with ``fix``. At an address, whether it answers is asked first (``ask``: not asked yet)."""
    from ablations.sweep.placement import is_local  # (the sweep package imports this module)

    if address and ask:
        check_answers(address)
    local = [redact_url(u) for u in stores if is_local(u)]
    if not is_loopback_address(address) and local:
        raise ValueError(
            f"the Ray cluster at {address} cannot write to {', '.join(local)}, which only this machine reaches; {fix}"
        )


def open_ray(
    address: str | None, num_cpus: int | None, resources: Resources, stores: dict[str, str], *, dashboard: bool
) -> Connection:
    """Ray (local on loopback, or the cluster at ``address``), once the cluster can place a trial, reach ``stores``
    (name -> URL) and load the plugins on every node; closed again when it cannot."""
    from ablations.sweep.placement import check_placement
    from models import plugins

    paths = [p.path for p in plugins.LOADED.values() if p.path is not None]
    conn = connect(address, num_cpus=num_cpus, dashboard=dashboard, py_modules=paths)
    try:
        check_placement(resources, stores)
        if plugins.LOADED:
            check_plugins_on_nodes(plugins.refs())
    except BaseException:
        conn.close()
        raise
    return conn


class WorkerEnvironmentError(ValueError):
    """Something no variant causes stops a submission: a node that cannot load a plugin, or finds another version."""


def check_plugins_on_nodes(refs: list) -> None:
    """Each alive node loads the plugins as its trials will (``models.plugins.load_refs``), before any trial runs;
    WorkerEnvironmentError naming the node and the fix when one cannot."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    @ray.remote(num_cpus=0, max_retries=0)
    def probe(refs_):
        from models import plugins

        try:
            plugins.load_refs(refs_)
        except Exception as err:  # anything its import raised on that node
            return f"{type(err).__name__}: {err}"
        return None

    asks = {
        f"{n['NodeManagerAddress']} ({n.get('NodeManagerHostname', '?')})": probe.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
        ).remote(refs)
        for n in ray.nodes()
        if n.get("Alive")
    }
    for node, ask in asks.items():
        why = ray.get(ask, timeout=600)
        if why is not None:
            raise WorkerEnvironmentError(
                f"node {node} cannot load the plugins, so no trial would train there: {why}; fix that node's "
                "environment (install the plugin's package there, or name the plugin by path so that it travels "
                "with the submission), then submit again: no cell was recorded"
            )


def close_ray(conn: Connection | None, out: Callable[[str], None]) -> None:
    """Disconnect, saying so where it fails: the records written next matter more than a clean disconnect."""
    if conn is None:
        return
    try:
        conn.close()
    except Exception as err:
        out(f"Ray did not shut down cleanly ({type(err).__name__}: {err}); recording the submission anyway")


__all__ = ["close_ray", "cluster_address", "open_ray", "refuse_unreachable"]
