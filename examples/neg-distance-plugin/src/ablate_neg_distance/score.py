"""L2 attention: the score of a query and a key is minus their squared distance, scaled like dot product attention.

Kim, Papamakarios and Mnih (2021), "The Lipschitz Constant of Self-Attention", section 3: dot-product attention is
not Lipschitz, and attention with scores -||q - k||^2 / sqrt(D) is (with q and k from one tied projection). Here q
and k keep their own projections (a departure: the comparison with dot product attention is then of the score alone).
"""

from __future__ import annotations

import math

from models.attention import SCORES, Score


@SCORES.register("neg_distance")
class NegativeDistance(Score):
    dot_like = False  # computed by scores(): torch's fused kernels take q.k only

    def scores(self, q, k, heads=slice(None)):  # (B, H, T, D), (B, H, S, D) -> (B, H, T, S)
        # -||q||^2 + 2 q.k - ||k||^2, without the (B, H, T, S, D) tensor of differences
        qk = q @ k.transpose(-1, -2)
        return (2 * qk - q.pow(2).sum(-1)[..., :, None] - k.pow(2).sum(-1)[..., None, :]) / math.sqrt(q.shape[-1])
