"""Positions against their closed forms and defining properties."""

from __future__ import annotations

import math

import pytest
import torch

from models import ConfigError, ModelConfig, Transformer
from models.positions import ALiBi, LearnedPositions, PositionError, Rotary, SinusoidalPositions, alibi_slopes
from tests.models.naive import press_get_slopes


def cfg(**kw) -> ModelConfig:
    return ModelConfig(**{"arch": "decoder", "d_model": 8, "n_heads": 2, **kw})


@pytest.mark.parametrize("d_model", [8, 13])
def test_sinusoidal_equals_the_closed_form(d_model):
    pe = SinusoidalPositions(cfg(d_model=d_model, n_heads=1))
    n = pe.table.shape[0] + 24  # longer than the cached table (max_len's default): computed on the fly
    x = torch.zeros(1, n, d_model)
    got = pe(x)[0].double()
    for pos in range(n):
        for i in range(d_model):
            angle = pos / 10000 ** ((i - i % 2) / d_model)
            want = math.sin(angle) if i % 2 == 0 else math.cos(angle)
            assert abs(got[pos, i].item() - want) < 1e-6, (pos, i)
    # with an offset (cached decoding) the same table continues
    torch.testing.assert_close(pe(torch.zeros(1, 5, d_model), start=n - 10)[0], got[n - 10 : n - 5].float())
    # position ids (left-padded prompts) select rows of the same closed form, in and beyond the table
    ids = torch.tensor([[0, 0, 3, n - 7], [5, 6, 7, 8]])
    torch.testing.assert_close(
        pe(torch.zeros(2, 4, d_model), start=n - 4, ids=ids).double(), got[ids], atol=1e-6, rtol=0
    )
    torch.testing.assert_close(
        pe(torch.zeros(2, 4, d_model), start=0, ids=ids % 4).double(), got[ids % 4], atol=1e-6, rtol=0
    )


def test_learned_table_refuses_longer_sequences_with_a_clear_error():
    pe = LearnedPositions(cfg(positions="learned", max_len=10))
    pe(torch.zeros(2, 10, 8))
    with pytest.raises(PositionError, match=r"max_len=10.*positions='learned'.*sinusoidal"):
        pe(torch.zeros(2, 11, 8))
    model = Transformer(ModelConfig(arch="decoder", positions="learned", max_len=12, d_model=16, n_heads=2))
    with pytest.raises(PositionError, match="max_len=12"):
        model(torch.ones(1, 13, dtype=torch.long))


def test_extrapolating_positions_accept_longer_sequences():
    for positions in ("sinusoidal", "rotary", "alibi", "none"):  # (max_len, which sizes nothing here, is refused)
        model = Transformer(ModelConfig(arch="decoder", positions=positions, d_model=16, n_heads=2))
        n = ModelConfig().max_len + 20
        assert model(torch.ones(1, n, dtype=torch.long)).shape == (1, n, 256)


def test_rotary_scores_depend_only_on_the_offset():
    torch.manual_seed(0)
    rot = Rotary(8, cached=4)  # small cache: positions beyond it are computed on the fly
    q, k = torch.randn(8), torch.randn(8)

    def score(i, j):
        qi = rot(q.view(1, 1, 1, 8).double(), start=i)
        kj = rot(k.view(1, 1, 1, 8).double(), start=j)
        return (qi * kj).sum().item()

    for offset in (0, 1, 5):
        values = [score(p + offset, p) for p in (0, 3, 17, 100)]
        assert max(values) - min(values) < 1e-5  # float32 angles
    assert abs(score(5, 0) - score(0, 0)) > 1e-3
    # rotation keeps the norm
    x = torch.randn(1, 1, 6, 8)
    torch.testing.assert_close(rot(x).norm(dim=-1), x.norm(dim=-1))
    # position ids rotate each row by its own positions
    ids = torch.tensor([[0, 1, 2, 3, 4, 9], [2, 3, 4, 5, 6, 7]])
    both = rot(x.expand(2, 1, 6, 8), start=4, ids=ids)
    torch.testing.assert_close(both[1], rot(x, start=2)[0])


def test_alibi_slopes_are_press_et_al_published_recipe():
    """Against the paper's reference code (``press_get_slopes``, written out in tests/models/naive.py)."""
    # powers of two: the closed form of the paper (section 3: 1/2, 1/4, ..., 1/256 for 8 heads)
    torch.testing.assert_close(alibi_slopes(8), torch.tensor([2.0 ** -(i + 1) for i in range(8)]))
    torch.testing.assert_close(alibi_slopes(4), torch.tensor([2.0 ** -(2 * (i + 1)) for i in range(4)]))
    # six heads by hand: the 4 slopes of 4 heads, then slopes 1 and 3 of 8 heads
    torch.testing.assert_close(alibi_slopes(6), torch.tensor([2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8, 2.0**-1, 2.0**-3]))
    for n in range(1, 65):  # every head count, powers of two or not, against the reference code
        torch.testing.assert_close(alibi_slopes(n), torch.tensor(press_get_slopes(n), dtype=torch.float32))


def test_alibi_bias_causal_is_press_and_bidirectional_keeps_direction():
    """Press et al. (2022) define -m_h (i - j) for keys j <= i (causal). Bidirectional stacks give future
    keys the reversed set of slopes, m_{H-1-h}: each head penalises past and future differently."""
    m = alibi_slopes(4)
    dist = torch.arange(-5, 6)  # query - key
    causal = ALiBi(4, causal=True).bias(dist)
    for h in range(4):
        for n, d in enumerate(dist.tolist()):
            if d >= 0:
                assert causal[h, n] == pytest.approx(-m[h].item() * d)
    both = ALiBi(4, causal=False).bias(dist)
    for h in range(4):
        for n, d in enumerate(dist.tolist()):
            want = -m[h].item() * d if d >= 0 else -m[3 - h].item() * -d
            assert both[h, n] == pytest.approx(want)
        assert not torch.allclose(both[h, :5].flip(0), both[h, 6:])  # past and future differ in every head


def test_alibi_with_one_head_is_refused_where_it_cannot_tell_direction():
    with pytest.raises(ConfigError, match=r"positions='alibi' in a bidirectional stack.*n_heads=1.*reverse"):
        ModelConfig(arch="encoder_decoder", positions="alibi", n_heads=1, d_model=8)
    ModelConfig(arch="decoder", positions="alibi", n_heads=1, d_model=8)  # causal: Press et al. exactly


def order_sensitivity(model: Transformer, src: torch.Tensor, tgt: torch.Tensor) -> tuple[float, float]:
    """(mean |output change| when each source is reversed, the same for random reorderings of each source)."""
    gen = torch.Generator().manual_seed(1)
    base = model(src, tgt)
    reversed_ = (model(src.flip(1), tgt) - base).abs().mean().item()
    shuffled = []
    for _ in range(4):
        perm = torch.stack([row[torch.randperm(src.shape[1], generator=gen)] for row in src])
        shuffled.append((model(perm, tgt) - base).abs().mean().item())
    return reversed_, sum(shuffled) / len(shuffled)


@pytest.mark.parametrize(
    "positions,score",
    [
        (p, s)
        for p in ("sinusoidal", "learned", "rotary", "alibi", "none")
        for s in ("dot", "additive")
        if (p, s) != ("rotary", "additive")  # refused: rotary needs a dot-product score
    ],
)
def test_encoder_decoder_tells_a_source_from_its_reverse_unless_positions_are_none(positions, score):
    """Cross-attention carries no positions, so the order of the source can reach the decoder only through
    the encoder. For a direction-aware encoder a reversed source is one reordering among others: its output
    changes by about as much as for a random reordering of the same tokens (0.6 to 1.7 times as much at
    initialisation, over seeds and schemes), which is the size required here (at least 0.3 times). ALiBi's
    symmetric form -m|i - j| (Press et al. 2022 defined the causal one) is direction-blind: reordered sources
    change the output, reversed ones not at all; the control below rebuilds it and must fail the requirement.
    `none` is permutation-equivariant, so the decoder sees the same set of memory vectors: identical outputs."""
    torch.manual_seed(0)
    model = Transformer(
        ModelConfig(
            arch="encoder_decoder", vocab_size=13, d_model=16, n_heads=4, n_layers=2, positions=positions, score=score
        )
    ).double()
    model.eval()
    src = torch.randint(4, 13, (8, 7))
    tgt = torch.randint(4, 13, (8, 5))
    with torch.no_grad():
        reversed_, shuffled = order_sensitivity(model, src, tgt)
        if positions == "none":
            torch.testing.assert_close(model(src, tgt), model(src.flip(1), tgt), rtol=0, atol=1e-10)
            return
        assert reversed_ > 0.3 * shuffled, (reversed_, shuffled)
        if positions == "alibi":  # the control: symmetric slopes (future = past) in every layer
            for layer in model.layers:
                alibi = layer.attn.sublayer.positions
                alibi.future.copy_(alibi.past)
            blind_reversed, blind_shuffled = order_sensitivity(model, src, tgt)
            assert blind_shuffled > 1e-3 and blind_reversed < 1e-9 * blind_shuffled


@pytest.mark.parametrize("scale_embeddings", [True, False])
def test_initial_scale_of_every_position_scheme(scale_embeddings):
    """What each scheme adds to the embeddings at initialisation, against the token embeddings' own RMS
    (N(0, d^-0.5) times sqrt(d) when scaled: RMS 1). Sinusoids have RMS sqrt(1/2) (sin^2 + cos^2 = 1 per pair);
    learned positions start on the token scale by default (BERT and GPT-2 also initialise both alike) so
    that "learned learns slower" is not an artefact of a 50x smaller start; the others add nothing."""
    torch.manual_seed(0)
    d, T = 256, 400
    rms = {}
    for positions in ("sinusoidal", "learned", "rotary", "alibi", "none"):
        table = {"max_len": T} if positions == "learned" else {}  # (the others read positions at any length)
        model = Transformer(
            ModelConfig(
                arch="decoder", d_model=d, n_heads=4, positions=positions, scale_embeddings=scale_embeddings, **table
            )
        )
        x = torch.zeros(1, T, d)
        rms[positions] = model.positions(x).pow(2).mean().sqrt().item()
        tokens = model.embed.weight * model.emb_scale
        token_rms = tokens.pow(2).mean().sqrt().item()
    want_token = 1.0 if scale_embeddings else d**-0.5
    assert token_rms == pytest.approx(want_token, rel=0.01)
    assert rms["sinusoidal"] == pytest.approx(math.sqrt(0.5), rel=1e-6)
    assert rms["learned"] == pytest.approx(want_token, rel=0.01)  # 102,400 draws: sampling error ~0.2%
    assert rms["rotary"] == rms["alibi"] == rms["none"] == 0.0
    # configurable: the old 0.02 start, or any other
    small = Transformer(ModelConfig(arch="decoder", d_model=d, n_heads=4, positions="learned", position_init_std=0.02))
    added = small.positions(torch.zeros(1, 512, d))
    assert added.std().item() == pytest.approx(0.02, rel=0.02)
    with pytest.raises(ConfigError, match=r"position_init_std=0.02.*positions='sinusoidal' has none"):
        ModelConfig(position_init_std=0.02)


@pytest.mark.parametrize("d_model", [64, 256])
def test_learned_positions_take_the_token_embeddings_step_under_adam(d_model):
    """Adam moves every stored element by about the learning rate, whatever its scale, so what enters the stack
    moves by lr times the factor a table is multiplied by when used. Token embeddings are stored at d^-0.5 and
    multiplied by sqrt(d); a position table stored at the scale it is added at moved sqrt(d) times less (8x at
    d 64, 16x at d 256), and learned positions learned slower for it. After N steps of the project's AdamW
    settings on a language model whose every token and position gets a gradient at every step, the change of
    what each table adds to the stack must be of one size."""
    from models.training import TrainingConfig

    torch.manual_seed(0)
    cfg = ModelConfig(
        arch="decoder", vocab_size=16, d_model=d_model, n_heads=4, max_len=32, positions="learned", tie_embeddings=False
    )
    model = Transformer(cfg)
    t = TrainingConfig()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=t.betas, eps=t.eps, weight_decay=0.0)

    def entering() -> tuple[torch.Tensor, torch.Tensor]:  # what each table adds to the stack, (V, C) and (T, C)
        with torch.no_grad():
            return model.embed.weight * model.emb_scale, model.positions(torch.zeros(1, 32, d_model))[0]

    tokens0, positions0 = entering()
    for _ in range(10):  # N = 10 steps
        batch = torch.randint(0, 16, (8, 33))
        logits = model(batch[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 16), batch[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    tokens1, positions1 = entering()
    token_step = (tokens1 - tokens0).pow(2).mean().sqrt()
    position_step = (positions1 - positions0).pow(2).mean().sqrt()
    assert token_step > 1e-3  # both tables did move
    assert 0.5 < position_step / token_step < 2.0, (float(position_step), float(token_step))
