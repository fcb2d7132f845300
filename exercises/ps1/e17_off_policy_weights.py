"""PS1.17: the off-policy weights of async GRPO: TIS, IcePop and sequence-level MIS (async_grpo.py
`off_policy_weights`).

The sampler mu ran some updates behind the trainer, whose weights now are pi_prox. Each sampled
token's weight in the loss corrects for that, from the ratio

    r_t = pi_prox(o_t) / mu(o_t) = exp(old_logprobs - sampler_logprobs)

on the real tokens (a padding token counts as r = 1). By `correction`:

    "none"     w_t = 1
    "tis"      w_t = min(r_t, cap)                              truncated: never above cap
    "icepop"   w_t = r_t if low <= r_t <= high, else 0           a token far off is masked
    "seq_mis"  w_t = R if R <= cap, else 0, R = prod_t r_t       one weight per response, masked

cut is True where a bound changed the weight: r_t > cap (tis), r_t outside [low, high] (icepop),
R > cap on every token of the response (seq_mis), nowhere (none).

Worked cases (the checker tries these first, and says the first one your function gets wrong):

- r = [[0.5, 1.5, 3.0]], tis with cap 2  ->  ([[0.5, 1.5, 2]], [[False, False, True]])
- r = [[0.5, 1.5, 3.0]], icepop with low 0.6, high 2  ->  ([[0, 1.5, 0]], [[True, False, True]])
- r = [[0.5, 1.5, 3.0]], seq_mis with cap 2  ->  ([[0, 0, 0]], [[True, True, True]])
- r = [[2, 3]] with the second token padding, seq_mis, cap 2.5: the padding counts as r = 1, so
  R = 2  ->  ([[2, 2]], [[False, False]])
- r = [[1, 1]], tis with cap 1: a ratio on a bound is kept, not cut  ->  ([[1, 1]], [[False,
  False]])
- r = [[1, 1]], icepop with low = high = 1: a ratio on a bound is kept, not cut  ->  ([[1, 1]],
  [[False, False]])
- r = [[1, 1]], seq_mis with cap 1: a ratio on a bound is kept, not cut  ->  ([[1, 1]], [[False,
  False]])

Hint: work with the log-ratio, zeroed on padding: a product of ratios is an exp of a sum.
Check: python -m exercises.check 1.17
"""
import torch  # noqa: F401


def off_policy_weights(old_logprobs, sampler_logprobs, mask, correction, cap=2.0, low=0.5,
                       high=5.0):
    """[b, R] each -> (weights [b, R] float, cut [b, R] bool)."""
    raise NotImplementedError("PS1.17: write off_policy_weights")
