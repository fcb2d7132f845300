"""Speedup: prompts read once. A GRPO group's rows share one prefill, a prefix that every prompt
shares (the system prompt and worked example) is read once, and a stepwise episode's next prompt
reads only the tokens added since its last call (`PrefixCache`)."""

from transformers import DynamicCache

from common.hf import KV_CACHE
from common.logprobs import MIN_SHARED_PREFIX


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
    their system prompt and worked examples. `fast_generate` reads what it can from here, and
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
    shared = min(_common_prefix(prompts[0], p) for p in prompts)
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
    # each row will store its own longer sequence (see `fast_generate`)
    prefix_cache.drop([i for m, i in matches if m > 0])
    out = model(input_ids=prompt_ids[:, W - M:], attention_mask=prompt_mask,
                position_ids=positions[:, W - M:], use_cache=True, logits_to_keep=1,
                **{KV_CACHE: cache})
    return getattr(out, KV_CACHE), out.logits[:, -1]

