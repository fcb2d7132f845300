"""common/models/logprobs.py and its speedups (common/models/fast/logprobs.py, common/models/fast/prompts.py): token
log-probs against cross-entropy, under left padding, chunked, and with the prompt tokens that rows
share run once; the fast path gives the plain forward's numbers and gradients."""

from unittest.mock import patch

import pytest
import torch
import torch.nn.functional as F

from common.models.fast.logprobs import fast_token_logprobs
from common.models.fast.prompts import identical_rows, shared_prefix_len
from common.models.logprobs import token_logprobs


# ---- token log-probs ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny():
    from common.models.loading import load_policy

    return load_policy("tiny-random")


@pytest.mark.parametrize("fast", [False, True], ids=["plain", "fast"])
def test_token_logprobs_match_cross_entropy(tiny, fast):
    torch.manual_seed(0)
    ids = torch.randint(3, 1000, (3, 10))
    mask = torch.ones_like(ids)
    R = 4
    lp, ent = token_logprobs(tiny, ids, mask, R, temperature=0.7, fast=fast)
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


def test_the_fast_forward_gives_the_plain_numbers_and_gradients(tiny):
    # A micro-batch as the files make it: a GRPO group of 3 rows (one prompt) and 2 rows of other
    # prompts, all starting with the same 16-token preamble; responses of different lengths; and
    # columns of padding left of every prompt and right of every response (a longer rollout's).
    # The fast path cuts the columns, reads the group's prompt and the preamble once and runs the
    # head in chunks: on every real token its log-probs, entropies, hidden states and gradients are
    # those of the plain forward.
    torch.manual_seed(7)
    preamble, R = torch.randint(3, 1000, (16,)), 6
    questions = [torch.randint(3, 1000, (n,)) for n in (4, 4, 7)]
    prompts = [questions[0]] * 3 + questions[1:]
    P = 2 + 16 + max(len(q) for q in prompts)  # 2 columns of padding in every row
    lengths = [6, 2, 4, 5, 1]
    ids = torch.zeros(5, P + R + 3, dtype=torch.long)  # 3 columns of padding after every response
    mask = torch.zeros_like(ids)
    for row, (q, n) in enumerate(zip(prompts, lengths)):
        prompt = torch.cat([preamble, q])
        ids[row, P - len(prompt):P], mask[row, P - len(prompt):P] = prompt, 1
        ids[row, P:P + n], mask[row, P:P + n] = torch.randint(3, 1000, (n,)), 1
    real = mask[:, -(R + 3):].bool()
    out = {}
    for fast in (False, True):
        tiny.zero_grad()
        lp, ent, hidden = token_logprobs(tiny, ids, mask, R + 3, 0.7, return_hidden=True, fast=fast)
        (lp * real).sum().backward()
        grads = [p.grad.clone() for p in tiny.parameters()]
        out[fast] = (lp[real], ent[real], hidden[mask.bool()], grads)
    for plain, fast in zip(out[False][:3], out[True][:3]):
        torch.testing.assert_close(fast, plain, atol=2e-5, rtol=0)
    for plain, fast in zip(out[False][3], out[True][3]):
        torch.testing.assert_close(fast, plain, atol=1e-5, rtol=1e-4)
    assert sum(g.abs().sum() for g in out[False][3]) > 0


def test_token_logprobs_chunking_and_gradients_agree(tiny):
    torch.manual_seed(2)
    ids = torch.randint(3, 1000, (4, 8))
    mask = torch.ones_like(ids)
    grads = []
    for chunk in (1, 4):
        tiny.zero_grad()
        lp, _ = fast_token_logprobs(tiny, ids, mask, 5, chunk_rows=chunk)
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
        with patch("common.models.fast.prompts.MIN_SHARED_PREFIX", min_shared):
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
    from common.models.loading import load_critic

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
