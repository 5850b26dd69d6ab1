"""Variants of a study that compare one model family under two names, said before anything runs.

A study may compare two settings that ``ModelConfig`` accepts as different models but that are the same family of
functions: Luong et al.'s ``general`` score q^T W_h k over projected q and k is ``dot`` with W_h folded into the
query projection (docs/components.md, Scores). Such a comparison measures a parameterisation, not what the
paper compared; the study may mean that, so it is a warning (the dry run and the sweep print it), not an error.
"""

from __future__ import annotations

from typing import Any

# scores that are one bilinear family when q and k are learned projections: general's W_h (and dot's 1/sqrt(D))
# fold into the query projection
BILINEAR_FAMILY = frozenset({"dot", "dot_unscaled", "general"})


def _same_bilinear_family(a: Any, b: Any) -> bool:
    """Two model configs that differ only in their score, general against dot or dot_unscaled, over projected q
    and k."""
    if a.score == b.score or not {a.score, b.score} <= BILINEAR_FAMILY or "general" not in {a.score, b.score}:
        return False
    return a.qk_projections and b.qk_projections and a.replace(score=b.score) == b


def equivalence_warnings(study: Any) -> list[str]:
    """One line per pair of variants (their first cells' models) that compares one family under two names."""
    models: dict[str, Any] = {}
    for cell in study.cells:
        models.setdefault(cell.variant, cell.run.model)
    names = list(models)
    said = []
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            if _same_bilinear_family(models[a], models[b]):
                said.append(
                    f"variants {a!r} and {b!r} compare score 'general' with {models[a].score if models[a].score != 'general' else models[b].score!r} "
                    "over projected q and k, where general's matrix folds into the query projection: one bilinear "
                    "family (docs/components.md, Scores), so their difference measures over-parameterisation, not "
                    "Luong et al. (2015)'s comparison; set model.qk_projections: false to compare Luong's scores "
                    "over the states themselves"
                )
    return said


def warning_lines(study: Any) -> list[str]:
    """``equivalence_warnings`` as the dry run and the sweep print them."""
    return [f"warning: {study.source}: {why}" for why in equivalence_warnings(study)]
