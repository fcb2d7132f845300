"""A right answer to PS1.7, written as a student would: for the grading mode's tests."""
import torch


def rloo_baselines(episode_returns, group_size):
    """[N] returns -> [N] baselines."""
    groups = episode_returns.reshape(-1, group_size)
    others = groups.sum(dim=1, keepdim=True) - groups
    return (others / (group_size - 1)).flatten()
