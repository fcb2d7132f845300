"""Token log-probs and entropies of responses under a model: the training forward of every
algorithm file. `token_logprobs` is the idea: one forward, the one-token shift, log-softmax, gather,
entropy. By default it hands the work to common/models/fast/logprobs.py, which computes the same
numbers at a fraction of the cost (tests/test_logprobs.py checks the two agree)."""

import torch
import torch.nn.functional as F

from common.models.fast.logprobs import fast_token_logprobs
from common.models.hf import position_ids_from_mask
from common.models.sharding import AdapterOff


def token_logprobs(model, input_ids, attention_mask, response_len, temperature=1.0,
                   return_hidden=False, fast=True):
    """Log-prob and entropy of each of the last `response_len` tokens of `input_ids`, given the
    tokens before, under softmax(logits / temperature).

    input_ids, attention_mask: [B, T] = [left-padded prompt ; right-padded response].
    Returns (logprobs [B, R], entropy [B, R]), and with return_hidden the last hidden states
    [B, T, H] (a value head reads them). Values on padding mean nothing: callers mask them.
    fast: the same numbers from fast_token_logprobs (padding columns cut, shared prompt tokens run
    once, the head a few rows at a time); False runs the lines below.
    """
    if fast:
        return fast_token_logprobs(model, input_ids, attention_mask, response_len, temperature,
                                   return_hidden)
    if isinstance(model, AdapterOff):  # LoRA's reference: the policy with its adapters off
        with model.policy.disable_adapter():
            return token_logprobs(model.policy, input_ids, attention_mask, response_len,
                                  temperature, return_hidden, fast)
    R = response_len
    # logits_to_keep: the head runs on the last R + 1 positions only
    out = model(input_ids=input_ids, attention_mask=attention_mask,
                position_ids=position_ids_from_mask(attention_mask), logits_to_keep=R + 1,
                output_hidden_states=return_hidden)
    # CRUCIAL: the logits at position t predict token t+1, so the R response tokens (the last R
    # columns) are scored by the R positions just before them.
    logits = out.logits[:, :-1].float() / temperature  # [B, R, V]
    labels = input_ids[:, -R:]  # [B, R]
    logp = F.log_softmax(logits, dim=-1)
    logprobs = logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1)  # [B, R]
    entropy = -(logp.exp() * logp).sum(-1)  # [B, R]
    return (logprobs, entropy, out.hidden_states[-1]) if return_hidden else (logprobs, entropy)


@torch.no_grad()
def batched_token_logprobs(model, gen, temperature=1.0, batch_size=8, fast=True):
    """`token_logprobs` of a rollout's responses without gradients, `batch_size` rows at a time: the
    log-probs of a frozen or old policy. gen: a common.models.sampler.Generation (or anything with
    .sequences() and .response_mask). fast: as token_logprobs'."""
    input_ids, attention_mask = gen.sequences()
    R = gen.response_mask.shape[1]
    return torch.cat([token_logprobs(model, input_ids[i:i + batch_size],
                                     attention_mask[i:i + batch_size], R,
                                     temperature, fast=fast)[0]
                      for i in range(0, input_ids.shape[0], batch_size)])


def logprobs_from_logits(logits, labels, temperature=1.0):
    """logits [..., V], labels [...] -> log softmax(logits / T)[label], computed in float32."""
    logp = F.log_softmax(logits.float() / temperature, dim=-1)
    return logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
