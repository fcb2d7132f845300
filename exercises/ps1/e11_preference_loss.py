"""PS1.11: the DPO and IPO losses of a pair (online_dpo.py `dpo_loss`).

For each pair, with the log-probs of the whole responses (sums over their tokens):

    h = (log pi(y_w) - log pi_ref(y_w)) - (log pi(y_l) - log pi_ref(y_l))
    "sigmoid" (DPO):  loss = -log sigmoid(beta * h)
    "ipo" (IPO):      loss = (h - 1 / (2 * beta))^2

y_w is the chosen response, y_l the rejected one.

The loss is differentiated through `chosen_logps` and `rejected_logps`, so the checker compares
gradients too: keep them (no .detach(), .item() or torch.no_grad() on the way).

Worked cases (the checker tries these first, and says the first one your function gets wrong):

- h = 0 (policy = reference), DPO: -log sigmoid(0) = log 2  ->  [0.6931]
- chosen -3, rejected -5, both -4 under the reference, beta 1, DPO: h = 1 - (-1) = 2, -log
  sigmoid(2) = log(1 + e^-2)  ->  [0.1269]
- the same pair, IPO, beta 0.5: (h - 1 / (2 x 0.5))^2 = (2 - 1)^2  ->  [1]

Hint: -log sigmoid(z) = log(1 + exp(-z)) overflows for very negative z if written as it reads;
torch has a stable form of log sigmoid.
Check: python -m exercises.check 1.11
"""
import torch  # noqa: F401
import torch.nn.functional as F  # noqa: F401


def preference_loss(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta,
                    loss_type):
    """Four [P] tensors of sequence log-probs -> [P] losses."""
    raise NotImplementedError("PS1.11: write preference_loss")
