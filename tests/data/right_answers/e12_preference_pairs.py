"""A right answer to PS1.12, written as a student would: for the grading mode's tests."""
import torch


def preference_pairs(scores, group_size):
    groups = scores.reshape(-1, group_size)
    best = torch.argmax(groups, dim=1)
    worst = torch.argmin(groups, dim=1)
    not_tied = groups.max(dim=1).values != groups.min(dim=1).values
    offsets = torch.arange(groups.shape[0]) * group_size
    chosen = (offsets + best)[not_tied]
    rejected = (offsets + worst)[not_tied]
    return chosen, rejected
