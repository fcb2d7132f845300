"""PS1.20: DAPO's soft overlong punishment (dapo.py `overlong_penalty`).

A response that runs into the last buffer_len tokens of the budget max_new_tokens loses reward
linearly, down to -factor at the budget (a response cut there gets all of it):

    penalty = 0                                                   L <= max_new_tokens - buffer_len
    penalty = -factor * (L - (max_new_tokens - buffer_len)) / buffer_len      inside the buffer

With buffer_len 0 there is no buffer and no penalty.

Worked cases (the checker tries these first, and says the first one your function gets wrong):

- lengths [10, 18, 20], max_new_tokens 20, buffer_len 4, factor 1: the buffer starts after 16
  tokens  ->  [0, -0.5, -1]
- lengths [20], max_new_tokens 20, buffer_len 0: no buffer, and no penalty  ->  [0]

Hint: how many tokens into the buffer is a response, and what should that number be for a
response that never reaches it?
Check: python -m exercises.check 1.20
"""
import torch  # noqa: F401


def overlong_penalty(lengths, max_new_tokens, buffer_len, factor):
    """lengths [N] (int64, tokens of each response) -> [N] float penalties."""
    raise NotImplementedError("PS1.20: write overlong_penalty")
