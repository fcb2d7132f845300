"""PS1's checks: for each exercise, the project's function it asks for (the oracle), the inputs both
are run on, cases worked by hand, and the common mistakes the checker names.

The oracles are the algorithm files' own functions, adapted only where an exercise asks for one
piece of a larger function (the per-token loss of `policy_loss`, one pair's `dpo_loss`): nothing
here is a second copy of a solution. The mistakes are wrong on purpose.
"""

import contextlib
import math
from dataclasses import replace
from types import SimpleNamespace
from unittest import mock

import torch
import torch.nn.functional as F

import appo
import async_grpo
import dapo
import distill
import grpo
import online_dpo
import ppo
import reinforce
import sft
import tools
import tppo
from common.rl import numerics
from common.models.logprobs import token_logprobs
from common.models import Generation
from common.models.sampler import inverse_cdf
from exercises.exercise import Exercise

# The files' own functions, taken once at import: PS2 (exercises/train.py) binds these names in the
# files to a student's functions, and an oracle or a mistake must never call the student's.
grpo_group_advantages = grpo.group_advantages
grpo_aggregate = grpo.aggregate
reinforce_compute_baselines = reinforce.compute_baselines
online_dpo_preference_pairs = online_dpo.preference_pairs
appo_compute_advantages = appo.compute_advantages
tppo_compute_advantages = tppo.compute_advantages
tools_play = tools.play
async_off_policy_weights = async_grpo.off_policy_weights
distill_advantages = distill.distill_advantages
distill_divergence = distill.divergence
dapo_overlong_penalty = dapo.overlong_penalty
sft_sft_loss = sft.sft_loss


# The grader's inputs for one student (python -m exercises.check --seed, exercises/grade.py): each
# random case is drawn afresh from it, so that outputs copied from another's run do not pass; 0
# gives the inputs as shipped.
STUDENT_SEED = 0


def _gen(seed):
    return torch.Generator().manual_seed(seed + 7919 * STUDENT_SEED)


def _padded_mask(lengths, R):
    """[B, R] right-padding mask of rows of the given lengths."""
    return (torch.arange(R)[None, :] < torch.tensor(lengths)[:, None]).float()


# ------------------------------------------------------------------------------------------------
# 1.1 masked mean


def _mean_cases():
    g = _gen(11)
    x = torch.randn(3, 5, generator=g)
    mask = _padded_mask([5, 2, 0], 5)
    return [("x [3, 5] with rows of 5, 2 and 0 real tokens, dim=None", dict(x=x, mask=mask)),
            ("the same along dim=1 (the third row is all padding)", dict(x=x, mask=mask, dim=1)),
            ("x [2, 4] along dim=0", dict(x=x[:2, :4], mask=mask[:2, :4], dim=0)),
            ("x [2, 3] with an all-zero mask, dim=None: a micro-batch of padding only",
             dict(x=x[:2, :3], mask=torch.zeros(2, 3)))]


MASKED_MEAN = Exercise(
    "1.1", "masked mean", "exercises.ps1.e01_masked_mean", "masked_mean",
    oracle=numerics.masked_mean, cases=_mean_cases, differentiable=("x",),
    worked=[("x = [[1, 2, 3, 4]], mask = [[1, 1, 0, 0]]",
             dict(x=torch.tensor([[1.0, 2, 3, 4]]), mask=torch.tensor([[1.0, 1, 0, 0]])),
             torch.tensor(1.5)),
            ("x = [[1, 2], [3, 4]], mask = [[1, 1], [0, 0]], dim=1: the second row is all padding",
             dict(x=torch.tensor([[1.0, 2], [3, 4]]), mask=torch.tensor([[1.0, 1], [0, 0]]), dim=1),
             torch.tensor([1.5, 0.0])),
            ("x = [[1, 2], [3, 4]], mask = [[1, 1], [1, 0]], dim=1: rows of 2 and 1 real tokens, "
             "each divided by its own count",
             dict(x=torch.tensor([[1.0, 2], [3, 4]]), mask=torch.tensor([[1.0, 1], [1, 0]]), dim=1),
             torch.tensor([1.5, 3.0]))],
    mistakes=[
        ("that is the mean over every entry: the padding was counted (multiply by the mask and "
         "divide by the mask's sum)",
         lambda x, mask, dim=None: x.mean() if dim is None else x.mean(dim)),
        ("the sum is masked but it is divided by the number of entries, padding included, not by "
         "the mask's sum", lambda x, mask, dim=None: (x * mask).sum() / x.numel() if dim is None
         else (x * mask).sum(dim) / x.shape[dim]),
        ("a row without real tokens gave NaN (0 / 0): clamp the count to at least 1",
         lambda x, mask, dim=None: (x * mask).sum() / mask.sum() if dim is None
         else (x * mask).sum(dim) / mask.sum(dim)),
        ("with dim, each row is divided by its own count of real tokens; this divided every row "
         "by the count of the whole batch",
         lambda x, mask, dim=None: (x * mask).sum() / mask.sum().clamp(min=1) if dim is None
         else (x * mask).sum(dim) / mask.sum().clamp(min=1)),
    ])


# ------------------------------------------------------------------------------------------------
# 1.2 masked whitening


def _whiten_cases():
    g = _gen(12)
    x = 3 + 2 * torch.randn(3, 6, generator=g)
    mask = _padded_mask([6, 3, 1], 6)
    x = x + 50 * (1 - mask)  # padding far from the real values, so that counting it shows
    one = torch.zeros(2, 3)
    one[1, 1] = 1.0  # a single real entry
    return [("x [3, 6] with padding of value ~50", dict(x=x, mask=mask)),
            ("the same, shift_mean=False", dict(x=x, mask=mask, shift_mean=False)),
            ("the same, eps 0.5", dict(x=x, mask=mask, eps=0.5)),
            ("x [2, 3] with a single real entry (n = 1)", dict(x=x[:2, :3], mask=one)),
            ("the same, shift_mean=False", dict(x=x[:2, :3], mask=one, shift_mean=False))]


def _whiten_biased(x, mask, shift_mean=True, eps=1e-8):
    n = mask.sum()
    mean = (x * mask).sum() / n
    var = ((x - mean) ** 2 * mask).sum() / n
    out = (x - mean) * torch.rsqrt(var + eps)
    return (out if shift_mean else out + mean) * mask


def _whiten_padding_kept(x, mask, shift_mean=True, eps=1e-8):
    mean, var = numerics.masked_mean_var(x, mask)
    out = (x - mean) * torch.rsqrt(var + eps)
    return out if shift_mean else out + mean


def _whiten_per_row(x, mask, shift_mean=True, eps=1e-8):
    n = mask.sum(-1, keepdim=True)
    mean = (x * mask).sum(-1, keepdim=True) / n.clamp(min=1)
    var = ((x - mean) ** 2 * mask).sum(-1, keepdim=True) / (n - 1).clamp(min=1)
    out = (x - mean) * torch.rsqrt(var + eps)
    return (out if shift_mean else out + mean) * mask


def _whiten_unmasked(x, mask, shift_mean=True, eps=1e-8):
    mean, var = x.mean(), x.var()
    out = (x - mean) * torch.rsqrt(var + eps)
    return (out if shift_mean else out + mean) * mask


MASKED_WHITEN = Exercise(
    "1.2", "masked whitening", "exercises.ps1.e02_masked_whiten", "masked_whiten",
    oracle=lambda x, mask, shift_mean=True, eps=1e-8: numerics.masked_whiten(x, mask, shift_mean,
                                                                             eps),
    cases=_whiten_cases,
    worked=[("x = [[1, 3, 9]], mask = [[1, 1, 0]]: mean 2, unbiased var 2",
             dict(x=torch.tensor([[1.0, 3, 9]]), mask=torch.tensor([[1.0, 1, 0]]), eps=0.0),
             torch.tensor([[-(0.5 ** 0.5), 0.5 ** 0.5, 0.0]])),
            ("x = [[1, 3], [5, 0]], mask = [[1, 1], [1, 0]]: mean 3 and var 4 over the three real "
             "entries of both rows",
             dict(x=torch.tensor([[1.0, 3], [5, 0]]), mask=torch.tensor([[1.0, 1], [1, 0]])),
             torch.tensor([[-1.0, 0], [1, 0]]))],
    mistakes=[
        ("the variance divides by n; the unbiased one divides by n - 1", _whiten_biased),
        ("the mean and variance were taken over the padding too: take them over the masked "
         "entries only", _whiten_unmasked),
        ("the padding is not 0 in the output: multiply the result by the mask",
         _whiten_padding_kept),
        ("the mean and variance were taken per row; whitening takes them over every real token "
         "of the batch at once", _whiten_per_row),
    ])


# ------------------------------------------------------------------------------------------------
# 1.3 KL estimates


def _kl_cases():
    g = _gen(13)
    logp = -torch.rand(2, 5, generator=g) * 3
    ref = -torch.rand(2, 5, generator=g) * 3
    low, low_ref = logp - 108, ref - 108  # exp(-110) is 0 in float32: the ratio from log-probs
    return [(f"{k} on log-probs [2, 5]", dict(logp=logp, ref_logp=ref, estimator=k))
            for k in ("k1", "k2", "k3")] + [
        (f"{k} on log-probs near -110, whose exp is 0 in float32",
         dict(logp=low, ref_logp=low_ref, estimator=k)) for k in ("k1", "k2", "k3")]


def _kl_ratio_detached(logp, ref_logp, estimator):
    if estimator != "k3":
        return numerics.kl_estimate(logp, ref_logp, estimator)
    log_ratio = ref_logp - logp
    return log_ratio.exp().detach() - 1 - log_ratio


def _kl_inverted(logp, ref_logp, estimator):
    return numerics.kl_estimate(ref_logp, logp, estimator)


KL = Exercise(
    "1.3", "KL estimates k1, k2, k3", "exercises.ps1.e03_kl_estimates", "kl_estimate",
    oracle=numerics.kl_estimate, cases=_kl_cases, differentiable=("logp",),
    worked=[("k3 with pi = 0.5, pi_ref = 0.25: 0.5 - 1 - log 0.5",
             dict(logp=torch.tensor([0.5]).log(), ref_logp=torch.tensor([0.25]).log(),
                  estimator="k3"), torch.tensor([0.5 - 1 + 0.6931472]))],
    mistakes=[
        ("the ratio is inverted: log pi_ref / pi where the estimate needs log pi / pi_ref (k1) or "
         "pi_ref / pi (k3)", _kl_inverted),
        ("k3 is r - 1 - log r with r = pi_ref / pi: the - 1 is missing",
         lambda logp, ref_logp, estimator: numerics.kl_estimate(logp, ref_logp, estimator) + (
             1.0 if estimator == "k3" else 0.0)),
        ("k2 is half the squared log-ratio: the 1/2 is missing",
         lambda logp, ref_logp, estimator: (logp - ref_logp) ** 2),
        ("k3's ratio pi_ref / pi was detached: the values are k3's, but its gradient in log pi is "
         "then 1, where k3's is 1 - pi_ref / pi (0 at pi = pi_ref): the loss would push log pi "
         "down everywhere", _kl_ratio_detached),
    ])


# ------------------------------------------------------------------------------------------------
# 1.4 response log-probs


class _Logits:
    """A stand-in model whose forward returns fixed logits, so that token_logprobs (the oracle)
    runs its own lines on them."""

    def __init__(self, logits):
        self.logits = logits

    def __call__(self, input_ids, attention_mask, position_ids, logits_to_keep,
                 output_hidden_states=False):
        return SimpleNamespace(logits=self.logits[:, -logits_to_keep:], hidden_states=None)


def _logprobs_oracle(logits, input_ids, response_len, temperature=1.0):
    return token_logprobs(_Logits(logits), input_ids, torch.ones_like(input_ids), response_len,
                          temperature, fast=False)[0]


def _logprobs_cases():
    g = _gen(14)
    logits = torch.randn(2, 7, 11, generator=g) * 2
    ids = torch.randint(0, 11, (2, 7), generator=g)
    return [("logits [2, 7, 11], a response of 3 tokens",
             dict(logits=logits, input_ids=ids, response_len=3)),
            ("the same at temperature 0.7",
             dict(logits=logits, input_ids=ids, response_len=3, temperature=0.7)),
            ("logits [1, 3, 3] with rows [0, 200, 0]: the tokens scored have probability e^-200, "
             "0 in float32", dict(logits=torch.tensor([[[0.0, 200, 0], [0, 200, 0], [0, 0, 0]]]),
                                  input_ids=torch.tensor([[0, 0, 2]]), response_len=2))]


def _no_shift(logits, input_ids, response_len, temperature=1.0):
    logp = F.log_softmax(logits[:, -response_len:].float() / temperature, dim=-1)
    return logp.gather(-1, input_ids[:, -response_len:, None])[..., 0]


LOGPROBS = Exercise(
    "1.4", "response log-probs and the one-token shift", "exercises.ps1.e04_response_logprobs",
    "response_logprobs", oracle=_logprobs_oracle, cases=_logprobs_cases,
    differentiable=("logits",),
    worked=[("logits [1, 3, 2] with rows [log 3, 0], [log 3, 0], [0, 5]; input_ids [[0, 1, 0]], "
             "a response of 2 tokens: log 1/4 and log 3/4",
             dict(logits=torch.tensor([[[1.0986123, 0], [1.0986123, 0], [0, 5]]]),
                  input_ids=torch.tensor([[0, 1, 0]]), response_len=2),
             torch.tensor([[-1.3862944, -0.2876821]])),
            ("the same at temperature 0.5: the logits doubled, log 1/10 and log 9/10",
             dict(logits=torch.tensor([[[1.0986123, 0], [1.0986123, 0], [0, 5]]]),
                  input_ids=torch.tensor([[0, 1, 0]]), response_len=2, temperature=0.5),
             torch.tensor([[-2.3025851, -0.1053605]]))],
    mistakes=[
        ("the logits at position t were used to score token t; they predict token t + 1 (slice "
         "them one position earlier)", _no_shift),
        ("the softmax was taken over the wrong axis: normalise over the vocabulary (dim=-1)",
         lambda logits, input_ids, response_len, temperature=1.0: F.log_softmax(
             logits[:, -response_len - 1:-1] / temperature, dim=1).gather(
                 -1, input_ids[:, -response_len:, None])[..., 0]),
        ("the temperature is missing: divide the logits by it before the softmax",
         lambda logits, input_ids, response_len, temperature=1.0: _logprobs_oracle(
             logits, input_ids, response_len)),
        ("the log-probs were divided by the temperature; it divides the logits, before the "
         "softmax", lambda logits, input_ids, response_len, temperature=1.0: _logprobs_oracle(
             logits, input_ids, response_len) / temperature),
    ])


# ------------------------------------------------------------------------------------------------
# 1.5 group advantages


def _group_cases():
    g = _gen(15)
    return [("3 groups of 4 rewards in {0, 1}, scale=True",
             dict(rewards=torch.tensor([1.0, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0, 1]), group_size=4)),
            ("2 groups of 3 real-valued rewards, scale=True",
             dict(rewards=torch.randn(6, generator=g), group_size=3)),
            ("the same, scale=False (Dr.GRPO)",
             dict(rewards=torch.randn(6, generator=g), group_size=3, scale=False))]


def _whole_batch(rewards, group_size, scale=True):
    a = rewards - rewards.mean()
    return a / (rewards.std() + 1e-4) if scale else a


def _group_no_eps(rewards, group_size, scale=True):
    r = rewards.view(-1, group_size)
    a = r - r.mean(1, keepdim=True)
    return (a / r.std(1, keepdim=True) if scale else a).reshape(-1)


def _group_means(kwargs, got):
    means = got.view(-1, kwargs["group_size"]).mean(1)
    k = int(means.abs().argmax())
    return (f"group {k}'s advantages average {means[k].item():.3g}, not 0: did you normalise over "
            "the whole batch instead of each group?")


GROUP = Exercise(
    "1.5", "GRPO's group advantages and Dr.GRPO's", "exercises.ps1.e05_group_advantages",
    "group_advantages", oracle=grpo_group_advantages, cases=_group_cases,
    worked=[("one group [1, 0, 0, 1]: mean 0.5, unbiased std 0.577",
             dict(rewards=torch.tensor([1.0, 0, 0, 1]), group_size=4),
             torch.tensor([1.0, -1, -1, 1]) * 0.5 / (3 ** -0.5 * 1 + 1e-4)),
            ("two groups [1, 0 | 1, 1]: std 0.707 in the first; the second is all equal, so 0",
             dict(rewards=torch.tensor([1.0, 0, 1, 1]), group_size=2),
             torch.tensor([0.5, -0.5, 0, 0]) / (2 ** -0.5 + 1e-4)),
            ("the same two groups, scale=False (Dr.GRPO): r - mean, not divided by the std",
             dict(rewards=torch.tensor([1.0, 0, 1, 1]), group_size=2, scale=False),
             torch.tensor([0.5, -0.5, 0, 0]))],
    mistakes=[
        (_group_means, _whole_batch),
        ("the std is the biased one (divided by G); GRPO, torch and TRL take the unbiased one "
         "(G - 1)", lambda rewards, group_size, scale=True: (
             (lambda r: ((r - r.mean(1, keepdim=True)) / (r.std(1, unbiased=False, keepdim=True)
                                                          + 1e-4) if scale
                         else r - r.mean(1, keepdim=True)).reshape(-1))(
                 rewards.view(-1, group_size)))),
        ("the advantages are not divided by the group's std (that is Dr.GRPO, scale=False)",
         lambda rewards, group_size, scale=True: grpo_group_advantages(rewards, group_size, False)),
        ("the groups are strided (row i in group i % N); they are consecutive rows: view(-1, G)",
         lambda rewards, group_size, scale=True: grpo_group_advantages(
             rewards.view(group_size, -1).t().reshape(-1), group_size, scale).view(
                 -1, group_size).t().reshape(-1)),
        ("the sign is flipped: the advantage is the reward minus the group's mean, not the mean "
         "minus the reward", lambda rewards, group_size, scale=True: -grpo_group_advantages(
             rewards, group_size, scale)),
        ("the std has no + 1e-4: the advantages are (r - mean) / (std + 1e-4), so that a group "
         "of equal rewards gets 0, not 0 / 0", _group_no_eps),
        ("scale=False was ignored: Dr.GRPO's advantages are r - mean, not divided by the std",
         lambda rewards, group_size, scale=True: grpo_group_advantages(rewards, group_size)),
    ])


# ------------------------------------------------------------------------------------------------
# 1.6 aggregate


def _aggregate_cases():
    g = _gen(16)
    per_token = torch.randn(3, 5, generator=g)
    mask = _padded_mask([5, 1, 3], 5)
    empty = _padded_mask([4, 0, 2], 5)  # the second row: no counted token
    return [(f"loss_type {t!r}, rows of 5, 1 and 3 tokens, normaliser {n}",
             dict(per_token=per_token, mask=mask, loss_type=t, normaliser=n))
            for t, n in (("grpo", 3.0), ("bnpo", 9.0), ("dapo", 9.0), ("dr_grpo", 15.0))] + [
        (f"loss_type {t!r}, rows of 4, 0 and 2 tokens (the second row adds 0), normaliser {n}",
         dict(per_token=per_token, mask=empty, loss_type=t, normaliser=n))
        for t, n in (("grpo", 2.0), ("bnpo", 6.0))]


def _aggregate_columns(per_token, mask, loss_type, normaliser):
    if loss_type != "grpo":
        return grpo_aggregate(per_token, mask, loss_type, normaliser)
    return ((per_token * mask).sum(0) / mask.sum(0).clamp(min=1)).sum() / normaliser


def _aggregate_mean_of_means(per_token, mask, loss_type, normaliser):
    if loss_type != "grpo":
        return grpo_aggregate(per_token, mask, loss_type, normaliser)
    return ((per_token * mask).sum(1) / mask.sum(1).clamp(min=1)).mean()


AGGREGATE = Exercise(
    "1.6", "per-sequence and per-token loss normalisation", "exercises.ps1.e06_aggregate",
    "aggregate", oracle=grpo_aggregate, cases=_aggregate_cases, differentiable=("per_token",),
    worked=[("grpo: rows [1, 3] (2 tokens) and [6, pad], normaliser 2: (2 + 6) / 2",
             dict(per_token=torch.tensor([[1.0, 3], [6, 100]]),
                  mask=torch.tensor([[1.0, 1], [1, 0]]), loss_type="grpo", normaliser=2.0),
             torch.tensor(4.0)),
            ("bnpo: the same rows, normaliser 3: (1 + 3 + 6) / 3",
             dict(per_token=torch.tensor([[1.0, 3], [6, 100]]),
                  mask=torch.tensor([[1.0, 1], [1, 0]]), loss_type="bnpo", normaliser=3.0),
             torch.tensor(10 / 3)),
            ("dapo: the same rows, normaliser 3: a token sum, as bnpo's",
             dict(per_token=torch.tensor([[1.0, 3], [6, 100]]),
                  mask=torch.tensor([[1.0, 1], [1, 0]]), loss_type="dapo", normaliser=3.0),
             torch.tensor(10 / 3)),
            ("grpo: rows [1, 3], [pad, pad] and [6, pad], normaliser 2 (the rows with a token): "
             "the empty row adds 0, (2 + 0 + 6) / 2",
             dict(per_token=torch.tensor([[1.0, 3], [5, 5], [6, 100]]),
                  mask=torch.tensor([[1.0, 1], [0, 0], [1, 0]]), loss_type="grpo",
                  normaliser=2.0), torch.tensor(4.0))],
    mistakes=[
        ("every loss type summed tokens; \"grpo\" first takes each sequence's mean over its own "
         "tokens", lambda per_token, mask, loss_type, normaliser:
         (per_token * mask).sum() / normaliser),
        ("every loss type took sequence means; only \"grpo\" does, the others sum tokens",
         lambda per_token, mask, loss_type, normaliser: grpo_aggregate(per_token, mask, "grpo",
                                                                       normaliser)),
        ("the mask was left out: padding tokens added their losses",
         lambda per_token, mask, loss_type, normaliser: grpo_aggregate(
             per_token, torch.ones_like(mask), loss_type, normaliser)),
        ("\"dapo\" sums tokens, as \"bnpo\" and \"dr_grpo\" do; this took sequence means, as "
         "\"grpo\" does", lambda per_token, mask, loss_type, normaliser: grpo_aggregate(
             per_token, mask, "grpo" if loss_type == "dapo" else loss_type, normaliser)),
        ("each sequence's mean is over its own tokens, along dim 1; this took means along dim 0, "
         "one per position", _aggregate_columns),
        ("the sequences' means were averaged; \"grpo\" sums them and divides by the normaliser "
         "given, which counts only the rows with a token", _aggregate_mean_of_means),
    ])


# ------------------------------------------------------------------------------------------------
# 1.7 RLOO baseline


RLOO = Exercise(
    "1.7", "RLOO's leave-one-out baseline", "exercises.ps1.e07_rloo_baseline", "rloo_baselines",
    oracle=lambda episode_returns, group_size: reinforce_compute_baselines(
        episode_returns, group_size, "rloo"),
    cases=lambda: [("2 groups of 4 returns", dict(episode_returns=torch.tensor(
        [1.0, 0, 0, 1, 0.5, 2, -1, 0]), group_size=4)),
        ("3 groups of 2", dict(episode_returns=torch.tensor([1.0, 0, 3, 3, -2, 5]),
                               group_size=2)),
        ("3 groups of 3 random returns", dict(episode_returns=torch.randn(9, generator=_gen(7)),
                                              group_size=3))],
    worked=[("one group [1, 0, 0, 1]: b_0 = (0 + 0 + 1) / 3",
             dict(episode_returns=torch.tensor([1.0, 0, 0, 1]), group_size=4),
             torch.tensor([1.0, 2, 2, 1]) / 3),
            ("two groups [1, 0 | 3, 3]: each sample's baseline is the other one of its group",
             dict(episode_returns=torch.tensor([1.0, 0, 3, 3]), group_size=2),
             torch.tensor([0.0, 1, 3, 3]))],
    mistakes=[
        ("that is the group mean, sample i included: leave it out, (sum - r_i) / (k - 1)",
         lambda episode_returns, group_size: episode_returns.view(-1, group_size).mean(
             1, keepdim=True).expand(-1, group_size).reshape(-1)),
        ("sample i is left out but the sum is divided by k, not by the k - 1 others",
         lambda episode_returns, group_size: ((lambda r: (r.sum(1, keepdim=True) - r) / group_size)(
             episode_returns.view(-1, group_size))).reshape(-1)),
        ("the group's sum was taken over dim 0, across groups; each sample's group is its row of "
         "view(-1, k), summed over dim 1", lambda episode_returns, group_size: (
             (lambda r: (r.sum(0, keepdim=True) - r) / (group_size - 1))(
                 episode_returns.view(-1, group_size))).reshape(-1)),
        ("the brackets are missing: (sum - r_i) / (k - 1), not (sum - r_i) / k - 1",
         lambda episode_returns, group_size: ((lambda r: (r.sum(1, keepdim=True) - r) / group_size
                                               - 1)(episode_returns.view(-1, group_size))
                                              ).reshape(-1)),
        ("the groups are strided (sample i in group i % N); they are consecutive samples: "
         "view(-1, k)", lambda episode_returns, group_size: reinforce_compute_baselines(
             episode_returns.view(group_size, -1).t().reshape(-1), group_size, "rloo").view(
                 -1, group_size).t().reshape(-1)),
    ])


# ------------------------------------------------------------------------------------------------
# 1.8 token GAE


def _gae_cases():
    g = _gen(18)
    mask = _padded_mask([4, 2, 5], 5)
    rewards = torch.zeros(3, 5)
    rewards[0, 3], rewards[1, 1], rewards[2, 4] = 1.0, -1.0, 0.5
    values = torch.randn(3, 5, generator=g)
    return [("rows of 4, 2 and 5 tokens, gamma 1, lam 0.95",
             dict(rewards=rewards, values=values, mask=mask, gamma=1.0, lam=0.95)),
            ("the same, gamma 0.9, lam 0.8",
             dict(rewards=rewards, values=values, mask=mask, gamma=0.9, lam=0.8))]


def _gae_no_bootstrap(rewards, values, mask, gamma, lam):
    advantages, _ = numerics.token_gae(rewards, values, mask, gamma, lam)
    adv = torch.zeros_like(rewards)
    last = torch.zeros(rewards.shape[0])
    for t in reversed(range(rewards.shape[1])):
        adv[:, t] = last = (rewards[:, t] - values[:, t] + gamma * lam * last) * mask[:, t]
    return adv, (adv + values) * mask


def _gae_through_padding(rewards, values, mask, gamma, lam):
    """Every row taken as R tokens long, then masked: the padding is bootstrapped from."""
    adv, last, next_value = torch.zeros_like(rewards), torch.zeros(len(rewards)), 0.0
    for t in reversed(range(rewards.shape[1])):
        last = rewards[:, t] + gamma * next_value - values[:, t] + gamma * lam * last
        adv[:, t], next_value = last, values[:, t]
    return adv * mask, (adv + values) * mask


def _gae_loop(rewards, values, mask, gamma, lam, done_of, backwards=True, bootstrap_gamma=True):
    """GAE by a loop over t, with done_t = done_of(mask, t), and gamma in the bootstrap
    gamma V_{t+1} unless bootstrap_gamma is False."""
    B, R = rewards.shape
    adv, last = torch.zeros_like(rewards), torch.zeros(B)
    for t in (reversed(range(R)) if backwards else range(R)):
        next_value = values[:, t + 1] if t + 1 < R else torch.zeros(B)
        done = done_of(mask, t)
        last = (rewards[:, t] + (gamma if bootstrap_gamma else 1) * next_value * (1 - done)
                - values[:, t] + gamma * lam * (1 - done) * last)
        adv[:, t] = last * mask[:, t]
    return adv, (adv + values) * mask


def _last_real(mask, t):
    return mask[:, t] * (1 - mask[:, t + 1]) if t + 1 < mask.shape[1] else mask[:, t]


GAE = Exercise(
    "1.8", "GAE and returns over tokens", "exercises.ps1.e08_token_gae", "token_gae",
    oracle=numerics.token_gae, cases=_gae_cases,
    worked=[("one row of 2 tokens, r = [0, 1], V = [0.5, 0.25], gamma = lam = 1",
             dict(rewards=torch.tensor([[0.0, 1]]), values=torch.tensor([[0.5, 0.25]]),
                  mask=torch.ones(1, 2), gamma=1.0, lam=1.0),
             (torch.tensor([[0.5, 0.75]]), torch.tensor([[1.0, 1.0]]))),
            ("the same row, gamma = 0.5, lam = 1: delta_0 = 0.5 x 0.25 - 0.5, A_0 = delta_0 "
             "+ 0.5 x 0.75 = 0",
             dict(rewards=torch.tensor([[0.0, 1]]), values=torch.tensor([[0.5, 0.25]]),
                  mask=torch.ones(1, 2), gamma=0.5, lam=1.0),
             (torch.tensor([[0.0, 0.75]]), torch.tensor([[0.5, 1.0]]))),
            ("r = [0, 1, pad], V = [0.5, 0.25, 9 on the padding], gamma = 1, lam = 0.5: the "
             "row ends at its second token, so the 9 never comes back: A_0 = -0.25 + 0.5 x 0.75",
             dict(rewards=torch.tensor([[0.0, 1, 0]]), values=torch.tensor([[0.5, 0.25, 9]]),
                  mask=torch.tensor([[1.0, 1, 0]]), gamma=1.0, lam=0.5),
             (torch.tensor([[0.125, 0.75, 0]]), torch.tensor([[0.625, 1.0, 0]])))],
    mistakes=[
        ("V_{t+1} is missing from delta: delta_t = r_t + gamma V_{t+1} (1 - done_t) - V_t",
         _gae_no_bootstrap),
        ("the returns are A, not A + V", lambda rewards, values, mask, gamma, lam: (
            numerics.token_gae(rewards, values, mask, gamma, lam)[0],) * 2),
        ("gamma and lam are swapped", lambda rewards, values, mask, gamma, lam:
         numerics.token_gae(rewards, values, mask, lam, gamma)),
        ("the row did not end at its last real token: the padding's values came back through "
         "gamma V_{t+1} and A_{t+1} (done_t = 1 at the last real token, where nothing is "
         "bootstrapped)", _gae_through_padding),
        ("gamma is missing from the bootstrap: delta_t = r_t + gamma V_{t+1} (1 - done_t) - V_t",
         lambda rewards, values, mask, gamma, lam: _gae_loop(rewards, values, mask, gamma, lam,
                                                             _last_real, bootstrap_gamma=False)),
        ("done_t was read off the token's own mask (1 at padding); it is 1 at a row's last real "
         "token, whose successor is padding, so the row's last token bootstrapped from it",
         lambda rewards, values, mask, gamma, lam: _gae_loop(rewards, values, mask, gamma, lam,
                                                             lambda m, t: 1 - m[:, t])),
        ("the loop ran forwards, so A_{t+1} was the advantage before t; A_t needs A_{t+1}: loop "
         "over t backwards", lambda rewards, values, mask, gamma, lam: _gae_loop(
             rewards, values, mask, gamma, lam, _last_real, backwards=False)),
    ])


# ------------------------------------------------------------------------------------------------
# 1.9 clipped surrogate, 1.10 clipped value loss: the per-token terms of ppo.py's losses


def _each_token(loss_of_mask, shape):
    """The per-token terms of a loss that sums mask * term / 1: one token of the mask at a time."""
    out = torch.zeros(shape)
    for i in range(shape[0]):
        for j in range(shape[1]):
            mask = torch.zeros(shape)
            mask[i, j] = 1.0
            out[i, j] = loss_of_mask(mask)
    return out


def _surrogate_oracle(logprobs, old_logprobs, advantages, epsilon):
    args = SimpleNamespace(epsilon=epsilon, loss_type="bnpo", kl_estimator="k3",
                           beta=0.0)
    return _each_token(lambda m: ppo.policy_loss(logprobs, old_logprobs, advantages, m, 1.0,
                                                 args)[0], logprobs.shape)


def _surrogate_cases():
    g = _gen(19)
    old = -torch.rand(3, 4, generator=g) * 2
    logprobs = old + torch.tensor([[-0.5, -0.1, 0.1, 0.5]]).expand(3, 4)  # ratios in and out
    advantages = torch.tensor([[1.0], [-1.0], [0.5]]).expand(3, 4).clone()
    return [("ratios 0.61, 0.90, 1.11, 1.65 with advantages +1, -1, +0.5, epsilon 0.2",
             dict(logprobs=logprobs, old_logprobs=old, advantages=advantages, epsilon=0.2)),
            ("the same ratios of log-probs near -110, whose exp is 0 in float32",
             dict(logprobs=logprobs - 108, old_logprobs=old - 108, advantages=advantages,
                  epsilon=0.2))]


SURROGATE = Exercise(
    "1.9", "PPO's clipped surrogate", "exercises.ps1.e09_clipped_surrogate", "clipped_surrogate",
    oracle=_surrogate_oracle, cases=_surrogate_cases, differentiable=("logprobs",),
    worked=[("ratios 1.5 and 0.5, A = 1, epsilon 0.2: max(-1.5, -1.2) and max(-0.5, -0.8)",
             dict(logprobs=torch.tensor([[1.5, 0.5]]).log(), old_logprobs=torch.zeros(1, 2),
                  advantages=torch.ones(1, 2), epsilon=0.2), torch.tensor([[-1.2, -0.5]]))],
    mistakes=[
        ("the ratio is inverted: pi_old / pi, where the surrogate needs pi / pi_old",
         lambda logprobs, old_logprobs, advantages, epsilon: _surrogate_oracle(
             old_logprobs, logprobs, advantages, epsilon)),
        ("min where it is max: of -A * ratio and -A * clip(ratio) the loss takes the larger (the "
         "pessimistic objective)", lambda logprobs, old_logprobs, advantages, epsilon: torch.min(
             -advantages * (logprobs - old_logprobs).exp(),
             -advantages * (logprobs - old_logprobs).exp().clamp(1 - epsilon, 1 + epsilon))),
        ("the ratio was clipped alone, -A * clip(ratio), without the unclipped term",
         lambda logprobs, old_logprobs, advantages, epsilon:
         -advantages * (logprobs - old_logprobs).exp().clamp(1 - epsilon, 1 + epsilon)),
        ("the sign is wrong: the loss is -A * ratio, so that minimising it raises A * ratio",
         lambda logprobs, old_logprobs, advantages, epsilon: -_surrogate_oracle(
             logprobs, old_logprobs, advantages, epsilon)),
        ("the log-ratio was clipped to [-epsilon, epsilon]; the ratio is clipped to "
         "[1 - epsilon, 1 + epsilon]", lambda logprobs, old_logprobs, advantages, epsilon:
         torch.max(-advantages * (logprobs - old_logprobs).exp(),
                   -advantages * (logprobs - old_logprobs).clamp(-epsilon, epsilon).exp())),
    ])


def _value_oracle(values, old_values, returns, clip):
    args = SimpleNamespace(cliprange_value=clip, loss_type="bnpo")
    return _each_token(lambda m: ppo.value_loss(values, old_values, returns, m, 1.0, args)[0],
                       values.shape)


def _value_cases():
    old = torch.tensor([[0.0, 0.0, 1.0], [0.5, -0.5, 0.0]])
    values = old + torch.tensor([[0.5, -0.05, -0.4], [0.5, 0.3, -0.3]])
    returns = torch.tensor([[1.0, -1.0, 0.0], [0.0, 1.0, -2.0]])
    g = _gen(110)
    random_old = torch.randn(3, 4, generator=g)
    return [("values moved 0.05 to 0.5 from old values, towards their returns and away, clip 0.2",
             dict(values=values, old_values=old, returns=returns, clip=0.2)),
            ("random values [3, 4] moved about 0.3 from their old values, clip 0.2",
             dict(values=random_old + 0.3 * torch.randn(3, 4, generator=g), old_values=random_old,
                  returns=torch.randn(3, 4, generator=g), clip=0.2))]


VALUE = Exercise(
    "1.10", "PPO's clipped value loss", "exercises.ps1.e10_value_loss", "clipped_value_loss",
    oracle=_value_oracle, cases=_value_cases, differentiable=("values",),
    worked=[("V = 0.5 from 0, return 1, clip 0.2: 0.5 max(0.25, 0.64)",
             dict(values=torch.tensor([[0.5]]), old_values=torch.zeros(1, 1),
                  returns=torch.ones(1, 1), clip=0.2), torch.tensor([[0.32]]))],
    mistakes=[
        ("no clipping: 0.5 (V - R)^2 alone",
         lambda values, old_values, returns, clip: 0.5 * (values - returns) ** 2),
        ("min where it is max: the clipped value loss takes the larger of the two",
         lambda values, old_values, returns, clip: 0.5 * torch.min(
             (values - returns) ** 2,
             (old_values + (values - old_values).clamp(-clip, clip) - returns) ** 2)),
        ("the 1/2 is missing", lambda values, old_values, returns, clip:
         2 * _value_oracle(values, old_values, returns, clip)),
    ])


# ------------------------------------------------------------------------------------------------
# 1.11 DPO and IPO, 1.12 pairs


def _preference_oracle(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps,
                       beta, loss_type):
    P = len(chosen_logps)
    logprobs = torch.stack([chosen_logps, rejected_logps], 1).reshape(2 * P, 1)
    ref = torch.stack([ref_chosen_logps, ref_rejected_logps], 1).reshape(2 * P, 1)
    args = SimpleNamespace(beta=beta, preference_loss=loss_type)
    return torch.stack([online_dpo.dpo_loss(logprobs, ref, torch.ones(2 * P, 1),
                                            F.one_hot(torch.tensor(k), P).float(), 1.0, args)[0]
                        for k in range(P)])


def _preference_cases():
    g = _gen(21)
    logps = [-torch.rand(4, generator=g) * 10 for _ in range(4)]
    names = ("chosen_logps", "rejected_logps", "ref_chosen_logps", "ref_rejected_logps")
    far = [torch.tensor([-300.0, -100]), torch.tensor([-100.0, -300]), torch.tensor([-200.0, -200]),
           torch.tensor([-200.0, -200])]
    return [(f"4 pairs, {t}, beta {b}", dict(zip(names, logps), beta=b, loss_type=t))
            for t, b in (("sigmoid", 0.1), ("ipo", 0.5))] + [
        ("2 pairs with beta h = -200 and 200, DPO: exp(200) overflows float32, the loss is 200 "
         "and 0", dict(zip(names, far), beta=1.0, loss_type="sigmoid"))]


def _swap(fn):
    return lambda chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta, \
        loss_type: fn(rejected_logps, chosen_logps, ref_rejected_logps, ref_chosen_logps, beta,
                      loss_type)


PREFERENCE = Exercise(
    "1.11", "the DPO and IPO losses", "exercises.ps1.e11_preference_loss", "preference_loss",
    oracle=_preference_oracle, cases=_preference_cases,
    differentiable=("chosen_logps", "rejected_logps"),
    worked=[("h = 0 (policy = reference), DPO: -log sigmoid(0) = log 2",
             dict(chosen_logps=torch.tensor([-3.0]), rejected_logps=torch.tensor([-5.0]),
                  ref_chosen_logps=torch.tensor([-3.0]), ref_rejected_logps=torch.tensor([-5.0]),
                  beta=0.1, loss_type="sigmoid"), torch.tensor([0.6931472])),
            ("chosen -3, rejected -5, both -4 under the reference, beta 1, DPO: h = 1 - (-1) = 2, "
             "-log sigmoid(2) = log(1 + e^-2)",
             dict(chosen_logps=torch.tensor([-3.0]), rejected_logps=torch.tensor([-5.0]),
                  ref_chosen_logps=torch.tensor([-4.0]), ref_rejected_logps=torch.tensor([-4.0]),
                  beta=1.0, loss_type="sigmoid"), torch.tensor([0.1269280])),
            ("the same pair, IPO, beta 0.5: (h - 1 / (2 x 0.5))^2 = (2 - 1)^2",
             dict(chosen_logps=torch.tensor([-3.0]), rejected_logps=torch.tensor([-5.0]),
                  ref_chosen_logps=torch.tensor([-4.0]), ref_rejected_logps=torch.tensor([-4.0]),
                  beta=0.5, loss_type="ipo"), torch.tensor([1.0]))],
    mistakes=[
        ("the reference log-probs were not subtracted: h compares log pi / pi_ref of the chosen "
         "and the rejected response",
         lambda chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta,
         loss_type: _preference_oracle(chosen_logps, rejected_logps, 0 * chosen_logps,
                                       0 * rejected_logps, beta, loss_type)),
        ("chosen and rejected are swapped: h is the chosen response's log-ratio minus the "
         "rejected one's", _swap(_preference_oracle)),
        ("IPO's target for h is 1 / (2 beta), not 1 / beta",
         lambda chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta,
         loss_type: ((chosen_logps - ref_chosen_logps - rejected_logps + ref_rejected_logps)
                     - 1 / beta) ** 2),
        ("IPO's h is not multiplied by beta: the loss is (h - 1 / (2 beta))^2",
         lambda chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta,
         loss_type: _preference_oracle(chosen_logps, rejected_logps, ref_chosen_logps,
                                       ref_rejected_logps, beta, loss_type)
         if loss_type != "ipo" else (beta * (chosen_logps - ref_chosen_logps - rejected_logps
                                             + ref_rejected_logps) - 1 / (2 * beta)) ** 2),
    ])


def _pairs_last_of_equals(scores, group_size):
    s = scores.view(-1, group_size).flip(1)  # the last of equals comes first
    best, worst = group_size - 1 - s.argmax(1), group_size - 1 - s.argmin(1)
    keep = s.max(1).values > s.min(1).values
    first = torch.arange(len(s)) * group_size
    return (first + best)[keep], (first + worst)[keep]


PAIRS = Exercise(
    "1.12", "online DPO's preference pairs", "exercises.ps1.e12_preference_pairs",
    "preference_pairs",
    oracle=lambda scores, group_size: online_dpo_preference_pairs(scores, group_size, "skip"),
    cases=lambda: [("3 prompts of 4 responses, the second all tied",
                    dict(scores=torch.tensor([0.0, 1, 0, 1, 1, 1, 1, 1, 0.5, 0, 1, 0.5]),
                         group_size=4)),
                   ("2 prompts of 2", dict(scores=torch.tensor([1.0, 0, 0, 1]), group_size=2)),
                   ("4 prompts of 4 random scores in {0, 0.5, 1}, with ties", dict(
                       scores=torch.randint(0, 3, (16,), generator=_gen(112)) / 2,
                       group_size=4)),
                   ("2 prompts of 2, both tied: no pair at all",
                    dict(scores=torch.tensor([1.0, 1, 0, 0]), group_size=2))],
    worked=[("[0, 1, 0, 1 | 1, 1, 1, 1]: rows 1 over 0; the tied prompt gives none",
             dict(scores=torch.tensor([0.0, 1, 0, 1, 1, 1, 1, 1]), group_size=4),
             (torch.tensor([1]), torch.tensor([0]))),
            ("[1, 1 | 0, 1]: the first prompt ties; the second gives rows 3 over 2",
             dict(scores=torch.tensor([1.0, 1, 0, 1]), group_size=2),
             (torch.tensor([3]), torch.tensor([2])))],
    mistakes=[
        ("a prompt whose responses all tie gave a pair; it gives none (ties='skip')",
         lambda scores, group_size: online_dpo_preference_pairs(scores, group_size, "first")),
        ("the rows are positions inside each group; they are rows of scores (add group * G)",
         lambda scores, group_size: tuple(
             r % group_size for r in online_dpo_preference_pairs(scores, group_size, "skip"))),
        ("the last of equal scores was taken; argmax and argmin take the first",
         _pairs_last_of_equals),
    ])


# ------------------------------------------------------------------------------------------------
# 1.13 step-level GAE (appo.py), 1.14 the BAD backup (tppo.py)


def _step_cases():
    g = _gen(23)
    rewards = torch.tensor([[0.0, 1, 0, 0.5], [0, 0, -1, 0]])
    dones = torch.tensor([[0.0, 1, 0, 0], [0, 0, 1, 0]])
    values = torch.randn(2, 4, generator=g)
    return [("2 envs of 4 steps, an episode ending inside each segment",
             dict(rewards=rewards, values=values, next_values=torch.tensor([0.3, -0.2]),
                  dones=dones, gamma=0.9, lam=0.8)),
            ("the same, the first env's episode ending at the segment's last step too",
             dict(rewards=rewards, values=values, next_values=torch.tensor([0.3, -0.2]),
                  dones=dones + torch.tensor([[0.0, 0, 0, 1], [0, 0, 0, 0]]), gamma=0.9,
                  lam=0.8))]


def _step_oracle(rewards, values, next_values, dones, gamma, lam):
    return appo_compute_advantages(rewards, values, None, next_values, dones, gamma, lam)


def _step_loop(rewards, values, next_values, dones, gamma, lam, done_of=None, carry=False,
               last_bootstraps=False):
    """Step GAE by a loop over t, with done_t = done_of(dones, t) (dones[:, t] unless given);
    carry: the advantage carried across an episode's end; last_bootstraps: the segment's last
    step bootstrapped from next_values whatever its done."""
    E, T = rewards.shape
    adv, last = torch.zeros_like(rewards), torch.zeros(E)
    for t in reversed(range(T)):
        done = done_of(dones, t) if done_of else dones[:, t]
        next_value = next_values if t == T - 1 else values[:, t + 1]
        cut = 0.0 if last_bootstraps and t == T - 1 else done
        last = (rewards[:, t] + gamma * next_value * (1 - cut) - values[:, t]
                + gamma * lam * (1 if carry else 1 - done) * last)
        adv[:, t] = last
    return adv, adv + values


STEP = Exercise(
    "1.13", "step-level advantages across episodes", "exercises.ps1.e13_step_gae",
    "step_advantages", oracle=_step_oracle, cases=_step_cases,
    worked=[("one env, 2 steps, the first ends an episode: r = [1, 0], V = [0, 0.5], "
             "V_next = 2, gamma = lam = 1",
             dict(rewards=torch.tensor([[1.0, 0]]), values=torch.tensor([[0.0, 0.5]]),
                  next_values=torch.tensor([2.0]), dones=torch.tensor([[1.0, 0]]), gamma=1.0,
                  lam=1.0), (torch.tensor([[1.0, 1.5]]), torch.tensor([[1.0, 2.0]]))),
            ("one env, one step that ends the episode: r = [1], V = [0.5], V_next = 2, gamma = "
             "lam = 1: nothing comes back from V_next",
             dict(rewards=torch.tensor([[1.0]]), values=torch.tensor([[0.5]]),
                  next_values=torch.tensor([2.0]), dones=torch.tensor([[1.0]]), gamma=1.0,
                  lam=1.0), (torch.tensor([[0.5]]), torch.tensor([[1.0]])))],
    mistakes=[
        ("an episode's end was ignored: the step where done = 1 bootstrapped from the next "
         "observation (a new problem)",
         lambda rewards, values, next_values, dones, gamma, lam: _step_oracle(
             rewards, values, next_values, torch.zeros_like(dones), gamma, lam)),
        ("the segment's last step was not bootstrapped with next_values",
         lambda rewards, values, next_values, dones, gamma, lam: _step_oracle(
             rewards, values, torch.zeros_like(next_values), dones, gamma, lam)),
        ("the returns are A, not A + V", lambda rewards, values, next_values, dones, gamma, lam: (
            _step_oracle(rewards, values, next_values, dones, gamma, lam)[0],) * 2),
        ("the step after an episode's end was cut off (done_{t+1}), not the step that ends it: "
         "done_t = 1 at the step where the episode ended", lambda rewards, values, next_values,
         dones, gamma, lam: _step_loop(rewards, values, next_values, dones, gamma, lam,
                                       done_of=lambda d, t: d[:, t + 1] if t + 1 < d.shape[1]
                                       else torch.zeros(len(d)))),
        ("the advantage was carried across an episode's end: A_t = delta_t + gamma lam "
         "(1 - done_t) A_{t+1}", lambda rewards, values, next_values, dones, gamma, lam:
         _step_loop(rewards, values, next_values, dones, gamma, lam, carry=True)),
        ("the segment's last step bootstrapped from next_values though its episode ended there: "
         "(1 - done_t) holds for next_values too", lambda rewards, values, next_values, dones,
         gamma, lam: _step_loop(rewards, values, next_values, dones, gamma, lam,
                                last_bootstraps=True)),
    ])


def _bad_cases():
    g = _gen(24)
    mask = torch.tensor([[[1.0, 1, 1], [1, 1, 0]], [[1, 0, 0], [1, 1, 1]]])  # [E=2, T=2, R=3]
    values = torch.randn(2, 2, 3, generator=g)
    inputs = dict(rewards=torch.tensor([[1.0, 0.5], [0, -1]]), response_mask=mask,
                  next_values=torch.tensor([0.4, -0.3]), dones=torch.tensor([[1.0, 0], [0, 0]]),
                  gamma=0.9, lam=0.8)
    return [("2 envs, 2 steps of 3, 2, 1 and 3 tokens, the first env's episode ends at step 0",
             dict(inputs, values=values * mask)),
            ("the same with values on the padding too, which no return may keep",
             dict(inputs, values=values))]


def _bad_gamma_every_token(rewards, values, response_mask, next_values, dones, gamma, lam):
    """A token-level GAE that treats every token as a step: gamma and lam at every token."""
    E, T, R = values.shape
    flat_mask = response_mask.reshape(E, T * R)
    flat_r = torch.zeros(E, T * R)
    flat_d = torch.zeros(E, T * R)
    last = response_mask.sum(-1).long() - 1
    for t in range(T):
        flat_r[torch.arange(E), t * R + last[:, t]] = rewards[:, t]
        flat_d[torch.arange(E), t * R + last[:, t]] = dones[:, t]
    keep = flat_mask > 0
    out_a, out_r = torch.zeros(E, T * R), torch.zeros(E, T * R)
    for e in range(E):
        idx = keep[e].nonzero()[:, 0]
        a, r = numerics.step_gae(flat_r[e, idx][None], values.reshape(E, -1)[e, idx][None],
                                 next_values[e:e + 1], flat_d[e, idx][None], gamma, lam)
        out_a[e, idx], out_r[e, idx] = a[0], r[0]
    return out_a.view(E, T, R), out_r.view(E, T, R)


def _bad_loop(rewards, values, response_mask, next_values, dones, gamma, lam, variant):
    """The BAD backup by loops over steps and tokens, with one rule changed (variant)."""
    E, T, R = values.shape
    adv = torch.zeros(E, T, R)
    for e in range(E):
        after, next_value = torch.tensor(0.0), next_values[e]
        for t in reversed(range(T)):
            real = response_mask[e, t].nonzero()[:, 0].tolist()
            last = R - 1 if variant == "slot" else real[-1]
            for j in reversed(range(R)):
                if response_mask[e, t, j] == 0:
                    after = torch.tensor(0.0) if variant == "reset" else after
                elif j == last:
                    delta = rewards[e, t] + gamma * next_value * (1 - dones[e, t]) - values[e, t, j]
                    after = adv[e, t, j] = delta + gamma * lam * (1 - dones[e, t]) * after
                else:
                    delta = values[e, t, j + 1] - values[e, t, j]
                    after = adv[e, t, j] = delta + (1.0 if variant == "no lam" else lam) * after
            next_value = values[e, t, real[0]]
    return adv, (adv + values) * response_mask


def _bad_variant(variant):
    def bad_advantages(rewards, values, response_mask, next_values, dones, gamma, lam):
        return _bad_loop(rewards, values, response_mask, next_values, dones, gamma, lam, variant)
    return bad_advantages


BAD = Exercise(
    "1.14", "tppo's BAD backup", "exercises.ps1.e14_bad_backup", "bad_advantages",
    oracle=tppo_compute_advantages, cases=_bad_cases,
    worked=[("one env, one step of 2 tokens, r = 1, V = [0.5, 0.25], V_next = 2 (not used: the "
             "step ends the episode), gamma = 0.9, lam = 1: A = [0.5, 0.75]",
             dict(rewards=torch.tensor([[1.0]]), values=torch.tensor([[[0.5, 0.25]]]),
                  response_mask=torch.ones(1, 1, 2), next_values=torch.tensor([2.0]),
                  dones=torch.tensor([[1.0]]), gamma=0.9, lam=1.0),
             (torch.tensor([[[0.5, 0.75]]]), torch.tensor([[[1.0, 1.0]]]))),
            ("one env, R = 2: a step of 1 token and padding (V 9), then a step of 2 tokens that "
             "ends the episode; r = [0, 1], V = [[0.5, 9], [0.25, 0.75]], gamma = 1, lam = 0.5: "
             "A = [[0.0625, 0], [0.625, 0.25]], the padding passing 0.625 through",
             dict(rewards=torch.tensor([[0.0, 1]]), values=torch.tensor([[[0.5, 9], [0.25, 0.75]]]),
                  response_mask=torch.tensor([[[1.0, 0], [1, 1]]]), next_values=torch.tensor([2.0]),
                  dones=torch.tensor([[0.0, 1]]), gamma=1.0, lam=0.5),
             (torch.tensor([[[0.0625, 0], [0.625, 0.25]]]),
              torch.tensor([[[0.5625, 0], [0.875, 1.0]]])))],
    mistakes=[
        ("gamma was applied at every token; inside a step there is no discount (delta = V[j+1] - "
         "V[j], A = delta + lam A_after), only at the step's last token", _bad_gamma_every_token),
        ("the episode's end was ignored at the last token of a done step",
         lambda rewards, values, response_mask, next_values, dones, gamma, lam:
         tppo_compute_advantages(rewards, values, response_mask, next_values,
                                 torch.zeros_like(dones), gamma, lam)),
        ("the returns are A, not (A + V) on real tokens",
         lambda rewards, values, response_mask, next_values, dones, gamma, lam: (
             tppo_compute_advantages(rewards, values, response_mask, next_values, dones, gamma,
                                     lam)[0],) * 2),
        ("padding passes A_after through to the real token before it; here it reset A_after to 0",
         _bad_variant("reset")),
        ("inside a step A = delta + lam A_after: the lam is missing",
         _bad_variant("no lam")),
        ("a step's last real token is where its mask ends, not its last slot R - 1: a shorter "
         "step got its reward at a padding slot", _bad_variant("slot")),
    ])


# ------------------------------------------------------------------------------------------------
# 1.15 the seeded inverse-CDF draw


def _cdf_cases():
    probs = torch.tensor([[0.5, 0.0, 0.5, 0.0], [0.1, 0.2, 0.3, 0.4], [0.0, 0.3, 0.0, 0.3]])
    return [("u at a step of the cdf, on a flat part and past a row's mass of 0.6",
             dict(probs=probs, uniforms=torch.tensor([0.5, 0.05, 0.4]))),
            ("u = 0 and u near 1", dict(probs=probs, uniforms=torch.tensor([0.0, 0.999, 0.999]))),
            ("random probs [4, 6] with zeros, random u", _random_draw(_gen(115)))]


def _random_draw(g):
    probs = torch.rand(4, 6, generator=g)
    probs = probs * (torch.rand(4, 6, generator=g) > 0.3)  # top-p zeroes some
    probs[:, 0] += 0.01  # no row without mass
    return dict(probs=probs, uniforms=torch.rand(4, generator=g, dtype=torch.float64))


INVERSE_CDF = Exercise(
    "1.15", "the seeded inverse-CDF draw", "exercises.ps1.e15_inverse_cdf", "inverse_cdf",
    oracle=inverse_cdf, cases=_cdf_cases,
    worked=[("probs [0.25, 0.25, 0.5], u = 0.6: cdf [0.25, 0.5, 1] first exceeds 0.6 at 2",
             dict(probs=torch.tensor([[0.25, 0.25, 0.5]]), uniforms=torch.tensor([0.6])),
             torch.tensor([2])),
            ("the same probs, u = 0.5, exactly on a step of the cdf: 0.5 is not more than 0.5, "
             "so 2",
             dict(probs=torch.tensor([[0.25, 0.25, 0.5]]), uniforms=torch.tensor([0.5])),
             torch.tensor([2])),
            ("probs [0.2, 0, 0.2], a mass of 0.4 (top-p zeroed the rest), u = 0.25: "
             "0.25 x 0.4 = 0.1, so 0",
             dict(probs=torch.tensor([[0.2, 0.0, 0.2]]), uniforms=torch.tensor([0.25])),
             torch.tensor([0])),
            ("probs [0.5, 0.5, 0], u = 1 - 2^-32, the sampler's largest: 1, never the last token, "
             "whose probability is 0",
             dict(probs=torch.tensor([[0.5, 0.5, 0.0]]),
                  uniforms=torch.tensor([1 - 2 ** -32], dtype=torch.float64)),
             torch.tensor([1])),
            ("rows [0.2, 0.2] and [0.5, 0.5], u = 0.4 each: each row's own mass, 0.4 and 1, so the "
             "thresholds are 0.16 and 0.4",
             dict(probs=torch.tensor([[0.2, 0.2], [0.5, 0.5]]), uniforms=torch.tensor([0.4, 0.4])),
             torch.tensor([0, 0]))],
    mistakes=[
        ("the draw took the first token whose cdf reaches u x mass (right=False); it must exceed "
         "it, or a cdf step at exactly u picks the token before",
         lambda probs, uniforms: torch.searchsorted(
             probs.double().cumsum(-1), (uniforms.double() * probs.double().sum(-1))[:, None],
             right=False)[:, 0].clamp(max=probs.shape[1] - 1)),
        ("u was not scaled by the row's mass; probs need not sum to 1 (top-p zeroes some)",
         lambda probs, uniforms: torch.searchsorted(
             probs.double().cumsum(-1), uniforms.double()[:, None], right=True)[:, 0].clamp(
                 max=probs.shape[1] - 1)),
        ("the cdf was summed in float32, where u = 1 - 2^-32 rounds to 1 and the threshold to the "
         "whole mass: no token's cdf exceeds it, and the draw falls past the last token. Compute "
         "in float64 (.double())",
         lambda probs, uniforms: torch.searchsorted(
             probs.float().cumsum(-1), (uniforms.float() * probs.float().sum(-1))[:, None],
             right=True)[:, 0]),
        ("u was scaled by the mass of the whole batch; each row has its own mass, the last "
         "entry of its cdf", lambda probs, uniforms: torch.searchsorted(
             probs.double().cumsum(-1), (uniforms.double() * probs.double().sum())[:, None],
             right=True)[:, 0].clamp(max=probs.shape[1] - 1)),
    ])


# ------------------------------------------------------------------------------------------------
# 1.16 the training ids and the tool mask (tools.py `play`)


def _tool_oracle(said, answers, budget):
    """tools.py's own `play` on one response, with a scripted model in place of the sampler: turn
    k samples said[k], and each turn but the last closes a call that the tool answers with the ids
    answers[k]. Only the sampler and the tool are scripted; how the ids, the mask and the budget
    are put together is play's own code."""
    turns, now = iter(range(len(said))), {}

    def generate(policy, tokenizer, contexts, max_new_tokens, temperature, top_p,
                 stop_strings=(), seeds=None, decoder=None):
        k = now["turn"] = next(turns)
        ids = torch.tensor([said[k]], dtype=torch.long)
        closed = torch.tensor([k < len(answers)])  # the stop string ended the turn: a call
        return Generation(torch.zeros(1, 1, dtype=torch.long), torch.ones(1, 1, dtype=torch.long),
                          ids, torch.ones_like(ids), torch.zeros(ids.shape), closed, ~closed)

    # The tool's answer travels as text (play wraps it in <output> tags and encodes it): here the
    # text of the ids, which this tokenizer reads back; there is no EOS, a turn ends at its call.
    tokenizer = SimpleNamespace(
        eos_token_id=None, pad_token_id=0, decode=lambda ids, skip_special_tokens=False: "",
        encode=lambda text, add_special_tokens=True: [
            int(t) for t in text.removeprefix("<output>").removesuffix("</output>").split()])
    args = replace(tools.Args(), max_new_tokens=budget, max_turns=len(said), tools="calc",
                   plain=True)
    def answer(text, names, tool_format):
        """Every closed turn is a call, answered with the scripted ids' text."""
        return " ".join(map(str, answers[now["turn"]]))

    with mock.patch.multiple(tools, generate=generate, answer_call=answer):
        gen, tool_mask, _, _, _ = tools_play(torch.nn.Linear(1, 1), tokenizer, [[1]], [0], args,
                                             1.0, contextlib.nullcontext())
    return gen.response_ids[0], tool_mask[0]


def _tool_cases():
    said, answers = [[11, 12, 13], [14, 15], [16, 17, 18, 19]], [[91, 92, 93], [94]]
    return [("3 turns, 2 calls, everything within a budget of 40",
             dict(said=said, answers=answers, budget=40)),
            ("the same in a budget of 9: the last call's answer fills it",
             dict(said=said, answers=answers, budget=9)),
            ("the same in a budget of 5: the first answer is cut",
             dict(said=said, answers=answers, budget=5)),
            ("a long answer, then a turn cut by a budget of 12",
             dict(said=[[1, 2], [3, 4, 5, 6, 7]], answers=[[80, 81, 82, 83, 84, 85]], budget=12)),
            ("one turn without a call, cut by a budget of 4",
             dict(said=[[1, 2, 3, 4, 5, 6]], answers=[], budget=4)),
            ("3 turns of random ids in a random budget", _random_turns(_gen(116)))]


def _random_turns(g):
    def ids(n):
        return torch.randint(1, 100, (n,), generator=g).tolist()
    lengths = torch.randint(1, 6, (5,), generator=g).tolist()
    return dict(said=[ids(n) for n in lengths[:3]], answers=[ids(n) for n in lengths[3:]],
                budget=int(torch.randint(4, 20, (1,), generator=g)))


def _tool_answers_counted_apart(said, answers, budget):
    """The budget counts the model's ids only: neither the answers count nor are they cut."""
    ids, mask, written = [], [], 0
    for k, turn in enumerate(said):
        new = turn[:budget - written]
        ids, mask, written = ids + new, mask + [1] * len(new), written + len(new)
        if len(new) < len(turn) or written >= budget or k == len(answers):
            break
        ids, mask = ids + answers[k], mask + [0] * len(answers[k])
    return torch.tensor(ids), torch.tensor(mask)


def _tool_answer_whole(said, answers, budget):
    """The tool's answer goes in whole, past the budget."""
    ids, mask = [], []
    for k, turn in enumerate(said):
        new = turn[:budget - len(ids)]
        ids, mask = ids + new, mask + [1] * len(new)
        if len(new) < len(turn) or len(ids) >= budget or k == len(answers):
            break
        ids, mask = ids + answers[k], mask + [0] * len(answers[k])
        if len(ids) >= budget:
            break
    return torch.tensor(ids), torch.tensor(mask)


def _tool_answers_last(said, answers, budget):
    """Every turn's ids, then every answer's."""
    ids = [i for turn in said for i in turn] + [i for answer in answers for i in answer]
    mask = [1] * sum(map(len, said)) + [0] * sum(map(len, answers))
    return torch.tensor(ids[:budget]), torch.tensor(mask[:budget])


TOOL_IDS = Exercise(
    "1.16", "the training ids and the tool mask", "exercises.ps1.e16_tool_ids", "training_ids",
    oracle=_tool_oracle, cases=_tool_cases,
    worked=[("said [[5, 6], [7, 8]], answers [[90, 91]], budget 10",
             dict(said=[[5, 6], [7, 8]], answers=[[90, 91]], budget=10),
             (torch.tensor([5, 6, 90, 91, 7, 8]), torch.tensor([1, 1, 0, 0, 1, 1]))),
            ("the same in a budget of 3: the answer is cut after one id",
             dict(said=[[5, 6], [7, 8]], answers=[[90, 91]], budget=3),
             (torch.tensor([5, 6, 90]), torch.tensor([1, 1, 0])))],
    mistakes=[
        ("the tool's ids got mask 1: the model did not pick them, so they stay in the ids with "
         "mask 0, out of the loss",
         lambda said, answers, budget: (_tool_oracle(said, answers, budget)[0],
                                        torch.ones_like(_tool_oracle(said, answers, budget)[1]))),
        ("the tool's answer was left out of the ids: the model reads it in the turns after it, so "
         "it stays in the sequence, with mask 0",
         lambda said, answers, budget: _tool_oracle(said, [[] for _ in answers], budget)),
        ("the budget counted the model's ids only: it holds the tools' ids too (TRL's "
         "max_completion_length)", _tool_answers_counted_apart),
        ("the tool's answer ran past the budget: cut it at the room that is left",
         _tool_answer_whole),
        ("the ids are in the order they were written: each tool's answer goes right after the "
         "call it answers, before the next turn", _tool_answers_last),
    ])


# ------------------------------------------------------------------------------------------------
# 1.17 the off-policy weights (async_grpo.py)


def _off_policy_oracle(old_logprobs, sampler_logprobs, mask, correction, cap=2.0, low=0.5,
                       high=5.0):
    args = SimpleNamespace(off_policy_correction=correction, is_cap=cap, icepop_low=low,
                           icepop_high=high)
    return async_off_policy_weights(old_logprobs, sampler_logprobs, mask, args)


def _off_policy_cases():
    g = _gen(17)
    mask = _padded_mask([6, 4, 3, 1], 6)
    sampler = -torch.rand(4, 6, generator=g) * 3
    spread = torch.tensor([[1.0], [0.15], [1.0], [1.0]])  # row 1 close to on-policy: R <= cap
    old = sampler + torch.randn(4, 6, generator=g) * spread
    old = old + 0.7 * (1 - mask)  # the padding's log-probs differ too, so that counting it shows
    inputs = dict(old_logprobs=old, sampler_logprobs=sampler, mask=mask)
    return [(f"{c} on [4, 6] with rows of 6, 4, 3 and 1 tokens, ratios from 0.18 to 3.6",
             dict(inputs, correction=c)) for c in ("none", "tis", "icepop", "seq_mis")] + [
        ("tis with cap 1.2", dict(inputs, correction="tis", cap=1.2)),
        ("icepop within [0.8, 1.5]", dict(inputs, correction="icepop", low=0.8, high=1.5))] + [
        (f"r = 1 exactly on the bounds, {c} with {bounds}: a weight on a bound is kept",
         dict(old_logprobs=sampler[:2, :3], sampler_logprobs=sampler[:2, :3].clone(),
              mask=mask[2:4, :3], correction=c, **kwargs))
        for c, bounds, kwargs in (("tis", "cap 1", dict(cap=1.0)),
                                  ("icepop", "low = high = 1", dict(low=1.0, high=1.0)),
                                  ("seq_mis", "cap 1", dict(cap=1.0)))]


def _off_policy_ratio(old_logprobs, sampler_logprobs, mask):
    return torch.exp(((old_logprobs - sampler_logprobs) * mask).clamp(-20, 20))


def _tis_zeroed(old_logprobs, sampler_logprobs, mask, correction, cap=2.0, low=0.5, high=5.0):
    if correction != "tis":
        return _off_policy_oracle(old_logprobs, sampler_logprobs, mask, correction, cap, low, high)
    r = _off_policy_ratio(old_logprobs, sampler_logprobs, mask)
    return r.masked_fill(r > cap, 0.0), r > cap


def _icepop_clamped(old_logprobs, sampler_logprobs, mask, correction, cap=2.0, low=0.5,
                    high=5.0):
    if correction != "icepop":
        return _off_policy_oracle(old_logprobs, sampler_logprobs, mask, correction, cap, low, high)
    r = _off_policy_ratio(old_logprobs, sampler_logprobs, mask)
    return r.clamp(low, high), (r < low) | (r > high)


def _mis_per_token(old_logprobs, sampler_logprobs, mask, correction, cap=2.0, low=0.5,
                   high=5.0):
    if correction != "seq_mis":
        return _off_policy_oracle(old_logprobs, sampler_logprobs, mask, correction, cap, low, high)
    r = _off_policy_ratio(old_logprobs, sampler_logprobs, mask)
    return r.masked_fill(r > cap, 0.0), r > cap


def _ratio_times_mask(old_logprobs, sampler_logprobs, mask, correction, cap, low, high):
    """off_policy_weights with r = exp(old - sampler) * mask: 0 on the padding."""
    r = torch.exp(old_logprobs - sampler_logprobs) * mask
    if correction == "tis":
        return r.clamp(max=cap), r > cap
    if correction == "icepop":
        cut = (r < low) | (r > high)
        return r.masked_fill(cut, 0.0), cut
    if correction == "seq_mis":
        seq = r.prod(1, keepdim=True).expand_as(r)
        return seq.masked_fill(seq > cap, 0.0), seq > cap
    return torch.ones_like(r), torch.zeros_like(r, dtype=torch.bool)


def _strict_bound(which):
    """off_policy_weights with a ratio on one correction's bound taken as past it."""
    def off_policy_weights(old_logprobs, sampler_logprobs, mask, correction, cap=2.0, low=0.5,
                           high=5.0):
        weights, cut = _off_policy_oracle(old_logprobs, sampler_logprobs, mask, correction, cap,
                                          low, high)
        if correction != which:
            return weights, cut
        r = _off_policy_ratio(old_logprobs, sampler_logprobs, mask)
        if which == "tis":
            return weights, r >= cap
        if which == "icepop":
            cut = (r <= low) | (r >= high)
            return r.masked_fill(cut, 0.0), cut
        seq = r.prod(1, keepdim=True).expand_as(r)
        return seq.masked_fill(seq >= cap, 0.0), seq >= cap
    return off_policy_weights


OFF_POLICY = Exercise(
    "1.17", "the off-policy weights: TIS, IcePop, sequence MIS",
    "exercises.ps1.e17_off_policy_weights", "off_policy_weights",
    oracle=_off_policy_oracle, cases=_off_policy_cases,
    worked=[(f"r = [[0.5, 1.5, 3.0]], {correction} with "
             + ", ".join(f"{k} {v:g}" for k, v in bounds.items()),
             dict(old_logprobs=torch.tensor([[0.2, 0.6, 0.3]]).log(),
                  sampler_logprobs=torch.tensor([[0.4, 0.4, 0.1]]).log(),
                  mask=torch.ones(1, 3), correction=correction, **bounds),
             (torch.tensor([weights]), torch.tensor([cut])))
            for correction, bounds, weights, cut in (
                ("tis", dict(cap=2.0), [0.5, 1.5, 2.0], [False, False, True]),
                ("icepop", dict(low=0.6, high=2.0), [0.0, 1.5, 0.0], [True, False, True]),
                ("seq_mis", dict(cap=2.0), [0.0, 0.0, 0.0], [True, True, True]))] + [
        ("r = [[2, 3]] with the second token padding, seq_mis, cap 2.5: the padding counts as "
         "r = 1, so R = 2",
         dict(old_logprobs=torch.tensor([[0.2, 0.3]]).log(),
              sampler_logprobs=torch.tensor([[0.1, 0.1]]).log(), mask=torch.tensor([[1.0, 0]]),
              correction="seq_mis", cap=2.5),
         (torch.tensor([[2.0, 2.0]]), torch.tensor([[False, False]])))] + [
        (f"r = [[1, 1]], {correction} with {bounds}: a ratio on a bound is kept, not cut",
         dict(old_logprobs=torch.tensor([[0.5, 0.25]]).log(),
              sampler_logprobs=torch.tensor([[0.5, 0.25]]).log(), mask=torch.ones(1, 2),
              correction=correction, **kwargs),
         (torch.tensor([[1.0, 1.0]]), torch.tensor([[False, False]])))
        for correction, bounds, kwargs in (("tis", "cap 1", dict(cap=1.0)),
                                           ("icepop", "low = high = 1", dict(low=1.0, high=1.0)),
                                           ("seq_mis", "cap 1", dict(cap=1.0)))],
    mistakes=[
        ("the ratio is inverted: r = pi_prox / mu, the trainer's probability over the sampler's "
         "(exp(old_logprobs - sampler_logprobs))",
         lambda old_logprobs, sampler_logprobs, mask, correction, cap=2.0, low=0.5, high=5.0:
         _off_policy_oracle(sampler_logprobs, old_logprobs, mask, correction, cap, low, high)),
        ("the padding was not masked: its log-ratio counts as 0 (a weight of 1), and a response's "
         "product R takes in its real tokens only",
         lambda old_logprobs, sampler_logprobs, mask, correction, cap=2.0, low=0.5, high=5.0:
         _off_policy_oracle(old_logprobs, sampler_logprobs, torch.ones_like(mask), correction,
                            cap, low, high)),
        ("TIS truncates a weight above cap to cap; it was set to 0 (masking is IcePop's and MIS's)",
         _tis_zeroed),
        ("IcePop masks a token outside [low, high] (weight 0); it was clamped into the range",
         _icepop_clamped),
        ("sequence MIS weighs every token of a response by the product of its ratios R; this used "
         "each token's own ratio", _mis_per_token),
        ("a padding token counts as r = 1 (its log-ratio 0); here r was multiplied by the mask, "
         "so the padding's ratio was 0 and a response's product R with it",
         lambda old_logprobs, sampler_logprobs, mask, correction, cap=2.0, low=0.5, high=5.0:
         _ratio_times_mask(old_logprobs, sampler_logprobs, mask, correction, cap, low, high)),
        ("TIS cuts a weight above cap (r_t > cap); a ratio equal to cap was said to be cut",
         _strict_bound("tis")),
        ("IcePop keeps a ratio on its bounds (low <= r_t <= high); one equal to low or high was "
         "masked", _strict_bound("icepop")),
        ("sequence MIS keeps R <= cap; a product equal to cap was masked",
         _strict_bound("seq_mis")),
    ])


# ------------------------------------------------------------------------------------------------
# 1.18 distillation's per-token advantage, 1.19 the full-vocabulary divergence (distill.py)


def _distill_cases():
    g = _gen(18)
    old, teacher = -torch.rand(3, 5, generator=g) * 4, -torch.rand(3, 5, generator=g) * 4
    reward = torch.randn(3, generator=g)
    return [(f"[3, 5] log-probs, a verifier's share per response, {form}",
             dict(old_logprobs=old, teacher_logprobs=teacher, reward_advantages=reward,
                  loss_form=form)) for form in ("sampled", "full")] + [
        ("sampled, without a verifier's share", dict(
            old_logprobs=old, teacher_logprobs=teacher, reward_advantages=torch.zeros(3),
            loss_form="sampled"))]


DISTILL_ADVANTAGES = Exercise(
    "1.18", "distillation's per-token advantage", "exercises.ps1.e18_distill_advantages",
    "distill_advantages", oracle=distill_advantages, cases=_distill_cases,
    constants=("old_logprobs", "teacher_logprobs"),
    worked=[(f"pi_old [0.5, 0.25], pi_T [0.25, 0.5], A_i = 1, {form}",
             dict(old_logprobs=torch.tensor([[0.5, 0.25]]).log(),
                  teacher_logprobs=torch.tensor([[0.25, 0.5]]).log(),
                  reward_advantages=torch.tensor([1.0]), loss_form=form), expected)
            for form, expected in (("sampled", torch.tensor([[1 - 0.6931472, 1 + 0.6931472]])),
                                   ("full", torch.tensor([[1.0, 1.0]])))],
    mistakes=[
        ("the sign of the log-ratio is flipped: the reward is log pi_T - log pi_old, above 0 where "
         "the teacher likes the token more than the student",
         lambda old_logprobs, teacher_logprobs, reward_advantages, loss_form: distill_advantages(
             teacher_logprobs, old_logprobs, reward_advantages, loss_form)),
        ("the verifier's share A_i was left out: it is added to every token of its response",
         lambda old_logprobs, teacher_logprobs, reward_advantages, loss_form: distill_advantages(
             old_logprobs, teacher_logprobs, 0 * reward_advantages, loss_form)),
        ("in the full form the advantage is the verifier's share alone: the divergence is the loss "
         "itself (1.19), not a reward",
         lambda old_logprobs, teacher_logprobs, reward_advantages, loss_form: distill_advantages(
             old_logprobs, teacher_logprobs, reward_advantages, "sampled")),
    ])


def _divergence_cases():
    g = _gen(19)
    student, teacher = torch.randn(2, 3, 7, generator=g) * 2, torch.randn(2, 3, 7, generator=g) * 2
    student[0, 0, :3] = teacher[0, 0, :3] = -1000.0  # words that neither would write
    return [(f"logits [2, 3, 7], beta {beta}",
             dict(student_logits=student, teacher_logits=teacher, beta=beta))
            for beta in (1.0, 0.0, 0.5, 0.2, 0.9)] + [
        (f"bfloat16 logits [2, 3, 7], beta {beta}: the divergence in float32",
         dict(student_logits=student[1:].bfloat16(), teacher_logits=teacher[1:].bfloat16(),
              beta=beta)) for beta in (1.0, 0.5)]


def _divergence_mixture_swapped(student_logits, teacher_logits, beta):
    if beta in (0, 1):
        return distill_divergence(student_logits, teacher_logits, beta)
    log_p = F.log_softmax(student_logits.float(), dim=-1)
    log_t = F.log_softmax(teacher_logits.float(), dim=-1)
    log_m = torch.logaddexp(log_p + math.log(beta), log_t + math.log(1 - beta))
    return (beta * (log_t.exp() * (log_t - log_m)).sum(-1)
            + (1 - beta) * (log_p.exp() * (log_p - log_m)).sum(-1))


def _divergence_mixture_of_probs(student_logits, teacher_logits, beta):
    if beta in (0, 1):
        return distill_divergence(student_logits, teacher_logits, beta)
    p, t = F.softmax(student_logits.float(), dim=-1), F.softmax(teacher_logits.float(), dim=-1)
    m = beta * t + (1 - beta) * p
    return beta * (t * (t / m).log()).sum(-1) + (1 - beta) * (p * (p / m).log()).sum(-1)


def _divergence_wrong_axis(student_logits, teacher_logits, beta):
    """distill.divergence with the log-softmax over dim 0, the sums over the vocabulary."""
    log_p = F.log_softmax(student_logits.float(), dim=0)
    log_t = F.log_softmax(teacher_logits.float(), dim=0)
    if beta == 1:
        return (log_p.exp() * (log_p - log_t)).sum(-1)
    if beta == 0:
        return (log_t.exp() * (log_t - log_p)).sum(-1)
    log_m = torch.logaddexp(log_p + math.log(1 - beta), log_t + math.log(beta))
    return (beta * (log_t.exp() * (log_t - log_m)).sum(-1)
            + (1 - beta) * (log_p.exp() * (log_p - log_m)).sum(-1))


DIVERGENCE = Exercise(
    "1.19", "distillation's full-vocabulary divergence", "exercises.ps1.e19_divergence",
    "divergence", oracle=distill_divergence, cases=_divergence_cases,
    worked=[(f"pi = [0.5, 0.5], pi_T = [0.25, 0.75], beta {beta}",
             dict(student_logits=torch.zeros(2), teacher_logits=torch.tensor([0.25, 0.75]).log(),
                  beta=beta), torch.tensor(expected))
            for beta, expected in (
                (1.0, 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)),
                (0.0, 0.25 * math.log(0.25 / 0.5) + 0.75 * math.log(0.75 / 0.5)),
                # m = [0.375, 0.625]
                (0.5, 0.5 * (0.25 * math.log(0.25 / 0.375) + 0.75 * math.log(0.75 / 0.625))
                 + 0.5 * (0.5 * math.log(0.5 / 0.375) + 0.5 * math.log(0.5 / 0.625))),
                # m = 0.25 pi_T + 0.75 pi = [0.4375, 0.5625]
                (0.25, 0.25 * (0.25 * math.log(0.25 / 0.4375) + 0.75 * math.log(0.75 / 0.5625))
                 + 0.75 * (0.5 * math.log(0.5 / 0.4375) + 0.5 * math.log(0.5 / 0.5625))))] + [
        ("student and teacher logits [0, -1000]: neither puts any mass on the second word, so 0 "
         "at beta 0.5",
         dict(student_logits=torch.tensor([0.0, -1000]), teacher_logits=torch.tensor([0.0, -1000]),
              beta=0.5), torch.tensor(0.0)),
        ("two positions [2, 2], each pi = [0.5, 0.5] and pi_T = [0.25, 0.75], beta 1.0: one "
         "divergence per position, over the vocabulary (the last dimension)",
         dict(student_logits=torch.zeros(2, 2),
              teacher_logits=torch.tensor([[0.25, 0.75], [0.25, 0.75]]).log(), beta=1.0),
         torch.tensor([0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)] * 2))],
    mistakes=[
        ("the student's and the teacher's distributions are swapped: beta 1 is the reverse "
         "KL(pi || pi_T), weighted by the student's pi",
         lambda student_logits, teacher_logits, beta: distill_divergence(teacher_logits,
                                                                         student_logits, beta)),
        ("the mixture's weights are swapped: m = beta pi_T + (1 - beta) pi",
         _divergence_mixture_swapped),
        ("the divergence sums over the vocabulary; this is the mean (divided by V)",
         lambda student_logits, teacher_logits, beta: distill_divergence(
             student_logits, teacher_logits, beta) / student_logits.shape[-1]),
        ("m was taken as probabilities and then its log: where both put (almost) no mass that is "
         "log 0, and NaN; take log m with logaddexp of the log-probs",
         _divergence_mixture_of_probs),
        ("the softmax was taken over the wrong axis: each distribution is over the vocabulary, "
         "the last dimension", _divergence_wrong_axis),
    ],
    differentiable=("student_logits",))


# ------------------------------------------------------------------------------------------------
# 1.20 DAPO's soft overlong punishment (dapo.py)


def _overlong_cases():
    lengths = torch.tensor([0, 10, 15, 16, 17, 18, 20])
    return [(f"lengths {lengths.tolist()}, max_new_tokens 20, buffer_len {b}, factor {f}",
             dict(lengths=lengths, max_new_tokens=20, buffer_len=b, factor=f))
            for b, f in ((4, 1.0), (10, 0.5), (20, 2.0), (0, 1.0))] + [
        ("8 random lengths up to 24, a random buffer", _random_lengths(_gen(120)))]


def _random_lengths(g):
    return dict(lengths=torch.randint(0, 25, (8,), generator=g), max_new_tokens=24,
                buffer_len=int(torch.randint(1, 13, (1,), generator=g)), factor=1.0)


def _overlong_unclamped(lengths, max_new_tokens, buffer_len, factor):
    if buffer_len == 0:
        return torch.zeros(lengths.shape)
    return -factor * (lengths - (max_new_tokens - buffer_len)).float() / buffer_len


OVERLONG = Exercise(
    "1.20", "DAPO's soft overlong punishment", "exercises.ps1.e20_overlong_penalty",
    "overlong_penalty", oracle=dapo_overlong_penalty, cases=_overlong_cases,
    worked=[("lengths [10, 18, 20], max_new_tokens 20, buffer_len 4, factor 1: the buffer starts "
             "after 16 tokens",
             dict(lengths=torch.tensor([10, 18, 20]), max_new_tokens=20, buffer_len=4, factor=1.0),
             torch.tensor([0.0, -0.5, -1.0])),
            ("lengths [20], max_new_tokens 20, buffer_len 0: no buffer, and no penalty",
             dict(lengths=torch.tensor([20]), max_new_tokens=20, buffer_len=0, factor=1.0),
             torch.tensor([0.0]))],
    mistakes=[
        ("the tokens into the buffer were not clamped at 0: a response shorter than "
         "max_new_tokens - buffer_len got a bonus; it gets 0", _overlong_unclamped),
        ("the excess is divided by buffer_len, so that a response at the budget gets -factor; it "
         "was divided by max_new_tokens",
         lambda lengths, max_new_tokens, buffer_len, factor: dapo_overlong_penalty(
             lengths, max_new_tokens, buffer_len, factor) * buffer_len / max_new_tokens),
        ("the sign is wrong: it is a penalty, from 0 down to -factor",
         lambda lengths, max_new_tokens, buffer_len, factor: -dapo_overlong_penalty(
             lengths, max_new_tokens, buffer_len, factor)),
        ("with buffer_len 0 there is no buffer and no penalty; this divided 0 by 0",
         lambda lengths, max_new_tokens, buffer_len, factor: -factor * (
             lengths - (max_new_tokens - buffer_len)).clamp(min=0).float() / buffer_len),
        ("the buffer starts one token late: a response of max_new_tokens - buffer_len + k "
         "tokens is k tokens into it",
         lambda lengths, max_new_tokens, buffer_len, factor: dapo_overlong_penalty(
             lengths - int(buffer_len > 0), max_new_tokens, buffer_len, factor)),
    ])


# ------------------------------------------------------------------------------------------------
# 1.21 the supervised loss on worked solutions (sft.py)


def _sft_cases():
    g = _gen(121)
    logprobs = -3 * torch.rand(3, 6, generator=g)
    mask = _padded_mask([6, 2, 0], 6)  # the third row: a micro-batch row with no solution token
    return [("logprobs [3, 6] with solutions of 6, 2 and 0 tokens, normaliser 8 (all of them)",
             dict(logprobs=logprobs, loss_mask=mask, normaliser=8.0)),
            ("the same rows as one micro-batch of a batch of 20 solution tokens",
             dict(logprobs=logprobs, loss_mask=mask, normaliser=20.0)),
            ("one row of 1 token", dict(logprobs=logprobs[:1, :1], loss_mask=mask[:1, :1],
                                        normaliser=1.0))]


def _sft_sequence_mean(logprobs, loss_mask, normaliser):
    per_row = (logprobs * loss_mask).sum(1) / loss_mask.sum(1).clamp(min=1)
    return -per_row.sum() / (loss_mask.sum(1) > 0).sum().clamp(min=1)


SFT_LOSS = Exercise(
    "1.21", "the supervised loss on worked solutions", "exercises.ps1.e21_sft_loss", "sft_loss",
    oracle=sft_sft_loss, cases=_sft_cases, differentiable=("logprobs",),
    worked=[("logprobs [[-1, -2, -9], [-0.5, -9, -9]], mask [[1, 1, 0], [1, 0, 0]], normaliser 3",
             dict(logprobs=torch.tensor([[-1.0, -2, -9], [-0.5, -9, -9]]),
                  loss_mask=torch.tensor([[1.0, 1, 0], [1, 0, 0]]), normaliser=3.0),
             torch.tensor(3.5 / 3)),
            ("the same rows as one micro-batch of a batch of 7 tokens (normaliser 7)",
             dict(logprobs=torch.tensor([[-1.0, -2, -9], [-0.5, -9, -9]]),
                  loss_mask=torch.tensor([[1.0, 1, 0], [1, 0, 0]]), normaliser=7.0),
             torch.tensor(0.5))],
    mistakes=[
        ("that is the mean over every entry: the padding was counted (multiply by the mask, then "
         "divide the sum by the normaliser)",
         lambda logprobs, loss_mask, normaliser: -logprobs.mean()),
        ("the sum was divided by this micro-batch's own solution tokens; the batch's normaliser "
         "is given, so that micro-batches add up to the batch's mean",
         lambda logprobs, loss_mask, normaliser: -(logprobs * loss_mask).sum()
         / loss_mask.sum().clamp(min=1)),
        ("the sign is wrong: that is the log-likelihood, which training raises; the loss is its "
         "negative", lambda logprobs, loss_mask, normaliser: (logprobs * loss_mask).sum()
         / normaliser),
        ("that is a mean per solution, then over solutions (grpo.py's aggregation): a token mean "
         "weighs each token alike, so a long solution counts for more", _sft_sequence_mean),
        ("the mask was moved one position against the log-probs; they are already aligned, "
         "token by token", lambda logprobs, loss_mask, normaliser: -(
             logprobs[:, :-1] * loss_mask[:, 1:]).sum() / normaliser),
    ])


EXERCISES = [MASKED_MEAN, MASKED_WHITEN, KL, LOGPROBS, GROUP, AGGREGATE, RLOO, GAE, SURROGATE,
             VALUE, PREFERENCE, PAIRS, STEP, BAD, INVERSE_CDF, TOOL_IDS, OFF_POLICY,
             DISTILL_ADVANTAGES, DIVERGENCE, OVERLONG, SFT_LOSS]


# ------------------------------------------------------------------------------------------------
# The rules each stub states about its output, quoted from its docstring, and the cases that try
# each one. tests/test_exercise_rules.py holds the table to the stubs and the cases: every rule's
# text is in its stub, every case named exists, a function right but for that one rule fails on
# the cases named, and every sentence of a stub that reads as a rule (must, never, gives, a dtype,
# a shape, NaN, ...) is here or in NOT_RULES.

_GRADIENTS = "keep them (no .detach(), .item() or torch.no_grad() on the way)"
_BAD_SHORT = BAD.worked[1][0]  # the step of 1 token and padding, then one of 2

RULES = {
    "1.1": [
        ("A statistic over tokens must ignore the padding",
         ["x = [[1, 2, 3, 4]], mask = [[1, 1, 0, 0]]"]),
        ("masked_mean(x, mask, dim=d) = sum(x * mask, d) / max(1, sum(mask, d))",
         ["the same along dim=1 (the third row is all padding)", "x [2, 4] along dim=0"]),
        ("each row (each slice along the other dimensions) is divided by its own count of real "
         "tokens, not by the count of the whole batch",
         ["x = [[1, 2], [3, 4]], mask = [[1, 1], [1, 0]], dim=1: rows of 2 and 1 real tokens, "
          "each divided by its own count"]),
        ("An all-zero mask gives 0, not NaN",
         ["x [2, 3] with an all-zero mask, dim=None: a micro-batch of padding only"]),
        ("An all-zero mask gives 0, not NaN (a micro-batch may hold only padding)",
         ["x = [[1, 2], [3, 4]], mask = [[1, 1], [0, 0]], dim=1: the second row is all padding"]),
        (_GRADIENTS, ["x = [[1, 2, 3, 4]], mask = [[1, 1, 0, 0]]"]),
    ],
    "1.2": [
        ("mean = masked mean of x",
         ["x = [[1, 3, 9]], mask = [[1, 1, 0]]: mean 2, unbiased var 2"]),
        ("n = sum(mask)", ["x = [[1, 3], [5, 0]], mask = [[1, 1], [1, 0]]: mean 3 and var 4 over "
                           "the three real entries of both rows"]),
        ("The variance is the unbiased one (n - 1)",
         ["x = [[1, 3, 9]], mask = [[1, 1, 0]]: mean 2, unbiased var 2"]),
        ("whiten(x) = (x - mean) / sqrt(var + eps) (shift_mean=True)", ["the same, eps 0.5"]),
        ("whiten(x) = (x - mean) / sqrt(var + eps) + mean (shift_mean=False",
         ["the same, shift_mean=False"]),
        ("and 0 on the padding", ["x = [[1, 3, 9]], mask = [[1, 1, 0]]: mean 2, unbiased var 2"]),
        ("with a single real entry (n = 1) divide by 1",
         ["x [2, 3] with a single real entry (n = 1)"]),
    ],
    "1.3": [
        ("k1 = log pi(x) / pi_ref(x)", ["k1 on log-probs [2, 5]"]),
        ("k2 = (log pi(x) / pi_ref(x))^2 / 2 biased, never negative", ["k2 on log-probs [2, 5]"]),
        ("k3 = pi_ref(x) / pi(x) - 1 - log(pi_ref(x) / pi(x)) unbiased, never negative",
         ["k3 with pi = 0.5, pi_ref = 0.25: 0.5 - 1 - log 0.5", "k3 on log-probs [2, 5]"]),
        ("every ratio is an exp of a difference of log-probs",
         [f"{k} on log-probs near -110, whose exp is 0 in float32" for k in ("k1", "k2", "k3")]),
        (_GRADIENTS, ["k3 with pi = 0.5, pi_ref = 0.25: 0.5 - 1 - log 0.5"]),
    ],
    "1.4": [
        ("A causal model's logits at position t predict the token at position t + 1",
         ["logits [1, 3, 2] with rows [log 3, 0], [log 3, 0], [0, 5]; input_ids [[0, 1, 0]], a "
          "response of 2 tokens: log 1/4 and log 3/4"]),
        ("the R response tokens are scored by the R positions just before them",
         ["logits [1, 3, 2] with rows [log 3, 0], [log 3, 0], [0, 5]; input_ids [[0, 1, 0]], a "
          "response of 2 tokens: log 1/4 and log 3/4",
          "logits [2, 7, 11], a response of 3 tokens"]),
        ("log softmax(logits[b, T-R-1+j] / temperature)",
         ["the same at temperature 0.5: the logits doubled, log 1/10 and log 9/10",
          "the same at temperature 0.7"]),
        ("over which axis is a distribution normalised?",
         ["logits [1, 3, 2] with rows [log 3, 0], [log 3, 0], [0, 5]; input_ids [[0, 1, 0]], a "
          "response of 2 tokens: log 1/4 and log 3/4"]),
        ("a token of probability e^-200, 0 in float32, still has its log-prob, -200, never -inf",
         ["logits [1, 3, 3] with rows [0, 200, 0]: the tokens scored have probability e^-200, 0 "
          "in float32"]),
        ("-> logprobs [B, R] of the last R = response_len tokens",
         ["logits [1, 3, 2] with rows [log 3, 0], [log 3, 0], [0, 5]; input_ids [[0, 1, 0]], a "
          "response of 2 tokens: log 1/4 and log 3/4"]),
        (_GRADIENTS, ["logits [2, 7, 11], a response of 3 tokens"]),
    ],
    "1.5": [
        ("rewards holds N groups of G = group_size responses to the same prompt, one group after "
         "another (rows 0..G-1 are group 0)",
         ["two groups [1, 0 | 1, 1]: std 0.707 in the first; the second is all equal, so 0"]),
        ("A_i = (r_i - mean(group)) / (std(group) + 1e-4) scale=True: GRPO",
         ["one group [1, 0, 0, 1]: mean 0.5, unbiased std 0.577"]),
        ("A_i = r_i - mean(group) scale=False: Dr.GRPO",
         ["the same two groups, scale=False (Dr.GRPO): r - mean, not divided by the std",
          "the same, scale=False (Dr.GRPO)"]),
        ("std is the unbiased one (torch.std's default)",
         ["one group [1, 0, 0, 1]: mean 0.5, unbiased std 0.577"]),
        ("A group whose rewards are all equal gets 0",
         ["two groups [1, 0 | 1, 1]: std 0.707 in the first; the second is all equal, so 0"]),
        ("[N * G] rewards -> [N * G] advantages",
         ["one group [1, 0, 0, 1]: mean 0.5, unbiased std 0.577"]),
    ],
    "1.6": [
        ('"grpo": sum_i [ sum_t mask * loss / sum_t mask ] / normaliser',
         ["grpo: rows [1, 3] (2 tokens) and [6, pad], normaliser 2: (2 + 6) / 2",
          "loss_type 'grpo', rows of 5, 1 and 3 tokens, normaliser 3.0"]),
        ("sum_{i,t} mask * loss / normaliser",
         ["bnpo: the same rows, normaliser 3: (1 + 3 + 6) / 3",
          "loss_type 'bnpo', rows of 5, 1 and 3 tokens, normaliser 9.0",
          "loss_type 'dr_grpo', rows of 5, 1 and 3 tokens, normaliser 15.0"]),
        ('"bnpo", "dapo", "dr_grpo":',
         ["dapo: the same rows, normaliser 3: a token sum, as bnpo's",
          "loss_type 'dapo', rows of 5, 1 and 3 tokens, normaliser 9.0"]),
        ("mask [b, R] (1 on the tokens that count)",
         ["grpo: rows [1, 3] (2 tokens) and [6, pad], normaliser 2: (2 + 6) / 2"]),
        ("normaliser is a number fixed for the whole minibatch",
         ["grpo: rows [1, 3], [pad, pad] and [6, pad], normaliser 2 (the rows with a token): the "
          "empty row adds 0, (2 + 0 + 6) / 2"]),
        ("A row with no counted token adds 0",
         ["grpo: rows [1, 3], [pad, pad] and [6, pad], normaliser 2 (the rows with a token): the "
          "empty row adds 0, (2 + 0 + 6) / 2",
          "loss_type 'grpo', rows of 4, 0 and 2 tokens (the second row adds 0), normaliser 2.0"]),
        (_GRADIENTS, ["loss_type 'grpo', rows of 5, 1 and 3 tokens, normaliser 3.0"]),
    ],
    "1.7": [
        ("groups of k = group_size consecutive samples of the same prompt",
         ["two groups [1, 0 | 3, 3]: each sample's baseline is the other one of its group"]),
        ("Sample i's baseline is the mean of the OTHER k - 1 samples of its group",
         ["one group [1, 0, 0, 1]: b_0 = (0 + 0 + 1) / 3"]),
        ("b_i = (sum_j r_j - r_i) / (k - 1)", ["one group [1, 0, 0, 1]: b_0 = (0 + 0 + 1) / 3"]),
        ("[N] returns -> [N] baselines", ["one group [1, 0, 0, 1]: b_0 = (0 + 0 + 1) / 3"]),
    ],
    "1.8": [
        ("delta_t = r_t + gamma * V_{t+1} * (1 - done_t) - V_t",
         ["one row of 2 tokens, r = [0, 1], V = [0.5, 0.25], gamma = lam = 1",
          "the same row, gamma = 0.5, lam = 1: delta_0 = 0.5 x 0.25 - 0.5, A_0 = delta_0 + 0.5 x "
          "0.75 = 0"]),
        ("A_t = delta_t + gamma * lam * (1 - done_t) * A_{t+1}",
         ["r = [0, 1, pad], V = [0.5, 0.25, 9 on the padding], gamma = 1, lam = 0.5: the row ends "
          "at its second token, so the 9 never comes back: A_0 = -0.25 + 0.5 x 0.75"]),
        ("returns = A + V", ["one row of 2 tokens, r = [0, 1], V = [0.5, 0.25], gamma = lam = 1"]),
        ("Each row's episode ends at its last real token, whose successor has value 0",
         ["r = [0, 1, pad], V = [0.5, 0.25, 9 on the padding], gamma = 1, lam = 0.5: the row ends "
          "at its second token, so the 9 never comes back: A_0 = -0.25 + 0.5 x 0.75"]),
        ("done_t = 1 at the last real token of a row",
         ["r = [0, 1, pad], V = [0.5, 0.25, 9 on the padding], gamma = 1, lam = 0.5: the row ends "
          "at its second token, so the 9 never comes back: A_0 = -0.25 + 0.5 x 0.75"]),
        ("Padding gets advantage and return 0",
         ["r = [0, 1, pad], V = [0.5, 0.25, 9 on the padding], gamma = 1, lam = 0.5: the row ends "
          "at its second token, so the 9 never comes back: A_0 = -0.25 + 0.5 x 0.75"]),
        ("A_t needs A_{t+1}: which direction must the loop over t go?",
         ["one row of 2 tokens, r = [0, 1], V = [0.5, 0.25], gamma = lam = 1"]),
        ("-> (advantages [B, R], returns [B, R])",
         ["one row of 2 tokens, r = [0, 1], V = [0.5, 0.25], gamma = lam = 1"]),
    ],
    "1.9": [
        ("With ratio = exp(logprobs - old_logprobs)",
         ["ratios 1.5 and 0.5, A = 1, epsilon 0.2: max(-1.5, -1.2) and max(-0.5, -0.8)"]),
        ("loss = max( -A * ratio, -A * clip(ratio, 1 - epsilon, 1 + epsilon) )",
         ["ratios 1.5 and 0.5, A = 1, epsilon 0.2: max(-1.5, -1.2) and max(-0.5, -0.8)",
          "ratios 0.61, 0.90, 1.11, 1.65 with advantages +1, -1, +0.5, epsilon 0.2"]),
        ("A token whose ratio has left the clip range in the direction its advantage pushes gets "
         "no gradient",
         ["ratios 1.5 and 0.5, A = 1, epsilon 0.2: max(-1.5, -1.2) and max(-0.5, -0.8)",
          "ratios 0.61, 0.90, 1.11, 1.65 with advantages +1, -1, +0.5, epsilon 0.2"]),
        ("Log-probs may lie far below 0 (near -110, whose exp is 0 in float32): the ratio and the "
         "loss stay finite", ["the same ratios of log-probs near -110, whose exp is 0 in float32"]),
        ("advantages is [b, R] here, one per token.",
         ["ratios 1.5 and 0.5, A = 1, epsilon 0.2: max(-1.5, -1.2) and max(-0.5, -0.8)"]),
        ("All inputs [b, R] -> per-token losses [b, R]",
         ["ratios 1.5 and 0.5, A = 1, epsilon 0.2: max(-1.5, -1.2) and max(-0.5, -0.8)"]),
        (_GRADIENTS, ["ratios 0.61, 0.90, 1.11, 1.65 with advantages +1, -1, +0.5, epsilon 0.2"]),
    ],
    "1.10": [
        ("values_clipped = old_values + clip(values - old_values, -clip, clip)",
         ["V = 0.5 from 0, return 1, clip 0.2: 0.5 max(0.25, 0.64)"]),
        ("loss = 0.5 * max( (values - returns)^2, (values_clipped - returns)^2 )",
         ["V = 0.5 from 0, return 1, clip 0.2: 0.5 max(0.25, 0.64)",
          "values moved 0.05 to 0.5 from old values, towards their returns and away, clip 0.2"]),
        ("loss = 0.5 *", ["V = 0.5 from 0, return 1, clip 0.2: 0.5 max(0.25, 0.64)"]),
        ("All inputs [b, R] -> per-token losses [b, R]",
         ["V = 0.5 from 0, return 1, clip 0.2: 0.5 max(0.25, 0.64)"]),
        (_GRADIENTS, ["values moved 0.05 to 0.5 from old values, towards their returns and away, "
                      "clip 0.2"]),
    ],
    "1.11": [
        ("h = (log pi(y_w) - log pi_ref(y_w)) - (log pi(y_l) - log pi_ref(y_l))",
         ["4 pairs, sigmoid, beta 0.1", "4 pairs, ipo, beta 0.5"]),
        ('"sigmoid" (DPO): loss = -log sigmoid(beta * h)', ["4 pairs, sigmoid, beta 0.1"]),
        ('"ipo" (IPO): loss = (h - 1 / (2 * beta))^2',
         ["the same pair, IPO, beta 0.5: (h - 1 / (2 x 0.5))^2 = (2 - 1)^2",
          "4 pairs, ipo, beta 0.5"]),
        ("y_w is the chosen response, y_l the rejected one",
         ["chosen -3, rejected -5, both -4 under the reference, beta 1, DPO: h = 1 - (-1) = 2, "
          "-log sigmoid(2) = log(1 + e^-2)"]),
        ("-log sigmoid(z) = log(1 + exp(-z)) overflows for very negative z if written as it reads",
         ["2 pairs with beta h = -200 and 200, DPO: exp(200) overflows float32, the loss is 200 "
          "and 0"]),
        ("Four [P] tensors of sequence log-probs -> [P] losses",
         ["h = 0 (policy = reference), DPO: -log sigmoid(0) = log 2"]),
        (_GRADIENTS, ["4 pairs, sigmoid, beta 0.1"]),
    ],
    "1.12": [
        ("Each prompt gives one pair: its best response (chosen) against its worst (rejected)",
         ["[0, 1, 0, 1 | 1, 1, 1, 1]: rows 1 over 0; the tied prompt gives none"]),
        ("the first of equal scores in both cases",
         ["[0, 1, 0, 1 | 1, 1, 1, 1]: rows 1 over 0; the tied prompt gives none"]),
        ("A prompt whose responses all score the same gives no pair",
         ["[0, 1, 0, 1 | 1, 1, 1, 1]: rows 1 over 0; the tied prompt gives none",
          "2 prompts of 2, both tied: no pair at all"]),
        ("Returns (chosen rows [P], rejected rows [P]): row numbers into scores (int64)",
         ["[0, 1, 0, 1 | 1, 1, 1, 1]: rows 1 over 0; the tied prompt gives none",
          "2 prompts of 2, both tied: no pair at all"]),
        ("in prompt order", ["3 prompts of 4 responses, the second all tied"]),
        ("The rows returned are rows of scores, not positions inside a group",
         ["[1, 1 | 0, 1]: the first prompt ties; the second gives rows 3 over 2"]),
    ],
    "1.13": [
        ("dones[:, t] = 1 where an episode ended at step t",
         ["one env, 2 steps, the first ends an episode: r = [1, 0], V = [0, 0.5], V_next = 2, "
          "gamma = lam = 1"]),
        ("delta_t = r_t + gamma * V_{t+1} * (1 - done_t) - V_t (V_T = next_values)",
         ["one env, 2 steps, the first ends an episode: r = [1, 0], V = [0, 0.5], V_next = 2, "
          "gamma = lam = 1"]),
        ("A_t = delta_t + gamma * lam * (1 - done_t) * A_{t+1}",
         ["one env, 2 steps, the first ends an episode: r = [1, 0], V = [0, 0.5], V_next = 2, "
          "gamma = lam = 1"]),
        ("returns = A + V", ["one env, 2 steps, the first ends an episode: r = [1, 0], V = [0, "
                             "0.5], V_next = 2, gamma = lam = 1"]),
        ("At an episode's end nothing comes back from the next step: that is a new problem",
         ["one env, one step that ends the episode: r = [1], V = [0.5], V_next = 2, gamma = lam "
          "= 1: nothing comes back from V_next",
          "the same, the first env's episode ending at the segment's last step too"]),
        ("-> (advantages [E, T], returns [E, T])",
         ["one env, 2 steps, the first ends an episode: r = [1, 0], V = [0, 0.5], V_next = 2, "
          "gamma = lam = 1"]),
    ],
    "1.14": [
        ("at a step's last real token: delta = r_t + gamma * V_next * (1 - done_t) - V[t, j]",
         ["one env, one step of 2 tokens, r = 1, V = [0.5, 0.25], V_next = 2 (not used: the step "
          "ends the episode), gamma = 0.9, lam = 1: A = [0.5, 0.75]"]),
        ("at any other real token: delta = V[t, j+1] - V[t, j]",
         ["one env, one step of 2 tokens, r = 1, V = [0.5, 0.25], V_next = 2 (not used: the step "
          "ends the episode), gamma = 0.9, lam = 1: A = [0.5, 0.75]"]),
        ("A = delta + lam * A_after", [_BAD_SHORT]),
        ("a step may be shorter than R", [_BAD_SHORT]),
        ("V_next is V of the next step's first token (next_values after the last step)",
         [_BAD_SHORT, "2 envs, 2 steps of 3, 2, 1 and 3 tokens, the first env's episode ends at "
                      "step 0"]),
        ("Inside a step there is no reward and no discount",
         ["one env, one step of 2 tokens, r = 1, V = [0.5, 0.25], V_next = 2 (not used: the step "
          "ends the episode), gamma = 0.9, lam = 1: A = [0.5, 0.75]"]),
        ("Padding gets 0 and passes A_after through", [_BAD_SHORT]),
        ("returns = (A + V) * mask",
         [_BAD_SHORT, "the same with values on the padding too, which no return may keep"]),
        ("-> (advantages [E, T, R], returns [E, T, R])",
         ["one env, one step of 2 tokens, r = 1, V = [0.5, 0.25], V_next = 2 (not used: the step "
          "ends the episode), gamma = 0.9, lam = 1: A = [0.5, 0.75]"]),
    ],
    "1.15": [
        ("token = min{ i : cdf[i] > u * cdf[V-1] }",
         ["the same probs, u = 0.5, exactly on a step of the cdf: 0.5 is not more than 0.5, so 2"]),
        ("probs [B, V] need not sum to 1 (top-p zeroes some)",
         ["probs [0.2, 0, 0.2], a mass of 0.4 (top-p zeroed the rest), u = 0.25: 0.25 x 0.4 = "
          "0.1, so 0"]),
        ("the first token whose cumulative probability EXCEEDS u times the row's mass",
         ["rows [0.2, 0.2] and [0.5, 0.5], u = 0.4 each: each row's own mass, 0.4 and 1, so the "
          "thresholds are 0.16 and 0.4"]),
        ("computed in float64, so that a token of probability 0 is never drawn",
         ["probs [0.5, 0.5, 0], u = 1 - 2^-32, the sampler's largest: 1, never the last token, "
          "whose probability is 0"]),
        ("Try u = 1 - 2^-32 in float32 and in float64",
         ["probs [0.5, 0.5, 0], u = 1 - 2^-32, the sampler's largest: 1, never the last token, "
          "whose probability is 0"]),
        ("-> tokens [B] (int64)",
         ["probs [0.25, 0.25, 0.5], u = 0.6: cdf [0.25, 0.5, 1] first exceeds 0.6 at 2"]),
    ],
    "1.16": [
        ("ids = said[0] + answers[0] + said[1] + answers[1] + ... + said[-1]",
         ["said [[5, 6], [7, 8]], answers [[90, 91]], budget 10"]),
        ("tool_mask = [1] * len(said[0]) + [0] * len(answers[0]) + [1] * len(said[1]) + ...",
         ["said [[5, 6], [7, 8]], answers [[90, 91]], budget 10"]),
        ("The tool's ids stay in the sequence (the model reads them) with mask 0",
         ["said [[5, 6], [7, 8]], answers [[90, 91]], budget 10"]),
        ("The budget counts every id, the model's and the tools'",
         ["the same in a budget of 5: the first answer is cut",
          "a long answer, then a turn cut by a budget of 12"]),
        ("a turn or an answer that would run past it is cut there",
         ["the same in a budget of 3: the answer is cut after one id"]),
        ("(ids [L] int64, tool_mask [L] int64)",
         ["said [[5, 6], [7, 8]], answers [[90, 91]], budget 10"]),
        ("L <= budget", ["the same in a budget of 3: the answer is cut after one id"]),
    ],
    "1.17": [
        ("r_t = pi_prox(o_t) / mu(o_t) = exp(old_logprobs - sampler_logprobs)",
         ["r = [[0.5, 1.5, 3.0]], tis with cap 2"]),
        ("on the real tokens (a padding token counts as r = 1)",
         ["r = [[2, 3]] with the second token padding, seq_mis, cap 2.5: the padding counts as "
          "r = 1, so R = 2"]),
        ('"none" w_t = 1', ["none on [4, 6] with rows of 6, 4, 3 and 1 tokens, ratios from 0.18 "
                            "to 3.6"]),
        ('"tis" w_t = min(r_t, cap) truncated: never above cap',
         ["r = [[0.5, 1.5, 3.0]], tis with cap 2"]),
        ('"icepop" w_t = r_t if low <= r_t <= high, else 0 a token far off is masked',
         ["r = [[0.5, 1.5, 3.0]], icepop with low 0.6, high 2"]),
        ("low <= r_t <= high",
         ["r = [[1, 1]], icepop with low = high = 1: a ratio on a bound is kept, not cut"]),
        ('"seq_mis" w_t = R if R <= cap, else 0, R = prod_t r_t one weight per response, masked',
         ["r = [[0.5, 1.5, 3.0]], seq_mis with cap 2"]),
        ("R if R <= cap",
         ["r = [[1, 1]], seq_mis with cap 1: a ratio on a bound is kept, not cut"]),
        ("cut is True where a bound changed the weight: r_t > cap (tis)",
         ["r = [[1, 1]], tis with cap 1: a ratio on a bound is kept, not cut"]),
        ("R > cap on every token of the response (seq_mis)",
         ["seq_mis on [4, 6] with rows of 6, 4, 3 and 1 tokens, ratios from 0.18 to 3.6"]),
        ("nowhere (none)", ["none on [4, 6] with rows of 6, 4, 3 and 1 tokens, ratios from 0.18 "
                            "to 3.6"]),
        ("(weights [b, R] float, cut [b, R] bool)", ["r = [[0.5, 1.5, 3.0]], tis with cap 2"]),
    ],
    "1.18": [
        ('"sampled": A_it = A_i - (log pi_old(o_t) - log pi_T(o_t))',
         ["pi_old [0.5, 0.25], pi_T [0.25, 0.5], A_i = 1, sampled"]),
        ('"full": A_it = A_i', ["pi_old [0.5, 0.25], pi_T [0.25, 0.5], A_i = 1, full"]),
        ("is added to every token of response i",
         ["pi_old [0.5, 0.25], pi_T [0.25, 0.5], A_i = 1, sampled"]),
        ("A token the teacher likes more than the student scores above 0",
         ["sampled, without a verifier's share"]),
        ("The advantage is a number, not a function of the weights",
         ["pi_old [0.5, 0.25], pi_T [0.25, 0.5], A_i = 1, sampled"]),
        ("reward_advantages [b] -> advantages [b, R]",
         ["pi_old [0.5, 0.25], pi_T [0.25, 0.5], A_i = 1, full"]),
    ],
    "1.19": [
        ("beta = 1: KL(pi || pi_T) = sum_v pi(v) (log pi(v) - log pi_T(v)) reverse",
         ["pi = [0.5, 0.5], pi_T = [0.25, 0.75], beta 1.0"]),
        ("beta = 0: KL(pi_T || pi) = sum_v pi_T(v) (log pi_T(v) - log pi(v)) forward",
         ["pi = [0.5, 0.5], pi_T = [0.25, 0.75], beta 0.0"]),
        ("0 < beta < 1: beta KL(pi_T || m) + (1 - beta) KL(pi || m), m = beta pi_T + (1 - beta) pi",
         ["pi = [0.5, 0.5], pi_T = [0.25, 0.75], beta 0.25"]),
        ("compared over the whole vocabulary", ["pi = [0.5, 0.5], pi_T = [0.25, 0.75], beta 1.0"]),
        ("which stays finite where a probability underflows",
         ["student and teacher logits [0, -1000]: neither puts any mass on the second word, so 0 "
          "at beta 0.5"]),
        ("[..., V] logits each -> [...] divergences",
         ["two positions [2, 2], each pi = [0.5, 0.5] and pi_T = [0.25, 0.75], beta 1.0: one "
          "divergence per position, over the vocabulary (the last dimension)"]),
        ("divergences (float32)", ["bfloat16 logits [2, 3, 7], beta 1.0: the divergence in "
                                   "float32"]),
        (_GRADIENTS, ["logits [2, 3, 7], beta 0.5"]),
    ],
    "1.20": [
        ("loses reward linearly, down to -factor at the budget",
         ["lengths [10, 18, 20], max_new_tokens 20, buffer_len 4, factor 1: the buffer starts "
          "after 16 tokens"]),
        ("penalty = 0 L <= max_new_tokens - buffer_len",
         ["lengths [10, 18, 20], max_new_tokens 20, buffer_len 4, factor 1: the buffer starts "
          "after 16 tokens"]),
        ("penalty = -factor * (L - (max_new_tokens - buffer_len)) / buffer_len inside the buffer",
         ["lengths [10, 18, 20], max_new_tokens 20, buffer_len 4, factor 1: the buffer starts "
          "after 16 tokens"]),
        ("L <= max_new_tokens - buffer_len",
         ["lengths [10, 18, 20], max_new_tokens 20, buffer_len 4, factor 1: the buffer starts "
          "after 16 tokens"]),
        ("With buffer_len 0 there is no buffer and no penalty",
         ["lengths [20], max_new_tokens 20, buffer_len 0: no buffer, and no penalty"]),
        ("-> [N] float penalties",
         ["lengths [20], max_new_tokens 20, buffer_len 0: no buffer, and no penalty"]),
    ],
    "1.21": [
        ("only the solution's tokens count, and padding never does",
         ["logprobs [[-1, -2, -9], [-0.5, -9, -9]], mask [[1, 1, 0], [1, 0, 0]], normaliser 3"]),
        ("loss = - sum_{i,t} mask_it * logprobs_it / normaliser",
         ["logprobs [[-1, -2, -9], [-0.5, -9, -9]], mask [[1, 1, 0], [1, 0, 0]], normaliser 3"]),
        ("divided by `normaliser`, the number of solution tokens in the whole batch",
         ["the same rows as one micro-batch of a batch of 7 tokens (normaliser 7)"]),
        ("(TRL's token mean)",
         ["logprobs [[-1, -2, -9], [-0.5, -9, -9]], mask [[1, 1, 0], [1, 0, 0]], normaliser 3"]),
        ("-> the scalar loss",
         ["logprobs [[-1, -2, -9], [-0.5, -9, -9]], mask [[1, 1, 0], [1, 0, 0]], normaliser 3"]),
        (_GRADIENTS, ["logprobs [3, 6] with solutions of 6, 2 and 0 tokens, normaliser 8 (all of "
                      "them)"]),
    ],
}

# The sentences of the stubs that read as rules (tests/test_exercise_rules.py's words) and are
# not rules on the output, with why.
NOT_RULES = {
    "1.3": [("never negative (GRPO's)", "a property of k3's formula, tried with it")],
    "1.5": [("a shape that puts each group on a row of its own lets every statistic be taken per "
             "group at once", "a hint on how, not a rule")],
    "1.6": [("so no length bias enters through it", "why Dr.GRPO's normaliser is a constant")],
    "1.7": [("no loop over samples is needed", "a hint on how, not a rule")],
    "1.12": [("online_dpo.py's function takes a `ties` argument; yours has none",
              "the signature, not the output")],
    "1.16": [("The training ids are exactly these ids, in order",
              "said by the two equations after it, tried with them"),
             ("never the transcript decoded and tokenised again",
              "the ids are the equation's; the checker gives ids, no text"),
             ("so their log-probs must not move", "why the mask is 0")],
    "1.19": [("The training differentiates this through the student's logits: the teacher is "
              "frozen", "the teacher's logits come from a forward without gradients; the checker "
                        "compares the student's gradient")],
    "1.20": [("lengths [N] (int64, tokens of each response)", "the input, not the output"),
             ("what should that number be for a response that never reaches it?",
              "a hint towards the rule penalty = 0, tried with it")],
    "1.21": [("The prompt is given, not learned", "why only the solution's tokens count"),
             ("logprobs [B, R] (float), loss_mask [B, R] (1 on a solution token), normaliser (a "
              "float)", "the inputs, not the output")],
}
