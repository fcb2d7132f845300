"""Every algorithm learns: the tiny random model, rewarded when its response (stepwise files: each
step) starts with an uppercase letter, raises that reward from its starting rate (about 0.08) to
near 1 within 30 updates (ppo.py: 40, as its critic learns first and it draws 16 samples an update,
not 32: at seed 0 its reward reaches 1.0 at update 33; tppo.py: 40, as where its rise starts at seed 0
moves with fp32 rounding: update 19-24 before the shared-prefix forward, 26 on 2 threads and 31 on 1
thread after it, whose first 7 updates agree with the old ones to 1e-6; appo.py: 40, likewise: its
rise starts at update 15 with transformers 5.24 and at 30 with 5.17, which rounds somewhere
differently; on 2 threads, without xdist, appo's reward collapses to 0 from update 14 at 5e-2;
online_dpo.py: 20, 16 prompts x 2 samples: at seed 0 its reward reaches 1.0 at update 8;
async_grpo.py: 30, sampled 1 update behind with TIS and 2 behind with IcePop, where at seed 0 the
reward reaches 1.0 at updates 13 and 19, against grpo.py's 10: staleness delays the rise,
bench/staleness_lab.py; reinforce_stepwise.py: episodes of 2 lines, each rewarded, with the
seed's estimator: the reward is 2.0 from update 13 at seed 0).

This is the test that catches a flipped sign, a detached tensor or a wrong mask in any file: with
any of them the reward stays at its starting rate or falls. The tiny model's next-token distribution
is close to uniform over 49k tokens, so it learns only by repeating the few rewarded first tokens it
happens to sample; that needs a large learning rate (5e-2; at 1e-2 nothing moves in 30 updates, at
2e-1 the model breaks). About 10-20 s per file on 2 cores.
"""

import json
import os
import sys
from pathlib import Path

import pytest

from dev.algorithms import ALGORITHMS
import warm  # tests/warm.py: `python X.py` runs forked from a warm process

ROOT = Path(__file__).resolve().parents[1]
SIZES = {  # each file's own batch shape, small enough for ~0.5 s per update, and its updates
    "grpo": ["--num_prompts", "4", "--num_generations", "8", "--max_steps", "30"],
    "reinforce": ["--num_prompts", "4", "--num_generations", "8", "--max_steps", "30"],
    # episodes of 2 lines, each rewarded, so the reward starts near twice the others'; the seed's
    # estimator, no baseline (at seed 0 the reward is 2.0 from update 13)
    "reinforce_stepwise": ["--num_prompts", "4", "--num_generations", "8", "--max_steps", "30",
                           "--max_episode_steps", "2", "--baseline", "none"],
    "ppo": ["--num_prompts", "16", "--max_steps", "40"],
    "appo": ["--max_steps", "40"],
    "tppo": ["--max_steps", "40"],
    "online_dpo": ["--num_prompts", "16", "--max_steps", "20"],
    # sampled 1 update behind, TIS (its defaults); and 2 behind, IcePop (async_grpo_k2)
    "async_grpo": ["--num_prompts", "4", "--num_generations", "8", "--max_steps", "30"],
    "async_grpo_k2": ["--num_prompts", "4", "--num_generations", "8", "--max_steps", "30",
                      "--max_staleness", "2", "--off_policy_correction", "icepop"],
    # 4 tokens cut nearly every response: overlong filtering would leave nothing to learn from
    "dapo": ["--num_prompts", "4", "--num_generations", "8", "--max_steps", "30",
             "--max_sampling_rounds", "2", "--no_mask_truncated_completions"],
    # on policy, grpo.py --loss_type dapo's update: at this learning rate (5e-2) a second,
    # off-policy minibatch drove CISPO's reward to 0 by update 10 (no trust region, only a cap)
    "cispo": ["--num_prompts", "4", "--num_generations", "8", "--max_steps", "30"],
    # two minibatches an update, so that the second is off policy and the gate acts; at 5e-2 the
    # reward fell to 0 and stayed there for seed 4 of seeds 0-5 (and for seed 0 on another CPU),
    # at 2e-2 it rose to at least 0.8 for each of seeds 0-9
    "sapo": ["--num_prompts", "4", "--num_generations", "8", "--max_steps", "30",
             "--num_mini_batches", "2", "--learning_rate", "2e-2"],
}


# distill.py learns from a teacher, not from a reward: tests/test_distill.py's learning test; sft.py
# from worked solutions: tests/test_sft.py's (its loss falls, its accuracy on arithmetic rises); tools.py
# has its own, on a model that can call a tool (tests/test_tools.py): on tiny-random it is grpo.py
# grpo.py's run in the first tier; the others, a minute together, in the second
@pytest.mark.parametrize("algo", [
    a if a == "grpo" else pytest.param(a, marks=pytest.mark.slow)
    for a in (*(a for a in ALGORITHMS if a not in ("distill", "tools", "sft")), "async_grpo_k2")])
def test_reward_rises_to_near_1(algo, tmp_path):
    cmd = [sys.executable, "tests/run_with_test_reward.py", algo.removesuffix("_k2"),
           "--model_name_or_path", "tiny-random",
           "--learning_rate", "5e-2", *SIZES[algo],  # before SIZES: a file's own may replace it
           "--max_new_tokens", "4", "--num_eval_problems", "0", "--num_few_shot", "0", "--temperature", "1.0",
           "--output_dir", str(tmp_path)]
    out = warm.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                   env={**os.environ, "TEST_REWARD": "first_upper"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    # logged by every file
    assert all(x["skipped_steps"] == 0 and x["reward/grader_timeouts"] == 0 for x in lines)
    rewards = [x["reward/mean"] for x in lines]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    # the starting rate: ~8 % of the tiny model's first tokens are uppercase, per rewarded line
    lines_rewarded = 2 if algo == "reinforce_stepwise" else 1
    assert first < 0.2 * lines_rewarded, rewards
    assert last > first + 0.5, rewards
