"""Off-policy GRPO: the sampler runs k updates behind the trainer, each token
weighted back toward the trainer's policy. Docs: docs/async_grpo.md

Papers: asynchronous RLHF (Noukhovitch et al. 2024, arXiv:2410.18252) and
AReaL's decoupled PPO (Fu et al. 2025, arXiv:2505.24298); the corrections: TIS
(Yao et al. 2025), IcePop (Ling team 2025) and sequence-level masked
importance sampling (Liu, Li et al. 2025), titled in the docs. The loss is
grpo.py's.

Update n trains on the batch that update n - k's weights sampled (k =
--max_staleness; the first k from the starting weights), so that the next
batch can be sampled while this one trains. Three policies meet:
    mu       the sampler: update n - k's weights, its log-probs in the batch
    pi_prox  the trainer's weights at update n (recomputed): PPO's pi_old
    pi       the weights being trained
and with rho_it = pi / pi_prox, as in grpo.py,
    L = agg_it [ w_it * -min(rho_it A_i, clip(rho_it, 1 - eps, 1 + eps) A_i)
                 + beta KL_it ]
where w_it (--off_policy_correction) corrects for mu != pi_prox, with
r_it = pi_prox / mu:
    none      w = 1
    tis       w = min(r_it, C)                             (truncated IS)
    icepop    w = r_it where low <= r_it <= high, else 0  (far-off tokens masked)
    seq_mis   w = R_i if R_i <= C, else 0, R_i = prod_t r_it  (a response masked)
k = 0 is grpo.py, update for update.

One process samples update n + k's batch before update n (the staleness
without the overlap); under torchrun the last rank samples it while the others
train, with the weights trainer rank 0 sends after each update: the same
batches and weights, up to float rounding.

Simplified versus AReaL, verl and TRL's AsyncGRPO: the staleness is fixed, not
"up to k", so that a run is reproducible and the two modes equal; one sampler,
and trainers without --fsdp; the weights are sent whole; no dynamic sampling.

Launch:
    python async_grpo.py                        # CPU, offline: k = 1, TIS
    python async_grpo.py --max_staleness 2 --off_policy_correction icepop
    torchrun --nproc_per_node 2 async_grpo.py   # rank 1 samples, rank 0 trains
    torchrun --nproc_per_node 3 async_grpo.py   # ranks 0-1 train, rank 2 samples
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
from common.run import (Run, SampledAhead, TrainArgs, check_unused, parse_args,
                        saved_queue)


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
    epsilon: float = 0.2
    """clip range of the ratio"""
    beta: float = 0.0
    """weight of the KL to the frozen reference (0: none is loaded)"""
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    """per-token estimate of the KL (k3: the GRPO paper's)"""
    kl_penalty: Literal["loss", "reward"] = "loss"
    """where the KL enters: a loss term per token, or a cost in the reward"""
    loss_type: Literal["grpo", "bnpo", "dr_grpo", "dapo"] = "grpo"
    """how per-token losses are aggregated, by TRL's names (see the docstring)"""
    # ---- off-policy
    max_staleness: int = 1  # new to async: k
    """k: update n trains on what update n - k's weights sampled (0: grpo.py)"""
    off_policy_correction: Literal["none", "tis", "icepop", "seq_mis"] = "tis"
    """each token's weight toward the trainer's policy (see the docstring)"""
    is_cap: float = 2.0  # C of TIS and MIS
    """tis: the weight's cap; seq_mis: a response weighted above it is masked"""
    icepop_low: float = 0.5  # IcePop's alpha
    """icepop: tokens whose weight is below this are masked"""
    icepop_high: float = 5.0  # IcePop's beta
    """icepop: tokens whose weight is above this are masked"""


def check_args(args, world_size):
    """This file's own option errors, each with its fix, before any model loads."""
    if world_size > 1 and args.fsdp:  # new to async: the sampler holds whole weights
        raise UsageError(
            "--fsdp would shard the weights over every rank, and async_grpo.py's last "
            "rank samples with whole weights: drop --fsdp, or use grpo.py --fsdp.")
    if args.num_generations < 2:
        raise UsageError("--num_generations must be >= 2: the group baseline needs "
                         "two samples.")
    # new to async: each correction reads its own bounds
    correction = args.off_policy_correction
    check_unused(args, [
        ("is_cap", correction in ("tis", "seq_mis"),
         "--off_policy_correction tis or seq_mis"),
        ("icepop_low", correction == "icepop", "--off_policy_correction icepop"),
        ("icepop_high", correction == "icepop", "--off_policy_correction icepop")])


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


# new to async: the correction
def off_policy_weights(old_logprobs, sampler_logprobs, mask, args):
    """w_it toward pi_prox (old_logprobs: this update's weights) for each token mu
    (sampler_logprobs: k updates ago) drew, and where a bound cut it. [b, R] each;
    padding counts as a ratio of 1 (the loss masks it out)."""
    log_r = (old_logprobs - sampler_logprobs) * mask  # log pi_prox / mu
    r = torch.exp(log_r.clamp(-20, 20))  # a large log-ratio's exp would be inf
    if args.off_policy_correction == "tis":  # truncated at C
        return r.clamp(max=args.is_cap), r > args.is_cap
    if args.off_policy_correction == "icepop":  # IcePop masks tokens far off
        cut = (r < args.icepop_low) | (r > args.icepop_high)
        return r.masked_fill(cut, 0.0), cut
    if args.off_policy_correction == "seq_mis":  # a response's weight, masked above C
        seq = torch.exp(log_r.sum(1, keepdim=True).clamp(-20, 20))  # prod_t r_it
        seq = seq.expand_as(r)
        cut = seq > args.is_cap
        return seq.masked_fill(cut, 0.0), cut
    return torch.ones_like(r), torch.zeros_like(r, dtype=torch.bool)


def policy_loss(logprobs, old_logprobs, advantages, loss_mask, normaliser, args,
                ref_logprobs=None, sampler_logprobs=None):  # new to async: mu's
    """The clipped surrogate. logprobs, old_logprobs, loss_mask: [b, R];
    ref_logprobs [b, R] adds the KL term (None: no KL in the loss)."""
    mask = loss_mask.float()
    log_ratio = logprobs - old_logprobs
    ratio = torch.exp(log_ratio)  # [b, R]
    low, high = 1 - args.epsilon, 1 + args.epsilon
    advantages = advantages[:, None]  # [b, 1]: a response's tokens share it
    pg_loss = torch.max(-advantages * ratio, -advantages * ratio.clamp(low, high))
    # new to async: the correction from mu to pi_prox
    weights, cut = off_policy_weights(old_logprobs, sampler_logprobs, mask, args)
    per_token = pg_loss * weights  # new to async: the weighted surrogate
    if ref_logprobs is not None:
        kl = kl_estimate(logprobs, ref_logprobs, args.kl_estimator)
        per_token = per_token + args.beta * kl
    loss = aggregate(per_token, mask, args.loss_type, normaliser)
    with torch.no_grad():
        clipped = (((ratio < low) & (advantages < 0))
                   | ((ratio > high) & (advantages > 0)))
        # approx_kl is how far the policy moved from the one that sampled
        approx_kl = kl_estimate(old_logprobs, logprobs, "k3")
        stats = {"clipfrac": masked_mean(clipped.float(), mask).item(),
                 "approx_kl": masked_mean(approx_kl, mask).item(),
                 "pg_loss": masked_mean(pg_loss, mask).item()}
        # new to async: the weights, and the share a bound cut
        stats.update({"is_weight/mean": masked_mean(weights, mask).item(),
                      "is_weight/clipped_frac": masked_mean(cut.float(), mask).item()})
        if ref_logprobs is not None:
            stats["kl_ref"] = masked_mean(kl, mask).item()
    return loss, stats


# ---- Main: setup, models, then each update's rollout, advantages, update, logs
def main(args):
    # TRY NOT TO MODIFY: processes, option checks, the seed; the env before any
    # model, so that a bad task or data file fails at once
    run = Run(args, check_args, samplers=1)  # new to async: one sampler
    # ---- derived options: the only lines that change args after parsing
    args.output_dir = run.output_dir  # without --output_dir: a new folder each run
    env, eval_env = make_envs(args, say=run.print)
    args.dataset_name, args.dataset_path = env.source
    args.max_steps, args.warmup_steps = run.schedule(len(env), args.num_prompts)
    args.micro_batch_size = args.micro_batch_size or run.default_micro_batch

    # new to async: the prompts split over the training ranks
    local_prompts, G = args.num_prompts // run.trainers, args.num_generations
    N = local_prompts * G  # samples per rank per update
    staleness = args.max_staleness  # new to async: k
    run.print(f"async GRPO | {run.world} process(es), {run.trainers} training, on "
              f"{run.device} | batches sampled {staleness} update(s) behind, "
              f"corrected by {args.off_policy_correction} | "
              f"{args.num_prompts} prompts x {G} samples | {args.num_ppo_epochs} "
              f"epoch(s) x {args.num_mini_batches} minibatch(es) | {len(env)} "
              f"problems | {args.max_steps} updates")
    start_step, resume_from = run.resume_point()
    # new to async: a resumed run's queue, checked before any model loads
    queue = saved_queue(run.state, args, start_step, len(env), resume_from)

    # ---- models
    tokenizer = load_tokenizer(args.model_name_or_path,
                               template_kwargs=args.chat_template_kwargs)
    run.check_prompts(tokenizer, env, eval_env)
    policy = trained_policy(args, resume_from, run.device)
    # new to async: the next k updates' batches, sampled ahead (under torchrun by
    # the last rank, while the others train)
    ahead = SampledAhead(run, staleness, lambda position: rollout(
        policy, tokenizer, env, position, 0, args.num_prompts, args, run.autocast),
        queue)
    if ahead.is_sampler:  # new to async: a sampler never trains
        return ahead.serve(policy, start_step)

    ref_policy = None
    if args.beta > 0:
        ref_policy = reference_policy(args, policy, run.device)
    trained = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trained, lr=args.learning_rate, weight_decay=0.0)
    if args.offload_optimizer:
        optimizer = run.offload_optimizer(policy, optimizer)
    # TRY NOT TO MODIFY: a resumed run's optimizers, the logs, the first evaluation
    # new to async: the queue, in each checkpoint
    run.start(policy, tokenizer, eval_env, {"policy": (policy, optimizer)},
              extra_state=lambda: {"queue": ahead.state(step)})

    for step in range(start_step, args.max_steps):
        t0 = time.time()
        # ---- rollout: G responses to each of this rank's problems, k updates old
        # new to async: drawn by the weights of update sampled.version
        sampled = ahead.pop(step)
        first_prompt = run.rank * local_prompts
        batch = sampled.share(first_prompt, local_prompts)  # new to async: a share
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
            # new to async: the training ranks only
            normaliser = loss_normaliser(loss_mask[batch_rows], args, run.trainers)
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
                # new to async: mu's log-probs
                loss, loss_stats = policy_loss(logprobs, old, advantages[rows],
                                               loss_mask[rows], normaliser, args, ref,
                                               gen.logprobs[rows])
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
        ahead.updated(policy, step)  # new to async: to the sampler
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
            "staleness/mean": step - sampled.version,  # new to async: updates behind
            "grad_norm": sum(grad_norms) / len(grad_norms),
            "lr": lr,
            "tokens_per_s": n_tokens * run.trainers / sampled.seconds,  # new to async:
            # the sampler's rate and time; the trainers' wait, what it could not hide
            "time/rollout_s": sampled.seconds,  # new to async: the sampler's
            "time/wait_s": t_rollout,
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
    ahead.close()  # new to async: the sampler's end
    return run.finish()


if __name__ == "__main__":
    main(parse_args(Args))
