"""Runs an algorithm file with a reward that varies even for the tiny random model, so that distributed and
resume tests compare non-trivial updates: reward = (len(response) % 5) / 4.

usage: python tests/run_with_test_reward.py grpo --model_name_or_path tiny-random ...  (torchrun works too)
"""

import importlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from transformers import HfArgumentParser  # noqa: E402

from common import env as envlib  # noqa: E402


class TestRewardEnv(envlib.MathEnv):
    def step(self, action):
        obs, _, done, info = super().step(action)
        return obs, (len(action) % 5) / 4, done, info


def make_env(task, split="train", **options):
    env = envlib.make_env(task, split, **options)
    env.__class__ = TestRewardEnv  # a subclass, not a patched method: copies of the env (stepwise) keep it
    return env


if __name__ == "__main__":
    algo = importlib.import_module(sys.argv[1])
    algo.make_env = make_env
    algo.main(HfArgumentParser(algo.Args).parse_args_into_dataclasses(sys.argv[2:])[0])
