"""A seed plan: seeds added in batches where a declared contrast is still open, stopped where it is decided
(docs/statistics.md, "Seed plans").

```yaml
seeds: {first: 8, batch: 2, max: 16, spending: pocock}
```

Every variant trains ``first`` seeds; after each batch (a *look*) every declared contrast is judged, and the next
batch adds ``batch`` seeds only to the variants of the contrasts still open, up to ``max``. The family-wise error
stays at ``alpha`` under that stopping: each contrast is tested by the group-sequential exact sign-flip test
(record/stats/sequential.py), whose boundaries spend alpha over the looks by an alpha-spending function of the
information t = seeds / max (Lan and DeMets 1983): ``pocock`` spends alpha ln(1 + (e - 1) t), much of it early;
``obrien_fleming`` 2 - 2 Phi(z_{1-alpha/2} / sqrt t), most of it late. The closed Holm test over the contrasts'
sequential tests keeps the family's error at alpha (Maurer and Bretz 2013).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from record.spec.common import Strict
from record.stats.plans import spend


class SeedPlan(Strict):
    first: int = Field(ge=2, description="seeds every variant trains before the first look")
    batch: int = Field(ge=1, description="seeds added, per look, to the variants of the contrasts still open")
    max: int = Field(ge=2, description="at most this many seeds per variant")
    spending: Literal["pocock", "obrien_fleming"] = "pocock"

    @model_validator(mode="after")
    def _ordered(self) -> SeedPlan:
        if self.max < self.first:
            raise ValueError(
                f"max={self.max} is below first={self.first}: a plan never trains fewer seeds than its first batch"
            )
        if self.max > self.first and self.batch > self.max - self.first:
            raise ValueError(
                f"batch={self.batch} is more than max - first = {self.max - self.first}: the plan could never add a "
                f"whole batch; use batch: {self.max - self.first} or less, or raise max to {self.first + self.batch}"
            )
        return self

    def looks(self) -> list[int]:
        """The seeds per variant at each look: first, first + batch, ..., max."""
        out = [self.first]
        while out[-1] < self.max:
            out.append(min(out[-1] + self.batch, self.max))
        return out

    def cumulative(self, alpha: float) -> list[float]:
        """The alpha spent by each look (the last is ``alpha``)."""
        return [self.spend(n / self.max, alpha) for n in self.looks()]

    def spend(self, t: float, alpha: float) -> float:
        """The alpha spent by information fraction ``t`` (seeds / max)."""
        return spend(self.spending, t, alpha)

    def as_dict(self) -> dict:
        return self.model_dump(mode="json")


__all__ = ["SeedPlan", "spend"]
