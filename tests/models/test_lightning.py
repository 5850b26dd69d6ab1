"""The LightningModule's pieces against their closed forms: schedules, scheduled sampling, the guard."""

from __future__ import annotations

import math

import pytest

from models.config import ConfigError
from models.training import TrainingConfig, lr_factor, teacher_forcing_p
from tests.models.devices import cuda


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


def test_scheduled_sampling_feeds_back_only_the_tokens_a_language_model_predicts():
    """Bengio et al. feed the model its own outputs in place of the tokens it generates. In a recall task the
    key-value pairs and queries are given and only the answers predicted: every input was replaceable, so the
    given context was overwritten with predictions. Here every eligible input is replaced (tf_p = 0)."""
    import torch

    from models.config import ModelConfig
    from models.lightning import LitTransformer
    from models.tasks import PAD, TaskDataModule, make_task

    torch.manual_seed(0)
    data = TaskDataModule(make_task({"name": "recall", "train_size": 16}), 8, 0)
    data.setup()
    batch = next(iter(data.train_dataloader()))
    cfg = ModelConfig(d_model=16, n_heads=2, n_layers=1, vocab_size=64, dropout=0.0, attn_dropout=0.0, emb_dropout=0.0)
    module = LitTransformer(cfg, TrainingConfig(), "lm")
    fed = []
    forward = module.model.forward
    module.model.forward = lambda inp, *a, **kw: fed.append(inp) or forward(inp, *a, **kw)
    module.scored_logits(batch, tf_p=0.0)
    given, mixed = batch["tokens"][:, :-1], fed[-1]
    predicted = torch.zeros_like(given, dtype=torch.bool)
    predicted[:, 1:] = batch["loss_mask"][:, :-1].bool() & (batch["tokens"][:, 1:-1] != PAD)
    with torch.no_grad():
        pred = forward(given).argmax(-1)  # the teacher-forced pass: the prediction of the token after each input
    expected = given.clone()
    expected[:, 1:] = torch.where(predicted[:, 1:], pred[:, :-1], given[:, 1:])
    assert predicted.any() and (~predicted & (given != PAD)).any()
    assert torch.equal(mixed, expected)  # answers fed back as predicted, the context as given


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


# --- speed: options, no waiting for the device between logged steps, utilisation -------------------------


def test_speed_options_are_checked_and_leave_existing_configurations_unchanged():
    """compile and fused_adamw change kernels, not what is learned: left at their defaults they stay out of the
    configuration's dictionary, so a run declared before they existed keeps its config hash."""
    plain = TrainingConfig()
    assert "compile" not in plain.to_dict() and "fused_adamw" not in plain.to_dict()
    fast = TrainingConfig(compile=True, fused_adamw=True)
    assert fast.to_dict()["compile"] is True and fast.to_dict()["fused_adamw"] is True
    assert TrainingConfig.from_dict(fast.to_dict()) == fast
    assert TrainingConfig.from_dict(plain.to_dict()) == plain
    for name in ("compile", "fused_adamw"):
        with pytest.raises(ConfigError, match=f"{name}='yes' must be true or false"):
            TrainingConfig(**{name: "yes"})


def tiny_lm(training: TrainingConfig, log_every: int):
    import logging

    import lightning as L
    import torch

    from models.config import ModelConfig
    from models.lightning import LitTransformer
    from models.tasks import TaskDataModule, make_task

    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    torch.manual_seed(0)
    data = TaskDataModule(make_task({"name": "text", "block_size": 16, "max_chars": 5000}), 4, 0)
    data.setup()
    module = LitTransformer(
        ModelConfig(d_model=16, n_heads=2, n_layers=1, d_ff=32), training, "lm", log_every=log_every
    )

    def trainer(callbacks=(), **options):
        return L.Trainer(
            **{
                "accelerator": "cpu",
                "max_steps": training.max_steps,
                "logger": False,
                "enable_checkpointing": False,
                "enable_progress_bar": False,
                "enable_model_summary": False,
                "num_sanity_val_steps": 0,
                "limit_val_batches": 0,
                "gradient_clip_val": training.grad_clip,
                "callbacks": list(callbacks),
                **options,
            }
        )

    return module, data, trainer


def test_training_reads_nothing_from_the_device_between_logged_steps():
    """A read of a tensor's value (``.item()``, ``float()``, ``bool()``: aten._local_scalar_dense) makes the host
    wait for the device. Steps that are not logged read none: the losses wait on the device for the guard,
    the token counts for the next logged step. (Fused AdamW keeps its step counts as tensors; the default
    AdamW reads them from host memory, which costs no wait.)"""
    import warnings

    import lightning as L
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    module, data, trainer = tiny_lm(TrainingConfig(max_steps=12, fused_adamw=True, warmup_steps=2), log_every=4)
    reads: list[int] = []

    class Reads(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._local_scalar_dense.default:
                reads.append(module.global_step)
            return func(*args, **(kwargs or {}))

    class Watch(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            self.mode = Reads()
            self.mode.__enter__()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.mode.__exit__(None, None, None)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer([Watch()]).fit(module, datamodule=data)
    assert sorted(set(reads)) == [0, 4, 8]  # the logged steps only
    logged = [step for step, metrics in module.pending if "train/loss" in metrics]
    assert logged == [0, 4, 8]
    cost = module.cost_summary()
    assert cost["train_tokens"] == 12 * 4 * 16  # every step's input tokens (17 a block, the last a target only)
    assert "mfu" not in cost  # a CPU: no known peak


def test_the_throughput_leaves_out_the_first_step_and_the_best_skips_non_finite_values():
    """Step 0 holds torch.compile's compilation (1.7 s against 1.3 ms a step, as a review measured): counted, compile's own speed was
    charged for it. Here step 0 is made 0.2 s slower: the throughput and step time are of the eleven steps after
    it, the training time counts all twelve. A non-finite first validation stayed the best for ever (min(nan, x))."""
    import time
    import warnings

    import lightning as L

    module, data, trainer = tiny_lm(TrainingConfig(max_steps=12, warmup_steps=2), log_every=4)

    class SlowFirstStep(L.Callback):
        def on_before_backward(self, trainer, pl_module, loss):  # inside the module's timed step
            if pl_module.global_step == 0:
                time.sleep(0.2)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer([SlowFirstStep()]).fit(module, datamodule=data)
    cost = module.cost_summary()
    steady = cost["step_time_ms"] * 11 / 1000  # the eleven steps after the first
    assert cost["train_tokens"] == 12 * 4 * 16
    assert cost["tokens_per_s"] == pytest.approx(11 * 4 * 16 / steady)
    assert cost["train_time_s"] >= 0.2 + steady  # the first step's time is in the total, not in the average
    for value in (float("nan"), 2.0, 1.0):
        module.record_validation({"val/loss": value, "val/token_acc": value / 4})
    assert module.best == {"val/loss": 1.0, "val/token_acc": 0.5}
    one, data, trainer = tiny_lm(TrainingConfig(max_steps=1, warmup_steps=1), log_every=4)  # a first step only
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer().fit(one, datamodule=data)
    cost = one.cost_summary()
    assert cost["train_tokens"] == 4 * 16 and cost["tokens_per_s"] == pytest.approx(4 * 16 / cost["train_time_s"])


def test_a_divergence_found_later_is_dated_to_its_step():
    """The guard reads the losses of the steps since the last logged one in order: a loss that turned non-finite
    at step 5 is reported at step 5, and training stops at the next logged step (8)."""
    import warnings

    import lightning as L
    import torch

    module, data, trainer = tiny_lm(TrainingConfig(max_steps=30, warmup_steps=2), log_every=4)

    class Poison(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if pl_module.global_step == 5:
                with torch.no_grad():
                    pl_module.model.head.weight.fill_(float("nan"))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = trainer([Poison()])
        t.fit(module, datamodule=data)
    assert module.diverged["step"] == 5 and "non-finite" in module.diverged["reason"]
    assert t.global_step in (8, 9)  # stopped at the check of step 8 (Lightning counts that step or not)


def test_model_flops_utilisation_uses_the_device_peak_or_the_override(monkeypatch):
    import torch

    from models.flops import peak_flops_per_s, utilisation

    cuda = torch.device("cuda")
    for name, precision, peak in (
        ("NVIDIA H100 80GB HBM3", "bf16-mixed", 989.5e12),
        ("NVIDIA H100 PCIe", "bf16-mixed", 756.5e12),
        ("NVIDIA H100 NVL", "16-mixed", 835.5e12),
        ("NVIDIA A100-SXM4-80GB", "32-true", 19.5e12),
        ("NVIDIA A10", "bf16-mixed", 125e12),  # not an A100
        ("Tesla V100-SXM2-32GB", "bf16-mixed", None),  # no bf16 tensor cores
        ("Some Future GPU", "bf16-mixed", None),
    ):
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None, name=name: name)
        assert peak_flops_per_s(cuda, precision) == peak
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "high")  # TF32 matmuls
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-80GB")
    assert peak_flops_per_s(cuda, "32-true") == 156e12
    assert peak_flops_per_s("cpu", "32-true") is None and utilisation(1e9, "cpu", "32-true") == {}
    monkeypatch.setenv("ABLATE_PEAK_FLOPS", "2e12")
    assert utilisation(1e12, "cpu", "32-true") == {"peak_flops_per_s": 2e12, "mfu": 0.5}
    monkeypatch.setenv("ABLATE_PEAK_FLOPS", "fast")
    with pytest.raises(ValueError, match="ABLATE_PEAK_FLOPS='fast' must be a number of FLOP/s"):
        peak_flops_per_s("cpu", "32-true")


def clipped_training(fused: bool, precision: str, grad_clip: float | None, accelerator: str) -> list:
    """The parameters after 3 steps of a tiny LM with the given optimizer, precision and clipping."""
    import warnings

    module, data, trainer = tiny_lm(
        TrainingConfig(max_steps=3, fused_adamw=fused, warmup_steps=1, grad_clip=grad_clip), log_every=1
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's notes on CPU AMP and small models
        trainer(accelerator=accelerator, devices=1, precision=precision).fit(module, datamodule=data)
    return [p.detach().cpu().clone() for p in module.parameters()]


def assert_fused_clips_like_foreach(precision: str, accelerator: str) -> None:
    import torch

    clipped = [clipped_training(fused, precision, 0.01, accelerator) for fused in (False, True)]
    for a, b in zip(*clipped):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    unclipped = clipped_training(True, precision, None, accelerator)
    assert any(not torch.allclose(a, b) for a, b in zip(clipped[1], unclipped))  # the clip was in effect


def test_fused_adamw_clips_under_mixed_precision_as_the_foreach_implementation():
    """Lightning refuses to clip for an optimizer that unscales inside its step (fused AdamW) under mixed
    precision; LitTransformer clips it itself: the same parameters as with the foreach AdamW. Found on an H100,
    where `fused_adamw: true` with bf16-mixed stopped every run at its first step."""
    assert_fused_clips_like_foreach("bf16-mixed", "cpu")


@cuda
@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed"])
def test_cuda_fused_adamw_clips_under_mixed_precision_as_the_foreach_implementation(precision):
    """On CUDA, 16-mixed has a GradScaler: the gradients are unscaled before the clip, and not again by the step."""
    assert_fused_clips_like_foreach(precision, "gpu")


def test_fused_adamw_takes_the_same_step():
    import torch

    from models.config import ModelConfig
    from models.lightning import LitTransformer

    steps = []
    for fused in (False, True):
        torch.manual_seed(0)
        module = LitTransformer(ModelConfig(d_model=16, n_heads=2, n_layers=1), TrainingConfig(fused_adamw=fused), "lm")
        opt = module.configure_optimizers()["optimizer"]
        assert bool(opt.defaults["fused"]) is fused
        tokens = torch.randint(1, 256, (2, 9))
        module.model(tokens).square().mean().backward()
        opt.step()
        steps.append([p.detach().clone() for p in module.model.parameters()])
    for a, b in zip(*steps):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_a_compiled_model_trains_like_the_eager_one():
    """training.compile: torch.compile of the model's forward (the CPU build compiles with its C++ backend);
    the same losses as without, and checkpoints keep the model's parameter names."""
    import warnings

    import torch

    losses = []
    for compiled in (False, True):
        module, data, trainer = tiny_lm(TrainingConfig(max_steps=3, compile=compiled, warmup_steps=1), log_every=1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer().fit(module, datamodule=data)
        losses.append([m["train/loss"] for _, m in module.pending if "train/loss" in m])
        names = set(module.model.state_dict())
        assert not any(n.startswith("_orig_mod") for n in names)
    torch.testing.assert_close(torch.tensor(losses[0]), torch.tensor(losses[1]), rtol=1e-4, atol=1e-5)


def test_decoding_options_are_checked_and_leave_existing_configurations_unchanged():
    """beam_size and length_penalty (how targets are decoded for exact match) stay out of the configuration's
    dictionary at their defaults: every run declared before they existed keeps its config hash."""
    plain = TrainingConfig()
    assert "beam_size" not in plain.to_dict() and "length_penalty" not in plain.to_dict()
    beam = TrainingConfig(beam_size=5, length_penalty=1.0)
    assert beam.to_dict()["beam_size"] == 5 and TrainingConfig.from_dict(beam.to_dict()) == beam
    assert "length_penalty" not in TrainingConfig(length_penalty=0).to_dict()
    with pytest.raises(ConfigError, match="beam_size=0 must be >= 1"):
        TrainingConfig(beam_size=0)
    with pytest.raises(ConfigError, match="length_penalty=-1 must be >= 0"):
        TrainingConfig(length_penalty=-1)


@pytest.mark.parametrize("beam_size,length_penalty", [(1, 0.0), (3, 0.0), (3, 1.0)])
def test_exact_match_and_the_error_by_position_decode_as_configured(beam_size, length_penalty):
    """Exact match decodes with the configured beam search (Britz et al. 2017 compare widths and length
    penalties), and error_at_k is the share of sequences whose k-th decoded token differs from the target's:
    both recomputed here from Transformer.beam_search / greedy called directly."""
    import torch
    import torch.nn.functional as F

    from models.config import ModelConfig
    from models.lightning import LitTransformer
    from models.tasks import BOS, EOS, PAD, TaskDataModule, make_task

    torch.manual_seed(0)
    task = make_task({"name": "reverse", "train_size": 50, "test_size": 40, "max_len": 5})
    data = TaskDataModule(task, 8, 0, eval_batch_size=16)
    data.setup()
    cfg = ModelConfig(arch="encoder_decoder", vocab_size=task.vocab_size, d_model=16, n_heads=2, n_layers=1, d_ff=32)
    module = LitTransformer(cfg, TrainingConfig(beam_size=beam_size, length_penalty=length_penalty), "seq2seq")
    module.eval()
    for p in module.parameters():  # a model with opinions, so that decoders disagree
        p.data.normal_(0, 0.5)
    got = module.evaluate(data.loader("test"), "test", positions=task.target_positions("test"))

    exact, wrong, seen = 0, torch.zeros(6), torch.zeros(6)
    with torch.no_grad():
        for batch in data.loader("test"):
            src, tgt = batch["src"], batch["tgt_out"]
            kw = dict(source=src, source_padding=src == PAD, max_new_tokens=tgt.shape[1], bos_id=BOS, eos_id=EOS)
            if beam_size > 1:
                out = module.model.beam_search(beam_size=beam_size, length_penalty=length_penalty, **kw)
            else:
                out = module.model.greedy(**kw)
            out = F.pad(out, (0, tgt.shape[1] - out.shape[1]), value=PAD)[:, : tgt.shape[1]]
            exact += int((out == tgt).all(1).sum())
            for k in range(tgt.shape[1]):
                has = tgt[:, k] != PAD
                seen[k] += has.sum()
                wrong[k] += (has & (out[:, k] != tgt[:, k])).sum()
    assert got["test/exact_match"] == pytest.approx(exact / 40)
    for k in range(6):
        assert got[f"test/error_at_{k + 1}"] == pytest.approx(float(wrong[k] / seen[k]))
    assert "test/error_at_7" not in got


def test_test_long_of_a_language_model_scores_only_positions_beyond_training():
    """The length-generalisation split of the text task: its loss is the mean negative log-likelihood of the tokens
    predicted from positions block_size and beyond, computed here from the model's logits."""
    import torch
    import torch.nn.functional as F

    from models.config import ModelConfig
    from models.lightning import LitTransformer
    from models.tasks import TaskDataModule, make_task

    torch.manual_seed(0)
    task = make_task({"name": "text", "block_size": 16, "long_block_size": 48, "max_chars": 20_000})
    data = TaskDataModule(task, 4, 0)
    data.setup()
    cfg = ModelConfig(arch="decoder", vocab_size=task.vocab_size, d_model=16, n_heads=2, n_layers=1, d_ff=32)
    module = LitTransformer(cfg, TrainingConfig(), "lm")
    got = module.evaluate(data.loader("test_long"), "test_long")
    assert "test_long/exact_match" not in got  # positions scored, not answers
    nll, n = 0.0, 0
    with torch.no_grad():
        for batch in data.loader("test_long"):
            logits = module.model(batch["tokens"][:, :-1])[:, 16:]
            nll += float(
                F.cross_entropy(
                    logits.reshape(-1, logits.shape[-1]), batch["tokens"][:, 17:].reshape(-1), reduction="sum"
                )
            )
            n += logits.shape[0] * logits.shape[1]
    assert got["test_long/loss"] == pytest.approx(nll / n, rel=1e-5)
