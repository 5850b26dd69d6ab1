"""The catalogue's verdict table, generated from the files each report committed beside its table.

    python docs/results/verdicts.py           # rewrite the table in docs/results/README.md (between its markers)
    python docs/results/verdicts.py --check   # exit 1 when the README's table is not what the files say

For every folder with ``seeds.csv``, ``declaration.json`` and ``contrasts.csv`` (a table written since studies were
registered): each declared contrast's verdict in the report's own words, its difference and Holm p-value, the seeds it
used, the cells the study trained against a fixed design at its plan's maximum, and, for a study also run at a longer
budget (``LONGER``), the other budget's verdict and whether the two agree. The numbers are the committed ones, which
``recompute.py`` reproduces from the seeds; nothing here is typed by hand but the papers' names and which study is
another's longer budget.
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
STUDIES = HERE.parents[1] / "ablations" / "studies"
README = HERE / "README.md"
BEGIN, END = "<!-- generated verdicts:begin -->", "<!-- generated verdicts:end -->"
PAPERS = {
    "attention_score": "Vaswani et al. 2017, 3.2.1; Britz et al. 2017",
    "attention_score_tuned": "Vaswani et al. 2017, 3.2.1; Britz et al. 2017",
    "decoding": "Britz et al. 2017, Table 7",
    "heads": "Vaswani et al. 2017, Table 3 (A)",
    "heads_planned": "Vaswani et al. 2017, Table 3 (A, B)",
    "heads_tuned": "Vaswani et al. 2017, Table 3 (A)",
    "locality": "Beltagy et al. 2020; Tay et al. 2021 (LRA)",
    "locality_tuned": "Tay et al. 2021 (LRA)",
    "michel_heads": "Michel et al. 2019",
    "nat": "Gu et al. 2018; Ghazvininejad et al. 2019",
    "norm_placement": "Xiong et al. 2020",
    "norm_placement_tuned": "Xiong et al. 2020",
    "positions": "Vaswani et al. 2017 (E); Press et al. 2022",
    "positions_long": "Press et al. 2022",
    "positions_tuned": "Vaswani et al. 2017 (E); Press et al. 2022",
    "positions_tuned_long": "Press et al. 2022",
    "scheduled_sampling": "Bengio et al. 2015",
    "similarity_recall": "Luong et al. 2015",
    "similarity_text": "Luong et al. 2015",
}
# the same declaration at a longer budget: its study -> the shorter one
LONGER = {
    f"{short}_long": short
    for short in (
        "decoding",
        "scheduled_sampling",
        "nat",
        "attention_score",
        "michel_heads",
        "norm_placement",
        "norm_placement_tuned",
    )
}
PAPERS |= {long: PAPERS[short] for long, short in LONGER.items()}


def studies() -> list[Path]:
    """The folders a verdict can be generated for: those with the per-seed export, in name order."""
    need = ("seeds.csv", "declaration.json", "contrasts.csv")
    return sorted(d for d in HERE.iterdir() if d.is_dir() and all((d / f).exists() for f in need))


def _num(text: str, spec: str = "+.3g") -> str:
    """A CSV number as the table shows it; "-" for an empty or NaN cell."""
    try:
        x = float(text)
    except ValueError:
        return text or "-"
    return "-" if x != x else format(x, spec)


def verdicts_of(folder: Path) -> dict[str, str]:
    with open(folder / "contrasts.csv", newline="") as f:
        return {c["label"]: c["verdict"] for c in csv.DictReader(f)}


def steps_of(study: str) -> int:
    return yaml.safe_load((STUDIES / f"{study}.yaml").read_text())["budget"]["steps"]


def other_budget(study: str) -> str | None:
    """The study run at the other budget, where both folders are committed."""
    other = LONGER.get(study) or next((long for long, short in LONGER.items() if short == study), None)
    return other if other and (HERE / other / "contrasts.csv").exists() else None


def rows(folder: Path) -> list[str]:
    """The study's lines of the table: one per declared contrast."""
    declared = json.loads((folder / "declaration.json").read_text())
    with open(folder / "seeds.csv", newline="") as f:
        cells = list(csv.DictReader(f))
    with open(folder / "contrasts.csv", newline="") as f:
        contrasts = {c["label"]: c for c in csv.DictReader(f)}
    plan = declared.get("plan")
    most = plan["max"] if plan else max(sum(1 for c in cells if c["variant"] == v) for v in declared["variants"])
    fixed = most * len(declared["variants"])
    trained = f"{len(cells)} of {fixed}" if plan else f"{len(cells)} (fixed)"
    other = other_budget(folder.name)
    theirs = verdicts_of(HERE / other) if other else {}
    # a report of another metric of a study's runs (positions_long: positions' test_long/loss) has its study's budget
    name = f"[{folder.name}]({folder.name}/table.md) ({steps_of(declared['study']):,} steps)"
    out = []
    for i, label in enumerate(declared["family"]):
        c = contrasts[label]
        first = i == 0
        budget = "-"
        if label in theirs:
            agree = "the same verdict" if theirs[label] == c["verdict"] else "they differ"
            budget = f"{theirs[label]} at {steps_of(other):,} steps: {agree}"
        out.append(
            f"| {name if first else ''} | {PAPERS.get(folder.name, '') if first else ''} | {label} | "
            f"{c['verdict']} | {_num(c['diff'])} | {_num(c['p_holm'], '.2g')} | {c['n_paired']} of {most} | "
            f"{trained if first else ''} | {budget} |"
        )
    return out


def table() -> str:
    lines = [
        "| study (budget) | paper | declared contrast | verdict | Δ | Holm p | seeds | cells trained (a fixed "
        "design's) | at the other budget |",
        "|---|---|---|---|---:|---:|---:|---:|---|",
    ]
    for folder in studies():
        lines += rows(folder)
    return "\n".join(lines) + "\n"


def with_table(text: str, generated: str) -> str:
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{README}: no {BEGIN} ... {END} markers to write the table between")
    head, rest = text.split(BEGIN, 1)
    return f"{head}{BEGIN}\n{generated}{END}{rest.split(END, 1)[1]}"


def main(argv: list[str]) -> int:
    text = README.read_text()
    wanted = with_table(text, table())
    if "--check" in argv:
        if wanted != text:
            print(f"{README}: the verdict table differs from the committed files: run python {__file__}")
            return 1
        print(f"{README}: the verdict table is what the files say ({len(studies())} studies)")
        return 0
    README.write_text(wanted)
    print(f"wrote the verdict table of {len(studies())} studies into {README}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
