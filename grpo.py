"""GRPO: Group Relative Policy Optimization on verifiable math. Docs: docs/grpo.md

Paper: Shao et al. 2024, "DeepSeekMath" (arXiv:2402.03300), with the loss variants of TRL's
GRPOTrainer: Dr.GRPO (Liu et al. 2025, arXiv:2503.20783), DAPO's token-level loss and clip-higher
(Yu et al. 2025, arXiv:2503.14476).

For every prompt, sample G responses, grade each with the task's verifier, and score each response
against its own group:
    A_i    = (r_i - mean(r_group)) / (std(r_group) + eps)          (Dr.GRPO: no division by the std)
    rho_it = pi(o_it | q, o_i<t) / pi_old(o_it | q, o_i<t)
    L      = agg_it [ -min(rho_it A_i, clip(rho_it, 1 - eps, 1 + eps_high) A_i) + beta KL_it ]
agg: per-sequence means, then their mean (grpo); a token mean over the local batch (bnpo) or the
global batch (dapo); or a constant 1 / (N * max_new_tokens) (dr_grpo). KL_it: the k3 estimate of the
KL to the frozen reference (--kl_estimator; --kl_penalty reward puts it in r_i instead).

Simplified versus the paper and TRL:
- one process both samples and learns, with the HF model and a KV-cached sampling loop (no vLLM);
- rewards come from rule-based verifiers (common/env.py), not a reward model;
- with one epoch of one minibatch (the default) the ratio is exactly 1: pi_old is the detached
  policy.

Launch:
    python grpo.py                        # CPU, offline: SmolLM2-135M-Instruct, arithmetic
    python grpo.py --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct --dataset_name gsm8k --bf16
    torchrun --nproc_per_node 8 grpo.py --model_name_or_path Qwen/Qwen2.5-1.5B-Instruct \\
        --dataset_name gsm8k --bf16 --num_prompts 64
"""

import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Literal, Optional

import torch

from common.args import TrainArgs, lr_at, parse_args, resolve_schedule
from common.env import make_envs
from common.grader import grader_counts
from common.evaluation import evaluate
from common.fast_sampler import fast_generate
from common.models import check_model_name, load_tokenizer, reference_policy, trained_policy
from common.sampler import Generation, decode_responses, encode_prompts
from common.sharding import clip_grad_norm, load_optimizer_state
from common.checkpoints import resume_point, save_checkpoint
from common.checks import StepGuard, check_batch, check_common_args, check_rewards
from common.distributed import (all_reduce_sum, average_gradients, init_distributed, minibatches,
                                print0, prompt_indices, sample_seed, set_seed)
from common.logger import Logger, every, global_metrics, mean_of, report_end
from common.logprobs import batched_token_logprobs, token_logprobs
from common.numerics import kl_estimate, kl_k3, masked_mean, masked_sum, mismatch_stats


@dataclass
class Args(TrainArgs):
    # ---- optimisation
    learning_rate: float = 2e-5
    """AdamW learning rate of the policy"""
    lr_scheduler: Literal["constant", "linear", "cosine", "polynomial"] = "constant"
    """schedule after the warmup (linear, cosine, polynomial: down to 0 at max_steps)"""
    warmup_steps: int = 0
    """updates of linear learning-rate warmup"""
    warmup_ratio: Optional[float] = None
    """when given, warmup_steps = this fraction of max_steps"""
    max_grad_norm: float = 1.0
    """gradient-norm clip"""
    max_steps: int = 20
    """policy updates (one rollout batch each)"""
    num_train_epochs: Optional[float] = None
    """when given, max_steps covers this many passes over the training problems"""
    micro_batch_size: int = 8
    """sequences per forward/backward; gradients accumulate over micro-batches (a GPU wants more:
    a 1.5B model's update on an H200 ran at 0.25 MFU with 8, 0.35 with 32)"""
    seed: int = 0
    """seeds prompt order, sampling and model init: runs are reproducible"""
    # ---- sampling
    max_new_tokens: int = 64
    """response length limit, in tokens"""
    temperature: float = 0.7
    """sampling temperature (also applied to the training log-probs)"""
    top_p: float = 1.0
    """nucleus sampling mass"""
    # ---- the algorithm
    num_prompts: int = 4
    """prompts per update, over all ranks"""
    num_generations: int = 8
    """G: responses sampled per prompt (the group)"""
    num_ppo_epochs: int = 1
    """passes over each rollout batch"""
    num_mini_batches: int = 1
    """optimizer steps per pass: the rollout batch is shuffled and cut into this many"""
    epsilon: float = 0.2
    """clip range of the ratio"""
    epsilon_high: Optional[float] = None
    """a higher upper clip range (DAPO's clip-higher: 0.28; default: epsilon)"""
    beta: float = 0.0
    """weight of the KL to the frozen reference (0: no reference is loaded)"""
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    """per-token estimate of the KL: k1 log-ratio, k2 its square / 2, k3 the GRPO paper's"""
    kl_penalty: Literal["loss", "reward"] = "loss"
    """where the KL enters: a loss term per token, or a cost in the reward"""
    loss_type: Literal["grpo", "bnpo", "dr_grpo", "dapo"] = "grpo"
    """how per-token losses are aggregated (see the docstring; dr_grpo also drops the std from A)"""
    drop_zero_std_groups: bool = False
    """leave groups whose G rewards are all equal (advantage 0) out of the loss and normaliser"""
    importance_sampling_level: Literal["token", "sequence"] = "token"
    """the ratio per token, or per response (GSPO: the exp of the mean token log-ratio)"""
    dynamic_sampling: bool = False
    """DAPO: sample more prompts until num_prompts groups have rewards that are not all equal"""
    max_sampling_rounds: int = 4
    """dynamic sampling: rounds of num_prompts prompts at most (then equal groups fill the batch)"""
    tis_cap: float = 0.0
    """truncated importance sampling: tokens weigh min(pi_trainer / pi_sampler, this) (0: off)"""


def check_args(args, world_size):
    """Every size error before any model loads, each with the fix."""
    check_common_args(args)
    if args.num_generations < 2:
        raise ValueError("--num_generations must be >= 2: the group baseline needs two samples.")
    check_batch(args, world_size, args.num_prompts, args.num_generations)
    check_model_name(args.model_name_or_path)


# ------------------------------------------------------------------------------------------------
# Advantages
# ------------------------------------------------------------------------------------------------
def kl_penalised(scores, kl, response_mask, beta):
    """--kl_penalty reward: each response's score minus beta times its summed per-token KL. [N]"""
    return scores if kl is None else scores - beta * masked_sum(kl, response_mask.float(), dim=1)


def compute_advantages(rewards, group_size, scale=True):
    """[N * G] rewards -> [N * G] advantages: each response against the others of its group. Dr.GRPO
    (scale=False) keeps the std out: it up-weights questions whose rewards barely vary."""
    r = rewards.view(-1, group_size)  # [N, G]: consecutive rows form a group
    advantages = r - r.mean(dim=1, keepdim=True)
    if scale:  # a group of equal rewards gets 0; the std is unbiased, as torch and TRL take it
        advantages = advantages / (r.std(dim=1, keepdim=True) + 1e-4)
    return advantages.reshape(-1)


# ------------------------------------------------------------------------------------------------
# Loss
# ------------------------------------------------------------------------------------------------
def loss_normaliser(loss_type, response_mask, max_new_tokens, world_size):
    """The denominator of a whole minibatch, fixed before micro-batching so that the micro-batch
    losses sum to the minibatch loss (1 x 8 and 8 x 1 give the same gradient). Rows without tokens
    (a dropped group) count nowhere."""
    sequences = (response_mask.sum(1) > 0).sum().clamp(min=1).item()
    if loss_type == "grpo":
        return float(sequences)
    if loss_type == "bnpo":
        return response_mask.sum().clamp(min=1).item()  # tokens in this rank's minibatch
    if loss_type == "dapo":
        # tokens in the global minibatch, per rank: after gradients are averaged over ranks this is
        # a token mean over everything every rank generated.
        return (all_reduce_sum(response_mask.sum().float()) / world_size).clamp(min=1).item()
    if loss_type == "dr_grpo":
        return float(sequences * max_new_tokens)
    raise ValueError(f"unknown loss_type {loss_type!r}")


def aggregate(per_token, mask, loss_type, normaliser):
    """[b, R] per-token losses -> this micro-batch's share of the minibatch loss."""
    if loss_type == "grpo":
        # CRUCIAL: each sequence is a mean over its own tokens: long and short answers weigh alike.
        return (masked_sum(per_token, mask, dim=1) / mask.sum(1).clamp(min=1)).sum() / normaliser
    return masked_sum(per_token, mask) / normaliser


def policy_loss(logprobs, old_logprobs, advantages, response_mask, normaliser, args,
                ref_logprobs=None, sampler_logprobs=None):
    """Clipped surrogate per token. logprobs, old_logprobs [b, R], advantages [b]; ref_logprobs
    [b, R] adds the KL term (None: no KL in the loss); sampler_logprobs [b, R] with --tis_cap weighs
    each token by the trainer's probability over the sampler's, truncated."""
    mask = response_mask.float()
    log_ratio = logprobs - old_logprobs  # [b, R]
    if args.importance_sampling_level == "sequence":  # GSPO: one ratio per response, a mean
        log_ratio = (masked_sum(log_ratio, mask, dim=1) / mask.sum(1).clamp(min=1))[:, None]
    ratio = torch.exp(log_ratio).expand_as(logprobs)  # [b, R]
    eps_high = args.epsilon if args.epsilon_high is None else args.epsilon_high
    advantages = advantages[:, None]  # [b, 1]: every token of a response shares its advantage
    pg_loss = torch.max(-advantages * ratio,
                        -advantages * ratio.clamp(1 - args.epsilon, 1 + eps_high))  # [b, R]
    per_token = pg_loss
    if args.tis_cap and sampler_logprobs is not None:  # the samples came from the sampler
        per_token = per_token * torch.exp(old_logprobs - sampler_logprobs).clamp(max=args.tis_cap)
    if ref_logprobs is not None:  # the KL as a loss term, differentiated through log pi
        kl = kl_estimate(logprobs, ref_logprobs, args.kl_estimator)  # [b, R]
        per_token = per_token + args.beta * kl
    loss = aggregate(per_token, mask, args.loss_type, normaliser)
    with torch.no_grad():
        clipped = (((ratio < 1 - args.epsilon) & (advantages < 0))
                   | ((ratio > 1 + eps_high) & (advantages > 0)))
        stats = {"clipfrac": masked_mean(clipped.float(), mask).item(),
                 "approx_kl": masked_mean(kl_k3(old_logprobs, logprobs), mask).item(),  # old vs new
                 "pg_loss": masked_mean(pg_loss, mask).item()}
        if ref_logprobs is not None:
            stats["kl_ref"] = masked_mean(kl, mask).item()
    return loss, stats


# ------------------------------------------------------------------------------------------------
# Rollout
# ------------------------------------------------------------------------------------------------
def rollout(policy, tokenizer, env, indices, seeds, args, autocast_dtype):
    """Sample G responses for each of this rank's prompts and grade them."""
    G = args.num_generations
    prompts = encode_prompts(tokenizer, [env.reset(i) for i in indices])
    prompts = [p for p in prompts for _ in range(G)]  # consecutive rows share a prompt
    gen = fast_generate(policy, tokenizer, prompts, args.max_new_tokens, args.temperature, args.top_p,
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


def sample_groups(policy, tokenizer, env, step, first, local_prompts, args, autocast_dtype):
    """This rank's groups of an update: one rollout of its local_prompts prompts, or with
    --dynamic_sampling (DAPO) rounds of them until local_prompts groups have rewards that differ
    (groups of equal rewards fill what max_sampling_rounds leave short). Each update owns
    max_sampling_rounds batches of the prompt stream, so the draws never depend on an earlier
    update's luck and a resumed run draws the same. -> rollout's four values, each group's problem,
    and the rounds used."""
    G, rounds = args.num_generations, args.max_sampling_rounds if args.dynamic_sampling else 1
    kept, spare = [], []  # (round's rollout, problem, group) of groups whose rewards differ / not
    for used in range(1, rounds + 1):
        position = step * rounds + used - 1  # without dynamic sampling: the update itself
        indices = prompt_indices(position, args.num_prompts, len(env), args.seed)
        indices = indices[first:first + local_prompts]
        seeds = [sample_seed(args.seed, position, first * G + k) for k in range(local_prompts * G)]
        out = rollout(policy, tokenizer, env, indices, seeds, args, autocast_dtype)
        if not args.dynamic_sampling:
            return (*out, indices, 1)
        differ = out[2].view(-1, G).std(dim=1) > 0
        for g, problem in enumerate(indices):
            (kept if differ[g] else spare).append((out, problem, g))
        if len(kept) >= local_prompts:
            break
    groups = (kept + spare)[:local_prompts]
    outs, rows = [o for o, _, _ in groups], [torch.arange(g * G, (g + 1) * G) for _, _, g in groups]
    gen = Generation.cat([o[0].rows(r) for o, r in zip(outs, rows)], tokenizer.pad_token_id)
    texts = [o[1][k] for o, r in zip(outs, rows) for k in r.tolist()]
    scores, correct = (torch.cat([o[j][r] for o, r in zip(outs, rows)]) for j in (2, 3))
    return gen, texts, scores, correct, [problem for _, problem, _ in groups], used


# ------------------------------------------------------------------------------------------------
# Main: setup -> models -> update loop -> eval, logging, checkpoint
# ------------------------------------------------------------------------------------------------
def main(args):
    # ---- setup: distributed, seed, env (the env first: a bad task or file fails before any model)
    dist_info = init_distributed()
    rank, world, device = dist_info.rank, dist_info.world_size, dist_info.device
    check_args(args, world)
    set_seed(args.seed)
    env, eval_env = make_envs(args, say=print0)
    resolve_schedule(args, len(env), args.num_prompts)
    local_prompts, G = args.num_prompts // world, args.num_generations
    N = local_prompts * G  # samples per rank per update
    autocast_dtype = torch.bfloat16 if args.bf16 else None
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if args.bf16 else nullcontext()
    print0(f"GRPO | {world} process(es) on {device} | {args.num_prompts} prompts x {G} samples per "
           f"update ({N} per rank) | {args.num_ppo_epochs} epoch(s) x {args.num_mini_batches} "
           f"minibatch(es) of micro-batches of {args.micro_batch_size} | {len(env)} problems | "
           f"{args.max_steps} updates")

    start_step, resume_from, state = resume_point(args.output_dir, args.resume, args.max_steps)

    # ---- models
    tokenizer = load_tokenizer(args.model_name_or_path)
    policy = trained_policy(args, resume_from, device)  # LoRA (--lora_r), FSDP2 (--fsdp)
    ref_policy = reference_policy(args, policy, device) if args.beta > 0 else None
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad],
                                  lr=args.learning_rate, weight_decay=0.0)
    if state is not None:
        load_optimizer_state(policy, optimizer, state["optimizers"]["policy"])
    guard = StepGuard()  # a NaN or inf loss or gradient skips the optimizer step
    logger = Logger(args, start_step, enabled=dist_info.is_main)

    def run_eval(step):
        if eval_env is None:
            return None
        acc = evaluate(policy, tokenizer, eval_env, args.num_eval_problems, args.max_new_tokens,
                       args.eval_batch_size, autocast_dtype)
        logger.log_eval(step, {"eval/accuracy": acc})
        print0(f"[update {step}] held-out greedy accuracy: {acc:.3f}")
        return acc

    def save(step):  # on every rank: under --fsdp the weights and optimizer states are gathered
        save_checkpoint(f"{args.output_dir}/checkpoint-{step}", policy, tokenizer, step,
                        {"policy": (policy, optimizer)},
                        merge_base=args.merge_lora and args.model_name_or_path)

    first_acc = run_eval(0) if args.eval_on_start and start_step == 0 else None

    # ---- update loop
    for step in range(start_step, args.max_steps):
        t0 = time.time()
        timeouts = grader_counts()["timeouts"]  # symbolic grades cut short by the time budget
        # ---- rollout: this rank's contiguous share of the global prompts; seeds follow the global
        # sample index, so 1 process and N processes draw the same samples for the same update.
        first = rank * local_prompts
        gen, texts, scores, correct, indices, rounds = sample_groups(  # grpo: DAPO's resampling
            policy, tokenizer, env, step, first, local_prompts, args, autocast_dtype)
        check_rewards(scores, step + 1, args.dataset_name, lambda k: f"problem {indices[k // G]}")
        input_ids, attention_mask = gen.sequences()  # [N, P + R]
        response_mask = gen.response_mask  # [N, R]
        mask = response_mask.float()
        R = response_mask.shape[1]
        t_rollout = time.time() - t0

        # ---- log-probs of the behaviour policy and of the reference, before any update
        mb, old_logprobs, ref_logprobs, kl = args.micro_batch_size, None, None, None
        with autocast:
            if args.num_ppo_epochs > 1 or args.num_mini_batches > 1:  # else: the detached policy
                old_logprobs = batched_token_logprobs(policy, gen, args.temperature, mb)
            if ref_policy is not None:
                ref_logprobs = batched_token_logprobs(ref_policy, gen, args.temperature, mb)
        if ref_logprobs is not None and args.kl_penalty == "reward":  # a cost in the reward
            kl = kl_estimate(gen.logprobs, ref_logprobs, args.kl_estimator)  # the sampler's
            ref_logprobs = None

        # ---- advantages: each response's reward against its group's
        rewards = kl_penalised(scores, kl, response_mask, args.beta)  # [N]
        advantages = compute_advantages(rewards, G, scale=args.loss_type != "dr_grpo")  # [N]
        zero_std = (rewards.view(-1, G).std(dim=1) == 0).repeat_interleave(G)  # [N]
        if args.drop_zero_std_groups:
            response_mask = response_mask * (~zero_std)[:, None]

        # ---- update: num_ppo_epochs passes of num_mini_batches optimizer steps, over micro-batches
        lr = lr_at(step, args)
        for group in optimizer.param_groups:
            group["lr"] = lr
        policy.train()
        stats, grad_norms = [], []
        epochs = [sample_seed(args.seed, step, e * world + rank)  # the seed of each epoch's shuffle
                  for e in range(args.num_ppo_epochs)]
        for rows in minibatches(N, args.num_mini_batches, epochs, device):  # an optimizer step each
            norm = loss_normaliser(args.loss_type, response_mask[rows], args.max_new_tokens, world)
            optimizer.zero_grad(set_to_none=True)
            total_loss = 0.0
            for i in rows.split(mb):  # a micro-batch
                with autocast:
                    logprobs, entropy = token_logprobs(policy, input_ids[i], attention_mask[i], R,
                                                       args.temperature)
                old = logprobs.detach() if old_logprobs is None else old_logprobs[i]
                ref = None if ref_logprobs is None else ref_logprobs[i]
                loss, s = policy_loss(logprobs, old, advantages[i], response_mask[i], norm, args,
                                      ref, gen.logprobs[i])
                loss.backward()
                total_loss += loss.item()
                stats.append({**s, **mismatch_stats(old, gen.logprobs[i], mask[i]),
                              "entropy": masked_mean(entropy.detach(), mask[i]).item()})
            average_gradients(policy)
            grad_norms.append(clip_grad_norm(policy, args.max_grad_norm))
            if guard.ok(total_loss, grad_norms[-1]):
                optimizer.step()
        # the rollout has no use for gradients: freed here, not at the next update's start
        optimizer.zero_grad(set_to_none=True)
        t_update = time.time() - t0 - t_rollout

        # ---- logging
        n_tokens = gen.response_mask.sum().item()
        metrics = {
            "reward/mean": scores.mean().item(),
            "reward/sq": (scores ** 2).mean().item(),
            "reward/grader_timeouts": (grader_counts()["timeouts"] - timeouts) / N,
            "accuracy": correct.mean().item(),
            "response_len/mean": n_tokens / N,
            "truncated_frac": gen.truncated.float().mean().item(),
            "zero_std_frac": zero_std.float().mean().item(),
            "sampling/rounds": rounds,
            "sampling/samples": rounds * N * world,  # over all ranks
            "grad_norm": sum(grad_norms) / len(grad_norms),
            **mean_of(stats),
        }
        if kl is not None:
            metrics["kl_ref"] = masked_mean(kl, mask).item()  # per token
        metrics = global_metrics(metrics, device)  # averaged over ranks; reward/sq -> reward/std
        metrics["skipped_steps"] = guard.pop()
        metrics.update({"lr": lr, "tokens_per_s": n_tokens * world / t_rollout,
                        "time/rollout_s": t_rollout, "time/update_s": t_update})
        logger.log(step + 1, metrics)
        if (step + 1) % args.log_interval == 0 or step == 0:
            logger.log_samples(step + 1, [
                {**env.sample_fields(indices[k // G]), "response": texts[k],
                 "reward": scores[k].item(), "advantage": advantages[k].item()}
                for k in range(0, N, max(1, N // 8))])

        # ---- eval and checkpoint
        if step + 1 < args.max_steps and every(step + 1, args.eval_interval):
            run_eval(step + 1)
        if step + 1 < args.max_steps and every(step + 1, args.save_interval):
            save(step + 1)

    final_acc = run_eval(args.max_steps)
    save(args.max_steps)
    report_end(first_acc, final_acc, f"{args.output_dir}/checkpoint-{args.max_steps}",
               adapter=bool(args.lora_r))
    logger.close()
    return first_acc, final_acc


if __name__ == "__main__":
    main(parse_args(Args))
