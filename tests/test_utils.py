"""Numeric helpers of common/utils.py against hand-worked values and closed forms."""

import math
from unittest.mock import patch

import pytest
import torch
import torch.nn.functional as F

from common.utils import (discounted_returns, explained_variance, identical_rows, kl_estimate,
                          kl_k1, kl_k2,
                          kl_k3, masked_mean, masked_whiten, minibatches, problem_index,
                          prompt_indices,
                          shared_prefix_len, step_gae, token_gae, token_logprobs)


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
    (only,) = list(minibatches(6, 1, [7]))
    assert only.tolist() == [0, 1, 2, 3, 4, 5]
    parts = list(minibatches(6, 3, [7, 8]))  # 2 epochs x 3 minibatches of 2 rows
    assert len(parts) == 6 and all(len(p) == 2 for p in parts)
    assert sorted(torch.cat(parts[:3]).tolist()) == sorted(torch.cat(parts[3:]).tolist()) == list(range(6))
    # each epoch its own shuffle
    assert torch.cat(parts[:3]).tolist() != torch.cat(parts[3:]).tolist()
    # a pure function
    assert [p.tolist() for p in minibatches(6, 3, [7, 8])] == [p.tolist() for p in parts]


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


# ---- token log-probs ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny():
    from common.models import load_policy

    return load_policy("tiny-random")


def test_token_logprobs_match_cross_entropy(tiny):
    torch.manual_seed(0)
    ids = torch.randint(3, 1000, (3, 10))
    mask = torch.ones_like(ids)
    R = 4
    lp, ent = token_logprobs(tiny, ids, mask, R, temperature=0.7)
    logits = tiny(input_ids=ids, attention_mask=mask).logits[:, -R - 1:-1] / 0.7  # one-token shift
    expected = -F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, -R:].reshape(-1),
                                reduction="none")
    torch.testing.assert_close(lp, expected.view(3, R), atol=1e-5, rtol=0)
    p = logits.softmax(-1)
    torch.testing.assert_close(ent, -(p * p.log()).sum(-1), atol=1e-4, rtol=0)


def test_token_logprobs_invariant_to_left_padding(tiny):
    torch.manual_seed(1)
    short = torch.randint(3, 1000, (1, 6))
    long = torch.randint(3, 1000, (1, 9))
    alone, _ = token_logprobs(tiny, short, torch.ones_like(short), 3)
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), short], dim=1)  # 3 pads on the left
    batch = torch.cat([padded, long])
    mask = torch.cat([torch.tensor([[0, 0, 0] + [1] * 6]), torch.ones(1, 9, dtype=torch.long)])
    together, _ = token_logprobs(tiny, batch, mask, 3)
    torch.testing.assert_close(together[:1], alone, atol=1e-5, rtol=0)


def test_token_logprobs_cut_all_padding_columns_and_zero_fill_them(tiny):
    # A micro-batch padded for a longer rollout: 2 extra pad columns on the left of every prompt and
    # 3 on the right of every response. The real tokens' log-probs and hidden states must be those
    # of the unpadded batch, and the pad columns come back as 0.
    torch.manual_seed(3)
    ids = torch.randint(3, 1000, (2, 7))  # 4 prompt + 3 response tokens
    mask = torch.ones_like(ids)
    lp, ent, hidden = token_logprobs(tiny, ids, mask, 3, return_hidden=True)
    pad_ids = F.pad(ids, (2, 3))
    pad_mask = F.pad(mask, (2, 3))
    lp_p, ent_p, hidden_p = token_logprobs(tiny, pad_ids, pad_mask, 6, return_hidden=True)
    assert lp_p.shape == (2, 6) and hidden_p.shape[:2] == (2, 12)
    torch.testing.assert_close(lp_p[:, :3], lp, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent_p[:, :3], ent, atol=1e-5, rtol=0)
    torch.testing.assert_close(hidden_p[:, 2:9], hidden, atol=1e-5, rtol=0)
    assert lp_p[:, 3:].abs().sum() == 0 and hidden_p[:, :2].abs().sum() == 0 and hidden_p[:, 9:].abs().sum() == 0


def test_token_logprobs_chunking_and_gradients_agree(tiny):
    torch.manual_seed(2)
    ids = torch.randint(3, 1000, (4, 8))
    mask = torch.ones_like(ids)
    grads = []
    for chunk in (1, 4):
        tiny.zero_grad()
        lp, _ = token_logprobs(tiny, ids, mask, 5, chunk_rows=chunk)
        lp.sum().backward()
        grads.append(tiny.model.embed_tokens.weight.grad.clone())
    # Same gradient up to float summation order.
    assert ((grads[0] - grads[1]).norm() / grads[0].norm()).item() < 1e-5


def test_identical_rows_on_a_hand_example():
    # rows 0, 2, 3 are one prompt, row 1 another (same tokens, different padding), row 4 a third
    x = torch.tensor([[0, 5, 6, 0, 1, 1], [5, 6, 0, 1, 1, 0], [0, 5, 6, 0, 1, 1],
                      [0, 5, 6, 0, 1, 1], [0, 7, 6, 0, 1, 1]])
    first, inverse = identical_rows(x)
    assert len(first) == 3
    torch.testing.assert_close(x[first][inverse], x)
    assert first.tolist() == [0, 1, 4] and inverse.tolist() == [0, 1, 0, 0, 2]
    # all distinct: the identity, whatever the values' order
    first, inverse = identical_rows(x[[4, 1, 0]])
    assert first.tolist() == inverse.tolist() == [0, 1, 2]


def test_token_logprobs_share_identical_prompts_exactly(tiny):
    # Rows 0 and 1 share a prompt (run once, its keys/values copied), row 2 has its own. Log-probs
    # and gradients must equal those of each row run on its own.
    torch.manual_seed(4)
    prompt_a, prompt_b = torch.randint(3, 1000, (1, 5)), torch.randint(3, 1000, (1, 5))
    responses = torch.randint(3, 1000, (3, 4))
    ids = torch.cat([torch.cat([prompt_a, prompt_a, prompt_b]), responses], dim=1)
    mask = torch.ones_like(ids)
    mask[1, -1] = 0  # a shorter response in the shared group
    tiny.zero_grad()
    lp, _ = token_logprobs(tiny, ids, mask, 4)
    (lp * mask[:, -4:]).sum().backward()
    shared_grad = tiny.model.layers[0].self_attn.k_proj.weight.grad.clone()
    tiny.zero_grad()
    alone = []
    for row in range(3):
        lp_row, _ = token_logprobs(tiny, ids[row:row + 1], mask[row:row + 1], 4)
        (lp_row * mask[row:row + 1, -4:]).sum().backward()
        alone.append(lp_row)
    torch.testing.assert_close(lp * mask[:, -4:], torch.cat(alone) * mask[:, -4:], atol=1e-5,
                               rtol=0)
    torch.testing.assert_close(shared_grad, tiny.model.layers[0].self_attn.k_proj.weight.grad,
                               atol=1e-5, rtol=1e-4)


def test_shared_prefix_len_on_a_hand_example():
    # three left-padded prompts (pad id 0): [7 8 9 4], [7 8 9 5 6], [7 8 1]: 2 shared tokens
    ids = torch.tensor([[0, 7, 8, 9, 4, 11], [7, 8, 9, 5, 6, 12], [0, 0, 7, 8, 1, 13]])
    mask = (ids != 0).long()
    assert shared_prefix_len(ids, mask, 5) == 2
    assert shared_prefix_len(ids[:2], mask[:2], 5) == 3
    assert shared_prefix_len(ids[:1], mask[:1], 5) == 0  # one row: nothing to share
    holed = mask.clone()
    holed[1, 2] = 0  # padding inside a prompt: not one run of padding then tokens
    assert shared_prefix_len(ids, holed, 5) == 0


def test_token_logprobs_share_a_prefix_of_prompts_of_different_lengths(tiny):
    # A 12-token preamble ahead of questions of 3, 5 and 1 tokens, so each row's left padding puts
    # the preamble in other columns. It runs once; log-probs, hidden states and gradients must be
    # those of the plain forward (the sharing switched off).
    torch.manual_seed(5)
    preamble, R = torch.randint(3, 1000, (12,)), 4
    prompts = [torch.cat([preamble, torch.randint(3, 1000, (n,))]) for n in (3, 5, 1)]
    P = max(len(p) for p in prompts)
    ids = torch.stack([F.pad(torch.cat([p, torch.randint(3, 1000, (R,))]), (P - len(p), 0))
                       for p in prompts])
    mask = torch.stack([F.pad(torch.ones(len(p) + R, dtype=torch.long), (P - len(p), 0))
                        for p in prompts])
    mask[2, -1] = 0  # a response that ended early
    assert shared_prefix_len(ids, mask, P) == 12
    out = []
    for min_shared in (8, 10**9):
        with patch("common.utils.MIN_SHARED_PREFIX", min_shared):
            tiny.zero_grad()
            lp, _, hidden = token_logprobs(tiny, ids, mask, R, return_hidden=True)
            (lp * mask[:, -R:]).sum().backward()
            out.append((lp * mask[:, -R:], hidden[mask.bool()],
                        tiny.model.layers[0].self_attn.k_proj.weight.grad.clone()))
    (lp, hidden, grad), (lp_plain, hidden_plain, grad_plain) = out
    torch.testing.assert_close(lp, lp_plain, atol=1e-5, rtol=0)
    torch.testing.assert_close(hidden, hidden_plain, atol=1e-5, rtol=0)
    torch.testing.assert_close(grad, grad_plain, atol=1e-5, rtol=1e-4)
    assert grad.abs().sum() > 0


def test_critic_shares_a_prompt_prefix_and_gives_the_plain_values():
    from common.models import load_critic

    torch.manual_seed(6)
    critic = load_critic("tiny-random")
    torch.nn.init.normal_(critic.head.net[-1].weight)  # V starts at 0: make it read the states
    preamble = torch.randint(3, 1000, (16,))
    # prompts of 17, 19 and 19 tokens (row 0 left-padded by 2) that start with the same 16, then 3
    # response tokens
    ids = torch.stack([F.pad(torch.cat([preamble, torch.randint(3, 1000, (n + 3,))]), (3 - n, 0))
                       for n in (1, 3, 3)])
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    assert shared_prefix_len(ids, mask, 19) == 16
    plain = critic(ids, mask)
    shared = critic(ids, mask, prompt_len=19)
    torch.testing.assert_close(shared[mask.bool()], plain[mask.bool()], atol=1e-5, rtol=0)
    assert plain[mask.bool()].std() > 0
