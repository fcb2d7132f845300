"""CISPO: GRPO with a clipped, detached importance weight. Docs: docs/cispo.md

Paper: MiniMax 2025, "MiniMax-M1: Scaling Test-Time Compute Efficiently with
Lightning Attention" (arXiv:2506.13585), as TRL's GRPOTrainer has it
(loss_type "cispo"): grpo.py with one new surrogate, each line of it marked
`new to CISPO`. PPO's clip sets a token's gradient to 0 once its ratio leaves
[1 - eps, 1 + eps]; the rare tokens whose probability jumps (a "However", a
"Wait") are the ones cut. CISPO clips the weight instead and detaches it, so
every token keeps a REINFORCE gradient, at most epsilon_high times its own:
    A_i    = (r_i - mean_G(r)) / (std_G(r) + eps)    (Dr.GRPO: no std)
    rho_it = pi(o_it | q, o_i<t) / pi_old(o_it | q, o_i<t)
    w_it   = sg(min(rho_it, epsilon_high))            (sg: no gradient)
    L      = agg_it [ -w_it A_i log pi(o_it | q, o_i<t) + beta KL_it ]
agg, --loss_type: a token mean over the global batch (dapo: TRL's cispo's, the
default here), or grpo.py's others. KL_it: k3's to the frozen reference.
epsilon_high is the cap on the weight itself, not on rho - 1 as in dapo.py;
its default 5.0 is TRL's recommendation (ScaleRL's eps_max). TRL's own default
(None) falls back to epsilon 0.2 and would cap every weight at 0.2 (< 1: a
smaller step on every on-policy token), so this file refuses a cap <= 1.

Simplified versus the paper and TRL:
- the paper's weight also has a floor (eps_low), unused there and in TRL:
  none here;
- no GSPO sequence ratio (TRL warns that its token mean weights a sequence
  by its length);
- one process samples and learns, with the HF model (no vLLM);
- with one epoch of one minibatch (the default) the ratio is exactly 1, the
  weight 1, and the gradient grpo.py's --loss_type dapo: run
  --num_ppo_epochs 2 (or --num_mini_batches 2) for the cap to act.

Launch:
    python cispo.py                     # CPU, offline: SmolLM2-135M, arithmetic
    python cispo.py --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct \\
        --dataset_name gsm8k --bf16 --num_mini_batches 4
    torchrun --nproc_per_node 8 cispo.py --bf16 --num_prompts 64 \\
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
    epsilon_high: float = 5.0  # new to CISPO: the cap on the weight
    """the upper clip range: CISPO's cap on the weight rho itself, not on rho - 1
    (TRL's name; ScaleRL's eps_max; 5.0, TRL's advice, as TRL's None is 0.2)"""
    beta: float = 0.0
    """weight of the KL to the frozen reference (0: none is loaded)"""
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    """per-token estimate of the KL (k3: the GRPO paper's)"""
    kl_penalty: Literal["loss", "reward"] = "loss"
    """where the KL enters: a loss term per token, or a cost in the reward"""
    # new to CISPO: TRL's cispo is a token mean over the global batch
    loss_type: Literal["grpo", "bnpo", "dr_grpo", "dapo"] = "dapo"
    """how per-token losses are aggregated, by TRL's names (see the docstring)"""


def check_args(args, world_size):
    """This file's own option errors, each with its fix, before any model loads."""
    if args.num_generations < 2:
        raise UsageError("--num_generations must be >= 2: a group needs two.")
    if args.epsilon_high <= 1:  # new to CISPO: a cap below 1 shrinks on-policy tokens
        raise UsageError(
            f"--epsilon_high {args.epsilon_high} caps the weight rho, not rho - 1: at "
            f"most 1 it shrinks every on-policy token; pass more than 1 (5.0, TRL's "
            f"advice; 1.28 is DAPO's 1 + 0.28).")


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
    """The clipped surrogate. logprobs, old_logprobs, loss_mask: [b, R];
    ref_logprobs [b, R] adds the KL term (None: no KL in the loss)."""
    mask = loss_mask.float()
    log_ratio = logprobs - old_logprobs
    ratio = torch.exp(log_ratio)  # [b, R]
    high = args.epsilon_high  # new to CISPO: a cap on the weight, and no floor
    advantages = advantages[:, None]  # [b, 1]: a response's tokens share it
    # new to CISPO: the capped weight times the log-prob. CRUCIAL: the weight is
    # detached, so a capped token still passes a gradient (its REINFORCE one,
    # times the cap), where the clip of grpo.py passes none
    pg_loss = -ratio.clamp(max=high).detach() * advantages * logprobs
    per_token = pg_loss
    if ref_logprobs is not None:
        kl = kl_estimate(logprobs, ref_logprobs, args.kl_estimator)
        per_token = per_token + args.beta * kl
    loss = aggregate(per_token, mask, args.loss_type, normaliser)
    with torch.no_grad():
        # new to CISPO: capped weights where A > 0, TRL's cispo_clip_ratio
        clipped = (ratio > high) & (advantages > 0)
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
    run.print(f"CISPO | {run.world} process(es) on {run.device} | "
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
