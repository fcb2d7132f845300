"""A right answer to PS1.4, written as a student would: for the grading mode's tests."""
import torch
import torch.nn.functional as F


def response_logprobs(logits, input_ids, response_len, temperature=1.0):
    """logits [B, T, V], input_ids [B, T] -> logprobs [B, R] of the last R = response_len tokens."""
    T = input_ids.shape[1]
    R = response_len
    # the logits at position t score the token at t + 1
    scoring = logits[:, T - R - 1:T - 1].float() / temperature  # [B, R, V]
    targets = input_ids[:, T - R:]  # [B, R]
    log_probs = F.log_softmax(scoring, dim=-1)
    return torch.gather(log_probs, 2, targets.unsqueeze(2)).squeeze(2)
