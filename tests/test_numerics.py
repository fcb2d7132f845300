"""common/rl/numerics.py and the seeded data order of common/distributed.py against hand-worked values
and closed forms."""

import math

import pytest
import torch

from common.env.math_env import problem_index, prompt_indices
from common.run.run import minibatch_order
from common.rl.numerics import (discounted_returns, explained_variance, kl_estimate, kl_k1, kl_k2,
                             kl_k3, masked_mean, masked_whiten, step_gae, token_gae)


# ---- GAE ---------------------------------------------------------------------------------------------------
def test_token_gae_four_steps_by_hand():
    # Terminal reward 1 on the last of 4 tokens, gamma 0.9, lambda 0.8 (gamma * lambda = 0.72):
    #   d3 = 1 - 0.8 = 0.2                 A3 = 0.2
    #   d2 = 0.9*0.8 - 0.7 = 0.02          A2 = 0.02 + 0.72*0.2     = 0.164
    #   d1 = 0.9*0.7 - 0.6 = 0.03          A1 = 0.03 + 0.72*0.164   = 0.14808
    #   d0 = 0.9*0.6 - 0.5 = 0.04          A0 = 0.04 + 0.72*0.14808 = 0.1466176
    rewards = torch.tensor([[0.0, 0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 0.6, 0.7, 0.8]])
    adv, ret = token_gae(rewards, values, torch.ones(1, 4), gamma=0.9, lam=0.8)
    torch.testing.assert_close(adv, torch.tensor([[0.1466176, 0.14808, 0.164, 0.2]]))
    torch.testing.assert_close(ret, torch.tensor([[0.6466176, 0.74808, 0.864, 1.0]]))


def test_token_gae_ends_at_padding():
    # A 2-token response padded to 4: the value after the last real token is 0, whatever sits in the
    # padding.
    rewards = torch.tensor([[0.0, 1.0, 5.0, 5.0]])
    values = torch.tensor([[0.5, 0.6, 9.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0]])
    adv, ret = token_gae(rewards, values, mask, gamma=1.0, lam=1.0)
    # A1 = 1 - 0.6 = 0.4 ; A0 = 0 + 0.6 - 0.5 + 0.4 = 0.5
    torch.testing.assert_close(adv, torch.tensor([[0.5, 0.4, 0.0, 0.0]]))
    torch.testing.assert_close(ret, torch.tensor([[1.0, 1.0, 0.0, 0.0]]))


def test_step_gae_episode_boundary_and_bootstrap():
    # Steps 0 | 1 2 : an episode ends at step 0, a new one runs into the segment cut, bootstrapped
    # with V=2.
    rewards = torch.tensor([[1.0, 0.0, 2.0]])
    values = torch.tensor([[0.5, 1.0, 1.5]])
    dones = torch.tensor([[1.0, 0.0, 0.0]])
    adv, ret = step_gae(rewards, values, torch.tensor([2.0]), dones, gamma=0.5, lam=1.0)
    # A2 = 2 + 0.5*2 - 1.5 = 1.5 ; A1 = 0 + 0.5*1.5 - 1 + 0.5*1.5 = 0.5 ; A0 = 1 - 0.5 = 0.5 (no
    # carry over the end)
    torch.testing.assert_close(adv, torch.tensor([[0.5, 0.5, 1.5]]))
    torch.testing.assert_close(ret, torch.tensor([[1.0, 1.5, 3.0]]))


def test_discounted_returns():
    torch.testing.assert_close(discounted_returns(torch.tensor([[0.0, 0.0, 1.0]]), 0.5),
                               torch.tensor([[0.25, 0.5, 1.0]]))


# ---- data order and minibatches ----------------------------------------------------------------------------------
def test_prompt_indices_walk_one_seeded_permutation_per_pass():
    # 5 problems, 2 prompts an update: updates 0-1 cover pass 0's first 4, update 2 takes its last
    # and the first of pass 1, which is another permutation
    stream = [i for step in range(5) for i in prompt_indices(step, 2, 5, seed=3)]
    assert sorted(stream[:5]) == [0, 1, 2, 3, 4] and sorted(stream[5:10]) == [0, 1, 2, 3, 4]
    assert stream[:5] != stream[5:10]
    assert stream == [problem_index(p, 5, 3) for p in range(10)]
    assert prompt_indices(1, 2, 5, seed=4) != prompt_indices(1, 2, 5, seed=3)


def test_minibatches_one_keeps_order_several_shuffle_each_epoch_alike_on_resume():
    (only,) = list(minibatch_order(6, 1, [7]))
    assert only.tolist() == [0, 1, 2, 3, 4, 5]
    parts = list(minibatch_order(6, 3, [7, 8]))  # 2 epochs x 3 minibatches of 2 rows
    assert len(parts) == 6 and all(len(p) == 2 for p in parts)
    assert sorted(torch.cat(parts[:3]).tolist()) == sorted(torch.cat(parts[3:]).tolist()) == list(range(6))
    # each epoch its own shuffle
    assert torch.cat(parts[:3]).tolist() != torch.cat(parts[3:]).tolist()
    # a pure function
    assert [p.tolist() for p in minibatch_order(6, 3, [7, 8])] == [p.tolist() for p in parts]


# ---- KL estimators ----------------------------------------------------------------------------------------------
P = torch.tensor([0.5, 0.3, 0.2])
Q = torch.tensor([0.25, 0.25, 0.5])
KL_PQ = 0.5 * math.log(2.0) + 0.3 * math.log(1.2) + 0.2 * math.log(0.4)  # sum p log p/q


def test_kl_estimators_single_sample():
    logp, ref = torch.tensor(math.log(0.5)), torch.tensor(math.log(0.25))
    assert kl_k1(logp, ref).item() == pytest.approx(math.log(2.0))
    assert kl_k2(logp, ref).item() == pytest.approx(0.5 * math.log(2.0) ** 2)
    # r - 1 - log r, r = q/p = 0.5
    assert kl_k3(logp, ref).item() == pytest.approx(0.5 - 1 - math.log(0.5))


def test_kl_estimate_dispatches_by_name():
    logp, ref = torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -1.0])
    for name, fn in (("k1", kl_k1), ("k2", kl_k2), ("k3", kl_k3)):
        torch.testing.assert_close(kl_estimate(logp, ref, name), fn(logp, ref))
    # k1 0.5 and -1; k2 0.125 and 0.5; k3 e^-0.5 - 1 + 0.5 and e^1 - 1 - 1
    torch.testing.assert_close(kl_estimate(logp, ref, "k2"), torch.tensor([0.125, 0.5]))
    torch.testing.assert_close(kl_estimate(logp, ref, "k3"),
                               torch.tensor([math.exp(-0.5) - 0.5, math.e - 2]))


def test_kl_estimators_expectations_match_closed_forms():
    # Exact expectations under x ~ p (a weighted sum over the 3 outcomes, no sampling noise).
    logp, ref = P.log(), Q.log()
    assert (P * kl_k1(logp, ref)).sum().item() == pytest.approx(KL_PQ)
    # E_p[q/p] = 1, so E[k3] = KL
    assert (P * kl_k3(logp, ref)).sum().item() == pytest.approx(KL_PQ)
    second_moment = 0.5 * (0.5 * math.log(2.0) ** 2 + 0.3 * math.log(1.2) ** 2 + 0.2 * math.log(0.4) ** 2)
    assert (P * kl_k2(logp, ref)).sum().item() == pytest.approx(second_moment)
    assert (kl_k3(logp, ref) >= 0).all()


# ---- masks ----------------------------------------------------------------------------------------------------
def test_masked_mean_and_whiten():
    x = torch.tensor([[1.0, 2.0, 100.0], [3.0, 100.0, 100.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert masked_mean(x, mask).item() == pytest.approx(2.0)
    torch.testing.assert_close(masked_mean(x, mask, dim=1), torch.tensor([1.5, 3.0]))
    w = masked_whiten(x, mask)
    # values 1, 2, 3: mean 2, unbiased variance 1 -> -1, 0, 1; padding stays 0 however large it was
    torch.testing.assert_close(w, torch.tensor([[-1.0, 0.0, 0.0], [1.0, 0.0, 0.0]]), atol=1e-6,
                               rtol=0)
    assert masked_mean(x, torch.zeros_like(mask)).item() == 0.0
    # OpenR's form, eps on the std: the same away from 0 variance, and 0 (not noise) for equal
    # values
    torch.testing.assert_close(masked_whiten(x, mask, eps_on_std=True), w, atol=1e-6, rtol=0)
    same = masked_whiten(torch.tensor([[0.3, 0.3]]), torch.ones(1, 2), eps_on_std=True)
    assert same.abs().max().item() == 0.0
    # TRL's reward whitening keeps the mean: 1, 2, 3 -> 1, 2, 3 (mean 2, std 1)
    torch.testing.assert_close(masked_whiten(x, mask, shift_mean=False)[mask.bool()],
                               torch.tensor([1.0, 2.0, 3.0]),
                               atol=1e-6, rtol=0)


def test_explained_variance():
    returns = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    mask = torch.ones(1, 4)
    assert explained_variance(returns, returns, mask) == pytest.approx(1.0)
    assert explained_variance(torch.full_like(returns, 2.5), returns, mask) == pytest.approx(0.0)
