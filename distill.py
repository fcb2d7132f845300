"""On-policy distillation: the student samples, a teacher scores every token. Docs: docs/distill.md

Papers: Agarwal et al. 2024, "On-Policy Distillation of Language Models: Learning from
Self-Generated Mistakes" (GKD, arXiv:2306.13649), the full-vocabulary form as TRL's
DistillationTrainer computes it; and Lu et al. 2025, "On-Policy Distillation" (Thinking Machines),
the sampled-token form as prime-rl and verl compute it.

For every prompt the student pi samples G responses; the teacher pi_T, a frozen checkpoint with the
student's tokenizer, scores each sampled token. The student learns to put its mass where the
teacher does, on the prefixes it reaches itself (not on the teacher's own samples, as offline
distillation does). Two forms:
  sampled (--loss_form sampled): the reverse KL on the sampled tokens is a per-token reward,
    A_it   = -(log pi_old(o_it | q, o_i<t) - log pi_T(o_it | q, o_i<t))   (+ w A_i^reward)
    L      = (1/T) sum_it -min(rho_it A_it, clip(rho_it, 1 - eps, 1 + eps) A_it)
  full (--loss_form full): the divergence of the two whole next-token distributions at each
    sampled prefix, differentiated exactly (the teacher's view of every word, not one),
    L      = (1/T) sum_it D_beta(pi(. | q, o_i<t), pi_T(. | q, o_i<t))
             (+ the clipped term of w A_i^reward)
    D_1 = KL(pi || pi_T) (reverse), D_0 = KL(pi_T || pi) (forward), and for 0 < beta < 1 the
    generalised JSD, with m = beta pi_T + (1 - beta) pi (beta: --jsd_beta):
    beta KL(pi_T || m) + (1 - beta) KL(pi || m).
T: the response tokens of the global batch (--loss_type dapo, the default, as TRL's
DistillationTrainer; grpo.py's other aggregations apply too). w: --reward_weight, which adds the
verifier's GRPO group advantage A_i^reward to every token (0: the verifier only grades, for the
log).

Simplified versus the papers and TRL:
- the teacher is a whole frozen copy on every rank (TRL: the same, or a vLLM server);
- each token's reward is its own: no sum over the later tokens' (the discount is 0, as Thinking
  Machines and prime-rl have it);
- one process both samples and learns, with the HF model and a KV-cached sampling loop (no vLLM).

Launch (the teacher: any checkpoint with the student's tokenizer, e.g. one grpo.py wrote):
    python grpo.py --output_dir runs/teacher                     # the teacher, 20 updates
    python distill.py --teacher_model_name_or_path runs/teacher/checkpoint-20
    python distill.py --teacher_model_name_or_path runs/teacher/checkpoint-20 --loss_form full
    torchrun --nproc_per_node 8 distill.py --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct \\
        --teacher_model_name_or_path Qwen/Qwen2.5-7B-Instruct --dataset_name gsm8k --bf16
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
from common.models import (Rollout, backbone_and_head, batched_token_logprobs, check_teacher,
                           encode_prompts, fast_decoding, generate, load_reference, load_tokenizer,
                           token_logprobs, trained_policy)
from common.rl import kl_estimate, masked_mean, mismatch_stats
from common.run import Run, TrainArgs, check_unused, parse_args


@dataclass
class Args(TrainArgs):
    # ---- the teacher
    teacher_model_name_or_path: Optional[str] = None
    """the model the student learns from: a hub id or a local folder, with the student's tokenizer
    (e.g. a grpo.py checkpoint, runs/teacher/checkpoint-20)"""
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
    temperature: float = 0.7  # new to distill: the teacher's too
    """sampling temperature (also applied to the student's and the teacher's log-probs)"""
    top_p: float = 1.0
    """nucleus sampling mass"""
    # ---- the algorithm
    num_prompts: int = 8
    """prompts per update, over all ranks"""
    num_generations: int = 4
    """G: responses sampled per prompt (the group)"""
    num_ppo_epochs: int = 1
    """passes over each rollout batch"""
    num_mini_batches: int = 1
    """optimizer steps per pass: the rollout batch is shuffled and cut into this many"""
    epsilon: float = 0.2
    """clip range of the ratio"""
    loss_form: Literal["sampled", "full"] = "sampled"
    """sampled: the reverse KL on the sampled tokens as a per-token reward; full: the divergence of
    the whole next-token distributions (TRL's DistillationTrainer)"""
    loss_type: Literal["grpo", "bnpo", "dr_grpo", "dapo"] = "dapo"  # new to distill: TRL's
    """how per-token losses are aggregated, by TRL GRPOTrainer's names (dapo: a token mean over the
    global batch, as TRL's DistillationTrainer)"""
    jsd_beta: float = 1.0
    """full form: which divergence, the generalised JSD's beta: 1 the reverse KL, 0 the forward KL,
    in between the JSD (TRL's DistillationTrainer calls it beta)"""
    reward_weight: float = 0.0
    """w: the verifier's group advantage times w is added to every token's (0: it only grades)"""


def check_args(args, world_size):
    """This file's own option errors, each with its fix, before any model loads (Run checks the
    shared ones of common/run/checks.py first)."""
    if args.teacher_model_name_or_path is None:
        raise UsageError("distill.py needs a teacher: --teacher_model_name_or_path, a model "
                         "with the student's tokenizer (e.g. `python grpo.py --output_dir "
                         "runs/teacher`, then --teacher_model_name_or_path "
                         "runs/teacher/checkpoint-20).")
    check_teacher(args.teacher_model_name_or_path, args.model_name_or_path)
    check_unused(args, [("jsd_beta", args.loss_form == "full", "--loss_form full")])
    if args.reward_weight > 0 and args.num_generations < 2:
        raise UsageError("--reward_weight adds the verifier's group advantage, which needs "
                         "--num_generations >= 2.")


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
def group_advantages(rewards, group_size, scale=True):
    """[N * G] rewards -> [N * G] advantages: each response against the others of its group. Dr.GRPO
    (scale=False) keeps the std out: it up-weights questions whose rewards barely vary."""
    r = rewards.view(-1, group_size)  # [N, G]: consecutive rows form a group
    advantages = r - r.mean(dim=1, keepdim=True)
    if scale:  # a group of equal rewards gets 0; the std is unbiased, as torch and TRL take it
        advantages = advantages / (r.std(dim=1, keepdim=True) + 1e-4)
    return advantages.reshape(-1)


def distill_advantages(old_logprobs, teacher_logprobs, reward_advantages, loss_form):
    """Per-token advantages [b, R]: in the sampled form, minus the log-ratio of the student (the
    policy that sampled) to the teacher at each sampled token, a token the teacher likes more than
    the student scores above 0; plus the verifier's share, reward_advantages [b] (0 without
    --reward_weight). In the full form the divergence itself is the loss, and only the verifier's
    share is left here."""
    advantages = reward_advantages[:, None].expand_as(old_logprobs)  # [b, R]
    if loss_form == "sampled":
        # CRUCIAL: a number, not a function of the weights: the gradient flows through the ratio
        advantages = advantages - (old_logprobs - teacher_logprobs).detach()
    return advantages


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


def divergence(student_logits, teacher_logits, beta):
    """[..., V] logits (already divided by the temperature) -> [...] the divergence of the two
    next-token distributions, as TRL's DistillationTrainer defines it: beta 1 the reverse KL(pi ||
    pi_T), 0 the forward KL(pi_T || pi), in between the generalised JSD against the mixture m."""
    log_p = F.log_softmax(student_logits.float(), dim=-1)
    log_t = F.log_softmax(teacher_logits.float(), dim=-1)
    if beta == 1:
        return (log_p.exp() * (log_p - log_t)).sum(-1)
    if beta == 0:
        return (log_t.exp() * (log_t - log_p)).sum(-1)
    log_m = torch.logaddexp(log_p + math.log(1 - beta), log_t + math.log(beta))
    return (beta * (log_t.exp() * (log_t - log_m)).sum(-1)
            + (1 - beta) * (log_p.exp() * (log_p - log_m)).sum(-1))


def full_divergence(student_hidden, teacher_hidden, student_head, teacher_head, beta, temperature,
                    chunk_rows=None):
    """`divergence` at every response position: hidden states [b, R, H] (each predicting the next
    token) -> [b, R]. chunk_rows rows at a time, recomputed in the backward pass: two [b, R, V]
    float32 logit tensors never exist at once (V is 49k-152k). chunk_rows: rows per chunk (default:
    ~128 MB of logits each)."""
    if chunk_rows is None:
        logits_per_row = student_hidden.shape[1] * student_head.weight.shape[0]  # R * V
        chunk_rows = max(1, (1 << 25) // max(1, logits_per_row))

    def chunk(h, h_teacher):
        # A teacher with the student's tokenizer may pad its output rows further (Qwen2.5 7B has
        # 152,064, its 0.5B 151,936): past the student's rows there is no token the student can
        # write, so the teacher's distribution is taken over the student's rows.
        student_logits = student_head(h) / temperature
        teacher_logits = teacher_head(h_teacher)[..., :student_logits.shape[-1]] / temperature
        return divergence(student_logits, teacher_logits, beta)

    out = []
    for i in range(0, student_hidden.shape[0], chunk_rows):
        h, h_teacher = student_hidden[i:i + chunk_rows], teacher_hidden[i:i + chunk_rows]
        out.append(checkpoint(chunk, h, h_teacher, use_reentrant=False)
                   if torch.is_grad_enabled() else chunk(h, h_teacher))
    return torch.cat(out)


def policy_loss(logprobs, old_logprobs, advantages, loss_mask, normaliser, args,
                divergences=None):
    """Clipped surrogate per token, plus the divergence in the full form.
    logprobs, old_logprobs, advantages: [b, R]; loss_mask [b, R]: the tokens that count;
    divergences [b, R]: the full form's per-position divergence (None: the sampled form)."""
    mask = loss_mask.float()
    ratio = torch.exp(logprobs - old_logprobs)  # [b, R]
    low, high = 1 - args.epsilon, 1 + args.epsilon  # the clip range
    pg_loss = torch.max(-advantages * ratio, -advantages * ratio.clamp(low, high))  # [b, R]
    per_token = pg_loss
    if divergences is not None:  # the full form: the divergence is differentiated itself
        per_token = per_token + divergences
    loss = aggregate(per_token, mask, args.loss_type, normaliser)
    with torch.no_grad():
        clipped = ((ratio < low) & (advantages < 0)) | ((ratio > high) & (advantages > 0))
        stats = {"clipfrac": masked_mean(clipped.float(), mask).item(),
                 # how far the policy moved from the one that sampled (pi_old)
                 "approx_kl": masked_mean(kl_estimate(old_logprobs, logprobs, "k3"), mask).item(),
                 "pg_loss": masked_mean(pg_loss, mask).item()}
        if divergences is not None:
            stats["divergence"] = masked_mean(divergences, mask).item()
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
    run.print(f"Distillation ({args.loss_form}) | {run.world} process(es) on {run.device} | "
              f"{args.num_prompts} prompts x {G} samples per update ({N} per rank) | teacher "
              f"{args.teacher_model_name_or_path} | {args.num_ppo_epochs} epoch(s) x "
              f"{args.num_mini_batches} minibatch(es) of micro-batches of {args.micro_batch_size} "
              f"| {len(env)} problems | {args.max_steps} updates")
    start_step, resume_from = run.resume_point()

    # ---- models
    tokenizer = load_tokenizer(args.model_name_or_path)
    run.check_prompts(tokenizer, env, eval_env)  # each prompt within the model's positions
    # new to distill: the teacher scores the student's token ids, so it reads the same ones
    teacher_tokenizer = load_tokenizer(args.teacher_model_name_or_path,
                                       "--teacher_model_name_or_path")
    if teacher_tokenizer.get_vocab() != tokenizer.get_vocab():  # new to distill:
        raise UsageError(f"--teacher_model_name_or_path {args.teacher_model_name_or_path} has "
                         "another tokenizer than the student's: the teacher scores the student's "
                         "token ids, so pass a teacher of the student's family.")
    policy = trained_policy(args, resume_from, run.device)  # LoRA (--lora_r), FSDP2 (--fsdp)
    # new to distill: the teacher, frozen and whole on every rank as grpo.py's reference (bf16
    # under --bf16)
    teacher = load_reference(args.teacher_model_name_or_path,
                             torch.bfloat16 if args.bf16 else torch.float32, run.device)
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
        input_ids, attention_mask = gen.sequences()  # [N, P + R]
        response_mask = gen.response_mask  # [N, R] every sampled token
        mask = response_mask.float()  # the same, for the statistics
        R = response_mask.shape[1]
        t_rollout = time.time() - t0

        # ---- log-probs of the behaviour policy, before any update
        micro_batch = run.micro_batch_size(*input_ids.shape)  # rows per forward (a GPU: fitted)
        old_logprobs = None
        with run.autocast:
            # one pass of one minibatch: pi_old is the policy itself, detached in the loss
            if args.num_ppo_epochs > 1 or args.num_mini_batches > 1:
                old_logprobs = batched_token_logprobs(policy, gen, args.temperature, micro_batch,
                                                      fast=not args.plain)

        # ---- advantages: the verifier's share (the teacher's is per token, in the update)
        reward_advantages = torch.zeros_like(scores)  # [N]
        if args.reward_weight:  # GRPO's group advantage, times w
            reward_advantages = args.reward_weight * group_advantages(scores, G)
        zero_std = (scores.view(-1, G).std(dim=1) == 0).repeat_interleave(G)  # [N]
        loss_mask = response_mask  # [N, R] the tokens that count in the loss

        # ---- update: num_ppo_epochs passes of num_mini_batches optimizer steps, over micro-batches
        lr = run.set_lr(optimizer, step)
        policy.train()
        stats, grad_norms, t_teacher = [], [], 0.0
        full = args.loss_form == "full"
        for batch_rows in run.minibatches(N, step):  # seeded: a resumed run takes the same
            normaliser = loss_normaliser(loss_mask[batch_rows], args, run.world)
            optimizer.zero_grad(set_to_none=True)
            total_loss = 0.0
            for rows in batch_rows.split(micro_batch):  # gradients accumulate over micro-batches
                t1 = time.time()
                # the teacher, micro-batch by micro-batch (its hidden states are not kept: memory
                # stays flat with a big teacher; a second epoch runs it again)
                with torch.no_grad(), run.autocast:
                    teacher_logprobs, _, *teacher_hidden = token_logprobs(
                        teacher, input_ids[rows], attention_mask[rows], R, args.temperature,
                        return_hidden=full, fast=not args.plain)
                t_teacher += time.time() - t1
                with run.autocast:
                    logprobs, entropy, *hidden = token_logprobs(policy, input_ids[rows],
                                                                attention_mask[rows], R,
                                                                args.temperature,
                                                                return_hidden=full,
                                                                fast=not args.plain)
                    divergences = None
                    if full:  # each response token is predicted by the hidden state before it
                        divergences = full_divergence(
                            hidden[0][:, -R - 1:-1], teacher_hidden[0][:, -R - 1:-1],
                            backbone_and_head(policy)[1], backbone_and_head(teacher)[1],
                            args.jsd_beta, args.temperature)
                old = logprobs.detach() if old_logprobs is None else old_logprobs[rows]
                advantages = distill_advantages(old, teacher_logprobs, reward_advantages[rows],
                                                args.loss_form)
                loss, loss_stats = policy_loss(logprobs, old, advantages, loss_mask[rows],
                                               normaliser, args, divergences)
                loss.backward()
                total_loss += loss.item()
                stats.append({**loss_stats, **mismatch_stats(old, gen.logprobs[rows], mask[rows]),
                              # the sampled estimate of KL(student || teacher), per token
                              "kl_teacher": masked_mean(old - teacher_logprobs, mask[rows]).item(),
                              "entropy": masked_mean(entropy.detach(), mask[rows]).item()})
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
            "zero_std_frac": zero_std.float().mean().item(),
            "grad_norm": sum(grad_norms) / len(grad_norms),
            "lr": lr, "tokens_per_s": n_tokens * run.world / t_rollout,
            "time/rollout_s": t_rollout, "time/update_s": t_update,
            "time/teacher_s": t_teacher,  # new to distill: the teacher's forwards, in the update
        }
        # new to distill: no reference, so no kl_ref; the advantage is per token, not logged
        samples = [{**env.sample_fields(batch.problems[k // G]), "response": batch.texts[k],
                    "reward": scores[k].item()}
                   for k in range(0, N, max(1, N // 8))]
        run.log(step + 1, metrics, stats, samples)
        run.end_update(step + 1)
    return run.finish()


if __name__ == "__main__":
    main(parse_args(Args))
