"""The Transformer: one config in, one model out.

Notation: B batch, T target/sequence length, S source length, C model width, V vocabulary, K beams.

arch ``encoder``          tokens (B, T) -> class logits (B, n_classes) or per-token (B, T, n_classes)
arch ``decoder``          tokens (B, T) -> next-token logits (B, T, V), causal
arch ``encoder_decoder``  source (B, S), target (B, T) -> next-token logits (B, T, V)

Padding masks are boolean, True at padding. A causal stack does not need the padding of a right-padded
batch: padding keys come after every real query and are never seen by one.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import torch
from torch import nn

from models.attention import KVCache, MultiHeadAttention
from models.blocks import NORMS, DecoderLayer, EncoderLayer
from models.config import ModelConfig
from models.positions import POSITIONS


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        C = cfg.d_model
        self.embed = nn.Embedding(cfg.vocab_size, C)
        if cfg.arch == "encoder_decoder" and cfg.tgt_vocab_size is not None:
            self.tgt_embed = nn.Embedding(cfg.tgt_vocab_size, C)
        else:
            self.tgt_embed = self.embed  # one table for source and target (Vaswani et al. share it)
        self.positions = POSITIONS[cfg.positions](C, cfg.max_len)
        self.emb_dropout = nn.Dropout(cfg.emb_dropout)
        self.emb_scale = math.sqrt(C) if cfg.scale_embeddings else 1.0

        def final_norm() -> nn.Module:
            return NORMS[cfg.norm_type](C, cfg.norm_eps) if cfg.norm == "pre" else nn.Identity()

        causal = cfg.arch == "decoder"
        self.layers = nn.ModuleList(EncoderLayer(cfg, p, causal) for p in cfg.patterns_for(cfg.n_layers))
        self.norm = final_norm()
        if cfg.arch == "encoder_decoder":
            self.dec_layers = nn.ModuleList(DecoderLayer(cfg, p) for p in cfg.patterns_for(cfg.decoder_layers))
            self.dec_norm = final_norm()
        if cfg.arch == "encoder":
            self.head = nn.Linear(C, cfg.n_classes)
        else:
            self.head = nn.Linear(C, cfg.target_vocab, bias=False)
        self._init_weights()
        if cfg.tied and cfg.arch != "encoder":
            self.head.weight = self.tgt_embed.weight

    def _init_weights(self) -> None:
        for name, p in self.named_parameters():
            if p.dim() < 2:
                if name.endswith(".bias"):
                    nn.init.zeros_(p)
            elif "embed" in name:
                nn.init.normal_(p, std=self.cfg.d_model**-0.5)
            elif (
                name.endswith("proj.weight")
                or name.endswith("linear1.weight")
                or name.endswith("linear2.weight")
                or name == "head.weight"
            ):
                nn.init.xavier_uniform_(p)

    # -- pieces ---------------------------------------------------------------------------------
    def _embed(self, table: nn.Embedding, tokens: torch.Tensor, start: int = 0) -> torch.Tensor:
        x = table(tokens) * self.emb_scale  # (B, T, C)
        return self.emb_dropout(self.positions(x, start))

    def encode(self, tokens: torch.Tensor, padding: torch.Tensor | None = None) -> torch.Tensor:
        """The (encoder) stack's output (B, T, C) after the final norm."""
        x = self._embed(self.embed, tokens)
        for layer in self.layers:
            x = layer(x, key_padding=padding)
        return self.norm(x)

    def _decode(self, tokens, memory, memory_padding=None, padding=None, start=0, cache=None) -> torch.Tensor:
        x = self._embed(self.tgt_embed, tokens, start)
        for i, layer in enumerate(self.dec_layers):
            x = layer(
                x,
                memory,
                memory_padding=memory_padding,
                key_padding=padding,
                start=start,
                cache=None if cache is None else cache[i],
            )
        return self.head(self.dec_norm(x))

    def _causal(self, tokens, padding=None, start=0, cache=None) -> torch.Tensor:
        x = self._embed(self.embed, tokens, start)
        for i, layer in enumerate(self.layers):
            x = layer(x, key_padding=padding, start=start, cache=None if cache is None else cache[i])
        return self.head(self.norm(x))

    # -- forward --------------------------------------------------------------------------------
    def forward(
        self,
        tokens: torch.Tensor,
        target: torch.Tensor | None = None,
        *,
        padding: torch.Tensor | None = None,
        target_padding: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """encoder: tokens -> class logits; decoder: tokens -> logits; encoder_decoder: (source, target)
        -> logits. ``padding`` (B, T) and ``target_padding`` (B, T) are True at padding."""
        arch = self.cfg.arch
        if arch == "decoder":
            return self._causal(tokens, padding)
        if arch == "encoder_decoder":
            if target is None:
                raise ValueError("arch='encoder_decoder' needs the target tokens: model(source, target)")
            memory = self.encode(tokens, padding)
            return self._decode(target, memory, padding, target_padding)
        h = self.encode(tokens, padding)  # (B, T, C)
        if self.cfg.classifier == "token":
            return self.head(h)
        if self.cfg.classifier == "first":
            return self.head(h[:, 0])
        if padding is None:
            return self.head(h.mean(dim=1))
        keep = (~padding).unsqueeze(-1).to(h.dtype)  # (B, T, 1)
        return self.head((h * keep).sum(1) / keep.sum(1).clamp(min=1.0))

    # -- head ablation (Michel et al. 2019) -----------------------------------------------------
    def attention_modules(self) -> Iterator[tuple[str, MultiHeadAttention]]:
        """Every attention module by name, e.g. ``layers.0.attn``, ``dec_layers.1.cross``."""
        for name, module in self.named_modules():
            if isinstance(module, MultiHeadAttention):
                yield name.removesuffix(".sublayer"), module

    def set_head_mask(self, gates: dict[str, Sequence[float] | torch.Tensor] | None) -> None:
        """Scale each head's output by a gate (0 removes the head); None restores every head.

        ``gates`` maps names from ``attention_modules()`` to one gate per head, e.g.
        ``{"layers.0.attn": [1, 0, 1, 1]}``. Unnamed modules keep all their heads.
        """
        modules = dict(self.attention_modules())
        gates = gates or {}
        unknown = sorted(set(gates) - set(modules))
        if unknown:
            raise KeyError(f"unknown attention module(s) {unknown}; valid: {sorted(modules)}")
        for name, module in modules.items():
            g = gates.get(name)
            if g is None:
                module.head_gate = None
                continue
            g = torch.as_tensor(g, dtype=torch.float32, device=self.head.weight.device)
            if g.shape != (module.n_heads,):
                raise ValueError(f"head mask for {name} has shape {tuple(g.shape)}; expected ({module.n_heads},)")
            module.head_gate = g

    # -- incremental decoding -------------------------------------------------------------------
    def new_cache(self) -> list:
        if self.cfg.arch == "encoder_decoder":
            return [(KVCache(), KVCache()) for _ in self.dec_layers]
        return [KVCache() for _ in self.layers]

    def step(self, tokens: torch.Tensor, cache: list, start: int, memory=None, memory_padding=None) -> torch.Tensor:
        """Logits (B, T, V) for new tokens (B, T) at positions start.., reusing and extending ``cache``.
        One step with T=1 costs O(cached keys), not a forward pass over the whole sequence."""
        if self.cfg.arch == "encoder_decoder":
            return self._decode(tokens, memory, memory_padding, start=start, cache=cache)
        if self.cfg.arch != "decoder":
            raise ValueError("incremental decoding needs arch 'decoder' or 'encoder_decoder'")
        return self._causal(tokens, start=start, cache=cache)

    @staticmethod
    def _reorder(cache: list, index: torch.Tensor) -> None:
        for entry in cache:
            for c in entry if isinstance(entry, tuple) else (entry,):
                c.reorder(index)

    def _start(self, prompt, source, source_padding, bos_id):
        """Prime a decoding: returns (logits of the last position (B, V), cache, next position, memory, padding)."""
        cache = self.new_cache()
        if self.cfg.arch == "encoder_decoder":
            if source is None:
                raise ValueError("arch='encoder_decoder' decodes from a source: pass source=")
            memory = self.encode(source, source_padding)
            if prompt is None:
                prompt = torch.full((source.shape[0], 1), bos_id, dtype=torch.long, device=source.device)
        else:
            memory = None
            if prompt is None:
                raise ValueError("arch='decoder' continues a prompt: pass prompt= (B, T) tokens")
        logits = self.step(prompt, cache, 0, memory, source_padding)
        return logits[:, -1], cache, prompt.shape[1], memory, prompt

    @torch.no_grad()
    def greedy(
        self,
        prompt: torch.Tensor | None = None,
        *,
        source: torch.Tensor | None = None,
        source_padding: torch.Tensor | None = None,
        max_new_tokens: int = 32,
        bos_id: int = 1,
        eos_id: int | None = None,
    ) -> torch.Tensor:
        """Greedy decoding with the key/value cache. Returns the generated tokens (B, <= max_new_tokens);
        after ``eos_id`` a sequence continues with pad_id."""
        logits, cache, pos, memory, _ = self._start(prompt, source, source_padding, bos_id)
        B = logits.shape[0]
        done = torch.zeros(B, dtype=torch.bool, device=logits.device)
        out = []
        for i in range(max_new_tokens):
            tok = logits.argmax(-1)
            tok = tok.masked_fill(done, self.cfg.pad_id)
            out.append(tok)
            if eos_id is not None:
                done |= tok == eos_id
                if bool(done.all()):
                    break
            if i + 1 < max_new_tokens:
                logits = self.step(tok[:, None], cache, pos, memory, source_padding)[:, -1]
                pos += 1
        return torch.stack(out, dim=1)

    @torch.no_grad()
    def beam_search(
        self,
        prompt: torch.Tensor | None = None,
        *,
        source: torch.Tensor | None = None,
        source_padding: torch.Tensor | None = None,
        beam_size: int = 4,
        max_new_tokens: int = 32,
        bos_id: int = 1,
        eos_id: int | None = None,
        length_penalty: float = 0.0,
    ) -> torch.Tensor:
        """Beam search with the key/value cache; returns the best sequence per input (B, <= max_new_tokens).

        Scores are summed log-probabilities divided by length**length_penalty (0: none). Beam size 1 is
        greedy decoding.
        """
        K = beam_size
        if K < 1:
            raise ValueError(f"beam_size={K} must be at least 1")
        logits, cache, pos, memory, _ = self._start(prompt, source, source_padding, bos_id)
        B, V = logits.shape
        dev = logits.device
        # every input's beams start identical: expand the cache, keep only beam 0 alive at first
        index = torch.arange(B, device=dev).repeat_interleave(K)
        self._reorder(cache, index)
        if memory is not None:
            memory = memory.index_select(0, index)
            source_padding = None if source_padding is None else source_padding.index_select(0, index)
        logp = torch.log_softmax(logits.float(), -1).index_select(0, index)  # (B*K, V)
        scores = torch.full((B, K), float("-inf"), device=dev)
        scores[:, 0] = 0.0
        done = torch.zeros(B, K, dtype=torch.bool, device=dev)
        lengths = torch.zeros(B, K, device=dev)
        tokens = torch.empty(B, K, 0, dtype=torch.long, device=dev)
        pad = self.cfg.pad_id
        for i in range(max_new_tokens):
            step = logp.view(B, K, V).clone()
            # a finished beam only continues with pad, at no cost
            step[done] = float("-inf")
            step[..., pad] = torch.where(done, torch.zeros_like(scores), step[..., pad])
            total = (scores[..., None] + step).view(B, K * V)
            scores, flat = total.topk(K, dim=-1)  # (B, K)
            beam, tok = flat // V, flat % V
            tokens = torch.cat([tokens.gather(1, beam[..., None].expand(-1, -1, tokens.shape[2])), tok[..., None]], 2)
            done = done.gather(1, beam)
            lengths = lengths.gather(1, beam) + (~done).float()
            if eos_id is not None:
                done = done | (tok == eos_id)
            if bool(done.all()) or i + 1 == max_new_tokens:
                break
            flat_beam = (torch.arange(B, device=dev)[:, None] * K + beam).view(-1)
            self._reorder(cache, flat_beam)
            logits = self.step(tok.view(-1, 1), cache, pos, memory, source_padding)[:, -1]
            logp = torch.log_softmax(logits.float(), -1)
            pos += 1
        final = scores / lengths.clamp(min=1.0) ** length_penalty if length_penalty else scores
        best = final.argmax(-1)  # (B,)
        return tokens[torch.arange(B, device=dev), best]

    # -- accounting -----------------------------------------------------------------------------
    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
