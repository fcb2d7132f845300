"""Speedup: decode attention that reads each key/value head once under grouped-query attention."""

import contextlib

import torch

DECODE_ATTENTION = "mathrl_decode_sdpa"


def _decode_attention(module, query, key, value, attention_mask, scaling=None, **kwargs):
    """SDPA that, for one query token per row, reads each key/value head once. With grouped-query
    attention (G query heads per key/value head) and a padding mask, transformers' SDPA path copies
    every cached key and value G times per layer per token (`repeat_kv`; newer releases skip the
    copy in eager decoding, none under torch.compile): at 256 rows of a Qwen2.5-1.5B shape that is
    ~34 GB written per token, 11 times the weights. Here the G query heads of a key/value head
    become G query positions over it, which the mask (the same for every head) covers as it is.
    Prefill and training forwards go to transformers' SDPA unchanged."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    B, H, S, D = query.shape
    groups = H // key.shape[1]
    if S != 1 or groups == 1 or attention_mask is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling,
                                      **kwargs)
    # head h reads key/value head h // G (repeat_kv's order): [B, H, 1, D] -> [B, H/G, G, D]
    q = query.reshape(B, key.shape[1], groups, D)
    out = torch.nn.functional.scaled_dot_product_attention(q, key, value, attn_mask=attention_mask,
                                                           scale=scaling)
    return out.reshape(B, 1, H, D), None  # transformers' layout: [B, S, H, D]


@contextlib.contextmanager
def _packed_gqa(model):
    """Run `model`'s SDPA attention through `_decode_attention` (same function, fewer bytes)."""
    config = getattr(model, "config", None)
    before = getattr(config, "_attn_implementation", None)
    if before != "sdpa":
        yield
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    # registered on each call (two dict entries), so the function in force is this module's
    AttentionInterface.register(DECODE_ATTENTION, _decode_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(DECODE_ATTENTION, sdpa_mask)  # masks made as for SDPA
    config._attn_implementation = DECODE_ATTENTION
    try:
        yield
    finally:
        config._attn_implementation = before

