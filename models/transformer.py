"""The Transformer: one config in, one model out.

Notation: B batch, T target/sequence length, S source length, C model width, V vocabulary, K beams,
N new tokens at most.

arch ``encoder``          tokens (B, T) -> class logits (B, n_classes) or per-token (B, T, n_classes)
arch ``decoder``          tokens (B, T) -> next-token logits (B, T, V), causal
arch ``encoder_decoder``  source (B, S), target (B, T) -> next-token logits (B, T, V); with
                          ``decoding='nat_gu'``, ``'uniform_copy'`` or ``'mask_predict'`` a length head reads
                          the encoder and the decoder, not causal, predicts every position at once from the
                          source embeddings copied uniformly (Gu et al. 2018; ``nat_gu`` with their positional
                          attention and self-attention mask, ``models.nat``) or from target tokens and a learned
                          [MASK] embedding (Ghazvininejad et al. 2019)

Padding masks are boolean, True at padding. A causal stack does not need the padding of a right-padded
batch: padding keys come after every real query and are never seen by one.

Decoding (``generate``, ``greedy``, ``beam_search``; ``parallel_decode`` for the others) reuses a key/value cache per layer
(``models.attention.KVCache``); prompts of different lengths are batched by left padding
(``prompt_padding``), each token then at its own position (``position_ids``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import torch
from torch import nn

from models.attention import KVCache, MultiHeadAttention
from models.beams import Beams
from models.blocks import DecoderLayer, EncoderLayer
from models.config import ModelConfig
from models.registry import NORMS, POSITIONS

NEG_INF = float("-inf")
PARALLEL = "'nat_gu', 'uniform_copy' or 'mask_predict'"  # the non-autoregressive decodings, for messages


class Transformer(nn.Module):
    # steps between checks of whether every sequence has finished (each check waits for the device)
    check_every = 4

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        C = cfg.d_model
        self.embed = nn.Embedding(cfg.vocab_size, C)
        # One table for source and target (Vaswani et al. share it) unless the target vocabulary differs:
        # tgt_vocab_size equal to vocab_size means what leaving it out means, the same model (one cell id).
        if cfg.target_vocab != cfg.vocab_size:
            self.tgt_embed = nn.Embedding(cfg.target_vocab, C)
        else:
            self.tgt_embed = self.embed
        self.positions = POSITIONS[cfg.positions](cfg)
        self.emb_dropout = nn.Dropout(cfg.emb_dropout)
        self.emb_scale = math.sqrt(C) if cfg.scale_embeddings else 1.0

        def final_norm() -> nn.Module:
            return NORMS[cfg.norm_type](C, cfg.norm_eps) if cfg.norm == "pre" else nn.Identity()

        causal = cfg.arch == "decoder"
        self.layers = nn.ModuleList(EncoderLayer(cfg, la, causal) for la in cfg.attention_layers(cfg.n_layers))
        self.norm = final_norm()
        if cfg.arch == "encoder_decoder":
            dec_causal = not cfg.non_autoregressive
            self.dec_layers = nn.ModuleList(
                DecoderLayer(cfg, la, dec_causal) for la in cfg.attention_layers(cfg.decoder_layers, dec_causal)
            )
            self.dec_norm = final_norm()
            if cfg.non_autoregressive:
                self.length_head = nn.Linear(C, cfg.max_len + 1)  # target lengths 0 .. max_len
            if cfg.decoding == "mask_predict":
                self.mask_embed = nn.Parameter(torch.empty(C))  # the [MASK] input of every unknown position
        if cfg.arch == "encoder":
            self.head = nn.Linear(C, cfg.n_classes)
        else:
            self.head = nn.Linear(C, cfg.target_vocab, bias=False)
        self._init_weights()
        if cfg.tied and cfg.arch != "encoder":
            self.head.weight = self.tgt_embed.weight

    def _init_weights(self) -> None:
        """Token embeddings (and [MASK]) N(0, d^-0.5), then scaled by sqrt(d) when used: RMS 1 entering the
        stack; every linear layer Xavier-uniform with zero biases (each projection of a fused matrix over its own
        shape: q, k and v of ``qkv_proj`` as three (C, C) layers, not one (3C, C)); norms at 1 and 0 (torch's default). Scores
        and learned positions initialise their own parameters (general: W = I; cosine: tau = 10; additive:
        v ~ N(0, 1/D); learned positions: ``position_init_std``). Longformer's global projections (Q_g, K_g, V_g) draw
        nothing: they are set to their layer's window projections afterwards (section 3.1), so that the other weights
        are those of the same seed without global projections."""
        std = self.cfg.d_model**-0.5
        copies = {id(p) for m in self.modules() if isinstance(m, MultiHeadAttention) for p in m.global_parameters()}
        tables = {id(t.weight) for t in (self.embed, self.tgt_embed)}
        if hasattr(self, "mask_embed"):
            tables.add(id(self.mask_embed))
        linear = {id(m.weight): "weight" for m in self.modules() if isinstance(m, nn.Linear)}
        linear.update({id(m.bias): "bias" for m in self.modules() if isinstance(m, nn.Linear) and m.bias is not None})
        blocks = {id(m.weight): getattr(m, "fused_outputs", 1) for m in self.modules() if isinstance(m, nn.Linear)}
        for _, p in self.named_parameters():  # in order: the same draws for the same seed as before
            if id(p) in copies:
                continue
            if id(p) in tables:
                nn.init.normal_(p, std=std)
            elif linear.get(id(p)) == "weight":  # Glorot's scale is a layer's: each projection of a fused matrix
                for block in p.data.chunk(blocks[id(p)], dim=0):  # (q, k, v; SwiGLU's gate, value) gets its own
                    nn.init.xavier_uniform_(block)
            elif linear.get(id(p)) == "bias":
                nn.init.zeros_(p)
        for m in self.modules():
            if isinstance(m, MultiHeadAttention):
                m.copy_global_projections()

    # -- pieces ---------------------------------------------------------------------------------
    def _embed(
        self, table: nn.Embedding, tokens, start: int = 0, position_ids=None, masked=None, copied=None
    ) -> torch.Tensor:
        x = table(tokens) if copied is None else copied  # (B, T, C); Gu et al.'s NAT: copied source embeddings
        if masked is not None:  # non-autoregressive decoding: unknown positions get the [MASK] embedding
            x = torch.where(masked[..., None], self.mask_embed.to(x.dtype), x)
        return self.emb_dropout(self.positions(x * self.emb_scale, start, position_ids))

    def encode(self, tokens: torch.Tensor, padding: torch.Tensor | None = None) -> torch.Tensor:
        """The (encoder) stack's output (B, T, C) after the final norm."""
        x = self._embed(self.embed, tokens)
        for layer in self.layers:
            x = layer(x, key_padding=padding)
        return self.norm(x)

    def _decode(
        self,
        tokens,
        memory,
        memory_padding=None,
        padding=None,
        start=0,
        cache=None,
        position_ids=None,
        masked=None,
        copied=None,
    ) -> torch.Tensor:
        x = self._embed(self.tgt_embed, tokens, start, position_ids, masked, copied)
        pe = self.position_encoding(x) if self.cfg.positional_attention else None  # (1, T, C)
        for i, layer in enumerate(self.dec_layers):
            x = layer(
                x,
                memory,
                memory_padding=memory_padding,
                key_padding=padding,
                start=start,
                position_ids=position_ids,
                cache=None if cache is None else cache[i],
                pos_encoding=pe,
            )
        return self.head(self.dec_norm(x))

    def position_encoding(self, x: torch.Tensor) -> torch.Tensor:
        """(1, T, C): what the position scheme adds to inputs x (B, T, C) at columns 0 .. T-1, the positional
        encodings that are the queries and keys of Gu et al.'s positional attention (sinusoidal: Vaswani's table;
        learned: the table, times its scale)."""
        return self.positions(x.new_zeros(1, *x.shape[1:]))

    def _causal(self, tokens, padding=None, start=0, cache=None, position_ids=None) -> torch.Tensor:
        x = self._embed(self.embed, tokens, start, position_ids)
        for i, layer in enumerate(self.layers):
            x = layer(
                x,
                key_padding=padding,
                start=start,
                position_ids=position_ids,
                cache=None if cache is None else cache[i],
            )
        return self.head(self.norm(x))

    # -- forward --------------------------------------------------------------------------------
    def forward(
        self,
        tokens: torch.Tensor,
        target: torch.Tensor | None = None,
        *,
        padding: torch.Tensor | None = None,
        target_padding: torch.Tensor | None = None,
        target_masked: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """encoder: tokens -> class logits; decoder: tokens -> logits; encoder_decoder: (source, target)
        -> logits. ``padding`` (B, T) and ``target_padding`` (B, T) are True at padding. Non-autoregressive:
        the logits predict every target position; ``nat_gu`` and ``uniform_copy`` read only the target's length
        (and padding),
        ``mask_predict`` its known tokens, [MASK] where ``target_masked`` (B, T) is True (default: everywhere)."""
        arch = self.cfg.arch
        if arch == "decoder":
            return self._causal(tokens, padding)
        if arch == "encoder_decoder":
            if target is None:
                raise ValueError("arch='encoder_decoder' needs the target tokens: model(source, target)")
            memory = self.encode(tokens, padding)
            if self.cfg.non_autoregressive:
                return self._parallel_logits(tokens, memory, padding, target, target_padding, target_masked)
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

    # -- non-autoregressive decoding (Gu et al. 2018; Ghazvininejad et al. 2019) --------------------
    def predict_length(self, memory: torch.Tensor, padding: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (B, max_len + 1) of the target length, from the mean of the encoder output over real
        source tokens (fairseq's NAT length predictor)."""
        if not self.cfg.non_autoregressive:
            raise ValueError(f"predict_length needs a non-autoregressive decoding ({PARALLEL})")
        if padding is None:
            pooled = memory.mean(dim=1)
        else:
            keep = (~padding).unsqueeze(-1).to(memory.dtype)
            pooled = (memory * keep).sum(1) / keep.sum(1).clamp(min=1.0)
        return self.length_head(pooled)

    def uniform_copy(
        self, source: torch.Tensor, padding: torch.Tensor | None, lengths: torch.Tensor, width: int
    ) -> torch.Tensor:
        """Gu et al. (2018, section 3.1), uniform copy: decoder input t of a target of length T' is the embedding of
        source token Round(t (S - 1) / (T' - 1)), S the source's real length (sources are right-padded; fairseq's
        ``_uniform_assignment``; token 0 when T' = 1). (B, width, C), unscaled like the table it reads."""
        B, S = source.shape
        src_len = torch.full((B,), S, device=source.device) if padding is None else S - padding.sum(1)
        step = (src_len - 1).double() / (lengths - 1).clamp(min=1).double()
        t = torch.arange(width, device=source.device, dtype=torch.float64)
        idx = torch.round(step[:, None] * t[None, :]).long()
        idx = torch.minimum(idx, (src_len - 1).clamp(min=0)[:, None])  # target padding: any real token
        return self.embed(source.gather(1, idx))

    def _parallel_logits(self, source, memory, padding, target, target_padding=None, target_masked=None):
        """The non-autoregressive decoder's logits (B, T, V): ``nat_gu`` and ``uniform_copy`` read the source
        embeddings copied to the target's length, ``mask_predict`` the target tokens with [MASK] where
        ``target_masked`` (default: all)."""
        if self.cfg.copies_source:
            T = target.shape[1]
            lengths = T - target_padding.sum(1) if target_padding is not None else torch.full_like(target[:, 0], T)
            copied = self.uniform_copy(source, padding, lengths, T)
            return self._decode(target, memory, padding, target_padding, copied=copied)
        if target_masked is None:
            target_masked = torch.ones_like(target, dtype=torch.bool)
        return self._decode(target, memory, padding, target_padding, masked=target_masked)

    def parallel_forward(self, source, target, *, padding=None, target_padding=None, target_masked=None):
        """Non-autoregressive training pass: (token logits (B, T, V), length logits (B, max_len + 1))."""
        if not self.cfg.non_autoregressive:
            raise ValueError(f"parallel_forward needs a non-autoregressive decoding ({PARALLEL})")
        memory = self.encode(source, padding)
        logits = self._parallel_logits(source, memory, padding, target, target_padding, target_masked)
        return logits, self.predict_length(memory, padding)

    def _length_candidates(self, memory, padding, max_length: int | None, k: int = 1) -> torch.Tensor:
        """The k most probable target lengths (B, k), most probable first (equal logits: the shorter first), each at
        most ``max_length`` and at least 1: a predicted length of 0 is decoded as 1, as Ghazvininejad et al.'s
        reference code raises its length candidates to its minimum (an empty output is never decoded). Raised or
        lowered candidates may repeat one another (they decode the same output)."""
        logits = self.predict_length(memory, padding)  # (B, max_len + 1)
        lengths = logits.sort(dim=-1, descending=True, stable=True).indices[:, :k]
        if max_length is not None:
            if max_length < 1:
                raise ValueError(f"max_length={max_length} must be at least 1 (a predicted length is at least 1)")
            lengths = lengths.clamp(max=max_length)
        return lengths.clamp(min=1)

    @torch.no_grad()
    def parallel_decode(
        self,
        source: torch.Tensor,
        source_padding: torch.Tensor | None = None,
        *,
        iterations: int | None = None,
        length_candidates: int | None = None,
        max_length: int | None = None,
        eos_id: int | None = None,
    ) -> torch.Tensor:
        """Predict the length (at least 1), then every target token at once: ``nat_gu`` and ``uniform_copy`` in one
        pass from the copied source (Gu et al. 2018); ``mask_predict`` from [MASK] inputs, then ``iterations`` T - 1
        refinements (default ``nat_iterations``; Ghazvininejad et al. 2019, section 3.2, ``_refine``), for each of
        the ``length_candidates`` most probable lengths (default the config's; section 3.3): the candidates of a
        source are decoded in parallel, as rows of one batch, and the output of the highest average log-probability
        of its tokens (each token's log-probability when it was last predicted) is kept; on equal averages the
        more probable length.

        Returns (B, L_max + 1): the tokens, then ``eos_id`` (when given) and padding, as ``greedy`` does.
        """
        T_iter, k = self._parallel_settings(iterations, length_candidates)
        memory = self.encode(source, source_padding)
        B, dev = source.shape[0], source.device
        lengths = self._length_candidates(memory, source_padding, max_length, k).reshape(-1)  # (B * k,)
        if k > 1:  # candidate j of source b is row b * k + j
            rows = torch.arange(B, device=dev).repeat_interleave(k)
            memory, source = memory.index_select(0, rows), source.index_select(0, rows)
            source_padding = None if source_padding is None else source_padding.index_select(0, rows)
        L = int(lengths.max())  # one synchronisation: the width of every row
        pad = torch.arange(L, device=dev)[None, :] >= lengths[:, None]  # (B * k, L)
        copied = self.uniform_copy(source, source_padding, lengths, L) if self.cfg.copies_source else None

        def predict(tokens, masked, rows=None):  # (confidence, token) (b, L) of the rows given (None: all)
            pick = (lambda t: t) if rows is None else (lambda t: None if t is None else t.index_select(0, rows))
            logits = self._decode(
                tokens, pick(memory), pick(source_padding), pick(pad), masked=masked, copied=pick(copied)
            ).float()
            logits[..., self.cfg.pad_id] = NEG_INF  # never generate the padding token
            return torch.log_softmax(logits, -1).max(-1)

        tokens = torch.full(pad.shape, self.cfg.pad_id, dtype=torch.long, device=dev)
        probs, tokens = predict(tokens, None if copied is not None else ~pad)
        if T_iter > 1:
            tokens, probs = self._refine(predict, tokens, probs, pad, lengths, T_iter)
        if k > 1:
            tokens, pad, lengths = self._best_candidates(tokens, probs, pad, lengths, B, k)
            L = tokens.shape[1]
        out = torch.full((B, L + 1), self.cfg.pad_id, dtype=torch.long, device=dev)
        out[:, :L] = tokens.masked_fill(pad, self.cfg.pad_id)
        if eos_id is not None:
            out[torch.arange(B, device=dev), lengths] = eos_id
        return out

    def _parallel_settings(self, iterations: int | None, length_candidates: int | None) -> tuple[int, int]:
        """(passes, length candidates) of a parallel decoding, the config's unless given; refused where they do not
        apply (one pass for the copying decoders, one length but for mask-predict)."""
        if not self.cfg.non_autoregressive:
            raise ValueError(f"parallel_decode needs a non-autoregressive decoding ({PARALLEL})")
        T_iter = self.cfg.nat_iterations if iterations is None else iterations
        k = self.cfg.length_candidates if length_candidates is None else length_candidates
        if T_iter < 1 or (self.cfg.copies_source and T_iter != 1):
            raise ValueError(
                f"iterations={T_iter}: {self.cfg.decoding!r} decodes in one pass, 'mask_predict' in at least one"
            )
        if k < 1 or (k > 1 and self.cfg.decoding != "mask_predict"):
            raise ValueError(
                f"length_candidates={k}: {self.cfg.decoding!r} decodes one length, 'mask_predict' at least one"
            )
        return T_iter, k

    @staticmethod
    def _best_candidates(tokens, probs, pad, lengths, B: int, k: int):
        """(tokens, padding, lengths) of each source's candidate of the highest average log-probability (argmax: the
        first, more probable length, on ties), cut to the longest kept."""
        dev = tokens.device
        average = probs.masked_fill(pad, 0.0).sum(1) / lengths  # (B * k,)
        best = torch.arange(B, device=dev) * k + average.view(B, k).argmax(1)  # (B,)
        lengths = lengths.index_select(0, best)
        L = int(lengths.max())
        return tokens.index_select(0, best)[:, :L], pad.index_select(0, best)[:, :L], lengths

    @staticmethod
    def _refine(predict, tokens, probs, pad, lengths, T_iter: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Mask-predict's iterations t = 1 .. T-1: the n = max(1, floor(L (T - t) / T)) least confident tokens are
        masked and predicted again (Ghazvininejad et al.'s reference code masks at least one; integer arithmetic
        here, where its floating point can round L (1 - t/T) down by one). A target of length 1 would be re-masked
        whole, its first pass's input again: its row is never passed through the decoder again. Returns the tokens
        and each one's log-probability when it was last predicted."""
        rows = (lengths > 1).nonzero().flatten()
        if rows.numel() == 0:
            return tokens, probs
        tok, prob, rpad, n_tokens = tokens[rows], probs[rows], pad[rows], lengths[rows]
        for t in range(1, T_iter):
            n = torch.div(n_tokens * (T_iter - t), T_iter, rounding_mode="floor").clamp(min=1)  # (b,)
            rank = prob.masked_fill(rpad, float("inf")).argsort(1).argsort(1)  # 0 = least confident
            masked = (rank < n[:, None]) & ~rpad
            new_p, new_t = predict(tok, masked, rows)
            tok, prob = torch.where(masked, new_t, tok), torch.where(masked, new_p, prob)
        return tokens.index_copy(0, rows, tok), probs.index_copy(0, rows, prob)

    # -- head ablation (Michel et al. 2019) -----------------------------------------------------
    def attention_modules(self) -> Iterator[tuple[str, MultiHeadAttention]]:
        """Every attention module by name, e.g. ``layers.0.attn``, ``dec_layers.1.cross``."""
        for name, module in self.named_modules():
            if isinstance(module, MultiHeadAttention):
                yield name.removesuffix(".sublayer"), module

    def set_head_mask(self, gates: dict[str, Sequence[float] | torch.Tensor] | None) -> None:
        """Scale each head's output by a gate (0 removes the head); None restores every head.

        ``gates`` maps names from ``attention_modules()`` to one gate per head, e.g.
        ``{"layers.0.attn": [1, 0, 1, 1]}``, or to a (B, H) tensor, one gate per sequence of the next batch and
        head: with ``requires_grad`` its gradient is each sequence's own dL/d(gate) (Michel et al.'s head
        importance). A tensor of float32 on the model's device is used as it is (gradients reach it). Unnamed
        modules keep all their heads.
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
            if g.dim() not in (1, 2) or g.shape[-1] != module.n_heads:
                raise ValueError(
                    f"head mask for {name} has shape {tuple(g.shape)}; expected ({module.n_heads},) or "
                    f"(batch, {module.n_heads})"
                )
            module.head_gate = g

    # -- incremental decoding -------------------------------------------------------------------
    def new_cache(self, capacity: int | None = None) -> list:
        """One cache per layer; ``capacity``: columns to preallocate (prompt + new tokens)."""
        if self.cfg.arch == "encoder_decoder":
            return [(KVCache(capacity), KVCache()) for _ in self.dec_layers]
        return [KVCache(capacity) for _ in self.layers]

    def _autoregressive(self, what: str) -> None:
        if self.cfg.arch not in ("decoder", "encoder_decoder"):
            raise ValueError(f"{what} needs arch 'decoder' or 'encoder_decoder'")
        if self.cfg.non_autoregressive:
            raise ValueError(
                f"{what} decodes left to right; this model has decoding={self.cfg.decoding!r}: use "
                "model.parallel_decode(source) or model.generate(source=...)"
            )

    def step(
        self,
        tokens: torch.Tensor,
        cache: list,
        start: int,
        memory=None,
        memory_padding=None,
        *,
        padding: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits (B, T, V) for new tokens (B, T) at columns start.., reusing and extending ``cache``.
        One step with T=1 costs O(cached keys), not a forward pass over the whole sequence. ``padding``
        (first call only) marks the left padding of the prompts; ``position_ids`` (B, T) their positions.
        ``memory`` may have fewer rows than ``tokens`` (K beams per source share it)."""
        self._autoregressive("incremental decoding")
        if self.cfg.arch == "encoder_decoder":
            return self._decode(tokens, memory, memory_padding, padding, start, cache, position_ids)
        return self._causal(tokens, padding, start, cache, position_ids)

    @staticmethod
    def _reorder(cache: list, index: torch.Tensor) -> None:
        for entry in cache:
            for c in entry if isinstance(entry, tuple) else (entry,):
                c.reorder(index)

    def _start(self, prompt, prompt_padding, source, source_padding, bos_id, max_new_tokens):
        """Prime a decoding: (logits of the last position (B, V), cache, next column, memory, next
        position ids (B,) or None)."""
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
        ids = None
        if prompt_padding is not None:
            if prompt_padding.shape != prompt.shape:
                raise ValueError(
                    f"prompt_padding {tuple(prompt_padding.shape)} must match prompt {tuple(prompt.shape)}"
                )
            if bool(prompt_padding[:, -1].any()):  # once per decoding
                raise ValueError("prompts must be left-padded (padding first, the last column real) to be batched")
            ids = ((~prompt_padding).long().cumsum(1) - 1).clamp(min=0)  # (B, T) position of each token
        T = prompt.shape[1]
        cache = self.new_cache(T + max_new_tokens)
        logits = self.step(prompt, cache, 0, memory, source_padding, padding=prompt_padding, position_ids=ids)
        return logits[:, -1], cache, T, memory, None if ids is None else ids[:, -1] + 1

    @staticmethod
    def _trim(out: torch.Tensor, eos_id: int | None) -> torch.Tensor:
        """Drop the columns after every sequence's end of sequence (one synchronisation)."""
        if eos_id is None or out.shape[1] == 0:
            return out
        is_eos = out == eos_id
        end = torch.where(is_eos.any(1), is_eos.float().argmax(1) + 1, out.shape[1])
        return out[:, : int(end.max())]

    @torch.no_grad()
    def greedy(
        self,
        prompt: torch.Tensor | None = None,
        *,
        prompt_padding: torch.Tensor | None = None,
        source: torch.Tensor | None = None,
        source_padding: torch.Tensor | None = None,
        max_new_tokens: int = 32,
        bos_id: int = 1,
        eos_id: int | None = None,
    ) -> torch.Tensor:
        """Greedy decoding with the key/value cache. Returns the generated tokens (B, <= max_new_tokens);
        after ``eos_id`` a sequence continues with pad_id. The padding token is never generated."""
        self._autoregressive("greedy")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={max_new_tokens} must be at least 1")
        logits, cache, col, memory, ids = self._start(
            prompt, prompt_padding, source, source_padding, bos_id, max_new_tokens
        )
        B = logits.shape[0]
        pad = self.cfg.pad_id
        done = torch.zeros(B, dtype=torch.bool, device=logits.device)
        out = torch.full((B, max_new_tokens), pad, dtype=torch.long, device=logits.device)
        for i in range(max_new_tokens):
            logits[:, pad] = NEG_INF
            tok = logits.argmax(-1).masked_fill(done, pad)
            out[:, i] = tok
            if eos_id is not None:
                done |= tok == eos_id
                if (i + 1) % self.check_every == 0 and bool(done.all()):
                    break
            if i + 1 < max_new_tokens:
                logits = self.step(
                    tok[:, None], cache, col, memory, source_padding, position_ids=None if ids is None else ids[:, None]
                )[:, -1]
                col += 1
                ids = None if ids is None else ids + 1
        return self._trim(out, eos_id)

    @torch.no_grad()
    def beam_search(
        self,
        prompt: torch.Tensor | None = None,
        *,
        prompt_padding: torch.Tensor | None = None,
        source: torch.Tensor | None = None,
        source_padding: torch.Tensor | None = None,
        beam_size: int = 4,
        max_new_tokens: int = 32,
        bos_id: int = 1,
        eos_id: int | None = None,
        length_penalty: float = 0.0,
    ) -> torch.Tensor:
        """Beam search with the key/value cache; the best sequence per input (B, <= max_new_tokens), padded
        after its end of sequence. The hypotheses, their length-penalised scores and the exact rule that finishes
        an input are ``models.beams.Beams``; the search stops when every input is finished (checked every
        ``check_every`` steps), which never changes the result. Beam size 1 is greedy decoding.
        """
        self._autoregressive("beam_search")
        K, N = beam_size, max_new_tokens
        if K < 1:
            raise ValueError(f"beam_size={K} must be at least 1")
        if N < 1:
            raise ValueError(f"max_new_tokens={N} must be at least 1")
        logits, cache, col, memory, ids = self._start(prompt, prompt_padding, source, source_padding, bos_id, N)
        B, dev = logits.shape[0], logits.device
        expand = torch.arange(B, device=dev).repeat_interleave(K)
        self._reorder(cache, expand)  # the self-attention caches; memory and cross-attention stay per source
        if ids is not None:
            ids = ids.repeat_interleave(K)  # the beams of an input share their positions
        dtype = torch.promote_types(logits.dtype, torch.float32)  # scores in float32 at least
        logp = torch.log_softmax(logits.to(dtype), -1).index_select(0, expand)  # (B*K, V)
        beams = Beams.start(B, K, N, dtype, dev, pad=self.cfg.pad_id, eos_id=eos_id, length_penalty=length_penalty)
        rows = torch.arange(B, device=dev)[:, None]
        for t in range(N):
            parent, last = beams.extend(logp, t)
            if t + 1 == N:
                beams.finish()
                break
            if eos_id is not None and (t + 1) % self.check_every == 0 and bool(beams.done(t + 1).all()):
                break
            self._reorder(cache, (rows * K + parent).view(-1))
            logits = self.step(
                last.view(-1, 1), cache, col, memory, source_padding, position_ids=None if ids is None else ids[:, None]
            )[:, -1]
            logp = torch.log_softmax(logits.to(dtype), -1)
            col += 1
            ids = None if ids is None else ids + 1
        best = beams.best()
        return self._trim(best, eos_id) if eos_id is not None else best[:, : t + 1]

    @torch.no_grad()
    def generate(
        self,
        prompt: torch.Tensor | None = None,
        *,
        source: torch.Tensor | None = None,
        source_padding: torch.Tensor | None = None,
        prompt_padding: torch.Tensor | None = None,
        max_new_tokens: int = 32,
        bos_id: int = 1,
        eos_id: int | None = None,
        beam_size: int = 1,
        length_penalty: float = 0.0,
    ) -> torch.Tensor:
        """The model's own decoding: ``parallel_decode`` for non-autoregressive models (at most max_new_tokens - 1
        tokens and at least 1, then eos), beam search when beam_size > 1, else greedy."""
        if self.cfg.non_autoregressive:
            return self.parallel_decode(source, source_padding, max_length=max(1, max_new_tokens - 1), eos_id=eos_id)
        kw = dict(
            prompt_padding=prompt_padding,
            source=source,
            source_padding=source_padding,
            max_new_tokens=max_new_tokens,
            bos_id=bos_id,
            eos_id=eos_id,
        )
        if beam_size > 1:
            return self.beam_search(prompt, beam_size=beam_size, length_penalty=length_penalty, **kw)
        return self.greedy(prompt, **kw)

    # -- accounting -----------------------------------------------------------------------------
    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
