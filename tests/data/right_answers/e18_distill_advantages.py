"""A right answer to PS1.18, written as a student would: for the grading mode's tests."""
import torch


def distill_advantages(old_logprobs, teacher_logprobs, reward_advantages, loss_form):
    """old_logprobs, teacher_logprobs [b, R], reward_advantages [b] -> advantages [b, R]."""
    per_response = reward_advantages.unsqueeze(1) * torch.ones_like(old_logprobs)
    if loss_form == "sampled":
        reverse_kl = (old_logprobs - teacher_logprobs).detach()
        return per_response - reverse_kl
    if loss_form == "full":
        return per_response
    raise ValueError(f"unknown loss_form {loss_form}")
