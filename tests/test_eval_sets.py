"""Evaluation as papers report it: several held-out sets (--eval_datasets), k sampled responses per
problem (--eval_samples) scored as avg@k, pass@k and maj@k against hand-computed values on scripted
responses, the same under 1 and 2 processes; eval.py's several sets in one call and one table."""

import json
import os
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import common.run.evaluation as evaluation
import eval as ev
from common.errors import PathError, UsageError
from common.env.math_env import eval_set_env, eval_set_name, make_env, make_eval_sets
from common.distributed import sample_seed
from common.models.loading import load_policy, load_tokenizer
from common.models.sampler import encode_prompts
from common.run.args import parse_args
from common.run.checks import check_eval_sets
from common.run.plot import eval_keys
import grpo
import tools
import warm

ROOT = Path(__file__).resolve().parents[1]
GSM8K_ROWS = [{"question": f"Sam has {a} apples and buys {b} more. How many has he now?",
               "answer": f"{a} + {b} = {a + b}\n#### {a + b}"} for a, b in
              [(2, 3), (4, 3), (1, 1), (6, 2), (5, 5), (3, 9)]]


def write_rows(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def gsm8k_file(tmp_path):
    return write_rows(tmp_path / "gsm8k_small.jsonl", GSM8K_ROWS)


class Scripted:
    """Stands in for `generate`: each problem's responses as written here, found by the prompt
    (greedy) or by the sample's seed (sampled, response j of problem i drawn with sample_seed(seed,
    i, j)), so the numbers below are computed by hand."""

    def __init__(self, env, tokenizer, greedy, sampled, seed):
        self.tokenizer = tokenizer
        prompts = encode_prompts(tokenizer, [env.prompt(i) for i in range(len(env))])
        self.greedy = {tuple(p): greedy[i] for i, p in enumerate(prompts) if i in greedy}
        self.sampled = {sample_seed(seed, i, j): text for i, texts in sampled.items()
                        for j, text in enumerate(texts)}

    def __call__(self, model, tokenizer, prompts, max_new_tokens, temperature=1.0, top_p=1.0,
                 stop_strings=(), seeds=None, decoder=None, reasoning=None):
        if seeds is None:
            assert temperature == 0.0
            written = [self.greedy[tuple(p)] for p in prompts]
        else:
            assert temperature == 0.6
            written = [self.sampled[s] for s in seeds]

        class Gen:
            truncated = torch.zeros(len(written), dtype=torch.bool)

            def texts(self, tokenizer):
                return written

            def completion_ids(self):
                return [[0] for _ in written]

        return Gen()


def test_sampled_metrics_are_the_hand_computed_ones_on_scripted_responses(gsm8k_file,
                                                                         monkeypatch):
    env = make_env("gsm8k", "test", path=str(gsm8k_file), num_few_shot=0)
    answers = [ex["answer"] for ex in env.examples[:3]]  # 5, 7, 2
    assert answers == ["5", "7", "2"]
    env.examples = env.examples[:3]
    greedy = {0: "2 + 3 = 5. The answer is 5.", 1: "The answer is 6.", 2: "It is 2."}
    sampled = {
        # 2 of 4 right; the vote: 5 twice, 6 once, one without an answer -> 5, right
        0: ["The answer is 5.", "The answer is 6.", "so 5", "The answer is 5."],
        # 1 of 4 right; the vote: 3 twice -> wrong
        1: ["The answer is 3.", "The answer is 7.", "The answer is 3.", "The answer is 8."],
        # none right, and no answer in the asked-for format: no vote
        2: ["two", "It is 2.", "2", "The answer is two."],
    }
    tokenizer = load_tokenizer("tiny-random")
    monkeypatch.setattr(evaluation, "generate", Scripted(env, tokenizer, greedy, sampled, seed=3))
    metrics = evaluation.evaluate_sets(load_policy("tiny-random"), tokenizer, {"small": env}, 200,
                                       16, batch_size=8, samples=4, temperature=0.6, seed=3)
    assert metrics == {
        "eval/small/greedy_pass@1": pytest.approx(1 / 3),  # only problem 0's greedy answer
        "eval/small/avg@4": pytest.approx((2 / 4 + 1 / 4 + 0) / 3),
        "eval/small/pass@4": pytest.approx(2 / 3),  # pass@4 from 4 samples: any right
        "eval/small/maj@4": pytest.approx(1 / 3),
        "eval/small/num_problems": 3,
    }


def test_pass_at_k_from_more_samples_is_the_unbiased_estimate():
    # per problem, from n = 4 samples with c right: pass@2 = 1 - C(4 - c, 2) / C(4, 2)
    assert evaluation.pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)
    assert evaluation.pass_at_k(4, 3, 2) == 1.0


@pytest.mark.slow  # the second tier: torchrun
def test_the_same_numbers_under_one_and_two_processes(gsm8k_file, tmp_path):
    # the training's evaluation before any update, 2 sets x (greedy + 4 samples), graded by the
    # responses' parity (tests/run_with_test_reward.py) so that the numbers are not all 0
    common = ["tests/run_with_test_reward.py", "grpo", "--model_name_or_path", "tiny-random",
              "--max_steps", "1", "--num_prompts", "2", "--num_generations", "2",
              "--max_new_tokens", "6", "--num_eval_problems", "5", "--eval_batch_size", "8",
              "--eval_datasets", "arithmetic", f"gsm8k={gsm8k_file}", "--eval_samples", "4",
              "--learning_rate", "0"]
    env = {**os.environ, "TEST_CORRECT": "parity"}
    lines = []
    for launch, out in (([sys.executable], "one"),
                        ([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                          "--master_port", "29571"], "two")):
        done = warm.run([*launch, *common, "--output_dir", str(tmp_path / out)], cwd=ROOT,
                        capture_output=True, text=True, timeout=600, env=env)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        rows = [json.loads(line) for line in
                (tmp_path / out / "eval.jsonl").read_text().splitlines()]
        lines.append([{k: v for k, v in row.items() if k != "time"} for row in rows])
    one, two = lines
    assert one == two
    first = one[0]
    assert first["step"] == 0 and first["eval/gsm8k/num_problems"] == 5
    assert first["eval/arithmetic/num_problems"] == 5
    assert first["eval/accuracy"] == first["eval/arithmetic/greedy_pass@1"]
    assert set(first) == {"step", "eval/accuracy"} | {
        f"eval/{s}/{m}" for s in ("arithmetic", "gsm8k")
        for m in ("greedy_pass@1", "avg@4", "pass@4", "maj@4", "num_problems")}
    # the parities vary: some sets' numbers are neither 0 nor 1
    values = [v for k, v in first.items() if k.startswith("eval/") and "num_" not in k]
    assert any(0 < v < 1 for v in values), first
    # each avg@4 is a multiple of 1/20 (5 problems x 4 samples), pass@4 >= avg@4
    for s in ("arithmetic", "gsm8k"):
        assert first[f"eval/{s}/avg@4"] * 20 == pytest.approx(round(first[f"eval/{s}/avg@4"] * 20))
        assert first[f"eval/{s}/pass@4"] >= first[f"eval/{s}/avg@4"]


def test_the_default_evaluation_logs_what_it_did(tmp_path):
    # no --eval_datasets, no --eval_samples: one greedy set, eval.jsonl as before
    args = parse_args(grpo.Args, ["--model_name_or_path", "tiny-random", "--output_dir",
                                  str(tmp_path)])
    assert args.eval_datasets is None and args.eval_samples == 0
    assert make_eval_sets(args) == {}


def test_eval_sets_are_named_and_read_as_their_tasks(gsm8k_file, tmp_path):
    math_file = write_rows(tmp_path / "aime.jsonl", [
        {"problem": "Find the remainder.", "answer": "033"},
        {"problem": "Find n.", "answer": "7"}])
    args = parse_args(grpo.Args, ["--difficulty", "1-3", "--eval_datasets", "arithmetic",
                                  str(gsm8k_file), f"aime24={math_file}", "owner/some_set",
                                  "--output_dir", str(tmp_path / "run")])
    assert [eval_set_name(g) for g in args.eval_datasets] == [
        "arithmetic", "gsm8k_small", "aime24", "some_set"]
    args.eval_datasets = args.eval_datasets[:3]  # no hub here
    sets = make_eval_sets(args, say=lambda _: None)
    # the training task's name stands for the run's own held-out set, filled in by Run.start
    assert sets["arithmetic"] is None
    assert sets["gsm8k_small"].task.name == "gsm8k" and len(sets["gsm8k_small"]) == 6
    aime = sets["aime24"]
    assert aime.task.name == "aime24" and [ex["answer"] for ex in aime.examples] == ["33", "7"]
    # AIME's convention: an integer in a box; 033 is 33
    assert aime.verify("so \\boxed{033}", 0)[0] == 1.0
    assert aime.verify("so \\boxed{33.0}", 0)[0] == 0.0
    # arithmetic as a set other than the training task's keeps the run's --difficulty
    other = replace(args, dataset_name="gsm8k", eval_datasets=["arithmetic"])
    arithmetic = make_eval_sets(other, say=lambda _: None)["arithmetic"]
    levels = {ex["level"] for ex in arithmetic.examples}
    assert levels == {1, 2, 3}
    assert eval_set_env(args, str(gsm8k_file)).system_prompt.startswith("Solve the math word")


@pytest.mark.parametrize("argv,message", [
    (["--eval_datasets", "arithmetic", "--num_eval_problems", "0"], "--num_eval_problems is 0"),
    (["--eval_samples", "4", "--num_eval_problems", "0"], "--num_eval_problems is 0"),
])
def test_eval_set_options_that_would_do_nothing_are_refused(argv, message, tmp_path):
    args = parse_args(grpo.Args, argv + ["--output_dir", str(tmp_path)])
    with pytest.raises(UsageError, match=message):
        check_eval_sets(args)


def test_tools_and_stepwise_evaluations_refuse_other_sets_and_samples(tmp_path):
    args = parse_args(tools.Args, ["--eval_samples", "4", "--output_dir", str(tmp_path)])
    with pytest.raises(UsageError, match="tools.py evaluates with its tools.*eval.py"):
        check_eval_sets(args)
    args = parse_args(tools.Args, ["--eval_datasets", args.dataset_name, "--output_dir",
                                   str(tmp_path)])
    check_eval_sets(args)  # its own set, greedily, is what it does anyway
    import reinforce_stepwise
    args = parse_args(reinforce_stepwise.Args, ["--eval_datasets", "gsm8k",
                                                "--output_dir", str(tmp_path)])
    with pytest.raises(UsageError, match="reinforce_stepwise.py evaluates stepwise episodes"):
        check_eval_sets(args)


def test_a_set_named_twice_and_an_unknown_set_fail_before_any_model(tmp_path, gsm8k_file):
    args = parse_args(grpo.Args, ["--eval_datasets", str(gsm8k_file), f"x/{gsm8k_file.name}",
                                  "--output_dir", str(tmp_path)])
    with pytest.raises(UsageError, match="names two sets 'gsm8k_small'"):
        make_eval_sets(args, say=lambda _: None)
    args = parse_args(grpo.Args, ["--eval_datasets", "gsm9k", "--output_dir", str(tmp_path)])
    with pytest.raises(UsageError, match="'gsm9k': not a task"):
        make_eval_sets(args, say=lambda _: None)
    with pytest.raises(UsageError, match="--eval_temperature 0 draws 4 copies"):
        check_eval_sets(parse_args(grpo.Args, ["--eval_samples", "4", "--eval_temperature", "0"]))
    check_eval_sets(parse_args(grpo.Args, ["--eval_temperature", "0"]))  # greedy, as the default


def test_the_plot_draws_each_sets_greedy_and_sampled_curves():
    rows = [{"step": 0, "eval/accuracy": 0.1, "eval/a/greedy_pass@1": 0.1, "eval/a/avg@4": 0.2,
             "eval/a/pass@4": 0.5, "eval/a/maj@4": 0.1, "eval/a/num_problems": 8,
             "eval/b/greedy_pass@1": 0.3}]
    assert eval_keys(rows) == [("eval/a/greedy_pass@1", "a greedy"), ("eval/a/avg@4", "a avg@4"),
                               ("eval/b/greedy_pass@1", "b greedy")]
    assert eval_keys([{"step": 0, "eval/accuracy": 0.5}]) == [("eval/accuracy", None)]


# ---- eval.py: several sets in one call ------------------------------------------------------
def test_eval_py_evaluates_several_sets_in_one_call_and_writes_one_table(gsm8k_file, tmp_path,
                                                                         capsys):
    aime = write_rows(tmp_path / "aime.jsonl", [{"problem": "Find n.", "answer": "7"}] * 3)
    out = tmp_path / "sets"
    args = parse_args(ev.Args, ["--model_name_or_path", "tiny-random", "--eval_datasets",
                                "arithmetic", str(gsm8k_file), f"aime24={aime}",
                                "--num_eval_problems", "4", "--max_new_tokens", "4",
                                "--output", str(out)])
    summaries = ev.main(args)
    assert list(summaries) == ["arithmetic", "gsm8k_small", "aime24"]
    assert [summaries[s]["num_problems"] for s in summaries] == [4, 4, 3]
    for name in summaries:
        records = [json.loads(line) for line in (out / f"{name}.jsonl").read_text().splitlines()]
        assert len(records) == summaries[name]["num_problems"]
        saved = json.loads((out / f"{name}.summary.json").read_text())
        assert saved["num_problems"] == summaries[name]["num_problems"]
    table = (out / "table.md").read_text().splitlines()
    assert table[0] == ("| set | problems | samples | max_new_tokens | pass@1 | format ok | "
                        "truncated |")
    assert [row.split(" | ")[:4] for row in table[2:]] == [
        ["| arithmetic", "4", "1", "4"], ["| gsm8k_small", "4", "1", "4"],
        ["| aime24", "3", "1", "4"]]
    assert "wrote " + str(out / "table.md") in capsys.readouterr().out


def test_eval_py_gives_each_set_its_tasks_budget(gsm8k_file, tmp_path):
    aime = write_rows(tmp_path / "aime.jsonl", [{"problem": "Find n.", "answer": "7"}])
    args = parse_args(ev.Args, ["--eval_datasets", str(gsm8k_file), f"aime24={aime}",
                                "arithmetic"])
    budgets = [ev.data_set(args, given)["max_new_tokens"] for given in args.eval_datasets]
    assert budgets == [512, 4096, 64]


@pytest.mark.parametrize("argv,message", [
    (["--eval_datasets", "gsm8k", "--dataset_name", "math"], "--dataset_name describe"),
    (["--eval_datasets", "gsm8k", "--levels", "1-2"], "--levels describe"),
    (["--eval_datasets", "a.jsonl", "b/a.jsonl"], "the set 'a' twice"),
    # a set's name is a file name in the --output folder: nothing written outside it
    (["--eval_datasets", "../escape=a.jsonl"], r"the set's name '../escape' is the name of its "
                                               r"files .* \(NAME=FILE, such as escape=a.jsonl\)"),
    (["--eval_datasets", "a\\b=a.jsonl"], "the set's name 'a\\\\\\\\b'"),
    (["--eval_datasets", ".hidden=a.jsonl"], "start with a dot"),
    (["--eval_datasets", "=a.jsonl"], "may not be empty"),
])
def test_eval_py_refuses_one_set_options_beside_several_sets(argv, message, tmp_path):
    args = parse_args(ev.Args, argv + ["--output", str(tmp_path / "o")])
    with pytest.raises(UsageError, match=message):
        ev.check_args(args)


def test_an_output_that_is_a_file_is_one_line_when_several_sets_are_asked(tmp_path):
    (tmp_path / "afile").write_text("")
    args = parse_args(ev.Args, ["--eval_datasets", "arithmetic", "gsm8k", "--output",
                                str(tmp_path / "afile")])
    with pytest.raises(PathError, match=r"--output .*afile: .*afile is a file, not a folder"):
        ev.check_args(args)
