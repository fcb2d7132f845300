"""Speedup: the training forward of common/models/logprobs.py, the same numbers at a fraction of the
cost.
- Columns that are padding in every row of a micro-batch are cut: it costs what its own longest
  sequence costs, not the whole rollout's.
- Prompt tokens that rows share run once (common/models/fast/prompts.py).
- The lm_head runs a few rows at a time, recomputed in the backward pass, so the [B, R, V] float32
  logits never exist at once (V is 49k-152k: they would dominate memory).
tests/test_logprobs.py checks each against the plain `token_logprobs`.
"""

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from common.models.fast.prompts import shared_prompt_forward
from common.models.hf import backbone_and_head, position_ids_from_mask
from common.models.sharding import AdapterOff, is_sharded, sharded_hidden_states


def fast_token_logprobs(model, input_ids, attention_mask, response_len, temperature=1.0,
                        return_hidden=False, chunk_rows=None):
    """common.models.logprobs.token_logprobs, the same numbers: the columns that are padding in
    every row are cut (and come back as 0), prompt tokens that rows share run once, and the head
    runs `chunk_rows` rows at a time (default: ~256 MB of logits)."""
    if isinstance(model, AdapterOff):  # LoRA's reference: the policy with its adapters off
        with model.policy.disable_adapter():
            return fast_token_logprobs(model.policy, input_ids, attention_mask, response_len,
                                       temperature, return_hidden, chunk_rows)
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
