"""Non-autoregressive decoding, each in its paper's form: Gu et al. (2018)'s NAT predicts the target length from the
encoder and every target token in one pass from the source embeddings copied uniformly; mask-predict
(Ghazvininejad et al. 2019) reads [MASK] inputs, trains as a conditional masked language model and refines the
least confident tokens at evaluation."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from models import ConfigError, ModelConfig, Transformer


def nat(decoding: str = "mask_predict", **kw) -> Transformer:
    cfg = dict(arch="encoder_decoder", vocab_size=13, d_model=16, n_heads=2, max_len=12, decoding=decoding)
    return Transformer(ModelConfig(**{**cfg, **kw})).double().eval()


@pytest.mark.parametrize("decoding", ["nat", "mask_predict"])
def test_every_target_position_sees_every_other_one(decoding):
    """The decoder self-attention is not causal: a later decoder input changes earlier outputs (it would not in the
    autoregressive decoder). NAT's inputs are copies of the source, so a later source token stands for it."""
    torch.manual_seed(0)
    src = torch.randint(4, 13, (2, 6))
    tgt = torch.randint(4, 13, (2, 5))
    model = nat(decoding)
    if decoding == "nat":  # input 4 of a 5-token target copies source token round(4 * 5 / 4) = 5
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
    ar = Transformer(model.cfg.replace(decoding="autoregressive")).double().eval()
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


def test_nat_reads_the_source_embeddings_copied_uniformly():
    """Gu et al. (2018, section 3.1): each decoder input is a copy of a source token's embedding, spread uniformly
    from the first source token to the last, whatever the two lengths; the target's tokens are never read."""
    torch.manual_seed(1)
    model = nat("nat")
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


@torch.no_grad()
def reference_mask_predict(model: Transformer, src: torch.Tensor, iterations: int, eos: int) -> list[int]:
    """Ghazvininejad et al. (2019), section 3.2, and their reference code (``MaskPredict.generate``: at least one
    token re-masked, ``select_worst``), for one source, written out plainly with full forward passes."""
    memory = model.encode(src[None])
    length = max(1, int(model.predict_length(memory).argmax()))  # their code raises length candidates to a minimum
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
    return tokens[0].tolist() + [eos]


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


def test_the_training_objective_does_not_depend_on_the_iterations_at_evaluation():
    """Mask-predict trains as a conditional masked LM (Ghazvininejad et al. section 3.1: a uniformly drawn number of
    tokens masked, those scored) whatever nat_iterations says about evaluation; NAT scores every position."""
    from models.lightning import LitTransformer, TrainingConfig
    from models.tasks import collate

    rows = [{"src": [4 + i % 8] * n, "tgt": list(range(4, 4 + n))} for i, n in enumerate([3, 5, 8, 8, 2, 6] * 4)]
    batch = collate("seq2seq", rows)
    cfg = ModelConfig(arch="encoder_decoder", vocab_size=12, d_model=16, n_heads=2, max_len=10, decoding="mask_predict")
    losses = []
    for iterations in (1, 4):
        torch.manual_seed(3)
        module = LitTransformer(cfg.replace(nat_iterations=iterations), TrainingConfig(), "seq2seq")
        torch.manual_seed(4)
        logits, targets, _, lengths = module._parallel(batch, sample_masks=True)
        losses.append((targets, F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)))
    torch.testing.assert_close(losses[0][1], losses[1][1], rtol=0, atol=0)
    assert torch.equal(losses[0][0], losses[1][0])
    scored = (losses[0][0] != -100).sum(1)
    assert (scored >= 1).all() and (scored < lengths).any()  # random masks, not every position
    module = LitTransformer(cfg.replace(decoding="nat"), TrainingConfig(), "seq2seq")
    _, targets, _, lengths = module._parallel(batch, sample_masks=True)
    assert torch.equal((targets != -100).sum(1), lengths)


def test_autoregressive_decoders_refuse_parallel_calls_and_vice_versa():
    model = nat()
    src = torch.randint(4, 13, (1, 4))
    for fn in (model.greedy, model.beam_search):
        with pytest.raises(ValueError, match=r"decoding='mask_predict'.*parallel_decode"):
            fn(source=src)
    ar = Transformer(ModelConfig(arch="encoder_decoder", vocab_size=13, d_model=16, n_heads=2))
    with pytest.raises(ValueError, match="needs decoding 'nat' or 'mask_predict'"):
        ar.parallel_decode(src)
    with pytest.raises(ValueError, match="'nat' decodes in one pass"):
        nat("nat").parallel_decode(src, iterations=3)


@pytest.mark.parametrize("decoding", ["nat", "mask_predict"])
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

    cfg = ModelConfig(arch="encoder_decoder", vocab_size=12, d_model=16, n_heads=2, max_len=4, decoding="nat")
    with pytest.raises(ConfigError, match=r"sampling='scheduled'.*decoding='nat'"):
        LitTransformer(cfg, TrainingConfig(sampling="scheduled"), "seq2seq")
    module = LitTransformer(cfg, TrainingConfig(), "seq2seq")
    with pytest.raises(ConfigError, match=r"a target of 6 tokens exceeds max_len=4.*raise model.max_len"):
        module._parallel(collate("seq2seq", [{"src": [5] * 6, "tgt": [5] * 6}]), sample_masks=False)


@pytest.mark.slow
@pytest.mark.parametrize("decoding,iterations", [("nat", 1), ("mask_predict", 1), ("mask_predict", 3)])
def test_a_small_model_learns_to_copy_through_the_lightning_module(tmp_path, decoding, iterations):
    """Trained through LitTransformer (loss with the length term, AdamW, warm-up) on the copy task, a tiny
    non-autoregressive model decodes most validation sequences exactly and predicts their lengths: Gu et al.'s
    NAT (its inputs are the source itself, copied), and mask-predict in one pass and with refinement."""
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
    )
    steps = 220 if decoding == "nat" else 400
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
