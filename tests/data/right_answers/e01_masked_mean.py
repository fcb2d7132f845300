"""A right answer to PS1.1, written as a student would: for the grading mode's tests."""
import torch


def masked_mean(x, mask, dim=None):
    mask = mask.to(x.dtype)
    if dim is None:
        total = (x * mask).sum()
        count = mask.sum()
    else:
        total = (x * mask).sum(dim)
        count = mask.sum(dim)
    return total / count.clamp(min=1)
