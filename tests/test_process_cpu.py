"""tests/process_cpu.py, the tool that says where the suite's CPU time goes."""

from __future__ import annotations

import resource
import sys

import pytest

from tests.process_cpu import Seen, kind, run

# Still between sleeps: the burning second falls between two samples even when a loaded machine (the rest of the
# suite) delays the sampler by far more than its interval (a burner that exited at once lost its last 0.1 s there)
BURN = (
    "import time\ntime.sleep(0.5)\nt = time.process_time()\nwhile time.process_time() - t < 1.0:\n    pass\n"
    "time.sleep(0.5)\n"
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_process_s_cpu_time_is_what_the_kernel_charged_it():
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    code, wall, entries = run([sys.executable, "-c", BURN], interval=0.05)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    charged = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)  # the oracle: the kernel's
    (burner,) = [e for e in entries if any("process_time" in c for c in e.commands)]
    assert code == 0 and charged >= 1.0
    # sampled every 0.05 s: at most what it spent before it was first seen (starting Python) is missed, never more
    # than it spent
    assert charged - 0.1 <= burner.cpu - burner.cpu0 <= charged + 0.02


@pytest.mark.parametrize(
    ("commands", "expected"),
    [
        (["ray::IDLE", "ray::ImplicitFunc.train"], "ray worker: ImplicitFunc"),
        (["ray::IDLE"], "ray worker: idle"),
        (["ray::run_trial"], "ray worker: run_trial"),
        (
            ["/venv/bin/python -u /venv/lib/python3.11/site-packages/ray/_private/log_monitor.py --x"],
            "ray daemon: log_monitor.py",
        ),
        (["/venv/lib/python3.11/site-packages/ray/core/src/ray/gcs/gcs_server --x"], "ray daemon: gcs_server"),
        (["/venv/bin/python -m ablate sweep s.yaml --tracking-uri sqlite:///m.db"], "ablate sweep"),
        (["/venv/bin/python /venv/bin/ablate search s.yaml"], "ablate search"),
        (["/venv/bin/python -m mlflow server --port 5000"], "mlflow server"),
        (["/venv/bin/python -m uvicorn --log-config x mlflow.server.fastapi_app:app"], "mlflow server"),
        (["/venv/bin/python -c import mlflow"], "python"),
        (["/usr/bin/sleep 1"], "sleep"),
    ],
)
def test_processes_are_named_by_what_they_ran(commands, expected):
    assert kind(Seen(pid=1, cpu0=0.0, cpu=1.0, commands=commands)) == expected
