"""Settings a run would not read, refused across its sections (two variants would train one model under two
names): decoding settings of a task that decodes nothing, windows and global tokens its sequences make moot."""

from __future__ import annotations

from dataclasses import fields

from models.config import ModelConfig
from models.training import TrainingConfig
from record.spec.common import Origin


def read_by_the_run(origin: Origin, task, model: ModelConfig, training: TrainingConfig) -> None:
    """A setting that the run's other sections leave unread is refused (two variants would train one model under
    two names): decoding settings for tasks that decode nothing, a window that covers every sequence of the task (full
    attention under another name), a global token past every sequence."""
    default = {f.name: f.default for f in fields(TrainingConfig)}
    seq2seq, autoregressive = task.kind == "seq2seq", not model.non_autoregressive
    for name, reads, why in (
        ("beam_size", seq2seq and autoregressive, "beam search decodes seq2seq targets left to right"),
        ("decode_batches", seq2seq, "exact match decodes seq2seq targets"),
        ("length_loss_weight", not autoregressive, "the target length is predicted by non-autoregressive decoding"),
    ):
        if not reads and getattr(training, name) != default[name]:
            raise origin.error(
                ("training", name),
                f"{name}={getattr(training, name)!r} changes nothing here: {why}, and this run trains task "
                f"{task.name!r} ({task.kind}) with decoding={model.decoding!r} (remove {name})",
                involves=[("training", name), ("task", "name"), ("model", "decoding")],
            )
    if model.arch == "encoder" and model.classifier == "token" and not getattr(task, "token_labels", False):
        raise origin.error(
            ("model", "classifier"),
            f"'token' tags every token, and task {task.name!r} labels each sequence once (use 'mean' or 'first')",
            involves=[("model", "classifier"), ("task", "name")],
        )
    _window_within_the_task(origin, task, model)


def _window_within_the_task(origin: Origin, task, model: ModelConfig) -> None:
    """Windows and global tokens against the task's longest sequence (every split, ``Task.max_length``)."""
    longest = task.max_length
    beyond = [t for t in model.global_tokens or () if t >= longest]
    if beyond:
        raise origin.error(
            ("model", "global_tokens"),
            f"global_tokens {beyond} are at or past every sequence of task {task.name!r} (at most {longest} tokens): "
            "no input ever has them (remove them)",
            involves=[("model", "global_tokens"), ("task", "name")],
        )
    stacks = [model.attention_layers()] + (
        [model.attention_layers(model.decoder_layers, causal=True)] if model.arch == "encoder_decoder" else []
    )
    covered = sorted({i for layers in stacks for i, la in enumerate(layers) if _covers(la, longest)})
    if covered:
        raise origin.error(
            ("model", "layer_windows" if model.layer_windows is not None else "window"),
            f"the window of layer(s) {covered} sees every token of every sequence of task {task.name!r} (at most "
            f"{longest} tokens): that is full attention under another name (use pattern 'full' there, or a smaller "
            "window)",
            involves=[("model", "window"), ("model", "layer_windows"), ("model", "pattern"), ("task", "name")],
        )


def _covers(layer, longest: int) -> bool:
    """A windowed layer whose every head sees every key of the longest sequence."""
    return layer.window is not None and max(layer.dilations) == 1 and layer.window >= longest - 1
