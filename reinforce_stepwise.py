"""Stepwise REINFORCE: LLM_RL's few-shot policy that writes one line per step, with a calculator.
Docs: docs/reinforce_stepwise.md

Paper: Williams 1992, "Simple statistical gradient-following algorithms for connectionist
reinforcement learning", as the "REINFORCE stable" of navidmdn/LLM_RL does it for LLMs: a few-shot
policy whose action is one line of a solution, a KL-regularised return per line, length-normalised
log-probs, a reference that can be refreshed, and a calculator the policy calls with <<expr>>;
plus the leave-one-out baseline of RLOO (Ahmadian et al. 2024, arXiv:2402.14740). reinforce.py is
the same algorithm with the whole response as one action: `diff reinforce.py reinforce_stepwise.py`
is what playing lines changes.

For every prompt, play k episodes of lines (common/models/stepwise.py plays them), grade each with
the task's verifier, and push up the log-probability of each line in proportion to how much its
return beats a baseline:
    G_t = sum_j gamma^j (r_t+j - beta KL_t+j),  KL_t = sum over line t's tokens of k1
    A_t = G_t - b,        b = 0 (none) | batch mean of G_0 (mean) | sum_j!=i G_0,j / (k-1) (rloo)
    L   = -(1/n) sum_t A_t log pi(line_t | state_t),   n: the lines of the batch
With --length_normalize (the seed's way, on by default) log pi(line) and KL_t are token means.
With --sym_calc a calculator writes the value after <<expr>>; those tokens are out of the loss.

Simplified versus the seed (LLM_RL):
- on-policy batches of num_prompts x num_generations episodes and one optimizer step each, no replay
  buffer (the seed samples stored transitions uniformly, without importance correction);
- the KL sits in the return as a detached number (KL in the reward, as in RLOO and TRL); the seed
  differentiates through it inside the loss (--kl_penalty loss puts it there);
- the return carries the KL of every later step (the seed: the step's own only);
- the calculator writes the value after the model's own ">>" (the seed rewrites "=..." inside the
  span with Python's eval); no return clamping to [0, 10] (rewards are in [0, 1] here);
- one process both samples and learns, with the HF model and a KV-cached sampling loop (no vLLM).

Launch:
    python reinforce_stepwise.py --sym_calc --num_few_shot 2    # CPU, offline: arithmetic
    python reinforce_stepwise.py --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct \\
        --dataset_name gsm8k --sym_calc --bf16
    torchrun --nproc_per_node 8 reinforce_stepwise.py --model_name_or_path Qwen/Qwen2.5-1.5B-Instruct \\
        --dataset_name gsm8k --sym_calc --bf16 --num_prompts 64
"""

import time
from dataclasses import dataclass
from typing import Literal, Optional

import torch

from common import UsageError, all_reduce_sum, sample_seed
from common.env import make_envs, prompt_indices, stepwise_system_prompt
from common.models import (batched_token_logprobs, eos_token_ids, full_state_dict, load_tokenizer,
                           play_episodes, policy_sampler, reference_policy, token_logprobs,
                           trained_policy, unsharded)
from common.rl import discounted_returns, kl_estimate, masked_mean, mismatch_stats
from common.run import Run, TrainArgs, every, parse_args


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
    num_generations: int = 8  # new to stepwise: episodes
    """G: episodes played per problem (the group; LLM_RL's k)"""
    baseline: Literal["none", "mean", "rloo"] = "rloo"
    """what each return is measured against: none (the seed), the batch mean, or rloo"""
    beta: float = 0.05
    """weight of the KL to the frozen reference (0: no reference is loaded)"""
    kl_estimator: Literal["k1", "k2", "k3"] = "k1"
    """per-token estimate of the KL: k1 log-ratio, k2 its square / 2, k3 the GRPO paper's"""
    kl_penalty: Literal["loss", "reward"] = "reward"
    """where the KL enters: a loss term per token, or a cost in the reward"""
    length_normalize: bool = True
    """log pi(action) and its KL as token means, as the seed does (--no_length_normalize: sums)"""
    ref_model_sync_steps: int = 0
    """copy the policy into the reference every this many updates (0: never)"""
    max_episode_steps: int = 10
    """steps per episode at most (a step is a line; --max_new_tokens limits each line)"""
    gamma: float = 0.99
    """discount, per line of an episode's return"""
    sym_calc: bool = False
    """after <<expr>> a calculator writes the value of expr (never eval)"""


def check_args(args, world_size):
    """This file's own option errors, each with its fix, before any model loads (Run checks the
    shared ones of common/run/checks.py first)."""
    if args.baseline == "rloo" and args.num_generations < 2:
        raise UsageError("--baseline rloo needs --num_generations >= 2: the others' mean.")
    if args.ref_model_sync_steps and args.beta == 0:
        raise UsageError("--ref_model_sync_steps refreshes the KL reference, but --beta is 0 (no "
                         "reference); set --beta > 0 or drop --ref_model_sync_steps.")
    if args.ref_model_sync_steps and args.lora_r:  # LoRA's reference is the frozen base
        raise UsageError("--ref_model_sync_steps copies the policy into the reference, but with "
                         "--lora_r the reference is the frozen base (the adapters off): drop one.")


# ------------------------------------------------------------------------------------------------
# Rollout
# ------------------------------------------------------------------------------------------------
def rollout(policy, tokenizer, env, position, first_prompt, local_prompts, args, autocast):
    """This rank's share (local_prompts from the first) of the num_prompts problems at `position` of
    the prompt stream: play G episodes of lines for each, graded. Each episode's seed follows its
    global sample index, and each line's is made from its episode's, so 1 process and N processes
    play the same episodes."""
    G = args.num_generations
    problems = prompt_indices(position, args.num_prompts, len(env), args.seed)
    problems = problems[first_prompt:first_prompt + local_prompts]
    seeds = [sample_seed(args.seed, position, first_prompt * G + k)
             for k in range(local_prompts * G)]
    sample = policy_sampler(policy, tokenizer, args.temperature, args.top_p,
                            lambda k, t, call: sample_seed(seeds[k], t, call), args.sym_calc,
                            autocast, fast=not args.plain)
    eos_ids = set(eos_token_ids(policy, tokenizer))
    with unsharded(policy):  # FSDP2: ranks may play different numbers of lines
        return play_episodes(sample, tokenizer, env, problems, G, args.max_new_tokens,
                             args.sym_calc, next(policy.parameters()).device, eos_ids)


# ------------------------------------------------------------------------------------------------
# Advantages: returns and baselines
# ------------------------------------------------------------------------------------------------
def sequence_logprobs(logprobs, mask, length_normalize):
    """[b, R] token log-probs -> [b] log pi(action): their sum or, as the seed does, their mean.
    Also turns per-token KL estimates into the action's KL, the same way."""
    total = (logprobs * mask).sum(1)  # [b]
    return total / mask.sum(1).clamp(min=1) if length_normalize else total


def stepwise_returns(rewards, kl, step_mask, gamma, beta):
    """rewards, kl, step_mask: [N, T] per episode and line -> returns [N, T],
    G_t = sum_j gamma^j (r_t+j - beta KL_t+j); 0 where an episode has no step t."""
    # CRUCIAL: the KL enters as a reward, a number computed without gradients, so the policy
    # gradient is pure REINFORCE (the seed differentiates through its KL term instead).
    return discounted_returns((rewards - beta * kl) * step_mask, gamma) * step_mask


def compute_baselines(episode_returns, group_size, baseline):
    """[N] returns G_0, k = group_size consecutive episodes per prompt -> [N] baselines."""
    if baseline == "none":
        return torch.zeros_like(episode_returns)
    if baseline == "mean":  # over every rank's episodes, so 1 and N processes make the same update
        count = episode_returns.new_tensor(float(len(episode_returns)))
        total = all_reduce_sum(torch.stack([episode_returns.sum(), count]))
        return (total[0] / total[1]).expand_as(episode_returns)
    if baseline == "rloo":
        r = episode_returns.view(-1, group_size)  # [N / k, k]
        # CRUCIAL: sample i is left out of its own baseline: b_i does not depend on o_i (unbiased).
        return ((r.sum(dim=1, keepdim=True) - r) / (group_size - 1)).reshape(-1)
    raise ValueError(f"unknown baseline {baseline!r}")


# ------------------------------------------------------------------------------------------------
# Loss
# ------------------------------------------------------------------------------------------------
def loss_normaliser(loss_mask, args, world_size):
    """The denominator of the whole batch: its actions over all ranks, per rank (ranks may hold
    different numbers of actions), fixed before micro-batching so that 1 x 8 and 8 x 1 agree.
    loss_mask [n, R]: one row per action."""
    actions = torch.tensor(float(loss_mask.shape[0]), device=loss_mask.device)
    return (all_reduce_sum(actions) / world_size).item()


def policy_loss(logprobs, old_logprobs, advantages, loss_mask, normaliser, args,
                ref_logprobs=None):
    """-A log pi(action), over `normaliser`.
    loss_mask [b, R]: the tokens that count; ref_logprobs [b, R] adds the KL term (None: no KL in
    the loss); logprobs, old_logprobs: [b, R]; advantages: [b], one per action."""
    mask = loss_mask.float()  # new to stepwise: 0 on padding and on the calculator's tokens
    seq_logprobs = sequence_logprobs(logprobs, mask, args.length_normalize)  # [b]
    # CRUCIAL: advantages are constants; the gradient flows only through log pi of the policy's
    # own tokens.
    pg_loss = -advantages * seq_logprobs  # [b]
    per_action = pg_loss
    if ref_logprobs is not None:  # the KL as a loss term, differentiated through log pi
        kl = kl_estimate(logprobs, ref_logprobs, args.kl_estimator)  # [b, R]
        per_action = per_action + args.beta * sequence_logprobs(kl, mask, args.length_normalize)
    loss = per_action.sum() / normaliser
    with torch.no_grad():  # old: the sampler, the policy being trained (0 up to numerics)
        stats = {"approx_kl": masked_mean(kl_estimate(old_logprobs, logprobs, "k3"), mask).item(),
                 "pg_loss": pg_loss.mean().item()}
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
    # new to stepwise: the env plays lines, with the calculator's syntax in its prompt
    stepwise = dict(stepwise=True, max_steps=args.max_episode_steps, calc_annotations=args.sym_calc,
                    system_prompt=args.system_prompt or stepwise_system_prompt(args.dataset_name,
                                                                               args.sym_calc))
    env, eval_env = make_envs(args, stepwise, stepwise_eval=True, say=run.print)  # new to stepwise:
    args.dataset_name, args.dataset_path = env.source  # a data file or hub id: its task
    args.max_steps, args.warmup_steps = run.schedule(len(env), args.num_prompts)
    args.micro_batch_size = args.micro_batch_size or run.default_micro_batch  # a GPU fits the rest

    local_prompts, G = args.num_prompts // run.world, args.num_generations
    N = local_prompts * G  # samples per rank per update
    run.print(f"REINFORCE, stepwise | {run.world} process(es) on {run.device} | {args.num_prompts} "
              f"prompts x {G} episodes per update ({N} per rank) | micro-batches of "
              f"{args.micro_batch_size} | {len(env)} problems | {args.max_steps} updates | "
              f"{args.baseline} baseline" + (" | a calculator" if args.sym_calc else ""))
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
    # new to REINFORCE: a refreshed reference (--ref_model_sync_steps) is saved with the policy
    run.start(policy, tokenizer, eval_env, {"policy": (policy, optimizer)},
              extra_state=lambda: ({"ref_policy": ref_policy.state_dict()}
                                   if args.ref_model_sync_steps else None))
    # new to REINFORCE: and comes back with it
    if run.state is not None and "ref_policy" in run.state["extra"] and ref_policy is not None:
        ref_policy.load_state_dict(run.state["extra"]["ref_policy"])

    for step in range(start_step, args.max_steps):
        t0 = time.time()
        # ---- rollout: k episodes to each of this rank's problems, graded
        first_prompt = run.rank * local_prompts  # this rank's share of the update's problems
        batch = rollout(policy, tokenizer, env, step, first_prompt, local_prompts, args,
                        run.autocast)
        # new to stepwise: rewards [N, T], one per line; gen has a row per line, n in all
        run.check_rewards(batch.rewards, step + 1, batch.problems)
        gen, scores = batch.gen, batch.scores
        input_ids, attention_mask = gen.sequences()  # new to stepwise: [n, P + R]
        response_mask = gen.response_mask  # new to stepwise: [n, R] a row per line
        mask = batch.loss_mask.float()  # new to stepwise: no calculator tokens
        R = response_mask.shape[1]
        t_rollout = time.time() - t0

        # ---- log-probs of the behaviour policy (the sampler's) and of the reference
        micro_batch = run.micro_batch_size(*input_ids.shape)  # rows per forward (a GPU: fitted)
        old_logprobs, ref_logprobs, kl = gen.logprobs, None, None
        with run.autocast:
            if ref_policy is not None:
                ref_logprobs = batched_token_logprobs(ref_policy, gen, args.temperature,
                                                      micro_batch, fast=not args.plain)
        if ref_logprobs is not None and args.kl_penalty == "reward":  # a cost in the reward
            kl = kl_estimate(gen.logprobs, ref_logprobs, args.kl_estimator)  # new to stepwise: [n, R]
            ref_logprobs = None

        # ---- advantages: each action's KL-regularised return against its episode's baseline
        # CRUCIAL: the sampler's log-probs make the KL a number, not a function of the weights
        # new to stepwise: [N, T] per episode and line, each line's KL a token mean
        steps, kl_steps = batch.step_mask.bool(), torch.zeros_like(batch.rewards)
        if kl is not None:  # new to stepwise: the KL of each line an episode played
            kl_steps[steps] = sequence_logprobs(kl, mask, args.length_normalize)
        # new to stepwise: each line's return carries the rest of its episode
        returns = stepwise_returns(batch.rewards, kl_steps, batch.step_mask, args.gamma, args.beta)
        baselines = compute_baselines(returns[:, 0], G, args.baseline)  # new to stepwise: of G_0
        advantages = (returns - baselines[:, None])[steps]  # new to stepwise: [n], gen's rows
        loss_mask = batch.loss_mask  # new to stepwise: [n, R] no calculator tokens
        n = len(advantages)  # new to stepwise: the lines of the batch

        # ---- update: one optimizer step on the whole batch (REINFORCE is on-policy), micro-batched
        lr = run.set_lr(optimizer, step)
        policy.train()
        stats, total_loss = [], 0.0
        normaliser = loss_normaliser(loss_mask, args, run.world)
        optimizer.zero_grad(set_to_none=True)
        # new to stepwise: gradients accumulate over micro-batches of lines
        for rows in torch.arange(n, device=run.device).split(micro_batch):
            with run.autocast:
                logprobs, entropy = token_logprobs(policy, input_ids[rows], attention_mask[rows], R,
                                                   args.temperature, fast=not args.plain)
            ref = None if ref_logprobs is None else ref_logprobs[rows]
            loss, loss_stats = policy_loss(logprobs, old_logprobs[rows], advantages[rows],
                                           loss_mask[rows], normaliser, args, ref)
            loss.backward()
            total_loss += loss.item()
            stats.append({**loss_stats,
                          **mismatch_stats(logprobs.detach(), gen.logprobs[rows], mask[rows]),
                          "entropy": masked_mean(entropy.detach(), mask[rows]).item()})
        # what DDP does: the mean of every rank's gradient; then the clip
        grad_norm = run.sync_gradients(policy)
        if run.guard.ok(total_loss, grad_norm):  # a NaN or inf skips the step
            optimizer.step()
        # the seed's refresh of the reference
        if ref_policy is not None and every(step + 1, args.ref_model_sync_steps):
            ref_policy.load_state_dict(full_state_dict(policy, all_ranks=True))
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
            "truncated_frac": batch.truncated.float().mean().item(),  # new to stepwise: lines
            "grad_norm": grad_norm,  # new to REINFORCE: one optimizer step
            "return/mean": returns[:, 0].mean().item(),  # new to stepwise: G_0
            "lr": lr, "tokens_per_s": n_tokens * run.world / t_rollout,
            "time/rollout_s": t_rollout, "time/update_s": t_update,
        }
        if kl is not None:
            metrics["kl_ref"] = masked_mean(kl, mask).item()  # per token
        # new to stepwise: lines per episode, the calculator's values written and refused
        metrics.update({"episode_steps/mean": n / N, "calc/fired": batch.calc_fired,
                        "calc/refused": batch.calc_refused})
        # new to stepwise: an episode's advantage is its first line's
        samples = [{**env.sample_fields(batch.problems[k // G]), "response": batch.texts[k],
                    "reward": scores[k].item(), "advantage": (returns[k, 0] - baselines[k]).item()}
                   for k in range(0, N, max(1, N // 8))]
        run.log(step + 1, metrics, stats, samples)
        run.end_update(step + 1)
    return run.finish()


if __name__ == "__main__":
    main(parse_args(Args))
