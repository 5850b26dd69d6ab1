"""One model, one spelling: a config whose attention geometry another spelling gives more simply is refused with
the spelling to use.

The self-attention geometry of a stack (each layer's pattern kind, window and per-head dilations, as
``ModelConfig.attention_layers`` resolves them) can be written several ways: a window schedule that resolves to
equal windows is the fixed window, ``layer_windows`` that follow a schedule are that schedule, ``head_dilations``
whose dilated heads are the last ones of every layer are ``dilation`` with ``dilated_heads``, ``layer_patterns``
that repeat one pattern are ``pattern``. Two variants of a study spelt differently would be one model under two
names and two cell ids. So the check builds the simplest spelling of the resolved geometry (``canonical``: a
single pattern before ``layer_patterns``; ``window`` fixed, then a schedule, then ``layer_windows``; ``dilation``
with the default schedule, then ``fixed``, ``decreasing``, then ``layer_dilations``, then ``head_dilations``, one
list before one per layer) and refuses any other, once that spelling is confirmed to resolve to the same geometry.
Values a layer ignores are refused where they are read (``models.layer_checks.per_layer``); values equal to what
leaving a key out means are written as left out (``ModelConfig.implied``).

Pure Python (no torch): the config is validated in a study's driver, which never builds a model.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

from models.errors import ConfigError
from models.schedules import schedule

BUILT_IN = {"full": "full", "local": "window", "dilated": "window"}  # pattern -> what it computes
GEOMETRY_DEFAULTS = {
    "pattern": "full",
    "layer_patterns": None,
    "window": None,
    "window_schedule": "fixed",
    "layer_windows": None,
    "dilation": 1,
    "dilated_heads": None,
    "dilation_schedule": "increasing",
    "layer_dilations": None,
    "head_dilations": None,
}
_checking = threading.local()  # the confirmation builds a config: its own check is skipped

Layer = tuple[str, Any, tuple[int, ...]]  # (full | window, window, dilations)


def _show(value: Any) -> Any:
    return [_show(v) for v in value] if isinstance(value, (tuple, list)) else value


def geometry(cfg) -> dict[int, list[Layer]] | None:
    """Each stack depth -> its layers' (kind, window, dilations); None when a pattern is not built in."""
    depths = {cfg.n_layers} | ({cfg.decoder_layers} if cfg.arch == "encoder_decoder" else set())
    out = {}
    for n in sorted(depths):
        layers = cfg.attention_layers(n)
        if any(la.pattern not in BUILT_IN for la in layers):
            return None
        out[n] = [(BUILT_IN[la.pattern], la.window, la.dilations) for la in layers]
    return out


def given(cfg) -> dict[str, Any]:
    """The geometry keys as written, without those at their defaults (or at what leaving them out means)."""
    out = {k: _show(getattr(cfg, k)) for k, default in GEOMETRY_DEFAULTS.items() if getattr(cfg, k) != default}
    if cfg.layer_patterns is None:
        out["pattern"] = cfg.pattern
    if out.get("dilated_heads") == cfg.implied()["dilated_heads"]:
        del out["dilated_heads"]
    return out


def _windows(cfg, stacks: dict[int, list[Layer]], per_layer: bool) -> dict[str, Any] | None:
    """The simplest spelling of every stack's windows: fixed, a schedule, or one per layer."""
    lists = {n: [w for kind, w, _ in layers if kind == "window"] for n, layers in stacks.items()}
    first = lists[min(lists)]
    if not first:
        return {}
    if all(set(ws) == {first[0]} for ws in lists.values()):
        return {"window": first[0]}
    if sum(first) % len(first) == 0:
        mean = sum(first) // len(first)
        for kind in ("increasing", "decreasing"):
            if all(schedule(mean, len(ws), kind) == ws for ws in lists.values()):
                return {"window": mean, "window_schedule": kind}
    if per_layer:
        return {"layer_windows": [w if kind == "window" else None for kind, w, _ in stacks[min(stacks)]]}
    return None


def _dilations(cfg, rows: dict[int, list[tuple[int, ...] | None]], per_layer: bool) -> dict[str, Any] | None:
    """The simplest spelling of the dilated layers' head dilations (``rows``: per stack, one tuple per layer, None
    where the layer is not dilated): a schedule, one dilation per layer, or every head."""
    H = cfg.n_heads
    used = [row for stack in rows.values() for row in stack if row is not None]
    counts = {sum(d > 1 for d in row) for row in used if max(row) > 1}
    if len(counts) == 1:
        k = counts.pop()
        if all(row == (1,) * (H - k) + (max(row),) * k for row in used):
            heads = {} if k == cfg.implied()["dilated_heads"] else {"dilated_heads": k}
            lists = {n: [max(row) for row in stack if row is not None] for n, stack in rows.items()}
            top = max(max(ds) for ds in lists.values())
            for kind in ("increasing", "fixed", "decreasing"):
                if all(schedule(top, len(ds), kind, start=1) == ds for ds in lists.values()):
                    return {"dilation": top, **heads, **({} if kind == "increasing" else {"dilation_schedule": kind})}
            if per_layer:
                stack = rows[min(rows)]
                return {"layer_dilations": [None if row is None else max(row) for row in stack], **heads}
    if len(set(used)) == 1:
        return {"head_dilations": list(used[0])}
    if per_layer:
        return {"head_dilations": [None if row is None else list(row) for row in rows[min(rows)]]}
    return None


def canonical(cfg, stacks: dict[int, list[Layer]]) -> dict[str, Any] | None:
    """The simplest spelling of the geometry of ``stacks`` (None: none found, nothing is refused)."""
    per_layer = len(stacks) == 1  # lists of one entry per layer need stacks of one depth
    kinds = {kind for layers in stacks.values() for kind, _, _ in layers}
    dilated = [any(max(d) > 1 for kind, _, d in layers if kind == "window") for layers in stacks.values()]
    options = []
    if kinds == {"full"}:
        return {"pattern": "full"}
    if kinds == {"window"}:
        name = "dilated" if any(dilated) else "local"
        options.append(({"pattern": name}, {n: [name] * n for n in stacks}))
    if per_layer:
        names = [
            "full" if kind == "full" else "dilated" if max(d) > 1 else "local" for kind, _, d in stacks[min(stacks)]
        ]
        options.append(({"layer_patterns": names}, {min(stacks): names}))
    for spelling, patterns in options:
        windows = _windows(cfg, stacks, per_layer)
        rows = {n: [layer[2] if p == "dilated" else None for p, layer in zip(patterns[n], stacks[n])] for n in stacks}
        if any(
            layer[2] != (1,) * cfg.n_heads for n in stacks for p, layer in zip(patterns[n], stacks[n]) if p != "dilated"
        ):
            continue  # a layer this spelling calls local has dilated heads
        dilations = (
            _dilations(cfg, rows, per_layer) if any(p == "dilated" for ps in patterns.values() for p in ps) else {}
        )
        if windows is not None and dilations is not None:
            return {**spelling, **windows, **dilations}
    return None


def _text(spelling: dict[str, Any]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in spelling.items())


def check(cfg) -> None:
    """Refuse ``cfg`` when its attention geometry has a simpler spelling (the module's docstring)."""
    if getattr(_checking, "active", False):
        return
    stacks = geometry(cfg)
    if stacks is None:
        return
    best = canonical(cfg, stacks)
    mine = given(cfg)
    if best is None or best == mine:
        return
    _checking.active = True
    try:  # confirm: the simpler spelling resolves to the same geometry (never refuse on a guess)
        other = dataclasses.replace(cfg, **{**GEOMETRY_DEFAULTS, **best})
        same = geometry(other) == stacks
    except ConfigError:
        same = False
    finally:
        _checking.active = False
    if same:
        # the key at fault: the first one written that the simpler spelling writes otherwise or not at all
        differ = [k for k in mine if best.get(k, GEOMETRY_DEFAULTS[k]) != mine[k]]
        field = differ[0] if differ else next(iter(mine))
        raise ConfigError(
            f"{_text(mine)} resolves to the same attention as {_text(best)}: write that (two spellings of one model "
            "would be two variants, and two cell ids, of one model)",
            field=field,
            value=mine[field],
            fix=f"write {_text(best)}",
            related=[k for k in {**mine, **best} if k != field],
        )
