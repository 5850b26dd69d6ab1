"""A naive Transformer written out from a model's weights, for the tests: no cache, no tiles, no fused kernels,
no code of ``models`` but the parameters it reads. Every score, position scheme and pattern is computed here from
its definition (Vaswani et al. 2017; Luong et al. 2015; Bahdanau et al. 2015; Su et al. 2021; Press et al.
2022 with the bidirectional rule of docs/components.md; Longformer's per-head dilation and global attention), and
a decoder is run step by step: at step t every layer is recomputed from scratch over tokens 0..t.

The geometry of every layer (window, each head's dilation, global tokens) is the test's own statement (``Layer``),
never what the config's code resolves: a mistake there must show up as a difference, not in both.

Notation: B batch, T length, C model width, H heads, D head dim.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from models import ModelConfig, Transformer


def press_get_slopes(n: int) -> list[float]:
    """Press et al.'s published recipe (ofirpress/attention_with_linear_biases, ``get_slopes``), written out."""

    def get_slopes_power_of_2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        ratio = start
        return [start * ratio**i for i in range(n)]

    if math.log2(n).is_integer():
        return get_slopes_power_of_2(n)
    closest_power_of_2 = 2 ** math.floor(math.log2(n))
    return (
        get_slopes_power_of_2(closest_power_of_2)
        + press_get_slopes(2 * closest_power_of_2)[0::2][: n - closest_power_of_2]
    )


def sinusoids(T: int, C: int) -> torch.Tensor:
    """Vaswani et al. section 3.5: PE[p, 2i] = sin(p / 10000^(2i/C)), PE[p, 2i+1] = cos(the same)."""
    pe = torch.zeros(T, C, dtype=torch.float64)
    for p in range(T):
        for j in range(C):
            angle = p / 10000 ** ((j - j % 2) / C)
            pe[p, j] = math.sin(angle) if j % 2 == 0 else math.cos(angle)
    return pe


def rotate(x: torch.Tensor, base: float) -> torch.Tensor:
    """Su et al.'s rotary embedding, GPT-NeoX's half split: pair (i, i + D/2) turned by p / base^(2i/D)."""
    T, D = x.shape[-2], x.shape[-1]
    inv = base ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    angle = torch.arange(T, dtype=torch.float64)[:, None] * inv  # (T, D/2)
    x1, x2 = x[..., : D // 2], x[..., D // 2 :]
    return torch.cat([x1 * angle.cos() - x2 * angle.sin(), x2 * angle.cos() + x1 * angle.sin()], dim=-1)


def alibi(H: int, T: int, S: int, causal: bool) -> torch.Tensor:
    """(H, T, S): -m_h (i - j) for past keys; future keys (bidirectional) -m_{H-1-h} (j - i)."""
    m = torch.tensor(press_get_slopes(H), dtype=torch.float64)
    dist = (torch.arange(S - T, S)[:, None] - torch.arange(S)[None, :]).double()  # query - key
    past = -m.view(-1, 1, 1) * dist
    future = m.flip(0).view(-1, 1, 1) * dist if not causal else past
    return torch.where(dist >= 0, past, future)


@dataclass(frozen=True)
class Layer:
    """One self-attention layer's geometry as a test states it: keys at distance <= ``window`` (None: every key),
    head h seeing only multiples of ``dilations[h]`` up to window * dilations[h] (empty: 1 for every head), and the
    positions with Longformer's global attention."""

    window: int | None = None
    dilations: tuple[int, ...] = ()
    global_tokens: tuple[int, ...] = ()


FULL = Layer()


def allowed(layer: Layer | None, H: int, T: int, S: int, causal: bool) -> torch.Tensor:
    """(H, T, S) keys each head's window holds: multiples of its dilation (Longformer), the past when causal."""
    dist = torch.arange(S - T, S)[:, None] - torch.arange(S)[None, :]
    rows = []
    for h in range(H):
        ok = torch.ones(T, S, dtype=torch.bool)
        if layer is not None and layer.window is not None:
            d = layer.dilations[h] if layer.dilations else 1
            ok &= (dist.abs() <= layer.window * d) & (dist % d == 0)
        rows.append(ok & (dist >= 0) if causal else ok)
    return torch.stack(rows)


def softmax(s: torch.Tensor, ok: torch.Tensor) -> torch.Tensor:
    """Softmax of the scores ``s`` over the keys ``ok`` allows; a query with none (padding whose keys are all
    padding) gets no weight at all: its output is 0, meaningless, and never read by a real query."""
    return torch.nan_to_num(torch.softmax(s.masked_fill(~ok, float("-inf")), dim=-1), nan=0.0)


def global_projections(cfg, module, x, q, k, v) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Longformer's Q_g, K_g, V_g (section 3.1) of every position, (B, H, T, D) each: the layer's own global
    projections, or the window's q, k, v under ``global_projections: shared``. Over the states (no q, k
    projections) Q_g and K_g are the states and only V_g is projected."""
    H, C = cfg.n_heads, cfg.n_heads * cfg.head_size
    if cfg.global_projections == "shared":
        return q, k, v
    if not cfg.qk_projections:
        return q, k, heads(F.linear(x, module.global_v_proj.weight.double(), module.global_v_proj.bias.double()), H)
    w, b = module.global_qkv_proj.weight.double(), module.global_qkv_proj.bias.double()
    q_g, k_g, v_g = (heads(F.linear(x, w[i * C : (i + 1) * C], b[i * C : (i + 1) * C]), H) for i in range(3))
    return q_g, k_g, v_g


def scores(
    cfg: ModelConfig, score, q: torch.Tensor, k: torch.Tensor, rotary: bool, name: str, projected: bool
) -> torch.Tensor:
    """(B, H, T, S) of score ``name`` from its definition; q and k are transformed before rotary positions."""
    D = q.shape[-1]
    if name == "additive":  # Bahdanau: v_h . tanh(q + k); over the states, Luong's concat maps them first
        if not projected:
            q, k = q @ score.w_q.double(), k @ score.w_k.double()
        return torch.einsum("bhtsd,hd->bhts", torch.tanh(q[:, :, :, None] + k[:, :, None]), score.v.double())
    if name == "general":  # Luong: q^T W_h k
        q = torch.einsum("bhtd,hde->bhte", q, (torch.eye(D, dtype=torch.float64) + score.delta.double()))
    if name == "cosine":
        q = F.normalize(q, dim=-1) * score.log_tau.double().clamp(max=math.log(100.0)).exp().view(1, -1, 1, 1)
        k = F.normalize(k, dim=-1)
    if rotary:
        q, k = rotate(q, cfg.rotary_base), rotate(k, cfg.rotary_base)
    scale = 1.0 / math.sqrt(D) if name in ("dot", "general") else 1.0
    return q @ k.transpose(-1, -2) * scale


def heads(x: torch.Tensor, H: int) -> torch.Tensor:
    B, T, _ = x.shape
    return x.view(B, T, H, -1).transpose(1, 2)  # (B, H, T, D)


def attention(cfg, module, x, memory=None, layer=None, causal=False, padding=None) -> torch.Tensor:
    """One attention module from its weights: softmax over the allowed keys of scores + bias, then values.
    ``layer``: the self-attention's ``Layer``; ``padding`` (B, S) True at padding keys (of x, or of memory).

    Global tokens (Longformer section 3.1, Hugging Face's LongformerSelfAttention): a query reads its window (the
    global keys left out of it) and every global key, with q, k, v, in one softmax; no distance bias on a global
    key. A global token's row is then replaced: Q_g of that token against K_g, V_g of every key, no bias."""
    H, C = cfg.n_heads, cfg.n_heads * cfg.head_size
    # the cross-attention's own score and projections (cross_score, cross_qk_projections), else the self-attention's
    name = cfg.score if memory is None else cfg.cross_attention_score
    projected = cfg.qk_projections if memory is None else cfg.cross_attention_projected
    if not projected and memory is not None:  # Luong: the source states are keys and values, c_t = sum_s a h_s
        q, k, v = heads(x, H), heads(memory, H), heads(memory, H)
    elif not projected:  # q and k are the states, head by head; values projected
        q, k = heads(x, H), heads(x, H)
        v = heads(F.linear(x, module.v_proj.weight.double(), module.v_proj.bias.double()), H)
    elif memory is None:  # self-attention
        w, b = module.qkv_proj.weight.double(), module.qkv_proj.bias.double()
        q, k, v = (heads(F.linear(x, w[i * C : (i + 1) * C], b[i * C : (i + 1) * C]), H) for i in range(3))
    else:  # cross-attention: no positions, every key
        q = heads(F.linear(x, module.q_proj.weight.double(), module.q_proj.bias.double()), H)
        w, b = module.kv_proj.weight.double(), module.kv_proj.bias.double()
        k, v = (heads(F.linear(memory, w[i * C : (i + 1) * C], b[i * C : (i + 1) * C]), H) for i in range(2))
    T, S = q.shape[2], k.shape[2]
    rotary = memory is None and cfg.positions == "rotary"
    s = scores(cfg, module.score, q, k, rotary, name, projected)
    bias = torch.zeros(H, T, S, dtype=torch.float64)
    if memory is None and cfg.positions == "alibi":
        bias = alibi(H, T, S, causal)
    is_global = torch.zeros(S, dtype=torch.bool)  # the global keys (self-attention: T == S)
    if memory is None and layer is not None:
        is_global[[t for t in layer.global_tokens if t < S]] = True
    s = s + torch.where(is_global, 0.0, bias)[None]  # no distance bias on a global key
    ok = (allowed(layer if memory is None else None, H, T, S, causal and memory is None) | is_global)[None]
    real = torch.ones(1, 1, 1, S, dtype=torch.bool) if padding is None else ~padding[:, None, None, :]
    out = softmax(s, ok & real) @ v  # (B, H, T, D)
    if is_global.any():  # the global tokens' rows: every real key, through Q_g, K_g, V_g, no bias
        q_g, k_g, v_g = global_projections(cfg, module, x, q, k, v)
        rows = softmax(scores(cfg, module.score, q_g, k_g, rotary, name, projected), real) @ v_g
        out = torch.where(is_global[None, None, :, None], rows, out)
    out = out.transpose(1, 2).reshape(x.shape[0], T, C)
    return F.linear(out, module.out_proj.weight.double(), module.out_proj.bias.double())


def embed(model: Transformer, table, tokens: torch.Tensor) -> torch.Tensor:
    cfg = model.cfg
    x = table.weight.double()[tokens] * (math.sqrt(cfg.d_model) if cfg.scale_embeddings else 1.0)
    T = tokens.shape[1]
    if cfg.positions == "sinusoidal":
        x = x + sinusoids(T, cfg.d_model)
    elif cfg.positions == "learned":  # stored like the token embeddings: times sqrt(d) when added
        x = x + model.positions.table.weight.double()[:T] * (math.sqrt(cfg.d_model) if cfg.scale_embeddings else 1.0)
    return x


def norm(module, x: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, x.shape[-1:], module.weight.double(), module.bias.double(), module.eps)


def feed_forward(ff, x: torch.Tensor) -> torch.Tensor:
    return F.linear(
        F.relu(F.linear(x, ff.linear1.weight.double(), ff.linear1.bias.double())),
        ff.linear2.weight.double(),
        ff.linear2.bias.double(),
    )


def stack(
    model: Transformer, layers, x, geometry: list[Layer], causal: bool, memory=None, padding=None, memory_padding=None
) -> torch.Tensor:
    """Pre-norm layers (Xiong et al. 2020): x + attention(norm(x)), [x + cross(norm(x))], x + ffn(norm(x)); layer i
    has the geometry ``geometry[i]``."""
    cfg = model.cfg
    if len(geometry) != len(layers):
        raise ValueError(f"the test gives {len(geometry)} layers' geometry for {len(layers)} layers")
    for layer, geo in zip(layers, geometry):
        x = x + attention(
            cfg, layer.attn.sublayer, norm(layer.attn.pre_norm, x), layer=geo, causal=causal, padding=padding
        )
        if memory is not None:
            cross = layer.cross.sublayer
            x = x + attention(cfg, cross, norm(layer.cross.pre_norm, x), memory=memory, padding=memory_padding)
        x = x + feed_forward(layer.ff.sublayer, norm(layer.ff.pre_norm, x))
    return x


def naive_encode(
    model: Transformer, src: torch.Tensor, geometry: list[Layer], padding: torch.Tensor | None = None
) -> torch.Tensor:
    """The encoder's output (B, S, C) after the final norm; ``padding`` (B, S) True at padding (the outputs there are
    meaningless)."""
    _written_for(model.cfg)
    x = stack(model, model.layers, embed(model, model.embed, src), geometry, causal=False, padding=padding)
    return norm(model.norm, x)


def _written_for(cfg: ModelConfig) -> None:
    if cfg.norm != "pre" or cfg.ffn != "relu" or cfg.norm_type != "layernorm":
        raise NotImplementedError("the naive reference is written for pre-norm, relu and layernorm")


def naive_step_by_step(
    model: Transformer,
    tokens: torch.Tensor,
    src: torch.Tensor | None = None,
    *,
    geometry: list[Layer],
    src_geometry: list[Layer] | None = None,
    src_padding: torch.Tensor | None = None,
) -> torch.Tensor:
    """Logits (B, T, V) of a decoder (or the decoder of an encoder-decoder), position t computed from scratch
    over tokens 0..t: nothing is carried from one step to the next. ``geometry``: the (decoder) layers';
    ``src_geometry``: the encoder's (default ``geometry``); ``src_padding`` (B, S) True at padding of the source."""
    _written_for(model.cfg)
    memory = None if src is None else naive_encode(model, src, src_geometry or geometry, src_padding)
    layers = model.layers if memory is None else model.dec_layers
    table = model.embed if memory is None else model.tgt_embed
    out = []
    for t in range(tokens.shape[1]):
        x = embed(model, table, tokens[:, : t + 1])
        x = stack(model, layers, x, geometry, causal=True, memory=memory, memory_padding=src_padding)
        final = model.norm if memory is None else model.dec_norm
        out.append(F.linear(norm(final, x[:, -1:]), model.head.weight.double()))
    return torch.cat(out, dim=1)
