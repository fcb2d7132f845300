"""A right answer to PS1.2, written as a student would: for the grading mode's tests."""
import torch


def masked_whiten(x, mask, shift_mean=True, eps=1e-8):
    mask = mask.to(x.dtype)
    n = mask.sum()
    mean = (x * mask).sum() / n.clamp(min=1)
    # unbiased: divide by n - 1, but by 1 when there is a single real entry
    var = (((x - mean) ** 2) * mask).sum() / (n - 1).clamp(min=1)
    out = (x - mean) / torch.sqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return out * mask
