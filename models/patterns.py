"""Attention patterns: which keys a query sees in self-attention (``PATTERNS``).

A pattern is one class: ``allowed(dist)`` says, for signed distances dist = query - key (T, S), which keys
each head may see ((H or 1, T, S) bool, or None for every key); the causal rule and padding are applied
by the caller. That alone is enough for a new pattern: the default ``attend`` runs full attention with
that mask, cached decoding uses the same mask, and ``reach`` (the furthest distance seen, None when
unbounded) lets a causal layer's cache keep only reach + 1 keys. A pattern with a faster exact kernel
overrides ``attend``. Class attributes ``windowed`` (needs ``window``) and ``dilated`` (takes dilations)
tell the config which keys apply (``models.traits``, which the built-in patterns inherit).

Built in:
  full     every key (subject to causality)
  local    keys at distance |i - j| <= W (only the past when causal): W is one-sided, 2W + 1 keys
           (W + 1 causal); Longformer's window w is 2W, Mistral's sliding window W is W (docs/components.md)
  dilated  Longformer (Beltagy et al. 2020, sections 3.1 and 4.2): dilation per head; head h sees keys at
           distances that are multiples of d_h up to W * d_h. Heads with d_h = 1 are plain local heads;
           ``ModelConfig.attention_layers`` resolves d_h for every layer and head from the config.

Global tokens (Longformer section 3.1, ``LayerAttention.global_tokens``): in a windowed layer of a bidirectional
stack, these positions attend to every key and every query attends to them, in every head. As in the paper (and
Hugging Face's LongformerSelfAttention), a query's window and the global keys (the global columns) use the
window's q, k, v, while the global tokens' rows use the global projections: Q_g of the global tokens against K_g,
V_g of every position (``global_qkv``, from ``MultiHeadAttention``; without it, under ``global_projections:
shared``, the window's q, k, v). No position bias applies to global rows and columns. The tiled kernels add the G
global keys as G more columns of every tile (taken out of the windows: each key counts once) and compute the G
global rows as one small dense call whose rows replace theirs (``kernels.global_columns``, ``window_padding``,
``global_rows``): every query keeps one softmax, so nothing is merged, and the cost stays O(T * (W + G)).
FlexAttention adds the global columns to its mask (and leaves them out of its bias); the rows are the same dense
call.
"""

from __future__ import annotations

import torch

from models import flex
from models.geometry import LayerAttention
from models.kernels import (
    Columns,
    dilated_attention,
    full_attention,
    global_columns,
    global_rows,
    local_attention,
    window_padding,
)
from models.registry import PATTERNS
from models.traits import DilatedTraits, LocalTraits, PatternTraits


class Pattern(PatternTraits):
    """Which keys each head sees; built from one layer's ``LayerAttention`` geometry."""

    def __init__(self, layer: LayerAttention) -> None:
        self.layer = layer
        self.window = layer.window
        self.dilations = layer.dilations
        self._on: dict = {}  # small index tensors per device, copied once (a copy per step would wait for it)

    def _tensor(self, key, make, device) -> torch.Tensor:
        if (key, device) not in self._on:
            self._on[key, device] = make().to(device)
        return self._on[key, device]

    def global_index(self, q: torch.Tensor, causal: bool) -> torch.Tensor | None:
        """(G,) the global positions within this sequence, or None. Kept when the window covers the sequence too:
        the global rows use their own projections, and no bias applies to global rows and columns."""
        keep = self.global_positions(q.shape[-2])
        if not keep:
            return None
        if causal:
            raise ValueError("global tokens attend to every key: they need a bidirectional (not causal) layer")
        return self._tensor(("global", keep), lambda: torch.tensor(keep), q.device)

    def global_positions(self, T: int) -> tuple[int, ...]:
        """The global tokens of a sequence of T positions (a position at or past its end is none of its own)."""
        return tuple(t for t in self.layer.global_tokens if t < T)

    @staticmethod
    def _global_rows_inputs(q, k, v, idx, global_qkv):
        """q_g of the global tokens ``idx``, k_g and v_g of every key: the global projections', or the window's."""
        return (q[:, :, idx], k, v) if global_qkv is None else global_qkv

    def _global_parts(self, q, k, v, idx, key_padding, global_qkv):
        """What the kernels need for the global tokens ``idx``: the global columns, the windows' padding (padding
        and the global keys) and the inputs of the global rows."""
        columns = global_columns(q, k, v, idx, key_padding)
        return columns, window_padding(q, idx, key_padding), self._global_rows_inputs(q, k, v, idx, global_qkv)

    @classmethod
    def plain(cls, n_heads: int) -> Pattern:
        return cls(LayerAttention(getattr(cls, "name", "full"), None, (1,) * n_heads))

    @property
    def reach(self) -> int | None:
        return self.layer.reach

    def allowed(self, dist: torch.Tensor) -> torch.Tensor | None:
        return None

    def attend(self, q, k, v, score, *, causal=False, key_padding=None, bias=None, dropout_p=0.0, global_qkv=None):
        """q (B, H, T, D), k, v (B, H, S, D) of one sequence (queries aligned to the last keys). ``global_qkv``:
        (q_g (B, H, G, D) of the global tokens, k_g, v_g (B, H, S, D)) through the global projections, or None
        (the window's q, k, v serve the global rows)."""
        T, S = q.shape[-2], k.shape[-2]
        dist = torch.arange(S - T, S, device=q.device)[:, None] - torch.arange(S, device=q.device)[None, :]
        allowed, idx = self.allowed(dist), self.global_index(q, causal)
        columns: Columns | None = None
        window_pad = key_padding
        if idx is not None:  # global columns beside the windows, then the global rows
            columns, window_pad, rows = self._global_parts(q, k, v, idx, key_padding, global_qkv)
        out = full_attention(
            q,
            k,
            v,
            score,
            causal=causal,
            key_padding=window_pad,
            bias=bias,
            allowed=allowed,
            dropout_p=dropout_p,
            columns=columns,
        )
        return out if idx is None else global_rows(out, *rows, score, idx, key_padding, dropout_p)

    def context(self, length: int, causal: bool) -> float:
        """Keys a query sees on average (for FLOPs): the full context unless the pattern bounds it."""
        return (length + 1) / 2 if causal else float(length)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.layer})"


@PATTERNS.register("full")
class FullPattern(Pattern):
    name = "full"

    def attend(self, q, k, v, score, *, causal=False, key_padding=None, bias=None, dropout_p=0.0, global_qkv=None):
        return full_attention(q, k, v, score, causal=causal, key_padding=key_padding, bias=bias, dropout_p=dropout_p)


@PATTERNS.register("local")
class LocalPattern(LocalTraits, Pattern):
    name = "local"

    def allowed(self, dist):
        return (dist.abs() <= self.window)[None]

    def attend(self, q, k, v, score, *, causal=False, key_padding=None, bias=None, dropout_p=0.0, global_qkv=None):
        idx = self.global_index(q, causal)
        if flex.usable(q, v, score, window=self.window, dilations=self.dilations, dropout_p=dropout_p, bias=bias):
            out = self._flex(q, k, v, score, causal, key_padding, bias, idx)
            rows = None if idx is None else self._global_rows_inputs(q, k, v, idx, global_qkv)
        else:
            columns, window_pad, rows = None, key_padding, None
            if idx is not None:
                columns, window_pad, rows = self._global_parts(q, k, v, idx, key_padding, global_qkv)
            out = self._windows(q, k, v, score, causal, window_pad, bias, dropout_p, columns)
        return out if idx is None else global_rows(out, *rows, score, idx, key_padding, dropout_p)

    def _windows(self, q, k, v, score, causal, key_padding, bias, dropout_p, columns: Columns | None):
        """The tiled kernels: each query's window (without the keys ``key_padding`` marks) and the ``columns``."""
        return local_attention(
            q,
            k,
            v,
            score,
            window=self.window,
            causal=causal,
            key_padding=key_padding,
            bias=bias,
            dropout_p=dropout_p,
            columns=columns,
        )

    def _flex(self, q, k, v, score, causal, key_padding, bias, idx):
        """Every head in one FlexAttention call (CUDA; ``models.flex``), the global columns in its mask (the
        global rows are replaced by the caller)."""
        return flex.window_attention(
            q,
            k,
            v,
            scale=score.scale,
            window=self.window,
            dilations=self.dilations,
            causal=causal,
            key_padding=key_padding,
            bias=bias,
            global_tokens=() if idx is None else self.global_positions(q.shape[-2]),
        )

    def context(self, length: int, causal: bool) -> float:
        """The window's keys, plus the G global keys, plus the global queries' rows (G x length, over the queries)."""
        window = min(super().context(length, causal), self.window + 1 if causal else 2 * self.window + 1)
        return min(float(length), window + 2 * len([t for t in self.layer.global_tokens if t < length]))


@PATTERNS.register("dilated")
class DilatedPattern(DilatedTraits, LocalPattern):
    """Per-head dilation: heads are grouped by their dilation and each group runs the residue-class kernel
    (dilation 1: the plain local kernel)."""

    name = "dilated"

    def __init__(self, layer: LayerAttention) -> None:
        super().__init__(layer)
        groups: dict[int, list[int]] = {}
        for h, d in enumerate(layer.dilations):
            groups.setdefault(d, []).append(h)
        self.groups = sorted(groups.items(), key=lambda item: item[1][0])  # [(d, heads)], by first head
        order = [h for _, heads in self.groups for h in heads]
        self.order = None if order == sorted(order) else torch.tensor(order).argsort()

    def allowed(self, dist):
        d = self._tensor("d", lambda: torch.tensor(self.dilations).view(-1, 1, 1), dist.device)  # (H, 1, 1)
        return (dist.abs() <= self.window * d) & (dist % d == 0)

    def _windows(self, q, k, v, score, causal, key_padding, bias, dropout_p, columns: Columns | None):
        """Each group of heads of one dilation through the residue-class kernel, the ``columns`` in every group."""
        outs = []
        for d, heads in self.groups:
            if len(self.groups) == 1:
                idx = slice(None)
            elif heads == list(range(heads[0], heads[-1] + 1)):
                idx = slice(heads[0], heads[-1] + 1)  # a view
            else:
                idx = self._tensor(d, lambda heads=heads: torch.tensor(heads), q.device)
            group_bias = None if bias is None else (lambda dist, idx=idx: bias(dist)[idx])
            group_columns = None if columns is None else (columns[0][:, idx], columns[1][:, idx], columns[2])
            outs.append(
                dilated_attention(
                    q[:, idx],
                    k[:, idx],
                    v[:, idx],
                    _HeadSubset(score, idx),
                    window=self.window,
                    dilation=d,
                    causal=causal,
                    key_padding=key_padding,
                    bias=group_bias,
                    dropout_p=dropout_p,
                    columns=group_columns,
                )
            )
        out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)
        return out if self.order is None else out.index_select(1, self._tensor("order", lambda: self.order, out.device))


class _HeadSubset:
    """A score function restricted to some heads (its per-head parameters indexed accordingly)."""

    def __init__(self, score, heads) -> None:
        self.score, self.heads = score, heads
        self.dot_like, self.scale = score.dot_like, score.scale

    def scores(self, q, k):
        return self.score.scores(q, k, self.heads)

    def fused_attention(self, q, k, v, extra=None):
        return self.score.fused_attention(q, k, v, extra, self.heads)
