"""PPO: Proximal Policy Optimization and a critic on verifiable math. Docs: docs/ppo.md

Paper: Schulman et al. 2017 (arXiv:1707.06347), token-level as oat's and TRL's PPO.

Sample G responses per prompt, grade each with the task's verifier, and score each
token against a learned value V_it of its prefix (V after the last token: 0):
    A_it   = r_it + gamma V_i,t+1 - V_it + gamma lam A_i,t+1,  R_it = A_it + V_it
    rho_it = pi(o_it | q, o_i<t) / pi_old(o_it | q, o_i<t)
    L      = agg_it [ -min(rho_it A_it, clip(rho_it, 1 - eps, 1 + eps) A_it)
                      - entropy_coef H_it + vf_coef L_V,it ]
    L_V,it = 0.5 max((V_it - R_it)^2, (V_old,it + clip_v(V_it - V_old,it) - R_it)^2)
agg, --loss_type: per-sequence means, then their mean (grpo); a token mean over the
local (bnpo) or the global batch (dapo); a constant 1 / (N max_new_tokens) (dr_grpo).
r_it: -beta KL_it, plus the score at the last token; clip_v: to +-cliprange_value.

Simplified versus oat and TRL:
- one process samples and learns, with the HF model (no vLLM);
- rule-based verifiers (common/env/tasks.py), not a reward model;
- pi_old's log-probs are the learner's (TRL: the sampler's); no adaptive KL control.

Launch:
    python ppo.py                       # CPU, offline: SmolLM2-135M, arithmetic
    python ppo.py --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct \\
        --dataset_name gsm8k --bf16
    torchrun --nproc_per_node 8 ppo.py --bf16 --num_prompts 128 \\
        --model_name_or_path Qwen/Qwen2.5-1.5B-Instruct --dataset_name gsm8k
"""

import time
from dataclasses import dataclass
from typing import Literal, Optional

import torch

from common import all_reduce_sum, sample_seed
from common.env import make_envs, prompt_indices
from common.models import (Rollout, batched_token_logprobs, encode_prompts,
                           fast_decoding, generate, load_tokenizer, reference_policy,
                           token_logprobs, trained_policy)
from common.models import critic_state, make_critic  # new to PPO: the critic
from common.rl import kl_estimate, masked_mean, mismatch_stats
from common.rl import explained_variance, masked_whiten, token_gae  # new to PPO: GAE
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
    num_generations: int = 1  # new to PPO: the critic is the baseline
    """G: responses sampled per prompt (the group)"""
    num_ppo_epochs: int = 1
    """passes over each rollout batch"""
    num_mini_batches: int = 2
    """optimizer steps per pass over the shuffled batch"""
    epsilon: float = 0.2
    """clip range of the ratio"""
    beta: float = 0.0
    """weight of the KL to the frozen reference (0: none is loaded)"""
    kl_estimator: Literal["k1", "k2", "k3"] = "k1"
    """per-token estimate of the KL (k3: the GRPO paper's)"""
    kl_penalty: Literal["loss", "reward"] = "reward"
    """where the KL enters: a loss term per token, or a cost in the reward"""
    loss_type: Literal["grpo", "bnpo", "dr_grpo", "dapo"] = "dapo"
    """how per-token losses are aggregated, by TRL's names (see the docstring)"""
    critic_type: Literal["separate", "shared"] = "separate"
    """separate: a second transformer (oat, TRL); shared: a head on the policy"""
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
    """taken off the score of a response cut before EOS (TRL's; 0: none)"""
    entropy_coef: float = 0.0
    """weight of the entropy bonus"""
    target_kl: float = 0.0
    """stop this batch's epochs once a minibatch's approx_kl passes it (0: never)"""


def check_args(args, world_size):
    """This file's own option errors, each with its fix, before any model loads."""


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
def token_rewards(scores, truncated, response_mask, args, kl=None):
    """Per-token rewards [B, R]. scores, truncated: [B]; kl: [B, R], or None."""
    mask = response_mask.float()
    rewards = torch.zeros_like(mask) if kl is None else -args.beta * kl * mask
    scores = scores - args.missing_eos_penalty * truncated.float()  # [B]
    # CRUCIAL: the score sits on each response's last real token (EOS, or cut)
    last = (mask.sum(1).long() - 1).clamp(min=0)  # [B]
    rewards[torch.arange(rewards.shape[0]), last] += scores
    return rewards


def compute_advantages(rewards, values, response_mask, args):
    """GAE per token: rewards, values [B, R] -> advantages, returns, 0 on padding."""
    mask = response_mask.float()
    if args.whiten_rewards:  # (r - mean) / std + mean, over every rank's tokens
        rewards = masked_whiten(rewards, mask, shift_mean=False)
    # CRUCIAL: V after a row's last real token is 0; the returns stay unwhitened
    advantages, returns = token_gae(rewards, values, mask, args.gamma, args.gae_lambda)
    if args.whiten_advantages:
        advantages = masked_whiten(advantages, mask)
    return advantages, returns


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
    # new to PPO: the advantages are the tokens' own already, [b, R]
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


def value_loss(values, old_values, returns, response_mask, normaliser, args):
    """Clipped value loss (PPO2, oat, TRL). values, old_values, returns: [b, R]."""
    mask = response_mask.float()
    clip = args.cliprange_value
    values_clipped = old_values + (values - old_values).clamp(-clip, clip)
    v_loss = 0.5 * torch.max((values - returns) ** 2, (values_clipped - returns) ** 2)
    loss = aggregate(v_loss, mask, args.loss_type, normaliser)
    with torch.no_grad():
        vf_clipped = ((values_clipped - returns) ** 2 > (values - returns) ** 2).float()
        stats = {"v_loss": masked_mean(v_loss, mask).item(),
                 "vf_clipfrac": masked_mean(vf_clipped, mask).item()}
    return loss, stats


# ---- Forwards: the log-probs and the values of every response token
def forward(policy, critic, input_ids, attention_mask, R, args):
    """-> logprobs, entropy, values: [b, R] each (V_t: of the prefix before token t)."""
    if args.critic_type == "shared":
        logprobs, entropy, hidden = token_logprobs(
            policy, input_ids, attention_mask, R, args.temperature,
            return_hidden=True, fast=not args.plain)
        return logprobs, entropy, critic(hidden[:, -R - 1:-1])  # [b, R]
    logprobs, entropy = token_logprobs(policy, input_ids, attention_mask, R,
                                       args.temperature, fast=not args.plain)
    # CRUCIAL: the log-probs' one-token shift: V(s_t) sits at the position before t
    values = critic(input_ids, attention_mask, input_ids.shape[1] - R)[:, -R - 1:-1]
    return logprobs, entropy, values


@torch.no_grad()
def rollout_forward(policy, critic, gen, micro_batch, args):
    """pi_old's log-probs and V_old of the rollout batch, before any update: [N, R]."""
    input_ids, attention_mask = gen.sequences()
    R = gen.response_mask.shape[1]
    outs = [forward(policy, critic, input_ids[i:i + micro_batch],
                    attention_mask[i:i + micro_batch], R, args)
            for i in range(0, input_ids.shape[0], micro_batch)]
    return torch.cat([o[0] for o in outs]), torch.cat([o[2] for o in outs]).float()


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
    run.print(f"PPO | {run.world} process(es) on {run.device} | "
              f"{args.num_prompts} prompts x {G} samples | {args.num_ppo_epochs} "
              f"epoch(s) x {args.num_mini_batches} minibatch(es) | {len(env)} "
              f"problems | {args.max_steps} updates")
    start_step, resume_from = run.resume_point()

    # ---- models
    tokenizer = load_tokenizer(args.model_name_or_path,
                               template_kwargs=args.chat_template_kwargs)
    run.check_prompts(tokenizer, env, eval_env)
    policy = trained_policy(args, resume_from, run.device)
    critic = make_critic(args, policy, run.device, run.state)  # new to PPO: the critic
    ref_policy = None
    if args.beta > 0:
        ref_policy = reference_policy(args, policy, run.device)
    trained = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trained, lr=args.learning_rate, weight_decay=0.0)
    if args.offload_optimizer:
        optimizer = run.offload_optimizer(policy, optimizer)
    critic_optimizer = torch.optim.AdamW(  # new to PPO: the critic's own, fp32
        critic.parameters(), lr=args.critic_learning_rate, weight_decay=0.0)
    # TRY NOT TO MODIFY: a resumed run's optimizers, the logs, the first evaluation
    run.start(policy, tokenizer, eval_env,  # new to PPO: the critic's state too
              {"policy": (policy, optimizer), "critic": (critic, critic_optimizer)},
              extra_state=lambda: {"critic": critic_state(critic)})

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

        # ---- log-probs of the behaviour policy and of the reference
        micro_batch = run.micro_batch_size(*input_ids.shape)
        ref_logprobs, kl = None, None
        with run.autocast:
            old_logprobs, values = rollout_forward(  # and the critic's values
                policy, critic, gen, micro_batch, args)
            if ref_policy is not None:
                ref_logprobs = batched_token_logprobs(
                    ref_policy, gen, args.temperature, micro_batch,
                    fast=not args.plain)
        if ref_logprobs is not None and args.kl_penalty == "reward":
            # CRUCIAL: from pi_old's log-probs, the KL is a number, not a
            # function of the weights
            kl = kl_estimate(old_logprobs, ref_logprobs, args.kl_estimator)
            ref_logprobs = None

        # ---- advantages: per-token rewards, then GAE with the critic's values
        rewards = token_rewards(scores, gen.truncated, response_mask, args, kl)
        advantages, returns = compute_advantages(rewards, values, response_mask, args)
        loss_mask = response_mask * (1 - gen.forced)  # [N, R] the model's own tokens

        # ---- update: epochs of minibatches, an optimizer step each
        lr = run.set_lr(optimizer, step)
        run.set_lr(critic_optimizer, step, args.critic_learning_rate)
        policy.train()
        critic.train()
        stats, grad_norms = [], []
        critic_grad_norms = []
        for batch_rows in run.minibatches(N, step):
            normaliser = loss_normaliser(loss_mask[batch_rows], args, run.world)
            optimizer.zero_grad(set_to_none=True)
            critic_optimizer.zero_grad(set_to_none=True)
            total_loss = 0.0
            first_stat = len(stats)
            for rows in batch_rows.split(micro_batch):
                with run.autocast:
                    logprobs, entropy, new_values = forward(
                        policy, critic, input_ids[rows], attention_mask[rows], R, args)
                old = old_logprobs[rows]
                ref = None if ref_logprobs is None else ref_logprobs[rows]
                pg, pg_stats = policy_loss(logprobs, old, advantages[rows],
                                           loss_mask[rows], normaliser, args, ref)
                vf, v_stats = value_loss(
                    new_values.float(), values[rows], returns[rows], loss_mask[rows],
                    normaliser, args)
                loss = pg + args.vf_coef * vf
                loss_stats = {**pg_stats, **v_stats}
                if args.entropy_coef:
                    bonus = aggregate(entropy, mask[rows], args.loss_type, normaliser)
                    loss = loss - args.entropy_coef * bonus
                loss.backward()
                total_loss += loss.item()
                loss_stats["entropy"] = masked_mean(entropy.detach(), mask[rows]).item()
                stats.append({**loss_stats,
                              **mismatch_stats(old, gen.logprobs[rows], mask[rows])})
            grad_norms.append(run.sync_gradients(policy))  # DDP's mean, the clip
            critic_grad_norms.append(run.sync_gradients(critic))
            if run.guard.ok(total_loss, grad_norms[-1], critic_grad_norms[-1]):
                optimizer.step()
                critic_optimizer.step()
            # CleanRL's early stop, on the ranks' mean, so that they all stop together
            kl_now = [s["approx_kl"] for s in stats[first_stat:]]
            kl_now = all_reduce_sum(torch.tensor(
                sum(kl_now) / len(kl_now), dtype=torch.float64, device=run.device))
            if args.target_kl and kl_now.item() / run.world > args.target_kl:
                break
        # the rollout has no use for gradients: freed now
        optimizer.zero_grad(set_to_none=True)
        critic_optimizer.zero_grad(set_to_none=True)
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
            "grad_norm": sum(grad_norms) / len(grad_norms),
            "critic_grad_norm": sum(critic_grad_norms) / len(critic_grad_norms),
            "value/mean": masked_mean(values, mask).item(),
            "return/mean": masked_mean(returns, mask).item(),
            "explained_variance": explained_variance(values, returns, mask),
            "lr": lr,
            "tokens_per_s": n_tokens * run.world / t_rollout,
            "time/rollout_s": t_rollout,
            "time/update_s": t_update,
        }
        if kl is not None:
            metrics["kl_ref"] = masked_mean(kl, mask).item()
        samples = [{**env.sample_fields(batch.problems[k // G]),  # new to PPO: t = 0
                    "response": batch.texts[k], "reward": scores[k].item(),
                    "advantage": advantages[k, 0].item(), "value": values[k, 0].item(),
                    "return": returns[k, 0].item()}
                   for k in range(0, N, max(1, N // 8))]
        run.log(step + 1, metrics, stats, samples)
        run.end_update(step + 1)
    return run.finish()


if __name__ == "__main__":
    main(parse_args(Args))
