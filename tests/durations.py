"""Measure what each test costs and write tests/durations.json, the table tests/conftest.py orders the suite by
(the longest first). Run it on an otherwise idle machine:

    .venv/bin/python -m tests.durations            # every test, one at a time (about 15 minutes on 2 cores)
    .venv/bin/python -m tests.durations -m slow    # any pytest arguments: the tests measured again replace theirs

A test's cost is the larger of its wall time and the CPU time the whole machine spent while it ran (its servers,
Ray daemons and workers included): two test processes share two cores, so a test that keeps three processes busy
holds the machine longer than its wall time says. Tests under 3 s stay out of the table."""

from __future__ import annotations

import json
import os
import sys
import time

import pytest

from tests.conftest import DURATIONS

SHORTEST = 3.0


def _busy_seconds() -> float:
    """CPU seconds spent by the whole machine since boot, idle and I/O wait excluded (Linux: /proc/stat)."""
    with open("/proc/stat") as f:
        ticks = [int(v) for v in f.readline().split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


class Recorder:
    def __init__(self) -> None:
        self.cost: dict[str, float] = {}

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        busy, start = _busy_seconds(), time.monotonic()
        yield
        self.cost[item.nodeid] = max(_busy_seconds() - busy, time.monotonic() - start)


def main(args: list[str]) -> int:
    recorder = Recorder()
    code = pytest.main(["-p", "no:xdist", "-q", *args], plugins=[recorder])
    try:
        table = json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        table = {}
    for node, seconds in recorder.cost.items():
        table.pop(node, None)
        if seconds >= SHORTEST:
            table[node] = round(seconds)
    table = dict(sorted(table.items(), key=lambda kv: -kv[1]))
    DURATIONS.write_text(json.dumps(table, indent=1) + "\n")
    print(f"{DURATIONS}: {len(table)} tests of {SHORTEST:.0f} s or more ({len(recorder.cost)} measured now)")
    return int(code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
