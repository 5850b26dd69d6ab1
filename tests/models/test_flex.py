"""The CUDA path of local and dilated attention (models/flex.py, torch's FlexAttention) against the tiled
kernels (the CPU path) and a dense band reference written out here.

On CPU, FlexAttention runs its forward only: uncompiled (``mode("eager")``: the scores materialised, every
mask and score modification applied to every pair) and compiled (``mode("compiled")``: the block-sparse
kernel, which reads only the blocks of the BlockMask; slow). Gradients and the CUDA kernels are checked by the
``cuda`` tests, which skip here without a device.
"""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask

from models import ModelConfig, Transformer, flex
from models.attention import SCORES, MultiHeadAttention
from models.config import LayerAttention
from models.patterns import DilatedPattern, LocalPattern
from models.positions import ALiBi
from tests.models.devices import cuda
from tests.models.test_attention import make_score, oracle_scores

DOT_LIKE = ["dot", "dot_unscaled", "general", "cosine"]
HEAD_DILATIONS = [(1, 1, 1, 1), (1, 1, 2, 3), (1, 2, 2, 4), (2, 1, 3, 1)]


def head_bands(T: int, window: int, dilations, causal: bool) -> torch.Tensor:
    """(H, T, T) True where head h's query i may see key j, from the definition (Longformer's per-head
    dilation: distances that are multiples of d_h up to window * d_h)."""
    dist = torch.arange(T)[:, None] - torch.arange(T)[None, :]
    out = []
    for d in dilations:
        ok = (dist.abs() <= window * d) & (dist % d == 0)
        out.append(ok & (dist >= 0) if causal else ok)
    return torch.stack(out)


def band_reference(name, score, q, k, v, allowed, key_padding=None, bias=None):
    """Softmax over the allowed keys of each function's own scores plus bias(query - key)."""
    s = oracle_scores(name, score, q, k)
    if bias is not None:
        T = q.shape[-2]
        s = s + bias(torch.arange(T)[:, None] - torch.arange(T)[None, :])[None]
    mask = allowed[None]
    if key_padding is not None:
        mask = mask & ~key_padding[:, None, None, :]
    return torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1) @ v


def pattern_for(window: int, dilations) -> LocalPattern:
    if max(dilations) == 1:
        return LocalPattern(LayerAttention("local", window, tuple(dilations)))
    return DilatedPattern(LayerAttention("dilated", window, tuple(dilations)))


def real_rows(out: torch.Tensor, pad: torch.Tensor | None) -> torch.Tensor:
    """Outputs at real queries (a padding query's output is meaningless by definition)."""
    return torch.ones_like(out, dtype=torch.bool) if pad is None else (~pad[:, None, :, None]).expand_as(out)


# --- the BlockMask ---------------------------------------------------------------------------------------

GEOMETRIES = [  # T, window, head dilations, causal, block
    (256, 5, (1, 1), False, 32),
    (256, 5, (1, 1), True, 32),
    (256, 40, (1, 1, 2, 3), False, 32),
    (512, 17, (1, 2), True, 64),
    (256, 64, (1, 1), False, 32),
    (256, 3, (2, 2), False, 16),
    (250, 5, (1, 1), False, 32),  # ragged: the sequence ends inside a block
    (201, 40, (1, 1, 2, 3), False, 32),
    (77, 17, (1, 2), True, 64),
    (100, 60, (1, 1), False, 16),  # wide windows: full blocks, some cut by the end
    (100, 60, (1, 1), True, 16),
    (130, 90, (1, 1, 1, 2), False, 16),
]


def listed(num: torch.Tensor, idx: torch.Tensor) -> list:
    return [
        [sorted(idx[0, h, i, : int(num[0, h, i])].tolist()) for i in range(num.shape[2])] for h in range(num.shape[1])
    ]


@pytest.mark.parametrize("T,window,dilations,causal,block", GEOMETRIES)
def test_block_structure_equals_torch_create_block_mask(T, window, dilations, causal, block):
    """The block lists built from one tile per block offset equal those of torch's create_block_mask, which
    evaluates the mask_mod at every (query, key) pair: the same partial and the same full blocks."""
    ours = flex.block_structure(T, window, dilations, causal, block=block)
    H = len(dilations) if len(set(dilations)) > 1 else None
    mod = flex._mask_mod(torch.tensor(window), torch.tensor(dilations), causal, None)
    ref = create_block_mask(mod, None, H, T, T, device="cpu", BLOCK_SIZE=block)
    assert listed(ours[0], ours[1]) == listed(ref.kv_num_blocks, ref.kv_indices)
    assert listed(ours[2], ours[3]) == listed(ref.full_kv_num_blocks, ref.full_kv_indices)
    merged = flex.block_structure(T, window, dilations, causal, block=block, split_full=False)
    assert merged[2] is None
    every = [[sorted(a + b) for a, b in zip(p, f)] for p, f in zip(listed(*ours[:2]), listed(*ours[2:]))]
    assert listed(merged[0], merged[1]) == every


def test_block_masks_are_cached_and_padding_reaches_every_block():
    dev = torch.device("cpu")
    a = flex.block_mask(300, 7, (1, 1, 2, 2), True, dev)
    assert flex.block_mask(300, 7, (1, 1, 2, 2), True, dev) is a
    pad = torch.zeros(2, 300, dtype=torch.bool)
    padded = flex.block_mask(300, 7, (1, 1, 2, 2), True, dev, pad)
    assert padded is not a and padded.full_kv_num_blocks is None  # the mask_mod (with the padding) runs everywhere
    assert flex.block_mask(300, 7, (1, 1, 2, 2), True, dev, pad).kv_indices is padded.kv_indices  # cached structure


# --- outputs against the tiled kernels and the band reference -------------------------------------------


@pytest.mark.parametrize("name", DOT_LIKE)
@pytest.mark.parametrize("causal", [False, True])
def test_flex_forward_equals_tiled_kernels_and_band_reference(name, causal):
    """Every combination the CUDA path serves (dot-like scores, local and per-head dilated windows, ALiBi, key
    padding, causal or not) gives the outputs of the tiled kernels and of the dense definition."""
    gen = torch.Generator().manual_seed(DOT_LIKE.index(name) * 2 + causal)
    H, D = 4, 8
    for trial in range(8):
        T = int(torch.randint(2, 260, (), generator=gen))
        window = int(torch.randint(1, 30, (), generator=gen))
        dilations = HEAD_DILATIONS[trial % 4]
        padded, alibi = trial % 2 == 0, trial % 3 != 1
        score = make_score(name, H, D)
        q, k, v = (torch.randn(2, H, T, D, dtype=torch.float64, generator=gen) for _ in range(3))
        pad = torch.zeros(2, T, dtype=torch.bool)
        pad[1, int(torch.randint(1, T + 1, (), generator=gen)) :] = True
        pad = pad if padded else None
        bias = ALiBi(H, causal).double().bias if alibi else None
        pattern = pattern_for(window, dilations)
        with torch.no_grad():
            qp, kp = score.prepare(q, k)
            with flex.mode("off"):
                tiled = pattern.attend(qp, kp, v, score, causal=causal, key_padding=pad, bias=bias)
            with flex.mode("eager"):
                assert flex.usable(qp, v, score, window=window, dilations=dilations) == (
                    window < T - 1 or max(dilations) > 1
                )
                out = pattern.attend(qp, kp, v, score, causal=causal, key_padding=pad, bias=bias)
        ref = band_reference(name, score, q, k, v, head_bands(T, window, dilations, causal), pad, bias)
        real = real_rows(out, pad)
        assert torch.isfinite(out).all()
        torch.testing.assert_close(out[real], tiled[real], rtol=1e-9, atol=1e-10)
        torch.testing.assert_close(out[real], ref[real].detach(), rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("arch", ["decoder", "encoder"])
@pytest.mark.parametrize("positions", ["alibi", "rotary", "sinusoidal"])
@pytest.mark.parametrize("pattern", ["local", "dilated"])
def test_models_give_the_same_outputs_through_flex_attention(arch, positions, pattern):
    """A whole model (its positions, scores, windows, dilation schedule and an encoder's padding) computes the
    same outputs with FlexAttention as with the tiled kernels."""
    torch.manual_seed(2)
    cfg = ModelConfig(
        arch=arch,
        **({"n_classes": 3, "classifier": "token"} if arch == "encoder" else {}),
        vocab_size=20,
        d_model=32,
        n_heads=4,
        n_layers=3,
        positions=positions,
        score="general" if positions == "alibi" else "dot",
        pattern=pattern,
        window=5,
        dilation=3 if pattern == "dilated" else 1,
        dilated_heads=2 if pattern == "dilated" else None,
    )
    model = Transformer(cfg).double().eval()
    tokens = torch.randint(1, 20, (2, 150))
    pad = torch.zeros(2, 150, dtype=torch.bool)
    pad[1, 97:] = True
    tokens[pad] = 0
    kw = {"padding": pad} if arch == "encoder" else {}
    calls = []
    window_attention = flex.window_attention

    def counted(*args, **kwargs):
        calls.append(1)
        return window_attention(*args, **kwargs)

    with torch.no_grad():
        with flex.mode("off"):
            tiled = model(tokens, **kw)
        with flex.mode("eager"), pytest.MonkeyPatch.context() as mp:
            mp.setattr(flex, "window_attention", counted)
            out = model(tokens, **kw)
    assert len(calls) == cfg.n_layers
    real = ~pad[..., None].expand_as(out) if arch == "encoder" else torch.ones_like(out, dtype=torch.bool)
    torch.testing.assert_close(out[real], tiled[real], rtol=1e-9, atol=1e-10)


def test_what_stays_on_the_tiled_kernels():
    """CPU tensors in the default mode (FlexAttention has no CPU backward), additive scores, dropout on the
    probabilities, a window that covers the sequence (full attention without a mask serves it), and on CUDA,
    float64 and head sizes flex does not tile."""
    q = torch.randn(1, 4, 64, 16)
    dot, additive = SCORES["dot"](4, 16), SCORES["additive"](4, 16)
    assert flex.current_mode() == "auto"
    assert not flex.usable(q, q, dot, window=8, dilations=(1,) * 4)
    with flex.mode("eager"):
        assert flex.usable(q, q, dot, window=8, dilations=(1,) * 4)
        assert not flex.usable(q, q, additive, window=8, dilations=(1,) * 4)
        assert not flex.usable(q, q, dot, window=8, dilations=(1,) * 4, dropout_p=0.1)
        assert not flex.usable(q, q, dot, window=63, dilations=(1,) * 4)
        assert flex.usable(q, q, dot, window=63, dilations=(1, 1, 1, 2))  # a dilated head never covers all
    with flex.mode("off"):
        assert not flex.usable(q, q, dot, window=8, dilations=(1,) * 4)
    with pytest.raises(ValueError, match="valid: auto, off, eager, compiled"), flex.mode("fast"):
        pass


def test_training_with_attention_dropout_uses_the_tiled_kernels():
    torch.manual_seed(0)
    pattern = LocalPattern(LayerAttention("local", 4, (1, 1)))
    mha = MultiHeadAttention(16, 2, 8, pattern=pattern, dropout=0.5).train()
    with flex.mode("eager"), pytest.MonkeyPatch.context() as mp:
        mp.setattr(flex, "window_attention", lambda *a, **k: pytest.fail("dropout needs the tiled kernels"))
        mha(torch.randn(2, 40, 16)).sum().backward()


@pytest.mark.slow
def test_compiled_flex_kernel_on_cpu_equals_tiled_kernels():
    """The compiled, block-sparse FlexAttention kernel (it reads only the listed blocks; CPU forward) with per-head
    dilation, ALiBi and padding, at a length that is not a multiple of the block."""
    torch.manual_seed(1)
    H, D = 4, 16
    for T, window, dilations, causal, padded in [
        (300, 20, (1, 1, 1, 1), True, False),
        (333, 30, (1, 1, 2, 3), False, True),
    ]:
        pattern = pattern_for(window, dilations)
        score = SCORES["dot"](H, D)
        q, k, v = (torch.randn(2, H, T, D) for _ in range(3))
        pad = torch.zeros(2, T, dtype=torch.bool)
        pad[1, 200:] = True
        pad = pad if padded else None
        bias = ALiBi(H, causal).bias
        with flex.mode("off"):
            tiled = pattern.attend(q, k, v, score, causal=causal, key_padding=pad, bias=bias)
        with flex.mode("compiled"):
            out = pattern.attend(q, k, v, score, causal=causal, key_padding=pad, bias=bias)
        real = real_rows(out, pad)
        torch.testing.assert_close(out[real], tiled[real], rtol=1e-5, atol=1e-5)


def test_only_a_bias_linear_in_the_distance_goes_to_flex_attention():
    """ALiBi's bias (Press et al. 2022: -m_h * (i - j)) is computed in the kernel from its slopes; any other bias
    stays on the tiled kernels, which take any bias(dist)."""
    q = torch.randn(1, 4, 64, 16)
    score = make_score("dot", 4, 16)
    alibi = ALiBi(4, causal=True)
    with flex.mode("compiled"):
        assert flex.usable(q, q, score, window=8, dilations=(1,) * 4, bias=alibi.bias)
        assert flex.usable(q, q, score, window=8, dilations=(1,) * 4)
        assert not flex.usable(q, q, score, window=8, dilations=(1,) * 4, bias=lambda dist: alibi.bias(dist) ** 2)
    past, future = alibi.slopes()
    dist = torch.arange(-5, 6)
    linear = torch.where(dist >= 0, -past[:, None] * dist, future[:, None] * dist)
    torch.testing.assert_close(alibi.bias(dist), linear)  # the slopes are the bias


@pytest.mark.parametrize("causal", [True, False])
def test_alibi_reaches_flex_attention_as_two_slopes_per_head_and_no_table(causal):
    """The score_mod adds ALiBi's bias (models.positions.ALiBi.bias, the reference) from two (H,) slopes and reads no
    other tensor: the table of distances it once gathered from made the H100's kernel for bf16 and heads of 64 need
    240 KB of shared memory, more than the 227 KB there (no CPU shows that; this shows the table is gone)."""
    alibi = ALiBi(8, causal)
    mod = flex.alibi_score_mod(alibi.bias, torch.device("cpu"), torch.float32)
    loads = [c.cell_contents for c in mod.__closure__ if isinstance(c.cell_contents, torch.Tensor)]
    assert sorted(t.shape for t in loads) == [(8,), (8,)]
    q, k = torch.arange(40).view(-1, 1), torch.arange(40).view(1, -1)
    expected = alibi.bias(q - k)  # (H, 40, 40)
    for h in range(8):
        got = mod(torch.zeros(()), 0, torch.tensor(h), q, k)
        torch.testing.assert_close(got, expected[h])


def test_the_compiled_flex_attention_may_compile_every_variant_a_process_meets(monkeypatch):
    """torch runs a function uncompiled once it has been compiled recompile_limit times (8 by default): for
    FlexAttention that is the dense (T, T) path, seen on an H100 when a benchmark's variants passed 8. Taking the
    compiled kernel raises the limit for the process (never lowers it)."""
    import torch._dynamo

    before = torch._dynamo.config.recompile_limit  # torch's config module cannot be monkeypatched back
    try:
        for limit, expected in ((8, flex.RECOMPILES), (500, 500)):
            monkeypatch.setattr(flex, "_compiled", {})  # the limit is raised when the compiled kernel is made
            torch._dynamo.config.recompile_limit = limit
            flex._flex(torch.device("cpu"))
            assert torch._dynamo.config.recompile_limit == expected >= 32
    finally:
        torch._dynamo.config.recompile_limit = before


# --- Longformer's global tokens (Beltagy et al. 2020, section 3.1) -------------------------------------

GLOBAL_CASES = [  # T, window, head dilations, global positions, causal
    (150, 3, (1, 1, 1, 1), (0,), False),  # tiles (T > 64, a small window)
    (150, 3, (1, 1, 2, 3), (0, 77, 149), False),
    (40, 4, (1, 1, 1, 1), (0, 5), False),  # band-masked full attention (short sequence)
    (40, 2, (1, 2, 2, 3), (3,), False),
    (300, 9, (1, 1, 2, 2), (0, 250), False),
    (150, 3, (1, 1), (0, 100, 200), False),  # a position past the sequence is no global token of it
]


def global_bands(T: int, window: int, dilations, globals_, causal: bool) -> torch.Tensor:
    """(H, T, T) from the definition: the window of each head, or a global query (its whole row), or a global key
    (its whole column); the causal rule on top."""
    g = torch.zeros(T, dtype=torch.bool)
    g[[t for t in globals_ if t < T]] = True
    allowed = head_bands(T, window, dilations, False) | g[None, :, None] | g[None, None, :]
    if causal:
        allowed &= torch.ones(T, T, dtype=torch.bool).tril()
    return allowed


@pytest.mark.parametrize("name", ["dot", "general", "additive"])
@pytest.mark.parametrize("T,window,dilations,globals_,causal", GLOBAL_CASES)
def test_global_tokens_equal_a_dense_masked_reference(name, T, window, dilations, globals_, causal):
    """The tiled kernels (global keys as extra columns of every tile, global queries as a dense call: outputs and
    gradients) and the uncompiled FlexAttention forward (global rows and columns in its mask; dot-like scores)
    against a softmax over the dense mask written out here, with padding and ALiBi."""
    gen = torch.Generator().manual_seed(T + window)
    H, D = len(dilations), 8
    score = make_score(name, H, D)
    q, k, v = (torch.randn(2, H, T, D, dtype=torch.float64, generator=gen).requires_grad_() for _ in range(3))
    pad = torch.zeros(2, T, dtype=torch.bool)
    pad[1, T - 7 :] = True
    bias = ALiBi(H, causal).double().bias
    la = LayerAttention("dilated" if max(dilations) > 1 else "local", window, tuple(dilations), tuple(globals_))
    pattern = (DilatedPattern if max(dilations) > 1 else LocalPattern)(la)
    ref = band_reference(name, score, q, k, v, global_bands(T, window, dilations, globals_, causal), pad, bias)
    real = real_rows(ref, pad)
    qp, kp = score.prepare(q, k)
    with flex.mode("off"):
        tiled = pattern.attend(qp, kp, v, score, causal=causal, key_padding=pad, bias=bias)
    torch.testing.assert_close(tiled[real], ref[real], rtol=1e-9, atol=1e-10)
    g = torch.randn(ref.shape, dtype=torch.float64, generator=gen) * real  # padding queries' outputs: ignored
    for ours, want in zip(torch.autograd.grad(tiled, (q, k, v), g), torch.autograd.grad(ref, (q, k, v), g)):
        torch.testing.assert_close(ours, want, rtol=1e-9, atol=1e-10)
    with torch.no_grad():
        if name != "additive":
            with flex.mode("eager"):  # forward only on CPU
                out = pattern.attend(
                    qp.detach(), kp.detach(), v.detach(), score, causal=causal, key_padding=pad, bias=bias
                )
            torch.testing.assert_close(out[real], ref[real].detach(), rtol=1e-9, atol=1e-10)


def test_global_tokens_keep_the_tiles_and_reach_every_position():
    """The window's cost stays: no (T, T) tensor is built at 1,000 tokens with two global tokens; and the gradient
    of a global query's output reaches every key, while a query far from every global token sees its window and
    the global keys only."""
    torch.manual_seed(0)
    T, window = 1000, 4
    pattern = LocalPattern(LayerAttention("local", window, (1, 1), (0, 500)))
    score = SCORES["dot"](2, 8)
    q, k, v = (torch.randn(1, 2, T, 8, requires_grad=True) for _ in range(3))
    sizes = []

    class Record(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor):
                    sizes.append(t.numel())
            return out

    with flex.mode("off"), Record():
        out = pattern.attend(q, k, v, score)
    assert max(sizes) < T * T / 4
    (g_global,) = torch.autograd.grad(out[0, :, 0].sum(), v, retain_graph=True)
    assert (g_global[0].abs().sum((0, 2)) > 0).all()  # a global query reads every value
    (g_far,) = torch.autograd.grad(out[0, :, 250].sum(), v)
    seen = (g_far[0].abs().sum((0, 2)) > 0).nonzero().flatten().tolist()
    assert seen == [0, *range(250 - window, 250 + window + 1), 500]


def test_block_structure_with_global_tokens_equals_torch_create_block_mask():
    for T, window, dilations, globals_, causal, block in [
        (256, 5, (1, 1), (0,), False, 32),
        (250, 17, (1, 1, 2, 3), (3, 140), False, 32),
        (201, 9, (1, 2), (200,), True, 16),
    ]:
        ours = flex.block_structure(T, window, dilations, causal, block=block, global_tokens=globals_)
        H = len(dilations) if len(set(dilations)) > 1 else None
        is_global = torch.zeros(T, dtype=torch.bool)
        is_global[list(globals_)] = True
        mod = flex._mask_mod(torch.tensor(window), torch.tensor(dilations), causal, None, is_global)
        ref = create_block_mask(mod, None, H, T, T, device="cpu", BLOCK_SIZE=block)
        assert listed(ours[0], ours[1]) == listed(ref.kv_num_blocks, ref.kv_indices)
        assert listed(ours[2], ours[3]) == listed(ref.full_kv_num_blocks, ref.full_kv_indices)


def test_an_encoder_classifies_from_a_first_token_that_sees_every_input():
    """Longformer gives the classified token global attention so that it reads the whole sequence: with
    global_tokens [0], one local layer of window 2 lets the first token's output depend on every input; without,
    on the first three only."""
    torch.manual_seed(1)
    for globals_, reach in ((None, 3), ([0], 40)):
        cfg = ModelConfig(
            arch="encoder",
            n_classes=3,
            classifier="first",
            vocab_size=20,
            d_model=16,
            n_heads=2,
            n_layers=1,
            pattern="local",
            window=2,
            global_tokens=globals_,
        )
        model = Transformer(cfg).double()
        x = model.embed(torch.randint(1, 20, (1, 40))).detach().requires_grad_()
        model.embed.register_forward_hook(lambda module, inputs, output, x=x: x)  # gradients reach the embeddings
        (g,) = torch.autograd.grad(model(torch.zeros(1, 40, dtype=torch.long)).sum(), x)
        assert (g[0].abs().sum(-1) > 0).sum().item() == reach


# --- CUDA ----------------------------------------------------------------------------------------------


@cuda
@pytest.mark.parametrize("dilations", [(1,) * 8, (1, 1, 1, 1, 2, 2, 2, 2)])
def test_cuda_flex_in_bf16_with_heads_of_64_and_alibi_equals_the_tiled_kernels(dilations):
    """The size a model trains at (bf16, heads of 64, 1k tokens, window 256, ALiBi): FlexAttention picks its
    largest tiles there, and its kernel must fit the GPU's shared memory (the ALiBi table it once gathered did
    not, on an H100). Outputs and gradients equal the tiled kernels' in fp32 on the same bf16 inputs."""
    dev = torch.device("cuda")
    torch.manual_seed(0)
    H, D, T = 8, 64, 1024
    score = make_score("dot", H, D).to(dev)
    bias = ALiBi(H, causal=True).to(dev).bias
    pattern = pattern_for(256, dilations)
    q, k, v = (torch.randn(2, H, T, D, device=dev).bfloat16().requires_grad_() for _ in range(3))
    g = torch.randn(2, H, T, D, device=dev)
    results = []
    for mode, dtype in (("off", torch.float32), ("auto", torch.bfloat16)):
        with flex.mode(mode):
            a, b, c = (x.to(dtype) for x in (q, k, v))
            out = pattern.attend(a, b, c, score, causal=True, bias=bias)
            grads = torch.autograd.grad(out.float(), (q, k, v), g)
            results.append((out.float(), *(x.float() for x in grads)))
    for ours, tiled in zip(*results):
        torch.testing.assert_close(ours, tiled, rtol=2e-2, atol=2e-2)


@cuda
@pytest.mark.parametrize("name", DOT_LIKE)
@pytest.mark.parametrize("causal", [False, True])
def test_cuda_flex_outputs_and_gradients_equal_the_tiled_kernels(name, causal):
    """On CUDA (the default mode routes here): outputs and gradients of q, k, v equal the tiled kernels', for
    local and per-head dilated windows, ALiBi and padding, at lengths across block boundaries."""
    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(DOT_LIKE.index(name) * 2 + causal)
    H, D = 4, 64
    for trial in range(8):
        T = int(torch.randint(130, 700, (), generator=gen))
        window = int(torch.randint(1, 160, (), generator=gen))
        dilations = HEAD_DILATIONS[trial % 4]
        padded, alibi = trial % 2 == 0, trial % 3 != 1
        score = make_score(name, H, D).float().to(dev)
        q, k, v = (torch.randn(2, H, T, D, generator=gen).to(dev).requires_grad_() for _ in range(3))
        pad = torch.zeros(2, T, dtype=torch.bool)
        pad[1, int(torch.randint(T // 2, T + 1, (), generator=gen)) :] = True
        pad = pad.to(dev) if padded else None
        bias = ALiBi(H, causal).to(dev).bias if alibi else None
        pattern = pattern_for(window, dilations)
        g = torch.randn(2, H, T, D, generator=gen).to(dev)
        results = []
        for mode in ("off", "auto"):
            with flex.mode(mode):
                qp, kp = score.prepare(q, k)
                out = pattern.attend(qp, kp, v, score, causal=causal, key_padding=pad, bias=bias)
                real = real_rows(out, pad)
                grads = torch.autograd.grad(out, (q, k, v), g * real)
                results.append((out[real], *grads))
        for ours, tiled in zip(*results):
            torch.testing.assert_close(ours, tiled, rtol=2e-4, atol=2e-4)


@cuda
@pytest.mark.parametrize("dilations", [(1, 1, 1, 1), (1, 1, 2, 3)])
def test_cuda_flex_with_global_tokens_equals_the_tiled_kernels(dilations):
    """Longformer's global tokens on CUDA: outputs and gradients of q, k, v equal the tiled kernels', with
    padding and ALiBi, at a length across block boundaries (global rows and columns in several blocks)."""
    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(7)
    H, D, T = 4, 64, 700
    pattern = pattern_for(40, dilations)
    pattern = type(pattern)(LayerAttention(pattern.layer.pattern, 40, dilations, (0, 130, 699)))
    score = make_score("dot", H, D).float().to(dev)
    q, k, v = (torch.randn(2, H, T, D, generator=gen).to(dev).requires_grad_() for _ in range(3))
    pad = torch.zeros(2, T, dtype=torch.bool, device=dev)
    pad[1, 600:] = True
    bias = ALiBi(H, False).to(dev).bias
    g = torch.randn(2, H, T, D, generator=gen).to(dev)
    results = []
    for mode in ("off", "auto"):
        with flex.mode(mode):
            out = pattern.attend(q, k, v, score, key_padding=pad, bias=bias)
            real = real_rows(out, pad)
            results.append((out[real], *torch.autograd.grad(out, (q, k, v), g * real)))
    for ours, tiled in zip(*results):
        torch.testing.assert_close(ours, tiled, rtol=2e-4, atol=2e-4)


@cuda
def test_cuda_decoder_trains_the_same_through_flex_attention():
    """A local decoder's loss and gradients on CUDA equal the tiled path's (1k tokens, window 64, ALiBi)."""
    torch.manual_seed(3)
    cfg = ModelConfig(arch="decoder", d_model=128, n_heads=2, n_layers=2, positions="alibi", pattern="local", window=64)
    model = Transformer(cfg).cuda()
    tokens = torch.randint(1, 256, (2, 1025), device="cuda")
    grads = []
    for mode in ("off", "auto"):
        model.zero_grad()
        with flex.mode(mode):
            logits = model(tokens[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
            loss.backward()
        grads.append([loss.detach()] + [p.grad.clone() for p in model.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)
