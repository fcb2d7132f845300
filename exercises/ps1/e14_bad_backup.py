"""PS1.14: tppo's BAD backup: token-level GAE inside multi-token steps (tppo.py `compute_advantages`).

An action (a step) is R tokens; the step's reward arrives after its last token. values [E, T, R] is
V of the prefix before each token; mask [E, T, R] is 1 on real tokens (a step may be shorter than
R); rewards, dones [E, T]; next_values [E] is V of the observation after the segment. Backwards over
steps t and, inside each, over tokens j:

    at a step's last real token:  delta = r_t + gamma * V_next * (1 - done_t) - V[t, j]
                                  A     = delta + gamma * lam * (1 - done_t) * A_after
    at any other real token:      delta = V[t, j+1] - V[t, j]
                                  A     = delta + lam * A_after

V_next is V of the next step's first token (next_values after the last step) and A_after is the
advantage of the next real token (across the step boundary too). Inside a step there is no reward
and no discount. Padding gets 0 and passes A_after through. returns = (A + V) * mask.

Worked cases (the checker tries these first, and says the first one your function gets wrong):

- one env, one step of 2 tokens, r = 1, V = [0.5, 0.25], V_next = 2 (not used: the step ends the
  episode), gamma = 0.9, lam = 1: A = [0.5, 0.75]  ->  ([[[0.5, 0.75]]], [[[1, 1]]])
- one env, R = 2: a step of 1 token and padding (V 9), then a step of 2 tokens that ends the
  episode; r = [0, 1], V = [[0.5, 9], [0.25, 0.75]], gamma = 1, lam = 0.5: A = [[0.0625, 0], [0.625,
  0.25]], the padding passing 0.625 through  ->  ([[[0.0625, 0], [0.625, 0.25]]], [[[0.5625, 0],
  [0.875, 1]]])

Check: python -m exercises.check 1.14
"""
import torch  # noqa: F401


def bad_advantages(rewards, values, response_mask, next_values, dones, gamma, lam):
    """-> (advantages [E, T, R], returns [E, T, R])"""
    raise NotImplementedError("PS1.14: write bad_advantages")
