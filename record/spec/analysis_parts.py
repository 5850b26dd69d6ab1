"""The parts of a study's ``analysis:`` section (record/spec/analysis.py): the declared correction family
(``Contrasts``), the effects a study looks for (``Expect``), the papers' claims each mapped to the contrast that
tests it (``Claim``), the convergence criterion and the report's warnings."""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError, field_validator, model_validator


class Contrasts(BaseModel):
    """The declared correction family: Holm's correction runs over exactly these contrasts."""

    model_config = ConfigDict(extra="forbid")

    pairs: Literal["baseline"] | list[tuple[str, str]] = Field(
        default_factory=list, description="[variant, comparator] pairs (Δ = variant − comparator), or 'baseline'"
    )
    main_effects: StrictBool | list[str] = False
    interactions: StrictBool | list[tuple[str, str]] = False

    @field_validator("pairs", "interactions", mode="before")
    @classmethod
    def _pairs(cls, value: Any, info: Any) -> Any:
        """One clear message for a malformed list (pydantic would report each member of the union)."""
        if isinstance(value, (str, bool)) or not isinstance(value, list):
            if info.field_name == "pairs" and value != "baseline":
                raise ValueError(f"must be a list of [variant, comparator] or 'baseline' (got {value!r})")
            return value
        what = "[variant, comparator]" if info.field_name == "pairs" else "[axis, axis]"
        for i, item in enumerate(value):
            if not (isinstance(item, (list, tuple)) and len(item) == 2 and all(isinstance(x, str) for x in item)):
                raise ValueError(f"item {i} ({item!r}) is not a pair {what} of names")
        return value

    @field_validator("main_effects", mode="before")
    @classmethod
    def _axes(cls, value: Any) -> Any:
        if isinstance(value, bool) or (isinstance(value, list) and all(isinstance(x, str) for x in value)):
            return value
        raise ValueError(f"must be true, false or a list of axes (got {value!r})")

    @model_validator(mode="after")
    def _something(self) -> Contrasts:
        if not self.pairs and not self.main_effects and not self.interactions:
            raise ValueError(
                "declares no contrast; list pairs, main_effects or interactions, or remove contrasts "
                "(then each variant is compared with the baseline)"
            )
        return self


class NamesContrast(BaseModel):
    """A declaration about one contrast of the family: a pair [variant, comparator], or a factorial effect's label."""

    model_config = ConfigDict(extra="forbid")

    contrast: tuple[str, str] | str = Field(description="[variant, comparator], or a factorial effect's label")
    metric: str | None = Field(None, description="default: the study's metric")

    @field_validator("contrast", mode="before")
    @classmethod
    def _contrast(cls, value: Any) -> Any:
        if isinstance(value, str) or (
            isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(x, str) for x in value)
        ):
            return value
        raise ValueError(f"must be [variant, comparator] or an effect's label (got {value!r})")

    @property
    def name(self) -> str:
        """The label of the contrast it names (a pair's "a vs b")."""
        return self.contrast if isinstance(self.contrast, str) else " vs ".join(self.contrast)


class Expect(NamesContrast):
    """The effect a study looks for in one contrast (a paper's number): where the metric leaves less room than
    this between the comparator and the metric's ceiling, floor or chance level, the verdict is *not testable
    here* (docs/statistics.md)."""

    value: float = Field(description="the expected difference, variant - comparator, in the metric's units")
    source: str = Field("", description="where the value comes from (a paper, its table)")

    @field_validator("value")
    @classmethod
    def _nonzero(cls, value: float) -> float:
        if not (math.isfinite(value) and value != 0):
            raise ValueError(f"must be a finite difference other than 0 (got {value})")
        return value


class Claim(NamesContrast):
    """A paper's sentence quoted with the contrast that tests it: the report shows it beside exactly that
    contrast's verdict, so a sentence is never read off a contrast it is not about."""

    source: str = Field(min_length=1, description="the paper and where in it: 'Vaswani et al. 2017, section 3.2.1'")
    sentence: str = Field(min_length=1, description="the claim, quoted")


class Margin(BaseModel):
    """An equivalence margin on the scale it means, where an absolute one (a number alone, in the metric's units)
    would not: ``relative``, a fraction of the comparator's value (0.05: within 5% either way, tested on the
    ratio, |log a - log b| <= log 1.05), or ``log``, on the log scale of a loss or a perplexity. Near a floor an
    absolute margin can exceed the values compared; a relative one shrinks with them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    relative: float | None = Field(None, gt=0, lt=1, description="a fraction of the comparator's value")
    log: float | None = Field(None, gt=0, description="on the log scale of the metric")

    @model_validator(mode="after")
    def _one(self) -> Margin:
        if (self.relative is None) == (self.log is None):
            raise ValueError("give exactly one of relative (e.g. 0.05) or log (e.g. 0.05)")
        return self

    @classmethod
    def of(cls, metric: str, value: Any) -> Any:
        """A margin given as a mapping as a ``Margin`` (its mistake said once, not once per member of the union
        with a number); anything else as given."""
        if not isinstance(value, dict):
            return value
        try:
            return cls.model_validate(value)
        except ValidationError as e:
            first = e.errors()[0]
            where = "".join(f".{p}" for p in first["loc"])
            raise ValueError(f"{metric}{where}: {first['msg'].removeprefix('Value error, ')}") from None

    @staticmethod
    def shown(value: float | Margin) -> str:
        return value.text if isinstance(value, Margin) else f"±{value:g}"

    @property
    def on_log(self) -> float:
        """The margin on the log scale its test runs on."""
        return math.log1p(self.relative) if self.relative is not None else float(self.log)

    @property
    def text(self) -> str:
        return (
            f"±{self.relative:.3g} of the comparator (ratio)" if self.relative is not None else f"±{self.log:.3g} (log)"
        )


class Converged(BaseModel):
    """A declared convergence criterion: a variant whose validation loss (the training loss's trend where
    validation is too sparse) still fell by more than ``fraction`` over the last ``window`` of its training steps
    has not converged, and its contrasts are *not testable here*. ``against``: what the fall is a fraction of, the
    loss's value (relative), or the spread of the final loss over the variant's seeds (``spread``: a loss near its
    floor keeps falling by large fractions of a tiny value while moving less than the seeds differ)."""

    model_config = ConfigDict(extra="forbid")

    window: float = Field(0.2, gt=0, lt=1, description="the last fraction of training steps looked at")
    fraction: float = Field(0.05, gt=0, description="the fall, as a fraction of `against`, above which it still moves")
    against: Literal["value", "spread"] = Field("value", description="the loss's value, or its seeds' spread")


class Warn(BaseModel):
    """When the report warns a reader that a number could mislead (dashboards/caveats.py, docs/statistics.md)."""

    model_config = ConfigDict(extra="forbid")

    chance_fraction: float = Field(0.9, gt=0, lt=1, description="near chance: at or above this fraction of ln C")
    converged_window: float = Field(0.2, gt=0, lt=1, description="the last fraction of steps the check looks at")
    converged_fraction: float = Field(0.05, gt=0, description="relative fall of val/loss over that window")
    param_ratio: float = Field(1.5, gt=1, description="parameter counts of compared variants")
    min_seeds: int = Field(5, ge=2, strict=True, description="intervals from fewer seeds are rough")
