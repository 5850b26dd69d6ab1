"""The attention geometry of a model config, checked when it is built: each layer's pattern, the windows and
dilations the patterns read (refused where no layer reads them, or where a simpler key says the same), and
Longformer's undilated bottom layer (``models.checks`` calls ``check``; the geometry itself is resolved by
``ModelConfig.attention_layers``). The type of each key (a list of positive integers, one per layer) is its
field's, declared in ``models.config``. Pure Python (no torch).
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

from models.errors import ConfigError
from models.registry import ALL as REGISTRIES


def _given(field: str, entry: Any, at: int) -> None:
    """An entry of a per-layer list where its layer reads it: a positive integer (its field's type), not null."""
    if entry is None:
        raise ConfigError(
            f"{field}[{at}]=None must be a positive integer", field=field, value=None, fix="give a positive integer"
        )


def _ints(field: str, value: Any, length: int | None = None, what: str = "", at: int | None = None) -> None:
    """A list of ``length`` positive integers (one per head: ``related`` n_heads)."""
    name = field if at is None else f"{field}[{at}]"
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


def per_layer(field: str, value: tuple, applies: list[bool], what: str, check) -> None:
    """A list with one entry per layer (its type is its field's, ``models.fields.per_layer``): ``check(entry,
    index)`` where the entry applies, null elsewhere (an entry a layer ignores would make two spellings of one
    model)."""
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


class _PatternUse(NamedTuple):
    """What the config's patterns are, for the checks of the keys they read (windows, dilations)."""

    windowed: bool  # some layer is windowed: it needs a window
    dilated: bool  # some layer is dilated: it takes dilations
    layer_kinds: list  # each layer's pattern traits, bottom to top
    windowed_names: str  # the patterns a window needs: "'local' or 'dilated'"
    dilated_names: str
    got: str  # the patterns as given, for the messages: "got pattern='full'"

    @classmethod
    def of(cls, cfg, registry) -> _PatternUse:
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


def check(cfg) -> None:
    """The self-attention geometry: the patterns, then the windows and the dilations they take (each refused
    where no layer reads it), then Longformer's undilated bottom layer."""
    layer_patterns(cfg)
    use = _PatternUse.of(cfg, REGISTRIES["pattern"])
    layer_windows(cfg, use)
    window(cfg, use)
    window_schedule(cfg, use)
    dilation_keys(cfg, use)
    dilation(cfg, use)
    dilated_layers = [t.dilated for t in use.layer_kinds]
    head_dilations(cfg, dilated_layers)
    layer_dilations(cfg, dilated_layers)
    explicit_dilations(cfg)
    if use.dilated:
        bottom_layer(cfg)


def layer_patterns(cfg) -> None:
    """layer_patterns replaces pattern, one per layer of each stack."""
    if cfg.layer_patterns is None:
        return
    if cfg.pattern != "full":  # the default: what layer_patterns replaces
        raise ConfigError(
            f"pattern={cfg.pattern!r} is not read when layer_patterns gives each layer's pattern: remove it",
            field="pattern",
            value=cfg.pattern,
            fix="remove pattern",
            related=("layer_patterns",),
        )
    if cfg.arch == "encoder_decoder" and cfg.decoder_layers != cfg.n_layers:
        raise ConfigError(
            f"layer_patterns applies to both stacks of arch='encoder_decoder', which then need the same "
            f"depth (n_layers={cfg.n_layers}, n_decoder_layers={cfg.decoder_layers})",
            field="layer_patterns",
            value=_show(cfg.layer_patterns),
            fix="give both stacks the same depth, or use pattern",
            related=("n_decoder_layers", "n_layers"),
        )
    if len(cfg.layer_patterns) != cfg.n_layers:
        raise ConfigError(
            f"layer_patterns has {len(cfg.layer_patterns)} entries but the stack has {cfg.n_layers} "
            "layers; give one pattern per layer",
            field="layer_patterns",
            value=_show(cfg.layer_patterns),
            fix=f"give {cfg.n_layers} patterns, one per layer",
            related=("n_layers",),
        )


def layer_windows(cfg, use: _PatternUse) -> None:
    """layer_windows where some layer is windowed (without one, ``_validate_window`` refuses it)."""
    if cfg.layer_windows is None or not use.windowed:
        return
    per_layer(
        "layer_windows",
        cfg.layer_windows,
        [t.windowed for t in use.layer_kinds],
        " (one window per layer)",
        functools.partial(_given, "layer_windows"),
    )
    if cfg.arch == "encoder_decoder" and cfg.decoder_layers != cfg.n_layers:
        raise ConfigError(
            "layer_windows applies to both stacks of arch='encoder_decoder', which then need the same depth "
            f"(n_layers={cfg.n_layers}, n_decoder_layers={cfg.decoder_layers})",
            field="layer_windows",
            value=_show(cfg.layer_windows),
            fix="give both stacks the same depth, or use window",
            related=("n_decoder_layers", "n_layers"),
        )
    if cfg.window is not None:
        raise ConfigError(
            "give either window (with window_schedule) or layer_windows, not both; remove one of them",
            field="window",
            value=cfg.window,
            fix="remove window or layer_windows",
            related=("layer_windows",),
        )


def window(cfg, use: _PatternUse) -> None:
    """A windowed pattern needs a window; a window needs a windowed pattern."""
    needs, got = use.windowed_names, use.got
    if use.windowed and cfg.window is None and cfg.layer_windows is None:
        raise ConfigError(
            f"pattern {needs} needs window (keys at distance <= window are seen)",
            field="window",
            value=None,
            fix="set window",
            related=("pattern", "layer_patterns"),
        )
    if not use.windowed and cfg.window is not None:
        raise ConfigError(
            f"window={cfg.window} requires pattern {needs} ({got}); remove window or change the pattern",
            field="window",
            value=cfg.window,
            fix=f"remove window, or use pattern {needs}",
            related=("pattern", "layer_patterns"),
        )
    if not use.windowed and cfg.layer_windows is not None:
        raise ConfigError(
            f"layer_windows requires pattern {needs} ({got}); remove layer_windows",
            field="layer_windows",
            value=_show(cfg.layer_windows),
            fix="remove layer_windows",
            related=("pattern", "layer_patterns"),
        )


def window_schedule(cfg, use: _PatternUse) -> None:
    """A schedule spreads ``window`` over windowed layers: without them, or beside layer_windows, it is unread."""
    if not use.windowed and cfg.window_schedule != "fixed":
        raise ConfigError(
            f"window_schedule={cfg.window_schedule!r} requires pattern {use.windowed_names} ({use.got})",
            field="window_schedule",
            value=cfg.window_schedule,
            fix=f"remove window_schedule, or use pattern {use.windowed_names}",
            related=("pattern", "layer_patterns"),
        )
    if cfg.window_schedule != "fixed" and cfg.layer_windows is not None:
        raise ConfigError(
            "window_schedule does not apply with layer_windows (each layer's window is given)",
            field="window_schedule",
            value=cfg.window_schedule,
            fix="remove window_schedule",
            related=("layer_windows",),
        )


def dilation_keys(cfg, use: _PatternUse) -> None:
    """Each dilation key needs a dilated layer to read it; a schedule needs ``dilation`` to spread."""
    explicit = cfg.head_dilations is not None or cfg.layer_dilations is not None
    needs, got = use.dilated_names, use.got
    if cfg.dilation > 1 and not use.dilated:
        raise ConfigError(
            f"dilation requires pattern {needs} ({got}, dilation={cfg.dilation})",
            field="dilation",
            value=cfg.dilation,
            fix=f"remove dilation, or use pattern {needs}",
            related=("pattern", "layer_patterns"),
        )
    for name in ("dilated_heads", "layer_dilations", "head_dilations"):
        if getattr(cfg, name) is not None and not use.dilated:
            raise ConfigError(
                f"{name} requires pattern {needs} ({got}); remove {name}",
                field=name,
                value=_show(getattr(cfg, name)),
                fix=f"remove {name}",
                related=("pattern", "layer_patterns"),
            )
    if cfg.dilation_schedule != "increasing" and (not use.dilated or explicit):
        given = "head_dilations or layer_dilations give the dilations" if explicit else f"{got}"
        raise ConfigError(
            f"dilation_schedule={cfg.dilation_schedule!r} spreads dilation over the layers of pattern "
            f"{needs} ({given}); remove it",
            field="dilation_schedule",
            value=cfg.dilation_schedule,
            fix="remove dilation_schedule",
            related=("head_dilations", "layer_dilations") if explicit else ("pattern", "layer_patterns"),
        )


def dilation(cfg, use: _PatternUse) -> None:
    """``dilation`` and ``dilated_heads``, where they give the dilations: a dilation, on at most every head."""
    explicit = cfg.head_dilations is not None or cfg.layer_dilations is not None
    if use.dilated and not explicit and cfg.dilation < 2:
        raise ConfigError(
            f"pattern {use.dilated_names} needs dilation >= 2 (dilation 1 is pattern 'local')",
            field="dilation",
            value=cfg.dilation,
            fix="set dilation >= 2, or use pattern 'local'",
            related=("pattern", "layer_patterns"),
        )
    if cfg.dilated_heads is not None and cfg.dilated_heads > cfg.n_heads:
        raise ConfigError(
            f"dilated_heads={cfg.dilated_heads} must be at most n_heads={cfg.n_heads}",
            field="dilated_heads",
            value=cfg.dilated_heads,
            fix=f"give dilated_heads <= {cfg.n_heads}",
            related=("n_heads",),
        )


def head_dilations(cfg, dilated_layers: list[bool]) -> None:
    """head_dilations gives every head's dilation: alone, one list for all layers or one per layer."""
    if cfg.head_dilations is None:
        return
    given = [n for n in ("dilated_heads", "layer_dilations") if getattr(cfg, n) is not None]
    given += ["dilation"] if cfg.dilation > 1 else []
    if given:
        raise ConfigError(
            f"head_dilations gives every head's dilation; remove {given[0]}",
            field=given[0],
            value=_show(getattr(cfg, given[0])),
            fix=f"remove {given[0]}",
            related=("head_dilations",),
        )
    hd, H = cfg.head_dilations, cfg.n_heads
    if not cfg.nested_head_dilations:
        _ints("head_dilations", hd, H, " (one dilation per head)")
        return
    if len(hd) != cfg.n_layers or (cfg.arch == "encoder_decoder" and cfg.decoder_layers != cfg.n_layers):
        raise ConfigError(
            f"head_dilations has {len(hd)} lists but the stack has {cfg.n_layers} layers (and both stacks "
            "of an encoder_decoder need that depth); give one list per layer or one list for all",
            field="head_dilations",
            value=_show(hd),
            fix=f"give {cfg.n_layers} lists, one per layer, or one list for all",
            related=("n_layers", "n_decoder_layers"),
        )
    each_head = lambda row, i: _ints("head_dilations", row, H, " (one dilation per head)", at=i)  # noqa: E731
    per_layer("head_dilations", hd, dilated_layers, "", each_head)


def layer_dilations(cfg, dilated_layers: list[bool]) -> None:
    """layer_dilations gives each dilated layer's dilation, in place of ``dilation``."""
    if cfg.layer_dilations is None:
        return
    per_layer(
        "layer_dilations",
        cfg.layer_dilations,
        dilated_layers,
        " (one dilation per layer)",
        functools.partial(_given, "layer_dilations"),
    )
    if cfg.dilation > 1:
        raise ConfigError(
            "layer_dilations gives each layer's dilation; remove dilation",
            field="dilation",
            value=cfg.dilation,
            fix="remove dilation",
            related=("layer_dilations",),
        )
    if cfg.arch == "encoder_decoder" and cfg.decoder_layers != cfg.n_layers:
        raise ConfigError(
            "layer_dilations applies to both stacks of arch='encoder_decoder', which need the same depth",
            field="layer_dilations",
            value=_show(cfg.layer_dilations),
            fix="give both stacks the same depth, or use dilation",
            related=("n_decoder_layers", "n_layers"),
        )


def explicit_dilations(cfg) -> None:
    """Dilations given per head or per layer that are all 1 are pattern 'local' (one spelling per model)."""
    if cfg.head_dilations is None and cfg.layer_dilations is None:
        return
    name = "head_dilations" if cfg.head_dilations is not None else "layer_dilations"
    rows = [row for row in getattr(cfg, name) if row is not None]
    if all(d == 1 for row in rows for d in (row if isinstance(row, tuple) else (row,))):
        raise ConfigError(
            f"every dilation of {name} is 1, which is pattern 'local': use pattern 'local', or give a dilation >= 2",
            field=name,
            value=_show(getattr(cfg, name)),
            fix="use pattern 'local', or give a dilation >= 2",
            related=("pattern", "layer_patterns"),
        )


def _dilations_spelt_by(cfg) -> str:
    """The key that gives the dilated heads' dilations, the most specific first."""
    for name in ("head_dilations", "layer_dilations", "dilated_heads"):
        if getattr(cfg, name) is not None:
            return name
    return "dilation"


def bottom_layer(cfg) -> None:
    """Longformer keeps the lower layers undilated: with every head of the bottom layer dilated, token t would
    not see t - 1 after one layer (and a stack dilated everywhere would never see it)."""
    stacks = {cfg.n_layers} | ({cfg.decoder_layers} if cfg.arch == "encoder_decoder" else set())
    if all(min(cfg.attention_layers(n)[0].dilations) == 1 for n in stacks):
        return
    spelt_by = _dilations_spelt_by(cfg)
    raise ConfigError(
        "every head of the bottom layer is dilated, so a token does not see its neighbour t-1 after "
        "one layer (and a stack dilated everywhere splits into independent sub-models over residue "
        "classes); keep some heads of the bottom layer undilated as Longformer does: dilated_heads < "
        "n_heads, a dilation_schedule that starts at 1, or a 1 in the first layer's head_dilations "
        "or layer_dilations",
        field=spelt_by,
        value=_show(getattr(cfg, spelt_by)),
        fix="keep some heads of the bottom layer undilated",
        related=tuple(k for k in ("dilation", "dilated_heads", "dilation_schedule") if k != spelt_by),
    )
