"""Stepwise episodes, the policy's side: one action is one line of text, sampled by the policy.
For action-level RL (appo.py, tppo.py) `play_segment` plays a segment of the episodes that
common/env/stepwise.py's `StepwiseEnvs` keeps side by side, and a process reward model (PRM) can
score every step; for reinforce_stepwise.py, `play_episodes` plays k whole episodes per problem,
with the env's safe calculator. Plumbing only: advantages, losses and updates stay in the
algorithm files.

    prm = ProcessRewardModel("peiyi9979/math-shepherd-mistral-7b-prm")  # "tiny-random" in tests
    envs = StepwiseEnvs(env, num_envs=4, first_env=0, total_envs=4, seed=0)
    segment = play_segment(envs, policy, tokenizer, update=0, num_steps=8, max_new_tokens=48,
                           prm=prm)
    segment.gen.sequences()  # [obs ; action] of the 4 x 8 transitions; row k * 8 + t: env k, step t

Each step's prompt is the episode so far, re-encoded as text; sampling it with the FastDecoder
(common/models/fast/decoding.py) and one PrefixCache for the whole rollout reads only the tokens
added since the episode's last step.
"""

import contextlib
import copy
import math
from dataclasses import dataclass, field

import torch

from common.distributed import sample_seed
from common.env.stepwise import CALC_SPAN, MAX_CALCS, calculator
from common.errors import UsageError
from common.models.fast.decoding import fast_decoding
from common.models.fast.prompts import PrefixCache
from common.models.hf import position_ids_from_mask
from common.models.loading import TINY_RANDOM, load_reference, load_tokenizer, tiny_random_model
from common.models.sampler import (Generation, Rollout, encode_prompts, eos_token_ids, generate,
                                   left_pad, right_pad)


# ------------------------------------------------------------------------------------------------
# Process reward model (Math-Shepherd style)
# ------------------------------------------------------------------------------------------------
def single_token_id(tokenizer, text, what):
    """The id of `text` if the tokenizer makes it exactly one token, else a ValueError naming the
    fix."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) != 1:
        raise UsageError(
            f"the PRM {what} {text!r} is {len(ids)} tokens for the PRM's tokenizer ({ids}); the "
            "PRM reads one "
            "logit at one position, so it must be a single token. Pass the tokens your PRM was "
            "trained with, "
            f"e.g. --prm_step_tag 'ки' --prm_good_token '+' --prm_bad_token '-' (Math-Shepherd) or "
            "--prm_step_tag $'\\n\\n\\n\\n\\n' --prm_good_token ' +' --prm_bad_token ' -' "
            "(OpenR's Qwen PRM).")
    return ids[0]


def load_prm_tokenizer(name, step_tag):
    """The PRM's tokenizer. For "tiny-random" the step tag is added as a new token when the embedded
    tokenizer splits it (it splits 'ки'), as Math-Shepherd's tokenizer has it as one token."""
    tokenizer = load_tokenizer(name, "--prm_model_name_or_path")
    if name == TINY_RANDOM and len(tokenizer.encode(step_tag, add_special_tokens=False)) != 1:
        tokenizer.add_tokens([step_tag])
    return tokenizer


@torch.no_grad()
def prm_scores(model, input_ids, tag_id, good_id, bad_id, pad_id, autocast_dtype=None):
    """P(good) against bad at the LAST step tag of each row: softmax over the two candidate logits
    there.

    input_ids: list of token-id lists, each holding at least one `tag_id`. Returns [B] float32
    scores.
    """
    device = next(model.parameters()).device
    ids, mask = left_pad(input_ids, pad_id)
    ids, mask = ids.to(device), mask.to(device)  # [B, T]
    is_tag = (ids == tag_id) & mask.bool()
    if not bool(is_tag.any(1).all()):
        raise UsageError("a PRM input holds no step tag: every step must end with the tag token")
    cols = torch.arange(ids.shape[1], device=device)
    # CRUCIAL: the newest tag is the last tag position, which is not always the last token of the
    # row.
    last_tag = torch.where(is_tag, cols, -1).max(dim=1).values  # [B]
    autocast = torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None)
    with autocast:
        logits = model(input_ids=ids, attention_mask=mask,
                       position_ids=position_ids_from_mask(mask)).logits
    at_tag = logits[torch.arange(ids.shape[0], device=device), last_tag].float()  # [B, V]
    return torch.softmax(at_tag[:, [good_id, bad_id]], dim=-1)[:, 0]


class ProcessRewardModel:
    """A causal-LM PRM, Math-Shepherd style: the input is the question and the steps so far, each
    followed by the step tag, and the reward of the newest step is P(good_token) / (P(good_token) +
    P(bad_token)) at its tag."""

    def __init__(self, name, step_tag="ки", good_token="+", bad_token="-", device="cpu",
                 autocast_dtype=None,
                 batch_size=16):
        self.tokenizer = load_prm_tokenizer(name, step_tag)
        self.step_tag = step_tag
        self.tag_id = single_token_id(self.tokenizer, step_tag, "step tag")
        self.good_id = single_token_id(self.tokenizer, good_token, "good token")
        self.bad_id = single_token_id(self.tokenizer, bad_token, "bad token")
        # a different random model from the tiny policy (seed 1), vocabulary with the tag
        if name == TINY_RANDOM:
            self.model = tiny_random_model(vocab_size=len(self.tokenizer),
                                           seed=1).to(device).eval().requires_grad_(False)
        else:
            # a 7B PRM in fp32 is 28 GB
            dtype = torch.float32 if autocast_dtype is None else autocast_dtype
            self.model = load_reference(name, dtype=dtype, device=device)
        self.autocast_dtype, self.batch_size = autocast_dtype, batch_size

    def text(self, question, steps):
        """OpenR's PRM input: 'question\\nstep_1 ки\\nstep_2 ки...', ending with the newest step's
        tag. A tag that the policy wrote itself is removed, so it can't add a position the PRM would
        be read at."""
        return question + "\n" + "\n".join(f"{step.replace(self.step_tag, '').strip()} "
                                           f"{self.step_tag}" for step in steps)

    def __call__(self, questions, steps):
        """Scores in (0, 1) of the newest step of each (question, steps so far)."""
        rows = [self.tokenizer(self.text(q, s))["input_ids"] for q, s in zip(questions, steps)]
        if any(row[-1] != self.tag_id for row in rows):
            raise UsageError(
                f"the PRM's tokenizer does not end {self.text(questions[0], steps[0])[-40:]!r} "
                "with the step tag's "
                f"token {self.tag_id}: it merges the tag with the text before it. Pass "
                "--prm_step_tag as the "
                f"token your PRM was trained with (Math-Shepherd: 'ки').")
        return torch.cat([prm_scores(self.model, rows[i:i + self.batch_size], self.tag_id,
                                     self.good_id,
                                     self.bad_id, self.tokenizer.pad_token_id,
                                     self.autocast_dtype).cpu()
                          for i in range(0, len(rows), self.batch_size)])


# ------------------------------------------------------------------------------------------------
# A segment of the episodes that run side by side (appo.py, tppo.py)
# ------------------------------------------------------------------------------------------------
@dataclass
class Segment:
    """num_envs x num_steps transitions. Row k * num_steps + t of `gen` is env k's step t."""
    # prompt = the observation, response = the action (its newline or EOS token included)
    gen: Generation
    rewards: torch.Tensor  # [E, T] the reward of each step (PRM score or verifier)
    # [E, T] 1 where the episode ended at that step (the next obs is a new problem)
    dones: torch.Tensor
    # [E] token ids of each env's observation after the last step: V there bootstraps the cut
    next_obs: list
    prm_rewards: torch.Tensor  # [E, T] the PRM's part of the reward (NaN without a PRM)
    texts: list  # [E * T] decoded actions
    episodes: list  # one dict per episode that ended in this segment
    indices: list  # [E][T] the problem each step was played on


@torch.no_grad()
def play_segment(envs, policy, tokenizer, update, num_steps, max_new_tokens, temperature=1.0,
                 top_p=1.0, autocast=contextlib.nullcontext(), fast=True, prm=None,
                 outcome_reward_coef=0.0):
    """Play num_steps steps in every env of `envs` (common/env/stepwise.py's StepwiseEnvs) with the
    policy, sampling under `autocast` (--bf16), with the sampler's speedups unless fast is False
    (--plain); with a PRM, its score of each step (plus outcome_reward_coef for a right answer) is
    the step's reward. Each sample's seed is made of (seed, env step, global env): 1 process and N
    processes play exactly the same episodes. -> a Segment"""
    E, T, tok = len(envs), num_steps, tokenizer
    eos = set(eos_token_ids(policy, tok))
    obs_ids, actions, logprobs, texts, truncated, indices = (
        [[None] * T for _ in range(E)] for _ in range(6))
    rewards, dones = torch.zeros(E, T), torch.zeros(E, T)
    prm_rewards = torch.full((E, T), math.nan)
    episodes = []
    device = next(policy.parameters()).device
    # an episode's next state is its last one plus the line just sampled: read only the new
    # tokens (this segment only: the policy's weights change at the next update)
    prefix_cache = PrefixCache()
    for t in range(T):
        prompts = encode_prompts(tok, envs.obs)
        seeds = [sample_seed(envs.seed, update * T + t, envs.first + k) for k in range(E)]
        with autocast, fast_decoding(policy, prefix_cache, enabled=fast) as decoder:
            gen = generate(policy, tok, prompts, max_new_tokens, temperature, top_p,
                           stop_strings=("\n",), seeds=seeds, decoder=decoder)
        decoder.remember(gen)
        correct = torch.zeros(E)
        for k in range(E):
            keep = gen.response_mask[k].bool()
            ids, lps = gen.response_ids[k][keep].tolist(), gen.logprobs[k][keep].tolist()
            obs_ids[k][t], actions[k][t], logprobs[k][t] = prompts[k], ids, lps
            indices[k][t] = envs.envs[k].index
            truncated[k][t] = bool(gen.truncated[k])
            texts[k][t] = tok.decode(ids, skip_special_tokens=True)
            rewards[k, t], done, correct[k], _ = envs.step(k, texts[k][t], ids[-1] in eos)
            dones[k, t] = float(done)
        # CRUCIAL: the PRM's score of the newest step replaces the env's reward
        if prm is not None:
            prm_rewards[:, t] = prm(envs.questions(), [env.steps for env in envs.envs])
            rewards[:, t] = prm_rewards[:, t] + outcome_reward_coef * correct
        episodes += envs.end_step(rewards[:, t].tolist())
    flat = [(obs_ids[k][t], actions[k][t], logprobs[k][t],
             truncated[k][t]) for k in range(E) for t in range(T)]
    prompt_ids, prompt_mask = left_pad([f[0] for f in flat], tok.pad_token_id)
    response_ids, response_mask = right_pad([f[1] for f in flat], tok.pad_token_id)
    truncated = torch.tensor([f[3] for f in flat])  # hit max_new_tokens before a newline or EOS
    gen = Generation(prompt_ids, prompt_mask, response_ids, response_mask,
                     right_pad([f[2] for f in flat], 0.0, torch.float)[0], ~truncated,
                     truncated)
    gen = Generation(*(x.to(device) for x in vars(gen).values()))
    return Segment(gen, rewards.to(device), dones.to(device), encode_prompts(tok, envs.obs),
                   prm_rewards.to(device), [x for row in texts for x in row], episodes, indices)


def trim_left_padding(input_ids, attention_mask):
    """Drop the leading columns that are padding in every row (observations differ a lot in
    length)."""
    first = int(attention_mask.any(0).long().argmax())
    return input_ids[:, first:], attention_mask[:, first:]


# ------------------------------------------------------------------------------------------------
# Whole episodes, k per problem, with a calculator (reinforce_stepwise.py: LLM_RL's few-shot
# stepwise math policy)
# ------------------------------------------------------------------------------------------------
@dataclass
class Action:
    """One line of a stepwise episode: sampled and calculator tokens in the order the policy saw."""
    ids: list = field(default_factory=list)
    logprobs: list = field(default_factory=list)  # the sampler's log-probs; 0 on calculator tokens
    policy_mask: list = field(default_factory=list)  # 1 on sampled tokens, 0 on calculator tokens
    fired: int = 0
    refused: int = 0


def sample_line(sample, tokenizer, prompts, keys, max_new_tokens, sym_calc, eos_ids):
    """One action (a line) for each prompt. sample(prompts, max_new_tokens, keys) -> [(token ids,
    log-probs)] ends each row at a newline, EOS or (with sym_calc) '>>'; keys[i] + (call,) names row
    i's sampling seed. With sym_calc, a row stopped by a closed <<expr>> gets the value's tokens
    appended and is sampled again."""
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
            a.ids, a.logprobs = a.ids + ids, a.logprobs + logprobs
            a.policy_mask = a.policy_mask + [1] * len(ids)
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
                # CRUCIAL: the calculator's tokens are context for what follows, but not the
                # policy's choice: policy_mask 0 keeps them out of the loss (and out of the KL).
                a.ids, a.logprobs = a.ids + value_ids, a.logprobs + [0.0] * len(value_ids)
                a.policy_mask = a.policy_mask + [0] * len(value_ids)
                a.fired += 1
            if len(a.ids) < max_new_tokens:
                again.append(i)  # the line goes on after the '>>' (and the value, if any)
        rows = again
        if not rows:
            break
    return actions


def policy_sampler(policy, tokenizer, temperature, top_p, seed_of, sym_calc,
                   autocast=contextlib.nullcontext(), fast=True):
    """The `sample` of `sample_line` with the policy: keys (episode, step, call) -> seeds via
    seed_of (None: torch's global RNG, or greedy at temperature 0). Make one per rollout: it keeps
    what the policy has read (`PrefixCache`), and each line (or calculator call) reads only the
    tokens added since. fast False (--plain): the plain decoder, which reads every prompt whole."""
    stops = ("\n", ">>") if sym_calc else ("\n",)
    prefix_cache = PrefixCache()

    def sample(prompts, max_new_tokens, keys):
        seeds = None if seed_of is None else [seed_of(*key) for key in keys]
        with autocast, fast_decoding(policy, prefix_cache, enabled=fast) as decoder:
            gen = generate(policy, tokenizer, prompts, max_new_tokens, temperature, top_p,
                           stop_strings=stops, seeds=seeds, decoder=decoder)
        decoder.remember(gen)
        return [(ids[m].tolist(), lp[m].tolist()) for ids, lp, m in
                zip(gen.response_ids.cpu(), gen.logprobs.cpu(), gen.response_mask.cpu().bool())]
    return sample


@dataclass
class Episodes(Rollout):
    """N episodes of steps (single-turn: one step each), a Rollout whose `gen` has one row per
    step, [state ; action], episode by episode; texts are the whole responses, scores the summed
    rewards."""
    loss_mask: torch.Tensor  # [n, R] the response mask with calculator tokens zeroed
    rewards: torch.Tensor  # [N, T]
    step_mask: torch.Tensor  # [N, T] 1 where episode i took step t
    truncated: torch.Tensor  # [N] out of tokens (single-turn) or of lines (stepwise) unanswered
    calc_fired: float = 0.0  # calculator values written, per episode
    calc_refused: float = 0.0  # <<...>> spans that were not arithmetic, per episode

    @classmethod
    def single_turn(cls, rollout):
        """One-step episodes from a rollout of whole responses."""
        gen, scores = rollout.gen, rollout.scores
        return cls(**vars(rollout), loss_mask=gen.response_mask, rewards=scores[:, None],
                   step_mask=torch.ones_like(scores[:, None]), truncated=gen.truncated)


def play_episodes(sample, tokenizer, env, indices, group_size, max_new_tokens, sym_calc, device,
                  eos_ids):
    """Play k = group_size episodes per problem of the stepwise `env`, one line per step, all live
    episodes in one batch: at most env.max_steps lines of max_new_tokens tokens each, with the
    calculator if sym_calc."""
    episodes = [copy.copy(env) for _ in range(len(indices) * group_size)]  # shared problems
    states = [ep.reset(indices[k // group_size]) for k, ep in enumerate(episodes)]
    N, T = len(episodes), env.max_steps
    rewards, step_mask = torch.zeros(N, T), torch.zeros(N, T)
    correct, finished = torch.zeros(N), torch.zeros(N, dtype=torch.bool)
    steps = []  # (episode, t, state ids, Action)
    for t in range(T):
        live = [k for k, ep in enumerate(episodes) if not ep.done]
        if not live:
            break
        prompts = encode_prompts(tokenizer, [states[k] for k in live])
        actions = sample_line(sample, tokenizer, prompts, [(k, t) for k in live], max_new_tokens,
                              sym_calc, eos_ids)
        for k, prompt, action in zip(live, prompts, actions):
            ep = episodes[k]
            text = tokenizer.decode(action.ids, skip_special_tokens=True)
            states[k], rewards[k, t], done, info = ep.step(text)
            ended = action.ids[-1] in eos_ids
            # the reply closed without the answer phrase: grade what it wrote
            if ended and not done:
                rewards[k, t], info = ep.score("\n".join(ep.steps), ep.index)
                ep.done = True
            step_mask[k, t], correct[k] = 1.0, float(info["correct"])
            finished[k] = ended or bool(ep.task.final_answer.search(ep.steps[-1]))
            steps.append((k, t, prompt, action))
    steps.sort(key=lambda s: s[:2])  # CRUCIAL: episode by episode, the order of rewards[step_mask]
    actions = [s[3] for s in steps]
    prompt_ids, prompt_mask = left_pad([s[2] for s in steps], tokenizer.pad_token_id)
    # calculator tokens attended...
    response_ids, response_mask = right_pad([a.ids for a in actions], tokenizer.pad_token_id)
    loss_mask, _ = right_pad([a.policy_mask for a in actions], 0)  # ...but not learned from
    truncated = torch.tensor([len(a.ids) >= max_new_tokens for a in actions])
    gen = Generation(prompt_ids, prompt_mask, response_ids, response_mask,
                     right_pad([a.logprobs for a in actions], 0.0, torch.float)[0], ~truncated,
                     truncated)
    gen = Generation(*(x.to(device) for x in vars(gen).values()))
    rewards = rewards.to(device)
    return Episodes(gen, ["\n".join(ep.steps) for ep in episodes], rewards.sum(1),
                    correct.to(device), list(indices), loss_mask=loss_mask.to(device),
                    rewards=rewards, step_mask=step_mask.to(device),
                    truncated=(~finished).to(device), calc_fired=sum(a.fired for a in actions) / N,
                    calc_refused=sum(a.refused for a in actions) / N)
