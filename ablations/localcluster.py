"""``ablate cluster up`` and ``ablate cluster down``: a Ray cluster of several nodes on this machine, safe by default.

A plain ``ray start --head`` listens on every interface with no token (anyone who reaches the machine runs code on
it), ``ray stop`` stops every Ray on the machine (other users', other tests'), and a head started without
``--block`` leaves daemons that ignore the SIGTERM sent to the command. Here instead:

- Loopback (the default): every node on 127.0.0.1, every listener bound to 127.0.0.1 (nothing outside the machine
  reaches it), no token, free ports (6379 may be someone else's), a short temp dir of its own (Unix socket paths
  stay under 107 bytes). Ray keeps a node on loopback only in its single-node mode (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER
  =0, which ``ablations.cluster`` sets for every driver of a loopback cluster) and refuses a second node there; each
  extra node is started by this module's own entry point, which lifts that refusal and keeps 127.0.0.1 as given
  (``_loopback_node``: two names of Ray's private API, checked at start, tested on upgrade).
- ``--token``: a head other machines must reach, on this machine's address (or ``--host``), with Ray's token
  authentication: every port refuses a request without the token, kept in a file only this user reads.
- Each node is ``ray start --block`` in a session of its own: SIGTERM to it stops the node's processes (the head
  included), and ``down`` stops exactly this cluster's: its nodes by PID (checked against their start time), then
  any process that still carries the cluster's mark in its environment, and nothing else.

What ``up`` started is recorded in ``<temp>/abl-ray-<uid>/clusters/`` (``ablations.cluster.ray_temp_dir``), which
is how ``down ADDRESS`` finds it.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ablations.cluster import ray_temp_dir

MARK = "ABLATE_LOCAL_CLUSTER"  # in the environment of every process of a cluster: its id
QUIET = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_enable_metrics_collection": "0"}


class ClusterError(RuntimeError):
    """A cluster that could not be started (with the end of the log that says why) or found."""


class NodeStopped(ClusterError):
    """A node stopped while it started."""


@dataclass
class Node:
    pid: int
    started: str  # the process's start time (/proc/PID/stat): a PID reused by another process is not ours
    log: str


@dataclass
class LocalCluster:
    address: str
    temp_dir: str
    mark: str
    nodes: list[Node] = field(default_factory=list)  # the head first
    token_file: str | None = None
    cpus_per_node: int = 1

    @property
    def loopback(self) -> bool:
        return self.token_file is None

    def state_file(self) -> Path:
        return state_dir() / f"{self.address.replace(':', '_')}.json"

    def save(self) -> None:
        path = self.state_file()
        path.write_text(json.dumps(asdict(self), indent=1))
        path.chmod(0o600)

    @classmethod
    def load(cls, path: Path) -> LocalCluster:
        data = json.loads(path.read_text())
        data["nodes"] = [Node(**n) for n in data["nodes"]]
        return cls(**data)


def state_dir() -> Path:
    path = Path(ray_temp_dir()) / "clusters"
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


# --- ports, addresses, processes -----------------------------------------------------------------------------


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct free ports between Ray's worker ports (10002-19999) and the kernel's ephemeral range: a port
    picked by binding port 0 is an ephemeral one, which any outgoing connection may take before Ray binds it."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            ephemeral = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral = 32768
    pick = secrets.SystemRandom()
    ports: list[int] = []
    for _ in range(10_000):
        if len(ports) == n:
            return ports
        port = pick.randrange(20000, max(ephemeral, 20001))
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        if port not in ports:
            ports.append(port)
    raise ClusterError(f"found no {n} free ports on {host}")


def machine_address() -> str:
    """The address other machines reach this one at (the interface of the default route); no packet is sent."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))
            return s.getsockname()[0]
        except OSError:
            return socket.gethostbyname(socket.gethostname())


def start_time(pid: int) -> str | None:
    """The start time of process ``pid`` (clock ticks since boot), or None if there is none."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def marked(mark: str, var: str = MARK) -> list[int]:
    """PIDs of the live processes whose environment carries ``var=mark`` (this user's; Linux /proc)."""
    needle = f"{var}={mark}".encode()
    pids = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if int(entry.name) != os.getpid() and needle in (entry / "environ").read_bytes().split(b"\0"):
                pids.append(int(entry.name))
        except (OSError, ValueError):
            continue
    return pids


# --- up ---------------------------------------------------------------------------------------------------------


def up(
    workers: int = 0,
    *,
    cpus_per_node: int | None = None,
    token: bool = False,
    host: str | None = None,
    dashboard: bool = False,
    gpus: int | None = None,
    timeout: float = 120.0,
) -> LocalCluster:
    """Start a head and ``workers`` more nodes on this machine and wait until all are alive (ClusterError, with the
    end of the failing node's log, if one is not; what was started is stopped again). ``gpus``: the GPUs the head
    declares (default: those Ray finds; a machine without any may declare some to try a packing study's placement)."""
    host = host or (machine_address() if token else "127.0.0.1")
    if not token and host != "127.0.0.1":
        raise ClusterError(f"--host {host}: a cluster other machines reach needs --token (Ray's token authentication)")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    cpus = cpus_per_node or max(1, cores // (workers + 1))
    temp_dir = tempfile.mkdtemp(prefix="abl-rc-", dir="/tmp" if Path("/tmp").is_dir() else None)
    gcs, client, dash = free_ports(3, host)
    cluster = LocalCluster(f"{host}:{gcs}", temp_dir, uuid.uuid4().hex[:12], cpus_per_node=cpus)
    env = _node_environment(cluster, token, host)
    memory = _object_store_bytes(workers + 1)
    common = [
        "--block",
        f"--node-ip-address={host}",
        f"--num-cpus={cpus}",
        f"--object-store-memory={memory}",
        f"--temp-dir={temp_dir}",
        "--disable-usage-stats",
    ]
    head = [
        "--head",
        f"--port={gcs}",
        f"--ray-client-server-port={client}",
        f"--include-dashboard={'true' if dashboard else 'false'}",
        f"--dashboard-host={host}",
        f"--dashboard-port={dash}",
        *([] if gpus is None else [f"--num-gpus={gpus}"]),
    ]
    try:
        _add_node(cluster, [*head, *common], "head", env, False, timeout)
        worker = [f"--address={cluster.address}", "--num-gpus=0", *common]  # the head has the GPUs: each node
        for i in range(workers):  # would count them all again; one at a time: Ray gives a node 30 s to register
            _add_node(cluster, worker, f"worker{i + 1}", env, not token, timeout)
    except BaseException:  # a node that did not start, Ctrl-C: nothing is left running but the logs
        stop(cluster, keep_logs=True)
        raise
    return cluster


def _add_node(
    cluster: LocalCluster, args: list[str], name: str, env: dict[str, str], loopback_worker: bool, timeout: float
) -> None:
    """Start a node (``args`` and ports of its own) and wait until the cluster shows it; a worker that stopped while
    it started (Ray's 30 s to register ran out on a busy machine) is started once more, on other ports."""
    host = cluster.address.rpartition(":")[0]
    for attempt in (1, 2):
        log = Path(cluster.temp_dir) / f"{name}{'' if attempt == 1 else '-again'}.log"
        cluster.nodes.append(_start([*args, *node_ports(host)], log, env, loopback_worker))
        cluster.save()
        try:
            return _wait(cluster, len(cluster.nodes), timeout)
        except NodeStopped:
            if attempt == 2 or name == "head":
                raise
            node = cluster.nodes.pop()  # what it left is stopped; the cluster's other nodes run on
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(node.pid, signal.SIGKILL)


def _node_environment(cluster: LocalCluster, token: bool, host: str) -> dict[str, str]:
    """The nodes' environment: the cluster's mark, Ray's authentication (a new token, in a file only this user
    reads, for ``--token``; none on loopback, where Ray keeps every listener on 127.0.0.1), free metrics ports."""
    env = {**os.environ, **QUIET, MARK: cluster.mark}
    for k in ("RAY_ADDRESS", "RAY_AUTH_TOKEN"):
        env.pop(k, None)
    if token:
        cluster.token_file = str(state_dir() / f"{cluster.address.replace(':', '_')}.token")
        fd = os.open(cluster.token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
        env |= {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": Path(cluster.token_file).read_text()}
        env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "1"
    else:
        env |= {"RAY_AUTH_MODE": "disabled", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    return env | dict(zip(("AUTOSCALER_METRIC_PORT", "DASHBOARD_METRIC_PORT"), map(str, free_ports(2, host))))


def _object_store_bytes(nodes: int) -> int:
    """Each node's object store: Ray's default (30% of memory) for each would promise the machine's memory to
    several nodes; a share of it for each, at most 2 GB, at least Ray's minimum."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return int(max(100 * 2**20, min(2 * 2**30, 0.3 * total / nodes)))


def node_ports(host: str) -> list[str]:
    """A ``ray start``'s own ports, each free: the defaults of two nodes on one machine would collide."""
    nm, om, dag, dal, rte, met = free_ports(6, host)
    return [
        f"--node-manager-port={nm}",
        f"--object-manager-port={om}",
        f"--dashboard-agent-grpc-port={dag}",
        f"--dashboard-agent-listen-port={dal}",
        f"--runtime-env-agent-port={rte}",
        f"--metrics-export-port={met}",
    ]


def _start(args: list[str], log: Path, env: dict[str, str], loopback_worker: bool) -> Node:
    """``ray start`` as a session of its own (it outlives ``up``; the terminal's Ctrl-C does not reach it)."""
    entry = ["-m", "ablations.localcluster", "node"] if loopback_worker else ["-m", "ray.scripts.scripts"]
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, *entry, "start", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=log.parent,
            start_new_session=True,
        )
    return Node(proc.pid, start_time(proc.pid) or "", str(log))


def _wait(cluster: LocalCluster, n: int, timeout: float) -> None:
    """Until the cluster shows ``n`` alive nodes, asked from a separate process (this one stays free of Ray)."""
    code = (
        "import ray, sys, time; ray.init(address=sys.argv[1], logging_level='error', log_to_driver=False)\n"
        "deadline = time.monotonic() + float(sys.argv[3])\n"
        "while sum(n['Alive'] for n in ray.nodes()) < int(sys.argv[2]) and time.monotonic() < deadline:\n"
        "    time.sleep(0.5)\n"
        "print(sum(n['Alive'] for n in ray.nodes()))"
    )
    env = {**os.environ, **QUIET}
    env.pop("RAY_ADDRESS", None)
    if cluster.token_file:
        env |= {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": Path(cluster.token_file).read_text()}
    else:
        env |= {"RAY_AUTH_MODE": "disabled", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for node in cluster.nodes:
            if start_time(node.pid) != node.started or _exited(node.pid):
                said = [line for line in Path(node.log).read_text(errors="replace").splitlines() if line.strip()]
                raise NodeStopped(
                    f"a node of the cluster stopped while it started: {said[-1].strip() if said else 'no output'} "
                    f"(its log: {node.log})"
                )
        left = str(max(1.0, min(20.0, deadline - time.monotonic())))
        with contextlib.suppress(subprocess.TimeoutExpired):
            out = subprocess.run(
                [sys.executable, "-c", code, cluster.address, str(n), left],
                capture_output=True,
                text=True,
                env=env,
                timeout=float(left) + 60,
            )
            if out.returncode == 0 and out.stdout.strip().isdigit() and int(out.stdout.strip()) >= n:
                return
        time.sleep(0.5)
    raise ClusterError(f"the Ray cluster at {cluster.address} did not show {n} nodes in {timeout:g} s")


def _exited(pid: int) -> bool:
    """Whether a child of this process has exited (reaped here: no zombie left); False for another's process."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return False
    return done == pid


# --- down -------------------------------------------------------------------------------------------------------


def clusters() -> list[LocalCluster]:
    """The clusters ``up`` started on this machine for this user that still have a node alive."""
    out = []
    for path in sorted(state_dir().glob("*.json")):
        with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
            cluster = LocalCluster.load(path)
            if any(start_time(n.pid) == n.started for n in cluster.nodes) or marked(cluster.mark):
                out.append(cluster)
    return out


def find(address: str) -> LocalCluster:
    """The cluster ``up`` started at ``address`` (ray:// and a missing host allowed), else ClusterError."""
    plain = address.removeprefix("ray://").strip()
    if plain.isdigit():
        plain = f"127.0.0.1:{plain}"
    path = state_dir() / f"{plain.replace(':', '_')}.json"
    if path.exists():
        return LocalCluster.load(path)
    known = ", ".join(c.address for c in clusters()) or "none"
    raise ClusterError(
        f"no cluster started by `ablate cluster up` at {address} on this machine (running here: {known}); "
        "a cluster started otherwise is stopped the way it was started"
    )


def down(address: str, grace: float = 30.0) -> list[int]:
    """Stop the cluster ``up`` started at ``address`` (``stop``); ClusterError if there is none."""
    return stop(find(address), grace)


def stop(cluster: LocalCluster, grace: float = 30.0, keep_logs: bool = False) -> list[int]:
    """SIGTERM to each node's ``ray start --block`` (the workers first, the head last), SIGKILL to what is left of
    them after ``grace`` seconds, then to any process that still carries the cluster's mark. Returns the PIDs that
    were stopped; removes the cluster's records and temp dir (unless ``keep_logs``: a cluster that did not start)."""
    stopped = set(marked(cluster.mark))
    live = [n for n in reversed(cluster.nodes) if start_time(n.pid) == n.started]
    for node in live:
        with contextlib.suppress(ProcessLookupError):
            os.kill(node.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(start_time(n.pid) == n.started for n in live):
        for node in live:
            _exited(node.pid)
        time.sleep(0.2)
    for node in live:
        if start_time(node.pid) == node.started:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(node.pid, signal.SIGKILL)  # the node's session: its own processes only
    deadline = time.monotonic() + 10
    while (left := marked(cluster.mark)) and time.monotonic() < deadline:
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
    stopped |= {n.pid for n in live}
    if not keep_logs:
        shutil.rmtree(cluster.temp_dir, ignore_errors=True)
    for path in (cluster.state_file(), Path(cluster.token_file) if cluster.token_file else None):
        if path is not None:
            path.unlink(missing_ok=True)
    return sorted(stopped)


# --- a loopback node ---------------------------------------------------------------------------------------------


def _loopback_node() -> None:
    """Let ``ray start`` add a node to a loopback cluster, on 127.0.0.1 as given. Ray refuses a second node in the
    mode that keeps its listeners on loopback (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0), and outside it rewrites
    127.0.0.1 to the machine's external address (ray-project/ray#26293, #59110); no public setting does both."""
    import ray._private.ray_constants as ray_constants
    import ray._private.services as services

    if not hasattr(ray_constants, "ENABLE_RAY_CLUSTER") or not hasattr(services, "resolve_ip_for_localhost"):
        import ray

        raise SystemExit(
            f"ray {ray.__version__} no longer has the settings a loopback node needs: start a cluster of one node "
            "(ablate cluster up), or one that other machines reach (ablate cluster up --token)"
        )
    ray_constants.ENABLE_RAY_CLUSTER = True  # past the multi-node check that loopback mode sets off
    services.resolve_ip_for_localhost = lambda host: host  # 127.0.0.1 stays 127.0.0.1


if __name__ == "__main__":  # python -m ablations.localcluster node start ARGS: one loopback node of a cluster
    if sys.argv[1:2] != ["node"]:
        raise SystemExit("usage: python -m ablations.localcluster node start ARGS (ablate cluster up runs it)")
    _loopback_node()
    from ray.scripts.scripts import main

    sys.argv = ["ray", *sys.argv[2:]]
    sys.exit(main())
