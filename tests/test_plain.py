"""--plain, the one switch of every file: the plain `Decoder` and `token_logprobs`' own lines, the path
docs/reading.md teaches and a debugger steps through. Every file passes it to each call that has a
fast form, and the plain path draws the same tokens and trains the same weights as the default, up to
float rounding: the same responses, and over two updates losses within 1e-5 of each other and gradient
norms within 0.1 % (fp32: the fast forms cut padding and read shared prompts once, so sums run in
another order; AdamW's step, about the learning rate whatever a gradient's size, then moves a weight
whose gradient is near 0 by a rounding's worth more or less)."""

import ast
import json
import os
import sys
from pathlib import Path

import pytest

from dev.algorithms import ALGORITHMS
import warm  # tests/warm.py: `python X.py` runs forked from a warm process

ROOT = Path(__file__).resolve().parents[1]
# each call that has a fast form, and the keyword that switches it
SWITCHED = {"fast_decoding": "enabled", "token_logprobs": "fast", "batched_token_logprobs": "fast",
            "play_segment": "fast", "policy_sampler": "fast"}


def unswitched(source):
    """Line numbers of the calls in `source` that take a fast form without `not args.plain`."""
    bad = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
        if name in SWITCHED:
            kw = {k.arg: ast.unparse(k.value) for k in node.keywords}
            if kw.get(SWITCHED[name]) != "not args.plain":
                bad.append(node.lineno)
    return sorted(bad)


@pytest.mark.parametrize("algo", ALGORITHMS)
def test_every_call_with_a_fast_form_takes_the_switch(algo):
    assert unswitched((ROOT / f"{algo}.py").read_text()) == []


def test_a_call_without_the_switch_is_found():
    source = ("def f(args):\n"
              "    with fast_decoding(policy, enabled=not args.plain) as d:\n"
              "        token_logprobs(policy, x, m, R, 1.0)\n"                      # 3
              "    play_segment(envs, policy, tok, 0, 4, 8, fast=True)\n"         # 4
              "    batched_token_logprobs(p, g, 1.0, 8, fast=not args.plain)\n")
    assert unswitched(source) == [3, 4]


def run(algo, flags, out):
    cmd = [sys.executable, "tests/run_with_test_reward.py", algo, "--model_name_or_path",
           "tiny-random", "--max_new_tokens", "8", "--num_eval_problems", "2", "--max_steps", "2",
           "--learning_rate", "1e-3", "--temperature", "1.0", *flags, "--output_dir", str(out)]
    done = warm.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                    env={**os.environ, "TEST_REWARD": "length", "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]


SIZES = {"grpo": ["--num_prompts", "2", "--num_generations", "4"],
         "tools": ["--num_prompts", "2", "--num_generations", "4"],  # turns of the model
         "appo": ["--num_envs", "2", "--num_steps", "4"]}  # stepwise episodes, the prefix cache


# grpo.py's, the path docs/reading.md teaches, in the first tier; the others in the second
@pytest.mark.parametrize("algo", [a if a == "grpo" else pytest.param(a, marks=pytest.mark.slow)
                                  for a in sorted(SIZES)])
def test_the_plain_path_trains_the_default_path_s_weights(algo, tmp_path):
    run(algo, SIZES[algo], tmp_path / "fast")
    run(algo, [*SIZES[algo], "--plain"], tmp_path / "plain")
    lines = {m: (tmp_path / m / "samples.jsonl").read_text().splitlines() for m in ("fast", "plain")}
    responses = {m: [json.loads(line)["response"] for line in lines[m]] for m in lines}
    assert responses["fast"] == responses["plain"] and responses["fast"]  # the same tokens
    logs = {m: [json.loads(x) for x in (tmp_path / m / "metrics.jsonl").read_text().splitlines()]
            for m in ("fast", "plain")}
    for fast, plain in zip(logs["fast"], logs["plain"]):
        assert fast["reward/mean"] == plain["reward/mean"]
        for key in ("pg_loss", "entropy"):
            assert plain[key] == pytest.approx(fast[key], rel=1e-5, abs=1e-5), key
        assert plain["grad_norm"] == pytest.approx(fast["grad_norm"], rel=1e-3)
