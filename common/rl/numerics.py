"""The small numerics a reader studies with the algorithms: masked statistics, KL estimators,
GAE and discounted returns, and the sampler-trainer mismatch. Torch only; each is unit-tested once
by hand (tests/test_numerics.py), and the algorithm files combine them.

Statistics that whiten or compare over a batch (`masked_mean_var`, `masked_whiten`,
`explained_variance`) reduce over every rank, so one process sees the numbers N processes see."""

import torch

from common.distributed import all_reduce_sum


# ------------------------------------------------------------------------------------------------
# Masked statistics
# ------------------------------------------------------------------------------------------------
def masked_sum(x, mask, dim=None):
    return (x * mask).sum() if dim is None else (x * mask).sum(dim)


def masked_mean(x, mask, dim=None):
    """Mean over the entries where mask is 1. An all-zero mask gives 0, not NaN."""
    return masked_sum(x, mask, dim) / (mask.sum() if dim is None else mask.sum(dim)).clamp(min=1)


def masked_mean_var(x, mask):
    """Mean and unbiased variance of the masked entries over every rank's tensors (one process sees
    the same numbers as N processes on the whole batch), computed in float64."""
    stats = all_reduce_sum(torch.stack([masked_sum(x, mask), mask.sum()]).double())
    count = stats[1].clamp(min=1)
    mean = stats[0] / count
    sq = all_reduce_sum(masked_sum((x.double() - mean) ** 2, mask).reshape(1))[0]
    var = sq / (count - 1) if count > 1 else sq / count
    return mean.to(x.dtype), var.to(x.dtype)


def masked_whiten(x, mask, shift_mean=True, eps=1e-8, eps_on_std=False):
    """(x - mean) / sqrt(var + eps) over the masked entries of all ranks (TRL, oat), or with
    eps_on_std (x - mean) / (std + eps) (OpenR); shift_mean=False adds the mean back (TRL's reward
    whitening). Masked-out entries come back as 0. The two differ only when the variance is near eps
    or below."""
    mean, var = masked_mean_var(x, mask)
    if eps_on_std:
        out = (x - mean) / (var.clamp(min=0).sqrt() + eps)
    else:
        out = (x - mean) * torch.rsqrt(var + eps)
    return (out if shift_mean else out + mean) * mask


def explained_variance(values, returns, mask):
    """1 - Var(returns - values) / Var(returns) over every rank's masked entries: 1 is a perfect
    critic, 0 no better than predicting the mean return, negative worse; NaN when the returns do not
    vary."""
    var_returns = masked_mean_var(returns, mask)[1]
    var_error = masked_mean_var(returns - values, mask)[1]
    return (1 - var_error / var_returns).item() if var_returns > 0 else float("nan")


# ------------------------------------------------------------------------------------------------
# KL estimators (Schulman, "Approximating KL divergence"), all per token, for samples x ~ pi
# ------------------------------------------------------------------------------------------------
def kl_k1(logp, ref_logp):
    """log pi/pi_ref: unbiased for KL(pi||pi_ref), high variance, can be negative."""
    return logp - ref_logp


def kl_k2(logp, ref_logp):
    """(log pi/pi_ref)^2 / 2: biased, low variance, never negative."""
    return 0.5 * (logp - ref_logp) ** 2


def kl_k3(logp, ref_logp):
    """pi_ref/pi - 1 - log(pi_ref/pi): unbiased and never negative (the GRPO paper's estimator)."""
    log_ratio = (ref_logp - logp).clamp(-20, 20)  # exp of a large log-ratio would overflow to inf
    return torch.expm1(log_ratio) - log_ratio


@torch.no_grad()
def mismatch_stats(trainer_logprobs, sampler_logprobs, mask):
    """How far the sampler's log-probs of the sampled tokens are from the trainer's: the mean
    absolute difference and the k3 estimate of KL(sampler || trainer). About 0 in fp32 eager; bf16,
    another kernel or a compiled sampler moves it (TRL, verl, oat and OpenRLHF log the same)."""
    return {"mismatch/abs": masked_mean((trainer_logprobs - sampler_logprobs).abs(), mask).item(),
            "mismatch/kl": masked_mean(kl_k3(sampler_logprobs, trainer_logprobs), mask).item()}


def kl_estimate(logp, ref_logp, estimator):
    """Per-token estimate of KL(pi || pi_ref) by name: "k1", "k2" or "k3"."""
    return {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}[estimator](logp, ref_logp)


# ------------------------------------------------------------------------------------------------
# Advantages
# ------------------------------------------------------------------------------------------------
def step_gae(rewards, values, next_value, dones, gamma, lam):
    """Generalised advantage estimation along the last dimension.

    rewards, values, dones: [N, T]; dones[:, t] = 1 when the episode ended at step t (no bootstrap
    from t+1). next_value: [N], the value of the state after step T-1 (a segment cut mid-episode is
    bootstrapped with it).
        delta_t = r_t + gamma * V_{t+1} * (1 - done_t) - V_t
        A_t     = delta_t + gamma * lam * (1 - done_t) * A_{t+1}
    Returns (advantages, returns = advantages + values), both [N, T].
    """
    T = rewards.shape[-1]
    advantages = torch.zeros_like(rewards)
    last = torch.zeros_like(rewards[..., 0])
    for t in reversed(range(T)):
        next_v = values[..., t + 1] if t + 1 < T else next_value
        nonterminal = 1.0 - dones[..., t]
        delta = rewards[..., t] + gamma * next_v * nonterminal - values[..., t]
        last = delta + gamma * lam * nonterminal * last
        advantages[..., t] = last
    return advantages, advantages + values


def token_gae(rewards, values, mask, gamma, lam):
    """GAE over right-padded response tokens [B, R]: the episode ends at each row's last real token,
    whose successor has value 0. Padding gets advantage and return 0."""
    mask = mask.to(rewards.dtype)
    # CRUCIAL: token t is terminal when token t+1 is padding (or t is the last column).
    dones = 1.0 - torch.cat([mask[:, 1:], torch.zeros_like(mask[:, :1])], dim=1)
    advantages, returns = step_gae(rewards * mask, values * mask, torch.zeros_like(rewards[:, 0]),
                                   dones,
                                   gamma, lam)
    return advantages * mask, returns * mask


def discounted_returns(rewards, gamma):
    """G_t = sum_k gamma^k r_{t+k} along the last dimension."""
    out = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[..., 0])
    for t in reversed(range(rewards.shape[-1])):
        running = rewards[..., t] + gamma * running
        out[..., t] = running
    return out
