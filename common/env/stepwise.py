"""Stepwise episodes, the env's side: one action is one line of text. `StepwiseEnvs` keeps a few
episodes side by side (OpenR's vector env, for appo.py and tppo.py): each carries over from one
rollout segment to the next, and one that ends is reset at once on the next problem. The lines
are sampled by the policy in common/models/stepwise.py, which also has the process reward model.
Here too: the calculator a line may call (reinforce_stepwise.py), and the system prompt that asks
for one step per line.

    envs = StepwiseEnvs(env, num_envs=4, first_env=0, total_envs=4, seed=0)
    envs.obs[k]                                     # env k's state: its episode so far
    reward, done, correct, cut = envs.step(k, line, ended)
    episodes = envs.end_step(rewards)               # the episodes that ended, each reset
"""

import copy
import re

from common.env.answers import safe_arith
from common.env.math_env import problem_index
from common.env.tasks import TASKS


class StepwiseEnvs:
    """`num_envs` stepwise episodes played side by side. Under torchrun this rank owns the global
    envs first_env .. first_env + num_envs - 1 of total_envs. Global env g plays its e-th episode
    on problem e * total_envs + g of a seeded stream, so 1 process and N processes play the same
    problems (the samples' seeds are made of the same g, common/models/stepwise.py)."""

    def __init__(self, env, num_envs, first_env, total_envs, seed):
        if not env.stepwise:
            raise ValueError("StepwiseEnvs needs an env made with stepwise=True")
        # one episode state each, shared problems
        self.envs = [copy.copy(env) for _ in range(num_envs)]
        self.first, self.total, self.seed = first_env, total_envs, seed
        self.episode = [0] * num_envs  # episodes started by each env
        self.step_rewards = [[] for _ in range(num_envs)]  # the running episode's, for its log
        self.last = [(False, 0.0, 0.0)] * num_envs  # (done, correct, cut) of each last step
        self.obs = [self._reset(k) for k in range(num_envs)]

    def __len__(self):
        return len(self.envs)

    def _reset(self, k):
        index = problem_index(self.episode[k] * self.total + self.first + k, len(self.envs[k]),
                              self.seed)
        self.episode[k] += 1
        self.step_rewards[k] = []
        return self.envs[k].reset(index)

    def step(self, k, line, ended):
        """Env k takes `line`; `ended`: the policy closed its reply (EOS) there. -> (reward, done,
        correct, cut), each a float but done."""
        env = self.envs[k]
        self.obs[k], reward, done, info = env.step(line)
        if ended and not done:  # the reply closed without the answer phrase: grade what it wrote
            reward, info = env.score("\n".join(env.steps), env.index)
            env.done = done = True
        self.last[k] = (done, float(done and info["correct"]), float(info.get("cut", False)))
        return reward, *self.last[k]

    def end_step(self, rewards):
        """After every env's step, its final reward each (a PRM's may replace the env's): the
        episodes that ended, as records for the logs, each env reset on its next problem."""
        ended = []
        for k, env in enumerate(self.envs):
            self.step_rewards[k].append(rewards[k])
            done, correct, cut = self.last[k]
            if done:
                example = env.examples[env.index]
                ended.append({"question": example["question"], "answer": example["answer"],
                              "response": "\n".join(env.steps), "correct": bool(correct),
                              "steps": len(env.steps), "cut": bool(cut),
                              "rewards": self.step_rewards[k]})
                self.obs[k] = self._reset(k)
        return ended

    def questions(self):
        """The question each env's episode is on."""
        return [env.examples[env.index]["question"] for env in self.envs]

    def state_dict(self):
        """What --resume needs to continue the running episodes exactly: problem, steps so far,
        counters."""
        return [{"episode": self.episode[k], "index": env.index, "steps": list(env.steps),
                 "step_rewards": list(self.step_rewards[k])} for k, env in enumerate(self.envs)]

    def load_state_dict(self, states):
        """states: this rank's envs, in order. The running episodes are replayed step by step."""
        for k, (env, state) in enumerate(zip(self.envs, states)):
            self.episode[k], self.step_rewards[k] = state["episode"], list(state["step_rewards"])
            self.obs[k] = env.reset(state["index"])
            for step in state["steps"]:
                self.obs[k] = env.step(step)[0]


# ------------------------------------------------------------------------------------------------
# The calculator of a line (reinforce_stepwise.py: LLM_RL's few-shot stepwise math policy)
# ------------------------------------------------------------------------------------------------
MAX_CALCS = 4  # calculator interruptions per line, as in the seed
CALC_SPAN = re.compile(r"<<([^<>\n]*)>>[^<>\n]*$")  # a <<...>> span that the last token closed
STEP_HINT = " Write one step per line."
CALC_HINT = (" For a calculation write <<expression>>: a calculator writes its value right after, "
             "e.g. <<12*7>>84.")


def stepwise_system_prompt(task, sym_calc):
    """The task's system prompt, asking for one step per line and, with the calculator, for its
    syntax."""
    if task not in TASKS:
        return None  # make_env names the registered tasks
    prompt = TASKS[task].system_prompt
    prompt += "" if "one step per line" in prompt else STEP_HINT
    return prompt + (CALC_HINT if sym_calc else "")


def calculator(expr):
    """The text a calculator writes for the inside of <<expr>> or <<expr=...>>: '24', '3.5', '0.33'
    (2 decimals at most, as the seed rounds), or None if expr is not arithmetic. safe_arith walks an
    AST whitelist: model text is never run."""
    value = safe_arith(expr.split("=")[0])
    if value is None:
        return None
    if value.denominator == 1:
        return str(value.numerator)
    return f"{float(value):.2f}".rstrip("0").rstrip(".")
