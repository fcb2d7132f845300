"""Speedup: a prompt read once, in sampling and in training forwards. The prompts of a GRPO group
are one prompt, and every prompt of a batch starts with the same system prompt and worked example:
- `identical_rows` and `shared_prefix_len` find what rows share;
- sampling: rows with the same prompt share one prefill, a prefix every prompt shares is read once,
  and a stepwise episode's next prompt reads only the tokens added since its last call
  (`PrefixCache`, `_prefill`: the FastDecoder's prefill);
- training: `shared_prompt_forward` runs the shared prompt tokens once and the rest of each row on
  their keys and values, the same function of the weights as a plain forward
  (common/models/fast/logprobs.py and the critic use it).
tests/test_fast_sampler.py and tests/test_logprobs.py check both against reading every prompt in
full."""

import torch
from transformers import DynamicCache

from common.models.hf import KV_CACHE, position_ids_from_mask

# fewer tokens shared by every prompt than this run with the rest: splitting them off costs a pass
# (the FastDecoder's prefill and training forwards both use it)
MIN_SHARED_PREFIX = 16


def identical_rows(x):
    """x [B, L] -> (first, inverse): the first row index of each distinct row of x, ascending, and
    for every row the slot of its distinct row, so that x[first][inverse] == x (both are aranges
    when all rows differ). Used to run a group's shared prompt once."""
    # slots in sorted order of the rows' values
    _, inverse = torch.unique(x, dim=0, return_inverse=True)
    rows = torch.arange(x.shape[0], device=x.device)
    first = torch.full((int(inverse.max()) + 1,), x.shape[0],
                       device=x.device).scatter_reduce(0, inverse, rows, "amin")
    order = first.argsort()  # renumber the slots by first appearance
    return first[order], order.argsort()[inverse]


def shared_prefix_len(input_ids, attention_mask, prompt_len):
    """How many leading prompt tokens every row has in common, wherever its left padding puts them
    (a system prompt and worked example ahead of each question; a whole prompt when all rows are
    one GRPO group). 0 when a row's prompt is not one padding run then tokens."""
    if len(input_ids) < 2:
        return 0
    mask = attention_mask[:, :prompt_len].bool()
    if not bool((mask.long().cumsum(1) > 0).eq(mask).all()):
        return 0
    pads = prompt_len - mask.sum(1)  # [B] left padding of each row
    shortest = int(prompt_len - pads.max())
    cols = pads[:, None] + torch.arange(shortest, device=input_ids.device)  # [B, L] real tokens
    aligned = input_ids.gather(1, cols)
    return int(aligned.eq(aligned[:1]).all(0).long().cumprod(0).sum())


# ------------------------------------------------------------------------------------------------
# Training forwards
# ------------------------------------------------------------------------------------------------
def shared_prompt_forward(body, input_ids, attention_mask, prompt_len):
    """A transformer body's last hidden states [B, T, H]; ids [B, T] = [left-padded prompt of
    prompt_len columns ; the rest]. Prompt tokens that rows share run once: either every row's
    common leading tokens (the system prompt and worked example ahead of every question; a whole
    prompt when the rows are one GRPO group) or, when it saves more, each distinct prompt of several
    groups. Their keys and values are copied out to the rows, and the rest of each row attends to
    them. Gradients flow back through the copies, so this is the same function of the weights as a
    plain forward, at a fraction of the prompt's cost in forward and backward."""
    positions = position_ids_from_mask(attention_mask)
    B = len(input_ids)
    # HF turns the cache off under gradient checkpointing, so prompts are shared only without it.
    if prompt_len >= 1 and not getattr(body, "gradient_checkpointing", False):
        k = shared_prefix_len(input_ids, attention_mask, prompt_len)
        distinct, inverse = identical_rows(torch.cat([input_ids[:, :prompt_len],
                                                      attention_mask[:, :prompt_len]], 1))
        if k >= MIN_SHARED_PREFIX and (B - 1) * k > (B - len(distinct)) * prompt_len:
            return _shared_prefix_forward(body, input_ids, attention_mask, positions, prompt_len, k)
        if len(distinct) < B:
            return _shared_prompts_forward(body, input_ids, attention_mask, positions, prompt_len,
                                           distinct, inverse)
    return body(input_ids=input_ids, attention_mask=attention_mask,
                position_ids=positions).last_hidden_state


def _shared_prompts_forward(body, input_ids, attention_mask, positions, prompt_len, distinct,
                            inverse):
    """Each distinct prompt once; row i's prompt is distinct[inverse[i]]."""
    prompt = body(input_ids=input_ids[distinct, :prompt_len],
                  attention_mask=attention_mask[distinct, :prompt_len],
                  position_ids=positions[distinct, :prompt_len], use_cache=True)
    cache = getattr(prompt, KV_CACHE)
    cache.batch_select_indices(inverse)
    rest = body(input_ids=input_ids[:, prompt_len:], attention_mask=attention_mask,
                position_ids=positions[:, prompt_len:], use_cache=True, **{KV_CACHE: cache})
    return torch.cat([prompt.last_hidden_state[inverse], rest.last_hidden_state], dim=1)


def _shared_prefix_forward(body, input_ids, attention_mask, positions, prompt_len, k):
    """The k leading tokens all rows share once, as one row; then each row without them, its left
    padding moved between them and the rest (masked, positions unchanged)."""
    B, T = input_ids.shape
    pads = (prompt_len - attention_mask[:, :prompt_len].sum(1))[:, None]  # [B, 1]
    first = int(pads[0])
    prefix = body(input_ids=input_ids[:1, first:first + k],
                  position_ids=positions[:1, first:first + k], use_cache=True)
    cache = getattr(prefix, KV_CACHE)
    cache.batch_select_indices(torch.zeros(B, dtype=torch.long, device=input_ids.device))
    # rest column c is the row's column c inside its padding, c + k after it
    cols = torch.arange(T - k, device=input_ids.device)[None]
    take = cols + k * (cols >= pads)  # [B, T - k]
    rest_mask = attention_mask.gather(1, take)
    rest = body(input_ids=input_ids.gather(1, take), position_ids=positions.gather(1, take),
                attention_mask=torch.cat([rest_mask.new_ones(B, k), rest_mask], 1),
                use_cache=True, **{KV_CACHE: cache})
    # [shared, padding, rest] back to each row's own [padding, shared, rest]
    relaid = torch.cat([prefix.last_hidden_state.expand(B, -1, -1), rest.last_hidden_state], 1)
    cols = torch.arange(T, device=input_ids.device)[None]
    back = torch.where(cols < pads, cols + k, torch.where(cols < pads + k, cols - pads, cols))
    return relaid.gather(1, back[:, :, None].expand(-1, -1, relaid.shape[-1]))


# ------------------------------------------------------------------------------------------------
# Sampling
# ------------------------------------------------------------------------------------------------
def _common_prefix(a, b):
    """Length of the longest common prefix of two id lists (a binary search of C-speed slice
    compares: a Python loop over tokens would cost more than the forward it saves)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if a[:mid] == b[:mid] else (lo, mid - 1)
    return lo


class PrefixCache:
    """Keys and values of token sequences the model has read, kept to be read again: a stepwise
    episode's next prompt is its last prompt plus the line just sampled, and a batch's prompts share
    their system prompt and worked examples. `FastDecoder` reads what it can from here, and
    prefills the rest.

    Valid only while the weights stay the same: make a new one for every rollout. Each entry is
    (ids, [(keys, values) per layer, each [heads, len(ids), head_dim]]). It also keeps the rollout's
    packed linear weights (`_onednn_linears`) and fused projections (`_fused_projections`), so that
    later calls do not build them again."""

    def __init__(self):
        self.entries = []
        self.packed = {}  # nn.Linear -> ((its weight's address, version), packed weight)
        self.fused = {}  # (module, layer names) -> [key, fused Linear, forwards]

    def match(self, ids):
        """(n, entry index): the most leading tokens of ids any entry holds (index None if none)."""
        best = (0, None)
        for i, (held, _) in enumerate(self.entries):
            n = _common_prefix(held, ids)
            if n > best[0]:
                best = (n, i)
        return best

    def add(self, ids, layers):
        self.entries.append((list(ids), layers))

    def drop(self, indices):
        """Forget entries that a longer sequence is about to replace."""
        indices = set(indices)
        self.entries = [e for i, e in enumerate(self.entries) if i not in indices]

    def keep(self, cache, rows, sequences, starts):
        """Store rows of a KV cache: batch row rows[i] holds sequences[i] from column starts[i]."""
        for row, ids, start in zip(rows, sequences, starts):
            end = start + len(ids)
            self.add(ids, [(layer.keys[row, :, start:end].clone(),
                            layer.values[row, :, start:end].clone()) for layer in cache.layers])


def _full_attention(model):
    """Prefix reuse places cached keys by position; a sliding-window layer keeps only its last
    window, so a model with one (or with no config to tell) reads every prompt in full."""
    config = getattr(model, "config", None)
    if config is None:
        return False
    types = getattr(config, "layer_types", None)
    if types is not None:
        return all(t == "full_attention" for t in types)
    return not (getattr(config, "sliding_window", None)
                and getattr(config, "use_sliding_window", True))


def _prefill(model, prompts, prompt_ids, prompt_mask, positions, prefix_cache):
    """Read the (distinct, left-padded) prompts into a KV cache: (cache, last logits [B, V]).

    Row i's first n_i tokens may already be in `prefix_cache`. The prompts are right-aligned, so
    only the last M = max_i(len_i - n_i) columns are run through the model; the columns before come
    from the cache (a row may recompute a few tokens it holds, to keep one rectangular forward).
    Before that, a prefix that all prompts share and the cache lacks is read once, for one row."""
    B, W = prompt_ids.shape
    if prefix_cache is None:
        out = model(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=positions,
                    use_cache=True, logits_to_keep=1)
        return getattr(out, KV_CACHE), out.logits[:, -1]
    matches = [prefix_cache.match(p) for p in prompts]
    shared = shared_prefix_len(prompt_ids, prompt_mask, W)
    if B > 1 and shared >= MIN_SHARED_PREFIX and any(m < shared for m, _ in matches):
        ids = prompt_ids.new_tensor([prompts[0][:shared]])
        layers = getattr(model(input_ids=ids, use_cache=True, logits_to_keep=1), KV_CACHE).layers
        prefix_cache.add(ids[0].tolist(), [(layer.keys[0], layer.values[0]) for layer in layers])
        matches = [prefix_cache.match(p) for p in prompts]
    lengths = [len(p) for p in prompts]
    # at least each row's last token runs, for its logits
    M = max(n - min(m, n - 1) for (m, _), n in zip(matches, lengths))
    if M == W:  # nothing to read again
        return _prefill(model, prompts, prompt_ids, prompt_mask, positions, None)
    # Row i's first len_i - M tokens come from its entry, into the columns just before the last M.
    held = [prefix_cache.entries[i][1] if i is not None else None for _, i in matches]
    cache = DynamicCache()
    for layer in range(len(next(h for h in held if h is not None))):
        pair = []
        for kv in (0, 1):  # keys, values
            like = next(h[layer][kv] for h in held if h is not None)  # [heads, n, head_dim]
            x = like.new_zeros(B, like.shape[0], W - M, like.shape[2])
            for row, (h, n) in enumerate(zip(held, lengths)):
                if n > M:
                    x[row, :, W - n:] = h[layer][kv][:, :n - M]
            pair.append(x)
        cache.update(*pair, layer)
    # each row will store its own longer sequence (`FastDecoder.remember`)
    prefix_cache.drop([i for m, i in matches if m > 0])
    out = model(input_ids=prompt_ids[:, W - M:], attention_mask=prompt_mask,
                position_ids=positions[:, W - M:], use_cache=True, logits_to_keep=1,
                **{KV_CACHE: cache})
    return getattr(out, KV_CACHE), out.logits[:, -1]

