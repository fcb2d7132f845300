"""PS1.15: the seeded draw of a token (common/models/sampler.py `inverse_cdf`).

The sampler draws each token from one uniform number u in [0, 1) per row, so that a run is the same
whatever the batch it is sampled in. probs [B, V] need not sum to 1 (top-p zeroes some): the draw
is the first token whose cumulative probability EXCEEDS u times the row's mass,

    token = min{ i : cdf[i] > u * cdf[V-1] },   cdf = cumsum(probs)

computed in float64, so that a token of probability 0 is never drawn.

Worked cases (the checker tries these first, and says the first one your function gets wrong):

- probs [0.25, 0.25, 0.5], u = 0.6: cdf [0.25, 0.5, 1] first exceeds 0.6 at 2  ->  [2]
- the same probs, u = 0.5, exactly on a step of the cdf: 0.5 is not more than 0.5, so 2  ->  [2]
- probs [0.2, 0, 0.2], a mass of 0.4 (top-p zeroed the rest), u = 0.25: 0.25 x 0.4 = 0.1, so 0
  ->  [0]
- probs [0.5, 0.5, 0], u = 1 - 2^-32, the sampler's largest: 1, never the last token, whose
  probability is 0  ->  [1]
- rows [0.2, 0.2] and [0.5, 0.5], u = 0.4 each: each row's own mass, 0.4 and 1, so the thresholds
  are 0.16 and 0.4  ->  [0, 0]

Hint: the cdf is sorted, so the first index above a threshold is a binary search (torch has
one; read what its `right` argument does). Try u = 1 - 2^-32 in float32 and in float64.
Check: python -m exercises.check 1.15
"""
import torch  # noqa: F401


def inverse_cdf(probs, uniforms):
    """probs [B, V], uniforms [B] -> tokens [B] (int64)."""
    raise NotImplementedError("PS1.15: write inverse_cdf")
