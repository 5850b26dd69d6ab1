"""Every benchmark, one after another (``make bench``); each writes its results to benchmarks/results/.

    python benchmarks/run.py [--quick]

Run on a quiet machine: the benchmarks compare two things in the same run, but other load adds noise.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller versions (a smoke run; results marked quick)")
    args = parser.parse_args()
    quick = ["--quick"] if args.quick else []
    out = ["--out", str(HERE / "results" / "quick")] if args.quick else []  # never over the committed results
    jobs = [
        ["model.py", *quick, *out],
        ["logging_overhead.py", *(["--repeats", "1", "--steps", "100"] if args.quick else []), *out],
        ["sweep.py", "overhead", *(["--cells", "2", "--steps", "300"] if args.quick else []), *out],
        ["sweep.py", "scale", *(["--cells", "20"] if args.quick else []), *out],
        ["startup.py", *(["--repeats", "2"] if args.quick else []), *out],
        ["collector.py", *(["--repeats", "1"] if args.quick else []), *out],
    ]
    for job in jobs:
        print(f"== {' '.join(job)}", flush=True)
        code = subprocess.call([sys.executable, str(HERE / job[0]), *job[1:]])
        if code:
            print(f"{job[0]} failed with exit code {code}", file=sys.stderr)
            return code
    return 0


if __name__ == "__main__":
    sys.exit(main())
