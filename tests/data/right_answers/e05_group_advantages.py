"""A right answer to PS1.5, written as a student would: for the grading mode's tests."""
import torch


def group_advantages(rewards, group_size, scale=True):
    """[N * G] rewards -> [N * G] advantages."""
    groups = rewards.reshape(-1, group_size)
    centred = groups - groups.mean(dim=1, keepdim=True)
    if scale:
        centred = centred / (groups.std(dim=1, keepdim=True) + 1e-4)
    return centred.flatten()
