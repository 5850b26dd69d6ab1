"""The worked example of docs/statistics.md is what the code produces: the norm_placement slice (4 layers,
learning rate 1e-2) in a store fabricated from the published means and standard deviations of
docs/results/norm_placement/table.json, reported with the doc's ``analysis:`` section."""

from __future__ import annotations

import re

import numpy as np
import pytest
import yaml

from dashboards.plan import pilot_plan
from dashboards.render import to_markdown
from dashboards.report import effects_markdown
from dashboards.table import build
from record.runs import load_runs
from tests.conftest import ROOT
from tests.dashboards.test_report import fill

DOC = ROOT / "docs" / "statistics.md"
# docs/results/norm_placement/table.json, n_layers=4, lr=0.01: (mean, standard deviation) of final/val_loss, 3 seeds
PUBLISHED = {
    ("pre", "0"): (0.6328704446345575, 0.18826614254151788),
    ("pre", "100"): (0.025761657108755293, 0.009016455948829407),
    ("post", "0"): (2.358498435419825, 7.610419096184568e-05),
    ("post", "100"): (1.036470310543575, 0.3746298398025034),
}


def fabricate(uri: str, analysis: dict) -> None:
    """Three seeds per variant whose mean and sample standard deviation are exactly the published ones."""
    rng = np.random.default_rng(2020)
    values, settings = {}, {}
    for (norm, warm), (mean, sd) in PUBLISHED.items():
        z = rng.standard_normal(3)
        z = (z - z.mean()) / z.std(ddof=1)
        name = f"norm={norm} warmup_steps={warm}"
        settings[name] = {"model.norm": norm, "training.warmup_steps": warm}
        values[name] = {s: float(mean + sd * z[s]) for s in range(3)}
    fill(
        uri, "norm_placement", values, kind="grid", settings=settings, metric="final/val_loss", direction="minimize",
        analysis=analysis,
    )  # fmt: skip


def doc_analysis() -> dict:
    text = DOC.read_text()
    block = re.search(r"```yaml\n(analysis:\n.*?)```", text, re.S).group(1)
    return yaml.safe_load(block)["analysis"]


@pytest.mark.slow
def test_the_worked_example_in_the_docs_is_what_the_code_produces(store):
    analysis = doc_analysis()
    fabricate(store, analysis)
    table = build(load_runs(store, "norm_placement"))
    text = DOC.read_text()
    produced = to_markdown(table)
    assert produced.strip() in text, "docs/statistics.md: paste the table this test produces\n" + produced
    effects = effects_markdown(table)
    assert effects.strip() in text, "docs/statistics.md: paste the effects this test produces\n" + effects
    plan = pilot_plan(store, "norm_placement")
    assert plan in text, "docs/statistics.md: paste the seeds plan this test produces\n" + plan


if __name__ == "__main__":  # print the example for the docs
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        uri = f"sqlite:///{tmp}/m.db"
        fabricate(uri, doc_analysis())
        t = build(load_runs(uri, "norm_placement"))
        print(to_markdown(t))
        print(effects_markdown(t))
        print(pilot_plan(uri, "norm_placement"))
