"""Batches: examples of one kind (``models.tasks.base``) padded into tensors."""

from __future__ import annotations

import torch

from models.tasks.base import BOS, EOS, PAD


def pad_batch(seqs: list[list[int]], value: int = PAD) -> torch.Tensor:
    """(len(seqs), longest) right-padded with ``value``; one tensor built from padded lists (a tensor per sequence
    cost more than a small model's training step)."""
    width = max(len(s) for s in seqs)
    return torch.tensor([[*s, *([value] * (width - len(s)))] for s in seqs], dtype=torch.long)


def collate(kind: str, examples: list[dict]) -> dict[str, torch.Tensor]:
    """Right-padded tensors. seq2seq: src, tgt_in (BOS + target), tgt_out (target + EOS);
    lm: tokens, and loss_mask or score_mask for the targets tokens[1:]; classify: tokens, label."""
    if kind == "seq2seq":
        return {
            "src": pad_batch([e["src"] for e in examples]),
            "tgt_in": pad_batch([[BOS, *e["tgt"]] for e in examples]),
            "tgt_out": pad_batch([[*e["tgt"], EOS] for e in examples]),
        }
    if kind == "lm":
        batch = {"tokens": pad_batch([e["tokens"] for e in examples])}
        for mask in ("loss_mask", "score_mask"):
            if examples[0].get(mask) is not None:
                batch[mask] = pad_batch([e[mask] for e in examples], 0).bool()
        return batch
    return {
        "tokens": pad_batch([e["tokens"] for e in examples]),
        "label": torch.tensor([e["label"] for e in examples], dtype=torch.long),
    }
