"""What a search's space allows, judged before the search starts: the values of a discrete parameter that make
no valid run whatever the others are (``refused_values``, said as a warning). ``spec`` is a
``record.spec.search.SearchSpec``, ``p`` its ``Param`` (not imported: search.py imports this module)."""

from __future__ import annotations

import itertools
import math
from typing import Any

from record.spec.common import Origin
from record.spec.errors import SpecError
from record.spec.run import resolve_run


def refused_values(spec: Any, most: int = 64, combinations: int = 512) -> list[str]:
    """The values of a discrete parameter (its choices, or an int range of at most ``most`` values) that make no
    valid run with any combination of the others' values (their choices, every value of an int range of at most
    16, the ends of the rest): a trial that draws one is refused, and counts towards n_trials (``n_heads`` from 1 to
    8 with d_model 64: 3, 5, 6 and 7). Not judged: a parameter whose others have more than ``combinations``
    combinations, and a value whose refusal names another parameter tried only at its ends (it may fit between)."""
    said = []
    for p in spec.space:
        values = _values(p, most)
        others = [q for q in spec.space if q is not p]
        every = [_values(q, 16) for q in others]
        tried = [v or [q.end(0), q.end(-1)] for q, v in zip(others, every)]
        if values is None or math.prod(len(t) for t in tried) > combinations:
            continue
        at_ends = [q.key.rsplit(".", 1)[-1] for q, v in zip(others, every) if v is None]
        refused: dict[Any, str] = {}
        for value in values:
            reasons = []
            for pick in itertools.product(*tried):
                chosen = dict(zip((q.key for q in others), pick), **{p.key: value})
                params = spec.assign(lambda q, chosen=chosen: chosen[q.key])
                try:
                    resolve_run({**spec.run_data(params), "name": spec.name}, Origin(None))
                    break
                except SpecError as err:
                    reasons.append(err.message)
            else:
                if not any(f"{leaf}=" in r for r in reasons for leaf in at_ends):
                    refused[value] = reasons[0]
        if refused:
            kept = [v for v in values if v not in refused]
            said.append(
                f"space.{p.key}: {', '.join(map(str, refused))} {'makes' if len(refused) == 1 else 'make'} no valid "
                f"run ({next(iter(refused.values()))}); a trial that draws one is refused and counts towards n_trials"
                + (f" (type: categorical with choices {kept} leaves them out)" if kept and p.type == "int" else "")
            )
    return said


def _values(p: Any, most: int) -> list[Any] | None:
    """Every value a discrete parameter can take (None for a float, or for an int range of more than ``most``)."""
    if p.type == "categorical":
        return list(p.choices)
    if p.type == "float" or (p.high - p.low) / (p.step or 1) + 1 > most:
        return None
    return list(range(int(p.low), int(p.high) + 1, int(p.step or 1)))
