"""Multi-turn tool use: GRPO over responses that call tools, the tools' tokens out of the loss.
Docs: docs/tools.md

Papers: ToRL (Li et al. 2025, arXiv:2503.23383) and ReTool (Feng et al. 2025, arXiv:2504.11536),
GRPO-style RL over responses with tool calls in them; the loss is grpo.py's (DeepSeekMath, Shao et
al. 2024, arXiv:2402.03300), as TRL's GRPOTrainer computes it with `tools=`.

The model writes; when it closes a call, `<calc>214 + 23 * 105</calc>`, sampling stops, the tool
runs (common/env/toolbox.py) and its answer is put after the call as token ids,
`<output>2629</output>`; sampling resumes after it, for up to --max_turns turns of the model. One
response is then
    o_i = [model ids, tool ids, model ids, ...]    m_it = 1 on the model's ids, 0 on the tool's
and, with A_i the group advantage of the final answer's reward, exactly as grpo.py:
    L = agg_it [ m_it * -min(rho_it A_i, clip(rho_it, 1 - eps, 1 + eps) A_i) + beta KL_it ]
Two details make or break it:
- which tokens train: the tool's ids get m_it = 0 (TRL's tool_mask, verl's response_mask): the model
  did not choose them, so their log-probs must not move, yet they stay in the sequence, where the
  model reads them;
- which ids the trainer sees: token in, token out. The training sequence is exactly the ids that
  were sampled plus the tool's ids, never the transcript decoded and tokenised again (which can
  split a word differently and train the model on tokens it never drew).
The reward grades the model's own text only: a tool's output is not the model's answer.

Simplified versus the papers and TRL:
- tools are a few whitelisted functions (a calculator, sympy's solve, simplify, factor), called with
  a tag of their own, not JSON in the chat template's tool format;
- one process both samples and learns, with the HF model and a KV-cached sampling loop (no vLLM);
- each turn is sampled again from its whole context (no cache kept across a tool call).

Launch:
    python tools.py --difficulty 6             # CPU, offline: SmolLM2-135M-Instruct, a calculator
    python tools.py --difficulty 6 --tools none   # the same run without a tool, to compare
    python tools.py --tools calc,solve,factor --dataset_name math --max_new_tokens 256
    torchrun --nproc_per_node 8 tools.py --model_name_or_path Qwen/Qwen2.5-1.5B-Instruct \\
        --dataset_name gsm8k --bf16 --num_prompts 64
"""

import time
from dataclasses import dataclass
from typing import Literal, Optional

import torch

from common import UsageError, all_reduce_sum, sample_seed
from common.env import (find_call, make_envs, output_text, parse_tools, prompt_indices, run_tool,
                        show_tools, stop_strings)
from common.models import (Generation, Rollout, batched_token_logprobs, encode_prompts,
                           eos_token_ids, fast_decoding, generate, left_pad, load_tokenizer,
                           reference_policy, right_pad, token_logprobs, trained_policy, unsharded)
from common.rl import kl_estimate, masked_mean, mismatch_stats
from common.run import Run, TrainArgs, check_unused, parse_args


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
    max_new_tokens: int = 96  # new to tools: the tools' tokens count
    """response length limit, in tokens: the model's and the tools' together (TRL's
    max_completion_length)"""
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
    # ---- the tools
    tools: str = "calc"  # new to tools: what the model may call
    """the tools, a comma list of calc, solve, simplify, factor (common/env/toolbox.py), or none"""
    max_turns: int = 3  # new to tools: TRL's max_tool_calling_iterations + 1
    """turns of the model in one response at most: max_turns - 1 tool calls are answered"""


def check_args(args, world_size):
    """This file's own option errors, each with its fix, before any model loads (Run checks the
    shared ones of common/run/checks.py first)."""
    if args.num_generations < 2:
        raise UsageError("--num_generations must be >= 2: the group baseline needs two samples.")
    try:  # new to tools: every name known
        parse_tools(args.tools)
    except ValueError as e:
        raise UsageError(str(e)) from None
    check_unused(args, [("max_turns", args.tools.strip() != "none", "--tools naming a tool")])


# ------------------------------------------------------------------------------------------------
# Rollout: turns of the model, with the tools' answers between them
# ------------------------------------------------------------------------------------------------
@dataclass
class ToolRollout(Rollout):
    tool_mask: torch.Tensor  # [N, R] TRL's name: 1 on the model's own tokens, 0 on the tools'
    calls: torch.Tensor  # [N] tool calls in each response
    failures: torch.Tensor  # [N] of them, the calls whose tool answered with an error


def turn_seed(seed, turn):
    """The sampling seed of one response's turn: the first turn's is the response's own, so that a
    response with no tool call is the one grpo.py samples."""
    return seed if turn == 0 else sample_seed(seed, turn, 0)


def play(policy, tokenizer, prompts, seeds, args, temperature, autocast):
    """Multi-turn responses to `prompts` (token-id lists): sample until EOS, the token budget or a
    closed tool call; run the tool and append its answer AS TOKEN IDS; sample again from the whole
    context. -> (Generation of every row's ids, tool_mask [N, R], the model's own texts, calls [N],
    failures [N]). The Generation's response_mask is 1 on the tools' tokens too (the model reads
    them); its log-probs are 0 there."""
    n, budget, tools = len(prompts), args.max_new_tokens, parse_tools(args.tools)
    eos = set(eos_token_ids(policy, tokenizer))
    ids = [[] for _ in range(n)]  # each response so far: the model's ids and the tools', in order
    own = [[] for _ in range(n)]  # 1 on the model's ids, 0 on the tools'
    logprobs = [[] for _ in range(n)]  # the sampler's log-prob of each of the model's ids
    calls, failures, ended = [0] * n, [0] * n, [False] * n
    active = list(range(n))  # the rows still writing
    for turn in range(args.max_turns):
        # the last turn's call would go unanswered: it samples on to EOS or the budget
        stops = stop_strings(tools) if turn < args.max_turns - 1 else ()
        room = [budget - len(ids[i]) for i in active]
        # CRUCIAL: token in, token out: the context is the ids as they are, never re-tokenised text
        with autocast, fast_decoding(policy, enabled=not args.plain) as decoder:
            gen = generate(policy, tokenizer, [prompts[i] + ids[i] for i in active], max(room),
                           temperature, args.top_p, stop_strings=stops,
                           seeds=[turn_seed(seeds[i], turn) for i in active], decoder=decoder)
        still = []
        for j, (i, sampled) in enumerate(zip(active, gen.completion_ids())):
            new = sampled[:room[j]]  # the budget is per row: a row that had a tool answer has less
            ids[i] += new
            own[i] += [1] * len(new)
            logprobs[i] += gen.logprobs[j, :len(new)].tolist()
            ended[i] = bool(new) and new[-1] in eos
            # a call is closed where the stop string, not EOS or the budget, ended the turn
            closed = bool(stops) and bool(gen.finished[j]) and not ended[i]
            call = find_call(tokenizer.decode(new), tools) if closed and new == sampled else None
            if call is None:  # EOS, the budget, or the last turn: the response is done
                continue
            answer = run_tool(*call)  # never raises: an error is a text the model reads
            calls[i], failures[i] = calls[i] + 1, failures[i] + answer.startswith("error:")
            # CRUCIAL: the tool's ids go in with mask 0: the model reads them, it did not pick them
            out = tokenizer.encode(output_text(answer), add_special_tokens=False)
            out = out[:budget - len(ids[i])]
            ids[i] += out
            own[i] += [0] * len(out)
            logprobs[i] += [0.0] * len(out)
            if len(ids[i]) < budget:
                still.append(i)
        active = still
        if not active:
            break
    device = next(policy.parameters()).device
    prompt_ids, prompt_mask = left_pad(prompts, tokenizer.pad_token_id)
    response_ids, response_mask = right_pad(ids, tokenizer.pad_token_id)
    tool_mask, _ = right_pad(own, 0)
    finished = torch.tensor(ended)
    gen = Generation(prompt_ids, prompt_mask, response_ids, response_mask,
                     right_pad(logprobs, 0.0, torch.float)[0], finished, ~finished)
    gen = Generation(*(x.to(device) for x in vars(gen).values()))
    # the reward reads what the model wrote, not what a tool answered
    texts = [tokenizer.decode([t for t, m in zip(row, keep) if m], skip_special_tokens=True)
             for row, keep in zip(ids, own)]
    return gen, tool_mask.to(device), texts, torch.tensor(calls), torch.tensor(failures)


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
    # new to tools: turns of the model with the tools' answers between them; under FSDP2 the whole
    # weights for every turn (ranks take different numbers of turns)
    with unsharded(policy):
        gen, tool_mask, texts, calls, failures = play(policy, tokenizer, prompts, seeds, args,
                                                      args.temperature, autocast)
    # (reward, info): the verifier, plus your own --reward_fn rewards
    graded = env.score_all(texts, [p for p in problems for _ in range(G)], gen.completion_ids())
    scores = torch.tensor([reward for reward, _ in graded], device=gen.response_ids.device)
    correct = torch.tensor([float(info["correct"]) for _, info in graded], device=scores.device)
    # new to tools: the tool mask, the calls and their failures come with the rollout
    return ToolRollout(gen, texts, scores, correct, problems, tool_mask, calls, failures)


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


def policy_loss(logprobs, old_logprobs, advantages, loss_mask, normaliser, args,
                ref_logprobs=None):
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
    per_token = pg_loss
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
    tools = parse_tools(args.tools)  # new to tools: ("calc",) by default
    for e in (env, eval_env):  # new to tools: the prompts name them and show one call
        show_tools(e, tools, args.num_few_shot)
    args.max_steps, args.warmup_steps = run.schedule(len(env), args.num_prompts)
    args.micro_batch_size = args.micro_batch_size or run.default_micro_batch  # a GPU fits the rest

    local_prompts, G = args.num_prompts // run.world, args.num_generations
    N = local_prompts * G  # samples per rank per update
    run.print(f"GRPO with tools ({', '.join(tools) or 'none'}, {args.max_turns} turns) | "
              f"{run.world} process(es) on {run.device} | {args.num_prompts} prompts x {G} "
              f"samples per update ({N} per rank) | {args.num_ppo_epochs} epoch(s) x "
              f"{args.num_mini_batches} minibatch(es) of micro-batches of {args.micro_batch_size} "
              f"| {len(env)} problems | {args.max_steps} updates")
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

    # new to tools: the held-out evaluation answers greedily, with the tools
    def respond(prompts):
        gen, _, texts, _, _ = play(policy, tokenizer, prompts, [0] * len(prompts), args, 0.0,
                                   run.autocast)
        return texts, gen.truncated.tolist()

    # TRY NOT TO MODIFY: a resumed run's optimizer state, the logs, the accuracy before training
    run.start(policy, tokenizer, eval_env, {"policy": (policy, optimizer)},  # new to tools:
              respond=respond)

    for step in range(start_step, args.max_steps):
        t0 = time.time()
        # ---- rollout: G responses to each of this rank's problems of the update, graded
        first_prompt = run.rank * local_prompts  # this rank's share of the update's problems
        batch = rollout(policy, tokenizer, env, step, first_prompt, local_prompts, args,
                        run.autocast)
        run.check_rewards(batch.scores, step + 1, batch.problems)  # NaN or inf: the run stops
        gen, scores = batch.gen, batch.scores
        input_ids, attention_mask = gen.sequences()  # [N, P + R]
        # new to tools: every token is the model's or the tools', and only the model's count
        response_mask = gen.response_mask  # new to tools: [N, R] the model's and the tools'
        own_mask = response_mask * batch.tool_mask  # new to tools: [N, R] the model's own
        mask = own_mask.float()  # new to tools: the same, for the statistics
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
        rewards = kl_penalised(scores, kl, own_mask, args.beta)  # new to tools: the model's KL
        advantages = group_advantages(rewards, G, scale=args.loss_type != "dr_grpo")  # [N]
        zero_std = (rewards.view(-1, G).std(dim=1) == 0).repeat_interleave(G)  # [N]
        # new to tools: CRUCIAL, the tools' tokens are out of the loss (TRL: completion_mask *
        # tool_mask)
        loss_mask = own_mask  # [N, R] the tokens that count in the loss

        # ---- update: num_ppo_epochs passes of num_mini_batches optimizer steps, over micro-batches
        lr = run.set_lr(optimizer, step)
        policy.train()
        stats, grad_norms = [], []
        for batch_rows in run.minibatches(N, step):  # seeded: a resumed run takes the same
            normaliser = loss_normaliser(loss_mask[batch_rows], args, run.world)
            optimizer.zero_grad(set_to_none=True)
            total_loss = 0.0
            for rows in batch_rows.split(micro_batch):  # gradients accumulate over micro-batches
                with run.autocast:
                    logprobs, entropy = token_logprobs(policy, input_ids[rows],
                                                       attention_mask[rows], R, args.temperature,
                                                       fast=not args.plain)
                old = logprobs.detach() if old_logprobs is None else old_logprobs[rows]
                ref = None if ref_logprobs is None else ref_logprobs[rows]
                loss, loss_stats = policy_loss(logprobs, old, advantages[rows], loss_mask[rows],
                                               normaliser, args, ref)
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
        t_update = time.time() - t0 - t_rollout

        # ---- logging (averaged over ranks), held-out accuracy and checkpoints at their intervals
        n_tokens = own_mask.sum().item()  # new to tools: what the model wrote
        metrics = {
            "reward/mean": scores.mean().item(),
            "reward/std": scores.std(unbiased=False).item(),
            "reward/grader_timeouts": run.grader_timeouts() / N,
            **env.reward_metrics(),  # rewards/<name>/mean of each --reward_fn
            "accuracy": batch.correct.mean().item(),
            "response_len/mean": n_tokens / N,
            "truncated_frac": gen.truncated.float().mean().item(),
            "zero_std_frac": zero_std.float().mean().item(),
            # new to tools: TRL's names; calls per response, and the share of calls that failed
            "tools/call_frequency": batch.calls.float().mean().item(),
            "tools/failure_frequency": (batch.failures.sum()
                                        / batch.calls.sum().clamp(min=1)).item(),
            "grad_norm": sum(grad_norms) / len(grad_norms),
            "lr": lr, "tokens_per_s": n_tokens * run.world / t_rollout,
            "time/rollout_s": t_rollout, "time/update_s": t_update,
        }
        if kl is not None:
            metrics["kl_ref"] = masked_mean(kl, mask).item()  # per token
        transcripts = gen.completion_ids()  # new to tools: the samples show the tools' answers
        # new to tools: each response decoded with the tools' answers in it
        samples = [{**env.sample_fields(batch.problems[k // G]),
                    "response": tokenizer.decode(transcripts[k], skip_special_tokens=True),
                    "reward": scores[k].item(), "advantage": advantages[k].item()}
                   for k in range(0, N, max(1, N // 8))]
        run.log(step + 1, metrics, stats, samples)
        run.end_update(step + 1)
    return run.finish()


if __name__ == "__main__":
    main(parse_args(Args))
