"""PS1.2: whitening over the real tokens (common/rl/numerics.py `masked_whiten`; ppo.py whitens its
rewards and advantages with it).

    mean = masked mean of x,   var = sum(mask * (x - mean)^2) / (n - 1),   n = sum(mask)
    whiten(x) = (x - mean) / sqrt(var + eps)            (shift_mean=True)
    whiten(x) = (x - mean) / sqrt(var + eps) + mean     (shift_mean=False: TRL's reward whitening)

and 0 on the padding. The variance is the unbiased one (n - 1), as torch.var and TRL take it; with
a single real entry (n = 1) divide by 1.

Worked cases (the checker tries these first, and says the first one your function gets wrong):

- x = [[1, 3, 9]], mask = [[1, 1, 0]]: mean 2, unbiased var 2  ->  [[-0.7071, 0.7071, 0]]
- x = [[1, 3], [5, 0]], mask = [[1, 1], [1, 0]]: mean 3 and var 4 over the three real entries of
  both rows  ->  [[-1, 0], [1, 0]]

Hint: which entries may the mean and the variance see, and what should the padding be afterwards?
Check: python -m exercises.check 1.2
"""
import torch  # noqa: F401


def masked_whiten(x, mask, shift_mean=True, eps=1e-8):
    raise NotImplementedError("PS1.2: write masked_whiten")
