"""Dropout on every path, checked statistically against its definition (Srivastava et al. 2014: each unit is
zeroed with probability p and the survivors scaled by 1 / (1 - p)), and the initialisation of every
parameter group against its distribution (scipy.stats)."""

from __future__ import annotations

import math
import re

import pytest
import torch
from scipy import stats
from torch import nn

from models import ModelConfig, Transformer
from models.attention import SCORES, full_attention
from models.config import LayerAttention
from models.patterns import DilatedPattern

P = 0.3


def check_dropped(kept: torch.Tensor, dropped: torch.Tensor, p: float) -> None:
    """``dropped`` is ``kept`` with each entry zeroed with probability p, the rest divided by 1 - p."""
    live = kept.abs() > 1e-12
    zero = live & (dropped == 0)
    n, k = int(live.sum()), int(zero.sum())
    assert n > 1000
    assert stats.binomtest(k, n, p).pvalue > 1e-4, f"{k} of {n} zeroed, expected p = {p}"
    survivors = live & ~zero
    torch.testing.assert_close(dropped[survivors], kept[survivors] / (1 - p), rtol=1e-6, atol=1e-9)


ATTENTION_PATHS = {
    "full dot (fused kernel)": ("full", "dot"),
    "full additive": ("full", "additive"),
    "local tiles": ("tiles", "dot"),
    "local tiles additive": ("tiles", "additive"),
    "local band mask": ("band", "dot"),
    "dilated heads": ("dilated", "dot"),
}


@pytest.mark.parametrize("path", ATTENTION_PATHS)
@pytest.mark.parametrize("causal", [False, True])
def test_attention_dropout_on_every_kernel_path(path, causal):
    """With values = the identity, the output of attention is its probability matrix: dropout must zero a
    fraction p of the probabilities and scale the rest by 1 / (1 - p)."""
    kind, score_name = ATTENTION_PATHS[path]
    torch.manual_seed(0)
    B, H, T = 2, 4, 130 if kind != "band" else 40
    score = SCORES[score_name](H, 8)
    q, k = torch.randn(B, H, T, 8, dtype=torch.float64), torch.randn(B, H, T, 8, dtype=torch.float64)
    v = torch.eye(T, dtype=torch.float64).expand(B, H, T, T)  # out = probabilities
    pad = torch.zeros(B, T, dtype=torch.bool)
    pad[1, -7:] = True
    if kind == "full":
        run = lambda p: full_attention(q, k, v, score, causal=causal, key_padding=pad, dropout_p=p)  # noqa: E731
    elif kind == "dilated":
        pattern = DilatedPattern(LayerAttention("dilated", 4, (1, 1, 2, 3)))
        run = lambda p: pattern.attend(q, k, v, score, causal=causal, key_padding=pad, dropout_p=p)  # noqa: E731
    else:
        from models.attention import local_attention

        block = {"block": 8} if kind == "tiles" else {}
        run = lambda p: local_attention(q, k, v, score, window=6, causal=causal, key_padding=pad, dropout_p=p, **block)  # noqa: E731
    kept = run(0.0)
    dropped = run(P)
    real = ~pad[:, None, :, None]  # rows of padding queries are meaningless
    check_dropped(kept * real, dropped * real, P)


def test_attention_dropout_through_the_module_and_cross_attention():
    """The module applies attn_dropout in training only, to self- and cross-attention (a zeroed probability
    changes the output; eval mode is deterministic)."""
    torch.manual_seed(1)
    model = Transformer(ModelConfig(arch="encoder_decoder", vocab_size=11, d_model=16, n_heads=2, attn_dropout=0.5))
    src, tgt = torch.randint(1, 11, (2, 6)), torch.randint(1, 11, (2, 5))
    model.eval()
    torch.testing.assert_close(model(src, tgt), model(src, tgt))
    model.train()
    seen = {}

    def record(name):
        def hook(module, inputs, output):
            seen[name] = module._p()

        return hook

    for name, module in model.attention_modules():
        module.register_forward_hook(record(name))
    assert not torch.allclose(model(src, tgt), model(src, tgt))
    assert seen == {n: 0.5 for n, _ in model.attention_modules()}


def test_residual_feed_forward_and_embedding_dropout_on_every_path():
    """Every nn.Dropout of the model (embeddings; after self-attention, cross-attention and feed-forward; inside
    the feed-forward network) runs in training and drops as defined."""
    torch.manual_seed(2)
    cfg = ModelConfig(arch="encoder_decoder", vocab_size=11, d_model=64, n_heads=2, dropout=P, emb_dropout=P)
    model = Transformer(cfg).double().train()
    calls: dict[str, list] = {}
    for name, module in model.named_modules():
        if isinstance(module, nn.Dropout):
            assert module.p == P, name
            module.register_forward_hook(lambda m, i, o, name=name: calls.setdefault(name, []).append((i[0], o)))
    model(torch.randint(1, 11, (8, 40)), torch.randint(1, 11, (8, 30)))
    expected = {"emb_dropout"}
    for stack, subs in (("layers", ("attn", "ff")), ("dec_layers", ("attn", "cross", "ff"))):
        for i in range(2):
            expected |= {f"{stack}.{i}.{s}.dropout" for s in subs} | {f"{stack}.{i}.ff.sublayer.dropout"}
    assert set(calls) == expected
    for seen in calls.values():
        kept = torch.cat([i.flatten() for i, _ in seen])
        dropped = torch.cat([o.flatten() for _, o in seen])
        check_dropped(kept, dropped, P)


# --- initialisation --------------------------------------------------------------------------------


def normal(std: float):
    def check(name: str, p: torch.Tensor) -> None:
        assert stats.kstest((p.detach().flatten() / std).numpy(), "norm").pvalue > 1e-3, name

    return check


def xavier(name: str, p: torch.Tensor, layers: int = 1) -> None:
    """Glorot and Bengio (2010): U(-a, a) with a = sqrt(6 / (fan_in + fan_out)) of each layer; ``layers``
    projections fused along the outputs (q, k and v: 3) are each a layer (drawn over the fused (3C, C) shape,
    self-attention's q started at 0.71x the scale of cross-attention's)."""
    for block in p.detach().chunk(layers, dim=0):
        fan_out, fan_in = block.shape
        a = math.sqrt(6 / (fan_in + fan_out))
        x = block.flatten().numpy()
        assert abs(x).max() <= a, name
        assert stats.kstest(x, "uniform", args=(-a, 2 * a)).pvalue > 1e-3, name


def fused_xavier(layers: int):
    return lambda name, p: xavier(name, p, layers)


def per_head_xavier(name: str, p: torch.Tensor) -> None:
    """(H, D, D): each head's map a layer of its own (the additive score's W_a over the states themselves)."""
    for h, block in enumerate(p.detach()):
        xavier(f"{name}[{h}]", block)


def constant(value: float):
    def check(name: str, p: torch.Tensor) -> None:
        assert torch.equal(p.detach(), torch.full_like(p, value)), name

    return check


def rules(cfg: ModelConfig) -> list[tuple[str, object]]:
    d, D = cfg.d_model, cfg.head_size
    pos_std = cfg.position_init_std if cfg.position_init_std is not None else (1.0 if cfg.scale_embeddings else d**-0.5)
    scale = d**0.5 if cfg.scale_embeddings else 1.0  # learned positions are stored like the token embeddings
    return [
        (r"(tgt_)?embed\.weight", normal(d**-0.5)),  # times sqrt(d) when used: RMS 1
        (r"mask_embed", normal(d**-0.5)),
        (r"positions\.table\.weight", normal(pos_std / scale)),  # times sqrt(d) when used
        (r".*qkv_proj\.weight", fused_xavier(3)),
        (r".*kv_proj\.weight", fused_xavier(2)),
        (r".*ff\.sublayer\.linear1\.weight", fused_xavier(2 if cfg.ffn == "swiglu" else 1)),  # SwiGLU: gate, value
        (r".*(proj|linear1|linear2)\.weight|head\.weight|length_head\.weight", xavier),
        (r".*\.bias", constant(0.0)),
        (r".*norm\.weight", constant(1.0)),
        (r".*score\.delta", constant(0.0)),  # general: W = I + delta starts at the identity
        (r".*score\.log_tau", constant(math.log(10.0))),  # cosine: tau = 10
        (r".*score\.v", normal(D**-0.5)),  # additive: v ~ N(0, 1/D)
        (r".*score\.w_[qk]", per_head_xavier),  # additive over the states (Luong's concat): its own W_a
    ]


MODELS = [
    dict(arch="encoder_decoder", decoding="mask_predict", score="general", positions="learned", tgt_vocab_size=50),
    dict(arch="encoder_decoder", decoding="nat_gu"),  # Gu et al.'s positional attention: its own projections
    dict(arch="decoder", score="cosine", norm_type="rmsnorm", ffn="swiglu", norm="post"),
    dict(arch="decoder", score="additive", positions="alibi", pattern="dilated", window=4, dilation=2),
    dict(arch="encoder", n_classes=5, positions="learned", scale_embeddings=False),
    dict(arch="encoder", n_classes=5, positions="learned", position_init_std=0.02),
    dict(arch="encoder_decoder", score="additive", qk_projections=False, n_heads=1),
]


@pytest.mark.parametrize("keys", MODELS, ids=[k["arch"] + "-" + str(i) for i, k in enumerate(MODELS)])
def test_every_parameter_group_starts_as_documented(keys):
    torch.manual_seed(3)
    table = {"max_len": 256} if keys.get("positions") == "learned" else {}  # a table of 256 positions to draw
    cfg = ModelConfig(**{"vocab_size": 300, "d_model": 64, "n_heads": 4, "n_layers": 2, **table, **keys})
    model = Transformer(cfg)
    table = rules(cfg)
    for name, p in model.named_parameters():
        matched = [check for pattern, check in table if re.fullmatch(pattern, name)]
        assert matched, f"{name}: no documented initialisation"
        matched[0](name, p)
