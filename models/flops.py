"""Estimated floating-point operations per token (Kaplan et al. 2020, section 2.1, extended to our variants).

Forward, per token: 2 * N over the weights the token passes through (each is one multiply-add; embedding
look-ups are free, a tied output projection is not), plus attention: 2 * 2 * context * H * D per layer
(scores, then the weighted sum of values), where context is the number of keys a query sees (about half
the sequence when causal; about the window for local and dilated patterns). Additive scores cost about
4 more operations per (query, key, dimension): add, tanh, multiply, sum. In encoder_decoder models a
source token passes through the encoder, a target token through the decoder (self- and cross-attention)
and the output projection (a non-autoregressive decoder's self-attention is not causal). Training costs about three forward passes (backward is twice the forward).
"""

from __future__ import annotations

from torch import nn

from models.config import ModelConfig
from models.registry import PATTERNS


def _params(module: nn.Module | None) -> int:
    return 0 if module is None else sum(p.numel() for p in module.parameters())


def _per_key(cfg: ModelConfig) -> float:
    return 4 * cfg.n_heads * cfg.head_size * (2 if cfg.score == "additive" else 1)


def _attention(cfg: ModelConfig, layers, length: int, causal: bool) -> float:
    """Attention FLOPs per query token over a stack: each layer's pattern says how many keys a query sees
    (dilation spaces a window's keys out but does not add any)."""
    return sum(_per_key(cfg) * PATTERNS[la.pattern](la).context(length, causal) for la in layers)


def forward_flops_per_token(model: nn.Module, length: int, source_length: int = 0) -> float:
    """Forward FLOPs per processed token (source and target tokens alike) of a ``Transformer``."""
    cfg: ModelConfig = model.cfg
    head = 2 * _params(model.head)
    if cfg.arch == "encoder_decoder":
        src = 2 * _params(model.layers) + _attention(cfg, cfg.attention_layers(cfg.n_layers), source_length, False)
        tgt = (
            2 * _params(model.dec_layers)
            + head
            + _attention(cfg, cfg.attention_layers(cfg.decoder_layers), length, not cfg.non_autoregressive)
            + _per_key(cfg) * source_length * cfg.decoder_layers  # cross-attention sees every source token
        )
        return (source_length * src + length * tgt) / max(source_length + length, 1)
    causal = cfg.arch == "decoder"
    per_token_head = head if cfg.arch == "decoder" or cfg.classifier == "token" else head / max(length, 1)
    return (
        2 * _params(model.layers) + per_token_head + _attention(cfg, cfg.attention_layers(cfg.n_layers), length, causal)
    )


def training_flops_per_token(model: nn.Module, length: int, source_length: int = 0) -> float:
    return 3.0 * forward_flops_per_token(model, length, source_length)
