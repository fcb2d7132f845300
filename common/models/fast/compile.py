"""Speedup (--compile): a static KV cache and a torch.compile'd decode step, the gpt-fast way."""

import weakref

import torch
from transformers import StaticCache

_COMPILED = weakref.WeakKeyDictionary()  # model -> its compiled forward (`compile_decoding`)
STATIC_CACHE_STEP = 128  # static caches are a multiple of this long: few shapes, few compiles


def compile_decoding(model, backend="inductor"):
    """Make the FastDecoder decode `model` with a static KV cache and a compiled forward (the
    gpt-fast approach, optional: --compile). Every decode step then has the same shapes, so
    torch.compile traces it once per batch size and cache length, and on a GPU its kernels replay
    as one CUDA graph rather than one launch each. Finished rows stay in the batch, masked:
    dropping them would change the shapes. The first rollouts pay for the compiling. The weights
    are inputs of the compiled graph, not constants in it, so optimizer steps reach it. backend:
    torch.compile's."""
    cuda = next(model.parameters()).device.type == "cuda"
    _COMPILED[model] = torch.compile(model, dynamic=False, backend=backend,
                                     mode="reduce-overhead" if cuda and backend == "inductor"
                                     else None)
    return model


def _static_cache(model, cache, length, filled=None):
    """A StaticCache of `length` positions holding what `cache` holds: a DynamicCache, or (to
    grow one) a StaticCache whose first `filled` positions are written."""
    static = StaticCache(config=model.config, max_cache_len=length)
    for i, layer in enumerate(cache.layers):
        keys, values = layer.keys, layer.values
        if filled is not None:
            keys, values = keys[:, :, :filled], values[:, :, :filled]
        static.update(keys, values, i)
    return static


def _grown_cache(model, cache, length, filled):
    """The static `cache` of `length` positions, the first `filled` written, in a new one
    STATIC_CACHE_STEP positions longer. -> (the new cache, its length)"""
    longer = length + STATIC_CACHE_STEP
    return _static_cache(model, cache, longer, filled), longer


def _cache_lengths(prompt_len, max_new_tokens, grow):
    """(first, last) length of the static cache for prompts of `prompt_len` tokens: both room for
    the whole response, or (grow) the first just room for the prompt and a first token, the cache
    then growing by STATIC_CACHE_STEP positions whenever it is full. Attention over a static cache
    reads all of its positions at every step, written or not: a cache that grows reads about half
    as many over a long response, at the price of one compiled graph per length."""
    last = -(-(prompt_len + max_new_tokens) // STATIC_CACHE_STEP) * STATIC_CACHE_STEP
    first = -(-(prompt_len + 1) // STATIC_CACHE_STEP) * STATIC_CACHE_STEP if grow else last
    return min(first, last), last

