"""The LightningModule's pieces against their closed forms: schedules, scheduled sampling, the guard."""

from __future__ import annotations

import math

import pytest

from models.config import ConfigError
from models.lightning import TrainingConfig, lr_factor, teacher_forcing_p


def test_noam_schedule_is_vaswani_formula():
    cfg = TrainingConfig(schedule="noam", warmup_steps=4000, lr=1.0)
    for step in (0, 1, 100, 3999, 4000, 10_000, 100_000):
        s = step + 1
        assert lr_factor(cfg, 512, step) == pytest.approx(512**-0.5 * min(s**-0.5, s * 4000**-1.5))
    peak = max(range(8000), key=lambda s: lr_factor(cfg, 512, s))
    assert peak == 3999  # the peak is at the end of warm-up


def test_warmup_cosine_and_constant_schedules():
    cfg = TrainingConfig(schedule="warmup_cosine", warmup_steps=10, max_steps=110, min_lr_ratio=0.1)
    assert lr_factor(cfg, 64, 0) == pytest.approx(0.1)  # 1/10 of the way up
    assert lr_factor(cfg, 64, 9) == pytest.approx(1.0)
    assert lr_factor(cfg, 64, 59) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lr_factor(cfg, 64, 109) == pytest.approx(0.1)
    flat = TrainingConfig(schedule="warmup_constant", warmup_steps=4)
    assert [lr_factor(flat, 64, s) for s in range(6)] == pytest.approx([0.25, 0.5, 0.75, 1, 1, 1])
    assert lr_factor(TrainingConfig(schedule="constant"), 64, 0) == 1.0


def test_teacher_forcing_schedules_of_bengio_et_al():
    assert teacher_forcing_p(TrainingConfig(), 10**6) == 1.0
    lin = TrainingConfig(sampling="scheduled", sampling_schedule="linear", sampling_k=100, sampling_min=0.2)
    assert [teacher_forcing_p(lin, s) for s in (0, 50, 100, 500)] == pytest.approx([1.0, 0.5, 0.2, 0.2])
    exp = TrainingConfig(sampling="scheduled", sampling_schedule="exponential", sampling_k=100)
    assert teacher_forcing_p(exp, 100) == pytest.approx(math.exp(-1))
    sig = TrainingConfig(sampling="scheduled", sampling_schedule="inverse_sigmoid", sampling_k=50)
    assert teacher_forcing_p(sig, 200) == pytest.approx(50 / (50 + math.exp(4)))
    assert teacher_forcing_p(sig, 10**7) == pytest.approx(0.0)  # no overflow


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"max_steps": 0}, r"max_steps=0 must be >= 1"),
        ({"lr": -1.0}, r"lr=-1.0 must be > 0"),
        ({"schedule": "linear"}, r"schedule='linear' is not a valid choice; valid: 'noam', 'warmup_cosine'"),
        ({"schedule": "noam", "warmup_steps": 0}, r"schedule='noam' needs warmup_steps >= 1"),
        ({"betas": [0.9]}, r"betas=\[0.9\] must be two numbers in \[0, 1\)"),
        ({"batch_size": 2.5}, r"batch_size=2.5 must be an integer"),
        ({"label_smoothing": 1.0}, r"label_smoothing=1.0 must be <= 0.99"),
        ({"sampling": "professor"}, r"sampling='professor' is not a valid choice"),
        ({"diverge_factor": 1.0}, r"diverge_factor=1.0 must be > 1"),
    ],
)
def test_training_config_refusals(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        TrainingConfig(**kwargs)


def test_divergence_guard_fires_on_blow_ups_not_on_wobbles_near_zero():
    from models.lightning import DivergenceGuard

    def first_alarm(losses, factor=4.0, after=5):
        guard = DivergenceGuard(factor, after)
        return next((step for step, loss in enumerate(losses) if guard.check(step, loss)), None)

    converging = [2.3 * 0.9**i for i in range(60)]  # down to about 0.004
    assert first_alarm(converging) is None
    # near zero, the loss wobbles by 5x: below the ratio's reach of a real divergence
    wobble = converging + [0.004, 0.02, 0.03, 0.02, 0.01] * 10
    assert first_alarm(wobble) is None
    # it climbs back to where it started: diverged, and soon
    blow_up = converging + [0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert first_alarm(blow_up) is not None and first_alarm(blow_up) >= 60
    assert first_alarm([1.0, 0.5, float("nan")]) == 2  # non-finite: at once
    assert first_alarm(blow_up, factor=None) is None  # the factor rule switched off
    assert "non-finite" in DivergenceGuard(4.0, 0).check(0, float("inf"))


def test_peak_memory_is_per_run_not_per_process():
    import torch

    from models.lightning import peak_memory_mb, reset_peak_memory

    big = torch.ones(64 * 2**20 // 4)  # 64 MB, then freed
    big += 1
    high = peak_memory_mb()
    del big
    reset_peak_memory()
    after = peak_memory_mb()
    if after == high:
        pytest.skip("this kernel does not reset the high-water mark (/proc/self/clear_refs)")
    assert after < high - 32
