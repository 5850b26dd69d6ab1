"""The whole model: decoding with the cache against the full forward pass, beam search against exhaustive
search and a plain reference, batched prompts, padding, heads removed at evaluation time, weight tying,
shapes of every arch."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from models import ModelConfig, Transformer, flex
from tests.models.naive import FULL, Layer, naive_encode, naive_step_by_step

PATTERNS = {
    "full": {},
    "local": {"pattern": "local", "window": 3},
    "dilated": {"pattern": "dilated", "window": 3, "dilation": 2},  # Longformer's default: upper layer, 1 head
    "per_head": {"pattern": "dilated", "window": 2, "head_dilations": [[1, 2], [3, 1], [1, 1]]},
    "schedules": {
        "layer_patterns": ["local", "dilated", "full"],
        "window": 2,
        "dilation": 3,
        "window_schedule": "increasing",  # one dilated layer: its dilation is 3 whatever the schedule
    },
}

# Each pattern's layers for 2 heads, stated here from the rules of docs/components.md (not from the config's code,
# which the naive reference is there to check): Longformer's default dilation rises from 1 in the bottom layer to
# `dilation` in the top one, on the last max(1, n_heads // 4) heads; an increasing window schedule of mean 2 over
# two windowed layers gives 2 * 2 (j + 1) / 3 in whole windows summing to 4: 1 and 3.
GEOMETRY = {
    "full": [FULL, FULL],
    "local": [Layer(3), Layer(3)],
    "dilated": [Layer(3, (1, 1)), Layer(3, (1, 2))],
    "per_head": [Layer(2, (1, 2)), Layer(2, (3, 1)), Layer(2, (1, 1))],
    "schedules": [Layer(1), Layer(3, (1, 3)), FULL],
}


def with_globals(geometry: list[Layer], positions) -> list[Layer]:
    """Longformer's global tokens go to the windowed layers of a bidirectional stack (docs/components.md)."""
    return [Layer(g.window, g.dilations, tuple(positions)) if g.window is not None else g for g in geometry]


DECODING_CASES = [
    (arch, score, positions, pattern)
    for arch in ("decoder", "encoder_decoder")
    for score in ("dot", "general", "cosine", "additive")
    for positions in ("sinusoidal", "learned", "rotary", "alibi", "none")
    for pattern in PATTERNS
    if not (positions == "rotary" and score == "additive")
] + [  # Luong et al.'s scores over the states themselves (qk_projections false)
    (arch, f"{score}-states", positions, pattern)
    for arch in ("decoder", "encoder_decoder")
    for score in ("dot", "general", "additive")
    for positions in ("sinusoidal", "rotary")
    for pattern in ("full", "local")
    if not (positions == "rotary" and score == "additive")
]


def tiny(arch: str, pattern: str = "full", **kw) -> Transformer:
    base = dict(arch=arch, vocab_size=17, d_model=16, n_heads=2, n_layers=2)
    if kw.get("positions") == "learned":  # max_len sizes the learned table (refused where nothing reads it)
        base["max_len"] = 64
    if arch == "encoder":
        base["n_classes"] = 3
    base.update(PATTERNS[pattern])
    if pattern in ("per_head", "schedules"):
        base["n_layers"] = 3
    return Transformer(ModelConfig(**{**base, **kw})).double().eval()


@pytest.mark.parametrize("arch,score,positions,pattern", DECODING_CASES)
def test_cached_incremental_decoding_equals_a_naive_step_by_step_decoder(arch, score, positions, pattern):
    """Cached decoding (a prompt, single steps, then a chunk of 3 tokens at once, for which a ring buffer must grow)
    and the full forward pass against a decoder written out in the test from the model's weights
    (``tests/models/naive.py``): at every step it recomputes every layer from scratch over the tokens so far, with
    each score, position scheme and pattern from its definition and no code of the model's."""
    torch.manual_seed(0)
    states = {"qk_projections": False} if score.endswith("-states") else {}
    model = tiny(arch, pattern, score=score.removesuffix("-states"), positions=positions, **states)
    src, tgt = torch.randint(1, 17, (2, 9)), torch.randint(1, 17, (2, 16))
    with torch.no_grad():  # move the score's parameters off their start (general: W = I, cosine: tau = 10)
        for name, p in model.named_parameters():
            if ".score." in name:
                p.add_(0.3 * torch.randn_like(p))
    want = naive_step_by_step(model, tgt, src if arch == "encoder_decoder" else None, geometry=GEOMETRY[pattern])
    memory = model.encode(src) if arch == "encoder_decoder" else None
    full = model(src, tgt) if arch == "encoder_decoder" else model(tgt)
    cache = model.new_cache()
    steps = [model.step(tgt[:, :4], cache, 0, memory)]  # a prompt, then one token at a time
    steps += [model.step(tgt[:, t : t + 1], cache, t, memory) for t in range(4, 13)]
    steps += [model.step(tgt[:, 13:16], cache, 13, memory)]
    # the model keeps its sinusoid and rotary tables in float32: 1e-6 (a wrong key or weight moves logits by 1e-2)
    torch.testing.assert_close(torch.cat(steps, dim=1), want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(full, want, rtol=1e-6, atol=1e-6)


def move_global_projections(model: Transformer) -> None:
    """Move every global projection off its start (a copy of the window's), so that using the wrong one shows."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.split(".")[-2] in ("global_qkv_proj", "global_v_proj"):
                p.add_(0.3 * torch.randn_like(p))


GLOBAL_ENCODER_CASES = [
    (positions, pattern, T, projections, "dot")
    for positions in ("sinusoidal", "learned", "rotary", "alibi")
    for pattern in ("local", "per_head")
    for T in (40, 150)  # the band path (T <= 64) and the tiles
    for projections in ("separate", "shared")
] + [  # scores over the states (qk_projections false): Q_g and K_g are the states, V_g is projected
    ("alibi", pattern, T, "separate", score) for pattern in ("local", "per_head") for T in (40, 150)
    for score in ("dot-states", "additive-states")
]  # fmt: skip


@pytest.mark.parametrize("positions,pattern,T,projections,score", GLOBAL_ENCODER_CASES)
def test_encoders_with_global_tokens_equal_the_naive_reference(positions, pattern, T, projections, score):
    """Longformer's global attention in an encoder (tiled kernels, band path, and FlexAttention's forward) against the
    naive reference, whose geometry the test states: padding (a global token among it), ALiBi (no bias on global
    rows and columns), rotary, local and per-head dilated windows, separate (moved off their start) or shared
    global projections, scores over projected q and k or over the states."""
    torch.manual_seed(5)
    globals_ = (0, 17, 40, 149)  # 40 is past the end of the short sequences; 149 is padding of the long ones
    kw = dict(positions=positions, global_tokens=list(globals_), global_projections=projections)
    kw.update(score=score.removesuffix("-states"), qk_projections=not score.endswith("-states"))
    model = tiny("encoder", pattern, **kw, **({"max_len": 160} if positions == "learned" else {}))  # a table of T
    move_global_projections(model)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".score." in name:
                p.add_(0.3 * torch.randn_like(p))
    src = torch.randint(1, 17, (2, T))
    pad = torch.zeros(2, T, dtype=torch.bool)
    pad[1, T - 6 :] = True
    geometry = with_globals(GEOMETRY[pattern], globals_)
    want = naive_encode(model, src, geometry, pad)
    real = ~pad[..., None].expand_as(want)
    for mode in ("off", "eager"):  # the tiled kernels, then FlexAttention's forward (uncompiled on a CPU)
        with flex.mode(mode), torch.no_grad():
            got = model.encode(src, pad)
        # the sinusoid and rotary tables are float32 (as in the decoding test); a wrong key or weight moves them by 1e-2
        torch.testing.assert_close(got[real], want[real], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("positions", ["sinusoidal", "rotary", "alibi"])
@pytest.mark.parametrize("pattern", ["local", "per_head", "schedules"])
def test_cached_decoding_over_an_encoder_with_global_tokens_equals_the_naive_reference(positions, pattern):
    """An encoder-decoder whose encoder has global tokens (its decoder, causal, has none): cached steps and the full
    forward against the naive reference, with a padded source."""
    torch.manual_seed(6)
    model = tiny("encoder_decoder", pattern, positions=positions, global_tokens=[0, 5])
    move_global_projections(model)
    src, tgt = torch.randint(1, 17, (2, 11)), torch.randint(1, 17, (2, 8))
    src_pad = torch.zeros(2, 11, dtype=torch.bool)
    src_pad[1, 8:] = True
    geometry = GEOMETRY[pattern]
    want = naive_step_by_step(
        model, tgt, src, geometry=geometry, src_geometry=with_globals(geometry, (0, 5)), src_padding=src_pad
    )
    with torch.no_grad():
        memory = model.encode(src, src_pad)
        cache = model.new_cache()
        steps = [model.step(tgt[:, :3], cache, 0, memory, src_pad)]
        steps += [model.step(tgt[:, t : t + 1], cache, t, memory, src_pad) for t in range(3, 8)]
        full = model(src, tgt, padding=src_pad)
    torch.testing.assert_close(torch.cat(steps, dim=1), want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(full, want, rtol=1e-6, atol=1e-6)


CROSS_CASES = [  # (self-attention keys, cross-attention keys): Luong et al.'s scores in the cross-attention alone
    ({"score": self_score, "positions": positions}, {"cross_score": cross, "cross_qk_projections": False})
    for self_score, positions in (("dot", "rotary"), ("additive", "sinusoidal"))
    for cross in ("dot", "dot_unscaled", "general", "additive", "cosine")
] + [
    ({"qk_projections": False}, {"cross_qk_projections": True, "cross_score": "general"}),  # the other way round
    ({"score": "cosine"}, {"cross_score": "additive"}),  # projected, another score
]


@pytest.mark.parametrize("own,cross", CROSS_CASES, ids=[f"{a}-{b}" for a, b in CROSS_CASES])
@pytest.mark.parametrize("n_heads", [1, 2])
def test_a_cross_attention_with_its_own_score_decodes_as_the_naive_decoder(own, cross, n_heads):
    """cross_score and cross_qk_projections: cached decoding (a prompt, then single steps) and the full forward
    against the naive decoder written from the model's weights (``tests/models/naive.py``: each attention with its
    own score from its definition; over the states, the cross-attention's values are the source states themselves).
    Rotary positions act in the self-attention only, so the cross-attention may take any score."""
    torch.manual_seed(1)
    keys = dict(arch="encoder_decoder", vocab_size=17, d_model=16, n_heads=n_heads, n_layers=2)
    model = Transformer(ModelConfig(**keys, **own, **cross)).double().eval()
    src, tgt = torch.randint(1, 17, (2, 9)), torch.randint(1, 17, (2, 8))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".score." in name:
                p.add_(0.3 * torch.randn_like(p))
    want = naive_step_by_step(model, tgt, src, geometry=GEOMETRY["full"])
    memory = model.encode(src)
    cache = model.new_cache()
    steps = [model.step(tgt[:, :3], cache, 0, memory)] + [
        model.step(tgt[:, t : t + 1], cache, t, memory) for t in range(3, 8)
    ]
    torch.testing.assert_close(torch.cat(steps, dim=1), want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(model(src, tgt), want, rtol=1e-6, atol=1e-6)


def test_windowed_causal_layers_keep_a_ring_of_reach_plus_one_keys():
    """Mistral's rolling buffer cache: a layer that never looks further back than its reach keeps reach + 1
    keys, written in place; full layers keep a preallocated buffer."""
    model = tiny("decoder", "schedules")  # windows 1 and 3 (increasing, mean 2); dilation 3 on a head of layer 1
    assert [la.window for la in model.cfg.attention_layers()] == [1, 3, None]
    reach = [la.reach for la in model.cfg.attention_layers()]
    assert reach == [1, 9, None]
    cache = model.new_cache(40)
    tokens = torch.randint(1, 17, (1, 30))
    steps = [model.step(tokens[:, :10], cache, 0)]  # a prompt longer than the rings: they wrap at once
    buffers = [c.k.data_ptr() for c in cache]
    steps += [model.step(tokens[:, t : t + 1], cache, t) for t in range(10, 30)]
    assert [c.k.shape[2] for c in cache] == [2, 10, 40]
    assert [c.k.data_ptr() for c in cache] == buffers  # written in place, never reallocated
    torch.testing.assert_close(torch.cat(steps, 1), model(tokens), rtol=1e-9, atol=1e-9)


class Ops(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("pattern", ["full", "local", "per_head"])
@pytest.mark.parametrize("padded", [False, True])
def test_cached_steps_never_wait_for_the_device_nor_copy_the_cache(pattern, padded):
    """No host synchronisation per step (.item(), bool(tensor), nonzero) and no torch.cat of the cache: a
    step reads preallocated buffers written in place."""
    model = tiny("decoder", pattern)
    cache = model.new_cache(24)
    prompt = torch.randint(1, 17, (2, 6))
    pad = torch.zeros(2, 6, dtype=torch.bool)
    pad[1, :3] = padded
    model.step(prompt, cache, 0, padding=pad if padded else None)
    with Ops() as ops:
        for t in range(6, 20):
            model.step(torch.randint(1, 17, (2, 1)), cache, t)
    for forbidden in ("_local_scalar_dense", "item", "nonzero", "cat", "is_nonzero"):
        assert forbidden not in ops.names, forbidden


def test_cross_attention_keys_and_values_are_computed_once_and_shared_by_the_beams():
    model = tiny("encoder_decoder")
    calls = []
    for _, module in model.attention_modules():
        if module.cross:
            module.kv_proj.register_forward_hook(lambda m, i, o: calls.append(i[0].shape[0]))
    model.beam_search(source=torch.randint(3, 17, (3, 7)), beam_size=4, max_new_tokens=8, eos_id=2)
    assert calls == [3, 3]  # once per decoder layer, for the 3 sources (not 3 x 4 beams)


@pytest.mark.parametrize("arch", ["decoder", "encoder_decoder"])
@pytest.mark.parametrize("positions", ["sinusoidal", "learned", "rotary", "alibi"])
@pytest.mark.parametrize("pattern", ["full", "local", "dilated"])
def test_batched_prompts_of_different_lengths_equal_each_prompt_alone(arch, positions, pattern):
    """Left padding plus position ids (Hugging Face's batched generation): each prompt decodes as it would
    alone, greedy and beam search alike."""
    torch.manual_seed(2)
    model = tiny(arch, pattern, positions=positions)
    prompts = [torch.randint(3, 17, (n,)) for n in (5, 2, 7)]
    T = max(len(p) for p in prompts)
    batch = torch.zeros(3, T, dtype=torch.long)
    pad = torch.ones(3, T, dtype=torch.bool)
    for i, p in enumerate(prompts):
        batch[i, T - len(p) :], pad[i, T - len(p) :] = p, False
    src = torch.randint(3, 17, (3, 6)) if arch == "encoder_decoder" else None
    kw = {"max_new_tokens": 6, "eos_id": 2}
    for decode in ("greedy", "beam"):
        fn = model.greedy if decode == "greedy" else (lambda **a: model.beam_search(beam_size=3, **a))
        together = fn(prompt=batch, prompt_padding=pad, source=src, **kw)
        for i, p in enumerate(prompts):
            alone = fn(prompt=p[None], source=None if src is None else src[i : i + 1], **kw)
            width = alone.shape[1]
            torch.testing.assert_close(together[i, :width], alone[0], rtol=0, atol=0)
            assert (together[i, width:] == model.cfg.pad_id).all()


@pytest.mark.parametrize("arch", ["decoder", "encoder_decoder"])
@pytest.mark.parametrize("pattern", ["full", "local"])
def test_beam_search_with_beam_one_equals_greedy(arch, pattern):
    torch.manual_seed(1)
    model = tiny(arch, pattern)
    kw = (
        {"source": torch.randint(1, 17, (4, 7))}
        if arch == "encoder_decoder"
        else {"prompt": torch.randint(1, 17, (4, 5))}
    )
    for eos in (None, 2, 5):
        greedy = model.greedy(**kw, max_new_tokens=10, eos_id=eos)
        beam = model.beam_search(**kw, beam_size=1, max_new_tokens=10, eos_id=eos)
        torch.testing.assert_close(beam, greedy, rtol=0, atol=0)


def small_vocab_model(arch: str, seed: int) -> Transformer:
    """V = 5 (pad 0, bos 1, eos 2, two symbols), with a likely end of sequence (its logit raised)."""
    torch.manual_seed(seed)
    model = (
        Transformer(ModelConfig(arch=arch, vocab_size=5, d_model=8, n_heads=2, n_layers=1, tie_embeddings=False))
        .double()
        .eval()
    )
    with torch.no_grad():
        model.head.weight[2] += 0.5 * model.head.weight[2].sign()
    return model


def next_logprobs(model, arch, context, tokens) -> torch.Tensor:
    """log p(. | context, tokens) from a full forward pass (no cache)."""
    if arch == "decoder":
        logits = model(torch.tensor([context + tokens]))[0, -1]
    else:
        logits = model(torch.tensor([context]), torch.tensor([[1] + tokens]))[0, -1]
    return torch.log_softmax(logits.double(), -1)


def reference_beam(model, arch, context, K, N, eos, lp, pad=0):
    """The fairseq / Hugging Face scheme written out plainly for one input: every hypothesis scored by its
    own forward pass, no early stopping (the pool is unbounded), hypotheses still live at N join the pool."""
    V = model.cfg.target_vocab
    live, pool = [([], 0.0)], []
    for _ in range(N):
        cands = []
        for tokens, s in live:
            logp = next_logprobs(model, arch, context, tokens)
            cands += [(s + logp[v].item(), tokens + [v]) for v in range(V) if v != pad]
        cands.sort(key=lambda c: -c[0])
        live = []
        for rank, (s, tokens) in enumerate(cands[: 2 * K]):
            if eos is not None and tokens[-1] == eos:
                if rank < K:
                    pool.append((s / len(tokens) ** lp, tokens))
            elif len(live) < K:
                live.append((tokens, s))
    pool += [(s / N**lp, tokens) for tokens, s in live]
    return max(pool)[1]


def exhaustive_best(model, arch, context, N, eos, lp, pad=0):
    """The best of every sequence: ending in eos within N tokens, or N tokens without it."""
    V = model.cfg.target_vocab
    symbols = [v for v in range(V) if v not in (pad, eos)]
    best = None
    for n in range(1, N + 1):
        for body in itertools.product(symbols, repeat=n - 1):
            for last in [eos] + (symbols if n == N else []):
                tokens = list(body) + [last]
                s = sum(next_logprobs(model, arch, context, tokens[:i])[t].item() for i, t in enumerate(tokens))
                score = s / n**lp
                best = max(best, (score, tokens)) if best else (score, tokens)
    return best[1]


def beam(model, arch, context, **kw):
    key = "prompt" if arch == "decoder" else "source"
    out = model.beam_search(**{key: torch.tensor([context])}, **kw)[0].tolist()
    return out[: out.index(2) + 1] if 2 in out else out


@pytest.mark.parametrize("arch", ["decoder", "encoder_decoder"])
@pytest.mark.parametrize("lp", [0.0, 0.6, 1.0, 2.0])
def test_a_wide_enough_beam_equals_exhaustive_search(arch, lp):
    """With K at least the number of candidates of any step (3 live x 4 tokens at most... 9 x 4 = 36 at N = 3),
    nothing is pruned: beam search returns the best-scoring sequence of all (exact enumeration), with the
    stopping rule on."""
    for seed in range(3):
        model = small_vocab_model(arch, seed)
        context = [3, 4, 3] if arch == "decoder" else [3, 4, 4, 3]
        want = exhaustive_best(model, arch, context, N=3, eos=2, lp=lp)
        assert beam(model, arch, context, beam_size=36, max_new_tokens=3, eos_id=2, length_penalty=lp) == want


@pytest.mark.parametrize("arch", ["decoder", "encoder_decoder"])
@pytest.mark.parametrize("K", [2, 3])
@pytest.mark.parametrize("lp", [0.0, 1.0, -0.5])
def test_beam_search_equals_a_plain_reference_of_the_scheme(arch, K, lp):
    """fairseq / Hugging Face: K live hypotheses, a pool of finished ones, the same length penalty when
    finishing and choosing, eos only from the first K candidates, never the padding token."""
    for seed in range(4):
        model = small_vocab_model(arch, 10 + seed)
        context = [3, 4] if arch == "decoder" else [4, 3, 3]
        want = reference_beam(model, arch, context, K, N=6, eos=2, lp=lp)
        assert beam(model, arch, context, beam_size=K, max_new_tokens=6, eos_id=2, length_penalty=lp) == want


def test_decoding_never_generates_the_padding_token():
    model = tiny("decoder", tie_embeddings=False)
    with torch.no_grad():
        model.head.weight[0] = 10 * model.head.weight.abs().max()  # the pad logit dominates
    prompt = torch.randint(3, 17, (3, 4))
    for out in (
        model.greedy(prompt=prompt, max_new_tokens=6),
        model.beam_search(prompt=prompt, beam_size=3, max_new_tokens=6),
        model.beam_search(prompt=prompt, beam_size=3, max_new_tokens=6, eos_id=2),
    ):
        body = [row[: row.index(2) + 1] if 2 in row else row for row in out.tolist()]
        assert all(0 not in row for row in body)


def test_greedy_follows_the_argmax_of_full_forward_passes():
    """Greedy with the cache against greedy recomputed from scratch at every step."""
    torch.manual_seed(2)
    model = tiny("decoder")
    prompt = torch.randint(1, 17, (2, 3))
    got = model.greedy(prompt=prompt, max_new_tokens=6)
    seq = prompt
    for _ in range(6):
        seq = torch.cat([seq, model(seq)[:, -1].argmax(-1, keepdim=True)], dim=1)
    torch.testing.assert_close(got, seq[:, 3:], rtol=0, atol=0)


def test_beam_search_finds_a_sequence_at_least_as_likely_as_greedy():
    torch.manual_seed(3)
    model = tiny("decoder")
    prompt = torch.randint(1, 17, (3, 4))

    def logprob(cont):
        seq = torch.cat([prompt, cont], dim=1)
        lp = torch.log_softmax(model(seq[:, :-1]).double(), -1)
        return lp[:, 3:].gather(-1, cont[..., None]).squeeze(-1).sum(-1)

    greedy = model.greedy(prompt=prompt, max_new_tokens=5)
    beam = model.beam_search(prompt=prompt, beam_size=5, max_new_tokens=5)
    assert (logprob(beam) >= logprob(greedy) - 1e-9).all()


def test_padding_tokens_do_not_change_the_encoder_output():
    torch.manual_seed(4)
    for pattern in PATTERNS:
        model = tiny("encoder", pattern)
        x = torch.randint(1, 17, (2, 12))
        pad = torch.zeros(2, 12, dtype=torch.bool)
        pad[:, 8:] = True
        y = x.clone()
        y[:, 8:] = torch.randint(1, 17, (2, 4))
        torch.testing.assert_close(model(x, padding=pad), model(y, padding=pad))


def test_classifier_heads_and_shapes():
    x = torch.randint(1, 17, (2, 12))
    assert tiny("encoder")(x).shape == (2, 3)
    assert tiny("encoder", classifier="first")(x).shape == (2, 3)
    assert tiny("encoder", classifier="token")(x).shape == (2, 12, 3)
    assert tiny("decoder")(x).shape == (2, 12, 17)
    ed = tiny("encoder_decoder", tgt_vocab_size=9)
    assert ed(x, torch.randint(1, 9, (2, 5))).shape == (2, 5, 9)


def test_a_target_vocabulary_equal_to_the_source_one_builds_the_shared_table():
    """tgt_vocab_size equal to vocab_size means what leaving it out means (ModelConfig.implied), and the two have
    one cell id: they must be one model, the shared table, not a second table trained under the same id."""
    from record.spec.configs import canonical

    built = {}
    for name, kw in (("left out", {}), ("equal", {"tgt_vocab_size": 17})):
        torch.manual_seed(0)
        built[name] = tiny("encoder_decoder", **kw)
    left_out, equal = built["left out"], built["equal"]
    assert equal.tgt_embed is equal.embed and equal.head.weight is equal.embed.weight
    assert canonical(left_out.cfg) == canonical(equal.cfg)
    assert equal.num_parameters() == left_out.num_parameters()
    mine, theirs = equal.state_dict(), left_out.state_dict()
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
    src, tgt = torch.randint(1, 17, (2, 6)), torch.randint(1, 17, (2, 5))
    torch.testing.assert_close(equal(src, tgt), left_out(src, tgt), rtol=0, atol=0)


def test_weight_tying_and_embedding_scale():
    tied = tiny("decoder")
    assert tied.head.weight is tied.embed.weight
    untied = tiny("decoder", tie_embeddings=False)
    assert untied.head.weight is not untied.embed.weight
    assert untied.num_parameters() == tied.num_parameters() + 17 * 16
    ed = tiny("encoder_decoder", tgt_vocab_size=9)
    assert ed.head.weight is ed.tgt_embed.weight and ed.tgt_embed is not ed.embed
    # sqrt(d_model) scaling of the token embeddings, with no positions to add
    plain = tiny("decoder", positions="none", scale_embeddings=False)
    scaled = tiny("decoder", positions="none")
    tok = torch.tensor([[3, 4]])
    torch.testing.assert_close(scaled._embed(scaled.embed, tok) / 4.0, scaled.embed(tok))
    torch.testing.assert_close(plain._embed(plain.embed, tok), plain.embed(tok))


def test_head_mask_equals_zeroing_the_heads_output_projection():
    """Removing head h is the same as zeroing the columns of the output projection that read head h."""
    torch.manual_seed(5)
    model = tiny("decoder", n_heads=4)
    x = torch.randint(1, 17, (2, 10))
    names = [name for name, _ in model.attention_modules()]
    assert names == ["layers.0.attn", "layers.1.attn"]
    model.set_head_mask({"layers.1.attn": [1, 0, 1, 0]})
    masked = model(x)
    model.set_head_mask(None)
    full = model(x)
    assert not torch.allclose(masked, full)
    ref = tiny("decoder", n_heads=4)
    ref.load_state_dict(model.state_dict())
    with torch.no_grad():
        w = ref.layers[1].attn.sublayer.out_proj.weight  # (C, H * D), head h reads columns h*D:(h+1)*D
        w[:, 4:8] = 0
        w[:, 12:16] = 0
    torch.testing.assert_close(masked, ref(x))
    with pytest.raises(KeyError, match="layers.0.attn"):
        model.set_head_mask({"layers.9.attn": [1, 1, 1, 1]})
    with pytest.raises(ValueError, match="expected"):
        model.set_head_mask({"layers.0.attn": [1, 1]})


def test_encoder_decoder_names_every_attention_module():
    names = [n for n, _ in tiny("encoder_decoder", n_decoder_layers=1).attention_modules()]
    assert names == ["layers.0.attn", "layers.1.attn", "dec_layers.0.attn", "dec_layers.0.cross"]


def test_per_layer_patterns():
    model = tiny("decoder", "full", layer_patterns=["local", "full"], window=2)
    assert [m.pattern.layer.pattern for _, m in model.attention_modules()] == ["local", "full"]
    x = torch.randint(1, 17, (1, 20))
    assert model(x).shape == (1, 20, 17)
