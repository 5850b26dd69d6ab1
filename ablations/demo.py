"""A quick look at the model without any infrastructure: a few variants, a few optimisation steps each."""

from __future__ import annotations

import time

import torch

from models import ModelConfig, Transformer

BASE = {"arch": "decoder", "vocab_size": 16, "d_model": 64, "n_heads": 4, "n_layers": 2, "norm": "post"}
VARIANTS = {
    "post-LN, sinusoidal, dot, full": {},
    "pre-LN, rotary, dot, full": {"norm": "pre", "positions": "rotary"},
    "pre-LN, learned, additive, full": {"norm": "pre", "positions": "learned", "score": "additive"},
    "pre-LN, alibi, dot, local w=4": {"norm": "pre", "positions": "alibi", "pattern": "local", "window": 4},
    "pre-LN, sinusoidal, cosine, dilated w=4 d=2": {
        "norm": "pre",
        "score": "cosine",
        "pattern": "dilated",
        "window": 4,
        "dilation": 2,
    },
}


def demo(steps: int = 30, seed: int = 0) -> dict[str, tuple[float, float]]:
    """Train each variant to copy random sequences (decoder, teacher forcing); print loss before and after."""
    torch.set_num_threads(1)
    results = {}
    print(f"{'variant':<46} {'params':>8} {'loss@0':>8} {'loss@' + str(steps):>8} {'s/step':>8}")
    for name, overrides in VARIANTS.items():
        torch.manual_seed(seed)
        cfg = ModelConfig(**{**BASE, **overrides})
        model = Transformer(cfg)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        first = last = float("nan")
        start = time.perf_counter()
        for step in range(steps + 1):
            half = torch.randint(2, 16, (32, 12))
            seq = torch.cat([half, half], dim=1)  # the second half repeats the first: learnable by attention
            logits = model(seq[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits[:, 12:].reshape(-1, 16), seq[:, 13:].reshape(-1))
            if step == 0:
                first = loss.item()
            if step == steps:
                last = loss.item()
                break
            opt.zero_grad()
            loss.backward()
            opt.step()
        per_step = (time.perf_counter() - start) / max(steps, 1)
        results[name] = (first, last)
        print(f"{name:<46} {model.num_parameters():>8,} {first:>8.3f} {last:>8.3f} {per_step:>8.3f}")
    return results
