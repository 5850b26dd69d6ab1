"""The whole model: decoding with the cache against the full forward pass, beam 1 against greedy,
padding, heads removed at evaluation time, weight tying, shapes of every arch."""

from __future__ import annotations

import pytest
import torch

from models import ModelConfig, Transformer

DECODING_CASES = [
    (arch, score, positions, pattern)
    for arch in ("decoder", "encoder_decoder")
    for score in ("dot", "general", "cosine", "additive")
    for positions in ("sinusoidal", "learned", "rotary", "alibi")
    for pattern in ("full", "local", "dilated")
    if not (positions == "rotary" and score == "additive")
]


def tiny(arch: str, **kw) -> Transformer:
    base = dict(arch=arch, vocab_size=17, d_model=16, n_heads=2, n_layers=2, max_len=64)
    if arch == "encoder":
        base["n_classes"] = 3
    if kw.get("pattern") in ("local", "dilated"):
        base["window"] = 3
    if kw.get("pattern") == "dilated":
        base["dilation"] = 2
    return Transformer(ModelConfig(**{**base, **kw})).double().eval()


@pytest.mark.parametrize("arch,score,positions,pattern", DECODING_CASES)
def test_cached_incremental_decoding_equals_the_full_forward(arch, score, positions, pattern):
    torch.manual_seed(0)
    model = tiny(
        arch,
        score=score,
        positions=positions,
        pattern=pattern,
        n_decoder_layers=3 if arch == "encoder_decoder" else None,
    )
    src, tgt = torch.randint(1, 17, (3, 9)), torch.randint(1, 17, (3, 16))
    memory = model.encode(src) if arch == "encoder_decoder" else None
    full = model(src, tgt) if arch == "encoder_decoder" else model(tgt)
    cache = model.new_cache()
    steps = [model.step(tgt[:, :4], cache, 0, memory)]  # a prompt, then one token at a time
    steps += [model.step(tgt[:, t : t + 1], cache, t, memory) for t in range(4, 16)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-9, atol=1e-9)


def test_local_cache_keeps_only_the_window():
    model = tiny("decoder", pattern="dilated")  # window 3, dilation 2: 6 positions back at most
    cache = model.new_cache()
    tokens = torch.randint(1, 17, (1, 30))
    model.step(tokens[:, :10], cache, 0)
    for t in range(10, 30):
        model.step(tokens[:, t : t + 1], cache, t)
        assert cache[0].k.shape[2] <= 3 * 2 + 1


@pytest.mark.parametrize("arch", ["decoder", "encoder_decoder"])
@pytest.mark.parametrize("pattern", ["full", "local"])
def test_beam_search_with_beam_one_equals_greedy(arch, pattern):
    torch.manual_seed(1)
    model = tiny(arch, pattern=pattern)
    kw = (
        {"source": torch.randint(1, 17, (4, 7))}
        if arch == "encoder_decoder"
        else {"prompt": torch.randint(1, 17, (4, 5))}
    )
    greedy = model.greedy(**kw, max_new_tokens=10, eos_id=2)
    beam = model.beam_search(**kw, beam_size=1, max_new_tokens=10, eos_id=2)
    torch.testing.assert_close(beam, greedy, rtol=0, atol=0)


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
    for pattern in ("full", "local", "dilated"):
        model = tiny("encoder", pattern=pattern)
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
    model = tiny("decoder", layer_patterns=["local", "full"], window=2)
    assert [m.pattern for _, m in model.attention_modules()] == ["local", "full"]
    x = torch.randint(1, 17, (1, 20))
    assert model(x).shape == (1, 20, 17)
