"""The RL utilities, the design's KL/advantage module: token log-probs under a model (the training
forward), masked statistics, the KL estimators, GAE and discounted returns. Small functions, each
tested against hand-worked values; what an algorithm does with them stays in its file.

Above env and models, below run. This face names what an algorithm file may import:

    numerics    masked means and whitening, explained variance, KL estimators, GAE, returns
    logprobs    token_logprobs: one forward, the one-token shift, log-softmax, gather, entropy
"""

from common.rl.logprobs import batched_token_logprobs, logprobs_from_logits, token_logprobs
from common.rl.numerics import (discounted_returns, explained_variance, kl_estimate, kl_k1, kl_k2,
                                kl_k3, masked_mean, masked_mean_var, masked_sum, masked_whiten,
                                mismatch_stats, step_gae, token_gae)

__all__ = ["batched_token_logprobs", "discounted_returns", "explained_variance", "kl_estimate",
           "kl_k1", "kl_k2", "kl_k3", "logprobs_from_logits", "masked_mean", "masked_mean_var",
           "masked_sum", "masked_whiten", "mismatch_stats", "step_gae", "token_gae",
           "token_logprobs"]
