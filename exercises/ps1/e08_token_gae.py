"""PS1.8: GAE and returns over response tokens (common/rl/numerics.py `token_gae`, ppo.py's advantages).

rewards, values, mask: [B, R], right-padded. Each row's episode ends at its last real token, whose
successor has value 0. Backwards over t:

    delta_t = r_t + gamma * V_{t+1} * (1 - done_t) - V_t
    A_t     = delta_t + gamma * lam * (1 - done_t) * A_{t+1}
    returns = A + V

done_t = 1 at the last real token of a row. Padding gets advantage and return 0.

Worked cases (the checker tries these first, and says the first one your function gets wrong):

- one row of 2 tokens, r = [0, 1], V = [0.5, 0.25], gamma = lam = 1  ->  ([[0.5, 0.75]], [[1,
  1]])
- the same row, gamma = 0.5, lam = 1: delta_0 = 0.5 x 0.25 - 0.5, A_0 = delta_0 + 0.5 x 0.75 = 0
  ->  ([[0, 0.75]], [[0.5, 1]])
- r = [0, 1, pad], V = [0.5, 0.25, 9 on the padding], gamma = 1, lam = 0.5: the row ends at its
  second token, so the 9 never comes back: A_0 = -0.25 + 0.5 x 0.75  ->  ([[0.125, 0.75, 0]],
  [[0.625, 1, 0]])

Hint: A_t needs A_{t+1}: which direction must the loop over t go? Every row can be handled at
once, and done_t and the padding can both be read off the mask.
Check: python -m exercises.check 1.8
"""
import torch  # noqa: F401


def token_gae(rewards, values, mask, gamma, lam):
    """-> (advantages [B, R], returns [B, R])"""
    raise NotImplementedError("PS1.8: write token_gae")
