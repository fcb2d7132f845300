"""common/models/fast/decoding.py and the speedups of common/fast_*.py: each alone, and all together,
draw the tokens of the plain sampler (common/models/sampler.py) with log-probs within float rounding; and
each does what it says (reads a prompt once, appends in place, packs weights once, ...). Stop strings
and EOS, for both samplers: tests/test_sampler.py."""

import collections
import warnings
from dataclasses import fields
from unittest.mock import patch

import pytest
import torch

from common.models.fast.attention import _decode_attention
from common.models.fast import compile as fast_compile
from common.models.fast.compile import _cache_lengths, compile_decoding
from common.models.fast.fused import _fused_projections
from common.models.fast.graphs import CapturedStep, capture_decoding
from common.models.fast.kv import _append_in_place
from common.models.fast.linears import _onednn_linears, _onednn_works
from common.models.fast.prompts import PrefixCache, _common_prefix
from common.models.fast.decoding import _KEPT_FUSED, Speedups
from common.models.hf import KV_CACHE
from common.models.logprobs import token_logprobs
from common.models.loading import load_policy, load_tokenizer
from common.models.sampler import encode_prompts, generate
from sampling import fast_generate


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny-random")


@pytest.fixture(scope="module")
def tiny():
    return load_policy("tiny-random")


def only(*names):
    """Speedups with these on and the rest off."""
    return Speedups(**{f.name: f.name in names for f in fields(Speedups)})


@pytest.mark.parametrize("speedups", [*[only(f.name) for f in fields(Speedups)], Speedups()],
                         ids=[*[f.name for f in fields(Speedups)], "all"])
def test_each_speedup_alone_and_all_together_draw_what_the_plain_sampler_draws(tiny, tok, speedups):
    # Prompts with a 20-token prefix in common, a GRPO group (rows 0-2 share a prompt), rows that
    # stop at different tokens ("e" or EOS) and others cut at 16 tokens, each with its own seed.
    torch.manual_seed(2)
    shared = torch.randint(10, 400, (20,)).tolist()
    own = [shared + torch.randint(10, 400, (n,)).tolist() for n in (3, 9, 5)]
    prompts = [own[0], own[0], own[0], own[1], own[2]]
    kw = dict(temperature=1.0, top_p=0.9, stop_strings=("e",), seeds=[11, 12, 13, 14, 15])
    plain = generate(tiny, tok, prompts, 16, **kw)
    assert len(set(plain.response_mask.sum(1).tolist())) > 1 and plain.finished.any()
    fast = fast_generate(tiny, tok, prompts, 16, speedups=speedups, **kw)
    assert fast.response_ids.tolist() == plain.response_ids.tolist()
    assert fast.response_mask.tolist() == plain.response_mask.tolist()
    assert fast.finished.tolist() == plain.finished.tolist()
    torch.testing.assert_close(fast.logprobs, plain.logprobs, atol=1e-5, rtol=0)


def test_checking_for_finished_rows_every_8_tokens_draws_the_same_responses(tok, tiny):
    # a GPU reads which rows are done every 8 tokens, not every token (a host sync): finished rows
    # then decode a few tokens more, masked out, and leave the batch later; the responses and their
    # log-probs are those of checking every token
    p = encode_prompts(tok, ["one", "two two", "three three three", "four"])
    kw = dict(temperature=1.0, seeds=[5, 6, 7, 8], stop_strings=("e",))
    every = fast_generate(tiny, tok, p, 20, check_every=1, **kw)
    lengths = every.response_mask.sum(1).tolist()
    assert len(set(lengths)) > 1 and every.finished.any()  # rows stop at different tokens
    for n in (3, 8):
        sparse = fast_generate(tiny, tok, p, 20, check_every=n, **kw)
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
        gen = fast_generate(tiny, tok, p, 10, temperature=1.0, seeds=[1, 2],
                            autocast_dtype=torch.bfloat16,
                            speedups=Speedups(fused_projections=False))
    assert gen.response_mask.sum().item() == 20  # 10 decode steps for each row
    assert len(linear) == 15 and casts == collections.Counter({name: 1 for name in linear.values()})
    # fast_fused.py stacks q/k/v and gate/up in bf16 once per rollout: autocast never casts them
    casts.clear()
    with CountWeightCasts():
        fast_generate(tiny, tok, p, 10, temperature=1.0, seeds=[1, 2],
                      autocast_dtype=torch.bfloat16)
    unfused = [n for n in linear.values() if n.split(".")[-1] in ("o_proj", "down_proj", "lm_head")]
    assert len(unfused) == 5 and casts == collections.Counter({name: 1 for name in unfused})


def test_identical_prompts_share_one_prefill(tiny, tok):
    # A GRPO group is G copies of one prompt: the prefill runs once per distinct prompt, and each
    # row's samples are still those it draws alone.
    p = encode_prompts(tok, ["same question", "other"])
    shapes = []
    hook = tiny.register_forward_pre_hook(lambda m, a,
                                          kw: shapes.append(tuple(kw["input_ids"].shape)),
                                          with_kwargs=True)
    try:
        shared = fast_generate(tiny, tok, [p[0], p[0], p[1]], 5, temperature=1.0,
                               seeds=[1, 2, 3]).response_ids
    finally:
        hook.remove()
    assert shapes[0][0] == 2 and all(s == (3, 1) for s in shapes[1:])
    for row, (prompt, seed) in enumerate([(p[0], 1), (p[0], 2), (p[1], 3)]):
        alone = fast_generate(tiny, tok, [prompt], 5, temperature=1.0, seeds=[seed]).response_ids
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
        reused = fast_generate(tiny, tok, prompts, 6, **kw)
        assert shapes[:2] == [(1, 20), (4, 9)]
        shapes.clear()
        full = generate(tiny, tok, prompts, 6, **kw)  # the plain sampler
        assert shapes[0] == (4, 29)
        shapes.clear()
        # no prefix of 16 tokens or more shared by all: every prompt is read in full
        fast_generate(tiny, tok, prompts + [torch.randint(10, 400, (12,)).tolist()], 2,
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
    first = fast_generate(tiny, tok, prompts, 8, seeds=[1, 2, 3], prefix_cache=cache, **kw)
    lengths = first.response_mask.sum(1).tolist()
    assert len(set(lengths)) > 1  # rows left the batch at different tokens
    # each row stored: its prompt and all its response tokens but the last
    assert sorted(len(ids) for ids, _ in cache.entries) == sorted(
        len(p) + n - 1 for p, n in zip(prompts, lengths))
    nxt = [p + ids[:n].tolist() + [13, 14]
           for p, ids, n in zip(prompts, first.response_ids, lengths)]
    shapes, hook = _forward_shapes(tiny)
    try:
        second = fast_generate(tiny, tok, nxt, 8, seeds=[4, 5, 6], prefix_cache=cache, **kw)
    finally:
        hook.remove()
    assert shapes[0] == (3, 3)
    # the entries read were replaced by the rows' longer sequences
    assert len(cache.entries) == 3
    full = generate(tiny, tok, nxt, 8, seeds=[4, 5, 6], temperature=1.0, stop_strings=("e",))
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
    eager = fast_generate(twin, tok, prompts, 12, **kw)
    assert len(set(eager.response_mask.sum(1).tolist())) > 1  # rows finish at different tokens
    compile_decoding(model, backend=backend)
    for step in range(2):
        # a rollout's PrefixCache or none: the fused projections are the model's own, the same
        # Linear objects every call (new ones would make the compiled step compile again)
        cache = PrefixCache() if step else None
        compiled = fast_generate(model, tok, prompts, 12, prefix_cache=cache, **kw)
        fused = [f for _, f, _ in _KEPT_FUSED[model].values()]
        assert len(fused) == 4 and (step == 0 or fused == held)
        held = fused
        assert compiled.response_ids.tolist() == eager.response_ids.tolist()
        assert compiled.response_mask.tolist() == eager.response_mask.tolist()
        # fp32 rounding: inductor fuses the attention over the static cache its own way (1.1e-5)
        torch.testing.assert_close(compiled.logprobs, eager.logprobs, atol=3e-5, rtol=0)
        with torch.no_grad():  # the same step on both
            for a, b in zip(model.parameters(), twin.parameters()):
                noise = torch.randn(a.shape, generator=torch.Generator().manual_seed(a.numel()))
                a.add_(noise), b.add_(noise)
        eager_next = fast_generate(twin, tok, prompts, 12, **kw)
        assert eager_next.response_ids.tolist() != eager.response_ids.tolist()
        eager = eager_next


def test_the_captured_step_draws_the_tokens_of_eager_decoding(tok):
    # The GPU default (common/models/fast/graphs.py): a static KV cache whose step builds its own 4D mask
    # from the prompts' padding and the cache's count of written columns, so that a CUDA graph can
    # replay it. Run here without a graph (graphs=False), the same function: eager decoding's
    # tokens, over two rollouts (a new cache: new buffers) and after an in-place weight update.
    torch.manual_seed(0)
    prompts = [torch.randint(10, 400, (n,)).tolist() for n in (7, 11, 4, 9)]
    kw = dict(temperature=1.0, seeds=[1, 2, 3, 4], stop_strings=("e",))
    model, twin = load_policy("tiny-random"), load_policy("tiny-random")
    capture_decoding(model, graphs=False)
    step = fast_compile._COMPILED[model]
    assert isinstance(step, CapturedStep) and step.graph is None
    caches = []
    for _ in range(2):
        eager = fast_generate(twin, tok, prompts, 12, **kw)
        assert len(set(eager.response_mask.sum(1).tolist())) > 1  # rows end at different tokens
        static = fast_generate(model, tok, prompts, 12, **kw)
        caches.append(step.cache())
        assert static.response_ids.tolist() == eager.response_ids.tolist()
        assert static.response_mask.tolist() == eager.response_mask.tolist()
        torch.testing.assert_close(static.logprobs, eager.logprobs, atol=5e-5, rtol=0)
        # the cache: prompts left-padded to 11 columns, room for 12 tokens, in steps of 128
        assert step.padding.shape == (4, 1, 1, 128)
        with torch.no_grad():  # the same step on both
            for a, b in zip(model.parameters(), twin.parameters()):
                noise = torch.randn(a.shape, generator=torch.Generator().manual_seed(a.numel()))
                a.add_(noise), b.add_(noise)
    assert caches[0] is None  # the first rollout's cache was let go: the step holds it weakly


def test_capture_decoding_leaves_what_it_cannot_capture_eager(monkeypatch):
    # On a CPU (nothing to capture), under --compile (it wins), for a sliding-window model (its
    # cache is not one static block) and for attention that reads an additive mask (eager), the
    # model decodes as before: nothing is registered.
    model = load_policy("tiny-random")
    assert capture_decoding(model) is model and model not in fast_compile._COMPILED
    compile_decoding(model, backend="eager")
    capture_decoding(model, graphs=False)
    assert not isinstance(fast_compile._COMPILED[model], CapturedStep)
    sliding = load_policy("tiny-random")
    monkeypatch.setattr(sliding.config, "sliding_window", 4, raising=False)
    monkeypatch.setattr(sliding.config, "use_sliding_window", True, raising=False)
    monkeypatch.setattr(sliding.config, "layer_types", None, raising=False)
    capture_decoding(sliding, graphs=False)
    assert sliding not in fast_compile._COMPILED
    additive = load_policy("tiny-random")
    additive.config._attn_implementation = "eager"
    capture_decoding(additive, graphs=False)
    assert additive not in fast_compile._COMPILED
    additive.config._attn_implementation = "sdpa"
    capture_decoding(additive, graphs=False)
    assert isinstance(fast_compile._COMPILED[additive], CapturedStep)


def test_cache_lengths_by_hand():
    # steps of 128: a 150-token prompt and 512 new tokens fit in 768 positions; growing, the cache
    # starts at 256 (the prompt and its first token) and grows to 768
    assert _cache_lengths(150, 512, grow=False) == (768, 768)
    assert _cache_lengths(150, 512, grow=True) == (256, 768)
    assert _cache_lengths(127, 1, grow=True) == (128, 128)
    assert _cache_lengths(128, 1, grow=True) == (256, 256)


def test_a_growing_static_cache_draws_the_tokens_of_eager_decoding(tok):
    # Speedups(grow_static_cache=True) under --compile, in steps of 4 positions here: prompts of 7
    # and 11 tokens (left-padded to 11) start in a cache of 12 positions, which grows at the
    # responses' tokens 1, 5 and 9 (positions 12, 16 and 20) to 24. Tokens of eager decoding.
    torch.manual_seed(0)
    prompts = [torch.randint(10, 400, (n,)).tolist() for n in (7, 11)]
    kw = dict(temperature=1.0, seeds=[1, 2])
    eager = fast_generate(load_policy("tiny-random"), tok, prompts, 12, **kw)
    model = compile_decoding(load_policy("tiny-random"), backend="aot_eager")
    lengths = []
    grown = fast_compile._grown_cache

    def counted(model, cache, length, filled):
        lengths.append((length, filled))
        return grown(model, cache, length, filled)

    with (patch("common.models.fast.compile.STATIC_CACHE_STEP", 4),
          patch("common.models.fast.decoding._grown_cache", counted)):
        compiled = fast_generate(model, tok, prompts, 12, speedups=Speedups(grow_static_cache=True),
                                 **kw)
    assert lengths == [(12, 12), (16, 16), (20, 20)]
    assert compiled.response_ids.tolist() == eager.response_ids.tolist()
    torch.testing.assert_close(compiled.logprobs, eager.logprobs, atol=3e-5, rtol=0)


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
            gen = fast_generate(tiny, tok, [p[0], p[0]], 3, temperature=1.0, seeds=[1, 2])
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


def test_decode_steps_append_keys_and_values_in_place_by_hand():
    from transformers import DynamicCache

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
    in_place = fast_generate(tiny, tok, p, 20, speedups=only("in_place_kv", "drop_finished"), **kw)
    assert len(set(in_place.response_mask.sum(1).tolist())) > 1
    concatenated = generate(tiny, tok, p, 20, **kw)  # the plain sampler: torch.cat
    assert in_place.response_ids.tolist() == concatenated.response_ids.tolist()
    assert in_place.response_mask.tolist() == concatenated.response_mask.tolist()
    torch.testing.assert_close(in_place.logprobs, concatenated.logprobs, atol=1e-6, rtol=0)


def test_decode_attention_reads_each_key_value_head_once_by_hand():
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
    import common.models.fast.attention as fast_attention

    assert tiny.config._attn_implementation == "sdpa" and tiny.config.num_key_value_heads == 2
    p = encode_prompts(tok, ["one", "two two", "three three three"])  # left padding: a mask
    kw = dict(temperature=1.0, seeds=[5, 6, 7])
    calls = collections.Counter()

    def counted(module, query, *args, **kwargs):
        calls[query.shape[2]] += 1
        return decode_attention(module, query, *args, **kwargs)

    decode_attention = fast_attention._decode_attention
    with patch("common.models.fast.attention._decode_attention", counted):
        packed = fast_generate(tiny, tok, p, 12, speedups=only("packed_gqa"), **kw)
    assert tiny.config._attn_implementation == "sdpa"  # restored
    assert calls[1] == 11 * 2 and set(calls) - {1}  # 11 decode steps (2 layers), the prefill
    plain = generate(tiny, tok, p, 12, **kw)  # transformers' SDPA
    assert packed.response_ids.tolist() == plain.response_ids.tolist()
    torch.testing.assert_close(packed.logprobs, plain.logprobs, atol=1e-6, rtol=0)


@pytest.mark.skipif(not _onednn_works(), reason="this torch build has no oneDNN packed linear")
def test_packed_linears_by_hand_packed_once_and_again_after_an_optimizer_step():
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


def test_fused_projections_by_hand_built_once_and_again_after_an_optimizer_step():
    # q, k, v: [[1, 0], [0, 1]], [[1, 1]], [[2, -1]]: x [3, 4] -> q [3, 4], k [7], v [2]
    attn = torch.nn.Module()
    attn.q_proj, attn.k_proj, attn.v_proj = (torch.nn.Linear(2, n, bias=False) for n in (2, 1, 1))
    with torch.no_grad():
        for layer, w in zip((attn.q_proj, attn.k_proj, attn.v_proj),
                            ([[1.0, 0.0], [0.0, 1.0]], [[1.0, 1.0]], [[2.0, -1.0]])):
            layer.weight.copy_(torch.tensor(w))
    x = torch.tensor([[[3.0, 4.0]]])
    matmuls = []
    store = {}
    with torch.no_grad(), _fused_projections(attn, True, store=store):
        (_, fused, _), = store.values()
        assert fused.weight.tolist() == [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [2.0, -1.0]]
        fused.register_forward_hook(lambda *a: matmuls.append(1))
        q, k, v = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
        assert (q.tolist(), k.tolist(), v.tolist()) == ([[[3.0, 4.0]]], [[[7.0]]], [[[2.0]]])
        assert len(matmuls) == 1  # one matmul for the three
        # a k_proj of another input (not the one q_proj read) runs its own matmul
        assert attn.k_proj(torch.tensor([[1.0, 2.0]])).tolist() == [[3.0]] and len(matmuls) == 1
    assert not any("forward" in vars(m) for m in attn.modules())  # restored
    with torch.no_grad(), _fused_projections(attn, True, store=store):  # same weights: reused
        assert store[(attn, ("q_proj", "k_proj", "v_proj"))][1] is fused
        assert fused.weight[2].tolist() == [1.0, 1.0]
    with torch.no_grad():
        attn.k_proj.weight.add_(1.0)  # an optimizer step writes in place: its version moves
    with torch.no_grad(), _fused_projections(attn, True, store=store):
        assert store[(attn, ("q_proj", "k_proj", "v_proj"))][1] is fused  # the same Linear...
        assert fused.weight[2].tolist() == [2.0, 2.0]  # ...with the new weight
        attn.q_proj(x)
        assert attn.k_proj(x).tolist() == [[[14.0]]]
    with torch.no_grad(), _fused_projections(attn, True, dtype=torch.bfloat16) as held:
        assert [f.weight.dtype for _, f, _ in held.values()] == [torch.bfloat16]  # autocast's


@pytest.mark.skipif(not _onednn_works(), reason="this torch build has no oneDNN packed linear")
def test_generate_with_packed_linears_draws_what_torch_linear_draws(tok, tiny):
    p = encode_prompts(tok, ["one", "two two", "three three three"])
    kw = dict(temperature=1.0, seeds=[5, 6, 7])
    store = PrefixCache()
    packed = fast_generate(tiny, tok, p, 12, prefix_cache=store, **kw)
    linears = [m for m in tiny.modules() if type(m) is torch.nn.Linear]
    assert not any("forward" in vars(m) for m in linears)  # restored
    # packed: o_proj, down_proj and the head of the model, and fast_fused.py's q/k/v and gate/up of
    # each layer (whose own layers then run no matmul of their own)
    fused = [f for _, f, _ in store.fused.values()]
    own = [m for name, m in tiny.named_modules()
           if name.endswith(("o_proj", "down_proj", "lm_head"))]
    assert len(fused) == 4 and len(own) == 5 and set(store.packed) == {*own, *fused}
    held = {m: w for m, (_, w) in store.packed.items()}
    fast_generate(tiny, tok, p, 4, prefix_cache=store, **kw)  # the rollout's next call: packs nothing
    assert all(store.packed[m][1] is held[m] for m in held)
    plain = generate(tiny, tok, p, 12, **kw)  # torch's linear
    assert packed.response_ids.tolist() == plain.response_ids.tolist()
    torch.testing.assert_close(packed.logprobs, plain.logprobs, atol=1e-5, rtol=0)
