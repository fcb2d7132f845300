"""Speedup (--compile): a static KV cache and a torch.compile'd decode step, the gpt-fast way."""

import weakref

import torch
from transformers import StaticCache

_COMPILED = weakref.WeakKeyDictionary()  # model -> its compiled forward (`compile_decoding`)
STATIC_CACHE_STEP = 128  # static caches are a multiple of this long: few shapes, few compiles


def compile_decoding(model, backend="inductor"):
    """Make `fast_generate` decode `model` with a static KV cache and a compiled forward (the
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


def _static_cache(model, cache, length):
    """A StaticCache of `length` positions holding what the DynamicCache `cache` holds."""
    static = StaticCache(config=model.config, max_cache_len=length)
    for i, layer in enumerate(cache.layers):
        static.update(layer.keys, layer.values, i)
    return static

