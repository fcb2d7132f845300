"""On-policy distillation: the student samples, a teacher scores every token.
Docs: docs/distill.md

Papers: Agarwal et al. 2024, "On-Policy Distillation of Language Models:
Learning from Self-Generated Mistakes" (GKD, arXiv:2306.13649), the full
form as TRL's DistillationTrainer computes it; Lu et al. 2025, "On-Policy
Distillation" (Thinking Machines), the sampled form as prime-rl and verl
have it.

The student pi samples G responses a prompt; a frozen teacher pi_T with the
same tokenizer scores each sampled token, so that the student puts its mass
where the teacher does, on the prefixes it reaches itself (offline
distillation: on the teacher's). Two forms (--loss_form):
  sampled: the reverse KL on the sampled tokens is a reward,
    A_it   = -(log pi_old(o_it | q, o_i<t) - log pi_T(o_it | q, o_i<t))
             + w A_i^reward
    L      = (1/T) sum_it -min(rho_it A_it, clip(rho_it, 1 - eps, 1 + eps) A_it)
  full: the divergence of the next-token distributions at each prefix,
    differentiated exactly,
    L      = (1/T) sum_it D_beta(pi(. | q, o_i<t), pi_T(. | q, o_i<t))
             + the clipped term of w A_i^reward
    D_1 = KL(pi || pi_T), D_0 = KL(pi_T || pi), and for 0 < beta < 1
    (--jsd_beta) D_beta = beta KL(pi_T || m) + (1 - beta) KL(pi || m),
    m = beta pi_T + (1 - beta) pi
T: the response tokens of the global batch (--loss_type dapo, the default,
as TRL's DistillationTrainer). w: --reward_weight, which adds the verifier's
GRPO group advantage A_i^reward to every token (0: it only grades).

Simplified versus the papers and TRL:
- the teacher is a whole frozen copy on every rank (TRL: or a vLLM server);
- each token's reward is its own, no sum over the later tokens' (a discount
  of 0, as in Thinking Machines and prime-rl);
- one process samples and learns, with the HF model (no vLLM).

Launch (the teacher: any checkpoint with the student's tokenizer):
    python grpo.py                                    # the teacher, 20 updates
    python distill.py --teacher_model_name_or_path runs/grpo/latest/checkpoint-20
    python distill.py --teacher_model_name_or_path runs/grpo/latest/checkpoint-20 \\
        --loss_form full
    torchrun --nproc_per_node 8 distill.py --bf16 --dataset_name gsm8k \\
        --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct \\
        --teacher_model_name_or_path Qwen/Qwen2.5-7B-Instruct
"""

import math
import time
from dataclasses import dataclass
from typing import Literal, Optional

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from common import UsageError, all_reduce_sum, sample_seed
from common.env import make_envs, prompt_indices
from common.models import (Rollout, backbone_and_head, batched_token_logprobs,
                           check_teacher, encode_prompts, fast_decoding, generate,
                           load_reference, load_tokenizer, token_logprobs,
                           trained_policy)
from common.rl import kl_estimate, masked_mean, mismatch_stats
from common.run import Run, TrainArgs, check_unused, parse_args


@dataclass
class Args(TrainArgs):
    # ---- the teacher
    teacher_model_name_or_path: Optional[str] = None
    """the model the student learns from, with its tokenizer (a hub id or a folder)"""
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
    temperature: float = 0.7  # new to distill: the teacher's too
    """sampling temperature (also applied to both models' training log-probs)"""
    top_p: float = 1.0
    """nucleus sampling mass"""
    max_thinking_tokens: Optional[int] = None
    """thinking budget: past this many tokens in a <think> block the sampler
    closes it (s1's budget forcing; those tokens out of the loss; docs/thinking.md)"""
    # ---- the algorithm
    num_prompts: int = 8
    """prompts per update, over all ranks"""
    num_generations: int = 4
    """G: responses sampled per prompt (the group)"""
    num_ppo_epochs: int = 1
    """passes over each rollout batch"""
    num_mini_batches: int = 1
    """optimizer steps per pass over the shuffled batch"""
    epsilon: float = 0.2
    """clip range of the ratio"""
    loss_form: Literal["sampled", "full"] = "sampled"
    """sampled: the reverse KL on the sampled tokens as a reward; full: D_beta"""
    loss_type: Literal["grpo", "bnpo", "dr_grpo", "dapo"] = "dapo"
    """how per-token losses are aggregated, by TRL's names (see the docstring)"""
    jsd_beta: float = 1.0
    """full form: which divergence, the JSD's beta (1 the reverse KL, 0 the forward)"""
    reward_weight: float = 0.0
    """w: each token's advantage gains w times the verifier's group advantage"""


def check_args(args, world_size):
    """This file's own option errors, each with its fix, before any model loads."""
    if args.teacher_model_name_or_path is None:
        raise UsageError(
            "distill.py needs a teacher: --teacher_model_name_or_path, a model with "
            "the student's tokenizer (e.g. `python grpo.py`, then "
            "--teacher_model_name_or_path runs/grpo/latest/checkpoint-20).")
    check_teacher(args.teacher_model_name_or_path, args.model_name_or_path)
    check_unused(args, [("jsd_beta", args.loss_form == "full",
                         "--loss_form full")])
    if args.reward_weight > 0 and args.num_generations < 2:
        raise UsageError("--reward_weight adds the verifier's group advantage, which "
                         "needs --num_generations >= 2.")


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
def group_advantages(rewards, group_size, scale=True):
    """[N * G] rewards -> advantages, each against its own group. Dr.GRPO's
    (scale=False) keeps out the std, which up-weights groups that barely vary."""
    r = rewards.view(-1, group_size)  # [N, G]
    advantages = r - r.mean(dim=1, keepdim=True)
    if scale:  # the unbiased std, as torch and TRL take it
        advantages = advantages / (r.std(dim=1, keepdim=True) + 1e-4)
    return advantages.reshape(-1)


def distill_advantages(old_logprobs, teacher_logprobs, reward_advantages, loss_form):
    """[b, R]: log pi_T - log pi_old at each token (the sampled form only), plus
    the verifier's share, reward_advantages [b] (0 without --reward_weight)."""
    advantages = reward_advantages[:, None].expand_as(old_logprobs)  # [b, R]
    if loss_form == "sampled":
        # CRUCIAL: a number, not a function of the weights: the gradient flows
        # through the ratio
        advantages = advantages - (old_logprobs - teacher_logprobs).detach()
    return advantages


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


def divergence(student_logits, teacher_logits, beta):
    """[..., V] logits over the temperature -> [...] D_beta, as TRL defines it"""
    log_p = F.log_softmax(student_logits.float(), dim=-1)
    log_t = F.log_softmax(teacher_logits.float(), dim=-1)
    if beta == 1:
        return (log_p.exp() * (log_p - log_t)).sum(-1)
    if beta == 0:
        return (log_t.exp() * (log_t - log_p)).sum(-1)
    log_m = torch.logaddexp(log_p + math.log(1 - beta), log_t + math.log(beta))
    return (beta * (log_t.exp() * (log_t - log_m)).sum(-1)
            + (1 - beta) * (log_p.exp() * (log_p - log_m)).sum(-1))


def full_divergence(student_hidden, teacher_hidden, student_head, teacher_head, beta,
                    temperature, chunk_rows=None):
    """`divergence` at each response position: [b, R, H] -> [b, R], chunk_rows rows
    at a time (~128 MB of logits), recomputed in the backward (V is 49k-152k)."""
    if chunk_rows is None:
        R, V = student_hidden.shape[1], student_head.weight.shape[0]
        chunk_rows = max(1, (1 << 25) // max(1, R * V))

    def chunk(h, h_teacher):
        # no token the student can write lies past its rows (Qwen2.5 7B pads further)
        student_logits = student_head(h) / temperature
        teacher_logits = teacher_head(h_teacher)[..., :student_logits.shape[-1]]
        return divergence(student_logits, teacher_logits / temperature, beta)

    out = []
    for i in range(0, student_hidden.shape[0], chunk_rows):
        rows = slice(i, i + chunk_rows)
        h, h_teacher = student_hidden[rows], teacher_hidden[rows]
        out.append(checkpoint(chunk, h, h_teacher, use_reentrant=False)
                   if torch.is_grad_enabled() else chunk(h, h_teacher))
    return torch.cat(out)


def policy_loss(logprobs, old_logprobs, advantages, loss_mask, normaliser, args,
                divergences=None):
    """The clipped surrogate; logprobs, old_logprobs, advantages, loss_mask: [b, R].
    divergences [b, R], the full form's, are added (None: the sampled form)."""
    mask = loss_mask.float()
    ratio = torch.exp(logprobs - old_logprobs)  # [b, R]
    low, high = 1 - args.epsilon, 1 + args.epsilon
    pg_loss = torch.max(-advantages * ratio, -advantages * ratio.clamp(low, high))
    per_token = pg_loss
    if divergences is not None:  # the full form adds the divergence itself
        per_token = per_token + divergences
    loss = aggregate(per_token, mask, args.loss_type, normaliser)
    with torch.no_grad():
        clipped = (((ratio < low) & (advantages < 0))
                   | ((ratio > high) & (advantages > 0)))
        # approx_kl is how far the policy moved from the one that sampled
        approx_kl = kl_estimate(old_logprobs, logprobs, "k3")
        stats = {"clipfrac": masked_mean(clipped.float(), mask).item(),
                 "approx_kl": masked_mean(approx_kl, mask).item(),
                 "pg_loss": masked_mean(pg_loss, mask).item()}
        if divergences is not None:
            stats["divergence"] = masked_mean(divergences, mask).item()
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
    run.print(f"Distillation ({args.loss_form}) | {run.world} process(es) on "
              f"{run.device} | teacher {args.teacher_model_name_or_path} | "
              f"{args.num_prompts} prompts x {G} samples | {args.num_ppo_epochs} "
              f"epoch(s) x {args.num_mini_batches} minibatch(es) | {len(env)} "
              f"problems | {args.max_steps} updates")
    start_step, resume_from = run.resume_point()

    # ---- models
    tokenizer = load_tokenizer(args.model_name_or_path,
                               template_kwargs=args.chat_template_kwargs)
    run.check_prompts(tokenizer, env, eval_env)
    # new to distill: the teacher reads the student's token ids
    teacher_tokenizer = load_tokenizer(args.teacher_model_name_or_path,
                                       "--teacher_model_name_or_path")
    # new to distill: the same check
    if teacher_tokenizer.get_vocab() != tokenizer.get_vocab():
        raise UsageError(
            f"--teacher_model_name_or_path {args.teacher_model_name_or_path} has "
            "another tokenizer than the student's: the teacher scores the student's "
            "token ids, so pass a teacher of the student's family.")
    policy = trained_policy(args, resume_from, run.device)
    # new to distill: the teacher, frozen and whole on every rank (bf16 under --bf16)
    teacher = load_reference(args.teacher_model_name_or_path,
                             torch.bfloat16 if args.bf16 else torch.float32,
                             run.device)
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

        # ---- log-probs of the behaviour policy, before any update
        micro_batch = run.micro_batch_size(*input_ids.shape)
        old_logprobs = None
        with run.autocast:
            # with one pass of one minibatch pi_old is the policy, detached
            if args.num_ppo_epochs > 1 or args.num_mini_batches > 1:
                old_logprobs = batched_token_logprobs(
                    policy, gen, args.temperature, micro_batch, fast=not args.plain)

        # ---- advantages: the verifier's share (the teacher's comes per token)
        reward_advantages = torch.zeros_like(scores)  # [N]
        if args.reward_weight:  # GRPO's group advantage, times w
            reward_advantages = args.reward_weight * group_advantages(scores, G)
        zero_std = (scores.view(-1, G).std(dim=1) == 0).repeat_interleave(G)
        loss_mask = response_mask * (1 - gen.forced)  # [N, R] the model's own tokens

        # ---- update: epochs of minibatches, an optimizer step each
        lr = run.set_lr(optimizer, step)
        policy.train()
        stats, grad_norms, t_teacher = [], [], 0.0
        full = args.loss_form == "full"
        for batch_rows in run.minibatches(N, step):
            normaliser = loss_normaliser(loss_mask[batch_rows], args, run.world)
            optimizer.zero_grad(set_to_none=True)
            total_loss = 0.0
            for rows in batch_rows.split(micro_batch):
                t1 = time.time()
                # a micro-batch at a time, no hidden state kept: flat memory
                with torch.no_grad(), run.autocast:
                    teacher_logprobs, _, *teacher_hidden = token_logprobs(
                        teacher, input_ids[rows], attention_mask[rows], R,
                        args.temperature, return_hidden=full, fast=not args.plain)
                t_teacher += time.time() - t1
                with run.autocast:
                    logprobs, entropy, *hidden = token_logprobs(
                        policy, input_ids[rows], attention_mask[rows], R,
                        args.temperature, return_hidden=full, fast=not args.plain)
                    divergences = None
                    if full:  # the hidden state before a token predicts it
                        divergences = full_divergence(
                            hidden[0][:, -R - 1:-1], teacher_hidden[0][:, -R - 1:-1],
                            backbone_and_head(policy)[1], backbone_and_head(teacher)[1],
                            args.jsd_beta, args.temperature)
                old = logprobs.detach()
                if old_logprobs is not None:
                    old = old_logprobs[rows]
                advantages = distill_advantages(old, teacher_logprobs,
                                                reward_advantages[rows], args.loss_form)
                loss, loss_stats = policy_loss(logprobs, old, advantages,
                                               loss_mask[rows], normaliser, args,
                                               divergences)
                loss.backward()
                total_loss += loss.item()
                loss_stats["entropy"] = masked_mean(entropy.detach(), mask[rows]).item()
                # the sampled estimate of KL(student || teacher)
                kl_teacher = masked_mean(old - teacher_logprobs, mask[rows]).item()
                stats.append({**loss_stats,
                              **mismatch_stats(old, gen.logprobs[rows], mask[rows]),
                              "kl_teacher": kl_teacher})
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
            "time/teacher_s": t_teacher,  # new to distill: the teacher's forwards
        }
        # new to distill: no reference, no kl_ref; no advantage a response to log
        samples = [{**env.sample_fields(batch.problems[k // G]),
                    "response": batch.texts[k], "reward": scores[k].item()}
                   for k in range(0, N, max(1, N // 8))]
        run.log(step + 1, metrics, stats, samples)
        run.end_update(step + 1)
    return run.finish()


if __name__ == "__main__":
    main(parse_args(Args))
