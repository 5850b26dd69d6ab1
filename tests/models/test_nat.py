"""Non-autoregressive decoding: Gu et al. (2018) predict the target length from the encoder and every target
token in parallel; mask-predict (Ghazvininejad et al. 2019) refines the least confident tokens."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from models import ConfigError, ModelConfig, Transformer


def nat(**kw) -> Transformer:
    cfg = dict(arch="encoder_decoder", vocab_size=13, d_model=16, n_heads=2, max_len=12, decoding="non_autoregressive")
    return Transformer(ModelConfig(**{**cfg, **kw})).double().eval()


def test_every_target_position_sees_every_other_one():
    """The decoder self-attention is not causal: a later decoder input changes earlier outputs (it would
    not in the autoregressive decoder)."""
    torch.manual_seed(0)
    src = torch.randint(4, 13, (2, 6))
    tgt = torch.randint(4, 13, (2, 5))
    other = tgt.clone()
    other[:, 4] = (other[:, 4] - 3) % 9 + 4
    known = torch.zeros(2, 5, dtype=torch.bool)  # every input is a known token (none masked)
    model = nat()
    a = model(src, tgt, target_masked=known)
    b = model(src, other, target_masked=known)
    assert (a[:, :4] - b[:, :4]).abs().max() > 1e-6
    ar = Transformer(model.cfg.replace(decoding="autoregressive")).double().eval()
    torch.testing.assert_close(ar(src, tgt)[:, :4], ar(src, other)[:, :4])


@torch.no_grad()
def reference_mask_predict(model: Transformer, src: torch.Tensor, iterations: int, eos: int) -> list[int]:
    """Ghazvininejad et al. (2019), section 3.2, for one source, written out plainly with full forward passes."""
    memory = model.encode(src[None])
    length = int(model.predict_length(memory).argmax())
    L = max(length, 1)
    tokens = torch.zeros(1, L, dtype=torch.long)
    masked = [True] * length
    probs = [0.0] * length
    for t in range(iterations):
        if t > 0:
            n = length * (iterations - t) // iterations
            order = sorted(range(length), key=lambda i: probs[i])
            masked = [i in order[:n] for i in range(length)]
        inp_mask = torch.tensor([masked + [False] * (L - length)])
        logits = model(src[None], tokens, target_masked=inp_mask, target_padding=torch.arange(L)[None] >= length)
        logits = logits.float()
        logits[..., 0] = float("-inf")
        logp = torch.log_softmax(logits, -1)[0]
        for i in range(length):
            if masked[i]:
                tokens[0, i] = int(logp[i].argmax())
                probs[i] = float(logp[i].max())
    return tokens[0, :length].tolist() + [eos]


@pytest.mark.parametrize("iterations", [1, 2, 4])
def test_mask_predict_equals_a_plain_reference(iterations):
    torch.manual_seed(1)
    model = nat(nat_iterations=iterations)
    with torch.no_grad():  # spread the predicted lengths over several values
        model.length_head.weight.mul_(30)
    src = torch.randint(4, 13, (6, 7))
    pad = torch.zeros(6, 7, dtype=torch.bool)
    out = model.mask_predict(src, pad, eos_id=2)
    lengths = set()
    for i in range(6):
        want = reference_mask_predict(model, src[i], iterations, eos=2)
        lengths.add(len(want))
        got = out[i].tolist()
        assert got[: len(want)] == want and all(t == 0 for t in got[len(want) :])
    assert len(lengths) > 1
    assert torch.equal(model.generate(source=src, source_padding=pad, max_new_tokens=20, eos_id=2), out)


def test_autoregressive_decoders_refuse_nat_calls_and_vice_versa():
    model = nat()
    src = torch.randint(4, 13, (1, 4))
    for fn in (model.greedy, model.beam_search):
        with pytest.raises(ValueError, match=r"decoding='non_autoregressive'.*mask_predict"):
            fn(source=src)
    ar = Transformer(ModelConfig(arch="encoder_decoder", vocab_size=13, d_model=16, n_heads=2))
    with pytest.raises(ValueError, match="needs decoding='non_autoregressive'"):
        ar.mask_predict(src)


def test_the_length_predictor_is_trained():
    """The length loss reaches the length head (and the encoder), and its loss falls within a few steps."""
    from models.lightning import LitTransformer, TrainingConfig
    from models.tasks import collate

    torch.manual_seed(2)
    cfg = ModelConfig(
        arch="encoder_decoder", vocab_size=12, d_model=16, n_heads=2, max_len=10, decoding="non_autoregressive"
    )
    module = LitTransformer(cfg, TrainingConfig(lr=1e-2, schedule="constant"), "seq2seq")
    opt = module.configure_optimizers()["optimizer"]
    losses = []
    for _ in range(80):
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

    cfg = ModelConfig(
        arch="encoder_decoder", vocab_size=12, d_model=16, n_heads=2, max_len=4, decoding="non_autoregressive"
    )
    with pytest.raises(ConfigError, match=r"sampling='scheduled'.*non_autoregressive"):
        LitTransformer(cfg, TrainingConfig(sampling="scheduled"), "seq2seq")
    module = LitTransformer(cfg, TrainingConfig(), "seq2seq")
    with pytest.raises(ConfigError, match=r"a target of 6 tokens exceeds max_len=4.*raise model.max_len"):
        module._parallel(collate("seq2seq", [{"src": [5] * 6, "tgt": [5] * 6}]), sample_masks=False)


@pytest.mark.slow
@pytest.mark.parametrize("iterations", [1, 3])
def test_a_small_nat_model_learns_to_copy_through_the_lightning_module(tmp_path, iterations):
    """Gu et al. (2018): trained through LitTransformer (loss with the length term, AdamW, warm-up) on the copy
    task, a tiny non-autoregressive model decodes most validation sequences exactly and predicts their lengths;
    with mask-predict refinement too (nat_iterations=3, trained on random masks)."""
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
        decoding="non_autoregressive",
        nat_iterations=iterations,
    )
    steps = 220 if iterations == 1 else 400
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
    assert before["val/exact_match"] < 0.05 and before["val/length_acc"] < 0.4
    assert after["val/exact_match"] > 0.5, after
    assert after["val/length_acc"] > 0.6, after
