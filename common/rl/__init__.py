"""The RL utilities, the design's KL/advantage module: masked statistics, the KL estimators, GAE
and discounted returns. Small functions, each tested against hand-worked values; what an algorithm
does with them stays in its file. (The token log-probs they are computed from are the model's:
common/models/logprobs.py.)

Above env and models, below run. This face names what an algorithm file may import:

    numerics    masked means and whitening, explained variance, KL estimators, GAE, returns
"""

from common.rl.numerics import (discounted_returns, explained_variance, kl_estimate, kl_k1, kl_k2,
                                kl_k3, masked_mean, masked_mean_var, masked_sum, masked_whiten,
                                mismatch_stats, step_gae, token_gae)

__all__ = ["discounted_returns", "explained_variance", "kl_estimate", "kl_k1", "kl_k2", "kl_k3",
           "masked_mean", "masked_mean_var", "masked_sum", "masked_whiten", "mismatch_stats",
           "step_gae", "token_gae"]
