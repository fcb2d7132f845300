"""Off-policy GRPO: the sampler runs k updates behind the trainer, each token weighted back
toward the trainer's policy. Docs: docs/async_grpo.md

Papers: asynchronous RLHF (Noukhovitch et al. 2024, arXiv:2410.18252) and AReaL's decoupled PPO (Fu
et al. 2025, arXiv:2505.24298); the corrections: TIS (Yao et al. 2025, "Your efficient RL framework
secretly brings you off-policy RL training"), IcePop (Ling team 2025) and sequence-level masked
importance sampling (Liu, Li et al. 2025, "When speed kills stability"). The loss is grpo.py's
(DeepSeekMath, Shao et al. 2024, arXiv:2402.03300).

Update n trains on a batch that the weights of update n - k sampled (k = --max_staleness; the first
k updates' batches come from the starting weights), so sampling the next batch can run while this
one trains. Three policies meet in the loss:
    mu       the sampler: the weights of update n - k, whose log-probs came with the batch
    pi_prox  the trainer's weights at update n (its log-probs recomputed): PPO's pi_old
    pi       the weights being trained
and with A_i the group advantage and rho_it = pi / pi_prox, exactly as grpo.py's,
    L = agg_it [ w_it * -min(rho_it A_i, clip(rho_it, 1 - eps, 1 + eps) A_i) + beta KL_it ]
where w_it corrects for mu != pi_prox, from r_it = pi_prox(o_it) / mu(o_it)
(--off_policy_correction):
    none      w = 1
    tis       w = min(r_it, C)                                 (truncated importance sampling)
    icepop    w = r_it where low <= r_it <= high, else 0      (tokens far off are masked)
    seq_mis   w = R_i if R_i <= C, else 0, R_i = prod_t r_it  (a whole response masked)
k = 0 is grpo.py's synchronous run, update for update.

Two ways to run it:
- one process: before update n it samples the batch of update n + k, with the weights as they are,
  and keeps it in a queue. This is the staleness without the overlap: to learn what k and the
  corrections do, at no gain in speed;
- under torchrun: the last rank samples, the others train, data-parallel as grpo.py's ranks
  (each trainer takes its share of the batch's prompts; gradients and metrics are averaged over the
  trainers). After each update trainer rank 0 sends the sampler its weights (GPU to GPU where each
  rank has its own, else through the host), and the sampler draws update n + k's batch while
  update n trains. The same batches and the same weights as one process, up to float rounding. It
  pays where each process has a device of its own; on a CPU's cores shared between them it does
  not (docs: measured).

Simplified versus AReaL, verl and TRL's AsyncGRPO:
- the staleness is fixed, not "up to k": batch n always comes from the weights of update n - k,
  which makes a run reproducible and the two modes equal (a sampler that takes the newest weights
  it has would be faster and would not be);
- one sampler (no pool of samplers) and trainers without --fsdp; the weights are sent whole after
  each update;
- DAPO's dynamic sampling is left out.

Launch:
    python async_grpo.py                           # CPU, offline: k = 1, the TIS correction
    python async_grpo.py --max_staleness 2 --off_policy_correction icepop
    torchrun --nproc_per_node 2 async_grpo.py      # rank 1 samples while rank 0 trains
    torchrun --nproc_per_node 3 async_grpo.py      # ranks 0-1 train, rank 2 samples
"""

import time
from dataclasses import dataclass
from typing import Literal, Optional

import torch

from common import UsageError, all_reduce_sum, sample_seed
from common.env import make_envs, prompt_indices
from common.models import (Rollout, batched_token_logprobs, encode_prompts, fast_decoding, generate,
                           load_tokenizer, reference_policy, token_logprobs, trained_policy)
from common.rl import kl_estimate, masked_mean, mismatch_stats
from common.run import Run, SampledAhead, TrainArgs, check_unused, parse_args, saved_queue


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
    epsilon: float = 0.2
    """clip range of the ratio"""
    beta: float = 0.0
    """weight of the KL to the frozen reference (0: no reference is loaded)"""
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    """per-token estimate of the KL: k1 log-ratio, k2 its square / 2, k3 the GRPO paper's"""
    kl_penalty: Literal["loss", "reward"] = "loss"
    """where the KL enters: a loss term per token, or a cost in the reward"""
    loss_type: Literal["grpo", "bnpo", "dr_grpo", "dapo"] = "grpo"
    """how per-token losses are aggregated, by TRL GRPOTrainer's names (see the docstring)"""
    # ---- off-policy
    max_staleness: int = 1  # new to async: k
    """k: update n trains on responses that the weights of update n - k sampled (0: grpo.py)"""
    off_policy_correction: Literal["none", "tis", "icepop", "seq_mis"] = "tis"
    """each token's weight toward the trainer's policy (see the docstring)"""
    is_cap: float = 2.0  # TIS and MIS: C
    """tis: the weight's cap; seq_mis: responses whose weight passes it are masked"""
    icepop_low: float = 0.5  # IcePop: alpha
    """icepop: tokens whose weight is below this are masked"""
    icepop_high: float = 5.0  # IcePop: beta
    """icepop: tokens whose weight is above this are masked"""


def check_args(args, world_size):
    """This file's own option errors, each with its fix, before any model loads (Run checks the
    shared ones of common/run/checks.py first)."""
    if world_size > 1 and args.fsdp:  # new to async: the sampler holds whole weights
        raise UsageError("--fsdp would shard the weights over every rank, and async_grpo.py's "
                         "last rank samples with whole weights: drop --fsdp, or use grpo.py "
                         "--fsdp.")
    if args.num_generations < 2:
        raise UsageError("--num_generations must be >= 2: the group baseline needs two samples.")
    correction = args.off_policy_correction  # new to async: each correction reads its own bounds
    check_unused(args, [
        ("is_cap", correction in ("tis", "seq_mis"), "--off_policy_correction tis or seq_mis"),
        ("icepop_low", correction == "icepop", "--off_policy_correction icepop"),
        ("icepop_high", correction == "icepop", "--off_policy_correction icepop")])


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


# ------------------------------------------------------------------------------------------------
# Advantages
# ------------------------------------------------------------------------------------------------
def kl_penalised(scores, kl, response_mask, beta):
    """--kl_penalty reward: each response's score minus beta times its summed per-token KL. [N]"""
    return scores if kl is None else scores - beta * (kl * response_mask.float()).sum(1)


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


# new to async: the correction
def off_policy_weights(old_logprobs, sampler_logprobs, mask, args):
    """Each token's weight w_it toward pi_prox (old_logprobs: the trainer's weights at this update)
    for a token that mu (sampler_logprobs: the weights of k updates ago) drew, and where a bound cut
    the weight (truncated or masked). [b, R] each; padding counts as a ratio of 1 (the loss masks
    it out)."""
    log_r = (old_logprobs - sampler_logprobs) * mask  # log pi_prox / mu per token, 0 on padding
    r = torch.exp(log_r.clamp(-20, 20))  # exp of a large log-ratio would overflow to inf
    if args.off_policy_correction == "tis":  # truncated at C
        return r.clamp(max=args.is_cap), r > args.is_cap
    if args.off_policy_correction == "icepop":  # IcePop: tokens far off are masked
        cut = (r < args.icepop_low) | (r > args.icepop_high)
        return r.masked_fill(cut, 0.0), cut
    if args.off_policy_correction == "seq_mis":  # MIS: one weight per response, masked above C
        seq = torch.exp(log_r.sum(1, keepdim=True).clamp(-20, 20)).expand_as(r)  # prod_t r_it
        cut = seq > args.is_cap
        return seq.masked_fill(cut, 0.0), cut
    return torch.ones_like(r), torch.zeros_like(r, dtype=torch.bool)


def policy_loss(logprobs, old_logprobs, advantages, loss_mask, normaliser, args,
                ref_logprobs=None, sampler_logprobs=None):  # new to async: the sampler's [b, R]
    """Clipped surrogate per token.
    loss_mask [b, R]: the tokens that count; ref_logprobs [b, R] adds the KL term (None: no KL in
    the loss); logprobs, old_logprobs: [b, R]."""
    mask = loss_mask.float()
    log_ratio = logprobs - old_logprobs  # [b, R]
    ratio = torch.exp(log_ratio)  # [b, R]
    low, high = 1 - args.epsilon, 1 + args.epsilon  # the clip range
    # every token of a response shares its advantage: [b] -> [b, 1]
    advantages = advantages[:, None]
    pg_loss = torch.max(-advantages * ratio, -advantages * ratio.clamp(low, high))  # [b, R]
    # new to async: each token weighted from the sampler's policy (k updates behind) to pi_prox
    weights, cut = off_policy_weights(old_logprobs, sampler_logprobs, mask, args)  # [b, R]
    per_token = pg_loss * weights  # new to async: the weighted surrogate
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
        stats.update({"is_weight/mean": masked_mean(weights, mask).item(),  # new to async: cut
                      "is_weight/clipped_frac": masked_mean(cut.float(), mask).item()})
        if ref_logprobs is not None:
            stats["kl_ref"] = masked_mean(kl, mask).item()
    return loss, stats


# ------------------------------------------------------------------------------------------------
# Main: setup -> models -> update loop (rollout, advantages, update) -> logging, eval, checkpoints
# ------------------------------------------------------------------------------------------------
def main(args):
    # TRY NOT TO MODIFY: processes, option checks and the seed; the env before any model, so that a
    # bad task or data file fails at once; where the run starts
    run = Run(args, check_args, samplers=1)  # new to async: under torchrun the last rank samples
    # ---- derived options: the only lines that change args after parsing (args.json keeps them)
    env, eval_env = make_envs(args, say=run.print)
    args.dataset_name, args.dataset_path = env.source  # a data file or hub id: its task
    args.max_steps, args.warmup_steps = run.schedule(len(env), args.num_prompts)
    args.micro_batch_size = args.micro_batch_size or run.default_micro_batch  # a GPU fits the rest

    # new to async: under torchrun the last rank samples and run.trainers ranks train, k updates
    # behind; one process does both
    local_prompts, G = args.num_prompts // run.trainers, args.num_generations
    N, staleness = local_prompts * G, args.max_staleness  # new to async: per trainer; k
    run.print(f"async GRPO | {run.world} process(es), {run.trainers} training, on {run.device} | "
              f"batches sampled {staleness} update(s) behind, corrected by "
              f"{args.off_policy_correction} | {args.num_prompts} prompts x {G} samples per update "
              f"({N} per trainer) | {args.num_ppo_epochs} epoch(s) x {args.num_mini_batches} "
              f"minibatch(es) of micro-batches of {args.micro_batch_size} | {len(env)} problems | "
              f"{args.max_steps} updates")
    start_step, resume_from = run.resume_point()
    queue = saved_queue(run.state, args, start_step, len(env), resume_from)  # new to async: checked

    # ---- models
    tokenizer = load_tokenizer(args.model_name_or_path)
    run.check_prompts(tokenizer, env, eval_env)  # each prompt within the model's positions
    policy = trained_policy(args, resume_from, run.device)  # LoRA (--lora_r), FSDP2 (--fsdp)
    # new to async: the batches of the next updates, whole, each drawn by the weights of k updates
    # before (under torchrun the last rank samples them while the others train); a resumed run's
    # from its checkpoint
    ahead = SampledAhead(run, staleness, lambda position: rollout(
        policy, tokenizer, env, position, 0, args.num_prompts, args, run.autocast), queue)
    if ahead.is_sampler:  # new to async: the last rank samples until the last batch, never trains
        return ahead.serve(policy, start_step)

    ref_policy = reference_policy(args, policy, run.device) if args.beta > 0 else None
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad],
                                  lr=args.learning_rate, weight_decay=0.0)
    if args.offload_optimizer:  # fp32 master weights and AdamW on the CPU, bf16 on the device
        optimizer = run.offload_optimizer(policy, optimizer)
    # TRY NOT TO MODIFY: a resumed run's optimizer state, the logs, the accuracy before training
    run.start(policy, tokenizer, eval_env, {"policy": (policy, optimizer)},  # new to async:
              extra_state=lambda: {"queue": ahead.state(step)})  # the queue, in each checkpoint

    for step in range(start_step, args.max_steps):
        t0 = time.time()
        # ---- rollout: G responses to each of this rank's problems, sampled k updates ago, graded
        sampled = ahead.pop(step)  # new to async: .version, the update whose weights drew it
        first_prompt = run.rank * local_prompts  # this rank's share of the update's problems
        batch = sampled.share(first_prompt, local_prompts)  # new to async: sampled whole
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
        rewards = kl_penalised(scores, kl, response_mask, args.beta)  # [N]
        advantages = group_advantages(rewards, G, scale=args.loss_type != "dr_grpo")  # [N]
        zero_std = (rewards.view(-1, G).std(dim=1) == 0).repeat_interleave(G)  # [N]
        loss_mask = response_mask  # [N, R] the tokens that count in the loss

        # ---- update: num_ppo_epochs passes of num_mini_batches optimizer steps, over micro-batches
        lr = run.set_lr(optimizer, step)
        policy.train()
        stats, grad_norms = [], []
        for batch_rows in run.minibatches(N, step):  # seeded: a resumed run takes the same
            # new to async: the ranks that train, the sampler left out
            normaliser = loss_normaliser(loss_mask[batch_rows], args, run.trainers)
            optimizer.zero_grad(set_to_none=True)
            total_loss = 0.0
            for rows in batch_rows.split(micro_batch):  # gradients accumulate over micro-batches
                with run.autocast:
                    logprobs, entropy = token_logprobs(policy, input_ids[rows],
                                                       attention_mask[rows], R, args.temperature,
                                                       fast=not args.plain)
                old = logprobs.detach() if old_logprobs is None else old_logprobs[rows]
                ref = None if ref_logprobs is None else ref_logprobs[rows]
                # new to async: the sampler's log-probs, which weigh each token
                loss, loss_stats = policy_loss(logprobs, old, advantages[rows], loss_mask[rows],
                                               normaliser, args, ref, gen.logprobs[rows])
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
        ahead.updated(policy, step)  # new to async: under torchrun rank 0 sends the sampler these
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
            "staleness/mean": step - sampled.version,  # new to async: updates behind
            "grad_norm": sum(grad_norms) / len(grad_norms),
            "lr": lr, "tokens_per_s": n_tokens * run.trainers / sampled.seconds,  # new to async:
            # the sampler's time on this batch; the trainer's wait for it (under torchrun: what the
            # sampler could not hide behind the update)
            "time/rollout_s": sampled.seconds, "time/wait_s": t_rollout,  # new to async:
            "time/update_s": t_update,
        }
        if kl is not None:
            metrics["kl_ref"] = masked_mean(kl, mask).item()  # per token
        samples = [{**env.sample_fields(batch.problems[k // G]), "response": batch.texts[k],
                    "reward": scores[k].item(), "advantage": advantages[k].item()}
                   for k in range(0, N, max(1, N // 8))]
        run.log(step + 1, metrics, stats, samples)
        run.end_update(step + 1)
    ahead.close()  # new to async: the sampler's last batch, and its process
    return run.finish()


if __name__ == "__main__":
    main(parse_args(Args))
