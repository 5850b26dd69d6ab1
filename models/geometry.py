"""The attention geometry of one layer, apart from ``models.config``: the kernels' modules (``models.patterns``) need it,
and importing the config from there made a plugin imported while the config loads (a registry hook) find it half
made (a circular import). Imports nothing of ours."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LayerAttention:
    """The self-attention geometry of one layer: its pattern, its window, the dilation of each head and the
    positions with global attention (Longformer section 3.1: they see every key and every query sees them)."""

    pattern: str
    window: int | None
    dilations: tuple[int, ...]  # one per head; 1 is a plain window
    global_tokens: tuple[int, ...] = ()

    @property
    def reach(self) -> int | None:
        """The furthest key distance any head's window sees (None: unbounded). Global tokens reach further; they
        are refused in causal layers, the only ones whose cache keeps reach + 1 keys."""
        return None if self.window is None else self.window * max(self.dilations)
