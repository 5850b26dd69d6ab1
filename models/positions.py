"""Position information: added to the embeddings, rotated into q/k, or added to the attention scores.

Notation: B batch, T sequence length, C model width (d_model), H heads, D head dim.

A scheme (registered in ``POSITIONS``) is a ``Positions`` module with two slots:
- the module itself, applied to the (scaled) token embeddings: ``forward(x, start, ids) -> x + PE``;
- ``in_attention(cfg, causal)``: a module given to every self-attention layer (``AttentionPositions``),
  which may rotate q and k (``rotate``) and add a bias to the scores (``bias``), or None.

Positions are columns ``start .. start + T - 1`` unless ``ids`` (B, T) gives each token's position (left
padded prompts). Attention-level schemes are relative: they depend on the distance between columns,
which equals the distance between positions of two real tokens of a row, so they use columns.

- ``sinusoidal`` (Vaswani et al. 2017, section 3.5): PE[p, 2i] = sin(p / 10000^(2i/C)),
  PE[p, 2i+1] = cos(p / 10000^(2i/C)), interleaved, added to the embeddings; any length.
- ``learned``: a table of ``max_len`` vectors added to the embeddings; longer inputs are refused. It starts
  on the scale of the token embeddings (``position_init_std``) and is stored like them (times sqrt(d) when
  used), so that Adam's steps move both by the same amount.
- ``none``: no position information (the model is permutation-equivariant apart from masks).
- ``rotary`` (Su et al. 2021): q and k rotated by position-dependent angles inside attention
  (half-split convention of GPT-NeoX); any length.
- ``alibi`` (Press et al. 2022): a per-head linear penalty on the attention scores. Causal: -m_h (i - j),
  exactly Press et al. Bidirectional: past keys -m_h (i - j), future keys -m_{H-1-h} (j - i), so that every
  head (but the middle one of an odd count) tells past from future; docs/components.md explains why.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from models.registry import POSITIONS
from models.traits import ALiBiTraits, LearnedTraits, PositionsTraits, RotaryTraits, SinusoidalTraits


class PositionError(ValueError):
    """An input that the position scheme cannot represent."""


def sinusoid_table(length: int, dim: int, start: int = 0, device=None, dtype=torch.float32) -> torch.Tensor:
    """(length, dim) table of Vaswani's sinusoids for positions start .. start+length-1."""
    pos = torch.arange(start, start + length, device=device, dtype=torch.float64)[:, None]
    return sinusoids(pos, dim).to(dtype)


def sinusoids(pos: torch.Tensor, dim: int) -> torch.Tensor:
    """Vaswani's sinusoids (..., dim) for float64 positions (..., 1)."""
    i = torch.arange(0, dim, 2, device=pos.device, dtype=torch.float64)
    angle = pos / torch.pow(10000.0, i / dim)  # (..., ceil(C/2))
    table = torch.zeros(*pos.shape[:-1], dim, device=pos.device, dtype=torch.float64)
    table[..., 0::2] = torch.sin(angle)
    table[..., 1::2] = torch.cos(angle[..., : dim // 2])
    return table


class AttentionPositions(nn.Module):
    """What a position scheme does inside self-attention; the base does nothing.

    ``rotate(q, k, start, ids)`` transforms q and k (B, H, T, D) of the tokens at columns start.. (or at
    positions ``ids`` (B, T)); ``bias(dist)`` gives the (H, ...) float bias for signed distances
    ``dist = query column - key column``, or None. ``has_bias`` says whether ``bias`` returns anything.
    """

    has_bias = False

    def rotate(self, q, k, start: int = 0, ids: torch.Tensor | None = None):
        return q, k

    def bias(self, dist: torch.Tensor) -> torch.Tensor | None:
        return None


class Positions(PositionsTraits, nn.Module):
    """A position scheme. As a module it adds absolute positions to the embeddings (the base adds none).

    Class attributes: ``needs_dot_product`` (the scheme acts through q.k, e.g. rotary),
    ``takes_init_std`` (``position_init_std`` applies). ``check(cfg)`` refuses what the scheme cannot do.
    The built-in schemes inherit these from ``models.traits``, which the config reads without torch.
    """

    def __init__(self, cfg) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor, start: int = 0, ids: torch.Tensor | None = None) -> torch.Tensor:
        return x

    @classmethod
    def in_attention(cls, cfg, causal: bool) -> AttentionPositions | None:
        return None


@POSITIONS.register("sinusoidal")
class SinusoidalPositions(SinusoidalTraits, Positions):
    def __init__(self, cfg) -> None:
        super().__init__(cfg)
        self.d_model = cfg.d_model
        self.register_buffer("table", sinusoid_table(cfg.max_len, cfg.d_model), persistent=False)

    def forward(self, x: torch.Tensor, start: int = 0, ids: torch.Tensor | None = None) -> torch.Tensor:  # x (B, T, C)
        end = start + x.shape[1]  # positions never exceed columns: ids <= column
        if ids is not None:
            if end <= self.table.shape[0]:
                pe = self.table[ids]  # (B, T, C)
            else:
                pe = sinusoids(ids.to(torch.float64)[..., None], self.d_model)
        elif end <= self.table.shape[0]:
            pe = self.table[start:end]
        else:  # beyond the cached table: the closed form extrapolates to any position
            pe = sinusoid_table(x.shape[1], self.d_model, start, device=x.device)
        return x + pe.to(x.dtype)


@POSITIONS.register("learned")
class LearnedPositions(LearnedTraits, Positions):
    """A table of ``max_len`` vectors, stored and scaled like the token embeddings: the parameter starts at
    std ``position_init_std / scale`` and is multiplied by ``scale`` (sqrt(d) with ``scale_embeddings``) when
    added. Adam moves every stored element by about the learning rate whatever its scale, so a table stored at
    the scale it is added at moved sqrt(d) times less, in what enters the stack, than the token embeddings."""

    def __init__(self, cfg) -> None:
        super().__init__(cfg)
        self.max_len = cfg.max_len
        self.scale = math.sqrt(cfg.d_model) if cfg.scale_embeddings else 1.0  # Transformer.emb_scale
        self.table = nn.Embedding(cfg.max_len, cfg.d_model)
        nn.init.normal_(self.table.weight, std=self.init_std(cfg) / self.scale)

    @staticmethod
    def init_std(cfg) -> float:
        """The std of what the table adds at the start: ``position_init_std``, by default the RMS of the token
        embeddings as they enter the stack (initialised N(0, d^-0.5), times sqrt(d) when scale_embeddings)."""
        if cfg.position_init_std is not None:
            return float(cfg.position_init_std)
        return 1.0 if cfg.scale_embeddings else cfg.d_model**-0.5

    def forward(self, x: torch.Tensor, start: int = 0, ids: torch.Tensor | None = None) -> torch.Tensor:
        end = start + x.shape[1]
        if end > self.max_len and (ids is None or int(ids.max()) >= self.max_len):
            reached = end - 1 if ids is None else int(ids.max())
            raise PositionError(
                f"sequence reaches position {reached}, beyond the learned position table of max_len={self.max_len} "
                "(positions='learned'); raise model.max_len, shorten the input, or use positions "
                "sinusoidal, rotary, alibi or none, which extrapolate"
            )
        pe = self.table(ids) if ids is not None else self.table.weight[start:end]  # (B, T, C) or (T, C)
        return x + (pe * self.scale).to(x.dtype)


@POSITIONS.register("none")
class NoPositions(Positions):
    """No position information."""


class Rotary(AttentionPositions):
    """Rotary position embedding of q and k, half-split convention: x -> x*cos + rotate_half(x)*sin."""

    def __init__(self, head_dim: int, base: float = 10000.0, cached: int = 2048) -> None:
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        cos, sin = self._angles(torch.arange(cached, dtype=torch.float64))
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def _angles(self, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        angle = pos.to(torch.float64)[..., None] * self.inv_freq  # (..., D/2)
        angle = torch.cat([angle, angle], dim=-1)  # (..., D)
        return angle.cos().float(), angle.sin().float()

    def forward(self, x: torch.Tensor, start: int = 0, ids: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, H, T, D) at columns start.. or at positions ids (B, T)."""
        T = x.shape[-2]
        if ids is not None:
            if start + T <= self.cos.shape[0]:  # ids never exceed the column
                cos, sin = self.cos[ids], self.sin[ids]  # (B, T, D)
            else:
                cos, sin = self._angles(ids)
            cos, sin = cos[:, None], sin[:, None]  # (B, 1, T, D)
        elif start + T <= self.cos.shape[0]:
            cos, sin = self.cos[start : start + T], self.sin[start : start + T]
        else:
            cos, sin = self._angles(torch.arange(start, start + T, device=x.device))
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin

    def rotate(self, q, k, start: int = 0, ids: torch.Tensor | None = None):
        return self(q, start, ids), self(k, start, ids)


@POSITIONS.register("rotary")
class RotaryPositions(RotaryTraits, Positions):
    @classmethod
    def in_attention(cls, cfg, causal: bool) -> AttentionPositions:
        return Rotary(cfg.head_size, cfg.rotary_base)


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


class ALiBi(AttentionPositions):
    """Linear biases: -past_h * (i - j) for keys j <= i, -future_h * (j - i) for keys j > i.

    Causal (Press et al. 2022): past = Press's slopes, future keys are never seen. Bidirectional: future
    slopes are the same set in reversed head order, so head h looks far one way and near the other.
    """

    has_bias = True

    def __init__(self, n_heads: int, causal: bool) -> None:
        super().__init__()
        past = alibi_slopes(n_heads)
        self.register_buffer("past", past, persistent=False)
        self.register_buffer("future", past if causal else past.flip(0), persistent=False)

    def bias(self, dist: torch.Tensor) -> torch.Tensor:
        """(H, ...) for signed distances dist (...) = query - key."""
        shape = (-1,) + (1,) * dist.dim()
        d = dist.to(self.past.dtype)
        return torch.where(dist >= 0, -self.past.view(shape) * d, self.future.view(shape) * d)

    def slopes(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(past, future): the bias is linear in the distance, -past_h * d for d >= 0 and future_h * d below
        (what ``bias`` computes; FlexAttention evaluates it in the kernel instead of reading a table)."""
        return self.past, self.future


@POSITIONS.register("alibi")
class ALiBiPositions(ALiBiTraits, Positions):
    @classmethod
    def in_attention(cls, cfg, causal: bool) -> AttentionPositions:
        return ALiBi(cfg.n_heads, causal)
