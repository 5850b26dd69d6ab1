"""Variants that compare one model family under two names are said before anything runs (a warning: the study
may mean it). Luong et al. (2015) compared dot, general and concat scores over states that are not separately
projected; over projected q and k, general's matrix folds into the query projection (docs/components.md)."""

from __future__ import annotations

from pathlib import Path

import yaml

from ablations.spec import load_study
from ablations.spec.equivalence import equivalence_warnings, equivalent_pairs, warning_lines
from tests.conftest import ROOT

BASE = {
    "task": {"name": "reverse", "train_size": 200, "max_len": 6},
    "model": {"d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32},
    "training": {"max_steps": 10, "val_every": 10, "batch_size": 16},
}


def study(tmp_path: Path, grid: dict, **model) -> object:
    data = {"name": "t", "base": {**BASE, "model": {**BASE["model"], **model}}, "design": {"grid": grid}, "seeds": 2}
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_study(path)


def test_general_against_dot_over_projected_q_and_k_is_said(tmp_path):
    said = equivalence_warnings(study(tmp_path, {"model.score": ["dot", "general", "cosine", "additive"]}))
    assert len(said) == 1
    assert "'model.score=dot'" not in said[0] and "score 'general' with 'dot'" in said[0]
    assert "one bilinear family" in said[0] and "model.qk_projections: false" in said[0]
    unscaled = equivalence_warnings(study(tmp_path, {"model.score": ["dot_unscaled", "general"]}))
    assert len(unscaled) == 1 and "'dot_unscaled'" in unscaled[0]


def test_luong_scores_over_the_states_and_other_differences_are_not_said(tmp_path):
    assert (
        equivalence_warnings(study(tmp_path, {"model.score": ["dot", "general", "additive"]}, qk_projections=False))
        == []
    )
    assert equivalence_warnings(study(tmp_path, {"model.score": ["dot", "cosine", "additive"]})) == []
    # a grid over score and norm: general against dot under the same norm is said (twice), across norms not
    crossed = equivalence_warnings(study(tmp_path, {"model.score": ["dot", "general"], "model.norm": ["pre", "post"]}))
    assert len(crossed) == 2
    assert all(("norm=pre" in w) != ("norm=post" in w) for w in crossed)


def test_the_catalogue_similarity_studies_compare_luongs_scores_and_would_be_warned_otherwise(tmp_path):
    """The third edition scores the states themselves (no warning); the same files over projected q and k, as the
    second edition scored them, are warned, naming the file."""
    for name in ("similarity_text", "similarity_recall"):
        assert warning_lines(load_study(ROOT / "ablations" / "studies" / f"{name}.yaml")) == []
        data = yaml.safe_load((ROOT / "ablations" / "studies" / f"{name}.yaml").read_text())
        data["base"]["model"]["qk_projections"] = True
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(data))
        lines = warning_lines(load_study(path))
        assert len(lines) == 1 and lines[0].startswith(f"warning: {path}: ")


def test_the_dry_run_says_it(tmp_path):
    from ablations.sweep.preview import dry_run

    said: list[str] = []
    s = study(tmp_path, {"model.score": ["dot", "general"]})
    dry_run(s, tracking_uri=f"sqlite:///{tmp_path / 'none.db'}", claims_url=None, reuse_any_code=False, out=said.append)
    assert warning_lines(s)[0] in said
    assert not (tmp_path / "none.db").exists()


def test_a_report_can_say_it_from_the_runs_params():
    """The report reads each variant's model from MLflow's params (text): the same pairs are found there."""
    params = {
        "score=dot": {"score": "dot", "qk_projections": "True", "d_model": "16"},
        "score=general": {"score": "general", "qk_projections": "True", "d_model": "16"},
        "score=general states": {"score": "general", "qk_projections": "False", "d_model": "16"},
        "score=dot states": {"score": "dot", "qk_projections": "False", "d_model": "16"},
    }
    assert equivalent_pairs(params) == [("score=dot", "score=general", "dot")]
