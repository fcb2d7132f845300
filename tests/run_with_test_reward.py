"""Runs an algorithm file with a test reward instead of the task's verifier, chosen by $TEST_REWARD:

- "length" (the default): (len(response) % 5) / 4, a reward that varies even for the tiny random
  model, so that
  distributed and resume tests compare non-trivial updates;
- "lowercase": the fraction of the response's characters that are lowercase ASCII letters, which the
  tiny random
  model can learn to raise within a few dozen updates (the learning tests);
- "tool_then_text": 1 where the response closed a tool call (tools.py ran it) and then wrote on,
  else 0 (the response is the model's own text: the tool's answer is not in it);
- "nan_at:K": the length reward, except NaN for the K-th response graded in this process (0-based);
- "tie_on_rank:K": the length reward, except 0.5 for every response of rank K (under torchrun), so
  that its prompts all tie; "tie": 0.5 everywhere.

$TEST_CORRECT=parity also grades the held-out evaluation's responses by their length: correct when
it is even, the "answer" being the parity, so that accuracies, avg@k, pass@k and maj@k vary even
for the tiny random model.

usage: TEST_REWARD=lowercase python tests/run_with_test_reward.py grpo --model_name_or_path
tiny-random ... (torchrun works too)
"""

import importlib
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.env import math_env as envlib  # noqa: E402
from common.run.args import parse_args  # noqa: E402

GRADED = [0]  # responses graded so far in this process (module level: stepwise files copy the env)


def test_reward(action, count=True):
    mode = os.environ.get("TEST_REWARD", "length")
    GRADED[0] += count
    if mode == "lowercase":
        return sum("a" <= c <= "z" for c in action) / max(1, len(action))
    if mode == "uppercase":
        return sum("A" <= c <= "Z" for c in action) / max(1, len(action))
    if mode == "first_upper":
        return float("A" <= action[:1] <= "Z")
    if mode == "tool_then_text":
        return float(action.partition("</calc>")[2].strip() != "")
    if mode.startswith("nan_at:") and GRADED[0] - 1 == int(mode.split(":")[1]):
        return float("nan")
    if mode == "tie" or mode == f"tie_on_rank:{os.environ.get('RANK', '0')}":
        return 0.5
    return (len(action) % 5) / 4


class TestRewardEnv(envlib.MathEnv):
    def step(self, action):
        # single-turn, step() grades the response with verify() below
        obs, reward, done, info = super().step(action)
        return obs, test_reward(action) if self.stepwise else reward, done, info

    def verify(self, response, index):  # what score() and score_all() call for each response
        reward, info = super().verify(response, index)
        if os.environ.get("TEST_CORRECT") == "parity":
            info = {**info, "correct": len(response) % 2 == 0, "pred": str(len(response) % 2),
                    "format_ok": True}
        if self.stepwise:
            # an episode that the policy closes with EOS is graded here, after step() rewarded its
            # last step (and counted it): the same reward, not the verifier's
            return test_reward(response.split("\n")[-1], count=False), info
        return test_reward(response), info


MAKE_ENV = envlib.make_env


def make_env(task, split="train", **options):
    env = MAKE_ENV(task, split, **options)
    # a subclass, not a patched method: copies of the env (stepwise) keep it
    env.__class__ = TestRewardEnv
    return env


if __name__ == "__main__":
    algo = importlib.import_module(sys.argv[1])
    envlib.make_env = make_env  # what common.env.math_env.make_envs calls
    algo.main(parse_args(algo.Args, sys.argv[2:]))
