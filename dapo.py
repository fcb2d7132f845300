"""DAPO: GRPO with decoupled clipping and dynamic sampling, on verifiable math. Docs: docs/dapo.md

Paper: Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale"
(arXiv:2503.14476). This is grpo.py with DAPO's recipe, each line of it marked `new to DAPO`:
- clip-higher: the ratio is clipped to [1 - eps_low, 1 + eps_high], eps_high = 0.28 > eps_low = 0.2,
  so that a token the policy rarely picks can still gain probability (entropy does not collapse);
- dynamic sampling: more prompts are sampled until num_prompts groups have rewards that differ
  (a group that is all right or all wrong has advantage 0 and teaches nothing), and such groups are
  left out of the loss;
- the token-level loss: a token mean over the global batch (--loss_type dapo), so that long
  responses weigh by their tokens;
- overlong reward shaping: a response that runs into the last overlong_buffer_len tokens of the
  budget loses reward linearly, down to -1 at max_new_tokens (the soft overlong punishment), and a
  response cut at the budget is out of the loss (overlong filtering):
    R_len(y) = 0                                   |y| <= L_max - L_cache
               ((L_max - L_cache) - |y|) / L_cache  L_max - L_cache < |y| <= L_max
and no KL to a reference (beta 0, as in grpo.py's default).

Simplified versus the paper: one process samples and learns (no vLLM); groups are refilled from
the next prompts of the stream for at most max_sampling_rounds rounds, then groups of equal rewards
fill what is left; rewards come from rule-based verifiers (common/env/tasks.py).

Launch:
    python dapo.py                        # CPU, offline: SmolLM2-135M-Instruct, arithmetic
    python dapo.py --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct --dataset_name gsm8k --bf16 \\
        --max_new_tokens 512 --overlong_buffer_len 128
    torchrun --nproc_per_node 8 dapo.py --model_name_or_path Qwen/Qwen2.5-1.5B-Instruct \\
        --dataset_name gsm8k --bf16 --num_prompts 64 --max_new_tokens 1024 --overlong_buffer_len 256
"""

import time
from dataclasses import dataclass
from typing import Literal, Optional

import torch

from common import UsageError, all_reduce_sum, sample_seed
from common.env import make_envs, prompt_indices
from common.models import (Generation, Rollout, batched_token_logprobs, encode_prompts,
                           fast_decoding, generate, load_tokenizer, reference_policy,
                           token_logprobs, trained_policy)
from common.rl import kl_estimate, masked_mean, mismatch_stats
from common.run import Run, TrainArgs, parse_args


@dataclass
class Args(TrainArgs):
    # ---- optimisation
    learning_rate: float = 5e-6
    """AdamW learning rate of the policy (docs/grpo.md#results: why not 2e-5)"""
    lr_scheduler: Literal["constant", "linear", "cosine", "polynomial"] = "constant"
    """schedule after the warmup (linear, cosine, polynomial: down to 0 at max_steps)"""
    warmup_steps: int = 0
    """updates of linear learning-rate warmup"""
    warmup_ratio: Optional[float] = None
    """when given, warmup_steps = this fraction of max_steps"""
    max_grad_norm: float = 1.0
    """gradient-norm clip (0: none)"""
    max_steps: int = 20
    """policy updates (one rollout batch each)"""
    num_train_epochs: Optional[float] = None
    """when given, max_steps covers this many passes over the training problems"""
    micro_batch_size: Optional[int] = None
    """sequences per forward/backward; gradients accumulate over micro-batches (default 8; on a GPU
    without --fsdp, 8 in the first update, then what half of the free memory holds)"""
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
    epsilon: float = 0.2  # new to DAPO: eps_low
    """clip range of the ratio (DAPO's eps_low)"""
    epsilon_high: float = 0.28  # new to DAPO: clip-higher
    """the upper clip range: the ratio is clipped to [1 - epsilon, 1 + epsilon_high]"""
    beta: float = 0.0
    """weight of the KL to the frozen reference (0: no reference is loaded)"""
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    """per-token estimate of the KL: k1 log-ratio, k2 its square / 2, k3 the GRPO paper's"""
    kl_penalty: Literal["loss", "reward"] = "loss"
    """where the KL enters: a loss term per token, or a cost in the reward"""
    loss_type: Literal["grpo", "bnpo", "dr_grpo", "dapo"] = "dapo"
    """how per-token losses are aggregated, by TRL GRPOTrainer's names (see the docstring)"""
    dynamic_sampling: bool = True  # new to DAPO: dynamic sampling
    """sample more prompts until num_prompts groups have rewards that are not all equal"""
    max_sampling_rounds: int = 4  # new to DAPO: dynamic sampling
    """dynamic sampling: rounds of num_prompts prompts at most (then equal groups fill the batch)"""
    drop_zero_std_groups: bool = True  # new to DAPO: no zero-advantage groups in the loss
    """leave groups whose G rewards are all equal (advantage 0) out of the loss and normaliser"""
    overlong_buffer_len: Optional[int] = None  # new to DAPO: soft overlong punishment
    """L_cache: a response longer than max_new_tokens - this loses reward, linearly in its excess
    (0: off; default: a fifth of max_new_tokens, the paper's 4,096 of 20,480)"""
    overlong_penalty_factor: float = 1.0  # new to DAPO: soft overlong punishment
    """the reward a response of max_new_tokens tokens loses (verl's
    overlong_buffer.penalty_factor)"""
    mask_truncated_completions: bool = True  # new to DAPO: overlong filtering
    """responses cut at max_new_tokens are out of the loss (TRL's name)"""


def check_args(args, world_size):
    """This file's own option errors, each with its fix, before any model loads (Run checks the
    shared ones of common/run/checks.py first)."""
    if args.num_generations < 2:
        raise UsageError("--num_generations must be >= 2: the group baseline needs two samples.")
    if (args.overlong_buffer_len or 0) > args.max_new_tokens:  # new to DAPO: in the budget
        raise UsageError(f"--overlong_buffer_len {args.overlong_buffer_len} is longer than "
                         f"--max_new_tokens {args.max_new_tokens}: the buffer is the budget's last "
                         f"tokens; pass at most {args.max_new_tokens}.")


# ------------------------------------------------------------------------------------------------
# Rollout
# ------------------------------------------------------------------------------------------------
def rollout(policy, tokenizer, env, position, first_prompt, local_prompts, args, autocast):
    """This rank's share (local_prompts from the first) of the num_prompts problems at `position` of
    the prompt stream: sample G responses for each and grade them. Each response's seed follows its
    global sample index, so 1 process and N processes draw the same samples."""
    G = args.num_generations
    problems = prompt_indices(position, args.num_prompts, len(env), args.seed)
    problems = problems[first_prompt:first_prompt + local_prompts]
    seeds = [sample_seed(args.seed, position, first_prompt * G + k)
             for k in range(local_prompts * G)]
    prompts = encode_prompts(tokenizer, [env.prompt(p) for p in problems])
    prompts = [p for p in prompts for _ in range(G)]  # consecutive rows share a prompt
    # the same samples, faster (--plain: the plain Decoder)
    with autocast, fast_decoding(policy, enabled=not args.plain) as decoder:
        gen = generate(policy, tokenizer, prompts, args.max_new_tokens, args.temperature,
                       args.top_p, seeds=seeds, decoder=decoder)
    texts = gen.texts(tokenizer)
    # (reward, info): the verifier, plus your own --reward_fn rewards
    graded = env.score_all(texts, [p for p in problems for _ in range(G)], gen.completion_ids())
    scores = torch.tensor([reward for reward, _ in graded], device=gen.response_ids.device)
    correct = torch.tensor([float(info["correct"]) for _, info in graded], device=scores.device)
    return Rollout(gen, texts, scores, correct, problems)


# new to DAPO: dynamic sampling
def dynamic_rollout(policy, tokenizer, env, step, first_prompt, local_prompts, args, autocast,
                    pad_id):
    """Rounds of rollouts until local_prompts groups have rewards that differ; groups of equal
    rewards fill what max_sampling_rounds leave short. Update `step` owns max_sampling_rounds
    positions of the prompt stream, so its draws never depend on an earlier update's luck and a
    resumed run draws the same. -> (this rank's Rollout, the rounds used)"""
    G, kept, spare = args.num_generations, [], []  # (round's Rollout, group) whose rewards differ
    for used in range(1, args.max_sampling_rounds + 1):
        position = step * args.max_sampling_rounds + used - 1
        batch = rollout(policy, tokenizer, env, position, first_prompt, local_prompts, args,
                        autocast)
        differ = batch.scores.view(-1, G).std(dim=1) > 0
        for g in range(local_prompts):
            (kept if differ[g] else spare).append((batch, g))
        if len(kept) >= local_prompts:
            break
    groups = (kept + spare)[:local_prompts]
    rows = [torch.arange(g * G, (g + 1) * G) for _, g in groups]
    gen = Generation.cat([b.gen.rows(r) for (b, _), r in zip(groups, rows)], pad_id)
    texts = [b.texts[k] for (b, _), r in zip(groups, rows) for k in r.tolist()]
    scores, correct = (torch.cat([getattr(b, name)[r] for (b, _), r in zip(groups, rows)])
                       for name in ("scores", "correct"))
    return Rollout(gen, texts, scores, correct, [b.problems[g] for b, g in groups]), used


# ------------------------------------------------------------------------------------------------
# Advantages
# ------------------------------------------------------------------------------------------------
def kl_penalised(scores, kl, response_mask, beta):
    """--kl_penalty reward: each response's score minus beta times its summed per-token KL. [N]"""
    return scores if kl is None else scores - beta * (kl * response_mask.float()).sum(1)


# new to DAPO: soft overlong punishment
def overlong_penalty(lengths, max_new_tokens, buffer_len, factor):
    """[N] response lengths in tokens -> [N] DAPO's length reward: 0 up to max_new_tokens -
    buffer_len tokens, then down linearly to -factor at max_new_tokens (a response cut at the
    budget gets all of it)."""
    if buffer_len == 0:
        return torch.zeros(lengths.shape, device=lengths.device)
    excess = (lengths - (max_new_tokens - buffer_len)).clamp(min=0)  # tokens into the buffer
    return -factor * excess.float() / buffer_len


def group_advantages(rewards, group_size, scale=True):
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
def loss_normaliser(loss_mask, args, world_size):
    """The denominator of a whole minibatch, fixed before micro-batching so that the micro-batch
    losses sum to the minibatch loss (1 x 8 and 8 x 1 give the same gradient). loss_mask [n, R]:
    the tokens that count."""
    sequences = (loss_mask.sum(1) > 0).sum().clamp(min=1).item()  # a dropped group's count nowhere
    if args.loss_type == "grpo":
        return float(sequences)
    if args.loss_type == "bnpo":
        return loss_mask.sum().clamp(min=1).item()  # tokens in this rank's minibatch
    if args.loss_type == "dapo":
        # tokens in the global minibatch, per rank: after gradients are averaged over ranks this is
        # a token mean over everything every rank generated.
        return (all_reduce_sum(loss_mask.sum().float()) / world_size).clamp(min=1).item()
    if args.loss_type == "dr_grpo":
        return float(sequences * args.max_new_tokens)
    raise ValueError(f"unknown loss_type {args.loss_type!r}")


def aggregate(per_token, mask, loss_type, normaliser):
    """[b, R] per-token losses -> this micro-batch's share of the minibatch loss."""
    if loss_type == "grpo":
        # CRUCIAL: each sequence is a mean over its own tokens: long and short answers weigh alike.
        return ((per_token * mask).sum(1) / mask.sum(1).clamp(min=1)).sum() / normaliser
    return (per_token * mask).sum() / normaliser


def policy_loss(logprobs, old_logprobs, advantages, loss_mask, normaliser, args,
                ref_logprobs=None):
    """Clipped surrogate per token.
    loss_mask [b, R]: the tokens that count; ref_logprobs [b, R] adds the KL term (None: no KL in
    the loss); logprobs, old_logprobs: [b, R]."""
    mask = loss_mask.float()
    log_ratio = logprobs - old_logprobs  # [b, R]
    ratio = torch.exp(log_ratio)  # [b, R]
    low, high = 1 - args.epsilon, 1 + args.epsilon_high  # new to DAPO: clip-higher
    # every token of a response shares its advantage: [b] -> [b, 1]
    advantages = advantages[:, None]
    pg_loss = torch.max(-advantages * ratio, -advantages * ratio.clamp(low, high))  # [b, R]
    per_token = pg_loss
    if ref_logprobs is not None:  # the KL as a loss term, differentiated through log pi
        kl = kl_estimate(logprobs, ref_logprobs, args.kl_estimator)  # [b, R]
        per_token = per_token + args.beta * kl
    loss = aggregate(per_token, mask, args.loss_type, normaliser)
    with torch.no_grad():
        clipped = ((ratio < low) & (advantages < 0)) | ((ratio > high) & (advantages > 0))
        stats = {"clipfrac": masked_mean(clipped.float(), mask).item(),
                 # how far the policy moved from the one that sampled (pi_old)
                 "approx_kl": masked_mean(kl_estimate(old_logprobs, logprobs, "k3"), mask).item(),
                 "pg_loss": masked_mean(pg_loss, mask).item()}
        if ref_logprobs is not None:
            stats["kl_ref"] = masked_mean(kl, mask).item()
    return loss, stats


# ------------------------------------------------------------------------------------------------
# Main: setup -> models -> update loop (rollout, advantages, update) -> logging, eval, checkpoints
# ------------------------------------------------------------------------------------------------
def main(args):
    # TRY NOT TO MODIFY: processes, option checks and the seed; the env before any model, so that a
    # bad task or data file fails at once; where the run starts
    run = Run(args, check_args)
    # ---- derived options: the only lines that change args after parsing (args.json keeps them)
    env, eval_env = make_envs(args, say=run.print)
    args.dataset_name, args.dataset_path = env.source  # a data file or hub id: its task
    args.max_steps, args.warmup_steps = run.schedule(len(env), args.num_prompts)
    if args.overlong_buffer_len is None:  # new to DAPO: the paper's share of the budget
        args.overlong_buffer_len = args.max_new_tokens // 5
    args.micro_batch_size = args.micro_batch_size or run.default_micro_batch  # a GPU fits the rest

    local_prompts, G = args.num_prompts // run.world, args.num_generations
    N = local_prompts * G  # samples per rank per update
    run.print(f"DAPO | {run.world} process(es) on {run.device} | {args.num_prompts} prompts x {G} "
              f"samples per update ({N} per rank) | {args.num_ppo_epochs} epoch(s) x "
              f"{args.num_mini_batches} minibatch(es) of micro-batches of {args.micro_batch_size} "
              f"| {len(env)} problems | {args.max_steps} updates")
    start_step, resume_from = run.resume_point()

    # ---- models
    tokenizer = load_tokenizer(args.model_name_or_path)
    run.check_prompts(tokenizer, env, eval_env)  # each prompt within the model's positions
    policy = trained_policy(args, resume_from, run.device)  # LoRA (--lora_r), FSDP2 (--fsdp)
    ref_policy = reference_policy(args, policy, run.device) if args.beta > 0 else None
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad],
                                  lr=args.learning_rate, weight_decay=0.0)
    if args.offload_optimizer:  # fp32 master weights and AdamW on the CPU, bf16 on the device
        optimizer = run.offload_optimizer(policy, optimizer)
    # TRY NOT TO MODIFY: a resumed run's optimizer state, the logs, the accuracy before training
    run.start(policy, tokenizer, eval_env, {"policy": (policy, optimizer)})

    for step in range(start_step, args.max_steps):
        t0 = time.time()
        # ---- rollout: G responses to each of this rank's problems of the update, graded
        first_prompt = run.rank * local_prompts  # this rank's share of the update's problems
        if args.dynamic_sampling:  # new to DAPO: more prompts until num_prompts groups differ
            batch, rounds = dynamic_rollout(policy, tokenizer, env, step, first_prompt,
                                            local_prompts, args, run.autocast,
                                            tokenizer.pad_token_id)
        else:
            batch, rounds = rollout(policy, tokenizer, env, step, first_prompt, local_prompts, args,
                                    run.autocast), 1
        run.check_rewards(batch.scores, step + 1, batch.problems)  # NaN or inf: the run stops
        gen, scores = batch.gen, batch.scores
        input_ids, attention_mask = gen.sequences()  # [N, P + R]
        response_mask = gen.response_mask  # [N, R] every sampled token
        mask = response_mask.float()  # the same, for the statistics
        R = response_mask.shape[1]
        t_rollout = time.time() - t0

        # ---- log-probs of the behaviour policy and of the reference, before any update
        micro_batch = run.micro_batch_size(*input_ids.shape)  # rows per forward (a GPU: fitted)
        old_logprobs, ref_logprobs, kl = None, None, None
        with run.autocast:
            # one pass of one minibatch: pi_old is the policy itself, detached in the loss
            if args.num_ppo_epochs > 1 or args.num_mini_batches > 1:
                old_logprobs = batched_token_logprobs(policy, gen, args.temperature, micro_batch,
                                                      fast=not args.plain)
            if ref_policy is not None:
                ref_logprobs = batched_token_logprobs(ref_policy, gen, args.temperature,
                                                      micro_batch, fast=not args.plain)
        if ref_logprobs is not None and args.kl_penalty == "reward":  # a cost in the reward
            # under the sampler's log-probs: a number, not a function of the weights
            kl = kl_estimate(gen.logprobs, ref_logprobs, args.kl_estimator)  # [N, R]
            ref_logprobs = None

        # ---- advantages: each response's reward against its group's
        # new to DAPO: the length reward of the soft overlong punishment
        penalty = overlong_penalty(response_mask.sum(1), args.max_new_tokens,
                                   args.overlong_buffer_len, args.overlong_penalty_factor)  # [N]
        rewards = kl_penalised(scores + penalty, kl, response_mask, args.beta)  # new to DAPO: [N]
        advantages = group_advantages(rewards, G, scale=args.loss_type != "dr_grpo")  # [N]
        zero_std = (rewards.view(-1, G).std(dim=1) == 0).repeat_interleave(G)  # [N]
        loss_mask = response_mask  # [N, R] the tokens that count in the loss
        if args.drop_zero_std_groups:  # new to DAPO: no zero-advantage groups in the loss
            loss_mask = loss_mask * (~zero_std)[:, None]
        if args.mask_truncated_completions:  # new to DAPO: overlong filtering
            loss_mask = loss_mask * (~gen.truncated)[:, None]

        # ---- update: num_ppo_epochs passes of num_mini_batches optimizer steps, over micro-batches
        lr = run.set_lr(optimizer, step)
        policy.train()
        stats, grad_norms = [], []
        for batch_rows in run.minibatches(N, step):  # seeded: a resumed run takes the same
            normaliser = loss_normaliser(loss_mask[batch_rows], args, run.world)
            optimizer.zero_grad(set_to_none=True)
            total_loss = 0.0
            for rows in batch_rows.split(micro_batch):  # gradients accumulate over micro-batches
                with run.autocast:
                    logprobs, entropy = token_logprobs(policy, input_ids[rows],
                                                       attention_mask[rows], R, args.temperature,
                                                       fast=not args.plain)
                old = logprobs.detach() if old_logprobs is None else old_logprobs[rows]
                ref = None if ref_logprobs is None else ref_logprobs[rows]
                loss, loss_stats = policy_loss(logprobs, old, advantages[rows], loss_mask[rows],
                                               normaliser, args, ref)
                loss.backward()
                total_loss += loss.item()
                stats.append({**loss_stats, **mismatch_stats(old, gen.logprobs[rows], mask[rows]),
                              "entropy": masked_mean(entropy.detach(), mask[rows]).item()})
            # what DDP does: the mean of every rank's gradient; then the clip
            grad_norms.append(run.sync_gradients(policy))
            if run.guard.ok(total_loss, grad_norms[-1]):  # a NaN or inf skips the step
                optimizer.step()
        # the rollout has no use for gradients: freed here, not at the next update's start
        optimizer.zero_grad(set_to_none=True)
        t_update = time.time() - t0 - t_rollout

        # ---- logging (averaged over ranks), held-out accuracy and checkpoints at their intervals
        n_tokens = response_mask.sum().item()
        metrics = {
            "reward/mean": scores.mean().item(),
            "reward/std": scores.std(unbiased=False).item(),
            "reward/grader_timeouts": run.grader_timeouts() / N,
            **env.reward_metrics(),  # rewards/<name>/mean of each --reward_fn
            "accuracy": batch.correct.mean().item(),
            "response_len/mean": n_tokens / N,
            "truncated_frac": gen.truncated.float().mean().item(),
            "zero_std_frac": zero_std.float().mean().item(),
            "reward/overlong_penalty": penalty.mean().item(),  # new to DAPO
            "sampling/rounds": rounds,  # new to DAPO: rounds of dynamic sampling
            "sampling/samples": rounds * N * run.world,  # new to DAPO: samples drawn over all ranks
            "grad_norm": sum(grad_norms) / len(grad_norms),
            "lr": lr, "tokens_per_s": n_tokens * run.world / t_rollout,
            "time/rollout_s": t_rollout, "time/update_s": t_update,
        }
        if kl is not None:
            metrics["kl_ref"] = masked_mean(kl, mask).item()  # per token
        samples = [{**env.sample_fields(batch.problems[k // G]), "response": batch.texts[k],
                    "reward": scores[k].item(), "advantage": advantages[k].item()}
                   for k in range(0, N, max(1, N // 8))]
        run.log(step + 1, metrics, stats, samples)
        run.end_update(step + 1)
    return run.finish()


if __name__ == "__main__":
    main(parse_args(Args))
