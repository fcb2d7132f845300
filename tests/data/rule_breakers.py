"""For each rule of exercises/ps1/cases.py's RULES, a function right but for that one rule (a
"breaker"): tests/test_exercise_rules.py checks that the checker fails each one on the cases the
rule names. BREAKERS[id][rule] is a function, a listed mistake of the exercise (mistake(id,
words): the one whose words begin so), or NO_GRADIENT: the exercise's own function with its
gradient cut."""

import importlib.util
from pathlib import Path

import torch
import torch.nn.functional as F

from exercises.ps1.cases import EXERCISES, _GRADIENTS

BY_ID = {e.id: e for e in EXERCISES}
NO_GRADIENT = "the right numbers under torch.no_grad()"

_spec = importlib.util.spec_from_file_location("wrong_answers",
                                               Path(__file__).with_name("wrong_answers.py"))
W = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(W)


def mistake(id, words):
    """The listed mistake of exercise id whose words begin with `words`."""
    found = [wrong for said, wrong in BY_ID[id].mistakes
             if isinstance(said, str) and said.startswith(words)]
    assert len(found) == 1, (id, words)
    return found[0]


def oracle(id):
    return BY_ID[id].oracle


def _masked_mean_no_dim(x, mask, dim=None):
    return oracle("1.1")(x, mask)  # dim ignored


def _whiten_no_shift(x, mask, shift_mean=True, eps=1e-8):
    return oracle("1.2")(x, mask, True, eps)


def _whiten_n_minus_1(x, mask, shift_mean=True, eps=1e-8):  # no guard for n = 1 alone
    n = mask.sum()
    if n > 1:
        return oracle("1.2")(x, mask, shift_mean, eps)
    return torch.full_like(x, float("nan"))


def _kl_k1_inverted(logp, ref_logp, estimator):
    right = oracle("1.3")(logp, ref_logp, estimator)
    return -right if estimator == "k1" else right


def _kl_of_probabilities(logp, ref_logp, estimator):
    ratio = ref_logp.exp() / logp.exp()  # the ratios as quotients of exps
    if estimator == "k1":
        return -torch.log(ratio)
    if estimator == "k2":
        return torch.log(ratio) ** 2 / 2
    return ratio - 1 - torch.log(ratio)


def _logprobs_log_of_softmax(logits, input_ids, response_len, temperature=1.0):
    scores = logits[:, -response_len - 1:-1] / temperature
    return torch.log(torch.softmax(scores, -1)).gather(-1, input_ids[:, -response_len:, None])[
        ..., 0]


def _logprobs_unsqueezed(logits, input_ids, response_len, temperature=1.0):
    return oracle("1.4")(logits, input_ids, response_len, temperature)[..., None]


def _groups_tied_nan(rewards, group_size, scale=True):
    right = oracle("1.5")(rewards, group_size, scale)
    tied = rewards.view(-1, group_size).std(1) == 0
    return right.view(-1, group_size).masked_fill(tied[:, None], float("nan")).reshape(-1)


def _groups_unflattened(rewards, group_size, scale=True):
    return oracle("1.5")(rewards, group_size, scale).view(-1, group_size)


def _aggregate_empty_row_nan(per_token, mask, loss_type, normaliser):
    right = oracle("1.6")(per_token, mask, loss_type, normaliser)
    return right + (torch.nan if loss_type == "grpo" and (mask.sum(1) == 0).any() else 0.0)


def _rloo_unflattened(episode_returns, group_size):
    return oracle("1.7")(episode_returns, group_size).view(-1, group_size)


def _gae_returns_unmasked(rewards, values, mask, gamma, lam):
    advantages, _ = oracle("1.8")(rewards, values, mask, gamma, lam)
    return advantages, advantages + values


def _swapped(id):
    def swapped(**kwargs):
        first, second = oracle(id)(**kwargs)
        return second, first
    return swapped


def _surrogate_straight_through(logprobs, old_logprobs, advantages, epsilon):
    ratio = torch.exp(logprobs - old_logprobs)
    clipped = ratio + (ratio.clamp(1 - epsilon, 1 + epsilon) - ratio).detach()
    return torch.max(-advantages * ratio, -advantages * clipped)


def _surrogate_of_probabilities(logprobs, old_logprobs, advantages, epsilon):
    ratio = logprobs.exp() / old_logprobs.exp()
    return torch.max(-advantages * ratio, -advantages * ratio.clamp(1 - epsilon, 1 + epsilon))


def _surrogate_per_row(logprobs, old_logprobs, advantages, epsilon):
    ratio = torch.exp(logprobs - old_logprobs)
    a = advantages[:, None]
    return torch.max(-a * ratio, -a * ratio.clamp(1 - epsilon, 1 + epsilon))


def _mean_of(id):
    def mean(**kwargs):
        return oracle(id)(**kwargs).mean()
    return mean


def _preference_no_beta(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta,
                        loss_type):
    if loss_type == "ipo":
        return oracle("1.11")(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps,
                              beta, loss_type)
    h = (chosen_logps - ref_chosen_logps) - (rejected_logps - ref_rejected_logps)
    return -F.logsigmoid(h)


def _preference_as_written(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps,
                           beta, loss_type):
    if loss_type == "ipo":
        return oracle("1.11")(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps,
                              beta, loss_type)
    h = (chosen_logps - ref_chosen_logps) - (rejected_logps - ref_rejected_logps)
    return torch.log(1 + torch.exp(-beta * h))


def _pairs_float(scores, group_size):
    return tuple(rows.float() for rows in oracle("1.12")(scores, group_size))


def _pairs_reversed(scores, group_size):
    return tuple(rows.flip(0) for rows in oracle("1.12")(scores, group_size))


def _bad_next_values_always(rewards, values, response_mask, next_values, dones, gamma, lam):
    """Every step's last token bootstraps from next_values, not from the next step's first."""
    E, T, R = values.shape
    adv = torch.zeros(E, T, R)
    for e in range(E):
        after = torch.tensor(0.0)
        for t in reversed(range(T)):
            real = response_mask[e, t].nonzero()[:, 0].tolist()
            for j in reversed(real):
                if j == real[-1]:
                    delta = rewards[e, t] + gamma * next_values[e] * (1 - dones[e, t]) - values[
                        e, t, j]
                    after = adv[e, t, j] = delta + gamma * lam * (1 - dones[e, t]) * after
                else:
                    after = adv[e, t, j] = values[e, t, j + 1] - values[e, t, j] + lam * after
    return adv, (adv + values) * response_mask


def _bad_returns_unmasked(rewards, values, response_mask, next_values, dones, gamma, lam):
    advantages, _ = oracle("1.14")(rewards, values, response_mask, next_values, dones, gamma, lam)
    return advantages, advantages + values


def _cdf_int32(probs, uniforms):
    return oracle("1.15")(probs, uniforms).int()


def _off_policy_none_ratio(old_logprobs, sampler_logprobs, mask, correction, cap=2.0, low=0.5,
                           high=5.0):
    weights, cut = oracle("1.17")(old_logprobs, sampler_logprobs, mask, correction, cap, low, high)
    if correction == "none":  # the ratio itself where no correction is asked
        weights = torch.exp((old_logprobs - sampler_logprobs) * mask)
    return weights, cut


def _off_policy_cut_per_token(old_logprobs, sampler_logprobs, mask, correction, cap=2.0, low=0.5,
                              high=5.0):
    weights, cut = oracle("1.17")(old_logprobs, sampler_logprobs, mask, correction, cap, low, high)
    if correction == "seq_mis":  # cut where a token's own ratio is above cap
        cut = torch.exp((old_logprobs - sampler_logprobs) * mask) > cap
    return weights, cut


def _off_policy_cut_for_none(old_logprobs, sampler_logprobs, mask, correction, cap=2.0, low=0.5,
                             high=5.0):
    weights, cut = oracle("1.17")(old_logprobs, sampler_logprobs, mask, correction, cap, low, high)
    if correction == "none":
        cut = torch.exp((old_logprobs - sampler_logprobs) * mask) > cap
    return weights, cut


def _off_policy_float_cut(old_logprobs, sampler_logprobs, mask, correction, cap=2.0, low=0.5,
                          high=5.0):
    weights, cut = oracle("1.17")(old_logprobs, sampler_logprobs, mask, correction, cap, low, high)
    return weights, cut.float()


def _divergence_beta0_reverse(student_logits, teacher_logits, beta):
    return oracle("1.19")(student_logits, teacher_logits, 1.0 if beta == 0 else beta)


def _divergence_in_input_dtype(student_logits, teacher_logits, beta):
    return oracle("1.19")(student_logits, teacher_logits, beta).to(student_logits.dtype)


def _overlong_integer_zeros(lengths, max_new_tokens, buffer_len, factor):
    if buffer_len == 0:
        return torch.zeros_like(lengths)
    return oracle("1.20")(lengths, max_new_tokens, buffer_len, factor)


def _sft_per_row(logprobs, loss_mask, normaliser):
    return -(logprobs * loss_mask).sum(1) / normaliser


BREAKERS = {
    "1.1": {
        "A statistic over tokens must ignore the padding": mistake("1.1", "that is the mean"),
        "masked_mean(x, mask, dim=d) = sum(x * mask, d) / max(1, sum(mask, d))":
            _masked_mean_no_dim,
        "each row (each slice along the other dimensions) is divided by its own count of real "
        "tokens, not by the count of the whole batch": mistake("1.1", "with dim"),
        "An all-zero mask gives 0, not NaN": W._mean_nan_without_dim,
        "An all-zero mask gives 0, not NaN (a micro-batch may hold only padding)":
            mistake("1.1", "a row without real tokens"),
        _GRADIENTS: NO_GRADIENT,
    },
    "1.2": {
        "mean = masked mean of x": mistake("1.2", "the mean and variance were taken over the "
                                                  "padding"),
        "n = sum(mask)": mistake("1.2", "the mean and variance were taken per row"),
        "The variance is the unbiased one (n - 1)": mistake("1.2", "the variance divides by n"),
        "whiten(x) = (x - mean) / sqrt(var + eps) (shift_mean=True)": W._whiten_eps_on_std,
        "whiten(x) = (x - mean) / sqrt(var + eps) + mean (shift_mean=False": _whiten_no_shift,
        "and 0 on the padding": mistake("1.2", "the padding is not 0"),
        "with a single real entry (n = 1) divide by 1": _whiten_n_minus_1,
    },
    "1.3": {
        "k1 = log pi(x) / pi_ref(x)": _kl_k1_inverted,
        "k2 = (log pi(x) / pi_ref(x))^2 / 2 biased, never negative": mistake("1.3", "k2 is half"),
        "k3 = pi_ref(x) / pi(x) - 1 - log(pi_ref(x) / pi(x)) unbiased, never negative":
            mistake("1.3", "k3 is r - 1 - log r"),
        "every ratio is an exp of a difference of log-probs": _kl_of_probabilities,
        _GRADIENTS: NO_GRADIENT,
    },
    "1.4": {
        "A causal model's logits at position t predict the token at position t + 1":
            mistake("1.4", "the logits at position t were used"),
        "the R response tokens are scored by the R positions just before them":
            W._logprobs_both_shifted,
        "log softmax(logits[b, T-R-1+j] / temperature)": mistake("1.4", "the temperature is "
                                                                        "missing"),
        "over which axis is a distribution normalised?": mistake("1.4", "the softmax was taken"),
        "a token of probability e^-200, 0 in float32, still has its log-prob, -200, never -inf":
            _logprobs_log_of_softmax,
        "-> logprobs [B, R] of the last R = response_len tokens": _logprobs_unsqueezed,
        _GRADIENTS: NO_GRADIENT,
    },
    "1.5": {
        "rewards holds N groups of G = group_size responses to the same prompt, one group after "
        "another (rows 0..G-1 are group 0)": mistake("1.5", "the groups are strided"),
        "A_i = (r_i - mean(group)) / (std(group) + 1e-4) scale=True: GRPO":
            mistake("1.5", "the std has no + 1e-4"),
        "A_i = r_i - mean(group) scale=False: Dr.GRPO": mistake("1.5", "scale=False was ignored"),
        "std is the unbiased one (torch.std's default)": mistake("1.5", "the std is the biased"),
        "A group whose rewards are all equal gets 0": _groups_tied_nan,
        "[N * G] rewards -> [N * G] advantages": _groups_unflattened,
    },
    "1.6": {
        '"grpo": sum_i [ sum_t mask * loss / sum_t mask ] / normaliser':
            mistake("1.6", "every loss type summed tokens"),
        "sum_{i,t} mask * loss / normaliser": mistake("1.6", "every loss type took sequence"),
        '"bnpo", "dapo", "dr_grpo":': mistake("1.6", '"dapo" sums tokens'),
        "mask [b, R] (1 on the tokens that count)": mistake("1.6", "the mask was left out"),
        "normaliser is a number fixed for the whole minibatch":
            mistake("1.6", "the sequences' means were averaged"),
        "A row with no counted token adds 0": _aggregate_empty_row_nan,
        _GRADIENTS: NO_GRADIENT,
    },
    "1.7": {
        "groups of k = group_size consecutive samples of the same prompt":
            mistake("1.7", "the groups are strided"),
        "Sample i's baseline is the mean of the OTHER k - 1 samples of its group":
            mistake("1.7", "that is the group mean"),
        "b_i = (sum_j r_j - r_i) / (k - 1)": mistake("1.7", "sample i is left out but"),
        "[N] returns -> [N] baselines": _rloo_unflattened,
    },
    "1.8": {
        "delta_t = r_t + gamma * V_{t+1} * (1 - done_t) - V_t": mistake("1.8", "V_{t+1} is "
                                                                               "missing"),
        "A_t = delta_t + gamma * lam * (1 - done_t) * A_{t+1}": mistake("1.8", "gamma and lam are "
                                                                               "swapped"),
        "returns = A + V": mistake("1.8", "the returns are A"),
        "Each row's episode ends at its last real token, whose successor has value 0":
            mistake("1.8", "the row did not end"),
        "done_t = 1 at the last real token of a row": mistake("1.8", "done_t was read off"),
        "Padding gets advantage and return 0": _gae_returns_unmasked,
        "A_t needs A_{t+1}: which direction must the loop over t go?":
            mistake("1.8", "the loop ran forwards"),
        "-> (advantages [B, R], returns [B, R])": _swapped("1.8"),
    },
    "1.9": {
        "With ratio = exp(logprobs - old_logprobs)": mistake("1.9", "the ratio is inverted"),
        "loss = max( -A * ratio, -A * clip(ratio, 1 - epsilon, 1 + epsilon) )":
            mistake("1.9", "min where it is max"),
        "A token whose ratio has left the clip range in the direction its advantage pushes gets "
        "no gradient": _surrogate_straight_through,
        "Log-probs may lie far below 0 (near -110, whose exp is 0 in float32): the ratio and the "
        "loss stay finite": _surrogate_of_probabilities,
        "advantages is [b, R] here, one per token.": _surrogate_per_row,
        "All inputs [b, R] -> per-token losses [b, R]": _mean_of("1.9"),
        _GRADIENTS: NO_GRADIENT,
    },
    "1.10": {
        "values_clipped = old_values + clip(values - old_values, -clip, clip)":
            mistake("1.10", "no clipping"),
        "loss = 0.5 * max( (values - returns)^2, (values_clipped - returns)^2 )":
            mistake("1.10", "min where it is max"),
        "loss = 0.5 *": mistake("1.10", "the 1/2 is missing"),
        "All inputs [b, R] -> per-token losses [b, R]": _mean_of("1.10"),
        _GRADIENTS: NO_GRADIENT,
    },
    "1.11": {
        "h = (log pi(y_w) - log pi_ref(y_w)) - (log pi(y_l) - log pi_ref(y_l))":
            mistake("1.11", "the reference log-probs were not subtracted"),
        '"sigmoid" (DPO): loss = -log sigmoid(beta * h)': _preference_no_beta,
        '"ipo" (IPO): loss = (h - 1 / (2 * beta))^2': mistake("1.11", "IPO's h is not"),
        "y_w is the chosen response, y_l the rejected one": mistake("1.11", "chosen and rejected"),
        "-log sigmoid(z) = log(1 + exp(-z)) overflows for very negative z if written as it reads":
            _preference_as_written,
        "Four [P] tensors of sequence log-probs -> [P] losses": _mean_of("1.11"),
        _GRADIENTS: NO_GRADIENT,
    },
    "1.12": {
        "Each prompt gives one pair: its best response (chosen) against its worst (rejected)":
            _swapped("1.12"),
        "the first of equal scores in both cases": mistake("1.12", "the last of equal scores"),
        "A prompt whose responses all score the same gives no pair":
            mistake("1.12", "a prompt whose responses all tie"),
        "Returns (chosen rows [P], rejected rows [P]): row numbers into scores (int64)":
            _pairs_float,
        "in prompt order": _pairs_reversed,
        "The rows returned are rows of scores, not positions inside a group":
            mistake("1.12", "the rows are positions"),
    },
    "1.13": {
        "dones[:, t] = 1 where an episode ended at step t":
            mistake("1.13", "the step after an episode's end"),
        "delta_t = r_t + gamma * V_{t+1} * (1 - done_t) - V_t (V_T = next_values)":
            mistake("1.13", "the segment's last step was not"),
        "A_t = delta_t + gamma * lam * (1 - done_t) * A_{t+1}":
            mistake("1.13", "the advantage was carried"),
        "returns = A + V": mistake("1.13", "the returns are A"),
        "At an episode's end nothing comes back from the next step: that is a new problem":
            mistake("1.13", "the segment's last step bootstrapped"),
        "-> (advantages [E, T], returns [E, T])": _swapped("1.13"),
    },
    "1.14": {
        "at a step's last real token: delta = r_t + gamma * V_next * (1 - done_t) - V[t, j]":
            mistake("1.14", "the episode's end was ignored"),
        "at any other real token: delta = V[t, j+1] - V[t, j]":
            mistake("1.14", "gamma was applied at every token"),
        "A = delta + lam * A_after": mistake("1.14", "inside a step A = delta + lam A_after"),
        "a step may be shorter than R": mistake("1.14", "a step's last real token"),
        "V_next is V of the next step's first token (next_values after the last step)":
            _bad_next_values_always,
        "Inside a step there is no reward and no discount":
            mistake("1.14", "gamma was applied at every token"),
        "Padding gets 0 and passes A_after through": mistake("1.14", "padding passes A_after"),
        "returns = (A + V) * mask": _bad_returns_unmasked,
        "-> (advantages [E, T, R], returns [E, T, R])": _swapped("1.14"),
    },
    "1.15": {
        "token = min{ i : cdf[i] > u * cdf[V-1] }": mistake("1.15", "the draw took the first"),
        "probs [B, V] need not sum to 1 (top-p zeroes some)": mistake("1.15", "u was not scaled"),
        "the first token whose cumulative probability EXCEEDS u times the row's mass":
            mistake("1.15", "u was scaled by the mass of the whole batch"),
        "computed in float64, so that a token of probability 0 is never drawn":
            mistake("1.15", "the cdf was summed in float32"),
        "Try u = 1 - 2^-32 in float32 and in float64": W._cdf_float32_clamped,
        "-> tokens [B] (int64)": _cdf_int32,
    },
    "1.16": {
        "ids = said[0] + answers[0] + said[1] + answers[1] + ... + said[-1]":
            mistake("1.16", "the ids are in the order"),
        "tool_mask = [1] * len(said[0]) + [0] * len(answers[0]) + [1] * len(said[1]) + ...":
            mistake("1.16", "the tool's ids got mask 1"),
        "The tool's ids stay in the sequence (the model reads them) with mask 0":
            mistake("1.16", "the tool's answer was left out"),
        "The budget counts every id, the model's and the tools'":
            mistake("1.16", "the budget counted the model's ids only"),
        "a turn or an answer that would run past it is cut there":
            mistake("1.16", "the tool's answer ran past the budget"),
        "(ids [L] int64, tool_mask [L] int64)": W._tool_bool_mask,
        "L <= budget": W._tool_below_budget,
    },
    "1.17": {
        "r_t = pi_prox(o_t) / mu(o_t) = exp(old_logprobs - sampler_logprobs)":
            mistake("1.17", "the ratio is inverted"),
        "on the real tokens (a padding token counts as r = 1)":
            mistake("1.17", "the padding was not masked"),
        '"none" w_t = 1': _off_policy_none_ratio,
        '"tis" w_t = min(r_t, cap) truncated: never above cap': mistake("1.17", "TIS truncates"),
        '"icepop" w_t = r_t if low <= r_t <= high, else 0 a token far off is masked':
            mistake("1.17", "IcePop masks a token outside"),
        "low <= r_t <= high": mistake("1.17", "IcePop keeps a ratio on its bounds"),
        '"seq_mis" w_t = R if R <= cap, else 0, R = prod_t r_t one weight per response, masked':
            mistake("1.17", "sequence MIS weighs every token"),
        "R if R <= cap": mistake("1.17", "sequence MIS keeps R <= cap"),
        "cut is True where a bound changed the weight: r_t > cap (tis)":
            mistake("1.17", "TIS cuts a weight above cap"),
        "R > cap on every token of the response (seq_mis)": _off_policy_cut_per_token,
        "nowhere (none)": _off_policy_cut_for_none,
        "(weights [b, R] float, cut [b, R] bool)": _off_policy_float_cut,
    },
    "1.18": {
        '"sampled": A_it = A_i - (log pi_old(o_t) - log pi_T(o_t))':
            mistake("1.18", "the sign of the log-ratio"),
        '"full": A_it = A_i': mistake("1.18", "in the full form"),
        "is added to every token of response i": mistake("1.18", "the verifier's share A_i"),
        "A token the teacher likes more than the student scores above 0":
            mistake("1.18", "the sign of the log-ratio"),
        "The advantage is a number, not a function of the weights": W._distill_not_detached,
        "reward_advantages [b] -> advantages [b, R]": W._distill_full_one_per_row,
    },
    "1.19": {
        "beta = 1: KL(pi || pi_T) = sum_v pi(v) (log pi(v) - log pi_T(v)) reverse":
            mistake("1.19", "the student's and the teacher's distributions are swapped"),
        "beta = 0: KL(pi_T || pi) = sum_v pi_T(v) (log pi_T(v) - log pi(v)) forward":
            _divergence_beta0_reverse,
        "0 < beta < 1: beta KL(pi_T || m) + (1 - beta) KL(pi || m), m = beta pi_T + (1 - beta) pi":
            mistake("1.19", "the mixture's weights are swapped"),
        "compared over the whole vocabulary": mistake("1.19", "the divergence sums over the "
                                                              "vocabulary"),
        "which stays finite where a probability underflows": mistake("1.19", "m was taken as "
                                                                             "probabilities"),
        "[..., V] logits each -> [...] divergences": mistake("1.19", "the softmax was taken over "
                                                                     "the wrong axis"),
        "divergences (float32)": _divergence_in_input_dtype,
        _GRADIENTS: NO_GRADIENT,
    },
    "1.20": {
        "loses reward linearly, down to -factor at the budget": mistake("1.20", "the sign is "
                                                                                "wrong"),
        "penalty = 0 L <= max_new_tokens - buffer_len":
            mistake("1.20", "the tokens into the buffer were not clamped"),
        "penalty = -factor * (L - (max_new_tokens - buffer_len)) / buffer_len inside the buffer":
            mistake("1.20", "the excess is divided by buffer_len"),
        "L <= max_new_tokens - buffer_len": mistake("1.20", "the buffer starts one token late"),
        "With buffer_len 0 there is no buffer and no penalty":
            mistake("1.20", "with buffer_len 0 there is no buffer"),
        "-> [N] float penalties": _overlong_integer_zeros,
    },
    "1.21": {
        "only the solution's tokens count, and padding never does":
            mistake("1.21", "that is the mean over every entry"),
        "loss = - sum_{i,t} mask_it * logprobs_it / normaliser": mistake("1.21", "the sign is "
                                                                                 "wrong"),
        "divided by `normaliser`, the number of solution tokens in the whole batch":
            mistake("1.21", "the sum was divided by this micro-batch's own"),
        "(TRL's token mean)": mistake("1.21", "that is a mean per solution"),
        "-> the scalar loss": _sft_per_row,
        _GRADIENTS: NO_GRADIENT,
    },
}
