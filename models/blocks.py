"""Norms, feed-forward networks and the encoder/decoder layers.

Notation: B batch, T target length, S source length, C model width (d_model), F feed-forward width.

Norm placement is a pair of module slots per sub-layer, so one forward serves both:
    x = post_norm(x + dropout(sublayer(pre_norm(x))))
``pre`` (Xiong et al. 2020) fills pre_norm and leaves post_norm as Identity (the stack then ends with a
final norm); ``post`` (Vaswani et al. 2017) does the opposite.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from models.attention import KVCache, MultiHeadAttention, projections
from models.config import LayerAttention, ModelConfig
from models.nat import PositionalAttention, WithoutSelf
from models.positions import AttentionPositions
from models.registry import FEED_FORWARDS, NORMS, PATTERNS, POSITIONS


@NORMS.register("layernorm")
def layernorm(d: int, eps: float) -> nn.Module:
    return nn.LayerNorm(d, eps=eps)


@NORMS.register("rmsnorm")
def rmsnorm(d: int, eps: float) -> nn.Module:
    return nn.RMSNorm(d, eps=eps)


class FeedForward(nn.Module):
    """Linear(C, F) -> activation -> dropout -> Linear(F, C), for relu and gelu."""

    def __init__(self, d_model: int, d_ff: int, activation: str, dropout: float, bias: bool) -> None:
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff, bias=bias)
        self.linear2 = nn.Linear(d_ff, d_model, bias=bias)
        self.activation = {"relu": F.relu, "gelu": F.gelu}[activation]
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear2(self.dropout(self.activation(self.linear1(x))))


class SwiGLU(nn.Module):
    """Shazeer 2020: Linear(C, 2F) -> silu(a) * b -> dropout -> Linear(F, C). Has 1.5x the parameters of
    relu/gelu at the same F; set d_ff to 2/3 of theirs for a parameter-matched comparison."""

    def __init__(self, d_model: int, d_ff: int, dropout: float, bias: bool) -> None:
        super().__init__()
        self.linear1 = projections(nn.Linear(d_model, 2 * d_ff, bias=bias), 2)  # the gate and the value
        self.linear2 = nn.Linear(d_ff, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.linear1(x).chunk(2, dim=-1)
        return self.linear2(self.dropout(F.silu(a) * b))


FEED_FORWARDS.register("relu")(lambda c: FeedForward(c.d_model, c.ff_size, "relu", c.dropout, c.bias))
FEED_FORWARDS.register("gelu")(lambda c: FeedForward(c.d_model, c.ff_size, "gelu", c.dropout, c.bias))
FEED_FORWARDS.register("swiglu")(lambda c: SwiGLU(c.d_model, c.ff_size, c.dropout, c.bias))


class Residual(nn.Module):
    """One sub-layer with its residual connection and its norm in the pre or post slot."""

    def __init__(self, cfg: ModelConfig, sublayer: nn.Module) -> None:
        super().__init__()
        norm = NORMS[cfg.norm_type](cfg.d_model, cfg.norm_eps)
        self.pre_norm = norm if cfg.norm == "pre" else nn.Identity()
        self.post_norm = norm if cfg.norm == "post" else nn.Identity()
        self.sublayer = sublayer
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        return self.post_norm(x + self.dropout(self.sublayer(self.pre_norm(x), *args, **kwargs)))


def layer_attention(cfg: ModelConfig, attention: LayerAttention | str) -> LayerAttention:
    """A layer's geometry; a pattern name gives that pattern with the config's window and, for dilated
    patterns, ``dilated_heads`` heads at ``dilation`` (as a one-layer stack would have it)."""
    if isinstance(attention, LayerAttention):
        return attention
    kind = PATTERNS[attention]
    H = cfg.n_heads
    n = cfg.n_dilated_heads if kind.dilated else 0
    return LayerAttention(attention, cfg.window if kind.windowed else None, (1,) * (H - n) + (cfg.dilation,) * n)


def self_attention(
    cfg: ModelConfig, attention: LayerAttention | str, causal: bool, exclude_self: bool = False
) -> MultiHeadAttention:
    """``exclude_self``: each query masked from its own position (Gu et al. 2018's decoder, ``models.nat``)."""
    layer = layer_attention(cfg, attention)
    positions = POSITIONS[cfg.positions].in_attention(cfg, causal)
    if exclude_self:
        positions = WithoutSelf(positions if positions is not None else AttentionPositions(), cfg.n_heads)
    return MultiHeadAttention(
        cfg.d_model,
        cfg.n_heads,
        cfg.head_size,
        score=cfg.score,
        pattern=PATTERNS[layer.pattern](layer),
        causal=causal,
        positions=positions,
        dropout=cfg.attn_dropout,
        bias=cfg.bias,
        chunk_elements=cfg.chunk_elements,
        qk_projections=cfg.qk_projections,
        global_projections=cfg.global_projections == "separate",  # Q_g, K_g, V_g where the layer has global tokens
    )


def cross_attention(cfg: ModelConfig) -> MultiHeadAttention:
    """The decoder's attention over the encoder's states, with its own score and projections (``cross_score``,
    ``cross_qk_projections``; by default the self-attention's)."""
    return MultiHeadAttention(
        cfg.d_model,
        cfg.n_heads,
        cfg.head_size,
        score=cfg.cross_attention_score,
        cross=True,
        dropout=cfg.attn_dropout,
        bias=cfg.bias,
        chunk_elements=cfg.chunk_elements,
        qk_projections=cfg.cross_attention_projected,
    )


class EncoderLayer(nn.Module):
    """Self-attention (causal for a decoder-only model) then feed-forward."""

    def __init__(self, cfg: ModelConfig, attention: LayerAttention | str = "full", causal: bool = False) -> None:
        super().__init__()
        self.attn = Residual(cfg, self_attention(cfg, attention, causal))
        self.ff = Residual(cfg, FEED_FORWARDS[cfg.ffn](cfg))

    def forward(self, x, *, key_padding=None, start: int = 0, position_ids=None, cache: KVCache | None = None):
        x = self.attn(x, key_padding=key_padding, start=start, position_ids=position_ids, cache=cache)  # (B, T, C)
        return self.ff(x)


def positional_attention(cfg: ModelConfig) -> PositionalAttention:
    """Gu et al. (2018)'s positional attention, with the model's score and projections (``models.nat``)."""
    return PositionalAttention(
        cfg.d_model,
        cfg.n_heads,
        cfg.head_size,
        score=cfg.score,
        dropout=cfg.attn_dropout,
        bias=cfg.bias,
        chunk_elements=cfg.chunk_elements,
        qk_projections=cfg.qk_projections,
    )


class Skip(nn.Module):
    """An empty sub-layer slot: the states pass unchanged (a decoder layer without positional attention)."""

    def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        return x


class DecoderLayer(nn.Module):
    """Self-attention (causal, or not for non-autoregressive decoding), cross-attention over the encoder
    memory, feed-forward. Gu et al.'s decoder (``decoding='nat_gu'``, their section 3.1 and Figure 2) masks each
    query's own position in the self-attention and adds positional attention after it (queries and keys the
    positional encodings ``pos_encoding`` (T, C), values the states), before the cross-attention."""

    def __init__(self, cfg: ModelConfig, attention: LayerAttention | str = "full", causal: bool = True) -> None:
        super().__init__()
        gu = cfg.positional_attention and not causal
        self.attn = Residual(cfg, self_attention(cfg, attention, causal, exclude_self=gu))
        self.pos_attn = Residual(cfg, positional_attention(cfg)) if gu else Skip()
        self.cross = Residual(cfg, cross_attention(cfg))
        self.ff = Residual(cfg, FEED_FORWARDS[cfg.ffn](cfg))

    def forward(
        self,
        x,
        memory,
        *,
        memory_padding=None,
        key_padding=None,
        start: int = 0,
        position_ids=None,
        cache=None,
        pos_encoding=None,
    ):
        self_cache, cross_cache = cache if cache is not None else (None, None)
        x = self.attn(x, key_padding=key_padding, start=start, position_ids=position_ids, cache=self_cache)
        x = self.pos_attn(x, pos_encoding, key_padding=key_padding)  # Gu et al.'s positional attention, or nothing
        x = self.cross(x, memory, key_padding=memory_padding, cache=cross_cache)  # memory (B, S, C)
        return self.ff(x)
