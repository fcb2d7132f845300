"""PS1.4: the log-probs of a response's tokens (common/models/logprobs.py `token_logprobs`: the training
forward of every file).

A causal model's logits at position t predict the token at position t + 1. Given the logits of
every position [B, T, V] of sequences input_ids [B, T] whose last R tokens are the response:

    logprobs[b, j] = log softmax(logits[b, T-R-1+j] / temperature)[input_ids[b, T-R+j]]

for j = 0..R-1: the R response tokens are scored by the R positions just before them. Logits may
lie far apart: a token of probability e^-200, 0 in float32, still has its log-prob, -200, never
-inf.

The loss is differentiated through `logits`, so the checker compares gradients too: keep them (no
.detach(), .item() or torch.no_grad() on the way).

Worked cases (the checker tries these first, and says the first one your function gets wrong):

- logits [1, 3, 2] with rows [log 3, 0], [log 3, 0], [0, 5]; input_ids [[0, 1, 0]], a response
  of 2 tokens: log 1/4 and log 3/4  ->  [[-1.386, -0.2877]]
- the same at temperature 0.5: the logits doubled, log 1/10 and log 9/10  ->  [[-2.303,
  -0.1054]]

Hint: write out which position's logits score the first response token for T = 5, R = 2; and
over which axis is a distribution normalised?
Check: python -m exercises.check 1.4
"""
import torch  # noqa: F401
import torch.nn.functional as F  # noqa: F401


def response_logprobs(logits, input_ids, response_len, temperature=1.0):
    """logits [B, T, V], input_ids [B, T] -> logprobs [B, R] of the last R = response_len tokens."""
    raise NotImplementedError("PS1.4: write response_logprobs")
