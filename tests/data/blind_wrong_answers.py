"""Wrong answers to PS1 written blind, by a hand that read only the stubs (their docstrings and
signatures), not the checker, its cases, its mistakes or the tests, and never ran the checker: two
per exercise, for measuring how often the checker names a mistake it was not shaped on.
tests/test_exercise_rules.py holds every one to failing and the course page to the count named.
Nothing in the checker may be tuned on these: write a new blind set instead.

BLIND[id] = [(label, class, function)], with wrong_answers.py's classes.
"""

import math
import torch
import torch.nn.functional as F


# ---------------- 1.1 masked_mean ----------------
def _e01_a(x, mask, dim=None):
    # forgets the max(1, .) guard: 0 / 0 on an all-padding row
    mask = mask.to(x.dtype)
    if dim is None:
        return (x * mask).sum() / mask.sum()
    return (x * mask).sum(dim) / mask.sum(dim)


def _e01_b(x, mask, dim=None):
    # with dim, divides every row by the count of the whole batch
    mask = mask.to(x.dtype)
    count = torch.clamp(mask.sum(), min=1)
    if dim is None:
        return (x * mask).sum() / count
    return (x * mask).sum(dim) / count


# ---------------- 1.2 masked_whiten ----------------
def _e02_a(x, mask, shift_mean=True, eps=1e-8):
    # biased variance (divides by n, not n - 1)
    mask = mask.to(x.dtype)
    n = mask.sum()
    mean = (x * mask).sum() / n
    var = (mask * (x - mean) ** 2).sum() / n
    out = (x - mean) / torch.sqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return out * mask


def _e02_b(x, mask, shift_mean=True, eps=1e-8):
    # n - 1 without the n = 1 case: 0 / 0 with a single real entry
    mask = mask.to(x.dtype)
    n = mask.sum()
    mean = (x * mask).sum() / n
    var = (mask * (x - mean) ** 2).sum() / (n - 1)
    out = (x - mean) / torch.sqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return out * mask


# ---------------- 1.3 kl_estimate ----------------
def _e03_a(logp, ref_logp, estimator):
    # k3 with the ratio the wrong way round
    log_ratio = logp - ref_logp
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return log_ratio ** 2 / 2
    if estimator == "k3":
        return torch.exp(log_ratio) - 1 - log_ratio
    raise ValueError(estimator)


def _e03_b(logp, ref_logp, estimator):
    # detaches logp inside the exp of k3 (only the log term carries gradient)
    log_ratio = logp - ref_logp
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return log_ratio ** 2 / 2
    if estimator == "k3":
        return torch.exp(ref_logp - logp.detach()) - 1 - (ref_logp - logp)
    raise ValueError(estimator)


# ---------------- 1.4 response_logprobs ----------------
def _e04_a(logits, input_ids, response_len, temperature=1.0):
    # scores each response token with the logits at its own position
    T = logits.shape[1]
    R = response_len
    lp = F.log_softmax(logits[:, T - R:, :] / temperature, dim=-1)
    ids = input_ids[:, T - R:]
    return lp.gather(-1, ids.unsqueeze(-1)).squeeze(-1)


def _e04_b(logits, input_ids, response_len, temperature=1.0):
    # log of softmax: a probability that underflows gives -inf
    T = logits.shape[1]
    R = response_len
    probs = torch.softmax(logits[:, T - R - 1:T - 1, :] / temperature, dim=-1)
    ids = input_ids[:, T - R:]
    return torch.log(probs.gather(-1, ids.unsqueeze(-1)).squeeze(-1))


# ---------------- 1.5 group_advantages ----------------
def _e05_a(rewards, group_size, scale=True):
    # biased std (unbiased=False)
    g = rewards.view(-1, group_size)
    mean = g.mean(dim=1, keepdim=True)
    adv = g - mean
    if scale:
        adv = adv / (g.std(dim=1, keepdim=True, unbiased=False) + 1e-4)
    return adv.reshape(-1)


def _e05_b(rewards, group_size, scale=True):
    # statistics over dim 0 (across groups) instead of within each group
    g = rewards.view(-1, group_size)
    mean = g.mean(dim=0, keepdim=True)
    adv = g - mean
    if scale:
        adv = adv / (g.std(dim=0, keepdim=True) + 1e-4)
    return adv.reshape(-1)


# ---------------- 1.6 aggregate ----------------
def _e06_a(per_token, mask, loss_type, normaliser):
    # grpo divides by each row's count with no guard: an empty row gives NaN
    mask = mask.to(per_token.dtype)
    if loss_type == "grpo":
        per_seq = (per_token * mask).sum(-1) / mask.sum(-1)
        return per_seq.sum() / normaliser
    return (per_token * mask).sum() / normaliser


def _e06_b(per_token, mask, loss_type, normaliser):
    # grpo averages the row means over the rows instead of dividing by normaliser
    mask = mask.to(per_token.dtype)
    if loss_type == "grpo":
        per_seq = (per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1)
        return per_seq.mean()
    return (per_token * mask).sum() / normaliser


# ---------------- 1.7 rloo_baselines ----------------
def _e07_a(episode_returns, group_size):
    # divides by k instead of k - 1
    g = episode_returns.view(-1, group_size)
    return ((g.sum(dim=1, keepdim=True) - g) / group_size).reshape(-1)


def _e07_b(episode_returns, group_size):
    # group sum taken over dim 0 (across groups)
    g = episode_returns.view(-1, group_size)
    return ((g.sum(dim=0, keepdim=True) - g) / (group_size - 1)).reshape(-1)


# ---------------- 1.8 token_gae ----------------
def _e08_a(rewards, values, mask, gamma, lam):
    # done only at the last column of the tensor: padding values leak into the last real token
    mask = mask.to(rewards.dtype)
    B, R = rewards.shape
    adv = torch.zeros_like(rewards)
    last = torch.zeros(B, dtype=rewards.dtype, device=rewards.device)
    for t in reversed(range(R)):
        next_v = values[:, t + 1] if t + 1 < R else torch.zeros_like(last)
        done = 1.0 if t == R - 1 else 0.0
        delta = rewards[:, t] + gamma * next_v * (1 - done) - values[:, t]
        a = (delta + gamma * lam * (1 - done) * last) * mask[:, t]
        adv[:, t] = a
        last = a
    return adv, (adv + values) * mask


def _e08_b(rewards, values, mask, gamma, lam):
    # forgets lam in the recursion
    mask = mask.to(rewards.dtype)
    B, R = rewards.shape
    next_mask = torch.cat([mask[:, 1:], torch.zeros_like(mask[:, :1])], dim=1)
    done = mask * (1 - next_mask)
    adv = torch.zeros_like(rewards)
    last = torch.zeros(B, dtype=rewards.dtype, device=rewards.device)
    for t in reversed(range(R)):
        next_v = values[:, t + 1] if t + 1 < R else torch.zeros_like(last)
        delta = rewards[:, t] + gamma * next_v * (1 - done[:, t]) - values[:, t]
        a = (delta + gamma * (1 - done[:, t]) * last) * mask[:, t]
        adv[:, t] = a
        last = a
    return adv, (adv + values) * mask


# ---------------- 1.9 clipped_surrogate ----------------
def _e09_a(logprobs, old_logprobs, advantages, epsilon):
    # min instead of max of the negated terms
    ratio = torch.exp(logprobs - old_logprobs)
    return torch.minimum(-advantages * ratio,
                         -advantages * torch.clamp(ratio, 1 - epsilon, 1 + epsilon))


def _e09_b(logprobs, old_logprobs, advantages, epsilon):
    # ratio as a quotient of probabilities: 0 / 0 for log-probs near -110
    ratio = torch.exp(logprobs) / torch.exp(old_logprobs)
    return torch.maximum(-advantages * ratio,
                         -advantages * torch.clamp(ratio, 1 - epsilon, 1 + epsilon))


# ---------------- 1.10 clipped_value_loss ----------------
def _e10_a(values, old_values, returns, clip):
    # min instead of max
    vc = old_values + torch.clamp(values - old_values, -clip, clip)
    return 0.5 * torch.minimum((values - returns) ** 2, (vc - returns) ** 2)


def _e10_b(values, old_values, returns, clip):
    # forgets the 0.5
    vc = old_values + torch.clamp(values - old_values, -clip, clip)
    return torch.maximum((values - returns) ** 2, (vc - returns) ** 2)


# ---------------- 1.11 preference_loss ----------------
def _e11_a(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta, loss_type):
    # -log(sigmoid(z)) written as it reads: overflows for very negative z
    h = (chosen_logps - ref_chosen_logps) - (rejected_logps - ref_rejected_logps)
    if loss_type == "sigmoid":
        return -torch.log(torch.sigmoid(beta * h))
    return (h - 1 / (2 * beta)) ** 2


def _e11_b(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta, loss_type):
    # IPO target written 1 / 2 * beta (precedence slip)
    h = (chosen_logps - ref_chosen_logps) - (rejected_logps - ref_rejected_logps)
    if loss_type == "sigmoid":
        return -F.logsigmoid(beta * h)
    return (h - 1 / 2 * beta) ** 2


# ---------------- 1.12 preference_pairs ----------------
def _e12_a(scores, group_size):
    # returns positions inside the group, not rows of scores
    g = scores.view(-1, group_size)
    best = g.argmax(dim=1)
    worst = g.argmin(dim=1)
    keep = g.max(dim=1).values != g.min(dim=1).values
    return best[keep].to(torch.int64), worst[keep].to(torch.int64)


def _e12_b(scores, group_size):
    # never skips a tied prompt
    g = scores.view(-1, group_size)
    offset = torch.arange(g.shape[0], device=scores.device) * group_size
    best = g.argmax(dim=1) + offset
    worst = g.argmin(dim=1) + offset
    return best.to(torch.int64), worst.to(torch.int64)


# ---------------- 1.13 step_advantages ----------------
def _e13_a(rewards, values, next_values, dones, gamma, lam):
    # bootstraps from next_values at the last step even when it ends an episode
    E, T = rewards.shape
    dones = dones.to(rewards.dtype)
    adv = torch.zeros_like(rewards)
    last = torch.zeros(E, dtype=rewards.dtype, device=rewards.device)
    for t in reversed(range(T)):
        if t == T - 1:
            delta = rewards[:, t] + gamma * next_values - values[:, t]
            a = delta
        else:
            nd = 1 - dones[:, t]
            delta = rewards[:, t] + gamma * values[:, t + 1] * nd - values[:, t]
            a = delta + gamma * lam * nd * last
        adv[:, t] = a
        last = a
    return adv, adv + values


def _e13_b(rewards, values, next_values, dones, gamma, lam):
    # reads done from the next step (done_{t+1}) instead of done_t
    E, T = rewards.shape
    dones = dones.to(rewards.dtype)
    adv = torch.zeros_like(rewards)
    last = torch.zeros(E, dtype=rewards.dtype, device=rewards.device)
    for t in reversed(range(T)):
        next_v = next_values if t == T - 1 else values[:, t + 1]
        d = torch.zeros_like(last) if t == T - 1 else dones[:, t + 1]
        nd = 1 - d
        delta = rewards[:, t] + gamma * next_v * nd - values[:, t]
        a = delta + gamma * lam * nd * last
        adv[:, t] = a
        last = a
    return adv, adv + values


# ---------------- 1.14 bad_advantages ----------------
def _bad(rewards, values, response_mask, next_values, dones, gamma, lam,
         inner_gamma=False, pad_resets=False):
    E, T, R = values.shape
    mask = response_mask.to(values.dtype)
    dones = dones.to(values.dtype)
    adv = torch.zeros_like(values)
    a_after = torch.zeros(E, dtype=values.dtype, device=values.device)
    v_next = next_values.to(values.dtype)
    for t in reversed(range(T)):
        nd = 1 - dones[:, t]
        for j in reversed(range(R)):
            real = mask[:, t, j] > 0
            if j + 1 < R:
                later_real = mask[:, t, j + 1:].sum(-1) > 0
                v_in = values[:, t, j + 1]
            else:
                later_real = torch.zeros_like(real)
                v_in = torch.zeros_like(a_after)
            is_last = real & ~later_real
            a_last = rewards[:, t] + gamma * v_next * nd - values[:, t, j] + gamma * lam * nd * a_after
            if inner_gamma:
                a_mid = gamma * v_in - values[:, t, j] + gamma * lam * a_after
            else:
                a_mid = v_in - values[:, t, j] + lam * a_after
            a = torch.where(is_last, a_last, torch.where(real, a_mid, torch.zeros_like(a_after)))
            adv[:, t, j] = a
            if pad_resets:
                a_after = a
            else:
                a_after = torch.where(real, a, a_after)
        v_next = values[:, t, 0]
    return adv, (adv + values) * mask


def _e14_a(rewards, values, response_mask, next_values, dones, gamma, lam):
    # discounts inside a step (gamma on V[t, j+1] and gamma * lam)
    return _bad(rewards, values, response_mask, next_values, dones, gamma, lam, inner_gamma=True)


def _e14_b(rewards, values, response_mask, next_values, dones, gamma, lam):
    # padding resets A_after to 0 instead of passing it through
    return _bad(rewards, values, response_mask, next_values, dones, gamma, lam, pad_resets=True)


# ---------------- 1.15 inverse_cdf ----------------
def _e15_a(probs, uniforms):
    # searchsorted with right=False: a u exactly on a step picks the token below
    cdf = torch.cumsum(probs.to(torch.float64), dim=-1)
    thr = uniforms.to(torch.float64) * cdf[:, -1]
    idx = torch.searchsorted(cdf, thr.unsqueeze(-1), right=False).squeeze(-1)
    return idx.clamp(max=probs.shape[-1] - 1).to(torch.int64)


def _e15_b(probs, uniforms):
    # computed in float32: u = 1 - 2^-32 rounds to 1 and the last (zero) token is drawn
    cdf = torch.cumsum(probs.to(torch.float32), dim=-1)
    thr = uniforms.to(torch.float32) * cdf[:, -1]
    idx = torch.searchsorted(cdf, thr.unsqueeze(-1), right=True).squeeze(-1)
    return idx.clamp(max=probs.shape[-1] - 1).to(torch.int64)


# ---------------- 1.16 training_ids ----------------
def _e16_a(said, answers, budget):
    # an answer that does not fit is dropped whole instead of cut
    ids, mask = [], []
    for k, turn in enumerate(said):
        room = budget - len(ids)
        if room <= 0:
            break
        part = list(turn)[:room]
        ids += part
        mask += [1] * len(part)
        if len(part) < len(turn):
            break
        if k < len(answers):
            ans = list(answers[k])
            if len(ids) + len(ans) > budget:
                break
            ids += ans
            mask += [0] * len(ans)
    return torch.tensor(ids, dtype=torch.int64), torch.tensor(mask, dtype=torch.int64)


def _e16_b(said, answers, budget):
    # tool_mask returned as bool, not int64
    ids, mask = [], []
    for k, turn in enumerate(said):
        parts = [(list(turn), 1)]
        if k < len(answers):
            parts.append((list(answers[k]), 0))
        for seq, m in parts:
            room = budget - len(ids)
            seq = seq[:max(room, 0)]
            ids += seq
            mask += [m] * len(seq)
    return torch.tensor(ids, dtype=torch.int64), torch.tensor(mask, dtype=torch.bool)


# ---------------- 1.17 off_policy_weights ----------------
def _opw(old_logprobs, sampler_logprobs, mask, correction, cap, low, high,
         tis_ge=False, seq_dim=-1):
    m = mask.to(old_logprobs.dtype)
    lr = (old_logprobs - sampler_logprobs) * m
    r = torch.exp(lr)
    if correction == "none":
        return torch.ones_like(r), torch.zeros_like(r, dtype=torch.bool)
    if correction == "tis":
        cut = r >= cap if tis_ge else r > cap
        return torch.clamp(r, max=cap), cut
    if correction == "icepop":
        cut = (r < low) | (r > high)
        return torch.where(cut, torch.zeros_like(r), r), cut
    if correction == "seq_mis":
        R = torch.exp(lr.sum(dim=seq_dim, keepdim=True)).expand_as(r)
        cut = R > cap
        return torch.where(cut, torch.zeros_like(R), R), cut
    raise ValueError(correction)


def _e17_a(old_logprobs, sampler_logprobs, mask, correction, cap=2.0, low=0.5, high=5.0):
    # tis cuts a ratio that sits exactly on the cap (>= instead of >)
    return _opw(old_logprobs, sampler_logprobs, mask, correction, cap, low, high, tis_ge=True)


def _e17_b(old_logprobs, sampler_logprobs, mask, correction, cap=2.0, low=0.5, high=5.0):
    # seq_mis product taken over the batch dimension, not over a response's tokens
    return _opw(old_logprobs, sampler_logprobs, mask, correction, cap, low, high, seq_dim=0)


# ---------------- 1.18 distill_advantages ----------------
def _e18_a(old_logprobs, teacher_logprobs, reward_advantages, loss_form):
    # sign of the reverse-KL term flipped
    a = reward_advantages.unsqueeze(-1).expand_as(old_logprobs)
    if loss_form == "sampled":
        return (a + (old_logprobs - teacher_logprobs)).detach()
    return a.clone().detach()


def _e18_b(old_logprobs, teacher_logprobs, reward_advantages, loss_form):
    # keeps the graph: the advantage stays a function of the weights
    a = reward_advantages.unsqueeze(-1).expand_as(old_logprobs)
    if loss_form == "sampled":
        return a - (old_logprobs - teacher_logprobs)
    return a + torch.zeros_like(old_logprobs)


# ---------------- 1.19 divergence ----------------
def _e19_a(student_logits, teacher_logits, beta):
    # mixture weights swapped: m = beta * pi + (1 - beta) * pi_T
    logp = F.log_softmax(student_logits.float(), dim=-1)
    logq = F.log_softmax(teacher_logits.float(), dim=-1)
    if beta == 1:
        return (logp.exp() * (logp - logq)).sum(-1)
    if beta == 0:
        return (logq.exp() * (logq - logp)).sum(-1)
    logm = torch.logsumexp(torch.stack([logq + math.log(1 - beta), logp + math.log(beta)]), dim=0)
    return (beta * (logq.exp() * (logq - logm)).sum(-1)
            + (1 - beta) * (logp.exp() * (logp - logm)).sum(-1))


def _e19_b(student_logits, teacher_logits, beta):
    # the mixture built from probabilities: log m = -inf where both underflow, 0 * inf = NaN
    logp = F.log_softmax(student_logits.float(), dim=-1)
    logq = F.log_softmax(teacher_logits.float(), dim=-1)
    p, q = logp.exp(), logq.exp()
    if beta == 1:
        return (p * (logp - logq)).sum(-1)
    if beta == 0:
        return (q * (logq - logp)).sum(-1)
    logm = torch.log(beta * q + (1 - beta) * p)
    return beta * (q * (logq - logm)).sum(-1) + (1 - beta) * (p * (logp - logm)).sum(-1)


# ---------------- 1.20 overlong_penalty ----------------
def _e20_a(lengths, max_new_tokens, buffer_len, factor):
    # integer floor division of the int64 lengths
    if buffer_len == 0:
        return torch.zeros(lengths.shape, dtype=torch.float32)
    into = torch.clamp(lengths - (max_new_tokens - buffer_len), min=0)
    return (-factor * (into // buffer_len)).to(torch.float32)


def _e20_b(lengths, max_new_tokens, buffer_len, factor):
    # no special case for buffer_len 0: 0 / 0
    into = torch.clamp(lengths - (max_new_tokens - buffer_len), min=0).to(torch.float32)
    return -factor * into / buffer_len if buffer_len else -factor * into / torch.tensor(0.0)


# ---------------- 1.21 sft_loss ----------------
def _e21_a(logprobs, loss_mask, normaliser):
    # divides by this micro-batch's token count, ignoring normaliser
    m = loss_mask.to(logprobs.dtype)
    return -(logprobs * m).sum() / m.sum().clamp(min=1)


def _e21_b(logprobs, loss_mask, normaliser):
    # forgets the mask: prompt and padding tokens count too
    return -logprobs.sum() / normaliser


BLIND = {
    "1.1": [("no max(1, .) guard on the count", "nan", _e01_a),
            ("divides each row by the whole batch's count", "dimension", _e01_b)],
    "1.2": [("biased variance (n, not n - 1)", "off-by-one", _e02_a),
            ("n - 1 with n = 1 gives 0/0", "nan", _e02_b)],
    "1.3": [("k3 ratio the wrong way round", "formula", _e03_a),
            ("logp detached inside k3's exp", "detached", _e03_b)],
    "1.4": [("logits at the token's own position, not the one before", "off-by-one", _e04_a),
            ("log of softmax underflows to -inf", "edge", _e04_b)],
    "1.5": [("biased std", "off-by-one", _e05_a),
            ("mean/std over dim 0 (across groups)", "dimension", _e05_b)],
    "1.6": [("grpo: unguarded per-row count, NaN on empty row", "nan", _e06_a),
            ("grpo: mean of row means, normaliser ignored", "formula", _e06_b)],
    "1.7": [("divides by k, not k - 1", "off-by-one", _e07_a),
            ("group sum over dim 0", "dimension", _e07_b)],
    "1.8": [("done only at the last column; padding value leaks", "edge", _e08_a),
            ("lam missing from the recursion", "formula", _e08_b)],
    "1.9": [("min instead of max", "formula", _e09_a),
            ("ratio as exp/exp: 0/0 at -110", "nan", _e09_b)],
    "1.10": [("min instead of max", "formula", _e10_a),
             ("missing the 0.5 factor", "formula", _e10_b)],
    "1.11": [("-log(sigmoid) not stable", "edge", _e11_a),
             ("IPO target 1/2*beta precedence slip", "formula", _e11_b)],
    "1.12": [("positions inside group, not rows", "off-by-one", _e12_a),
             ("tied prompt not skipped", "edge", _e12_b)],
    "1.13": [("bootstraps next_values through a final done", "edge", _e13_a),
             ("uses done_{t+1} instead of done_t", "off-by-one", _e13_b)],
    "1.14": [("discount applied inside a step", "formula", _e14_a),
             ("padding resets A_after instead of passing it", "edge", _e14_b)],
    "1.15": [("searchsorted right=False", "edge", _e15_a),
             ("cdf in float32", "dtype", _e15_b)],
    "1.16": [("answer dropped whole instead of cut", "edge", _e16_a),
             ("tool_mask as bool", "dtype", _e16_b)],
    "1.17": [("tis cuts at r == cap (>=)", "edge", _e17_a),
             ("seq_mis product over batch dim", "dimension", _e17_b)],
    "1.18": [("KL term sign flipped", "formula", _e18_a),
             ("advantage not detached", "not detached", _e18_b)],
    "1.19": [("mixture weights swapped", "formula", _e19_a),
             ("mixture in probability space, NaN", "nan", _e19_b)],
    "1.20": [("integer floor division", "dtype", _e20_a),
             ("buffer_len 0 divides by zero", "nan", _e20_b)],
    "1.21": [("divides by micro-batch count, not normaliser", "formula", _e21_a),
             ("forgets the mask", "formula", _e21_b)],
}
