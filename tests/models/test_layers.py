"""Whole layers against PyTorch's own: nn.TransformerEncoderLayer with copied weights, pre and post."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from models.blocks import DecoderLayer, EncoderLayer
from models.config import ModelConfig


def copy_into_torch_layer(ours: EncoderLayer, theirs: nn.TransformerEncoderLayer) -> None:
    attn = ours.attn.sublayer
    norm1 = ours.attn.pre_norm if isinstance(ours.attn.pre_norm, nn.LayerNorm) else ours.attn.post_norm
    norm2 = ours.ff.pre_norm if isinstance(ours.ff.pre_norm, nn.LayerNorm) else ours.ff.post_norm
    pairs = [
        (theirs.self_attn.in_proj_weight, attn.qkv_proj.weight),
        (theirs.self_attn.in_proj_bias, attn.qkv_proj.bias),
        (theirs.self_attn.out_proj.weight, attn.out_proj.weight),
        (theirs.self_attn.out_proj.bias, attn.out_proj.bias),
        (theirs.linear1.weight, ours.ff.sublayer.linear1.weight),
        (theirs.linear1.bias, ours.ff.sublayer.linear1.bias),
        (theirs.linear2.weight, ours.ff.sublayer.linear2.weight),
        (theirs.linear2.bias, ours.ff.sublayer.linear2.bias),
        (theirs.norm1.weight, norm1.weight),
        (theirs.norm1.bias, norm1.bias),
        (theirs.norm2.weight, norm2.weight),
        (theirs.norm2.bias, norm2.bias),
    ]
    with torch.no_grad():
        for dst, src in pairs:
            dst.copy_(src + 0.1 * torch.randn_like(src) if src.dim() == 1 else src)  # non-trivial norms/biases
            src.copy_(dst)


@pytest.mark.parametrize("norm", ["pre", "post"])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("padded", [False, True])
def test_encoder_layer_equals_torch_transformer_encoder_layer(norm, activation, padded):
    torch.manual_seed(0)
    C, H, Fw, B, T = 32, 4, 64, 3, 10
    cfg = ModelConfig(arch="encoder", n_classes=2, d_model=C, n_heads=H, d_ff=Fw, norm=norm, ffn=activation)
    ours = EncoderLayer(cfg, "full").double()
    theirs = nn.TransformerEncoderLayer(
        C, H, Fw, dropout=0.0, activation=activation, batch_first=True, norm_first=norm == "pre"
    ).double()
    copy_into_torch_layer(ours, theirs)
    x = torch.randn(B, T, C, dtype=torch.float64)
    pad = torch.zeros(B, T, dtype=torch.bool)
    if padded:
        pad[0, 6:] = True
        pad[2, 2:] = True
    x1, x2 = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    out = ours(x1, key_padding=pad if padded else None)
    ref = theirs(x2, src_key_padding_mask=pad if padded else None)
    real = ~pad[..., None]
    torch.testing.assert_close(out * real, ref * real)
    g = torch.randn_like(out) * real
    out.backward(g)
    ref.backward(g)
    torch.testing.assert_close(x1.grad, x2.grad)
    torch.testing.assert_close(ours.ff.sublayer.linear1.weight.grad, theirs.linear1.weight.grad)
    torch.testing.assert_close(ours.attn.sublayer.qkv_proj.weight.grad, theirs.self_attn.in_proj_weight.grad)


def test_norm_slots_follow_the_placement():
    pre = EncoderLayer(ModelConfig(norm="pre"), "full")
    post = EncoderLayer(ModelConfig(norm="post"), "full")
    assert isinstance(pre.attn.pre_norm, nn.LayerNorm) and isinstance(pre.attn.post_norm, nn.Identity)
    assert isinstance(post.attn.post_norm, nn.LayerNorm) and isinstance(post.attn.pre_norm, nn.Identity)
    rms = EncoderLayer(ModelConfig(norm="pre", norm_type="rmsnorm"), "full")
    assert isinstance(rms.ff.pre_norm, nn.RMSNorm)


def test_rmsnorm_matches_its_definition():
    torch.manual_seed(1)
    layer = EncoderLayer(ModelConfig(norm="pre", norm_type="rmsnorm", norm_eps=1e-6), "full").double()
    norm = layer.attn.pre_norm
    with torch.no_grad():
        norm.weight.normal_()
    x = torch.randn(2, 5, 128, dtype=torch.float64)
    ref = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * norm.weight
    torch.testing.assert_close(norm(x), ref)


def test_swiglu_matches_its_definition():
    torch.manual_seed(2)
    cfg = ModelConfig(ffn="swiglu", d_model=16, d_ff=24, n_heads=2)
    ff = EncoderLayer(cfg, "full").ff.sublayer.double()
    x = torch.randn(3, 16, dtype=torch.float64)
    w1, b1 = ff.linear1.weight, ff.linear1.bias
    a = x @ w1[:24].T + b1[:24]
    b = x @ w1[24:].T + b1[24:]
    ref = (a * torch.sigmoid(a) * b) @ ff.linear2.weight.T + ff.linear2.bias
    torch.testing.assert_close(ff(x), ref)


def copy_into_torch_decoder_layer(ours: DecoderLayer, theirs: nn.TransformerDecoderLayer) -> None:
    """Our weights into PyTorch's layer (norms and biases made non-trivial first, then shared)."""

    def norm(residual):
        return residual.pre_norm if isinstance(residual.pre_norm, nn.LayerNorm) else residual.post_norm

    attn, cross, ff = ours.attn.sublayer, ours.cross.sublayer, ours.ff.sublayer
    pairs = [
        (theirs.self_attn.in_proj_weight, attn.qkv_proj.weight),
        (theirs.self_attn.in_proj_bias, attn.qkv_proj.bias),
        (theirs.self_attn.out_proj.weight, attn.out_proj.weight),
        (theirs.self_attn.out_proj.bias, attn.out_proj.bias),
        (theirs.multihead_attn.out_proj.weight, cross.out_proj.weight),
        (theirs.multihead_attn.out_proj.bias, cross.out_proj.bias),
        (theirs.linear1.weight, ff.linear1.weight),
        (theirs.linear1.bias, ff.linear1.bias),
        (theirs.linear2.weight, ff.linear2.weight),
        (theirs.linear2.bias, ff.linear2.bias),
    ]
    for i, residual in enumerate((ours.attn, ours.cross, ours.ff), start=1):
        theirs_norm = getattr(theirs, f"norm{i}")
        pairs += [(theirs_norm.weight, norm(residual).weight), (theirs_norm.bias, norm(residual).bias)]
    with torch.no_grad():
        for dst, src in pairs:
            dst.copy_(src + 0.1 * torch.randn_like(src) if src.dim() == 1 else src)
            src.copy_(dst)
        # PyTorch packs the cross-attention's q, k, v projections in one matrix; ours has q and kv apart
        theirs.multihead_attn.in_proj_weight.copy_(torch.cat([cross.q_proj.weight, cross.kv_proj.weight]))
        bias = torch.cat([cross.q_proj.bias, cross.kv_proj.bias]) + 0.1 * torch.randn(3 * cross.q_proj.bias.shape[0])
        theirs.multihead_attn.in_proj_bias.copy_(bias)
        n = cross.q_proj.bias.shape[0]
        cross.q_proj.bias.copy_(bias[:n])
        cross.kv_proj.bias.copy_(bias[n:])


@pytest.mark.parametrize("norm", ["pre", "post"])
@pytest.mark.parametrize("padded", [False, True])
def test_decoder_layer_equals_torch_transformer_decoder_layer(norm, padded):
    """Vaswani et al.'s decoder layer (post-norm) and its pre-norm variant (Xiong et al. 2020), against
    nn.TransformerDecoderLayer(norm_first=...) with copied weights: causal self-attention, cross-attention
    over a padded memory, feed-forward; outputs and gradients."""
    torch.manual_seed(3)
    C, H, Fw, B, T, S = 32, 4, 64, 3, 7, 9
    cfg = ModelConfig(arch="encoder_decoder", d_model=C, n_heads=H, d_ff=Fw, norm=norm)
    ours = DecoderLayer(cfg, "full").double()
    theirs = nn.TransformerDecoderLayer(C, H, Fw, dropout=0.0, batch_first=True, norm_first=norm == "pre").double()
    copy_into_torch_decoder_layer(ours, theirs)
    x, memory = torch.randn(B, T, C, dtype=torch.float64), torch.randn(B, S, C, dtype=torch.float64)
    mem_pad = torch.zeros(B, S, dtype=torch.bool)
    if padded:
        mem_pad[0, 5:] = True
        mem_pad[2, 2:] = True
    x1, x2 = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    m1, m2 = memory.clone().requires_grad_(True), memory.clone().requires_grad_(True)
    out = ours(x1, m1, memory_padding=mem_pad if padded else None)
    causal = nn.Transformer.generate_square_subsequent_mask(T, dtype=torch.float64)
    ref = theirs(x2, m2, tgt_mask=causal, tgt_is_causal=True, memory_key_padding_mask=mem_pad if padded else None)
    torch.testing.assert_close(out, ref)
    g = torch.randn_like(out)
    out.backward(g)
    ref.backward(g)
    torch.testing.assert_close(x1.grad, x2.grad)
    torch.testing.assert_close(m1.grad, m2.grad)
    torch.testing.assert_close(ours.cross.sublayer.out_proj.weight.grad, theirs.multihead_attn.out_proj.weight.grad)
    torch.testing.assert_close(ours.attn.sublayer.qkv_proj.weight.grad, theirs.self_attn.in_proj_weight.grad)
