"""Issue 48 in the report: the registration and every amendment are stated, a contrast added after results of its
cells existed is exploratory (tested and shown, outside the confirmatory Holm family), and every seed's value is
exported so that docs/results/recompute.py (numpy and scipy only) reproduces every p-value and interval."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import numpy as np
import pytest
import yaml

from ablations.register import register
from dashboards.render import to_markdown
from dashboards.report import make_report
from dashboards.table import build
from record.runs import load_runs
from record.spec import load_study
from tests.conftest import ROOT
from tests.dashboards.test_legacy_store import relocated_store
from tests.dashboards.test_report import fill
from tests.dashboards.test_table import grid
from tests.record.spec.test_study import BASE

RECOMPUTE = ROOT / "docs" / "results" / "recompute.py"


def study_file(tmp_path, pairs):
    data = {
        "name": "three",
        "base": BASE,
        "design": {
            "variants": [{"name": n, "set": {"training.lr": lr}} for n, lr in (("a", 1e-3), ("b", 2e-3), ("c", 3e-3))]
        },
        "seeds": 8,
        "metric": "final/val_loss",
        "analysis": {"contrasts": {"pairs": pairs}},
    }
    path = tmp_path / "three.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_contrast_added_after_results_is_exploratory_and_the_report_says_when_and_why(tmp_path, store):
    claims = f"sqlite:///{tmp_path / 'claims.db'}"
    register(load_study(study_file(tmp_path, [["b", "a"]])), store, claims)  # before any result
    rng = np.random.default_rng(3)
    base = {s: 0.8 + 0.01 * rng.standard_normal() for s in range(8)}
    values = {"a": base, "b": {s: v - 0.02 for s, v in base.items()}, "c": {s: v - 0.03 for s, v in base.items()}}
    amended = {"contrasts": {"pairs": [["b", "a"], ["c", "a"]]}}
    fill(
        store, "three", values, analysis=amended, metric="final/val_loss", direction="minimize"
    )  # the cells' results, recorded as a sweep records them
    register(load_study(study_file(tmp_path, [["b", "a"], ["c", "a"]])), store, claims, amend="c looked better")
    table = build(load_runs(store, "three"))
    assert [c.label for c in table.family] == ["b vs a"]
    (late,) = table.exploratory
    assert late.label == "c vs a" and late.exploratory == "not in the family registered before results (version 0)"
    assert late.p_holm == late.p and table.family[0].p_holm == table.family[0].p  # two Holm groups of one each
    md = to_markdown(table)
    assert "Registered" in md and "before any result" in md
    assert "Amendment 1" in md and "c looked better (changed analysis.contrasts; 24 cell(s) had results by then)" in md
    assert "exploratory: c vs a: different (better)" in md and "| exploratory: different (better) |" in md


def recompute(folder) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(RECOMPUTE), str(folder)], capture_output=True, text=True, timeout=300)


def test_every_p_value_and_interval_is_recomputed_from_the_exported_seeds_alone(tmp_path, store):
    """A real sweep's store (diverged cells, a grid's effects) and a grid with declared pairs, an interaction and a
    margin: the script reproduces every contrast of contrasts.csv; one value changed in seeds.csv, it does not."""
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    out = make_report(relocated_store(legacy), "legacy", out_dir=tmp_path / "r1", log=False).files
    assert {"seeds", "declaration"} <= set(out)
    done = recompute(tmp_path / "r1")
    assert done.returncode == 0 and "contrasts reproduced" in done.stdout, done.stdout + done.stderr
    analysis = {
        "contrasts": {
            "pairs": [["norm=post warmup=0", "norm=pre warmup=0"]],
            "interactions": True,
            "main_effects": True,
        },
        "margins": {"final/val_loss": 0.05},
    }
    grid(store, "g", analysis)
    make_report(store, "g", out_dir=tmp_path / "r2", log=False)
    done = recompute(tmp_path / "r2")
    # 3 rows against the baseline, 1 declared pair, 2 main effects, 1 interaction
    assert done.returncode == 0 and done.stdout.startswith("all 7 contrasts reproduced"), done.stdout + done.stderr
    ratio = {**analysis, "margins": {"final/val_loss": {"relative": 0.1}}}  # issue 65: TOST on the log values
    grid(store, "g_ratio", ratio)
    make_report(store, "g_ratio", out_dir=tmp_path / "r3", log=False)
    done = recompute(tmp_path / "r3")
    assert done.returncode == 0 and done.stdout.startswith("all 7 contrasts reproduced"), done.stdout + done.stderr
    seeds = tmp_path / "r2" / "seeds.csv"
    lines = seeds.read_text().splitlines()
    cols = lines[0].split(",")
    first = lines[1].split(",")
    first[cols.index("rule_value")] = str(float(first[cols.index("rule_value")]) + 0.5)
    seeds.write_text("\n".join([lines[0], ",".join(first), *lines[2:]]) + "\n")
    done = recompute(tmp_path / "r2")
    assert done.returncode == 1 and "recomputed" in done.stdout


PLAN = {"first": 8, "batch": 2, "max": 12, "spending": "pocock"}


def planned_values(rng, twin: bool = False) -> dict[str, dict[int, float]]:
    """A planned study's values: ``near`` open at every look of PLAN, ``far`` decided at the first, and with
    ``twin`` one equivalent to the baseline within 0.05 at the first."""
    base = {s: 0.8 + 0.02 * rng.standard_normal() for s in range(12)}
    values = {
        "base": base,
        "near": {s: v + 0.03 + 0.06 * rng.standard_normal() for s, v in base.items()},
        "far": {s: base[s] + 0.2 + 0.01 * rng.standard_normal() for s in range(8)},
    }
    if twin:
        values["twin"] = {s: base[s] + 0.001 * rng.standard_normal() for s in range(8)}
    return values


def test_a_seed_plan_s_looks_are_replayed_from_the_exported_seeds_alone(tmp_path, store):
    """A seed plan's table: the script replays its looks (which seeds each variant had, which contrasts stayed open)
    with its own group-sequential test, and reproduces each contrast as the look that decided it saw it: one
    different at the first look, one equivalent within the margin at the first look, one open to the maximum."""
    rng = np.random.default_rng(3)
    values = planned_values(rng, twin=True)
    analysis = {"contrasts": {"pairs": "baseline"}, "margins": {"test/acc": 0.05}}
    fill(store, "planned", values, analysis=analysis, plan=PLAN)
    make_report(store, "planned", out_dir=tmp_path / "r", log=False)
    declared = json.loads((tmp_path / "r" / "declaration.json").read_text())
    assert declared["schema"] == 1  # record.recorded.AnalysedUnder, its own serialisation
    assert declared["plan"] == PLAN and [look["open"] for look in declared["looks"]] == [["near vs base"]] * 3
    assert [look["seeds"]["far"] for look in declared["looks"]] == [8, 8, 8]
    done = recompute(tmp_path / "r")
    assert done.returncode == 0 and done.stdout.startswith("all 3 contrasts reproduced"), done.stdout + done.stderr
    verdicts = {r["label"]: r["verdict"] for r in csv.DictReader((tmp_path / "r" / "contrasts.csv").open())}
    assert verdicts == {"near vs base": "not resolved", "far vs base": "different (better)",
                        "twin vs base": "equivalent within ±0.05"}  # fmt: skip
    declared["looks"][0]["open"] = ["near vs base", "twin vs base"]  # a look the seeds do not give
    (tmp_path / "r" / "declaration.json").write_text(json.dumps(declared))
    done = recompute(tmp_path / "r")
    assert done.returncode == 1 and "look 1: open ['near vs base'] replayed" in done.stdout, done.stdout


def test_another_metric_of_a_planned_study_is_tested_on_its_own_values(tmp_path, store):
    """A planned study reported on a metric its plan does not decide on (positions' test_long/loss): each contrast
    is that metric's fixed-sample exact test over the seeds the plan trained, not the decision metric's looks
    shown under its name (what the third edition's positions_long first showed); the script reproduces it."""
    from scipy.stats import permutation_test

    rng = np.random.default_rng(5)
    values = planned_values(rng)
    other = {
        (v, s): {"test/other": -3 * x + 0.05 * rng.standard_normal()} for v, d in values.items() for s, x in d.items()
    }
    fill(store, "planned", values, analysis={"contrasts": {"pairs": "baseline"}}, plan=PLAN, extra=other)
    make_report(store, "planned", metric="test/other", out_dir=tmp_path / "r", log=False)
    declared = json.loads((tmp_path / "r" / "declaration.json").read_text())
    assert declared["plan"]["decides_on"] == "test/acc" and declared["looks"] == []
    rows = {r["label"]: r for r in csv.DictReader((tmp_path / "r" / "contrasts.csv").open())}
    for variant in ("near", "far"):
        seeds = sorted(values[variant])
        d = np.array([other[(variant, s)]["test/other"] - other[("base", s)]["test/other"] for s in seeds])
        row = rows[f"{variant} vs base"]
        assert float(row["diff"]) == pytest.approx(d.mean()) and int(row["n_paired"]) == len(seeds)
        exact = permutation_test((d,), np.mean, permutation_type="samples", n_resamples=np.inf).pvalue
        assert float(row["p"]) == pytest.approx(exact)
    assert "its looks decide on test/acc, not on test/other" in (tmp_path / "r" / "table.md").read_text()
    done = recompute(tmp_path / "r")
    assert done.returncode == 0 and done.stdout.startswith("all 2 contrasts reproduced"), done.stdout + done.stderr


def test_what_an_amendment_after_results_changes_makes_exploratory():
    """Changes after results of a contrast's cells: a margin or the seeds move every contrast; a variant's settings
    only the contrasts that compare it; a change made before its cells had results moves none; an edited record
    makes everything exploratory."""
    from record.exploratory import exploratory
    from record.recorded import Registration
    from record.spec.declaration import digest

    def entry(version, declared, finished=None, changed=()):
        return Registration(version=version, hash=digest(declared), declaration=declared, created=1.0,
                            finished=finished or {}, changed=list(changed), reason="why")  # fmt: skip

    variants = {"a": {"x": "1"}, "b": {"x": "2"}, "c": {"x": "3"}}
    first = {"variants": variants, "runs": {"a": "r1", "b": "r2", "c": "r3"}, "analysis": {}, "design": "variants"}
    involved = {"b vs a": ("b", "a"), "c vs a": ("c", "a")}
    assert exploratory([entry(0, first)], involved) == {}
    rerun_c = {**first, "runs": {**first["runs"], "c": "r3'"}}
    seen = {"a": 2, "b": 2, "c": 2}
    only_c = exploratory([entry(0, first), entry(1, rerun_c, seen, ["runs"])], involved)
    assert list(only_c) == ["c vs a"] and "runs of c, a" in only_c["c vs a"]
    margin = {**first, "analysis": {"margins": {"m": 0.1}}}
    every = exploratory([entry(0, first), entry(1, margin, seen, ["analysis.margins"])], involved)
    assert set(every) == set(involved)
    before = exploratory([entry(0, first), entry(1, margin, {}, ["analysis.margins"])], involved)  # no results yet
    assert before == {}
    edited = entry(0, first)
    edited = Registration(**{**edited.to_json(), "declaration": margin})  # its hash is first's
    assert set(exploratory([edited], involved)) == set(involved)


def test_a_study_file_registered_with_uncommitted_changes_is_not_reported_as_its_commit():
    """The report cut "+changes" off the recorded commit, so a plan registered from an edited file read as the
    commit's older declaration (docs/results/decoding, 2026-11-27)."""
    from types import SimpleNamespace

    from dashboards.render import registration_lines
    from record.recorded import Registration

    def line(commit):
        entry = Registration(version=0, hash="h", declaration={}, created=1.0, git_commit=commit)
        return registration_lines(SimpleNamespace(registrations=[entry]))[0]

    assert line("90644dcaf7e2" + "0" * 28 + "+changes").endswith(
        "study file at commit 90644dcaf7e2 with uncommitted changes (the registered declaration is not that commit's file))."
    )
    assert line("90644dcaf7e2" + "0" * 28).endswith("(declaration h, study file at commit 90644dcaf7e2).")
    assert line("").endswith("(declaration h).")
