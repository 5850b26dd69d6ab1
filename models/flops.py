"""Estimated floating-point operations per token (Kaplan et al. 2020, section 2.1, extended to our variants).

Forward, per token: 2 * N over the weights the token passes through (each is one multiply-add; embedding
look-ups are free, a tied output projection is not), plus attention: 2 * 2 * context * H * D per layer
(scores, then the weighted sum of values), where context is the number of keys a query sees (about half
the sequence when causal; about the window for local and dilated patterns). Additive scores replace the
multiply-add of q.k (2 operations per query, key and dimension) by add, tanh, multiply and sum (4, counting
tanh as one): 6 per (query, key, dimension) with the weighted sum of values, against 4 for dot products. In encoder_decoder models a
source token passes through the encoder, a target token through the decoder (self- and cross-attention)
and the output projection (a non-autoregressive decoder's self-attention is not causal; Gu et al.'s adds positional
attention over the target). Training costs about three forward passes (backward is twice the forward).
"""

from __future__ import annotations

from torch import nn

from models.config import ModelConfig
from models.registry import PATTERNS


def _params(module: nn.Module | None) -> int:
    return 0 if module is None else sum(p.numel() for p in module.parameters())


def _per_key(cfg: ModelConfig, score: str | None = None) -> float:
    """FLOPs per (query, key) pair of one layer scored by ``score`` (default: the self-attention's)."""
    return (6 if (score or cfg.score) == "additive" else 4) * cfg.n_heads * cfg.head_size


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
            + _attention(
                cfg,
                cfg.attention_layers(cfg.decoder_layers, not cfg.non_autoregressive),
                length,
                not cfg.non_autoregressive,
            )
            # cross-attention sees every source token, with its own score
            + _per_key(cfg, cfg.cross_attention_score) * source_length * cfg.decoder_layers
            # Gu et al.'s positional attention (nat_gu) sees every target position (its q and k projections read the
            # positional encodings, counted in the layers' parameters like every projection)
            + (_per_key(cfg) * length * cfg.decoder_layers if cfg.positional_attention else 0)
        )
        return (source_length * src + length * tgt) / max(source_length + length, 1)
    causal = cfg.arch == "decoder"
    per_token_head = head if cfg.arch == "decoder" or cfg.classifier == "token" else head / max(length, 1)
    return (
        2 * _params(model.layers) + per_token_head + _attention(cfg, cfg.attention_layers(cfg.n_layers), length, causal)
    )


def training_flops_per_token(model: nn.Module, length: int, source_length: int = 0) -> float:
    return 3.0 * forward_flops_per_token(model, length, source_length)


# ---------------------------------------------------------------------------------------------------
# Model FLOPs utilisation: achieved FLOP/s over the device's peak

# Dense peaks (no sparsity) in TFLOP/s from NVIDIA's data sheets, by the precision of the matrix products:
# bf16/fp16 tensor cores, tf32 (fp32 inputs with TF32 matmuls allowed), fp32 (CUDA cores). Patterns are
# matched against torch.cuda.get_device_name() in order (the more specific names first).
PEAK_TFLOPS: tuple[tuple[str, dict[str, float]], ...] = (
    (r"H100.*NVL", {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0}),
    (r"H100.*PCIe", {"bf16": 756.5, "fp16": 756.5, "tf32": 378.0, "fp32": 51.2}),
    (r"H200.*NVL", {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0}),
    (r"GH200|H100|H200", {"bf16": 989.5, "fp16": 989.5, "tf32": 494.5, "fp32": 66.9}),  # SXM
    (r"A100", {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}),
    (r"L40S", {"bf16": 362.05, "fp16": 362.05, "tf32": 183.0, "fp32": 91.6}),
    (r"\bL4\b", {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3}),
    (r"\bA10\b", {"bf16": 125.0, "fp16": 125.0, "tf32": 62.5, "fp32": 31.2}),
    (r"V100", {"fp16": 125.0, "fp32": 15.7}),  # SXM2
)
PEAK_ENV = "ABLATE_PEAK_FLOPS"  # FLOP/s of the device (e.g. 989.5e12): overrides the table


def matmul_precision(precision: str) -> str | None:
    """The kind of matrix product a Lightning precision runs: bf16, fp16, tf32, fp32 (None: fp64)."""
    import torch

    p = str(precision)
    if p.startswith("bf16"):
        return "bf16"
    if p.startswith("16"):
        return "fp16"
    if p.startswith("64"):
        return None
    tf32 = torch.backends.cuda.matmul.allow_tf32 or torch.get_float32_matmul_precision() != "highest"
    return "tf32" if tf32 else "fp32"


def peak_flops_per_s(device, precision: str) -> float | None:
    """The device's peak FLOP/s for the run's precision, where known: ``ABLATE_PEAK_FLOPS``, else the table
    for CUDA devices; None elsewhere (a CPU's peak depends on its vector units and clock: not guessed)."""
    import os
    import re

    import torch

    if os.environ.get(PEAK_ENV):
        try:
            return float(os.environ[PEAK_ENV])
        except ValueError as err:
            raise ValueError(f"{PEAK_ENV}={os.environ[PEAK_ENV]!r} must be a number of FLOP/s, e.g. 989.5e12") from err
    device = torch.device(device)
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    kind = matmul_precision(precision)
    for pattern, peaks in PEAK_TFLOPS:
        if re.search(pattern, name):
            return peaks[kind] * 1e12 if kind in peaks else None
    return None


def utilisation(achieved_flops_per_s: float, device, precision: str) -> dict[str, float]:
    """{"peak_flops_per_s", "mfu"} where the peak is known, else {}."""
    peak = peak_flops_per_s(device, precision)
    if not peak:
        return {}
    return {"peak_flops_per_s": peak, "mfu": achieved_flops_per_s / peak}
