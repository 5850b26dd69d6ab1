"""Whole layers against PyTorch's own: nn.TransformerEncoderLayer with copied weights, pre and post."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from models.blocks import EncoderLayer
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
