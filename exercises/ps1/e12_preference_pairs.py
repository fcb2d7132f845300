"""PS1.12: which responses make a pair (online_dpo.py `preference_pairs`).

scores holds groups of G = group_size consecutive responses to one prompt. Each prompt gives one
pair: its best response (chosen) against its worst (rejected), the first of equal scores in both
cases. A prompt whose responses all score the same gives no pair (ties="skip").

Returns (chosen rows [P], rejected rows [P]): row numbers into scores, in prompt order.

Hint: argmax and argmin along dim=1 take the first of equals; add each group's first row.
Check: python -m exercises.check 1.12
"""
import torch  # noqa: F401


def preference_pairs(scores, group_size):
    raise NotImplementedError("PS1.12: write preference_pairs")
