"""PS1.12: which responses make a pair (online_dpo.py `preference_pairs`).

scores holds groups of G = group_size consecutive responses to one prompt. Each prompt gives one
pair: its best response (chosen) against its worst (rejected), the first of equal scores in both
cases. A prompt whose responses all score the same gives no pair (online_dpo.py's function
takes a `ties` argument; yours has none and always skips such a prompt, as ties="skip" does).

Returns (chosen rows [P], rejected rows [P]): row numbers into scores (int64), in prompt order.

Worked cases (the checker tries these first, and says the first one your function gets wrong):

- [0, 1, 0, 1 | 1, 1, 1, 1]: rows 1 over 0; the tied prompt gives none  ->  ([1], [0])
- [1, 1 | 0, 1]: the first prompt ties; the second gives rows 3 over 2  ->  ([3], [2])

Hint: put each prompt's scores on a row of their own; torch's argmax and argmin return the first
of equal values. The rows returned are rows of scores, not positions inside a group.
Check: python -m exercises.check 1.12
"""
import torch  # noqa: F401


def preference_pairs(scores, group_size):
    raise NotImplementedError("PS1.12: write preference_pairs")
