"""Every kernel path takes q, k and v of any layout: contiguous, transposed from (B, T, H, D) (what a projection split
into heads gives), strided in the head dimension, sliced from a larger batch, and broadcast over the batch (stride
0). Each path's outputs and gradients on those layouts equal a dense masked reference computed on contiguous copies
(the scores from each function's definition, the mask written out here). The kernel tests elsewhere feed contiguous
tensors only, which is how additive scores with global tokens crashed in backward on the band path (issue 63)."""

from __future__ import annotations

import pytest
import torch

from models import ModelConfig, Transformer, flex, fused
from models.config import LayerAttention
from models.kernels import attend, full_attention
from models.patterns import DilatedPattern, LocalPattern
from tests.models.test_attention import asymmetric_bias, make_score, oracle_scores

B, H, D = 2, 2, 4


def laid_out(x: torch.Tensor, layout: str) -> torch.Tensor:
    """``x`` (B, H, T, D), with the same values, in ``layout``; a leaf that requires grad."""
    x = x.detach()
    if layout == "contiguous":
        out = x.clone()
    elif layout == "transposed":  # (B, T, H, D) split into heads
        out = x.transpose(1, 2).contiguous().transpose(1, 2)
    elif layout == "strided":  # every other element of the head dimension
        wide = torch.zeros(*x.shape[:-1], 2 * x.shape[-1], dtype=x.dtype)
        wide[..., ::2] = x
        out = wide[..., ::2]
    elif layout == "sliced":  # every other sequence of a batch twice as large
        big = torch.zeros(2 * x.shape[0], *x.shape[1:], dtype=x.dtype)
        big[::2] = x
        out = big[::2]
    elif layout == "broadcast":  # one sequence's keys for the whole batch (stride 0)
        out = x[:1].expand_as(x)
    else:
        raise AssertionError(layout)
    assert out.is_contiguous() == (layout == "contiguous")
    return out.requires_grad_()


LAYOUTS = ["contiguous", "transposed", "strided", "sliced", "broadcast"]


def dense(name, score, q, k, v, allowed, pad=None, bias=None):
    """softmax(score(q, k) + bias, over the allowed keys) @ v on contiguous copies: (B, H, T, Dv)."""
    q, k, v = (t.contiguous() for t in (q, k, v))
    s = oracle_scores(name, score, q, k)
    if bias is not None:
        T, S = q.shape[-2], k.shape[-2]
        s = s + bias(torch.arange(S - T, S)[:, None] - torch.arange(S)[None, :])[None]
    mask = allowed[None] if allowed.dim() == 3 else allowed[None, None]
    if pad is not None:
        mask = mask & ~pad[:, None, None, :]
    mask = mask | ~mask.any(-1, keepdim=True)  # a padding query with only padding in sight: finite, and ignored
    return torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1) @ v


def windows(T: int, window: int, dilations, globals_=(), causal: bool = False) -> torch.Tensor:
    """(H, T, T) from the definition: head h sees distances that are multiples of d_h up to window * d_h; a global
    token's row and column are whole; the causal rule on top."""
    dist = torch.arange(T)[:, None] - torch.arange(T)[None, :]
    g = torch.zeros(T, dtype=torch.bool)
    g[list(globals_)] = True
    heads = [((dist.abs() <= window * d) & (dist % d == 0)) | g[:, None] | g[None, :] for d in dilations]
    allowed = torch.stack(heads)
    return allowed & (dist >= 0) if causal else allowed


def pattern(window: int, dilations, globals_=()):
    la = LayerAttention("dilated" if max(dilations) > 1 else "local", window, tuple(dilations), tuple(globals_))
    return (DilatedPattern if max(dilations) > 1 else LocalPattern)(la)


# path: (T, window, dilations, global tokens, causal, padded, bias, how it runs)
PATHS = {
    "full": (12, None, (1, 1), (), False, True, True, "full"),
    "full causal": (12, None, (1, 1), (), True, False, False, "full"),
    "band": (40, 3, (1, 1), (), False, True, True, "tiles"),  # T <= 64: band-masked full attention
    "tiles": (150, 3, (1, 1), (), True, True, True, "tiles"),
    "dilated tiles": (150, 3, (1, 2), (), False, True, False, "tiles"),
    "band + global": (40, 4, (1, 1), (0, 17), False, True, False, "tiles"),  # the crash of issue 63
    "tiles + global": (150, 3, (1, 2), (0, 90), False, True, False, "tiles"),
    "flex": (150, 5, (1, 2), (), True, True, True, "flex"),  # forward only on a CPU
    "fused additive": (40, None, (1, 1), (), True, True, False, "fused"),
}


def run_path(path: str, name: str, score, q, k, v, pad, bias):
    T, window, dilations, globals_, causal, _, _, how = PATHS[path]
    if how == "full":
        qp, kp = score.prepare(q, k)
        return full_attention(qp, kp, v, score, causal=causal, key_padding=pad, bias=bias)
    if how == "fused":
        with fused.mode("eager"):  # the fused kernels' arithmetic, uncompiled (the compiled pieces: test_fused.py)
            qp, kp = score.prepare(q, k)
            return full_attention(qp, kp, v, score, causal=causal, key_padding=pad, bias=bias)
    qp, kp = score.prepare(q, k)
    mode = "eager" if how == "flex" else "off"
    with flex.mode(mode):
        return pattern(window, dilations, globals_).attend(qp, kp, v, score, causal=causal, key_padding=pad, bias=bias)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("name", ["dot", "additive"])
def test_every_kernel_path_takes_any_layout(path, name, layout):
    T, window, dilations, globals_, causal, padded, biased, how = PATHS[path]
    if (how == "flex") != (name == "dot") and how in ("flex", "fused"):
        pytest.skip("FlexAttention takes dot-like scores, the fused kernels additive ones")
    gen = torch.Generator().manual_seed(T)
    score = make_score(name, H, D)
    base = [torch.randn(B, H, T, D, dtype=torch.float64, generator=gen) for _ in range(3)]
    if layout == "broadcast":
        base = [t[:1].expand_as(t).clone() for t in base]
    q, k, v = (laid_out(t, layout) for t in base)
    pad = None
    if padded:
        pad = torch.zeros(B, T, dtype=torch.bool)
        pad[1, T - 5 :] = True
    bias = asymmetric_bias if biased else None
    allowed = (
        torch.ones(T, T, dtype=torch.bool).tril() if causal else torch.ones(T, T, dtype=torch.bool)
    ) if window is None else windows(T, window, dilations, globals_, causal)  # fmt: skip
    refs = [t.detach().clone().requires_grad_() for t in base]
    ref = dense(name, score, *refs, allowed, pad, bias)
    real = torch.ones_like(ref, dtype=torch.bool) if pad is None else (~pad[:, None, :, None]).expand_as(ref)
    if how == "flex":
        with torch.no_grad():
            out = run_path(path, name, score, q, k, v, pad, bias)
        torch.testing.assert_close(out[real], ref.detach()[real], rtol=1e-9, atol=1e-10)
        return
    out = run_path(path, name, score, q, k, v, pad, bias)
    torch.testing.assert_close(out[real], ref[real], rtol=1e-9, atol=1e-10)
    g = torch.randn(ref.shape, dtype=torch.float64, generator=gen) * real
    for ours, want in zip(torch.autograd.grad(out, (q, k, v), g), torch.autograd.grad(ref, refs, g)):
        torch.testing.assert_close(ours, want, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("name", ["dot", "additive"])
def test_a_cached_step_reads_keys_from_slices_of_a_preallocated_buffer(name):
    """The cached path's keys and values are the filled slots of a buffer of the prompt's and new tokens' length,
    never copied: one query over them equals the dense reference on contiguous copies."""
    gen = torch.Generator().manual_seed(3)
    score = make_score(name, H, D)
    buf = torch.zeros(B, H, 20, 2 * D, dtype=torch.float64)
    buf.normal_(generator=gen)
    k, v = buf[:, :, :13, :D], buf[:, :, :13, D:]  # the filled slots; strided in the head dimension
    q = torch.randn(B, H, 1, D, dtype=torch.float64, generator=gen)
    qp, kp = score.prepare(q, k)
    out = attend(qp, kp, v, score, causal=True)
    torch.testing.assert_close(out, dense(name, score, q, k, v, torch.ones(1, 13, dtype=torch.bool)))


def test_additive_scores_with_global_tokens_train_on_the_band_path():
    """Issue 63's crash: a local encoder with a global token and additive scores failed in backward at 40 tokens
    (the band path: a view of a non-contiguous q) and worked at 200 (the tiles)."""
    cfg = ModelConfig(
        arch="encoder", n_classes=2, d_model=32, n_heads=2, n_layers=2, score="additive", pattern="local", window=4,
        global_tokens=(0,), classifier="first",
    )  # fmt: skip
    torch.manual_seed(0)
    model = Transformer(cfg)
    for T in (40, 200):
        model.zero_grad()
        model(torch.randint(4, 50, (3, T))).sum().backward()
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters() if p.requires_grad)
