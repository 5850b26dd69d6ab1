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

from models.attention import KVCache, MultiHeadAttention
from models.config import ModelConfig

NORMS = {
    "layernorm": lambda d, eps: nn.LayerNorm(d, eps=eps),
    "rmsnorm": lambda d, eps: nn.RMSNorm(d, eps=eps),
}


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
        self.linear1 = nn.Linear(d_model, 2 * d_ff, bias=bias)
        self.linear2 = nn.Linear(d_ff, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.linear1(x).chunk(2, dim=-1)
        return self.linear2(self.dropout(F.silu(a) * b))


FEED_FORWARDS = {
    "relu": lambda c: FeedForward(c.d_model, c.ff_size, "relu", c.dropout, c.bias),
    "gelu": lambda c: FeedForward(c.d_model, c.ff_size, "gelu", c.dropout, c.bias),
    "swiglu": lambda c: SwiGLU(c.d_model, c.ff_size, c.dropout, c.bias),
}


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


def self_attention(cfg: ModelConfig, pattern: str, causal: bool) -> MultiHeadAttention:
    return MultiHeadAttention(
        cfg.d_model,
        cfg.n_heads,
        cfg.head_size,
        score=cfg.score,
        pattern=pattern,
        window=cfg.window,
        dilation=cfg.dilation,
        causal=causal,
        positions=cfg.positions,
        rotary_base=cfg.rotary_base,
        dropout=cfg.attn_dropout,
        bias=cfg.bias,
        chunk_elements=cfg.chunk_elements,
    )


def cross_attention(cfg: ModelConfig) -> MultiHeadAttention:
    return MultiHeadAttention(
        cfg.d_model,
        cfg.n_heads,
        cfg.head_size,
        score=cfg.score,
        cross=True,
        dropout=cfg.attn_dropout,
        bias=cfg.bias,
        chunk_elements=cfg.chunk_elements,
    )


class EncoderLayer(nn.Module):
    """Self-attention (causal for a decoder-only model) then feed-forward."""

    def __init__(self, cfg: ModelConfig, pattern: str, causal: bool = False) -> None:
        super().__init__()
        self.attn = Residual(cfg, self_attention(cfg, pattern, causal))
        self.ff = Residual(cfg, FEED_FORWARDS[cfg.ffn](cfg))

    def forward(self, x, *, key_padding=None, start: int = 0, cache: KVCache | None = None):  # x (B, T, C)
        x = self.attn(x, key_padding=key_padding, start=start, cache=cache)
        return self.ff(x)


class DecoderLayer(nn.Module):
    """Causal self-attention, cross-attention over the encoder memory, feed-forward."""

    def __init__(self, cfg: ModelConfig, pattern: str) -> None:
        super().__init__()
        self.attn = Residual(cfg, self_attention(cfg, pattern, causal=True))
        self.cross = Residual(cfg, cross_attention(cfg))
        self.ff = Residual(cfg, FEED_FORWARDS[cfg.ffn](cfg))

    def forward(self, x, memory, *, memory_padding=None, key_padding=None, start: int = 0, cache=None):
        self_cache, cross_cache = cache if cache is not None else (None, None)
        x = self.attn(x, key_padding=key_padding, start=start, cache=self_cache)  # x (B, T, C)
        x = self.cross(x, memory, key_padding=memory_padding, cache=cross_cache)  # memory (B, S, C)
        return self.ff(x)
