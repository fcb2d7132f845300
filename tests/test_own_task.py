"""Your own task (docs/your_own_task.md): your own reward functions in TRL's convention
(`--reward_fn`), your own data with other field names, and the example in examples/own_task/.
Each test here failed before these extension points existed (the issue's half-working cases)."""

import json
import math
import os
import re
import shlex
import sys
import time
from pathlib import Path

import pytest

from common.env.math_env import make_env, make_envs
from common.errors import PathError, UsageError
from common.env.rewards import load_reward_fn
from common.env.tasks import TASKS, Task, register
from grpo import Args
import warm  # tests/warm.py: `python X.py` runs forked from a warm process

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "own_task"
KEYS = {"question": "prompt_text", "answer": "target"}
ROWS = [json.loads(line) for line in (EXAMPLE / "data.jsonl").read_text().splitlines()]
TEXTS = ["The answer is 26000 millimeters.", "the answer is 3000", "I think it is 1800 cents.",
         "The answer is 14 decades."]  # the example's first four problems: 26000, 3000, 1800, 140


def example_env(**options):
    return make_env("gsm8k", path=EXAMPLE / "data.jsonl", keys=KEYS, num_few_shot=0, **options)


def example_funcs():
    return [load_reward_fn(f"{EXAMPLE}/reward.py:{name}")
            for name in ("names_the_unit", "starts_with_capital")]


def test_a_reward_fn_gets_the_rows_own_fields_and_is_weighted_with_the_verifier():
    env = example_env(reward_funcs=example_funcs(), reward_weights=[1.0, 0.5, 0.25])
    assert [r["unit"] for r in ROWS[:4]] == ["millimeters", "millimeters", "cents", "years"]
    graded = env.score_all(TEXTS, [0, 1, 2, 3])
    # verifier: right number with "The answer is" (0, 1); no marker (2); a wrong number (3)
    assert [info["rewards"] for _, info in graded] == [
        {"verifier": 1.0, "names_the_unit": 1.0, "starts_with_capital": 1.0},
        {"verifier": 1.0, "names_the_unit": 0.0, "starts_with_capital": 0.0},
        {"verifier": 0.0, "names_the_unit": None, "starts_with_capital": 1.0},  # no final answer
        {"verifier": 0.0, "names_the_unit": None, "starts_with_capital": 1.0}]  # a wrong number
    assert [r for r, _ in graded] == [1.75, 1.0, 0.25, 0.25]  # a None is left out of the sum
    assert [info["correct"] for _, info in graded] == [True, True, False, False]
    assert env.reward_metrics() == {"rewards/verifier/mean": 0.5,
                                    "rewards/names_the_unit/mean": 0.5,
                                    "rewards/starts_with_capital/mean": 0.75}
    again = env.reward_metrics()  # read once: then NaN (no response graded), under the same keys
    assert list(again) == ["rewards/verifier/mean", "rewards/names_the_unit/mean",
                           "rewards/starts_with_capital/mean"]
    assert all(math.isnan(v) for v in again.values())


def test_completions_are_chat_messages_or_text_as_in_trl(tmp_path):
    seen = {}

    def spy(prompts, completions, completion_ids, target, **kwargs):
        seen.update(prompts=prompts, completions=completions, ids=completion_ids, target=target,
                    fields=sorted(kwargs))
        return [0.0] * len(completions)

    example_env(reward_funcs=[("spy", spy)]).score_all(["A", "B"], [0, 2], [[5, 6], [7]])
    assert seen["completions"] == [[{"role": "assistant", "content": "A"}],
                                   [{"role": "assistant", "content": "B"}]]
    assert seen["prompts"][1][-1] == {"role": "user", "content": ROWS[2]["prompt_text"]}
    assert seen["ids"] == [[5, 6], [7]] and seen["target"] == ["26000", "1800"]
    assert seen["fields"] == ["prompt_text", "unit"]  # the row as the file has it
    example_env(template="plain", reward_funcs=[("spy", spy)]).score_all(["A"], [0])
    assert seen["completions"] == ["A"] and seen["prompts"][0].endswith("Answer:")


@pytest.mark.parametrize("returned, message", [
    ([1.0], "returned 1 rewards for 2 completions"),
    ([1.0, float("nan")], "returned nan for completion 1; return a finite float"),
    (["1", 0.0], "returned '1' \\(str\\) for completion 0"),
    (0.5, "returned float; return a list"),
    # a dict has a length too: its keys were taken for the rewards
    ({"a": 1.0, "b": 0.0}, "returned dict; return a list"),
    ({1.0, 0.0}, "returned set; return a list"),
])
def test_a_bad_return_is_one_error_naming_the_function(returned, message):
    env = example_env(reward_funcs=[("mine", lambda **kw: returned)])
    with pytest.raises(UsageError, match=f"reward function 'mine' \\(--reward_fn\\) {message}"):
        env.score_all(["a", "b"], [0, 1])


def test_a_slow_reward_fn_is_stopped_at_its_limit_with_one_error(monkeypatch):
    def slow(completions, **kw):
        time.sleep(30)

    def stubborn(completions, **kw):  # catches Exception: the limit must still stop it
        try:
            time.sleep(30)
        except Exception:
            return [1.0] * len(completions)

    monkeypatch.setenv("MATHRL_REWARD_FN_TIMEOUT", "0.5")
    for name, fn in (("slow", slow), ("stubborn", stubborn)):
        env = example_env(reward_funcs=[(name, fn)])
        start = time.monotonic()
        with pytest.raises(UsageError, match=f"reward function '{name}' \\(--reward_fn\\) took "
                           "more than 0.5 s on a batch of 2 completions; make it faster, or allow "
                           "it more time with MATHRL_REWARD_FN_TIMEOUT"):
            env.score_all(["a", "b"], [0, 1])
        assert time.monotonic() - start < 5.0
    monkeypatch.setenv("MATHRL_REWARD_FN_TIMEOUT", "soon")
    with pytest.raises(UsageError, match="MATHRL_REWARD_FN_TIMEOUT=soon: give a number"):
        example_env(reward_funcs=[("f", lambda completions, **kw: [0.0])]).score_all(["a"], [0])


def test_a_slow_reward_fn_ends_the_run_with_one_line(tmp_path):
    (tmp_path / "slow.py").write_text("import time\n\n\ndef slow(completions, **kw):\n"
                                      "    time.sleep(600)\n")
    cmd = [sys.executable, "grpo.py", "--model_name_or_path", "tiny-random",
           "--reward_fn", f"{tmp_path}/slow.py:slow", "--num_prompts", "2",
           "--num_generations", "2", "--max_new_tokens", "4", "--max_steps", "1",
           "--num_eval_problems", "0", "--output_dir", str(tmp_path / "run")]
    out = warm.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300,
                   env={**os.environ, "MATHRL_REWARD_FN_TIMEOUT": "1"})
    assert out.returncode == 1, out.stderr[-2000:]
    # the line follows the progress bar's text (tqdm ends no line), once
    said = ("error: reward function 'slow' (--reward_fn) took more than 1 s on a batch of 4 "
            "completions; make it faster, or allow it more time with "
            "MATHRL_REWARD_FN_TIMEOUT=<seconds>\n")
    assert out.stderr.count(said) == 1 and out.stderr.count("error") == 1, out.stderr[-2000:]
    assert "Traceback" not in out.stderr


def test_reward_fn_specs_fail_with_the_fix(tmp_path, monkeypatch):
    with pytest.raises(UsageError, match="write file.py:function or module:function"):
        load_reward_fn("reward.py")
    with pytest.raises(PathError, match="no file nope.py"):
        load_reward_fn("nope.py:f")
    with pytest.raises(UsageError, match="has no function 'nope' \\(functions in it: "
                                         "names_the_unit, starts_with_capital, text_of\\)"):
        load_reward_fn(f"{EXAMPLE}/reward.py:nope")
    with pytest.raises(PathError, match="no module 'no_such_module_here' on the path"):
        load_reward_fn("no_such_module_here:f")
    (tmp_path / "my_rewards.py").write_text("def f(completions, **kw):\n    return [1.0]\n")
    monkeypatch.chdir(tmp_path)  # module:name is found from the folder a command runs in
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert load_reward_fn("my_rewards:f")[0] == "f"
    with pytest.raises(UsageError, match="--reward_weights 1.0: give 3 weights, the verifier's "
                                         "first, then one per --reward_fn"):
        example_env(reward_funcs=example_funcs(), reward_weights=[1.0])
    with pytest.raises(UsageError, match="--reward_weights 1.0 nan -1.0: every weight must be a "
                                         "finite number"):
        example_env(reward_funcs=example_funcs()[:2], reward_weights=[1.0, math.nan, -1.0])


@pytest.mark.slow  # the second tier: TRL's code
@pytest.mark.skipif(not (ROOT / "examples").exists(), reason="no examples folder")
def test_the_same_function_gives_trls_rewards(tmp_path):
    pytest.importorskip("trl")
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from common.models.loading import load_tokenizer, tiny_random_model

    funcs = example_funcs()
    env = example_env(reward_funcs=funcs, reward_weights=[1.0, 0.5, 0.25])
    ids = [[11, 12], [13], [14, 15, 16], [17]]
    ours = env.score_all(TEXTS, [0, 1, 2, 3], ids)

    def verifier(completions, index, **kwargs):  # the task's verifier, as a TRL reward function
        return [env.verify(c[0]["content"], i)[0] for c, i in zip(completions, index)]

    inputs = [{"prompt": env.prompt(i), **ROWS[i], "index": i} for i in range(4)]
    config = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to=[],
                        per_device_train_batch_size=4, num_generations=4,
                        reward_weights=[1.0, 0.5, 0.25])
    trainer = GRPOTrainer(model=tiny_random_model(), args=config,
                          reward_funcs=[verifier] + [fn for _, fn in funcs],
                          train_dataset=Dataset.from_list(inputs),
                          processing_class=load_tokenizer("tiny-random"))
    completions = [[{"role": "assistant", "content": t}] for t in TEXTS]
    theirs = trainer._calculate_rewards(inputs, [x["prompt"] for x in inputs], completions, ids)
    columns = [[info["rewards"][name] for _, info in ours]
               for name in ("verifier", "names_the_unit", "starts_with_capital")]
    assert [[None if math.isnan(v) else v for v in col] for col in theirs.T.tolist()] == columns
    total = (theirs * trainer.reward_weights).nansum(dim=1)  # TRL's weighted sum
    assert total.tolist() == [reward for reward, _ in ours]


def test_a_task_of_your_own_runs_without_a_few_shot_file(tmp_path):
    @register
    class Capitals(Task):  # a new task: there is no data/few_shot_capitals.jsonl
        name = "capitals"

        @classmethod
        def from_row(cls, row, where):
            return {"question": row["q"], "answer": row["a"]}

    path = tmp_path / "capitals.jsonl"
    path.write_text(json.dumps({"q": "Capital of France?", "a": "Paris"}) + "\n")
    said = []
    try:  # before: "data/few_shot_capitals.jsonl has 0 examples" with the default num_few_shot 1
        env = make_env("capitals", path=path, num_few_shot=1, say=said.append)
    finally:
        TASKS.pop("capitals")
    assert env.few_shot == [] and env.prompt(0)[-1]["content"] == "Capital of France?"
    assert said == ["task capitals: no worked examples (data/few_shot_capitals.jsonl does not "
                    "exist), so the prompts have none"]


def test_a_training_file_without_a_held_out_one_gives_up_a_fifth_offline(tmp_path):
    args = Args(dataset_path=str(EXAMPLE / "data.jsonl"), question_key="prompt_text",
                answer_key="target", num_eval_problems=30)
    said = []
    train, held_out = make_envs(args, say=said.append)  # no hub: the file alone
    assert (len(train), len(held_out)) == (170, 30)
    questions = {ex["question"] for ex in train.examples}
    assert not questions & {ex["question"] for ex in held_out.examples}
    assert len(questions | {ex["question"] for ex in held_out.examples}) == 200
    assert said[-1] == (f"{EXAMPLE / 'data.jsonl'}: no --eval_dataset_path, so 30 of its 200 rows "
                        "are held out for evaluation and 170 train")
    # and 4 rows are too few to hold a fifth out of: evaluation reads them, and says so
    small = tmp_path / "small.jsonl"
    small.write_text("".join(json.dumps(r) + "\n" for r in ROWS[:4]))
    said = []
    train, held_out = make_envs(Args(dataset_path=str(small), question_key="prompt_text",
                                     answer_key="target"), say=said.append)
    assert len(train) == len(held_out) == 4 and "too few to hold a fifth out" in said[-1]


def test_the_keys_decide_the_task_and_a_worked_solution_is_no_gold(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text(json.dumps({"prob": "What is $1+2$?", "sol": "We add: $1+2=3$, so "
                                "$\\boxed{3}$."}) + "\n")
    args = Args(dataset_path=str(path), question_key="prob", answer_key="sol",
                num_eval_problems=0)
    train, _ = make_envs(args, say=lambda _: None)
    # read as math (before: as gsm8k, for want of a 'problem' field), the gold the boxed answer
    assert train.task.name == "math" and train.examples[0]["answer"] == "3"
    assert train.score("So $\\boxed{3}$.", 0)[0] == 1.0
    path.write_text(json.dumps({"prob": "What is $1+2$?", "sol": "We add one and two to get "
                                "three."}) + "\n")
    with pytest.raises(UsageError, match=r"row 1: the answer field holds text, not a final answer"
                                         r" .*point --answer_key at the final answer"):
        make_env("math", path=path, keys={"question": "prob", "answer": "sol"})


def test_eval_py_takes_trainings_data_options(tmp_path):
    import eval as ev
    from common.run.args import parse_args

    args = parse_args(ev.Args, ["--dataset_name", "gsm8k", "--dataset_path",
                                str(EXAMPLE / "data.jsonl"), "--question_key", "prompt_text",
                                "--answer_key", "target", "--system_prompt", "Be brief.",
                                "--reward_fn", f"{EXAMPLE}/reward.py:names_the_unit",
                                "--eval_batch_size", "8", "--levels", "1"])
    assert (args.question_key, args.answer_key, args.eval_batch_size) == ("prompt_text", "target",
                                                                         8)
    assert parse_args(ev.Args, ["--batch_size", "4"]).eval_batch_size == 4  # the old name
    rows = [{"prompt_text": r["prompt_text"], "target": r["target"], "unit": r["unit"],
             "response": t} for r, t in zip(ROWS, TEXTS)]
    (tmp_path / "saved.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = ev.main(parse_args(ev.Args, ["--dataset_name", "gsm8k", "--responses",
                                           str(tmp_path / "saved.jsonl"), "--answer_key", "target",
                                           "--output", str(tmp_path / "regraded.jsonl")]))
    assert summary["accuracy"] == 0.5  # the gold came from the 'target' field
    with pytest.raises(UsageError, match="--responses regrades saved ones with the task's "
                                         "verifier alone"):
        ev.main(parse_args(ev.Args, ["--dataset_name", "gsm8k", "--responses",
                                     str(tmp_path / "saved.jsonl"), "--reward_fn",
                                     f"{EXAMPLE}/reward.py:names_the_unit"]))


def docs_commands():
    """The `python ...` command lines of docs/your_own_task.md, continuations joined."""
    text = re.sub(r"\\\n\s*", " ", (ROOT / "docs" / "your_own_task.md").read_text())
    return [shlex.split(m.group(1)) for m in re.finditer(r"^\s*python (\S+\.py[^\n`]*)", text,
                                                         re.M)]


@pytest.mark.slow  # the second tier: every command of a page
def test_every_command_of_the_page_runs(tmp_path):
    """Each command as the page writes it, on the tiny model and cut to one update (the page's own
    runs use the embedded model)."""
    commands = docs_commands()
    assert [c[0] for c in commands] == ["grpo.py", "grpo.py", "eval.py"]
    for k, argv in enumerate(commands):
        quick = ["--model_name_or_path", "tiny-random", "--max_new_tokens", "4"]
        if argv[0] == "eval.py":
            checkpoint = next((tmp_path / "run0").glob("checkpoint-*"))
            argv = [a if a != "runs/grpo/latest/checkpoint-20" else str(checkpoint) for a in argv]
            quick = ["--max_new_tokens", "4", "--num_eval_problems", "4", "--output",
                     str(tmp_path / "eval.jsonl")]
        else:
            quick += ["--max_steps", "1", "--num_eval_problems", "4", "--output_dir",
                      str(tmp_path / f"run{k}")]
        out = warm.run([sys.executable, *argv, *quick], cwd=ROOT, capture_output=True,
                       text=True, timeout=600)
        assert out.returncode == 0, (argv, out.stdout[-2000:], out.stderr[-2000:])
    line = json.loads((tmp_path / "run0" / "metrics.jsonl").read_text().splitlines()[0])
    assert {"rewards/verifier/mean", "rewards/names_the_unit/mean"} <= set(line)


@pytest.mark.slow  # the second tier: a learning run
def test_the_examples_own_reward_rises(tmp_path):
    """The example's data and reward file, its style reward alone (--reward_weights 0 1): the tiny
    random model learns to start with a capital letter, as in tests/test_learning.py."""
    cmd = [sys.executable, "grpo.py", "--dataset_path", "examples/own_task/data.jsonl",
           "--question_key", "prompt_text", "--answer_key", "target",
           "--reward_fn", "examples/own_task/reward.py:starts_with_capital",
           "--reward_weights", "0", "1", "--model_name_or_path", "tiny-random",
           "--num_prompts", "4", "--num_generations", "8", "--max_steps", "30",
           "--max_new_tokens", "4", "--num_eval_problems", "0", "--num_few_shot", "0",
           "--temperature", "1.0", "--learning_rate", "5e-2", "--output_dir", str(tmp_path)]
    out = warm.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    rewards = [x["rewards/starts_with_capital/mean"] for x in lines]
    assert [x["reward/mean"] for x in lines] == rewards  # weights 0 and 1: the style reward alone
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert first < 0.2 and last > first + 0.5, rewards
