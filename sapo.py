"""SAPO: GRPO with a soft gate for the clip. Docs: docs/sapo.md

Paper: Gao et al. 2025, "Soft Adaptive Policy Optimization" (arXiv:2511.20347),
as TRL's GRPOTrainer has it (loss_type "sapo"): grpo.py with one new surrogate,
each line of it marked `new to SAPO`. PPO's clip is a cliff: inside
[1 - eps, 1 + eps] a token gets its whole gradient, outside none. SAPO passes
the ratio through a sigmoid instead, whose slope is 1 at rho = 1 (GRPO's
gradient, on policy) and fades smoothly as rho leaves 1, faster for a larger
temperature; a negative advantage takes the larger one, as its tokens are
the ones that destabilise training in the paper:
    A_i    = (r_i - mean_G(r)) / (std_G(r) + eps)    (Dr.GRPO: no std)
    rho_it = pi(o_it | q, o_i<t) / pi_old(o_it | q, o_i<t)
    tau_i  = sapo_temperature_pos if A_i > 0 else sapo_temperature_neg
    f_it   = sigmoid(tau_i (rho_it - 1)) 4 / tau_i        (the gate)
    L      = agg_it [ -f_it A_i + beta KL_it ]
d f_it / d rho_it = 4 s (1 - s), s the sigmoid: 1 at rho = 1, half of that
where |rho - 1| = 1.76 / tau (clipfrac counts those tokens).
agg, --loss_type: per-sequence means, then their mean (grpo, TRL's sapo's, the
default), or grpo.py's others. KL_it: k3's to the frozen reference. GSPO's
sequence ratio is an option here, as in TRL (the paper's sequence-level form).

Simplified versus the paper and TRL:
- one process samples and learns, with the HF model (no vLLM);
- rule-based verifiers (common/env/tasks.py), not a reward model;
- with one epoch of one minibatch (the default) the ratio is exactly 1, and
  the gradient grpo.py's: run --num_ppo_epochs 2 (or --num_mini_batches 2)
  for the gate to act.

Launch:
    python sapo.py                      # CPU, offline: SmolLM2-135M, arithmetic
    python sapo.py --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct \\
        --dataset_name gsm8k --bf16 --num_mini_batches 4
    torchrun --nproc_per_node 8 sapo.py --bf16 --num_prompts 64 \\
        --model_name_or_path Qwen/Qwen2.5-1.5B-Instruct --dataset_name gsm8k \\
        --num_mini_batches 4
"""

import time
from dataclasses import dataclass
from typing import Literal, Optional

import torch

from common import UsageError, all_reduce_sum, sample_seed
from common.env import make_envs, prompt_indices
from common.models import (Rollout, batched_token_logprobs, encode_prompts,
                           fast_decoding, generate, load_tokenizer, reference_policy,
                           token_logprobs, trained_policy)
from common.rl import kl_estimate, masked_mean, mismatch_stats
from common.run import Run, TrainArgs, parse_args


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
    max_thinking_tokens: Optional[int] = None
    """thinking budget: past this many tokens in a <think> block the sampler
    closes it (s1's budget forcing; those tokens out of the loss; docs/thinking.md)"""
    # ---- the algorithm
    num_prompts: int = 4
    """prompts per update, over all ranks"""
    num_generations: int = 8
    """G: responses sampled per prompt (the group)"""
    num_ppo_epochs: int = 1
    """passes over each rollout batch"""
    num_mini_batches: int = 1
    """optimizer steps per pass over the shuffled batch"""
    sapo_temperature_pos: float = 1.0  # new to SAPO: the gate's temperatures
    """tau of the gate where A > 0 (TRL's name and default)"""
    sapo_temperature_neg: float = 1.05  # new to SAPO: the gate's temperatures
    """tau of the gate where A <= 0: larger, a faster fade (TRL's name and default)"""
    beta: float = 0.0
    """weight of the KL to the frozen reference (0: none is loaded)"""
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    """per-token estimate of the KL (k3: the GRPO paper's)"""
    kl_penalty: Literal["loss", "reward"] = "loss"
    """where the KL enters: a loss term per token, or a cost in the reward"""
    loss_type: Literal["grpo", "bnpo", "dr_grpo", "dapo"] = "grpo"
    """how per-token losses are aggregated, by TRL's names (see the docstring)"""
    importance_sampling_level: Literal["token", "sequence"] = "token"  # GSPO: sequence
    """the ratio per token, or per response (GSPO)"""


def check_args(args, world_size):
    """This file's own option errors, each with its fix, before any model loads."""
    if args.num_generations < 2:
        raise UsageError("--num_generations must be >= 2: a group needs two.")
    # new to SAPO: the gate divides by its temperature
    for name in ("sapo_temperature_pos", "sapo_temperature_neg"):
        if getattr(args, name) <= 0:
            raise UsageError(f"--{name} {getattr(args, name)}: the gate divides by it; "
                             f"pass a temperature > 0 (TRL's are 1.0 and 1.05).")


# ---- Rollout
def rollout(policy, tokenizer, env, position, first_prompt, local_prompts, args,
            autocast):
    """G responses to each of this rank's problems of update `position`, graded. A
    response's seed follows its global index: N processes draw what 1 does."""
    G = args.num_generations
    problems = prompt_indices(position, args.num_prompts, len(env), args.seed)
    problems = problems[first_prompt:first_prompt + local_prompts]
    seeds = [sample_seed(args.seed, position, first_prompt * G + k)
             for k in range(local_prompts * G)]
    prompts = encode_prompts(tokenizer, [env.prompt(p) for p in problems])
    prompts = [p for p in prompts for _ in range(G)]  # a group's rows in a row
    with autocast, fast_decoding(policy, enabled=not args.plain) as decoder:
        gen = generate(policy, tokenizer, prompts, args.max_new_tokens,
                       args.temperature, args.top_p, seeds=seeds, decoder=decoder,
                       reasoning=env.reasoning)
    texts = gen.texts(tokenizer)
    graded = env.score_all(texts, [p for p in problems for _ in range(G)],
                           gen.completion_ids())
    device = gen.response_ids.device
    scores = torch.tensor([reward for reward, _ in graded], device=device)
    correct = torch.tensor([float(info["correct"]) for _, info in graded],
                           device=device)
    return Rollout(gen, texts, scores, correct, problems)


# ---- Advantages
def kl_penalised(scores, kl, response_mask, beta):
    """--kl_penalty reward: each score minus beta times its summed KL. [N]"""
    if kl is None:
        return scores
    return scores - beta * (kl * response_mask.float()).sum(1)


def group_advantages(rewards, group_size, scale=True):
    """[N * G] rewards -> advantages, each against its own group. Dr.GRPO's
    (scale=False) keeps out the std, which up-weights groups that barely vary."""
    r = rewards.view(-1, group_size)  # [N, G]
    advantages = r - r.mean(dim=1, keepdim=True)
    if scale:  # the unbiased std, as torch and TRL take it
        advantages = advantages / (r.std(dim=1, keepdim=True) + 1e-4)
    return advantages.reshape(-1)


# ---- Loss
def loss_normaliser(loss_mask, args, world_size):
    """A minibatch's denominator, fixed before micro-batching, so that 1 x 8 and 8 x 1
    give the same gradient. loss_mask [n, R]: the tokens that count."""
    sequences = (loss_mask.sum(1) > 0).sum().clamp(min=1).item()
    if args.loss_type == "grpo":
        return float(sequences)
    if args.loss_type == "bnpo":
        return loss_mask.sum().clamp(min=1).item()  # this rank's tokens
    if args.loss_type == "dapo":
        # once the gradients are averaged over ranks: a mean over every rank's tokens
        tokens = all_reduce_sum(loss_mask.sum().float())
        return (tokens / world_size).clamp(min=1).item()
    if args.loss_type == "dr_grpo":
        return float(sequences * args.max_new_tokens)
    raise ValueError(f"unknown loss_type {args.loss_type!r}")


def aggregate(per_token, mask, loss_type, normaliser):
    """[b, R] per-token losses -> this micro-batch's share of the minibatch loss."""
    if loss_type == "grpo":
        # CRUCIAL: a mean over each sequence's own tokens: long and short weigh alike
        per_sequence = (per_token * mask).sum(1) / mask.sum(1).clamp(min=1)
        return per_sequence.sum() / normaliser
    return (per_token * mask).sum() / normaliser


def policy_loss(logprobs, old_logprobs, advantages, loss_mask, normaliser, args,
                ref_logprobs=None):
    # new to SAPO: a soft gate, not a clip
    """The gated surrogate. logprobs, old_logprobs, loss_mask: [b, R];
    ref_logprobs [b, R] adds the KL term (None: no KL in the loss)."""
    mask = loss_mask.float()
    log_ratio = logprobs - old_logprobs
    ratio = torch.exp(log_ratio)  # [b, R]
    if args.importance_sampling_level == "sequence":  # GSPO: one ratio a response
        ratio = torch.exp(masked_mean(log_ratio, mask, dim=1))[:, None].expand_as(ratio)
    # new to SAPO: one temperature per sign of the advantage
    tau = torch.where(advantages > 0, args.sapo_temperature_pos,
                      args.sapo_temperature_neg)[:, None]  # [b, 1]
    advantages = advantages[:, None]  # [b, 1]: a response's tokens share it
    # new to SAPO: the gate. CRUCIAL: its slope in rho is 4 s (1 - s), 1 at rho = 1,
    # so on policy the gradient is grpo.py's; off policy it fades, never to 0
    gate = torch.sigmoid(tau * (ratio - 1)) * 4 / tau
    pg_loss = -gate * advantages  # new to SAPO: the gate for the clipped ratio
    per_token = pg_loss
    if ref_logprobs is not None:
        kl = kl_estimate(logprobs, ref_logprobs, args.kl_estimator)
        per_token = per_token + args.beta * kl
    loss = aggregate(per_token, mask, args.loss_type, normaliser)
    with torch.no_grad():
        # new to SAPO: tokens whose gate passes under half of GRPO's gradient
        s = torch.sigmoid(tau * (ratio - 1))
        clipped = 4 * s * (1 - s) < 0.5  # new to SAPO: the gate's slope in rho
        # approx_kl is how far the policy moved from the one that sampled
        approx_kl = kl_estimate(old_logprobs, logprobs, "k3")
        stats = {"clipfrac": masked_mean(clipped.float(), mask).item(),
                 "approx_kl": masked_mean(approx_kl, mask).item(),
                 "pg_loss": masked_mean(pg_loss, mask).item()}
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
    env, eval_env = make_envs(args, say=run.print)
    args.dataset_name, args.dataset_path = env.source
    args.max_steps, args.warmup_steps = run.schedule(len(env), args.num_prompts)
    args.micro_batch_size = args.micro_batch_size or run.default_micro_batch

    local_prompts, G = args.num_prompts // run.world, args.num_generations
    N = local_prompts * G  # samples per rank per update
    run.print(f"SAPO | {run.world} process(es) on {run.device} | "
              f"{args.num_prompts} prompts x {G} samples | {args.num_ppo_epochs} "
              f"epoch(s) x {args.num_mini_batches} minibatch(es) | {len(env)} "
              f"problems | {args.max_steps} updates")
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
    run.start(policy, tokenizer, eval_env, {"policy": (policy, optimizer)})

    for step in range(start_step, args.max_steps):
        t0 = time.time()
        # ---- rollout: G responses to each of this rank's problems, graded
        first_prompt = run.rank * local_prompts
        batch = rollout(policy, tokenizer, env, step, first_prompt, local_prompts,
                        args, run.autocast)
        run.check_rewards(batch.scores, step + 1, batch.problems)
        gen, scores = batch.gen, batch.scores
        input_ids, attention_mask = gen.sequences()  # [N, P + R]
        response_mask = gen.response_mask  # [N, R]
        mask = response_mask.float()
        R = response_mask.shape[1]
        t_rollout = time.time() - t0

        # ---- log-probs of the behaviour policy and of the reference
        micro_batch = run.micro_batch_size(*input_ids.shape)
        old_logprobs, ref_logprobs, kl = None, None, None
        with run.autocast:
            # with one pass of one minibatch pi_old is the policy, detached
            if args.num_ppo_epochs > 1 or args.num_mini_batches > 1:
                old_logprobs = batched_token_logprobs(
                    policy, gen, args.temperature, micro_batch, fast=not args.plain)
            if ref_policy is not None:
                ref_logprobs = batched_token_logprobs(
                    ref_policy, gen, args.temperature, micro_batch,
                    fast=not args.plain)
        if ref_logprobs is not None and args.kl_penalty == "reward":
            # CRUCIAL: from the sampler's log-probs, the KL is a number, not a
            # function of the weights
            kl = kl_estimate(gen.logprobs, ref_logprobs, args.kl_estimator)
            ref_logprobs = None

        # ---- advantages: each response's reward against its group's
        rewards = kl_penalised(scores, kl, response_mask, args.beta)  # [N]
        advantages = group_advantages(rewards, G, args.loss_type != "dr_grpo")
        zero_std = (rewards.view(-1, G).std(dim=1) == 0).repeat_interleave(G)
        loss_mask = response_mask * (1 - gen.forced)  # [N, R] the model's own tokens

        # ---- update: epochs of minibatches, an optimizer step each
        lr = run.set_lr(optimizer, step)
        policy.train()
        stats, grad_norms = [], []
        for batch_rows in run.minibatches(N, step):
            normaliser = loss_normaliser(loss_mask[batch_rows], args, run.world)
            optimizer.zero_grad(set_to_none=True)
            total_loss = 0.0
            for rows in batch_rows.split(micro_batch):
                with run.autocast:
                    logprobs, entropy = token_logprobs(
                        policy, input_ids[rows], attention_mask[rows], R,
                        args.temperature, fast=not args.plain)
                old = logprobs.detach()
                if old_logprobs is not None:
                    old = old_logprobs[rows]
                ref = None if ref_logprobs is None else ref_logprobs[rows]
                loss, loss_stats = policy_loss(logprobs, old, advantages[rows],
                                               loss_mask[rows], normaliser, args, ref)
                loss.backward()
                total_loss += loss.item()
                loss_stats["entropy"] = masked_mean(entropy.detach(), mask[rows]).item()
                stats.append({**loss_stats,
                              **mismatch_stats(old, gen.logprobs[rows], mask[rows])})
            grad_norms.append(run.sync_gradients(policy))  # DDP's mean, the clip
            if run.guard.ok(total_loss, grad_norms[-1]):  # a NaN or inf skips it
                optimizer.step()
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
            "truncated_frac": gen.truncated.float().mean().item(),
            "zero_std_frac": zero_std.float().mean().item(),
            "grad_norm": sum(grad_norms) / len(grad_norms),
            "lr": lr,
            "tokens_per_s": n_tokens * run.world / t_rollout,
            "time/rollout_s": t_rollout,
            "time/update_s": t_update,
        }
        if kl is not None:
            metrics["kl_ref"] = masked_mean(kl, mask).item()
        samples = [{**env.sample_fields(batch.problems[k // G]),
                    "response": batch.texts[k], "reward": scores[k].item(),
                    "advantage": advantages[k].item()}
                   for k in range(0, N, max(1, N // 8))]
        run.log(step + 1, metrics, stats, samples)
        run.end_update(step + 1)
    return run.finish()


if __name__ == "__main__":
    main(parse_args(Args))
