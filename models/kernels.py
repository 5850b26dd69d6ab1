"""Attention kernels: scores + mask -> probabilities -> weighted values, for every pattern.

Notation: B batch, H heads, T query length, S key length, D head dim, W window, d dilation, N number of
tiles, b tile size, K keys per tile ((ceil(W / b) + 1) b causal, (2 ceil(W / b) + 1) b not).

A score object (``models.attention.Score``) is duck-typed here: ``dot_like``, ``scale`` and, when not
dot-like, ``scores(q, k)``. Position biases are functions of signed distances (query - key) that return
(H, ...) float tensors (``Bias``).

  ``full_attention``     every key, with an optional band mask ``allowed``; no mask at all is passed where
                         none is needed (flash kernels on GPU)
  ``local_attention``    keys at distance |i - j| <= W, in O(T * W): queries cut into tiles of b = W (at most
                         64) positions; each tile attends to its own tile and its neighbours (the previous
                         ones only when causal), taken as overlapping views of one padded copy of K and V,
                         never copied per tile; a small per-tile mask built from absolute positions enforces
                         the exact window, causality, padding and the sequence end; all tiles go through one
                         batched call. When the tiled neighbourhood would cover most of the sequence
                         (K > 0.6 T) or the sequence is short (T <= 64), it is full attention with a band
                         mask (cheaper there, and one kernel).
  ``dilated_attention``  keys at distances that are multiples of d up to W*d: the sequence is split into d
                         interleaved residue classes and each runs local attention, in O(T * W).
  ``additive_scores``    v_h . tanh(q + k) in blocks of at most ``budget`` elements, forward and backward.
  ``global_columns``, ``global_rows``  Longformer's global attention (section 3.1) for the windowed kernels: the G
                         global keys become G extra columns of every tile, seen by every query with no position bias
                         (``window_padding`` takes them out of the windows, so each key counts once, as Hugging
                         Face's LongformerSelfAttention does), and the G global queries attend to every key (with
                         the global projections Q_g, K_g, V_g, no position bias) in one small dense call whose rows
                         replace theirs: O(T * (W + G)), one softmax per query, no merging of partial softmaxes.

A query whose every key is masked (a padding query whose window holds only padding) attends uniformly
instead of producing NaN; its output is meaningless and must be ignored by the caller, but it stays finite
so that gradients do not turn into NaN.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F

Bias = Callable[[torch.Tensor], torch.Tensor]  # signed distances (...) -> (H, ...) float bias

# ---------------------------------------------------------------------------------------------------
# Additive scores in bounded memory


def additive_blocks(A: int, H: int, T: int, S: int, E: int, budget: int) -> Iterator[tuple[slice, ...]]:
    """Blocks (a, h, t, s) of the (A, H, T, S, E) intermediate, each of at most max(budget, E) elements, as
    large as possible: the key axis first, then queries, heads and the batch (one block when all fits)."""
    pairs = max(1, budget // E)  # (query, key) pairs per block
    s = min(S, pairs)
    t = min(T, pairs // s) if s == S else 1
    h = min(H, pairs // (s * t)) if t == T else 1
    a = min(A, pairs // (s * t * h)) if h == H else 1
    for a0 in range(0, A, a):
        for h0 in range(0, H, h):
            for t0 in range(0, T, t):
                for s0 in range(0, S, s):
                    yield slice(a0, a0 + a), slice(h0, h0 + h), slice(t0, t0 + t), slice(s0, s0 + s)


def _tanh_of_sum(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """tanh(q + k) broadcast, written into a new contiguous tensor whatever the strides of q and k (a sum follows its
    inputs' layout: a transposed q made it non-contiguous, and the views below of it failed)."""
    x = q.new_empty(torch.broadcast_shapes(q.shape, k.shape))
    return torch.add(q, k, out=x).tanh_()


class _AdditiveScores(torch.autograd.Function):
    """scores[a, h, t, s] = sum_e v[h, e] * tanh(q[a, h, t, e] + k[a, h, s, e]).

    q (A, H, T, E), k (A, H, S, E) (any strides: overlapping tiles of keys are read in place), v (H, E).
    Forward and backward walk over ``additive_blocks`` and recompute tanh; each block's (a, h, t, s, E)
    tensor is the only intermediate of that size alive at any time (everything else is computed in place
    or reduced by a matrix product), so ``budget`` bounds the extra memory.
    """

    @staticmethod
    def forward(ctx, q, k, v, budget):
        A, H, T, E = q.shape
        S = k.shape[2]
        out = q.new_empty(A, H, T, S)
        for a, h, t, s in additive_blocks(A, H, T, S, E, budget):
            x = _tanh_of_sum(q[a, h, t, None, :], k[a, h, None, s, :])  # (a, h, t, s, E)
            out[a, h, t, s] = torch.matmul(x, v[h].reshape(1, x.shape[1], 1, E, 1)).squeeze(-1)
            del x  # before the next block is allocated
        ctx.save_for_backward(q, k, v)
        ctx.budget = budget
        return out

    @staticmethod
    def backward(ctx, grad):  # grad (A, H, T, S)
        q, k, v = ctx.saved_tensors
        A, H, T, E = q.shape
        S = k.shape[2]
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        for a, h, t, s in additive_blocks(A, H, T, S, E, ctx.budget):
            x = _tanh_of_sum(q[a, h, t, None, :], k[a, h, None, s, :])  # (a, h, t, s, E)
            na, nh, nt, ns = x.shape[:4]
            g = grad[a, h, t, s]  # (a, h, t, s)
            # dv[h] = sum over a, t, s of g * tanh(.): a product, no second (a, h, t, s, E) tensor
            dv[h] += torch.matmul(g.reshape(na, nh, 1, nt * ns), x.view(na, nh, nt * ns, E)).sum(0).squeeze(1)
            x.mul_(x).neg_().add_(1.0).mul_(g[..., None]).mul_(v[h].reshape(1, nh, 1, 1, E))  # dL/d(q + k), in place
            dq[a, h, t] += x.sum(3)
            dk[a, h, s] += x.sum(2)
            del x  # before the next block is allocated
        return dq, dk, dv, None


def additive_scores(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, budget: int = 1 << 20) -> torch.Tensor:
    """v_h . tanh(q_t + k_s) for q (B, H, ..., T, E), k (B, H, ..., S, E), v (H, E) -> (B, H, ..., T, S)."""
    lead = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    T, S, E = q.shape[-2], k.shape[-2], q.shape[-1]
    q, k = q.expand(*lead, T, E), k.expand(*lead, S, E)  # views
    if len(lead) == 2:
        return _AdditiveScores.apply(q, k, v.to(q.dtype), budget)
    # other layouts: heads to dim 1, everything else flattened into dim 0 (copies)
    H = lead[1]
    qf = q.movedim(1, 0).reshape(H, -1, T, E).transpose(0, 1)
    kf = k.movedim(1, 0).reshape(H, -1, S, E).transpose(0, 1)
    out = _AdditiveScores.apply(qf, kf, v.to(q.dtype), budget)  # (A, H, T, S)
    return out.transpose(0, 1).reshape(H, lead[0], *lead[2:], T, S).movedim(0, 1)


# ---------------------------------------------------------------------------------------------------
# The kernel: scores + mask -> probabilities -> weighted values


def _unstarve(allowed: torch.Tensor) -> torch.Tensor:
    """Rows with no allowed key attend to every key instead (finite, ignored by callers)."""
    return allowed | ~allowed.any(dim=-1, keepdim=True)


def attend(q, k, v, score, mask=None, bias=None, causal: bool = False, dropout_p: float = 0.0):
    """Attention of prepared q (..., T, D) over k, v (..., S, D).

    mask: bool, True where a key may be seen, broadcastable to (..., T, S); bias: float, added to the
    scores (ALiBi); causal: the square causal rule (only without mask and bias: the fast path).
    """
    if mask is not None and bias is not None:
        bias = bias.masked_fill(~mask, float("-inf"))
        mask = None
    extra = bias if bias is not None else mask
    if not score.dot_like and dropout_p == 0.0:
        if causal and extra is None:
            T, S = q.shape[-2], k.shape[-2]
            extra = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(S - T)
            causal = False
        fused = getattr(score, "fused_attention", None)  # None (or returning None): no fused kernel here
        out = None if fused is None else fused(q, k, v, extra)
        if out is not None:
            return out
    if score.dot_like:
        if causal and extra is None and q.shape[-2] != k.shape[-2]:  # SDPA's is_causal aligns the queries to the
            T, S = q.shape[-2], k.shape[-2]  # first keys; ours are the last ones (a chunk after a cache)
            extra, causal = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(S - T), False
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=extra, dropout_p=dropout_p, is_causal=causal and extra is None, scale=score.scale
        )
    s = score.scores(q, k)  # (..., T, S)
    if causal and extra is None:
        T, S = s.shape[-2:]
        extra = torch.ones(T, S, dtype=torch.bool, device=s.device).tril(S - T)
    if extra is not None:
        s = s + extra if extra.dtype != torch.bool else s.masked_fill(~extra, float("-inf"))
    p = torch.softmax(s, dim=-1)
    if dropout_p > 0.0:
        p = F.dropout(p, dropout_p)
    return p @ v


def full_attention(
    q,
    k,
    v,
    score,
    *,
    causal=False,
    key_padding=None,
    bias: Bias | None = None,
    allowed=None,
    dropout_p=0.0,
    columns: Columns | None = None,
):
    """q (B, H, T, D), k/v (B, H, S, D), queries aligned to the last keys; key_padding (B, S) True at
    padding; bias: ALiBi-like function of signed distances; allowed: (H or 1, T, S) band mask of a pattern;
    columns: extra keys every query may see (``global_columns``). No mask at all is passed when none is needed."""
    T, S = q.shape[-2], k.shape[-2]
    if key_padding is None and bias is None and allowed is None and columns is None:
        return attend(q, k, v, score, causal=causal, dropout_p=dropout_p)
    mask = allowed
    if causal:
        tri = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(S - T)
        mask = tri if mask is None else mask & tri
    if key_padding is not None:
        kp = ~key_padding[:, None, None, :]  # (B, 1, 1, S)
        mask = kp if mask is None else mask & kp
    if mask is not None and key_padding is not None:
        mask = _unstarve(mask)
    b = None
    if bias is not None:
        dist = torch.arange(S - T, S, device=q.device)[:, None] - torch.arange(S, device=q.device)[None, :]
        b = bias(dist).to(q.dtype)  # (H, T, S)
    if columns is not None:
        return _with_columns(q, k, v, score, mask, b, columns, dropout_p)
    return attend(q, k, v, score, mask=mask, bias=b, dropout_p=dropout_p)


def tile_size(window: int, length: int) -> int:
    """Queries per tile: the window (at most 64: larger windows span several tiles, which wastes fewer keys
    than one tile per window), never more than the sequence."""
    return max(1, min(window, 64, length))


def band(T: int, window: int, device=None) -> torch.Tensor:
    """(1, T, T) True where |i - j| <= window."""
    dist = torch.arange(T, device=device)[:, None] - torch.arange(T, device=device)[None, :]
    return (dist.abs() <= window)[None]


class _Neighbourhoods(torch.autograd.Function):
    """(H, L, D) laid-out keys -> (N', H, K, D) overlapping windows of K positions every b positions, a view
    (no copy). Its backward adds the K / b tile-sized slices of the gradient back in place, which is several
    times faster on CPU than the generic backward of ``unfold``."""

    @staticmethod
    def forward(ctx, buf, K: int, b: int):
        ctx.shape, ctx.K, ctx.b = buf.shape, K, b
        return buf.unfold(1, K, b).permute(1, 0, 3, 2)

    @staticmethod
    def backward(ctx, grad):  # (N', H, K, D)
        H, L, D = ctx.shape
        K, b = ctx.K, ctx.b
        n = grad.shape[0]
        out = grad.new_zeros(H, L, D)
        g = grad.reshape(n, H, K // b, b, D)
        for i in range(K // b):
            out[:, i * b : i * b + n * b].view(H, n, b, D).add_(g[:, :, i].transpose(0, 1))
        return out, None, None


Columns = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
"""Extra key columns of every query: keys, values (B, H, G, D) and an additive (B, H or 1, T, G) term (-inf where
a query must not see the column): Longformer's global keys (``global_columns``)."""


def global_columns(q, k, v, idx: torch.Tensor, key_padding=None) -> Columns:
    """The global keys ``idx`` (G,) as extra columns of every query (Longformer section 3.1: every query attends to
    them), with no position bias: a global key is read alike from any distance. The windows must not hold them too
    (``window_padding``: each key counts once); padding keys stay masked."""
    add = torch.zeros(q.shape[0], 1, q.shape[-2], idx.numel(), dtype=q.dtype, device=q.device)  # (B, 1, T, G)
    if key_padding is not None:
        add = add.masked_fill(key_padding[:, idx][:, None, None, :], float("-inf"))
    return k[:, :, idx], v[:, :, idx], add


def window_padding(q, idx: torch.Tensor, key_padding=None) -> torch.Tensor:
    """(B, T) True at the keys the windows must not read: padding, and the global keys ``idx`` (G,), which every
    query reads as a column of its own instead (``global_columns``)."""
    B, T = q.shape[0], q.shape[-2]
    pad = torch.zeros(B, T, dtype=torch.bool, device=q.device) if key_padding is None else key_padding.clone()
    pad[:, idx] = True
    return pad


def global_rows(out, q_g, k_g, v_g, score, idx: torch.Tensor, key_padding=None, dropout_p=0.0):
    """``out`` (B, H, T, Dv) with the rows of the global queries ``idx`` (G,) replaced by their attention over every
    key: q_g (B, H, G, D) the global queries, k_g, v_g (B, H, T, D) every key and value, through the global
    projections (Longformer's Q_g, K_g, V_g; the window's under ``global_projections: shared``), with no position
    bias; padding keys stay masked."""
    mask = None if key_padding is None else _unstarve(~key_padding[:, None, None, :])  # (B, 1, 1, T)
    rows = attend(q_g, k_g, v_g, score, mask=mask, dropout_p=dropout_p)  # (B, H, G, Dv)
    return out.index_copy(2, idx, rows.to(out.dtype))


def _with_columns(q, k, v, score, mask, bias, columns: Columns, dropout_p: float = 0.0):
    """Attention over k, v (S keys; ``mask`` bool broadcastable to (B, H, T, S) or None, ``bias`` (H, T, S) or None)
    and the extra ``columns``, in one softmax: the masks and biases become one additive term."""
    k_g, v_g, add = columns
    B, T, S = q.shape[0], q.shape[-2], k.shape[-2]
    win = q.new_zeros(1, 1, T, S) if bias is None else bias[None].to(q.dtype)
    if mask is not None:
        win = torch.where(mask, win, torch.tensor(float("-inf"), dtype=q.dtype, device=q.device))
    H = max(win.shape[1], add.shape[1])
    both = torch.cat([win.expand(B, H, T, S), add.expand(B, H, T, add.shape[-1])], dim=-1)
    return attend(q, torch.cat([k, k_g], 2), torch.cat([v, v_g], 2), score, bias=both, dropout_p=dropout_p)


def _tiled_columns(columns: Columns, N: int, b: int) -> Columns:
    """Extra columns in tile layout: keys, values (B * N, H, G, D) and the term (B * N, H', b, G)."""
    k_g, v_g, add = columns
    B, H, G, _ = k_g.shape
    per_tile = lambda t: t[:, None].expand(B, N, *t.shape[1:]).reshape(B * N, *t.shape[1:])  # noqa: E731
    add = F.pad(add, (0, 0, 0, N * b - add.shape[2]))  # queries past the end: finite, ignored
    add = add.reshape(B, add.shape[1], N, b, G).transpose(1, 2).reshape(B * N, add.shape[1], b, G)
    return per_tile(k_g), per_tile(v_g), add


def _tile_mask(B: int, T: int, b: int, K: int, back: int, window: int, causal: bool, key_padding, dev):
    """(allowed (B * N, 1, b, K) bool, rel (b, K) query - key distances) of ``local_attention``'s tiles. The window
    rule is the same in every tile; only which keys exist (and padding) differ per tile."""
    N = -(-T // b)
    R = N * b
    offset = torch.arange(K, device=dev) - back * b  # key position relative to the tile's first query
    rel = torch.arange(b, device=dev)[:, None] - offset[None, :]  # (b, K) query - key distance
    allowed = rel.abs() <= window
    if causal:
        allowed &= rel >= 0
    kpos = torch.arange(0, R, b, device=dev)[:, None] + offset  # (N, K)
    allowed = allowed & ((kpos >= 0) & (kpos < T))[:, None, :]  # (N, b, K)
    if key_padding is not None:  # laid out like the keys (``local_attention``'s buffer), then cut into tiles
        ahead = K // b - back - 1
        kp = key_padding.new_ones(back * b + B * R + ahead * b)
        kp[back * b : back * b + B * R].view(B, R)[:, :T] = key_padding
        kp = kp.unfold(0, K, b)  # (B * N, K)
        allowed = allowed.repeat(B, 1, 1) & ~kp[:, None, :]  # (B * N, b, K)
    else:
        allowed = allowed.repeat(B, 1, 1)
    return _unstarve(allowed)[:, None], rel  # queries past the end stay finite


def _key_tiles(t, b: int, back: int, ahead: int):
    """(B, H, T, D) keys or values -> (B * N, H, K, D): each tile's neighbourhood (``back`` tiles before it, its own,
    ``ahead`` after), an overlapping view of one padded head-major copy (rows of N * b positions, zeros between)."""
    B, H, T, E = t.shape
    R = -(-T // b) * b  # padded row length
    L = back * b + B * R + ahead * b
    buf = t.new_empty(H, L, E)
    rows = buf[:, back * b : back * b + B * R].view(H, B, R, E)
    rows[:, :, :T] = t.transpose(0, 1)
    rows[:, :, T:] = 0  # padding only: masked keys must still be finite
    buf[:, : back * b] = 0
    buf[:, back * b + B * R :] = 0
    return _Neighbourhoods.apply(buf, (back + 1 + ahead) * b, b)


def local_attention(
    q,
    k,
    v,
    score,
    *,
    window,
    causal=False,
    key_padding=None,
    bias: Bias | None = None,
    dropout_p=0.0,
    block=None,
    columns: Columns | None = None,
):
    """Exact sliding-window self-attention in O(T * W): q, k, v (B, H, T, D), keys at |i - j| <= window.

    Tiles of b queries see the ceil(W / b) tiles before them (and after them unless causal) plus their own.
    Keys and values are laid out once, head-major, with every row padded to N * b positions, and each tile's
    neighbourhood is an overlapping view of that layout (``unfold``): no copy per neighbouring tile. A
    neighbourhood that crosses into the next row only reads keys the position mask excludes. ``block``
    forces tiles of that size (no fall-back to full attention). ``columns``: extra keys (Longformer's global
    keys) added to every tile, masked per query as their term says.
    """
    B, H, T, D = q.shape
    if window >= T - 1:  # the window covers the whole sequence: this is full attention
        kw = dict(causal=causal, key_padding=key_padding, bias=bias, dropout_p=dropout_p, columns=columns)
        return full_attention(q, k, v, score, **kw)
    b = block or tile_size(window, T)
    N = -(-T // b)
    back = -(-window // b)  # neighbouring tiles on each side that hold keys within the window
    ahead = 0 if causal else back
    span = back + 1 + ahead  # tiles of keys per tile of queries
    K = span * b
    if block is None and (T <= 64 or 5 * K > 3 * T):
        # the tiles would see most keys anyway, or are too small to pay for themselves (measured on CPU:
        # docs/components.md): full attention with a band mask is cheaper, and one kernel
        return full_attention(
            q,
            k,
            v,
            score,
            causal=causal,
            key_padding=key_padding,
            bias=bias,
            allowed=band(T, window, q.device),
            dropout_p=dropout_p,
            columns=columns,
        )
    R = N * b  # padded row length
    qt = F.pad(q, (0, 0, 0, R - T)).reshape(B, H, N, b, D).transpose(1, 2).reshape(B * N, H, b, D)
    kt, vt = _key_tiles(k, b, back, ahead), _key_tiles(v, b, back, ahead)

    allowed, rel = _tile_mask(B, T, b, K, back, window, causal, key_padding, q.device)
    b_ = bias(rel).to(q.dtype) if bias is not None else None  # (H, b, K)
    if columns is None:
        out = attend(qt, kt, vt, score, mask=allowed, bias=b_, dropout_p=dropout_p)  # (B * N, H, b, Dv)
    else:  # the global keys as G more columns of every tile (a copy of the tiles' keys: K + G per query)
        out = _with_columns(qt, kt, vt, score, allowed, b_, _tiled_columns(columns, N, b), dropout_p)
    Dv = out.shape[-1]
    return out.reshape(B, N, H, b, Dv).transpose(1, 2).reshape(B, H, R, Dv)[:, :, :T]


def dilated_attention(
    q,
    k,
    v,
    score,
    *,
    window,
    dilation,
    causal=False,
    key_padding=None,
    bias: Bias | None = None,
    dropout_p=0.0,
    block=None,
    columns: Columns | None = None,
):
    """Keys at distance <= window*dilation that are multiples of dilation: local attention on each of the
    ``dilation`` interleaved residue classes, in O(T * W). ``block`` forces tiles of that size; ``columns``: extra
    keys every class's queries may see (Longformer's global keys, from every class)."""
    B, H, T, D = q.shape
    d = dilation
    kw = dict(window=window, causal=causal, dropout_p=dropout_p, block=block)
    if d == 1:
        return local_attention(q, k, v, score, key_padding=key_padding, bias=bias, columns=columns, **kw)
    M = -(-T // d)
    extra = M * d - T
    if extra:
        q, k, v = (F.pad(t, (0, 0, 0, extra)) for t in (q, k, v))
        if key_padding is None:
            key_padding = torch.zeros(B, T, dtype=torch.bool, device=q.device)
        key_padding = F.pad(key_padding, (0, extra), value=True)

    def split(t):  # (B, H, M*d, D) -> (B*d, H, M, D): position m*d + r goes to class r, index m
        h, E = t.shape[1], t.shape[-1]
        return t.reshape(B, h, M, d, E).permute(0, 3, 1, 2, 4).reshape(B * d, h, M, E)  # any strides

    kp = None if key_padding is None else key_padding.reshape(B, M, d).transpose(1, 2).reshape(B * d, M)
    if columns is not None:  # every class sees the same global keys; their terms follow their queries
        k_g, v_g, add = columns
        add = split(F.pad(add.expand(B, -1, -1, -1), (0, 0, 0, M * d - T)))
        columns = (k_g.repeat_interleave(d, 0), v_g.repeat_interleave(d, 0), add)
    out = local_attention(
        split(q),
        split(k),
        split(v),
        score,
        key_padding=kp,
        bias=None if bias is None else (lambda dist: bias(dist * d)),  # distances within a class are in steps of d
        columns=columns,
        **kw,
    )  # (B*d, H, M, D)
    Dv = out.shape[-1]
    out = out.reshape(B, d, H, M, Dv).permute(0, 2, 3, 1, 4).reshape(B, H, M * d, Dv)
    return out[:, :, :T]
