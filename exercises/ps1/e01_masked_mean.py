"""PS1.1: the masked mean (common/rl/numerics.py `masked_mean`; every algorithm file uses it).

A batch of responses is a right-padded [B, R] tensor: a response shorter than R is followed by
padding, and `mask` is 1 on real tokens and 0 on padding. A statistic over tokens must ignore the
padding:

    masked_mean(x, mask)        = sum(x * mask) / max(1, sum(mask))
    masked_mean(x, mask, dim=d) = the same along dimension d only

An all-zero mask gives 0, not NaN (a micro-batch may hold only padding).

Hint: multiply, sum, and divide by the mask's count clamped to at least 1.
Check: python -m exercises.check 1.1
"""
import torch  # noqa: F401 (you will need it)


def masked_mean(x, mask, dim=None):
    raise NotImplementedError("PS1.1: write masked_mean")
