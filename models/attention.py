"""Multi-head attention = a score function x a pattern (x a position scheme's slot), and its key/value cache.

Notation: B batch, H heads, T query length, S key length, D head dim, C model width.

Score functions (``SCORES``, registered here):
  dot           q.k / sqrt(D)                        (Vaswani et al. 2017)
  dot_unscaled  q.k                                  (Vaswani section 3.2.1's unscaled variant)
  general       (q W_h).k / sqrt(D), W_h learned     (Luong et al. 2015, bilinear; W = I + delta, delta starts at 0)
  cosine        tau_h cos(q, k), tau_h learned       (Henry et al. 2020; Swin v2's per-head temperature)
  additive      v_h . tanh(q + k)                    (Bahdanau et al. 2015; q, k are W_q x, W_k x)
With ``qk_projections`` (the default) q and k are learned projections of the states (Vaswani et al.): then
``general`` is ``dot`` with W_h folded into the query projection, the same bilinear family. Without them
(``qk_projections=False``) each head scores its slice of the states themselves, as Luong et al. scored a
decoder state against encoder states: ``dot`` has no parameter, ``general`` one matrix W_h, and ``additive`` is
Luong's ``concat`` v_h . tanh(W1_h q + W2_h k) with maps of its own (``Score.over_states``). Luong's setting is
the cross-attention (a model's ``cross_score``, ``cross_qk_projections``), whose values are then the source
states too; in self-attention over the states q and k are one tensor, and a token scores itself |x|^2.
The dot-like scores reduce to torch's scaled_dot_product_attention on transformed q and k (flash kernels
where the inputs allow: no mask is passed where none is needed). Additive scores go through
``additive_scores``, an autograd function that never holds more than ``chunk_elements`` elements of its
(query, key, dimension) intermediates, in forward and backward, in as few blocks as that allows.

Patterns (``models.patterns``) decide which keys a query sees; the kernels are in ``models.kernels`` (and
re-exported here).

Incremental decoding keeps a ``KVCache`` per layer: preallocated buffers written in place (a ring buffer
for windowed causal layers), no host synchronisation per step, cross-attention keys and values computed
once per source and shared by its beams.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from models import fused
from models.kernels import (  # noqa: F401  (re-exported: the kernels are part of this module's interface)
    Bias,
    additive_blocks,
    additive_scores,
    attend,
    band,
    dilated_attention,
    full_attention,
    local_attention,
    tile_size,
)
from models.patterns import FullPattern
from models.positions import AttentionPositions
from models.registry import SCORES
from models.traits import AdditiveTraits, ScoreTraits

# ---------------------------------------------------------------------------------------------------
# Score functions


class Score(ScoreTraits, nn.Module):
    """A score function. ``prepare_query`` / ``prepare_key`` transform q and k (B, H, T, D) before rotary
    positions (so that rotated scores stay relative); then either ``dot_like`` (the score is
    ``scale * q.k`` of the prepared q and k, computed by torch's fused attention) or ``scores(q, k, heads)``
    -> (..., T, S), where ``heads`` indexes the per-head parameters for the heads q and k hold."""

    scale = 1.0

    def __init__(self, n_heads: int, head_dim: int, chunk_elements: int = 1 << 20) -> None:
        super().__init__()
        self.n_heads, self.head_dim, self.chunk_elements = n_heads, head_dim, chunk_elements

    def prepare_query(self, q: torch.Tensor) -> torch.Tensor:
        return q

    def prepare_key(self, k: torch.Tensor) -> torch.Tensor:
        return k

    def prepare(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.prepare_query(q), self.prepare_key(k)

    def over_states(self) -> None:
        """Called when q and k are the states themselves (``qk_projections=False``, Luong et al.'s setting): a
        score whose definition holds maps of q and k creates them here (additive: Luong's concat W_a)."""

    def scores(self, q: torch.Tensor, k: torch.Tensor, heads=slice(None)) -> torch.Tensor:
        return q @ k.transpose(-1, -2) * self.scale

    def fused_attention(self, q, k, v, extra=None, heads=slice(None)) -> torch.Tensor | None:
        """softmax(scores + extra) @ v in one fused computation, or None (then ``scores`` serves)."""
        return None


@SCORES.register("dot")
class DotScore(Score):
    """q.k / sqrt(D)."""

    def __init__(self, n_heads: int, head_dim: int, chunk_elements: int = 1 << 20) -> None:
        super().__init__(n_heads, head_dim, chunk_elements)
        self.scale = 1.0 / math.sqrt(head_dim)


@SCORES.register("dot_unscaled")
class UnscaledDotScore(Score):
    """q.k, unscaled."""


@SCORES.register("general")
class GeneralScore(DotScore):
    """Bilinear q^T W_h k per head, scaled like dot. W_h = I + delta_h with delta_h starting at 0 (so it
    starts as dot), and weight decay, which pulls the parameter delta to 0, pulls W towards the identity."""

    def __init__(self, n_heads: int, head_dim: int, chunk_elements: int = 1 << 20) -> None:
        super().__init__(n_heads, head_dim, chunk_elements)
        self.delta = nn.Parameter(torch.zeros(n_heads, head_dim, head_dim))  # (H, D, D)
        self.register_buffer("eye", torch.eye(head_dim), persistent=False)

    @property
    def weight(self) -> torch.Tensor:
        return self.eye + self.delta

    def prepare_query(self, q):  # q (B, H, T, D) @ W (H, D, D)
        return q @ self.weight.to(q.dtype)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        old = state_dict.pop(prefix + "weight", None)  # checkpoints that stored W itself
        if old is not None and prefix + "delta" not in state_dict:
            state_dict[prefix + "delta"] = old - torch.eye(old.shape[-1], dtype=old.dtype)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


@SCORES.register("cosine")
class CosineScore(Score):
    """tau_h * cos(q, k) with a learned per-head temperature tau_h = exp(log_tau_h) <= 100, starting at 10."""

    def __init__(self, n_heads: int, head_dim: int, chunk_elements: int = 1 << 20) -> None:
        super().__init__(n_heads, head_dim, chunk_elements)
        self.log_tau = nn.Parameter(torch.full((n_heads,), math.log(10.0)))

    def prepare_query(self, q):  # (B, H, T, D)
        tau = self.log_tau.clamp(max=math.log(100.0)).exp().to(q.dtype).view(1, -1, 1, 1)
        return F.normalize(q, dim=-1) * tau

    def prepare_key(self, k):
        return F.normalize(k, dim=-1)


@SCORES.register("additive")
class AdditiveScore(AdditiveTraits, Score):
    """Bahdanau's v_h . tanh(q + k), computed by ``additive_scores`` in bounded memory. Over projected q and k
    this is Luong et al.'s ``concat`` v^T tanh(W_a [h_t; h_s]) with W_a = [W_q; W_k]; over the states themselves
    (``over_states``) the score holds W_a itself: per head, (D, D) maps of q and of k, without bias."""

    def __init__(self, n_heads: int, head_dim: int, chunk_elements: int = 1 << 20) -> None:
        super().__init__(n_heads, head_dim, chunk_elements)
        self.v = nn.Parameter(torch.randn(n_heads, head_dim) / math.sqrt(head_dim))  # (H, D)
        self.w_q: nn.Parameter | None = None
        self.w_k: nn.Parameter | None = None

    def over_states(self) -> None:
        H, D = self.n_heads, self.head_dim
        bound = math.sqrt(3.0 / D)  # Xavier uniform over each head's (D, D) map: sqrt(6 / (fan_in + fan_out))
        self.w_q = nn.Parameter(torch.empty(H, D, D).uniform_(-bound, bound))
        self.w_k = nn.Parameter(torch.empty(H, D, D).uniform_(-bound, bound))

    def prepare_query(self, q):  # (B, H, T, D) @ (H, D, D)
        return q if self.w_q is None else q @ self.w_q.to(q.dtype)

    def prepare_key(self, k):
        return k if self.w_k is None else k @ self.w_k.to(k.dtype)

    def scores(self, q: torch.Tensor, k: torch.Tensor, heads=slice(None)) -> torch.Tensor:  # (B,H,T,D) (B,H,S,D)
        return additive_scores(q, k, self.v[heads], self.chunk_elements)

    def fused_attention(self, q, k, v, extra=None, heads=slice(None)) -> torch.Tensor | None:
        """On CUDA: ``models.fused.additive_attention`` (fused kernels, query chunks of ``chunk_elements``
        scores)."""
        if q.dim() != 4 or not fused.usable(q, bias=extra if extra is not None and extra.is_floating_point() else None):
            return None
        return fused.additive_attention(q, k, v, self.v[heads], extra, self.chunk_elements)


# ---------------------------------------------------------------------------------------------------
# The key/value cache


class KVCache:
    """Keys and values of one attention layer seen so far, preallocated and written in place.

    Self-attention: ``k``, ``v`` (B, H, capacity, D) hold column c in slot c, or, as a ring buffer of
    ``ring`` slots (causal layers whose pattern has a finite reach), in slot c % ring, so that a windowed
    layer keeps only reach + 1 keys. ``pos`` (capacity,) holds each slot's column (EMPTY while unused),
    ``pad`` (B, capacity) is True at padding keys of a left-padded prompt (None when there is none). Writes
    are slice assignments whose bounds are Python integers: no host synchronisation. Without a capacity,
    the buffer doubles when full; that, and a chunk of several tokens that outgrows a ring, are the rare
    paths that reallocate (and may synchronise).

    Cross-attention (``static``): the keys and values of the encoder memory, computed once per source; the
    beams of a source share them (their queries are folded together), so beam reordering never touches them.
    """

    EMPTY = -(1 << 40)

    def __init__(self, capacity: int | None = None) -> None:
        self.capacity = capacity
        self.ring: int | None = None
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self.pos: torch.Tensor | None = None
        self.pad: torch.Tensor | None = None
        self.end = 0  # columns written so far
        self.static = False
        self._spare: tuple[torch.Tensor, torch.Tensor] | None = None  # the other half of a double buffer

    def set_static(self, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k, self.v, self.static = k, v, True

    def _allocate(self, like: torch.Tensor, slots: int, padded: bool) -> None:
        B, H, _, D = like.shape
        self.k = like.new_zeros(B, H, slots, D)
        self.v = like.new_zeros(B, H, slots, D)
        if self.ring is None:
            self.pos = torch.arange(slots, device=like.device)
        else:
            self.pos = torch.full((slots,), self.EMPTY, dtype=torch.long, device=like.device)
        self.pad = torch.zeros(B, slots, dtype=torch.bool, device=like.device) if padded else None

    def _resize(self, slots: int) -> None:
        """Move to a buffer of ``slots`` slots (a rare path: capacity exceeded or a ring too small)."""
        old_k, old_v, old_pos, old_pad = self.k, self.v, self.pos, self.pad
        self._allocate(old_k, slots, old_pad is not None)
        if self.ring is None:
            n = self.end
            self.k[:, :, :n], self.v[:, :, :n] = old_k[:, :, :n], old_v[:, :, :n]
            if old_pad is not None:
                self.pad[:, :n] = old_pad[:, :n]
        else:
            keep = old_pos >= 0
            cols = old_pos[keep]
            slot = cols % slots
            self.k.index_copy_(2, slot, old_k[:, :, keep])
            self.v.index_copy_(2, slot, old_v[:, :, keep])
            self.pos.index_copy_(0, slot, cols)
            if old_pad is not None:
                self.pad.index_copy_(1, slot, old_pad[:, keep])
            self.ring = slots

    def write(self, k: torch.Tensor, v: torch.Tensor, start: int, pad: torch.Tensor | None = None, ring=None) -> None:
        """Store k, v (B, H, T, D) of columns start .. start+T-1; pad (B, T) True at padding keys.
        ``ring``: on the first write, the ring size (None: a plain buffer)."""
        T = k.shape[2]
        if start != self.end:
            raise ValueError(
                f"the cache holds columns 0..{self.end - 1}: the next step starts at {self.end} (got {start})"
            )
        if self.k is None:
            self.ring = ring
            self._allocate(k, ring if ring is not None else max(self.capacity or 0, T, 16), pad is not None)
        elif self.ring is None and start + T > self.k.shape[2]:
            self._resize(max(start + T, 2 * self.k.shape[2]))
        if pad is not None and self.pad is None:
            self.pad = torch.zeros(k.shape[0], self.k.shape[2], dtype=torch.bool, device=k.device)
        cap = self.k.shape[2]
        if self.ring is None:
            pieces = [(start, start + T, 0)]
        else:
            n = min(T, cap)
            c0 = start + T - n
            s0 = c0 % cap
            first = min(n, cap - s0)
            pieces = [(s0, s0 + first, T - n)]
            if n > first:
                pieces.append((0, n - first, T - n + first))
        for a, z, src in pieces:
            width = z - a
            self.k[:, :, a:z] = k[:, :, src : src + width]
            self.v[:, :, a:z] = v[:, :, src : src + width]
            if self.ring is not None:
                col = start + src
                self.pos[a:z] = torch.arange(col, col + width, device=self.pos.device)
            if self.pad is not None:
                if pad is None:
                    self.pad[:, a:z] = False
                else:
                    self.pad[:, a:z] = pad[:, src : src + width]
        self.end = start + T

    def ensure_ring(self, slots: int) -> None:
        if self.ring is not None and self.ring < slots:
            self._resize(slots)

    def read(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Views of the stored keys, values, their columns (S,) and padding (B, S) or None."""
        if self.ring is not None:
            return self.k, self.v, self.pos, self.pad
        n = self.end
        return self.k[:, :, :n], self.v[:, :, :n], self.pos[:n], None if self.pad is None else self.pad[:, :n]

    def reorder(self, index: torch.Tensor) -> None:
        """Follow the beams: row i becomes old row index[i]. Only the filled slots are copied, into a spare
        pair of buffers that then swaps with the current one. Static caches are shared and stay."""
        if self.static or self.k is None:
            return
        n = self.end if self.ring is None else self.k.shape[2]
        shape = (index.numel(), *self.k.shape[1:])
        if self._spare is None or self._spare[0].shape != shape:
            self._spare = (self.k.new_empty(shape), self.v.new_empty(shape))
        k, v = self._spare
        torch.index_select(self.k[:, :, :n], 0, index, out=k[:, :, :n])
        torch.index_select(self.v[:, :, :n], 0, index, out=v[:, :, :n])
        self._spare = (self.k, self.v) if self.k.shape == shape else None
        self.k, self.v = k, v
        if self.pad is not None:
            self.pad = self.pad.index_select(0, index)


# ---------------------------------------------------------------------------------------------------
# The module


def projections(linear: nn.Linear, n: int) -> nn.Linear:
    """``linear`` marked as ``n`` projections fused along its outputs (q, k, v): each is initialised as a layer
    of its own (Transformer._init_weights)."""
    linear.fused_outputs = n
    return linear


class MultiHeadAttention(nn.Module):
    """Self- or cross-attention with pluggable slots: a score function, a pattern (``models.patterns``)
    and the attention part of a position scheme (``AttentionPositions``: rotary, ALiBi, or nothing).

    ``pattern`` applies to self-attention; cross-attention is always full and position-free. Without
    ``qk_projections`` q and k are the states themselves, split into heads: self-attention projects its values,
    cross-attention does not (Luong et al.'s context vector is the attention-weighted mean of the source states
    themselves, c_t = sum_s a_t(s) h_s); the output is projected in both (cross: the c_t half of Luong's W_c).

    ``global_projections``: the global attention of the pattern's global tokens (Longformer section 3.1) has
    projections of its own: ``global_qkv_proj`` (Q_g, K_g, V_g), or ``global_v_proj`` (V_g) without
    ``qk_projections`` (q and k are the states), copies of the window's at construction
    (``copy_global_projections``). A query's window and the global columns use the window's q, k, v; the global
    rows use Q_g of the global tokens against K_g, V_g of every position.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        head_dim: int,
        *,
        score: str = "dot",
        pattern=None,
        causal: bool = False,
        cross: bool = False,
        positions: AttentionPositions | None = None,
        dropout: float = 0.0,
        bias: bool = True,
        chunk_elements: int = 1 << 20,
        qk_projections: bool = True,
        global_projections: bool = False,
    ) -> None:
        super().__init__()
        self.n_heads, self.head_dim = n_heads, head_dim
        self.qk_projections = qk_projections
        self.pattern = FullPattern.plain(n_heads) if cross or pattern is None else pattern
        self.causal = causal and not cross
        self.cross = cross
        self.dropout = dropout
        inner = n_heads * head_dim
        if not qk_projections:  # the scores read the states; self-attention projects its values, cross does not
            if inner != d_model:
                raise ValueError(f"without q/k projections n_heads * head_dim ({inner}) must equal d_model ({d_model})")
            if not cross:
                self.v_proj = nn.Linear(d_model, inner, bias=bias)
        elif cross:
            self.q_proj = nn.Linear(d_model, inner, bias=bias)
            self.kv_proj = projections(nn.Linear(d_model, 2 * inner, bias=bias), 2)
        else:
            self.qkv_proj = projections(nn.Linear(d_model, 3 * inner, bias=bias), 3)
        self.out_proj = nn.Linear(inner, d_model, bias=bias)
        self.score = SCORES[score](n_heads, head_dim, chunk_elements)
        if not qk_projections:
            self.score.over_states()
        self.positions = positions if positions is not None and not cross else AttentionPositions()
        self.head_gate: torch.Tensor | None = None  # (H,) set by Transformer.set_head_mask
        layer = getattr(self.pattern, "layer", None)
        if global_projections and not self.causal and not cross and layer is not None and layer.global_tokens:
            local = self.global_source()
            # Longformer's Q_g, K_g, V_g (or V_g alone): allocated without drawing from the generator (the model's
            # other weights stay those of the same seed), then set to the window's
            glob = nn.utils.skip_init(nn.Linear, d_model, local.out_features, bias=bias, device=local.weight.device)
            glob.fused_outputs = getattr(local, "fused_outputs", 1)
            if qk_projections:
                self.global_qkv_proj = glob
            else:
                self.global_v_proj = glob
            self.copy_global_projections()

    @property
    def global_proj(self) -> nn.Linear | None:
        """The global projections (``global_qkv_proj`` or ``global_v_proj``), or None (none, or shared)."""
        glob = getattr(self, "global_qkv_proj", None)
        return glob if glob is not None else getattr(self, "global_v_proj", None)

    def global_parameters(self) -> list[nn.Parameter]:
        """The parameters of the global projections (none without them)."""
        glob = self.global_proj
        return [] if glob is None else list(glob.parameters())

    def global_source(self) -> nn.Linear:
        """The window's projection that the global one mirrors: ``qkv_proj``, or ``v_proj`` over the states."""
        return self.qkv_proj if self.qk_projections else self.v_proj

    @torch.no_grad()
    def copy_global_projections(self) -> None:
        """Set the global projections to the window's (Longformer section 3.1: "Q_g, K_g, V_g are all initialized
        with values that match Q_s, K_s, V_s"): the layer then computes what shared projections compute."""
        glob = self.global_proj
        if glob is None:
            return
        source = self.global_source()
        glob.weight.copy_(source.weight)
        if source.bias is not None:
            glob.bias.copy_(source.bias)

    def _heads(self, t: torch.Tensor, n: int) -> tuple[torch.Tensor, ...]:
        B, T, _ = t.shape
        return t.view(B, T, n, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)  # n x (B, H, T, D)

    def _p(self) -> float:
        return self.dropout if self.training else 0.0

    def _bias(self) -> Bias | None:
        return self.positions.bias if self.positions.has_bias else None

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor | None = None,
        *,
        key_padding: torch.Tensor | None = None,
        start: int = 0,
        position_ids: torch.Tensor | None = None,
        cache: KVCache | None = None,
    ) -> torch.Tensor:
        """x (B, T, C); memory (B', S, C) for cross-attention (B = B' * beams); key_padding (B, S) True at
        padding keys; start: column of x[:, 0]; position_ids (B, T): positions when they differ from the
        columns (left padding); cache: keys/values of earlier steps (updated in place)."""
        B, T, _ = x.shape
        if self.cross:
            q = self.score.prepare_query(
                self._heads(self.q_proj(x), 1)[0] if self.qk_projections else self._heads(x, 1)[0]
            )
            if cache is not None and cache.static:
                k, v = cache.k, cache.v
            else:
                k, v = self._keys_values(memory)
                k = self.score.prepare_key(k)
                if cache is not None:
                    cache.set_static(k, v)
            out = self._cross(q, k, v, key_padding)
        else:
            if self.qk_projections:
                q, k, v = self._heads(self.qkv_proj(x), 3)
            else:  # q = k = the states, head by head (B, H, T, D)
                (q,), (v,) = self._heads(x, 1), self._heads(self.v_proj(x), 1)
                k = q
            q, k = self.score.prepare(q, k)
            q, k = self.positions.rotate(q, k, start, position_ids)
            if cache is not None and cache.end > 0:
                out = self._cached_step(q, k, v, cache, start, key_padding)
            else:
                idx = None if self.global_proj is None else self.pattern.global_index(q, self.causal)
                extra = {} if idx is None else {"global_qkv": self._global_qkv(x, q, k, idx, start, position_ids)}
                out = self.pattern.attend(
                    q,
                    k,
                    v,
                    self.score,
                    causal=self.causal,
                    key_padding=key_padding,
                    bias=self._bias(),
                    dropout_p=self._p(),
                    **extra,
                )
                if cache is not None:
                    cache.write(k, v, start, key_padding, ring=self._ring())
        if self.head_gate is not None:  # (H,) for every sequence, or (B, H): one gate per sequence and head
            out = out * self.head_gate.to(out.dtype).view(-1 if self.head_gate.dim() > 1 else 1, self.n_heads, 1, 1)
        return self.out_proj(out.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim))

    def _global_qkv(self, x, q, k, idx, start: int, position_ids):
        """Longformer's global projections: Q_g of the global tokens ``idx`` (B, H, G, D), K_g and V_g of every
        position (B, H, T, D), prepared by the score and rotated like the window's q and k. Without
        ``qk_projections`` Q_g and K_g are the states (the window's q and k) and only V_g is projected."""
        if not self.qk_projections:
            (v_g,) = self._heads(self.global_v_proj(x), 1)
            return q[:, :, idx], k, v_g
        q_g, k_g, v_g = self._heads(self.global_qkv_proj(x), 3)  # (B, H, T, D) each; Q_g is kept at idx only
        q_g, k_g = self.score.prepare(q_g, k_g)
        q_g, k_g = self.positions.rotate(q_g, k_g, start, position_ids)
        return q_g[:, :, idx], k_g, v_g

    def _keys_values(self, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Cross-attention's keys and values (B', H, S, D) of the encoder memory (B', S, C)."""
        if self.qk_projections:
            k, v = self._heads(self.kv_proj(memory), 2)
            return k, v
        (h,) = self._heads(memory, 1)  # Luong et al.: the source states are the keys and the values
        return h, h

    def _ring(self) -> int | None:
        """Slots a cache needs: reach + 1 for a causal layer whose pattern sees a bounded distance back."""
        reach = self.pattern.reach
        return reach + 1 if self.causal and reach is not None else None

    def _cross(self, q, k, v, key_padding):
        Bq, Bk = q.shape[0], k.shape[0]
        if Bq == Bk:
            return full_attention(q, k, v, self.score, key_padding=key_padding, dropout_p=self._p())
        # G beams per source: their queries attend to the same keys, folded into one row (no position rule
        # connects queries in cross-attention, so this is exact)
        G = Bq // Bk
        _, H, T, D = q.shape
        q = q.view(Bk, G, H, T, D).transpose(1, 2).reshape(Bk, H, G * T, D)
        out = full_attention(q, k, v, self.score, key_padding=key_padding, dropout_p=self._p())
        return out.view(Bk, H, G, T, D).transpose(1, 2).reshape(Bq, H, T, D)

    def _cached_step(self, q, k, v, cache: KVCache, start: int, key_padding):
        """New queries at columns start.. attend to the cached keys plus their own: O(cached keys), no
        host synchronisation."""
        if key_padding is not None:
            raise ValueError("padding is given with the first call that fills a cache (the prompt) only")
        T = q.shape[2]
        if cache.ring is not None and T > 1:
            cache.ensure_ring(self.pattern.reach + T)  # every query of the chunk must still find its window
        cache.write(k, v, start)
        keys, values, kpos, kpad = cache.read()
        qpos = torch.arange(start, start + T, device=q.device)
        dist = qpos[:, None] - kpos[None, :]  # (T, S)
        mask = self.pattern.allowed(dist)  # (H or 1, T, S), or None: every key
        if T > 1:  # a single new query is the last column: every stored key is in its past
            mask = dist >= 0 if mask is None else mask & (dist >= 0)
        if kpad is not None:
            mask = ~kpad[:, None, None, :] if mask is None else mask & ~kpad[:, None, None, :]
        bias = self.positions.bias(dist).to(q.dtype) if self.positions.has_bias else None
        return attend(q, keys, values, self.score, mask=mask, bias=bias, dropout_p=self._p())
