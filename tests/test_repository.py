"""The repository's contract: nothing shadows the standard library, the CLI answers fast, the committed tables
are recomputable."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
    code = "import sys; from ablations.cli import build_parser; build_parser(); print(sorted(m for m in ('torch', 'ray', 'mlflow', 'lightning') if m in sys.modules))"
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
