"""PS1.8: GAE and returns over response tokens (common/rl/numerics.py `token_gae`, ppo.py's advantages).

rewards, values, mask: [B, R], right-padded. Each row's episode ends at its last real token, whose
successor has value 0. Backwards over t:

    delta_t = r_t + gamma * V_{t+1} * (1 - done_t) - V_t
    A_t     = delta_t + gamma * lam * (1 - done_t) * A_{t+1}
    returns = A + V

done_t = 1 at the last real token of a row. Padding gets advantage and return 0.

Hint: a loop over t from R - 1 down to 0, carrying the next A and V of every row at once.
Check: python -m exercises.check 1.8
"""
import torch  # noqa: F401


def token_gae(rewards, values, mask, gamma, lam):
    """-> (advantages [B, R], returns [B, R])"""
    raise NotImplementedError("PS1.8: write token_gae")
