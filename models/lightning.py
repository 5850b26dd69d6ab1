"""The LightningModule: losses for every arch, AdamW with warm-up schedules, scheduled sampling, a
divergence guard, and metrics of quality and cost.

Non-autoregressive seq2seq models train on every target position at once plus ``length_loss_weight`` times the
loss of the length predictor: ``decoding='nat_gu'`` (Gu et al. 2018's decoder) and ``'uniform_copy'`` (its inputs
alone) from the source embeddings copied uniformly to the target's length, every position scored;
``decoding='mask_predict'`` (Ghazvininejad et al. 2019, section 3.1) as a conditional masked LM: a uniformly drawn
number of random positions behind [MASK], those scored, whatever ``nat_iterations`` and ``length_candidates`` (the
passes and the length beam at evaluation only). Validation scores every position (all-[MASK] inputs for
mask-predict) and reports ``length_acc``; exact match decodes with ``Transformer.generate``.

Notation: B batch, T target length, S source length, V vocabulary.

Metrics are not sent anywhere from here (models/ imports no tracking library): the module appends
``(step, {name: value})`` to ``self.pending`` and a callback of the caller drains it. Training metrics are
computed every ``log_every`` steps only, so that logging costs almost nothing.
"""

from __future__ import annotations

import math
import time
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F

from models.config import ConfigError, ModelConfig
from models.flops import training_flops_per_token, utilisation
from models.tasks.base import BOS, EOS, PAD
from models.training import (  # noqa: F401  (re-exported: models.lightning.TrainingConfig keeps working)
    OMITTED_AT_DEFAULT,
    SAMPLING,
    SAMPLING_SCHEDULES,
    SCHEDULES,
    SPEED_OPTIONS,
    TrainingConfig,
    lr_factor,
    metric_names,
    teacher_forcing_p,
)
from models.transformer import Transformer


def cxx_compiler() -> str | None:
    """The C++ compiler torch.compile's CPU backend would build its kernels with (``CXX``, else g++; clang++ on
    macOS), where it is found; None where it is not."""
    import os
    import shutil
    import sys

    return shutil.which(os.environ.get("CXX", "clang++" if sys.platform == "darwin" else "g++"))


def check_device(training: TrainingConfig, device: torch.device | str) -> None:
    """Refuse, before anything trains, a training setting the device cannot run: compile on a CPU without a C++
    compiler (its first step failed deep inside torch's compiler), bf16 on a GPU without bfloat16."""
    device = torch.device(device)
    if device.type == "cpu" and training.compile and cxx_compiler() is None:
        raise ConfigError(
            "training.compile=true on a CPU needs a C++ compiler: torch.compile builds the CPU's kernels in C++, "
            "and none was found (CXX, else g++)",
            field="training.compile",
            value=True,
            fix="install a C++ compiler (g++, or name one in CXX), or set training.compile: false",
        )
    bf16 = training.precision.startswith("bf16")
    if device.type == "cuda" and bf16 and not torch.cuda.is_bf16_supported(including_emulation=False):
        raise ConfigError(
            f"training.precision={training.precision!r} needs a GPU with bfloat16 (compute capability 8.0 or "
            f"later); {torch.cuda.get_device_name(device)} has none",
            field="training.precision",
            value=training.precision,
            fix="use precision '16-mixed' on this GPU, or run on one with bfloat16",
        )


def reset_peak_memory() -> None:
    """Start the high-water mark again: a worker process reused for many runs must not report its old peaks
    (Linux: /proc/self/clear_refs resets VmHWM; CUDA: the allocator's peak)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.reset_peak_memory_stats()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def peak_memory_mb() -> float:
    """Peak resident memory of this process (CPU) or peak allocated memory (CUDA) since the last
    ``reset_peak_memory()``, in MB."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.max_memory_allocated() / 2**20
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource
    import sys

    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kb / 2**20 if sys.platform == "darwin" else kb / 1024


class DivergenceGuard:
    """A run has diverged when its loss is not finite, or when its smoothed loss (EMA 0.9) rises above
    ``factor`` times its running minimum and climbs back at least half-way to its level when the rule started
    (step ``after``). A ratio alone misfires near zero: a loss of 0.002 wobbling to 0.009 has not diverged."""

    def __init__(self, factor: float | None, after: int) -> None:
        self.factor, self.after = factor, after
        self.smooth: float | None = None
        self.minimum = math.inf
        self.start: float | None = None

    def check(self, step: int, loss: float) -> str | None:
        """None while training is sound, else the reason it diverged."""
        if not math.isfinite(loss):
            return f"non-finite loss ({loss}) at step {step}"
        self.smooth = loss if self.smooth is None else 0.9 * self.smooth + 0.1 * loss
        self.minimum = min(self.minimum, self.smooth)
        if self.start is None and step >= self.after:
            self.start = self.smooth
        f = self.factor
        if (
            f is not None
            and self.start is not None
            and self.smooth > f * self.minimum
            and self.smooth - self.minimum > 0.5 * (self.start - self.minimum)
        ):
            return (
                f"loss {self.smooth:.4g} (smoothed) rose above {f} x its running minimum {self.minimum:.4g} "
                f"and back towards its level at step {self.after} ({self.start:.4g}) at step {step}"
            )
        return None


class LitTransformer(L.LightningModule):
    """Trains a Transformer on one kind of task: ``seq2seq``, ``lm`` or ``classify``."""

    def __init__(
        self,
        model: ModelConfig,
        training: TrainingConfig,
        kind: str,
        log_every: int = 10,
        typical_length: int = 128,
        typical_source_length: int = 0,
    ) -> None:
        super().__init__()
        self.cfg, self.training_cfg, self.kind, self.log_every = model, training, kind, log_every
        self.model = Transformer(model)
        self.n_params = self.model.num_parameters()
        self.flops_per_token = training_flops_per_token(self.model, typical_length, typical_source_length)
        self.pending: list[tuple[int, dict[str, float]]] = []
        self.diverged: dict[str, Any] | None = None
        self.best: dict[str, float] = {}
        self.last_val: dict[str, float] = {}
        self.last_val_step = -1
        self.guard = DivergenceGuard(training.diverge_factor, training.diverge_after)
        # Nothing waits for the device between logged steps: the losses of the steps since the last check
        # stay on the device, and so do the token counts (read with one transfer every ``log_every`` steps).
        self._losses: list[tuple[int, torch.Tensor]] = []
        self._tokens = 0
        self._token_count: torch.Tensor | None = None  # tokens since the last logged step, on the device
        self._last_loss = float("nan")
        self._train_time = 0.0
        self._window_time = 0.0  # seconds of training steps since the last logged step
        self._first_step = (0, 0.0)  # step 0's tokens and seconds (compilation, warm-up): not in the throughput
        self._t0: float | None = None  # the running step's start (None between steps: the clock is stopped)
        self._lengths_checked = False
        if training.compile:
            self.model.compile()  # in place: parameter names (and checkpoints) stay those of the model
        if training.sampling == "scheduled" and model.non_autoregressive:
            raise ConfigError(
                f"sampling='scheduled' feeds a decoder its own earlier predictions; decoding={model.decoding!r} "
                "has none (use sampling='teacher_forcing')",
                field="training.sampling",
                value=training.sampling,
                fix="use sampling='teacher_forcing'",
                related=("model.decoding",),
            )

    # -- batches -> (logits, targets, mask) ------------------------------------------------------
    def scored_logits(self, batch: dict[str, torch.Tensor], tf_p: float = 1.0):
        """Logits and what they are scored against. targets hold -100 where nothing is scored."""
        if self.kind == "classify":
            tokens = batch["tokens"]
            return self.model(tokens, padding=tokens == PAD), batch["label"]
        if self.kind == "seq2seq" and self.cfg.non_autoregressive:
            logits, targets, _, _ = self._parallel(batch, sample_masks=False)
            return logits, targets
        if self.kind == "seq2seq":
            src, tgt_in, tgt_out = batch["src"], batch["tgt_in"], batch["tgt_out"]
            if tf_p < 1.0:
                tgt_in = self._mix_predictions(tgt_in, lambda t: self.model(src, t, padding=src == PAD), tf_p)
            logits = self.model(src, tgt_in, padding=src == PAD)
            return logits, tgt_out.masked_fill(tgt_out == PAD, -100)
        tokens = batch["tokens"]
        inp, tgt = tokens[:, :-1], tokens[:, 1:]
        keep = tgt != PAD
        for mask in ("loss_mask", "score_mask"):  # answers only; positions scored only
            if mask in batch:
                keep &= batch[mask]
        if tf_p < 1.0:  # only tokens the model predicts are fed back: recall's given key-value pairs are not
            predicted = torch.zeros_like(inp, dtype=torch.bool)
            predicted[:, 1:] = keep[:, :-1]
            inp = self._mix_predictions(inp, self.model, tf_p, predicted)
        logits = self.model(inp)  # right padding needs no mask in a causal model
        return logits, tgt.masked_fill(~keep, -100)

    def _parallel(self, batch: dict[str, torch.Tensor], sample_masks: bool):
        """Non-autoregressive: (token logits, targets (-100 where not scored), length logits, lengths)."""
        src, target = batch["src"], batch["tgt_in"][:, 1:]  # (B, T): the target tokens, right-padded
        tpad = target == PAD
        lengths = (~tpad).sum(1)
        if not self._lengths_checked:  # once: a target the length head cannot represent is a config error
            self._lengths_checked = True
            if int(lengths.max()) > self.cfg.max_len:
                raise ConfigError(
                    f"a target of {int(lengths.max())} tokens exceeds max_len={self.cfg.max_len}, the longest length "
                    "the non-autoregressive length predictor knows; raise model.max_len",
                    field="model.max_len",
                    value=self.cfg.max_len,
                    fix=f"raise model.max_len to at least {int(lengths.max())}",
                )
        if sample_masks and self.cfg.decoding == "mask_predict":  # n ~ U{1..length} random positions (CMLM)
            n = (torch.rand(lengths.shape, device=src.device) * lengths).long() + 1
            order = torch.rand(target.shape, device=src.device).masked_fill(tpad, 2.0).argsort(1).argsort(1)
            masked = (order < n[:, None]) & ~tpad
        else:
            masked = ~tpad
        logits, length_logits = self.model.parallel_forward(
            src, target, padding=src == PAD, target_padding=tpad, target_masked=masked
        )
        return logits, target.masked_fill(~masked, -100), length_logits, lengths

    def _mix_predictions(self, inp: torch.Tensor, forward, tf_p: float, eligible=None) -> torch.Tensor:
        """Scheduled sampling for Transformers (Mihaylova and Martins 2019): a first teacher-forced pass
        predicts every next token; each input after the first is replaced by the prediction for it with
        probability 1 - tf_p. ``eligible``: the inputs that are the model's own outputs in generation (Bengio et
        al. feed back generated tokens only; a language model's prompt and context are given)."""
        with torch.no_grad():
            pred = forward(inp).argmax(-1)  # (B, T): prediction of the token after each position
        replace = torch.rand(inp.shape, device=inp.device) >= tf_p
        replace[:, 0] = False
        replace &= inp != PAD
        if eligible is not None:
            replace &= eligible
        mixed = inp.clone()
        mixed[:, 1:] = torch.where(replace[:, 1:], pred[:, :-1], inp[:, 1:])
        return mixed

    def _loss(self, logits, targets, smoothing: float) -> torch.Tensor:
        return F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]).float(),
            targets.reshape(-1),
            ignore_index=-100,
            label_smoothing=smoothing,
        )

    def _count_tokens(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Non-padding tokens the model reads in the batch, a tensor on its device (reading it would wait for the
        device). A language model reads tokens[:, :-1]: the last token is only a target (counted, the throughput
        and MFU were T / (T - 1) too high)."""
        inputs = [t[:, :-1] if k == "tokens" and self.kind == "lm" else t for k, t in batch.items()]
        return sum((t != PAD).sum() for k, t in zip(batch, inputs) if k in ("src", "tgt_in", "tokens"))

    # -- training ---------------------------------------------------------------------------------
    def on_train_batch_start(self, batch, batch_idx) -> None:
        self._t0 = time.perf_counter()

    def step_loss(self, batch: dict[str, torch.Tensor], step: int):
        """(training loss, logits, targets) of a batch at optimisation step ``step``: what a training step
        minimises (a packing calibration runs it outside Lightning's loop)."""
        tf_p = self._teacher_forcing(step)
        if self.kind == "seq2seq" and self.cfg.non_autoregressive:
            logits, targets, length_logits, lengths = self._parallel(batch, sample_masks=True)
            loss = self._loss(logits, targets, self.training_cfg.label_smoothing)
            loss = loss + self.training_cfg.length_loss_weight * F.cross_entropy(length_logits.float(), lengths)
        else:
            logits, targets = self.scored_logits(batch, tf_p)
            loss = self._loss(logits, targets, self.training_cfg.label_smoothing)
        return loss, logits, targets

    def _teacher_forcing(self, step: int) -> float:
        if self.kind == "classify" or self.cfg.non_autoregressive:
            return 1.0
        return teacher_forcing_p(self.training_cfg, step)

    def training_step(self, batch, batch_idx):
        step = self.global_step
        loss, logits, targets = self.step_loss(batch, step)
        self._losses.append((step, loss.detach()))
        if step % self.log_every == 0:
            if self._check_losses():
                return None  # skip this update; the trainer stops
            with torch.no_grad():
                scored = targets != -100
                acc = ((logits.argmax(-1) == targets) & scored).sum() / scored.sum().clamp(min=1)
            metrics = {
                "train/loss": self._last_loss,
                "train/token_acc": float(acc),
                "train/lr": self.trainer.optimizers[0].param_groups[0]["lr"],
            }
            if (tf_p := self._teacher_forcing(step)) < 1.0:
                metrics["train/teacher_forcing_p"] = tf_p
            self.pending.append((step, metrics))
        return loss

    def _check_losses(self) -> bool:
        """The divergence guard over every step since the last check, in order (one transfer from the
        device); True when the run has diverged (and the trainer told to stop)."""
        if not self._losses:
            return False
        steps = [s for s, _ in self._losses]
        values = torch.stack([v.float() for _, v in self._losses])
        self._losses = []
        if self.trainer.world_size > 1:  # data-parallel: every rank judges (and logs) the same mean losses
            values = self.trainer.strategy.reduce(values, reduce_op="mean")
        for step, value in zip(steps, values.tolist()):
            self._last_loss = value
            if self._guard(step, value):
                return True
        return False

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        if self._t0 is None:
            return
        n = self._count_tokens(batch)  # on the device: no wait
        self._token_count = n if self._token_count is None else self._token_count + n
        step = self.global_step - 1  # the step that just ran
        if step % self.log_every == 0:
            window = int(self._token_count)  # waits for the device: its time counts in this step
            self._token_count = None
            self._tokens += window
        dt = time.perf_counter() - self._t0
        self._t0 = None
        if (
            step == 0
        ):  # torch.compile compiles here, once (1.7 s against 1.3 ms a step, as a review measured): kept apart
            self._first_step = (self._tokens, dt)
            self._tokens = 0
        else:
            self._train_time += dt
        self._window_time += dt
        if step % self.log_every == 0 and self._window_time > 0:
            self.pending.append(
                (
                    step,
                    {
                        "train/tokens_per_s": window / self._window_time,
                        "train/step_time_ms": 1000 * self._window_time / max(1, self.log_every if step else 1),
                    },
                )
            )
            self._window_time = 0.0

    def on_train_end(self) -> None:
        """The steps since the last logged one: the guard sees their losses, the cost their tokens and the
        time the device still needed for them."""
        t = time.perf_counter()
        self._check_losses()
        tokens = 0
        if self._token_count is not None:
            tokens = int(self._token_count)
            self._token_count = None
        if self.global_step <= 1:  # one step only: it is the first step's
            self._first_step = (self._first_step[0] + tokens, self._first_step[1] + time.perf_counter() - t)
        else:
            self._tokens += tokens
            self._train_time += time.perf_counter() - t

    def _guard(self, step: int, loss: float) -> bool:
        """The divergence guard: True (and the trainer told to stop) when the run has diverged."""
        reason = self.guard.check(step, loss)
        if reason is None:
            return False
        self.diverged = {"step": step, "reason": reason}
        self.trainer.should_stop = True
        return True

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        """Clip as Lightning does, also for fused AdamW under mixed precision, which Lightning refuses ("does not
        allow for gradient clipping because it performs unscaling of gradients internally"): with bf16 there is
        no loss scale and the gradients are the true ones; with fp16's GradScaler they are unscaled first
        (``GradScaler.unscale_``), after which its step hands the optimizer no scale to divide by again."""
        if not gradient_clip_val or not getattr(optimizer, "_step_supports_amp_scaling", False):
            return super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)
        scaler = getattr(self.trainer.precision_plugin, "scaler", None)
        if scaler is not None:
            scaler.unscale_(optimizer)
        params = [p for group in optimizer.param_groups for p in group["params"]]
        if gradient_clip_algorithm == "value":
            torch.nn.utils.clip_grad_value_(params, gradient_clip_val)
        else:  # "norm", Lightning's default
            torch.nn.utils.clip_grad_norm_(params, gradient_clip_val)

    def configure_optimizers(self):
        """AdamW; weight decay on matrices only (not norms, biases, embeddings or positions). The general
        score's W is stored as I + delta, so decay pulls delta to 0 and W towards its identity start."""
        decay, no_decay = [], []
        for name, p in self.model.named_parameters():
            (decay if p.dim() >= 2 and "embed" not in name and "positions" not in name else no_decay).append(p)
        t = self.training_cfg
        # one group when nothing decays (the same update, one call less per step)
        groups = [{"params": decay, "weight_decay": t.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        opt = torch.optim.AdamW(
            groups if t.weight_decay else [{"params": decay + no_decay, "weight_decay": 0.0}],
            lr=t.lr,
            betas=t.betas,
            eps=t.eps,
            fused=True if t.fused_adamw else None,
            # one kernel per operation for all parameters: torch picks it by default on CUDA only, and on the CPU
            # the loop over tensors cost more than a small model's forward pass (the same arithmetic)
            foreach=None if t.fused_adamw else True,
        )
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: lr_factor(t, self.cfg.d_model, step))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    # -- evaluation -------------------------------------------------------------------------------
    def on_validation_epoch_start(self) -> None:
        self._sums = torch.zeros(8, dtype=torch.float64, device=self.device)

    def validation_step(self, batch, batch_idx):
        decode = self.training_cfg.decode_batches
        self._sums += self.batch_sums(batch, decode is None or batch_idx < decode)

    def on_validation_epoch_end(self) -> None:
        sums = self.trainer.strategy.reduce(self._sums, reduce_op="sum")
        if not self.trainer.sanity_checking:
            self.record_validation(self.metrics_from_sums(sums, "val"))

    def record_validation(self, metrics: dict[str, float]) -> None:
        """Keep the latest and the best validation metrics, and queue them for logging."""
        self.last_val, self.last_val_step = metrics, self.global_step
        for name, value in metrics.items():
            if not math.isfinite(value):  # min(nan, x) is nan: a non-finite first validation stuck as the best
                continue
            better = max if name.endswith(("acc", "accuracy", "exact_match")) else min
            self.best[name] = better(self.best.get(name, value), value)
        self.pending.append((self.global_step, metrics))

    @torch.no_grad()
    def batch_sums(
        self, batch: dict[str, torch.Tensor], decode: bool, positions: torch.Tensor | None = None
    ) -> torch.Tensor:
        """[loss sum, scored tokens, correct tokens, sequences, exact sequences, decoded sequences,
        correct lengths, predicted lengths] (the last two for non-autoregressive decoding). ``positions``
        (2, P), when given, gathers the decoded sequences' errors and targets by position (``exact_matches``)."""
        length_ok = length_n = 0.0
        if self.kind == "seq2seq" and self.cfg.non_autoregressive:
            logits, targets, length_logits, lengths = self._parallel(batch, sample_masks=False)
            length_ok, length_n = float((length_logits.argmax(-1) == lengths).sum()), float(lengths.numel())
        else:
            logits, targets = self.scored_logits(batch)
        scored = targets != -100
        nll = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1), ignore_index=-100, reduction="sum"
        )
        correct = (logits.argmax(-1) == targets) & scored
        n_seq = targets.shape[0]
        if self.kind == "classify":
            exact = correct.sum()
            decoded = n_seq
        elif self.kind == "seq2seq" and decode:
            exact = self.exact_matches(batch, positions)
            decoded = n_seq
        elif self.kind == "lm" and "loss_mask" in batch:  # every answer right (recall, retrieval)
            exact = ((correct | ~scored).all(dim=1) & scored.any(dim=1)).sum()
            decoded = n_seq
        else:
            exact, decoded = 0, 0
        return torch.tensor(
            [float(nll), float(scored.sum()), float(correct.sum()), n_seq, float(exact), decoded, length_ok, length_n],
            dtype=torch.float64,
            device=self.device,
        )

    def exact_matches(self, batch: dict[str, torch.Tensor], positions: torch.Tensor | None = None) -> torch.Tensor:
        """Sequences whose decoding (greedy or beam search with the key/value cache, as ``beam_size`` and
        ``length_penalty`` say, or mask-predict for non-autoregressive models) is exactly the target.

        ``positions`` (2, P), when given, adds for each target position k (the end of sequence included) the
        sequences decoded wrongly there (row 0) and the sequences with a target there (row 1): the free-running
        error by position, where exposure bias shows (Bengio et al. 2015; an early mistake is fed back)."""
        src, tgt_out = batch["src"], batch["tgt_out"]
        t = self.training_cfg
        out = self.model.generate(
            source=src,
            source_padding=src == PAD,
            max_new_tokens=tgt_out.shape[1],
            bos_id=BOS,
            eos_id=EOS,
            beam_size=t.beam_size,
            length_penalty=t.length_penalty,
        )
        width = max(out.shape[1], tgt_out.shape[1])
        out = F.pad(out, (0, width - out.shape[1]), value=PAD)
        tgt_out = F.pad(tgt_out, (0, width - tgt_out.shape[1]), value=PAD)
        if positions is not None:
            w = min(width, positions.shape[1])
            target = tgt_out[:, :w] != PAD
            positions[0, :w] += ((out[:, :w] != tgt_out[:, :w]) & target).sum(0).to(positions.dtype)
            positions[1, :w] += target.sum(0).to(positions.dtype)
        return (out == tgt_out).all(dim=1).sum()

    metric_names = staticmethod(metric_names)

    def metrics_from_sums(self, sums: torch.Tensor, prefix: str) -> dict[str, float]:
        nll, scored, correct, n_seq, exact, decoded, length_ok, length_n = sums.tolist()
        out: dict[str, float] = {}
        if self.kind == "classify":
            out[f"{prefix}/loss"] = nll / max(n_seq, 1)
            out[f"{prefix}/accuracy"] = correct / max(n_seq, 1)
            return out
        loss = nll / max(scored, 1)
        out[f"{prefix}/loss"] = loss
        out[f"{prefix}/ppl"] = math.exp(min(loss, 50.0))
        out[f"{prefix}/token_acc"] = correct / max(scored, 1)
        if decoded:
            out[f"{prefix}/exact_match"] = exact / decoded
        if length_n:
            out[f"{prefix}/length_acc"] = length_ok / length_n
        return out

    @torch.no_grad()
    def evaluate(
        self,
        loader,
        prefix: str,
        decode_batches: int | None = None,
        positions: int = 0,
        max_batches: int | None = None,
    ) -> dict[str, float]:
        """Metrics of a whole split in this process (used after training for the test splits), or of its first
        ``max_batches`` (the validations' ``val_batches``). ``positions`` > 0 (seq2seq): also the decoded error rate
        at each target position 1..positions that some target reaches, ``{prefix}/error_at_{k}``
        (``exact_matches``)."""
        was_training = self.training
        self.eval()
        sums = torch.zeros(8, dtype=torch.float64, device=self.device)
        by_position = torch.zeros(2, positions, dtype=torch.float64, device=self.device) if positions else None
        for i, batch in enumerate(loader):
            if max_batches is not None and i >= max_batches:
                break
            batch = {k: v.to(self.device) for k, v in batch.items()}
            sums += self.batch_sums(batch, decode_batches is None or i < decode_batches, by_position)
        self.train(was_training)
        metrics = self.metrics_from_sums(sums, prefix)
        if by_position is not None and self.kind == "seq2seq":
            errors, counts = by_position.tolist()
            metrics.update(
                {f"{prefix}/error_at_{k + 1}": e / n for k, (e, n) in enumerate(zip(errors, counts)) if n > 0}
            )
        return metrics

    # -- cost -------------------------------------------------------------------------------------
    def cost_summary(self) -> dict[str, float]:
        """The cost of training. Throughput, step time and utilisation are of the steps after the first (step 0
        holds torch.compile's compilation and the first allocations, counted against compile's own speed);
        ``train_tokens`` and ``train_time_s`` count every step."""
        first_tokens, first_time = self._first_step
        timed = self._train_time > 0
        tokens_per_s = self._tokens / self._train_time if timed else (first_tokens / first_time if first_time else 0.0)
        return {
            "tokens_per_s": tokens_per_s,
            "step_time_ms": 1000 * (self._train_time / max(1, self.global_step - 1) if timed else first_time),
            "train_tokens": float(self._tokens + first_tokens),
            "train_time_s": self._train_time + first_time,
            "peak_memory_mb": peak_memory_mb(),
            "n_params": float(self.n_params),
            "flops_per_token": self.flops_per_token,
            "achieved_flops_per_s": self.flops_per_token * tokens_per_s,
            **utilisation(self.flops_per_token * tokens_per_s, self.device, self.training_cfg.precision),
        }
