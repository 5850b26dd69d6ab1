"""ModelConfig: one serialisable description of a Transformer variant.

Strings name components; each axis resolves through a small registry in its own module
(``ATTENTION_SCORES``, ``PATTERNS``, ``POSITIONS``, ``NORMS``, ``FEED_FORWARDS``), so adding a variant
is one class and one line. Every field is checked when the config is built, and impossible
combinations are refused with a message that names the field, the value and what to do instead.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from typing import Any

ARCHS = ("encoder", "decoder", "encoder_decoder")
NORM_PLACEMENTS = ("pre", "post")
NORM_TYPES = ("layernorm", "rmsnorm")
POSITIONS = ("sinusoidal", "learned", "none", "rotary", "alibi")
SCORES = ("dot", "dot_unscaled", "general", "cosine", "additive")
PATTERNS = ("full", "local", "dilated")
FEED_FORWARDS = ("relu", "gelu", "swiglu")
CLASSIFIERS = ("mean", "first", "token")


class ConfigError(ValueError):
    """A configuration that cannot be built. The message names the field, the value and the fix."""


def _choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        valid = ", ".join(repr(c) for c in choices)
        raise ConfigError(f"{name}={value!r} is not a valid choice; valid: {valid}")


def _positive_int(name: str, value: Any, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name}={value!r} must be a positive integer")


def _probability(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
        raise ConfigError(f"{name}={value!r} must be a number in [0, 1)")


@dataclass(frozen=True)
class ModelConfig:
    """A Transformer variant.

    arch: ``encoder`` (classification or tagging), ``decoder`` (causal language model) or
    ``encoder_decoder`` (seq2seq with cross-attention).
    """

    arch: str = "decoder"
    vocab_size: int = 256
    # encoder_decoder: target vocabulary; None shares the source vocabulary (and its embedding table).
    tgt_vocab_size: int | None = None
    # encoder: number of output classes; classifier pools ``mean`` / ``first`` token, or tags each ``token``.
    n_classes: int | None = None
    classifier: str = "mean"
    d_model: int = 128
    n_layers: int = 2  # encoder layers, or decoder layers for arch=decoder
    n_decoder_layers: int | None = None  # encoder_decoder: decoder depth (default n_layers)
    n_heads: int = 4
    head_dim: int | None = None  # default d_model // n_heads (Vaswani Table 3 rows A/B vary it alone)
    d_ff: int | None = None  # default 4 * d_model
    dropout: float = 0.0  # residual dropout (after attention and feed-forward)
    attn_dropout: float = 0.0  # on the attention probabilities
    emb_dropout: float = 0.0  # on the embeddings (+ positions)
    max_len: int = 512  # size of the learned position table; sinusoidal/rotary/alibi/none extrapolate
    norm: str = "pre"  # placement: pre (adds a final norm) | post (Vaswani et al.)
    norm_type: str = "layernorm"
    norm_eps: float = 1e-5
    positions: str = "sinusoidal"
    rotary_base: float = 10000.0
    score: str = "dot"
    pattern: str = "full"
    window: int | None = None  # local/dilated: keys at distance <= window (* dilation) are seen
    dilation: int = 1
    # Optional per-layer patterns of the self-attention, bottom to top (e.g. local below, full above).
    layer_patterns: tuple[str, ...] | None = None
    ffn: str = "relu"
    bias: bool = True
    # None: tie wherever there is a language-model head (decoder, encoder_decoder).
    tie_embeddings: bool | None = None
    scale_embeddings: bool = True  # multiply token embeddings by sqrt(d_model)
    pad_id: int = 0
    # Additive scores are computed in chunks of at most this many elements per tensor.
    chunk_elements: int = 1 << 18

    def __post_init__(self) -> None:
        if self.layer_patterns is not None and not isinstance(self.layer_patterns, tuple):
            object.__setattr__(self, "layer_patterns", tuple(self.layer_patterns))
        self._validate()

    # -- derived values -------------------------------------------------------------------------
    @property
    def head_size(self) -> int:
        return self.head_dim if self.head_dim is not None else self.d_model // self.n_heads

    @property
    def ff_size(self) -> int:
        return self.d_ff if self.d_ff is not None else 4 * self.d_model

    @property
    def decoder_layers(self) -> int:
        return self.n_decoder_layers if self.n_decoder_layers is not None else self.n_layers

    @property
    def target_vocab(self) -> int:
        return self.tgt_vocab_size if self.tgt_vocab_size is not None else self.vocab_size

    @property
    def tied(self) -> bool:
        return self.arch != "encoder" if self.tie_embeddings is None else self.tie_embeddings

    def patterns_for(self, n_layers: int) -> tuple[str, ...]:
        """The self-attention pattern of each layer of a stack of ``n_layers``."""
        return self.layer_patterns if self.layer_patterns is not None else (self.pattern,) * n_layers

    # -- (de)serialisation ----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        if out["layer_patterns"] is not None:
            out["layer_patterns"] = list(out["layer_patterns"])
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ConfigError(f"unknown model key(s) {unknown}; valid keys: {sorted(names)}")
        return cls(**data)

    def replace(self, **changes: Any) -> ModelConfig:
        return dataclasses.replace(self, **changes)

    # -- validation -----------------------------------------------------------------------------
    def _validate(self) -> None:
        _choice("arch", self.arch, ARCHS)
        _choice("norm", self.norm, NORM_PLACEMENTS)
        _choice("norm_type", self.norm_type, NORM_TYPES)
        _choice("positions", self.positions, POSITIONS)
        _choice("score", self.score, SCORES)
        _choice("pattern", self.pattern, PATTERNS)
        _choice("ffn", self.ffn, FEED_FORWARDS)
        _choice("classifier", self.classifier, CLASSIFIERS)
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "max_len", "dilation", "chunk_elements"):
            _positive_int(name, getattr(self, name))
        for name in ("tgt_vocab_size", "n_classes", "n_decoder_layers", "head_dim", "d_ff", "window"):
            _positive_int(name, getattr(self, name), allow_none=True)
        for name in ("dropout", "attn_dropout", "emb_dropout"):
            _probability(name, getattr(self, name))
        for name in ("bias", "scale_embeddings"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name}={getattr(self, name)!r} must be true or false")
        if self.tie_embeddings is not None and not isinstance(self.tie_embeddings, bool):
            raise ConfigError(f"tie_embeddings={self.tie_embeddings!r} must be true, false or null (auto)")
        if isinstance(self.pad_id, bool) or not isinstance(self.pad_id, int) or self.pad_id < 0:
            raise ConfigError(f"pad_id={self.pad_id!r} must be a non-negative integer")
        if self.pad_id >= self.vocab_size:
            raise ConfigError(f"pad_id={self.pad_id} must be below vocab_size={self.vocab_size}")
        if not isinstance(self.norm_eps, (int, float)) or self.norm_eps <= 0:
            raise ConfigError(f"norm_eps={self.norm_eps!r} must be a positive number")
        if not isinstance(self.rotary_base, (int, float)) or self.rotary_base <= 1:
            raise ConfigError(f"rotary_base={self.rotary_base!r} must be a number above 1")

        if self.head_dim is None and self.d_model % self.n_heads != 0:
            raise ConfigError(
                f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}; "
                "choose a divisible pair or set head_dim explicitly"
            )

        # arch-specific fields
        if self.arch == "encoder":
            if self.n_classes is None:
                raise ConfigError("arch='encoder' needs n_classes (the size of the classification or tagging head)")
            if self.tie_embeddings:
                raise ConfigError(
                    "tie_embeddings=true needs a language-model head; arch='encoder' has a classifier "
                    "(set tie_embeddings to false or null)"
                )
        elif self.n_classes is not None:
            raise ConfigError(f"n_classes is only for arch='encoder' (got arch={self.arch!r}); remove it")
        if self.arch != "encoder_decoder":
            for name in ("tgt_vocab_size", "n_decoder_layers"):
                if getattr(self, name) is not None:
                    raise ConfigError(f"{name} is only for arch='encoder_decoder' (got arch={self.arch!r}); remove it")
        if self.arch == "encoder_decoder" and self.tgt_vocab_size is not None and self.pad_id >= self.tgt_vocab_size:
            raise ConfigError(f"pad_id={self.pad_id} must be below tgt_vocab_size={self.tgt_vocab_size}")

        # attention: positions x score
        if self.positions == "rotary":
            if self.score == "additive":
                raise ConfigError(
                    "positions='rotary' encodes offsets through the dot product q.k, which score='additive' "
                    "does not compute; use positions sinusoidal, learned, alibi or none with additive scores"
                )
            if self.head_size % 2:
                raise ConfigError(
                    f"positions='rotary' rotates pairs of dimensions and needs an even head_dim (got {self.head_size})"
                )

        # attention: patterns
        patterns = self.layer_patterns if self.layer_patterns is not None else (self.pattern,)
        for i, p in enumerate(patterns):
            _choice(f"layer_patterns[{i}]" if self.layer_patterns is not None else "pattern", p, PATTERNS)
        if self.layer_patterns is not None:
            if self.arch == "encoder_decoder" and self.decoder_layers != self.n_layers:
                raise ConfigError(
                    f"layer_patterns applies to both stacks of arch='encoder_decoder', which then need the same "
                    f"depth (n_layers={self.n_layers}, n_decoder_layers={self.decoder_layers})"
                )
            if len(self.layer_patterns) != self.n_layers:
                raise ConfigError(
                    f"layer_patterns has {len(self.layer_patterns)} entries but the stack has {self.n_layers} "
                    "layers; give one pattern per layer"
                )
        windowed = any(p in ("local", "dilated") for p in patterns)
        dilated = any(p == "dilated" for p in patterns)
        if windowed and self.window is None:
            raise ConfigError("pattern 'local' or 'dilated' needs window (keys at distance <= window are seen)")
        if not windowed and self.window is not None:
            raise ConfigError(
                f"window={self.window} requires pattern 'local' or 'dilated' (got pattern={self.pattern!r}); "
                "remove window or change the pattern"
            )
        if self.dilation > 1 and not dilated:
            raise ConfigError(
                f"dilation requires pattern 'dilated' (got pattern={self.pattern!r}, dilation={self.dilation})"
            )
        if dilated and self.dilation < 2:
            raise ConfigError("pattern 'dilated' needs dilation >= 2 (dilation 1 is pattern 'local')")

    # A short human-readable name, used in logs.
    def describe(self) -> str:
        parts = [
            self.arch,
            f"d{self.d_model}",
            f"L{self.n_layers}",
            f"H{self.n_heads}",
            self.norm,
            self.positions,
            self.score,
        ]
        parts.append(self.pattern if self.window is None else f"{self.pattern}{self.window}")
        return "-".join(parts)
