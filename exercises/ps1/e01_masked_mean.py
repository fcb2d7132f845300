"""PS1.1: the masked mean (common/rl/numerics.py `masked_mean`; every algorithm file uses it).

A batch of responses is a right-padded [B, R] tensor: a response shorter than R is followed by
padding, and `mask` is 1 on real tokens and 0 on padding. A statistic over tokens must ignore the
padding:

    masked_mean(x, mask)        = sum(x * mask) / max(1, sum(mask))
    masked_mean(x, mask, dim=d) = sum(x * mask, d) / max(1, sum(mask, d))

With dim, each row (each slice along the other dimensions) is divided by its own count of real
tokens, not by the count of the whole batch.

An all-zero mask gives 0, not NaN (a micro-batch may hold only padding).

The loss is differentiated through `x`, so the checker compares gradients too: keep them (no
.detach(), .item() or torch.no_grad() on the way).

Worked cases (the checker tries these first, and says the first one your function gets wrong):

- x = [[1, 2, 3, 4]], mask = [[1, 1, 0, 0]]  ->  1.5
- x = [[1, 2], [3, 4]], mask = [[1, 1], [0, 0]], dim=1: the second row is all padding  ->  [1.5,
  0]
- x = [[1, 2], [3, 4]], mask = [[1, 1], [1, 0]], dim=1: rows of 2 and 1 real tokens, each divided by
  its own count  ->  [1.5, 3]

Hint: what should a padding entry add to the sum, and to the count? And what is 0 / 0 in torch?
Check: python -m exercises.check 1.1
"""
import torch  # noqa: F401 (you will need it)


def masked_mean(x, mask, dim=None):
    raise NotImplementedError("PS1.1: write masked_mean")
