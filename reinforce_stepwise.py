"""Stepwise REINFORCE: LLM_RL's policy, a line a step, with a calculator.
Docs: docs/reinforce_stepwise.md

Paper: Williams 1992, as LLM_RL's "REINFORCE stable" does it, with RLOO's
leave-one-out baseline (Ahmadian et al. 2024). An action is a line: `diff
reinforce.py reinforce_stepwise.py` is what that changes.

Play k episodes of lines per prompt (common/models/stepwise.py), grade each,
and push up each line's log-probability by how much its return beats a
baseline:
    G_t = sum_j gamma^j (r_t+j - beta KL_t+j),  KL_t: k1 on line t's tokens
    A_t = G_t - b,  b = 0 (none) | mean(G_0) (mean) | mean_j!=i G_0,j (rloo)
    L   = -(1/n) sum_t A_t log pi(line_t | state_t),  n: the batch's lines
With --sym_calc a calculator writes the value of <<expr>>, out of the loss.

Simplified versus the seed (LLM_RL) as in reinforce.py, and:
- the return carries the KL of every later step (the seed's: its own);
- the calculator writes after the model's ">>" (the seed rewrites "=..."
  in the span with Python's eval).

Launch:
    python reinforce_stepwise.py --sym_calc --num_few_shot 2    # CPU, offline
    python reinforce_stepwise.py --sym_calc --bf16 --dataset_name gsm8k \\
        --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct
    torchrun --nproc_per_node 8 reinforce_stepwise.py --sym_calc --bf16 \\
        --num_prompts 64 --dataset_name gsm8k \\
        --model_name_or_path Qwen/Qwen2.5-1.5B-Instruct
"""

import time
from dataclasses import dataclass
from typing import Literal, Optional

import torch

from common import UsageError, all_reduce_sum, sample_seed
from common.env import make_envs, prompt_indices, stepwise_system_prompt
from common.models import (batched_token_logprobs, eos_token_ids, full_state_dict,
                           load_tokenizer, play_episodes, policy_sampler,
                           reference_policy, token_logprobs, trained_policy, unsharded)
from common.rl import (discounted_returns, kl_estimate, masked_mean,
                       mismatch_stats)
from common.run import Run, TrainArgs, every, parse_args


@dataclass
class Args(TrainArgs):
    # ---- optimisation
    learning_rate: float = 5e-6
    """AdamW learning rate (docs/grpo.md#results: why not 2e-5)"""
    lr_scheduler: Literal["constant", "linear", "cosine", "polynomial"] = "constant"
    """schedule after the warmup (all but constant end at 0)"""
    warmup_steps: int = 0
    """updates of linear learning-rate warmup"""
    warmup_ratio: Optional[float] = None
    """when given, warmup_steps = this fraction of max_steps"""
    max_grad_norm: float = 1.0
    """gradient-norm clip (0: none)"""
    max_steps: int = 20
    """policy updates (one rollout batch each)"""
    num_train_epochs: Optional[float] = None
    """when given, max_steps covers this many passes over the problems"""
    micro_batch_size: Optional[int] = None
    """sequences per forward and backward (8; on a GPU, what fits)"""
    seed: int = 0
    """seeds prompt order, sampling and model init"""
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
    """what each return is measured against: none (the seed), the mean, or rloo"""
    beta: float = 0.05
    """weight of the KL to the frozen reference (0: none is loaded)"""
    kl_estimator: Literal["k1", "k2", "k3"] = "k1"
    """per-token estimate of the KL (k3: the GRPO paper's)"""
    kl_penalty: Literal["loss", "reward"] = "reward"
    """where the KL enters: a loss term per token, or a cost in the reward"""
    length_normalize: bool = True
    """log pi(action) and its KL as token means, as the seed's (else sums)"""
    ref_model_sync_steps: int = 0
    """copy the policy into the reference every this many updates (0: never)"""
    max_episode_steps: int = 10
    """steps per episode at most (a step: one line)"""
    gamma: float = 0.99
    """discount, per line of an episode's return"""
    sym_calc: bool = False
    """after <<expr>> a calculator writes its value (never eval)"""


def check_args(args, world_size):
    """This file's own option errors, each with its fix, before any model loads."""
    if args.baseline == "rloo" and args.num_generations < 2:
        raise UsageError("--baseline rloo needs --num_generations >= 2: "
                         "the others' mean.")
    if args.ref_model_sync_steps and args.beta == 0:
        raise UsageError("--ref_model_sync_steps refreshes the KL reference, but "
                         "--beta is 0 (no reference); set --beta > 0 or drop "
                         "--ref_model_sync_steps.")
    if args.ref_model_sync_steps and args.lora_r:
        raise UsageError("--ref_model_sync_steps copies the policy into the reference, "
                         "but with --lora_r the reference is the frozen base (the "
                         "adapters off): drop one.")


# ---- Rollout
def rollout(policy, tokenizer, env, position, first_prompt, local_prompts, args,
            autocast):
    """G episodes for each of this rank's problems of update `position`, graded.
    Seeds follow the global index: N processes play what 1 does."""
    G = args.num_generations
    problems = prompt_indices(position, args.num_prompts, len(env), args.seed)
    problems = problems[first_prompt:first_prompt + local_prompts]
    seeds = [sample_seed(args.seed, position, first_prompt * G + k)
             for k in range(local_prompts * G)]
    sample = policy_sampler(policy, tokenizer, args.temperature, args.top_p,
                            lambda k, t, call: sample_seed(seeds[k], t, call),
                            args.sym_calc, autocast, fast=not args.plain)
    eos_ids = set(eos_token_ids(policy, tokenizer))
    with unsharded(policy):  # ranks may play different numbers of lines
        device = next(policy.parameters()).device
        return play_episodes(sample, tokenizer, env, problems, G,
                             args.max_new_tokens, args.sym_calc, device, eos_ids)


# ---- Advantages
def sequence_logprobs(logprobs, mask, length_normalize):
    """[b, R] log-probs (or KLs) -> [b]: their sum, or the seed's mean."""
    total = (logprobs * mask).sum(1)  # [b]
    return total / mask.sum(1).clamp(min=1) if length_normalize else total


def stepwise_returns(rewards, kl, step_mask, gamma, beta):
    """rewards, kl, step_mask: [N, T], an episode's lines -> returns G_t [N, T],
    0 where an episode has no step t."""
    # CRUCIAL: the KL enters as a number, without a gradient: pure REINFORCE
    shaped = (rewards - beta * kl) * step_mask
    return discounted_returns(shaped, gamma) * step_mask


def compute_baselines(episode_returns, group_size, baseline):
    """[N] returns G_0, k = group_size a prompt in a row -> [N] baselines."""
    if baseline == "none":
        return torch.zeros_like(episode_returns)
    if baseline == "mean":  # over every rank's, so that 1 and N processes agree
        count = episode_returns.new_tensor(float(len(episode_returns)))
        total = all_reduce_sum(torch.stack([episode_returns.sum(), count]))
        return (total[0] / total[1]).expand_as(episode_returns)
    if baseline == "rloo":
        r = episode_returns.view(-1, group_size)  # [N / k, k]
        # CRUCIAL: i is out of its own baseline: b_i does not depend on o_i
        return ((r.sum(dim=1, keepdim=True) - r) / (group_size - 1)).reshape(-1)
    raise ValueError(f"unknown baseline {baseline!r}")


# ---- Loss
def loss_normaliser(loss_mask, args, world_size):
    """The batch's actions over all ranks, per rank, fixed before micro-batching:
    1 x 8 and 8 x 1 agree. loss_mask [n, R]: a row an action."""
    actions = torch.tensor(float(loss_mask.shape[0]), device=loss_mask.device)
    return (all_reduce_sum(actions) / world_size).item()


def policy_loss(logprobs, old_logprobs, advantages, loss_mask, normaliser, args,
                ref_logprobs=None):
    """-A log pi(action). logprobs, old_logprobs, loss_mask: [b, R]; advantages [b];
    ref_logprobs [b, R] adds the KL term (None: no KL in the loss)."""
    mask = loss_mask.float()  # new to stepwise: no calculator tokens
    seq_logprobs = sequence_logprobs(logprobs, mask, args.length_normalize)  # [b]
    # CRUCIAL: A is a constant: the gradient flows through log pi alone
    pg_loss = -advantages * seq_logprobs  # [b]
    per_action = pg_loss
    if ref_logprobs is not None:
        kl = kl_estimate(logprobs, ref_logprobs, args.kl_estimator)
        kl_action = sequence_logprobs(kl, mask, args.length_normalize)
        per_action = per_action + args.beta * kl_action
    loss = per_action.sum() / normaliser
    with torch.no_grad():
        # approx_kl is how far the policy moved from the one that sampled
        approx_kl = kl_estimate(old_logprobs, logprobs, "k3")
        stats = {"approx_kl": masked_mean(approx_kl, mask).item(),
                 "pg_loss": pg_loss.mean().item()}
        if ref_logprobs is not None:
            stats["kl_ref"] = masked_mean(kl, mask).item()
    return loss, stats


# ---- Main: setup, models, then each update's rollout, advantages, update, logs
def main(args):
    # TRY NOT TO MODIFY: processes, option checks, the seed; the env before any
    # model, so that a bad task or data file fails at once
    run = Run(args, check_args)
    # ---- derived options: the only lines that change args after parsing
    args.output_dir = run.output_dir  # without --output_dir: a new folder each run
    # new to stepwise: envs of lines, the prompt showing the calculator
    stepwise = dict(stepwise=True, max_steps=args.max_episode_steps,
                    calc_annotations=args.sym_calc,
                    system_prompt=args.system_prompt or stepwise_system_prompt(
                        args.dataset_name, args.sym_calc))
    # new to stepwise: and so do the held-out problems
    env, eval_env = make_envs(args, stepwise, stepwise_eval=True, say=run.print)
    args.dataset_name, args.dataset_path = env.source
    args.max_steps, args.warmup_steps = run.schedule(len(env), args.num_prompts)
    args.micro_batch_size = args.micro_batch_size or run.default_micro_batch

    local_prompts, G = args.num_prompts // run.world, args.num_generations
    N = local_prompts * G  # samples per rank per update
    run.print(f"REINFORCE, stepwise | {run.world} process(es) on {run.device} | "
              f"{args.num_prompts} prompts x {G} episodes | {args.baseline} "
              f"baseline | {len(env)} problems | {args.max_steps} updates"
              + (" | a calculator" if args.sym_calc else ""))
    start_step, resume_from = run.resume_point()

    # ---- models
    tokenizer = load_tokenizer(args.model_name_or_path,
                               template_kwargs=args.chat_template_kwargs)
    run.check_prompts(tokenizer, env, eval_env)
    policy = trained_policy(args, resume_from, run.device)
    ref_policy = None
    if args.beta > 0:
        ref_policy = reference_policy(args, policy, run.device)
    trained = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trained, lr=args.learning_rate, weight_decay=0.0)
    if args.offload_optimizer:
        optimizer = run.offload_optimizer(policy, optimizer)
    # TRY NOT TO MODIFY: a resumed run's optimizers, the logs, the first evaluation
    # new to REINFORCE: a refreshed reference (--ref_model_sync_steps) is saved
    run.start(policy, tokenizer, eval_env, {"policy": (policy, optimizer)},
              extra_state=lambda: ({"ref_policy": ref_policy.state_dict()}
                                   if args.ref_model_sync_steps else None))
    if (run.state is not None  # new to REINFORCE: and resumed
            and "ref_policy" in run.state["extra"] and ref_policy is not None):
        ref_policy.load_state_dict(run.state["extra"]["ref_policy"])

    for step in range(start_step, args.max_steps):
        t0 = time.time()
        # ---- rollout: G episodes to each of this rank's problems, graded
        first_prompt = run.rank * local_prompts
        batch = rollout(policy, tokenizer, env, step, first_prompt, local_prompts,
                        args, run.autocast)
        # new to stepwise: rewards [N, T]; gen has a row a line, n in all
        run.check_rewards(batch.rewards, step + 1, batch.problems)
        gen, scores = batch.gen, batch.scores
        input_ids, attention_mask = gen.sequences()  # new to stepwise: [n, P + R]
        response_mask = gen.response_mask  # new to stepwise: [n, R]
        mask = batch.loss_mask.float()  # new to stepwise: no calculator tokens
        R = response_mask.shape[1]
        t_rollout = time.time() - t0

        # ---- log-probs of the behaviour policy and of the reference
        micro_batch = run.micro_batch_size(*input_ids.shape)
        old_logprobs, ref_logprobs, kl = gen.logprobs, None, None
        with run.autocast:
            if ref_policy is not None:
                ref_logprobs = batched_token_logprobs(
                    ref_policy, gen, args.temperature, micro_batch,
                    fast=not args.plain)
        if ref_logprobs is not None and args.kl_penalty == "reward":
            # CRUCIAL: from the sampler's log-probs, the KL is a number, not a
            # function of the weights
            kl = kl_estimate(gen.logprobs, ref_logprobs, args.kl_estimator)
            ref_logprobs = None

        # ---- advantages: each line's KL-regularised return against a baseline
        # new to stepwise: [N, T], per episode and line
        steps, kl_steps = batch.step_mask.bool(), torch.zeros_like(batch.rewards)
        if kl is not None:  # new to stepwise: the KL of each line played
            kl_steps[steps] = sequence_logprobs(kl, mask, args.length_normalize)
        # new to stepwise: a line's return carries the rest of its episode
        returns = stepwise_returns(batch.rewards, kl_steps, batch.step_mask,
                                   args.gamma, args.beta)
        # new to stepwise: the episodes' baselines, of G_0
        baselines = compute_baselines(returns[:, 0], G, args.baseline)
        advantages = (returns - baselines[:, None])[steps]  # new to stepwise: [n]
        loss_mask = batch.loss_mask  # new to stepwise: [n, R] no calculator tokens
        n = len(advantages)  # new to stepwise: the batch's lines

        # ---- update: one optimizer step on the whole batch, on-policy
        lr = run.set_lr(optimizer, step)
        policy.train()
        stats, grad_norms = [], []
        normaliser = loss_normaliser(loss_mask, args, run.world)
        optimizer.zero_grad(set_to_none=True)
        total_loss = 0.0
        # new to stepwise: micro-batches of lines
        for rows in torch.arange(n, device=run.device).split(micro_batch):
            with run.autocast:
                logprobs, entropy = token_logprobs(
                    policy, input_ids[rows], attention_mask[rows], R,
                    args.temperature, fast=not args.plain)
            old = old_logprobs[rows]
            ref = None if ref_logprobs is None else ref_logprobs[rows]
            loss, loss_stats = policy_loss(logprobs, old, advantages[rows],
                                           loss_mask[rows], normaliser, args, ref)
            loss.backward()
            total_loss += loss.item()
            loss_stats["entropy"] = masked_mean(entropy.detach(), mask[rows]).item()
            stats.append({**loss_stats, **mismatch_stats(
                logprobs.detach(), gen.logprobs[rows], mask[rows])})
        grad_norms.append(run.sync_gradients(policy))  # DDP's mean, the clip
        if run.guard.ok(total_loss, grad_norms[-1]):  # a NaN or inf skips it
            optimizer.step()
        # the seed's refresh of the reference
        if ref_policy is not None and every(step + 1, args.ref_model_sync_steps):
            ref_policy.load_state_dict(full_state_dict(policy, all_ranks=True))
        # the rollout has no use for gradients: freed now
        optimizer.zero_grad(set_to_none=True)
        t_update = time.time() - t0 - t_rollout

        # ---- logging (averaged over ranks), held-out accuracy and checkpoints
        n_tokens = response_mask.sum().item()
        metrics = {
            "reward/mean": scores.mean().item(),
            "reward/std": scores.std(unbiased=False).item(),
            "reward/grader_timeouts": run.grader_timeouts() / N,
            **env.reward_metrics(),
            "accuracy": batch.correct.mean().item(),
            "response_len/mean": n_tokens / N,
            "grad_norm": sum(grad_norms) / len(grad_norms),
            "return/mean": returns[:, 0].mean().item(),  # new to stepwise: G_0
            "lr": lr,
            "tokens_per_s": n_tokens * run.world / t_rollout,
            "time/rollout_s": t_rollout,
            "time/update_s": t_update,
        }
        if kl is not None:
            metrics["kl_ref"] = masked_mean(kl, mask).item()
        # new to stepwise: episodes cut, their lines, the calculator
        metrics.update({"truncated_frac": batch.truncated.float().mean().item(),
                        "episode_steps/mean": n / N,
                        "calc/fired": batch.calc_fired,
                        "calc/refused": batch.calc_refused})
        # new to stepwise: an episode's advantage is its first line's
        samples = [{**env.sample_fields(batch.problems[k // G]),
                    "response": batch.texts[k], "reward": scores[k].item(),
                    "advantage": (returns[k, 0] - baselines[k]).item()}
                   for k in range(0, N, max(1, N // 8))]
        run.log(step + 1, metrics, stats, samples)
        run.end_update(step + 1)
    return run.finish()


if __name__ == "__main__":
    main(parse_args(Args))
