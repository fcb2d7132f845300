"""PS1.9: PPO's clipped surrogate, per token (ppo.py and grpo.py `policy_loss`).

With ratio = exp(logprobs - old_logprobs), per token:

    loss = max( -A * ratio, -A * clip(ratio, 1 - epsilon, 1 + epsilon) )

The max of the two negated terms is the min of the two objectives: the pessimistic bound. A token
whose ratio has left the clip range in the direction its advantage pushes gets no gradient.

Hint: torch.max, torch.clamp; advantages is [b, R] here, one per token.
Check: python -m exercises.check 1.9
"""
import torch  # noqa: F401


def clipped_surrogate(logprobs, old_logprobs, advantages, epsilon):
    """All inputs [b, R] -> per-token losses [b, R]."""
    raise NotImplementedError("PS1.9: write clipped_surrogate")
