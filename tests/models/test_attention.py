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
    dist = torch.arange(T)[:, None] - torch.arange(T)[None, :]  # i - j
    allowed = torch.ones(T, T, dtype=torch.bool)
    if causal:
        allowed &= dist >= 0
    if window is not None:
        allowed &= (dist.abs() <= window * dilation) & (dist % dilation == 0)
    return allowed


PAST = torch.tensor([0.5, 0.125], dtype=torch.float64)
FUTURE = torch.tensor([0.25, 0.0625], dtype=torch.float64)


def asymmetric_bias(dist: torch.Tensor) -> torch.Tensor:
    """An ALiBi-like bias with its own slopes for past (dist >= 0) and future keys: (H, ...)."""
    d = dist.double()
    shape = (-1,) + (1,) * dist.dim()
    return torch.where(dist >= 0, -PAST.view(shape) * d, FUTURE.view(shape) * d)


def oracle_attention(name, score, q, k, v, allowed, key_padding=None, alibi=False):
    s = oracle_scores(name, score, q, k)
    if alibi:  # written out per (i, j), apart from the kernels' vectorised bias
        T = q.shape[-2]
        bias = torch.zeros(2, T, T, dtype=torch.float64)
        for i in range(T):
            for j in range(T):
                bias[:, i, j] = -PAST * (i - j) if j <= i else -FUTURE * (j - i)
        s = s + bias[None]
    mask = allowed[None, None]
    if key_padding is not None:
        mask = mask & ~key_padding[:, None, None, :]
    return torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1) @ v


def kernel(pattern, score, q, k, v, window=None, dilation=1, **kw):
    q, k = score.prepare(q, k)
    if pattern == "full":
        kw.pop("block", None)
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


# --- Luong et al. (2015): scores over states that are not separately projected ----------------------


def perturbed(module: nn.Module) -> nn.Module:
    with torch.no_grad():  # every score parameter off its start (general: W = I)
        for name, p in module.named_parameters():
            if name.startswith("score."):
                p.add_(0.3 * torch.randn_like(p))
    return module


def block_diagonal(blocks: torch.Tensor) -> torch.Tensor:
    return torch.block_diag(*blocks.unbind(0))


@pytest.mark.parametrize("name", ["dot", "general", "additive"])
@pytest.mark.parametrize("cross", [False, True])
def test_luong_scores_over_states_equal_their_definitions(name, cross):
    """Luong et al. (2015, section 3.1) score a decoder state h_t against encoder states h_s themselves: dot
    h_t . h_s (no parameter), general h_t^T W_a h_s (one matrix), concat v_a^T tanh(W_a [h_t; h_s]). With
    qk_projections false each head scores its slice of the states so (scaled by 1/sqrt(D) like dot); self-attention
    projects its values, cross-attention takes the source states themselves (Luong's c_t = sum_s a_t(s) h_s). dot
    and general against torch's nn.MultiheadAttention whose query and key projections are the identity (general:
    the query's is W_h^T, block by block), and so is the value's in cross-attention; concat written out."""
    torch.manual_seed(5)
    B, T, S, C, H = 2, 5, 7 if cross else 5, 16, 2
    D = C // H
    ours = perturbed(MultiHeadAttention(C, H, D, score=name, cross=cross, qk_projections=False).double())
    assert not hasattr(ours, "qkv_proj") and not hasattr(ours, "q_proj") and not hasattr(ours, "kv_proj")
    x = torch.randn(B, T, C, dtype=torch.float64)
    mem = torch.randn(B, S, C, dtype=torch.float64) if cross else x
    got = ours(x, mem) if cross else ours(x)
    eye = torch.eye(C, dtype=torch.float64)
    assert hasattr(ours, "v_proj") != cross
    w_v, b_v = (eye, torch.zeros(C, dtype=torch.float64)) if cross else (ours.v_proj.weight, ours.v_proj.bias)
    if name == "additive":  # concat: v_h . tanh(x_t^h W1_h + x_s^h W2_h), over each head's slice
        sc = ours.score
        q = torch.einsum("bthd,hde->bhte", x.view(B, T, H, D), sc.w_q)
        k = torch.einsum("bshd,hde->bhse", mem.view(B, S, H, D), sc.w_k)
        s = torch.einsum("bhtse,he->bhts", torch.tanh(q[:, :, :, None] + k[:, :, None]), sc.v)
        v = F.linear(mem, w_v, b_v).view(B, S, H, D).transpose(1, 2)
        out = (torch.softmax(s, -1) @ v).transpose(1, 2).reshape(B, T, C)
        want = F.linear(out, ours.out_proj.weight, ours.out_proj.bias)
    else:
        theirs = nn.MultiheadAttention(C, H, batch_first=True).double()
        query = eye if name == "dot" else block_diagonal(ours.score.weight.transpose(1, 2))
        with torch.no_grad():
            theirs.in_proj_weight.copy_(torch.cat([query, eye, w_v]))
            theirs.in_proj_bias.copy_(torch.cat([torch.zeros(2 * C, dtype=torch.float64), b_v]))
            theirs.out_proj.weight.copy_(ours.out_proj.weight)
            theirs.out_proj.bias.copy_(ours.out_proj.bias)
        want, _ = theirs(x, mem, mem, need_weights=False)
    torch.testing.assert_close(got, want)


def test_general_equals_dot_when_q_and_k_are_projected_and_not_over_states():
    """With q and k projected, q^T W_h k = (W_h^T W_q x)^T (W_k x): a dot model whose query projection absorbs
    W_h gives the same outputs (what a study of general against dot measured there was only over-
    parameterisation). Over the states themselves dot has no parameter to absorb W_h: the two differ."""
    torch.manual_seed(6)
    C, H = 16, 2
    D = C // H
    x = torch.randn(2, 6, C, dtype=torch.float64)
    general = perturbed(MultiHeadAttention(C, H, D, score="general").double())
    dot = MultiHeadAttention(C, H, D, score="dot").double()
    dot.load_state_dict({k: v for k, v in general.state_dict().items() if not k.startswith("score.")})
    W = general.score.weight  # (H, D, D)
    with torch.no_grad():  # q_h W_h = x (W_q,h^T W_h): rows of head h of the query projection become W_h^T W_q,h
        fold = block_diagonal(W.transpose(1, 2))
        dot.qkv_proj.weight[:C] = fold @ general.qkv_proj.weight[:C]
        dot.qkv_proj.bias[:C] = fold @ general.qkv_proj.bias[:C]
    torch.testing.assert_close(dot(x), general(x), rtol=1e-12, atol=1e-12)

    general_states = perturbed(MultiHeadAttention(C, H, D, score="general", qk_projections=False).double())
    dot_states = MultiHeadAttention(C, H, D, score="dot", qk_projections=False).double()
    dot_states.load_state_dict({k: v for k, v in general_states.state_dict().items() if not k.startswith("score.")})
    assert not any(n.startswith("score.") for n, _ in dot_states.named_parameters())  # Luong's dot: no parameter
    assert (dot_states(x) - general_states(x)).abs().max() > 1e-2


def luong_energy(name: str, score: nn.Module, h: int, h_t: torch.Tensor, h_s: torch.Tensor) -> torch.Tensor:
    """score(h_t, h_s) (S,) of one head h, from Luong et al. (2015, section 3.1)'s formulas and the weights: h_t (D,)
    the target state, h_s (S, D) the source states, D the head's width (its slice of d_model)."""
    D = h_t.shape[0]
    if name == "dot_unscaled":  # Luong's dot: h_t . h_s
        return h_s @ h_t
    if name == "dot":  # h_t . h_s / sqrt(D)
        return h_s @ h_t / math.sqrt(D)
    if name == "general":  # h_t^T W_a h_s / sqrt(D), W_a = I + delta
        W_a = torch.eye(D, dtype=h_t.dtype) + score.delta[h]
        return torch.stack([h_t @ W_a @ h_s[j] for j in range(h_s.shape[0])]) / math.sqrt(D)
    if name == "additive":  # concat: v_a . tanh(W_a [h_t; h_s]), W_a = [W_1, W_2], W_1 = w_q^T, W_2 = w_k^T
        W_a = torch.cat([score.w_q[h].T, score.w_k[h].T], dim=1)  # (D, 2D)
        return torch.stack([score.v[h] @ torch.tanh(W_a @ torch.cat([h_t, h_s[j]])) for j in range(h_s.shape[0])])
    if name == "cosine":  # tau cos(h_t, h_s), tau = exp(log_tau) <= 100
        tau = min(math.exp(score.log_tau[h].item()), 100.0)
        return torch.stack([tau * (h_t @ h_s[j]) / (h_t.norm() * h_s[j].norm()) for j in range(h_s.shape[0])])
    raise AssertionError(name)


@pytest.mark.parametrize("name", ["dot", "dot_unscaled", "general", "additive", "cosine"])
@pytest.mark.parametrize("n_heads", [1, 2])
def test_cross_attention_over_the_states_equals_luongs_formulas_in_an_encoder_decoder(name, n_heads):
    """Luong et al.'s setting in a whole encoder-decoder (cross_score, cross_qk_projections false): every decoder
    layer's cross-attention sub-layer, caught in the model's forward, equals the paper's attention written out per
    target position, from the weights: a_t(s) = softmax over the real source positions of score(h_t, h_s), the
    context c_t = sum_s a_t(s) h_s (the source states themselves), and the sub-layer's output W_o c_t + b_o (the c_t
    half of Luong's W_c; the residual adds h_t). h_t is what enters the sub-layer (after its norm), h_s the encoder's
    output; with n_heads 2 each head does so over its half of the states. The self-attentions keep their
    projected dot."""
    from models import ModelConfig, Transformer

    torch.manual_seed(7)
    C = 16
    cfg = ModelConfig(
        arch="encoder_decoder", vocab_size=19, d_model=C, n_heads=n_heads, n_layers=2, d_ff=32, cross_score=name,
        cross_qk_projections=False,
    )  # fmt: skip
    model = Transformer(cfg).double().eval()
    with torch.no_grad():  # every score parameter off its start, in the cross-attentions too
        for n, p in model.named_parameters():
            if ".score." in n:
                p.add_(0.3 * torch.randn_like(p))
    for layer in model.dec_layers:
        cross, own = layer.cross.sublayer, layer.attn.sublayer
        assert not any(hasattr(cross, a) for a in ("q_proj", "kv_proj", "qkv_proj", "v_proj"))
        assert hasattr(own, "qkv_proj") and own.score.__class__.__name__ == "DotScore"
    seen = {}

    def catch(i):
        def hook(module, args, kwargs, out) -> None:  # its input h_t, the memory h_s, its output
            seen.setdefault(i, (args[0], args[1], out))

        return hook

    for i, layer in enumerate(model.dec_layers):
        layer.cross.sublayer.register_forward_hook(catch(i), with_kwargs=True)
    src, tgt = torch.randint(1, 19, (2, 7)), torch.randint(1, 19, (2, 5))
    pad = torch.zeros(2, 7, dtype=torch.bool)
    pad[1, 4:] = True
    with torch.no_grad():
        model(src, tgt, padding=pad)
        memory = model.encode(src, pad)
    D = C // n_heads
    for i, layer in enumerate(model.dec_layers):
        x, h_s, got = seen[i]
        torch.testing.assert_close(h_s, memory, rtol=0, atol=0)
        sub = layer.cross.sublayer
        want = torch.zeros_like(got)
        for b in range(2):
            real = ~pad[b]
            for t in range(tgt.shape[1]):
                context = []
                for h in range(n_heads):
                    cols = slice(h * D, (h + 1) * D)
                    source = h_s[b, real, cols]  # (S, D)
                    a = torch.softmax(luong_energy(name, sub.score, h, x[b, t, cols], source), dim=0)
                    context.append(a @ source)
                want[b, t] = sub.out_proj.weight @ torch.cat(context) + sub.out_proj.bias
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_cross_keys_leave_the_self_attentions_as_they_were():
    """cross_score and cross_qk_projections change the cross-attention only: every parameter outside it has the same
    name and shape as in the model without them, and with those parameters the encoder's output and each decoder layer's self-attention and feed-forward sub-layers give
    the same outputs, to the last bit. The cross-attentions differ."""
    from models import ModelConfig, Transformer

    base = dict(arch="encoder_decoder", vocab_size=17, d_model=16, n_heads=2, n_layers=2, d_ff=32, score="general")

    def outside(model):
        return {n: p for n, p in model.named_parameters() if ".cross." not in n}

    plain = Transformer(ModelConfig(**base)).double().eval()
    src, x = torch.randint(1, 17, (2, 7)), torch.randn(2, 5, 16, dtype=torch.float64)
    for keys in (
        {"cross_score": "additive", "cross_qk_projections": False},
        {"cross_qk_projections": False},
        {"cross_score": "dot"},
    ):
        luong = Transformer(ModelConfig(**base, **keys)).double().eval()
        assert {n: p.shape for n, p in outside(luong).items()} == {n: p.shape for n, p in outside(plain).items()}
        state = luong.state_dict()
        state.update({k: v for k, v in plain.state_dict().items() if ".cross." not in k})
        luong.load_state_dict(state)
        with torch.no_grad():
            assert torch.equal(luong.encode(src), plain.encode(src))
            for ours, theirs in zip(luong.dec_layers, plain.dec_layers):
                assert ours.attn.sublayer.score.__class__ is theirs.attn.sublayer.score.__class__
                assert torch.equal(ours.attn(x), theirs.attn(x)) and torch.equal(ours.ff(x), theirs.ff(x))
                assert not torch.allclose(ours.cross(x, x), theirs.cross(x, x))


# --- local and dilated against band-masked full attention -------------------------------------------


@pytest.mark.parametrize("name", ALL_SCORES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("tiled", [False, True])
def test_local_and_dilated_equal_band_masked_full_attention(name, causal, tiled):
    """Every kernel path (tiles forced, or the choice between tiles and a band mask) against the definition."""
    from models.attention import tile_size

    gen = torch.Generator().manual_seed(ALL_SCORES.index(name) * 4 + causal * 2 + tiled)
    for trial in range(12):
        T = int(torch.randint(1, 200, (), generator=gen))
        window = int(torch.randint(1, 24, (), generator=gen))
        dilation = int(torch.randint(1, 4, (), generator=gen))
        padded, alibi = trial % 2 == 0, trial % 3 == 0
        score = make_score(name, 2, 4)
        q, k, v, pad = random_case(gen, T, padded=padded)
        bias = asymmetric_bias if alibi else None
        pattern = "local" if dilation == 1 else "dilated"
        block = {"block": tile_size(window, -(-T // dilation))} if tiled else {}
        out = kernel(
            pattern,
            score,
            q,
            k,
            v,
            window,
            dilation,
            causal=causal,
            key_padding=pad if padded else None,
            bias=bias,
            **block,
        )
        ref = oracle_attention(
            name, score, q, k, v, band_mask(T, window, dilation, causal), pad if padded else None, alibi
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
    for budget in (1, 7, 24, 100, 1 << 20):  # one (query, key) pair per block up to everything at once
        torch.testing.assert_close(additive_scores(q, k, v, budget), ref)
        g = torch.randn_like(ref)
        got = torch.autograd.grad(additive_scores(q, k, v, budget), (q, k, v), g)
        want = torch.autograd.grad(ref, (q, k, v), g, retain_graph=True)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b)
    small = [t[:1, :2, :3].detach().clone().requires_grad_(True) for t in (q, k)]
    assert torch.autograd.gradcheck(lambda q, k, v: additive_scores(q, k, v, 13), (*small, v[:2]))


class TensorSizes(TorchDispatchMode):
    """Records every operation, the number of elements of every tensor it produces, the elements of every
    storage it allocates, and the peak of the elements alive at once in allocated storages of at least
    ``watch`` elements (views and in-place results share a storage and count once)."""

    def __init__(self, watch: int = 1 << 62) -> None:
        super().__init__()
        self.sizes: list[int] = []
        self.allocs: list[int] = []
        self.ops: list[str] = []
        self.watch, self.alive, self.peak = watch, {}, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        import weakref

        out = func(*args, **(kwargs or {}))
        self.ops.append(str(func.overloadpacket.__name__))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.sizes.append(t.numel())
                storage = t.untyped_storage()
                key, n = storage.data_ptr(), storage.nbytes() // t.element_size()
                if key not in self.alive:  # a new allocation, not a view or an in-place result
                    self.allocs.append(n)
                    self.alive[key] = n
                    weakref.finalize(t, self.alive.pop, key, None)
                    self.peak = max(self.peak, sum(m for m in self.alive.values() if m >= self.watch))
        return out


def test_additive_memory_is_bounded_by_the_chunk_budget():
    """chunk_elements is a real bound: the (query, key, dimension) intermediates alive at any moment of the
    forward and backward passes never exceed it (the scores and gradients themselves aside)."""
    A, H, T, S, E = 1, 2, 64, 48, 16
    q, k = torch.randn(A, H, T, E, requires_grad=True), torch.randn(A, H, S, E, requires_grad=True)
    v = torch.randn(H, E, requires_grad=True)
    budget = 5000  # not a multiple of anything: blocks of 312 (query, key) pairs = 4992 elements
    outputs = {A * H * T * S, A * H * T * E, A * H * S * E, H * E}  # scores, gradients of q, k, v
    with TensorSizes(watch=budget // 4) as watch:
        additive_scores(q, k, v, budget).sum().backward()
    intermediates = [n for n in watch.sizes if n not in outputs]
    assert max(intermediates) <= budget
    assert watch.peak <= budget + sum(outputs)  # one block alive at a time, beside the scores and gradients
    with TensorSizes() as one:  # everything fits: one block, one tanh, in forward
        additive_scores(q, k, v, A * H * T * S * E)
    assert one.ops.count("tanh_") == 1
    blocks = list(__import__("models.attention", fromlist=["x"]).additive_blocks(A, H, T, S, E, budget))
    assert all(
        (b[0].stop - b[0].start) * (b[1].stop - b[1].start) * (b[2].stop - b[2].start) * (b[3].stop - b[3].start) * E
        <= budget
        for b in blocks
    )


def test_local_attention_tiles_follow_the_window_and_copy_keys_once():
    """Tiles of b = W queries (no floor of 32), neighbourhoods as views: no tensor in the forward pass holds
    the keys once per neighbouring tile (span = 3 tiles here)."""
    from models.attention import tile_size

    assert tile_size(8, 4096) == 8 and tile_size(3, 100) == 3 and tile_size(512, 4096) == 64
    assert tile_size(8, 5) == 5
    B, H, T, D, W = 1, 2, 512, 8, 8
    score = SCORES["dot"](H, D, 1 << 16)
    q, k, v = (torch.randn(B, H, T, D) for _ in range(3))
    with TensorSizes() as watch:
        out = local_attention(q, k, v, score, window=W, causal=False)
    assert max(watch.allocs) < 2 * B * H * T * D  # one padded copy of K (or V), not span = 3 copies
    assert "cat" not in watch.ops
    ref = oracle_attention("dot", score, q.double(), k.double(), v.double(), band_mask(T, W, 1, False))
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)


def sdpa_masks(fn) -> list:
    """The attn_mask of every scaled_dot_product_attention call made by fn()."""
    seen = []
    real = F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        seen.append(kwargs.get("attn_mask", args[3] if len(args) > 3 else None))
        return real(*args, **kwargs)

    F.scaled_dot_product_attention = spy
    try:
        fn()
    finally:
        F.scaled_dot_product_attention = real
    return seen


@pytest.mark.parametrize("name", ALL_SCORES)
def test_causal_queries_fewer_than_keys_are_the_last_ones(name):
    """full_attention's queries are aligned to the last keys (a chunk after cached keys: query t is position
    S - T + t). The dot-like scores went to SDPA's is_causal, which aligns them to the first keys (query t saw
    keys 0..t only), while the other scores and the masked paths aligned them to the last."""
    torch.manual_seed(0)
    B, H, T, S, D = 2, 2, 3, 7, 4
    score = make_score(name, H, D)
    q, k, v = (torch.randn(B, H, n, D, dtype=torch.float64) for n in (T, S, S))
    seen = (torch.arange(S - T, S)[:, None] - torch.arange(S)[None, :]) >= 0  # query at position p sees keys <= p
    expected = torch.softmax(oracle_scores(name, score, q, k).masked_fill(~seen, float("-inf")), -1) @ v
    torch.testing.assert_close(kernel("full", score, q, k, v, causal=True), expected)


def test_no_mask_is_passed_where_none_is_needed():
    """Flash kernels on GPU need attn_mask=None: full (causal or not) self-attention without padding, a
    window that covers the sequence, cross-attention without padding, and a cached full-attention step."""
    from models import ModelConfig, Transformer

    torch.manual_seed(0)
    B, H, T, D = 2, 2, 16, 4
    score = SCORES["dot"](H, D)
    q, k, v = (torch.randn(B, H, T, D) for _ in range(3))
    for causal in (False, True):
        assert sdpa_masks(lambda c=causal: full_attention(q, k, v, score, causal=c)) == [None]
        assert sdpa_masks(lambda c=causal: local_attention(q, k, v, score, window=T, causal=c)) == [None]
    # the window covers the tiled neighbourhood: one call, full attention with a band mask
    masks = sdpa_masks(lambda: local_attention(q, k, v, score, window=6, causal=False))
    assert len(masks) == 1 and masks[0].shape[-2:] == (T, T)
    model = Transformer(ModelConfig(arch="encoder_decoder", vocab_size=11, d_model=8, n_heads=2)).eval()
    src, tgt = torch.randint(1, 11, (2, 5)), torch.randint(1, 11, (2, 4))
    assert sdpa_masks(lambda: model(src, tgt)) == [None] * 6  # 2 encoder, 2 decoder self, 2 cross
    cache = model.new_cache(8)
    memory = model.encode(src)
    model.step(tgt, cache, 0, memory)
    assert sdpa_masks(lambda: model.step(tgt[:, :1], cache, 4, memory)) == [None] * 4


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


def reach_reference(layers, T: int, causal: bool) -> torch.Tensor:
    """(T, T) True where input position j can influence output position i through the stack, from dense
    band masks: each layer passes its input on (the residual) or through any head's band."""
    total = torch.eye(T, dtype=torch.bool)
    for la in layers:
        step = torch.eye(T, dtype=torch.bool)
        for d in la.dilations:
            step |= band_mask(T, la.window, d, causal) if la.window is not None else band_mask(T, None, 1, causal)
        total = (step.double() @ total.double()) > 0
    return total


def stack_influence(cfg, layers, T: int, i: int, causal: bool, score: str) -> torch.Tensor:
    """|d out[i] / d x[j]| summed over features: which inputs reach output i (gradients, the model itself)."""
    from models.blocks import EncoderLayer

    stack = nn.Sequential(*[EncoderLayer(cfg, la, causal=causal) for la in layers]).double()
    x = torch.randn(1, T, cfg.d_model, dtype=torch.float64, requires_grad=True)
    stack(x)[0, i].sum().backward()
    return x.grad[0].abs().sum(-1) > 0  # (T,)


DILATION_CASES = [
    # (model keys, what it exercises)
    dict(pattern="local", window=3),
    dict(pattern="local", window=2, window_schedule="increasing"),
    dict(pattern="local", window=2, window_schedule="decreasing"),
    dict(pattern="local", layer_windows=[1, 4, 2]),
    dict(pattern="dilated", window=2, dilation=3),  # Longformer's default: increasing, a quarter of the heads
    dict(pattern="dilated", window=2, dilation=3, dilation_schedule="fixed"),
    dict(pattern="dilated", window=2, dilation=3, dilation_schedule="decreasing"),
    dict(pattern="dilated", window=2, dilation=2, dilated_heads=3),
    dict(pattern="dilated", window=3, dilation=2, window_schedule="increasing", dilation_schedule="fixed"),
    dict(pattern="dilated", window=2, layer_dilations=[1, 2, 4]),
    dict(pattern="dilated", window=2, head_dilations=[1, 2, 3, 1]),
    dict(pattern="dilated", window=1, head_dilations=[[2, 1, 2, 2], [1, 3, 3, 1], [4, 4, 4, 4]]),
    dict(layer_patterns=["local", "dilated", "full"], window=2, dilation=3),
]


@pytest.mark.parametrize("keys", DILATION_CASES, ids=[str(c) for c in DILATION_CASES])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("score", ["dot", "additive"])
def test_reach_of_every_window_and_dilation_combination_equals_the_band_reference(keys, causal, score):
    """Longformer (Beltagy et al. 2020, sections 3.1, 4.2): dilation per head, schedules per layer. What a
    stack can see is exactly the composition of each layer's dense band masks (any head, or the residual)."""
    from models.config import ModelConfig

    torch.manual_seed(5)
    cfg = ModelConfig(arch="decoder", d_model=8, n_heads=4, n_layers=3, positions="none", score=score, **keys)
    layers = cfg.attention_layers()
    T = 61
    ref = reach_reference(layers, T, causal)
    for i in (0, 30, 60):
        got = stack_influence(cfg, layers, T, i, causal, score)
        assert torch.equal(got, ref[i]), (i, got.nonzero().flatten().tolist(), ref[i].nonzero().flatten().tolist())


def test_longformer_default_keeps_heads_undilated_and_dilates_upper_layers():
    """Old configs ``pattern: dilated, window: W, dilation: d`` now mean Longformer's scheme: a quarter of
    the heads dilated (2 of 8), dilation rising from 1 in the bottom layer to d in the top one."""
    from models.config import ModelConfig

    cfg = ModelConfig(arch="decoder", n_heads=8, d_model=32, n_layers=4, pattern="dilated", window=8, dilation=3)
    assert [la.dilations for la in cfg.attention_layers()] == [
        (1,) * 8,
        (1,) * 6 + (2, 2),
        (1,) * 6 + (2, 2),
        (1,) * 6 + (3, 3),
    ]
    assert [la.window for la in cfg.attention_layers()] == [8, 8, 8, 8]
    inc = cfg.replace(window_schedule="increasing").attention_layers()
    assert [la.window for la in inc] == [3, 6, 10, 13]  # mean 8: compute-matched with the fixed window
    assert [la.window for la in cfg.replace(window_schedule="decreasing").attention_layers()] == [13, 10, 6, 3]


def test_every_window_schedule_keeps_the_mean_window_compute_matched():
    """Longformer's schedule (small windows below, large above) is compared at the cost of the fixed window: a
    local layer's cost grows linearly with its window, so the windows must sum to n * W. Rounding each layer alone
    did not: W 1 over three layers gave [1, 1, 2] (mean 1.33), W 3 gave [2, 3, 5] (mean 3.33)."""
    from models import ConfigError, ModelConfig

    for window in range(1, 33):
        for layers in range(2, 9):
            cfg = ModelConfig(arch="decoder", d_model=16, n_heads=2, n_layers=layers, pattern="local", window=window)
            for kind in ("increasing", "decreasing"):
                if window == 1:  # every window 1: the fixed window under another name, refused with that spelling
                    with pytest.raises(
                        ConfigError, match=r"resolves to the same attention as pattern: local, window: 1"
                    ):
                        cfg.replace(window_schedule=kind)
                    continue
                windows = [la.window for la in cfg.replace(window_schedule=kind).attention_layers()]
                assert sum(windows) == layers * window and min(windows) >= 1, (window, layers, kind, windows)
                assert windows == sorted(windows, reverse=kind == "decreasing"), (window, layers, kind, windows)
                ideal = [window * 2 * (j + 1) / (layers + 1) for j in range(layers)][
                    :: 1 if kind == "increasing" else -1
                ]
                assert all(abs(w - x) < 1 for w, x in zip(windows, ideal) if x >= 1), (window, layers, windows)


PER_LAYER = ("layer_windows", "layer_dilations", "layer_patterns")
DEPTH_CASES = [
    (keys, depth)
    for keys in DILATION_CASES
    if "dilat" in str(keys)
    for depth in (1, 3)
    # one layer: per-layer lists have one entry too many, and a schedule is the default's (refused as a respelling)
    if depth == 3
    or not (
        any(k in keys for k in PER_LAYER)
        or isinstance(keys.get("head_dilations", [0])[0], list)
        or any("schedule" in k for k in keys)
    )
]


@pytest.mark.parametrize("keys,depth", DEPTH_CASES, ids=[f"{k}-L{d}" for k, d in DEPTH_CASES])
def test_a_stack_with_dilation_reaches_the_previous_token_at_depth_one(keys, depth):
    """The defect Longformer avoids: if every head of a layer stack were dilated, token t would never see
    t - 1. Every accepted configuration with dilated heads sees it after its first layer."""
    from models.config import ModelConfig

    cfg = ModelConfig(arch="decoder", d_model=8, n_heads=4, n_layers=depth, positions="none", **keys)
    layers = cfg.attention_layers()
    assert any(max(la.dilations) > 1 for la in layers) or depth == 1
    torch.manual_seed(0)
    for causal in (True, False):
        got = stack_influence(cfg, layers[:1], 31, 20, causal, "dot")
        assert got[19], "token t must see t - 1 after one layer"


def test_a_stack_whose_bottom_layer_dilates_every_head_is_refused():
    """Longformer (section 4.2) keeps the lower layers undilated; a bottom layer with every head dilated does
    not see t - 1 after one layer, and a stack dilated everywhere never does."""
    from models.config import ConfigError, ModelConfig

    base = dict(n_heads=2, d_model=8, pattern="dilated", window=2)
    for keys in (
        dict(n_layers=1, dilation=2, dilated_heads=2),
        dict(dilation=2, dilated_heads=2, dilation_schedule="decreasing"),
        dict(head_dilations=[2, 3]),
        dict(head_dilations=[[2, 2], [1, 2]]),
        dict(layer_dilations=[2, 1], dilated_heads=2),
    ):
        with pytest.raises(
            ConfigError, match=r"every head of the bottom layer is dilated.*t-1.*dilated_heads < n_heads"
        ):
            ModelConfig(**base, **keys)
    ModelConfig(**base, dilation=2, dilated_heads=2)  # increasing: the bottom layer is not dilated


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
