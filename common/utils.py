"""Small numeric helpers (log-probs, masks, whitening, KL estimators, GAE, returns) and plumbing
(distributed, seeding, logging, checkpoints). Each numeric helper is unit-tested once in
tests/test_utils.py; the algorithm files combine them, and keep every line that decides the
algorithm's math to themselves."""

import importlib.util
import json
import math
import os
import random
import re
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint
from transformers.modeling_outputs import BaseModelOutputWithPast

from common.sharding import (AdapterOff, full_state_dict, is_dtensor, is_sharded, optimizer_state,
                             untied)

# Recent transformers (5.24 here) call the KV cache `cache`, in forward's arguments and in its
# outputs: the old `past_key_values` warns there and is to go in 5.40, while 4.x knows only the old
# one (and would silently ignore an unknown `cache=`), so the name is read off the installed
# version's output class.
KV_CACHE = "cache" if "cache" in BaseModelOutputWithPast.__dataclass_fields__ else "past_key_values"


# ------------------------------------------------------------------------------------------------
# Log-probs and entropy
# ------------------------------------------------------------------------------------------------
# fewer tokens shared by every prompt than this run with the rest: splitting them off costs a pass
# (generate's prefill and token_logprobs' forward both use it)
MIN_SHARED_PREFIX = 16


def position_ids_from_mask(mask):
    # CRUCIAL: with left padding the first real token must get position 0, not the pad count.
    return (mask.cumsum(-1) - 1).clamp(min=0)


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


def logprobs_from_logits(logits, labels, temperature=1.0):
    """logits [..., V], labels [...] -> log softmax(logits / T)[label], computed in float32."""
    logp = F.log_softmax(logits.float() / temperature, dim=-1)
    return logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1)


def _chunk_logprobs_entropy(hidden, labels, weight, bias, temperature):
    # [c, R, V], only one chunk alive at a time
    logits = F.linear(hidden, weight, bias).float() / temperature
    logp = F.log_softmax(logits, dim=-1)
    entropy = -(logp.exp() * logp).sum(-1)  # [c, R]
    return logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1), entropy


def backbone_and_head(model):
    """(transformer body, lm_head) of an HF causal LM, also through a PEFT wrapper."""
    if hasattr(model, "get_base_model"):
        model = model.get_base_model()
    return model.base_model, model.get_output_embeddings()


def sharded_hidden_states(model, input_ids, attention_mask, position_ids):
    """The body's last hidden states [B, T, H] of an FSDP2-sharded causal LM. FSDP2 gathers the
    root's weights (embeddings, final norm, head) in the root's forward only, and keeps them until
    backward: so the whole model runs, with one logit per row, and its head can be used after."""
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                output_hidden_states=True, logits_to_keep=1)
    return out.hidden_states[-1]


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


def _body_forward(model, body, input_ids, attention_mask, prompt_len):
    """Hidden states [B, T, H]: `shared_prompt_forward`, or under FSDP2 the whole sharded model."""
    if is_sharded(model):
        positions = position_ids_from_mask(attention_mask)
        return sharded_hidden_states(model, input_ids, attention_mask, positions)
    return shared_prompt_forward(body, input_ids, attention_mask, prompt_len)


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


def token_logprobs(model, input_ids, attention_mask, response_len, temperature=1.0, chunk_rows=None,
                   return_hidden=False):
    """Log-prob and entropy of each of the last `response_len` tokens of `input_ids`, given the
    tokens before.

    input_ids, attention_mask: [B, T] = [left-padded prompt ; right-padded response].
    Returns (logprobs [B, R], entropy [B, R]) and, with return_hidden, the body's hidden states
    [B, T, H]. The lm_head runs on a few rows at a time and, when gradients are on, is recomputed in
    the backward pass, so the [B, R, V] float32 logits never exist at once (V is 49k-152k: that
    tensor would dominate memory).
    """
    if isinstance(model, AdapterOff):  # LoRA's reference: the policy with its adapters off
        with model.policy.disable_adapter():
            return token_logprobs(model.policy, input_ids, attention_mask, response_len,
                                  temperature, chunk_rows, return_hidden)
    body, head = backbone_and_head(model)
    # Columns that are padding in every row (left of the longest prompt, right of the longest
    # response) change nothing for the real tokens, so they are cut before the forward and
    # zero-filled after: a micro-batch costs what its own longest sequence costs, not the whole
    # rollout's.
    T, full_R = input_ids.shape[1], response_len
    used = attention_mask.bool().any(0).nonzero()[:, 0]
    lo = min(int(used[0]), T - response_len - 1) if len(used) else 0
    hi = max(int(used[-1]) + 1, T - response_len + 1) if len(used) else T
    input_ids, attention_mask = input_ids[:, lo:hi], attention_mask[:, lo:hi]
    response_len = response_len - (T - hi)
    # [B, T', H]
    hidden = _body_forward(model, body, input_ids, attention_mask,
                           input_ids.shape[1] - response_len)
    # CRUCIAL: the hidden state at position t predicts token t+1, so the R response tokens (the last
    # R columns) are scored by the R hidden states just before them.
    h = hidden[:, -response_len - 1:-1]  # [B, R, H]
    labels = input_ids[:, -response_len:]  # [B, R]
    if chunk_rows is None:
        # ~256 MB of fp32 logits
        chunk_rows = max(1, (1 << 26) // max(1, response_len * head.weight.shape[0]))
    logps, ents = [], []
    for i in range(0, h.shape[0], chunk_rows):
        args = (h[i:i + chunk_rows], labels[i:i + chunk_rows], head.weight, head.bias, temperature)
        if torch.is_grad_enabled():
            lp, ent = checkpoint(_chunk_logprobs_entropy, *args, use_reentrant=False)
        else:
            lp, ent = _chunk_logprobs_entropy(*args)
        logps.append(lp)
        ents.append(ent)
    out = [torch.cat(logps), torch.cat(ents)]
    if response_len < full_R:  # the trimmed response columns: log-prob and entropy 0, as padding
        out = [F.pad(x, (0, full_R - response_len)) for x in out]
    if return_hidden:
        out.append(F.pad(hidden, (0, 0, lo, T - hi)))
    return tuple(out)


@torch.no_grad()
def batched_token_logprobs(model, gen, temperature=1.0, batch_size=8):
    """`token_logprobs` of a rollout's responses without gradients, `batch_size` rows at a time: the
    log-probs of a frozen or old policy. gen: a common.models.Generation (or anything with
    .sequences() and .response_mask)."""
    input_ids, attention_mask = gen.sequences()
    R = gen.response_mask.shape[1]
    return torch.cat([token_logprobs(model, input_ids[i:i + batch_size],
                                     attention_mask[i:i + batch_size], R,
                                     temperature)[0]
                      for i in range(0, input_ids.shape[0], batch_size)])


# ------------------------------------------------------------------------------------------------
# Masked statistics
# ------------------------------------------------------------------------------------------------
def masked_sum(x, mask, dim=None):
    return (x * mask).sum() if dim is None else (x * mask).sum(dim)


def masked_mean(x, mask, dim=None):
    """Mean over the entries where mask is 1. An all-zero mask gives 0, not NaN."""
    return masked_sum(x, mask, dim) / (mask.sum() if dim is None else mask.sum(dim)).clamp(min=1)


def masked_mean_var(x, mask):
    """Mean and unbiased variance of the masked entries over every rank's tensors (one process sees
    the same numbers as N processes on the whole batch), computed in float64."""
    stats = all_reduce_sum(torch.stack([masked_sum(x, mask), mask.sum()]).double())
    count = stats[1].clamp(min=1)
    mean = stats[0] / count
    sq = all_reduce_sum(masked_sum((x.double() - mean) ** 2, mask).reshape(1))[0]
    var = sq / (count - 1) if count > 1 else sq / count
    return mean.to(x.dtype), var.to(x.dtype)


def masked_whiten(x, mask, shift_mean=True, eps=1e-8, eps_on_std=False):
    """(x - mean) / sqrt(var + eps) over the masked entries of all ranks (TRL, oat), or with
    eps_on_std (x - mean) / (std + eps) (OpenR); shift_mean=False adds the mean back (TRL's reward
    whitening). Masked-out entries come back as 0. The two differ only when the variance is near eps
    or below."""
    mean, var = masked_mean_var(x, mask)
    if eps_on_std:
        out = (x - mean) / (var.clamp(min=0).sqrt() + eps)
    else:
        out = (x - mean) * torch.rsqrt(var + eps)
    return (out if shift_mean else out + mean) * mask


def explained_variance(values, returns, mask):
    """1 - Var(returns - values) / Var(returns) over every rank's masked entries: 1 is a perfect
    critic, 0 no better than predicting the mean return, negative worse; NaN when the returns do not
    vary."""
    var_returns = masked_mean_var(returns, mask)[1]
    var_error = masked_mean_var(returns - values, mask)[1]
    return (1 - var_error / var_returns).item() if var_returns > 0 else float("nan")


# ------------------------------------------------------------------------------------------------
# KL estimators (Schulman, "Approximating KL divergence"), all per token, for samples x ~ pi
# ------------------------------------------------------------------------------------------------
def kl_k1(logp, ref_logp):
    """log pi/pi_ref: unbiased for KL(pi||pi_ref), high variance, can be negative."""
    return logp - ref_logp


def kl_k2(logp, ref_logp):
    """(log pi/pi_ref)^2 / 2: biased, low variance, never negative."""
    return 0.5 * (logp - ref_logp) ** 2


def kl_k3(logp, ref_logp):
    """pi_ref/pi - 1 - log(pi_ref/pi): unbiased and never negative (the GRPO paper's estimator)."""
    log_ratio = (ref_logp - logp).clamp(-20, 20)  # exp of a large log-ratio would overflow to inf
    return torch.expm1(log_ratio) - log_ratio


@torch.no_grad()
def mismatch_stats(trainer_logprobs, sampler_logprobs, mask):
    """How far the sampler's log-probs of the sampled tokens are from the trainer's: the mean
    absolute difference and the k3 estimate of KL(sampler || trainer). About 0 in fp32 eager; bf16,
    another kernel or a compiled sampler moves it (TRL, verl, oat and OpenRLHF log the same)."""
    return {"mismatch/abs": masked_mean((trainer_logprobs - sampler_logprobs).abs(), mask).item(),
            "mismatch/kl": masked_mean(kl_k3(sampler_logprobs, trainer_logprobs), mask).item()}


def kl_estimate(logp, ref_logp, estimator):
    """Per-token estimate of KL(pi || pi_ref) by name: "k1", "k2" or "k3"."""
    return {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}[estimator](logp, ref_logp)


# ------------------------------------------------------------------------------------------------
# Advantages
# ------------------------------------------------------------------------------------------------
def step_gae(rewards, values, next_value, dones, gamma, lam):
    """Generalised advantage estimation along the last dimension.

    rewards, values, dones: [N, T]; dones[:, t] = 1 when the episode ended at step t (no bootstrap
    from t+1). next_value: [N], the value of the state after step T-1 (a segment cut mid-episode is
    bootstrapped with it).
        delta_t = r_t + gamma * V_{t+1} * (1 - done_t) - V_t
        A_t     = delta_t + gamma * lam * (1 - done_t) * A_{t+1}
    Returns (advantages, returns = advantages + values), both [N, T].
    """
    T = rewards.shape[-1]
    advantages = torch.zeros_like(rewards)
    last = torch.zeros_like(rewards[..., 0])
    for t in reversed(range(T)):
        next_v = values[..., t + 1] if t + 1 < T else next_value
        nonterminal = 1.0 - dones[..., t]
        delta = rewards[..., t] + gamma * next_v * nonterminal - values[..., t]
        last = delta + gamma * lam * nonterminal * last
        advantages[..., t] = last
    return advantages, advantages + values


def token_gae(rewards, values, mask, gamma, lam):
    """GAE over right-padded response tokens [B, R]: the episode ends at each row's last real token,
    whose successor has value 0. Padding gets advantage and return 0."""
    mask = mask.to(rewards.dtype)
    # CRUCIAL: token t is terminal when token t+1 is padding (or t is the last column).
    dones = 1.0 - torch.cat([mask[:, 1:], torch.zeros_like(mask[:, :1])], dim=1)
    advantages, returns = step_gae(rewards * mask, values * mask, torch.zeros_like(rewards[:, 0]),
                                   dones,
                                   gamma, lam)
    return advantages * mask, returns * mask


def discounted_returns(rewards, gamma):
    """G_t = sum_k gamma^k r_{t+k} along the last dimension."""
    out = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[..., 0])
    for t in reversed(range(rewards.shape[-1])):
        running = rewards[..., t] + gamma * running
        out[..., t] = running
    return out


# ------------------------------------------------------------------------------------------------
# Distributed (torchrun sets RANK/WORLD_SIZE/LOCAL_RANK; without them this is the world_size == 1
# case)
# ------------------------------------------------------------------------------------------------
@dataclass
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self):
        return self.rank == 0


def init_distributed():
    """Initialise from the torchrun environment: nccl on CUDA, gloo on CPU."""
    use_cuda = torch.cuda.is_available()
    if "RANK" not in os.environ:
        return DistInfo(device=torch.device("cuda" if use_cuda else "cpu"))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ["LOCAL_RANK"])
    if use_cuda:
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
        # N processes on one CPU would each start one thread per core and fight over them.
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))
    if not dist.is_initialized():
        dist.init_process_group("nccl" if use_cuda else "gloo",
                                device_id=device if use_cuda else None)
    return DistInfo(rank, world, local, device)


def print0(*args, **kwargs):
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(*args, **kwargs, flush=True)


def all_reduce_mean(metrics, device=torch.device("cpu")):
    """Dict of floats -> the same dict averaged over ranks (one collective for all keys)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return dict(metrics)
    keys = sorted(metrics)
    t = torch.tensor([float(metrics[k]) for k in keys], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return {k: v / dist.get_world_size() for k, v in zip(keys, t.tolist())}


def global_metrics(metrics, device=torch.device("cpu")):
    """One update's metrics averaged over ranks, with "reward/sq" (the mean squared reward) turned
    into "reward/std": the std of every rank's rewards together."""
    metrics = all_reduce_mean(metrics, device)
    if "reward/sq" in metrics:
        variance = metrics.pop("reward/sq") - metrics["reward/mean"] ** 2
        metrics["reward/std"] = math.sqrt(max(0.0, variance))
    return metrics


def mean_of(stats):
    """A list of metric dicts -> each key's mean over the dicts that hold it."""
    keys = dict.fromkeys(k for s in stats for k in s)
    return {k: sum(s[k] for s in stats if k in s) / sum(k in s for s in stats) for k in keys}


def every(step, interval):
    """Whether an every-`interval`-updates event (eval, save) falls on update `step`; interval 0:
    never."""
    return bool(interval) and step % interval == 0


def check_batch(args, world_size, num_prompts, per_prompt):
    """Prompts split evenly over the ranks, and each rank's rows over the minibatches, or the
    fix."""
    if num_prompts % world_size:
        raise ValueError(f"--num_prompts {num_prompts} must be divisible by the number of "
                         "processes "
                         f"({world_size}); try --num_prompts "
                         f"{world_size * max(1, num_prompts // world_size)}.")
    local = num_prompts // world_size * per_prompt
    if local % getattr(args, "num_mini_batches", 1):
        raise ValueError(f"each rank gets {local} sequences per update (num_prompts / processes x "
                         f"num_generations), which --num_mini_batches {args.num_mini_batches} must "
                         "divide; "
                         f"try --num_mini_batches {math.gcd(local, args.num_mini_batches)}.")


def all_reduce_sum(x):
    """Tensor summed over ranks (in place), e.g. a global token count for a loss denominator."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(x)
    return x


def all_gather_objects(obj):
    """Python object from every rank -> list of them (rank order)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def broadcast_parameters(module):
    """Every rank starts from rank 0's weights, whatever its own initialisation did."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        for p in module.parameters():
            dist.broadcast(p.data, src=0)


def average_gradients(module):
    """What DDP does, done once per optimizer step: after all micro-batches have accumulated their
    gradients, average them over ranks. Doing it here, rather than in backward hooks, means gradient
    accumulation needs no `no_sync` and cannot sync too often or too rarely."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return
    world = dist.get_world_size()
    # sharded (FSDP2) gradients were already reduce-scattered and averaged in backward
    grads = [p.grad for p in module.parameters()
             if p.requires_grad and p.grad is not None and not is_dtensor(p.grad)]
    handles = [dist.all_reduce(g, async_op=True) for g in grads]
    for h, g in zip(handles, grads):
        h.wait()
        g.div_(world)


def report_end(first_acc, final_acc, path, adapter=False):
    """The last line of a run: held-out accuracy before and after, and where the policy went."""
    accuracy = " -> ".join(f"{a:.3f}" for a in (first_acc, final_acc) if a is not None)
    loads = ("a LoRA adapter: peft loads it" if adapter
             else "AutoModelForCausalLM.from_pretrained loads it")
    print0(f"held-out greedy accuracy {accuracy or 'not measured'}; policy saved to {path} "
           f"({loads})")


def set_seed(seed):
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np

        np.random.seed(seed % 2**32)
    except ImportError:
        pass


def sample_seed(seed, step, sample_index):
    """Sampling seed of one response, from (run seed, update, global sample index). Runs are
    reproducible, the samples do not depend on how many ranks share the batch, and a resumed run
    draws exactly what the uninterrupted run would have."""
    return (seed * 1_000_003 + step) * 1_000_003 + sample_index


def problem_index(position, num_problems, seed):
    """The problem at `position` of an endless stream over the problems: a seeded permutation per
    pass. Every rank computes the same stream, and a resumed run continues where it stopped."""
    epoch, offset = divmod(position, num_problems)
    perm = torch.randperm(num_problems,
                          generator=torch.Generator().manual_seed(seed * 7919 + epoch))
    return int(perm[offset])


def prompt_indices(step, num_prompts, num_problems, seed):
    """The problems of update `step`: num_prompts consecutive positions of the stream."""
    return [problem_index(pos, num_problems, seed) for pos in range(step * num_prompts,
                                                                    (step + 1) * num_prompts)]


def minibatches(n, num_mini_batches, seeds, device="cpu"):
    """Row indices of the minibatches of one pass over n rows per seed (one seed per epoch): a
    shuffle seeded by it, cut into equal parts; with one minibatch the rows keep their order."""
    for seed in seeds:
        if num_mini_batches == 1:
            yield torch.arange(n, device=device)
            continue
        order = torch.randperm(n, generator=torch.Generator().manual_seed(seed % 2**63)).to(device)
        yield from order.chunk(num_mini_batches)


# ------------------------------------------------------------------------------------------------
# Logging
# ------------------------------------------------------------------------------------------------
class Logger:
    """A progress bar, {output_dir}/metrics.jsonl (one JSON object per logged update),
    samples.jsonl, eval.jsonl, TensorBoard when installed, and wandb with track=True. On ranks other
    than 0 every method is a no-op.

    A fresh run (initial_step 0) starts the three files anew. A resumed run cuts them back to the
    lines of updates up to initial_step, the checkpoint's update, so that lines written after that
    checkpoint by the killed run are not doubled (a line cut short by the kill goes too)."""

    def __init__(self, args, initial_step=0, enabled=True):
        self.enabled = enabled
        if not enabled:
            return
        from tqdm.auto import tqdm

        self.dir = Path(args.output_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        config = asdict(args)
        (self.dir / "args.json").write_text(json.dumps(config, indent=2, default=str))
        files = [self.dir / f"{name}.jsonl" for name in ("metrics", "eval", "samples")]
        for path in files:
            _keep_lines_up_to(path, initial_step if initial_step > 0 else -1)
        self.metrics_file, self.eval_file, self.samples_file = (open(path, "a") for path in files)
        self.start = time.time()
        self.bar = tqdm(total=args.max_steps, initial=initial_step, desc="updates",
                        dynamic_ncols=True)
        self.tb = None
        try:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(self.dir / "tb"))
        except ImportError:
            pass
        self.wandb = None
        if args.track:
            import wandb

            self.wandb = wandb.init(project=args.wandb_project, name=self.dir.name, config=config)
        self.warned, self.kl_history = set(), []

    def log(self, step, metrics):
        """One JSON line per update in metrics.jsonl."""
        if not self.enabled:
            return
        self._write(self.metrics_file, step, metrics)
        self.bar.update(1)
        self._show(step, metrics)
        self._watch(step, metrics)

    def _watch(self, step, metrics):
        """Say once, in the log, when a run looks like it is diverging: the policy moved far from
        the one that sampled (approx_kl inf, above 1, or 10 times its usual size), or its entropy
        collapsed to about 0."""
        kl, entropy = metrics.get("approx_kl"), metrics.get("entropy")
        history = self.kl_history
        usual = sorted(history)[len(history) // 2] if len(history) >= 5 else None
        far = usual is not None and kl is not None and kl > max(0.05, 10 * usual)
        if kl is not None and (not math.isfinite(kl) or kl > 1.0 or far):
            self._warn_once("approx_kl",
                            f"warning: approx_kl is {kl:.4g} at update {step} (usually "
                            f"{'n/a' if usual is None else f'{usual:.3g}'}): the policy moved far "
                            "from the one that "
                            f"sampled, a sign of divergence; consider a lower --learning_rate.")
        elif kl is not None:
            self.kl_history.append(kl)
        if entropy is not None and entropy < 1e-3:
            self._warn_once("entropy",
                            f"warning: the policy's entropy collapsed to {entropy:.2g} at update "
                            f"{step}: "
                            "its samples are (nearly) all the same, so they carry little learning "
                            "signal.")

    def _warn_once(self, kind, text):
        if kind not in self.warned:
            self.warned.add(kind)
            self.bar.write(text)

    def log_eval(self, step, metrics):
        """Evaluations go to eval.jsonl (step 0 is before any update)."""
        if not self.enabled:
            return
        self._write(self.eval_file, step, metrics)
        self._show(step, metrics)

    def _write(self, file, step, metrics):
        file.write(json.dumps({"step": step, "time": round(time.time() - self.start, 2),
                               **metrics}) + "\n")
        file.flush()
        if self.tb:
            for k, v in metrics.items():
                self.tb.add_scalar(k, v, step)
        if self.wandb:
            self.wandb.log(metrics, step=step)

    def _show(self, step, metrics):
        shown = {k: metrics[k] for k in ("reward/mean", "accuracy", "eval/accuracy",
                                         "kl_ref") if k in metrics}
        self.bar.set_postfix({k: f"{v:.3f}" for k, v in shown.items()}, refresh=True)

    def log_samples(self, step, samples, show=1):
        """samples: list of dicts (prompt, response, reward, ...). All go to samples.jsonl; `show`
        are printed so that reward hacking is visible while the run goes."""
        if not self.enabled:
            return
        for s in samples:
            self.samples_file.write(json.dumps({"step": step, **s}) + "\n")
        self.samples_file.flush()
        for s in samples[:show]:
            self.bar.write(f"[step {step}] reward={s.get('reward')}  "
                           f"{s.get('response', '')[:300]!r}")

    def close(self):
        if not self.enabled:
            return
        self.bar.close()
        for f in (self.metrics_file, self.eval_file, self.samples_file):
            f.close()
        if self.tb:
            self.tb.close()
        if self.wandb:
            self.wandb.finish()


def _keep_lines_up_to(path, step):
    """Rewrite a jsonl log keeping the whole lines whose "step" is <= step (step -1: none)."""
    if not path.exists():
        path.touch()
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            if json.loads(line)["step"] <= step:
                kept.append(line + "\n")
        except (ValueError, KeyError, TypeError):
            pass  # cut short by a kill
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(kept))
    os.replace(tmp, path)  # a kill during the rewrite must not lose the lines


# ------------------------------------------------------------------------------------------------
# Checkpoints: a folder that from_pretrained loads, plus trainer_state.pt for --resume
# ------------------------------------------------------------------------------------------------
def _non_finite(tensors, prefix=""):
    """Names of the floating-point tensors holding NaN or inf, in a (nested) dict of tensors."""
    bad = []
    for name, t in tensors.items():
        if isinstance(t, dict):
            bad += _non_finite(t, f"{prefix}{name}.")
        elif torch.is_tensor(t) and t.is_floating_point() and not bool(torch.isfinite(t).all()):
            bad.append(prefix + name)
    return bad


def save_checkpoint(path, model, tokenizer, step, optimizers=None, extra=None, merge_base=None):
    """Writes `path/` with the policy (save_pretrained, safetensors; a LoRA policy's adapter), its
    tokenizer, trainer_state.pt (the step, optimizer states and any extra state, e.g. a critic's
    weights) and manifest.json (every file's size). optimizers: {name: (module, optimizer)}.
    merge_base: a LoRA policy's base model, to also write the merged model in `path/merged`.

    Every rank calls it (under --fsdp the weights and optimizer states are gathered); rank 0 writes.
    A kill at any moment leaves either the previous checkpoint or the new one whole: the files are
    written into `path.tmp`, which `checkpoints` ignores, and renamed into place only when complete.
    Weights holding NaN or inf are never written."""
    path = Path(path)
    weights = untied(model, full_state_dict(model))
    optimizer_states = {k: optimizer_state(m, o) for k, (m, o) in (optimizers or {}).items()}
    main = not dist.is_initialized() or dist.get_rank() == 0
    bad = _non_finite({**weights, "extra": extra or {}}) if main else None
    if dist.is_initialized():  # every rank stops, not only the one that looked
        bad = all_gather_objects(bad)[0]
    if bad:
        raise FloatingPointError(f"not writing {path}: {bad[0]} ({len(bad)} tensors in all) holds "
                                 "NaN or inf. "
                                 f"The previous checkpoint is intact; --resume continues from it.")
    if not main:
        return
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)  # left by a save that was killed
    model.save_pretrained(tmp, state_dict=weights, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    if merge_base:
        _save_merged(merge_base, tmp, tokenizer)
    state = {"step": step, "optimizers": optimizer_states, "extra": extra or {}}
    torch.save(state, tmp / "trainer_state.pt")
    sizes = {str(f.relative_to(tmp)): f.stat().st_size
             for f in sorted(tmp.rglob("*")) if f.is_file()}
    (tmp / "manifest.json").write_text(json.dumps(sizes, indent=1))
    # the same step saved again: swap by renames, so that a whole copy exists at every moment
    if path.exists():
        old = path.with_name(path.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old)
    else:
        os.replace(tmp, path)


def _save_merged(base_name, adapter_dir, tokenizer):
    """--merge_lora: the adapter just written in adapter_dir, merged into a fresh copy of its base
    model, as a folder that AutoModelForCausalLM.from_pretrained loads."""
    from peft import PeftModel

    from common.models import load_policy

    merged = PeftModel.from_pretrained(load_policy(base_name), str(adapter_dir)).merge_and_unload()
    merged.save_pretrained(adapter_dir / "merged", safe_serialization=True)
    tokenizer.save_pretrained(adapter_dir / "merged")


def checkpoints(output_dir):
    """The checkpoint-N folders of output_dir, newest first; unfinished saves (checkpoint-N.tmp) are
    not among them."""
    found = [(int(m.group(1)), p) for p in Path(output_dir).glob("checkpoint-*")
             if (m := re.fullmatch(r"checkpoint-(\d+)", p.name)) and p.is_dir()]
    return [p for _, p in sorted(found, reverse=True)]


def load_trainer_state(path):
    """trainer_state.pt of a checkpoint, after checking that every file its manifest lists is there
    at its size (a truncated or missing file raises ValueError)."""
    path = Path(path)
    if (path / "manifest.json").exists():
        for name, size in json.loads((path / "manifest.json").read_text()).items():
            found = (path / name).stat().st_size if (path / name).is_file() else None
            if found != size:
                raise ValueError(f"{name} has {'no file' if found is None else f'{found} bytes'}, "
                                 f"the manifest says {size} bytes")
    return torch.load(path / "trainer_state.pt", map_location="cpu", weights_only=False)


def resume_point(output_dir, resume, max_steps):
    """(start_step, checkpoint folder, trainer state): where a run starts, decided before any model
    loads.

    Without --resume a folder that already holds checkpoints is an error (a later --resume would mix
    two runs). With --resume: the newest complete checkpoint, falling back past a corrupt one with a
    message; none at all starts from update 0, said plainly; a checkpoint beyond --max_steps is an
    error; one at --max_steps means the run is finished, and the process exits."""
    found = checkpoints(output_dir)
    if not resume:
        if found:
            raise FileExistsError(f"--output_dir {output_dir} already holds {found[0].name} from "
                                  "an earlier run: "
                                  "pass --resume to continue it, or another --output_dir for a "
                                  "new run.")
        return 0, None, None
    for path in found:
        try:
            state = load_trainer_state(path)
        # a truncated file, a bad zip, a missing trainer_state.pt: try the one before
        except Exception as e:
            print0(f"--resume: {path} is corrupt ({type(e).__name__}: {e}); falling back to the "
                   "previous checkpoint")
            continue
        if state["step"] > max_steps:
            raise ValueError(f"--resume: {path} is at update {state['step']}, beyond --max_steps "
                             f"{max_steps}; "
                             f"pass --max_steps {state['step']} or more (or another --output_dir).")
        if state["step"] == max_steps:
            print0(f"--resume: {path} is already at --max_steps {max_steps}: nothing to do "
                   f"(raise --max_steps to train further)")
            raise SystemExit(0)
        print0(f"resuming from {path} at update {state['step']}")
        return state["step"], path, state
    print0(f"--resume: no complete checkpoint in {output_dir}; starting from update 0")
    return 0, None, None


# ------------------------------------------------------------------------------------------------
# Run safety: argument checks, non-finite rewards and steps
# ------------------------------------------------------------------------------------------------
# Sizes that must be >= 1, and counts that may be 0 (0: never, or none), in whichever file defines
# them.
POSITIVE = ("max_steps", "max_new_tokens", "micro_batch_size", "eval_batch_size", "log_interval",
            "num_prompts",
            "num_generations", "num_ppo_epochs", "num_mini_batches", "num_envs", "num_steps",
            "max_episode_steps", "eval_max_new_tokens")
NON_NEGATIVE = ("num_eval_problems", "eval_interval", "save_interval", "warmup_steps",
                "num_few_shot")


def check_common_args(args):
    """The checks every algorithm file shares, before any model loads, each naming the fix: sizes,
    sampling, the output folder, wandb."""
    defaults = {f.name: f.default for f in fields(args)}
    for name in POSITIVE + NON_NEGATIVE:
        value, low = getattr(args, name, None), 1 if name in POSITIVE else 0
        if value is not None and value < low:
            raise ValueError(f"--{name} {value}: must be >= {low} (the default is "
                             f"{defaults[name]}).")
    if not args.temperature > 0 or not 0 < args.top_p <= 1:
        raise ValueError(f"--temperature {args.temperature} --top_p {args.top_p}: training samples "
                         "need a "
                         f"temperature > 0 (log-probs are divided by it) and top_p in (0, 1].")
    check_output_dir(args.output_dir)
    if args.lora_r and importlib.util.find_spec("peft") is None:
        raise ImportError("--lora_r needs peft: pip install peft (or --lora_r 0 for full "
                          "fine-tuning)")
    if args.merge_lora and not args.lora_r:
        raise ValueError("--merge_lora merges LoRA adapters, but --lora_r is 0 (full fine-tuning "
                         "saves whole models already): drop --merge_lora or set --lora_r.")
    if args.fsdp and "RANK" not in os.environ:
        raise ValueError("--fsdp shards the models over the processes that torchrun starts: run "
                         "`torchrun --nproc_per_node N <file>.py --fsdp ...` (N = 1 works too).")
    if args.compile and args.fsdp:
        raise ValueError("--compile decodes with a whole, compiled model; under --fsdp the weights "
                         "are gathered from shards for each rollout: drop one of the two.")
    if args.track and importlib.util.find_spec("wandb") is None:
        raise ImportError("--track logs to Weights & Biases, which is not installed: pip install "
                          "wandb, or drop "
                          "--track (metrics.jsonl and TensorBoard logs are written anyway).")


def check_output_dir(path, flag="--output_dir"):
    """Write a probe file where the output will go (the folder, or its nearest existing parent), so
    that an unwritable path fails before hours of work rather than at the first save. Nothing is
    left behind."""
    path = Path(path).expanduser()
    existing = next(p for p in [path, *path.parents] if p.exists())
    if not existing.is_dir():
        raise NotADirectoryError(f"{flag} {path}: {existing} is a file, not a folder; pass a "
                                 "folder (it is created "
                                 f"if missing).")
    try:
        tempfile.TemporaryFile(dir=existing).close()
    except OSError as e:
        raise PermissionError(f"{flag} {path} can't be written ({e.strerror or e} in {existing}): "
                              "pass a folder "
                              f"you can write to.") from None


def check_rewards(rewards, step, task, describe):
    """A NaN or inf reward would turn every weight into NaN through the update: stop before it,
    naming the sample. rewards: [N] or [N, T]; describe(i) or describe(i, t) says which problem that
    entry is."""
    bad = (~torch.isfinite(rewards)).nonzero()
    if len(bad):
        where = tuple(bad[0].tolist())
        raise FloatingPointError(
            f"reward {rewards[where].item()} for sample "
            f"{where[0]}{f', step {where[1]}' if len(where) > 1 else ''} "
            f"({describe(*where)}) of task {task!r} in update {step}: rewards must be finite "
            "numbers. The run stops "
            "before this update, so no checkpoint holds it; fix the reward function (or PRM) that "
            "produced it.")


class StepGuard:
    """Skips an optimizer step whose loss or gradient norm is NaN or inf, on every rank alike, and
    stops the run after `patience` skips in a row: one bad batch must not turn every weight into
    NaN.

        if guard.ok(loss, grad_norm):   # False: the step is skipped (and counted)
            optimizer.step()
    """

    def __init__(self, patience=3):
        self.patience, self.in_a_row, self.skipped = patience, 0, 0

    def ok(self, *values):
        bad = torch.tensor([0.0 if all(math.isfinite(float(v)) for v in values) else 1.0])
        # one rank's NaN skips the step everywhere
        if dist.is_initialized() and dist.get_world_size() > 1:
            bad = bad.to(_collective_device())
            dist.all_reduce(bad, op=dist.ReduceOp.MAX)
        if bad.item() == 0:
            self.in_a_row = 0
            return True
        self.in_a_row += 1
        self.skipped += 1
        print0("non-finite loss or gradient norm "
               f"({', '.join(f'{float(v):.4g}' for v in values)}): optimizer step "
               f"skipped ({self.in_a_row} in a row)")
        if self.in_a_row >= self.patience:
            raise FloatingPointError(
                f"{self.in_a_row} optimizer steps in a row had a NaN or inf loss or gradient norm: "
                "the run stops "
                "here. Lower --learning_rate, check the rewards, or try without --bf16; --resume "
                "continues from "
                f"the last checkpoint, which holds finite weights.")
        return False

    def pop(self):
        """Steps skipped since the last call (the `skipped_steps` metric of one update)."""
        skipped, self.skipped = self.skipped, 0
        return skipped


def _collective_device():
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
