"""Ray, started on demand on this machine or reached at an address, loopback-only by default.

A local Ray binds every listener to 127.0.0.1 and advertises 127.0.0.1 only when
RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 is set before ``ray`` is imported (Ray otherwise rewrites 127.0.0.1 to
the machine's external address and listens on all interfaces: an exposed Ray cluster runs anyone's code).
So this module sets that, and the other quiet and safe defaults, before it imports ray, unless the user
asked for a remote cluster. Reaching a remote cluster (``--address`` / RAY_ADDRESS with a non-loopback
host) is the user's explicit choice; the code then travels in Ray's runtime environment.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import signal
import socket
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# what the runtime environment leaves behind when it ships the working directory to remote workers
RUNTIME_EXCLUDES = [
    ".venv",
    ".git",
    ".ablate",
    "**/__pycache__",
    "*.db",
    "docs",
    "benchmarks/results",
    ".pytest_cache",
    ".ruff_cache",
    "*.egg-info",
]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def is_loopback_address(address: str | None) -> bool:
    """True for no address (a local Ray) and for host:port addresses on 127.0.0.0/8 or localhost."""
    if not address or address == "local":
        return True
    if address == "auto":
        return False
    host = address.split("://")[-1].rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def prepare_environment(address: str | None) -> None:
    """Quiet, safe defaults; loopback-only Ray unless the address is remote. Call before importing ray."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_enable_metrics_collection", "0")
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # our own progress lines replace Tune's tables
    # Tune's default result loggers (CSV, JSON and TensorBoard files per trial under .ablate/ray_results): MLflow is
    # the record, nothing reads them, and they cost a sweep several CPU-seconds (tensorboardX, a write per result)
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    if is_loopback_address(address):
        if "ray" in sys.modules and os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER") != "0":
            raise RuntimeError(
                "ray was imported before the loopback settings could be applied; "
                "set RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 before importing ray"
            )
        # 127.0.0.1 everywhere (read at import). Ray has no public setting that keeps a node on loopback: it
        # rewrites --node-ip-address=127.0.0.1 to the machine's external address (ray-project/ray#26293,
        # ray-project/ray#59110); this variable, read by ray._private.services, is the one switch that works.
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
        # token authentication is for clusters reachable from elsewhere; a loopback cluster has none
        # (a loopback address may be an SSH tunnel to a cluster with a token: then keep token authentication)
        os.environ.setdefault("RAY_AUTH_MODE", "token" if os.environ.get("RAY_AUTH_TOKEN") else "disabled")
        # fixed default ports of the metrics servers: move them to free ones
        os.environ.setdefault("AUTOSCALER_METRIC_PORT", str(free_port()))
        os.environ.setdefault("DASHBOARD_METRIC_PORT", str(free_port()))


def import_for_driver(address: str | None, modules: list[str]) -> None:
    """Ray and ``modules`` imported with the garbage collector paused (ablations.process.import_paused), after Ray's
    settings for ``address``: what a sweep's or search's driver imports before it connects (2.93 -> 2.36 CPU-seconds
    a command on a 2-core machine, benchmarks/results/collector.md)."""
    from ablations.process import import_paused

    prepare_environment(address or os.environ.get("RAY_ADDRESS") or None)
    import_paused(["ray", *modules])


def ray_temp_dir() -> str:
    """Short (Unix socket paths must stay under 107 bytes), per user."""
    path = _ray_temp_path()
    path.mkdir(parents=True, exist_ok=True)
    return str(path)


def _ray_temp_path() -> Path:
    return Path(tempfile.gettempdir()) / f"abl-ray-{os.getuid() if hasattr(os, 'getuid') else 'u'}"


@dataclass
class Connection:
    address: str | None
    started_here: bool
    remote: bool
    dashboard_url: str | None
    owned: bool = True  # False: Ray was already connected by the caller, who disconnects it

    def describe(self) -> str:
        if self.started_here:
            return "local, started here"
        return self.address or "the Ray this process was already connected to"

    def close(self) -> None:
        import ray

        if self.owned and ray.is_initialized():
            ray.shutdown()


def connect(
    address: str | None = None,
    *,
    num_cpus: int | None = None,
    num_gpus: int | None = None,
    dashboard: bool = False,
    py_modules: list[str] | None = None,
) -> Connection:
    """Start a local Ray on loopback (no address), or join the cluster at ``address``; ``py_modules``: local files and
    package folders (plugins) that travel to a cluster's workers with the working directory."""
    address = address or os.environ.get("RAY_ADDRESS") or None
    prepare_environment(address)
    import ray

    if ray.is_initialized():
        return Connection(address, False, not is_loopback_address(address), None, owned=False)
    with _sigterm_kept():
        try:
            return _connect(address, num_cpus, num_gpus, dashboard, py_modules or [])
        except (RuntimeError, ConnectionError, TimeoutError, OSError) as err:  # its own one line, like every error
            raise RayStartError(_start_failure(address, err)) from None


class RayStartError(ValueError):
    """Ray did not start, or the cluster did not take this driver: said in one line, with where to look."""


def _start_failure(address: str | None, err: BaseException) -> str:
    first = next((line.strip() for line in str(err).splitlines() if line.strip()), type(err).__name__)
    where = (
        f"the cluster at {address}" if address else f"a local Ray (its logs: {_ray_temp_path()}/session_latest/logs)"
    )
    return (
        f"{where} did not start: {type(err).__name__}: {first[:300]}; a module imported at Python's start "
        "(sitecustomize, PYTHONPATH) delays every Ray process: load your own code as a plugin instead (--plugin, "
        "docs/plugins.md)"
    )


@contextlib.contextmanager
def _sigterm_kept():
    """The caller's SIGTERM handler survives ray.init. Ray's driver replaces it twice: with a Python handler that
    calls sys.exit, and with its C++ failure handler, which prints "*** SIGTERM received ***" with a stack trace
    and aborts the process (exit 134) after our clean-up. The CLI's handler makes SIGTERM stop a command the way
    Ctrl-C does (runs recorded as killed, exit 130): put back, it replaces both for SIGTERM only (Ray's C++
    handler stays for crashes: SIGSEGV, SIGABRT and the rest)."""
    main = threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signal.SIGTERM) if main else None
    try:
        yield
    finally:
        if callable(before):  # only a Python handler of the caller's; SIG_DFL and SIG_IGN stay Ray's business
            signal.signal(signal.SIGTERM, before)


def _connect(
    address: str | None, num_cpus: int | None, num_gpus: int | None, dashboard: bool, py_modules: list[str]
) -> Connection:
    import ray

    remote = not is_loopback_address(address)
    if address:  # a cluster started elsewhere: this working directory travels to its workers (the MLflow
        # credentials do not: runtime_env's env_vars are printed in every node's log; the trials get them in their
        # arguments, record.secrets.Credentials), and so do the plugins named by path (models.plugins)
        _quiet_packaging()
        runtime_env: dict = {"working_dir": str(ROOT), "excludes": RUNTIME_EXCLUDES}
        if py_modules:
            runtime_env["py_modules"] = list(py_modules)
        ctx = ray.init(address=address, runtime_env=runtime_env, log_to_driver=False, logging_level="warning")
        return Connection(address, False, remote, getattr(ctx, "dashboard_url", None))
    port = free_port() if dashboard else None
    ctx = ray.init(
        num_cpus=num_cpus,
        num_gpus=num_gpus,
        include_dashboard=dashboard,
        dashboard_host="127.0.0.1",
        dashboard_port=port,
        _temp_dir=ray_temp_dir(),
        log_to_driver=False,
        logging_level="warning",
    )
    return Connection(None, True, False, getattr(ctx, "dashboard_url", None))


class _Packaging(logging.Filter):
    """Ray 2.60 says, for every directory it now leaves out of a working directory by default (.git, .venv),
    that it does: they are left out here anyway (RUNTIME_EXCLUDES), so the note is noise."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "is now ignored by default when packaging" not in record.getMessage()


def _quiet_packaging() -> None:
    logging.getLogger("ray._private.runtime_env.working_dir").addFilter(_Packaging())


def node_addresses() -> list[str]:
    """The address every alive node advertises (for the loopback check)."""
    import ray

    return [n["NodeManagerAddress"] for n in ray.nodes() if n.get("Alive")]


def check_answers(address: str, timeout: float = 10.0) -> None:
    """Something listens at a cluster's address (its GCS; its Ray Client server for ray://), asked in seconds: Ray's
    driver waits for an address where nothing listens for minutes (5 min 30 s, measured), printing C++ warnings,
    then the sweep said only that it did not finish. "auto" (a cluster of this machine) is Ray's to find."""
    if "://" in address and not address.startswith("ray://"):  # Ray's docs set RAY_ADDRESS=http://...:8265 for jobs
        raise ValueError(
            f"{address} is an address of Ray's dashboard (its Jobs API), not of the cluster: give the head's "
            "host:6379, or ray://host:10001 (--address, RAY_ADDRESS)"
        )
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if address == "auto" or not port.isdigit():
        return
    try:
        with socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout=timeout):
            return
    except OSError as err:
        why = err.strerror or f"no answer in {timeout:g} s"
        raise ValueError(
            f"no Ray cluster answers at {address} ({why}): start it (ray start --head), or name the right one "
            "(--address, RAY_ADDRESS)"
        ) from None


class DoesNotFit(ValueError):
    """A trial asks for more than the Ray cluster that was started for it has: it would wait forever."""


def check_fits(address: str | None, num_cpus: int | None, cpus: float, gpus: float) -> None:
    """Before anything starts: refuse a trial that a local Ray could never hold (it would wait forever). A
    cluster at an address is not checked (it may grow), only asked whether it answers."""
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address:
        check_answers(address)
        return
    have_cpus = num_cpus or (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()) or 1
    if cpus > have_cpus:
        raise DoesNotFit(
            f"each trial needs {cpus:g} CPUs (resources.cpus), but the local Ray has {have_cpus}: it would wait "
            f"forever; lower resources.cpus{'' if num_cpus is None else ', or raise --cpus'}"
        )
    if gpus:
        import torch

        have_gpus = torch.cuda.device_count()
        if gpus > have_gpus:
            raise DoesNotFit(
                f"each trial needs {gpus:g} GPU(s) (resources.gpus), but this machine has {have_gpus}: it would "
                "wait forever; set resources.gpus to 0, or give the study a cluster with GPUs (--address)"
            )
