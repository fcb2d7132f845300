"""A right answer to PS1.13, written as a student would: for the grading mode's tests."""
import torch


def step_advantages(rewards, values, next_values, dones, gamma, lam):
    """-> (advantages [E, T], returns [E, T])"""
    E, T = rewards.shape
    advantages = torch.zeros_like(rewards)
    next_value = next_values
    next_adv = torch.zeros_like(next_values)
    for t in range(T - 1, -1, -1):
        not_done = 1.0 - dones[:, t]
        delta = rewards[:, t] + gamma * next_value * not_done - values[:, t]
        adv = delta + gamma * lam * not_done * next_adv
        advantages[:, t] = adv
        next_adv = adv
        next_value = values[:, t]
    return advantages, advantages + values
