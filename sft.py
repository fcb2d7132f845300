"""SFT: supervised fine-tuning on worked solutions, the cold start. Docs: docs/sft.md

Paper: the supervised stage before RL of InstructGPT (Ouyang et al. 2022) and
DeepSeek-R1's cold start (DeepSeek-AI 2025, arXiv:2501.12948); the loss is TRL's
SFTTrainer's with completion_only_loss (the prompt out of the loss).

Each update takes num_prompts problems of the stream the RL files draw from, and
trains the policy to write each one's worked solution y_i after its prompt x_i
(the RL files' prompt). y_i ends in the answer format the verifier reads (GSM8K's
'#### N' said 'The answer is N.'), and its end-of-sequence token, to learn to stop:
    L = - sum_it log pi(y_it | x_i, y_i<t) / sum_i |y_i|
a token mean over the global batch (TRL's; grpo.py's "dapo" loss type): each
solution weighs as many tokens as it has.

Simplified versus TRL's SFTTrainer: no packing; an update is num_prompts whole
solutions and one optimizer step, as the RL files' updates; a solution longer
than max_new_tokens is refused before any weights load, not cut.

Launch:
    python sft.py                       # CPU, offline: SmolLM2-135M, arithmetic
    python grpo.py --model_name_or_path runs/sft/latest/checkpoint-20   # then RL
    python sft.py --dataset_name gsm8k --dataset_path gsm8k_train.jsonl \\
        --max_new_tokens 346 --output_dir runs/sft_gsm8k
    torchrun --nproc_per_node 8 sft.py --bf16 --num_prompts 64 \\
        --model_name_or_path Qwen/Qwen2.5-1.5B-Instruct --dataset_name math \\
        --max_new_tokens 2048
"""

import time
from dataclasses import dataclass
from typing import Literal, Optional

import torch

from common import UsageError, all_reduce_sum
from common.env import make_envs, prompt_indices
from common.models import (Generation, encode_prompts, left_pad, load_tokenizer,
                           right_pad, token_logprobs, trained_policy)
from common.rl import masked_mean
from common.run import Run, TrainArgs, parse_args


@dataclass
class Args(TrainArgs):
    # ---- optimisation
    learning_rate: float = 2e-5  # new to SFT: TRL's SFTConfig default
    """AdamW learning rate"""
    lr_scheduler: Literal["constant", "linear", "cosine", "polynomial"] = "constant"
    """schedule after the warmup (all but constant end at 0)"""
    warmup_steps: int = 0
    """updates of linear learning-rate warmup"""
    warmup_ratio: Optional[float] = None
    """when given, warmup_steps = this fraction of max_steps"""
    max_grad_norm: float = 1.0
    """gradient-norm clip (0: none)"""
    max_steps: int = 20  # new to SFT: a batch of solutions, not a rollout
    """policy updates (one batch of worked solutions each)"""
    num_train_epochs: Optional[float] = None
    """when given, max_steps covers this many passes over the problems"""
    micro_batch_size: Optional[int] = None
    """sequences per forward and backward (8; on a GPU, what fits)"""
    seed: int = 0  # new to SFT: nothing is sampled in training
    """seeds prompt order, and model init"""
    # ---- the data
    max_new_tokens: int = 64
    """response length limit, in tokens"""
    num_prompts: int = 8  # new to SFT: the default batch
    """prompts per update, over all ranks (each with its worked solution)"""
    solution_key: Optional[str] = None  # new to SFT: the targets
    """field of the data rows that holds the worked solution (default: the
    task's usual names: 'solution'; GSM8K's 'answer')"""


def check_args(args, world_size):
    """This file's own option errors, each with its fix, before any model loads."""
    if args.reward_fn or args.reward_weights:
        raise UsageError("sft.py trains on worked solutions, not on rewards: drop "
                         "--reward_fn and --reward_weights (an RL file reads them).")


# ---- Data
def encode_solutions(tokenizer, solutions, max_new_tokens):
    """Every worked solution's token ids, the end-of-sequence token last: the model
    learns to stop. A budget that would cut some is refused, with how many, before
    any weights load."""
    ids = [x + [tokenizer.eos_token_id]
           for x in tokenizer(solutions, add_special_tokens=False)["input_ids"]]
    longest = max(len(x) for x in ids)
    if longest > max_new_tokens:
        cut = sum(len(x) > max_new_tokens for x in ids)
        raise UsageError(f"--max_new_tokens {max_new_tokens} would cut {cut:,} of the "
                         f"{len(ids):,} worked solutions (the longest is {longest} "
                         f"tokens with its end token): pass --max_new_tokens {longest},"
                         " or train on rows whose solutions fit.")
    return ids


def solution_batch(tokenizer, env, problems, targets, device):
    """Prompts and worked solutions of `problems` as a Generation: prompts
    left-padded, solutions right-padded, their mask the tokens of the loss."""
    prompts = encode_prompts(tokenizer, [env.prompt(p) for p in problems])
    # CRUCIAL: the solution alone is the target: the prompt is given, not learned
    rows = [targets[p] for p in problems]
    prompt_ids, prompt_mask = left_pad(prompts, tokenizer.pad_token_id)
    response_ids, response_mask = right_pad(rows, tokenizer.pad_token_id)
    n = len(problems)
    return Generation(prompt_ids.to(device), prompt_mask.to(device),
                      response_ids.to(device), response_mask.to(device),
                      logprobs=torch.zeros(response_ids.shape, device=device),
                      finished=torch.ones(n, dtype=torch.bool, device=device),
                      truncated=torch.zeros(n, dtype=torch.bool, device=device))


# ---- Loss
def loss_normaliser(loss_mask, world_size):
    """The batch's denominator, fixed before micro-batching, so that 1 x 8 and 8 x 1
    give the same gradient: once DDP averages the gradients over ranks, a mean over
    every rank's tokens."""
    tokens = all_reduce_sum(loss_mask.sum().float())
    return (tokens / world_size).clamp(min=1).item()


def sft_loss(logprobs, loss_mask, normaliser):
    """The negative log-likelihood of the solutions' tokens. logprobs, loss_mask:
    [b, R]."""
    return -(logprobs * loss_mask.float()).sum() / normaliser


# ---- Main: setup, models, then each update's batch, loss, update, logs
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

    solutions = env.solutions(say=run.print)  # every row's, read and checked now
    local_prompts = args.num_prompts // run.world
    run.print(f"SFT | {run.world} process(es) on {run.device} | "
              f"{args.num_prompts} solutions an update | {len(env)} problems | "
              f"{args.max_steps} updates")
    start_step, resume_from = run.resume_point()

    # ---- models
    tokenizer = load_tokenizer(args.model_name_or_path,
                               template_kwargs=args.chat_template_kwargs)
    run.check_prompts(tokenizer, env, eval_env)
    targets = encode_solutions(tokenizer, solutions, args.max_new_tokens)
    policy = trained_policy(args, resume_from, run.device)
    trained = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trained, lr=args.learning_rate, weight_decay=0.0)
    if args.offload_optimizer:
        optimizer = run.offload_optimizer(policy, optimizer)
    # TRY NOT TO MODIFY: a resumed run's optimizers, the logs, the first evaluation
    run.start(policy, tokenizer, eval_env, {"policy": (policy, optimizer)})

    for step in range(start_step, args.max_steps):
        t0 = time.time()
        # ---- data: this rank's problems of update `step`, each with its solution
        first_prompt = run.rank * local_prompts
        problems = prompt_indices(step, args.num_prompts, len(env), args.seed)
        problems = problems[first_prompt:first_prompt + local_prompts]
        batch = solution_batch(tokenizer, env, problems, targets, run.device)
        input_ids, attention_mask = batch.sequences()  # [n, P + R]
        loss_mask = batch.response_mask  # [n, R]
        n, R = loss_mask.shape

        # ---- update: one optimizer step on the batch, micro-batched
        micro_batch = run.micro_batch_size(*input_ids.shape)
        lr = run.set_lr(optimizer, step)
        policy.train()
        normaliser = loss_normaliser(loss_mask, run.world)
        optimizer.zero_grad(set_to_none=True)
        total_loss, stats = 0.0, []
        for rows in torch.arange(n, device=run.device).split(micro_batch):
            with run.autocast:
                logprobs, entropy = token_logprobs(policy, input_ids[rows],
                                                   attention_mask[rows], R,
                                                   fast=not args.plain)
            loss = sft_loss(logprobs, loss_mask[rows], normaliser)
            loss.backward()
            total_loss += loss.item()
            stats.append({"entropy": masked_mean(entropy.detach(),
                                                 loss_mask[rows].float()).item()})
        grad_norm = run.sync_gradients(policy)  # DDP's mean, the clip
        if run.guard.ok(total_loss, grad_norm):  # a NaN or inf skips it
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        t_update = time.time() - t0

        # ---- logging (averaged over ranks), held-out accuracy and checkpoints
        metrics = {
            "loss": total_loss,
            "response_len/mean": loss_mask.sum().item() / n,
            "grad_norm": grad_norm,
            "lr": lr,
            "time/update_s": t_update,
        }
        samples = [{**env.sample_fields(p), "response": solutions[p]}
                   for p in problems[::max(1, len(problems) // 8)]]
        run.log(step + 1, metrics, stats, samples)
        run.end_update(step + 1)
    return run.finish()


if __name__ == "__main__":
    main(parse_args(Args))
