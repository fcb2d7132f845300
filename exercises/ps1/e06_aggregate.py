"""PS1.6: from per-token losses to a loss, by loss type (grpo.py `aggregate`).

per_token [b, R] and mask [b, R] (1 on the tokens that count); normaliser is a number fixed for the
whole minibatch (grpo.py's `loss_normaliser`).

    "grpo":                      sum_i [ sum_t mask * loss / sum_t mask ] / normaliser
                                 (each sequence a mean over its own tokens: long and short weigh alike)
    "bnpo", "dapo", "dr_grpo":   sum_{i,t} mask * loss / normaliser
                                 (a token sum: long answers weigh more; Dr.GRPO's normaliser is a
                                 constant, so no length bias enters through it)

A row with no counted token adds 0.

Check: python -m exercises.check 1.6
"""
import torch  # noqa: F401


def aggregate(per_token, mask, loss_type, normaliser):
    raise NotImplementedError("PS1.6: write aggregate")
