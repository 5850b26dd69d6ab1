"""The repository's contract: nothing shadows the standard library, the CLI answers fast, the committed tables
are recomputable."""

from __future__ import annotations

import csv
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def test_standard_library_platform_still_works_from_the_repository_root():
    code = "import platform, sys; print(platform.system()); import torch; print(platform.__file__)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    system, where = out.stdout.split()
    assert system in ("Linux", "Darwin", "Windows")
    assert not Path(where).resolve().is_relative_to(ROOT / "platform")
    assert not (ROOT / "platform" / "__init__.py").exists()
    assert not list((ROOT / "platform").rglob("*.py")), "platform/ holds deployment files only"


def test_cli_help_answers_without_importing_the_heavy_libraries():
    code = "import sys; from ablate.main import build_parser; build_parser(); print(sorted(m for m in ('torch', 'ray', 'mlflow', 'lightning') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in readme and "make test" in ci
    assert "make quickstart" in readme


def test_every_committed_table_with_its_seeds_is_recomputed_from_them_alone():
    """docs/results: each folder that commits seeds.csv and declaration.json reproduces every p-value and interval
    of its contrasts.csv (a seed plan's looks replayed) with numpy and scipy alone."""
    folders = sorted(p.parent for p in (ROOT / "docs" / "results").glob("*/seeds.csv"))
    assert folders, "no committed table has its per-seed values"
    for folder in folders:
        script = ROOT / "docs" / "results" / "recompute.py"
        done = subprocess.run([sys.executable, str(script), str(folder)], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0 and "contrasts reproduced" in done.stdout, (folder.name, done.stdout, done.stderr)


def verdicts_module():
    spec = importlib.util.spec_from_file_location("verdicts", ROOT / "docs" / "results" / "verdicts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_results_readme_verdict_table_is_generated_from_the_committed_files():
    """docs/results/README.md's generated table says what each folder's files say; an edited verdict is caught."""
    script = ROOT / "docs" / "results" / "verdicts.py"
    done = subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    verdicts = verdicts_module()
    folder = verdicts.studies()[0]
    label = json.loads((folder / "declaration.json").read_text())["family"][0]
    row = next(line for line in verdicts.rows(folder) if f"| {label} |" in line)
    with open(folder / "contrasts.csv", newline="") as f:
        verdict = next(c["verdict"] for c in csv.DictReader(f) if c["label"] == label)
    assert f"| {verdict} |" in row  # the report's own words, read from its file
    readme = (ROOT / "docs" / "results" / "README.md").read_text()
    edited = readme.replace(row, row.replace(f"| {verdict} |", "| reproduced |"))
    assert verdicts.with_table(edited, verdicts.table()) == readme


def test_a_study_run_at_a_longer_budget_is_compared_contrast_by_contrast(tmp_path, monkeypatch):
    """Item 3 of issue 51: each declared contrast's verdict beside the other budget's, and whether they differ."""
    verdicts = verdicts_module()
    source = ROOT / "docs" / "results" / "heads_planned"
    for name, steps in (("short", 1000), ("short_long", 3000)):
        (tmp_path / name).mkdir()
        for f in ("seeds.csv", "contrasts.csv"):
            (tmp_path / name / f).write_text((source / f).read_text())
        declared = json.loads((source / "declaration.json").read_text())
        (tmp_path / name / "declaration.json").write_text(json.dumps({**declared, "study": name}))
        (tmp_path / f"{name}.yaml").write_text(f"budget: {{steps: {steps}}}\n")
    contrasts = tmp_path / "short_long" / "contrasts.csv"
    contrasts.write_text(contrasts.read_text().replace(",different (worse),", ",not resolved,", 1))
    monkeypatch.setattr(verdicts, "HERE", tmp_path)
    monkeypatch.setattr(verdicts, "STUDIES", tmp_path)
    monkeypatch.setattr(verdicts, "LONGER", {"short_long": "short"})
    short = verdicts.rows(tmp_path / "short")
    assert "(1,000 steps)" in short[0] and short[0].endswith("| not resolved at 3,000 steps: the same verdict |")
    assert short[1].endswith("| not resolved at 3,000 steps: they differ |")  # different (worse) here
    assert short[2].endswith("| different (worse) at 3,000 steps: the same verdict |")
    assert verdicts.rows(tmp_path / "short_long")[1].endswith("| different (worse) at 1,000 steps: they differ |")
    # a report of another metric of a study's runs (positions_long) has no file of its own: its study's budget
    (tmp_path / "short_metric").mkdir()
    for f in ("seeds.csv", "declaration.json", "contrasts.csv"):
        (tmp_path / "short_metric" / f).write_text((tmp_path / "short" / f).read_text())
    assert "[short_metric](short_metric/table.md) (1,000 steps)" in verdicts.rows(tmp_path / "short_metric")[0]


def test_each_longer_budget_declares_its_short_study_with_only_more_steps():
    """A ``_long`` study is a copy of its shorter one (registration needs a whole file): the copy must not drift,
    budget keys other than steps included."""
    verdicts = verdicts_module()
    studies = ROOT / "ablations" / "studies"
    for long, short in verdicts.LONGER.items():
        a, b = (yaml.safe_load((studies / f"{name}.yaml").read_text()) for name in (long, short))
        assert a.pop("name") == long and b.pop("name") == short
        assert a["budget"].pop("steps") > b["budget"].pop("steps"), long
        for study in (a, b):
            study.pop("description")
        assert a == b, long
