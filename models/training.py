"""How a run trains: the training configuration (optimiser, schedules, scheduled sampling, decoding for exact match,
the divergence guard's settings) and the schedules themselves. Plain Python: declaring or checking a run (the
study loader, every ``ablate`` command before it trains) imports neither Lightning nor the model's kernels;
``models.lightning`` trains with it.

Validated by pydantic as ``ModelConfig`` is (``models.fields``): each field's type and range in its annotation
(``Annotated[int, Ge(1)]``: ``max_steps=0 must be >= 1``), the rules between fields in ``_check``."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import fields
from typing import Annotated, Any, Literal

from annotated_types import Ge, Gt, Le
from pydantic import BeforeValidator, model_validator

from models.config import ConfigError
from models.fields import Betas, Number, config

SCHEDULES = ("noam", "warmup_cosine", "warmup_constant", "constant")
SAMPLING = ("teacher_forcing", "scheduled")
SAMPLING_SCHEDULES = ("linear", "exponential", "inverse_sigmoid")
SPEED_OPTIONS = ("compile", "fused_adamw")  # fields that change how fast a run trains, not what it learns
# Lightning's precisions (its older spellings "32", "16", "bf16" and "64" refused, with the full name to write)
PRECISIONS = ("32-true", "bf16-mixed", "16-mixed", "bf16-true", "16-true", "64-true")
_ALIASES = {"32": "32-true", "16": "16-mixed", "bf16": "bf16-mixed", "64": "64-true"}
FLOAT16_TINY = 2.0**-24  # the smallest float16 above zero: a smaller AdamW eps is 0 in float16
# Fields left out of a configuration's dictionary at these defaults, so that a configuration written before they
# existed keeps its dictionary, hence its config hash (its run's identity): the speed options, and how
# sequences are decoded for exact match (beam width and length penalty, Britz et al. 2017 Table 7).
OMITTED_AT_DEFAULT = {"compile": False, "fused_adamw": False, "beam_size": 1, "length_penalty": 0.0}
# The order of the fields' own refusals when a configuration has several mistakes: the numbers, then the choices and
# the flags (the rules between fields come after, ``TrainingConfig._check``).
REFUSAL_ORDER = (
    *("max_steps", "max_time", "batch_size", "eval_batch_size", "lr", "eps", "weight_decay", "warmup_steps"),
    *("min_lr_ratio", "grad_clip", "label_smoothing", "length_loss_weight", "val_every", "val_batches"),
    *("decode_batches", "beam_size", "length_penalty", "sampling_k", "sampling_min", "diverge_factor"),
    *("diverge_after", "betas", "schedule", "sampling", "sampling_schedule", "precision", "deterministic"),
    *SPEED_OPTIONS,
)


def _lightning_name(value: Any) -> Any:
    """Lightning's short name of a precision is refused with what it means, not the nearest spelling."""
    alias = _ALIASES.get(str(value))
    if alias and value not in PRECISIONS:
        valid = ", ".join(map(repr, PRECISIONS))
        raise ConfigError(
            f"precision={value!r} is not a valid choice; did you mean {alias!r}? valid: {valid}",
            field="precision",
            value=value,
            fix=f"write {alias!r}, Lightning's full name of it",
        )
    return value


Precision = Annotated[Literal[PRECISIONS], BeforeValidator(_lightning_name)]


@config(order=REFUSAL_ORDER)
class TrainingConfig:
    """How a run trains. ``lr`` is the peak rate, except for ``noam`` where it is the factor in front of
    d_model^-0.5 * min(step^-0.5, step * warmup^-1.5) (Vaswani et al. used 1)."""

    max_steps: Annotated[int, Ge(1)] = 1000
    max_time: Annotated[Number, Gt(0)] | None = None  # seconds of training at most (a budget), None: no limit
    batch_size: Annotated[int, Ge(1)] = 32
    eval_batch_size: Annotated[int, Ge(1)] | None = None
    lr: Annotated[Number, Gt(0)] = 1e-3
    betas: Betas = (0.9, 0.98)
    eps: Annotated[Number, Gt(0)] = 1e-9
    weight_decay: Annotated[Number, Ge(0)] = 0.0  # applied to matrices only, not to norms, biases or embeddings
    schedule: Literal[SCHEDULES] = "warmup_cosine"
    warmup_steps: Annotated[int, Ge(0)] = 100
    min_lr_ratio: Annotated[Number, Ge(0), Le(1)] = 0.0  # warmup_cosine decays to lr * min_lr_ratio
    grad_clip: Annotated[Number, Gt(0)] | None = 1.0  # max gradient norm, None: no clipping
    label_smoothing: Annotated[Number, Ge(0), Le(0.99)] = 0.0
    # non-autoregressive decoding: weight of the target-length loss (fairseq's 0.1)
    length_loss_weight: Annotated[Number, Ge(0)] = 0.1
    precision: Precision = "32-true"  # Lightning's (PRECISIONS): bf16-mixed, 16-mixed (GPUs; a CPU runs them slowly)
    val_every: Annotated[int, Ge(1)] = 100  # steps between validations
    val_batches: Annotated[int, Ge(1)] | None = None  # cap on validation batches, None: the whole split
    decode_batches: Annotated[int, Ge(0)] | None = 4  # validation batches decoded for exact match (seq2seq)
    # How seq2seq targets are decoded for exact match (validation and test): beam search of this width (1:
    # greedy) scoring a hypothesis of n tokens with log-probability s as s / n**length_penalty.
    beam_size: Annotated[int, Ge(1)] = 1
    length_penalty: Annotated[Number, Ge(0)] = 0.0
    sampling: Literal[SAMPLING] = "teacher_forcing"  # or "scheduled" (Bengio et al. 2015)
    sampling_schedule: Literal[SAMPLING_SCHEDULES] = "inverse_sigmoid"
    sampling_k: Annotated[Number, Gt(0)] = (
        500.0  # linear: 1 - step / k (floored at sampling_min); exponential: 1/e time; inverse_sigmoid: k
    )
    sampling_min: Annotated[Number, Ge(0), Le(1)] = 0.0  # lowest probability of feeding the gold token
    # diverged when the smoothed loss exceeds factor * its running minimum
    diverge_factor: Annotated[Number, Gt(1)] | None = 4.0
    diverge_after: Annotated[int, Ge(0)] = 50  # steps before the factor rule applies (a non-finite loss stops at once)
    deterministic: bool = True
    # Speed only (the same training, other kernels): torch.compile the model's forward; AdamW's fused
    # implementation (one kernel for every parameter; CUDA, and CPU from torch 2.4).
    compile: bool = False
    fused_adamw: bool = False

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainingConfig:
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ConfigError(
                f"unknown training key(s) {unknown}; valid keys: {sorted(names)}",
                field=unknown[0],
                value=data[unknown[0]],
                fix=f"remove {unknown[0]} or correct its name",
                related=unknown[1:],
            )
        return cls(**data)

    def implied(self) -> dict[str, Any]:
        """What each field left out (None) means here (``ModelConfig.implied``)."""
        return {"eval_batch_size": self.batch_size}

    def to_dict(self) -> dict[str, Any]:
        """Every field, except those of ``OMITTED_AT_DEFAULT`` left at their defaults: a configuration written
        before they existed keeps its dictionary, hence its config hash (its run's identity)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["betas"] = list(self.betas)
        for name, default in OMITTED_AT_DEFAULT.items():
            if out[name] == default:  # validated: booleans are booleans, numbers numbers
                del out[name]
        return out

    @model_validator(mode="after")
    def _check(self) -> TrainingConfig:
        """The rules between fields, once each field is of its type: what a schedule and a precision need, then
        the values no part of the training reads."""
        self._check_choices()
        self._check_precision()
        self._check_read()
        return self

    def _sampling_floor_reached(self) -> bool:
        """Whether scheduled sampling's decay reaches ``sampling_min`` within the run's steps (else it reads it not)."""
        raw = dataclasses.replace(self, sampling_min=0.0) if self.sampling_min else self
        return any(teacher_forcing_p(raw, s) < self.sampling_min for s in range(self.max_steps))

    def _check_read(self) -> None:
        """A value no part of the training reads is refused (two variants would train one model under two names):
        each entry is (field, whether it is read, what reads it, the setting that would)."""
        default = {f.name: f.default for f in fields(self)}
        scheduled = self.sampling == "scheduled"
        for name, read, reader, related in (
            ("min_lr_ratio", self.schedule == "warmup_cosine", "schedule='warmup_cosine' decays to it", "schedule"),
            ("warmup_steps", self.schedule != "constant", "a schedule with warm-up reads it", "schedule"),
            ("sampling_schedule", scheduled, "sampling='scheduled' follows it", "sampling"),
            ("sampling_k", scheduled, "sampling='scheduled' follows it", "sampling"),
            ("sampling_min", scheduled, "sampling='scheduled' follows it", "sampling"),
            (
                "sampling_min",
                not scheduled or self._sampling_floor_reached(),
                f"the schedule decays to it; within max_steps={self.max_steps} it stays above it",
                "sampling_k",
            ),
            ("length_penalty", self.beam_size > 1, "beam search (beam_size > 1) scores with it", "beam_size"),
            (
                "diverge_after",
                self.diverge_factor is not None,
                "the diverge_factor rule starts there",
                "diverge_factor",
            ),
        ):
            if not read and getattr(self, name) != default[name]:
                raise ConfigError(
                    f"{name}={getattr(self, name)!r} changes nothing with {related}={getattr(self, related)!r} "
                    f"({reader}); remove {name}",
                    field=name,
                    value=getattr(self, name),
                    fix=f"remove {name}, or set {related}",
                    related=(related,),
                )

    def _check_choices(self) -> None:
        """What the schedules need: noam a warm-up, inverse_sigmoid a k of at least 1."""
        if self.schedule == "noam" and self.warmup_steps < 1:
            raise ConfigError(
                "schedule='noam' needs warmup_steps >= 1",
                field="warmup_steps",
                value=self.warmup_steps,
                fix="set warmup_steps >= 1, or another schedule",
                related=("schedule",),
            )
        if self.sampling_schedule == "inverse_sigmoid" and self.sampling == "scheduled" and self.sampling_k < 1:
            raise ConfigError(
                f"sampling_schedule='inverse_sigmoid' needs sampling_k >= 1 (got {self.sampling_k})",
                field="sampling_k",
                value=self.sampling_k,
                fix="set sampling_k >= 1, or another sampling_schedule",
                related=("sampling_schedule", "sampling"),
            )

    def _check_precision(self) -> None:
        """AdamW's eps in float16 parameters."""
        if self.precision == "16-true" and self.eps < FLOAT16_TINY and not self.fused_adamw:
            raise ConfigError(
                f"eps={self.eps:g} is 0 in float16, the dtype of the parameters and of AdamW's state under "
                "precision='16-true': AdamW divides 0 by 0 for every parameter with no gradient yet, and the first "
                "step makes the model non-finite",
                field="eps",
                value=self.eps,
                fix="set eps to 1e-7 or more, or use precision '16-mixed' (float32 parameters), or set fused_adamw: "
                "true (it computes in float32)",
                related=("precision", "fused_adamw"),
            )


def lr_factor(cfg: TrainingConfig, d_model: int, step: int) -> float:
    """Multiplier of ``lr`` at optimizer step ``step`` (0-based)."""
    s = step + 1
    w = cfg.warmup_steps
    if cfg.schedule == "noam":
        return d_model**-0.5 * min(s**-0.5, s * w**-1.5)
    warm = min(1.0, s / w) if w > 0 else 1.0
    if cfg.schedule == "constant":
        return 1.0
    if cfg.schedule == "warmup_constant" or s <= w:
        return warm
    progress = min(1.0, (s - w) / max(1, cfg.max_steps - w))
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def teacher_forcing_p(cfg: TrainingConfig, step: int) -> float:
    """Probability of feeding the gold previous token at ``step`` (1.0 for plain teacher forcing)."""
    if cfg.sampling == "teacher_forcing":
        return 1.0
    k = cfg.sampling_k
    if cfg.sampling_schedule == "linear":
        p = 1.0 - step / k
    elif cfg.sampling_schedule == "exponential":
        p = math.exp(-step / k)
    else:
        p = k / (k + math.exp(min(step / k, 700.0)))
    return max(cfg.sampling_min, p)


def metric_names(kind: str, *, exact: bool, length: bool) -> list[str]:
    """The names ``LitTransformer.metrics_from_sums`` gives a split's metrics (without the split's prefix): for a
    task of ``kind``, with exact match scored (``exact``) and the target length predicted (``length``, NAT)."""
    if kind == "classify":
        return ["loss", "accuracy"]
    return ["loss", "ppl", "token_acc"] + (["exact_match"] if exact else []) + (["length_acc"] if length else [])
