"""Local and dilated attention through torch's FlexAttention (the CUDA path of the windowed patterns).

On CUDA, ``LocalPattern`` and ``DilatedPattern`` hand their dot-like scores (dot, dot_unscaled, general,
cosine: each is ``scale * q.k`` of prepared q and k) to ``window_attention``: one compiled
``flex_attention`` call per layer, whatever the heads' dilations, with

- a ``BlockMask`` of 128 x 128 blocks for the window, the dilation of every head (``mask_mod`` reads it per
  head), the causal rule and key padding. Its block structure depends on the block offset only, so it is
  built from one tile per offset (``block_structure``) and cached per (length, window, dilations, causal,
  device); ``create_block_mask`` would evaluate the mask over every (query, key) pair unless compiled (4 G
  pairs at 64k tokens). Key padding changes with every batch: it is read by the ``mask_mod`` (a closure,
  which FlexAttention does not recompile for), on the cached structure whose blocks are then all partial
  (a "full" block skips the ``mask_mod``).
- ALiBi as a ``score_mod`` that computes the bias from two slopes per head (past and future keys); a bias
  that is not linear in the distance stays on the tiled kernels.
- Longformer's global tokens (section 3.1): the ``mask_mod`` allows their columns (every query reads a global
  key), the ``score_mod`` adds no bias there (a global key is read alike from any distance), and the block
  structure lists their key blocks for every query block (partial blocks: O(N * (window blocks + G)) blocks, so
  the window's cost stays). Their rows use the global projections (Q_g of the global tokens, K_g and V_g of every
  position), which one call with the window's q, k, v cannot read: ``models.patterns`` computes them apart, a
  (G, T) dense call whose rows replace these.

Where a window saves nothing (it covers the sequence) the caller runs full attention without a mask
(flash kernels). Dropout on the attention probabilities, additive scores, float64 and head sizes that are
not a power of two from 16 up stay on the tiled kernels of ``models.kernels``, which are also the CPU path:
FlexAttention has no backward on CPU (torch 2.13).

A query that sees no key (a padding query whose window holds only padding) gets a zero output here and a
uniform average on the tiled path: both finite, both meaningless, ignored by callers.

``ABLATE_FLEX`` (environment) or ``mode(...)`` choose: ``auto`` (CUDA, compiled: the default), ``off``
(tiled kernels everywhere), ``eager`` (any device, flex_attention uncompiled: forward only, for tests on
CPU), ``compiled`` (any device, compiled: the CPU build compiles the forward with its C++ backend).
"""

from __future__ import annotations

import contextlib
import copy
import os
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch

BLOCK = 128  # FlexAttention's default sparse block (and kernel tile) size
MODES = ("auto", "off", "eager", "compiled")

_mode = os.environ.get("ABLATE_FLEX", "auto")
_compiled: dict[str, Callable] = {}  # device type -> compiled flex_attention
_api: dict[str, Any] = {}  # FlexAttention, imported when first needed (it loads torch's compiler: ~1.5 s)


def api() -> dict[str, Any]:
    """{"flex_attention", "BlockMask"}, or {} where this torch has no FlexAttention (before 2.5)."""
    if "checked" not in _api:
        _api["checked"] = True
        try:
            from torch.nn.attention.flex_attention import BlockMask, flex_attention
        except ImportError:  # pragma: no cover - older torch: the tiled kernels serve every device
            return _api
        _api.update(flex_attention=flex_attention, BlockMask=BlockMask, block_mask=torch.compiler.disable(_block_mask))
    return _api


_cache: dict = {}  # (T, window, dilations, causal, padded, device, global tokens) -> BlockMask
_CACHE_SIZE = 64


def current_mode() -> str:
    if _mode not in MODES:
        raise ValueError(f"ABLATE_FLEX={_mode!r} is not a valid choice; valid: {', '.join(MODES)}")
    return _mode


@contextlib.contextmanager
def mode(value: str) -> Iterator[None]:
    """Use FlexAttention ``auto`` (CUDA only), ``off``, ``eager`` or ``compiled`` (any device) inside the block."""
    global _mode
    if value not in MODES:
        raise ValueError(f"mode={value!r} is not a valid choice; valid: {', '.join(MODES)}")
    old, _mode = _mode, value
    try:
        yield
    finally:
        _mode = old


def _power_of_two(n: int) -> bool:
    return n >= 16 and n & (n - 1) == 0


def linear_slopes(bias: Callable | None) -> Callable | None:
    """``slopes()`` of the position scheme whose ``bias`` this is, where the bias is linear in the distance per
    head (ALiBi: ``models.positions.ALiBi``); None otherwise."""
    return getattr(getattr(bias, "__self__", None), "slopes", None)


def usable(
    q: torch.Tensor, v: torch.Tensor, score, *, window: int, dilations, dropout_p: float = 0.0, bias=None
) -> bool:
    """Whether this windowed self-attention runs through FlexAttention (else the tiled kernels). A bias must
    be linear in the distance (ALiBi), which the kernel computes from two slopes per head."""
    m = current_mode()
    if m == "off" or not score.dot_like or dropout_p > 0.0 or (bias is not None and linear_slopes(bias) is None):
        return False
    if window >= q.shape[-2] - 1 and max(dilations) == 1:  # the window covers the sequence: full attention
        return False
    if m == "auto" and not (
        q.is_cuda
        and q.dtype in (torch.float32, torch.bfloat16, torch.float16)
        and _power_of_two(q.shape[-1])
        and _power_of_two(v.shape[-1])
    ):
        return False
    return bool(api())


# ---------------------------------------------------------------------------------------------------
# The block structure


def _allowed(dist: torch.Tensor, window: int, dilations: torch.Tensor, causal: bool) -> torch.Tensor:
    """(H', ...) True where a head of each dilation sees signed distance dist = query - key."""
    d = dilations.view(-1, *([1] * dist.dim()))
    a = dist.abs()
    ok = (a <= window * d) & (a % d == 0)
    return ok & (dist >= 0) if causal else ok


def block_structure(
    T: int,
    window: int,
    dilations: tuple[int, ...],
    causal: bool,
    block: int = BLOCK,
    split_full: bool = True,
    global_tokens: tuple[int, ...] = (),
):
    """The blocks of a (T, T) window mask: (kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices),
    each (1, H', N, ...) int32 with N = ceil(T / block) and H' = 1 when every head has the same dilation, else
    one row per head. A block is listed when some (query, key) pair in it is allowed, as "full" when every
    pair is (blocks cut by the sequence end never are), in increasing key order; ``split_full=False`` lists
    every block as partial (the last two are None).

    Written here because the structure depends on the block offset only (plus the ragged last block): a tile
    per offset gives it exactly, where ``create_block_mask`` evaluates every pair. ``global_tokens`` add the
    blocks of their columns (``_with_globals``)."""
    rows = dilations if len(set(dilations)) > 1 else dilations[:1]
    dil = torch.tensor(rows)
    H = len(rows)
    N = -(-T // block)
    reach = window * max(rows)
    m = -(-reach // block) + 1  # block offsets that can hold an allowed pair: |i - j| <= m
    offsets = torch.arange(-m, m + 1)
    a = torch.arange(block)
    rel = a[:, None] - a[None, :]  # (block, block) query - key within a tile
    tile = _allowed(offsets.view(-1, 1, 1) * block + rel, window, dil, causal)  # (H, 2m+1, block, block)
    some, every = tile.flatten(2).any(-1), tile.flatten(2).all(-1)  # (H, 2m+1)

    i = torch.arange(N).view(N, 1)
    j = i - offsets.view(1, -1)  # (N, 2m+1) key block of each offset
    inside = (j >= 0) & (j < N)
    some = some[:, None, :] & inside  # (H, N, 2m+1)
    every = every[:, None, :] & inside
    if T % block:  # the last query block and the last key block are cut: recompute those tiles exactly
        _cut_tiles(T, block, j, inside, some, every, lambda dist: _allowed(dist, window, dil, causal))
    partial = some & ~every
    if global_tokens:
        return _with_globals(T, block, j, inside, partial, every, global_tokens, causal, split_full)

    def pack(chosen: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # key blocks in increasing order: offsets run from -m (ahead) to m (behind), so reverse them
        chosen = chosen.flip(-1)
        cols = j.flip(-1).expand(H, N, 2 * m + 1)
        count = chosen.sum(-1)
        order = torch.argsort((~chosen).to(torch.int8), dim=-1, stable=True)  # chosen first, in key order
        idx = torch.zeros(H, N, N, dtype=torch.int32)
        width = min(N, 2 * m + 1)
        idx[..., :width] = torch.gather(cols, -1, order)[..., :width].clamp(0, N - 1).to(torch.int32)
        return count.to(torch.int32)[None], idx[None]

    if not split_full:
        return (*pack(some), None, None)
    return (*pack(partial), *pack(every))


def _cut_tiles(T: int, block: int, j, inside, some, every, allowed) -> None:
    """``some`` and ``every`` (H, N, offsets) of the tiles the sequence end cuts (the last query block's and the
    last key block's), recomputed in place from ``allowed(dist)`` over their real pairs; a cut block is never full."""
    N = j.shape[0]
    n = T - (N - 1) * block
    for row in range(N):
        for c in range(j.shape[1]):
            col = int(j[row, c])
            if not inside[row, c] or (row != N - 1 and col != N - 1):
                continue
            qs = torch.arange(n if row == N - 1 else block) + row * block
            ks = torch.arange(n if col == N - 1 else block) + col * block
            some[:, row, c] = allowed(qs[:, None] - ks[None, :]).flatten(1).any(-1)
            every[:, row, c] = False


def _with_globals(T, block, j, inside, partial, every, global_tokens, causal: bool, split_full: bool):
    """The block structure of ``block_structure`` (``partial``, ``every``: (H, N, offsets) at key blocks ``j``)
    with the columns of the global tokens: the key blocks holding one, for every query block (the past ones only
    when causal), as partial blocks unless full. Their rows are computed apart (``models.patterns``)."""
    H, N = partial.shape[:2]

    def dense(chosen: torch.Tensor) -> torch.Tensor:  # (H, N, offsets) -> (H, N, N) by key block
        out = torch.zeros(H, N, N + 1, dtype=torch.bool)
        out.scatter_(-1, torch.where(inside, j, N).expand(H, N, -1), chosen & inside)
        return out[..., :N]

    full, part = dense(every), dense(partial)
    g = torch.tensor(sorted({t // block for t in global_tokens if t < T}), dtype=torch.long)
    extra = torch.zeros(N, N, dtype=torch.bool)
    extra[:, g] = True
    if causal:
        extra &= torch.ones(N, N, dtype=torch.bool).tril()
    part = part | (extra & ~full)

    def pack(chosen: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        order = torch.argsort((~chosen).to(torch.int8), dim=-1, stable=True)  # chosen first, in key order
        return chosen.sum(-1).to(torch.int32)[None], order.to(torch.int32)[None]

    if not split_full:
        return (*pack(part | full), None, None)
    return (*pack(part), *pack(full))


def _mask_mod(
    window: torch.Tensor,
    dilations: torch.Tensor | None,
    causal: bool,
    padding: torch.Tensor | None,
    is_global: torch.Tensor | None = None,
):
    """FlexAttention's mask_mod: the window (a 0-d tensor, so that a compiled kernel serves every window),
    each head's dilation (``dilations`` (H,), None: all 1), the columns of global tokens (``is_global`` (T,)
    bool, None: none; their rows are computed apart), the causal rule and key padding (B, S) True at padding."""

    def mod(b, h, q_idx, kv_idx):
        dist = q_idx - kv_idx
        if dilations is None:
            ok = (dist <= window) & (dist >= -window)
        else:
            d = dilations[h]
            a = dist.abs()
            ok = (a <= window * d) & (a % d == 0)
        if is_global is not None:
            ok = ok | is_global[kv_idx]
        if causal:
            ok = ok & (dist >= 0)
        if padding is not None:
            ok = ok & ~padding[b, kv_idx]
        return ok

    return mod


def block_mask(
    T: int,
    window: int,
    dilations: tuple[int, ...],
    causal: bool,
    device: torch.device,
    key_padding: torch.Tensor | None = None,
    global_tokens: tuple[int, ...] = (),
):
    """The cached ``BlockMask`` of a window (with key padding: a copy whose mask_mod reads it). Not traced
    by torch.compile (a compiled model calls it as Python)."""
    return api()["block_mask"](T, window, dilations, causal, device, key_padding, global_tokens)


def _block_mask(T, window, dilations, causal, device, key_padding, global_tokens=()):
    padded = key_padding is not None
    key = (T, window, dilations, causal, padded, str(device), global_tokens)
    mask = _cache.get(key)
    if mask is None:
        # with padding every listed block is partial, so that the mask_mod (and the padding) applies in all
        kv_num, kv_idx, full_num, full_idx = block_structure(
            T, window, dilations, causal, split_full=not padded, global_tokens=global_tokens
        )
        per_head = len(set(dilations)) > 1
        dil = torch.tensor(dilations, device=device) if per_head or dilations[0] != 1 else None
        is_global = None
        if global_tokens:
            is_global = torch.zeros(T, dtype=torch.bool, device=device)
            is_global[[t for t in global_tokens if t < T]] = True
        to = lambda t: None if t is None else t.to(device)
        mask = api()["BlockMask"].from_kv_blocks(
            to(kv_num),
            to(kv_idx),
            to(full_num),
            to(full_idx),
            BLOCK_SIZE=BLOCK,
            mask_mod=_mask_mod(torch.tensor(window, device=device), dil, causal, None, is_global),
            seq_lengths=(T, T),
        )
        mask.ablate_geometry = (torch.tensor(window, device=device), dil, is_global)  # for the padded copies
        if len(_cache) >= _CACHE_SIZE:
            _cache.pop(next(iter(_cache)))
        _cache[key] = mask
    if not padded:
        return mask
    out = copy.copy(mask)
    window_, dil, is_global = mask.ablate_geometry
    out.mask_mod = _mask_mod(window_, dil, causal, key_padding, is_global)
    return out


# ---------------------------------------------------------------------------------------------------
# The call


def _linear_bias_mod(past: torch.Tensor, future: torch.Tensor, is_global: torch.Tensor | None = None):
    """score_mod adding -past[h] * d for distances d = q - k >= 0 and future[h] * d below (ALiBi): two loads per
    head, no table. A gather from a table of distances made the H100's kernel for bf16 and heads of 64 need
    240 KB of shared memory, more than the 227 KB there are ("No valid triton configs", torch 2.11).
    ``is_global`` (T,) bool: the global tokens' columns, which take no bias (Longformer's global attention)."""

    if is_global is None:

        def mod(score, b, h, q_idx, kv_idx):
            d = (q_idx - kv_idx).to(past.dtype)
            return score + torch.where(d >= 0, -past[h] * d, future[h] * d)

        return mod

    def global_mod(score, b, h, q_idx, kv_idx):
        d = (q_idx - kv_idx).to(past.dtype)
        return torch.where(is_global[kv_idx], score, score + torch.where(d >= 0, -past[h] * d, future[h] * d))

    return global_mod


# Compilations of flex_attention one process may hold. Every distinct call compiles its own kernel (a scale, a
# bias or none, per-head dilations or none, causal, key padding, then dynamic shapes), and torch counts them per
# function for the whole process, whoever compiled it (a compiled model, a benchmark's own flex_attention).
# Past torch's default of 8 it silently runs flex_attention uncompiled: the full (T, T) scores in memory. On an
# H100 that made a dilated window about 45 times slower, with about 900 times the memory, at 4k tokens, and ran
# out of memory at 16k; a trial worker that trains several cells in turn would meet it too.
RECOMPILES = 64


def _flex(device: torch.device) -> Callable:
    flex_attention = api()["flex_attention"]
    if torch.compiler.is_compiling():  # inside a compiled model: dynamo traces flex_attention itself
        return flex_attention
    kind = device.type
    if kind not in _compiled:
        from torch._dynamo import config as dynamo

        dynamo.recompile_limit = max(dynamo.recompile_limit, RECOMPILES)
        # CUDA: one kernel serves every length (dynamic after the first new shape). The CPU build's C++
        # template failed to compile dynamic shapes with key padding (torch 2.13): one kernel per shape there.
        _compiled[kind] = torch.compile(flex_attention, dynamic=None if kind == "cuda" else False)
    return _compiled[kind]


def compiled(device: torch.device | str) -> Callable:
    """The process's compiled ``flex_attention`` for a device's type, the one every windowed layer calls. Another
    caller (a benchmark's anchor) that compiles its own holds kernels of its own and counts against torch's limit
    of compilations per function: sharing this one shares both, as a trial worker training variants in turn does."""
    return _flex(torch.device(device))


def alibi_score_mod(
    bias: Callable, device: torch.device, dtype: torch.dtype, is_global: torch.Tensor | None = None
) -> Callable:
    """The score_mod of a bias linear in the distance (ALiBi's ``bias``, ``linear_slopes``): it loads two slopes per
    head, (H,) each, and no table (``_linear_bias_mod``); none at the global columns ``is_global`` (T,) bool."""
    return _linear_bias_mod(*(s.to(device, dtype) for s in linear_slopes(bias)()), is_global)


def window_attention(
    q,
    k,
    v,
    *,
    scale: float,
    window: int,
    dilations: tuple[int, ...],
    causal: bool = False,
    key_padding: torch.Tensor | None = None,
    bias: Callable[[torch.Tensor], torch.Tensor] | None = None,
    global_tokens: tuple[int, ...] = (),
) -> torch.Tensor:
    """Self-attention of prepared q, k, v (B, H, T, D) over keys at distances that are multiples of each
    head's dilation up to window x dilation (only the past when causal); key_padding (B, T) True at
    padding; bias: ALiBi's (a bound ``bias`` whose scheme has ``slopes()``), added to the scores but for the
    global columns; global_tokens: positions every query sees (Longformer section 3.1: the global columns; their
    own rows, which see every key through the global projections, are computed apart by the caller)."""
    T = q.shape[-2]
    dilations = tuple(int(d) for d in dilations)
    mask = block_mask(T, window, dilations, causal, q.device, key_padding, tuple(global_tokens))
    score_mod = None
    if bias is not None:  # linear in the distance (``usable`` sends no other bias here)
        dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
        score_mod = alibi_score_mod(bias, q.device, dtype, mask.ablate_geometry[2])
    if current_mode() == "eager":  # a test mode: torch's warning that it materialises the scores is expected
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
            return api()["flex_attention"](q, k, v, score_mod=score_mod, block_mask=mask, scale=scale)
    return _flex(q.device)(q, k, v, score_mod=score_mod, block_mask=mask, scale=scale)
