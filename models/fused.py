"""Additive (Bahdanau) attention with fused kernels: the CUDA path of ``score: additive``.

softmax_s(v_h . tanh(q_t + k_s) + bias) @ values, computed by query chunks: each chunk's (query, key) scores
come from one compiled kernel (tanh, product and sum over the head dimension fused: the (query, key,
dimension) tensor is never written to memory), then the mask, the bias, the softmax (its log-sum-exp kept
per query) and the product with the values. The backward recomputes each chunk's scores and probabilities
from the saved log-sum-exp (the flash-attention recurrence, Dao et al. 2022) and gets the gradients of q, k
and v_h from three more fused kernels. Memory: the inputs, the outputs, and a few (query, key) tiles of at
most ``chunk_elements`` elements each; the chunks are as large as that allows (on GPUs raise
``chunk_elements``, e.g. to 2^26: fewer, larger chunks mean fewer kernel launches).

Hand-written because no library does it: torch's fused attention kernels (SDPA, FlexAttention) take q.k
scores only, and a score_mod sees the score, never q and k.

``ABLATE_FUSED`` (environment) or ``mode(...)``: ``auto`` (CUDA, compiled: the default), ``off`` (the
blockwise kernels of ``models.kernels`` everywhere), ``eager`` (any device, uncompiled: the same arithmetic,
each chunk's (query, key, dimension) tensor materialised; for tests), ``compiled`` (any device).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator

import torch

MODES = ("auto", "off", "eager", "compiled")
_mode = os.environ.get("ABLATE_FUSED", "auto")
_compiled: dict[tuple[str, str], Callable] = {}


def current_mode() -> str:
    if _mode not in MODES:
        raise ValueError(f"ABLATE_FUSED={_mode!r} is not a valid choice; valid: {', '.join(MODES)}")
    return _mode


@contextlib.contextmanager
def mode(value: str) -> Iterator[None]:
    """Use the fused additive attention ``auto`` (CUDA only), ``off``, ``eager`` or ``compiled`` inside the block."""
    global _mode
    if value not in MODES:
        raise ValueError(f"mode={value!r} is not a valid choice; valid: {', '.join(MODES)}")
    old, _mode = _mode, value
    try:
        yield
    finally:
        _mode = old


def usable(q: torch.Tensor, dropout_p: float = 0.0, bias: torch.Tensor | None = None) -> bool:
    m = current_mode()
    if m == "off" or dropout_p > 0.0 or (bias is not None and bias.requires_grad):
        return False
    return q.is_cuda if m == "auto" else True


# ---------------------------------------------------------------------------------------------------
# The fused pieces: each one pointwise expression reduced over one axis, which the compiler turns into
# one kernel that never stores the (query, key, dimension) tensor.


def _scores(q, k, w):  # q (A, H, t, E), k (A, H, S, E), w (H, E) -> (A, H, t, S)
    x = torch.tanh(q[:, :, :, None, :] + k[:, :, None, :, :])
    return (x * w[None, :, None, None, :]).sum(-1)


def _grad_q(q, k, w, g):  # g (A, H, t, S) = dL/dscores -> (A, H, t, E)
    x = torch.tanh(q[:, :, :, None, :] + k[:, :, None, :, :])
    return ((1.0 - x * x) * g[..., None]).sum(3) * w[None, :, None, :]


def _grad_k(q, k, w, g):  # -> (A, H, S, E)
    x = torch.tanh(q[:, :, :, None, :] + k[:, :, None, :, :])
    return ((1.0 - x * x) * g[..., None]).sum(2) * w[None, :, None, :]


def _grad_w(q, k, g):  # -> (H, E)
    x = torch.tanh(q[:, :, :, None, :] + k[:, :, None, :, :])
    return (x * g[..., None]).sum((0, 2, 3))


_PIECES = {"scores": _scores, "grad_q": _grad_q, "grad_k": _grad_k, "grad_w": _grad_w}


def _piece(name: str, device: torch.device, eager: bool) -> Callable:
    fn = _PIECES[name]
    if eager or torch.compiler.is_compiling():
        return fn
    key = (name, device.type)
    if key not in _compiled:
        _compiled[key] = torch.compile(fn)
    return _compiled[key]


# ---------------------------------------------------------------------------------------------------
# The attention


def _rows(t: torch.Tensor | None, a: int, z: int) -> torch.Tensor | None:
    """Queries a..z of a mask or bias broadcastable to (..., T, S)."""
    return t if t is None or t.shape[-2] == 1 else t[..., a:z, :]


def _masked(s: torch.Tensor, extra: torch.Tensor | None) -> torch.Tensor:
    if extra is None:
        return s
    if extra.dtype == torch.bool:
        return s.masked_fill_(~extra, float("-inf"))
    return s.add_(extra)


def _chunk(A: int, H: int, T: int, S: int, budget: int) -> int:
    """Queries per chunk: (A, H, chunk, S) scores of at most ``budget`` elements (one query at least)."""
    return max(1, min(T, budget // max(1, A * H * S)))


class _AdditiveAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, w, extra, budget):
        A, H, T, _ = q.shape
        S = k.shape[2]
        n = _chunk(A, H, T, S, budget)
        eager = current_mode() == "eager"  # the backward keeps the forward's mode (it may run outside mode(...))
        scores = _piece("scores", q.device, eager)
        out = v.new_empty(A, H, T, v.shape[-1])
        lse = q.new_empty(A, H, T, dtype=torch.float32 if q.dtype != torch.float64 else q.dtype)
        for a in range(0, T, n):
            z = min(T, a + n)
            s = _masked(scores(q[:, :, a:z], k, w), _rows(extra, a, z))
            m = torch.logsumexp(s.float() if s.dtype != torch.float64 else s, dim=-1)
            lse[:, :, a:z] = m
            p = torch.exp(s - m[..., None].to(s.dtype))
            out[:, :, a:z] = p.to(v.dtype) @ v
            del s, p
        ctx.save_for_backward(q, k, v, w, out, lse, extra)
        ctx.n, ctx.eager = n, eager
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, w, out, lse, extra = ctx.saved_tensors
        n = ctx.n
        T = q.shape[2]
        scores, grad_q, grad_k, grad_w = (
            _piece(p, q.device, ctx.eager) for p in ("scores", "grad_q", "grad_k", "grad_w")
        )
        grad = grad.contiguous()
        delta = (grad.float() * out.float()).sum(-1) if q.dtype != torch.float64 else (grad * out).sum(-1)
        dq = torch.empty_like(q)
        dk = torch.zeros(k.shape, dtype=torch.float32 if k.dtype != torch.float64 else k.dtype, device=k.device)
        dv = torch.zeros(v.shape, dtype=dk.dtype, device=v.device)
        dw = torch.zeros(w.shape, dtype=dk.dtype, device=w.device)
        for a in range(0, T, n):
            z = min(T, a + n)
            qa, ga = q[:, :, a:z], grad[:, :, a:z]
            s = _masked(scores(qa, k, w), _rows(extra, a, z))
            p = torch.exp(s - lse[:, :, a:z, None].to(s.dtype))  # the probabilities, recomputed
            dv += p.transpose(-1, -2).to(ga.dtype) @ ga
            ds = (ga @ v.transpose(-1, -2)).to(p.dtype).sub_(delta[:, :, a:z, None].to(p.dtype)).mul_(p)
            del s, p
            dq[:, :, a:z] = grad_q(qa, k, w, ds)
            dk += grad_k(qa, k, w, ds)
            dw += grad_w(qa, k, ds)
            del ds
        return dq, dk.to(k.dtype), dv.to(v.dtype), dw.to(w.dtype), None, None


def additive_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    w: torch.Tensor,
    extra: torch.Tensor | None = None,
    budget: int = 1 << 20,
) -> torch.Tensor:
    """softmax(w_h . tanh(q_t + k_s) [+ extra]) @ v for q (A, H, T, E), k (A, H, S, E), v (A, H, S, Dv),
    w (H, E); extra: a bool mask (True: seen) or a float bias (-inf: not seen), broadcastable to (A, H, T, S),
    in which every query sees at least one key. ``budget``: elements of one chunk's (query, key) scores."""
    lead = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    if len(lead) != 2:
        raise ValueError(f"additive_attention takes (A, H, T, E) inputs (got q {tuple(q.shape)})")
    q = q.expand(*lead, *q.shape[-2:])
    k = k.expand(*lead, *k.shape[-2:])
    v = v.expand(*lead, *v.shape[-2:])
    while extra is not None and extra.dim() < 4:
        extra = extra[None]
    return _AdditiveAttention.apply(q, k, v, w.to(q.dtype), extra, budget)
