"""Stepwise rollouts for action-level RL (appo.py, tppo.py): one action is one line of text, a few episodes run
side by side and carry over from one rollout segment to the next, and a process reward model (PRM) can score
every step. Plumbing only: advantages, losses and updates stay in the algorithm files.

    prm = ProcessRewardModel("peiyi9979/math-shepherd-mistral-7b-prm")      # or "tiny-random" for tests
    envs = StepwiseEnvs(env, tokenizer, num_envs=4, first_env=0, total_envs=4, seed=0, prm=prm)
    segment = envs.collect(policy, update=0, num_steps=8, max_new_tokens=48, temperature=0.7)
    segment.gen.sequences()      # [obs ; action] of the 4 x 8 transitions, row k * 8 + t = env k, step t

Generation reuses the KV cache of the observation for every token of the action (common.models.generate), but
not across steps: each step re-encodes the observation as text. Reusing it would need per-row cache surgery,
because the envs reset at different times and the env normalises whitespace at the step boundary; the prefill
it would save costs about one no-grad forward over the segment, less than the training forwards.
"""

import copy
import math
from dataclasses import dataclass

import torch

from common.models import (TINY_RANDOM, Generation, check_model_name, encode_prompts, eos_token_ids, generate,
                           left_pad, load_reference, load_tokenizer, tiny_random_model)
from common.utils import position_ids_from_mask, sample_seed

# ---------------------------------------------------------------------------------------------------------
# Process reward model (Math-Shepherd style)
# ---------------------------------------------------------------------------------------------------------
MATH_SHEPHERD = {"step_tag": "ки", "good_token": "+", "bad_token": "-"}


def single_token_id(tokenizer, text, what):
    """The id of `text` if the tokenizer makes it exactly one token, else a ValueError naming the fix."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) != 1:
        raise ValueError(
            f"the PRM {what} {text!r} is {len(ids)} tokens for the PRM's tokenizer ({ids}); the PRM reads one "
            f"logit at one position, so it must be a single token. Pass the tokens your PRM was trained with, "
            f"e.g. --prm_step_tag 'ки' --prm_good_token '+' --prm_bad_token '-' (Math-Shepherd) or "
            f"--prm_step_tag $'\\n\\n\\n\\n\\n' --prm_good_token ' +' --prm_bad_token ' -' (OpenR's Qwen PRM).")
    return ids[0]


def load_prm_tokenizer(name, step_tag):
    """The PRM's tokenizer. For "tiny-random" the step tag is added as a new token when the embedded tokenizer
    splits it (it splits 'ки'), as Math-Shepherd's tokenizer has it as one token."""
    check_model_name(name)
    tokenizer = load_tokenizer(name)
    if name == TINY_RANDOM and len(tokenizer.encode(step_tag, add_special_tokens=False)) != 1:
        tokenizer.add_tokens([step_tag])
    return tokenizer


@torch.no_grad()
def prm_scores(model, input_ids, tag_id, good_id, bad_id, pad_id, autocast_dtype=None):
    """P(good) against bad at the LAST step tag of each row: softmax over the two candidate logits there.

    input_ids: list of token-id lists, each holding at least one `tag_id`. Returns [B] float32 scores.
    """
    device = next(model.parameters()).device
    ids, mask = left_pad(input_ids, pad_id)
    ids, mask = ids.to(device), mask.to(device)  # [B, T]
    is_tag = (ids == tag_id) & mask.bool()
    if not bool(is_tag.any(1).all()):
        raise ValueError("a PRM input holds no step tag: every step must end with the tag token")
    cols = torch.arange(ids.shape[1], device=device)
    # CRUCIAL: the newest tag is the last tag position, which is not always the last token of the row.
    last_tag = torch.where(is_tag, cols, -1).max(dim=1).values  # [B]
    autocast = torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None)
    with autocast:
        logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits
    at_tag = logits[torch.arange(ids.shape[0], device=device), last_tag].float()  # [B, V]
    return torch.softmax(at_tag[:, [good_id, bad_id]], dim=-1)[:, 0]


class ProcessRewardModel:
    """A causal-LM PRM, Math-Shepherd style: the input is the question and the steps so far, each followed by the
    step tag, and the reward of the newest step is P(good_token) / (P(good_token) + P(bad_token)) at its tag."""

    def __init__(self, name, step_tag="ки", good_token="+", bad_token="-", device="cpu", autocast_dtype=None,
                 batch_size=16):
        self.tokenizer = load_prm_tokenizer(name, step_tag)
        self.step_tag = step_tag
        self.tag_id = single_token_id(self.tokenizer, step_tag, "step tag")
        self.good_id = single_token_id(self.tokenizer, good_token, "good token")
        self.bad_id = single_token_id(self.tokenizer, bad_token, "bad token")
        if name == TINY_RANDOM:  # a different random model from the tiny policy (seed 1), vocabulary with the tag
            self.model = tiny_random_model(vocab_size=len(self.tokenizer), seed=1).to(device).eval().requires_grad_(False)
        else:
            dtype = torch.float32 if autocast_dtype is None else autocast_dtype  # a 7B PRM in fp32 is 28 GB
            self.model = load_reference(name, dtype=dtype, device=device)
        self.autocast_dtype, self.batch_size = autocast_dtype, batch_size

    def text(self, question, steps):
        """OpenR's PRM input: 'question\\nstep_1 ки\\nstep_2 ки...', ending with the newest step's tag. A tag that the
        policy wrote itself is removed, so it can't add a position the PRM would be read at."""
        return question + "\n" + "\n".join(f"{step.replace(self.step_tag, '').strip()} {self.step_tag}" for step in steps)

    def __call__(self, questions, steps):
        """Scores in (0, 1) of the newest step of each (question, steps so far)."""
        rows = [self.tokenizer(self.text(q, s))["input_ids"] for q, s in zip(questions, steps)]
        if any(row[-1] != self.tag_id for row in rows):
            raise ValueError(
                f"the PRM's tokenizer does not end {self.text(questions[0], steps[0])[-40:]!r} with the step tag's "
                f"token {self.tag_id}: it merges the tag with the text before it. Pass --prm_step_tag as the "
                f"token your PRM was trained with (Math-Shepherd: 'ки').")
        return torch.cat([prm_scores(self.model, rows[i:i + self.batch_size], self.tag_id, self.good_id,
                                     self.bad_id, self.tokenizer.pad_token_id, self.autocast_dtype).cpu()
                          for i in range(0, len(rows), self.batch_size)])


# ---------------------------------------------------------------------------------------------------------
# Parallel stepwise episodes
# ---------------------------------------------------------------------------------------------------------
@dataclass
class Segment:
    """num_envs x num_steps transitions. Row k * num_steps + t of `gen` is env k's step t."""
    gen: Generation  # prompt = the observation, response = the action (its newline or EOS token included)
    rewards: torch.Tensor  # [E, T] the reward of each step (PRM score or verifier)
    dones: torch.Tensor  # [E, T] 1 where the episode ended at that step (the next obs is a new problem)
    next_obs: list  # [E] token ids of each env's observation after the last step: V there bootstraps the cut
    prm_rewards: torch.Tensor  # [E, T] the PRM's part of the reward (NaN without a PRM)
    texts: list  # [E * T] decoded actions
    episodes: list  # one dict per episode that ended in this segment
    indices: list  # [E][T] the problem each step was played on


def problem_index(position, num_problems, seed):
    """The problem at `position` of an endless stream: a seeded permutation per pass over the problems."""
    epoch, offset = divmod(position, num_problems)
    perm = torch.randperm(num_problems, generator=torch.Generator().manual_seed(seed * 7919 + epoch))
    return int(perm[offset])


class StepwiseEnvs:
    """`num_envs` stepwise episodes played side by side (OpenR's vector env). An episode that ends is reset at
    once on the next problem, and episodes carry over from one segment to the next.

    Under torchrun this rank owns the global envs first_env .. first_env + num_envs - 1 of total_envs. Global env
    g plays its e-th episode on problem e * total_envs + g of a seeded stream, and samples with a seed made of
    (seed, env step, g): 1 process and N processes play exactly the same episodes.
    """

    def __init__(self, env, tokenizer, num_envs, first_env, total_envs, seed, prm=None, outcome_reward_coef=0.0):
        if not env.stepwise:
            raise ValueError("StepwiseEnvs needs an env made with stepwise=True")
        self.envs = [copy.copy(env) for _ in range(num_envs)]  # one episode state each, shared problems
        self.tokenizer, self.first, self.total, self.seed = tokenizer, first_env, total_envs, seed
        self.prm, self.outcome_reward_coef = prm, outcome_reward_coef
        self.episode = [0] * num_envs  # episodes started by each env
        self.step_rewards = [[] for _ in range(num_envs)]  # rewards of the running episode, for logging
        self.obs = [self._reset(k) for k in range(num_envs)]

    def _reset(self, k):
        index = problem_index(self.episode[k] * self.total + self.first + k, len(self.envs[k]), self.seed)
        self.episode[k] += 1
        self.step_rewards[k] = []
        return self.envs[k].reset(index)

    @torch.no_grad()
    def collect(self, policy, update, num_steps, max_new_tokens, temperature=1.0, top_p=1.0, autocast_dtype=None):
        """Play num_steps steps in every env with the policy; returns a Segment."""
        E, T, tok = len(self.envs), num_steps, self.tokenizer
        eos = set(eos_token_ids(policy, tok))
        obs_ids, actions, logprobs, texts, truncated, indices = ([[None] * T for _ in range(E)] for _ in range(6))
        rewards, dones = torch.zeros(E, T), torch.zeros(E, T)
        prm_rewards = torch.full((E, T), math.nan)
        episodes = []
        device = next(policy.parameters()).device
        for t in range(T):
            prompts = encode_prompts(tok, self.obs)
            seeds = [sample_seed(self.seed, update * T + t, self.first + k) for k in range(E)]
            gen = generate(policy, tok, prompts, max_new_tokens, temperature, top_p, stop_strings=("\n",),
                           seeds=seeds, autocast_dtype=autocast_dtype)
            correct = torch.zeros(E)
            for k, env in enumerate(self.envs):
                keep = gen.response_mask[k].bool()
                ids, lps = gen.response_ids[k][keep].tolist(), gen.logprobs[k][keep].tolist()
                obs_ids[k][t], actions[k][t], logprobs[k][t], indices[k][t] = prompts[k], ids, lps, env.index
                truncated[k][t] = bool(gen.truncated[k])
                texts[k][t] = tok.decode(ids, skip_special_tokens=True)
                self.obs[k], rewards[k, t], done, info = env.step(texts[k][t])
                if ids[-1] in eos and not done:  # the policy closed its reply without the answer phrase:
                    rewards[k, t], info = env.score("\n".join(env.steps), env.index)  # grade what it wrote
                    env.done = done = True
                dones[k, t], correct[k] = float(done), float(done and info["correct"])
            if self.prm is not None:  # CRUCIAL: the PRM's score of the newest step replaces the env's reward
                questions = [env.examples[env.index]["question"] for env in self.envs]
                prm_rewards[:, t] = self.prm(questions, [env.steps for env in self.envs])
                rewards[:, t] = prm_rewards[:, t] + self.outcome_reward_coef * correct
            for k, env in enumerate(self.envs):
                self.step_rewards[k].append(rewards[k, t].item())
                if dones[k, t]:
                    example = env.examples[env.index]
                    episodes.append({"question": example["question"], "answer": example["answer"],
                                     "response": "\n".join(env.steps), "correct": bool(correct[k]),
                                     "steps": len(env.steps), "rewards": self.step_rewards[k]})
                    self.obs[k] = self._reset(k)
        flat = [(obs_ids[k][t], actions[k][t], logprobs[k][t], truncated[k][t]) for k in range(E) for t in range(T)]
        prompt_ids, prompt_mask = left_pad([f[0] for f in flat], tok.pad_token_id)
        R = max(len(f[1]) for f in flat)

        def right_pad(rows, value, dtype):
            return torch.tensor([r + [value] * (R - len(r)) for r in rows], dtype=dtype)

        response_mask = right_pad([[1] * len(f[1]) for f in flat], 0, torch.long)
        truncated = torch.tensor([f[3] for f in flat])  # hit max_new_tokens before a newline or EOS
        gen = Generation(prompt_ids, prompt_mask, right_pad([f[1] for f in flat], tok.pad_token_id, torch.long),
                         response_mask, right_pad([f[2] for f in flat], 0.0, torch.float), ~truncated, truncated)
        gen = Generation(*(x.to(device) for x in vars(gen).values()))
        return Segment(gen, rewards.to(device), dones.to(device), encode_prompts(tok, self.obs),
                       prm_rewards.to(device), [x for row in texts for x in row], episodes, indices)

    def state_dict(self):
        """What --resume needs to continue the running episodes exactly: problem, steps so far, counters."""
        return [{"episode": self.episode[k], "index": env.index, "steps": list(env.steps),
                 "step_rewards": list(self.step_rewards[k])} for k, env in enumerate(self.envs)]

    def load_state_dict(self, states):
        """states: this rank's envs, in order. The running episodes are replayed step by step."""
        for k, (env, state) in enumerate(zip(self.envs, states)):
            self.episode[k], self.step_rewards[k] = state["episode"], list(state["step_rewards"])
            self.obs[k] = env.reset(state["index"])
            for step in state["steps"]:
                self.obs[k] = env.step(step)[0]


def trim_left_padding(input_ids, attention_mask):
    """Drop the leading columns that are padding in every row (observations differ a lot in length)."""
    first = int(attention_mask.any(0).long().argmax())
    return input_ids[:, first:], attention_mask[:, first:]
