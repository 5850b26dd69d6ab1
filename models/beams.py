"""Beam search's bookkeeping, apart from the model: per input, K live hypotheses and a pool of the K best finished
ones (the scheme of fairseq and Hugging Face), as tensors. ``Transformer.beam_search`` feeds it each step's
log-probabilities and reorders its key/value cache by the parents it returns.

Notation: B inputs, K beams, V vocabulary, N new tokens at most.

A hypothesis of n generated tokens (its end of sequence included) with summed log-probability s scores
s / n**length_penalty, in the pool and in the final choice alike. Each step ranks the 2K best extensions of the
live hypotheses (never by the padding token; live hypotheses of one step have one length, so their ranking does
not depend on the penalty); an extension by ``eos_id`` among the first K joins the pool, and the first K others
stay live. Hypotheses still live after N tokens join the pool with n = N.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

NEG_INF = float("-inf")


@dataclass
class Beams:
    """The hypotheses of one beam search over B inputs (the module's docstring: their scores and ranking)."""

    live: torch.Tensor  # (B, K) summed log-probabilities of the live hypotheses; NEG_INF: not alive
    seqs: torch.Tensor  # (B, K, N) their tokens, pad after
    pool: torch.Tensor  # (B, K) normalised scores of the finished hypotheses, best first; NEG_INF: empty
    pool_seqs: torch.Tensor  # (B, K, N)
    rank: torch.Tensor  # (2K,) 0 .. 2K - 1: the order of a step's candidates, best first
    length_penalty: float
    pad: int
    eos_id: int | None

    @classmethod
    def start(cls, B: int, K: int, N: int, dtype, device, *, pad: int, eos_id: int | None, length_penalty: float):
        live = torch.full((B, K), NEG_INF, dtype=dtype, device=device)
        live[:, 0] = 0.0  # the beams of an input start identical: only one is alive
        seqs = torch.full((B, K, N), pad, dtype=torch.long, device=device)
        rank = torch.arange(2 * K, device=device)
        return cls(live, seqs, torch.full_like(live, NEG_INF), seqs.clone(), rank, float(length_penalty), pad, eos_id)

    def extend(self, logp: torch.Tensor, t: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Step ``t``: extend the live hypotheses by ``logp`` (B*K, V), the next token's log-probabilities of each.
        Returns the new live hypotheses' parent beams (B, K) and last tokens (B, K)."""
        B, K, N = self.seqs.shape
        V = logp.shape[-1]
        cand = self.live[..., None] + logp.view(B, K, V)
        cand[..., self.pad] = NEG_INF
        top, flat = cand.view(B, K * V).topk(2 * K, dim=1)  # best first
        beam, tok = flat // V, flat % V
        new = self.seqs.gather(1, beam[..., None].expand(-1, -1, N))
        new[..., t] = tok
        if self.eos_id is not None:
            is_eos = tok == self.eos_id
            n = t + 1  # generated tokens of the candidates, end of sequence included
            fin = torch.where(is_eos & (self.rank < K), top / n**self.length_penalty, torch.full_like(top, NEG_INF))
            self._join(fin, new)
            pick = (self.rank + 2 * K * is_eos).argsort(1)[:, :K]  # the first K that do not end here
        else:
            pick = self.rank[:K].expand(B, K)
        self.live = top.gather(1, pick)
        self.seqs = new.gather(1, pick[..., None].expand(-1, -1, N))
        return beam.gather(1, pick), tok.gather(1, pick)

    def _join(self, scores: torch.Tensor, seqs: torch.Tensor) -> None:
        """Keep the K best of the pool and of the finished candidates ``scores`` (B, C) with their ``seqs``."""
        K, N = self.pool.shape[1], self.seqs.shape[2]
        self.pool, which = torch.cat([self.pool, scores], 1).topk(K, dim=1)
        self.pool_seqs = torch.cat([self.pool_seqs, seqs], 1).gather(1, which[..., None].expand(-1, -1, N))

    def done(self, n: int) -> torch.Tensor:
        """(B,) True where no live hypothesis (n tokens so far) can still beat the worst of a full pool: its best
        reachable score is s / N**length_penalty when the penalty is positive (s only decreases, the divisor grows
        up to N) and s / (n + 1)**penalty otherwise. The bound is exact: stopping never changes the result."""
        N, lp = self.seqs.shape[2], self.length_penalty
        best = self.live.max(1).values
        bound = best / N**lp if lp > 0 else best / (n + 1) ** lp
        worst = self.pool[:, -1]
        return ((worst > NEG_INF) & (bound <= worst)) | (best == NEG_INF)

    def finish(self) -> None:
        """The hypotheses still live after N tokens join the pool with n = N."""
        self._join(self.live / self.seqs.shape[2] ** self.length_penalty, self.seqs)

    def best(self) -> torch.Tensor:
        """(B, N) the best hypothesis of each input's pool."""
        return self.pool_seqs[torch.arange(self.pool.shape[0], device=self.pool.device), self.pool.argmax(1)]
