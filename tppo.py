"""TPPO: token-level PPO with action decomposition, as OpenR's train/mat does it.
Docs: docs/tppo.md

OpenR (Wang et al. 2024, arXiv:2410.09671), llm_trainer_tppo.py. An action
is a reasoning step (a line), rewarded per step: r_t = P('+' | question,
steps 1..t) of a process reward model, or without one the verifier on the
last step. TPPO is POAD (Wen et al. 2024): the critic gives one value a
*token* (V_j: of the prefix before token j), and GAE runs over tokens with
the BAD backup, no reward nor discount inside a step (its last token:
j = L_t - 1):

    j < L_t - 1: delta_j = V_j+1 - V_j,  A_j = delta_j + lam A_j+1
    j = L_t - 1: delta_j = r_t + gamma V(o_t+1) m_t+1 - V_j,
                 A_j = delta_j + gamma lam m_t+1 A_t+1
    R_j = A_j + V_j,  rho_j = pi(w_j | o_t, w_<j) / pi_old(w_j | o_t, w_<j)
    L_pi    = mean max(-rho A, -clip(rho, 1 - eps, 1 + eps) A) - c_ent mean H
    L_V     = c_V mean max(huber(R - V_clip), huber(R - V))
with V_clip = V_old + clip(V - V_old, +-eps), A whitened, m_t+1 = 0 when
the episode ended at step t. A minibatch whose approx KL passes skip_kl is
skipped.

Simplified or changed versus OpenR:
- one process samples and learns, with the HF model (no vLLM, no
  subprocess vector env);
- the critic is a value head on a frozen copy of the starting policy
  (OpenR: the base model, its LoRA adapters off, as --lora_r does here);
- beyond OpenR, whose PRM never sees the gold answer:
  --outcome_reward_coef adds the verifier's correctness on the last step;
  without a PRM the reward is the verifier alone;
- an episode also ends at EOS (OpenR: on "answer" or after 10 steps);
- no entropy bonus by default (OpenR: 0.01): it cost accuracy on the
  default CPU run (docs/tppo.md);
- evaluation is greedy single-turn generation of the whole answer
  (common/run/evaluation.py), on every file's held-out problems.

Launch:
    python tppo.py                      # CPU, offline: SmolLM2-135M, arithmetic
    python tppo.py --model_name_or_path Qwen/Qwen2.5-Math-1.5B \\
        --template plain --dataset_name math --max_new_tokens 96 --bf16 \\
        --prm_model_name_or_path peiyi9979/math-shepherd-mistral-7b-prm
    torchrun --nproc_per_node 8 tppo.py --bf16 --num_envs 64 \\
        --model_name_or_path Qwen/Qwen2.5-1.5B-Instruct --dataset_name gsm8k
    python tppo.py --seed 10 --dataset_name prealgebra \\
        --dataset_path math_500.jsonl --model_name_or_path Qwen2.5-Math-1.5B \\
        --prm_type MS --prm_model_name_or_path math-shepherd-mistral-7b-prm \\
        --algorithm_name TPPO --experiment_name ms_single \\
        --num_mini_batch 4 --ppo_epoch 1    # OpenR's own command
"""

import time
from dataclasses import dataclass
from typing import Literal, Optional

import torch
import torch.nn.functional as F

from common import (UsageError, all_gather_objects, all_reduce_mean,
                    all_reduce_sum, sample_seed)
from common.env import StepwiseEnvs, make_envs, resolve_task
from common.models import (ProcessRewardModel, batched_token_logprobs, critic_state,
                           left_pad, load_prm_tokenizer, load_tokenizer, make_critic,
                           play_segment, single_token_id, token_logprobs,
                           trained_policy, trim_left_padding)
from common.rl import (explained_variance, kl_estimate, masked_mean,
                       masked_whiten, mismatch_stats)
from common.run import Run, TrainArgs, mean_of, parse_args

# steps per episode and tokens per step, by task (OpenR's 10 of 96 on MATH)
STEP_LIMITS = {"arithmetic": (2, 32), "countdown": (4, 64), "gsm8k": (10, 96),
               "math": (10, 96)}


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
    max_steps: int = 15
    """policy updates (one rollout batch each)"""
    num_train_epochs: Optional[float] = None
    """when given, max_steps covers this many passes over the problems"""
    micro_batch_size: Optional[int] = None
    """sequences per forward and backward (8; on a GPU, what fits)"""
    seed: int = 0
    """seeds prompt order, sampling and model init"""
    # ---- sampling
    max_new_tokens: Optional[int] = None  # new to TPPO: a step's
    """response length limit, in tokens: of one step (by task: arithmetic 32,
    countdown 64, else 96, OpenR's)"""
    temperature: float = 0.7
    """sampling temperature (also applied to the training log-probs)"""
    top_p: float = 1.0
    """nucleus sampling mass"""
    # ---- the algorithm
    num_envs: int = 8
    """episodes played side by side, over all ranks (n_rollout_threads)"""
    num_steps: int = 4
    """steps each episode takes per update; episodes carry over"""
    max_episode_steps: Optional[int] = None
    """steps per episode at most (by task: arithmetic 2, countdown 4, else 10)"""
    step_tag: str = "\n"
    """text after each step (a line) in the policy's context (OpenR: ' ки\\n')"""
    prm_model_name_or_path: Optional[str] = None
    """process reward model (Math-Shepherd's) scoring each step (else the verifier)"""
    prm_step_tag: str = "ки"
    """the PRM's step tag; one token for its tokenizer"""
    prm_good_token: str = "+"
    """the PRM's 'good step' token: reward = P(good) against bad"""
    prm_bad_token: str = "-"
    """the PRM's 'bad step' token"""
    outcome_reward_coef: float = 0.0
    """beyond OpenR: with a PRM, add this times the verifier's correctness"""
    num_ppo_epochs: int = 1  # new to TPPO: a segment's
    """passes over each rollout batch (a segment of every episode)"""
    num_mini_batches: int = 2  # new to TPPO: of every episode
    """optimizer steps per pass over the shuffled batch (dividing num_steps)"""
    epsilon: float = 0.2
    """clip range of the ratio"""
    cliprange_value: float = 0.2
    """how far the new value may move from the old one before the value loss clips"""
    critic_learning_rate: float = 1e-4
    """learning rate of the critic (Adam, as OpenR)"""
    critic_hidden_size: int = 1024
    """width of the value head's hidden layers"""
    critic_num_layers: int = 2
    """hidden layers of the value head (0: one linear layer)"""
    critic_train_body: bool = False
    """train the critic's transformer body too (OpenR: the head only)"""
    vf_coef: float = 1.0
    """weight of the value loss"""
    huber_delta: float = 10.0
    """Huber threshold of the value loss"""
    gamma: float = 0.95
    """discount, per step"""
    gae_lambda: float = 0.95
    """GAE lambda"""
    entropy_coef: float = 0.0
    """weight of the entropy bonus (OpenR: 0.01)"""
    skip_kl: float = 0.02
    """skip a minibatch's policy step when its approx_kl passes this (0: never)"""
    lora_target_modules: str = "q_proj,v_proj"
    """modules that get adapters (OpenR's LoRA: r 8, alpha 16, q_proj and v_proj)"""
    eval_max_new_tokens: int = 64
    """token limit of the whole answer in evaluation"""


def check_args(args, world_size):
    """This file's own option errors, each with its fix, before any model loads."""
    if args.num_envs % world_size:
        fit = world_size * max(1, args.num_envs // world_size)
        raise UsageError(f"--num_envs {args.num_envs} must be divisible by the number "
                         f"of processes ({world_size}); try --num_envs {fit}.")
    if args.num_steps % args.num_mini_batches:
        raise UsageError(f"--num_mini_batches {args.num_mini_batches} must divide "
                         f"--num_steps {args.num_steps}: each minibatch takes as many "
                         "steps of every episode.")
    if args.prm_model_name_or_path:  # the tag and candidates, a token each
        prm_tok = load_prm_tokenizer(args.prm_model_name_or_path,
                                     args.prm_step_tag)
        for text, what in [(args.prm_step_tag, "step tag"),
                           (args.prm_good_token, "good token"),
                           (args.prm_bad_token, "bad token")]:
            single_token_id(prm_tok, text, what)


# ---- Advantages
def compute_advantages(rewards, values, response_mask, next_values, dones, gamma, lam):
    """Token-level GAE with the BAD backup per env over the segment, backwards
    over steps and then tokens. rewards, dones: [E, T]; values, response_mask:
    [E, T, R] (V of the prefix before each action token); next_values: [E], V
    after the segment. Padding gets 0. -> [E, T, R] each"""
    E, T, R = values.shape
    mask = response_mask.to(values.dtype)
    last = mask.sum(-1).long() - 1  # [E, T] each step's last token
    advantages = torch.zeros_like(values)
    running = torch.zeros_like(next_values)  # A of the token after (or next step's)
    next_v = next_values  # V(o_t+1, token 0): of the next observation
    for t in reversed(range(T)):
        nonterminal = 1.0 - dones[:, t]  # [E] m_t+1
        for j in reversed(range(R)):
            v = values[:, t, j]  # [E]
            v_after = values[:, t, j + 1] if j + 1 < R else torch.zeros_like(v)
            is_last = last[:, t] == j  # [E]
            # CRUCIAL: the step's reward and gamma at its last token only;
            # inside it V backs up as it is
            bootstrap = rewards[:, t] + gamma * next_v * nonterminal
            delta = torch.where(is_last, bootstrap - v, v_after - v)
            adv = torch.where(is_last, delta + gamma * lam * nonterminal * running,
                              delta + lam * running)
            # padding passes the running A through
            running = torch.where(mask[:, t, j] > 0, adv, running)
            advantages[:, t, j] = adv * mask[:, t, j]
        next_v = values[:, t, 0]
    return advantages, (advantages + values) * mask


# ---- Loss
def policy_loss(logprobs, old_logprobs, advantages, response_mask, entropy, normaliser,
                args):
    """Clipped surrogate per token, a token mean. Every input but the normaliser
    is [b, R]."""
    mask = response_mask.float()
    ratio = torch.exp(logprobs - old_logprobs)  # [b, R]
    low, high = 1 - args.epsilon, 1 + args.epsilon
    pg_loss = torch.max(-advantages * ratio, -advantages * ratio.clamp(low, high))
    loss = ((pg_loss - args.entropy_coef * entropy) * mask).sum() / normaliser
    with torch.no_grad():
        clipped = (((ratio < low) & (advantages < 0))
                   | ((ratio > high) & (advantages > 0)))
        # approx_kl is how far the policy moved from the one that sampled
        approx_kl = kl_estimate(old_logprobs, logprobs, "k3")
        stats = {"clipfrac": masked_mean(clipped.float(), mask).item(),
                 "approx_kl": masked_mean(approx_kl, mask).item(),
                 "pg_loss": masked_mean(pg_loss, mask).item(),
                 "entropy": masked_mean(entropy, mask).item()}
    return loss, stats


def value_loss(values, old_values, returns, response_mask, normaliser, args):
    """OpenR's value loss: the larger of the Huber losses of the clipped and
    the unclipped values, per token. values, old_values, returns: [b, R]."""
    clip, delta = args.cliprange_value, args.huber_delta
    values_clipped = old_values + (values - old_values).clamp(-clip, clip)
    v_loss = torch.max(  # [b, R]
        F.huber_loss(values_clipped, returns, reduction="none", delta=delta),
        F.huber_loss(values, returns, reduction="none", delta=delta))
    mask = response_mask.float()
    loss = args.vf_coef * (v_loss * mask).sum() / normaliser
    return loss, {"v_loss": masked_mean(v_loss, mask).item()}


def critic_values(critic, input_ids, attention_mask, R):
    """V of the prefix before each action token: the critic at the observation's
    last token and at the action's tokens but the last. [b, R]"""
    input_ids, attention_mask = trim_left_padding(input_ids, attention_mask)
    # CRUCIAL: the log-probs' one-token shift
    return critic(input_ids, attention_mask, input_ids.shape[1] - R)[:, -R - 1:-1]


def loss_normaliser(loss_mask, args, world_size):
    """Tokens in the global minibatch, per rank: once the gradients are averaged
    over ranks, the losses are token means over every rank's minibatch.
    loss_mask [n, R]: the tokens that count."""
    return (all_reduce_sum(loss_mask.sum().float()) / world_size).clamp(min=1).item()


# ---- Update: one minibatch, the critic first (OpenR's order)
def env_minibatches(step, epoch, num_envs, first_env, num_steps, num_mini_batches,
                    seed):
    """Row indices (k * T + t) of each minibatch. Every env gives T /
    num_mini_batches of its steps, drawn by a permutation seeded by (update,
    epoch, global env): 1 and N processes form the same global minibatch."""
    T, per = num_steps, num_steps // num_mini_batches
    seeds = [sample_seed(seed, step * 1000 + epoch, first_env + k) % 2**63
             for k in range(num_envs)]
    perms = [torch.randperm(T, generator=torch.Generator().manual_seed(s))
             for s in seeds]
    return [torch.cat([k * T + perms[k][m * per:(m + 1) * per]
                       for k in range(num_envs)])
            for m in range(num_mini_batches)]


def update_critic(critic, critic_optimizer, gen, old_values, returns, batch_rows,
                  micro_batch, args, run):
    """One critic step on the minibatch `batch_rows` of the rollout `gen`, in
    micro-batches of micro_batch rows."""
    input_ids, attention_mask = gen.sequences()
    response_mask, R = gen.response_mask, gen.response_mask.shape[1]
    normaliser = loss_normaliser(response_mask[batch_rows], args, run.world)
    critic_optimizer.zero_grad(set_to_none=True)
    stats, total_loss = [], 0.0
    for rows in batch_rows.split(micro_batch):
        with run.autocast:
            values = critic_values(critic, input_ids[rows], attention_mask[rows],
                                   R)
        loss, loss_stats = value_loss(values, old_values[rows], returns[rows],
                                      response_mask[rows], normaliser, args)
        loss.backward()
        total_loss += loss.item()
        stats.append(loss_stats)
    grad_norm = run.sync_gradients(critic)  # DDP's mean, the clip
    if run.guard.ok(total_loss, grad_norm):  # a NaN or inf skips it
        critic_optimizer.step()
    v_loss = sum(s["v_loss"] for s in stats) / len(stats)
    return {"v_loss": v_loss, "critic_grad_norm": grad_norm}


def update_policy(policy, optimizer, gen, old_logprobs, advantages, batch_rows,
                  micro_batch, args, run, unmoved=False):
    """The minibatch's gradient, then OpenR's early stop: no step if the
    approx KL between the rollout's policy and this one passes skip_kl on the
    minibatch. An update's first minibatch also compares the sampler's
    log-probs with these."""
    all_ids, all_mask = gen.sequences()
    response_mask, R = gen.response_mask, gen.response_mask.shape[1]
    normaliser = loss_normaliser(response_mask[batch_rows], args, run.world)
    # new to TPPO: CRUCIAL, the advantages are whitened per minibatch (OpenR),
    # over every rank's tokens
    step_mask = response_mask[batch_rows].float()  # new to TPPO: a token's each
    advantages = masked_whiten(advantages[batch_rows], step_mask, eps_on_std=True)
    optimizer.zero_grad(set_to_none=True)
    stats, total_loss = [], 0.0
    for k, rows in enumerate(batch_rows.split(micro_batch)):
        in_batch = slice(k * micro_batch, (k + 1) * micro_batch)
        input_ids, attention_mask = trim_left_padding(all_ids[rows],
                                                      all_mask[rows])
        with run.autocast:
            logprobs, entropy = token_logprobs(
                policy, input_ids, attention_mask, R, args.temperature,
                fast=not args.plain)
        loss, loss_stats = policy_loss(logprobs, old_logprobs[rows],
                                       advantages[in_batch], response_mask[rows],
                                       entropy, normaliser, args)
        loss.backward()
        total_loss += loss.item()
        if unmoved:  # the policy has not moved, so its log-probs are the rollout's
            loss_stats.update(mismatch_stats(
                logprobs.detach(), gen.logprobs[rows], response_mask[rows].float()))
        stats.append(loss_stats)
    stats = all_reduce_mean(mean_of(stats), run.device)
    if args.skip_kl and stats["approx_kl"] > args.skip_kl:  # every rank alike
        optimizer.zero_grad(set_to_none=True)
        return {**stats, "early_stop_frac": 1.0}
    grad_norm = run.sync_gradients(policy)  # DDP's mean, the clip
    if run.guard.ok(total_loss, grad_norm):  # a NaN or inf skips it
        optimizer.step()
    return {**stats, "early_stop_frac": 0.0, "grad_norm": grad_norm}


# ---- Main: setup, models, then each update's rollout, advantages, update, logs
def main(args):
    # TRY NOT TO MODIFY: processes, option checks, the seed; the env before any
    # model, so that a bad task or data file fails at once
    run = Run(args, check_args)
    # ---- derived options: the only lines that change args after parsing
    args.output_dir = run.output_dir  # without --output_dir: a new folder each run
    task = resolve_task(args, say=run.print)[0]
    steps, tokens = STEP_LIMITS.get(task, (10, 96))
    args.max_episode_steps = args.max_episode_steps or steps
    args.max_new_tokens = args.max_new_tokens or tokens
    stepwise = dict(stepwise=True, step_tag=args.step_tag,
                    max_steps=args.max_episode_steps)
    env, eval_env = make_envs(args, stepwise, say=run.print)
    args.dataset_name, args.dataset_path = env.source
    # the episodes of an update
    per_update = args.num_envs * args.num_steps / args.max_episode_steps
    args.max_steps, args.warmup_steps = run.schedule(len(env), per_update)
    args.micro_batch_size = args.micro_batch_size or run.default_micro_batch

    local_envs, T = args.num_envs // run.world, args.num_steps
    reward = "the verifier"
    if args.prm_model_name_or_path:
        reward = "PRM " + args.prm_model_name_or_path
    run.print(f"TPPO | {run.world} process(es) on {run.device} | "
              f"{args.num_envs} episodes x {T} steps | {args.num_ppo_epochs} "
              f"epoch(s) x {args.num_mini_batches} minibatch(es) | {len(env)} "
              f"problems | {args.max_steps} updates | reward: {reward} | "
              f"episodes of {args.max_episode_steps} steps of "
              f"{args.max_new_tokens} tokens at most")
    start_step, resume_from = run.resume_point()

    # ---- models
    tokenizer = load_tokenizer(args.model_name_or_path,
                               template_kwargs=args.chat_template_kwargs)
    run.check_prompts(tokenizer, env, eval_env)
    policy = trained_policy(args, resume_from, run.device)
    critic = make_critic(args, policy, run.device, run.state)
    prm = None
    if args.prm_model_name_or_path:
        dtype = torch.bfloat16 if args.bf16 else None
        prm = ProcessRewardModel(args.prm_model_name_or_path, args.prm_step_tag,
                                 args.prm_good_token, args.prm_bad_token,
                                 device=run.device, autocast_dtype=dtype)
    trained = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trained, lr=args.learning_rate, weight_decay=0.0)
    if args.offload_optimizer:
        optimizer = run.offload_optimizer(policy, optimizer)
    critic_trained = [p for p in critic.parameters() if p.requires_grad]
    critic_optimizer = torch.optim.Adam(
        critic_trained, lr=args.critic_learning_rate, eps=1e-5)
    envs = StepwiseEnvs(env, local_envs, run.rank * local_envs, args.num_envs,
                        args.seed)

    def extra_state():  # the critic, and every rank's running episodes
        parts = all_gather_objects(envs.state_dict())
        running = [s for part in parts for s in part]
        return {"critic": critic_state(critic), "envs": running}

    # TRY NOT TO MODIFY: a resumed run's optimizers, the logs, the first evaluation
    run.start(policy, tokenizer, eval_env,
              {"policy": (policy, optimizer), "critic": (critic, critic_optimizer)},
              extra_state, args.eval_max_new_tokens)
    if run.state is not None:  # the episodes that were running carry on
        mine = slice(run.rank * local_envs, (run.rank + 1) * local_envs)
        envs.load_state_dict(run.state["extra"]["envs"][mine])

    for step in range(start_step, args.max_steps):
        t0 = time.time()
        # ---- rollout: T steps in each of this rank's envs; episodes carry over
        segment = play_segment(envs, policy, tokenizer, step, T,
                               args.max_new_tokens, args.temperature, args.top_p,
                               run.autocast, fast=not args.plain, prm=prm,
                               outcome_reward_coef=args.outcome_reward_coef)
        run.check_rewards(segment.rewards, step + 1, segment.indices)
        gen = segment.gen
        input_ids, attention_mask = gen.sequences()  # [N, P + R], row k * T + t
        response_mask = gen.response_mask  # [N, R]
        N, R = response_mask.shape
        t_rollout = time.time() - t0

        # ---- values and advantages (beyond grpo: a critic, GAE over tokens)
        micro_batch = run.micro_batch_size(*input_ids.shape)
        with torch.no_grad(), run.autocast:
            # new to TPPO: a value a token, [N, R]
            values = torch.cat([
                critic_values(critic, input_ids[rows], attention_mask[rows], R)
                for rows in torch.arange(N).split(micro_batch)])
            values = values.float() * response_mask  # new to TPPO: 0 on padding
            next_obs = left_pad(segment.next_obs, tokenizer.pad_token_id)
            next_obs = [x.to(run.device) for x in next_obs]
            next_values = critic(*next_obs)[:, -1].float()  # V at the cut
        # new to TPPO: GAE over tokens, with the BAD backup
        advantages, returns = compute_advantages(
            segment.rewards, values.view(local_envs, T, R),
            response_mask.view(local_envs, T, R), next_values, segment.dones,
            args.gamma, args.gae_lambda)  # [E, T, R]
        # new to TPPO: [N, R]
        advantages, returns = advantages.reshape(N, R), returns.reshape(N, R)

        # ---- log-probs of the behaviour policy: the sampler's, exact in fp32
        old_logprobs = gen.logprobs  # [N, R]
        # CRUCIAL: bf16 sampling and training forwards round differently
        if args.bf16:
            with run.autocast:
                old_logprobs = batched_token_logprobs(
                    policy, gen, args.temperature, micro_batch, fast=not args.plain)

        # ---- update: epochs of minibatches, the critic's step first
        lr = run.set_lr(optimizer, step)
        run.set_lr(critic_optimizer, step, args.critic_learning_rate)
        policy.train()
        stats = []
        for epoch in range(args.num_ppo_epochs):
            for batch_rows in env_minibatches(step, epoch, local_envs,
                                              run.rank * local_envs, T,
                                              args.num_mini_batches, args.seed):
                batch_rows = batch_rows.to(run.device)
                step_stats = update_critic(
                    critic, critic_optimizer, gen, values, returns, batch_rows,
                    micro_batch, args, run)
                step_stats.update(update_policy(
                    policy, optimizer, gen, old_logprobs, advantages, batch_rows,
                    micro_batch, args, run, unmoved=not stats))
                stats.append(step_stats)
        # the rollout has no use for gradients: freed now
        optimizer.zero_grad(set_to_none=True)
        critic_optimizer.zero_grad(set_to_none=True)
        t_update = time.time() - t0 - t_rollout

        # ---- logging (averaged over ranks), held-out accuracy and checkpoints
        n_tokens = response_mask.sum().item()
        rewards = segment.rewards.reshape(N)
        mask = response_mask.float()  # new to TPPO: a value a token
        episodes = segment.episodes  # those that ended in this segment
        # their accuracy and length, over all ranks
        ended = [len(episodes), sum(e["correct"] for e in episodes),
                 sum(e["steps"] for e in episodes),
                 sum(e["cut"] for e in episodes)]
        ended = all_reduce_sum(torch.tensor(ended, dtype=torch.float64,
                                            device=run.device))
        metrics = {
            "reward/mean": rewards.mean().item(),
            "reward/std": rewards.std(unbiased=False).item(),
            "reward/grader_timeouts": (run.grader_timeouts()
                                       / max(1, len(episodes))),
            **env.reward_metrics(),
            "response_len/mean": n_tokens / N,
            "truncated_frac": gen.truncated.float().mean().item(),
            "value/mean": masked_mean(values, mask).item(),
            "explained_variance": explained_variance(values, returns, mask),
            "episodes": ended[0].item(),
            "lr": lr,
            "tokens_per_s": n_tokens * run.world / t_rollout,
            "time/rollout_s": t_rollout,
            "time/update_s": t_update,
        }
        if ended[0] > 0:  # a cut episode ended at --max_episode_steps, unanswered
            metrics.update({"accuracy": (ended[1] / ended[0]).item(),
                            "episode_steps/mean": (ended[2] / ended[0]).item(),
                            "episode_cut_frac": (ended[3] / ended[0]).item()})
        if prm is not None:
            metrics["prm_reward"] = segment.prm_rewards.mean().item()
        # grad_norm is the mean over the steps taken (none if all stopped early)
        samples = [{**e, "reward": sum(e["rewards"])} for e in episodes[:4]]
        run.log(step + 1, metrics, stats, samples)
        run.end_update(step + 1)
    return run.finish()


if __name__ == "__main__":
    main(parse_args(Args))
