"""ModelConfig: one serialisable description of a Transformer variant, validated by pydantic when it is built.

Each field declares its type and range in its annotation (the types are ``models.fields``'): a positive integer
(``Size``), a probability, a boolean that is a boolean, one of fixed choices (``Literal``), or the name of a
registered component (``Component``). Strings name components; each kind resolves through its registry in
``models.registry`` (``SCORES``, ``PATTERNS``, ``POSITIONS``, ``NORMS``, ``FEED_FORWARDS``), which is also where the
valid choices come from, so adding a variant is one class and one registry line. The rules between fields
(impossible combinations, two spellings of one model) are ``models.checks``, run after the fields' own; a component
may add its own with a ``check(cfg)`` class method. Every refusal is a ConfigError that names the field, the value
and what to do instead (``models.errors.refusal`` translates pydantic's).

Adding a field: annotate it here (a type of ``models.fields``, or ``Annotated`` with its ``Refusal``); a rule it
has with other fields goes in ``models.checks``. The geometry of each self-attention layer (pattern, window, the
dilation of every head) is resolved here, in ``attention_layers``, from the schedules; docs/components.md explains
every key.
"""

from __future__ import annotations

import dataclasses
from dataclasses import fields
from typing import Annotated, Any, Literal

from annotated_types import Ge, Gt
from pydantic import BeforeValidator, model_validator

from models import checks
from models.errors import ConfigError, Refusal, shown
from models.fields import (
    MOST_LAYERS,
    PLUGIN_FIX,
    AsTuple,
    Component,
    Count,
    GlobalTokens,
    HeadDilations,
    Number,
    OptionalCount,
    OptionalSize,
    PadId,
    PositiveNumber,
    Probability,
    Size,
    choice,
    config,
    per_layer,
)
from models.geometry import LayerAttention
from models.registry import ALL as REGISTRIES
from models.registry import PATTERNS
from models.schedules import schedule
from models.traits import ROTARY_BASE

__all__ = ["ARCHS", "ConfigError", "LayerAttention", "ModelConfig"]

ARCHS = ("encoder", "decoder", "encoder_decoder")
NORM_PLACEMENTS = ("pre", "post")
CLASSIFIERS = ("mean", "first", "token")
SCHEDULES = ("fixed", "increasing", "decreasing")
# autoregressive; nat_gu: Gu et al. (2018)'s Non-Autoregressive Transformer decoder (inputs copied uniformly from the
# source embeddings, positional attention, self-attention without each query's own position; one pass);
# uniform_copy: its inputs alone, on a plain non-causal decoder (what ``nat`` built until 2026-11-28; ``nat`` is
# refused); mask_predict: Ghazvininejad et al. (2019) ([MASK] inputs, a conditional masked LM, nat_iterations passes
# and length_candidates lengths at evaluation)
DECODINGS = ("autoregressive", "nat_gu", "uniform_copy", "mask_predict")
SIZES = (
    "vocab_size",
    "d_model",
    "n_layers",
    "n_heads",
    "max_len",
    "dilation",
    "chunk_elements",
    "nat_iterations",
    "length_candidates",
)
COUNTS = dict.fromkeys(("n_layers", "n_decoder_layers", "n_heads"), MOST_LAYERS)  # (models.fields.Count)
OPTIONAL_SIZES = ("tgt_vocab_size", "n_classes", "n_decoder_layers", "head_dim", "d_ff", "window", "dilated_heads")
# Fields left out of a config's dictionary at these defaults, so that a configuration written before they existed
# keeps its dictionary, hence its cell id (as ``models.training.OMITTED_AT_DEFAULT`` does for training fields).
OMITTED_AT_DEFAULT: dict[str, Any] = {
    "qk_projections": True,
    "global_tokens": None,
    "global_projections": "separate",
    "length_candidates": 1,
}
# Fields left out of a config's dictionary when None or equal to what leaving them out means (``implied``): the
# cross-attention's own score and projections, as the self-attention's unless given.
OMITTED_AT_IMPLIED = ("cross_score", "cross_qk_projections")
# Longformer section 3.1: global attention has projections of its own (Q_g, K_g, V_g, initialised as copies of the
# window's), or, departing from the paper, shares the window's.
GLOBAL_PROJECTIONS = ("separate", "shared")
# The order of the fields' own refusals when a config has several mistakes (the rules between fields come after):
# the choices, the sizes, the counts' bounds, the probabilities, the flags, the other numbers, then the rest.
REFUSAL_ORDER = (
    *("arch", "norm", "norm_type", "positions", "score", "ffn", "classifier", "window_schedule", "dilation_schedule"),
    *("global_projections", "cross_score", "decoding", *SIZES, *OPTIONAL_SIZES),
    *(f"{name}:less_than_equal" for name in COUNTS),
    *("dropout", "attn_dropout", "emb_dropout", "bias", "scale_embeddings", "qk_projections", "tie_embeddings"),
    *("cross_qk_projections", "pad_id", "norm_eps", "rotary_base", "position_init_std"),
)


def _retired(value: Any) -> Any:
    """Names retired because they named another model than they built: refused with the names to choose from."""
    if value == "non_autoregressive":  # what it meant is mask_predict's model, under Gu et al.'s name
        raise ConfigError(
            "decoding='non_autoregressive' named one-pass mask-predict after Gu et al. (2018); say which paper: "
            "decoding='mask_predict' (Ghazvininejad et al. 2019: [MASK] inputs, what it was) or decoding='nat_gu' "
            "(Gu et al. 2018's decoder: decoder inputs copied uniformly from the source embeddings)",
            field="decoding",
            value=value,
            fix="write decoding='mask_predict' or decoding='nat_gu'",
        )
    if value == "nat":  # until 2026-11-28: Gu et al.'s name on their decoder inputs alone
        raise ConfigError(
            "decoding='nat' named Gu et al. (2018)'s Non-Autoregressive Transformer but built only its decoder "
            "inputs (the source embeddings copied uniformly), without their positional attention and without "
            "masking each query's own position; say which: decoding='uniform_copy' (what 'nat' built) or "
            "decoding='nat_gu' (Gu et al.'s decoder as their section 3.1 defines it)",
            field="decoding",
            value=value,
            fix="write decoding='uniform_copy' (what it was) or decoding='nat_gu'",
        )
    return value


# Each field's type: the fixed choices, the registered components, and the types of this config alone.
Arch = choice(ARCHS)
Placement = choice(NORM_PLACEMENTS)
Classifier = choice(CLASSIFIERS)
Schedule = choice(SCHEDULES)
GlobalProjections = choice(GLOBAL_PROJECTIONS)
Decoding = Annotated[Literal[DECODINGS], BeforeValidator(_retired), Refusal(fix=PLUGIN_FIX)]
Score = Component("score")
CrossScore = Component("score", optional=True)
Pattern = Component("pattern")
Positions = Component("positions")
NormType = Component("norm_type")
FeedForward = Component("ffn")
LayerPatterns = Annotated[
    tuple[Pattern, ...] | None,
    AsTuple,
    Refusal(
        "{name}={value!r} must be a list of patterns, one per layer",
        "give a list of patterns, one per layer",
        ("tuple_type",),
        whole=True,
    ),
    Refusal(fix=PLUGIN_FIX),
]
LayerWindows = per_layer(" (one window per layer)")
LayerDilations = per_layer(" (one dilation per layer)")
RotaryBase = Annotated[Number, Gt(1), Refusal("{name}={value!r} must be a number above 1", "give a number above 1")]
InitStd = Annotated[
    Annotated[Number, Ge(0)] | None,
    Refusal("{name}={value!r} must be a non-negative number or null", "give a number >= 0, or remove it"),
]
TieEmbeddings = Annotated[
    bool | None, Refusal("{name}={value!r} must be true, false or null (auto)", "write true, false or null")
]
CrossProjections = Annotated[
    bool | None,
    Refusal("{name}={value!r} must be true, false or null (as qk_projections)", "write true, false or null"),
]


@config(order=REFUSAL_ORDER)
class ModelConfig:
    """A Transformer variant.

    arch: ``encoder`` (classification or tagging), ``decoder`` (causal language model) or
    ``encoder_decoder`` (seq2seq with cross-attention).
    """

    arch: Arch = "decoder"
    vocab_size: Size = 256
    # encoder_decoder: target vocabulary; None (or vocab_size) shares the source vocabulary and its embedding table.
    tgt_vocab_size: OptionalSize = None
    # encoder: number of output classes; classifier pools ``mean`` / ``first`` token, or tags each ``token``.
    n_classes: OptionalSize = None
    classifier: Classifier = "mean"
    d_model: Size = 128
    n_layers: Count = 2  # encoder layers, or decoder layers for arch=decoder
    n_decoder_layers: OptionalCount = None  # encoder_decoder: decoder depth (default n_layers)
    n_heads: Count = 4
    head_dim: OptionalSize = None  # default d_model // n_heads (Vaswani Table 3 rows A/B vary it alone)
    d_ff: OptionalSize = None  # default 4 * d_model
    dropout: Probability = 0.0  # residual dropout (after attention and feed-forward)
    attn_dropout: Probability = 0.0  # on the attention probabilities
    emb_dropout: Probability = 0.0  # on the embeddings (+ positions)
    max_len: Size = 512  # learned position table; NAT: the longest target; sinusoidal/rotary/alibi/none extrapolate
    norm: Placement = "pre"  # placement: pre (adds a final norm) | post (Vaswani et al.)
    norm_type: NormType = "layernorm"
    norm_eps: PositiveNumber = 1e-5
    positions: Positions = "sinusoidal"
    # learned positions: std of the initial table; None = the scale of the token embeddings entering the
    # stack (1 with scale_embeddings, d_model**-0.5 without), so that neither dominates at the start.
    position_init_std: InitStd = None
    rotary_base: RotaryBase = ROTARY_BASE
    score: Score = "dot"
    # False: q and k are the states themselves, split into heads (Luong et al. 2015 scored unprojected states:
    # dot has no parameter, general one matrix, additive is their concat with its own maps); only v is projected.
    qk_projections: bool = True
    # encoder_decoder: the cross-attention's score and q/k projections (None: as score and qk_projections). A target
    # state scored against the source states themselves, cross_qk_projections false, is Luong et al. (2015)'s
    # setting: there their dot, general and concat (additive) differ; the values are then the source states too.
    cross_score: CrossScore = None
    cross_qk_projections: CrossProjections = None
    pattern: Pattern = "full"
    # local/dilated: keys at distance <= window are seen (one-sided: 2 * window + 1 keys, window + 1 when
    # causal; Longformer's w is 2 * window, Mistral's W is window). With a schedule: the mean over layers.
    window: OptionalSize = None
    window_schedule: Schedule = "fixed"  # fixed | increasing | decreasing over the windowed layers
    layer_windows: LayerWindows = None  # one window per layer (overrides window and window_schedule)
    # dilated (Longformer, Beltagy et al. 2020 sections 3.1, 4.2): the largest dilation of the dilated heads
    dilation: Size = 1
    dilated_heads: OptionalSize = None  # heads dilated per dilated layer (the last ones); None: max(1, n_heads // 4)
    dilation_schedule: Schedule = "increasing"  # over the dilated layers: 1 at the bottom up to `dilation` at the top
    layer_dilations: LayerDilations = None  # one dilation per layer for the dilated heads
    # the dilation of every head: one list (every dilated layer) or one list per layer; overrides the above
    head_dilations: HeadDilations = None
    # Longformer's global attention (Beltagy et al. 2020, section 3.1): these positions attend to every key and
    # every query attends to them, in the windowed layers of bidirectional stacks (e.g. [0] for classifier: first).
    global_tokens: GlobalTokens = None
    # separate (the paper): global rows use Q_g, K_g, V_g of their own, copies of the window's at initialisation;
    # shared (a departure from the paper): the window's projections serve global attention too
    global_projections: GlobalProjections = "separate"
    # Optional per-layer patterns of the self-attention, bottom to top (e.g. local below, full above).
    layer_patterns: LayerPatterns = None
    ffn: FeedForward = "relu"
    bias: bool = True
    # None: tie wherever there is a language-model head (decoder, encoder_decoder).
    tie_embeddings: TieEmbeddings = None
    scale_embeddings: bool = True  # multiply token embeddings by sqrt(d_model)
    pad_id: PadId = 0
    # Additive scores hold at most this many elements of (query, key, dimension) intermediates at a time
    # (2^20: 4 MB blocks, within 1% of the fastest on CPU; raise it on GPUs, where larger blocks mean fewer launches).
    chunk_elements: Size = 1 << 20
    # encoder_decoder: autoregressive (left to right), or every target position at once from a predicted length:
    # ``nat_gu`` (Gu et al. 2018's decoder: the source embeddings copied uniformly, positional attention, each query
    # masked from its own position; one pass), ``uniform_copy`` (its copied inputs alone, on a plain non-causal
    # decoder) or ``mask_predict`` (Ghazvininejad et al. 2019: [MASK] inputs, trained as a conditional masked LM;
    # nat_iterations passes and length_candidates lengths at evaluation, which leave the training unchanged).
    decoding: Decoding = "autoregressive"
    nat_iterations: Size = 1
    # mask_predict: the top-l predicted lengths decoded in parallel, the one of highest average log-probability
    # kept (Ghazvininejad et al. section 3.3; their main results use 5). 1: the most probable length alone.
    length_candidates: Size = 1

    @model_validator(mode="after")
    def _check(self) -> ModelConfig:
        """The rules between fields, once each field is of its type (``models.checks``)."""
        checks.check(self)
        return self

    # -- derived values -------------------------------------------------------------------------
    def implied(self) -> dict[str, Any]:
        """What each field left out (None) means here: the one place that says it (the properties below read it;
        a cell's id writes a value equal to it as left out, ``record.spec.run.canonical``)."""
        return {
            "head_dim": self.d_model // self.n_heads if self.d_model % self.n_heads == 0 else None,  # else given
            "d_ff": 4 * self.d_model,
            "n_decoder_layers": self.n_layers,
            "tgt_vocab_size": self.vocab_size,
            "tie_embeddings": self.arch != "encoder",
            "dilated_heads": max(1, self.n_heads // 4),
            # learned positions start at the token embeddings' scale (LearnedPositions.init_std)
            "position_init_std": (1.0 if self.scale_embeddings else self.d_model**-0.5)
            if self.positions == "learned"
            else None,
            # the cross-attention (encoder_decoder only) scores as the self-attention does unless told otherwise
            "cross_score": self.score if self.arch == "encoder_decoder" else None,
            "cross_qk_projections": self.qk_projections if self.arch == "encoder_decoder" else None,
        }

    def _given(self, name: str) -> Any:
        value = getattr(self, name)
        return self.implied()[name] if value is None else value

    @property
    def head_size(self) -> int:
        return self._given("head_dim")

    @property
    def cross_attention_score(self) -> str | None:
        """The score of the encoder_decoder's cross-attention (``cross_score``, else ``score``); None without one."""
        return self._given("cross_score")

    @property
    def cross_attention_projected(self) -> bool | None:
        """Whether the cross-attention's q and k are projections (``cross_qk_projections``, else
        ``qk_projections``); False: the target and source states themselves (Luong et al. 2015); None without one."""
        return self._given("cross_qk_projections")

    @property
    def ff_size(self) -> int:
        return self._given("d_ff")

    @property
    def decoder_layers(self) -> int:
        return self._given("n_decoder_layers")

    @property
    def target_vocab(self) -> int:
        return self._given("tgt_vocab_size")

    @property
    def tied(self) -> bool:
        return self._given("tie_embeddings")

    @property
    def non_autoregressive(self) -> bool:
        """Every target position predicted at once (``nat_gu``, ``uniform_copy`` or ``mask_predict``)."""
        return self.decoding != "autoregressive"

    @property
    def copies_source(self) -> bool:
        """The decoder reads the source embeddings copied uniformly (Gu et al. 2018: ``nat_gu``, ``uniform_copy``)."""
        return self.decoding in ("nat_gu", "uniform_copy")

    @property
    def positional_attention(self) -> bool:
        """Gu et al.'s decoder (``nat_gu``): positional attention in every decoder layer, and a self-attention that
        masks each query's own position."""
        return self.decoding == "nat_gu"

    @property
    def dot_like_score(self) -> bool:
        """Whether the score is ``scale * q.k`` (its traits' ``dot_like``), known without importing it."""
        return REGISTRIES["score"].traits(self.score).dot_like

    @property
    def nested_head_dilations(self) -> bool:
        """Whether head_dilations gives one list per layer (null for a layer that is not dilated)."""
        hd = self.head_dilations
        return hd is not None and any(row is None or isinstance(row, tuple) for row in hd)

    @property
    def n_dilated_heads(self) -> int:
        return self._given("dilated_heads")

    def component_names(self) -> dict[str, set[str]]:
        """The registered components this model is built from, by registry (``models.registry.ALL``'s keys): what a
        plugin's components enter its identity by (``models.plugins.used_by``)."""
        scores = {self.score} | ({self.cross_attention_score} if self.cross_attention_score else set())
        patterns = set(self.patterns_for(self.n_layers))
        return {
            "score": scores,
            "pattern": patterns,
            "positions": {self.positions},
            "norm_type": {self.norm_type},
            "ffn": {self.ffn},
        }

    def patterns_for(self, n_layers: int) -> tuple[str, ...]:
        """The self-attention pattern of each layer of a stack of ``n_layers``."""
        return self.layer_patterns if self.layer_patterns is not None else (self.pattern,) * n_layers

    def attention_layers(self, n_layers: int | None = None, causal: bool = False) -> tuple[LayerAttention, ...]:
        """The self-attention geometry of each layer of a stack of ``n_layers`` (default ``n_layers``); global
        tokens go to the windowed layers of a bidirectional (not ``causal``) stack."""
        n_layers = self.n_layers if n_layers is None else n_layers
        patterns = self.patterns_for(n_layers)
        H = self.n_heads
        windowed = [i for i, p in enumerate(patterns) if PATTERNS.traits(p).windowed]
        dilated = [i for i, p in enumerate(patterns) if PATTERNS.traits(p).dilated]
        windows: dict[int, int] = {}
        if self.layer_windows is not None:
            windows = {i: self.layer_windows[i] for i in windowed}
        elif windowed and self.window is not None:
            windows = dict(zip(windowed, schedule(self.window, len(windowed), self.window_schedule)))
        heads: dict[int, tuple[int, ...]] = {}
        if self.head_dilations is not None:
            nested = self.nested_head_dilations
            heads = {i: self.head_dilations[i] if nested else self.head_dilations for i in dilated}
        elif dilated:
            if self.layer_dilations is not None:
                per_layer = [self.layer_dilations[i] for i in dilated]
            else:
                per_layer = schedule(self.dilation, len(dilated), self.dilation_schedule, start=1)
            n = self.n_dilated_heads
            heads = {i: (1,) * (H - n) + (d,) * n for i, d in zip(dilated, per_layer)}
        globals_ = () if causal or self.global_tokens is None else self.global_tokens
        return tuple(
            LayerAttention(p, windows.get(i), heads.get(i, (1,) * H), globals_ if i in windows else ())
            for i, p in enumerate(patterns)
        )

    # -- (de)serialisation ----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Every field, except those of ``OMITTED_AT_DEFAULT`` left at their defaults and those of
        ``OMITTED_AT_IMPLIED`` left out or equal to what leaving them out means (older cell ids stay)."""
        out = {f.name: shown(getattr(self, f.name)) for f in fields(self)}
        for name, default in OMITTED_AT_DEFAULT.items():
            if out[name] == default:
                del out[name]
        implied = self.implied()
        for name in OMITTED_AT_IMPLIED:  # one spelling: cross_score equal to score is cross_score left out
            if out[name] is None or out[name] == implied[name]:
                del out[name]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ConfigError(
                f"unknown model key(s) {unknown}; valid keys: {sorted(names)}",
                field=unknown[0],
                value=data[unknown[0]],
                fix=f"remove {unknown[0]} or correct its name",
                related=unknown[1:],
            )
        return cls(**data)

    def replace(self, **changes: Any) -> ModelConfig:
        return dataclasses.replace(self, **changes)

    # A short human-readable name, used in logs.
    def describe(self) -> str:
        parts = [
            self.arch,
            f"d{self.d_model}",
            f"L{self.n_layers}",
            f"H{self.n_heads}",
            self.norm,
            self.positions,
            self.score if self.qk_projections else f"{self.score}-states",
        ]
        cross = (self.cross_attention_score, self.cross_attention_projected)
        if self.arch == "encoder_decoder" and cross != (self.score, self.qk_projections):
            parts.append(f"cross{cross[0]}" if cross[1] else f"cross{cross[0]}-states")
        parts.append(self.pattern if self.window is None else f"{self.pattern}{self.window}")
        if self.copies_source:
            parts.append(self.decoding.replace("_", ""))
        elif self.decoding == "mask_predict":
            parts.append(f"maskpredict{self.nat_iterations}")
            if self.length_candidates > 1:
                parts.append(f"lengths{self.length_candidates}")
        return "-".join(parts)
