"""PS1.9: PPO's clipped surrogate, per token (ppo.py and grpo.py `policy_loss`).

With ratio = exp(logprobs - old_logprobs), per token:

    loss = max( -A * ratio, -A * clip(ratio, 1 - epsilon, 1 + epsilon) )

The max of the two negated terms is the min of the two objectives: the pessimistic bound. A token
whose ratio has left the clip range in the direction its advantage pushes gets no gradient.
Log-probs may lie far below 0 (near -110, whose exp is 0 in float32): the ratio and the loss stay
finite.

The loss is differentiated through `logprobs`, so the checker compares gradients too: keep them
(no .detach(), .item() or torch.no_grad() on the way).

Worked cases (the checker tries these first, and says the first one your function gets wrong):

- ratios 1.5 and 0.5, A = 1, epsilon 0.2: max(-1.5, -1.2) and max(-0.5, -0.8)  ->  [[-1.2,
  -0.5]]

Hint: work out one token with A > 0 and a ratio above 1 + epsilon, and one with A < 0 and a
ratio below 1 - epsilon: which of the two terms does each take? (advantages is [b, R] here, one
per token.)
Check: python -m exercises.check 1.9
"""
import torch  # noqa: F401


def clipped_surrogate(logprobs, old_logprobs, advantages, epsilon):
    """All inputs [b, R] -> per-token losses [b, R]."""
    raise NotImplementedError("PS1.9: write clipped_surrogate")
