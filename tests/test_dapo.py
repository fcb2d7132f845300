"""dapo.py: DAPO's recipe against hand-worked values (the soft overlong punishment, clip-higher,
dynamic sampling), the option checks, and end-to-end runs on the tiny model (overlong filtering
keeps every cut response out of the loss). The rest of the file is grpo.py's, held to its text by
tests/test_layers.py's copies."""

import json
import os
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import dapo
from common.errors import UsageError
from common.run.checks import check_options
import warm  # tests/warm.py: `python X.py` runs forked from a warm process

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--model_name_or_path", "tiny-random", "--max_new_tokens", "8", "--num_eval_problems", "0",
        "--num_prompts", "2", "--num_generations", "4", "--max_steps", "1",
        "--learning_rate", "1e-3", "--temperature", "1.0"]


# ---- the soft overlong punishment ---------------------------------------------------------------
@pytest.mark.parametrize("factor", [1.0, 0.5])
def test_the_overlong_penalty_is_zero_then_falls_linearly_to_minus_the_factor(factor):
    # L_max = 10, L_cache = 4: free up to 6 tokens, then (6 - |y|) / 4 times the factor
    lengths = torch.tensor([3, 6, 7, 8, 9, 10])
    got = dapo.overlong_penalty(lengths, max_new_tokens=10, buffer_len=4, factor=factor)
    torch.testing.assert_close(got, factor * torch.tensor([0.0, 0.0, -0.25, -0.5, -0.75, -1.0]))


def test_a_buffer_of_zero_punishes_nothing():
    got = dapo.overlong_penalty(torch.tensor([1, 10]), max_new_tokens=10, buffer_len=0, factor=1.0)
    assert got.tolist() == [0.0, 0.0]


def test_a_buffer_as_long_as_the_budget_punishes_every_token():
    # L_cache = L_max = 8: each token costs 1/8 of the factor, the whole budget all of it
    got = dapo.overlong_penalty(torch.tensor([0, 2, 8]), max_new_tokens=8, buffer_len=8,
                                factor=2.0)
    assert got.tolist() == [0.0, -0.5, -2.0]


# ---- clip-higher ---------------------------------------------------------------------------------
def test_clip_higher_lets_a_positive_advantage_rise_further_than_a_negative_one_falls():
    args = replace(dapo.Args(), epsilon=0.2, epsilon_high=0.28, loss_type="bnpo")
    mask, old = torch.ones(4, 1), torch.zeros(4, 1)
    # ratios 1.5 (A > 0 and A < 0) and 0.5 (A > 0 and A < 0)
    new = torch.log(torch.tensor([[1.5], [1.5], [0.5], [0.5]])).requires_grad_()
    loss, stats = dapo.policy_loss(new, old, torch.tensor([1.0, -1.0, 1.0, -1.0]), mask, 4.0,
                                   args)
    # A > 0 at 1.5: clipped to 1.28 (not grpo.py's 1.2); A < 0 at 1.5: 1.5, unclipped;
    # A > 0 at 0.5: 0.5, unclipped; A < 0 at 0.5: clipped to 0.8 = 1 - 0.2
    assert loss.item() == pytest.approx((-1.28 + 1.5 - 0.5 + 0.8) / 4)
    assert stats["clipfrac"] == pytest.approx(0.5)
    loss.backward()
    assert new.grad[:, 0].tolist() == pytest.approx([0.0, 1.5 / 4, -0.5 / 4, 0.0])


# ---- dynamic sampling ----------------------------------------------------------------------------
def test_dynamic_sampling_keeps_groups_whose_rewards_differ(monkeypatch):
    # problems with an even index give the group rewards 0, 1, 0, 1; odd ones 0, 0, 0, 0
    def rollout(policy, tokenizer, env, position, first, local_prompts, args, autocast_dtype):
        indices = dapo.prompt_indices(position, args.num_prompts, len(env), args.seed)
        indices = indices[first:first + local_prompts]
        scores = torch.tensor([float(k % 2 and i % 2 == 0) for i in indices for k in range(4)])
        gen = dapo.Generation(*(torch.zeros(len(scores), 1) for _ in range(7)))
        return dapo.Rollout(gen, [f"p{i}" for i in indices for _ in range(4)], scores,
                            scores.clone(), indices)
    monkeypatch.setattr(dapo, "rollout", rollout)
    env = list(range(40))  # only len(env) is read
    tok = type("Tok", (), {"pad_token_id": 0})()
    args = replace(dapo.Args(), num_prompts=4, num_generations=4, max_sampling_rounds=3)
    batch, rounds = dapo.dynamic_rollout(None, tok, env, 5, 0, 4, args, None, 0)
    gen, texts, scores, problems = batch.gen, batch.texts, batch.scores, batch.problems
    drawn = [dapo.prompt_indices(5 * 3 + r, 4, 40, args.seed) for r in range(rounds)]
    expected = [i for round_ in drawn for i in round_ if i % 2 == 0][:4]
    assert problems == expected and len(problems) == 4 and rounds == len(drawn)
    assert (scores.view(4, 4).std(dim=1) > 0).all()  # no group of equal rewards in the batch
    assert texts == [f"p{i}" for i in problems for _ in range(4)] and gen.response_ids.shape == (16, 1)
    # with too few rounds the batch is filled with equal-reward groups, in the order drawn
    args = replace(args, max_sampling_rounds=1)
    batch, rounds = dapo.dynamic_rollout(None, tok, env, 5, 0, 4, args, None, 0)
    problems = batch.problems
    first = dapo.prompt_indices(5, 4, 40, args.seed)
    assert rounds == 1 and problems == [i for i in first if i % 2 == 0] + [i for i in first if i % 2]


# ---- options ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("change,message", [
    ({"overlong_buffer_len": 65}, "--overlong_buffer_len 65 is longer than --max_new_tokens 64"),
    ({"overlong_buffer_len": -1}, "--overlong_buffer_len -1: must be in [0, 131072]"),
    ({"overlong_buffer_len": 9, "max_new_tokens": 8}, "--overlong_buffer_len 9 is longer than"),
    ({"overlong_penalty_factor": -0.5}, "--overlong_penalty_factor -0.5: must be >= 0"),
    ({"max_sampling_rounds": 0}, "--max_sampling_rounds 0: must be in [1, 64]"),
    ({"epsilon_high": 0.0}, "--epsilon_high 0.0: must be > 0"),
])
def test_option_errors_name_the_fix(change, message, tmp_path):
    args = replace(dapo.Args(), output_dir=str(tmp_path / "run"), **change)
    with pytest.raises(UsageError) as e:
        check_options(args, dapo.check_args, world_size=1)
    assert str(e.value).startswith(message)


def test_the_defaults_are_the_papers():
    args = dapo.Args()
    assert (args.epsilon, args.epsilon_high, args.loss_type, args.beta) == (0.2, 0.28, "dapo", 0.0)
    assert args.dynamic_sampling and args.drop_zero_std_groups and args.mask_truncated_completions
    assert args.overlong_buffer_len is None  # a fifth of the budget, in main: 4,096 of 20,480


# ---- end to end --------------------------------------------------------------------------------------
def run(flags, out):
    cmd = [sys.executable, "tests/run_with_test_reward.py", "dapo", *TINY, *flags,
           "--output_dir", str(out)]
    done = warm.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                    env={**os.environ, "TEST_REWARD": "length"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return json.loads((out / "metrics.jsonl").read_text().splitlines()[0])


def test_every_cut_response_is_out_of_the_loss_and_pays_the_whole_penalty(tmp_path):
    # The tiny random model never ends a response before 8 tokens: each is cut at the budget, so
    # the buffer of 8 takes the whole penalty from each (-1), and overlong filtering leaves no token
    # in the loss: the update moves no weight. Without the filtering the same run moves them.
    kept = run(["--overlong_buffer_len", "8", "--no_dynamic_sampling"], tmp_path / "masked")
    moved = run(["--overlong_buffer_len", "8", "--no_dynamic_sampling",
                 "--no_mask_truncated_completions"], tmp_path / "unmasked")
    assert kept["truncated_frac"] == 1.0 and kept["reward/overlong_penalty"] == -1.0
    assert kept["grad_norm"] == 0.0 and moved["grad_norm"] > 0
    assert moved["reward/overlong_penalty"] == -1.0
    assert kept["sampling/rounds"] == 1 and kept["sampling/samples"] == 8
