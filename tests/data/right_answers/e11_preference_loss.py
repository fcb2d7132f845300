"""A right answer to PS1.11, written as a student would: for the grading mode's tests."""
import torch
import torch.nn.functional as F


def preference_loss(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta,
                    loss_type):
    """Four [P] tensors of sequence log-probs -> [P] losses."""
    chosen_ratio = chosen_logps - ref_chosen_logps
    rejected_ratio = rejected_logps - ref_rejected_logps
    h = chosen_ratio - rejected_ratio
    if loss_type == "sigmoid":
        return -F.logsigmoid(beta * h)
    if loss_type == "ipo":
        return (h - 1 / (2 * beta)) ** 2
    raise ValueError(f"unknown loss_type {loss_type}")
