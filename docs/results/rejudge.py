"""Judge every committed table again under the current verdict rules, from its exported files alone, and list what
changes: a margin that reaches past the metric's end (equivalence not testable here), a verdict that flips with the
failure rule, a pair that fails more often.

    python docs/results/rejudge.py            # the table of changes, study by study (Markdown)
    python docs/results/rejudge.py STUDY ...  # only these

Reads ``seeds.csv`` and ``declaration.json`` of each folder (``record.exported``); no store, no training. What the
files do not hold is not judged again: loss curves (convergence), output classes (chance levels).
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from dashboards.looks import table  # noqa: E402
from dashboards.verdicts import failure_text, rules_text  # noqa: E402
from record.exported import exploratory_of, exported_runs  # noqa: E402
from record.testable import NOT_TESTABLE  # noqa: E402


def committed(folder: Path) -> dict[str, str]:
    """label -> the verdict the committed table gave."""
    with open(folder / "contrasts.csv", newline="") as f:
        return {row["label"]: row["verdict"] for row in csv.DictReader(f)}


def changes(folder: Path) -> list[tuple[str, str, str, str]]:
    """(contrast, committed verdict, verdict now, what else its line now says) where anything differs."""
    if exploratory_of(folder):
        raise SystemExit(f"{folder.name}: exploratory marks are not re-derived from an export; judge it from its store")
    metric = json.loads((folder / "declaration.json").read_text())["metric"]
    t = table(exported_runs(folder), metric=metric, curves=False)
    before, out = committed(folder), []
    expected = {e.name for e in t.analysis.expect}
    for c in t.family:
        extra = "; ".join(x for x in (rules_text(t, c), failure_text(t, c)) if x)
        was = before.get(c.label, "(none)")
        if was == NOT_TESTABLE and c.verdict != was and c.label in expected:  # the room needs the chance level
            out.append((c.label, was, was, "kept: the export holds no chance level to judge analysis.expect's room"))
        elif was != c.verdict or extra:
            out.append((c.label, was, c.verdict, extra))
    return out


def main(names: list[str]) -> int:
    folders = [HERE / n for n in names] if names else sorted(p for p in HERE.iterdir() if (p / "seeds.csv").exists())
    print("| study | contrast | committed | under the current rules | also said |")
    print("|---|---|---|---|---|")
    changed = 0
    for folder in folders:
        for label, was, now, extra in changes(folder):
            changed += was != now
            print(f"| {folder.name} | {label} | {was} | {now} | {extra} |")
    print(f"\n{changed} verdict(s) change in {len(folders)} tables.")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
