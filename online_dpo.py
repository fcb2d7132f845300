"""Online DPO: Direct Preference Optimization on the policy's own samples, judged by the verifier.
Docs: docs/online_dpo.md

Papers: Rafailov et al. 2023, "Direct Preference Optimization" (arXiv:2305.18290), online as in Guo
et al. 2024, "Direct Language Model Alignment from Online AI Feedback" (arXiv:2402.04792), and IPO
(Azar et al. 2023, arXiv:2310.12036) online as in Calandriello et al. 2024 (arXiv:2403.08635); the
loss of TRL's OnlineDPOTrainer.

For every prompt, sample G responses (2 by default), grade each with the task's verifier, and pair
the best (chosen, y_w) with the worst (rejected, y_l); a prompt whose responses all score the same
gives no pair. With log pi(y | x) summed over a response's tokens and the frozen starting policy as
the reference:
    h = [log pi(y_w | x) - log pi_ref(y_w | x)] - [log pi(y_l | x) - log pi_ref(y_l | x)]
    L = mean over pairs of  -log sigmoid(beta h)    (sigmoid: DPO)
                        or  (h - 1 / (2 beta))^2      (ipo)
beta (log pi(y | x) - log pi_ref(y | x)) is a response's implicit reward; rewards/accuracies logs
how often the chosen response's is the higher.

Simplified versus the papers and TRL:
- one process both samples and learns, with the HF model and a KV-cached sampling loop (no vLLM);
- the judge is the task's rule-based verifier (TRL: reward functions or a judge model); responses
  that score the same give no pair (--ties first: TRL's rule, the first response is chosen);
- with G > 2 each prompt's best response is paired with its worst (oat's best-of-n against
  worst-of-n);
- one optimizer step per rollout batch: every pair is the current policy's.

Launch:
    python online_dpo.py                  # CPU, offline: SmolLM2-135M-Instruct, arithmetic
    python online_dpo.py --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct --dataset_name gsm8k --bf16
    torchrun --nproc_per_node 8 online_dpo.py --model_name_or_path Qwen/Qwen2.5-1.5B-Instruct \\
        --dataset_name gsm8k --bf16 --num_prompts 64
"""

import time
from dataclasses import dataclass
from typing import Literal, Optional

import torch
import torch.nn.functional as F

from common import UsageError, all_gather_objects, all_reduce_sum, sample_seed
from common.env import make_envs, prompt_indices
from common.models import (Rollout, batched_token_logprobs, encode_prompts, fast_decoding, generate,
                           load_tokenizer, reference_policy, token_logprobs, trained_policy)
from common.rl import masked_mean
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
    num_prompts: int = 16
    """prompts per update, over all ranks"""
    num_generations: int = 2  # new to online DPO: a pair
    """G: responses sampled per prompt (TRL: 2); the best and the worst of them form the pair"""
    beta: float = 0.1  # new to online DPO: DPO's beta
    """weight of the KL to the frozen reference: DPO's implicit reward is beta log(pi / pi_ref)"""
    preference_loss: Literal["sigmoid", "ipo"] = "sigmoid"
    """sigmoid: DPO's -log sigmoid(beta h); ipo: (h - 1 / (2 beta))^2, with beta as IPO's tau"""
    ties: Literal["skip", "first"] = "skip"
    """responses that score the same: no pair, or (TRL's rule) the first response is chosen"""
    missing_eos_penalty: float = 0.0
    """taken off the score of a response cut at max_new_tokens before EOS (TRL's; 0: none)"""


def check_args(args, world_size):
    """This file's own option errors, each with its fix, before any model loads (Run checks the
    shared ones of common/run/checks.py first)."""
    if args.num_generations < 2:
        raise UsageError("--num_generations must be >= 2: a pair needs two responses.")
    if not args.beta > 0:
        raise UsageError(f"--beta {args.beta}: DPO's implicit reward is beta log(pi / pi_ref), so "
                         "beta must be > 0 (TRL: 0.1).")


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
# Pairs (online DPO: the verifier's preference replaces the group's advantage)
# ------------------------------------------------------------------------------------------------
def preference_pairs(scores, group_size, ties="skip"):
    """[N] scores, group_size consecutive rows per prompt -> (chosen rows [P], rejected rows [P]):
    each prompt's best response against its worst (the first of equals). A prompt whose responses
    all score the same gives no pair; with ties="first" its first response is chosen over its
    second, as TRL does."""
    s = scores.view(-1, group_size)  # [N / G, G]
    best, worst = s.argmax(dim=1), s.argmin(dim=1)  # torch takes the first of equal values
    differ = s.max(dim=1).values > s.min(dim=1).values
    keep = differ
    if ties == "first":  # TRL's rule: the first of equals is chosen
        best, worst = torch.where(differ, best, 0), torch.where(differ, worst, 1)
        keep = torch.ones_like(differ)
    group_start = torch.arange(len(s), device=scores.device) * group_size
    return (group_start + best)[keep], (group_start + worst)[keep]


def rows_in_step(chosen, rejected):
    """Rows of gen for the update, a pair's chosen and rejected in turn [2 P'], and each pair's
    weight [P']. Every rank runs as many micro-batches (under FSDP2 each forward gathers the weights
    on every rank at once), so a rank with fewer pairs than another adds pairs of weight 0."""
    most = max(all_gather_objects(len(chosen)))
    pad = most - len(chosen)  # rows 0 and 1: any rows do, at weight 0
    weights = torch.cat([torch.ones(len(chosen)), torch.zeros(pad)]).to(chosen.device)
    chosen, rejected = torch.cat([chosen, chosen.new_zeros(pad)]), torch.cat(
        [rejected, rejected.new_ones(pad)])
    return torch.stack([chosen, rejected], 1).flatten(), weights


# ------------------------------------------------------------------------------------------------
# Loss
# ------------------------------------------------------------------------------------------------
def loss_normaliser(loss_mask, args, world_size):
    """The denominator of the whole batch: its pairs over all ranks, per rank, fixed before
    micro-batching so that 1 x 8 and 8 x 1 agree and the loss is a mean over every rank's pairs.
    loss_mask [2P, R]: a pair's chosen and rejected rows."""
    pairs = torch.tensor(loss_mask.shape[0] / 2, device=loss_mask.device)
    return (all_reduce_sum(pairs) / world_size).clamp(min=1).item()


# the statistics of the pairs, logged as NaN (null in metrics.jsonl) on an update without a pair
PAIR_STATS = ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies",
              "logps/chosen", "logps/rejected", "pg_loss", "entropy", "kl_ref")


def dpo_loss(logprobs, ref_logprobs, loss_mask, weights, normaliser, args):
    """logprobs, ref_logprobs, loss_mask [2b, R]: the chosen and the rejected response of each pair,
    in turn; weights [b]: 1 for a pair, 0 for one that only keeps ranks in step. -> this
    micro-batch's share of the mean loss over the update's pairs, and its statistics."""
    mask = loss_mask.float()
    # CRUCIAL: log pi(y | x) of a whole response, the sum over its tokens (not a mean)
    seq, ref_seq = (logprobs * mask).sum(1), (ref_logprobs * mask).sum(1)  # [2b]
    chosen, rejected = seq[0::2] - ref_seq[0::2], seq[1::2] - ref_seq[1::2]  # [b] log pi / pi_ref
    h = chosen - rejected  # [b]
    if args.preference_loss == "sigmoid":
        losses = -F.logsigmoid(args.beta * h)
    elif args.preference_loss == "ipo":  # IPO: h's target is 1 / (2 tau), squared error around it
        losses = (h - 1 / (2 * args.beta)) ** 2
    else:
        raise ValueError(f"unknown preference_loss {args.preference_loss!r}")
    loss = (losses * weights).sum() / normaliser
    real = weights > 0
    if not real.any():  # pairs that only keep this rank in step say nothing
        return loss, {}
    with torch.no_grad():  # each statistic over this micro-batch's pairs of weight 1
        stats = {"rewards/chosen": (args.beta * chosen)[real].mean().item(),
                 "rewards/rejected": (args.beta * rejected)[real].mean().item(),
                 "rewards/margins": (args.beta * h)[real].mean().item(),
                 "rewards/accuracies": (h[real] > 0).float().mean().item(),
                 "logps/chosen": seq[0::2][real].mean().item(),
                 "logps/rejected": seq[1::2][real].mean().item(),
                 "pg_loss": losses[real].mean().item()}
    return loss, stats


# ------------------------------------------------------------------------------------------------
# Main: setup -> models -> update loop (rollout, pairs, update) -> logging, eval, checkpoints
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
    run.print(f"Online DPO | {run.world} process(es) on {run.device} | {args.num_prompts} prompts "
              f"x {G} samples per update ({N} per rank) | micro-batches of {args.micro_batch_size} "
              f"pairs | {len(env)} problems | {args.max_steps} updates | {args.preference_loss}")
    start_step, resume_from = run.resume_point()

    # ---- models
    tokenizer = load_tokenizer(args.model_name_or_path)
    run.check_prompts(tokenizer, env, eval_env)  # each prompt within the model's positions
    policy = trained_policy(args, resume_from, run.device)  # LoRA (--lora_r), FSDP2 (--fsdp)
    ref_policy = reference_policy(args, policy, run.device)  # new to online DPO: always
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
        batch = rollout(policy, tokenizer, env, step, first_prompt, local_prompts, args,
                        run.autocast)
        run.check_rewards(batch.scores, step + 1, batch.problems)  # NaN or inf: the run stops
        gen, scores = batch.gen, batch.scores
        response_mask = gen.response_mask  # [N, R] every sampled token
        t_rollout = time.time() - t0

        # ---- pairs: each prompt's best response against its worst, as the verifier sees them
        preferred = scores  # [N] what the judge compares
        if args.missing_eos_penalty:  # a response cut short scores less
            preferred = scores - args.missing_eos_penalty * gen.truncated.float()
        chosen, rejected = preference_pairs(preferred, G, args.ties)  # [P] rows of gen each
        P = len(chosen)
        rows_of_pairs, weights = rows_in_step(chosen, rejected)  # [2 P'] w, l, w, l...; [P']
        pairs = gen.rows(rows_of_pairs)
        input_ids, attention_mask = pairs.sequences()  # [2 P', P + R]
        loss_mask = pairs.response_mask  # [2 P', R] the pairs' tokens
        mask = loss_mask.float() * weights.repeat_interleave(2)[:, None]  # the real pairs' only
        R = loss_mask.shape[1]

        # ---- log-probs of the reference, before any update
        # CRUCIAL: the implicit reward is log pi itself: the log-probs are at temperature 1, not the
        # sampling temperature (as TRL)
        micro_batch = run.micro_batch_size(len(weights), 2 * input_ids.shape[1])  # in pairs
        ref_logprobs = None
        with run.autocast:
            if len(weights):
                ref_logprobs = batched_token_logprobs(ref_policy, pairs, 1.0, 2 * micro_batch,
                                                      fast=not args.plain)  # [2 P', R]

        # ---- update: one optimizer step on every pair (the policy's own), micro-batches of pairs
        lr = run.set_lr(optimizer, step)
        policy.train()
        stats, grad_norms = [], []
        if len(weights):  # no pair on any rank (every response scored the same): no step
            batch_rows = torch.arange(len(loss_mask), device=run.device)  # w, l of every pair
            normaliser = loss_normaliser(loss_mask[:2 * P], args, run.world)
            optimizer.zero_grad(set_to_none=True)
            total_loss = 0.0
            for rows in batch_rows.split(2 * micro_batch):  # gradients accumulate over them
                with run.autocast:
                    logprobs, entropy = token_logprobs(policy, input_ids[rows],
                                                       attention_mask[rows], R, fast=not args.plain)
                loss, loss_stats = dpo_loss(logprobs, ref_logprobs[rows], loss_mask[rows],
                                            weights[rows[0::2] // 2], normaliser, args)
                loss.backward()
                total_loss += loss.item()
                if loss_stats:  # the micro-batch holds a pair of weight 1
                    stats.append({**loss_stats,
                                  "entropy": masked_mean(entropy.detach(), mask[rows]).item(),
                                  # per token, k1: TRL's objective/kl over the response's length
                                  "kl_ref": masked_mean(logprobs.detach() - ref_logprobs[rows],
                                                        mask[rows]).item()})
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
            "pairs/frac": P / local_prompts,
            "grad_norm": sum(grad_norms) / max(1, len(grad_norms)),  # new to online DPO: maybe 0
            "lr": lr, "tokens_per_s": n_tokens * run.world / t_rollout,
            "time/rollout_s": t_rollout, "time/update_s": t_update,
        }
        # new to online DPO: the KL to the reference is in the pairs' statistics; the samples say
        # which responses were paired
        samples = [{**env.sample_fields(batch.problems[k // G]), "response": batch.texts[k],
                    "reward": scores[k].item(), "chosen": k in chosen[:P].tolist(),
                    "rejected": k in rejected[:P].tolist()}
                   for k in range(0, N, max(1, N // 8))]
        run.log(step + 1, metrics, stats, samples, stat_keys=PAIR_STATS)  # new to online DPO:
        run.end_update(step + 1)
    return run.finish()


if __name__ == "__main__":
    main(parse_args(Args))
