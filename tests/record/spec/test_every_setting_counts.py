"""Every setting counts, or is refused (issue 63). For every field of the model, training and task sections, over
randomly drawn valid runs, a changed value either changes what the run computes, or is refused with the spelling
to use: two variants of a study that train one model under two names would be two cells and a contrast of nothing.

What a run computes, observed on fixed data with fixed seeds (each observable independent of the field tried):
the task's data (each split's content), the forward output at initialisation, the training loss of three steps of
AdamW with the run's clipping, learning rate and teacher forcing, the learning-rate and teacher-forcing schedules
over the run's steps, the divergence guard's verdicts on fixed loss traces, the validation steps, and the
evaluation (loss, accuracy, exact match and its decoding) of the first validation batches. A field that acts on
speed or memory alone is declared operational below, with its reason; there the test asserts the opposite: where
it is accepted, nothing observed changes (to rounding).
"""

from __future__ import annotations

import dataclasses
import math
import random
from typing import Any

import pytest
import torch

from models.config import ModelConfig
from models.lightning import DivergenceGuard, LitTransformer
from models.tasks import TASKS, TaskDataModule
from models.tasks.batches import collate
from models.training import TrainingConfig, lr_factor, teacher_forcing_p
from record.spec import SpecError
from record.spec.run import resolve_run

pytestmark = pytest.mark.slow

P_DRAW = 0.12  # the chance that a field of a drawn run takes another value than its first
SIZES = {"train_size": 48, "val_size": 16, "test_size": 16}
TASK_BASES = {  # each kind of task, small
    "reverse": {"name": "reverse", "symbols": 6, "min_len": 1, "max_len": 6, **SIZES},
    "copy": {"name": "copy", "symbols": 5, "min_len": 2, "max_len": 5, **SIZES},
    "recall": {"name": "recall", "keys": 6, "values": 6, "pairs": 3, "queries": 2, **SIZES},
    "retrieval": {"name": "retrieval", "symbols": 6, "length": 12, "distance": 4, **SIZES},
    "listops": {"name": "listops", "max_depth": 3, "max_args": 3, "min_len": 5, "max_len": 16, **SIZES},
}

# Values each field may take in a drawn run (the first values of a list are likelier to be drawn as a base).
MODEL_VALUES: dict[str, list] = {
    "arch": ["decoder", "encoder", "encoder_decoder"],  # set by the task's kind
    "vocab_size": [None],  # set by the task
    "tgt_vocab_size": [None, 64],
    "n_classes": [None],  # set by the task
    "classifier": ["mean", "first", "token"],
    "d_model": [16, 24, 32],
    "n_layers": [1, 2, 3],
    "n_decoder_layers": [None, 1, 2],
    "n_heads": [2, 4, 1],
    "head_dim": [None, 4, 12],
    "d_ff": [None, 24, 40],
    "dropout": [0.0, 0.1],
    "attn_dropout": [0.0, 0.2],
    "emb_dropout": [0.0, 0.1],
    "max_len": [512, 64, 40],
    "norm": ["pre", "post"],
    "norm_type": ["layernorm", "rmsnorm"],
    "norm_eps": [1e-5, 1e-3],
    "positions": ["sinusoidal", "learned", "rotary", "alibi", "none"],
    "position_init_std": [None, 0.02, 0.5],
    "rotary_base": [10000.0, 500.0],
    "score": ["dot", "dot_unscaled", "general", "cosine", "additive"],
    "qk_projections": [True, False],
    "pattern": ["full", "local", "dilated"],
    "window": [None, 1, 2, 4, 100],
    "window_schedule": ["fixed", "increasing", "decreasing"],
    "layer_windows": [None, [1, 3], [2, 2, 5]],
    "dilation": [1, 2, 3],
    "dilated_heads": [None, 1, 2],
    "dilation_schedule": ["increasing", "fixed", "decreasing"],
    "layer_dilations": [None, [1, 2], [2, 3, 2]],
    "head_dilations": [None, [1, 2], [1, 1, 2, 3]],
    "global_tokens": [None, [0], [0, 3], [90]],
    "layer_patterns": [None, ["local", "full"], ["full", "local", "full"]],
    "ffn": ["relu", "gelu", "swiglu"],
    "bias": [True, False],
    "tie_embeddings": [None, True, False],
    "scale_embeddings": [True, False],
    "pad_id": [0],  # the tasks' padding token
    "chunk_elements": [1 << 20, 64],
    "cross_score": [None, "general", "dot", "additive"],
    "cross_qk_projections": [None, False, True],
    "global_projections": ["separate", "shared"],
    "decoding": ["autoregressive", "nat_gu", "uniform_copy", "mask_predict"],
    "nat_iterations": [1, 3],
    "length_candidates": [1, 5],
}
TRAINING_VALUES: dict[str, list] = {
    "max_steps": [40, 60],
    "max_time": [None, 3600.0],
    "batch_size": [8, 6],
    "eval_batch_size": [None, 5],
    "lr": [1e-3, 3e-3],
    "betas": [[0.9, 0.98], [0.8, 0.9]],
    "eps": [1e-9, 1e-3],
    "weight_decay": [0.0, 0.1],
    "schedule": ["warmup_cosine", "noam", "warmup_constant", "constant"],
    "warmup_steps": [5, 0, 20],
    "min_lr_ratio": [0.0, 0.1],
    "grad_clip": [1.0, None, 0.01],
    "label_smoothing": [0.0, 0.1],
    "length_loss_weight": [0.1, 0.5],
    "precision": ["32-true", "64-true"],
    "val_every": [10, 25],
    "val_batches": [None, 1],
    "decode_batches": [4, 0, 1],
    "beam_size": [1, 3],
    "length_penalty": [0.0, 1.0],
    "sampling": ["teacher_forcing", "scheduled"],
    "sampling_schedule": ["inverse_sigmoid", "linear", "exponential"],
    "sampling_k": [500.0, 20.0],
    "sampling_min": [0.0, 0.5],
    "diverge_factor": [4.0, None, 1.5],
    "diverge_after": [50, 5],
    "deterministic": [True, False],
    "compile": [False],  # operational; compiling here would cost minutes
    "fused_adamw": [False, True],
}
# What changes how fast or in how much memory a run trains, never what it computes: where accepted, the test asserts
# that nothing observed changes. Each with its reason.
OPERATIONAL = {
    ("model", "chunk_elements"): "bounds the memory of additive scores (refused where no score is additive)",
    # unless val_batches or decode_batches cuts a split: then it decides which sequences are scored or decoded
    ("training", "eval_batch_size"): "how many sequences an evaluation batch holds (padding is masked)",
    ("training", "max_time"): "a budget of seconds: stops a run that takes longer, never reached here",
    ("training", "deterministic"): "asks torch for deterministic kernels; the CPU's already are",
    ("training", "compile"): "compiles the same computation",
    ("training", "fused_adamw"): "AdamW's one-kernel implementation of the same update",
}
NOT_DRAWN = {  # fields the task sets (a run file cannot change them without another task)
    ("model", "arch"), ("model", "vocab_size"), ("model", "n_classes"), ("model", "pad_id"),
}  # fmt: skip


def task_values(name: str) -> dict[str, list]:
    """A task's fields, each with its base value first and others to try."""
    base = TASK_BASES[name]
    params = TASKS[name].Params
    out = {}
    for f in dataclasses.fields(params):
        value = base.get(f.name, f.default)
        out[f.name] = [value, *_others(value, f.name)]
    return out


def _others(value: Any, name: str) -> list:
    """Other values of a task's field, far enough from ``value`` to change a small sample of data."""
    if isinstance(value, bool):
        return [not value]
    if value is None:
        return [4 if "len" in name else 1]
    if isinstance(value, int):
        return [2 * value + 1, max(1, value // 2)] if value > 1 else [value + 2]
    if isinstance(value, float):
        return [value / 2 if value > 0 else 0.1]
    return []


def draw_run(rng: random.Random, task: str) -> dict[str, Any]:
    """A run file of ``task`` with its model and training drawn from the values above (not yet checked)."""
    model = {k: v[0] for k, v in MODEL_VALUES.items() if (("model", k) not in NOT_DRAWN)}
    training = {k: v[0] for k, v in TRAINING_VALUES.items()}
    for k, values in MODEL_VALUES.items():
        if ("model", k) not in NOT_DRAWN and rng.random() < P_DRAW:
            model[k] = rng.choice(values)
    for k, values in TRAINING_VALUES.items():
        if rng.random() < P_DRAW:
            training[k] = rng.choice(values)
    kind = TASKS[task].kind
    model["arch"] = {"seq2seq": "encoder_decoder", "lm": "decoder", "classify": "encoder"}[kind]
    if kind == "classify":
        model["n_classes"] = 10
    return {"seed": 0, "task": dict(TASK_BASES[task]), "model": model, "training": training}


def valid_runs(seed: int, n: int) -> list[tuple[str, dict]]:
    """``n`` drawn runs that resolve, spread over the tasks."""
    rng, out, names = random.Random(seed), [], list(TASK_BASES)
    tries = 0
    while len(out) < n:
        tries += 1
        assert tries < 5000, "too few valid runs drawn"
        task = names[len(out) % len(names)]
        data = draw_run(rng, task)
        try:
            resolve_run(data)
        except SpecError:
            continue
        out.append((task, data))
    return out


# --- what a run computes ---------------------------------------------------------------------------------------------


def observe(data: dict[str, Any]) -> dict[str, Any]:
    run = resolve_run(data)
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64 if run.training.precision == "64-true" else torch.float32)  # Lightning's way
    try:
        return _observe(run)
    finally:
        torch.set_default_dtype(before)


def _observe(run) -> dict[str, Any]:
    t = run.training
    torch.manual_seed(0)
    dm = TaskDataModule(run.task, t.batch_size, run.seed, t.eval_batch_size)
    dm.setup()
    seen: dict[str, Any] = {"data": {s: dm.digest(s) for s in dm.task.splits}}
    module = LitTransformer(run.model, t, run.task.kind)
    if t.precision == "64-true":
        module = module.double()  # Lightning's double precision: the module, and the default dtype (observe)
    module.train()
    seen["forward"] = module.scored_logits(next(iter(dm.train_dataloader())))[0].detach().clone()
    seen["losses"] = _three_steps(module, dm)
    steps = range(t.max_steps)
    seen["lr"] = [lr_factor(t, run.model.d_model, s) for s in steps]
    seen["teacher_forcing"] = [teacher_forcing_p(t, s) for s in steps]
    seen["validations"] = [s for s in steps if (s + 1) % t.val_every == 0]
    seen["guard"] = [_verdicts(t, trace) for trace in TRACES]
    module.eval()
    with torch.no_grad():
        if run.task.kind == "seq2seq":  # the decoded sequences themselves (an untrained model matches nothing)
            src = collate(run.task.kind, dm.rows["validation"][:8])["src"]
            seen["decoded"] = module.model.generate(
                source=src, source_padding=src == 0, max_new_tokens=run.model.max_len if run.model.non_autoregressive
                else 8, bos_id=1, eos_id=2, beam_size=t.beam_size,
                length_penalty=t.length_penalty,
            )  # fmt: skip
        positions = dm.task.target_positions("validation") if run.task.kind == "seq2seq" else 0
        seen["evaluation"] = module.evaluate(
            dm.val_dataloader(), "val", t.decode_batches, positions=positions, max_batches=t.val_batches
        )
        # what the evaluation counts, batch by batch: its sums, sequences decoded among them (exact match is 0 of
        # however many an untrained model decodes)
        loader = list(dm.val_dataloader())[: t.val_batches]
        decode = [t.decode_batches is None or i < t.decode_batches for i in range(len(loader))]
        counts = [module.batch_sums(b, d)[[1, 3, 5]] for b, d in zip(loader, decode)]
        seen["evaluation_counts"] = torch.stack(counts).sum(0).tolist()
    return seen


TRACES = [  # losses a run could log: falling near zero, then climbing back early or late; a spike; a slow rise
    [2.0 - 0.05 * s for s in range(38)] + [0.1 + 0.2 * s for s in range(40)],
    [2.0 - 0.2 * s for s in range(9)] + [0.2 + 0.3 * s for s in range(30)],
    [2.0] * 20 + [float("inf")] + [2.0] * 20,
    [1.0 + 0.05 * s for s in range(80)],
]


def _verdicts(t: TrainingConfig, trace: list[float]) -> list[bool]:
    guard = DivergenceGuard(t.diverge_factor, t.diverge_after)
    return [guard.check(step, loss) is not None for step, loss in enumerate(trace)]


def _three_steps(module: LitTransformer, dm) -> list[float]:
    """The training loss at three AdamW steps, with the run's schedule, clipping and teacher forcing."""
    t = module.training_cfg
    opt = module.configure_optimizers()
    optimizer, scheduler = opt["optimizer"], opt["lr_scheduler"]["scheduler"]
    losses = []
    batches = iter(dm.train_dataloader())
    torch.manual_seed(1)
    for step in range(3):
        batch = next(batches)
        batch = {k: v for k, v in batch.items()}
        loss, _, _ = module.step_loss(batch, step)
        losses.append(float(loss.detach()))
        loss.backward()
        if t.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(module.parameters(), t.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
    return losses


def differs(a: dict[str, Any], b: dict[str, Any], tolerance: float = 0.0) -> list[str]:
    """The observables on which ``a`` and ``b`` differ (beyond ``tolerance``, relative)."""
    out = []
    for key in a:
        x, y = a[key], b[key]
        if isinstance(x, torch.Tensor):
            same = x.dtype == y.dtype and x.shape == y.shape
            same = same and (torch.equal(x, y) or torch.allclose(x, y, rtol=tolerance, atol=tolerance))
        elif isinstance(x, dict) and all(isinstance(v, float) for v in x.values()):
            same = x.keys() == y.keys() and all(_close(x[k], y[k], tolerance) for k in x)
        elif isinstance(x, list) and x and isinstance(x[0], float):
            same = len(x) == len(y) and all(_close(p, q, tolerance) for p, q in zip(x, y))
        else:
            same = x == y
        if not same:
            out.append(key)
    return out


def _close(x: float, y: float, tolerance: float) -> bool:
    return (math.isnan(x) and math.isnan(y)) or x == y or abs(x - y) <= tolerance * max(1.0, abs(x), abs(y))


# --- the property -------------------------------------------------------------------------------------------------

FIELDS = (
    [("model", f.name) for f in dataclasses.fields(ModelConfig) if ("model", f.name) not in NOT_DRAWN]
    + [("training", f.name) for f in dataclasses.fields(TrainingConfig)]
    + [("task", f"{task}.{name}") for task in TASK_BASES for name in task_values(task)]
)
BASES_PER_FIELD = 2  # accepted changes tried per field: twice this (the suite's time, 2 cores)


def test_every_field_of_the_sections_has_values_to_try():
    """A field added to a section without values here fails: it would escape the property below."""
    assert {f.name for f in dataclasses.fields(ModelConfig)} == set(MODEL_VALUES)
    assert {f.name for f in dataclasses.fields(TrainingConfig)} == set(TRAINING_VALUES)


_OBSERVED: dict[int, dict] = {}


def _observed(index: int, data: dict) -> dict:
    if index not in _OBSERVED:
        _OBSERVED[index] = observe(data)
    return _OBSERVED[index]


RUNS = valid_runs(63, 80)


@pytest.mark.parametrize("section,field", FIELDS, ids=[f"{s}.{f}" for s, f in FIELDS])
def test_a_changed_value_changes_what_the_run_computes_or_is_refused(section, field):
    if section == "task":
        task, name = field.split(".")
        candidates = [(i, d) for i, (t, d) in enumerate(RUNS) if t == task]
        values = task_values(task)[name]
    else:
        name = field
        values = (MODEL_VALUES if section == "model" else TRAINING_VALUES)[name]
        candidates = list(enumerate(d for _, d in RUNS))
        random.Random(field).shuffle(candidates)  # every run, until enough changes were accepted
    operational = OPERATIONAL.get((section, name))
    tried = 0
    no_ops = []
    for index, data in candidates:
        current = data[section].get(name, values[0])
        for value in values:
            if value == current or (value is None and name not in data[section] and section != "task"):
                continue
            changed = {**data, section: {**data[section], name: value}}
            try:
                other_run = resolve_run(changed)
            except SpecError:
                continue  # refused: fine
            if other_run.config_hash() == resolve_run(data).config_hash():
                continue  # what leaving the key out means, written as left out: one cell, not two
            tried += 1
            base, other = _observed(index, data), observe(changed)
            here = operational and not _cut(data, changed, name)
            diff = differs(base, other, tolerance=1e-5 if here else 0.0)
            if here:
                assert not diff, f"{section}.{name}={value!r} is declared operational but changed {diff}"
                continue
            if not diff:
                no_ops.append(f"{section}.{name}: {current!r} -> {value!r} in {_describe(data)}")
        if tried >= BASES_PER_FIELD * 2:
            break
    assert not no_ops, "accepted, and changes nothing observed:\n" + "\n".join(no_ops)


def _cut(data: dict, changed: dict, name: str) -> bool:
    """Whether the evaluation's batch size decides which sequences are evaluated: a cap on the batches scored or
    decoded that stops short of the validation split in either run."""
    if name != "eval_batch_size":
        return False
    size = data["task"].get("val_size", 500)
    for run in (data, changed):
        t = run["training"]
        batch = t.get("eval_batch_size") or t.get("batch_size", 32)
        caps = [c for c in (t.get("val_batches"), t.get("decode_batches", 4)) if c]  # 0 decodes none in both
        if any(c * batch < size for c in caps):
            return True
    return False


def _describe(data: dict) -> str:
    m = data["model"]
    keys = ("arch", "score", "pattern", "positions", "decoding")
    return f"task {data['task']['name']}, " + ", ".join(f"{k}={m.get(k)}" for k in keys)
