"""PS1.6: from per-token losses to a loss, by loss type (grpo.py `aggregate`).

per_token [b, R] and mask [b, R] (1 on the tokens that count); normaliser is a number fixed for the
whole minibatch (grpo.py's `loss_normaliser`).

    "grpo":                      sum_i [ sum_t mask * loss / sum_t mask ] / normaliser
                                 (each sequence a mean over its own tokens: long and short weigh alike)
    "bnpo", "dapo", "dr_grpo":   sum_{i,t} mask * loss / normaliser
                                 (a token sum: long answers weigh more; Dr.GRPO's normaliser is a
                                 constant, so no length bias enters through it)

A row with no counted token adds 0.

The loss is differentiated through `per_token`, so the checker compares gradients too: keep them
(no .detach(), .item() or torch.no_grad() on the way).

Worked cases (the checker tries these first, and says the first one your function gets wrong):

- grpo: rows [1, 3] (2 tokens) and [6, pad], normaliser 2: (2 + 6) / 2  ->  4
- bnpo: the same rows, normaliser 3: (1 + 3 + 6) / 3  ->  3.333
- dapo: the same rows, normaliser 3: a token sum, as bnpo's  ->  3.333
- grpo: rows [1, 3], [pad, pad] and [6, pad], normaliser 2 (the rows with a token): the empty row
  adds 0, (2 + 0 + 6) / 2  ->  4

Check: python -m exercises.check 1.6
"""
import torch  # noqa: F401


def aggregate(per_token, mask, loss_type, normaliser):
    raise NotImplementedError("PS1.6: write aggregate")
