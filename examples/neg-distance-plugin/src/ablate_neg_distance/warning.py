"""A warning of one's own, said in every report beside the built-in ones: distances grow with the head size, so
negative-distance scores compared at large heads start sharper than dot product's (which divides by sqrt(D) too,
but whose q.k has mean 0)."""

from __future__ import annotations

from dashboards.caveats import WARNINGS, TableView


@WARNINGS.register("distance_scale")
def distance_scale(view: TableView) -> str | None:
    compared = [v for v, model in view.models.items() if model.get("score") == "neg_distance"]
    wide = [v for v in compared if _number(view.models[v].get("head_dim")) > 32]
    if not wide:
        return None
    return f"{', '.join(wide)}: negative-distance scores at heads wider than 32 start sharper than dot product's"


def _number(text: str | None) -> float:
    try:
        return float(text or 0)
    except ValueError:  # "None": the head size was not recorded
        return 0.0
