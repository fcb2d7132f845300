"""PS1.21: the supervised loss on worked solutions (sft.py `sft_loss`).

A cold start before RL trains the model to write a worked solution after its prompt. The prompt
is given, not learned: only the solution's tokens count, and padding never does. The loss is the
negative log-likelihood of those tokens, summed and divided by `normaliser`, the number of
solution tokens in the whole batch (TRL's token mean), which the update fixes before it splits
the batch into micro-batches:

    loss = - sum_{i,t} mask_it * logprobs_it / normaliser

The loss is differentiated through `logprobs`, so the checker compares gradients too: keep them
(no .detach(), .item() or torch.no_grad() on the way).

Worked cases (the checker tries these first, and says the first one your function gets wrong):

- logprobs [[-1, -2, -9], [-0.5, -9, -9]], mask [[1, 1, 0], [1, 0, 0]], normaliser 3  ->  1.167
  (three solution tokens: (1 + 2 + 0.5) / 3)
- the same rows as one micro-batch of a batch of 7 tokens (normaliser 7)  ->  0.5

Hint: which entries of logprobs are solution tokens, and by what does this micro-batch divide?
Check: python -m exercises.check 1.21
"""
import torch  # noqa: F401


def sft_loss(logprobs, loss_mask, normaliser):
    """logprobs [B, R] (float), loss_mask [B, R] (1 on a solution token), normaliser (a float)
    -> the scalar loss."""
    raise NotImplementedError("PS1.21: write sft_loss")
