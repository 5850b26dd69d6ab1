"""A naive Transformer written out from a model's weights, for the tests: no cache, no tiles, no fused kernels,
no code of ``models`` but the parameters it reads. Every score, position scheme and pattern is computed here from
its definition (Vaswani et al. 2017; Luong et al. 2015; Bahdanau et al. 2015; Su et al. 2021; Press et al.
2022 with the bidirectional rule of docs/components.md; Longformer's per-head dilation), and a decoder is run
step by step: at step t every layer is recomputed from scratch over tokens 0..t.

Notation: B batch, T length, C model width, H heads, D head dim.
"""

from __future__ import annotations

import math

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


def allowed(layer, H: int, T: int, S: int, causal: bool) -> torch.Tensor:
    """(H, T, S) keys each head sees: a window of multiples of its dilation (Longformer), the past when causal."""
    dist = torch.arange(S - T, S)[:, None] - torch.arange(S)[None, :]
    rows = []
    for h in range(H):
        ok = torch.ones(T, S, dtype=torch.bool)
        if layer is not None and layer.window is not None:
            d = layer.dilations[h]
            ok &= (dist.abs() <= layer.window * d) & (dist % d == 0)
        rows.append(ok & (dist >= 0) if causal else ok)
    return torch.stack(rows)


def scores(cfg: ModelConfig, score, q: torch.Tensor, k: torch.Tensor, rotary: bool) -> torch.Tensor:
    """(B, H, T, S) from each function's definition; q and k are transformed before rotary positions."""
    D = q.shape[-1]
    if cfg.score == "additive":  # Bahdanau: v_h . tanh(q + k); over the states, Luong's concat maps them first
        if not cfg.qk_projections:
            q, k = q @ score.w_q.double(), k @ score.w_k.double()
        return torch.einsum("bhtsd,hd->bhts", torch.tanh(q[:, :, :, None] + k[:, :, None]), score.v.double())
    if cfg.score == "general":  # Luong: q^T W_h k
        q = torch.einsum("bhtd,hde->bhte", q, (torch.eye(D, dtype=torch.float64) + score.delta.double()))
    if cfg.score == "cosine":
        q = F.normalize(q, dim=-1) * score.log_tau.double().clamp(max=math.log(100.0)).exp().view(1, -1, 1, 1)
        k = F.normalize(k, dim=-1)
    if rotary:
        q, k = rotate(q, cfg.rotary_base), rotate(k, cfg.rotary_base)
    scale = 1.0 / math.sqrt(D) if cfg.score in ("dot", "general") else 1.0
    return q @ k.transpose(-1, -2) * scale


def heads(x: torch.Tensor, H: int) -> torch.Tensor:
    B, T, _ = x.shape
    return x.view(B, T, H, -1).transpose(1, 2)  # (B, H, T, D)


def attention(cfg, module, x, memory=None, layer=None, causal=False) -> torch.Tensor:
    """One attention module from its weights: softmax over the allowed keys of scores + bias, then values."""
    H, C = cfg.n_heads, cfg.n_heads * cfg.head_size
    if not cfg.qk_projections:  # Luong: q and k are the states, head by head; values projected
        source = x if memory is None else memory
        q, k = heads(x, H), heads(source, H)
        v = heads(F.linear(source, module.v_proj.weight.double(), module.v_proj.bias.double()), H)
    elif memory is None:  # self-attention
        w, b = module.qkv_proj.weight.double(), module.qkv_proj.bias.double()
        q, k, v = (heads(F.linear(x, w[i * C : (i + 1) * C], b[i * C : (i + 1) * C]), H) for i in range(3))
    else:  # cross-attention: no positions, every key
        q = heads(F.linear(x, module.q_proj.weight.double(), module.q_proj.bias.double()), H)
        w, b = module.kv_proj.weight.double(), module.kv_proj.bias.double()
        k, v = (heads(F.linear(memory, w[i * C : (i + 1) * C], b[i * C : (i + 1) * C]), H) for i in range(2))
    T, S = q.shape[2], k.shape[2]
    s = scores(cfg, module.score, q, k, rotary=memory is None and cfg.positions == "rotary")
    if memory is None and cfg.positions == "alibi":
        s = s + alibi(H, T, S, causal)[None]
    ok = allowed(layer if memory is None else None, H, T, S, causal and memory is None)
    p = torch.softmax(s.masked_fill(~ok[None], float("-inf")), dim=-1)
    out = (p @ v).transpose(1, 2).reshape(x.shape[0], T, C)
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


def stack(model: Transformer, layers, x, geometry, causal: bool, memory=None) -> torch.Tensor:
    """Pre-norm layers (Xiong et al. 2020): x + attention(norm(x)), [x + cross(norm(x))], x + ffn(norm(x))."""
    cfg = model.cfg
    for layer, geo in zip(layers, geometry):
        x = x + attention(cfg, layer.attn.sublayer, norm(layer.attn.pre_norm, x), layer=geo, causal=causal)
        if memory is not None:
            x = x + attention(cfg, layer.cross.sublayer, norm(layer.cross.pre_norm, x), memory=memory)
        x = x + feed_forward(layer.ff.sublayer, norm(layer.ff.pre_norm, x))
    return x


def naive_encode(model: Transformer, src: torch.Tensor) -> torch.Tensor:
    cfg = model.cfg
    x = stack(model, model.layers, embed(model, model.embed, src), cfg.attention_layers(cfg.n_layers), causal=False)
    return norm(model.norm, x)


def naive_step_by_step(model: Transformer, tokens: torch.Tensor, src: torch.Tensor | None = None) -> torch.Tensor:
    """Logits (B, T, V) of a decoder (or the decoder of an encoder-decoder), position t computed from scratch
    over tokens 0..t: nothing is carried from one step to the next."""
    cfg = model.cfg
    if cfg.norm != "pre" or cfg.ffn != "relu" or cfg.norm_type != "layernorm":
        raise NotImplementedError("the naive reference is written for pre-norm, relu and layernorm")
    memory = None if src is None else naive_encode(model, src)
    layers = model.layers if memory is None else model.dec_layers
    table = model.embed if memory is None else model.tgt_embed
    geometry = cfg.attention_layers(len(layers))
    out = []
    for t in range(tokens.shape[1]):
        x = stack(model, layers, embed(model, table, tokens[:, : t + 1]), geometry, causal=True, memory=memory)
        final = model.norm if memory is None else model.dec_norm
        out.append(F.linear(norm(final, x[:, -1:]), model.head.weight.double()))
    return torch.cat(out, dim=1)
