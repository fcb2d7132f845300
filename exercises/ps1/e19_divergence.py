"""PS1.19: the full-vocabulary divergence of distillation (distill.py `divergence`, which
`full_divergence` takes at every response position).

At each prefix the student's next-token distribution pi and the teacher's pi_T are compared over
the whole vocabulary, as TRL's DistillationTrainer does, with beta (--jsd_beta):

    beta = 1:      KL(pi || pi_T)   = sum_v pi(v) (log pi(v) - log pi_T(v))       reverse
    beta = 0:      KL(pi_T || pi)   = sum_v pi_T(v) (log pi_T(v) - log pi(v))     forward
    0 < beta < 1:  beta KL(pi_T || m) + (1 - beta) KL(pi || m),  m = beta pi_T + (1 - beta) pi

The logits are already divided by the temperature. The training differentiates this through the
student's logits: the teacher is frozen.

The loss is differentiated through `student_logits`, so the checker compares gradients too: keep
them (no .detach(), .item() or torch.no_grad() on the way).

Worked cases (the checker tries these first, and says the first one your function gets wrong):

- pi = [0.5, 0.5], pi_T = [0.25, 0.75], beta 1.0  ->  0.1438
- pi = [0.5, 0.5], pi_T = [0.25, 0.75], beta 0.0  ->  0.1308
- pi = [0.5, 0.5], pi_T = [0.25, 0.75], beta 0.5  ->  0.03382
- pi = [0.5, 0.5], pi_T = [0.25, 0.75], beta 0.25  ->  0.02487
- student and teacher logits [0, -1000]: neither puts any mass on the second word, so 0 at beta
  0.5  ->  0
- two positions [2, 2], each pi = [0.5, 0.5] and pi_T = [0.25, 0.75], beta 1.0: one divergence per
  position, over the vocabulary (the last dimension)  ->  [0.1438, 0.1438]

Hint: stay in log space: log m can be formed from the two log-probs and log beta, log(1 - beta)
without ever taking a probability (torch has log(e^a + e^b)), which stays finite where a
probability underflows.
Check: python -m exercises.check 1.19
"""
import math  # noqa: F401

import torch  # noqa: F401
import torch.nn.functional as F  # noqa: F401


def divergence(student_logits, teacher_logits, beta):
    """[..., V] logits each -> [...] divergences (float32)."""
    raise NotImplementedError("PS1.19: write divergence")
