"""The rules between a model config's fields, checked when it is built (after each field's own type and range,
which its annotation in ``models.config`` declares): the heads' width, each arch's keys, the cross-attention,
the decoding, the attention geometry (``models.layer_checks``), one spelling per model (``models.spelling``),
Longformer's global tokens, each chosen component's own ``check(cfg)``, and sizes no part of the model reads.

``check`` runs them in the order the messages come when a config has several mistakes; each raises a ConfigError
naming the field at fault, its value, the fix and the other keys it read (``related``). A new rule between fields
is a function here, called from ``check``. Pure Python (no torch).
"""

from __future__ import annotations

from dataclasses import fields

from models import layer_checks, spelling
from models.errors import ConfigError
from models.registry import ALL as REGISTRIES


def check(cfg) -> None:
    """Every rule between fields, in the order the messages come: the combinations, then each chosen component's own
    check (it may read any field), then the sizes no part of the model reads."""
    pad_id(cfg)
    heads(cfg)
    arch(cfg)
    cross(cfg)
    decoding(cfg)
    layer_checks.check(cfg)
    spelling.check(cfg)  # one spelling per model: a simpler spelling of the same attention is asked for
    global_tokens(cfg)
    components(cfg)
    read(cfg)


def read(cfg) -> None:
    """A size no part of this model reads is refused unless left at its default (two spellings of one model):
    the additive score's block size, and the table and length head of ``max_len``."""
    scores = {cfg.score, getattr(cfg, "cross_score", None) or cfg.score}
    chunked = any(getattr(REGISTRIES["score"].traits(s), "chunked", False) for s in scores)
    defaults = {f.name: f.default for f in fields(cfg)}
    if cfg.chunk_elements != defaults["chunk_elements"] and not chunked:
        raise ConfigError(
            f"chunk_elements={cfg.chunk_elements} bounds the blocks of additive scores; score={cfg.score!r} "
            "computes none (remove chunk_elements)",
            field="chunk_elements",
            value=cfg.chunk_elements,
            fix="remove chunk_elements",
            related=("score",),
        )
    takes = getattr(REGISTRIES["positions"].traits(cfg.positions), "takes_max_len", False)  # (a plugin's: no)
    if cfg.max_len != defaults["max_len"] and not takes and not cfg.non_autoregressive:
        raise ConfigError(
            f"max_len={cfg.max_len} sizes a learned position table or a non-autoregressive length head; "
            f"positions={cfg.positions!r} with decoding={cfg.decoding!r} has neither and reads positions at "
            "any length (remove max_len)",
            field="max_len",
            value=cfg.max_len,
            fix="remove max_len, or use positions='learned'",
            related=("positions", "decoding"),
        )


def pad_id(cfg) -> None:
    """pad_id is a token of the vocabulary."""
    if cfg.pad_id >= cfg.vocab_size:
        raise ConfigError(
            f"pad_id={cfg.pad_id} must be below vocab_size={cfg.vocab_size}",
            field="pad_id",
            value=cfg.pad_id,
            fix=f"give a pad_id below {cfg.vocab_size}, or raise vocab_size",
            related=("vocab_size",),
        )


def heads(cfg) -> None:
    """The heads' width: d_model split evenly, unless head_dim is given (and q, k unprojected need the split)."""
    if cfg.head_dim is None and cfg.d_model % cfg.n_heads != 0:
        raise ConfigError(
            f"d_model={cfg.d_model} is not divisible by n_heads={cfg.n_heads}; "
            "choose a divisible pair or set head_dim explicitly",
            field="d_model",
            value=cfg.d_model,
            fix="choose d_model and n_heads with n_heads dividing d_model, or set head_dim",
            related=("n_heads",),
        )
    if not cfg.qk_projections and cfg.head_size * cfg.n_heads != cfg.d_model:
        raise ConfigError(
            f"qk_projections=false splits each state into n_heads={cfg.n_heads} slices of head_dim="
            f"{cfg.head_size}, which must cover d_model={cfg.d_model}; remove head_dim or set it to "
            "d_model / n_heads",
            field="head_dim",
            value=cfg.head_dim,
            fix="remove head_dim, or set it to d_model / n_heads",
            related=("qk_projections", "n_heads", "d_model"),
        )


def _only_for(cfg, arch: str, name: str) -> ConfigError:
    """A key another arch reads: refused, since it would change nothing (two spellings of one model)."""
    return ConfigError(
        f"{name} is only for arch={arch!r} (got arch={cfg.arch!r}); remove it",
        field=name,
        value=getattr(cfg, name),
        fix=f"remove {name}",
        related=("arch",),
    )


def arch(cfg) -> None:
    """The keys of one arch: the encoder's classifier head, the encoder_decoder's second stack and vocabulary."""
    if cfg.arch == "encoder":
        if cfg.n_classes is None:
            raise ConfigError(
                "arch='encoder' needs n_classes (the size of the classification or tagging head)",
                field="n_classes",
                value=None,
                fix="set n_classes",
                related=("arch",),
            )
        if cfg.tie_embeddings:
            raise ConfigError(
                "tie_embeddings=true needs a language-model head; arch='encoder' has a classifier "
                "(set tie_embeddings to false or null)",
                field="tie_embeddings",
                value=True,
                fix="set tie_embeddings to false or null",
                related=("arch",),
            )
    else:
        if cfg.n_classes is not None:
            raise _only_for(cfg, "encoder", "n_classes")
        if cfg.classifier != "mean":
            raise _only_for(cfg, "encoder", "classifier")
    if cfg.arch != "encoder_decoder":
        for name in ("tgt_vocab_size", "n_decoder_layers"):
            if getattr(cfg, name) is not None:
                raise _only_for(cfg, "encoder_decoder", name)
    if cfg.arch == "encoder_decoder" and cfg.tgt_vocab_size is not None and cfg.pad_id >= cfg.tgt_vocab_size:
        raise ConfigError(
            f"pad_id={cfg.pad_id} must be below tgt_vocab_size={cfg.tgt_vocab_size}",
            field="pad_id",
            value=cfg.pad_id,
            fix=f"give a pad_id below {cfg.tgt_vocab_size}, or raise tgt_vocab_size",
            related=("tgt_vocab_size",),
        )


def cross(cfg) -> None:
    """The cross-attention's own keys: read by an encoder_decoder only (elsewhere they would change nothing);
    over the states themselves, the heads' slices must tile d_model."""
    if cfg.arch != "encoder_decoder":
        for name in ("cross_score", "cross_qk_projections"):
            if getattr(cfg, name) is not None:
                raise ConfigError(
                    f"{name} sets the cross-attention of arch='encoder_decoder'; arch={cfg.arch!r} has none, "
                    "so it would change nothing: remove it (the self-attention's keys are score and qk_projections)",
                    field=name,
                    value=getattr(cfg, name),
                    fix=f"remove {name}, or use arch='encoder_decoder'",
                    related=("arch",),
                )
        return
    if cfg.qk_projections and not cfg.cross_attention_projected and cfg.head_size * cfg.n_heads != cfg.d_model:
        raise ConfigError(
            f"cross_qk_projections=false scores target states against source states themselves, each of the "
            f"n_heads={cfg.n_heads} heads over its slice of head_dim={cfg.head_size}, which must cover "
            f"d_model={cfg.d_model}; remove head_dim or set it to d_model / n_heads (Luong et al.'s single "
            "attention: n_heads 1)",
            field="head_dim",
            value=cfg.head_dim,
            fix="remove head_dim, or set it to d_model / n_heads",
            related=("cross_qk_projections", "n_heads", "d_model"),
        )


def components(cfg) -> None:
    """Each chosen component's own checks (e.g. rotary needs a dot-product score), patterns included."""
    for name in ("positions", "score", "norm_type", "ffn"):
        check = getattr(REGISTRIES[name].traits(getattr(cfg, name)), "check", None)
        if check is not None:
            check(cfg)
    for p in sorted(set(cfg.patterns_for(cfg.n_layers))):
        check = getattr(REGISTRIES["pattern"].traits(p), "check", None)
        if check is not None:
            check(cfg)


def decoding(cfg) -> None:
    """Non-autoregressive decoding: an encoder_decoder's, with the passes and lengths of its paper."""
    if cfg.non_autoregressive and cfg.arch != "encoder_decoder":
        raise ConfigError(
            f"decoding={cfg.decoding!r} predicts a target from a source and needs arch='encoder_decoder' "
            f"(got arch={cfg.arch!r}); use decoding='autoregressive'",
            field="decoding",
            value=cfg.decoding,
            fix="use decoding='autoregressive', or arch='encoder_decoder'",
            related=("arch",),
        )
    if cfg.nat_iterations > 1 and cfg.decoding != "mask_predict":
        raise ConfigError(
            f"nat_iterations={cfg.nat_iterations} is the number of mask-predict passes at evaluation "
            f"(Ghazvininejad et al. 2019); it needs decoding='mask_predict' (got decoding={cfg.decoding!r}"
            + (": Gu et al.'s decoder decodes in one pass)" if cfg.copies_source else ")"),
            field="nat_iterations",
            value=cfg.nat_iterations,
            fix="remove nat_iterations, or use decoding='mask_predict'",
            related=("decoding",),
        )
    length_candidates(cfg)
    if cfg.positional_attention and not getattr(REGISTRIES["positions"].traits(cfg.positions), "absolute", False):
        raise ConfigError(
            "decoding='nat_gu' gives every decoder layer Gu et al.'s positional attention, whose queries and keys "
            f"are the positional encodings the decoder adds to its inputs; positions={cfg.positions!r} adds none "
            "(rotary and alibi act inside attention, none has no positions): use positions 'sinusoidal' or "
            "'learned', or decoding='uniform_copy' (Gu et al.'s inputs without positional attention)",
            field="decoding",
            value=cfg.decoding,
            fix="use positions='sinusoidal' or 'learned', or decoding='uniform_copy'",
            related=("positions",),
        )


def length_candidates(cfg) -> None:
    """Mask-predict's length beam (Ghazvininejad et al. section 3.3): refused where it would change nothing or
    where the paper of the decoding does not decode several lengths."""
    n = cfg.length_candidates
    if n > 1 and cfg.decoding != "mask_predict":
        why = {
            "autoregressive": "an autoregressive decoder ends its output with its own end of sequence; its search "
            "is training.beam_size",
        }.get(
            cfg.decoding,
            "Gu et al. decode one length: their noisy parallel decoding samples fertilities and rescores the "
            "candidates with an autoregressive teacher, neither of which is built",
        )
        raise ConfigError(
            f"length_candidates={n} decodes the {n} most probable target lengths and keeps the output of highest "
            "average log-probability, mask-predict's length beam (Ghazvininejad et al. 2019, section 3.3); it "
            f"needs decoding='mask_predict' (got decoding={cfg.decoding!r}: {why})",
            field="length_candidates",
            value=n,
            fix="remove length_candidates, or use decoding='mask_predict'",
            related=("decoding",),
        )
    if n > cfg.max_len + 1:
        raise ConfigError(
            f"length_candidates={n} is more than the {cfg.max_len + 1} target lengths the length predictor knows "
            f"(0 .. max_len={cfg.max_len})",
            field="length_candidates",
            value=n,
            fix=f"give length_candidates <= {cfg.max_len + 1}, or raise max_len",
            related=("max_len",),
        )


def global_tokens(cfg) -> None:
    """Longformer's global tokens: in windowed layers of a bidirectional stack, projected as said only if any."""
    g = cfg.global_tokens
    if g is None:
        if cfg.global_projections != "separate":
            raise ConfigError(
                f"global_projections={cfg.global_projections!r} says how global tokens are projected; there are "
                "none: remove global_projections, or set global_tokens",
                field="global_projections",
                value=cfg.global_projections,
                fix="remove global_projections, or set global_tokens",
                related=("global_tokens",),
            )
        return
    if not any(REGISTRIES["pattern"].traits(p).windowed for p in cfg.patterns_for(cfg.n_layers)):
        raise ConfigError(
            f"global_tokens gives positions global attention in windowed layers (Longformer); pattern "
            f"{cfg.pattern!r} sees every key already: remove global_tokens or use pattern 'local' or 'dilated'",
            field="global_tokens",
            value=list(g),
            fix="remove global_tokens, or use pattern 'local' or 'dilated'",
            related=("pattern", "layer_patterns"),
        )
    if cfg.arch == "decoder":
        raise ConfigError(
            "global_tokens in a causal stack (arch='decoder') would let a global token see later tokens; Longformer's "
            "global attention is for bidirectional stacks (encoders, the encoder of an encoder_decoder): remove it",
            field="global_tokens",
            value=list(g),
            fix="remove global_tokens",
            related=("arch",),
        )
