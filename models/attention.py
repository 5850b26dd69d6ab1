"""Multi-head attention = a score function x a pattern.

Notation: B batch, H heads, T query length, S key length, D head dim, C model width,
W window, d dilation, N number of tiles, b tile size (b >= W), K keys per tile (2b causal, 3b not).

Score functions (``SCORES``):
  dot           q.k / sqrt(D)                        (Vaswani et al. 2017)
  dot_unscaled  q.k                                  (Vaswani section 3.2.1's unscaled variant)
  general       (q W_h).k / sqrt(D), W_h learned     (Luong et al. 2015, bilinear; W starts at identity)
  cosine        tau_h cos(q, k), tau_h learned       (Henry et al. 2020; Swin v2)
  additive      v_h . tanh(q + k)                    (Bahdanau et al. 2015; q, k are W_q x, W_k x)
The dot-like scores reduce to torch's scaled_dot_product_attention on transformed q and k. Additive
scores go through ``additive_scores``, a chunked autograd function whose memory is bounded by
``chunk_elements`` in forward and backward.

Patterns (``PATTERNS``), composed with the causal rule and key padding:
  full     every key (subject to causality)
  local    keys at distance |i - j| <= W (only the past when causal)
  dilated  keys at distance |i - j| <= W*d that are multiples of d
Local attention cuts the queries into tiles of b >= W positions; a tile attends to its own tile and its
neighbours (the previous one only when causal) and a small per-tile mask built from absolute positions
enforces the exact window, causality, padding and the sequence end. Dilated attention splits the
sequence into d interleaved residue classes and runs local attention on each. No (T, S) tensor is ever
built for these patterns: time and memory are O(T * W).

A query whose every key is masked (a padding query whose window holds only padding) attends uniformly
instead of producing NaN; its output is meaningless and must be ignored by the caller, but it stays finite
so that gradients do not turn into NaN.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from models.positions import Rotary, alibi_slopes

# ---------------------------------------------------------------------------------------------------
# Score functions


class DotScore(nn.Module):
    """q.k, scaled by 1/sqrt(D) unless ``scaled`` is false.

    Every score has ``prepare(q, k) -> (q, k)``, applied by the attention module before rotary
    positions (so that rotated scores stay relative), and then either ``dot_like`` (scores are
    ``scale * q.k`` of the prepared q and k) or ``scores(q, k)``.
    """

    dot_like = True

    def __init__(self, n_heads: int, head_dim: int, scaled: bool = True) -> None:
        super().__init__()
        self.scale = 1.0 / math.sqrt(head_dim) if scaled else 1.0

    def prepare(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return q, k


class GeneralScore(DotScore):
    """Bilinear q^T W_h k per head, scaled like dot; W_h starts at the identity (so it starts as dot)."""

    def __init__(self, n_heads: int, head_dim: int) -> None:
        super().__init__(n_heads, head_dim, scaled=True)
        self.weight = nn.Parameter(torch.eye(head_dim).repeat(n_heads, 1, 1))  # (H, D, D)

    def prepare(self, q, k):  # q (B, H, T, D) @ W (H, D, D)
        return q @ self.weight.to(q.dtype), k


class CosineScore(DotScore):
    """tau_h * cos(q, k) with a learned per-head temperature tau_h = exp(log_tau_h) <= 100, starting at 10."""

    def __init__(self, n_heads: int, head_dim: int) -> None:
        super().__init__(n_heads, head_dim)
        self.log_tau = nn.Parameter(torch.full((n_heads,), math.log(10.0)))
        self.scale = 1.0

    def prepare(self, q, k):  # (B, H, T, D)
        tau = self.log_tau.clamp(max=math.log(100.0)).exp().to(q.dtype).view(1, -1, 1, 1)
        return F.normalize(q, dim=-1) * tau, F.normalize(k, dim=-1)


class AdditiveScore(nn.Module):
    """Bahdanau's v_h . tanh(q + k), computed by ``additive_scores`` in bounded memory."""

    dot_like = False

    def __init__(self, n_heads: int, head_dim: int, chunk_elements: int = 1 << 18) -> None:
        super().__init__()
        self.v = nn.Parameter(torch.randn(n_heads, head_dim) / math.sqrt(head_dim))  # (H, D)
        self.chunk_elements = chunk_elements

    def prepare(self, q, k):
        return q, k

    def scores(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:  # q (B,H,...,T,D) k (B,H,...,S,D)
        return additive_scores(q, k, self.v, self.chunk_elements)


SCORES = {
    "dot": lambda h, d, chunk: DotScore(h, d, scaled=True),
    "dot_unscaled": lambda h, d, chunk: DotScore(h, d, scaled=False),
    "general": lambda h, d, chunk: GeneralScore(h, d),
    "cosine": lambda h, d, chunk: CosineScore(h, d),
    "additive": lambda h, d, chunk: AdditiveScore(h, d, chunk),
}


class _AdditiveScores(torch.autograd.Function):
    """scores[g, t, s] = sum_e v[g, e] * tanh(q[g, t, e] + k[g, s, e]).

    Inputs are flattened to q (G, T, E), k (G, S, E), v (G, E). The (G, T, S, E) intermediate is never
    held whole: forward and backward walk over chunks of at most ``budget`` elements and recompute tanh.
    """

    @staticmethod
    def _chunks(G: int, T: int, S: int, E: int, budget: int):
        per_query = max(1, S * E)
        rows = max(1, budget // per_query)
        t_step = min(T, rows)
        g_step = max(1, rows // T) if t_step == T else 1
        for g0 in range(0, G, g_step):
            for t0 in range(0, T, t_step):
                yield slice(g0, g0 + g_step), slice(t0, t0 + t_step)

    @staticmethod
    def forward(ctx, q, k, v, budget):
        G, T, E = q.shape
        S = k.shape[1]
        out = q.new_empty(G, T, S)
        for gs, ts in _AdditiveScores._chunks(G, T, S, E, budget):
            a = torch.tanh(q[gs, ts, None, :] + k[gs, None, :, :])  # (g, t, S, E)
            out[gs, ts] = (a @ v[gs, None, :, None]).squeeze(-1)
        ctx.save_for_backward(q, k, v)
        ctx.budget = budget
        return out

    @staticmethod
    def backward(ctx, grad):  # grad (G, T, S)
        q, k, v = ctx.saved_tensors
        G, T, E = q.shape
        S = k.shape[1]
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        for gs, ts in _AdditiveScores._chunks(G, T, S, E, ctx.budget):
            a = torch.tanh(q[gs, ts, None, :] + k[gs, None, :, :])  # (g, t, S, E)
            g = grad[gs, ts, :, None]  # (g, t, S, 1)
            dv[gs] += (g * a).sum(dim=(1, 2))
            pre = a.mul_(a).neg_().add_(1.0).mul_(g).mul_(v[gs, None, None, :])  # dL/d(q + k)
            dq[gs, ts] += pre.sum(dim=2)
            dk[gs] += pre.sum(dim=1)
        return dq, dk, dv, None


def additive_scores(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, budget: int = 1 << 18) -> torch.Tensor:
    """v_h . tanh(q_t + k_s) for q (B, H, ..., T, E), k (B, H, ..., S, E), v (H, E) -> (B, H, ..., T, S)."""
    lead = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    T, S, E = q.shape[-2], k.shape[-2], q.shape[-1]
    qf = q.expand(*lead, T, E).reshape(-1, T, E)
    kf = k.expand(*lead, S, E).reshape(-1, S, E)
    vf = v.view((1, v.shape[0]) + (1,) * (len(lead) - 2) + (E,)).expand(*lead, E).reshape(-1, E)
    out = _AdditiveScores.apply(qf, kf, vf.to(q.dtype), budget)
    return out.view(*lead, T, S)


# ---------------------------------------------------------------------------------------------------
# The kernel: scores + mask -> probabilities -> weighted values


def _unstarve(allowed: torch.Tensor) -> torch.Tensor:
    """Rows with no allowed key attend to every key instead (finite, ignored by callers)."""
    return allowed | ~allowed.any(dim=-1, keepdim=True)


def attend(q, k, v, score: nn.Module, mask=None, bias=None, causal: bool = False, dropout_p: float = 0.0):
    """Attention of prepared q (..., T, D) over k, v (..., S, D).

    mask: bool, True where a key may be seen, broadcastable to (..., T, S); bias: float, added to the
    scores (ALiBi); causal: the square causal rule (only without mask and bias, the fast path).
    """
    if mask is not None and bias is not None:
        bias = bias.masked_fill(~mask, float("-inf"))
        mask = None
    extra = bias if bias is not None else mask
    if score.dot_like:
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=extra, dropout_p=dropout_p, is_causal=causal and extra is None, scale=score.scale
        )
    s = score.scores(q, k)  # (..., T, S)
    if causal and extra is None:
        T, S = s.shape[-2:]
        extra = torch.ones(T, S, dtype=torch.bool, device=s.device).tril(S - T)
    if extra is not None:
        s = s + extra if extra.dtype != torch.bool else s.masked_fill(~extra, float("-inf"))
    p = torch.softmax(s, dim=-1)
    if dropout_p > 0.0:
        p = F.dropout(p, dropout_p)
    return p @ v


def _alibi_bias(slopes: torch.Tensor, dist: torch.Tensor) -> torch.Tensor:
    """-m_h * |dist| for slopes (H,) and integer distances (...) -> (H, ...)."""
    return -slopes.view((-1,) + (1,) * dist.dim()) * dist.abs().to(slopes.dtype)


# ---------------------------------------------------------------------------------------------------
# Patterns


def full_attention(q, k, v, score, *, causal=False, key_padding=None, slopes=None, dropout_p=0.0):
    """q (B, H, T, D), k/v (B, H, S, D); key_padding (B, S) True at padding; slopes (H,) for ALiBi."""
    T, S = q.shape[-2], k.shape[-2]
    if key_padding is None and slopes is None:
        return attend(q, k, v, score, causal=causal, dropout_p=dropout_p)
    mask = None
    if key_padding is not None:
        mask = ~key_padding[:, None, None, :]  # (B, 1, 1, S)
    if causal:
        tri = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(S - T)
        mask = tri if mask is None else mask & tri
    if key_padding is not None:
        mask = _unstarve(mask)  # (B, 1, 1 or T, S)
    bias = None
    if slopes is not None:
        qpos = torch.arange(S - T, S, device=q.device)
        kpos = torch.arange(S, device=q.device)
        bias = _alibi_bias(slopes.to(q.dtype), qpos[:, None] - kpos[None, :])  # (H, T, S)
    return attend(q, k, v, score, mask=mask, bias=bias, dropout_p=dropout_p)


def tile_size(window: int, length: int) -> int:
    """Queries per tile: about the window (at least 32, at most 128), never more than the sequence."""
    return min(max(min(window, 128), 32), length)


def local_attention(q, k, v, score, *, window, causal=False, key_padding=None, slopes=None, dropout_p=0.0, block=None):
    """Exact sliding-window self-attention in O(T * W): q, k, v (B, H, T, D), keys at |i - j| <= window.

    Tiles of b queries see the ceil(W / b) tiles before them (and after them unless causal) plus their own.
    Tiles go into the batch dimension, (B * N, H, b, D), the layout in which torch's fused CPU and GPU
    kernels accept a mask.
    """
    B, H, T, D = q.shape
    if window >= T - 1:  # the window covers the whole sequence: this is full attention
        return full_attention(
            q, k, v, score, causal=causal, key_padding=key_padding, slopes=slopes, dropout_p=dropout_p
        )
    b = block or tile_size(window, T)
    N = -(-T // b)
    back = -(-window // b)  # neighbouring tiles on each side that hold keys within the window
    ahead = 0 if causal else back
    span = back + 1 + ahead  # tiles of keys per tile of queries; K = span * b keys
    right = N * b - T + ahead * b

    def tiles(t):  # (B, H, T, D) -> (B * N, H, K, D): for each query tile, its neighbourhood of keys
        t = F.pad(t, (0, 0, back * b, right)).view(B, H, N + back + ahead, b, D).transpose(1, 2)
        return torch.cat([t[:, i : i + N] for i in range(span)], dim=3).view(B * N, H, span * b, D)

    qt = F.pad(q, (0, 0, 0, N * b - T)).view(B, H, N, b, D).transpose(1, 2).reshape(B * N, H, b, D)
    kt, vt = tiles(k), tiles(v)

    # The window rule is the same in every tile; only which keys exist (and padding) differ per tile.
    dev = q.device
    K = span * b
    offset = torch.arange(K, device=dev) - back * b  # key position relative to the tile's first query
    rel = torch.arange(b, device=dev)[:, None] - offset[None, :]  # (b, K) query - key distance
    allowed = rel.abs() <= window
    if causal:
        allowed &= rel >= 0
    kpos = torch.arange(0, N * b, b, device=dev)[:, None] + offset  # (N, K)
    allowed = allowed & ((kpos >= 0) & (kpos < T))[:, None, :]  # (N, b, K)
    if key_padding is not None:
        kp = F.pad(key_padding, (back * b, right), value=True).view(B, N + back + ahead, b)
        kp = torch.cat([kp[:, i : i + N] for i in range(span)], dim=2)  # (B, N, K)
        allowed = _unstarve(allowed & ~kp[:, :, None, :])  # (B, N, b, K)
    else:
        allowed[N - 1, T - (N - 1) * b :] = True  # queries past the end (discarded): keep them finite
        allowed = allowed.expand(B, N, b, K)
    allowed = allowed.reshape(B * N, 1, b, K)
    bias = _alibi_bias(slopes.to(q.dtype), rel) if slopes is not None else None  # (H, b, K)
    out = attend(qt, kt, vt, score, mask=allowed, bias=bias, dropout_p=dropout_p)  # (B * N, H, b, D)
    return out.view(B, N, H, b, D).transpose(1, 2).reshape(B, H, N * b, D)[:, :, :T]


def dilated_attention(q, k, v, score, *, window, dilation, causal=False, key_padding=None, slopes=None, dropout_p=0.0):
    """Keys at distance <= window*dilation that are multiples of dilation: local attention on each of the
    ``dilation`` interleaved residue classes, in O(T * W)."""
    B, H, T, D = q.shape
    d = dilation
    M = -(-T // d)
    extra = M * d - T
    if extra:
        q, k, v = (F.pad(t, (0, 0, 0, extra)) for t in (q, k, v))
        if key_padding is None:
            key_padding = torch.zeros(B, T, dtype=torch.bool, device=q.device)
        key_padding = F.pad(key_padding, (0, extra), value=True)

    def split(t):  # (B, H, M*d, D) -> (B*d, H, M, D): position m*d + r goes to class r, index m
        return t.view(B, H, M, d, D).permute(0, 3, 1, 2, 4).reshape(B * d, H, M, D)

    kp = None if key_padding is None else key_padding.view(B, M, d).transpose(1, 2).reshape(B * d, M)
    out = local_attention(
        split(q),
        split(k),
        split(v),
        score,
        window=window,
        causal=causal,
        key_padding=kp,
        slopes=None if slopes is None else slopes * d,
        dropout_p=dropout_p,
    )  # (B*d, H, M, D)
    out = out.view(B, d, H, M, D).permute(0, 2, 3, 1, 4).reshape(B, H, M * d, D)
    return out[:, :, :T]


def positions_mask(qpos, kpos, pattern: str, window: int | None, dilation: int, causal: bool) -> torch.Tensor:
    """(T, S) bool: which keys at absolute positions kpos a query at qpos sees (used by cached decoding)."""
    dist = qpos[:, None] - kpos[None, :]
    allowed = torch.ones_like(dist, dtype=torch.bool)
    if causal:
        allowed &= dist >= 0
    if pattern == "local":
        allowed &= dist.abs() <= window
    elif pattern == "dilated":
        allowed &= (dist.abs() <= window * dilation) & (dist % dilation == 0)
    return allowed


# ---------------------------------------------------------------------------------------------------
# The module


@dataclass
class KVCache:
    """Keys and values of one attention layer seen so far, with their absolute positions."""

    k: torch.Tensor | None = None  # (B, H, S, D)
    v: torch.Tensor | None = None
    pos: torch.Tensor | None = None  # (S,)
    static: bool = False  # cross-attention: computed once from the encoder memory

    def reorder(self, index: torch.Tensor) -> None:
        if self.k is not None:
            self.k, self.v = self.k.index_select(0, index), self.v.index_select(0, index)


class MultiHeadAttention(nn.Module):
    """Self- or cross-attention with a pluggable score function and pattern.

    ``pattern`` applies to self-attention; cross-attention is always full and position-free.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        head_dim: int,
        *,
        score: str = "dot",
        pattern: str = "full",
        window: int | None = None,
        dilation: int = 1,
        causal: bool = False,
        cross: bool = False,
        positions: str = "none",
        rotary_base: float = 10000.0,
        dropout: float = 0.0,
        bias: bool = True,
        chunk_elements: int = 1 << 18,
    ) -> None:
        super().__init__()
        self.n_heads, self.head_dim = n_heads, head_dim
        self.pattern, self.window, self.dilation = ("full", None, 1) if cross else (pattern, window, dilation)
        self.causal = causal and not cross
        self.cross = cross
        self.dropout = dropout
        inner = n_heads * head_dim
        if cross:
            self.q_proj = nn.Linear(d_model, inner, bias=bias)
            self.kv_proj = nn.Linear(d_model, 2 * inner, bias=bias)
        else:
            self.qkv_proj = nn.Linear(d_model, 3 * inner, bias=bias)
        self.out_proj = nn.Linear(inner, d_model, bias=bias)
        self.score = SCORES[score](n_heads, head_dim, chunk_elements)
        self.rotary = Rotary(head_dim, rotary_base) if positions == "rotary" and not cross else None
        if positions == "alibi" and not cross:
            self.register_buffer("slopes", alibi_slopes(n_heads), persistent=False)
        else:
            self.slopes = None
        self.head_gate: torch.Tensor | None = None  # (H,) set by Transformer.mask_heads

    def _heads(self, t: torch.Tensor, n: int) -> tuple[torch.Tensor, ...]:
        B, T, _ = t.shape
        return t.view(B, T, n, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)  # n x (B, H, T, D)

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor | None = None,
        *,
        key_padding: torch.Tensor | None = None,
        start: int = 0,
        cache: KVCache | None = None,
    ) -> torch.Tensor:
        """x (B, T, C); memory (B, S, C) for cross-attention; key_padding (B, S) True at padding keys;
        start: absolute position of x[:, 0]; cache: keys/values of earlier steps (updated in place)."""
        B, T, _ = x.shape
        if self.cross:
            (q,) = self._heads(self.q_proj(x), 1)
            if cache is not None and cache.k is not None:
                k, v = cache.k, cache.v
            else:
                k, v = self._heads(self.kv_proj(memory), 2)
                if cache is not None:
                    cache.k, cache.v, cache.static = k, v, True
            q, k = self.score.prepare(q, k)
            out = full_attention(q, k, v, self.score, key_padding=key_padding, dropout_p=self._p())
        else:
            q, k, v = self._heads(self.qkv_proj(x), 3)
            q, k = self.score.prepare(q, k)
            if self.rotary is not None:
                q, k = self.rotary(q, start), self.rotary(k, start)
            if cache is not None and cache.k is not None:
                out = self._cached_step(q, k, v, cache, start)
            else:
                out = self._pattern(q, k, v, key_padding)
                if cache is not None:
                    cache.k, cache.v = k, v
                    cache.pos = torch.arange(start, start + T, device=x.device)
                    self._trim(cache)
        if self.head_gate is not None:
            out = out * self.head_gate.to(out.dtype).view(1, -1, 1, 1)
        return self.out_proj(out.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim))

    def _p(self) -> float:
        return self.dropout if self.training else 0.0

    def _pattern(self, q, k, v, key_padding):
        kw = dict(causal=self.causal, key_padding=key_padding, slopes=self.slopes, dropout_p=self._p())
        if self.pattern == "local":
            return local_attention(q, k, v, self.score, window=self.window, **kw)
        if self.pattern == "dilated":
            return dilated_attention(q, k, v, self.score, window=self.window, dilation=self.dilation, **kw)
        return full_attention(q, k, v, self.score, **kw)

    def _cached_step(self, q, k, v, cache: KVCache, start: int):
        """New queries at positions start.. attend to cached keys plus their own: O(cached keys)."""
        T = q.shape[-2]
        cache.k, cache.v = torch.cat([cache.k, k], dim=2), torch.cat([cache.v, v], dim=2)
        cache.pos = torch.cat([cache.pos, torch.arange(start, start + T, device=q.device)])
        qpos = cache.pos[-T:]
        mask = positions_mask(qpos, cache.pos, self.pattern, self.window, self.dilation, self.causal)
        bias = None
        if self.slopes is not None:
            bias = _alibi_bias(self.slopes.to(q.dtype), qpos[:, None] - cache.pos[None, :])
        out = attend(q, cache.k, cache.v, self.score, mask=mask, bias=bias)
        self._trim(cache)
        return out

    def _trim(self, cache: KVCache) -> None:
        """Causal local/dilated attention never looks further back than window * dilation: drop older keys."""
        if self.causal and self.pattern != "full":
            keep = cache.pos > cache.pos[-1] - self.window * self.dilation
            if not bool(keep.all()):
                cache.k, cache.v, cache.pos = cache.k[:, :, keep], cache.v[:, :, keep], cache.pos[keep]
