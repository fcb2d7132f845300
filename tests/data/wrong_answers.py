"""Plausible wrong answers to PS1, written blind from the stubs (their docstrings and signatures
only), as students write them: not the checker's listed mistakes. tests/test_exercise_rules.py
holds the checker to them: every one fails, and most fail naming the mistake.

WRONG[id] = [(label, class, function)]. The classes:

    "detached"      a gradient the training needs is lost (.detach(), .item(), a re-wrapped tensor)
    "not detached"  a gradient flows where the file has a constant
    "off-by-one"    a slice, a mask, a bound or a count one position off
    "dimension"     a statistic over the wrong dimension, or a dimension kept or lost
    "dtype"         an integer where a float is asked for, a float where indices are, not a tensor
    "nan"           NaN or inf on an edge: 0 / 0, log 0, an exp that overflows or underflows
    "edge"          a rule of the stub's own on an edge: n = 1, a loss type, a bound included
    "formula"       the equation itself written wrong
"""

import math

import torch
import torch.nn.functional as F

# ---- 1.1 masked_mean ---------------------------------------------------------------------------


def _mean_nan_without_dim(x, mask, dim=None):
    if dim is None:  # the clamp only where a row can be empty
        return (x * mask).sum() / mask.sum()
    return (x * mask).sum(dim) / mask.sum(dim).clamp(min=1)


def _mean_keepdim(x, mask, dim=None):
    if dim is None:
        return (x * mask).sum() / mask.sum().clamp(min=1)
    return (x * mask).sum(dim, keepdim=True) / mask.sum(dim, keepdim=True).clamp(min=1)


def _mean_clone_detach(x, mask, dim=None):
    masked = x.clone().detach()  # a copy, so as not to change x in place
    masked[mask == 0] = 0
    if dim is None:
        return masked.sum() / mask.sum().clamp(min=1)
    return masked.sum(dim) / mask.sum(dim).clamp(min=1)


def _mean_batch_count(x, mask, dim=None):
    total = (x * mask).sum() if dim is None else (x * mask).sum(dim)
    return total / mask.sum().clamp(min=1)


def _mean_python_max(x, mask, dim=None):
    if dim is None:
        return (x * mask).sum() / max(1, mask.sum())
    return (x * mask).sum(dim) / max(1, mask.sum(dim))


# ---- 1.2 masked_whiten -------------------------------------------------------------------------


def _whiten_n_minus_1(x, mask, shift_mean=True, eps=1e-8):
    n = mask.sum()
    mean = (x * mask).sum() / n
    var = ((x - mean) ** 2 * mask).sum() / (n - 1)
    out = (x - mean) / torch.sqrt(var + eps)
    return (out if shift_mean else out + mean) * mask


def _whiten_eps_on_std(x, mask, shift_mean=True, eps=1e-8):
    n = mask.sum()
    mean = (x * mask).sum() / n
    var = ((x - mean) ** 2 * mask).sum() / max(n - 1, 1)
    out = (x - mean) / (torch.sqrt(var) + eps)
    return (out if shift_mean else out + mean) * mask


def _whiten_mean_on_padding(x, mask, shift_mean=True, eps=1e-8):
    n = mask.sum()
    mean = (x * mask).sum() / n
    var = ((x - mean) ** 2 * mask).sum() / max(n - 1, 1)
    out = (x - mean) / torch.sqrt(var + eps) * mask
    return out if shift_mean else out + mean


def _whiten_torch_var(x, mask, shift_mean=True, eps=1e-8):
    real = x[mask.bool()]
    mean, var = real.mean(), real.var()  # unbiased, as torch.var is
    out = (x - mean) / torch.sqrt(var + eps)
    return (out if shift_mean else out + mean) * mask


def _whiten_per_row(x, mask, shift_mean=True, eps=1e-8):
    n = mask.sum(1, keepdim=True).clamp(min=1)
    mean = (x * mask).sum(1, keepdim=True) / n
    var = ((x - mean) ** 2 * mask).sum(1, keepdim=True) / (n - 1).clamp(min=1)
    out = (x - mean) / torch.sqrt(var + eps)
    return (out if shift_mean else out + mean) * mask


# ---- 1.3 kl_estimate ---------------------------------------------------------------------------


def _kl_probabilities(logp, ref_logp, estimator):
    p, p_ref = logp.exp(), ref_logp.exp()
    if estimator == "k1":
        return torch.log(p / p_ref)
    if estimator == "k2":
        return torch.log(p / p_ref) ** 2 / 2
    return p_ref / p - 1 - torch.log(p_ref / p)


def _kl_k1_inverted(logp, ref_logp, estimator):
    if estimator == "k1":
        return ref_logp - logp
    if estimator == "k2":
        return (logp - ref_logp) ** 2 / 2
    return torch.exp(ref_logp - logp) - 1 - (ref_logp - logp)


def _kl_math_loop(logp, ref_logp, estimator):
    out = []
    for a, b in zip(logp.flatten().tolist(), ref_logp.flatten().tolist()):
        d = b - a
        out.append(-d if estimator == "k1" else d * d / 2 if estimator == "k2"
                   else math.exp(d) - 1 - d)
    return torch.tensor(out).view(logp.shape)


def _kl_mean(logp, ref_logp, estimator):
    d = ref_logp - logp
    return {"k1": -d, "k2": d ** 2 / 2, "k3": d.exp() - 1 - d}[estimator].mean()


# ---- 1.4 response_logprobs ---------------------------------------------------------------------


def _logprobs_both_shifted(logits, input_ids, response_len, temperature=1.0):
    R = response_len
    scores = F.log_softmax(logits[:, -R - 1:-1] / temperature, dim=-1)
    return scores.gather(-1, input_ids[:, -R - 1:-1, None])[..., 0]


def _logprobs_log_of_softmax(logits, input_ids, response_len, temperature=1.0):
    R = response_len
    probs = torch.softmax(logits[:, -R - 1:-1] / temperature, dim=-1)
    return torch.log(probs).gather(-1, input_ids[:, -R:, None])[..., 0]


def _logprobs_temperature_after(logits, input_ids, response_len, temperature=1.0):
    R = response_len
    scores = F.log_softmax(logits[:, -R - 1:-1], dim=-1) / temperature
    return scores.gather(-1, input_ids[:, -R:, None])[..., 0]


def _logprobs_not_squeezed(logits, input_ids, response_len, temperature=1.0):
    R = response_len
    scores = F.log_softmax(logits[:, -R - 1:-1] / temperature, dim=-1)
    return scores.gather(-1, input_ids[:, -R:, None])


def _logprobs_constant_normaliser(logits, input_ids, response_len, temperature=1.0):
    R = response_len
    scores = logits[:, -R - 1:-1] / temperature
    norm = torch.logsumexp(scores, -1, keepdim=True).detach()  # the normaliser, a constant
    return (scores - norm).gather(-1, input_ids[:, -R:, None])[..., 0]


# ---- 1.5 group_advantages ----------------------------------------------------------------------


def _groups_std_over_dim0(rewards, group_size, scale=True):
    r = rewards.view(-1, group_size)
    a = r - r.mean(1, keepdim=True)
    return (a / (r.std(0) + 1e-4) if scale else a).reshape(-1)


def _groups_no_eps(rewards, group_size, scale=True):
    r = rewards.view(-1, group_size)
    a = r - r.mean(1, keepdim=True)
    return (a / r.std(1, keepdim=True) if scale else a).reshape(-1)


def _groups_not_flattened(rewards, group_size, scale=True):
    r = rewards.view(-1, group_size)
    a = r - r.mean(1, keepdim=True)
    return a / (r.std(1, keepdim=True) + 1e-4) if scale else a


def _groups_always_scaled(rewards, group_size, scale=True):
    r = rewards.view(-1, group_size)
    return ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)).reshape(-1)


# ---- 1.6 aggregate -----------------------------------------------------------------------------


def _aggregate_no_dapo(per_token, mask, loss_type, normaliser):
    if loss_type in ("bnpo", "dr_grpo"):
        return (per_token * mask).sum() / normaliser
    rows = (per_token * mask).sum(1) / mask.sum(1).clamp(min=1)
    return rows.sum() / normaliser


def _aggregate_nan_row(per_token, mask, loss_type, normaliser):
    if loss_type == "grpo":
        return ((per_token * mask).sum(1) / mask.sum(1)).sum() / normaliser
    return (per_token * mask).sum() / normaliser


def _aggregate_columns(per_token, mask, loss_type, normaliser):
    if loss_type == "grpo":
        return ((per_token * mask).sum(0) / mask.sum(0).clamp(min=1)).sum() / normaliser
    return (per_token * mask).sum() / normaliser


def _aggregate_row_mean(per_token, mask, loss_type, normaliser):
    if loss_type == "grpo":  # the mean of the sequences' means
        return ((per_token * mask).sum(1) / mask.sum(1).clamp(min=1)).mean()
    return (per_token * mask).sum() / normaliser


def _aggregate_item(per_token, mask, loss_type, normaliser):
    if loss_type == "grpo":
        total = ((per_token * mask).sum(1) / mask.sum(1).clamp(min=1)).sum().item()
    else:
        total = (per_token * mask).sum().item()
    return torch.tensor(total / normaliser)


# ---- 1.7 rloo_baselines ------------------------------------------------------------------------


def _rloo_sum_dim0(episode_returns, group_size):
    r = episode_returns.view(-1, group_size)
    return ((r.sum(0, keepdim=True) - r) / (group_size - 1)).reshape(-1)


def _rloo_precedence(episode_returns, group_size):
    r = episode_returns.view(-1, group_size)
    return ((r.sum(1, keepdim=True) - r) / group_size - 1).reshape(-1)


def _rloo_not_flattened(episode_returns, group_size):
    r = episode_returns.view(-1, group_size)
    return (r.sum(1, keepdim=True) - r) / (group_size - 1)


def _rloo_strided(episode_returns, group_size):
    r = episode_returns.view(group_size, -1)
    return ((r.sum(0, keepdim=True) - r) / (group_size - 1)).reshape(-1)


# ---- 1.8 token_gae -----------------------------------------------------------------------------


def _gae_loop(rewards, values, mask, gamma, lam, done_of, forward=False, mask_returns=True):
    """A student's loop; done_of(t) says where the row ends, as each student reads the stub."""
    B, R = rewards.shape
    adv = torch.zeros_like(rewards)
    last = torch.zeros(B)
    steps = range(R) if forward else reversed(range(R))
    for t in steps:
        next_v = values[:, t + 1] if t + 1 < R else torch.zeros(B)
        done = done_of(mask, t)
        delta = rewards[:, t] + gamma * next_v * (1 - done) - values[:, t]
        last = delta + gamma * lam * (1 - done) * last
        adv[:, t] = last * mask[:, t]
    returns = adv + values
    return adv, returns * mask if mask_returns else returns


def _done_right(mask, t):
    return mask[:, t] * (1 - mask[:, t + 1]) if t + 1 < mask.shape[1] else mask[:, t]


def _gae_done_from_own_mask(rewards, values, mask, gamma, lam):
    return _gae_loop(rewards, values, mask, gamma, lam,
                     lambda m, t: 1 - m[:, t] if t + 1 < m.shape[1] else torch.ones(len(m)))


def _gae_returns_on_padding(rewards, values, mask, gamma, lam):
    return _gae_loop(rewards, values, mask, gamma, lam, _done_right, mask_returns=False)


def _gae_forward(rewards, values, mask, gamma, lam):
    return _gae_loop(rewards, values, mask, gamma, lam, _done_right, forward=True)


def _gae_rows_for_steps(rewards, values, mask, gamma, lam):
    adv = torch.zeros_like(rewards)
    last = torch.zeros(rewards.shape[1])
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[t] - values[t]  # rewards[t]: meant as step t of every row
        last = delta + gamma * lam * last
        adv[t] = last
    return adv * mask, (adv + values) * mask


def _gae_no_gamma_in_bootstrap(rewards, values, mask, gamma, lam):
    B, R = rewards.shape
    adv, last = torch.zeros_like(rewards), torch.zeros(B)
    for t in reversed(range(R)):
        next_v = values[:, t + 1] if t + 1 < R else torch.zeros(B)
        done = _done_right(mask, t)
        delta = rewards[:, t] + next_v * (1 - done) - values[:, t]
        last = delta + gamma * lam * (1 - done) * last
        adv[:, t] = last * mask[:, t]
    return adv, (adv + values) * mask


# ---- 1.9 clipped_surrogate ---------------------------------------------------------------------


def _surrogate_ratio_of_probs(logprobs, old_logprobs, advantages, epsilon):
    ratio = logprobs.exp() / old_logprobs.exp()
    return torch.max(-advantages * ratio, -advantages * ratio.clamp(1 - epsilon, 1 + epsilon))


def _surrogate_straight_through(logprobs, old_logprobs, advantages, epsilon):
    ratio = torch.exp(logprobs - old_logprobs)
    clipped = ratio + (ratio.clamp(1 - epsilon, 1 + epsilon) - ratio).detach()
    return torch.max(-advantages * ratio, -advantages * clipped)


def _surrogate_clipped_detached(logprobs, old_logprobs, advantages, epsilon):
    ratio = torch.exp(logprobs - old_logprobs)
    clipped = ratio.clamp(1 - epsilon, 1 + epsilon).detach()  # "the clipped term is a bound"
    return torch.max(-advantages * ratio, -advantages * clipped)


def _surrogate_advantage_per_row(logprobs, old_logprobs, advantages, epsilon):
    ratio = torch.exp(logprobs - old_logprobs)
    a = advantages[:, None]  # as grpo.py does
    return torch.max(-a * ratio, -a * ratio.clamp(1 - epsilon, 1 + epsilon))


def _surrogate_clip_log_ratio(logprobs, old_logprobs, advantages, epsilon):
    log_ratio = logprobs - old_logprobs
    return torch.max(-advantages * log_ratio.exp(),
                     -advantages * log_ratio.clamp(-epsilon, epsilon).exp())


# ---- 1.10 clipped_value_loss -------------------------------------------------------------------


def _value_clip_around_returns(values, old_values, returns, clip):
    clipped = returns + (values - returns).clamp(-clip, clip)
    return 0.5 * torch.max((values - returns) ** 2, (clipped - returns) ** 2)


def _value_mean(values, old_values, returns, clip):
    clipped = old_values + (values - old_values).clamp(-clip, clip)
    return 0.5 * torch.max((values - returns) ** 2, (clipped - returns) ** 2).mean()


def _value_clipped_detached(values, old_values, returns, clip):
    clipped = old_values + (values.detach() - old_values).clamp(-clip, clip)
    return 0.5 * torch.max((values - returns) ** 2, (clipped - returns) ** 2)


def _value_clamp_swapped(values, old_values, returns, clip):
    clipped = old_values + torch.clamp(values - old_values, clip, -clip)
    return 0.5 * torch.max((values - returns) ** 2, (clipped - returns) ** 2)


def _value_half_one_term(values, old_values, returns, clip):
    clipped = old_values + (values - old_values).clamp(-clip, clip)
    return torch.max(0.5 * (values - returns) ** 2, (clipped - returns) ** 2)


# ---- 1.11 preference_loss ----------------------------------------------------------------------


def _h(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps):
    return (chosen_logps - ref_chosen_logps) - (rejected_logps - ref_rejected_logps)


def _preference_as_written(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps,
                           beta, loss_type):
    h = _h(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps)
    if loss_type == "ipo":
        return (h - 1 / (2 * beta)) ** 2
    return torch.log(1 + torch.exp(-beta * h))


def _preference_log_sigmoid(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps,
                            beta, loss_type):
    h = _h(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps)
    if loss_type == "ipo":
        return (h - 1 / (2 * beta)) ** 2
    return -torch.log(torch.sigmoid(beta * h))


def _preference_loop(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta,
                     loss_type):
    out = []
    for c, r, rc, rr in zip(chosen_logps.tolist(), rejected_logps.tolist(),
                            ref_chosen_logps.tolist(), ref_rejected_logps.tolist()):
        h = (c - rc) - (r - rr)
        out.append((h - 1 / (2 * beta)) ** 2 if loss_type == "ipo"
                   else math.log1p(math.exp(-beta * h)))
    return torch.tensor(out)


def _preference_ipo_beta_h(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps,
                           beta, loss_type):
    h = _h(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps)
    if loss_type == "ipo":
        return (beta * h - 1 / (2 * beta)) ** 2
    return -F.logsigmoid(beta * h)


def _preference_mean(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta,
                     loss_type):
    h = _h(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps)
    loss = (h - 1 / (2 * beta)) ** 2 if loss_type == "ipo" else -F.logsigmoid(beta * h)
    return loss.mean()


# ---- 1.12 preference_pairs ---------------------------------------------------------------------


def _pairs_float_rows(scores, group_size):
    s = scores.view(-1, group_size)
    keep = s.max(1).values > s.min(1).values
    start = torch.arange(len(s)) * group_size
    return (torch.Tensor((start + s.argmax(1))[keep].tolist()),
            torch.Tensor((start + s.argmin(1))[keep].tolist()))


def _pairs_lists(scores, group_size):
    chosen, rejected = [], []
    for k, group in enumerate(scores.view(-1, group_size)):
        if group.max() > group.min():
            chosen.append(k * group_size + int(group.argmax()))
            rejected.append(k * group_size + int(group.argmin()))
    return torch.tensor(chosen), torch.tensor(rejected)


def _pairs_strided(scores, group_size):
    s = scores.view(group_size, -1).t()
    keep = s.max(1).values > s.min(1).values
    start = torch.arange(len(s)) * group_size
    return (start + s.argmax(1))[keep], (start + s.argmin(1))[keep]


def _pairs_argmax_dim0(scores, group_size):
    s = scores.view(-1, group_size)
    keep = s.max(1).values > s.min(1).values
    start = torch.arange(len(s)) * group_size
    best, worst = s.argmax(0), s.argmin(0)
    return (start + best[:len(s)])[keep], (start + worst[:len(s)])[keep]


# ---- 1.13 step_advantages ----------------------------------------------------------------------


def _step_loop(rewards, values, next_values, dones, gamma, lam, variant):
    E, T = rewards.shape
    adv, last = torch.zeros_like(rewards), torch.zeros(E)
    for t in reversed(range(T)):
        if t == T - 1:
            next_v = next_values if variant == "last step" else next_values * (1 - dones[:, t])
        else:
            next_v = values[:, t + 1] * (1 - dones[:, t])
        done = dones[:, t + 1] if variant == "next done" and t + 1 < T else dones[:, t]
        if variant == "next done" and t < T - 1:
            next_v = values[:, t + 1] * (1 - done)
        delta = rewards[:, t] + gamma * next_v - values[:, t]
        carry = 1 if variant == "carry" else 1 - done
        last = delta + gamma * lam * carry * last
        adv[:, t] = last
    returns = adv + values
    if variant == "returns next":
        returns = adv + torch.cat([values[:, 1:], next_values[:, None]], 1)
    return adv, returns


def _step_next_done(rewards, values, next_values, dones, gamma, lam):
    return _step_loop(rewards, values, next_values, dones, gamma, lam, "next done")


def _step_last_step(rewards, values, next_values, dones, gamma, lam):
    return _step_loop(rewards, values, next_values, dones, gamma, lam, "last step")


def _step_carry(rewards, values, next_values, dones, gamma, lam):
    return _step_loop(rewards, values, next_values, dones, gamma, lam, "carry")


def _step_returns_next(rewards, values, next_values, dones, gamma, lam):
    return _step_loop(rewards, values, next_values, dones, gamma, lam, "returns next")


# ---- 1.14 bad_advantages -----------------------------------------------------------------------


def _bad_loop(rewards, values, response_mask, next_values, dones, gamma, lam, variant):
    E, T, R = values.shape
    adv = torch.zeros_like(values)
    for e in range(E):
        a_after, v_next = 0.0, float(next_values[e])
        for t in reversed(range(T)):
            real = [j for j in range(R) if response_mask[e, t, j] > 0]
            last = R - 1 if variant == "last slot" else (real[-1] if real else -1)
            for j in reversed(range(R)):
                if response_mask[e, t, j] == 0:
                    if variant == "reset":
                        a_after = 0.0
                    continue
                if j == last:
                    d = float(dones[e, t])
                    delta = float(rewards[e, t]) + gamma * v_next * (1 - d) - float(values[e, t, j])
                    a = delta + gamma * lam * (1 - d) * a_after
                else:
                    delta = float(values[e, t, j + 1]) - float(values[e, t, j])
                    a = delta + (1 if variant == "no lam" else lam) * a_after
                adv[e, t, j] = a
                a_after = a
            if real:
                v_next = float(values[e, t, real[0]])
    returns = adv + values
    return adv, returns if variant == "returns" else returns * response_mask


def _bad_reset(rewards, values, response_mask, next_values, dones, gamma, lam):
    return _bad_loop(rewards, values, response_mask, next_values, dones, gamma, lam, "reset")


def _bad_no_lam(rewards, values, response_mask, next_values, dones, gamma, lam):
    return _bad_loop(rewards, values, response_mask, next_values, dones, gamma, lam, "no lam")


def _bad_last_slot(rewards, values, response_mask, next_values, dones, gamma, lam):
    return _bad_loop(rewards, values, response_mask, next_values, dones, gamma, lam, "last slot")


def _bad_returns_unmasked(rewards, values, response_mask, next_values, dones, gamma, lam):
    return _bad_loop(rewards, values, response_mask, next_values, dones, gamma, lam, "returns")


# ---- 1.15 inverse_cdf --------------------------------------------------------------------------


def _cdf_int32(probs, uniforms):
    cdf = probs.double().cumsum(-1)
    return torch.searchsorted(cdf, (uniforms.double() * cdf[:, -1])[:, None], right=True,
                              out_int32=True)[:, 0]


def _cdf_cumsum_dim0(probs, uniforms):
    cdf = probs.double().cumsum(0)
    return torch.searchsorted(cdf, (uniforms.double() * cdf[:, -1])[:, None],
                              right=True)[:, 0].clamp(max=probs.shape[1] - 1)


def _cdf_normalised_by_all(probs, uniforms):
    p = probs.double() / probs.double().sum()
    cdf = p.cumsum(-1)
    return torch.searchsorted(cdf, uniforms.double()[:, None], right=True)[:, 0].clamp(
        max=probs.shape[1] - 1)


def _cdf_float32_clamped(probs, uniforms):
    cdf = probs.float().cumsum(-1)
    thresholds = (uniforms.float() * cdf[:, -1])[:, None]
    return torch.searchsorted(cdf, thresholds, right=True)[:, 0].clamp(max=probs.shape[1] - 1)


# ---- 1.16 training_ids -------------------------------------------------------------------------


def _pieces(said, answers):
    ids, mask = [], []
    for k, turn in enumerate(said):
        ids, mask = ids + list(turn), mask + [1] * len(turn)
        if k < len(answers):
            ids, mask = ids + list(answers[k]), mask + [0] * len(answers[k])
    return ids, mask


def _tool_bool_mask(said, answers, budget):
    ids, mask = _pieces(said, answers)
    return torch.tensor(ids[:budget]), torch.tensor(mask[:budget], dtype=torch.bool)


def _tool_float_mask(said, answers, budget):
    ids, mask = _pieces(said, answers)
    return torch.tensor(ids[:budget]), torch.tensor(mask[:budget], dtype=torch.float)


def _tool_below_budget(said, answers, budget):
    ids, mask = _pieces(said, answers)
    return torch.tensor(ids[:budget - 1]), torch.tensor(mask[:budget - 1])  # L < budget


def _tool_answers_last(said, answers, budget):
    ids = [i for turn in said for i in turn] + [i for answer in answers for i in answer]
    mask = [1] * sum(map(len, said)) + [0] * sum(map(len, answers))
    return torch.tensor(ids[:budget]), torch.tensor(mask[:budget])


def _tool_lists(said, answers, budget):
    ids, mask = _pieces(said, answers)
    return ids[:budget], mask[:budget]


# ---- 1.17 off_policy_weights -------------------------------------------------------------------


def _weights(old_logprobs, sampler_logprobs, mask, correction, cap, low, high, variant=""):
    if variant == "padding 0":
        r = torch.exp(old_logprobs - sampler_logprobs) * mask
    else:
        r = torch.exp((old_logprobs - sampler_logprobs) * mask)
    if correction == "none":
        cut = torch.zeros_like(r, dtype=torch.bool)
        return torch.ones_like(r), cut.float() if variant == "float cut" else cut
    if correction == "tis":
        cut = r > cap
        return r.clamp(max=cap), cut.float() if variant == "float cut" else cut
    if correction == "icepop":
        keep = (r > low) & (r < high) if variant == "strict" else (r >= low) & (r <= high)
        return torch.where(keep, r, torch.zeros_like(r)), ~keep
    log_r = torch.log(r)
    if variant == "mean":
        seq = r.mean(1, keepdim=True)
    elif variant == "dim 0":
        seq = log_r.sum(0, keepdim=True).exp()
    else:
        seq = log_r.sum(1, keepdim=True).exp()
    seq = seq.expand_as(r)
    cut = seq > cap
    return torch.where(cut, torch.zeros_like(seq), seq), cut


def _off_policy(variant):
    def off_policy_weights(old_logprobs, sampler_logprobs, mask, correction, cap=2.0, low=0.5,
                           high=5.0):
        return _weights(old_logprobs, sampler_logprobs, mask, correction, cap, low, high, variant)
    return off_policy_weights


# ---- 1.18 distill_advantages -------------------------------------------------------------------


def _distill_not_detached(old_logprobs, teacher_logprobs, reward_advantages, loss_form):
    a = reward_advantages[:, None].expand_as(old_logprobs)
    return a + (teacher_logprobs - old_logprobs) if loss_form == "sampled" else a


def _distill_broadcast(old_logprobs, teacher_logprobs, reward_advantages, loss_form):
    if loss_form == "sampled":
        return reward_advantages + (teacher_logprobs - old_logprobs).detach()
    return reward_advantages.expand_as(old_logprobs)


def _distill_full_one_per_row(old_logprobs, teacher_logprobs, reward_advantages, loss_form):
    if loss_form == "sampled":
        return reward_advantages[:, None] + (teacher_logprobs - old_logprobs).detach()
    return reward_advantages


def _distill_times(old_logprobs, teacher_logprobs, reward_advantages, loss_form):
    a = reward_advantages[:, None].expand_as(old_logprobs)
    if loss_form == "sampled":
        return a * (teacher_logprobs - old_logprobs).detach()
    return a


# ---- 1.19 divergence ---------------------------------------------------------------------------


def _kl(log_a, log_b):
    return (log_a.exp() * (log_a - log_b)).sum(-1)


def _divergence_of_probs(student_logits, teacher_logits, beta):
    p, t = F.softmax(student_logits.float(), -1), F.softmax(teacher_logits.float(), -1)
    if beta == 1:
        return (p * (p.log() - t.log())).sum(-1)
    if beta == 0:
        return (t * (t.log() - p.log())).sum(-1)
    m = beta * t + (1 - beta) * p
    return beta * (t * (t.log() - m.log())).sum(-1) + (1 - beta) * (p * (p.log() - m.log())).sum(-1)


def _divergence_no_float(student_logits, teacher_logits, beta):
    log_p, log_t = F.log_softmax(student_logits, -1), F.log_softmax(teacher_logits, -1)
    if beta == 1:
        return _kl(log_p, log_t)
    if beta == 0:
        return _kl(log_t, log_p)
    log_m = torch.logaddexp(log_t + math.log(beta), log_p + math.log(1 - beta))
    return beta * _kl(log_t, log_m) + (1 - beta) * _kl(log_p, log_m)


def _divergence_dim0(student_logits, teacher_logits, beta):
    log_p = F.log_softmax(student_logits.float(), 0)
    log_t = F.log_softmax(teacher_logits.float(), 0)
    if beta == 1:
        return _kl(log_p, log_t)
    if beta == 0:
        return _kl(log_t, log_p)
    log_m = torch.logaddexp(log_t + math.log(beta), log_p + math.log(1 - beta))
    return beta * _kl(log_t, log_m) + (1 - beta) * _kl(log_p, log_m)


def _divergence_m_reversed(student_logits, teacher_logits, beta):
    log_p = F.log_softmax(student_logits.float(), -1)
    log_t = F.log_softmax(teacher_logits.float(), -1)
    if beta == 1:
        return _kl(log_p, log_t)
    if beta == 0:
        return _kl(log_t, log_p)
    log_m = torch.logaddexp(log_t + math.log(beta), log_p + math.log(1 - beta))
    m = log_m.exp()  # KL(m || .) where the stub has KL(. || m)
    return beta * (m * (log_m - log_t)).sum(-1) + (1 - beta) * (m * (log_m - log_p)).sum(-1)


def _divergence_weights_detached(student_logits, teacher_logits, beta):
    log_p = F.log_softmax(student_logits.float(), -1)
    log_t = F.log_softmax(teacher_logits.float(), -1)
    p = log_p.exp().detach()  # the weights of the sum taken as a fixed distribution
    if beta == 1:
        return (p * (log_p - log_t)).sum(-1)
    if beta == 0:
        return _kl(log_t, log_p)
    log_m = torch.logaddexp(log_t + math.log(beta), log_p + math.log(1 - beta))
    return beta * _kl(log_t, log_m) + (1 - beta) * (p * (log_p - log_m)).sum(-1)


# ---- 1.20 overlong_penalty ---------------------------------------------------------------------


def _overlong_zeros_like(lengths, max_new_tokens, buffer_len, factor):
    if buffer_len == 0:
        return torch.zeros_like(lengths)
    excess = (lengths - (max_new_tokens - buffer_len)).clamp(min=0)
    return -factor * excess / buffer_len


def _overlong_floor_division(lengths, max_new_tokens, buffer_len, factor):
    if buffer_len == 0:
        return torch.zeros(lengths.shape)
    excess = (lengths - (max_new_tokens - buffer_len)).clamp(min=0)
    return -factor * (excess // buffer_len)


def _overlong_one_late(lengths, max_new_tokens, buffer_len, factor):
    if buffer_len == 0:
        return torch.zeros(lengths.shape)
    excess = (lengths - (max_new_tokens - buffer_len) - 1).clamp(min=0)
    return -factor * excess.float() / buffer_len


def _overlong_list(lengths, max_new_tokens, buffer_len, factor):
    start = max_new_tokens - buffer_len
    return [0.0 if n <= start or buffer_len == 0 else -factor * (n - start) / buffer_len
            for n in lengths.tolist()]


# ---- 1.21 sft_loss -----------------------------------------------------------------------------


def _sft_per_row(logprobs, loss_mask, normaliser):
    return -(logprobs * loss_mask).sum(1) / normaliser


def _sft_item(logprobs, loss_mask, normaliser):
    return torch.tensor(-(logprobs * loss_mask).sum().item() / normaliser)


def _sft_shifted_mask(logprobs, loss_mask, normaliser):
    # the labels are one position on from the logits, so the mask too (it is not: the log-probs
    # given are already the solution tokens')
    return -(logprobs[:, :-1] * loss_mask[:, 1:]).sum() / normaliser


def _sft_index_by_mask(logprobs, loss_mask, normaliser):
    return -logprobs[loss_mask].sum() / normaliser


WRONG = {
    "1.1": [("the clamp only with dim: an all-zero mask with dim=None gives NaN", "nan",
             _mean_nan_without_dim),
            ("keepdim=True: a [B, 1] mean where [B] is asked", "dimension", _mean_keepdim),
            ("x.clone().detach() to avoid changing x", "detached", _mean_clone_detach),
            ("with dim, divided by the whole batch's count", "formula", _mean_batch_count),
            ("Python's max(1, ...) on a tensor of counts", "edge", _mean_python_max)],
    "1.2": [("divided by n - 1 with no guard: n = 1 gives NaN", "nan", _whiten_n_minus_1),
            ("eps added to the std, not to the variance", "formula", _whiten_eps_on_std),
            ("shift_mean=False adds the mean back after the mask", "off-by-one",
             _whiten_mean_on_padding),
            ("torch.var of the real entries: NaN for a single entry", "nan", _whiten_torch_var),
            ("whitened per row", "dimension", _whiten_per_row)],
    "1.3": [("the ratios as quotients of probabilities", "nan", _kl_probabilities),
            ("k1 the wrong way round, k2 and k3 right", "formula", _kl_k1_inverted),
            ("a loop over Python floats with math.exp", "detached", _kl_math_loop),
            ("the mean over tokens", "dimension", _kl_mean)],
    "1.4": [("both the logits and the ids shifted one back", "off-by-one", _logprobs_both_shifted),
            ("the log of the softmax", "nan", _logprobs_log_of_softmax),
            ("the temperature divides the log-probs", "formula", _logprobs_temperature_after),
            ("the gathered [B, R, 1] not squeezed", "dimension", _logprobs_not_squeezed),
            ("the normaliser logsumexp detached", "detached", _logprobs_constant_normaliser)],
    "1.5": [("the std over dim 0", "dimension", _groups_std_over_dim0),
            ("no 1e-4: a tied group gives NaN", "nan", _groups_no_eps),
            ("[N, G] returned, not flattened", "dimension", _groups_not_flattened),
            ("scale ignored: always divided by the std", "edge", _groups_always_scaled)],
    "1.6": [("\"dapo\" handled as \"grpo\"", "edge", _aggregate_no_dapo),
            ("a row with no counted token divides 0 by 0", "nan", _aggregate_nan_row),
            ("the sequence means over dim 0", "dimension", _aggregate_columns),
            ("grpo takes the mean of the sequences, not the sum over the normaliser", "formula",
             _aggregate_row_mean),
            ("the total through .item() into a new tensor", "detached", _aggregate_item)],
    "1.7": [("the group sums over dim 0", "dimension", _rloo_sum_dim0),
            ("/ group_size - 1 without brackets", "formula", _rloo_precedence),
            ("[N, k] returned, not flattened", "dimension", _rloo_not_flattened),
            ("the groups strided", "dimension", _rloo_strided)],
    "1.8": [("done read off the token's own mask", "off-by-one", _gae_done_from_own_mask),
            ("the returns not masked", "off-by-one", _gae_returns_on_padding),
            ("the loop forwards", "formula", _gae_forward),
            ("rewards[t] for step t: the rows taken for steps", "dimension", _gae_rows_for_steps),
            ("gamma missing in the bootstrap", "formula", _gae_no_gamma_in_bootstrap)],
    "1.9": [("the ratio as a quotient of probabilities", "nan", _surrogate_ratio_of_probs),
            ("a straight-through clip: the gradient passes the clip", "not detached",
             _surrogate_straight_through),
            ("the clipped term detached", "detached", _surrogate_clipped_detached),
            ("advantages[:, None] as in grpo.py", "dimension", _surrogate_advantage_per_row),
            ("the log-ratio clipped to [-epsilon, epsilon]", "formula", _surrogate_clip_log_ratio)],
    "1.10": [("the clip around the returns", "formula", _value_clip_around_returns),
             ("the mean over tokens", "dimension", _value_mean),
             ("the clipped value from detached values", "detached", _value_clipped_detached),
             ("clamp's bounds swapped", "formula", _value_clamp_swapped),
             ("the 1/2 on one term only", "formula", _value_half_one_term)],
    "1.11": [("log(1 + exp(-beta h)) as written", "nan", _preference_as_written),
             ("-log(sigmoid(beta h))", "nan", _preference_log_sigmoid),
             ("a loop over Python floats", "detached", _preference_loop),
             ("IPO with beta h", "formula", _preference_ipo_beta_h),
             ("the mean over pairs", "dimension", _preference_mean)],
    "1.12": [("rows as floats (torch.Tensor of a list)", "dtype", _pairs_float_rows),
             ("lists to tensors: a float empty tensor when every prompt ties", "dtype",
              _pairs_lists),
             ("the groups strided", "dimension", _pairs_strided),
             ("argmax over dim 0", "dimension", _pairs_argmax_dim0)],
    "1.13": [("done of the next step", "off-by-one", _step_next_done),
             ("the last step bootstraps from next_values even when done", "edge", _step_last_step),
             ("the advantage carried across an episode's end", "formula", _step_carry),
             ("returns A + V_{t+1}", "formula", _step_returns_next)],
    "1.14": [("padding resets A_after", "off-by-one", _bad_reset),
             ("no lam inside a step", "formula", _bad_no_lam),
             ("a step's last token taken as its last slot", "off-by-one", _bad_last_slot),
             ("the returns not masked", "edge", _bad_returns_unmasked)],
    "1.15": [("searchsorted's out_int32", "dtype", _cdf_int32),
             ("cumsum over dim 0", "dimension", _cdf_cumsum_dim0),
             ("normalised by the whole batch's mass", "dimension", _cdf_normalised_by_all),
             ("float32, clamped to the last token", "dtype", _cdf_float32_clamped)],
    "1.16": [("a bool tool mask", "dtype", _tool_bool_mask),
             ("a float tool mask", "dtype", _tool_float_mask),
             ("L < budget", "off-by-one", _tool_below_budget),
             ("every turn, then every answer", "formula", _tool_answers_last),
             ("Python lists", "dtype", _tool_lists)],
    "1.17": [("cut as a float", "dtype", _off_policy("float cut")),
             ("IcePop's bounds exclusive", "edge", _off_policy("strict")),
             ("padding's ratio 0, not 1", "off-by-one", _off_policy("padding 0")),
             ("sequence MIS by the mean ratio", "formula", _off_policy("mean")),
             ("the product over dim 0", "dimension", _off_policy("dim 0"))],
    "1.18": [("the log-ratio not detached", "not detached", _distill_not_detached),
             ("A_i added without [:, None]", "dimension", _distill_broadcast),
             ("full: one advantage per row", "dimension", _distill_full_one_per_row),
             ("A_i times the log-ratio", "formula", _distill_times)],
    "1.19": [("the log of softmax probabilities", "nan", _divergence_of_probs),
             ("no .float(): bf16 in, bf16 out", "dtype", _divergence_no_float),
             ("log_softmax over dim 0", "dimension", _divergence_dim0),
             ("KL(m || .) for KL(. || m)", "formula", _divergence_m_reversed),
             ("the student's probabilities as weights detached", "detached",
              _divergence_weights_detached)],
    "1.20": [("torch.zeros_like(lengths) without a buffer", "dtype", _overlong_zeros_like),
             ("floor division", "dtype", _overlong_floor_division),
             ("the buffer one token late", "off-by-one", _overlong_one_late),
             ("a Python list", "dtype", _overlong_list)],
    "1.21": [("one loss per row", "dimension", _sft_per_row),
             ("through .item() into a new tensor", "detached", _sft_item),
             ("the mask shifted by one", "off-by-one", _sft_shifted_mask),
             ("indexed by the float mask", "dtype", _sft_index_by_mask)],
}


# ---- held out ----------------------------------------------------------------------------------
# Written after the checker's kinds of mistake and the mistakes listed for WRONG were in place, and
# not used to tune either: the share of these that the checker names is the honest figure for
# wrong answers it was not shaped on.


def _h_mean_broadcast(x, mask, dim=None):
    if dim is None:
        return (x * mask).sum() / mask.sum().clamp(min=1)
    return (x * mask).sum(dim) / mask.sum(dim, keepdim=True).clamp(min=1)


def _h_mean_bool_index(x, mask, dim=None):
    if dim is None:
        return x[mask.bool()].mean()
    return torch.stack([r[m.bool()].mean() if m.any() else r.sum() * 0
                        for r, m in zip(x.movedim(dim, -1), mask.movedim(dim, -1))])


def _h_whiten_square_unmasked(x, mask, shift_mean=True, eps=1e-8):
    n = mask.sum()
    mean = (x * mask).sum() / n
    var = ((x * mask - mean) ** 2).sum() / max(n - 1, 1)  # the padding counts mean^2 each
    out = (x - mean) / torch.sqrt(var + eps)
    return (out if shift_mean else out + mean) * mask


def _h_whiten_centred_only(x, mask, shift_mean=True, eps=1e-8):
    mean = (x * mask).sum() / mask.sum()
    return ((x - mean) if shift_mean else x) * mask


def _h_kl_k3_inverted(logp, ref_logp, estimator):
    d = ref_logp - logp
    if estimator == "k3":
        return torch.exp(-d) - 1 + d
    return -d if estimator == "k1" else d ** 2 / 2


def _h_kl_k1_abs(logp, ref_logp, estimator):
    d = ref_logp - logp
    return {"k1": d.abs(), "k2": d ** 2 / 2, "k3": d.exp() - 1 - d}[estimator]


def _h_logprobs_short_slice(logits, input_ids, response_len, temperature=1.0):
    scores = F.log_softmax(logits[:, -response_len:-1] / temperature, dim=-1)
    return scores.gather(-1, input_ids[:, -response_len + 1:, None])[..., 0]


def _h_logprobs_first_ids(logits, input_ids, response_len, temperature=1.0):
    scores = F.log_softmax(logits[:, -response_len - 1:-1] / temperature, dim=-1)
    return scores.gather(-1, input_ids[:, :response_len, None])[..., 0]


def _h_logprobs_times_temperature(logits, input_ids, response_len, temperature=1.0):
    scores = F.log_softmax(logits[:, -response_len - 1:-1] * temperature, dim=-1)
    return scores.gather(-1, input_ids[:, -response_len:, None])[..., 0]


def _h_groups_batch_mean(rewards, group_size, scale=True):
    r = rewards.view(-1, group_size)
    a = r - rewards.mean()
    return (a / (r.std(1, keepdim=True) + 1e-4) if scale else a).reshape(-1)


def _h_groups_clamped_std(rewards, group_size, scale=True):
    r = rewards.view(-1, group_size)
    a = r - r.mean(1, keepdim=True)
    return (a / r.std(1, keepdim=True).clamp(min=1e-4) if scale else a).reshape(-1)


def _h_aggregate_total_count(per_token, mask, loss_type, normaliser):
    if loss_type == "grpo":
        return ((per_token * mask).sum(1) / mask.sum().clamp(min=1)).sum() / normaliser
    return (per_token * mask).sum() / normaliser


def _h_aggregate_own_count(per_token, mask, loss_type, normaliser):
    if loss_type == "grpo":
        return ((per_token * mask).sum(1) / mask.sum(1).clamp(min=1)).sum() / normaliser
    return (per_token * mask).sum() / mask.sum().clamp(min=1)


def _h_rloo_whole_batch(episode_returns, group_size):
    return (episode_returns.sum() - episode_returns) / (len(episode_returns) - 1)


def _h_gae_unmasked_advantages(rewards, values, mask, gamma, lam):
    B, R = rewards.shape
    adv, last = torch.zeros_like(rewards), torch.zeros(B)
    for t in reversed(range(R)):
        next_v = values[:, t + 1] * mask[:, t + 1] if t + 1 < R else torch.zeros(B)
        last = rewards[:, t] + gamma * next_v - values[:, t] + gamma * lam * last * (
            mask[:, t + 1] if t + 1 < R else 0)
        adv[:, t] = last
    return adv, (adv + values) * mask


def _h_surrogate_clip_positive_only(logprobs, old_logprobs, advantages, epsilon):
    ratio = torch.exp(logprobs - old_logprobs)
    clipped = torch.where(advantages > 0, ratio.clamp(1 - epsilon, 1 + epsilon), ratio)
    return torch.max(-advantages * ratio, -advantages * clipped)


def _h_value_abs_clipped(values, old_values, returns, clip):
    clipped = old_values + (values - old_values).clamp(-clip, clip)
    return 0.5 * torch.max((values - returns) ** 2, (clipped - returns).abs())


def _h_value_unclipped_detached(values, old_values, returns, clip):
    clipped = old_values + (values - old_values).clamp(-clip, clip)
    return 0.5 * torch.max((values.detach() - returns) ** 2, (clipped - returns) ** 2)


def _h_preference_softplus_sign(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps,
                                beta, loss_type):
    h = (chosen_logps - ref_chosen_logps) - (rejected_logps - ref_rejected_logps)
    return (h - 1 / (2 * beta)) ** 2 if loss_type == "ipo" else F.softplus(beta * h)


def _h_pairs_swapped(scores, group_size):
    s = scores.view(-1, group_size)
    keep = s.max(1).values > s.min(1).values
    start = torch.arange(len(s)) * group_size
    return (start + s.argmin(1))[keep], (start + s.argmax(1))[keep]


def _h_step_gamma_twice(rewards, values, next_values, dones, gamma, lam):
    E, T = rewards.shape
    adv, last = torch.zeros_like(rewards), torch.zeros(E)
    for t in reversed(range(T)):
        next_v = next_values if t == T - 1 else values[:, t + 1]
        delta = rewards[:, t] + gamma * next_v * (1 - dones[:, t]) - values[:, t]
        last = delta + gamma * gamma * lam * (1 - dones[:, t]) * last
        adv[:, t] = last
    return adv, adv + values


def _h_bad_gamma_inside(rewards, values, response_mask, next_values, dones, gamma, lam):
    E, T, R = values.shape
    adv = torch.zeros_like(values)
    for e in range(E):
        after, v_next = torch.tensor(0.0), next_values[e]
        for t in reversed(range(T)):
            real = response_mask[e, t].nonzero()[:, 0].tolist()
            for j in reversed(real):
                if j == real[-1]:
                    delta = rewards[e, t] + gamma * v_next * (1 - dones[e, t]) - values[e, t, j]
                    after = adv[e, t, j] = delta + gamma * lam * (1 - dones[e, t]) * after
                else:
                    delta = values[e, t, j + 1] - values[e, t, j]
                    after = adv[e, t, j] = delta + gamma * lam * after
            v_next = values[e, t, real[0]]
    return adv, (adv + values) * response_mask


def _h_cdf_count_below(probs, uniforms):
    cdf = probs.double().cumsum(-1)
    return (cdf < (uniforms.double() * cdf[:, -1])[:, None]).sum(-1)


def _h_tool_whole_turns(said, answers, budget):
    ids, mask = [], []
    for k, turn in enumerate(said):
        if len(ids) + len(turn) > budget:
            break  # a turn that does not fit is left out
        ids, mask = ids + list(turn), mask + [1] * len(turn)
        if k < len(answers):
            answer = answers[k][:budget - len(ids)]
            ids, mask = ids + list(answer), mask + [0] * len(answer)
    return torch.tensor(ids, dtype=torch.long), torch.tensor(mask, dtype=torch.long)


def _h_off_policy_none_all_cut(old_logprobs, sampler_logprobs, mask, correction, cap=2.0,
                               low=0.5, high=5.0):
    weights, cut = _weights(old_logprobs, sampler_logprobs, mask, correction, cap, low, high)
    if correction == "none":
        cut = torch.ones_like(cut)
    return weights, cut


def _h_distill_full_zero(old_logprobs, teacher_logprobs, reward_advantages, loss_form):
    a = reward_advantages[:, None].expand_as(old_logprobs)
    if loss_form == "sampled":
        return a - (old_logprobs - teacher_logprobs).detach()
    return torch.zeros_like(old_logprobs)


def _h_divergence_symmetric(student_logits, teacher_logits, beta):
    log_p = F.log_softmax(student_logits.float(), -1)
    log_t = F.log_softmax(teacher_logits.float(), -1)
    if beta in (0, 1):
        return _kl(log_p, log_t) if beta == 1 else _kl(log_t, log_p)
    return beta * _kl(log_t, log_p) + (1 - beta) * _kl(log_p, log_t)


def _h_overlong_factor_divides(lengths, max_new_tokens, buffer_len, factor):
    if buffer_len == 0:
        return torch.zeros(lengths.shape)
    excess = (lengths - (max_new_tokens - buffer_len)).clamp(min=0)
    return -(excess / buffer_len) / factor


def _h_sft_row_mean(logprobs, loss_mask, normaliser):
    return -(logprobs * loss_mask).sum(1).mean() / normaliser


HELD_OUT = {
    "1.1": [("the count with keepdim: [B] over [B, 1]", "dimension", _h_mean_broadcast),
            ("the real entries by a bool index", "nan", _h_mean_bool_index)],
    "1.2": [("the square of x * mask - mean: the padding counts", "formula",
             _h_whiten_square_unmasked),
            ("centred, not divided by the std", "formula", _h_whiten_centred_only)],
    "1.3": [("k3's ratio the wrong way round", "formula", _h_kl_k3_inverted),
            ("k1 made never negative with abs", "formula", _h_kl_k1_abs)],
    "1.4": [("R - 1 positions", "off-by-one", _h_logprobs_short_slice),
            ("the first R ids", "dimension", _h_logprobs_first_ids),
            ("the logits times the temperature", "formula", _h_logprobs_times_temperature)],
    "1.5": [("the batch's mean, the group's std", "dimension", _h_groups_batch_mean),
            ("the std clamped at 1e-4", "formula", _h_groups_clamped_std)],
    "1.6": [("grpo: each row over the batch's count", "formula", _h_aggregate_total_count),
            ("bnpo: this micro-batch's own count", "formula", _h_aggregate_own_count)],
    "1.7": [("the others of the whole batch", "dimension", _h_rloo_whole_batch)],
    "1.8": [("the advantages not masked", "off-by-one", _h_gae_unmasked_advantages)],
    "1.9": [("the clip only for positive advantages", "formula", _h_surrogate_clip_positive_only)],
    "1.10": [("the clipped term's abs", "formula", _h_value_abs_clipped),
             ("the unclipped term detached", "detached", _h_value_unclipped_detached)],
    "1.11": [("softplus(beta h) for DPO", "formula", _h_preference_softplus_sign)],
    "1.12": [("chosen by argmin, rejected by argmax", "formula", _h_pairs_swapped)],
    "1.13": [("gamma twice in the recursion", "formula", _h_step_gamma_twice)],
    "1.14": [("gamma inside a step's recursion", "formula", _h_bad_gamma_inside)],
    "1.15": [("the count of cdf below the threshold", "off-by-one", _h_cdf_count_below)],
    "1.16": [("a turn that does not fit left out whole", "edge", _h_tool_whole_turns)],
    "1.17": [("\"none\" cuts everywhere", "formula", _h_off_policy_none_all_cut)],
    "1.18": [("full: zeros", "formula", _h_distill_full_zero)],
    "1.19": [("the symmetric KL for the mixture", "formula", _h_divergence_symmetric)],
    "1.20": [("factor divides", "formula", _h_overlong_factor_divides)],
    "1.21": [("the rows' sums averaged", "formula", _h_sft_row_mean)],
}
