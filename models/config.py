"""ModelConfig: one serialisable description of a Transformer variant.

Strings name components; each kind resolves through its registry in ``models.registry`` (``SCORES``,
``PATTERNS``, ``POSITIONS``, ``NORMS``, ``FEED_FORWARDS``), which is also where the valid choices come from,
so adding a variant is one class and one registry line. Every field is checked when the config is built,
and impossible combinations are refused with a message that names the field, the value and what to do
instead. A component may add its own checks with a ``check(cfg)`` class method.

The geometry of each self-attention layer (pattern, window, the dilation of every head) is resolved here,
in ``attention_layers``, from the schedules; docs/components.md explains every key.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from typing import Any, NamedTuple

from models import spelling
from models.errors import ConfigError, not_a_choice
from models.geometry import LayerAttention
from models.registry import ALL as REGISTRIES
from models.registry import PATTERNS
from models.schedules import schedule
from models.traits import ROTARY_BASE

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
COUNTS = {"n_layers": 256, "n_decoder_layers": 256, "n_heads": 256}  # twice the largest models' (PaLM: 118 layers)
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


def _name(field: str, at: int | None) -> str:
    """How the message names a field, or one entry of it (``layer_windows[2]``)."""
    return field if at is None else f"{field}[{at}]"


def _choice(field: str, value: Any, choices, at: int | None = None, component: str | None = None) -> None:
    """``component``: the kind of registered component the field names: the refusal then says how to load one's own
    (a plugin) and which plugins failed to import."""
    if not isinstance(value, str) or value not in choices:
        valid = ", ".join(repr(c) for c in choices)
        message = not_a_choice(_name(field, at), value, choices)
        if component is not None:
            from models.plugins import unknown_hint

            message += f"; {unknown_hint(component)}"
        raise ConfigError(message, field=field, value=value, fix=f"use one of {valid}, or load the plugin that has it")


def _positive_int(field: str, value: Any, allow_none: bool = False, at: int | None = None) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        fix = "give a positive integer" + (" or remove it" if allow_none else "")
        raise ConfigError(f"{_name(field, at)}={value!r} must be a positive integer", field=field, value=value, fix=fix)


def _probability(field: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
        raise ConfigError(
            f"{field}={value!r} must be a number in [0, 1)", field=field, value=value, fix="give a number in [0, 1)"
        )


def _ints(field: str, value: Any, length: int | None = None, what: str = "", at: int | None = None) -> None:
    """A list of ``length`` positive integers (one per head: ``related`` n_heads)."""
    name = _name(field, at)
    if not isinstance(value, tuple) or not all(
        not isinstance(v, bool) and isinstance(v, int) and v >= 1 for v in value
    ):
        raise ConfigError(
            f"{name}={_show(value)} must be a list of positive integers{what}",
            field=field,
            value=_show(value),
            fix="give a list of positive integers",
        )
    if length is not None and len(value) != length:
        raise ConfigError(
            f"{name} has {len(value)} entries but needs {length}{what}",
            field=field,
            value=_show(value),
            fix=f"give {length} entries",
            related=("n_heads",),
        )


def _per_layer(field: str, value: Any, applies: list[bool], what: str, check) -> None:
    """A list with one entry per layer: ``check(entry, index)`` where the entry applies, null elsewhere (an
    entry a layer ignores would make two spellings of one model)."""
    if not isinstance(value, tuple):
        raise ConfigError(
            f"{field}={_show(value)} must be a list with one entry per layer{what}",
            field=field,
            value=_show(value),
            fix="give a list with one entry per layer",
        )
    if len(value) != len(applies):
        raise ConfigError(
            f"{field} has {len(value)} entries but needs {len(applies)}{what}",
            field=field,
            value=_show(value),
            fix=f"give {len(applies)} entries, one per layer",
            related=("n_layers", "layer_patterns"),
        )
    for i, (entry, used) in enumerate(zip(value, applies)):
        if used:
            check(entry, i)
        elif entry is not None:
            raise ConfigError(
                f"{field}[{i}]={_show(entry)} is given for layer {i}, whose pattern does not use it: write null there "
                "(a value a layer ignores would spell one model two ways)",
                field=field,
                value=_show(entry),
                fix=f"write null at {field}[{i}]",
                related=("layer_patterns",),
            )


def _show(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_show(v) for v in value]
    return value


def _tuple(value: Any) -> Any:
    """Lists (from YAML or JSON) to tuples, nested lists too, so that the config stays hashable."""
    if isinstance(value, (list, tuple)):
        return tuple(_tuple(v) for v in value)
    return value


class _PatternUse(NamedTuple):
    """What the config's patterns are, for the checks of the keys they read (windows, dilations)."""

    windowed: bool  # some layer is windowed: it needs a window
    dilated: bool  # some layer is dilated: it takes dilations
    layer_kinds: list  # each layer's pattern traits, bottom to top
    windowed_names: str  # the patterns a window needs: "'local' or 'dilated'"
    dilated_names: str
    got: str  # the patterns as given, for the messages: "got pattern='full'"

    @classmethod
    def of(cls, cfg: ModelConfig, registry) -> _PatternUse:
        traits, names = registry.traits, registry.names()
        patterns = cfg.layer_patterns if cfg.layer_patterns is not None else (cfg.pattern,)
        return cls(
            windowed=any(traits(p).windowed for p in patterns),
            dilated=any(traits(p).dilated for p in patterns),
            layer_kinds=[traits(p) for p in cfg.patterns_for(cfg.n_layers)],
            windowed_names=" or ".join(repr(n) for n in names if traits(n).windowed),
            dilated_names=" or ".join(repr(n) for n in names if traits(n).dilated),
            got=f"got pattern={cfg.pattern!r}"
            if cfg.layer_patterns is None
            else f"got layer_patterns={list(patterns)}",
        )


@dataclass(frozen=True)
class ModelConfig:
    """A Transformer variant.

    arch: ``encoder`` (classification or tagging), ``decoder`` (causal language model) or
    ``encoder_decoder`` (seq2seq with cross-attention).
    """

    arch: str = "decoder"
    vocab_size: int = 256
    # encoder_decoder: target vocabulary; None (or vocab_size) shares the source vocabulary and its embedding table.
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
    max_len: int = 512  # learned position table; NAT: the longest target; sinusoidal/rotary/alibi/none extrapolate
    norm: str = "pre"  # placement: pre (adds a final norm) | post (Vaswani et al.)
    norm_type: str = "layernorm"
    norm_eps: float = 1e-5
    positions: str = "sinusoidal"
    # learned positions: std of the initial table; None = the scale of the token embeddings entering the
    # stack (1 with scale_embeddings, d_model**-0.5 without), so that neither dominates at the start.
    position_init_std: float | None = None
    rotary_base: float = ROTARY_BASE
    score: str = "dot"
    # False: q and k are the states themselves, split into heads (Luong et al. 2015 scored unprojected states:
    # dot has no parameter, general one matrix, additive is their concat with its own maps); only v is projected.
    qk_projections: bool = True
    # encoder_decoder: the cross-attention's score and q/k projections (None: as score and qk_projections). A target
    # state scored against the source states themselves, cross_qk_projections false, is Luong et al. (2015)'s
    # setting: there their dot, general and concat (additive) differ; the values are then the source states too.
    cross_score: str | None = None
    cross_qk_projections: bool | None = None
    pattern: str = "full"
    # local/dilated: keys at distance <= window are seen (one-sided: 2 * window + 1 keys, window + 1 when
    # causal; Longformer's w is 2 * window, Mistral's W is window). With a schedule: the mean over layers.
    window: int | None = None
    window_schedule: str = "fixed"  # fixed | increasing | decreasing over the windowed layers
    layer_windows: tuple[int, ...] | None = None  # one window per layer (overrides window and window_schedule)
    # dilated (Longformer, Beltagy et al. 2020 sections 3.1, 4.2): the largest dilation of the dilated heads
    dilation: int = 1
    dilated_heads: int | None = None  # heads dilated per dilated layer (the last ones); None: max(1, n_heads // 4)
    dilation_schedule: str = "increasing"  # over the dilated layers: 1 at the bottom up to `dilation` at the top
    layer_dilations: tuple[int, ...] | None = None  # one dilation per layer for the dilated heads
    # the dilation of every head: one list (every dilated layer) or one list per layer; overrides the above
    head_dilations: tuple | None = None
    # Longformer's global attention (Beltagy et al. 2020, section 3.1): these positions attend to every key and
    # every query attends to them, in the windowed layers of bidirectional stacks (e.g. [0] for classifier: first).
    global_tokens: tuple[int, ...] | None = None
    # separate (the paper): global rows use Q_g, K_g, V_g of their own, copies of the window's at initialisation;
    # shared (a departure from the paper): the window's projections serve global attention too
    global_projections: str = "separate"
    # Optional per-layer patterns of the self-attention, bottom to top (e.g. local below, full above).
    layer_patterns: tuple[str, ...] | None = None
    ffn: str = "relu"
    bias: bool = True
    # None: tie wherever there is a language-model head (decoder, encoder_decoder).
    tie_embeddings: bool | None = None
    scale_embeddings: bool = True  # multiply token embeddings by sqrt(d_model)
    pad_id: int = 0
    # Additive scores hold at most this many elements of (query, key, dimension) intermediates at a time
    # (2^20: 4 MB blocks, within 1% of the fastest on CPU; raise it on GPUs, where larger blocks mean fewer launches).
    chunk_elements: int = 1 << 20
    # encoder_decoder: autoregressive (left to right), or every target position at once from a predicted length:
    # ``nat_gu`` (Gu et al. 2018's decoder: the source embeddings copied uniformly, positional attention, each query
    # masked from its own position; one pass), ``uniform_copy`` (its copied inputs alone, on a plain non-causal
    # decoder) or ``mask_predict`` (Ghazvininejad et al. 2019: [MASK] inputs, trained as a conditional masked LM;
    # nat_iterations passes and length_candidates lengths at evaluation, which leave the training unchanged).
    decoding: str = "autoregressive"
    nat_iterations: int = 1
    # mask_predict: the top-l predicted lengths decoded in parallel, the one of highest average log-probability
    # kept (Ghazvininejad et al. section 3.3; their main results use 5). 1: the most probable length alone.
    length_candidates: int = 1

    def __post_init__(self) -> None:
        for name in ("layer_patterns", "layer_windows", "layer_dilations", "head_dilations", "global_tokens"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, _tuple(value))
        self._validate()

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
        out = {f.name: _show(getattr(self, f.name)) for f in fields(self)}
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

    # -- validation -----------------------------------------------------------------------------
    # One check per concern, in the order the messages come when a config has several mistakes: each field's own
    # type and range first, then the combinations, then each chosen component's own check (it may read any field).
    def _validate(self) -> None:
        self._validate_choices()
        self._validate_numbers()
        self._validate_flags()
        self._validate_scalars()
        self._validate_heads()
        self._validate_arch()
        self._validate_cross()
        self._validate_decoding()
        self._validate_patterns(REGISTRIES["pattern"])
        spelling.check(self)  # one spelling per model: a simpler spelling of the same attention is asked for
        self._validate_global_tokens(REGISTRIES["pattern"])
        self._validate_components()
        self._validate_read()

    def _validate_read(self) -> None:
        """A size no part of this model reads is refused unless left at its default (two spellings of one model):
        the additive score's block size, and the table and length head of ``max_len``."""
        scores = {self.score, getattr(self, "cross_score", None) or self.score}
        chunked = any(getattr(REGISTRIES["score"].traits(s), "chunked", False) for s in scores)
        defaults = {f.name: f.default for f in fields(self)}
        if self.chunk_elements != defaults["chunk_elements"] and not chunked:
            raise ConfigError(
                f"chunk_elements={self.chunk_elements} bounds the blocks of additive scores; score={self.score!r} "
                "computes none (remove chunk_elements)",
                field="chunk_elements",
                value=self.chunk_elements,
                fix="remove chunk_elements",
                related=("score",),
            )
        takes = getattr(REGISTRIES["positions"].traits(self.positions), "takes_max_len", False)  # (a plugin's: no)
        if self.max_len != defaults["max_len"] and not takes and not self.non_autoregressive:
            raise ConfigError(
                f"max_len={self.max_len} sizes a learned position table or a non-autoregressive length head; "
                f"positions={self.positions!r} with decoding={self.decoding!r} has neither and reads positions at "
                "any length (remove max_len)",
                field="max_len",
                value=self.max_len,
                fix="remove max_len, or use positions='learned'",
                related=("positions", "decoding"),
            )

    def _validate_choices(self) -> None:
        """Every field that names a choice: the fixed ones and those a registry holds."""
        _choice("arch", self.arch, ARCHS)
        _choice("norm", self.norm, NORM_PLACEMENTS)
        for name in ("norm_type", "positions", "score", "ffn"):
            _choice(name, getattr(self, name), REGISTRIES[name].names(), component=REGISTRIES[name].kind)
        _choice("classifier", self.classifier, CLASSIFIERS)
        _choice("window_schedule", self.window_schedule, SCHEDULES)
        _choice("dilation_schedule", self.dilation_schedule, SCHEDULES)
        _choice("global_projections", self.global_projections, GLOBAL_PROJECTIONS)
        if self.cross_score is not None:  # None: the cross-attention scores as ``score``
            _choice("cross_score", self.cross_score, REGISTRIES["score"].names(), component="score")
        self._validate_decoding_name()

    def _validate_numbers(self) -> None:
        """Sizes and probabilities, each on its own."""
        for name in SIZES:
            _positive_int(name, getattr(self, name))
        for name in OPTIONAL_SIZES:
            _positive_int(name, getattr(self, name), allow_none=True)
        for name, most in COUNTS.items():  # checks walk every layer and head: n_layers=10**8 would hang them
            value = getattr(self, name)
            if value is not None and value > most:
                raise ConfigError(
                    f"{name}={value} is more than a model here can have (at most {most:,})",
                    field=name,
                    value=value,
                    fix=f"give at most {most:,}",
                )
        for name in ("dropout", "attn_dropout", "emb_dropout"):
            _probability(name, getattr(self, name))

    def _validate_flags(self) -> None:
        for name in ("bias", "scale_embeddings", "qk_projections"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(
                    f"{name}={getattr(self, name)!r} must be true or false",
                    field=name,
                    value=getattr(self, name),
                    fix="write true or false",
                )
        if self.tie_embeddings is not None and not isinstance(self.tie_embeddings, bool):
            raise ConfigError(
                f"tie_embeddings={self.tie_embeddings!r} must be true, false or null (auto)",
                field="tie_embeddings",
                value=self.tie_embeddings,
                fix="write true, false or null",
            )
        if self.cross_qk_projections is not None and not isinstance(self.cross_qk_projections, bool):
            raise ConfigError(
                f"cross_qk_projections={self.cross_qk_projections!r} must be true, false or null (as qk_projections)",
                field="cross_qk_projections",
                value=self.cross_qk_projections,
                fix="write true, false or null",
            )

    def _validate_scalars(self) -> None:
        """pad_id (a token of the vocabulary), and the numbers of the norms and the position schemes."""
        if isinstance(self.pad_id, bool) or not isinstance(self.pad_id, int) or self.pad_id < 0:
            raise ConfigError(
                f"pad_id={self.pad_id!r} must be a non-negative integer",
                field="pad_id",
                value=self.pad_id,
                fix="give an integer >= 0",
            )
        if self.pad_id >= self.vocab_size:
            raise ConfigError(
                f"pad_id={self.pad_id} must be below vocab_size={self.vocab_size}",
                field="pad_id",
                value=self.pad_id,
                fix=f"give a pad_id below {self.vocab_size}, or raise vocab_size",
                related=("vocab_size",),
            )
        if not isinstance(self.norm_eps, (int, float)) or self.norm_eps <= 0:
            raise ConfigError(
                f"norm_eps={self.norm_eps!r} must be a positive number",
                field="norm_eps",
                value=self.norm_eps,
                fix="give a number above 0",
            )
        if not isinstance(self.rotary_base, (int, float)) or self.rotary_base <= 1:
            raise ConfigError(
                f"rotary_base={self.rotary_base!r} must be a number above 1",
                field="rotary_base",
                value=self.rotary_base,
                fix="give a number above 1",
            )
        std = self.position_init_std
        if std is not None and (isinstance(std, bool) or not isinstance(std, (int, float)) or std < 0):
            raise ConfigError(
                f"position_init_std={std!r} must be a non-negative number or null",
                field="position_init_std",
                value=std,
                fix="give a number >= 0, or remove it",
            )

    def _validate_heads(self) -> None:
        """The heads' width: d_model split evenly, unless head_dim is given (and q, k unprojected need the split)."""
        if self.head_dim is None and self.d_model % self.n_heads != 0:
            raise ConfigError(
                f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}; "
                "choose a divisible pair or set head_dim explicitly",
                field="d_model",
                value=self.d_model,
                fix="choose d_model and n_heads with n_heads dividing d_model, or set head_dim",
                related=("n_heads",),
            )
        if not self.qk_projections and self.head_size * self.n_heads != self.d_model:
            raise ConfigError(
                f"qk_projections=false splits each state into n_heads={self.n_heads} slices of head_dim="
                f"{self.head_size}, which must cover d_model={self.d_model}; remove head_dim or set it to "
                "d_model / n_heads",
                field="head_dim",
                value=self.head_dim,
                fix="remove head_dim, or set it to d_model / n_heads",
                related=("qk_projections", "n_heads", "d_model"),
            )

    def _only_for(self, arch: str, name: str) -> ConfigError:
        """A key another arch reads: refused, since it would change nothing (two spellings of one model)."""
        return ConfigError(
            f"{name} is only for arch={arch!r} (got arch={self.arch!r}); remove it",
            field=name,
            value=getattr(self, name),
            fix=f"remove {name}",
            related=("arch",),
        )

    def _validate_arch(self) -> None:
        """The keys of one arch: the encoder's classifier head, the encoder_decoder's second stack and vocabulary."""
        if self.arch == "encoder":
            if self.n_classes is None:
                raise ConfigError(
                    "arch='encoder' needs n_classes (the size of the classification or tagging head)",
                    field="n_classes",
                    value=None,
                    fix="set n_classes",
                    related=("arch",),
                )
            if self.tie_embeddings:
                raise ConfigError(
                    "tie_embeddings=true needs a language-model head; arch='encoder' has a classifier "
                    "(set tie_embeddings to false or null)",
                    field="tie_embeddings",
                    value=True,
                    fix="set tie_embeddings to false or null",
                    related=("arch",),
                )
        else:
            if self.n_classes is not None:
                raise self._only_for("encoder", "n_classes")
            if self.classifier != "mean":
                raise self._only_for("encoder", "classifier")
        if self.arch != "encoder_decoder":
            for name in ("tgt_vocab_size", "n_decoder_layers"):
                if getattr(self, name) is not None:
                    raise self._only_for("encoder_decoder", name)
        if self.arch == "encoder_decoder" and self.tgt_vocab_size is not None and self.pad_id >= self.tgt_vocab_size:
            raise ConfigError(
                f"pad_id={self.pad_id} must be below tgt_vocab_size={self.tgt_vocab_size}",
                field="pad_id",
                value=self.pad_id,
                fix=f"give a pad_id below {self.tgt_vocab_size}, or raise tgt_vocab_size",
                related=("tgt_vocab_size",),
            )

    def _validate_cross(self) -> None:
        """The cross-attention's own keys: read by an encoder_decoder only (elsewhere they would change nothing);
        over the states themselves, the heads' slices must tile d_model."""
        if self.arch != "encoder_decoder":
            for name in ("cross_score", "cross_qk_projections"):
                if getattr(self, name) is not None:
                    raise ConfigError(
                        f"{name} sets the cross-attention of arch='encoder_decoder'; arch={self.arch!r} has none, "
                        "so it would change nothing: remove it (the self-attention's keys are score and qk_projections)",
                        field=name,
                        value=getattr(self, name),
                        fix=f"remove {name}, or use arch='encoder_decoder'",
                        related=("arch",),
                    )
            return
        if self.qk_projections and not self.cross_attention_projected and self.head_size * self.n_heads != self.d_model:
            raise ConfigError(
                f"cross_qk_projections=false scores target states against source states themselves, each of the "
                f"n_heads={self.n_heads} heads over its slice of head_dim={self.head_size}, which must cover "
                f"d_model={self.d_model}; remove head_dim or set it to d_model / n_heads (Luong et al.'s single "
                "attention: n_heads 1)",
                field="head_dim",
                value=self.head_dim,
                fix="remove head_dim, or set it to d_model / n_heads",
                related=("cross_qk_projections", "n_heads", "d_model"),
            )

    def _validate_components(self) -> None:
        """Each chosen component's own checks (e.g. rotary needs a dot-product score), patterns included."""
        for name in ("positions", "score", "norm_type", "ffn"):
            check = getattr(REGISTRIES[name].traits(getattr(self, name)), "check", None)
            if check is not None:
                check(self)
        for p in sorted(set(self.patterns_for(self.n_layers))):
            check = getattr(REGISTRIES["pattern"].traits(p), "check", None)
            if check is not None:
                check(self)

    def _validate_decoding_name(self) -> None:
        """Names retired because they named another model than they built: refused with the names to choose from."""
        if self.decoding == "non_autoregressive":  # what it meant is mask_predict's model, under Gu et al.'s name
            raise ConfigError(
                "decoding='non_autoregressive' named one-pass mask-predict after Gu et al. (2018); say which paper: "
                "decoding='mask_predict' (Ghazvininejad et al. 2019: [MASK] inputs, what it was) or decoding='nat_gu' "
                "(Gu et al. 2018's decoder: decoder inputs copied uniformly from the source embeddings)",
                field="decoding",
                value=self.decoding,
                fix="write decoding='mask_predict' or decoding='nat_gu'",
            )
        if self.decoding == "nat":  # until 2026-11-28: Gu et al.'s name on their decoder inputs alone
            raise ConfigError(
                "decoding='nat' named Gu et al. (2018)'s Non-Autoregressive Transformer but built only its decoder "
                "inputs (the source embeddings copied uniformly), without their positional attention and without "
                "masking each query's own position; say which: decoding='uniform_copy' (what 'nat' built) or "
                "decoding='nat_gu' (Gu et al.'s decoder as their section 3.1 defines it)",
                field="decoding",
                value=self.decoding,
                fix="write decoding='uniform_copy' (what it was) or decoding='nat_gu'",
            )
        _choice("decoding", self.decoding, DECODINGS)

    def _validate_decoding(self) -> None:
        if self.non_autoregressive and self.arch != "encoder_decoder":
            raise ConfigError(
                f"decoding={self.decoding!r} predicts a target from a source and needs arch='encoder_decoder' "
                f"(got arch={self.arch!r}); use decoding='autoregressive'",
                field="decoding",
                value=self.decoding,
                fix="use decoding='autoregressive', or arch='encoder_decoder'",
                related=("arch",),
            )
        if self.nat_iterations > 1 and self.decoding != "mask_predict":
            raise ConfigError(
                f"nat_iterations={self.nat_iterations} is the number of mask-predict passes at evaluation "
                f"(Ghazvininejad et al. 2019); it needs decoding='mask_predict' (got decoding={self.decoding!r}"
                + (": Gu et al.'s decoder decodes in one pass)" if self.copies_source else ")"),
                field="nat_iterations",
                value=self.nat_iterations,
                fix="remove nat_iterations, or use decoding='mask_predict'",
                related=("decoding",),
            )
        self._validate_length_candidates()
        if self.positional_attention and not getattr(REGISTRIES["positions"].traits(self.positions), "absolute", False):
            raise ConfigError(
                "decoding='nat_gu' gives every decoder layer Gu et al.'s positional attention, whose queries and keys "
                f"are the positional encodings the decoder adds to its inputs; positions={self.positions!r} adds none "
                "(rotary and alibi act inside attention, none has no positions): use positions 'sinusoidal' or "
                "'learned', or decoding='uniform_copy' (Gu et al.'s inputs without positional attention)",
                field="decoding",
                value=self.decoding,
                fix="use positions='sinusoidal' or 'learned', or decoding='uniform_copy'",
                related=("positions",),
            )

    def _validate_length_candidates(self) -> None:
        """Mask-predict's length beam (Ghazvininejad et al. section 3.3): refused where it would change nothing or
        where the paper of the decoding does not decode several lengths."""
        n = self.length_candidates
        if n > 1 and self.decoding != "mask_predict":
            why = {
                "autoregressive": "an autoregressive decoder ends its output with its own end of sequence; its search "
                "is training.beam_size",
            }.get(
                self.decoding,
                "Gu et al. decode one length: their noisy parallel decoding samples fertilities and rescores the "
                "candidates with an autoregressive teacher, neither of which is built",
            )
            raise ConfigError(
                f"length_candidates={n} decodes the {n} most probable target lengths and keeps the output of highest "
                "average log-probability, mask-predict's length beam (Ghazvininejad et al. 2019, section 3.3); it "
                f"needs decoding='mask_predict' (got decoding={self.decoding!r}: {why})",
                field="length_candidates",
                value=n,
                fix="remove length_candidates, or use decoding='mask_predict'",
                related=("decoding",),
            )
        if n > self.max_len + 1:
            raise ConfigError(
                f"length_candidates={n} is more than the {self.max_len + 1} target lengths the length predictor knows "
                f"(0 .. max_len={self.max_len})",
                field="length_candidates",
                value=n,
                fix=f"give length_candidates <= {self.max_len + 1}, or raise max_len",
                related=("max_len",),
            )

    def _validate_patterns(self, registry) -> None:
        """The self-attention geometry: the patterns, then the windows and the dilations they take (each refused
        where no layer reads it), then Longformer's undilated bottom layer."""
        self._validate_layer_patterns(registry)
        use = _PatternUse.of(self, registry)
        self._validate_layer_windows(use)
        self._validate_window(use)
        self._validate_window_schedule(use)
        self._validate_dilation_keys(use)
        self._validate_dilation(use)
        dilated_layers = [t.dilated for t in use.layer_kinds]
        self._validate_head_dilations(dilated_layers)
        self._validate_layer_dilations(dilated_layers)
        self._validate_explicit_dilations()
        if use.dilated:
            self._validate_bottom_layer()

    def _validate_layer_patterns(self, registry) -> None:
        if self.layer_patterns is None:
            _choice("pattern", self.pattern, registry.names(), component="pattern")
            return
        for i, p in enumerate(self.layer_patterns):
            _choice("layer_patterns", p, registry.names(), at=i, component="pattern")
        if self.pattern != "full":  # the default: what layer_patterns replaces
            raise ConfigError(
                f"pattern={self.pattern!r} is not read when layer_patterns gives each layer's pattern: remove it",
                field="pattern",
                value=self.pattern,
                fix="remove pattern",
                related=("layer_patterns",),
            )
        if self.arch == "encoder_decoder" and self.decoder_layers != self.n_layers:
            raise ConfigError(
                f"layer_patterns applies to both stacks of arch='encoder_decoder', which then need the same "
                f"depth (n_layers={self.n_layers}, n_decoder_layers={self.decoder_layers})",
                field="layer_patterns",
                value=_show(self.layer_patterns),
                fix="give both stacks the same depth, or use pattern",
                related=("n_decoder_layers", "n_layers"),
            )
        if len(self.layer_patterns) != self.n_layers:
            raise ConfigError(
                f"layer_patterns has {len(self.layer_patterns)} entries but the stack has {self.n_layers} "
                "layers; give one pattern per layer",
                field="layer_patterns",
                value=_show(self.layer_patterns),
                fix=f"give {self.n_layers} patterns, one per layer",
                related=("n_layers",),
            )

    def _validate_layer_windows(self, use: _PatternUse) -> None:
        """layer_windows where some layer is windowed (without one, ``_validate_window`` refuses it)."""
        if self.layer_windows is None or not use.windowed:
            return
        _per_layer(
            "layer_windows",
            self.layer_windows,
            [t.windowed for t in use.layer_kinds],
            " (one window per layer)",
            lambda w, i: _positive_int("layer_windows", w, at=i),
        )
        if self.arch == "encoder_decoder" and self.decoder_layers != self.n_layers:
            raise ConfigError(
                "layer_windows applies to both stacks of arch='encoder_decoder', which then need the same depth "
                f"(n_layers={self.n_layers}, n_decoder_layers={self.decoder_layers})",
                field="layer_windows",
                value=_show(self.layer_windows),
                fix="give both stacks the same depth, or use window",
                related=("n_decoder_layers", "n_layers"),
            )
        if self.window is not None:
            raise ConfigError(
                "give either window (with window_schedule) or layer_windows, not both; remove one of them",
                field="window",
                value=self.window,
                fix="remove window or layer_windows",
                related=("layer_windows",),
            )

    def _validate_window(self, use: _PatternUse) -> None:
        """A windowed pattern needs a window; a window needs a windowed pattern."""
        needs, got = use.windowed_names, use.got
        if use.windowed and self.window is None and self.layer_windows is None:
            raise ConfigError(
                f"pattern {needs} needs window (keys at distance <= window are seen)",
                field="window",
                value=None,
                fix="set window",
                related=("pattern", "layer_patterns"),
            )
        if not use.windowed and self.window is not None:
            raise ConfigError(
                f"window={self.window} requires pattern {needs} ({got}); remove window or change the pattern",
                field="window",
                value=self.window,
                fix=f"remove window, or use pattern {needs}",
                related=("pattern", "layer_patterns"),
            )
        if not use.windowed and self.layer_windows is not None:
            raise ConfigError(
                f"layer_windows requires pattern {needs} ({got}); remove layer_windows",
                field="layer_windows",
                value=_show(self.layer_windows),
                fix="remove layer_windows",
                related=("pattern", "layer_patterns"),
            )

    def _validate_window_schedule(self, use: _PatternUse) -> None:
        """A schedule spreads ``window`` over windowed layers: without them, or beside layer_windows, it is unread."""
        if not use.windowed and self.window_schedule != "fixed":
            raise ConfigError(
                f"window_schedule={self.window_schedule!r} requires pattern {use.windowed_names} ({use.got})",
                field="window_schedule",
                value=self.window_schedule,
                fix=f"remove window_schedule, or use pattern {use.windowed_names}",
                related=("pattern", "layer_patterns"),
            )
        if self.window_schedule != "fixed" and self.layer_windows is not None:
            raise ConfigError(
                "window_schedule does not apply with layer_windows (each layer's window is given)",
                field="window_schedule",
                value=self.window_schedule,
                fix="remove window_schedule",
                related=("layer_windows",),
            )

    def _validate_dilation_keys(self, use: _PatternUse) -> None:
        """Each dilation key needs a dilated layer to read it; a schedule needs ``dilation`` to spread."""
        explicit = self.head_dilations is not None or self.layer_dilations is not None
        needs, got = use.dilated_names, use.got
        if self.dilation > 1 and not use.dilated:
            raise ConfigError(
                f"dilation requires pattern {needs} ({got}, dilation={self.dilation})",
                field="dilation",
                value=self.dilation,
                fix=f"remove dilation, or use pattern {needs}",
                related=("pattern", "layer_patterns"),
            )
        for name in ("dilated_heads", "layer_dilations", "head_dilations"):
            if getattr(self, name) is not None and not use.dilated:
                raise ConfigError(
                    f"{name} requires pattern {needs} ({got}); remove {name}",
                    field=name,
                    value=_show(getattr(self, name)),
                    fix=f"remove {name}",
                    related=("pattern", "layer_patterns"),
                )
        if self.dilation_schedule != "increasing" and (not use.dilated or explicit):
            given = "head_dilations or layer_dilations give the dilations" if explicit else f"{got}"
            raise ConfigError(
                f"dilation_schedule={self.dilation_schedule!r} spreads dilation over the layers of pattern "
                f"{needs} ({given}); remove it",
                field="dilation_schedule",
                value=self.dilation_schedule,
                fix="remove dilation_schedule",
                related=("head_dilations", "layer_dilations") if explicit else ("pattern", "layer_patterns"),
            )

    def _validate_dilation(self, use: _PatternUse) -> None:
        """``dilation`` and ``dilated_heads``, where they give the dilations: a dilation, on at most every head."""
        explicit = self.head_dilations is not None or self.layer_dilations is not None
        if use.dilated and not explicit and self.dilation < 2:
            raise ConfigError(
                f"pattern {use.dilated_names} needs dilation >= 2 (dilation 1 is pattern 'local')",
                field="dilation",
                value=self.dilation,
                fix="set dilation >= 2, or use pattern 'local'",
                related=("pattern", "layer_patterns"),
            )
        if self.dilated_heads is not None and self.dilated_heads > self.n_heads:
            raise ConfigError(
                f"dilated_heads={self.dilated_heads} must be at most n_heads={self.n_heads}",
                field="dilated_heads",
                value=self.dilated_heads,
                fix=f"give dilated_heads <= {self.n_heads}",
                related=("n_heads",),
            )

    def _validate_head_dilations(self, dilated_layers: list[bool]) -> None:
        """head_dilations gives every head's dilation: alone, one list for all layers or one per layer."""
        if self.head_dilations is None:
            return
        given = [n for n in ("dilated_heads", "layer_dilations") if getattr(self, n) is not None]
        given += ["dilation"] if self.dilation > 1 else []
        if given:
            raise ConfigError(
                f"head_dilations gives every head's dilation; remove {given[0]}",
                field=given[0],
                value=_show(getattr(self, given[0])),
                fix=f"remove {given[0]}",
                related=("head_dilations",),
            )
        hd, H = self.head_dilations, self.n_heads
        if not self.nested_head_dilations:
            _ints("head_dilations", hd, H, " (one dilation per head)")
            return
        if len(hd) != self.n_layers or (self.arch == "encoder_decoder" and self.decoder_layers != self.n_layers):
            raise ConfigError(
                f"head_dilations has {len(hd)} lists but the stack has {self.n_layers} layers (and both stacks "
                "of an encoder_decoder need that depth); give one list per layer or one list for all",
                field="head_dilations",
                value=_show(hd),
                fix=f"give {self.n_layers} lists, one per layer, or one list for all",
                related=("n_layers", "n_decoder_layers"),
            )
        each_head = lambda row, i: _ints("head_dilations", row, H, " (one dilation per head)", at=i)  # noqa: E731
        _per_layer("head_dilations", hd, dilated_layers, "", each_head)

    def _validate_layer_dilations(self, dilated_layers: list[bool]) -> None:
        """layer_dilations gives each dilated layer's dilation, in place of ``dilation``."""
        if self.layer_dilations is None:
            return
        _per_layer(
            "layer_dilations",
            self.layer_dilations,
            dilated_layers,
            " (one dilation per layer)",
            lambda d, i: _positive_int("layer_dilations", d, at=i),
        )
        if self.dilation > 1:
            raise ConfigError(
                "layer_dilations gives each layer's dilation; remove dilation",
                field="dilation",
                value=self.dilation,
                fix="remove dilation",
                related=("layer_dilations",),
            )
        if self.arch == "encoder_decoder" and self.decoder_layers != self.n_layers:
            raise ConfigError(
                "layer_dilations applies to both stacks of arch='encoder_decoder', which need the same depth",
                field="layer_dilations",
                value=_show(self.layer_dilations),
                fix="give both stacks the same depth, or use dilation",
                related=("n_decoder_layers", "n_layers"),
            )

    def _validate_explicit_dilations(self) -> None:
        """Dilations given per head or per layer that are all 1 are pattern 'local' (one spelling per model)."""
        if self.head_dilations is None and self.layer_dilations is None:
            return
        name = "head_dilations" if self.head_dilations is not None else "layer_dilations"
        rows = [row for row in getattr(self, name) if row is not None]
        if all(d == 1 for row in rows for d in (row if isinstance(row, tuple) else (row,))):
            raise ConfigError(
                f"every dilation of {name} is 1, which is pattern 'local': use pattern 'local', or give a "
                "dilation >= 2",
                field=name,
                value=_show(getattr(self, name)),
                fix="use pattern 'local', or give a dilation >= 2",
                related=("pattern", "layer_patterns"),
            )

    def _dilations_spelt_by(self) -> str:
        """The key that gives the dilated heads' dilations, the most specific first."""
        for name in ("head_dilations", "layer_dilations", "dilated_heads"):
            if getattr(self, name) is not None:
                return name
        return "dilation"

    def _validate_bottom_layer(self) -> None:
        """Longformer keeps the lower layers undilated: with every head of the bottom layer dilated, token t would
        not see t - 1 after one layer (and a stack dilated everywhere would never see it)."""
        stacks = {self.n_layers} | ({self.decoder_layers} if self.arch == "encoder_decoder" else set())
        if all(min(self.attention_layers(n)[0].dilations) == 1 for n in stacks):
            return
        spelt_by = self._dilations_spelt_by()
        raise ConfigError(
            "every head of the bottom layer is dilated, so a token does not see its neighbour t-1 after "
            "one layer (and a stack dilated everywhere splits into independent sub-models over residue "
            "classes); keep some heads of the bottom layer undilated as Longformer does: dilated_heads < "
            "n_heads, a dilation_schedule that starts at 1, or a 1 in the first layer's head_dilations "
            "or layer_dilations",
            field=spelt_by,
            value=_show(getattr(self, spelt_by)),
            fix="keep some heads of the bottom layer undilated",
            related=tuple(k for k in ("dilation", "dilated_heads", "dilation_schedule") if k != spelt_by),
        )

    def _validate_global_tokens(self, patterns_registry) -> None:
        g = self.global_tokens
        if g is None:
            if self.global_projections != "separate":
                raise ConfigError(
                    f"global_projections={self.global_projections!r} says how global tokens are projected; there are "
                    "none: remove global_projections, or set global_tokens",
                    field="global_projections",
                    value=self.global_projections,
                    fix="remove global_projections, or set global_tokens",
                    related=("global_tokens",),
                )
            return
        if (
            not isinstance(g, tuple)
            or not g
            or not all(not isinstance(t, bool) and isinstance(t, int) and t >= 0 for t in g)
        ):
            raise ConfigError(
                f"global_tokens={_show(g)} must be a non-empty list of positions (integers >= 0), e.g. [0]",
                field="global_tokens",
                value=_show(g),
                fix="give a non-empty list of integers >= 0",
            )
        if list(g) != sorted(set(g)):
            raise ConfigError(
                f"global_tokens={_show(g)} names the same positions as {sorted(set(g))}: write that (sorted, each once)",
                field="global_tokens",
                value=_show(g),
                fix=f"write global_tokens={sorted(set(g))}",
            )
        if not any(patterns_registry.traits(p).windowed for p in self.patterns_for(self.n_layers)):
            raise ConfigError(
                f"global_tokens gives positions global attention in windowed layers (Longformer); pattern "
                f"{self.pattern!r} sees every key already: remove global_tokens or use pattern 'local' or 'dilated'",
                field="global_tokens",
                value=_show(g),
                fix="remove global_tokens, or use pattern 'local' or 'dilated'",
                related=("pattern", "layer_patterns"),
            )
        if self.arch == "decoder":
            raise ConfigError(
                "global_tokens in a causal stack (arch='decoder') would let a global token see later tokens; Longformer's "
                "global attention is for bidirectional stacks (encoders, the encoder of an encoder_decoder): remove it",
                field="global_tokens",
                value=_show(g),
                fix="remove global_tokens",
                related=("arch",),
            )

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
