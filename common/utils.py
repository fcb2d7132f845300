"""Small numeric helpers (log-probs, masks, KL estimators, GAE, group baselines) and plumbing (distributed,
seeding, logging, checkpoints). Each numeric helper is unit-tested once in tests/test_utils.py; the algorithm
files combine them, and keep every line that decides the algorithm's math to themselves."""

import json
import os
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint
from transformers.modeling_outputs import BaseModelOutputWithPast

# Recent transformers (5.24 here) call the KV cache `cache`, in forward's arguments and in its outputs: the old
# `past_key_values` warns there and is to go in 5.40, while 4.x knows only the old one (and would silently ignore
# an unknown `cache=`), so the name is read off the installed version's output class.
KV_CACHE = "cache" if "cache" in BaseModelOutputWithPast.__dataclass_fields__ else "past_key_values"


# ---------------------------------------------------------------------------------------------------------
# Log-probs and entropy
# ---------------------------------------------------------------------------------------------------------
def position_ids_from_mask(mask):
    # CRUCIAL: with left padding the first real token must get position 0, not the pad count.
    return (mask.cumsum(-1) - 1).clamp(min=0)


def identical_rows(x):
    """x [B, L] -> (first, inverse): the first row index of each distinct row of x, ascending, and for every row
    the slot of its distinct row, so that x[first][inverse] == x (both are aranges when all rows differ). Used to
    run a group's shared prompt once."""
    _, inverse = torch.unique(x, dim=0, return_inverse=True)  # slots in sorted order of the rows' values
    rows = torch.arange(x.shape[0], device=x.device)
    first = torch.full((int(inverse.max()) + 1,), x.shape[0], device=x.device).scatter_reduce(0, inverse, rows, "amin")
    order = first.argsort()  # renumber the slots by first appearance
    return first[order], order.argsort()[inverse]


def logprobs_from_logits(logits, labels, temperature=1.0):
    """logits [..., V], labels [...] -> log softmax(logits / T)[label], computed in float32."""
    logp = F.log_softmax(logits.float() / temperature, dim=-1)
    return logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1)


def _chunk_logprobs_entropy(hidden, labels, weight, bias, temperature):
    logits = F.linear(hidden, weight, bias).float() / temperature  # [c, R, V], only one chunk alive at a time
    logp = F.log_softmax(logits, dim=-1)
    entropy = -(logp.exp() * logp).sum(-1)  # [c, R]
    return logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1), entropy


def backbone_and_head(model):
    """(transformer body, lm_head) of an HF causal LM, also through a PEFT wrapper."""
    if hasattr(model, "get_base_model"):
        model = model.get_base_model()
    return model.base_model, model.get_output_embeddings()


def _body_forward(model, body, input_ids, attention_mask, prompt_len):
    """Hidden states [B, T, H]. Rows with identical prompt columns (a GRPO group: G responses to one question)
    run the prompt once; its keys/values are copied out to every row of the group, and the responses attend to
    them. Gradients flow back through the copies, so this is the same function of the weights as a plain
    forward, at a fraction of the prompt's cost in forward and backward."""
    positions = position_ids_from_mask(attention_mask)
    distinct = None
    # HF turns the cache off under gradient checkpointing, so prompts are shared only without it.
    if prompt_len >= 1 and not getattr(body, "gradient_checkpointing", False):
        distinct, inverse = identical_rows(torch.cat([input_ids[:, :prompt_len], attention_mask[:, :prompt_len]], 1))
    if distinct is None or len(distinct) == len(input_ids):
        return body(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions).last_hidden_state
    prompt = body(input_ids=input_ids[distinct, :prompt_len], attention_mask=attention_mask[distinct, :prompt_len],
                  position_ids=positions[distinct, :prompt_len], use_cache=True)
    cache = getattr(prompt, KV_CACHE)
    cache.batch_select_indices(inverse)
    rest = body(input_ids=input_ids[:, prompt_len:], attention_mask=attention_mask,
                position_ids=positions[:, prompt_len:], use_cache=True, **{KV_CACHE: cache})
    return torch.cat([prompt.last_hidden_state[inverse], rest.last_hidden_state], dim=1)


def token_logprobs(model, input_ids, attention_mask, response_len, temperature=1.0, chunk_rows=None,
                   return_hidden=False):
    """Log-prob and entropy of each of the last `response_len` tokens of `input_ids`, given the tokens before.

    input_ids, attention_mask: [B, T] = [left-padded prompt ; right-padded response].
    Returns (logprobs [B, R], entropy [B, R]) and, with return_hidden, the body's hidden states [B, T, H].
    The lm_head runs on a few rows at a time and, when gradients are on, is recomputed in the backward pass,
    so the [B, R, V] float32 logits never exist at once (V is 49k-152k: that tensor would dominate memory).
    """
    body, head = backbone_and_head(model)
    # Columns that are padding in every row (left of the longest prompt, right of the longest response) change
    # nothing for the real tokens, so they are cut before the forward and zero-filled after: a micro-batch
    # costs what its own longest sequence costs, not the whole rollout's.
    T, full_R = input_ids.shape[1], response_len
    used = attention_mask.bool().any(0).nonzero()[:, 0]
    lo = min(int(used[0]), T - response_len - 1) if len(used) else 0
    hi = max(int(used[-1]) + 1, T - response_len + 1) if len(used) else T
    input_ids, attention_mask = input_ids[:, lo:hi], attention_mask[:, lo:hi]
    response_len = response_len - (T - hi)
    hidden = _body_forward(model, body, input_ids, attention_mask, input_ids.shape[1] - response_len)  # [B, T', H]
    # CRUCIAL: the hidden state at position t predicts token t+1, so the R response tokens (the last R
    # columns) are scored by the R hidden states just before them.
    h = hidden[:, -response_len - 1:-1]  # [B, R, H]
    labels = input_ids[:, -response_len:]  # [B, R]
    if chunk_rows is None:
        chunk_rows = max(1, (1 << 26) // max(1, response_len * head.weight.shape[0]))  # ~256 MB of fp32 logits
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
def batched_token_logprobs(model, input_ids, attention_mask, response_len, temperature=1.0, batch_size=8):
    """`token_logprobs` without gradients, `batch_size` rows at a time: log-probs of a frozen or old policy."""
    return torch.cat([token_logprobs(model, input_ids[i:i + batch_size], attention_mask[i:i + batch_size],
                                     response_len, temperature)[0]
                      for i in range(0, input_ids.shape[0], batch_size)])


# ---------------------------------------------------------------------------------------------------------
# Masked statistics
# ---------------------------------------------------------------------------------------------------------
def masked_sum(x, mask, dim=None):
    return (x * mask).sum() if dim is None else (x * mask).sum(dim)


def masked_mean(x, mask, dim=None):
    """Mean over the entries where mask is 1. An all-zero mask gives 0, not NaN."""
    return masked_sum(x, mask, dim) / (mask.sum() if dim is None else mask.sum(dim)).clamp(min=1)


def masked_var(x, mask, unbiased=True):
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    n = mask.sum()
    if unbiased and n > 1:
        var = var * n / (n - 1)
    return var


def masked_whiten(x, mask, shift_mean=True, eps=1e-8):
    """(x - mean) / std over the masked entries; masked-out entries come back as 0."""
    mean, var = masked_mean(x, mask), masked_var(x, mask)
    out = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return out * mask


def explained_variance(values, returns, mask):
    """1 - Var(returns - values) / Var(returns): 1 is a perfect critic, 0 no better than a constant."""
    var_ret = masked_var(returns, mask)
    return (1 - masked_var(returns - values, mask) / var_ret).item() if var_ret > 0 else float("nan")


# ---------------------------------------------------------------------------------------------------------
# KL estimators (Schulman, "Approximating KL divergence"), all per token, for samples x ~ pi
# ---------------------------------------------------------------------------------------------------------
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


# ---------------------------------------------------------------------------------------------------------
# Advantages
# ---------------------------------------------------------------------------------------------------------
def step_gae(rewards, values, next_value, dones, gamma, lam):
    """Generalised advantage estimation along the last dimension.

    rewards, values, dones: [N, T]; dones[:, t] = 1 when the episode ended at step t (no bootstrap from t+1).
    next_value: [N], the value of the state after step T-1 (a segment cut mid-episode is bootstrapped with it).
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
    """GAE over right-padded response tokens [B, R]: the episode ends at each row's last real token, whose
    successor has value 0. Padding gets advantage and return 0."""
    mask = mask.to(rewards.dtype)
    # CRUCIAL: token t is terminal when token t+1 is padding (or t is the last column).
    dones = 1.0 - torch.cat([mask[:, 1:], torch.zeros_like(mask[:, :1])], dim=1)
    advantages, returns = step_gae(rewards * mask, values * mask, torch.zeros_like(rewards[:, 0]), dones,
                                   gamma, lam)
    return advantages * mask, returns * mask


def group_advantages(rewards, group_size, baseline="mean_std", eps=1e-4):
    """Advantages from the other samples of the same prompt. rewards: [N * G], groups are consecutive.

    baseline: "mean" (r - mean), "mean_std" ((r - mean) / (std + eps), std unbiased as in torch/TRL; a group
    whose rewards are all equal gets 0), or "loo" (leave-one-out: r_i - mean_{j != i} r_j, RLOO).
    """
    r = rewards.view(-1, group_size)  # [N, G]
    mean = r.mean(dim=1, keepdim=True)
    if baseline == "mean":
        adv = r - mean
    elif baseline == "mean_std":
        adv = (r - mean) / (r.std(dim=1, keepdim=True) + eps)
    elif baseline == "loo":
        if group_size < 2:
            raise ValueError("the leave-one-out baseline needs at least 2 samples per prompt")
        adv = r - (r.sum(dim=1, keepdim=True) - r) / (group_size - 1)
    else:
        raise ValueError(f"unknown baseline {baseline!r}: use 'mean', 'mean_std' or 'loo'")
    return adv.reshape(-1)


def discounted_returns(rewards, gamma):
    """G_t = sum_k gamma^k r_{t+k} along the last dimension."""
    out = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[..., 0])
    for t in reversed(range(rewards.shape[-1])):
        running = rewards[..., t] + gamma * running
        out[..., t] = running
    return out


# ---------------------------------------------------------------------------------------------------------
# Distributed (torchrun sets RANK/WORLD_SIZE/LOCAL_RANK; without them this is the world_size == 1 case)
# ---------------------------------------------------------------------------------------------------------
@dataclass
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self):
        return self.rank == 0


def init_distributed(cpu=False):
    """Initialise from the torchrun environment: nccl on CUDA, gloo on CPU."""
    use_cuda = torch.cuda.is_available() and not cpu
    if "RANK" not in os.environ:
        return DistInfo(device=torch.device("cuda" if use_cuda else "cpu"))
    rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    if use_cuda:
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
        # N processes on one CPU would each start one thread per core and fight over them.
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))
    if not dist.is_initialized():
        dist.init_process_group("nccl" if use_cuda else "gloo", device_id=device if use_cuda else None)
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
    grads = [p.grad for p in module.parameters() if p.requires_grad and p.grad is not None]
    handles = [dist.all_reduce(g, async_op=True) for g in grads]
    for h, g in zip(handles, grads):
        h.wait()
        g.div_(world)


def set_seed(seed):
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np

        np.random.seed(seed % 2**32)
    except ImportError:
        pass


def sample_seed(seed, step, sample_index):
    """Sampling seed of one response, from (run seed, update, global sample index). Runs are reproducible,
    the samples do not depend on how many ranks share the batch, and a resumed run draws exactly what the
    uninterrupted run would have."""
    return (seed * 1_000_003 + step) * 1_000_003 + sample_index


# ---------------------------------------------------------------------------------------------------------
# Logging
# ---------------------------------------------------------------------------------------------------------
class Logger:
    """A progress bar, {output_dir}/metrics.jsonl (one JSON object per logged update), samples.jsonl,
    TensorBoard when installed, and wandb with track=True. On ranks other than 0 every method is a no-op."""

    def __init__(self, output_dir, args, total_steps, initial_step=0, enabled=True, track=False,
                 project="mathrl", run_name=None):
        self.enabled = enabled
        if not enabled:
            return
        from tqdm.auto import tqdm

        self.dir = Path(output_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        config = asdict(args) if hasattr(args, "__dataclass_fields__") else dict(args)
        (self.dir / "args.json").write_text(json.dumps(config, indent=2, default=str))
        self.metrics_file = open(self.dir / "metrics.jsonl", "a")
        self.eval_file = open(self.dir / "eval.jsonl", "a")
        self.samples_file = open(self.dir / "samples.jsonl", "a")
        self.start = time.time()
        self.bar = tqdm(total=total_steps, initial=initial_step, desc="updates", dynamic_ncols=True)
        self.tb = None
        try:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(self.dir / "tb"))
        except ImportError:
            pass
        self.wandb = None
        if track:
            import wandb

            self.wandb = wandb.init(project=project, name=run_name or self.dir.name, config=config)

    def log(self, step, metrics):
        """One JSON line per update in metrics.jsonl."""
        if not self.enabled:
            return
        self._write(self.metrics_file, step, metrics)
        self.bar.update(1)
        self._show(step, metrics)

    def log_eval(self, step, metrics):
        """Evaluations go to eval.jsonl (step 0 is before any update)."""
        if not self.enabled:
            return
        self._write(self.eval_file, step, metrics)
        self._show(step, metrics)

    def _write(self, file, step, metrics):
        file.write(json.dumps({"step": step, "time": round(time.time() - self.start, 2), **metrics}) + "\n")
        file.flush()
        if self.tb:
            for k, v in metrics.items():
                self.tb.add_scalar(k, v, step)
        if self.wandb:
            self.wandb.log(metrics, step=step)

    def _show(self, step, metrics):
        shown = {k: metrics[k] for k in ("reward/mean", "accuracy", "eval/accuracy", "kl_ref") if k in metrics}
        self.bar.set_postfix({k: f"{v:.3f}" for k, v in shown.items()}, refresh=True)

    def log_samples(self, step, samples, show=1):
        """samples: list of dicts (prompt, response, reward, ...). All go to samples.jsonl; `show` are printed
        so that reward hacking is visible while the run goes."""
        if not self.enabled:
            return
        for s in samples:
            self.samples_file.write(json.dumps({"step": step, **s}) + "\n")
        self.samples_file.flush()
        for s in samples[:show]:
            self.bar.write(f"[step {step}] reward={s.get('reward')}  {s.get('response', '')[:300]!r}")

    def write(self, text):
        if self.enabled:
            self.bar.write(text)

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


# ---------------------------------------------------------------------------------------------------------
# Checkpoints: a folder that from_pretrained loads, plus trainer_state.pt for --resume
# ---------------------------------------------------------------------------------------------------------
def save_checkpoint(path, model, tokenizer, step, optimizers=None, extra=None):
    """Writes `path/` with the policy (save_pretrained, safetensors), its tokenizer, and trainer_state.pt
    holding the step, optimizer states and any extra state (e.g. a critic's weights)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    state = {"step": step, "optimizers": {k: o.state_dict() for k, o in (optimizers or {}).items()},
             "extra": extra or {}}
    torch.save(state, tmp / "trainer_state.pt")
    if path.exists():
        import shutil

        shutil.rmtree(path)
    os.replace(tmp, path)  # a crash mid-save leaves the previous checkpoint intact


def latest_checkpoint(output_dir):
    """The checkpoint-N folder with the largest N in output_dir, or None."""
    found = [p for p in Path(output_dir).glob("checkpoint-*") if (p / "trainer_state.pt").exists()]
    return max(found, key=lambda p: int(p.name.split("-")[-1]), default=None)


def load_trainer_state(path):
    return torch.load(Path(path) / "trainer_state.pt", map_location="cpu", weights_only=False)
