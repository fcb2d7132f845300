"""common/models/sampler.py, the plain sampler: prompts as token ids, the seeded per-row draw by hand,
stop strings and EOS, and log-probs that the training forward reproduces."""

import pytest
import torch

from common.models.hf import KV_CACHE
from common.models.logprobs import token_logprobs
from common.models.loading import load_policy, load_tokenizer
from common.models.sampler import (_hash32, encode_prompts, generate, inverse_cdf, key_uniforms, left_pad,
                            render_prompt, row_keys, row_uniforms, uniform_table)
from sampling import fast_generate


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny-random")


@pytest.fixture(scope="module")
def tiny():
    return load_policy("tiny-random")


def test_render_prompt_continues_a_partial_assistant_message(tok):
    messages = [{"role": "user", "content": "What is 2 + 3?"}]
    head = render_prompt(tok, messages)
    assert head.endswith("<|im_start|>assistant\n")
    partial = render_prompt(tok,
                            messages + [{"role": "assistant", "content": "Step 1: 2 + 3 = 5\n"}])
    # the step boundary survives exactly, with no end-of-turn token after it
    assert partial == head + "Step 1: 2 + 3 = 5\n"
    assert render_prompt(tok, "Question: 1 + 1\nAnswer:") == "Question: 1 + 1\nAnswer:"


def test_left_pad():
    ids, mask = left_pad([[5, 6, 7], [8]], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]


@pytest.mark.parametrize("sampler", [generate, fast_generate])
def test_generation_logprobs_match_training_forward(tok, tiny, sampler):
    prompts = encode_prompts(tok,
                             [[{"role": "user", "content": "hi"}],
                              [{"role": "user", "content": "a longer prompt"}]])
    gen = sampler(tiny, tok, prompts, 10, temperature=0.7, top_p=0.9, seeds=[1, 2])
    ids, mask = gen.sequences()
    lp, _ = token_logprobs(tiny, ids, mask, gen.response_ids.shape[1], temperature=0.7)
    m = gen.response_mask.bool()
    torch.testing.assert_close(lp[m], gen.logprobs[m], atol=1e-4, rtol=0)
    # the random model never says EOS in 10 tokens
    assert gen.truncated.all() and not gen.finished.any()
    assert gen.response_mask.sum().item() == 20


@pytest.mark.parametrize("sampler", [generate, fast_generate])
def test_samples_depend_on_the_row_seed_not_the_batch(tok, tiny, sampler):
    p = encode_prompts(tok, ["one", "two two", "three three three"])
    together = sampler(tiny, tok, p, 6, temperature=1.0, seeds=[10, 11, 12]).response_ids
    alone = sampler(tiny, tok, p[2:], 6, temperature=1.0, seeds=[12]).response_ids
    assert together[2].tolist() == alone[0].tolist()
    other_seed = sampler(tiny, tok, p[2:], 6, temperature=1.0, seeds=[13]).response_ids
    assert other_seed[0].tolist() != alone[0].tolist()


def test_inverse_cdf_draws_by_hand():
    probs = torch.tensor([[0.25, 0.75]])
    # cdf [0.25, 1.0]: the first token whose cumulative probability exceeds u
    assert [inverse_cdf(probs, torch.tensor([u])).item() for u in (0.0, 0.2, 0.25, 0.999)] == [0, 0, 1, 1]
    # zero-probability tokens are never drawn, even at the largest uniform (1 - 2^-32)
    zeros = torch.tensor([[0.5, 0.0, 0.5, 0.0]]).expand(2, 4)
    assert inverse_cdf(zeros, torch.tensor([0.5, 1 - 2**-32], dtype=torch.float64)).tolist() == [2, 2]
    # top-p leaves a mass below 1 (here 0.4): thresholds scale with it, u 0.74 -> 0.296 < 0.3
    kept = torch.tensor([[0.0, 0.3, 0.0, 0.1], [0.0, 0.3, 0.0, 0.1]])
    assert inverse_cdf(kept, torch.tensor([0.74, 0.76])).tolist() == [1, 3]


def _lowbias32(x):  # the same hash in plain Python integer arithmetic
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    return x ^ (x >> 16)


def test_hash_matches_32_bit_arithmetic_and_uniforms_are_uniform():
    xs = [0, 1, 2, 12345, 0x7FFFFFFF, 0x80000000, 0xDEADBEEF, 0xFFFFFFFF]
    assert _hash32(torch.tensor(xs)).tolist() == [_lowbias32(x) for x in xs]
    seeds = torch.arange(5000, dtype=torch.long) * 1_000_003 + 2**40  # seeds above 2^32 too
    u = torch.stack([row_uniforms(seeds, t) for t in range(8)])  # [8, 5000]
    assert u.min() >= 0 and u.max() < 1 and len(torch.unique(u)) == u.numel()
    # 40,000 draws: each tenth of [0, 1) holds 4,000 +- 4 sigma (about 240), the mean 0.5 +- 0.006
    counts = torch.histc(u.float(), bins=10, min=0, max=1)
    assert (counts - 4000).abs().max() < 240 and abs(u.mean().item() - 0.5) < 0.006
    # consecutive tokens of a row are not correlated
    assert abs(torch.corrcoef(torch.stack([u[:-1].flatten(), u[1:].flatten()]))[0, 1].item()) < 0.02
    # the sampler's frequencies follow the probabilities
    tokens = inverse_cdf(torch.tensor([[0.1, 0.2, 0.3, 0.4]]).expand(u.numel(), 4), u.flatten())
    freq = torch.bincount(tokens, minlength=4) / u.numel()
    torch.testing.assert_close(freq, torch.tensor([0.1, 0.2, 0.3, 0.4]), atol=0.01, rtol=0)


def test_row_uniforms_by_hand_and_from_keys():
    # the stream every seeded run draws from: a hash of the seed's two halves, then of the index
    seeds = [0, 7, 2**32 + 5, 2**62 + 12345]
    for t in (0, 1, 511):
        expected = []
        for s in seeds:
            key = _lowbias32((s & 0xFFFFFFFF) ^ _lowbias32((s >> 32) ^ 0x9E3779B9))
            expected.append(_lowbias32(key ^ _lowbias32(t ^ 0x632BE5AB)) / 2**32)
        got = row_uniforms(torch.tensor(seeds), t)
        assert got.dtype == torch.float64 and got.tolist() == expected
        assert key_uniforms(row_keys(torch.tensor(seeds)), t).tolist() == expected
        # what generate draws from: the whole table hashed at once, the same bits
        assert uniform_table(torch.tensor(seeds), 512)[:, t].tolist() == expected


# a row that ended (EOS at step 2) leaves the forward batch, in both samplers
@pytest.mark.parametrize("sampler,sizes", [(generate, [2, 2, 1, 1]), (fast_generate, [2, 2, 1, 1])])
def test_stop_strings_and_eos_end_rows_independently(tok, sampler, sizes):
    # A model that always predicts the same fixed token sequence, so the stopping logic is checked
    # exactly: row 0 says "a", "\n", ... ; row 1 says "b", EOS.
    newline = tok("\n", add_special_tokens=False)["input_ids"][-1]
    a, b = tok("a", add_special_tokens=False)["input_ids"][0], tok("b",
                                                                   add_special_tokens=False)["input_ids"][0]
    script = {0: [a, newline, a, a], 1: [b, tok.eos_token_id, b, b]}

    class Cache:  # the step count and which original rows are still in the batch
        def __init__(self, rows):
            self.t, self.rows = 0, rows

        def batch_select_indices(self, keep):
            self.rows = [self.rows[i] for i in keep.tolist()]

    batch_sizes = []

    class Scripted(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))
            self.config = type("C", (), {})()

        def forward(self, input_ids, attention_mask, position_ids, use_cache=True, **kw):
            past = kw.get(KV_CACHE)
            cache = Cache([0, 1]) if past is None else past
            if past is not None:
                cache.t += 1
            assert input_ids.shape[0] == attention_mask.shape[0] == len(cache.rows)
            batch_sizes.append(len(cache.rows))
            logits = torch.full((len(cache.rows), 1, len(tok)), -1e4)
            for i, row in enumerate(cache.rows):
                logits[i, 0, script[row][cache.t]] = 0.0
            return type("O", (), {"logits": logits, KV_CACHE: cache})()

    gen = sampler(Scripted(), tok, [[1], [1, 2]], 4, temperature=0, stop_strings=("\n",))
    # all rows done after 2 tokens: no wasted columns
    assert gen.response_mask.tolist() == [[1, 1], [1, 1]]
    assert gen.finished.tolist() == [True, True]
    assert gen.texts(tok) == ["a\n", "b"]  # the EOS token is dropped from the text
    gen = sampler(Scripted(), tok, [[1], [1, 2]], 4, temperature=0)
    assert gen.response_mask.tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert gen.truncated.tolist() == [True, False]
    assert batch_sizes[-4:] == sizes
    # spans tokens
    gen = sampler(Scripted(), tok, [[1], [1, 2]], 4, temperature=0, stop_strings=("a\na",))
    assert gen.response_mask.tolist() == [[1, 1, 1], [1, 1, 0]]
