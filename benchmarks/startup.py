"""What a command costs before any work starts: ``ablate sweep --dry-run`` (the validation and planning every
submission does first) against the same command made to import torch first, as every command did before the
config learned to validate without torch (``models.traits``). Alternating, one process per measurement,
CPU seconds (user + system) of the process as well as its wall time.

    python benchmarks/startup.py [--repeats 10] [--study ablations/studies/locality.yaml]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from processes import ROOT, alternating

COMMAND = (
    "import sys\n"
    "{preload}"
    "from ablate.main import main\n"
    "sys.argv = ['ablate', 'sweep', {study!r}, '--dry-run', '--tracking-uri', {uri!r}]\n"
    "main()\n"
    "assert ('torch' in sys.modules) == {expect_torch}, 'torch import state'\n"
)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--study", type=Path, default=ROOT / "ablations" / "studies" / "locality.yaml")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        uri = f"sqlite:///{tmp}/mlflow.db"
        codes = {
            "now": COMMAND.format(preload="", study=str(args.study.resolve()), uri=uri, expect_torch=False),
            "with torch": COMMAND.format(
                preload="import torch\n", study=str(args.study.resolve()), uri=uri, expect_torch=True
            ),
        }
        rows = {
            name: [(cpu, wall) for cpu, wall, _ in runs] for name, runs in alternating(codes, args.repeats, tmp).items()
        }

    def med(name: str, i: int) -> float:
        return statistics.median(r[i] for r in rows[name])

    result = {
        "study": str(args.study.relative_to(ROOT)) if args.study.resolve().is_relative_to(ROOT) else str(args.study),
        "repeats": args.repeats,
        "cpu_s": {name: med(name, 0) for name in rows},
        "wall_s": {name: med(name, 1) for name in rows},
        "raw": rows,
    }
    result["cpu_ratio"] = result["cpu_s"]["now"] / result["cpu_s"]["with torch"]
    result["cpu_saved_s"] = result["cpu_s"]["with torch"] - result["cpu_s"]["now"]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "startup.json").write_text(json.dumps(result, indent=2) + "\n")
    md = [
        "# Start-up of a command: `ablate sweep --dry-run`",
        "",
        f"Command: `python benchmarks/startup.py --repeats {args.repeats}`; study `{result['study']}`; medians of "
        f"{args.repeats} alternating processes each; {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d')}.",
        "",
        "| | CPU s (user + system) | wall s |",
        "|---|---|---|",
        *(f"| {name} | {result['cpu_s'][name]:.2f} | {result['wall_s'][name]:.2f} |" for name in rows),
        "",
        f"The dry run now costs **{result['cpu_ratio']:.2f}x** the CPU time of the same command importing torch "
        f"({result['cpu_saved_s']:.2f} CPU s saved per command).",
        "",
    ]
    (args.out / "startup.md").write_text("\n".join(md))
    print("\n".join(md))
    return result


if __name__ == "__main__":
    main()
