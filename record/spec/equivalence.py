"""Variants of a study whose score comparison does not measure what it seems to, said before anything runs.

A study may compare two settings that ``ModelConfig`` accepts as different models but that are the same family of
functions: Luong et al.'s ``general`` score q^T W_h k over projected q and k is ``dot`` with W_h folded into the
query projection, ``dot`` reparameterised (docs/components.md, Scores). Such a comparison measures a
parameterisation, not what the paper compared. And a study may compare scores in self-attention over the states
themselves (``qk_projections: false``), where q and k are one tensor: a token scores itself |x|^2, and the scores
differ first in how they treat that (Luong et al. scored target states against source states: an encoder_decoder's
cross-attention, ``cross_score`` with ``cross_qk_projections: false``). The study may mean either, so each is a
warning (the dry run and the sweep print it, the report repeats it: ``dashboards.caveats``), not an error.

Each attention a model has is a *site*: ``self`` (every self-attention: ``score``, ``qk_projections``) and, in an
encoder_decoder, ``cross`` (``cross_score``, ``cross_qk_projections``, as the self-attention's when left out).
Two variants compare scores when their models differ in nothing but the scores of some sites.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# scores that are one bilinear family when q and k are learned projections: general's W_h (and dot's 1/sqrt(D))
# fold into the query projection
BILINEAR_FAMILY = frozenset({"dot", "dot_unscaled", "general"})
SCORING_KEYS = ("score", "qk_projections", "cross_score", "cross_qk_projections")

Sites = dict[str, tuple[str, bool]]  # site (self | cross) -> (its score, whether its q and k are projected)


def _given(value: Any) -> bool:
    return value is not None and str(value) not in ("None", "")  # MLflow keeps a null as the text 'None'


def _flag(value: Any, default: bool) -> bool:
    return str(value).lower() not in ("false", "0") if _given(value) else default


def sites(model: Mapping[str, Any]) -> Sites:
    """How a model scores, site by site: ``self`` and, in an encoder_decoder, ``cross`` (its own keys, else the
    self-attention's). ``model``: {field: value}, a config's ``to_dict()`` or a run's ``params.model.*`` (text)."""
    score, projected = str(model.get("score", "dot")), _flag(model.get("qk_projections"), True)
    out = {"self": (score, projected)}
    if str(model.get("arch", "decoder")) == "encoder_decoder":
        cross = model.get("cross_score")
        out["cross"] = (str(cross) if _given(cross) else score, _flag(model.get("cross_qk_projections"), projected))
    return out


def score_pairs(models: Mapping[str, Mapping[str, Any]]) -> list[tuple[str, str, Sites, Sites, list[str]]]:
    """(variant, variant, the sites of each, the sites whose scores differ) for each pair of variants whose models
    differ in the scores of some sites and in nothing else (projections included)."""
    names = list(models)
    out = []
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            ma, mb = models[a], models[b]
            rest = [{k: str(v) for k, v in m.items() if k not in SCORING_KEYS} for m in (ma, mb)]
            sa, sb = sites(ma), sites(mb)
            if rest[0] != rest[1] or any(sa[s][1] != sb[s][1] for s in sa):
                continue
            differ = [s for s in sa if sa[s][0] != sb[s][0]]
            if differ:
                out.append((a, b, sa, sb, differ))
    return out


def equivalent_pairs(models: Mapping[str, Mapping[str, Any]]) -> list[tuple[str, str, str]]:
    """(variant, variant, the score compared with general) for each pair of variants whose models differ only in
    their scores, and at every site where they do, general against dot or dot_unscaled over projected q and k.
    ``models``: each variant's model as {field: value}, a config's ``to_dict()`` or a run's ``params.model.*``
    (text, as MLflow keeps them)."""
    said = []
    for a, b, sa, sb, differ in score_pairs(models):
        pairs = [{sa[s][0], sb[s][0]} for s in differ]
        if all(sa[s][1] and p <= BILINEAR_FAMILY and "general" in p for s, p in zip(differ, pairs)):
            said.append((a, b, (pairs[0] - {"general"}).pop()))
    return said


def coinciding_pairs(models: Mapping[str, Mapping[str, Any]]) -> list[tuple[str, str]]:
    """Each pair of variants that compares scores in self-attention over the states themselves (their self-attention
    scores differ, qk_projections false): there q and k are one tensor."""
    return [(a, b) for a, b, sa, _, differ in score_pairs(models) if "self" in differ and not sa["self"][1]]


def coinciding_sentence(pairs: list[tuple[str, str]]) -> str:
    """What is said of the pairs of ``coinciding_pairs``, in one sentence naming their variants."""
    names = ", ".join(repr(v) for v in dict.fromkeys(v for pair in pairs for v in pair))
    return (
        f"variants {names} compare scores in self-attention over the states themselves (model.qk_projections: "
        "false), where q and k are one tensor: a token scores itself |x|^2 (general x^T W x, cosine its maximum), "
        "above the other tokens, so at initialisation dot, general and cosine put most of each token's attention on "
        "itself, and dot has no parameter to change that (docs/components.md, Scores); their difference measures how "
        "each score escapes its own token, not Luong et al. (2015)'s comparison, which scored target states against "
        "source states: vary model.cross_score with model.cross_qk_projections: false in an encoder_decoder"
    )


def sentence(a: str, b: str, other: str) -> str:
    """What is said of a pair of ``equivalent_pairs``."""
    return (
        f"variants {a!r} and {b!r} compare score 'general' with {other!r} over projected q and k, where general's "
        f"matrix folds into the query projection: {other} reparameterised, one bilinear family (docs/components.md, "
        "Scores), so their difference measures over-parameterisation, not Luong et al. (2015)'s comparison; Luong "
        "scored target states against source states themselves: model.cross_score with "
        "model.cross_qk_projections: false in an encoder_decoder (model.qk_projections: false scores the "
        "self-attention's states too, where q and k coincide)"
    )


def _models(study: Any) -> dict[str, dict[str, Any]]:
    """Each variant's model (its first cell's), as {field: value}."""
    models: dict[str, Any] = {}
    for cell in study.cells:
        models.setdefault(cell.variant, cell.run.model.to_dict())
    return models


def equivalence_warnings(study: Any) -> list[str]:
    """One line per pair of variants (their first cells' models) that compares one family under two names."""
    return [sentence(*pair) for pair in equivalent_pairs(_models(study))]


def coinciding_warnings(study: Any) -> list[str]:
    """One line naming the variants that compare scores where q and k coincide, or none."""
    pairs = coinciding_pairs(_models(study))
    return [coinciding_sentence(pairs)] if pairs else []


def warning_lines(study: Any) -> list[str]:
    """``equivalence_warnings`` and ``coinciding_warnings`` as the dry run and the sweep print them."""
    return [f"warning: {study.source}: {why}" for why in equivalence_warnings(study) + coinciding_warnings(study)]
