"""The CUDA path of local and dilated attention (models/flex.py, torch's FlexAttention) against the tiled
kernels (the CPU path) and a dense band reference written out here.

On CPU, FlexAttention runs its forward only: uncompiled (``mode("eager")``: the scores materialised, every
mask and score modification applied to every pair) and compiled (``mode("compiled")``: the block-sparse
kernel, which reads only the blocks of the BlockMask; slow). Gradients and the CUDA kernels are checked by the
``cuda`` tests, which skip here without a device.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask

from models import ModelConfig, Transformer, flex
from models.attention import SCORES, MultiHeadAttention
from models.config import LayerAttention
from models.patterns import DilatedPattern, LocalPattern
from models.positions import ALiBi
from tests.models.devices import cuda
from tests.models.naive import press_get_slopes
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
    dilation, ALiBi and padding, at a length that is not a multiple of the block; and with global tokens (their
    columns in the blocks, without ALiBi; their rows through global projections of their own)."""
    torch.manual_seed(1)
    H, D = 4, 16
    for T, window, dilations, causal, padded, globals_ in [
        (300, 20, (1, 1, 1, 1), True, False, ()),
        (333, 30, (1, 1, 2, 3), False, True, ()),
        (333, 30, (1, 1, 2, 3), False, True, (0, 140, 332)),
    ]:
        pattern = pattern_for(window, dilations)
        pattern = type(pattern)(LayerAttention(pattern.layer.pattern, window, dilations, globals_))
        score = SCORES["dot"](H, D)
        q, k, v, k_g, v_g = (torch.randn(2, H, T, D) for _ in range(5))
        kw = {"global_qkv": (torch.randn(2, H, len(globals_), D), k_g, v_g)} if globals_ else {}
        pad = torch.zeros(2, T, dtype=torch.bool)
        pad[1, 200:] = True
        pad = pad if padded else None
        bias = ALiBi(H, causal).bias
        with flex.mode("off"):
            tiled = pattern.attend(q, k, v, score, causal=causal, key_padding=pad, bias=bias, **kw)
        with flex.mode("compiled"):
            out = pattern.attend(q, k, v, score, causal=causal, key_padding=pad, bias=bias, **kw)
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

GLOBAL_CASES = [  # T, window, head dilations, global positions
    (150, 3, (1, 1, 1, 1), (0,)),  # tiles (T > 64, a small window)
    (150, 3, (1, 1, 2, 3), (0, 77, 149)),  # 149: a padding position of the second sequence
    (40, 4, (1, 1, 1, 1), (0, 5)),  # band-masked full attention (short sequence)
    (40, 2, (1, 2, 2, 3), (3,)),
    (300, 9, (1, 1, 2, 2), (0, 250)),
    (150, 3, (1, 1), (0, 100, 200)),  # a position past the sequence is no global token of it
    (20, 30, (1, 1), (0, 7)),  # a window that covers the sequence: the global rows and columns still differ
]


def longformer_reference(name, score, q, k, v, rows, window, dilations, globals_, pad, bias):
    """Longformer's attention (Beltagy et al. 2020, section 3.1; Hugging Face's LongformerSelfAttention) written out
    densely, from its equations, apart from the kernels. A query that is not global: one softmax over the keys of its
    head's window and the global keys (each once), scores s(q_i, k_j) plus bias(i - j) in the window and no bias at a
    global key, over the values v. A global query i: one softmax over every key of s(Q_g q_i, K_g k_j), no bias, over
    the values V_g (``rows``: q_g of the global tokens, k_g, v_g of every key). Padding keys are masked; a query with no
    key left attends to every one (finite; its output is ignored)."""
    T = q.shape[-2]
    g = [t for t in globals_ if t < T]
    is_global = torch.zeros(T, dtype=torch.bool)
    is_global[g] = True
    real = ~pad[:, None, None, :]  # (B, 1, 1, T)

    def softmax(s, mask):
        mask = mask | ~mask.any(-1, keepdim=True)
        return torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1)

    dist = torch.arange(T)[:, None] - torch.arange(T)[None, :]
    s = oracle_scores(name, score, q, k) + torch.where(is_global, 0.0, bias(dist))[None]  # (B, H, T, T)
    out = softmax(s, (head_bands(T, window, dilations, False)[None] | is_global) & real) @ v
    q_g, k_g, v_g = rows
    global_rows = softmax(oracle_scores(name, score, q_g, k_g), real) @ v_g  # (B, H, G, D)
    for n, t in enumerate(g):  # a global token's row replaces the one its window gave
        out = torch.cat([out[:, :, :t], global_rows[:, :, n : n + 1], out[:, :, t + 1 :]], dim=2)
    return out


@pytest.mark.parametrize("projections", ["separate", "shared"])
@pytest.mark.parametrize("name", ["dot", "general", "additive"])
@pytest.mark.parametrize("T,window,dilations,globals_", GLOBAL_CASES)
def test_global_tokens_equal_longformer_written_out(name, T, window, dilations, globals_, projections):
    """The tiled kernels (global keys as extra columns of every tile, global rows as one dense call: outputs and
    gradients of q, k, v and of the global projections' q_g, k_g, v_g, float64) and the uncompiled FlexAttention
    forward (global columns in its mask, global rows apart; dot-like scores) against Longformer's equations written
    out here, with padding and ALiBi, local and per-head dilated, tiles, band path and a window that covers all;
    ``shared``: the global rows read the window's q, k, v (no ``global_qkv``)."""
    gen = torch.Generator().manual_seed(T + window)
    H, D = len(dilations), 8
    score = make_score(name, H, D)
    leaf = lambda: torch.randn(2, H, T, D, dtype=torch.float64, generator=gen).requires_grad_()  # noqa: E731
    q, k, v = leaf(), leaf(), leaf()
    g = torch.tensor([t for t in globals_ if t < T])
    if projections == "separate":
        q_all, k_g, v_g = leaf(), leaf(), leaf()
        inputs, rows = (q, k, v, q_all, k_g, v_g), (q_all[:, :, g], k_g, v_g)
    else:
        inputs, rows = (q, k, v), (q[:, :, g], k, v)
    pad = torch.zeros(2, T, dtype=torch.bool)
    pad[1, T - 7 :] = True
    bias = ALiBi(H, False).double().bias
    la = LayerAttention("dilated" if max(dilations) > 1 else "local", window, tuple(dilations), tuple(globals_))
    pattern = (DilatedPattern if max(dilations) > 1 else LocalPattern)(la)
    ref = longformer_reference(name, score, q, k, v, rows, window, dilations, globals_, pad, bias)
    real = real_rows(ref, pad)
    qp, kp = score.prepare(q, k)
    kw = {}
    if projections == "separate":
        q_gp, k_gp = score.prepare(q_all, k_g)
        kw["global_qkv"] = (q_gp[:, :, g], k_gp, v_g)
    with flex.mode("off"):
        tiled = pattern.attend(qp, kp, v, score, key_padding=pad, bias=bias, **kw)
    torch.testing.assert_close(tiled[real], ref[real], rtol=1e-9, atol=1e-10)
    grad = torch.randn(ref.shape, dtype=torch.float64, generator=gen) * real  # padding queries' outputs: ignored
    for ours, want in zip(torch.autograd.grad(tiled, inputs, grad), torch.autograd.grad(ref, inputs, grad)):
        torch.testing.assert_close(ours, want, rtol=1e-9, atol=1e-10)
    if name != "additive":
        with torch.no_grad(), flex.mode("eager"):  # forward only on CPU
            detached = {"global_qkv": tuple(t.detach() for t in kw["global_qkv"])} if kw else {}
            out = pattern.attend(qp.detach(), kp.detach(), v.detach(), score, key_padding=pad, bias=bias, **detached)
        torch.testing.assert_close(out[real], ref[real].detach(), rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("path", ["band", "tiles", "flex"])
@pytest.mark.parametrize("dilations", [(1, 1, 1, 1), (1, 1, 2, 3)])
def test_under_alibi_every_query_puts_the_same_attention_on_a_global_token_whatever_its_distance(path, dilations):
    """Longformer's global tokens are read by every query alike (section 3.1: "all tokens attend to it"), which is
    what a classifier reading the first token relies on. With every query and key alike (equal scores), query i's
    attention on global token 0 is 1 / (1 + sum over the other keys j of its window of exp(alibi_h(i - j))), Press et
    al.'s slopes written out here: the window's shape only, the same for every query whose window is whole, at distance
    5 or 150 from the token. (With ALiBi on the global column, late queries of a 160-token sequence put between 9e-14
    and 5e-2 of their attention on it, depending on the head.)"""
    T = 40 if path == "band" else 160
    H, D, window = len(dilations), 8, 3
    pattern = pattern_for(window, dilations)
    pattern = type(pattern)(LayerAttention(pattern.layer.pattern, window, dilations, (0,)))
    q = torch.full((1, H, T, D), 0.3, dtype=torch.float64)
    v = torch.zeros(1, H, T, D, dtype=torch.float64)
    v[:, :, 0, 0] = 1.0  # out[..., i, 0] is query i's attention on token 0
    with torch.no_grad(), flex.mode("eager" if path == "flex" else "off"):
        out = pattern.attend(q, q, v, SCORES["dot"](H, D), bias=ALiBi(H, False).double().bias)
    on_global = out[0, :, :, 0]  # (H, T)
    slopes = press_get_slopes(H)
    for h, d in enumerate(dilations):
        past, future = slopes[h], slopes[H - 1 - h]  # docs/components.md: future keys take the reversed slopes
        for i in range(1, T):
            others = [j for j in range(max(0, i - window * d), min(T, i + window * d + 1)) if (i - j) % d == 0 and j]
            z = sum(math.exp(-past * (i - j) if j <= i else -future * (j - i)) for j in others)
            assert on_global[h, i].item() == pytest.approx(1 / (1 + z), rel=1e-12), (h, i)
        whole = on_global[h, window * d + 1 : T - window * d]  # queries whose window is whole
        torch.testing.assert_close(whole, whole[:1].expand_as(whole), rtol=1e-12, atol=0)


def test_global_tokens_keep_the_tiles_and_reach_every_position():
    """The window's cost stays: no (T, T) tensor is built at 1,000 tokens with two global tokens and global
    projections of their own; the gradient of a global query's output reaches every value of the global projection
    (V_g) and none of the window's, while a query far from every global token reads its window and the global keys
    only, through the window's values."""
    torch.manual_seed(0)
    T, window = 1000, 4
    pattern = LocalPattern(LayerAttention("local", window, (1, 1), (0, 500)))
    score = SCORES["dot"](2, 8)
    q, k, v, k_g, v_g = (torch.randn(1, 2, T, 8, requires_grad=True) for _ in range(5))
    q_g = torch.randn(1, 2, 2, 8, requires_grad=True)
    sizes = []

    class Record(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor):
                    sizes.append(t.numel())
            return out

    with flex.mode("off"), Record():
        out = pattern.attend(q, k, v, score, global_qkv=(q_g, k_g, v_g))
    assert max(sizes) < T * T / 4
    g_v, g_vg = torch.autograd.grad(out[0, :, 0].sum(), (v, v_g), retain_graph=True, allow_unused=True)
    assert (g_vg[0].abs().sum((0, 2)) > 0).all() and (g_v is None or not g_v.any())  # Q_g, K_g, V_g only
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


ENCODER = {"arch": "encoder", "n_classes": 3}
GLOBAL_MODELS = [  # keys, the layers with global attention, the parameters of one layer's global projections
    # Q_g, K_g, V_g: three (C, C) matrices and their biases, 3 * (16 * 16 + 16) = 816 (C = d_model = 16)
    ({**ENCODER, "layer_patterns": ["local", "full", "dilated"], "n_layers": 3, "dilation": 2}, 2, 816),
    ({**ENCODER, "pattern": "local", "bias": False}, 2, 3 * 256),  # no biases
    # over the states (no q, k projections): Q_g and K_g are the states, V_g alone is projected
    ({**ENCODER, "pattern": "local", "qk_projections": False}, 2, 272),
    # the encoder's windowed layers; an autoregressive decoder (causal) has none, a non-autoregressive one has them
    ({"arch": "encoder_decoder", "pattern": "local"}, 2, 816),
    ({"arch": "encoder_decoder", "pattern": "local", "decoding": "mask_predict"}, 4, 816),
]


@pytest.mark.parametrize("keys,layers,per_layer", GLOBAL_MODELS)
def test_global_projections_are_parameters_of_their_own_that_start_as_the_windows(keys, layers, per_layer):
    """Longformer section 3.1: two sets of projections, Q_s, K_s, V_s for the window and Q_g, K_g, V_g for global
    attention, "all initialized with values that match Q_s, K_s, V_s". A model with global tokens has them in every
    layer with global attention, counted in its parameters (what cost/n_params logs): exactly their count more than
    with ``global_projections: shared``. They start as copies (the other weights are those of the same seed), so the
    model computes at initialisation what shared projections compute (as before they existed); they are trained."""
    cfg = ModelConfig(**{"d_model": 16, "n_heads": 2, "window": 2, "global_tokens": [0, 9], **keys})
    built = {}
    for projections in ("separate", "shared"):
        torch.manual_seed(0)
        built[projections] = Transformer(cfg.replace(global_projections=projections)).double()
    separate, shared = built["separate"], built["shared"]
    assert separate.num_parameters() - shared.num_parameters() == layers * per_layer
    theirs = shared.state_dict()
    mine = separate.state_dict()
    globals_ = {name: p for name, p in mine.items() if ".global_" in name}
    assert len(globals_) == layers * (1 + cfg.bias) and set(mine) - set(globals_) == set(theirs)
    assert all(torch.equal(mine[name], theirs[name]) for name in theirs)  # the same draws for the same seed
    for name, p in globals_.items():  # a copy of the window's projection (qkv_proj, or v_proj over the states)
        window = name.replace("global_qkv_proj", "qkv_proj").replace("global_v_proj", "v_proj")
        assert torch.equal(p, mine[window]) and p.data_ptr() != mine[window].data_ptr(), name
    src = torch.randint(1, 200, (2, 30))
    args = (src,) if cfg.arch == "encoder" else (src, torch.randint(1, 200, (2, 12)))
    torch.testing.assert_close(separate(*args), shared(*args), rtol=0, atol=0)
    separate(*args).sum().backward()
    assert all(p.grad is not None and p.grad.any() for n, p in separate.named_parameters() if ".global_" in n)


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
    """Longformer's global tokens on CUDA: outputs and gradients of q, k, v and of the global projections' q_g, k_g,
    v_g equal the tiled kernels', with padding and ALiBi (none on the global columns), at a length across block
    boundaries (global columns in several blocks)."""
    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(7)
    H, D, T = 4, 64, 700
    globals_ = (0, 130, 699)
    pattern = pattern_for(40, dilations)
    pattern = type(pattern)(LayerAttention(pattern.layer.pattern, 40, dilations, globals_))
    score = make_score("dot", H, D).float().to(dev)
    q, k, v, k_g, v_g = (torch.randn(2, H, T, D, generator=gen).to(dev).requires_grad_() for _ in range(5))
    q_g = torch.randn(2, H, len(globals_), D, generator=gen).to(dev).requires_grad_()
    pad = torch.zeros(2, T, dtype=torch.bool, device=dev)
    pad[1, 600:] = True
    bias = ALiBi(H, False).to(dev).bias
    g = torch.randn(2, H, T, D, generator=gen).to(dev)
    results = []
    for mode in ("off", "auto"):
        with flex.mode(mode):
            out = pattern.attend(q, k, v, score, key_padding=pad, bias=bias, global_qkv=(q_g, k_g, v_g))
            real = real_rows(out, pad)
            results.append((out[real], *torch.autograd.grad(out, (q, k, v, q_g, k_g, v_g), g * real)))
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
