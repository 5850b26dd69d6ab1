"""How a stack's mean window or top dilation spreads over its layers (``window_schedule``, ``dilation_schedule``).

A module of its own because both ``models.config`` (resolving each layer's geometry) and ``models.spelling``
(finding the simplest spelling of a geometry, which ``models.config`` asks for) read it. Pure Python.
"""

from __future__ import annotations

import math


def _round(x: float) -> int:
    return int(math.floor(x + 0.5))


def schedule(value: int, n: int, kind: str, start: int | None = None) -> list[int]:
    """``n`` values for layers bottom to top.

    With ``start`` (dilations): ``fixed`` is ``value`` everywhere; ``increasing`` goes linearly from
    ``start`` at the bottom to ``value`` at the top (a single layer gets ``value``); ``decreasing`` the
    reverse. Without ``start`` (windows): ``increasing`` is value * 2 (j + 1) / (n + 1) for layer j
    (Longformer's small windows below, large above), in whole windows of at least 1 that sum to n * value, so
    the mean is exactly ``value`` (compute-matched to ``fixed``: rounding each layer alone gave [1, 1, 2] for 1 and
    [2, 3, 5] for 3 over three layers): the largest remainders round up, upper layers first on ties.
    """
    if kind == "fixed" or n == 1:
        out = [value] * n
    elif start is not None:
        out = [_round(start + (value - start) * j / (n - 1)) for j in range(n)]
    else:
        ideal = [value * 2 * (j + 1) / (n + 1) for j in range(n)]
        out = [max(1, math.floor(x)) for x in ideal]
        by_remainder = sorted(range(n), key=lambda j: (ideal[j] - out[j], j), reverse=True)
        for j in by_remainder[: max(0, n * value - sum(out))]:
            out[j] += 1
    return out[::-1] if kind == "decreasing" else out
