"""Where a command's CPU time goes, by the kind of process that spent it (Linux: /proc). For the test suite, which
is bound by the CPU and spends most of it starting processes:

    .venv/bin/python -m tests.process_cpu -- make test
    .venv/bin/python -m tests.process_cpu --json out.json -- .venv/bin/python -m pytest tests/ablations -m slow

Every process seen while the command runs is sampled (every 0.3 s) for its CPU time, its command lines (Ray renames
its workers after what they run: ``ray::ImplicitFunc.train`` is a Tune trial, ``ray::run_trial`` a search's) and
the test that started it (PYTEST_CURRENT_TEST in its environment; a Ray worker carries the variable of the test that
started its Ray). Every process on the machine is sampled, for what it spends while the command runs: run it on an
otherwise idle machine. What a process spends in its last 0.3 s is missed, so short processes are undercounted."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
RAY_DAEMONS = ("gcs_server", "raylet", "dashboard.py", "log_monitor.py", "monitor.py", "runtime_env")


@dataclass
class Seen:
    pid: int
    cpu0: float  # CPU seconds it had spent when first seen (a process older than the command)
    cpu: float
    commands: list[str] = field(default_factory=list)
    test: str = ""


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def sample(seen: dict[tuple[int, str], Seen]) -> None:
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = _read(f"/proc/{name}/stat").decode()
            fields = stat[stat.rfind(")") + 2 :].split()
            cpu = (int(fields[11]) + int(fields[12])) / TICK
            command = _read(f"/proc/{name}/cmdline").replace(b"\0", b" ").decode(errors="replace").strip()[:300]
            key = (int(name), fields[19])  # pid and start time: a pid used twice is two processes
            if key not in seen:
                env = _read(f"/proc/{name}/environ").split(b"\0")
                test = next((e[20:].decode(errors="replace") for e in env if e.startswith(b"PYTEST_CURRENT_TEST=")), "")
                seen[key] = Seen(int(name), cpu, cpu, test=test.split(" (")[0])
            entry = seen[key]
            entry.cpu = cpu
            if command and command not in entry.commands:
                entry.commands.append(command)
        except (OSError, IndexError, ValueError):  # it ended while being read, or is not ours to read
            continue


def kind(entry: Seen) -> str:
    """What a process was: a Ray worker by what it ran, a Ray daemon, an ``ablate`` command, a server, ..."""
    text = " | ".join(entry.commands)
    ray = sorted({m.split(".")[0] for m in re.findall(r"ray::([A-Za-z_][\w.]*)", text)} - {"IDLE"})
    if "ray::" in text:
        return "ray worker: " + (", ".join(ray) or "idle")
    if daemon := next((d for d in RAY_DAEMONS if d in text), None):
        return f"ray daemon: {daemon}"
    if m := re.search(r"(?:-m ablate|bin/ablate) (\w+)", text):
        return f"ablate {m.group(1)}"
    if "execnet" in text or "exec(eval(sys.stdin.readline()))" in text:
        return "pytest-xdist worker"
    servers = {"mlflow server": "mlflow server", "uvicorn": "mlflow server", "optuna": "optuna-dashboard"}
    if server := next((v for k, v in servers.items() if k in text and "import" not in text), None):
        return server
    for name in ("pytest", "postgres", "chrom", "cc1plus"):
        if name in text:
            return name
    return os.path.basename(next((c.split()[0] for c in entry.commands if c.split()), "?"))


def run(command: list[str], interval: float = 0.3) -> tuple[int, float, list[Seen]]:
    """Run ``command``, sampling every process meanwhile: (its exit code, its wall seconds, the processes seen)."""
    seen: dict[tuple[int, str], Seen] = {}
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            sample(seen)
            stop.wait(interval)

    sampler = threading.Thread(target=loop, daemon=True)
    started = time.monotonic()
    sampler.start()
    try:
        code = subprocess.call(command)
    finally:
        stop.set()
        sampler.join()
    sample(seen)
    me = os.getpid()
    return code, time.monotonic() - started, [e for e in seen.values() if e.pid != me and e.cpu > e.cpu0]


def table(entries: list[Seen], by, top: int) -> list[tuple[float, int, str]]:
    cpu, count = Counter(), Counter()
    for e in entries:
        cpu[by(e)] += e.cpu - e.cpu0
        count[by(e)] += 1
    return [(round(v, 1), count[k], k) for k, v in cpu.most_common(top)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--top", type=int, default=30, help="rows per table (default 30)")
    parser.add_argument("--json", help="also write every process seen to this file")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to measure after --, e.g. -- make test")
    code, wall, entries = run(command)
    total = sum(e.cpu - e.cpu0 for e in entries)
    print(f"\n{' '.join(command)}: exit {code}, {wall:.0f} s wall, {total:.0f} CPU-s in {len(entries)} processes")
    print("\nCPU-s  processes  kind")
    for cpu, n, k in table(entries, kind, args.top):
        print(f"{cpu:7.1f} {n:5d}  {k}")
    print("\nCPU-s  processes  started during the test (processes outside pytest's own)")
    for cpu, n, k in table([e for e in entries if e.test], lambda e: e.test, args.top):
        print(f"{cpu:7.1f} {n:5d}  {k}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{**e.__dict__, "kind": kind(e)} for e in entries], f, indent=1)
    return code


if __name__ == "__main__":
    sys.exit(main())
