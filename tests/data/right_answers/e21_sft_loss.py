"""A right answer to PS1.21, written as a student would: for the grading mode's tests."""
import torch


def sft_loss(logprobs, loss_mask, normaliser):
    """logprobs [B, R] (float), loss_mask [B, R] (1 on a solution token), normaliser (a float)
    -> the scalar loss."""
    solution = logprobs * loss_mask.to(logprobs.dtype)
    return -solution.sum() / normaliser
