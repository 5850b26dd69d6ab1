"""The group-sequential exact sign-flip test: paired differences looked at after each batch of seeds, each look's
boundary set so that the chance of crossing by look k under no difference is exactly the alpha spent by then.

Under no difference (the differences symmetric about 0), the signs of the differences are independent fair coins
given their absolute values. So, given the absolute values seen by look k, every one of the 2^n sign patterns of the
first n seeds is equally likely, and the boundary of look k can be chosen among them: the most extreme patterns not
already past an earlier boundary, as many as the alpha spent by look k allows (Mehta, Patel, Senchaudhuri and
Tsiatis 1994, "Exact permutational tests for group sequential clinical trials", Biometrics 50: 1042-1053). The
chance of ever crossing is then at most alpha whatever the distribution of the differences, and, unlike testing
each look at its own slice of alpha (the union bound), the looks' correlation is used: crossing an early boundary
spends alpha that later looks would have spent on the same patterns. No maintained Python package does this
(statsmodels and scipy have no group-sequential tests; R's gsDesign and ldbounds work on the normal scale).

Patterns are enumerated up to EXACT_MAX_N seeds, sampled (MC_RESAMPLES, a fixed seed) beyond, as the fixed test.
With discrete boundaries, crossing at one alpha does not always mean crossing at every larger one (an early look
given more alpha can spend it on patterns a later look would not have taken), so a family is decided by the closed
test itself (``closed``), not by Holm's shortcut on p-values.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

from record.stats.family import EXACT_MAX_N, MC_RESAMPLES

ROWS_PER_CHUNK = 64  # bounds memory: rows x 2^16 patterns x 8 bytes


@functools.cache
def _patterns(n: int, symmetric: bool) -> np.ndarray:
    """(n, R) signs, equally likely under no difference: every pattern up to EXACT_MAX_N seeds (with the first sign
    fixed when ``symmetric``: a pattern and its negation give the same |sum|), MC_RESAMPLES drawn beyond."""
    if n > EXACT_MAX_N:
        return np.random.default_rng(0).choice([-1.0, 1.0], size=(n, MC_RESAMPLES))
    free = n - 1 if symmetric else n
    codes = np.arange(2**free)[None, :] >> np.arange(free)[:, None]
    signs = np.where(codes & 1, -1.0, 1.0)
    return np.vstack([np.ones((1, signs.shape[1])), signs]) if symmetric else signs


def crossed(d: np.ndarray, sizes: Sequence[int], cumulative: Sequence[Sequence[float]], side: int = 0) -> np.ndarray:
    """Whether each row of ``d`` (rows x n paired differences, seeds in order) crossed a boundary at one of its
    looks, after ``sizes[k]`` seeds, for each level: ``cumulative[level][k]`` the alpha spent by look k. ``side``
    0: two-sided (|sum|); 1: large sums (mean > 0); -1: small sums. Returns levels x rows booleans."""
    d = np.atleast_2d(np.asarray(d, dtype=float))
    chunks = [_crossed(d[i : i + ROWS_PER_CHUNK], sizes, cumulative, side) for i in range(0, len(d), ROWS_PER_CHUNK)]
    return np.concatenate(chunks, axis=1) if chunks else np.zeros((len(cumulative), 0), dtype=bool)


def _crossed(d: np.ndarray, sizes: Sequence[int], cumulative: Sequence[Sequence[float]], side: int) -> np.ndarray:
    flips = _patterns(sizes[-1], side == 0)
    total = flips.shape[1]
    tol = 1e-9 * np.abs(d[:, : sizes[-1]]).sum(axis=1, keepdims=True)
    past = np.zeros((len(cumulative), len(d), total), dtype=bool)  # per level: patterns past an earlier boundary
    out = np.zeros((len(cumulative), len(d)), dtype=bool)
    sums, observed, n0 = np.zeros((len(d), total)), np.zeros((len(d), 1)), 0
    most = max(max(c) for c in cumulative)
    for k, n in enumerate(sizes):
        sums += np.abs(d[:, n0:n]) @ flips[n0:n]  # running sums: each look adds its new seeds
        observed += d[:, n0:n].sum(axis=1, keepdims=True)
        n0 = n
        stat, seen = (np.abs(sums), np.abs(observed)) if side == 0 else (side * sums, side * observed)
        top = _Top(stat, most)
        for level, spent in enumerate(cumulative):
            gone = past[level].sum(axis=1)
            allowed = np.floor(spent[k] * total + 1e-9).astype(int) - gone  # patterns this look may add
            bound = top.boundary(past[level], allowed, total - gone) + tol
            out[level] |= seen[:, 0] > bound[:, 0]
            past[level] |= stat > bound
    return out


class _Top:
    """The largest values of each row, sorted, enough for any boundary up to alpha ``most``: the boundary's
    pattern is among the top most x R, since every pattern past an earlier boundary was spent from the same alpha."""

    def __init__(self, stat: np.ndarray, most: float):
        count = min(stat.shape[1], int(most * stat.shape[1]) + 2)
        idx = np.argpartition(-stat, count - 1, axis=1)[:, :count] if count < stat.shape[1] else None
        idx = np.broadcast_to(np.arange(stat.shape[1]), stat.shape) if idx is None else idx
        order = np.argsort(-np.take_along_axis(stat, idx, axis=1), axis=1, kind="stable")
        self.idx = np.take_along_axis(idx, order, axis=1)
        self.values = np.take_along_axis(stat, self.idx, axis=1)

    def boundary(self, past: np.ndarray, allowed: np.ndarray, alive: np.ndarray) -> np.ndarray:
        """Per row, the (allowed + 1)-th largest value not ``past``: only patterns strictly above it cross, so tied
        patterns never split and at most ``allowed`` cross (all when ``allowed`` reaches every alive one)."""
        rank = np.cumsum(~np.take_along_axis(past, self.idx, axis=1), axis=1)  # alive patterns so far, in order
        k = np.clip(allowed, 0, None) + 1
        where = np.minimum((rank < k[:, None]).sum(axis=1), self.values.shape[1] - 1)  # first reaching rank k
        bound = np.take_along_axis(self.values, where[:, None], axis=1)
        return np.where((allowed >= alive)[:, None], -np.inf, np.where(allowed[:, None] < 0, np.inf, bound))


def closed(at: Sequence[np.ndarray]) -> np.ndarray:
    """The closed test of m hypotheses whose intersections are Bonferroni tests (Holm's procedure, Marcus, Peritz
    and Gabriel 1976), from each hypothesis' sequential test at alpha / s: ``at[s - 1]`` (rows x m) says which
    crossed a boundary at that level. An intersection of s hypotheses is rejected when one of them crossed at
    alpha / s, an error of at most alpha by the union bound; H_i is rejected when every intersection holding it
    is: for each s, H_i crossed at alpha / s, or at least m - s + 1 others did (no s - 1 others escape them).
    Holm's shortcut on p-values would assume that a test crossing at one level crosses at every higher one, which
    discrete sequential boundaries do not always give; this needs no such assumption."""
    steps = np.stack([np.atleast_2d(a) for a in at])  # (m, rows, m)
    m = steps.shape[0]
    others = steps.sum(axis=2, keepdims=True) - steps  # per level and row: how many others crossed
    need = (m - np.arange(1, m + 1) + 1)[:, None, None]
    return (steps | (others >= need)).all(axis=0)


__all__ = ["closed", "crossed"]
