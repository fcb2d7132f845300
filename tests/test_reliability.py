"""A run a student can leave overnight: bad input fails before any model loads with the fix, a NaN
reward stops the run, a NaN loss or gradient skips the step, no checkpoint holds NaN, and a run
killed at any moment resumes to the same weights and logs as an uninterrupted one."""

import importlib
import json
import math
import os
import re
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dev.algorithms import ALGORITHMS
from common.run.checkpoints import checkpoints, load_trainer_state, resume_point, save_checkpoint
from common.run.checks import StepGuard, check_options, check_rewards
from common.run.logger import Logger, json_line
from common.models.loading import load_tokenizer, tiny_random_model
from common.errors import PathError, UsageError
import warm  # tests/warm.py: `python X.py` runs forked from a warm process

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--model_name_or_path", "tiny-random", "--max_new_tokens", "8", "--num_eval_problems", "4",
        "--num_prompts", "2", "--num_generations", "4", "--micro_batch_size", "2"]


def run(cmd, ok=True, **kw):
    # a run meant to fail under torchrun is read for torchrun's own report: the real launcher
    out = warm.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                   real_torchrun=not ok, **kw)
    assert (out.returncode == 0) == ok, out.stdout[-3000:] + out.stderr[-3000:]
    return out


def run_args(output_dir, **changes):
    """The options of a run, as the Logger reads them."""
    from grpo import Args

    return Args(output_dir=str(output_dir), max_steps=changes.get("max_steps", 10))


def algo_args(algo, **changes):
    module = importlib.import_module(algo)
    if algo == "distill":  # it has no default teacher: one is given, as a run must
        changes = {"teacher_model_name_or_path": "tiny-random", **changes}
    return module, replace(module.Args(), model_name_or_path="tiny-random", **changes)


# ---- bad input: one error with the fix, before any model loads --------------------------------------------------
SIZES = ["max_steps", "max_new_tokens", "micro_batch_size", "num_prompts", "num_generations",
         "num_envs",
         "num_mini_batches", "num_ppo_epochs", "num_steps", "max_episode_steps", "log_interval",
         "eval_batch_size"]


@pytest.mark.parametrize("algo,size", [(algo, size) for algo in ALGORITHMS for size in SIZES
                                       if hasattr(importlib.import_module(algo).Args, size)])
def test_sizes_below_one_name_the_flag_and_its_default(algo, size, tmp_path):
    module, args = algo_args(algo, output_dir=str(tmp_path))
    default = getattr(args, size)
    says = "leave it out for its default" if default is None else f"the default is {default}"
    with pytest.raises(ValueError, match=rf"--{size} 0: must be (>= 1|in \[1, \d+\]) \({says}\)"):
        check_options(replace(args, **{size: 0}), module.check_args, world_size=1)


# (option, a bad value, what the message says); each fails in every file that has the option
BAD_NUMBERS = [("max_grad_norm", -1.0, "must be >= 0"), ("learning_rate", -1e-5, r"must be in \[0, 1\]"),
               ("learning_rate", math.nan, r"must be in \[0, 1\]"), ("learning_rate", math.inf, r"must be in \[0, 1\]"),
               ("learning_rate", 1e30, r"must be in \[0, 1\]"), ("critic_learning_rate", 2.0, r"must be in \[0, 1\]"),
               ("critic_learning_rate", -1.0, r"must be in \[0, 1\]"), ("warmup_ratio", 1.5, r"must be in \[0, 1\]"),
               ("warmup_ratio", -0.1, r"must be in \[0, 1\]"), ("num_train_epochs", 0.0, "must be > 0"),
               ("epsilon", -0.2, "must be > 0"), ("epsilon_high", 0.0, "must be > 0"),
               ("beta", -0.1, "must be >= 0"),
               ("cliprange_value", 0.0, "must be > 0"), ("vf_coef", -1.0, "must be >= 0"),
               ("gamma", 1.01, r"must be in \[0, 1\]"), ("gae_lambda", -0.5, r"must be in \[0, 1\]"),
               ("entropy_coef", -0.01, "must be >= 0"), ("target_kl", math.nan, "must be >= 0"), ("skip_kl", -1.0, "must be >= 0"),
               ("huber_delta", 0.0, "must be > 0"), ("missing_eos_penalty", -1.0, "must be >= 0"),
               ("max_sampling_rounds", 0, r"must be in \[1, 64\]"), ("lora_r", -1, r"must be in \[0, 4096\]"),
               ("critic_num_layers", -1, r"must be in \[0, 16\]"), ("critic_hidden_size", 0, r"must be in \[1, 16384\]"),
               ("ref_model_sync_steps", -1, "must be >= 0"), ("seed", 10**30, r"must be in \[0, 4294967295\]"),
               # sizes that memory holds have a top: a typo of 1e12 filled 8 GB in a minute
               ("num_prompts", 10**12, r"must be in \[1, 65536\]"), ("num_generations", 10**12, r"must be in \[1, 4096\]"),
               ("num_envs", 10**12, r"must be in \[1, 65536\]"), ("max_new_tokens", 10**9, r"must be in \[1, 131072\]"),
               ("eval_batch_size", 10**6, r"must be in \[1, 4096\]")]


@pytest.mark.parametrize("algo,name,bad,says", [
    (a, n, b, s) for a in ALGORITHMS for n, b, s in BAD_NUMBERS
    # online_dpo's beta must be > 0, a check of its own (tests/test_online_dpo.py)
    if hasattr(importlib.import_module(a).Args, n) and (a, n) != ("online_dpo", "beta")])
def test_numbers_outside_their_range_name_the_flag_and_the_range(algo, name, bad, says, tmp_path):
    module, args = algo_args(algo, output_dir=str(tmp_path))
    with pytest.raises(UsageError, match=rf"--{name} {re.escape(str(bad))}: {says} \(") as e:
        check_options(replace(args, **{name: bad}), module.check_args, world_size=1)
    assert isinstance(e.value, ValueError)  # what `except ValueError` expects
    for good in {"max_grad_norm": [0.0, math.inf], "warmup_ratio": [0.0, 1.0], "learning_rate": [0.0, 1.0],
                 "beta": [0.0], "gamma": [0.0, 1.0], "num_prompts": [2048]}.get(name, []):  # the ends allowed
        check_options(replace(args, **{name: good}), module.check_args, world_size=1)


def test_max_grad_norm_0_measures_the_norm_and_clips_nothing():
    from common.models.sharding import clip_grad_norm

    layer = torch.nn.Linear(2, 1, bias=False)
    layer.weight.grad = torch.tensor([[3.0, 4.0]])
    assert clip_grad_norm(layer, 0.0) == pytest.approx(5.0)
    assert layer.weight.grad.tolist() == [[3.0, 4.0]]  # 0 used to scale every gradient to 0
    assert clip_grad_norm(layer, 1.0) == pytest.approx(5.0)
    assert layer.weight.grad.tolist() == [[pytest.approx(0.6), pytest.approx(0.8)]]


@pytest.mark.parametrize("flags,says", [
    (["--max_grad_norm", "-1"], "error: --max_grad_norm -1.0: must be >= 0 (the default is 1.0)."),
    (["--output_dir", "/proc/x"], "error: --output_dir /proc/x can't be written"),
    (["--model_name_or_path", "/no/such/model"], "error: --model_name_or_path '/no/such/model': no such folder"),
])
def test_a_user_error_is_one_line_without_a_traceback(flags, says):
    out = run([sys.executable, "grpo.py", "--model_name_or_path", "tiny-random", *flags], ok=False)
    assert out.stderr.startswith(says) and out.stderr.count("\n") == 1, out.stderr
    assert out.stdout == ""


def test_a_bug_keeps_its_traceback(tmp_path):
    # a TypeError raised inside the file is not the user's doing: the traceback stays
    script = tmp_path / "bug.py"
    script.write_text("import sys; sys.path.insert(0, %r)\n"
                      "from common.run.args import parse_args\nfrom grpo import Args\n"
                      "parse_args(Args, [])\nlen(3)\n" % str(ROOT))
    out = run([sys.executable, str(script)], ok=False)
    assert "Traceback" in out.stderr and "TypeError" in out.stderr


@pytest.mark.parametrize("algo", ALGORITHMS)
def test_output_dir_that_is_a_file_or_unwritable_fails_at_once(algo, tmp_path):
    module, args = algo_args(algo)
    (tmp_path / "a_file").write_text("")
    with pytest.raises(PathError, match="a_file is a file, not a folder"):
        check_options(replace(args, output_dir=str(tmp_path / "a_file")), module.check_args, world_size=1)
    with pytest.raises(PathError, match="a_file is a file"):
        check_options(replace(args, output_dir=str(tmp_path / "a_file" / "run")), module.check_args, world_size=1)
    # /proc takes no new files, even from root
    with pytest.raises(PathError, match="can't be written"):
        check_options(replace(args, output_dir="/proc/mathrl-run"), module.check_args, world_size=1)
    assert not (Path("/proc") / "mathrl-run").exists()


def test_eval_output_that_cannot_be_written_fails_before_generating(tmp_path):
    import eval as evaluation

    args = replace(evaluation.Args(), model_name_or_path="tiny-random")
    with pytest.raises(PathError, match="--output /proc/x can't be written"):
        evaluation.check_args(replace(args, output="/proc/x/out.jsonl"))
    with pytest.raises(PathError, match="is a folder"):
        evaluation.check_args(replace(args, output=str(tmp_path)))


def test_a_malformed_json_line_names_the_file_and_its_line(tmp_path):
    from common.env.math_env import make_env

    path = tmp_path / "train.jsonl"
    # line 3 is blank, line 4 is cut short; a U+2028 inside a JSON string is not a line break
    path.write_text('{"question": "a\u2028b", "answer": "1"}\n{"question": "c", "answer": '
                    '"2"}\n\n{"question": "d", "ans\n')
    with pytest.raises(ValueError,
                       match=r"train.jsonl, line 4: not valid JSON \(Unterminated string"):
        make_env("arithmetic", path=path)
    path.write_text('{"question": "a\u2028b", "answer": "1"}\n\n{"question": "c", "answer": "2"}\n')
    assert [ex["question"] for ex in make_env("arithmetic",
                                              path=path).examples] == ["a\u2028b", "c"]
    bad = tmp_path / "train.json"
    bad.write_text('[\n {"question": "a", "answer": "1"},\n {"question": "b" "answer": "2"}\n]')
    with pytest.raises(ValueError, match=r"train.json, line 3: not valid JSON \(Expecting ','"):
        make_env("arithmetic", path=bad)


@pytest.mark.parametrize("algo", ALGORITHMS)
def test_track_without_wandb_names_the_fix(algo, tmp_path, monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name,
                        *a: None if name == "wandb" else find_spec(name, *a))
    module, args = algo_args(algo, output_dir=str(tmp_path), track=True)
    with pytest.raises(ImportError, match=r"pip install -r requirements-extra.txt \(wandb and tensorboard\), or drop --track"):
        check_options(args, module.check_args, world_size=1)


@pytest.mark.parametrize("algo", ALGORITHMS)
def test_fsdp_and_lora_flags_fail_before_any_model_loads(algo, tmp_path, monkeypatch):
    import importlib.util

    monkeypatch.delenv("RANK", raising=False)
    module, args = algo_args(algo, output_dir=str(tmp_path), fsdp=True)
    with pytest.raises(ValueError, match=r"run `torchrun --nproc_per_node N .*--fsdp"):
        check_options(args, module.check_args, world_size=1)
    module, args = algo_args(algo, output_dir=str(tmp_path), merge_lora=True)
    with pytest.raises(ValueError, match="but --lora_r is 0"):
        check_options(args, module.check_args, world_size=1)
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name,
                        *a: None if name == "peft" else find_spec(name, *a))
    module, args = algo_args(algo, output_dir=str(tmp_path), lora_r=8)
    with pytest.raises(ImportError, match="--lora_r needs peft: pip install peft"):
        check_options(args, module.check_args, world_size=1)
    monkeypatch.setenv("RANK", "0")  # under torchrun
    module, args = algo_args(algo, output_dir=str(tmp_path), fsdp=True, compile=True)
    with pytest.raises(ValueError, match="--compile decodes with a whole, compiled model"):
        check_options(args, module.check_args, world_size=1)


@pytest.mark.parametrize("algo", ALGORITHMS)
@pytest.mark.parametrize("world", [1, 2, 8])
def test_defaults_work_at_1_2_and_8_processes_or_name_the_fix(algo, world, tmp_path):
    module, args = algo_args(algo, output_dir=str(tmp_path))
    try:
        # async_grpo.py's Run: under torchrun its last rank samples and the others train
        check_options(args, module.check_args, world_size=world,
                      samplers=int(algo == "async_grpo"))
    # allowed only with a concrete fix, and only where the defaults can't split
    except ValueError as e:
        assert "try --" in str(e), e
        # fewer prompts than processes (grpo's and reinforce's 4 over 8)
        assert world == 8 and getattr(args, "num_prompts", world) < world, e


@pytest.mark.slow  # the second tier: torchrun
def test_ppo_defaults_under_torchrun_with_two_processes(tmp_path):
    # ppo's defaults (16 prompts, 2 minibatches, micro-batches of 8) give each rank minibatches of 4
    # sequences: this used to fail with "--micro_batch_size 8 must divide 4"; micro-batches are now
    # "up to" 8.
    run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
         "29531", "ppo.py",
         "--model_name_or_path", "tiny-random", "--max_steps", "1", "--num_eval_problems", "2",
         "--output_dir", str(tmp_path)], env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1]


# ---- non-finite rewards, losses and weights -------------------------------------------------------------------
def test_check_rewards_names_the_sample_the_problem_and_the_update():
    # finite: nothing
    check_rewards(torch.tensor([0.0, 1.0, 0.1]), 3, "gsm8k", [4, 5, 6])
    # groups of 2 rows: row 2 is the second group's, problem 7
    with pytest.raises(FloatingPointError,
                       match=r"reward inf for sample 2 \(problem 7\) of task 'gsm8k' in update 3"):
        check_rewards(torch.tensor([0.0, 1.0, math.inf, 0.0]), 3, "gsm8k", [5, 7])
    # stepwise: each entry's own problem
    with pytest.raises(FloatingPointError,
                       match=r"reward nan for sample 1, step 2 \(problem 9\)"):
        check_rewards(torch.tensor([[0.0, 0, 0], [0, 0, math.nan]]), 1, "math",
                      [[3, 3, 4], [8, 8, 9]])


def test_step_guard_skips_non_finite_steps_and_stops_after_three_in_a_row():
    guard = StepGuard(patience=3)
    assert guard.ok(0.5, torch.tensor(2.0))
    assert not guard.ok(math.nan, 1.0)
    assert not guard.ok(0.5, torch.tensor(math.inf))
    assert guard.ok(0.5, 1.0)  # a finite step resets the run of skips
    assert guard.pop() == 2 and guard.pop() == 0
    assert not guard.ok(math.nan) and not guard.ok(math.nan)
    with pytest.raises(FloatingPointError, match="3 optimizer steps in a row"):
        guard.ok(-math.inf)


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny-random")


def test_a_checkpoint_with_non_finite_weights_is_never_written(tmp_path, tok):
    model = tiny_random_model()
    save_checkpoint(tmp_path / "checkpoint-1", model, tok, 1)
    with torch.no_grad():
        model.model.norm.weight[3] = math.nan
    with pytest.raises(FloatingPointError,
                       match=r"not writing .*checkpoint-2: model.norm.weight .* NaN or inf"):
        save_checkpoint(tmp_path / "checkpoint-2", model, tok, 2)
    # a critic's weights too
    with pytest.raises(FloatingPointError, match=r"extra.critic.head.bias"):
        save_checkpoint(tmp_path / "checkpoint-2", tiny_random_model(), tok, 2,
                        extra={"critic": {"head.bias": torch.tensor([math.inf])}})
    assert checkpoints(tmp_path) == [tmp_path / "checkpoint-1"]
    assert not (tmp_path / "checkpoint-2").exists() and not (tmp_path / "checkpoint-2.tmp").exists()


def _nan_loss_after(grpo, monkeypatch, bad_calls):
    """grpo.policy_loss that returns NaN on the given (0-based) calls."""
    real, calls = grpo.policy_loss, [0]

    def loss_fn(*a, **k):
        loss, stats = real(*a, **k)
        calls[0] += 1
        return (loss * math.nan if calls[0] - 1 in bad_calls else loss), stats
    monkeypatch.setattr(grpo, "policy_loss", loss_fn)


def test_a_nan_loss_skips_that_step_and_the_run_goes_on(tmp_path, monkeypatch):
    import grpo

    # micro-batches of 2 over 8 sequences: calls 4..7 are update 2's; one NaN micro-batch spoils its
    # step
    _nan_loss_after(grpo, monkeypatch, {5})
    grpo.main(replace(grpo.Args(), model_name_or_path="tiny-random", max_new_tokens=8,
                      num_eval_problems=2,
                      num_prompts=2, num_generations=4, micro_batch_size=2, max_steps=3,
                      learning_rate=1e-3,
                      output_dir=str(tmp_path)))
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [x["skipped_steps"] for x in lines] == [0, 1, 0]
    # the NaN grad norm is logged as null (strict JSON), and the line counts it
    assert lines[1]["grad_norm"] is None and lines[1]["nonfinite"] >= 1
    assert math.isfinite(lines[2]["grad_norm"])
    weights = load_file(str(tmp_path / "checkpoint-3" / "model.safetensors"))
    assert all(bool(torch.isfinite(w).all()) for w in weights.values())


def test_nan_losses_in_a_row_stop_the_run_without_a_nan_checkpoint(tmp_path, monkeypatch):
    import grpo

    _nan_loss_after(grpo, monkeypatch, set(range(4, 100)))  # every step from update 2 on
    with pytest.raises(FloatingPointError,
                       match="3 optimizer steps in a row had a NaN or inf loss"):
        grpo.main(replace(grpo.Args(), model_name_or_path="tiny-random", max_new_tokens=8,
                          num_eval_problems=2,
                          num_prompts=2, num_generations=4, micro_batch_size=2, max_steps=6,
                          save_interval=1,
                          output_dir=str(tmp_path)))
    # updates 2, 3 and 4 were skipped; the checkpoints written before the stop hold the finite
    # update-1 weights
    assert [p.name for p in checkpoints(tmp_path)] == ["checkpoint-3", "checkpoint-2",
                                                       "checkpoint-1"]
    a, b = (load_file(str(tmp_path / f"checkpoint-{k}" / "model.safetensors")) for k in (1, 3))
    assert all(torch.equal(a[k], b[k]) and bool(torch.isfinite(a[k]).all()) for k in a)


def test_grader_timeouts_are_logged_as_a_fraction_of_the_graded_responses(tmp_path, monkeypatch):
    import grpo
    from common.env import grader_worker

    rollout = grpo.rollout

    def timing_out(*args, **kwargs):  # as if 2 of every rollout's 8 grades ran out of time
        grader_worker._count("timeouts")
        grader_worker._count("timeouts")
        return rollout(*args, **kwargs)
    monkeypatch.setattr(grpo, "rollout", timing_out)
    grpo.main(replace(grpo.Args(), model_name_or_path="tiny-random", max_new_tokens=8,
                      num_eval_problems=2,
                      num_prompts=2, num_generations=4, max_steps=2, output_dir=str(tmp_path)))
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [x["reward/grader_timeouts"] for x in lines] == [2 / 8, 2 / 8]


@pytest.mark.parametrize("algo", ["grpo", "appo"])
def test_a_nan_reward_at_update_1_stops_the_run_before_the_update(algo, tmp_path):
    # graded before update 1's rollout: 4 eval answers, then 8 responses (grpo) or 8 x 4 steps
    # (appo) of update 0
    nan_at = {"grpo": 4 + 8, "appo": 4 + 8 * 4}[algo]
    sizes = {"grpo": ["--num_prompts", "2", "--num_generations", "4"],
             "appo": ["--eval_max_new_tokens", "8"]}[algo]
    out = run([sys.executable, "tests/run_with_test_reward.py", algo, "--model_name_or_path",
               "tiny-random",
               "--max_new_tokens", "8", "--num_eval_problems", "4", *sizes, "--max_steps", "3",
               "--save_interval", "1",
               "--output_dir", str(tmp_path)], ok=False,
               env={**os.environ, "TEST_REWARD": f"nan_at:{nan_at}"})
    # a user's reward gone wrong: one line, no traceback
    assert "error: reward nan for sample 0" in out.stderr and "Traceback" not in out.stderr
    # update 1 is the 2nd
    assert "of task 'arithmetic' in update 2: rewards must be finite numbers" in out.stderr
    assert [p.name for p in checkpoints(tmp_path)] == ["checkpoint-1"]
    weights = load_file(str(tmp_path / "checkpoint-1" / "model.safetensors"))
    assert all(bool(torch.isfinite(w).all()) for w in weights.values())


# ---- checkpoints and resume -----------------------------------------------------------------------------------
def test_unfinished_saves_and_other_names_are_not_checkpoints(tmp_path, tok):
    save_checkpoint(tmp_path / "checkpoint-2", tiny_random_model(), tok, 2)
    for name in ("checkpoint-3.tmp", "checkpoint-10.tmp", "checkpoint-x", "checkpoint-2.old"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "trainer_state.pt").write_text("partial")
    (tmp_path / "checkpoint-7").write_text("a file")
    assert checkpoints(tmp_path) == [tmp_path / "checkpoint-2"]
    assert checkpoints(tmp_path)[0] == tmp_path / "checkpoint-2"  # the newest complete one
    assert checkpoints(tmp_path / "missing") == []


def test_weights_loaded_from_a_checkpoint_are_aligned_like_new_ones(tmp_path, tok):
    # safetensors data sits at an arbitrary offset; CPU matmuls round unaligned operands
    # differently, which made a resumed appo run drift by an ulp from the uninterrupted one a few
    # updates later
    from common.models.loading import load_policy

    save_checkpoint(tmp_path / "checkpoint-1", tiny_random_model(), tok, 1)
    policy = load_policy(str(tmp_path / "checkpoint-1"))
    assert all(p.data_ptr() % 64 == 0 for p in policy.parameters())
    assert policy.lm_head.weight is policy.model.embed_tokens.weight  # still tied


def test_saving_the_same_step_twice_replaces_it_whole(tmp_path, tok):
    save_checkpoint(tmp_path / "checkpoint-1", tiny_random_model(), tok, 1, extra={"x": 1})
    save_checkpoint(tmp_path / "checkpoint-1", tiny_random_model(seed=1), tok, 1, extra={"x": 2})
    assert load_trainer_state(tmp_path / "checkpoint-1")["extra"] == {"x": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-1"]
    manifest = json.loads((tmp_path / "checkpoint-1" / "manifest.json").read_text())
    assert manifest["model.safetensors"] == (tmp_path / "checkpoint-1" / "model.safetensors").stat().st_size


def test_resume_point_decisions(tmp_path, tok, capsys):
    # no checkpoint: --resume says so and starts at 0; a fresh run in an empty folder is fine
    assert resume_point(tmp_path, True, 5) == (0, None, None)
    assert "no complete checkpoint in" in capsys.readouterr().out
    assert resume_point(tmp_path, False, 5) == (0, None, None)
    for step in (1, 2, 3):
        save_checkpoint(tmp_path / f"checkpoint-{step}", tiny_random_model(), tok, step)
    # a fresh run would mix with the earlier one's checkpoints under a later --resume
    with pytest.raises(PathError,
                       match="already holds checkpoint-3 from an earlier run: pass --resume"):
        resume_point(tmp_path, False, 5)
    # --max_steps below the checkpoint: an error, where it used to overwrite checkpoint-3 with later
    # weights
    with pytest.raises(ValueError,
                       match="checkpoint-3 is at update 3, beyond --max_steps 2; pass --max_steps 3"):
        resume_point(tmp_path, True, 2)
    with pytest.raises(SystemExit) as done:  # already finished: exit 0, so a resume loop ends
        resume_point(tmp_path, True, 3)
    assert done.value.code == 0 and "nothing to do" in capsys.readouterr().out
    step, path, state = resume_point(tmp_path, True, 5)
    assert (step, path, state["step"]) == (3, tmp_path / "checkpoint-3", 3)
    # a truncated weight file: named, and the previous checkpoint is used
    with open(tmp_path / "checkpoint-3" / "model.safetensors", "r+b") as f:
        f.truncate(1000)
    step, path, _ = resume_point(tmp_path, True, 5)
    out = capsys.readouterr().out
    assert (step, path) == (2, tmp_path / "checkpoint-2")
    assert f"{tmp_path / 'checkpoint-3'} is corrupt (ValueError: model.safetensors has 1000 bytes" in out
    # a garbled trainer state, with a manifest that agrees on its size
    state_file = tmp_path / "checkpoint-2" / "trainer_state.pt"
    state_file.write_bytes(b"\0" * state_file.stat().st_size)
    step, path, _ = resume_point(tmp_path, True, 5)
    assert (step, path) == (1,
                            tmp_path / "checkpoint-1") and "checkpoint-2 is corrupt" in capsys.readouterr().out


def test_a_resumed_logger_cuts_the_logs_back_to_the_checkpoint(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": s,
                                                                "x": s}) + "\n" for s in (1, 2, 3, 4))
                                            + '{"step": 5, "x"')  # the last line cut by a kill
    (tmp_path / "eval.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in (0, 2, 4)))
    logger = Logger(run_args(tmp_path), initial_step=2)
    logger.log(3, {"x": 30})
    logger.close()
    assert [json.loads(x)["x"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1, 2, 30]
    assert [json.loads(x)["step"] for x in (tmp_path / "eval.jsonl").read_text().splitlines()] == [0, 2]
    before = (tmp_path / "metrics.jsonl").read_text()
    Logger(run_args(tmp_path), initial_step=0).close()  # a run from update 0 starts the logs anew
    assert (tmp_path / "metrics.jsonl").read_text() == "" and (tmp_path / "eval.jsonl").read_text() == ""
    assert (tmp_path / "metrics.1.jsonl").read_text() == before  # and keeps the earlier lines aside


def test_a_rerun_into_logs_without_a_checkpoint_refuses_or_keeps_every_line(tmp_path, capsys):
    # a run killed before its first checkpoint (the default --save_interval 0 saves at the end)
    lines = "".join(json.dumps({"step": s, "x": s}) + "\n" for s in (1, 2, 3))
    (tmp_path / "metrics.jsonl").write_text(lines)
    (tmp_path / "eval.jsonl").write_text('{"step": 0, "eval/accuracy": 0.3}\n')
    with pytest.raises(PathError, match="holds the logs of an earlier run \\(metrics.jsonl, "
                                        "eval.jsonl\\) but no checkpoint: pass another "
                                        "--output_dir for a new run, or --resume"):
        resume_point(tmp_path, False, 5)
    assert (tmp_path / "metrics.jsonl").read_text() == lines  # refused before touching anything
    # --resume: from update 0, and the old lines move aside, once per restart
    for restart in (1, 2):
        assert resume_point(tmp_path, True, 5) == (0, None, None)
        logger = Logger(run_args(tmp_path), initial_step=0)
        logger.log(1, {"x": 10 * restart})
        logger.close()
    assert (tmp_path / "metrics.1.jsonl").read_text() == lines
    assert json.loads((tmp_path / "metrics.2.jsonl").read_text())["x"] == 10
    assert json.loads((tmp_path / "metrics.jsonl").read_text())["x"] == 20
    assert "metrics.jsonl: the earlier run's lines are kept in metrics.1.jsonl" in capsys.readouterr().out


def strict(line):
    """json.loads as jq reads a line: bare NaN, Infinity and -Infinity are errors."""
    def refuse(name):
        raise ValueError(f"not strict JSON: {name}")

    return json.loads(line, parse_constant=refuse)


def test_log_lines_are_strict_json_with_non_finite_values_null_and_counted(tmp_path):
    logger = Logger(run_args(tmp_path))
    logger.log(1, {"loss": math.nan, "grad_norm": math.inf, "reward/mean": 0.25})
    logger.log_eval(1, {"eval/accuracy": 0.5})
    logger.log_samples(1, [{"response": "r", "reward": -math.inf,
                            "step_rewards": [1.0, math.nan, 0.5]}], show=0)
    logger.close()
    (metrics,) = [strict(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert metrics["loss"] is None and metrics["grad_norm"] is None
    assert metrics["reward/mean"] == 0.25 and metrics["nonfinite"] == 2
    (evaluation,) = [strict(x) for x in (tmp_path / "eval.jsonl").read_text().splitlines()]
    assert evaluation["eval/accuracy"] == 0.5 and "nonfinite" not in evaluation  # only when > 0
    (sample,) = [strict(x) for x in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert sample["reward"] is None and sample["step_rewards"] == [1.0, None, 0.5]
    assert sample["nonfinite"] == 2
    # a float subclass (numpy's float64) too; and a line without them is what json.dumps writes
    import numpy as np

    assert json_line({"x": np.float64("inf"), "y": (2.0, -1)}) == '{"x": null, "y": [2.0, -1], "nonfinite": 1}'
    assert json_line({"step": 3, "x": 0.5}) == '{"step": 3, "x": 0.5}'


def test_micro_batch_statistics_average_where_measured_and_are_nan_where_not():
    # one process: the mean over the micro-batches that hold each key; a named key nothing measured
    # is NaN (null in the log). Two ranks with different keys: tests/test_online_dpo.py.
    from common.distributed import all_reduce_stats

    out = all_reduce_stats([{"a": 1.0, "b": 2.0}, {"a": 4.0}], keys=("a", "c"))
    assert out["a"] == 2.5 and out["b"] == 2.0 and math.isnan(out["c"]) and len(out) == 3
    assert all_reduce_stats([]) == {}


def test_without_tensorboard_the_logger_names_the_extra_once(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails: not installed
    logger = Logger(run_args(tmp_path))
    logger.log(1, {"x": 1.0})
    logger.log(2, {"x": 2.0})
    logger.close()
    captured = capsys.readouterr()
    out = captured.out + captured.err
    assert out.count("tensorboard is not installed (pip install -r requirements-extra.txt)") == 1
    assert "Traceback" not in out and not (tmp_path / "tb").exists()


def test_divergence_is_said_once(tmp_path, capsys):
    logger = Logger(run_args(tmp_path, max_steps=20))
    for step, kl in enumerate([0.01, 0.012, 0.009, 0.011, 0.01, 0.01], 1):  # usual size ~0.01
        logger.log(step, {"approx_kl": kl, "entropy": 1.5})
    logger.log(7, {"approx_kl": 0.2, "entropy": 1.5})  # 20 times the usual
    logger.log(8, {"approx_kl": math.inf, "entropy": 0.0})
    logger.log(9, {"approx_kl": math.inf, "entropy": 0.0})
    logger.close()
    captured = capsys.readouterr()
    err = captured.out + captured.err
    assert err.count("warning: approx_kl is 0.2 at update 7 (usually 0.01)") == 1
    assert err.count("warning: approx_kl") == 1
    assert err.count("warning: the policy's entropy collapsed to 0 at update 8") == 1


# appo: episodes that carry over updates, a critic
@pytest.mark.slow  # the second tier: kills and resumes
@pytest.mark.parametrize("algo", ["grpo", "appo"])
def test_killed_at_random_moments_and_resumed_ends_like_an_uninterrupted_run(algo, tmp_path):
    sys.path.insert(0, str(ROOT / "bench"))
    from kill_resume import kill_and_resume

    # 4 updates, a checkpoint after each (bench/kill_resume.py makes 20 kills in 84 updates)
    summary = kill_and_resume(algo, kills=1, max_steps=4, seed=0, out=tmp_path)
    assert summary["kills"] == 1 and summary["crashes"] == []
    assert summary["max_abs_weight_diff"] == 0.0
    assert summary["logs_match"] == {"metrics.jsonl": True, "eval.jsonl": True,
                                     "samples.jsonl": True}



class Payload:
    """What a poisoned trainer_state.pt carries: unpickling it calls os.system."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_poisoned_trainer_state_is_refused_and_runs_nothing(tmp_path, tok):
    save_checkpoint(tmp_path / "checkpoint-1", tiny_random_model(), tok, 1)
    state = tmp_path / "checkpoint-1" / "trainer_state.pt"
    marker = tmp_path / "payload-ran"
    torch.save({"step": 1, "optimizers": {}, "extra": {"x": Payload(marker)}}, state)
    manifest = json.loads((tmp_path / "checkpoint-1" / "manifest.json").read_text())
    manifest["trainer_state.pt"] = state.stat().st_size  # as a careful attacker would
    (tmp_path / "checkpoint-1" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(PathError, match=r"holds more than tensors and numbers \(it names "
                                        r"(posix|os)\.system\).*refused"):
        resume_point(tmp_path, True, 5)
    assert not marker.exists()  # the payload never ran
    # the same file through a plain pickle load would have run it: the test's payload is real
    torch.load(state, weights_only=False)
    assert marker.exists()


def test_every_file_resumes_from_a_state_that_holds_only_tensors_and_numbers(tmp_path, tok):
    # what the files save (optimizer states, a critic, running episodes) loads with
    # weights_only=True
    save_checkpoint(tmp_path / "checkpoint-2", tiny_random_model(), tok, 2,
                    extra={"envs": [{"episode": 3, "index": 7, "steps": ["1 + 2 = 3"],
                                     "step_rewards": [0.5]}], "critic": {"w": torch.ones(2)}})
    start, path, state = resume_point(tmp_path, True, 5)
    assert start == 2 and path.name == "checkpoint-2"
    assert state["extra"]["envs"][0]["steps"] == ["1 + 2 = 3"]


def test_a_missing_prm_names_its_own_flag_and_prm_examples():
    from common.models.stepwise import load_prm_tokenizer

    with pytest.raises(PathError, match="^--prm_model_name_or_path '/no/prm': no such folder.*"
                                        "math-shepherd"):
        load_prm_tokenizer("/no/prm", "ки")


def test_data_errors_count_rows_from_1_as_lines_are(tmp_path):
    from common.env.math_env import make_env

    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"question": "1+1?", "answer": "2"}) + "\n"
                    + json.dumps({"q": "2+2?"}) + "\n")
    with pytest.raises(UsageError, match="bad.jsonl: row 2 has no"):  # the 2nd row, on line 2
        make_env("gsm8k", path=path)


RANK_ERROR = """import os, sys, time
sys.path.insert(0, {root!r})
from common.errors import UsageError, report_user_errors
report_user_errors()
if os.environ["RANK"] in sys.argv[1].split(","):
    raise UsageError("bad here")
time.sleep(20)
"""


@pytest.mark.slow  # the second tier: torchrun
@pytest.mark.parametrize("failing,says", [("0,1", ["error: bad here"]),
                                          ("1", ["error (rank 1): bad here"])])
def test_under_torchrun_an_error_of_every_rank_is_said_once_and_one_rank_s_by_it(
        failing, says, tmp_path):
    script = tmp_path / "rank_error.py"
    script.write_text(RANK_ERROR.format(root=str(ROOT)))
    out = run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", str(script),
               failing], ok=False)
    ours = [line for line in out.stderr.splitlines() if line.startswith("error")]
    assert ours == says, out.stderr[-3000:]
    assert "UsageError" not in out.stderr  # no traceback of ours; torchrun reports its own failure


RESUME_ON_TWO_NODES = """import os, sys
sys.path.insert(0, {root!r})
import torch.distributed as dist
from common.run.checkpoints import resume_point
from common.distributed import init_distributed
from common.errors import report_user_errors
report_user_errors()
init_distributed()
# rank 1 reads sys.argv[2]: a second node whose --output_dir is its own disk, not rank 0's
rank = os.environ["RANK"]
step = resume_point(sys.argv[1 + int(rank)], True, 5)[0]
# each rank's own file: two ranks printing at once interleave their lines on the shared stdout
with open(os.path.join(sys.argv[3], "rank" + rank), "w") as f:
    f.write(f"rank {{rank}} starts at update {{step}}")
dist.destroy_process_group()  # else gloo may abort at exit ("terminate called ...", -6)
"""


@pytest.mark.slow  # the second tier: torchrun
@pytest.mark.parametrize("shared", [True, False])
def test_resume_on_two_nodes_stops_unless_every_rank_sees_rank_0_s_checkpoint(shared, tmp_path):
    import socket

    script = tmp_path / "resume.py"
    script.write_text(RESUME_ON_TWO_NODES.format(root=str(ROOT)))
    run_dir, other_disk = tmp_path / "run", tmp_path / "node1"
    (run_dir / "checkpoint-2").mkdir(parents=True)  # rank 0 wrote it, on rank 0's disk
    torch.save({"step": 2, "optimizers": {}, "extra": {}}, run_dir / "checkpoint-2" / "trainer_state.pt")
    other_disk.mkdir()
    said = tmp_path / "said"
    said.mkdir()
    out = run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               str(script), str(run_dir), str(run_dir if shared else other_disk), str(said)], ok=shared,
              env={**os.environ, "OMP_NUM_THREADS": "1"})
    starts = sorted(p.read_text() for p in said.iterdir())
    if shared:
        assert starts == ["rank 0 starts at update 2", "rank 1 starts at update 2"]
        return
    host = socket.gethostname()
    # after init_process_group torch prefixes each line a rank writes with "[rankN]: "
    lines = [re.sub(r"^\[rank\d+\]: ", "", line) for line in out.stderr.splitlines()]
    ours = [line for line in lines if line.startswith("error")]
    # it used to start rank 1 at update 0 beside rank 0's update 2, and say nothing
    assert ours == [f"error: --resume: rank 1 (on {host}) sees no checkpoint in {run_dir} but rank 0 (on {host}) "
                    "sees checkpoint-2; on several nodes --output_dir must be a shared filesystem that every "
                    "node reads."], out.stderr[-3000:]
    assert starts == []  # neither rank went on
