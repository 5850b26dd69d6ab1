"""Issue 14 on real MLflow stores filled as sweeps fill them: failures counted, every contrast answered,
equivalence tested, power stated, the declared family corrected, pairing shown; every number checked against
an independent computation (sign flips enumerated, Fisher by the hypergeometric, Holm by its definition)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from mlflow import MlflowClient
from scipy import stats as sps

from dashboards.render import to_csv, to_html, to_latex, to_markdown, to_terminal
from dashboards.report import make_report
from dashboards.table import build
from dashboards.verdicts import readings
from record import stats
from record.runs import load_runs
from tests.dashboards.test_report import fill, flips, table_part
from tests.record.test_stats import fisher_by_enumeration, holm_by_definition

SEEDS5 = range(5)
SEEDS8 = range(8)
FORBIDDEN = ("same", "matches", "identical", "costs nothing")  # never written unless TOST says equivalent


def base_values(seeds, rng) -> dict[int, float]:
    return {s: 0.80 + 0.01 * rng.standard_normal() for s in seeds}


def renderings(table) -> dict[str, str]:
    return {
        "markdown": to_markdown(table),
        "terminal": to_terminal(table),
        "latex": to_latex(table),
        "html": to_html(table),
        "csv": to_csv(table),
    }


def test_failed_seeds_enter_under_the_worst_rule_and_are_never_best_unmarked(store):
    rng = np.random.default_rng(0)
    base = base_values(SEEDS5, rng)
    fragile = {s: (0.95 if s < 3 else None) for s in SEEDS5}  # best survivors, but 2 of 5 seeds diverge/fail
    values = {"baseline": base, "fragile": fragile}
    states = {("fragile", 3): "diverged", ("fragile", 4): "failed"}
    fill(store, "worst", values, states=states)
    table = build(load_runs(store, "worst"))
    rec = {r["variant"]: r for r in table.as_records()}
    worst = min(list(base.values()) + [0.95])  # accuracy: the lowest value any successful cell reached
    assert table.worst == pytest.approx(worst)
    d = np.array([(0.95 if s < 3 else worst) - base[s] for s in SEEDS5])
    r = rec["fragile"]
    assert (r["successes"], r["cells"], r["diverged"], r["failed"]) == (3, 5, 1, 1)
    assert r["n_paired"] == 5 and r["diff"] == pytest.approx(d.mean()) and r["p"] == pytest.approx(flips(d))
    assert r["mean"] == pytest.approx(0.95) and r["n"] == 3  # the mean column: the successes only, marked †
    assert r["p_success"] == pytest.approx(fisher_by_enumeration(3, 5, 5, 5))
    assert r["failure_rule"] == "worst"
    md = to_markdown(table)
    assert "0.95† ±" not in md and "0.95†" in md  # no spread among the survivors: no ± either
    rule = f"failure rule: worst (a failed seed counts as the worst test/acc any finished cell of the study reached = {worst:.4g})"
    assert rule in md
    assert "3/5 [0.15, 0.95]" in md  # Clopper-Pearson of 3 of 5
    # under 'exclude' the survivors have the best mean, but three paired seeds cannot show it better (issue 21:
    # best is marked only where the family's tests support it): no bold, and the caption says why
    fill(store, "excl", values, states=states, analysis={"failure_rule": "exclude"})
    excl = build(load_runs(store, "excl"))
    row = next(r for r in excl.rows if r.variant == "fragile")
    assert not row.best and row.failed_any and row.contrast.n == 3 and row.contrast.verdict == "not resolved"
    md = to_markdown(excl)
    assert "**" not in table_part(md).split("\n\n")[0] and "0.95† (no spread, n=3)" in md
    assert "fragile's, is not shown better than baseline (verdict: not resolved)" in md
    assert "failure rule: exclude" in md


def test_survivors_that_are_shown_better_are_bold_but_marked(store):
    """Under 'exclude', a variant whose 8 surviving seeds all beat the baseline is established as best (2/2^8
    after Holm over one contrast), in bold, with † and a note that 2 of its 10 seeds failed."""
    seeds = range(10)
    rng = np.random.default_rng(3)
    base = base_values(seeds, rng)
    fragile = {s: (base[s] + 0.05 if s < 8 else None) for s in seeds}
    states = {("fragile", 8): "diverged", ("fragile", 9): "failed"}
    fill(store, "excl", {"baseline": base, "fragile": fragile}, states=states, analysis={"failure_rule": "exclude"})
    table = build(load_runs(store, "excl"))
    row = next(r for r in table.rows if r.variant == "fragile")
    assert row.contrast.n == 8 and flips([0.05] * 8) == pytest.approx(2 / 256)
    assert row.contrast.p_holm == pytest.approx(flips([fragile[s] - base[s] for s in range(8)]))
    assert row.best and row.failed_any and row.contrast.verdict == "different (better)"
    assert f"**{row.summary.mean:.4g}† ±" in to_markdown(table)
    assert any("fragile is best † although 2 of 10 seeds failed" in n for n in table.notes)
    assert "fragile in bold: the best mean (higher is better" in to_markdown(table)


@pytest.mark.slow
def test_a_variant_that_failed_on_every_seed_is_a_result(store):
    rng = np.random.default_rng(1)
    base = base_values(SEEDS8, rng)
    other = {s: v + 0.003 * rng.standard_normal() for s, v in base.items()}
    values = {"baseline": base, "other": other, "dead": {s: None for s in SEEDS8}}
    states = {("dead", s): ("diverged" if s % 2 else "failed") for s in SEEDS8}
    fill(store, "dead", values, states=states)
    table = build(load_runs(store, "dead"))
    rec = {r["variant"]: r for r in table.as_records()}
    r = rec["dead"]
    assert (r["successes"], r["cells"], r["n"]) == (0, 8, 0) and math.isnan(r["mean"])
    assert (r["success_low"], r["success_high"]) == (0.0, pytest.approx(1 - 0.025 ** (1 / 8)))
    worst = min(list(base.values()) + list(other.values()))
    d = np.array([worst - base[s] for s in SEEDS8])
    assert r["p"] == pytest.approx(flips(d)) and r["diff"] == pytest.approx(d.mean())
    assert r["p_success"] == pytest.approx(fisher_by_enumeration(0, 8, 8, 8))
    p_other = flips(np.array([other[s] - base[s] for s in SEEDS8]))
    assert [rec["other"]["p_holm"], r["p_holm"]] == pytest.approx(holm_by_definition([p_other, flips(d)]))
    assert r["verdict"] == "different (worse)"  # every seed at the worst value: 2/256 before Holm
    assert any("dead: failed on every seed (4 diverged, 4 failed)" in n for n in table.notes)
    for name, text in renderings(table).items():  # every table carries the notes (LaTeX's caption had none)
        assert name == "csv" or "dead: failed on every seed (4 diverged, 4 failed)" in text, name
    # excluded instead: untestable, but it stays in the family with p = 1 (the family does not shrink)
    fill(store, "dead_excl", values, states=states, analysis={"failure_rule": "exclude"})
    excl = {r["variant"]: r for r in build(load_runs(store, "dead_excl")).as_records()}
    assert excl["dead"]["n_paired"] == 0 and excl["dead"]["p_holm"] == 1.0 and excl["dead"]["verdict"] == "untestable"
    assert excl["other"]["p_holm"] == pytest.approx(holm_by_definition([p_other, 1.0])[0])
    md = to_markdown(build(load_runs(store, "dead_excl")))
    assert "| – (no paired seed) | 1 (untestable) | untestable |" in md
    assert "counted in the family with p = 1" in md


def test_missing_and_running_cells(store):
    rng = np.random.default_rng(2)
    base = base_values(SEEDS5, rng)
    values = {"baseline": base, "short": {s: base[s] + 0.01 for s in (0, 1, 2)}}  # seeds 3, 4 never ran
    fill(store, "gaps", values)
    c = MlflowClient(store)
    exp = c.get_experiment_by_name("gaps").experiment_id
    tags = {"kind": "cell", "variant": "short", "seed": "3", "cell_id": "short-3", "submission": "1"}
    c.create_run(exp, tags={**tags, "status_detail": "running"})  # still training: no outcome yet
    table = build(load_runs(store, "gaps"))
    rec = {r["variant"]: r for r in table.as_records()}
    assert rec["short"]["cells"] == 3 and rec["short"]["pending"] == 1 and rec["short"]["n_paired"] == 3
    assert rec["short"]["p"] == pytest.approx(0.25)  # +0.01 in each of the 3 seeds: the exact test's floor
    assert rec["short"]["spread"] is False and math.isnan(rec["short"]["diff_low"])
    md = to_markdown(table)
    assert "+0.01 (same in all 3 seeds)" in md and "smallest attainable p: 0.25 with 3 seeds" in md
    assert any("short: 1 cell(s) without an outcome yet" in n for n in table.notes)


def test_never_learned_cells_are_failures(store):
    rng = np.random.default_rng(3)
    base = base_values(SEEDS5, rng)
    values = {"baseline": base, "stuck": {s: (0.1 if s < 2 else 0.7) for s in SEEDS5}}
    fill(store, "nl", values, analysis={"never_learned": {"test/acc": 0.2}})
    table = build(load_runs(store, "nl"))
    r = {r["variant"]: r for r in table.as_records()}["stuck"]
    assert (r["successes"], r["not_learned"], r["finished"], r["cells"]) == (3, 2, 5, 5)
    assert r["mean"] == pytest.approx(0.7)  # the mean over the cells that learned
    # the worst value a finished cell reached is the stuck cells' own 0.1: a failure never scores better than that
    assert table.worst == pytest.approx(0.1)
    d = np.array([(0.1 if s < 2 else 0.7) - base[s] for s in SEEDS5])
    assert r["diff"] == pytest.approx(d.mean()) and r["p"] == pytest.approx(flips(d))
    assert "not learned" in table_part(to_markdown(table)).splitlines()[0]


def grid(store, study: str, analysis: dict | None, seeds=SEEDS8) -> dict:
    """A 2 x 2 grid: y = 1 + 0.3 [post] - 0.2 [warmup 0] + 0.1 [post, warmup 0] + seed noise (loss)."""
    rng = np.random.default_rng(4)
    values, settings = {}, {}
    for norm in ("pre", "post"):
        for warm in ("100", "0"):
            name = f"norm={norm} warmup={warm}"
            settings[name] = {"model.norm": norm, "training.warmup": warm}
            y = 1 + 0.3 * (norm == "post") - 0.2 * (warm == "0") + 0.1 * (norm == "post" and warm == "0")
            values[name] = {s: y + 0.05 * s + 0.01 * rng.standard_normal() for s in seeds}
    fill(
        store, study, values, kind="grid", settings=settings, metric="final/val_loss", direction="minimize",
        analysis=analysis,
    )  # fmt: skip
    return values


def test_the_declared_family_is_exactly_what_holm_corrects(store, tmp_path):
    # Post-LN against Pre-LN without warm-up (not against the baseline, pre with warm-up), and the main effect of norm
    analysis = {"contrasts": {"pairs": [["norm=post warmup=0", "norm=pre warmup=0"]], "main_effects": ["model.norm"]}}
    values = grid(store, "fam", analysis)
    table = build(load_runs(store, "fam"))
    family = table.family
    assert [c.label for c in family] == ["norm=post warmup=0 vs norm=pre warmup=0", "model.norm: post vs pre"]
    d = np.array([values["norm=post warmup=0"][s] - values["norm=pre warmup=0"][s] for s in SEEDS8])
    assert family[0].p == pytest.approx(flips(d))
    assert [c.p_holm for c in family] == pytest.approx(holm_by_definition([c.p for c in family]))
    assert family[1].estimate == pytest.approx(0.35, abs=0.01) and family[1].verdict == "different (worse)"
    rows = {r.variant: r.contrast for r in table.rows if r.contrast is not None}
    assert all(not c.in_family and c.verdict == "not in the family" for c in rows.values())
    md = to_markdown(table)
    assert "Declared contrasts:" in md and "| norm=post warmup=0 vs norm=pre warmup=0 |" in md
    assert "family of 2 contrast(s): 1 declared pair(s), 1 main effect(s)" in md
    effects = {c.label: c for c in table.effects}
    assert not effects["model.norm x training.warmup: post x 0 vs pre x 100"].in_family  # not declared
    report = make_report(store, "fam", out_dir=tmp_path / "r", log=False)
    text = report.files["effects"].read_text()
    assert f"| model.norm | post vs pre | {family[1].estimate:+.3g} |" in text and "| different (worse) |" in text
    assert "| training.warmup | 0 vs 100 |" in text and "not in the family" in text
    contrasts = report.files["contrasts"].read_text()
    assert contrasts.startswith("label,kind,a,b,diff") and "model.norm: post vs pre" in contrasts


def test_equivalence_is_a_test_and_the_words_come_from_it(store):
    rng = np.random.default_rng(5)
    base = base_values(SEEDS8, rng)
    values = {
        "baseline": base,
        "close": {s: v + 0.001 * rng.standard_normal() for s, v in base.items()},  # within the margin
        "far": {s: v + 0.08 + 0.002 * rng.standard_normal() for s, v in base.items()},
        "noisy": {s: v + 0.05 * rng.standard_normal() for s, v in base.items()},
    }
    fill(store, "eq", values, analysis={"margins": {"test/acc": 0.01}})
    table = build(load_runs(store, "eq"))
    rec = {r["variant"]: r for r in table.as_records()}
    d = np.array([values["close"][s] - base[s] for s in SEEDS8])
    assert rec["close"]["p_tost"] == pytest.approx(max(flips_one(d + 0.01, "greater"), flips_one(d - 0.01, "less")))
    p_tost = [rec[v]["p_tost"] for v in ("close", "far", "noisy")]
    assert [rec[v]["p_tost_holm"] for v in ("close", "far", "noisy")] == pytest.approx(holm_by_definition(p_tost))
    assert rec["close"]["verdict"] == "equivalent within ±0.01"
    assert rec["far"]["verdict"] == "different (better)" and rec["noisy"]["verdict"] == "not resolved"
    for name, text in renderings(table).items():
        low = text.lower()
        assert not any(f" {w} " in low or f"({w}" in low for w in FORBIDDEN), name
        verdict = "equivalent within $\\pm$0.01" if name == "latex" else "equivalent within ±0.01"
        assert verdict in text and "not resolved" in text, name
    # the p an "equivalent" rests on is printed beside it (before, only the difference test's p_holm was, so the
    # table read "p 0.6, equivalent"), in the row that carries the verdict
    row = next(line for line in to_markdown(table).splitlines() if line.startswith("| close |"))
    close = rec["close"]
    assert f"{close['p_holm']:.3g}; TOST {close['p_tost_holm']:.3g}" in row and "equivalent within ±0.01" in row


def flips_one(d, alternative):
    from tests.record.test_stats import flips as flips_any

    return flips_any(d, alternative)


def test_ceilings_get_an_exact_answer(store):
    """Both variants at 1.000 in every seed: Δ = 0 with no spread, p = 1 (never nan, never left out), and the exact
    TOST's p (1/32 at 5 seeds, 1/8 at 3). At the ceiling no variant can score 0.01 above the comparator, so the
    margin cannot fail on that side: "equivalent" would be automatic, and the verdict says equivalence is not
    testable here (issue 65; it read "equivalent within ±0.01" at 5 seeds)."""
    for seeds, verdict in (
        (SEEDS5, "not resolved; equivalence not testable here"),
        (range(3), "not resolved; equivalence not testable here"),
    ):
        study = f"ceiling{len(seeds)}"
        values = {"baseline": {s: 1.0 for s in seeds}, "also": {s: 1.0 for s in seeds}}
        fill(store, study, values, analysis={"margins": {"test/acc": 0.01}})
        table = build(load_runs(store, study))
        r = {r["variant"]: r for r in table.as_records()}["also"]
        assert r["p"] == 1.0 and r["p_holm"] == 1.0 and r["p_tost"] == pytest.approx(1 / 2 ** len(seeds))
        assert r["verdict"] == verdict and math.isnan(r["diff_low"]) and r["spread"] is False
        md = to_markdown(table)
        assert f"+0 (same in all {len(seeds)} seeds)" in md and "1 (no spread, n=" in md
        assert "± 0 " not in md and "[+0, +0]" not in md  # no interval shown as certainty


def test_power_and_seeds_needed_are_stated(store, tmp_path):
    rng = np.random.default_rng(6)
    base = base_values(SEEDS5, rng)
    values = {"baseline": base, "v": {s: v + 0.01 + 0.01 * rng.standard_normal() for s, v in base.items()}}
    fill(store, "pow", values, analysis={"detect": {"test/acc": 0.005}, "test": "t"})
    table = build(load_runs(store, "pow"))
    c = table.rows[1].contrast
    d = np.array([values["v"][s] - base[s] for s in SEEDS5])
    assert c.seeds_needed == stats.seeds_needed(d, 0.005, test="t")
    assert c.mde == pytest.approx(stats.detectable(float(np.std(d, ddof=1)), 5, 0.05, 0.8, "t"))
    md = to_markdown(table)
    assert "seeds for Δ 0.005" in table_part(md).splitlines()[0] and f"| {c.seeds_needed} |" in md
    report = make_report(store, "pow", out_dir=tmp_path / "r", log=False)
    assert "Seeds needed" in report.html and f"<td>{c.seeds_needed}</td>" in report.html


def test_the_report_shows_what_pairing_bought(store, tmp_path):
    rng = np.random.default_rng(7)
    base = {s: 0.5 + 0.1 * s + 0.002 * rng.standard_normal() for s in SEEDS5}  # seeds differ a lot
    var = {s: v + 0.01 + 0.002 * rng.standard_normal() for s, v in base.items()}  # and pairing removes it
    fill(store, "pair", {"baseline": base, "v": var})
    report = make_report(store, "pair", out_dir=tmp_path / "r", log=False)
    a, b = np.array(list(base.values())), np.array(list(var.values()))
    r = np.corrcoef(a, b)[0, 1]
    assert "Pairing" in report.html and f"<td>{r:+.2f}</td>" in report.html
    c = report.table.rows[1].contrast
    assert c.sd / c.sd_unpaired < 0.1  # the paired spread is a small part of the unpaired one


def test_every_rendering_carries_the_same_numbers(store):
    rng = np.random.default_rng(8)
    base = base_values(SEEDS8, rng)
    values = {"baseline": base, "v": {s: v + 0.02 + 0.004 * rng.standard_normal() for s, v in base.items()}}
    values["w"] = {s: (v + 0.01 if s else None) for s, v in base.items()}
    fill(store, "render", values, states={("w", 0): "diverged"})
    table = build(load_runs(store, "render"))
    for row in table.rows[1:]:
        c = row.contrast
        p = f"{c.p_holm:.3g}"
        for name, text in renderings(table).items():
            if name == "csv":
                continue
            assert p in text and c.verdict in text and f"{row.outcomes.successes}/{row.outcomes.cells}" in text, name
    csv_text = to_csv(table)
    header = csv_text.splitlines()[0].split(",")
    for field in ("successes", "success_low", "p", "p_holm", "verdict", "p_tost", "hedges_g", "detectable",
                  "correlation", "failure_rule", "test", "min_p"):  # fmt: skip
        assert field in header


@pytest.mark.slow
def test_a_pilot_says_how_many_seeds_a_resubmission_needs(store):
    """For the sweep's dry run: an earlier submission is the pilot for the study file's analysis section."""
    from dashboards.plan import pilot_plan
    from record.spec.analysis import parse_analysis

    assert pilot_plan(store, "nothing") is None  # no earlier submission: nothing to say
    rng = np.random.default_rng(9)
    base = base_values(SEEDS5, rng)
    values = {
        "baseline": base,
        "a": {s: v + 0.01 + 0.01 * rng.standard_normal() for s, v in base.items()},
        "b": {s: v + 0.02 * rng.standard_normal() for s, v in base.items()},
    }
    fill(store, "pilot", values)  # submitted without an analysis section
    assert "declare analysis.detect.test/acc" in pilot_plan(store, "pilot")
    analysis = parse_analysis({"detect": {"test/acc": 0.01}, "contrasts": {"pairs": [["a", "b"], ["a", "baseline"]]}})
    text = pilot_plan(store, "pilot", analysis)
    for a, b in (("a", "b"), ("a", "baseline")):
        d = [values[a][s] - values[b][s] for s in SEEDS5]
        n = stats.seeds_needed(d, 0.01, family_size=2)
        assert f"  {a} vs {b}: {n} (pilot: 5 seeds, sd of Δ {np.std(d, ddof=1):.3g})" in text
    assert "at 0.05/2 (Holm's strictest step" in text


def test_changed_says_what_differs_from_the_baseline_chosen():
    """With --baseline another variant, `changed` is what differs from that variant: its settings the row leaves
    at the study's base run count too (a row showed only its own settings, and the study's base row '-')."""
    from dashboards.table import _changed
    from record.recorded import RecordedDesign

    design = RecordedDesign.from_json(
        {
            "variants": [
                {"name": "base", "settings": {}},
                {"name": "wide", "settings": {"model.d_ff": 128}},
                {"name": "slow", "settings": {"training.lr": "1e-05"}},
            ]
        }
    )
    assert _changed(design, "slow", "base") == "lr=1e-05"
    assert _changed(design, "slow", "wide") == "lr=1e-05, d_ff=(base run's)"
    assert _changed(design, "base", "wide") == "d_ff=(base run's)"
    assert _changed(design, "wide", "wide") == "(baseline)"


def test_stars_follow_the_verdict_at_the_study_s_alpha(store):
    """Six seeds all one way: the exact test's p is 2/2^6 = 0.031. At alpha 0.05 that is "different" with one star
    after Δ; at alpha 0.01 it is "not resolved", and a star beside it would say otherwise."""
    rng = np.random.default_rng(7)
    base = base_values(range(6), rng)
    values = {"baseline": base, "higher": {s: v + 0.05 + 0.01 * rng.random() for s, v in base.items()}}
    for alpha, verdict, star in ((0.05, "different (better)", True), (0.01, "not resolved", False)):
        study = f"stars{int(alpha * 100)}"
        fill(store, study, values, analysis={"alpha": alpha})
        table = build(load_runs(store, study))
        row = next(r for r in table.rows if r.variant == "higher")
        assert row.contrast.p_holm == pytest.approx(2 / 2**6) and row.contrast.verdict == verdict
        line = next(x for x in to_markdown(table).splitlines() if x.startswith("| higher |"))
        assert ("] * |" in line) is star and row.marks == ("*" if star else ""), line


# --- issue 46: what a verdict can claim ----------------------------------------------------------------------


def test_a_finished_run_without_a_finite_metric_is_a_failure_whatever_its_name(store):
    """A finished cell whose exact match was nan was "pending" (no outcome yet, forever): only a loss's name made it
    diverged. Now a logged non-finite value is diverged and a missing one failed; both count as failures."""
    rng = np.random.default_rng(7)
    base = base_values(SEEDS5, rng)
    odd = {s: base[s] + 0.01 for s in SEEDS5}
    odd[3], odd[4] = float("nan"), None  # seed 3 logged nan, seed 4 logged no test/acc at all
    fill(store, "nonfinite", {"baseline": base, "odd": odd})
    table = build(load_runs(store, "nonfinite"))
    r = {r["variant"]: r for r in table.as_records()}["odd"]
    assert (r["successes"], r["cells"], r["diverged"], r["failed"], r["pending"]) == (3, 5, 1, 1, 0)
    assert any("odd: 2 finished run(s) without a finite test/acc, counted as failures" in n for n in table.notes)


def test_an_imputed_value_is_shown_as_imputed_with_no_interval_of_its_own(store):
    """A variant that failed on every seed takes the worst value seven times: Δ's spread is the baseline's alone,
    and an interval (+0.10 [0.098, 0.106]) looked measured. Partly imputed contrasts say how many seeds were."""
    rng = np.random.default_rng(8)
    base = base_values(SEEDS5, rng)
    values = {"baseline": base, "dead": dict.fromkeys(SEEDS5), "half": {s: base[s] + 0.02 for s in SEEDS5}}
    values["half"][0] = None
    states = {**{("dead", s): "diverged" for s in SEEDS5}, ("half", 0): "failed"}
    fill(store, "imputed", values, states=states)
    table = build(load_runs(store, "imputed"))
    rows = {r.variant: r for r in table.rows}
    dead, half = rows["dead"].contrast, rows["half"].contrast
    assert dead.all_imputed == "dead" and dead.imputed == 5 and half.imputed == 1 and not half.all_imputed
    md = to_markdown(table)
    line = next(x for x in md.splitlines() if x.startswith("| dead |"))
    assert "(imputed: every seed of dead failed; no interval)" in line and "[" not in line.split("|")[5]
    assert "(1 of 5 imputed)" in next(x for x in md.splitlines() if x.startswith("| half |"))


def room_study(store, study: str, expect: list[dict]) -> None:
    """Locality in miniature: full attention at 0.315 accuracy on a ten-class task whose majority class holds 14%
    of the test set; local attention at 0.30."""
    rng = np.random.default_rng(9)
    full = {s: 0.315 + 0.01 * rng.standard_normal() for s in SEEDS8}
    local = {s: 0.30 + 0.01 * rng.standard_normal() for s in SEEDS8}
    params = dict.fromkeys(("full", "local"), {"model.arch": "encoder", "model.n_classes": "10"})
    extra = {(v, s): {"data/test_majority": 0.14} for v in ("full", "local") for s in SEEDS8}
    analysis = {"expect": expect}
    fill(
        store,
        study,
        {"full": full, "local": local},
        metric="test/accuracy",
        params=params,
        extra=extra,
        analysis=analysis,
    )


def test_no_room_for_the_expected_effect_is_not_testable_here(store):
    """LRA's local attention lost 0.21 accuracy on ListOps; here full attention scores 0.315 and the majority class
    0.14, so no variant can fall by 0.21: "LRA's -0.21 is excluded by every interval" was automatic. The verdict is
    computed: not testable here, with the room and what would make it testable. An expectation the room holds
    leaves the verdict to the test."""
    source = "Tay et al. 2021, Table 1"
    room_study(store, "room", [{"contrast": ["local", "full"], "value": -0.21, "source": source}])
    table = build(load_runs(store, "room"))
    c = table.rows[1].contrast
    full_mean = table.rows[0].summary.mean
    assert c.verdict == "not testable here" and c.p == pytest.approx(flips([x for x in c.differences]))
    assert f"no room for the expected -0.21 ({source})" in c.untestable_here
    assert f"the comparator scores {full_mean:.3g}" in c.untestable_here
    assert "the majority class's share is 0.14" in c.untestable_here
    assert f"{full_mean - 0.14:.3g} away" in c.untestable_here
    assert c.make_testable == "a task, length or budget at which the comparator scores above 0.35"
    lead = table_lead(to_markdown(table))
    assert "local vs full: not testable here" in lead and "why: no room" in lead and "next: a task, length" in lead
    room_study(store, "roomy", [{"contrast": ["local", "full"], "value": -0.1}])
    assert build(load_runs(store, "roomy")).rows[1].contrast.verdict in ("not resolved", "different (worse)")


def test_a_margin_past_the_metric_s_floor_cannot_show_equivalence(store):
    """Issue 65: norm_placement_long declared ±0.01 nats where the losses were 0.0002-0.002, so a variant five times
    the comparator's loss came out "different (worse), equivalent within ±0.01": no variant can score 0.01 below a
    loss of 0.001, so one of the two one-sided tests cannot fail. The equivalence verdict is now not testable here,
    with the room said; the same margin where the comparator's loss leaves room on both sides still decides."""
    rng = np.random.default_rng(11)
    floor = {s: 0.001 + 0.0001 * rng.standard_normal() for s in SEEDS8}
    values = {"pre": floor, "post": {s: 5 * v for s, v in floor.items()}}
    margins = {"margins": {"final/val_loss": 0.01}}
    fill(store, "floor", values, metric="final/val_loss", direction="minimize", analysis=margins)
    table = build(load_runs(store, "floor"))
    c = table.rows[1].contrast
    assert c.p_tost_holm <= 0.05  # the arithmetic alone says equivalent: every difference is far inside ±0.01
    assert c.verdict == "different (worse); equivalence not testable here"
    level = table.rows[0].summary.mean
    assert f"the comparator scores {level:.3g} on final/val_loss, {level:.3g} from it" in c.equivalence_untestable_here
    assert "a perfect loss of 0" in c.equivalence_untestable_here
    assert "equivalent within" not in table_lead(to_markdown(table))  # the verdicts said first claim no equivalence
    assert c.make_equivalence_testable.startswith(f"a margin below {level:.3g}")
    reading = next(r for r in readings(table) if r.label == c.label)
    assert reading.why.startswith("equivalence not testable here: the margin ±0.01 reaches past a perfect loss of 0")
    # the loss of a model far from its floor leaves room for ±0.01 on both sides: the tests decide
    mid = {s: 0.5 + 0.01 * rng.standard_normal() for s in SEEDS8}
    fill(store, "mid", {"pre": mid, "post": {s: v + 0.001 for s, v in mid.items()}}, metric="final/val_loss",
         direction="minimize", analysis=margins)  # fmt: skip
    c = build(load_runs(store, "mid")).rows[1].contrast
    assert c.equivalence_untestable_here == "" and "equivalent within ±0.01" in c.verdict
    assert c.comparator == pytest.approx(np.mean(list(mid.values())))


def test_a_variant_that_diverges_more_says_so_in_its_verdict_line(store):
    """Issue 65: scheduled_sampling_long's variant diverged on 6 of 14 seeds; under the worst rule those seeds took
    the worst value and the metric's verdict was "not resolved" while Fisher's exact test on the success rates gave
    Holm p 0.032, and the verdict line never said so. Now it does, with the counts and the test's p (Fisher by
    enumeration); a variant whose rate does not differ adds nothing."""
    seeds = range(14)
    rng = np.random.default_rng(12)
    base = base_values(seeds, rng)
    shaky = {s: (base[s] + 0.002 if s >= 6 else None) for s in seeds}
    states = {("shaky", s): "diverged" for s in range(6)}
    fill(store, "diverging", {"baseline": base, "shaky": shaky}, states=states)
    table = build(load_runs(store, "diverging"))
    c = table.rows[1].contrast
    assert c.p_rate_holm == pytest.approx(fisher_by_enumeration(8, 14, 14, 14)) and c.p_rate_holm <= 0.05
    line = next(r for r in readings(table) if r.label == c.label).sentence
    assert line.startswith(f"shaky vs baseline: {c.verdict} on test/acc")
    assert line.endswith(
        f"; shaky fails more: 6 of 14 seeds (6 diverged) against 0 of 14 for baseline, Fisher Holm p {c.p_rate_holm:.2g}"
    )
    assert "fails more" in table_lead(to_markdown(table))
    states = {("shaky", 0): "diverged"}  # 1 of 14: Fisher p 1
    fill(
        store, "one_off", {"baseline": base, "shaky": {s: (None if s == 0 else base[s]) for s in seeds}}, states=states
    )
    quiet = build(load_runs(store, "one_off"))
    assert "fails more" not in next(r for r in readings(quiet) if r.label == "shaky vs baseline").sentence


def test_a_claim_is_shown_beside_the_verdict_of_exactly_its_contrast(store):
    """Issue 65: a paper's sentence stands beside the verdict of the contrast the study mapped it to, in every
    rendering that leads with the verdicts, and beside no other contrast."""
    rng = np.random.default_rng(13)
    base = base_values(SEEDS8, rng)
    values = {"dot": base, "additive": {s: v + 0.001 * rng.standard_normal() for s, v in base.items()},
              "unscaled": {s: v - 0.05 for s, v in base.items()}}  # fmt: skip
    sentence = "additive and dot-product attention perform similarly for small values of d_k"
    claim = {"contrast": ["additive", "dot"], "source": "Vaswani et al. 2017, section 3.2.1", "sentence": sentence}
    fill(store, "claimed", values, analysis={"claims": [claim]})
    table = build(load_runs(store, "claimed"))
    said = {r.label: r for r in readings(table)}
    verdict = next(c.verdict for c in table.family if c.label == "additive vs dot")
    assert said["additive vs dot"].claims == (
        f'Vaswani et al. 2017, section 3.2.1: "{sentence}" (tested here: {verdict})',
    )
    assert said["unscaled vs dot"].claims == ()
    for text in (to_markdown(table), to_terminal(table), to_html(table)):
        assert text.count(sentence) == 1
    lines = to_terminal(table).splitlines()
    at = next(i for i, x in enumerate(lines) if x.startswith("additive vs dot:"))
    assert lines[at + 1].startswith('  claim: Vaswani et al. 2017, section 3.2.1: "additive and dot-product')


def test_a_verdict_that_flips_with_the_failure_rule_says_so(store):
    """Issue 65: failures enter every verdict they change. Three of ten seeds of a variant diverge; its seven
    survivors beat the baseline by 0.05 in every seed. Under 'worst' (declared) the diverged seeds take the worst
    value observed (0.3) and the sign-flip test cannot resolve it (p 2/8 from the three large differences); under
    'exclude' the seven survivors are different (better) (2/2^7). The verdict line says the verdict flips, with each
    rule's verdict; a study without failures judges one rule only."""
    seeds = range(10)
    base = {s: 0.8 + 0.001 * s for s in seeds}
    base[9] = 0.3  # the worst value any finished cell reached
    values = {"baseline": base, "fragile": {s: (None if s < 3 else base[s] + 0.05) for s in seeds}}
    states = {("fragile", s): "diverged" for s in range(3)}
    fill(store, "flips", values, states=states)
    table = build(load_runs(store, "flips"))
    assert table.by_rule["fragile vs baseline"] == {"worst": "not resolved", "exclude": "different (better)"}
    r = next(r for r in readings(table) if r.label == "fragile vs baseline")
    expected = "the verdict flips with the failure rule: worst (declared): not resolved; exclude: different (better)"
    assert r.rules == expected and f"  - failure rules: {expected}" in to_markdown(table)
    clean = {"baseline": base, "fine": {s: base[s] + 0.05 for s in seeds}}
    fill(store, "no_failures", clean)
    assert build(load_runs(store, "no_failures")).by_rule == {}


def test_a_relative_margin_tests_the_ratio_and_keeps_room_at_the_floor(store):
    """Issue 65: a margin on the scale it means. Losses of 0.001 leave no room for ±0.01, but ±5% of the comparator
    is a ratio, tested as the two one-sided tests of each seed's log(a / b) against ±log 1.05 (scipy's t-test form
    as the independent check): a variant within 2% is equivalent; one five times the loss is not, and is worse."""
    rng = np.random.default_rng(14)
    floor = {s: 0.001 * (1 + 0.05 * rng.standard_normal()) for s in SEEDS8}
    close = {s: v * (1.02 + 0.001 * rng.standard_normal()) for s, v in floor.items()}
    values = {"pre": floor, "close": close, "far": {s: 5 * v for s, v in floor.items()}}
    analysis = {"margins": {"final/val_loss": {"relative": 0.05}}, "test": "t"}
    fill(store, "ratio", values, metric="final/val_loss", direction="minimize", analysis=analysis)
    table = build(load_runs(store, "ratio"))
    by = {r.variant: r.contrast for r in table.rows[1:]}
    logs = np.array([np.log(close[s] / floor[s]) for s in SEEDS8])
    m = np.log(1.05)
    expected = max(
        sps.ttest_1samp(logs, -m, alternative="greater").pvalue, sps.ttest_1samp(logs, m, alternative="less").pvalue
    )
    assert by["close"].p_tost == pytest.approx(expected) and by["close"].on_scale == pytest.approx(tuple(logs))
    assert by["close"].verdict.endswith("equivalent within ±0.05 of the comparator (ratio)")
    assert by["close"].equivalence_untestable_here == ""  # a ratio never reaches a loss's floor of 0
    assert by["far"].verdict == "different (worse)"
    assert "equivalent within ±0.05 of the comparator (ratio) (TOST, Holm)" in to_markdown(table)


def table_lead(md: str) -> str:
    return md[: md.index("| variant")]


def test_a_variant_not_converged_by_the_declared_criterion_is_not_testable_here(store):
    """analysis.converged declared: a variant whose val/loss still fell 20% over the last fifth of training has
    not converged, and its contrasts are not testable here (the undeclared check only warns)."""
    rng = np.random.default_rng(10)
    base = base_values(SEEDS5, rng)
    values = {"baseline": base, "slow": {s: base[s] - 0.05 for s in SEEDS5}}
    falling = [(25, 2.0), (50, 1.5), (75, 1.25), (100, 1.0)]  # 1.25 -> 1.0 over the last quarter: 20% over a fifth
    curves = {("slow", s): falling for s in SEEDS5}
    steps = {"cost/steps": 100.0, "cost/wall_time_s": 10.0, "cost/n_params": 1000.0}
    analysis = {"converged": {"window": 0.2, "fraction": 0.05}}
    fill(store, "conv", values, curves=curves, analysis=analysis, cost=steps)
    c = build(load_runs(store, "conv")).rows[1].contrast
    assert (
        c.verdict == "not testable here"
        and "not converged" in c.untestable_here
        and "slow's loss fell" in c.untestable_here
    )
    assert c.make_testable == "a longer budget (budget.steps: 200)"
    fill(store, "conv_undeclared", values, curves=curves, cost=steps)
    plain = build(load_runs(store, "conv_undeclared"))
    assert plain.rows[1].contrast.verdict != "not testable here" and any(w.kind == "convergence" for w in plain.caveats)


def test_a_loss_near_its_floor_that_falls_less_than_its_seeds_differ_has_converged(store):
    """Issue 65: the relative fall of a loss already near zero fired the not-converged warning at exact-match
    ceilings (norm_placement at 1,200 steps, final losses below 0.002). A loss ending at 0.003-0.043 over the seeds
    (fill adds 0.01 per seed) that fell by 0.0024 over the last fifth (5-44% of its value, 16% on average) moves
    less than its seeds' final losses differ (sd 0.016): no warning, and a criterion declared against that spread
    finds it converged; against the value (relative) it does not. A loss falling by 0.2 is not converged either way."""
    floor = {("floor", s): [(25, 0.02), (50, 0.012), (75, 0.006), (100, 0.003)] for s in SEEDS5}
    moving = {("moving", s): [(25, 2.0), (50, 1.5), (75, 1.25), (100, 1.0)] for s in SEEDS5}
    values = {"base": {s: 0.5 for s in SEEDS5}, "floor": {s: 0.003 + 0.01 * s for s in SEEDS5},
              "moving": {s: 1.0 + 0.01 * s for s in SEEDS5}}  # fmt: skip
    steps = {"cost/steps": 100.0, "cost/wall_time_s": 10.0, "cost/n_params": 1000.0}
    fell, last = (0.006 - 0.003 * 5 / 25) - 0.003, np.array([0.003 + 0.01 * s for s in SEEDS5])  # v(80) - v(100)
    assert fell < np.std(last, ddof=1) and np.mean(fell / (last + fell)) > 0.05  # the premise
    kw = dict(metric="final/val_loss", direction="minimize", curves={**floor, **moving}, cost=steps)
    fill(store, "floor_plain", values, **kw)
    warned = [c for c in build(load_runs(store, "floor_plain")).caveats if c.kind == "convergence"]
    assert [c.variants for c in warned] == [("moving",)]
    for against, floor_testable in (("spread", True), ("value", False)):
        analysis = {"converged": {"window": 0.2, "fraction": 1.0 if against == "spread" else 0.05, "against": against}}
        fill(store, f"floor_{against}", values, analysis=analysis, **kw)
        rows = {r.variant: r.contrast for r in build(load_runs(store, f"floor_{against}")).rows[1:]}
        assert (rows["floor"].verdict != "not testable here") == floor_testable, (
            against,
            rows["floor"].untestable_here,
        )
        assert rows["moving"].verdict == "not testable here"
        said = "times its seeds' spread; analysis.converged.fraction 1 of the spread" if against == "spread" else "%;"
        assert said in rows["moving"].untestable_here, rows["moving"].untestable_here


def test_the_table_leads_with_each_verdict_why_and_the_next_step(store):
    """A new user's 2 x 2 grid at two seeds got "not resolved, p 1" beside a 95% interval of [+0.188, +0.392], the
    reason in a footnote, and no verdict for its main effects. Now the default family of a grid is its main
    effects and interaction; each comes first with its verdict, why (the exact test's floor at 2 seeds) and the
    command that resolves it; the interval the exact test does not share is marked."""
    grid(store, "g2", None, seeds=range(2))
    table = build(load_runs(store, "g2"))
    assert [c.label for c in table.family] == [
        "model.norm: post vs pre",
        "training.warmup: 0 vs 100",
        "model.norm x training.warmup: post x 0 vs pre x 100",
    ]
    lead = table_lead(to_markdown(table))
    assert lead.count("not resolved on final/val_loss") == 3
    assert "why: 2 seeds: the exact test's smallest p is 0.5, above Holm's first step 0.05/3" in lead
    # 2/2^n <= 0.05/3 first at n = 7 (independent: the exact test's floor)
    assert min(n for n in range(2, 12) if 2 / 2**n <= 0.05 / 3) == 7
    assert "next: ablate sweep ablations/studies/g2.yaml --seeds" in lead
    seeds = [int(x.split("--seeds ")[1].split()[0]) for x in lead.splitlines() if "--seeds" in x]
    assert all("--amend" in x for x in lead.splitlines() if "--seeds" in x)  # seeds after results: an amendment
    assert seeds and min(seeds) >= 7
    main = table.family[0]
    assert main.ci_t[0] > 0 and "‡" in to_markdown(table)  # the t interval excludes 0, the exact test cannot say


def test_no_more_seeds_are_advised_where_these_seeds_had_the_power(store):
    """Raising the seeds to a count already trained is no step: where the declared difference needs no more seeds
    than the table has, the why says these seeds had the power, and the step is the margin that would test
    equivalence (the catalogue's heads table advised "--seeds 8" at 8 seeds)."""
    rng = np.random.default_rng(12)
    base = base_values(SEEDS5, rng)
    values = {"baseline": base, "v": {s: v + 0.002 * rng.standard_normal() for s, v in base.items()}}
    fill(store, "powered", values, analysis={"detect": {"test/acc": 0.05}, "test": "t"})
    table = build(load_runs(store, "powered"))
    c = table.rows[1].contrast
    d = np.array([values["v"][s] - base[s] for s in SEEDS5])
    assert c.verdict == "not resolved" and stats.seeds_needed(d, 0.05, test="t") <= 5
    lead = table_lead(to_markdown(table))
    assert "--seeds" not in lead and "power for it: a difference that large is unlikely" in lead
    assert "next: declare analysis.margins.test/acc to test equivalence" in lead


def test_decided_verdicts_count_the_seeds_as_measured(store):
    """ "Cosine better in all 7 seeds" was written where the exact p was 4/128 (one seed not better): the count in
    a verdict sentence is counted from the per-seed differences; equivalence words only after a margin test."""
    seeds = range(7)
    base = {s: 1.0 + 0.01 * s for s in seeds}
    better = {s: base[s] - (0.02 if s else -0.001) for s in seeds}  # lower (better) in 6 of 7
    analysis = {"margins": {"final/val_loss": 0.5}}
    fill(
        store, "counts", {"base": base, "cos": better}, metric="final/val_loss", direction="minimize", analysis=analysis
    )
    table = build(load_runs(store, "counts"))
    c = table.rows[1].contrast
    assert c.p == pytest.approx(flips([better[s] - base[s] for s in seeds]))
    lead = table_lead(to_markdown(table))
    sentence = next(x for x in lead.splitlines() if x.startswith("- **cos vs base"))
    d = np.array([better[s] - base[s] for s in seeds])
    assert f"lower in {int((d < 0).sum())} of 7 seeds" in sentence and "lower in 6 of 7 seeds" in sentence
    assert ("equivalent within ±0.5" in sentence) == (c.p_tost_holm <= 0.05)
