"""A setting the rest of the run leaves unread is refused, naming that key and the fix, and only it (issue 63: these
were accepted, and two variants of a study trained one model under two names). The property behind them, over
every field and random runs, is test_every_setting_counts.py; these are the cases a review found, one each."""

from __future__ import annotations

import pytest

from record.spec import SpecError
from record.spec.run import resolve_run

SEQ2SEQ = {"task": {"name": "reverse", "max_len": 6}, "model": {"d_model": 16, "n_heads": 2}}
LM = {"task": {"name": "recall"}, "model": {"d_model": 16, "n_heads": 2}}
CLASSIFY = {"task": {"name": "listops", "max_depth": 3, "max_args": 3, "min_len": 5, "max_len": 16}}


def run(base: dict, model: dict | None = None, training: dict | None = None, task: dict | None = None) -> dict:
    return {
        "task": {**base["task"], **(task or {})},
        "model": {**base.get("model", {}), **(model or {})},
        "training": training or {},
    }


CASES = {  # (run, the key at fault, words of the refusal)
    "beam search with Gu et al.'s NAT": (
        run(SEQ2SEQ, {"decoding": "nat_gu"}, {"beam_size": 4}),
        "training.beam_size",
        "beam search decodes seq2seq targets left to right",
    ),
    "beam search with mask-predict": (
        run(SEQ2SEQ, {"decoding": "mask_predict"}, {"beam_size": 4}),
        "training.beam_size",
        "decoding='mask_predict'",
    ),
    "beam search for a language model": (
        run(LM, training={"beam_size": 4}),
        "training.beam_size",
        "task 'recall' (lm)",
    ),
    "a length penalty with greedy decoding": (
        run(SEQ2SEQ, training={"length_penalty": 1.0}),
        "training.length_penalty",
        "changes nothing with beam_size=1",
    ),
    "the length loss of autoregressive decoding": (
        run(SEQ2SEQ, training={"length_loss_weight": 0.5}),
        "training.length_loss_weight",
        "predicted by non-autoregressive decoding",
    ),
    "decoded batches of a classifier": (
        run(CLASSIFY, training={"decode_batches": 2}),
        "training.decode_batches",
        "exact match decodes seq2seq targets",
    ),
    "the additive score's blocks with a dot score": (
        run(SEQ2SEQ, {"chunk_elements": 4096}),
        "model.chunk_elements",
        "score='dot' computes none",
    ),
    "max_len with sinusoidal positions": (
        run(SEQ2SEQ, {"max_len": 64}),
        "model.max_len",
        "positions='sinusoidal' with decoding='autoregressive' has neither",
    ),
    "a window wider than every sequence": (
        run(SEQ2SEQ, {"pattern": "local", "window": 40}),
        "model.window",
        "full attention under another name",
    ),
    "a global token past every sequence": (
        run(
            CLASSIFY,
            {"d_model": 16, "n_heads": 2, "pattern": "local", "window": 2, "global_tokens": [0, 30]},
        ),
        "model.global_tokens",
        "global_tokens [30] are at or past every sequence",
    ),
    "scheduled sampling's k with teacher forcing": (
        run(SEQ2SEQ, training={"sampling_k": 50.0}),
        "training.sampling_k",
        "changes nothing with sampling='teacher_forcing'",
    ),
    "scheduled sampling's schedule with teacher forcing": (
        run(SEQ2SEQ, training={"sampling_schedule": "linear"}),
        "training.sampling_schedule",
        "changes nothing with sampling='teacher_forcing'",
    ),
    "a floor the schedule never reaches": (
        run(SEQ2SEQ, training={"sampling": "scheduled", "sampling_min": 0.5, "max_steps": 100}),
        "training.sampling_min",
        "within max_steps=100 it stays above it",
    ),
    "min_lr_ratio with the constant schedule": (
        run(SEQ2SEQ, training={"schedule": "constant", "min_lr_ratio": 0.1}),
        "training.min_lr_ratio",
        "changes nothing with schedule='constant'",
    ),
    "warm-up with the constant schedule": (
        run(SEQ2SEQ, training={"schedule": "constant", "warmup_steps": 0}),
        "training.warmup_steps",
        "changes nothing with schedule='constant'",
    ),
    "diverge_after without the factor rule": (
        run(SEQ2SEQ, training={"diverge_factor": None, "diverge_after": 10}),
        "training.diverge_after",
        "changes nothing with diverge_factor=None",
    ),
    "tagging tokens of a task that labels sequences": (
        run(CLASSIFY, {"classifier": "token"}),
        "model.classifier",
        "labels each sequence once",
    ),
    "ListOps' operator probability where no node can be an operator": (
        run(CLASSIFY, task={"max_depth": 2, "operator_p": 0.5, "max_len": 6}),
        "task.operator_p",
        "there is no such node",
    ),
    "ListOps' max_len above its longest expression": (
        run(CLASSIFY, task={"max_len": 40}),
        "task.max_len",
        "above the longest expression",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_setting_the_run_leaves_unread_is_refused_alone_with_its_fix(case):
    data, key, words = CASES[case]
    with pytest.raises(SpecError) as info:
        resolve_run(data)
    errors = info.value.every()
    assert [e.key for e in errors] == [key], [str(e) for e in errors]  # that key, and no false companion
    assert words in info.value.message, info.value.message
    assert "remove" in info.value.message or "use " in info.value.message  # the spelling to use


@pytest.mark.parametrize("case", list(CASES))
def test_without_the_setting_the_run_is_accepted(case):
    """Each refusal is of the one setting: the same run without it resolves."""
    data, key, _ = CASES[case]
    section, name = key.split(".")
    kept = {**data, section: {k: v for k, v in data[section].items() if k != name}}
    if name == "window":
        kept["model"] = {k: v for k, v in kept["model"].items() if k != "pattern"}
    resolve_run(kept)
