"""Attention against independent oracles: torch's SDPA and nn.MultiheadAttention, and explicit
band-masked full attention written out here with the scores of each function from its definition."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from models.attention import (
    SCORES,
    MultiHeadAttention,
    additive_scores,
    dilated_attention,
    full_attention,
    local_attention,
)

ALL_SCORES = ["dot", "dot_unscaled", "general", "cosine", "additive"]


def make_score(name: str, H: int, D: int, budget: int = 1 << 10) -> nn.Module:
    score = SCORES[name](H, D, budget).double()
    with torch.no_grad():  # move learned parameters away from their initial values
        for p in score.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return score


def oracle_scores(name: str, score: nn.Module, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """(B, H, T, S) scores straight from each function's definition (no shared code with the kernels)."""
    D = q.shape[-1]
    if name == "dot":
        return q @ k.transpose(-1, -2) / math.sqrt(D)
    if name == "dot_unscaled":
        return q @ k.transpose(-1, -2)
    if name == "general":
        return torch.einsum("bhtd,hde,bhse->bhts", q, score.weight, k) / math.sqrt(D)
    if name == "cosine":
        tau = score.log_tau.exp().view(1, -1, 1, 1)
        cos = torch.einsum("bhtd,bhsd->bhts", q, k) / (q.norm(dim=-1)[..., :, None] * k.norm(dim=-1)[..., None, :])
        return tau * cos
    if name == "additive":  # v . tanh(q_t + k_s), the whole (B, H, T, S, D) tensor: fine at test sizes
        return torch.einsum("bhtsd,hd->bhts", torch.tanh(q[:, :, :, None, :] + k[:, :, None, :, :]), score.v)
    raise AssertionError(name)


def band_mask(T: int, window: int | None, dilation: int, causal: bool) -> torch.Tensor:
    """(T, T) True where query i may see key j, from the definition of each pattern."""
    allowed = torch.ones(T, T, dtype=torch.bool)
    for i in range(T):
        for j in range(T):
            dist = i - j
            if causal and dist < 0:
                allowed[i, j] = False
            if window is not None and (abs(dist) > window * dilation or dist % dilation != 0):
                allowed[i, j] = False
    return allowed


def oracle_attention(name, score, q, k, v, allowed, key_padding=None, slopes=None, dilation=1):
    s = oracle_scores(name, score, q, k)
    if slopes is not None:
        T = q.shape[-2]
        dist = (torch.arange(T)[:, None] - torch.arange(T)[None, :]).abs().double()
        s = s - slopes.view(1, -1, 1, 1) * dist
    mask = allowed[None, None]
    if key_padding is not None:
        mask = mask & ~key_padding[:, None, None, :]
    return torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1) @ v


def kernel(pattern, score, q, k, v, window=None, dilation=1, **kw):
    q, k = score.prepare(q, k)
    if pattern == "full":
        return full_attention(q, k, v, score, **kw)
    if pattern == "local":
        return local_attention(q, k, v, score, window=window, **kw)
    return dilated_attention(q, k, v, score, window=window, dilation=dilation, **kw)


def random_case(gen: torch.Generator, T: int, B: int = 2, H: int = 2, D: int = 4, padded: bool = True):
    q, k, v = (torch.randn(B, H, T, D, dtype=torch.float64, generator=gen) for _ in range(3))
    pad = torch.zeros(B, T, dtype=torch.bool)
    if padded:
        keep = int(torch.randint(1, T + 1, (), generator=gen))
        pad[1, keep:] = True
    return q, k, v, pad


def assert_close_on_real_queries(out, ref, pad):
    real = (~pad[:, None, :, None]).expand_as(out)  # outputs at padding queries are meaningless by definition
    torch.testing.assert_close(out[real], ref[real], rtol=1e-9, atol=1e-10)


# --- dot product against torch ---------------------------------------------------------------------


@pytest.mark.parametrize("causal", [False, True])
def test_dot_module_equals_sdpa_outputs_and_gradients(causal):
    torch.manual_seed(0)
    B, T, C, H = 2, 9, 16, 4
    mha = MultiHeadAttention(C, H, C // H, score="dot", causal=causal).double()
    x = torch.randn(B, T, C, dtype=torch.float64, requires_grad=True)
    out = mha(x)

    x2 = x.detach().clone().requires_grad_(True)
    q, k, v = F.linear(x2, mha.qkv_proj.weight, mha.qkv_proj.bias).chunk(3, dim=-1)
    q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal).transpose(1, 2).reshape(B, T, C)
    ref = F.linear(ref, mha.out_proj.weight, mha.out_proj.bias)
    torch.testing.assert_close(out, ref)
    g = torch.randn_like(out)
    (ga,) = torch.autograd.grad(out, x, g)
    (gb,) = torch.autograd.grad(ref, x2, g)
    torch.testing.assert_close(ga, gb)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_dot_module_equals_nn_multihead_attention(causal, padded):
    torch.manual_seed(1)
    B, T, C, H = 3, 11, 24, 4
    ours = MultiHeadAttention(C, H, C // H, score="dot", causal=causal).double()
    theirs = nn.MultiheadAttention(C, H, batch_first=True).double()
    with torch.no_grad():
        theirs.in_proj_weight.copy_(ours.qkv_proj.weight)
        theirs.in_proj_bias.copy_(ours.qkv_proj.bias)
        theirs.out_proj.weight.copy_(ours.out_proj.weight)
        theirs.out_proj.bias.copy_(ours.out_proj.bias)
    x = torch.randn(B, T, C, dtype=torch.float64)
    pad = torch.zeros(B, T, dtype=torch.bool)
    if padded:
        pad[1, 7:] = True
        pad[2, 3:] = True
    x1, x2 = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    out = ours(x1, key_padding=pad if padded else None)
    causal_mask = torch.ones(T, T, dtype=torch.bool).triu(1) if causal else None  # True = not allowed
    ref, _ = theirs(x2, x2, x2, key_padding_mask=pad if padded else None, attn_mask=causal_mask, need_weights=False)
    real = ~pad[..., None]
    torch.testing.assert_close(out * real, ref * real)
    g = torch.randn_like(out) * real
    out.backward(g)
    ref.backward(g)
    torch.testing.assert_close(x1.grad, x2.grad)
    torch.testing.assert_close(ours.qkv_proj.weight.grad, theirs.in_proj_weight.grad)
    torch.testing.assert_close(ours.out_proj.weight.grad, theirs.out_proj.weight.grad)


def test_cross_attention_equals_nn_multihead_attention():
    torch.manual_seed(2)
    B, T, S, C, H = 2, 5, 8, 16, 2
    ours = MultiHeadAttention(C, H, C // H, score="dot", cross=True).double()
    theirs = nn.MultiheadAttention(C, H, batch_first=True).double()
    with torch.no_grad():
        theirs.in_proj_weight.copy_(torch.cat([ours.q_proj.weight, ours.kv_proj.weight]))
        theirs.in_proj_bias.copy_(torch.cat([ours.q_proj.bias, ours.kv_proj.bias]))
        theirs.out_proj.weight.copy_(ours.out_proj.weight)
        theirs.out_proj.bias.copy_(ours.out_proj.bias)
    x, mem = torch.randn(B, T, C, dtype=torch.float64), torch.randn(B, S, C, dtype=torch.float64)
    pad = torch.zeros(B, S, dtype=torch.bool)
    pad[0, 6:] = True
    ref, _ = theirs(x, mem, mem, key_padding_mask=pad, need_weights=False)
    torch.testing.assert_close(ours(x, mem, key_padding=pad), ref)


# --- local and dilated against band-masked full attention -------------------------------------------


@pytest.mark.parametrize("name", ALL_SCORES)
@pytest.mark.parametrize("causal", [False, True])
def test_local_and_dilated_equal_band_masked_full_attention(name, causal):
    gen = torch.Generator().manual_seed(ALL_SCORES.index(name) * 2 + causal)
    for trial in range(12):
        T = int(torch.randint(1, 70, (), generator=gen))
        window = int(torch.randint(1, 24, (), generator=gen))
        dilation = int(torch.randint(1, 4, (), generator=gen))
        padded, alibi = trial % 2 == 0, trial % 3 == 0
        score = make_score(name, 2, 4)
        q, k, v, pad = random_case(gen, T, padded=padded)
        slopes = torch.tensor([0.5, 0.125], dtype=torch.float64) if alibi else None
        pattern = "local" if dilation == 1 else "dilated"
        out = kernel(
            pattern, score, q, k, v, window, dilation, causal=causal, key_padding=pad if padded else None, slopes=slopes
        )
        ref = oracle_attention(
            name, score, q, k, v, band_mask(T, window, dilation, causal), pad if padded else None, slopes
        )
        assert torch.isfinite(out).all()
        assert_close_on_real_queries(out, ref, pad)


@pytest.mark.parametrize("block", [1, 3, 8, 64])
def test_local_attention_exact_for_any_tile_size(block):
    """Tiles smaller or larger than the window (the window then spans several tiles) change nothing."""
    gen = torch.Generator().manual_seed(block)
    score = make_score("dot", 2, 4)
    for causal in (False, True):
        q, k, v, pad = random_case(gen, 37)
        out = local_attention(q, k, v, score, window=6, causal=causal, key_padding=pad, block=max(block, 1))
        ref = oracle_attention("dot", score, q, k, v, band_mask(37, 6, 1, causal), pad)
        assert_close_on_real_queries(out, ref, pad)


@pytest.mark.parametrize("name", ALL_SCORES)
def test_window_at_least_length_equals_full_and_dilation_one_equals_local(name):
    gen = torch.Generator().manual_seed(7)
    score = make_score(name, 2, 4)
    for causal in (False, True):
        q, k, v, pad = random_case(gen, 23)
        full = kernel("full", score, q, k, v, causal=causal, key_padding=pad)
        for window in (22, 23, 40):
            assert_close_on_real_queries(
                kernel("local", score, q, k, v, window, causal=causal, key_padding=pad), full, pad
            )
        local = kernel("local", score, q, k, v, 5, causal=causal, key_padding=pad)
        qp, kp = score.prepare(q, k)
        dil1 = dilated_attention(qp, kp, v, score, window=5, dilation=1, causal=causal, key_padding=pad)
        assert_close_on_real_queries(dil1, local, pad)


@pytest.mark.parametrize("name", ALL_SCORES)
@pytest.mark.parametrize("pattern", ["local", "dilated"])
def test_gradcheck_local_and_dilated(name, pattern):
    torch.manual_seed(3)
    score = make_score(name, 2, 3)
    q, k, v = (torch.randn(1, 2, 7, 3, dtype=torch.float64, requires_grad=True) for _ in range(3))
    pad = torch.zeros(1, 7, dtype=torch.bool)
    pad[0, 6] = True

    def f(q, k, v):
        out = kernel(pattern, score, q, k, v, window=2, dilation=2, causal=False, key_padding=pad)
        return out[:, :, :6]  # real queries only

    assert torch.autograd.gradcheck(f, (q, k, v))


def test_additive_scores_match_definition_and_gradcheck_with_tiny_chunks():
    torch.manual_seed(4)
    q = torch.randn(2, 3, 5, 4, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 3, 6, 4, dtype=torch.float64, requires_grad=True)
    v = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    ref = torch.einsum("bhtsd,hd->bhts", torch.tanh(q[:, :, :, None] + k[:, :, None]), v)
    for budget in (1, 7, 24, 1 << 20):  # one (query, key) pair per chunk up to everything at once
        torch.testing.assert_close(additive_scores(q, k, v, budget), ref)
    assert torch.autograd.gradcheck(lambda q, k, v: additive_scores(q, k, v, 13), (q, k, v))


class TensorSizes(TorchDispatchMode):
    """Records the number of elements of every tensor an operation produces."""

    def __init__(self) -> None:
        super().__init__()
        self.sizes: list[int] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.sizes.append(t.numel())
        return out


def test_additive_memory_is_bounded_by_the_chunk_budget():
    """No tensor in forward or backward comes near the whole (B, H, T, S, D) tensor."""
    B, H, T, D = 1, 2, 256, 16
    q, k = torch.randn(B, H, T, D, requires_grad=True), torch.randn(B, H, T, D, requires_grad=True)
    v = torch.randn(H, D, requires_grad=True)
    budget = 1 << 14
    with TensorSizes() as watch:
        additive_scores(q, k, v, budget).sum().backward()
    assert max(watch.sizes) <= max(budget, B * H * T * T)  # the chunk, or the (B, H, T, S) scores
    assert max(watch.sizes) < B * H * T * T * D // 8


@pytest.mark.parametrize("name", ALL_SCORES)
@pytest.mark.parametrize("pattern", ["local", "dilated"])
def test_windowed_attention_never_builds_a_length_squared_tensor(name, pattern):
    B, H, T, D, W = 1, 2, 1024, 8, 8
    score = SCORES[name](H, D, 1 << 16)
    q, k, v = (torch.randn(B, H, T, D, requires_grad=True) for _ in range(3))
    pad = torch.zeros(B, T, dtype=torch.bool)
    pad[0, 1000:] = True
    with TensorSizes() as watch:
        out = kernel(pattern, score, q, k, v, W, 3, causal=False, key_padding=pad)
        out.sum().backward()
    # O(T * W): a generous constant, far below T * T
    assert max(watch.sizes) <= 64 * B * H * T * W * D
    assert max(watch.sizes) < B * H * T * T // 2


# --- reach and causality ---------------------------------------------------------------------------


@pytest.mark.parametrize("pattern,window,dilation", [("local", 3, 1), ("dilated", 2, 3)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("score", ["dot", "additive"])
def test_reach_of_stacked_windows(pattern, window, dilation, causal, score):
    from models.blocks import EncoderLayer
    from models.config import ModelConfig

    torch.manual_seed(5)
    L, T, i = 2, 41, 20
    cfg = ModelConfig(
        arch="decoder",
        d_model=8,
        n_heads=2,
        n_layers=L,
        pattern=pattern,
        window=window,
        dilation=dilation,
        positions="none",
        score=score,
    )
    layers = nn.Sequential(*[EncoderLayer(cfg, pattern, causal=causal) for _ in range(L)]).double()
    x = torch.randn(1, T, 8, dtype=torch.float64, requires_grad=True)
    layers(x)[0, i].sum().backward()
    grad = x.grad[0].abs().sum(-1)  # (T,)
    reach = L * window * dilation
    for j in range(T):
        dist = i - j
        reachable = abs(dist) <= reach and dist % dilation == 0 and (dist >= 0 or not causal)
        if reachable:
            assert grad[j] > 0, f"position {j} (distance {dist}) should influence {i}"
        else:
            assert grad[j] == 0, f"position {j} (distance {dist}) is beyond the reach {reach}"


VALID_COMBINATIONS = [
    (pattern, score, positions)
    for pattern in ("full", "local", "dilated")
    for score in ALL_SCORES
    for positions in ("sinusoidal", "learned", "rotary", "alibi", "none")
    if not (positions == "rotary" and score == "additive")  # refused: see test_config
]


@pytest.mark.parametrize("pattern,score,positions", VALID_COMBINATIONS)
def test_changing_future_tokens_never_changes_earlier_outputs(pattern, score, positions):
    from models import ModelConfig, Transformer

    torch.manual_seed(6)
    cfg = ModelConfig(
        arch="decoder",
        vocab_size=13,
        d_model=16,
        n_heads=2,
        n_layers=2,
        positions=positions,
        score=score,
        pattern=pattern,
        window=None if pattern == "full" else 3,
        dilation=2 if pattern == "dilated" else 1,
    )
    model = Transformer(cfg).double().eval()
    a = torch.randint(1, 13, (2, 19))
    b = a.clone()
    b[:, 11:] = torch.randint(1, 13, (2, 8))
    torch.testing.assert_close(model(a)[:, :11], model(b)[:, :11], rtol=0, atol=1e-12)
    assert not torch.allclose(model(a)[:, 11:], model(b)[:, 11:])
