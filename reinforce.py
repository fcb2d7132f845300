"""REINFORCE with a KL-regularised return and a baseline on verifiable math. Docs: docs/reinforce.md

Paper: Williams 1992, "Simple statistical gradient-following algorithms for connectionist
reinforcement learning", as the "REINFORCE stable" of navidmdn/LLM_RL does it for LLMs (a
KL-regularised return, length-normalised log-probs, a reference that can be refreshed), plus the
leave-one-out baseline of RLOO (Ahmadian et al. 2024, arXiv:2402.14740; TRL's RLOOTrainer). The
seed's policy writes one line per step with a calculator: that is reinforce_stepwise.py.

For every prompt, sample k responses, grade each with the task's verifier, and push up the
log-probability of each response in proportion to how much its KL-regularised return beats a
baseline (docs/reinforce.md says why a baseline helps, and what it measured):
    G_i = r_i - beta KL_i,    KL_i = sum_t [log pi(o_it) - log pi_ref(o_it)]   (k1, per response)
    A_i = G_i - b_i,          b_i = 0 (none) | batch mean of G (mean) | sum_j!=i G_j / (k-1) (rloo)
    L   = -(1/N) sum_i A_i log pi(o_i | q),    log pi(o_i | q) = sum_t log pi(o_it | q, o_i<t)
With --length_normalize (the seed's way, on by default) log pi(o_i | q) and KL_i are token means.

Simplified versus the seed (LLM_RL):
- on-policy batches of num_prompts x num_generations samples and one optimizer step each, no replay
  buffer (the seed samples stored transitions uniformly, without importance correction);
- the KL sits in the return as a detached number (KL in the reward, as in RLOO and TRL); the seed
  differentiates through it inside the loss (--kl_penalty loss puts it there);
- no return clamping to [0, 10] (rewards are in [0, 1] here);
- one process both samples and learns, with the HF model and a KV-cached sampling loop (no vLLM).

Launch:
    python reinforce.py                   # CPU, offline: SmolLM2-135M-Instruct, arithmetic
    python reinforce.py --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct --dataset_name gsm8k --bf16
    torchrun --nproc_per_node 8 reinforce.py --model_name_or_path Qwen/Qwen2.5-1.5B-Instruct \\
        --dataset_name gsm8k --bf16 --num_prompts 64
"""

import time
from dataclasses import dataclass
from typing import Literal, Optional

import torch

from common import UsageError, all_reduce_sum, sample_seed
from common.env import make_envs, prompt_indices
from common.models import (Rollout, batched_token_logprobs, encode_prompts, fast_decoding,
                           full_state_dict, generate, load_tokenizer, reference_policy,
                           token_logprobs, trained_policy)
from common.rl import kl_estimate, masked_mean, mismatch_stats
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
    num_generations: int = 8
    """G: responses sampled per prompt (the group)"""
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
# Advantages: returns and baselines
# ------------------------------------------------------------------------------------------------
def sequence_logprobs(logprobs, mask, length_normalize):
    """[b, R] token log-probs -> [b] log pi(action): their sum or, as the seed does, their mean.
    Also turns per-token KL estimates into the action's KL, the same way."""
    total = (logprobs * mask).sum(1)  # [b]
    return total / mask.sum(1).clamp(min=1) if length_normalize else total


def kl_regularised_returns(rewards, kl, beta):
    """rewards, kl: [N], per response -> returns [N], G = r - beta KL."""
    # CRUCIAL: the KL enters as a reward, a number computed without gradients, so the policy
    # gradient is pure REINFORCE (the seed differentiates through its KL term instead).
    return rewards - beta * kl


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
    mask = loss_mask.float()  # 0 on padding
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
    env, eval_env = make_envs(args, say=run.print)
    args.dataset_name, args.dataset_path = env.source  # a data file or hub id: its task
    args.max_steps, args.warmup_steps = run.schedule(len(env), args.num_prompts)
    args.micro_batch_size = args.micro_batch_size or run.default_micro_batch  # a GPU fits the rest

    local_prompts, G = args.num_prompts // run.world, args.num_generations
    N = local_prompts * G  # samples per rank per update
    run.print(f"REINFORCE | {run.world} process(es) on {run.device} | {args.num_prompts} prompts x "
              f"{G} samples per update ({N} per rank) | micro-batches of {args.micro_batch_size} | "
              f"{len(env)} problems | {args.max_steps} updates | {args.baseline} baseline")
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
        # ---- rollout: k responses to each of this rank's problems, graded
        first_prompt = run.rank * local_prompts  # this rank's share of the update's problems
        batch = rollout(policy, tokenizer, env, step, first_prompt, local_prompts, args,
                        run.autocast)
        run.check_rewards(batch.scores, step + 1, batch.problems)  # NaN or inf: the run stops
        gen, scores = batch.gen, batch.scores
        input_ids, attention_mask = gen.sequences()  # [N, P + R]
        response_mask = gen.response_mask  # [N, R] every sampled token
        mask = response_mask.float()  # the same, for the statistics
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
            kl = kl_estimate(gen.logprobs, ref_logprobs, args.kl_estimator)  # [N, R]
            ref_logprobs = None

        # ---- advantages: each response's KL-regularised return against its baseline
        # CRUCIAL: the sampler's log-probs make the KL a number, not a function of the weights
        kl_seq = 0.0 if kl is None else sequence_logprobs(kl, mask, args.length_normalize)  # [N]
        returns = kl_regularised_returns(scores, kl_seq, args.beta)  # [N]
        baselines = compute_baselines(returns, G, args.baseline)  # [N]
        advantages = returns - baselines  # [N]
        loss_mask = response_mask  # [N, R] the tokens that count in the loss

        # ---- update: one optimizer step on the whole batch (REINFORCE is on-policy), micro-batched
        lr = run.set_lr(optimizer, step)
        policy.train()
        stats, total_loss = [], 0.0
        normaliser = loss_normaliser(loss_mask, args, run.world)
        optimizer.zero_grad(set_to_none=True)
        for rows in torch.arange(N, device=run.device).split(micro_batch):  # gradients accumulate
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
            "truncated_frac": gen.truncated.float().mean().item(),
            "grad_norm": grad_norm,  # new to REINFORCE: one optimizer step
            "return/mean": returns.mean().item(),
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
