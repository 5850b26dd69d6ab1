"""The CUDA path of additive (Bahdanau) attention (models/fused.py) against the blockwise kernels (the CPU
path) and the definition.

On CPU, ``mode("eager")`` runs the same arithmetic uncompiled (each chunk's (query, key, dimension) tensor
materialised) and ``mode("compiled")`` the kernels torch.compile generates (slow); the ``cuda`` tests run the
default path on a device and skip here without one.
"""

from __future__ import annotations

import pytest
import torch

from models import ModelConfig, Transformer, fused
from models.attention import SCORES
from models.config import LayerAttention
from models.kernels import additive_scores
from models.patterns import DilatedPattern, FullPattern, LocalPattern
from models.positions import ALiBi
from tests.models.devices import cuda
from tests.models.test_attention import make_score, oracle_attention


def patterns(H: int, window: int):
    return {
        "full": FullPattern.plain(H),
        "local": LocalPattern(LayerAttention("local", window, (1,) * H)),
        "dilated": DilatedPattern(LayerAttention("dilated", window, (1, 2) * (H // 2))),
    }


def run(pattern, score, q, k, v, mode, g, **kw):
    """Output and gradients of q, k, v and the score's v_h, under a mode of the fused path."""
    with fused.mode(mode):
        out = pattern.attend(q, k, v, score, **kw)
    return (out, *torch.autograd.grad(out, (q, k, v, score.v), g))


@pytest.mark.parametrize("name", ["full", "local", "dilated"])
@pytest.mark.parametrize("causal", [False, True])
def test_fused_additive_attention_equals_the_blockwise_kernels(name, causal):
    """Outputs and every gradient (queries, keys, values, the score's v_h) equal the blockwise path's, with ALiBi,
    key padding, causality and budgets from one query per chunk to everything at once."""
    gen = torch.Generator().manual_seed(["full", "local", "dilated"].index(name) * 2 + causal)
    H, D = 4, 6
    for trial in range(6):
        T = int(torch.randint(2, 50, (), generator=gen))
        budget = [400, 3000, 1 << 20][trial % 3]
        pattern = patterns(H, int(torch.randint(1, 9, (), generator=gen)))[name]
        score = make_score("additive", H, D, budget)
        q, k, v = (torch.randn(2, H, T, D, dtype=torch.float64, generator=gen).requires_grad_() for _ in range(3))
        pad = torch.zeros(2, T, dtype=torch.bool)
        pad[1, int(torch.randint(1, T + 1, (), generator=gen)) :] = True
        pad = pad if trial % 2 == 0 else None
        bias = ALiBi(H, causal).double().bias if trial % 3 != 2 else None
        real = torch.ones(2, H, T, D, dtype=torch.bool) if pad is None else (~pad[:, None, :, None]).expand(2, H, T, D)
        g = torch.randn(2, H, T, D, dtype=torch.float64, generator=gen) * real
        kw = dict(causal=causal, key_padding=pad, bias=bias)
        ours = run(pattern, score, q, k, v, "eager", g, **kw)
        blockwise = run(pattern, score, q, k, v, "off", g, **kw)
        torch.testing.assert_close(ours[0][real], blockwise[0][real], rtol=1e-10, atol=1e-12)
        for a, b in zip(ours[1:], blockwise[1:]):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_fused_additive_attention_equals_the_definition_and_gradcheck():
    """Bahdanau et al. (2015): softmax_s(v . tanh(q_t + k_s)) weights the values; checked against the whole
    (B, H, T, S, D) tensor written out, and by finite differences with several chunks."""
    torch.manual_seed(1)
    H, D, T = 2, 4, 7
    score = make_score("additive", H, D, budget=2 * H * T)  # two queries per chunk
    q, k, v = (torch.randn(1, H, T, D, dtype=torch.float64, requires_grad=True) for _ in range(3))
    allowed = torch.ones(T, T, dtype=torch.bool).tril()
    with fused.mode("eager"):
        out = FullPattern.plain(H).attend(q, k, v, score, causal=True)
        assert torch.autograd.gradcheck(
            lambda q, k, v, w: fused.additive_attention(q, k, v, w, allowed, budget=2 * H * T), (q, k, v, score.v)
        )
    torch.testing.assert_close(out, oracle_attention("additive", score, q, k, v, allowed))


def test_chunks_are_as_large_as_the_budget_allows():
    """No Python loop over small pieces: each chunk's (query, key) scores hold at most ``chunk_elements``
    elements, and the chunks are as few as that allows (one when everything fits)."""
    A, H, T, S, E = 2, 3, 50, 50, 8
    q, k, v = (torch.randn(A, H, n, E) for n in (T, S, S))
    w = torch.randn(H, E)
    for budget, chunks in ((A * H * S * T, 1), (A * H * S * 7, 8), (10, 50)):
        shapes = []

        def scores(q, k, w, shapes=shapes):
            shapes.append(q.shape[0] * q.shape[1] * q.shape[2] * k.shape[2])
            return fused._scores(q, k, w)

        with fused.mode("eager"), pytest.MonkeyPatch.context() as mp:
            mp.setitem(fused._PIECES, "scores", scores)
            fused.additive_attention(q, k, v, w, None, budget)
        assert len(shapes) == chunks
        assert max(shapes) <= max(budget, A * H * S)


def test_what_stays_on_the_blockwise_kernels():
    q = torch.randn(1, 2, 5, 4)
    assert fused.current_mode() == "auto"
    assert not fused.usable(q)  # CPU tensors: the blockwise kernels, no compilation
    with fused.mode("eager"):
        assert fused.usable(q)
        assert not fused.usable(q, dropout_p=0.1)
        assert not fused.usable(q, bias=torch.zeros(5, 5, requires_grad=True))  # a learned bias needs its gradient
    with pytest.raises(ValueError, match="valid: auto, off, eager, compiled"), fused.mode("fast"):
        pass


def test_the_backward_keeps_the_mode_of_its_forward():
    """A training step's backward may run after ``mode(...)`` has closed (or in autograd's device thread): it must
    use the pieces its forward chose. Eager here: nothing is compiled for it."""
    torch.manual_seed(3)
    q, k, v = (torch.randn(1, 2, 5, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    w = torch.randn(2, 4, dtype=torch.float64, requires_grad=True)
    fused._compiled.clear()
    with fused.mode("eager"):
        out = fused.additive_attention(q, k, v, w)
    out.sum().backward()  # outside the block: the mode is "auto" again
    assert fused._compiled == {}
    assert all(t.grad is not None and t.grad.isfinite().all() for t in (q, k, v, w))


def test_a_model_with_additive_scores_is_unchanged_by_the_fused_path():
    torch.manual_seed(2)
    cfg = ModelConfig(
        arch="encoder_decoder", vocab_size=20, d_model=16, n_heads=2, n_layers=1, score="additive", chunk_elements=64
    )
    model = Transformer(cfg).double()
    src, tgt = torch.randint(1, 20, (2, 9)), torch.randint(1, 20, (2, 6))
    out = []
    for mode in ("off", "eager"):
        model.zero_grad()
        with fused.mode(mode):
            logits = model(src, tgt, padding=src == 0)
        logits.square().mean().backward()
        out.append([logits] + [p.grad.clone() for p in model.parameters()])
    for a, b in zip(*out):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.slow
def test_compiled_fused_kernels_equal_the_blockwise_kernels_on_cpu():
    """The kernels torch.compile generates (CPU backend) for scores and the three gradients."""
    torch.manual_seed(3)
    H, D, T = 4, 16, 96
    score = SCORES["additive"](H, D, 1 << 12)
    q, k, v = (torch.randn(2, H, T, D, requires_grad=True) for _ in range(3))
    g = torch.randn(2, H, T, D)
    pattern = FullPattern.plain(H)
    ours = run(pattern, score, q, k, v, "compiled", g, causal=True)
    blockwise = run(pattern, score, q, k, v, "off", g, causal=True)
    for a, b in zip(ours, blockwise):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


@cuda
@pytest.mark.parametrize("name", ["full", "local", "dilated"])
def test_cuda_fused_additive_attention_equals_the_blockwise_kernels(name):
    dev = torch.device("cuda")
    torch.manual_seed(4)
    H, D, T = 4, 32, 300
    pattern = patterns(H, 16)[name]
    score = make_score("additive", H, D, budget=1 << 14).float().to(dev)
    q, k, v = (torch.randn(2, H, T, D, device=dev, requires_grad=True) for _ in range(3))
    pad = torch.zeros(2, T, dtype=torch.bool, device=dev)
    pad[1, 250:] = True
    real = (~pad[:, None, :, None]).expand(2, H, T, D)
    g = torch.randn(2, H, T, D, device=dev) * real
    kw = dict(causal=False, key_padding=pad, bias=ALiBi(H, False).to(dev).bias)
    ours = run(pattern, score, q, k, v, "auto", g, **kw)
    blockwise = run(pattern, score, q, k, v, "off", g, **kw)
    torch.testing.assert_close(ours[0][real], blockwise[0][real], rtol=1e-4, atol=1e-4)
    for a, b in zip(ours[1:], blockwise[1:]):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-3)


@cuda
def test_cuda_fused_scores_equal_the_definition():
    dev = torch.device("cuda")
    q, k, w = torch.randn(1, 2, 33, 8, device=dev), torch.randn(1, 2, 40, 8, device=dev), torch.randn(2, 8, device=dev)
    compiled = fused._piece("scores", dev, eager=False)  # the compiled kernel, not the eager definition
    torch.testing.assert_close(compiled(q, k, w), additive_scores(q, k, w), rtol=1e-5, atol=1e-5)
