"""A right answer to PS1.17, written as a student would: for the grading mode's tests."""
import torch


def off_policy_weights(old_logprobs, sampler_logprobs, mask, correction, cap=2.0, low=0.5,
                       high=5.0):
    """[b, R] each -> (weights [b, R] float, cut [b, R] bool)."""
    mask = mask.to(old_logprobs.dtype)
    log_r = (old_logprobs - sampler_logprobs) * mask  # padding: log r = 0, r = 1
    r = torch.exp(log_r)
    if correction == "none":
        return torch.ones_like(r), torch.zeros(r.shape, dtype=torch.bool)
    if correction == "tis":
        cut = r > cap
        return torch.clamp(r, max=cap), cut
    if correction == "icepop":
        cut = (r < low) | (r > high)
        return torch.where(cut, torch.zeros_like(r), r), cut
    if correction == "seq_mis":
        seq = torch.exp(log_r.sum(dim=1, keepdim=True)).expand_as(r)
        cut = seq > cap
        return torch.where(cut, torch.zeros_like(seq), seq), cut
    raise ValueError(f"unknown correction {correction}")
