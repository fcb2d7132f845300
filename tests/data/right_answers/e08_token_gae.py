"""A right answer to PS1.8, written as a student would: for the grading mode's tests."""
import torch


def token_gae(rewards, values, mask, gamma, lam):
    """-> (advantages [B, R], returns [B, R])"""
    mask = mask.to(rewards.dtype)
    B, R = rewards.shape
    advantages = torch.zeros_like(rewards)
    next_value = torch.zeros(B, dtype=rewards.dtype)
    next_adv = torch.zeros(B, dtype=rewards.dtype)
    for t in range(R - 1, -1, -1):
        # token t ends its row when the next token is padding (or there is none)
        if t + 1 < R:
            not_done = mask[:, t + 1]
        else:
            not_done = torch.zeros(B, dtype=rewards.dtype)
        delta = rewards[:, t] + gamma * next_value * not_done - values[:, t]
        adv = (delta + gamma * lam * not_done * next_adv) * mask[:, t]
        advantages[:, t] = adv
        next_adv = adv
        next_value = values[:, t]
    returns = (advantages + values) * mask
    return advantages, returns
