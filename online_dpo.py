"""Online DPO: DPO on the policy's own samples, judged by the verifier.
Docs: docs/online_dpo.md

Papers: Rafailov et al. 2023, "Direct Preference Optimization"
(arXiv:2305.18290), online as in Guo et al. 2024 (arXiv:2402.04792), and IPO
(Azar et al. 2023) online as in Calandriello et al. 2024 (arXiv:2403.08635);
the loss of TRL's OnlineDPOTrainer.

Sample G responses per prompt (2 by default), grade each with the task's
verifier, and pair the best (chosen, y_w) with the worst (rejected, y_l); a
prompt whose responses all score the same gives no pair. With log pi(y | x)
summed over a response's tokens, and the frozen start as the reference:
    h = log [pi(y_w | x) / pi_ref(y_w | x)] - log [pi(y_l | x) / pi_ref(y_l | x)]
    L = mean over pairs of  -log sigmoid(beta h)    (sigmoid: DPO)
                        or  (h - 1 / (2 beta))^2      (ipo)
beta log(pi(y | x) / pi_ref(y | x)) is a response's implicit reward;
rewards/accuracies is how often the chosen response's is the higher.

Simplified versus the papers and TRL:
- one process samples and learns, with the HF model (no vLLM);
- the judge is the task's verifier (TRL: reward functions or a judge model);
  equal scores give no pair (--ties first: TRL's rule, the first is chosen);
- with G > 2, each prompt's best is paired with its worst (oat's best-of-n
  against worst-of-n);
- one optimizer step per rollout batch: every pair is the current policy's.

Launch:
    python online_dpo.py                # CPU, offline: SmolLM2-135M, arithmetic
    python online_dpo.py --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct \\
        --dataset_name gsm8k --bf16
    torchrun --nproc_per_node 8 online_dpo.py --bf16 --num_prompts 64 \\
        --model_name_or_path Qwen/Qwen2.5-1.5B-Instruct --dataset_name gsm8k
"""

import time
from dataclasses import dataclass
from typing import Literal, Optional

import torch
import torch.nn.functional as F

from common import UsageError, all_gather_objects, all_reduce_sum, sample_seed
from common.env import make_envs, prompt_indices
from common.models import (Rollout, batched_token_logprobs, encode_prompts,
                           fast_decoding, generate, load_tokenizer, reference_policy,
                           token_logprobs, trained_policy)
from common.rl import masked_mean
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
    num_prompts: int = 16
    """prompts per update, over all ranks"""
    num_generations: int = 2  # new to online DPO: a pair
    """G: responses sampled per prompt (TRL: 2); the best and worst pair up"""
    beta: float = 0.1  # new to online DPO: DPO's beta
    """weight of the KL to the frozen reference: reward beta log(pi / pi_ref)"""
    preference_loss: Literal["sigmoid", "ipo"] = "sigmoid"
    """sigmoid: DPO's -log sigmoid(beta h); ipo: (h - 1 / (2 beta))^2, beta as tau"""
    ties: Literal["skip", "first"] = "skip"
    """equal scores: no pair, or (TRL's rule) the first is chosen"""
    missing_eos_penalty: float = 0.0
    """taken off the score of a response cut before EOS (TRL's; 0: none)"""


def check_args(args, world_size):
    """This file's own option errors, each with its fix, before any model loads."""
    if args.num_generations < 2:
        raise UsageError("--num_generations must be >= 2: a pair needs two responses.")
    if not args.beta > 0:
        raise UsageError(f"--beta {args.beta}: DPO's implicit reward is beta log(pi / "
                         "pi_ref), so beta must be > 0 (TRL: 0.1).")


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


# ---- Pairs: the verifier's preference, not the group's advantage
def preference_pairs(scores, group_size, ties="skip"):
    """[N] scores, group_size rows a prompt in a row -> (chosen rows [P],
    rejected rows [P]): each prompt's best against its worst (the first of
    equals). Equal scores give no pair; with ties="first" the first response is
    chosen over the second, as TRL does."""
    s = scores.view(-1, group_size)  # [N / G, G]
    best, worst = s.argmax(dim=1), s.argmin(dim=1)  # the first of equals
    differ = s.max(dim=1).values > s.min(dim=1).values
    keep = differ
    if ties == "first":
        best = torch.where(differ, best, 0)
        worst = torch.where(differ, worst, 1)
        keep = torch.ones_like(differ)
    group_start = torch.arange(len(s), device=scores.device) * group_size
    return (group_start + best)[keep], (group_start + worst)[keep]


def rows_in_step(chosen, rejected):
    """Rows of gen for the update, each pair's chosen and rejected in turn
    [2 P'], and each pair's weight [P']. Every rank runs as many micro-batches
    (FSDP2 gathers the weights on every rank at once): a rank with fewer pairs
    adds pairs of weight 0."""
    most = max(all_gather_objects(len(chosen)))
    pad = most - len(chosen)  # any rows do (0 and 1), at weight 0
    weights = torch.cat([torch.ones(len(chosen)), torch.zeros(pad)])
    weights = weights.to(chosen.device)
    chosen = torch.cat([chosen, chosen.new_zeros(pad)])
    rejected = torch.cat([rejected, rejected.new_ones(pad)])
    return torch.stack([chosen, rejected], 1).flatten(), weights


# ---- Loss
def loss_normaliser(loss_mask, args, world_size):
    """The batch's pairs over all ranks, per rank, fixed before micro-batching:
    1 x 8 and 8 x 1 agree, and the loss is a mean over every rank's pairs.
    loss_mask [2P, R]: each pair's chosen and rejected rows."""
    pairs = torch.tensor(loss_mask.shape[0] / 2, device=loss_mask.device)
    return (all_reduce_sum(pairs) / world_size).clamp(min=1).item()


# the pairs' statistics, NaN (null in metrics.jsonl) without a pair
PAIR_STATS = ("rewards/chosen", "rewards/rejected", "rewards/margins",
              "rewards/accuracies", "logps/chosen", "logps/rejected", "pg_loss",
              "entropy", "kl_ref")


def dpo_loss(logprobs, ref_logprobs, loss_mask, weights, normaliser, args):
    """logprobs, ref_logprobs, loss_mask [2b, R]: each pair's chosen and
    rejected in turn; weights [b]: 1 for a pair, 0 for one that only keeps the
    ranks in step. -> this micro-batch's share of the mean loss over the
    update's pairs, and its statistics."""
    mask = loss_mask.float()
    # CRUCIAL: log pi(y | x) of a response: the sum over its tokens, not a mean
    seq = (logprobs * mask).sum(1)  # [2b]
    ref_seq = (ref_logprobs * mask).sum(1)
    # [b] each: log pi / pi_ref of the chosen and of the rejected
    chosen, rejected = seq[0::2] - ref_seq[0::2], seq[1::2] - ref_seq[1::2]
    h = chosen - rejected  # [b]
    if args.preference_loss == "sigmoid":
        losses = -F.logsigmoid(args.beta * h)
    elif args.preference_loss == "ipo":  # IPO: h's target is 1 / (2 tau)
        losses = (h - 1 / (2 * args.beta)) ** 2
    else:
        raise ValueError(f"unknown preference_loss {args.preference_loss!r}")
    loss = (losses * weights).sum() / normaliser
    real = weights > 0
    if not real.any():  # pairs that only keep this rank in step say nothing
        return loss, {}
    with torch.no_grad():  # each over this micro-batch's pairs of weight 1
        stats = {"rewards/chosen": (args.beta * chosen)[real].mean().item(),
                 "rewards/rejected": (args.beta * rejected)[real].mean().item(),
                 "rewards/margins": (args.beta * h)[real].mean().item(),
                 "rewards/accuracies": (h[real] > 0).float().mean().item(),
                 "logps/chosen": seq[0::2][real].mean().item(),
                 "logps/rejected": seq[1::2][real].mean().item(),
                 "pg_loss": losses[real].mean().item()}
    return loss, stats


# ---- Main: setup, models, then each update's rollout, pairs, update, logs
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
    run.print(f"Online DPO | {run.world} process(es) on {run.device} | "
              f"{args.num_prompts} prompts x {G} samples | {args.preference_loss} "
              f"| {len(env)} problems | {args.max_steps} updates")
    start_step, resume_from = run.resume_point()

    # ---- models
    tokenizer = load_tokenizer(args.model_name_or_path,
                               template_kwargs=args.chat_template_kwargs)
    run.check_prompts(tokenizer, env, eval_env)
    policy = trained_policy(args, resume_from, run.device)
    # new to online DPO: a reference always, the implicit reward's
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
        response_mask = gen.response_mask  # [N, R]
        t_rollout = time.time() - t0

        # ---- pairs: each prompt's best response against its worst
        preferred = scores  # [N] what the judge compares
        if args.missing_eos_penalty:  # a response cut short scores less
            preferred = scores - args.missing_eos_penalty * gen.truncated.float()
        chosen, rejected = preference_pairs(preferred, G, args.ties)  # [P] each
        P = len(chosen)
        rows_of_pairs, weights = rows_in_step(chosen, rejected)  # [2 P'], [P']
        pairs = gen.rows(rows_of_pairs)  # w, l, w, l...
        input_ids, attention_mask = pairs.sequences()  # [2 P', P + R]
        loss_mask = pairs.response_mask * (1 - pairs.forced)  # [2 P', R] the pairs' own
        # the statistics count the tokens of the pairs of weight 1 only
        mask = loss_mask.float() * weights.repeat_interleave(2)[:, None]
        R = loss_mask.shape[1]

        # ---- log-probs of the reference, before any update
        # CRUCIAL: the implicit reward is log pi itself: at temperature 1, not the
        # sampling temperature (as TRL)
        micro_batch = run.micro_batch_size(len(weights), 2 * input_ids.shape[1])
        ref_logprobs = None
        with run.autocast:
            if len(weights):  # [2 P', R]
                ref_logprobs = batched_token_logprobs(
                    ref_policy, pairs, 1.0, 2 * micro_batch, fast=not args.plain)

        # ---- update: one optimizer step on every pair, the policy's own
        lr = run.set_lr(optimizer, step)
        policy.train()
        stats, grad_norms = [], []
        if len(weights):  # no pair on any rank (all scores equal): no step
            batch_rows = torch.arange(len(loss_mask), device=run.device)
            normaliser = loss_normaliser(loss_mask[:2 * P], args, run.world)
            optimizer.zero_grad(set_to_none=True)
            total_loss = 0.0
            for rows in batch_rows.split(2 * micro_batch):  # of pairs
                with run.autocast:
                    logprobs, entropy = token_logprobs(
                        policy, input_ids[rows], attention_mask[rows], R,
                        fast=not args.plain)
                loss, loss_stats = dpo_loss(
                    logprobs, ref_logprobs[rows], loss_mask[rows],
                    weights[rows[0::2] // 2], normaliser, args)
                loss.backward()
                total_loss += loss.item()
                if loss_stats:  # the micro-batch holds a pair of weight 1
                    # kl_ref is k1 a token, TRL's objective/kl over the length
                    kl = logprobs.detach() - ref_logprobs[rows]
                    entropy = entropy.detach()
                    stats.append({**loss_stats,
                                  "entropy": masked_mean(entropy, mask[rows]).item(),
                                  "kl_ref": masked_mean(kl, mask[rows]).item()})
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
            "pairs/frac": P / local_prompts,
            "lr": lr,
            "tokens_per_s": n_tokens * run.world / t_rollout,
            "time/rollout_s": t_rollout,
            "time/update_s": t_update,
        }
        # new to online DPO: 0 where no rank had a pair (no step)
        metrics["grad_norm"] = sum(grad_norms) / max(1, len(grad_norms))
        # new to online DPO: kl_ref is in the pairs' statistics; the samples
        # say which responses were paired
        samples = [{**env.sample_fields(batch.problems[k // G]),
                    "response": batch.texts[k], "reward": scores[k].item(),
                    "chosen": k in chosen[:P].tolist(),
                    "rejected": k in rejected[:P].tolist()}
                   for k in range(0, N, max(1, N // 8))]
        # new to online DPO: the pairs' statistics, NaN without a pair
        run.log(step + 1, metrics, stats, samples, stat_keys=PAIR_STATS)
        run.end_update(step + 1)
    return run.finish()


if __name__ == "__main__":
    main(parse_args(Args))
