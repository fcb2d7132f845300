"""Token log-probs and entropies of responses under a model: the training forward of every
algorithm file. `token_logprobs` is the idea (a forward, the one-token shift, log-softmax, gather,
entropy); below it, what makes it cheap: columns that are padding in every row are cut, prompt
tokens that rows share run once, and the lm_head runs a few rows at a time so the [B, R, V] logits
never exist at once."""

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from common.hf import KV_CACHE, backbone_and_head, position_ids_from_mask
from common.sharding import AdapterOff, is_sharded, sharded_hidden_states


def token_logprobs(model, input_ids, attention_mask, response_len, temperature=1.0, chunk_rows=None,
                   return_hidden=False):
    """Log-prob and entropy of each of the last `response_len` tokens of `input_ids`, given the
    tokens before, under softmax(logits / temperature).

    input_ids, attention_mask: [B, T] = [left-padded prompt ; right-padded response].
    Returns (logprobs [B, R], entropy [B, R]), 0 on padding, and with return_hidden the body's
    hidden states [B, T, H] (a value head reads them).
    """
    if isinstance(model, AdapterOff):  # LoRA's reference: the policy with its adapters off
        with model.policy.disable_adapter():
            return token_logprobs(model.policy, input_ids, attention_mask, response_len,
                                  temperature, chunk_rows, return_hidden)
    body, head = backbone_and_head(model)
    T, R = input_ids.shape[1], response_len
    lo, hi = used_columns(attention_mask, R)  # columns that are padding in every row are cut
    input_ids, attention_mask, R = input_ids[:, lo:hi], attention_mask[:, lo:hi], R - (T - hi)
    hidden = body_forward(model, body, input_ids, attention_mask, hi - lo - R)  # [B, T', H]
    # CRUCIAL: the hidden state at position t predicts token t+1, so the R response tokens (the last
    # R columns) are scored by the R hidden states just before them.
    h = hidden[:, -R - 1:-1]  # [B, R, H]
    labels = input_ids[:, -R:]  # [B, R]
    out = list(chunked_head(h, labels, head, temperature, chunk_rows))  # [B, R] each
    if hi < T:  # the response columns cut as padding: log-prob and entropy 0
        out = [F.pad(x, (0, T - hi)) for x in out]
    if return_hidden:
        out.append(F.pad(hidden, (0, 0, lo, T - hi)))
    return tuple(out)


def logprobs_and_entropy(hidden, labels, weight, bias, temperature):
    """What the lm_head says of each label: hidden [b, R, H] -> logits / T, their log-softmax in
    float32, the label's log-prob [b, R] and the entropy [b, R] of the whole distribution."""
    logits = F.linear(hidden, weight, bias).float() / temperature  # [b, R, V]
    logp = F.log_softmax(logits, dim=-1)
    entropy = -(logp.exp() * logp).sum(-1)  # [b, R]
    return logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1), entropy


@torch.no_grad()
def batched_token_logprobs(model, gen, temperature=1.0, batch_size=8):
    """`token_logprobs` of a rollout's responses without gradients, `batch_size` rows at a time: the
    log-probs of a frozen or old policy. gen: a common.sampler.Generation (or anything with
    .sequences() and .response_mask)."""
    input_ids, attention_mask = gen.sequences()
    R = gen.response_mask.shape[1]
    return torch.cat([token_logprobs(model, input_ids[i:i + batch_size],
                                     attention_mask[i:i + batch_size], R,
                                     temperature)[0]
                      for i in range(0, input_ids.shape[0], batch_size)])


def logprobs_from_logits(logits, labels, temperature=1.0):
    """logits [..., V], labels [...] -> log softmax(logits / T)[label], computed in float32."""
    logp = F.log_softmax(logits.float() / temperature, dim=-1)
    return logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1)


# ------------------------------------------------------------------------------------------------
# What makes it cheap (the same numbers: tests/test_logprobs.py)
# ------------------------------------------------------------------------------------------------
def used_columns(attention_mask, response_len):
    """(lo, hi): the columns [lo, hi) that hold a real token in some row, keeping at least the
    last prompt column and the first response column. The columns outside (left of the longest
    prompt, right of the longest response) change nothing for the real tokens: a micro-batch then
    costs what its own longest sequence costs, not the whole rollout's."""
    T = attention_mask.shape[1]
    used = attention_mask.bool().any(0).nonzero()[:, 0]
    if not len(used):
        return 0, T
    return (min(int(used[0]), T - response_len - 1),
            max(int(used[-1]) + 1, T - response_len + 1))


def chunked_head(hidden, labels, head, temperature, chunk_rows=None):
    """`logprobs_and_entropy` of hidden [B, R, H] a few rows at a time and, when gradients are on,
    recomputed in the backward pass: the [B, R, V] float32 logits never exist at once (V is
    49k-152k: that tensor would dominate memory). chunk_rows: rows per chunk (default: ~256 MB of
    logits)."""
    R = hidden.shape[1]
    if chunk_rows is None:
        chunk_rows = max(1, (1 << 26) // max(1, R * head.weight.shape[0]))
    logps, ents = [], []
    for i in range(0, hidden.shape[0], chunk_rows):
        args = (hidden[i:i + chunk_rows], labels[i:i + chunk_rows], head.weight, head.bias,
                temperature)
        if torch.is_grad_enabled():
            lp, ent = checkpoint(logprobs_and_entropy, *args, use_reentrant=False)
        else:
            lp, ent = logprobs_and_entropy(*args)
        logps.append(lp)
        ents.append(ent)
    return torch.cat(logps), torch.cat(ents)


def body_forward(model, body, input_ids, attention_mask, prompt_len):
    """Hidden states [B, T, H]: `shared_prompt_forward`, or under FSDP2 the whole sharded model."""
    if is_sharded(model):
        positions = position_ids_from_mask(attention_mask)
        return sharded_hidden_states(model, input_ids, attention_mask, positions)
    return shared_prompt_forward(body, input_ids, attention_mask, prompt_len)


# fewer tokens shared by every prompt than this run with the rest: splitting them off costs a pass
# (fast_generate's prefill and token_logprobs' forward both use it)
MIN_SHARED_PREFIX = 16


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
