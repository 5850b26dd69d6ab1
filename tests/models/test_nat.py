"""Non-autoregressive decoding, each in its paper's form: Gu et al. (2018)'s NAT decoder (``nat_gu``) predicts the
target length from the encoder and every target token in one pass from the source embeddings copied uniformly, with
positional attention and a self-attention that masks each query's own position; ``uniform_copy`` is its inputs alone
on a plain non-causal decoder; mask-predict (Ghazvininejad et al. 2019) reads [MASK] inputs, trains as a conditional
masked language model, refines the least confident tokens and decodes several length candidates at evaluation."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from models import ConfigError, ModelConfig, Transformer

COPIES = ["nat_gu", "uniform_copy"]  # the decodings whose inputs are Gu et al.'s uniform copy of the source


def nat(decoding: str = "mask_predict", **kw) -> Transformer:
    cfg = dict(arch="encoder_decoder", vocab_size=13, d_model=16, n_heads=2, max_len=12, decoding=decoding)
    return Transformer(ModelConfig(**{**cfg, **kw})).double().eval()


@pytest.mark.parametrize("decoding", [*COPIES, "mask_predict"])
def test_every_target_position_sees_every_other_one(decoding):
    """The decoder self-attention is not causal: a later decoder input changes earlier outputs (it would not in the
    autoregressive decoder). NAT's inputs are copies of the source, so a later source token stands for it."""
    torch.manual_seed(0)
    src = torch.randint(4, 13, (2, 6))
    tgt = torch.randint(4, 13, (2, 5))
    model = nat(decoding)
    if decoding in COPIES:  # input 4 of a 5-token target copies source token round(4 * 5 / 4) = 5
        other_src = src.clone()
        other_src[:, 5] = (other_src[:, 5] - 3) % 9 + 4
        memory = model.encode(src)
        a = model._decode(tgt, memory, copied=model.uniform_copy(src, None, torch.full((2,), 5), 5))
        b = model._decode(tgt, memory, copied=model.uniform_copy(other_src, None, torch.full((2,), 5), 5))
    else:
        other = tgt.clone()
        other[:, 4] = (other[:, 4] - 3) % 9 + 4
        known = torch.zeros(2, 5, dtype=torch.bool)  # every input is a known token (none masked)
        a, b = model(src, tgt, target_masked=known), model(src, other, target_masked=known)
    assert (a[:, :4] - b[:, :4]).abs().max() > 1e-6
    ar = Transformer(model.cfg.replace(decoding="autoregressive", max_len=ModelConfig().max_len)).double().eval()
    other = tgt.clone()
    other[:, 4] = (other[:, 4] - 3) % 9 + 4
    torch.testing.assert_close(ar(src, tgt)[:, :4], ar(src, other)[:, :4])


def fairseq_uniform_assignment(src_len: int, trg_len: int) -> list[int]:
    """fairseq's ``_uniform_assignment`` (nonautoregressive_transformer.py), Gu et al.'s uniform copy, written out for
    one sentence: step (S - 1) / (T' - 1), input t copies source token round(step * t); T' = 1 copies token 0."""
    if trg_len == 1:
        return [0]
    step = (src_len - 1) / (trg_len - 1)
    return [round(step * t) for t in range(trg_len)]


@pytest.mark.parametrize("decoding", COPIES)
def test_gu_et_al_read_the_source_embeddings_copied_uniformly(decoding):
    """Gu et al. (2018, section 3.1): each decoder input is a copy of a source token's embedding, spread uniformly
    from the first source token to the last, whatever the two lengths; the target's tokens are never read."""
    torch.manual_seed(1)
    model = nat(decoding)
    src = torch.randint(4, 13, (1, 9))
    for S in range(1, 10):
        pad = torch.arange(9)[None] >= S  # right-padded: S real tokens
        for L in range(1, 13):
            got = model.uniform_copy(src, pad, torch.tensor([L]), L)[0]
            index = fairseq_uniform_assignment(S, L)
            torch.testing.assert_close(got, model.embed.weight[src[0, index]], rtol=0, atol=0)
            assert index[0] == 0 and index[-1] == (S - 1 if L > 1 else 0)
    tgt, other = torch.randint(4, 13, (2, 6)), torch.randint(4, 13, (2, 6))
    src = torch.randint(4, 13, (2, 7))
    torch.testing.assert_close(model(src, tgt), model(src, other), rtol=0, atol=0)
    with torch.no_grad():  # the copies enter the decoder scaled like token embeddings, with its positions
        x = model._embed(model.tgt_embed, tgt, copied=model.uniform_copy(src, None, torch.full((2,), 6), 6))
    want = model.embed.weight[src[:, [0, 1, 2, 4, 5, 6]]] * model.emb_scale + model.positions.table[:6]
    torch.testing.assert_close(x, want.to(x.dtype))


# --- Gu et al. (2018)'s decoder layer, section 3.1 and Figure 2, written out from the paper ----------------------


def layer_norm(x: torch.Tensor, norm) -> torch.Tensor:
    """Ba et al.'s layer normalisation with the norm's gain and bias."""
    mean, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
    return (x - mean) / torch.sqrt(var + norm.eps) * norm.weight + norm.bias


def attention(q_in, k_in, v_in, w_q, b_q, w_k, b_k, w_v, b_v, out, heads: int, allowed) -> torch.Tensor:
    """Multi-head Attention(Q, K, V) = softmax(Q K^T / sqrt(D)) V (Vaswani et al.; Gu et al. use it in every
    attention of their network), each head over its D columns of the projections, the heads concatenated and
    projected by ``out``; allowed (B, T, S) True where a query may see a key."""
    Q, K, V = q_in @ w_q.T + b_q, k_in @ w_k.T + b_k, v_in @ w_v.T + b_v  # (B, T or S, H D)
    D = Q.shape[-1] // heads
    outs = []
    for h in range(heads):
        cols = slice(h * D, (h + 1) * D)
        scores = Q[..., cols] @ K[..., cols].transpose(-1, -2) / math.sqrt(D)
        outs.append(torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1) @ V[..., cols])
    return torch.cat(outs, -1) @ out.weight.T + out.bias


def thirds(linear):
    """The q, k, v weights and biases of a (3 H D, C) projection."""
    w, b = linear.weight.chunk(3, 0), linear.bias.chunk(3, 0)
    return w[0], b[0], w[1], b[1], w[2], b[2]


def sinusoids(T: int, C: int) -> torch.Tensor:
    """Vaswani et al.'s PE(p, 2i) = sin(p / 10000^(2i/C)), PE(p, 2i+1) = cos(p / 10000^(2i/C))."""
    pe = torch.zeros(T, C, dtype=torch.float64)
    for p in range(T):
        for i in range(0, C, 2):
            pe[p, i] = math.sin(p / 10000 ** (i / C))
            pe[p, i + 1] = math.cos(p / 10000 ** (i / C))
    return pe


@torch.no_grad()
def reference_gu_decoder(model: Transformer, src: torch.Tensor, lengths: list[int], T: int) -> torch.Tensor:
    """The logits (B, T, V) of a one-layer decoder as Gu et al. (2018) section 3.1 defines it, from the model's
    weights: inputs the source embeddings copied uniformly (scaled like token embeddings) plus the positional
    encodings; self-attention not causal, each query masked from its own position (a query with no other key keeps
    its own: the softmax needs one); positional attention, queries and keys the positional encodings, values the
    states; cross-attention over the encoder's output; the feed-forward network; each a residual sub-layer with its
    norm before it (pre) or after the sum (post). ``uniform_copy``: the same without the mask and the positional
    attention. Positions past a target's length are padding: masked as keys, their rows not compared."""
    cfg, layer = model.cfg, model.dec_layers[0]
    gu, post, C, H = cfg.decoding == "nat_gu", cfg.norm == "post", cfg.d_model, cfg.n_heads
    B, S = src.shape
    memory = model.encode(src)  # the encoder is not under test
    if cfg.positions == "sinusoidal":  # the model keeps its table in float32
        pe = sinusoids(T, C).float().double()
    else:
        pe = model.positions.table.weight[:T] * math.sqrt(C)
    x = torch.zeros(B, T, C, dtype=torch.float64)
    for b, n in enumerate(lengths):
        x[b, :n] = model.embed.weight[src[b, fairseq_uniform_assignment(S, n)]] * math.sqrt(C)
    x = x + pe
    real = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]  # (B, T) keys that are not padding
    seen = real[:, None, :].expand(B, T, T)
    if gu:
        seen = seen & ~torch.eye(T, dtype=torch.bool)
        seen = seen | (torch.eye(T, dtype=torch.bool) & ~seen.any(-1, keepdim=True))  # no other key: its own
    attn, pos, cross, ff = (layer.attn.sublayer, layer.pos_attn, layer.cross.sublayer, layer.ff.sublayer)
    w_k, w_v = cross.kv_proj.weight.chunk(2, 0)
    b_k, b_v = cross.kv_proj.bias.chunk(2, 0)

    def self_attention(h):  # queries, keys and values the states
        return attention(h, h, h, *thirds(attn.qkv_proj), attn.out_proj, H, seen)

    def positional_attention(h):  # queries and keys the positional encodings, values the states
        return attention(pe, pe, h, *thirds(pos.sublayer.qkv_proj), pos.sublayer.out_proj, H, real[:, None, :])

    def inter_attention(h):  # over every source position
        every = torch.ones(B, T, S, dtype=torch.bool)
        return attention(
            h, memory, memory, cross.q_proj.weight, cross.q_proj.bias, w_k, b_k, w_v, b_v, cross.out_proj, H, every
        )

    def feed_forward(h):
        return torch.relu(h @ ff.linear1.weight.T + ff.linear1.bias) @ ff.linear2.weight.T + ff.linear2.bias

    sublayers = [(layer.attn, self_attention), (layer.cross, inter_attention), (layer.ff, feed_forward)]
    if gu:  # Figure 2: after the self-attention, before the inter-attention
        sublayers.insert(1, (pos, positional_attention))
    for residual, f in sublayers:
        norm = residual.post_norm if post else residual.pre_norm
        x = layer_norm(x + f(x), norm) if post else x + f(layer_norm(x, norm))
    if not post:
        x = layer_norm(x, model.dec_norm)
    return x @ model.head.weight.T


@pytest.mark.parametrize("decoding", COPIES)
@pytest.mark.parametrize("norm,positions", [("pre", "sinusoidal"), ("post", "sinusoidal"), ("pre", "learned")])
def test_a_gu_et_al_decoder_layer_equals_the_paper_written_out(decoding, norm, positions):
    """Gu et al.'s decoder (nat_gu) and its uniform-copy inputs alone (uniform_copy), one layer, recomputed by hand
    from the model's weights: padded targets of lengths 5, 3 and 1 (whose one query has no other key), pre and post
    norm, sinusoidal and learned positional encodings."""
    torch.manual_seed(5)
    model = nat(decoding, n_layers=1, n_decoder_layers=1, n_heads=4, norm=norm, positions=positions)
    if decoding == "nat_gu":
        names = [n for n, _ in model.dec_layers[0].named_children()]
        assert names == ["attn", "pos_attn", "cross", "ff"]  # Figure 2's order
    src = torch.randint(4, 13, (3, 7))
    lengths = [5, 3, 1]
    tpad = torch.arange(5)[None, :] >= torch.tensor(lengths)[:, None]
    tgt = torch.randint(4, 13, (3, 5)).masked_fill(tpad, 0)
    got = model(src, tgt, target_padding=tpad)
    want = reference_gu_decoder(model, src, lengths, 5)
    for b, n in enumerate(lengths):
        torch.testing.assert_close(got[b, :n], want[b, :n], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize(
    "pattern,T",
    [
        (("full", None, (1, 1, 1, 1)), 9),
        (("local", 3, (1, 1, 1, 1)), 40),
        (("local", 3, (1, 1, 1, 1)), 150),
        (("dilated", 3, (1, 1, 2, 3)), 150),
    ],
    ids=["full", "local band", "local tiles", "dilated"],
)
def test_each_query_gives_its_own_position_no_attention(pattern, T):
    """Gu et al. section 3.1: "we mask out each query position only from attending to itself". Moving query i's own
    value changes nothing at i (its probability is exactly 0) but changes its neighbours, which still see it, on
    every kernel path of the non-causal self-attention, with padding keys; a one-token target attends to itself."""
    from models.blocks import self_attention
    from models.config import LayerAttention

    torch.manual_seed(6)
    cfg = ModelConfig(arch="encoder_decoder", d_model=16, n_heads=4, decoding="nat_gu")
    attn = self_attention(cfg, LayerAttention(*pattern), causal=False, exclude_self=True).double().eval()
    x = torch.randn(2, T, 16, dtype=torch.float64)
    pad = torch.zeros(2, T, dtype=torch.bool)
    pad[1, -5:] = True
    base = attn(x, key_padding=pad)
    for i in (0, 1, (T - 5) // 2, T - 7):  # i and i + 1 are real positions of both rows
        shift = torch.zeros(2, T, 3 * 16, dtype=torch.float64)
        shift[:, i, 32:] = torch.randn(16, dtype=torch.float64)  # query i's value only
        hook = attn.qkv_proj.register_forward_hook(lambda m, inp, out, shift=shift: out + shift)
        moved = attn(x, key_padding=pad)
        hook.remove()
        torch.testing.assert_close(moved[:, i], base[:, i], rtol=0, atol=1e-12)
        assert (moved[:, i + 1] - base[:, i + 1]).abs().min() > 1e-6  # its neighbour sees it
    one = torch.randn(2, 1, 16, dtype=torch.float64)  # no other key: the softmax keeps the query's own
    v = one @ attn.qkv_proj.weight[32:].T + attn.qkv_proj.bias[32:]
    torch.testing.assert_close(attn(one), attn.out_proj(v))


@pytest.mark.parametrize("positions", ["rotary", "alibi", "none"])
def test_positional_attention_needs_positional_encodings(positions):
    """Gu et al.'s positional attention reads the encodings the decoder adds to its inputs: schemes that add none
    are refused, with the two ways out; its own projections and norm exist in nat_gu only."""
    with pytest.raises(
        ConfigError, match=rf"decoding='nat_gu' .*positions='{positions}' adds none.*uniform_copy"
    ) as err:
        ModelConfig(arch="encoder_decoder", n_heads=2, decoding="nat_gu", positions=positions)
    assert err.value.fields == ("decoding", "positions")
    ModelConfig(arch="encoder_decoder", n_heads=2, decoding="uniform_copy", positions=positions)
    gu, plain = nat("nat_gu"), nat("uniform_copy")
    extra = {n for n, _ in gu.named_parameters()} - {n for n, _ in plain.named_parameters()}
    assert extra == {
        f"dec_layers.{i}.pos_attn.{p}"
        for i in range(2)
        for p in ("pre_norm.weight", "pre_norm.bias", "sublayer.qkv_proj.weight", "sublayer.qkv_proj.bias")
        + ("sublayer.out_proj.weight", "sublayer.out_proj.bias")
    }


def test_nat_is_refused_with_the_two_names_that_say_what_it_is():
    """Until 2026-11-28 ``decoding: nat`` named Gu et al.'s NAT but built its uniform-copy inputs alone: a run file
    that says ``nat`` is refused (it would otherwise load as another model), naming what it built."""
    with pytest.raises(
        ConfigError, match=r"decoding='nat' named Gu et al.*decoding='uniform_copy' \(what 'nat' built\)"
    ):
        ModelConfig(arch="encoder_decoder", decoding="nat")


@torch.no_grad()
def reference_mask_predict(model: Transformer, src: torch.Tensor, iterations: int, eos: int) -> list[int]:
    """Ghazvininejad et al. (2019), section 3.2, and their reference code (``MaskPredict.generate``: at least one
    token re-masked, ``select_worst``), for one source, written out plainly with full forward passes."""
    memory = model.encode(src[None])
    length = max(1, int(model.predict_length(memory).argmax()))  # their code raises length candidates to a minimum
    return mask_predict_at(model, src, length, iterations)[0] + [eos]


@torch.no_grad()
def mask_predict_at(model: Transformer, src: torch.Tensor, length: int, iterations: int):
    """Mask-predict of one source at a given length: (tokens, each token's log-probability when last predicted)."""
    tokens = torch.zeros(1, length, dtype=torch.long)
    masked = [True] * length
    probs = [0.0] * length
    for t in range(iterations):
        if t > 0:
            n = max(1, length * (iterations - t) // iterations)
            order = sorted(range(length), key=lambda i: probs[i])
            masked = [i in order[:n] for i in range(length)]
        logits = model(src[None], tokens, target_masked=torch.tensor([masked])).float()
        logits[..., 0] = float("-inf")
        logp = torch.log_softmax(logits, -1)[0]
        for i in range(length):
            if masked[i]:
                tokens[0, i] = int(logp[i].argmax())
                probs[i] = float(logp[i].max())
    return tokens[0].tolist(), probs


LENGTHS = [0, 1, 2, 3, 5, 7, 8, 4]  # predicted for the 8 sources of the tests below: 0 and 1 among them


def set_lengths(model: Transformer, lengths: list[int]) -> Transformer:
    """The length predictor (trained in its own test) made to predict ``lengths`` for a batch of that size."""

    def predict(memory, padding=None):
        logits = Transformer.predict_length(model, memory, padding)
        chosen = torch.tensor(lengths[: logits.shape[0]] if logits.shape[0] > 1 else [lengths[predict.row]])
        return logits + 1e3 * F.one_hot(chosen, logits.shape[-1]).to(logits.dtype)

    predict.row = 0
    model.predict_length = predict
    return model


@pytest.mark.parametrize("iterations", [1, 2, 4])
def test_mask_predict_equals_a_plain_reference(iterations):
    torch.manual_seed(1)
    model = set_lengths(nat(nat_iterations=iterations), LENGTHS)
    src = torch.randint(4, 13, (8, 7))
    pad = torch.zeros(8, 7, dtype=torch.bool)
    out = model.parallel_decode(src, pad, eos_id=2)
    for i in range(8):
        model.predict_length.row = i  # the reference decodes source i alone
        want = reference_mask_predict(model, src[i], iterations, eos=2)
        got = out[i].tolist()
        assert len(want) == max(1, LENGTHS[i]) + 1
        assert got[: len(want)] == want and all(t == 0 for t in got[len(want) :])
    assert torch.equal(model.generate(source=src, source_padding=pad, max_new_tokens=20, eos_id=2), out)


def reference_length_beam(model: Transformer, src, length_logits: list[float], k: int, iterations: int, eos: int):
    """Ghazvininejad et al. (2019) section 3.3 and their ``generate_cmlm.py``: the k most probable lengths (equal
    logits: the shorter first; raised to at least 1 as their code raises its candidates to its minimum), each decoded
    alone, the output of the highest average log-probability of its tokens kept (the first, more probable, of equal
    averages)."""
    ranking = sorted(range(len(length_logits)), key=lambda n: (-length_logits[n], n))[:k]
    best = None
    for n in ranking:
        tokens, logp = mask_predict_at(model, src, max(1, n), iterations)
        average = sum(logp) / len(logp)
        if best is None or average > best[0]:
            best = (average, tokens)
    return best[1] + [eos]


def set_length_logits(model: Transformer, logits: torch.Tensor) -> Transformer:
    """The length predictor made to give ``logits`` (B, max_len + 1) for a batch of B sources."""
    model.predict_length = lambda memory, padding=None: logits[: memory.shape[0]].to(memory.dtype)
    return model


def length_logits(seed: int) -> torch.Tensor:
    """(8, 13) logits of lengths 0 .. 12 with ties: 0 and 1 first (both decode one token), 4 and 2 equal (2 ranks
    first), the longest length first, the shortest lengths last."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(8, 13, generator=g, dtype=torch.float64)
    logits[0, [0, 1]] = 5.0
    logits[1, [4, 2]] = 5.0
    logits[2, 12] = 5.0
    logits[3, [5, 6, 7]] = 5.0
    logits[4, :3] = -5.0
    return logits


@pytest.mark.parametrize("iterations,k", [(1, 1), (1, 3), (3, 3), (2, 13)])
def test_the_length_beam_equals_decoding_each_candidate_alone(iterations, k):
    """Mask-predict with k length candidates (all 13 lengths 0 .. max_len at k = 13) decoded as rows of one batch
    picks what decoding every candidate length separately and comparing average log-probabilities picks."""
    torch.manual_seed(7)
    model = nat(nat_iterations=iterations, length_candidates=k)
    logits = length_logits(k)
    set_length_logits(model, logits)
    src = torch.randint(4, 13, (8, 7))
    out = model.parallel_decode(src, eos_id=2)
    width = 0
    for i in range(8):
        want = reference_length_beam(model, src[i], logits[i].tolist(), k, iterations, eos=2)
        got = out[i].tolist()
        assert got[: len(want)] == want and all(t == 0 for t in got[len(want) :]), (i, got, want)
        width = max(width, len(want))
    assert out.shape[1] == width  # the chosen lengths' width, not the longest candidate's
    assert torch.equal(model.generate(source=src, max_new_tokens=20, eos_id=2), out)


def test_equal_average_log_probabilities_keep_the_more_probable_length():
    """With one token besides padding every candidate's average log-probability is exactly 0: the length ranked
    first by the length predictor is kept (Ghazvininejad et al.'s ``max`` over candidates in their ranking), and
    the first of equal length logits is the shorter."""
    torch.manual_seed(8)
    model = nat(tgt_vocab_size=2, nat_iterations=2, length_candidates=4)
    logits = length_logits(0)
    set_length_logits(model, logits)
    out = model.parallel_decode(torch.randint(4, 13, (8, 7)), eos_id=2)
    for i in range(8):
        first = max(1, sorted(range(13), key=lambda n: (-float(logits[i, n]), n))[0])
        assert out[i].tolist() == [1] * first + [2] + [0] * (out.shape[1] - first - 1), i


def test_the_length_beam_is_mask_predict_s_and_acts_at_evaluation_only():
    """length_candidates is refused where it would change nothing (autoregressive decoding) or where the paper of
    the decoding decodes one length (Gu et al.); it stays out of the configuration's dictionary at 1, so every
    configuration written before it keeps its cell id; it exceeds no length the predictor knows."""
    base = dict(arch="encoder_decoder", n_heads=2)
    for decoding in ("autoregressive", *COPIES):
        with pytest.raises(
            ConfigError, match=rf"length_candidates=5 .*needs decoding='mask_predict' \(got decoding='{decoding}'"
        ):
            ModelConfig(**base, decoding=decoding, length_candidates=5)
    with pytest.raises(ConfigError, match=r"length_candidates=6 is more than the 5 target lengths .*max_len=4"):
        ModelConfig(**base, decoding="mask_predict", max_len=4, length_candidates=6)
    with pytest.raises(ConfigError, match=r"length_candidates=0 must be a positive integer"):
        ModelConfig(**base, decoding="mask_predict", length_candidates=0)
    one, five = (
        ModelConfig(**base, decoding="mask_predict"),
        ModelConfig(**base, decoding="mask_predict", length_candidates=5),
    )
    assert "length_candidates" not in one.to_dict() and five.to_dict()["length_candidates"] == 5
    assert ModelConfig.from_dict(five.to_dict()) == five and ModelConfig.from_dict(one.to_dict()) == one
    with pytest.raises(ValueError, match=r"length_candidates=3: 'uniform_copy' decodes one length"):
        nat("uniform_copy").parallel_decode(torch.randint(4, 13, (1, 4)), length_candidates=3)


def test_no_decoder_pass_changes_nothing_and_no_length_is_zero():
    """Every refinement pass re-masks at least one token and fewer than all (all would be the first pass's input
    again), so a one-token target never goes through the decoder twice; a predicted length of 0 decodes one token
    (Ghazvininejad et al.'s code raises length candidates to a minimum), never an empty output."""
    torch.manual_seed(1)
    model = set_lengths(nat(nat_iterations=4), LENGTHS)
    src = torch.randint(4, 13, (8, 7))
    decode, calls = model._decode, []

    def recorded(tokens, memory, memory_padding=None, padding=None, **kw):
        calls.append((padding, kw.get("masked")))
        return decode(tokens, memory, memory_padding, padding, **kw)

    model._decode = recorded
    predicted = model.predict_length(model.encode(src)).argmax(-1)
    out = model.parallel_decode(src, eos_id=2)
    lengths = (out != 0).sum(1) - 1  # tokens before eos
    assert (predicted == 0).any() and (lengths >= 1).all()
    assert torch.equal(lengths, predicted.clamp(min=1))
    assert len(calls) == 4 and calls[0][0].shape[0] == 8
    for pad, masked in calls[1:]:
        n, length = masked.sum(1), (~pad).sum(1)
        assert ((n >= 1) & (n < length)).all()
        assert pad.shape[0] == int((lengths > 1).sum())  # the rows of length 1 are done after the first pass
    # every row of length 0 or 1: one token each, and no refinement pass at all
    set_lengths(model, [0, 1] * 4)
    calls.clear()
    assert model.parallel_decode(src, eos_id=2)[:, 1].eq(2).all() and len(calls) == 1


def test_the_training_objective_does_not_depend_on_the_passes_or_lengths_at_evaluation():
    """Mask-predict trains as a conditional masked LM (Ghazvininejad et al. section 3.1: a uniformly drawn number of
    tokens masked, those scored) whatever nat_iterations and length_candidates say about evaluation: the same
    initial weights, masks and loss for every count; Gu et al.'s decoders score every position."""
    from models.lightning import LitTransformer, TrainingConfig
    from models.tasks import collate

    rows = [{"src": [4 + i % 8] * n, "tgt": list(range(4, 4 + n))} for i, n in enumerate([3, 5, 8, 8, 2, 6] * 4)]
    batch = collate("seq2seq", rows)
    cfg = ModelConfig(arch="encoder_decoder", vocab_size=12, d_model=16, n_heads=2, max_len=10, decoding="mask_predict")
    losses = []
    for iterations, candidates in ((1, 1), (4, 1), (1, 5), (4, 5)):
        torch.manual_seed(3)
        module = LitTransformer(
            cfg.replace(nat_iterations=iterations, length_candidates=candidates), TrainingConfig(), "seq2seq"
        )
        torch.manual_seed(4)
        loss, logits, targets = module.step_loss(batch, 0)  # what a training step minimises, length term included
        losses.append((targets, loss, [p.detach().clone() for p in module.parameters()]))
    for targets, loss, params in losses[1:]:
        torch.testing.assert_close(loss, losses[0][1], rtol=0, atol=0)
        assert torch.equal(targets, losses[0][0])
        assert all(torch.equal(a, b) for a, b in zip(params, losses[0][2]))
    scored = (losses[0][0] != -100).sum(1)
    lengths = (batch["tgt_out"] != 0).sum(1) - 1  # the target's tokens, without its end of sequence
    assert (scored >= 1).all() and (scored < lengths).any()  # random masks, not every position
    for decoding in COPIES:
        module = LitTransformer(cfg.replace(decoding=decoding), TrainingConfig(), "seq2seq")
        _, targets, _, lengths = module._parallel(batch, sample_masks=True)
        assert torch.equal((targets != -100).sum(1), lengths)


def test_autoregressive_decoders_refuse_parallel_calls_and_vice_versa():
    model = nat()
    src = torch.randint(4, 13, (1, 4))
    for fn in (model.greedy, model.beam_search):
        with pytest.raises(ValueError, match=r"decoding='mask_predict'.*parallel_decode"):
            fn(source=src)
    ar = Transformer(ModelConfig(arch="encoder_decoder", vocab_size=13, d_model=16, n_heads=2))
    with pytest.raises(
        ValueError, match="needs a non-autoregressive decoding \\('nat_gu', 'uniform_copy' or 'mask_predict'"
    ):
        ar.parallel_decode(src)
    for decoding in COPIES:
        with pytest.raises(ValueError, match=f"'{decoding}' decodes in one pass"):
            nat(decoding).parallel_decode(src, iterations=3)


@pytest.mark.parametrize("decoding", [*COPIES, "mask_predict"])
def test_the_length_predictor_is_trained(decoding):
    """The length loss reaches the length head (and the encoder), and its loss falls within a few steps."""
    from models.lightning import LitTransformer, TrainingConfig
    from models.tasks import collate

    torch.manual_seed(2)
    cfg = ModelConfig(arch="encoder_decoder", vocab_size=12, d_model=16, n_heads=2, max_len=10, decoding=decoding)
    module = LitTransformer(cfg, TrainingConfig(lr=1e-2, schedule="constant"), "seq2seq")
    opt = module.configure_optimizers()["optimizer"]
    losses = []
    for _ in range(60):
        lengths = torch.randint(1, 9, (32,)).tolist()
        rows = [{"src": [4 + (i % 8)] * n, "tgt": [5] * n} for i, n in enumerate(lengths)]
        logits, targets, length_logits, lengths_t = module._parallel(collate("seq2seq", rows), sample_masks=True)
        loss = F.cross_entropy(length_logits, lengths_t)
        opt.zero_grad()
        loss.backward()
        assert module.model.length_head.weight.grad.abs().sum() > 0
        opt.step()
        losses.append(loss.item())
    assert sum(losses[-5:]) < 0.5 * sum(losses[:5])


def test_nat_refuses_scheduled_sampling_and_overlong_targets():
    from models.lightning import LitTransformer, TrainingConfig
    from models.tasks import collate

    cfg = ModelConfig(arch="encoder_decoder", vocab_size=12, d_model=16, n_heads=2, max_len=4, decoding="nat_gu")
    with pytest.raises(ConfigError, match=r"sampling='scheduled'.*decoding='nat_gu'"):
        LitTransformer(cfg, TrainingConfig(sampling="scheduled"), "seq2seq")
    module = LitTransformer(cfg, TrainingConfig(), "seq2seq")
    with pytest.raises(ConfigError, match=r"a target of 6 tokens exceeds max_len=4.*raise model.max_len"):
        module._parallel(collate("seq2seq", [{"src": [5] * 6, "tgt": [5] * 6}]), sample_masks=False)


@pytest.mark.slow
@pytest.mark.parametrize(
    "decoding,iterations,candidates",
    [("nat_gu", 1, 1), ("uniform_copy", 1, 1), ("mask_predict", 1, 1), ("mask_predict", 3, 1)],
)
def test_a_small_model_learns_to_copy_through_the_lightning_module(tmp_path, decoding, iterations, candidates):
    """Trained through LitTransformer (loss with the length term, AdamW, warm-up) on the copy task, a tiny
    non-autoregressive model decodes most validation sequences exactly and predicts their lengths: Gu et al.'s
    decoder and its uniform-copy inputs alone (the inputs are the source itself, copied), and mask-predict in one
    pass and with refinement. (Length candidates are left at 1: here the length head learns the length exactly,
    and 3 candidates, whose average log-probabilities are not calibrated across lengths never trained on, lowered
    exact match from 1.0 to 0.44 at one pass and from 0.995 to 0.51 at three; docs/components.md.)"""
    import lightning as L

    from models.lightning import LitTransformer, TrainingConfig
    from models.tasks import TaskDataModule, make_task

    torch.manual_seed(0)
    task = make_task({"name": "copy", "symbols": 8, "max_len": 6, "train_size": 4000, "val_size": 200, "test_size": 10})
    data = TaskDataModule(task, batch_size=64, seed=0)
    data.setup()
    cfg = ModelConfig(
        arch="encoder_decoder",
        vocab_size=task.vocab_size,
        d_model=32,
        n_heads=4,
        d_ff=64,
        max_len=16,
        decoding=decoding,
        nat_iterations=iterations,
        length_candidates=candidates,
    )
    steps = 220 if decoding in COPIES else 400
    module = LitTransformer(cfg, TrainingConfig(max_steps=steps, lr=3e-3, warmup_steps=30, batch_size=64), "seq2seq")
    before = module.evaluate(data.val_dataloader(), "val")
    trainer = L.Trainer(
        max_steps=steps,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        default_root_dir=tmp_path,
    )
    trainer.fit(module, data.train_dataloader())
    after = module.evaluate(data.val_dataloader(), "val")
    # an untrained decoder whose inputs are the source itself copies a sequence whose length it guesses right
    assert before["val/exact_match"] < (0.2 if decoding in COPIES else 0.05) and before["val/length_acc"] < 0.4
    assert after["val/exact_match"] > before["val/exact_match"] + 0.4, (before, after)
    assert after["val/exact_match"] > 0.5, after
    assert after["val/length_acc"] > 0.6, after
