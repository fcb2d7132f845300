"""PS1.4: the log-probs of a response's tokens (common/rl/logprobs.py `token_logprobs`: the training
forward of every file).

A causal model's logits at position t predict the token at position t + 1. Given the logits of
every position [B, T, V] of sequences input_ids [B, T] whose last R tokens are the response:

    logprobs[b, j] = log softmax(logits[b, T-R-1+j] / temperature)[input_ids[b, T-R+j]]

for j = 0..R-1: the R response tokens are scored by the R positions just before them.

Hint: slice the logits one position earlier than the labels; log_softmax over the vocabulary.
Check: python -m exercises.check 1.4
"""
import torch  # noqa: F401
import torch.nn.functional as F  # noqa: F401


def response_logprobs(logits, input_ids, response_len, temperature=1.0):
    """logits [B, T, V], input_ids [B, T] -> logprobs [B, R] of the last R = response_len tokens."""
    raise NotImplementedError("PS1.4: write response_logprobs")
