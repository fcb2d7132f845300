"""The sampler with its speedups on: `fast_generate` draws what common.sampler.generate draws (the
same tokens; log-probs within float rounding), faster. Every algorithm file samples with it.

Each speedup lives in its own module and is switched on here, in `Speedups`; a test checks each
alone against the plain sampler (tests/test_fast_sampler.py):
- fast_prefill.py: rows with the same prompt (a GRPO group) share one prefill, a prefix every
  prompt shares (the system prompt and worked example) is read once, and a stepwise episode's next
  prompt reads only the tokens added since its last call (`PrefixCache`);
- fast_kv.py: decode steps write their keys and values into buffers with room, not a new copy of
  the whole cache per token;
- fast_attention.py: decode attention reads each key/value head once under grouped-query attention;
- fast_fused.py: one matmul for the q/k/v projections and one for gate/up, with the weights
  stacked once per rollout;
- fast_linears.py: on a CPU, fp32 linear layers run through oneDNN with weights packed once per
  rollout;
- finished rows leave the forward batch (here): once most rows have answered, the rest decode alone;
- fast_compile.py (--compile): a static KV cache and a compiled decode step, for the models that
  `compile_decoding` was called on (common.models.trained_policy does it under --compile); with
  `grow_static_cache`, a cache that grows as it fills (off by default).
Stop strings of one character are read off a table of the tokens that hold them, not decoded.
"""

import contextlib
import weakref
from dataclasses import dataclass

import torch

from common.fast_attention import _packed_gqa
from common.fast_compile import _COMPILED, _cache_lengths, _grown_cache, _static_cache
from common.fast_fused import _fused_projections
from common.fast_kv import _append_in_place
from common.fast_linears import _onednn_linears
from common.fast_prefill import PrefixCache, _full_attention, _prefill
from common.hf import KV_CACHE, position_ids_from_mask
from common.logprobs import identical_rows
from common.sampler import (Generation, eos_token_ids, key_uniforms, left_pad, row_keys,
                            sample_token, stop_string_hit)
from common.sharding import unsharded


@dataclass(frozen=True)
class Speedups:
    """Which speedups `fast_generate` uses: all of them unless a caller says otherwise (the tests,
    bench/roofline.py's before and after)."""
    shared_prefill: bool = True
    """fast_prefill.py: prompt tokens another row or an earlier call of the rollout read run once"""
    in_place_kv: bool = True
    """fast_kv.py: each decode step appends its keys and values in place"""
    packed_gqa: bool = True
    """fast_attention.py: decode attention reads each key/value head once"""
    fused_projections: bool = True
    """fast_fused.py: q/k/v as one matmul, gate/up as one, weights stacked once per rollout"""
    packed_linears: bool = True
    """fast_linears.py: CPU fp32 linear layers through oneDNN, weights packed once per rollout"""
    drop_finished: bool = True
    """rows that finished leave the forward batch"""
    grow_static_cache: bool = False
    """fast_compile.py (--compile): the static cache grows as it fills, so attention reads less of
    it (off until a GPU measures it: one compiled graph per cache length)"""


@torch.no_grad()
def fast_generate(model, tokenizer, prompts, max_new_tokens, temperature=1.0, top_p=1.0,
                  stop_strings=(), seeds=None, autocast_dtype=None, check_every=None,
                  prefix_cache=None, speedups=Speedups()):
    """common.sampler.generate's samples, faster; its arguments, and:

    autocast_dtype: torch.bfloat16 under --bf16. check_every: read which rows are done (a host
    sync) every this many tokens, to stop early and drop finished rows from the batch; default 1 on
    CPU, where a sync costs nothing, and 8 on a GPU, where it stalls the queue of kernels (finished
    rows decode a few tokens more, masked out). prefix_cache: a `PrefixCache` that lives for one
    rollout: prompts read what it holds, and each row's prompt and response are stored in it for
    the next call (a stepwise episode's next state); it also keeps the rollout's packed linear
    weights. None: a prefix that all prompts share is read once, for this call only.
    """
    device = next(model.parameters()).device
    check_every = check_every or (1 if device.type == "cpu" else 8)
    pad_id = tokenizer.pad_token_id
    eos = torch.tensor(eos_token_ids(model, tokenizer), device=device)
    one_token_stops = [s for s in stop_strings if len(s) == 1]
    long_stops = [s for s in stop_strings if len(s) > 1]
    stop_table = None
    if one_token_stops:
        stop_table = torch.zeros(len(tokenizer), dtype=torch.bool)
        for s in one_token_stops:
            stop_table |= _single_token_stop_table(tokenizer, s)
        stop_table = stop_table.to(device)

    prompt_ids, prompt_mask = left_pad(prompts, pad_id)
    prompt_ids, prompt_mask = prompt_ids.to(device), prompt_mask.to(device)
    B = prompt_ids.shape[0]
    seeds = None if seeds is None else torch.tensor([int(x) % 2**63 for x in seeds], device=device)
    keys = None if seeds is None else row_keys(seeds)
    was_training = model.training
    model.eval()
    autocast = torch.autocast(device.type,
                              dtype=autocast_dtype) if autocast_dtype else contextlib.nullcontext()

    tokens, logps = [], []
    done = torch.zeros(B, dtype=torch.bool, device=device)
    finished = torch.zeros(B, dtype=torch.bool, device=device)
    alive_mask = []  # per step: was the row still generating when this token was sampled
    rows = torch.arange(B, device=device)  # the original rows still in the forward batch
    # FSDP2: the weights gathered once, not once per token
    # the compiled forward (--compile) traces the layers as they are
    pack = speedups.packed_linears and autocast_dtype is None and model not in _COMPILED
    # fused weights live for the rollout (prefix_cache), or for a compiled model's life: its
    # compiled step reads them as inputs, and new ones would make it compile again
    fused_store = (_KEPT_FUSED.setdefault(model, {}) if model in _COMPILED else
                   prefix_cache.fused if prefix_cache else None)
    with (autocast, unsharded(model),
          _packed_gqa(model) if speedups.packed_gqa else contextlib.nullcontext(),
          _fused_projections(model, speedups.fused_projections, autocast_dtype,
                             fused_store) as fused,
          _onednn_linears(model, pack, prefix_cache.packed if prefix_cache else None,
                          also=[held[1] for held in fused.values()])):
        attn = prompt_mask
        positions = position_ids_from_mask(prompt_mask)
        # Rows with the same prompt (a GRPO group, G samples of one question) share one prefill:
        # only the distinct prompts run through the model, and their KV cache rows are then copied
        # out to every row.
        distinct, inverse = torch.arange(B, device=device), torch.arange(B, device=device)
        store = None  # a model whose cache cannot be rearranged reads every prompt in full
        if speedups.shared_prefill:
            distinct, inverse = identical_rows(torch.cat([prompt_ids, prompt_mask], 1))
            if _full_attention(model):
                store = PrefixCache() if prefix_cache is None else prefix_cache
        cache, logits = _prefill(model, [list(prompts[i]) for i in distinct.tolist()],
                                 prompt_ids[distinct], attn[distinct], positions[distinct], store)
        next_pos = positions[:, -1:] + 1
        if len(distinct) < B:
            cache.batch_select_indices(inverse)
        logits = logits[inverse]  # [B, V]

        def remember(batch_rows):
            """Store these rows of the forward batch in prefix_cache: the prompt and the response
            tokens the model has read (all but the last, which was never fed)."""
            if store is None or store is not prefix_cache:  # no later call to read it
                return
            index = rows[batch_rows]
            counts = torch.stack(alive_mask, 1)[index].sum(1).tolist()
            sampled = torch.stack(tokens, 1)[index].tolist()
            sequences = [list(prompts[r]) + ids[:k - 1]
                         for r, ids, k in zip(index.tolist(), sampled, counts)]
            store.keep(cache, batch_rows.tolist(), sequences,
                       [prompt_ids.shape[1] - len(prompts[r]) for r in index.tolist()])

        compiled = _COMPILED.get(model)
        W = prompt_ids.shape[1]
        if compiled is not None:  # the prompts' keys and values, in a preallocated cache
            length, _ = _cache_lengths(W, max_new_tokens, speedups.grow_static_cache)
            cache = _static_cache(model, cache, length)
            # the columns after the current token are hidden by the causal mask
            attn = torch.cat([attn, attn.new_ones(B, length - W)], dim=1)
        elif speedups.in_place_kv:
            cache = _append_in_place(cache, max_new_tokens)
        for t in range(max_new_tokens):
            uniforms = None if seeds is None else key_uniforms(keys[rows], t)
            sampled, lp_rows = sample_token(logits, temperature, top_p, uniforms)
            token = torch.full((B,), pad_id, dtype=sampled.dtype, device=device)
            lp = torch.zeros(B, device=device)
            alive = ~done
            token[rows], lp[rows] = sampled, lp_rows.float()
            token = torch.where(alive, token, torch.full_like(token, pad_id))
            tokens.append(token)
            logps.append(torch.where(alive, lp, torch.zeros_like(lp)))
            alive_mask.append(alive)
            hit = torch.isin(token, eos)
            if stop_table is not None:
                hit |= stop_table[token]
            if long_stops:
                hit |= stop_string_hit(tokenizer, tokens, long_stops, alive)
            finished |= hit & alive
            done |= hit
            check = (t + 1) % check_every == 0
            if t == max_new_tokens - 1 or (check and bool(done.all())):
                break
            # Finished rows leave the forward batch (their KV cache rows too): once the model
            # answers concisely, most of a batch is done long before the slowest row, and a dead row
            # costs as much as a live one. A row's sample depends only on its own logits and its own
            # seed.
            drop = check and compiled is None and speedups.drop_finished
            keep = (~done[rows]).nonzero()[:, 0] if drop else None
            if keep is not None and len(keep) < len(rows):
                remember(done[rows].nonzero()[:, 0])
                rows, attn, next_pos = rows[keep], attn[keep], next_pos[keep]
                cache.batch_select_indices(keep)
            if compiled is None:
                attn = torch.cat([attn, torch.ones_like(attn[:, :1])], dim=1)
            elif W + t >= length:  # this token's keys go to position W + t: a full cache grows
                cache, grown = _grown_cache(model, cache, length, W + t)
                attn = torch.cat([attn, attn.new_ones(B, grown - length)], dim=1)
                length = grown
            out = (model if compiled is None else compiled)(
                input_ids=token[rows][:, None], attention_mask=attn, position_ids=next_pos,
                use_cache=True, **{KV_CACHE: cache})
            cache, next_pos, logits = getattr(out, KV_CACHE), next_pos + 1, out.logits[:, -1]
        remember(torch.arange(len(rows), device=device))
    model.train(was_training)

    response_mask = torch.stack(alive_mask, dim=1).long()  # [B, R]
    # between checks every row may have finished: those last columns hold no token
    R = max(1, int(response_mask.any(0).nonzero().max()) + 1) if check_every > 1 else len(tokens)
    return Generation(
        prompt_ids=prompt_ids, prompt_mask=prompt_mask,
        response_ids=torch.stack(tokens[:R], dim=1), response_mask=response_mask[:, :R],
        logprobs=torch.stack(logps[:R], dim=1), finished=finished, truncated=~finished,
    )


_STOP_TABLES = {}
_KEPT_FUSED = weakref.WeakKeyDictionary()  # a compiled model -> its fused projections


def _single_token_stop_table(tokenizer, text):
    """Bool [V]: tokens whose text contains `text` (e.g. every token holding a newline)."""
    key = (tokenizer.name_or_path, len(tokenizer), text)
    if key not in _STOP_TABLES:
        pieces = tokenizer.batch_decode([[i] for i in range(len(tokenizer))])
        _STOP_TABLES[key] = torch.tensor([text in p for p in pieces], dtype=torch.bool)
    return _STOP_TABLES[key]
