"""What the config needs to know about a component, without torch: its flags and its own checks.

``ModelConfig`` validates a study's every variant in the driver (``ablate sweep``, ``ablate search``), which
never builds a model; importing torch there cost 1 to 2.5 CPU seconds per command (benchmarks/startup.py).
So each built-in component's flags and ``check(cfg)`` live here, in classes that import nothing heavy, and
the component classes inherit them (``class LocalPattern(LocalTraits, Pattern)``): one definition, read by
the config through ``REGISTRY.traits(name)`` whether or not the component's module is loaded yet.
``models.registry`` declares each built-in name with its module and traits; a researcher's own component is
registered as before and is its own traits (its class attributes and ``check``).
"""

from __future__ import annotations

from models.errors import ConfigError

ROTARY_BASE = 10000.0  # Su et al.'s base of the rotary wavelengths (ModelConfig.rotary_base's default)


class ScoreTraits:
    """``dot_like``: the score is ``scale * q.k`` of the prepared q and k (torch's fused attention runs it);
    ``chunked``: it computes its scores in blocks of ``chunk_elements`` (else that key changes nothing)."""

    dot_like = True
    chunked = False


class AdditiveTraits(ScoreTraits):
    dot_like = False
    chunked = True


class PatternTraits:
    """``windowed``: the pattern needs ``window``; ``dilated``: it takes per-head dilations."""

    windowed = False
    dilated = False


class LocalTraits(PatternTraits):
    windowed = True


class DilatedTraits(LocalTraits):
    dilated = True


class PositionsTraits:
    """``needs_dot_product``: the scheme acts through q.k (rotary); ``takes_init_std``: ``position_init_std``
    applies; ``absolute``: the scheme adds a vector per position to the embeddings (sinusoidal, learned), which
    Gu et al.'s positional attention reads as its queries and keys (``decoding='nat_gu'``). ``check(cfg)``
    refuses what the scheme cannot do."""

    needs_dot_product = False
    takes_init_std = False
    takes_base = False  # rotary_base applies
    takes_max_len = False  # a table of max_len positions (else the scheme reads positions at any length)
    absolute = False

    @classmethod
    def check(cls, cfg) -> None:
        if cfg.position_init_std is not None and not cls.takes_init_std:
            raise ConfigError(
                f"position_init_std={cfg.position_init_std} sets the initial scale of a learned table; "
                f"positions={cfg.positions!r} has none (remove it, or use positions='learned')",
                field="position_init_std",
                value=cfg.position_init_std,
                fix="remove position_init_std, or use positions='learned'",
                related=("positions",),
            )
        if cfg.rotary_base != ROTARY_BASE and not cls.takes_base:
            raise ConfigError(
                f"rotary_base={cfg.rotary_base:g} sets the wavelengths of rotary positions; positions="
                f"{cfg.positions!r} has none (remove it, or use positions='rotary')",
                field="rotary_base",
                value=cfg.rotary_base,
                fix="remove rotary_base, or use positions='rotary'",
                related=("positions",),
            )
        if cls.needs_dot_product and not cfg.dot_like_score:
            raise ConfigError(
                f"positions={cfg.positions!r} encodes offsets through the dot product q.k, which score="
                f"{cfg.score!r} does not compute; use positions sinusoidal, learned, alibi or none with "
                f"{cfg.score} scores",
                field="positions",
                value=cfg.positions,
                fix=f"use positions sinusoidal, learned, alibi or none with score={cfg.score!r}, or a dot-product score",
                related=("score",),
            )


class SinusoidalTraits(PositionsTraits):
    absolute = True


class LearnedTraits(PositionsTraits):
    takes_init_std = True
    takes_max_len = True  # its table holds max_len positions
    absolute = True


class RotaryTraits(PositionsTraits):
    needs_dot_product = True
    takes_base = True

    @classmethod
    def check(cls, cfg) -> None:
        super().check(cfg)
        if cfg.head_size % 2:
            raise ConfigError(
                f"positions='rotary' rotates pairs of dimensions and needs an even head_dim (got {cfg.head_size})",
                field="positions",
                value=cfg.positions,
                fix="choose an even head_dim (or d_model / n_heads), or other positions",
                related=("head_dim", "d_model", "n_heads"),
            )


class ALiBiTraits(PositionsTraits):
    @classmethod
    def check(cls, cfg) -> None:
        super().check(cfg)
        bidirectional = cfg.arch != "decoder"  # encoders, and the decoder of non-autoregressive seq2seq
        if bidirectional and cfg.n_heads == 1:
            raise ConfigError(
                f"positions='alibi' in a bidirectional stack (arch={cfg.arch!r}) gives past and future keys the "
                "slopes of two different heads; with n_heads=1 they coincide and the bias cannot tell a sequence "
                "from its reverse. Use n_heads >= 2, or positions sinusoidal, learned or rotary",
                field="positions",
                value=cfg.positions,
                fix="use n_heads >= 2, or positions sinusoidal, learned or rotary",
                related=("n_heads", "arch"),
            )
