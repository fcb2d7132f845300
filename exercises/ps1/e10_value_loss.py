"""PS1.10: PPO's clipped value loss, per token (ppo.py `value_loss`).

The critic's new value may move at most `clip` from the value the returns were computed with:

    values_clipped = old_values + clip(values - old_values, -clip, clip)
    loss = 0.5 * max( (values - returns)^2, (values_clipped - returns)^2 )

The loss is differentiated through `values`, so the checker compares gradients too: keep them (no
.detach(), .item() or torch.no_grad() on the way).

Worked cases (the checker tries these first, and says the first one your function gets wrong):

- V = 0.5 from 0, return 1, clip 0.2: 0.5 max(0.25, 0.64)  ->  [[0.32]]

Check: python -m exercises.check 1.10
"""
import torch  # noqa: F401


def clipped_value_loss(values, old_values, returns, clip):
    """All inputs [b, R] -> per-token losses [b, R]."""
    raise NotImplementedError("PS1.10: write clipped_value_loss")
