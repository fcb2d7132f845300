"""PS1.3: three estimates of KL(pi || pi_ref) from one sample (common/rl/numerics.py `kl_k1`, `kl_k2`,
`kl_k3`; Schulman, "Approximating KL divergence"). grpo.py's --kl_estimator picks one.

For a token x sampled from pi, with logp = log pi(x) and ref_logp = log pi_ref(x):

    k1 = log pi(x) / pi_ref(x)                              unbiased, can be negative
    k2 = (log pi(x) / pi_ref(x))^2 / 2                      biased, never negative
    k3 = pi_ref(x) / pi(x) - 1 - log(pi_ref(x) / pi(x))     unbiased, never negative (GRPO's)

The loss is differentiated through `logp`, so the checker compares gradients too: keep them (no
.detach(), .item() or torch.no_grad() on the way).

Worked cases (the checker tries these first, and says the first one your function gets wrong):

- k3 with pi = 0.5, pi_ref = 0.25: 0.5 - 1 - log 0.5  ->  [0.1931]

Hint: every ratio is an exp of a difference of log-probs; watch which way round each ratio is.
Check: python -m exercises.check 1.3
"""
import torch  # noqa: F401


def kl_estimate(logp, ref_logp, estimator):
    """Per-token estimate by name: "k1", "k2" or "k3"."""
    raise NotImplementedError("PS1.3: write kl_estimate")
