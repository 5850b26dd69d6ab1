"""Gu et al. (2018)'s Non-Autoregressive Transformer decoder, section 3.1 ("Decoder stack"): the two pieces of its
layers that an autoregressive decoder has not (its inputs, the source embeddings copied uniformly, are
``Transformer.uniform_copy``).

Notation: B batch, T target length, C model width, H heads, D head dim.

- ``WithoutSelf``: the decoder's self-attention is not causal, and "we mask out each query position only from
  attending to itself, which we found to improve decoder performance relative to unmasked self-attention". The
  mask is a bias of ``SELF_BIAS`` on the scores at distance 0, added on every kernel path (full, local tiles,
  dilated, global tokens), so that the query's own key gets exactly zero probability whenever the query has
  another key. A query with no other key (a one-token target; a dilated head none of whose other keys falls
  inside the target) attends to itself, since a softmax needs a key: as in Gu et al.'s code, whose mask is a
  finite -1e10 (salesforce/nonauto-nmt, ``Attention(diag=True)``).
- ``PositionalAttention``: "a multi-head attention module with the same general attention mechanism used in other
  parts of the Transformer network, ... where the positional encoding is used as query and key and the decoder
  states as the value". Its own q, k, v and output projections (stored as a self-attention's ``qkv_proj``: q and k
  read the positional encodings, v the decoder states); the model's score (``score``, ``qk_projections``) as
  everywhere else in the model (the paper writes the scale as sqrt(d_model), what its code uses in every
  attention); full attention over the target's real positions, no mask of its own position (the paper masks the
  self-attention only; its code passes the self-attention's flags to both). The positional encodings are what the
  decoder's position scheme adds to its inputs (sinusoidal: Vaswani's table, as Gu et al.; learned: the table).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from models.attention import MultiHeadAttention
from models.kernels import full_attention
from models.positions import AttentionPositions

# Added to the score of each query's own key. Finite, so that a query with no other key stays finite (float16's
# range holds it); exp(-1e4) is 0 in every floating type, so the own key gets probability exactly 0 otherwise.
SELF_BIAS = -1e4


class WithoutSelf(AttentionPositions):
    """The attention part of a position scheme (``inner``: rotary, ALiBi or nothing), plus Gu et al.'s mask of each
    query's own position: a bias of ``SELF_BIAS`` at signed distance 0, for every head."""

    has_bias = True

    def __init__(self, inner: AttentionPositions, n_heads: int) -> None:
        super().__init__()
        self.inner, self.n_heads = inner, n_heads

    def rotate(self, q, k, start: int = 0, ids: torch.Tensor | None = None):
        return self.inner.rotate(q, k, start, ids)

    def bias(self, dist: torch.Tensor) -> torch.Tensor:
        """(H, ...) for signed distances dist (...) = query - key."""
        own = torch.zeros(dist.shape, device=dist.device).masked_fill(dist == 0, SELF_BIAS)
        own = own.expand(self.n_heads, *dist.shape)
        return self.inner.bias(dist) + own if self.inner.has_bias else own


class PositionalAttention(MultiHeadAttention):
    """Gu et al.'s positional attention: softmax(score(q, k)) v with q, k projections of the positional encodings
    (T, C) and v a projection of the decoder states (B, T, C); padding keys are masked. Built as a self-attention
    (its ``qkv_proj``: q, k, v; or, without ``qk_projections``, q = k = the encodings and ``v_proj``), so its
    parameters are initialised and gated per head (``Transformer.set_head_mask``) as any attention's."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        head_dim: int,
        *,
        score: str = "dot",
        dropout: float = 0.0,
        bias: bool = True,
        chunk_elements: int = 1 << 20,
        qk_projections: bool = True,
    ) -> None:
        super().__init__(
            d_model,
            n_heads,
            head_dim,
            score=score,
            dropout=dropout,
            bias=bias,
            chunk_elements=chunk_elements,
            qk_projections=qk_projections,
        )

    def forward(  # type: ignore[override]
        self, x: torch.Tensor, encoding: torch.Tensor, *, key_padding: torch.Tensor | None = None
    ) -> torch.Tensor:
        """x (B, T, C) the decoder states (the values); encoding (T, C) or (B, T, C) the positional encodings (the
        queries and keys); key_padding (B, T) True at padding."""
        B, T, C = x.shape
        pe = encoding.to(x.dtype).expand(B, T, C)
        if self.qk_projections:
            inner = self.n_heads * self.head_dim
            w, b = self.qkv_proj.weight, self.qkv_proj.bias
            q, k = self._heads(F.linear(pe, w[: 2 * inner], None if b is None else b[: 2 * inner]), 2)
            (v,) = self._heads(F.linear(x, w[2 * inner :], None if b is None else b[2 * inner :]), 1)  # (B, H, T, D)
        else:  # q = k = the encodings, head by head
            (q,), (v,) = self._heads(pe.contiguous(), 1), self._heads(self.v_proj(x), 1)
            k = q
        q, k = self.score.prepare(q, k)
        out = full_attention(q, k, v, self.score, key_padding=key_padding, dropout_p=self._p())  # (B, H, T, D)
        if self.head_gate is not None:  # (H,) for every sequence, or (B, H)
            out = out * self.head_gate.to(out.dtype).view(-1 if self.head_gate.dim() > 1 else 1, self.n_heads, 1, 1)
        return self.out_proj(out.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim))
