"""Variants of a study that compare one model family under two names, said before anything runs.

A study may compare two settings that ``ModelConfig`` accepts as different models but that are the same family of
functions: Luong et al.'s ``general`` score q^T W_h k over projected q and k is ``dot`` with W_h folded into the
query projection (docs/components.md, Scores). Such a comparison measures a parameterisation, not what the
paper compared; the study may mean that, so it is a warning (the dry run and the sweep print it), not an error.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# scores that are one bilinear family when q and k are learned projections: general's W_h (and dot's 1/sqrt(D))
# fold into the query projection
BILINEAR_FAMILY = frozenset({"dot", "dot_unscaled", "general"})


def _projected(model: Mapping[str, Any]) -> bool:
    return str(model.get("qk_projections", True)).lower() not in ("false", "0")


def equivalent_pairs(models: Mapping[str, Mapping[str, Any]]) -> list[tuple[str, str, str]]:
    """(variant, variant, the score compared with general) for each pair of variants whose models differ only in
    their score, general against dot or dot_unscaled, over projected q and k. ``models``: each variant's model as
    {field: value}, a config's ``to_dict()`` or a run's ``params.model.*`` (text, as MLflow keeps them)."""
    names = list(models)
    said = []
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            ma, mb = models[a], models[b]
            scores = {str(ma.get("score", "dot")), str(mb.get("score", "dot"))}
            if len(scores) != 2 or not scores <= BILINEAR_FAMILY or "general" not in scores:
                continue
            rest = [{k: str(v) for k, v in m.items() if k != "score"} for m in (ma, mb)]
            if _projected(ma) and _projected(mb) and rest[0] == rest[1]:
                said.append((a, b, (scores - {"general"}).pop()))
    return said


def sentence(a: str, b: str, other: str) -> str:
    """What is said of a pair of ``equivalent_pairs``."""
    return (
        f"variants {a!r} and {b!r} compare score 'general' with {other!r} over projected q and k, where general's "
        "matrix folds into the query projection: one bilinear family (docs/components.md, Scores), so their "
        "difference measures over-parameterisation, not Luong et al. (2015)'s comparison; set "
        "model.qk_projections: false to compare Luong's scores over the states themselves"
    )


def equivalence_warnings(study: Any) -> list[str]:
    """One line per pair of variants (their first cells' models) that compares one family under two names."""
    models: dict[str, Any] = {}
    for cell in study.cells:
        models.setdefault(cell.variant, cell.run.model.to_dict())
    return [sentence(*pair) for pair in equivalent_pairs(models)]


def warning_lines(study: Any) -> list[str]:
    """``equivalence_warnings`` as the dry run and the sweep print them."""
    return [f"warning: {study.source}: {why}" for why in equivalence_warnings(study)]
