"""PS1.15: the seeded draw of a token (common/models/sampler.py `inverse_cdf`).

The sampler draws each token from one uniform number u in [0, 1) per row, so that a run is the same
whatever the batch it is sampled in. probs [B, V] need not sum to 1 (top-p zeroes some): the draw
is the first token whose cumulative probability EXCEEDS u times the row's mass,

    token = min{ i : cdf[i] > u * cdf[V-1] },   cdf = cumsum(probs)

computed in float64, so that a token of probability 0 is never drawn.

Hint: torch.searchsorted(cdf, threshold, right=True) finds the first index whose value exceeds it.
Check: python -m exercises.check 1.15
"""
import torch  # noqa: F401


def inverse_cdf(probs, uniforms):
    """probs [B, V], uniforms [B] -> tokens [B] (int64)."""
    raise NotImplementedError("PS1.15: write inverse_cdf")
