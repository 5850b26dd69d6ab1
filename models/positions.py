"""Position information: added to the embeddings, rotated into q/k, or added to the attention scores.

Notation: B batch, T sequence length, C model width (d_model), H heads, D head dim.

- ``sinusoidal`` (Vaswani et al. 2017, section 3.5): PE[p, 2i] = sin(p / 10000^(2i/C)),
  PE[p, 2i+1] = cos(p / 10000^(2i/C)), interleaved, added to the embeddings; any length.
- ``learned``: a table of ``max_len`` vectors added to the embeddings; longer inputs are refused.
- ``none``: no position information (the model is permutation-equivariant apart from masks).
- ``rotary`` (Su et al. 2021): q and k rotated by position-dependent angles inside attention
  (half-split convention of GPT-NeoX); any length.
- ``alibi`` (Press et al. 2022): a per-head linear penalty -m_h * |i - j| on the attention scores.
"""

from __future__ import annotations

import math

import torch
from torch import nn


class PositionError(ValueError):
    """An input that the position scheme cannot represent."""


def sinusoid_table(length: int, dim: int, start: int = 0, device=None, dtype=torch.float32) -> torch.Tensor:
    """(length, dim) table of Vaswani's sinusoids for positions start .. start+length-1."""
    pos = torch.arange(start, start + length, device=device, dtype=torch.float64)[:, None]
    i = torch.arange(0, dim, 2, device=device, dtype=torch.float64)
    angle = pos / torch.pow(10000.0, i / dim)  # (T, ceil(C/2))
    table = torch.zeros(length, dim, device=device, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle[:, : dim // 2])
    return table.to(dtype)


class AbsolutePositions(nn.Module):
    """Adds nothing (``none``, ``rotary``, ``alibi``): the embeddings pass through unchanged."""

    def forward(self, x: torch.Tensor, start: int = 0) -> torch.Tensor:
        return x


class SinusoidalPositions(AbsolutePositions):
    def __init__(self, d_model: int, max_len: int) -> None:
        super().__init__()
        self.d_model = d_model
        self.register_buffer("table", sinusoid_table(max_len, d_model), persistent=False)

    def forward(self, x: torch.Tensor, start: int = 0) -> torch.Tensor:  # x (B, T, C)
        end = start + x.shape[1]
        if end <= self.table.shape[0]:
            pe = self.table[start:end]
        else:  # beyond the cached table: the closed form extrapolates to any position
            pe = sinusoid_table(x.shape[1], self.d_model, start, device=x.device)
        return x + pe.to(x.dtype)


class LearnedPositions(AbsolutePositions):
    def __init__(self, d_model: int, max_len: int) -> None:
        super().__init__()
        self.max_len = max_len
        self.table = nn.Embedding(max_len, d_model)
        nn.init.normal_(self.table.weight, std=0.02)

    def forward(self, x: torch.Tensor, start: int = 0) -> torch.Tensor:
        end = start + x.shape[1]
        if end > self.max_len:
            raise PositionError(
                f"sequence reaches position {end - 1}, beyond the learned position table of max_len={self.max_len} "
                "(positions='learned'); raise model.max_len, shorten the input, or use positions "
                "sinusoidal, rotary, alibi or none, which extrapolate"
            )
        return x + self.table.weight[start:end].to(x.dtype)


POSITIONS = {
    "sinusoidal": SinusoidalPositions,
    "learned": LearnedPositions,
    "none": lambda d_model, max_len: AbsolutePositions(),
    "rotary": lambda d_model, max_len: AbsolutePositions(),
    "alibi": lambda d_model, max_len: AbsolutePositions(),
}


class Rotary(nn.Module):
    """Rotary position embedding of q and k, half-split convention: x -> x*cos + rotate_half(x)*sin."""

    def __init__(self, head_dim: int, base: float = 10000.0, cached: int = 2048) -> None:
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        cos, sin = self._angles(0, cached)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def _angles(self, start: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        pos = torch.arange(start, start + length, dtype=torch.float64, device=self.inv_freq.device)
        angle = torch.outer(pos, self.inv_freq)  # (T, D/2)
        angle = torch.cat([angle, angle], dim=-1)  # (T, D)
        return angle.cos().float(), angle.sin().float()

    def forward(self, x: torch.Tensor, start: int = 0) -> torch.Tensor:  # x (B, H, T, D)
        T = x.shape[-2]
        if start + T <= self.cos.shape[0]:
            cos, sin = self.cos[start : start + T], self.sin[start : start + T]
        else:
            cos, sin = self._angles(start, T)
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """Press et al.'s head slopes: a geometric sequence starting at 2^(-8/n); interleaved for non powers of 2."""

    def power_of_two(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n_heads).is_integer():
        slopes = power_of_two(n_heads)
    else:
        closest = 2 ** math.floor(math.log2(n_heads))
        slopes = power_of_two(closest) + alibi_slopes(2 * closest).tolist()[0::2][: n_heads - closest]
    return torch.tensor(slopes, dtype=torch.float32)
