"""PPO: Proximal Policy Optimization with a learned critic on verifiable math. Docs: docs/ppo.md

Paper: Schulman et al. 2017, "Proximal Policy Optimization Algorithms" (arXiv:1707.06347), in the
token-level form of oat's PPO learner and TRL's PPOTrainer (Huang et al. 2024, "The N+
Implementation Details of RLHF with PPO", arXiv:2403.17031).

Sample responses, grade each with the task's verifier, and learn a value V(s_t) of every prefix:
    r_t   = -beta KL_t + [t = last] (score - missing_eos_penalty [no EOS])  (KL_t: k1, pi_old, ref)
    A_t   = delta_t + gamma lam A_t+1,  delta_t = r_t + gamma V_t+1 - V_t    (V after the last: 0)
    R_t   = A_t + V_t  (the value target);  A <- whiten(A)
    rho_t = pi(o_t | s_t) / pi_old(o_t | s_t)
    L_pi  = agg_t max(-rho_t A_t, -clip(rho_t, 1 - eps, 1 + eps) A_t) - entropy_coef agg_t H_t
    L_V   = 0.5 agg_t max((V_t - R_t)^2, (V_old,t + clip(V_t - V_old,t, +-cliprange_value) - R_t)^2)
    L     = L_pi + vf_coef L_V
agg, by TRL GRPOTrainer's names: the token mean over the global minibatch (dapo, TRL's PPO) or
per-sequence means, then their mean (grpo, oat); also bnpo and dr_grpo, as grpo.py. Each rollout
batch is used for num_ppo_epochs passes of num_mini_batches steps.

Simplified versus oat and TRL:
- one process both samples and learns, with the HF model and a KV-cached sampling loop (no vLLM);
- rewards come from rule-based verifiers (common/env/tasks.py), not a reward model;
- pi_old's log-probs are recomputed by the learner before the update, not taken from the sampler
  (TRL's PPOTrainer keeps the generation's logits), so the ratio is exactly 1 on the first
  minibatch of the first epoch;
- no adaptive KL controller and no reward clipping.

Launch:
    python ppo.py                         # CPU, offline: SmolLM2-135M-Instruct, arithmetic
    python ppo.py --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct --dataset_name gsm8k --bf16
    torchrun --nproc_per_node 8 ppo.py --model_name_or_path Qwen/Qwen2.5-1.5B-Instruct \\
        --dataset_name gsm8k --bf16 --num_prompts 128
"""

import time
from dataclasses import dataclass
from typing import Literal, Optional

import torch

from common import all_reduce_sum, sample_seed
from common.env import make_envs, prompt_indices
from common.models import (Rollout, batched_token_logprobs, critic_state, encode_prompts,
                           fast_decoding, generate, load_tokenizer, make_critic, reference_policy,
                           token_logprobs, trained_policy)
from common.rl import (explained_variance, kl_estimate, masked_mean, masked_whiten, mismatch_stats,
                       token_gae)
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
    num_generations: int = 1  # new to PPO: the critic is the baseline
    """G: responses sampled per prompt (with a critic for the baseline, 1 works: oat, TRL)"""
    num_ppo_epochs: int = 1
    """passes over each rollout batch"""
    num_mini_batches: int = 2
    """optimizer steps per pass: the rollout batch is shuffled and cut into this many"""
    epsilon: float = 0.2
    """clip range of the ratio"""
    beta: float = 0.0
    """weight of the KL to the frozen reference (0: no reference is loaded)"""
    kl_estimator: Literal["k1", "k2", "k3"] = "k1"
    """per-token estimate of the KL: k1 log-ratio, k2 its square / 2, k3 the GRPO paper's"""
    kl_penalty: Literal["loss", "reward"] = "reward"
    """where the KL enters: a loss term per token, or a cost in the reward"""
    loss_type: Literal["grpo", "bnpo", "dr_grpo", "dapo"] = "dapo"
    """how per-token losses are aggregated, by TRL GRPOTrainer's names (see the docstring)"""
    critic_type: Literal["separate", "shared"] = "separate"
    """separate: a second transformer and a value head (oat, TRL); shared: a head on the policy"""
    critic_learning_rate: float = 2e-4
    """learning rate of the critic (AdamW; or of the shared value head)"""
    critic_hidden_size: int = 1024
    """width of the value head's hidden layers"""
    critic_num_layers: int = 0
    """hidden layers of the value head (0: one linear layer, as TRL)"""
    cliprange_value: float = 0.2
    """how far the new value may move from the old one before the value loss clips"""
    vf_coef: float = 0.1
    """weight of the value loss"""
    gamma: float = 1.0
    """discount, per token (oat and TRL: 1)"""
    gae_lambda: float = 1.0
    """GAE lambda (oat: 1, i.e. A_t = return - V_t; TRL: 0.95)"""
    whiten_advantages: bool = True
    """whiten the advantages over the batch's response tokens"""
    whiten_rewards: bool = False
    """scale the per-token rewards to unit variance before GAE (TRL)"""
    missing_eos_penalty: float = 0.0
    """taken off the score of a response cut at max_new_tokens before EOS (TRL's; 0: none)"""
    entropy_coef: float = 0.0
    """weight of the entropy bonus"""
    target_kl: float = 0.0
    """stop this batch's epochs once a minibatch's approx_kl exceeds this (CleanRL; 0: never)"""


def check_args(args, world_size):
    """This file's own option errors, each with its fix, before any model loads (Run checks the
    shared ones of common/run/checks.py first)."""


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
# Advantages (PPO: per-token rewards, a critic and GAE replace the group baseline)
# ------------------------------------------------------------------------------------------------
def token_rewards(scores, truncated, response_mask, args, kl=None):
    """Per-token rewards [B, R]. scores, truncated: [B]; kl: [B, R] KL estimates, or None."""
    mask = response_mask.float()
    rewards = torch.zeros_like(mask) if kl is None else -args.beta * kl * mask  # [B, R]
    scores = scores - args.missing_eos_penalty * truncated.float()  # [B]
    # CRUCIAL: the score sits on the last real token of each right-padded response: its EOS when
    # it stopped, else the last token it was allowed to sample. Other tokens get the KL term only.
    last = (mask.sum(1).long() - 1).clamp(min=0)  # [B]
    rewards[torch.arange(rewards.shape[0]), last] += scores
    return rewards


def compute_advantages(rewards, values, response_mask, args):
    """Token-level GAE. rewards, values: [B, R] -> (advantages, returns), [B, R], 0 on padding."""
    mask = response_mask.float()
    if args.whiten_rewards:  # (r - mean) / std + mean, over every rank's tokens
        rewards = masked_whiten(rewards, mask, shift_mean=False)
    # CRUCIAL: the episode ends at each row's last real token: V after it is 0 (truncated too).
    advantages, returns = token_gae(rewards, values, mask, args.gamma, args.gae_lambda)  # [B, R]
    # CRUCIAL: returns are taken before whitening: they are the critic's targets, in reward units.
    if args.whiten_advantages:
        advantages = masked_whiten(advantages, mask)
    return advantages, returns


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
    # new to PPO: the advantages are the tokens' own already, [b, R]
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


def value_loss(values, old_values, returns, response_mask, normaliser, args):
    """Clipped value loss (PPO2, oat, TRL). values, old_values, returns: [b, R]."""
    mask = response_mask.float()
    # the new value may move at most cliprange_value from the value the returns were computed with
    clip = args.cliprange_value
    values_clipped = old_values + (values - old_values).clamp(-clip, clip)
    v_loss = 0.5 * torch.max((values - returns) ** 2, (values_clipped - returns) ** 2)  # [b, R]
    loss = aggregate(v_loss, mask, args.loss_type, normaliser)
    with torch.no_grad():
        vf_clipped = ((values_clipped - returns) ** 2 > (values - returns) ** 2).float()
        stats = {"v_loss": masked_mean(v_loss, mask).item(),
                 "vf_clipfrac": masked_mean(vf_clipped, mask).item()}
    return loss, stats


# ------------------------------------------------------------------------------------------------
# Forwards (PPO: the log-probs and the values of every response token)
# ------------------------------------------------------------------------------------------------
def forward(policy, critic, input_ids, attention_mask, R, args):
    """-> logprobs [b, R], entropy [b, R], values [b, R] (V(s_t) of the prefix before token t). The
    critic is a separate transformer, or (--critic_type shared) a value head on the policy's own
    hidden states."""
    if args.critic_type == "shared":  # a value head reads the policy's hidden states
        logprobs, entropy, hidden = token_logprobs(policy, input_ids, attention_mask, R,
                                                   args.temperature, return_hidden=True,
                                                   fast=not args.plain)
        return logprobs, entropy, critic(hidden[:, -R - 1:-1])  # [b, R]
    logprobs, entropy = token_logprobs(policy, input_ids, attention_mask, R, args.temperature,
                                       fast=not args.plain)
    # CRUCIAL: the same one-token shift as the log-probs: V(s_t) sits at the position before t.
    values = critic(input_ids, attention_mask, input_ids.shape[1] - R)[:, -R - 1:-1]  # [b, R]
    return logprobs, entropy, values


@torch.no_grad()
def rollout_forward(policy, critic, gen, micro_batch, args):
    """pi_old's log-probs and V_old of the whole rollout batch, before any update: [N, R] each."""
    input_ids, attention_mask = gen.sequences()
    R = gen.response_mask.shape[1]
    outs = [forward(policy, critic, input_ids[i:i + micro_batch],
                    attention_mask[i:i + micro_batch], R, args)
            for i in range(0, input_ids.shape[0], micro_batch)]
    return torch.cat([o[0] for o in outs]), torch.cat([o[2] for o in outs]).float()


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
    run.print(f"PPO | {run.world} process(es) on {run.device} | {args.num_prompts} prompts x {G} "
              f"samples per update ({N} per rank) | {args.num_ppo_epochs} epoch(s) x "
              f"{args.num_mini_batches} minibatch(es) of micro-batches of {args.micro_batch_size} "
              f"| {len(env)} problems | {args.max_steps} updates")
    start_step, resume_from = run.resume_point()

    # ---- models
    tokenizer = load_tokenizer(args.model_name_or_path)
    run.check_prompts(tokenizer, env, eval_env)  # each prompt within the model's positions
    policy = trained_policy(args, resume_from, run.device)  # LoRA (--lora_r), FSDP2 (--fsdp)
    # new to PPO: the critic, a copy of the policy with a value head (or a head on the policy)
    critic = make_critic(args, policy, run.device, run.state)
    ref_policy = reference_policy(args, policy, run.device) if args.beta > 0 else None
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad],
                                  lr=args.learning_rate, weight_decay=0.0)
    if args.offload_optimizer:  # fp32 master weights and AdamW on the CPU, bf16 on the device
        optimizer = run.offload_optimizer(policy, optimizer)
    # new to PPO: the critic's own AdamW, always fp32
    critic_optimizer = torch.optim.AdamW(critic.parameters(), lr=args.critic_learning_rate,
                                         weight_decay=0.0)
    # TRY NOT TO MODIFY: a resumed run's optimizer state, the logs, the accuracy before training
    # new to PPO: the critic's optimizer and weights are saved and resumed with the policy's
    run.start(policy, tokenizer, eval_env,
              {"policy": (policy, optimizer), "critic": (critic, critic_optimizer)},
              extra_state=lambda: {"critic": critic_state(critic)})

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

        # ---- log-probs of the behaviour policy, its values, and the reference, before any update
        micro_batch = run.micro_batch_size(*input_ids.shape)  # rows per forward (a GPU: fitted)
        ref_logprobs, kl = None, None
        with run.autocast:
            # [N, R] each
            old_logprobs, values = rollout_forward(policy, critic, gen, micro_batch, args)
            if ref_policy is not None:
                ref_logprobs = batched_token_logprobs(ref_policy, gen, args.temperature,
                                                      micro_batch, fast=not args.plain)
        if ref_logprobs is not None and args.kl_penalty == "reward":  # a cost in the reward
            # under pi_old's log-probs (PPO has them; the sampler's, grpo's, differ by rounding)
            kl = kl_estimate(old_logprobs, ref_logprobs, args.kl_estimator)  # [N, R]
            ref_logprobs = None

        # ---- advantages: per-token rewards, then GAE with the critic's values
        rewards = token_rewards(scores, gen.truncated, response_mask, args, kl)  # [N, R]
        advantages, returns = compute_advantages(rewards, values, response_mask, args)  # [N, R]
        loss_mask = response_mask  # [N, R] the tokens that count in the loss

        # ---- update: num_ppo_epochs passes of num_mini_batches optimizer steps, over micro-batches
        lr = run.set_lr(optimizer, step)
        run.set_lr(critic_optimizer, step, args.critic_learning_rate)
        policy.train()
        critic.train()
        stats, grad_norms, critic_grad_norms = [], [], []
        for batch_rows in run.minibatches(N, step):  # seeded: a resumed run takes the same
            normaliser = loss_normaliser(loss_mask[batch_rows], args, run.world)
            optimizer.zero_grad(set_to_none=True)
            critic_optimizer.zero_grad(set_to_none=True)
            total_loss, first_stat = 0.0, len(stats)
            for rows in batch_rows.split(micro_batch):  # gradients accumulate over micro-batches
                with run.autocast:
                    logprobs, entropy, new_values = forward(policy, critic, input_ids[rows],
                                                            attention_mask[rows], R, args)
                ref = None if ref_logprobs is None else ref_logprobs[rows]
                pg, pg_stats = policy_loss(logprobs, old_logprobs[rows], advantages[rows],
                                           loss_mask[rows], normaliser, args, ref)
                vf, v_stats = value_loss(new_values.float(), values[rows], returns[rows],
                                         loss_mask[rows], normaliser, args)
                loss = pg + args.vf_coef * vf
                if args.entropy_coef:
                    bonus = aggregate(entropy, mask[rows], args.loss_type, normaliser)
                    loss = loss - args.entropy_coef * bonus
                loss.backward()
                total_loss += loss.item()
                stats.append({**pg_stats, **v_stats,
                              **mismatch_stats(old_logprobs[rows], gen.logprobs[rows], mask[rows]),
                              "entropy": masked_mean(entropy.detach(), mask[rows]).item()})
            # what DDP does: the mean of every rank's gradient; then the clip
            grad_norms.append(run.sync_gradients(policy))
            critic_grad_norms.append(run.sync_gradients(critic))
            if run.guard.ok(total_loss, grad_norms[-1], critic_grad_norms[-1]):
                optimizer.step()
                critic_optimizer.step()
            # CleanRL's early stop: the update ends once this minibatch's approx_kl, averaged
            # over every rank so that all ranks stop together, passes --target_kl
            kl_now = [s["approx_kl"] for s in stats[first_stat:]]
            kl_now = all_reduce_sum(torch.tensor(sum(kl_now) / len(kl_now), dtype=torch.float64,
                                                 device=run.device)).item() / run.world
            if args.target_kl and kl_now > args.target_kl:
                break
        # the rollout has no use for gradients: freed here, not at the next update's start
        optimizer.zero_grad(set_to_none=True)
        critic_optimizer.zero_grad(set_to_none=True)
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
            "grad_norm": sum(grad_norms) / len(grad_norms),
            "critic_grad_norm": sum(critic_grad_norms) / len(critic_grad_norms),
            "value/mean": masked_mean(values, mask).item(),
            "return/mean": masked_mean(returns, mask).item(),
            # how much of the returns' variance the critic explained (over every rank's tokens)
            "explained_variance": explained_variance(values, returns, mask),
            "lr": lr, "tokens_per_s": n_tokens * run.world / t_rollout,
            "time/rollout_s": t_rollout, "time/update_s": t_update,
        }
        if kl is not None:
            metrics["kl_ref"] = masked_mean(kl, mask).item()  # per token
        # new to PPO: the first token's advantage, value and return of each response
        samples = [{**env.sample_fields(batch.problems[k // G]), "response": batch.texts[k],
                    "reward": scores[k].item(), "advantage": advantages[k, 0].item(),
                    "value": values[k, 0].item(), "return": returns[k, 0].item()}
                   for k in range(0, N, max(1, N // 8))]
        run.log(step + 1, metrics, stats, samples)
        run.end_update(step + 1)
    return run.finish()


if __name__ == "__main__":
    main(parse_args(Args))
