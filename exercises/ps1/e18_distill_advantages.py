"""PS1.18: on-policy distillation's per-token advantage (distill.py `distill_advantages`).

The student sampled each token o_t; the teacher scores it. In the sampled form (Thinking Machines'
on-policy distillation) minus the reverse KL at the sampled token is a per-token reward, and the
verifier's group advantage A_i (0 without --reward_weight) is added to every token of response i:

    "sampled":  A_it = A_i - (log pi_old(o_t) - log pi_T(o_t))
    "full":     A_it = A_i          (the divergence itself is the loss: 1.19)

A token the teacher likes more than the student scores above 0. The advantage is a number, not a
function of the weights: the gradient flows through the ratio of the clipped loss alone.

Worked cases (the checker tries these first, and says the first one your function gets wrong):

- pi_old [0.5, 0.25], pi_T [0.25, 0.5], A_i = 1, sampled  ->  [[0.3069, 1.693]]
- pi_old [0.5, 0.25], pi_T [0.25, 0.5], A_i = 1, full  ->  [[1, 1]]

Hint: reward_advantages is [b], one per response; the log-probs are [b, R].
Check: python -m exercises.check 1.18
"""
import torch  # noqa: F401


def distill_advantages(old_logprobs, teacher_logprobs, reward_advantages, loss_form):
    """old_logprobs, teacher_logprobs [b, R], reward_advantages [b] -> advantages [b, R]."""
    raise NotImplementedError("PS1.18: write distill_advantages")
