"""Multi-turn tool use: GRPO over responses that call tools, the tools' tokens out of
the loss. Docs: docs/tools.md

Papers: ToRL (Li et al. 2025, arXiv:2503.23383) and ReTool (Feng et al. 2025,
arXiv:2504.11536): GRPO over responses with tool calls in them; the loss is
grpo.py's, as TRL's GRPOTrainer computes it with `tools=`.

The model writes; when it closes a call, `<calc>214 + 23 * 105</calc>`,
sampling stops, the tool runs (common/env/toolbox.py) and its answer goes
after the call as token ids, `<output>2629</output>`; sampling resumes after
it, for up to --max_turns turns of the model. One response is then
    o_i = [model ids, tool ids, model ids, ...]    m_it = 1 on the model's ids
and, with A_i the group advantage of the final answer's reward, as in grpo.py:
    L = agg_it [ m_it * -min(rho_it A_i, clip(rho_it, 1 - eps, 1 + eps) A_i)
                 + beta KL_it ]
Two details make or break it:
- which tokens train: the tool's ids get m_it = 0 (TRL's tool_mask, verl's
  response_mask): the model did not choose them, so their log-probs must not
  move, yet they stay in the sequence, where the model reads them;
- which ids the trainer sees: token in, token out. The training sequence is
  the ids that were sampled plus the tool's ids, never the transcript decoded
  and tokenised again (which can split a word differently: tokens the model
  never drew).
The reward grades the model's own text only: a tool's output is not its
answer.

--tool_format template: the chat template shows the tools, a call is JSON in
`<tool_call>` tags, and the answer is the template's tool message, as ids.

Simplified versus the papers and TRL:
- a few whitelisted tools (a calculator, sympy's solve, simplify, factor),
  called with a tag of their own by default, or one option away (--tool_format
  template) as JSON in the chat template's tool format;
- one process samples and learns, with the HF model (no vLLM);
- each turn is sampled again from its whole context (no cache across a call).

Launch:
    python tools.py --difficulty 6      # CPU, offline: SmolLM2-135M, a calculator
    python tools.py --difficulty 6 --tools none   # the same without a tool
    python tools.py --tools calc,solve,factor --dataset_name math --max_new_tokens 256
    torchrun --nproc_per_node 8 tools.py --bf16 --num_prompts 64 \\
        --model_name_or_path Qwen/Qwen2.5-1.5B-Instruct --dataset_name gsm8k
    python tools.py --tool_format template \\
        --model_name_or_path Qwen/Qwen2.5-1.5B-Instruct --dataset_name gsm8k
"""

import time
from dataclasses import dataclass
from typing import Literal, Optional

import torch

from common import UsageError, all_reduce_sum, sample_seed
from common.env import (answer_call, make_envs, output_text, parse_tools,
                        prompt_indices, show_tools, stop_strings, tool_schema)
from common.models import (Generation, Rollout, batched_token_logprobs, encode_prompts,
                           eos_token_ids, fast_decoding, generate, left_pad,
                           load_tokenizer, offer_tools, reference_policy, right_pad,
                           token_logprobs, tool_message, trained_policy, unsharded)
from common.rl import kl_estimate, masked_mean, mismatch_stats
from common.run import Run, TrainArgs, check_unused, parse_args


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
    max_new_tokens: int = 96  # new to tools: the tools' tokens count
    """response length limit, in tokens, the tools' too (TRL's max_completion_length)"""
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
    # ---- the tools
    tools: str = "calc"  # new to tools: what the model may call
    """the tools, a comma list of calc, solve, simplify, factor
    (common/env/toolbox.py), or none"""
    max_turns: int = 3  # new to tools: TRL's max_tool_calling_iterations + 1
    """the model's turns in a response at most: max_turns - 1 calls are answered"""
    tool_format: Literal["tags", "template"] = "tags"  # new to tools: how calls read
    """tags: <calc>2 * 3</calc>, answered <output>6</output>; template: the
    chat template's tools and JSON calls, answered as its tool message"""


def check_args(args, world_size):
    """This file's own option errors, each with its fix, before any model loads."""
    if args.num_generations < 2:
        raise UsageError("--num_generations must be >= 2: the group baseline needs "
                         "two samples.")
    try:  # new to tools: every name known
        parse_tools(args.tools)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if args.tool_format == "template" and args.template == "plain":  # new to tools
        raise UsageError("--tool_format template needs a chat template: drop "
                         "--template plain, or use --tool_format tags.")
    called = args.tools.strip() != "none"
    check_unused(args, [("max_turns", called, "--tools naming a tool"),
                        ("tool_format", called, "--tools naming a tool"),
                        ("num_few_shot", args.tool_format == "tags",
                         "--tool_format tags")])


# ---- Rollout: turns of the model, with the tools' answers between them
@dataclass
class ToolRollout(Rollout):
    tool_mask: torch.Tensor  # [N, R] 1 on the model's tokens (TRL's name)
    calls: torch.Tensor  # [N] tool calls in each response
    failures: torch.Tensor  # [N] of them, the calls answered with an error


def turn_seed(seed, turn):
    """A response's seed for one turn: the first turn's is the response's own, so
    that a response with no tool call is the one grpo.py samples."""
    return seed if turn == 0 else sample_seed(seed, turn, 0)


def play(policy, tokenizer, prompts, seeds, args, temperature, autocast):
    """Multi-turn responses to `prompts` (token-id lists): sample until EOS, the
    budget or a closed tool call; append the tool's answer AS TOKEN IDS; sample
    again from the whole context. -> (Generation, tool_mask [N, R], the model's own
    texts, calls [N], failures [N]). The Generation's response_mask is 1 on the
    tools' tokens too (the model reads them), its log-probs 0 there."""
    n, budget, tools = len(prompts), args.max_new_tokens, parse_tools(args.tools)
    eos = set(eos_token_ids(policy, tokenizer))
    ids = [[] for _ in range(n)]  # the model's ids and the tools', in order
    own = [[] for _ in range(n)]  # 1 on the model's ids, 0 on the tools'
    logprobs = [[] for _ in range(n)]  # the sampler's, of the model's ids
    calls, failures, ended = [0] * n, [0] * n, [False] * n
    active = list(range(n))  # the rows still writing
    for turn in range(args.max_turns):
        # the last turn samples on, as its call would go unanswered
        stops = ()
        if turn < args.max_turns - 1:
            stops = stop_strings(tools, args.tool_format)
        room = [budget - len(ids[i]) for i in active]
        # CRUCIAL: token in, token out: the ids, never re-tokenised text
        contexts = [prompts[i] + ids[i] for i in active]
        turn_seeds = [turn_seed(seeds[i], turn) for i in active]
        with autocast, fast_decoding(policy, enabled=not args.plain) as decoder:
            gen = generate(policy, tokenizer, contexts, max(room), temperature,
                           args.top_p, stop_strings=stops, seeds=turn_seeds,
                           decoder=decoder)
        still = []
        for j, (i, sampled) in enumerate(zip(active, gen.completion_ids())):
            new = sampled[:room[j]]  # a row with a tool answer has less room
            ids[i] += new
            own[i] += [1] * len(new)
            logprobs[i] += gen.logprobs[j, :len(new)].tolist()
            ended[i] = bool(new) and new[-1] in eos
            # closed if the stop string, not EOS or the budget, ended the turn
            closed = bool(stops) and bool(gen.finished[j]) and not ended[i]
            said, answer = None, None
            if closed and new == sampled:  # an error is an answer too
                said = tokenizer.decode(new)
                answer = answer_call(said, tools, args.tool_format)
            if answer is None:  # done at EOS, the budget or the last turn
                continue
            calls[i] += 1
            failures[i] += answer.startswith("error:")
            reply = output_text(answer)  # <output>2629</output>
            if args.tool_format == "template":  # the template's tool message
                reply = tool_message(tokenizer, said, answer)
            # CRUCIAL: the tool's ids go in with mask 0: the model did not pick them
            out = tokenizer.encode(reply, add_special_tokens=False)
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
    texts = [tokenizer.decode([t for t, m in zip(row, keep) if m],
                              skip_special_tokens=True)
             for row, keep in zip(ids, own)]
    return gen, tool_mask.to(device), texts, torch.tensor(calls), torch.tensor(failures)


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
    # new to tools: turns of the model, the tools' answers between them; under FSDP2
    # the whole weights for every turn (ranks take different numbers of turns)
    with unsharded(policy):
        gen, tool_mask, texts, calls, failures = play(
            policy, tokenizer, prompts, seeds, args, args.temperature, autocast)
    graded = env.score_all(texts, [p for p in problems for _ in range(G)],
                           gen.completion_ids())
    device = gen.response_ids.device
    scores = torch.tensor([reward for reward, _ in graded], device=device)
    correct = torch.tensor([float(info["correct"]) for _, info in graded],
                           device=device)
    # new to tools: the tool mask, the calls and their failures
    return ToolRollout(gen, texts, scores, correct, problems, tool_mask, calls,
                       failures)


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
    low, high = 1 - args.epsilon, 1 + args.epsilon
    advantages = advantages[:, None]  # [b, 1]: a response's tokens share it
    pg_loss = torch.max(-advantages * ratio, -advantages * ratio.clamp(low, high))
    per_token = pg_loss
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
    tools = parse_tools(args.tools)  # new to tools: ("calc",) by default
    # new to tools: the prompts name the tools and show one call
    for e in (env, eval_env):
        show_tools(e, tools, args.num_few_shot, args.tool_format)
    args.max_steps, args.warmup_steps = run.schedule(len(env), args.num_prompts)
    args.micro_batch_size = args.micro_batch_size or run.default_micro_batch

    local_prompts, G = args.num_prompts // run.world, args.num_generations
    N = local_prompts * G  # samples per rank per update
    run.print(f"GRPO with tools ({', '.join(tools) or 'none'}, {args.max_turns} "
              f"turns) | {run.world} process(es) on {run.device} | "
              f"{args.num_prompts} prompts x {G} samples | {args.num_ppo_epochs} "
              f"epoch(s) x {args.num_mini_batches} minibatch(es) | {len(env)} "
              f"problems | {args.max_steps} updates")
    start_step, resume_from = run.resume_point()

    # ---- models
    tokenizer = load_tokenizer(args.model_name_or_path,
                               template_kwargs=args.chat_template_kwargs)
    if args.tool_format == "template":  # new to tools: the template's tools
        offer_tools(tokenizer, [tool_schema(t) for t in tools],
                    args.model_name_or_path)
    run.check_prompts(tokenizer, env, eval_env)
    policy = trained_policy(args, resume_from, run.device)
    ref_policy = None
    if args.beta > 0:
        ref_policy = reference_policy(args, policy, run.device)
    trained = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trained, lr=args.learning_rate, weight_decay=0.0)
    if args.offload_optimizer:
        optimizer = run.offload_optimizer(policy, optimizer)

    # new to tools: the held-out evaluation answers greedily, with the tools
    def respond(prompts):
        gen, _, texts, _, _ = play(policy, tokenizer, prompts, [0] * len(prompts),
                                   args, 0.0, run.autocast)
        return texts, gen.truncated.tolist()

    # TRY NOT TO MODIFY: a resumed run's optimizers, the logs, the first evaluation
    # new to tools: the evaluation's respond
    run.start(policy, tokenizer, eval_env, {"policy": (policy, optimizer)},
              respond=respond)

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
        # new to tools: the model's own tokens; response_mask holds the tools' too
        own_mask = response_mask * batch.tool_mask
        mask = own_mask.float()  # new to tools: the model's own tokens
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
        # new to tools: the KL of the model's own tokens
        rewards = kl_penalised(scores, kl, own_mask, args.beta)  # [N]
        advantages = group_advantages(rewards, G, args.loss_type != "dr_grpo")
        zero_std = (rewards.view(-1, G).std(dim=1) == 0).repeat_interleave(G)
        # new to tools: CRUCIAL: the tools' tokens are out of the loss
        loss_mask = own_mask  # [N, R] the tokens that count in the loss

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
        n_tokens = own_mask.sum().item()  # new to tools: what the model wrote
        metrics = {
            "reward/mean": scores.mean().item(),
            "reward/std": scores.std(unbiased=False).item(),
            "reward/grader_timeouts": run.grader_timeouts() / N,
            **env.reward_metrics(),
            "accuracy": batch.correct.mean().item(),
            "response_len/mean": n_tokens / N,
            "truncated_frac": gen.truncated.float().mean().item(),
            "zero_std_frac": zero_std.float().mean().item(),
            # new to tools: TRL's names: calls a response, the share that failed
            "tools/call_frequency": batch.calls.float().mean().item(),
            "tools/failure_frequency": (batch.failures.sum()
                                        / batch.calls.sum().clamp(min=1)).item(),
            "grad_norm": sum(grad_norms) / len(grad_norms),
            "lr": lr,
            "tokens_per_s": n_tokens * run.world / t_rollout,
            "time/rollout_s": t_rollout,
            "time/update_s": t_update,
        }
        if kl is not None:
            metrics["kl_ref"] = masked_mean(kl, mask).item()
        transcripts = gen.completion_ids()  # new to tools: with the tools' answers
        # new to tools: each response decoded with the tools' answers in it
        samples = [{**env.sample_fields(batch.problems[k // G]),
                    "response": tokenizer.decode(transcripts[k],
                                                 skip_special_tokens=True),
                    "reward": scores[k].item(), "advantage": advantages[k].item()}
                   for k in range(0, N, max(1, N // 8))]
        run.log(step + 1, metrics, stats, samples)
        run.end_update(step + 1)
    return run.finish()


if __name__ == "__main__":
    main(parse_args(Args))
