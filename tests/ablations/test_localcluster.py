"""`ablate cluster up` starts a Ray cluster of several nodes on this machine, on loopback only, and `ablate cluster
down` stops exactly that cluster's processes, by PID: another Ray beside it keeps running (`ray stop` would have
stopped it too). The head stops on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from ablations import localcluster
from tests.conftest import ROOT

CONNECT = """
import sys
from ablations.cluster import connect, node_addresses
connection = connect(sys.argv[1])
import ray

@ray.remote(num_cpus=1)
def node():
    import time
    time.sleep(2)  # two at once: one on each node
    return ray.get_runtime_context().get_node_id()

print(sorted(node_addresses()), len(set(ray.get([node.remote() for _ in range(2)]))))
connection.close()
"""


def ablate(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    return subprocess.run(
        [sys.executable, "-m", "ablate", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**env, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
    )


def alive(pids: list[int]) -> list[int]:
    return [p for p in pids if localcluster.start_time(p) is not None and "Z" not in _state(p)]


def _state(pid: int) -> str:
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


def listeners(pids: list[int]) -> list[str]:
    """The addresses the processes listen on (ss), e.g. 127.0.0.1:41234."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout
    return [line.split()[3] for line in out.splitlines() if any(f"pid={p}," in line for p in pids)]


@pytest.mark.slow
def test_cluster_up_runs_on_loopback_and_down_stops_exactly_its_processes():
    other = ablate("cluster", "up")  # another Ray of this machine, which `ray stop` would have stopped too
    assert other.returncode == 0, other.stderr
    other_cluster = localcluster.find(other.stdout.strip())
    started = [other_cluster]
    try:
        up = ablate("cluster", "up", "--workers", "1", "--cpus-per-node", "1")
        assert up.returncode == 0, up.stderr
        address = up.stdout.strip()  # the address alone on stdout: export RAY_ADDRESS=$(ablate cluster up)
        assert address.startswith("127.0.0.1:") and "on loopback only" in up.stderr
        assert f"ablate cluster down {address}" in up.stderr
        cluster = localcluster.find(address)
        started.append(cluster)
        ours, theirs = localcluster.marked(cluster.mark), localcluster.marked(other_cluster.mark)
        assert len(cluster.nodes) == 2 and not set(ours) & set(theirs)

        # two nodes, both on loopback, each running a task; every listener of the cluster on 127.0.0.1
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        run = subprocess.run(
            [sys.executable, "-c", CONNECT, address], capture_output=True, text=True, timeout=180, cwd=ROOT, env=env
        )
        assert run.returncode == 0, run.stderr[-3000:]
        assert run.stdout.strip().splitlines()[-1] == "['127.0.0.1', '127.0.0.1'] 2"
        bound = listeners(localcluster.marked(cluster.mark))
        assert bound and all(a.startswith(("127.0.0.1:", "[::ffff:127.0.0.1]:")) for a in bound), bound

        # down: exactly this cluster's processes, by PID; the other Ray runs on
        down = ablate("cluster", "down", address)
        assert down.returncode == 0 and f"stopped the Ray cluster at {address}" in down.stderr, down.stderr
        assert localcluster.marked(cluster.mark) == [] and alive(ours) == []
        assert alive(theirs) == theirs
        assert ablate("cluster", "down", address).returncode == 2  # nothing there any more, said in one line

        # the head stops on SIGTERM, its processes with it
        os.kill(other_cluster.nodes[0].pid, signal.SIGTERM)
        deadline = time.monotonic() + 60
        while alive(theirs) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert alive(theirs) == []
    finally:  # whatever is left (a failed assertion), and the other cluster's record
        for cluster in started:
            localcluster.stop(cluster)
