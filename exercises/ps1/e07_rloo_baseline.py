"""PS1.7: the leave-one-out baseline of RLOO (reinforce.py `compute_baselines`, --baseline rloo).

episode_returns holds groups of k = group_size consecutive samples of the same prompt. Sample i's
baseline is the mean of the OTHER k - 1 samples of its group:

    b_i = (sum_j r_j - r_i) / (k - 1)

so that b_i does not depend on sample i itself and the gradient estimate stays unbiased.

Worked cases (the checker tries these first, and says the first one your function gets wrong):

- one group [1, 0, 0, 1]: b_0 = (0 + 0 + 1) / 3  ->  [0.3333, 0.6667, 0.6667, 0.3333]
- two groups [1, 0 | 3, 3]: each sample's baseline is the other one of its group  ->  [0, 1, 3, 3]

Hint: the sum of the others is the group's sum minus the sample itself; no loop over samples is
needed.
Check: python -m exercises.check 1.7
"""
import torch  # noqa: F401


def rloo_baselines(episode_returns, group_size):
    """[N] returns -> [N] baselines."""
    raise NotImplementedError("PS1.7: write rloo_baselines")
