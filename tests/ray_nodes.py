"""A real multi-node Ray cluster on one machine, loopback only: ``ray start --head`` and ``ray start --address``
as processes on free ports, stopped by their PID (never ``ray stop``, which kills every Ray on the machine).

Run as a script, this module is ``ray start`` for an extra node on 127.0.0.1. Ray refuses a second node when
RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 (which keeps it on loopback) and rewrites 127.0.0.1 to the machine's
external address without it; the two patched names below (private API of ray 2.60, re-check on upgrade)
keep the node on 127.0.0.1. Real clusters span machines and need neither.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

ENV = {
    "RAY_AUTH_MODE": "disabled",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_enable_metrics_collection": "0",
}


def _free_ports(n: int) -> list[int]:
    from tests.conftest import free_ports

    return free_ports(n)  # below the ephemeral range: no outgoing connection takes them before Ray binds them


def _node_ports() -> list[str]:
    from ablations.localcluster import node_ports  # imported here: this file also runs as Ray's script

    return node_ports("127.0.0.1")


@dataclass
class Cluster:
    address: str
    temp_dir: str
    nodes: list[subprocess.Popen] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)

    def stop_node(self, index: int, timeout: float = 60.0) -> None:
        """SIGTERM one node's ``ray start --block``: it drains and leaves the cluster."""
        proc = self.nodes[index]
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


def _start(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    with open(log, "w") as out:
        return subprocess.Popen(
            args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ, **env}
        )


def wait_for_nodes(address: str, n: int, timeout: float = 90.0) -> None:
    """Until the cluster at ``address`` shows ``n`` alive nodes, asked from a separate process (this one may join
    another Ray), which connects once and asks again every 0.5 s (a new process per question cost about a CPU-second
    each, 14 of them in a run of the suite)."""
    code = (
        "import ray, sys, time; ray.init(address=sys.argv[1], logging_level='error'); n = int(sys.argv[2]); "
        "deadline = time.monotonic() + float(sys.argv[3])\n"
        "while sum(1 for x in ray.nodes() if x['Alive']) < n and time.monotonic() < deadline: time.sleep(0.5)\n"
        "print(sum(1 for x in ray.nodes() if x['Alive']))"
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = str(max(1.0, deadline - time.monotonic()))
        out = subprocess.run(
            [sys.executable, "-c", code, address, str(n), left],
            capture_output=True, text=True, env={**os.environ, **ENV}, timeout=timeout + 60,
        )  # fmt: skip
        if out.returncode == 0 and out.stdout.strip().isdigit() and int(out.stdout.strip()) >= n:
            return
        time.sleep(1)  # the head is not up yet: it could not connect
    raise TimeoutError(f"the Ray cluster at {address} did not reach {n} nodes in {timeout} s")


@contextmanager
def ray_cluster(log_dir: Path, nodes: int = 2, cpus_per_node: int = 1, dashboard: bool = True, head_gpus: int = 0):
    """A head and ``nodes - 1`` more nodes on 127.0.0.1, free ports, a short temp dir of their own. ``head_gpus``:
    GPUs the head declares to Ray (there or not: trials placed on them train on the CPU without CUDA)."""
    temp_dir = tempfile.mkdtemp(prefix="abl-rc-", dir="/tmp")  # Unix socket paths must stay short
    gcs, cli, aut, dsh, dash = _free_ports(5)
    env = {**ENV, "AUTOSCALER_METRIC_PORT": str(aut), "DASHBOARD_METRIC_PORT": str(dsh)}
    address = f"127.0.0.1:{gcs}"
    cluster = Cluster(address, temp_dir)
    ray = [sys.executable, "-m", "ray.scripts.scripts"]
    common = [
        "--block",
        "--node-ip-address=127.0.0.1",
        f"--num-cpus={cpus_per_node}",
        f"--temp-dir={temp_dir}",
        "--disable-usage-stats",
    ]
    try:
        log = log_dir / "ray-head.log"
        cluster.logs.append(log)
        cluster.nodes.append(
            _start(
                [
                    *ray,
                    "start",
                    "--head",
                    f"--port={gcs}",
                    f"--ray-client-server-port={cli}",
                    f"--include-dashboard={'true' if dashboard else 'false'}",
                    "--dashboard-host=127.0.0.1",
                    f"--dashboard-port={dash}",
                    *_node_ports(),
                    f"--num-gpus={head_gpus}",
                    *common,
                ],
                log,
                env,
            )
        )
        wait_for_nodes(address, 1)
        for i in range(1, nodes):
            log = log_dir / f"ray-node{i}.log"
            cluster.logs.append(log)
            cluster.nodes.append(
                _start(
                    [
                        sys.executable,
                        __file__,
                        "start",
                        f"--address={address}",
                        *_node_ports(),
                        "--num-gpus=0",
                        *common,
                    ],
                    log,
                    env,
                )
            )
        wait_for_nodes(address, nodes)
        yield cluster
    finally:
        for i in reversed(range(len(cluster.nodes))):  # extra nodes first, the head last
            cluster.stop_node(i)
        shutil.rmtree(temp_dir, ignore_errors=True)


if __name__ == "__main__":
    # No public Ray setting starts several nodes on loopback: `ray start --node-ip-address=127.0.0.1` is
    # rewritten to the machine's external address (ray-project/ray#26293, ray-project/ray#59110), and the
    # loopback switch (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0) refuses a second node. This test helper patches the
    # two internals involved, in its own process only.
    import ray._private.ray_constants as ray_constants
    import ray._private.services as services

    ray_constants.ENABLE_RAY_CLUSTER = True  # pass the multi-node check that loopback mode sets off
    services.resolve_ip_for_localhost = lambda host: host  # keep 127.0.0.1 as given
    from ray.scripts.scripts import main

    sys.exit(main())
