"""Positions against their closed forms and defining properties."""

from __future__ import annotations

import math

import pytest
import torch

from models import ModelConfig, Transformer
from models.positions import LearnedPositions, PositionError, Rotary, SinusoidalPositions, alibi_slopes


@pytest.mark.parametrize("d_model", [8, 13])
def test_sinusoidal_equals_the_closed_form(d_model):
    pe = SinusoidalPositions(d_model, max_len=16)
    x = torch.zeros(1, 40, d_model)  # longer than the cached table: computed on the fly
    got = pe(x)[0].double()
    for pos in range(40):
        for i in range(d_model):
            angle = pos / 10000 ** ((i - i % 2) / d_model)
            want = math.sin(angle) if i % 2 == 0 else math.cos(angle)
            assert abs(got[pos, i].item() - want) < 1e-6, (pos, i)
    # with an offset (cached decoding) the same table continues
    torch.testing.assert_close(pe(torch.zeros(1, 5, d_model), start=30)[0], got[30:35].float())


def test_learned_table_refuses_longer_sequences_with_a_clear_error():
    pe = LearnedPositions(8, max_len=10)
    pe(torch.zeros(2, 10, 8))
    with pytest.raises(PositionError, match=r"max_len=10.*positions='learned'.*sinusoidal"):
        pe(torch.zeros(2, 11, 8))
    model = Transformer(ModelConfig(arch="decoder", positions="learned", max_len=12, d_model=16, n_heads=2))
    with pytest.raises(PositionError, match="max_len=12"):
        model(torch.ones(1, 13, dtype=torch.long))


def test_extrapolating_positions_accept_longer_sequences():
    for positions in ("sinusoidal", "rotary", "alibi", "none"):
        model = Transformer(ModelConfig(arch="decoder", positions=positions, max_len=8, d_model=16, n_heads=2))
        assert model(torch.ones(1, 20, dtype=torch.long)).shape == (1, 20, 256)


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


def test_alibi_slopes_are_press_et_al_geometric_sequence():
    torch.testing.assert_close(alibi_slopes(8), torch.tensor([2.0 ** -(i + 1) for i in range(8)]))
    torch.testing.assert_close(alibi_slopes(4), torch.tensor([2.0 ** -(2 * (i + 1)) for i in range(4)]))
    # not a power of two: the 4 slopes of 4 heads, then every other slope of 8 heads
    six = alibi_slopes(6)
    torch.testing.assert_close(six[:4], alibi_slopes(4))
    torch.testing.assert_close(six[4:], alibi_slopes(8)[0::2][:2])
