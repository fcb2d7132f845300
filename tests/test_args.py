"""common/run/args.py: --help from docstrings, the seeds' flags translated into this project's
vocabulary (one line each, batch sizes by arithmetic, infrastructure flags accepted with what
happens instead, unknown flags named with the closest option), the learning-rate schedules, and the
vocabulary itself: every option of every file has its --help, and every metric key of every algorithm
file is in the metrics table of docs/README.md."""

import importlib
import json
import math
import re
import sys
from dataclasses import fields, replace
from pathlib import Path

import pytest

from dev.algorithms import ALGORITHMS
from common.run.args import field_docs, lr_at, parse_args, schedule
from common.run.seed_flags import ALIASES, reads
import warm  # tests/warm.py: `python X.py` runs forked from a warm process

ROOT = Path(__file__).resolve().parents[1]


def args_of(algo, argv, capsys=None):
    module = importlib.import_module(algo)
    args = parse_args(module.Args, argv)
    return args, (capsys.readouterr().out if capsys else "")


# ---- the front door: the file's own flags never enter the seeds' dialect ----------------------------------------
def entered(argv, algo="grpo"):
    """The functions of common/run/seed_flags.py that parse_args calls on `argv`."""
    called = set()

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.endswith("seed_flags.py"):
            called.add(frame.f_code.co_name)

    sys.setprofile(profile)
    try:
        args_of(algo, argv)
    finally:
        sys.setprofile(None)
    return called


def test_a_start_with_the_files_own_flags_enters_none_of_the_dialect():
    assert entered([]) == set()
    assert entered(["--max_steps", "1"]) == set()
    # every spelling of an own flag: dashes, --name=value, --no_X, --X true, lists
    assert entered(["--max-steps=2", "--no_eval_on_start", "--bf16", "false", "--eval_datasets",
                    "arithmetic", "gsm8k", "--output_dir=~/runs/x"]) == set()
    # a seed's flag enters it, and so does an option under two of its names (it says which wins)
    assert "translate" in entered(["--max_completion_length", "64"])
    assert "translate" in entered(["--eval_on_start", "true", "--no_eval_on_start"])


# ---- renames, notes, rules ------------------------------------------------------------------------------------
def test_a_renamed_flag_prints_one_line_and_sets_the_option(capsys):
    args, out = args_of("appo", ["--ppo_epoch", "3"], capsys)
    assert args.num_ppo_epochs == 3
    assert out.strip() == "--ppo_epoch is OpenR's name for --num_ppo_epochs"
    # oat adds it; here, as in TRL, it is taken off
    args, out = args_of("ppo", ["--non_stop_penalty", "-1.0"], capsys)
    assert args.missing_eos_penalty == 1.0 and "oat's name for --missing_eos_penalty" in out


def test_infrastructure_flags_are_accepted_with_what_happens_instead(capsys):
    args, out = args_of("grpo",
                        ["--collocate", "--vllm_gpu_ratio", "0.7", "--zero-stage", "2", "--gpus",
                         "8"],
                        capsys)
    assert args == parse_args(importlib.import_module("grpo").Args, [])  # nothing changed
    assert "--collocate: one process samples and learns" in out
    assert "--zero_stage: launch with torchrun" in out and "--vllm_gpu_ratio: generation runs" in out


def test_an_unknown_flag_names_the_closest_option():
    with pytest.raises(SystemExit,
                       match=r"--kl_coeficient is not an option here; the closest option is "
                             r"--kl_coef"):
        args_of("ppo", ["--kl_coeficient", "0.1"])
    with pytest.raises(SystemExit,
                       match=r"--ppo_epoch is not an option here \(OpenR's flag, not used by "
                                         r"grpo.py\); the closest option is --num_ppo_epochs"):
        args_of("grpo", ["--ppo_epoch", "2"])


def test_two_names_of_one_option_with_different_values():
    with pytest.raises(SystemExit,
                       match="--generate_max_length and --max_completion_length name the same "
                             "option"):
        args_of("grpo", ["--generate_max_length", "1024", "--max_completion_length", "256"])
    # the same value twice is fine; this project's own name wins over a seed's (a test's --max_steps
    # 1)
    args, _ = args_of("appo", ["--lr", "1e-6", "--learning_rate", "1e-6"])
    assert args.learning_rate == 1e-6
    args, _ = args_of("reinforce", ["--num_iterations", "20", "--max_steps", "1"])
    assert args.max_steps == 1
    args, _ = args_of("reinforce", ["--max_steps", "1", "--num_iterations", "20"])
    assert args.max_steps == 1


def test_oat_batch_sizes_by_arithmetic(capsys):
    # oat's GSM8K PPO example: 64 prompts x 8 samples per rollout, 64 samples per optimizer step
    args, out = args_of("ppo",
                        ["--rollout_batch_size", "64", "--num_samples", "8", "--train_batch_size",
                         "64",
                                "--train_batch_size_per_device", "8",
                                "--rollout_batch_size_per_device", "8"],
                        capsys)
    assert (args.num_prompts, args.num_generations, args.num_mini_batches,
            args.micro_batch_size) == (64, 8, 8, 8)
    assert "--rollout_batch_size_per_device: per-rank sizes follow" in out
    with pytest.raises(ValueError, match="--train_batch_size 48 must divide"):
        args_of("grpo",
                ["--rollout_batch_size", "8", "--num_samples", "8", "--train_batch_size", "48"])


def test_oat_kl_knobs_pick_the_placement():
    # oat's GSM8K line: a KL loss
    args, _ = args_of("ppo", ["--kl_penalty_coef", "0", "--beta", "0.0001"])
    assert (args.beta, args.kl_penalty, args.kl_estimator) == (0.0001, "loss", "k3")
    args, _ = args_of("ppo", ["--kl_penalty_coef", "0.05"])  # KL in the reward, k1
    assert (args.beta, args.kl_penalty, args.kl_estimator) == (0.05, "reward", "k1")
    with pytest.raises(ValueError, match="two KL terms at once"):
        args_of("ppo", ["--kl_penalty_coef", "0.05", "--beta", "0.1"])


def test_trl_batch_sizes_by_arithmetic(monkeypatch):
    # GRPO: per_device_train_batch_size counts completions; 8 x 4 accumulation x 2 processes = 64 =
    # 8 prompts x 8
    monkeypatch.setenv("WORLD_SIZE", "2")
    args, _ = args_of("grpo",
                      ["--per_device_train_batch_size", "8", "--gradient_accumulation_steps", "4",
                               "--num_generations", "8", "--max_completion_length", "256"])
    assert (args.num_prompts, args.micro_batch_size, args.max_new_tokens,
            args.num_mini_batches) == (8, 8, 256, 1)
    # steps_per_generation 8 = 2 x the accumulation: 2 optimizer steps per rollout of 8 x 2 x 8
    # completions
    args, _ = args_of("grpo",
                      ["--per_device_train_batch_size", "8", "--gradient_accumulation_steps", "4",
                               "--steps_per_generation", "8", "--num_generations", "8"])
    assert (args.num_prompts, args.num_mini_batches) == (16, 2)
    monkeypatch.setenv("WORLD_SIZE", "1")
    # PPO: a rollout batch of per_device x accumulation x TRL's one minibatch prompts; 10000
    # episodes / 64
    args, _ = args_of("ppo",
                      ["--per_device_train_batch_size", "64", "--gradient_accumulation_steps", "1",
                              "--total_episodes", "10000"])
    assert (args.num_prompts, args.num_mini_batches, args.micro_batch_size,
            args.max_steps) == (64, 1, 64, 156)


def test_llm_rl_collection_is_one_episode_per_problem_without_a_baseline():
    args, _ = args_of("reinforce_stepwise",
                      ["--num_collection_episodes", "100", "--max_trajectory_steps", "10",
                       "--sym_calc", "--kl_coeff", "0.25", "--update_ref_iterations", "2"])
    assert (args.num_prompts, args.num_generations, args.baseline) == (100, 1, "none")
    assert (args.sym_calc, args.max_episode_steps, args.beta,
            args.ref_model_sync_steps) == (True, 10, 0.25, 2)
    args, _ = args_of("reinforce", ["--num_collection_episodes", "100", "--baseline", "mean"])
    assert args.baseline == "mean"  # an explicit option wins over the seed's


# ---- learning-rate schedules ----------------------------------------------------------------------------------
@pytest.mark.parametrize("schedule,expected", [
    # 2 warmup updates (1e-3 x 1/2, x 2/2), then 8 more down to the end; progress p = (step - 2) / 8
    ("constant", [5e-4, 1e-3, 1e-3, 1e-3, 1e-3, 1e-3]),
    ("linear", [5e-4, 1e-3, 1e-3 * 7 / 8, 1e-3 * 6 / 8, 1e-3 * 4 / 8, 1e-3 * 1 / 8]),
    ("cosine",
     [5e-4,
      1e-3] + [1e-3 * 0.5 * (1 + math.cos(math.pi * p)) for p in (1 / 8, 2 / 8, 4 / 8, 7 / 8)]),
    ("polynomial",
     [5e-4, 1e-3] + [(1e-3 - 1e-7) * (1 - p) + 1e-7 for p in (1 / 8, 2 / 8, 4 / 8, 7 / 8)]),
])
def test_schedules_at_a_few_updates(schedule, expected):
    args = importlib.import_module("grpo").Args(output_dir="x", learning_rate=1e-3,
                                                 warmup_steps=2, max_steps=10,
                                                 lr_scheduler=schedule)
    got = [lr_at(step, args) for step in (0, 1, 3, 4, 6, 9)]
    assert got == pytest.approx(expected, rel=1e-9)
    # a critic's rate on the same schedule: the schedule of its own peak
    assert lr_at(3, args, base=2e-3) == lr_at(3, replace(args, learning_rate=2e-3))


def test_epochs_and_warmup_ratio_once_the_data_is_read():
    args = importlib.import_module("grpo").Args(output_dir="x", num_train_epochs=1.5,
                                                 warmup_ratio=0.1)
    assert schedule(args, num_problems=100, problems_per_update=8) == (19, 2)  # ceil(150 / 8), ceil(1.9)
    plain = importlib.import_module("grpo").Args(output_dir="x", max_steps=7, warmup_steps=3)
    assert schedule(plain, num_problems=100, problems_per_update=8) == (7, 3)  # as given


@pytest.mark.parametrize("algo", ["grpo", pytest.param("ppo", marks=pytest.mark.slow)])
def test_a_resumed_run_continues_the_schedule(algo, tmp_path):
    # 3 updates straight against 2 + a resume: the logged learning rates agree, and follow the
    # cosine
    import sys

    common = ["tests/run_with_test_reward.py", algo, "--model_name_or_path", "tiny-random",
              "--max_new_tokens", "4",
              "--num_eval_problems", "0", "--num_prompts", "2", "--num_generations", "2",
              "--micro_batch_size", "4",
              "--num_mini_batches", "1", "--lr_scheduler", "cosine", "--warmup_steps", "1",
              "--learning_rate",
              "1e-3"]
    for out, steps in (("straight", ["3"]), ("split", ["2"]), ("split", ["3", "--resume"])):
        warm.run([sys.executable, *common, "--max_steps", *steps, "--output_dir",
                  str(tmp_path / out)], cwd=ROOT, check=True, capture_output=True, text=True)
    lrs = {out: [json.loads(x)["lr"] for x in (tmp_path / out / "metrics.jsonl").read_text().splitlines()]
           for out in ("straight", "split")}
    # update 0: warmup 1e-3; then cosine over the 2 remaining updates: 1e-3 (p = 0), 5e-4 (p = 1/2)
    assert lrs["straight"] == lrs["split"] == pytest.approx([1e-3, 1e-3, 5e-4])


# ---- one vocabulary -----------------------------------------------------------------------------------------
def vocabulary():
    """{metric key: row} of the vocabulary table in docs/README.md, one row each."""
    text = (ROOT / "docs/README.md").read_text()
    table = text[text.index("## Vocabulary"):]
    table = table[:table.index("\n## ", 3)] if "\n## " in table[3:] else table
    names = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0].startswith("`"):
            for name in re.findall(r"`([^`]+)`", cells[0]):
                assert name.lstrip("-") not in names, f"the vocabulary defines {name} twice"
                names[name.lstrip("-")] = cells
    return names


def test_every_option_of_every_file_has_its_help_and_the_vocabulary_no_copy_of_it():
    # what an option means is its docstring, which --help prints; the page's table holds only what
    # --help cannot say (the metric keys), so that no second text of an option can drift. One
    # meaning per option name: tests/test_layers.py
    names = vocabulary()
    for algo in [*ALGORITHMS, "eval"]:
        module = importlib.import_module(algo)
        docs = field_docs(module.Args)
        for f in fields(module.Args):
            assert docs.get(f.name), f"{algo}.py --{f.name} has no docstring"
            assert f.name not in names, f"docs/README.md's vocabulary repeats --{f.name}'s help"


def test_no_alias_is_also_an_option_of_its_file():
    for alias in ALIASES:
        for algo in (a for a in ALGORITHMS if reads(alias.files, a)):
            module = importlib.import_module(algo)
            assert alias.name not in {f.name for f in fields(module.Args)}, (algo, alias.name)
            if alias.to:
                assert alias.to in {f.name for f in fields(module.Args)}, (algo, alias.name, alias.to)


def logged_keys(algo):
    """The metric keys a file writes: the string keys of its metrics dict and of its loss stats."""
    source = (ROOT / f"{algo}.py").read_text()
    keys = set(re.findall(r'(?:[{,]\s*|^\s+)"([a-z_]+(?:/[a-z_]+)?)": ',
                          source[source.index("def "):],
                          re.MULTILINE))
    keys |= set(re.findall(r'metrics\["([a-z_/]+)"\]', source))
    keys |= set(re.findall(r'stats\["([a-z_/]+)"\]', source))
    # the dict keys of samples, batches and checkpoints are not metrics
    return keys - {"question", "answer", "response", "reward", "advantage", "value", "return",
                   "chosen", "rejected",
                   "policy", "critic",
                   "envs", "ref_policy", "input_ids", "attention_mask", "response_mask",
                   "old_logprobs", "advantages",
                   "returns", "values", "extra", "optimizers", "timeouts", "kl", "rewards", "sampler_logprobs",
                   "queue"}


@pytest.mark.parametrize("algo", ALGORITHMS)
def test_every_metric_key_is_in_the_vocabulary(algo):
    names = vocabulary()
    keys = logged_keys(algo)
    # the parser finds them (a DPO step has no ratio to a sampling policy: no approx_kl)
    expected = {"reward/mean", "accuracy", "entropy", "approx_kl", "grad_norm", "lr"}
    if algo == "sft":  # no rollout, no reward: the loss of the solutions
        expected = {"loss", "entropy", "grad_norm", "lr"}
    assert expected - ({"approx_kl"} if algo == "online_dpo" else set()) <= keys
    for key in keys:
        assert key in names, f"{algo}.py logs {key!r}, which docs/README.md's vocabulary does not define"


@pytest.mark.parametrize("algo,flag,says", [
    ("reinforce", "--stepwise", "reinforce.py: --stepwise: LLM_RL's stepwise policy is "
                                "reinforce_stepwise.py now: run that file."),
    ("reinforce", "--sym_calc", "reinforce.py: --sym_calc: LLM_RL's stepwise policy is "
                                "reinforce_stepwise.py now"),
    ("ppo", "--tis_cap", "ppo.py: --tis_cap: truncated importance sampling is async_grpo.py's: "
                         "async_grpo.py --max_staleness 0 --off_policy_correction tis")])
def test_an_option_that_left_for_its_recipe_s_file_names_the_new_form(algo, flag, says):
    with pytest.raises(SystemExit) as e:
        parse_args(importlib.import_module(algo).Args, [flag, "2"] if "cap" in flag else [flag])
    assert str(e.value).startswith(says), str(e.value)


# ---- --help ---------------------------------------------------------------------------------------------
def help_entries(args_class):
    """{option: its help text, one line} of `python X.py --help`."""
    from common.run.args import make_parser
    parser = make_parser(args_class)
    formatter = parser._get_formatter()
    return {action.option_strings[0]: " ".join(formatter._expand_help(action).split())
            for action in parser._actions if action.option_strings and action.help}


@pytest.mark.parametrize("algo", [*ALGORITHMS, "eval"])
def test_help_says_each_default_once_and_a_no_switch_only_what_it_turns_off(algo):
    entries = help_entries(importlib.import_module(algo).Args)
    for flag, text in entries.items():
        assert text.count("default:") <= 1, (flag, text)
        if flag.startswith("--no_"):
            assert text == f"turn --{flag[5:]} off", (flag, text)
    # a default the docstring does not state is given with the range; one it states, alone
    assert entries["--num_eval_problems"].endswith(
        "(default: all): the fixed random subset training evaluates; with --responses, the first "
        "N rows (>= 0)" if algo == "eval" else "(default: 200; >= 0)")
    assert entries["--levels"].endswith("e.g. '1-3' or '4,5' (default: all)")
