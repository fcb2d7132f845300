"""A right answer to PS1.6, written as a student would: for the grading mode's tests."""
import torch


def aggregate(per_token, mask, loss_type, normaliser):
    mask = mask.to(per_token.dtype)
    masked = per_token * mask
    if loss_type == "grpo":
        lengths = mask.sum(dim=1).clamp(min=1)
        return (masked.sum(dim=1) / lengths).sum() / normaliser
    if loss_type in ("bnpo", "dapo", "dr_grpo"):
        return masked.sum() / normaliser
    raise ValueError(f"unknown loss_type {loss_type}")
