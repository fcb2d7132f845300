"""`fast_generate`: the tests' one-call form of what the algorithm files write in two lines,

    with autocast, fast_decoding(policy) as decoder:
        gen = generate(policy, tokenizer, prompts, ..., decoder=decoder)

and, with a prefix_cache (stepwise files), `decoder.remember(gen)` after it."""

import torch

from common.models.fast.decoding import Speedups, fast_decoding
from common.models.sampler import generate


def fast_generate(model, tokenizer, prompts, max_new_tokens, *args, autocast_dtype=None,
                  prefix_cache=None, speedups=Speedups(), check_every=None, **kwargs):
    device = next(model.parameters()).device
    autocast = torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None)
    with autocast, fast_decoding(model, prefix_cache, speedups, check_every) as decoder:
        gen = generate(model, tokenizer, prompts, max_new_tokens, *args, decoder=decoder, **kwargs)
    decoder.remember(gen)
    return gen
