"""What the benchmarks that time whole processes share: one Python process per measurement, the variants
alternating (after one warm-up each, for the file cache), CPU seconds (user + system, from the kernel's
accounting of children) and wall seconds of each."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def measure(code: str, cwd: str) -> tuple[float, float, str]:
    """(CPU seconds, wall seconds, standard output) of one Python process running ``code`` with the repository on
    its path."""
    before = os.times()
    t = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], cwd=cwd, check=True, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t
    after = os.times()
    return (
        (after.children_user - before.children_user) + (after.children_system - before.children_system),
        wall,
        out.stdout,
    )


def alternating(codes: dict[str, str], repeats: int, cwd: str) -> dict[str, list[tuple[float, float, str]]]:
    """``repeats`` measurements of each of ``codes``, taken in turn in ``cwd``, after one unrecorded run of each."""
    for code in codes.values():  # warm the file cache
        measure(code, cwd)
    rows: dict[str, list[tuple[float, float, str]]] = {name: [] for name in codes}
    for _ in range(repeats):
        for name, code in codes.items():
            rows[name].append(measure(code, cwd))
    return rows
