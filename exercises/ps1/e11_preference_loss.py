"""PS1.11: the DPO and IPO losses of a pair (online_dpo.py `dpo_loss`).

For each pair, with the log-probs of the whole responses (sums over their tokens):

    h = (log pi(y_w) - log pi_ref(y_w)) - (log pi(y_l) - log pi_ref(y_l))
    "sigmoid" (DPO):  loss = -log sigmoid(beta * h)
    "ipo" (IPO):      loss = (h - 1 / (2 * beta))^2

y_w is the chosen response, y_l the rejected one.

Hint: torch.nn.functional.logsigmoid is the stable -log(1 + exp(-z)).
Check: python -m exercises.check 1.11
"""
import torch  # noqa: F401
import torch.nn.functional as F  # noqa: F401


def preference_loss(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta,
                    loss_type):
    """Four [P] tensors of sequence log-probs -> [P] losses."""
    raise NotImplementedError("PS1.11: write preference_loss")
