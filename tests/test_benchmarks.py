"""The six benchmarks papers report (aime24, aime25, amc23, math500, minerva_math, olympiadbench):
the hub data each loads, a test split only, their answer conventions, budget, prompt and local
files. Rows are fabricated: nothing is downloaded."""

import json

import pytest

import common.env.tasks as tasks
from common.errors import UsageError
from common.env.math_env import filter_math, make_env, make_envs, resolve_task, verify
from common.env.tasks import MATH, TASKS, Task, detect_task, load_few_shot
from grpo import Args

BENCHMARKS = {  # name -> (hub id, config, split) and a row with the hub's columns
    "aime24": (("HuggingFaceH4/aime_2024", None, "train"),
               {"id": 60, "problem": "Find x.", "solution": "... so $\\boxed{033}$.",
                "answer": "033", "url": "https://aops", "year": "2024"}),
    "aime25": (("math-ai/aime25", None, "test"), {"problem": "Find x.", "answer": "70", "id": "0"}),
    "amc23": (("math-ai/amc23", None, "test"), {"id": 0, "question": "Find x.", "answer": 27.0}),
    "math500": (("HuggingFaceH4/MATH-500", None, "test"),
                {"problem": "Find x.", "solution": "So $\\boxed{\\frac12}$.", "answer": "\\frac12",
                 "subject": "Algebra", "level": 3, "unique_id": "test/algebra/1.json"}),
    "minerva_math": (("math-ai/minervamath", None, "test"),
                     {"question": "Find x.", "answer": "1.3"}),
    "olympiadbench": (("math-ai/olympiadbench", None, "test"),
                      {"id": 1606, "question": "Find x.", "solution": ["First...", "Then..."],
                       "final_answer": ["$\\frac{1}{2}$"], "is_multiple_answer": False,
                       "unit": None, "answer_type": "Numerical", "subfield": "Algebra"}),
}
GOLDS = {"aime24": "33", "aime25": "70", "amc23": "27", "math500": "\\frac12",
         "minerva_math": "1.3", "olympiadbench": "\\frac{1}{2}"}


@pytest.fixture
def hub(monkeypatch):
    """load_hub_rows replaced: records (name, config, split) and returns the benchmark's row."""
    calls = []

    def fake(name, config, split):
        calls.append((name, config, split))
        return [row for (hub_id, row) in BENCHMARKS.values() if hub_id[0] == name]

    monkeypatch.setattr(tasks, "load_hub_rows", fake)
    return calls


def test_registered_after_the_four_tasks_with_maths_prompt_and_budget():
    assert list(TASKS) == ["arithmetic", "countdown", "gsm8k", "math", *BENCHMARKS]
    for name in BENCHMARKS:
        cls = TASKS[name]
        assert issubclass(cls, MATH) and cls.name == name
        assert cls.system_prompt == MATH.system_prompt
        assert cls.budget == 4096 and cls.few_shot_task == "math"
        assert list(cls.hub) == ["test"]
        assert cls.benchmark
    assert Task.budget is None and MATH.budget is None and MATH.few_shot_task is None
    assert not any(TASKS[name].benchmark for name in ("arithmetic", "countdown", "gsm8k", "math"))


def test_unknown_names_list_the_benchmarks_apart():
    with pytest.raises(UsageError) as e:
        make_env("aime")
    assert "the tasks are arithmetic, countdown, gsm8k, math. " in str(e.value)
    assert str(e.value).endswith("The benchmarks, evaluated only: aime24, aime25, amc23, math500, "
                                 "minerva_math, olympiadbench.")
    with pytest.raises(UsageError) as e:
        resolve_task(Args(dataset_name="aime"), say=lambda _: None)
    assert "a benchmark (aime24, aime25, amc23, math500, minerva_math, olympiadbench)" in str(
        e.value)


@pytest.mark.parametrize("name", BENCHMARKS)
def test_test_split_loads_the_hub_dataset_with_its_columns(name, hub):
    env = make_env(name, "test")
    assert hub == [BENCHMARKS[name][0]]
    assert len(env) == 1
    assert env.examples[0]["question"] == "Find x."
    assert env.examples[0]["answer"] == GOLDS[name]
    assert env.examples[0]["row"] == BENCHMARKS[name][1]  # a --reward_fn sees the hub's row
    assert verify(name, f"So \\boxed{{{GOLDS[name]}}}.", env.examples[0]["answer"]) == 1.0


@pytest.mark.parametrize("name", BENCHMARKS)
def test_train_split_is_refused_before_any_data_loads(name, hub, monkeypatch, tmp_path):
    def no_few_shot(*a, **k):
        raise AssertionError("few-shot file read before the split was checked")

    monkeypatch.setattr("common.env.math_env.load_few_shot", no_few_shot)
    missing = tmp_path / "never_read.jsonl"  # read, it would raise PathError, not UsageError
    for path in (None, missing):
        with pytest.raises(UsageError) as e:
            make_env(name, "train", path=path, num_few_shot=1)
        assert f"--eval_datasets {name}" in str(e.value)
        assert f"eval.py --dataset_name {name}" in str(e.value)
    with pytest.raises(UsageError, match="only a test split"):
        TASKS[name].load("train", None, seed=0)
    assert hub == []


def test_a_training_file_given_a_benchmark_is_told_to_evaluate_it(hub):
    with pytest.raises(UsageError, match="--eval_datasets aime24"):
        make_envs(Args(dataset_name="aime24"), say=lambda _: None)
    assert hub == []


@pytest.mark.parametrize("gold, read", [("033", "33"), (33, "33"), ("33", "33"), (33.0, "33"),
                                        ("0", "0"), ("000", "0"), (999, "999")])
def test_aime_gold_is_an_integer_0_to_999(gold, read):
    for name in ("aime24", "aime25"):
        assert TASKS[name].from_row({"problem": "q", "answer": gold}, "r")["answer"] == read


@pytest.mark.parametrize("gold", ["1000", "33.5", "-3", "\\frac{66}{2}", "abc"])
def test_aime_gold_that_is_no_aime_answer_is_refused(gold):
    with pytest.raises(UsageError, match="not an AIME answer"):
        TASKS["aime24"].from_row({"problem": "q", "answer": gold}, "data.jsonl: row 1")


def test_aime_gold_may_come_from_a_boxed_solution():
    # math-ai/aime24's rows hold only a solution ending in \boxed{}
    row = {"problem": "q", "solution": "Hence $\\boxed{033}$."}
    assert TASKS["aime24"].from_row(row, "r")["answer"] == "33"


@pytest.mark.parametrize("response, reward", [
    ("So \\boxed{33}.", 1.0),
    ("So \\boxed{033}.", 1.0),  # AIME answers are written with three digits
    ("So \\boxed{ 33 }.", 1.0),
    ("A draft gave \\boxed{34}.\nThat is wrong.\nThe sum is \\boxed{33}.", 1.0),  # the last box
    ("So \\boxed{33.5}.", 0.0),
    ("So \\boxed{34}.", 0.0),
    ("So \\boxed{33.0}.", 0.0),  # an integer written as a decimal: not digits alone
    ("So \\boxed{\\frac{66}{2}}.", 0.0),  # never evaluated
    ("So \\boxed{33 \\text{ ways}}.", 0.0),
    ("So \\boxed{1033}.", 0.0),
    ("So \\boxed{-33}.", 0.0),
    ("So \\boxed{33} or \\boxed{34}.", 0.0),  # two candidates: no answer
    ("So \\boxed{33}. The answer is 34.", 0.0),  # the last marker is words, not a box
    ("The answer is 33.", 0.0),  # no box
    ("The answer is $33$.", 0.0),
    ("33", 0.0),
    ("So \\boxed{}.", 0.0),
])
def test_aime_is_right_only_for_the_integer_alone_in_the_last_box(response, reward):
    for name in ("aime24", "aime25"):
        assert verify(name, response, "33") == reward
        assert verify(name, response, "033") == reward  # a gold as a row writes it


def test_aime_format_flag_and_zero():
    assert TASKS["aime24"].grade("The answer is 33.", "33") == (0.0, None, False)
    assert TASKS["aime24"].grade("So \\boxed{33.0}.", "33") == (0.0, "33.0", True)
    assert verify("aime24", "\\boxed{0}", "0") == verify("aime24", "\\boxed{000}", "0") == 1.0
    assert verify("aime24", "\\boxed{0}", "10") == 0.0


def test_amc23_float_gold_reads_as_integer_and_grades_with_math_equal():
    cls = TASKS["amc23"]
    assert cls.from_row({"question": "q", "answer": 27.0}, "r")["answer"] == "27"
    assert cls.from_row({"question": "q", "answer": 2.5}, "r")["answer"] == "2.5"
    fraction = cls.from_row({"question": "q", "answer": "\\frac{3}{4}"}, "r")["answer"]
    assert fraction == "\\frac{3}{4}"
    assert verify("amc23", "\\boxed{27}", "27") == 1.0
    assert verify("amc23", "\\boxed{27.0}", "27") == 1.0  # math_equal: the same number
    assert verify("amc23", "The answer is $27$.", "27") == 1.0  # MATH's markers
    assert verify("amc23", "\\boxed{28}", "27") == 0.0
    assert verify("amc23", "27", "27") == 0.0  # a bare number is no answer


def test_olympiadbench_final_answer_list():
    cls = TASKS["olympiadbench"]
    one = cls.from_row({"question": "q", "final_answer": ["$\\frac{1}{2}$"]}, "r")
    assert one["answer"] == "\\frac{1}{2}"
    assert verify("olympiadbench", "\\boxed{0.5}", one["answer"]) == 1.0
    assert verify("olympiadbench", "\\boxed{\\frac{1}{3}}", one["answer"]) == 0.0
    several = cls.from_row({"question": "q", "final_answer": ["$1$", "$x=2$"]}, "r")
    assert several["answer"] == "1, x=2"
    assert verify("olympiadbench", "\\boxed{x=2, 1}", several["answer"]) == 1.0  # any order
    assert verify("olympiadbench", "\\boxed{1}", several["answer"]) == 0.0  # one of two
    assert verify("olympiadbench", "\\boxed{1, 2, 3}", several["answer"]) == 0.0
    text = cls.from_row({"question": "q", "final_answer": "$5$"}, "r")  # a plain string too
    assert verify("olympiadbench", "\\boxed{5}", text["answer"]) == 1.0
    solution = cls.from_row({"question": "q", "final_answer": ["$5$"], "solution": ["a", "b"]},
                            "r")["solution"]
    assert solution == "a\n\nb"


@pytest.mark.parametrize("answers", [[], [3], ["$$"]])
def test_olympiadbench_bad_final_answer_is_refused(answers):
    with pytest.raises(UsageError, match="final_answer"):
        TASKS["olympiadbench"].from_row({"question": "q", "final_answer": answers}, "r")


def test_minerva_and_math500_grade_with_math_equal():
    assert verify("minerva_math", "\\boxed{1.30}", "1.3") == 1.0
    assert verify("minerva_math", "\\boxed{1.4}", "1.3") == 0.0
    ex = TASKS["math500"].from_row(BENCHMARKS["math500"][1], "r")
    assert (ex["answer"], ex["level"], ex["subject"]) == ("\\frac12", 3, "Algebra")
    assert verify("math500", "\\boxed{0.5}", "\\frac12") == 1.0
    assert verify("math500", "\\boxed{2}", "\\frac12") == 0.0


@pytest.mark.parametrize("name", BENCHMARKS)
def test_a_local_file_with_the_hubs_columns_reads_the_same_way(name, hub, tmp_path):
    path = tmp_path / f"{name}.jsonl"
    path.write_text(json.dumps(BENCHMARKS[name][1]) + "\n")
    env = make_env(name, "test", path=path)
    assert hub == []  # offline: the hub is never asked
    assert [ex["answer"] for ex in env.examples] == [GOLDS[name]]
    # the command line's way: --dataset_name NAME --dataset_path FILE stays NAME
    args = Args(dataset_name=name, dataset_path=str(path))
    assert resolve_task(args, say=lambda _: None) == (name, str(path), None)


def test_prompt_is_maths_system_prompt_and_worked_example(tmp_path):
    path = tmp_path / "aime.jsonl"
    path.write_text(json.dumps({"problem": "Find x.", "answer": "033"}) + "\n")
    math_example = load_few_shot(TASKS["math"], 1)[0]
    assert load_few_shot(TASKS["aime24"], 1) == [math_example]  # read as math reads it
    messages = make_env("aime24", "test", path=path, num_few_shot=1).reset(0)
    assert messages == [{"role": "system", "content": MATH.system_prompt},
                        {"role": "user", "content": math_example["question"]},
                        {"role": "assistant", "content": math_example["solution"]},
                        {"role": "user", "content": "Find x."}]


def test_other_tasks_keep_their_behaviour(tmp_path):
    # a file of AIME's columns, named without its task, is still read as math
    assert detect_task([{"problem": "Find x.", "answer": "033"}]) == "math"
    assert load_few_shot(TASKS["math"], 1)[0]["answer"] == TASKS["math"].from_row(
        json.loads((tasks.DATA_DIR / "few_shot_math.jsonl").read_text().splitlines()[0]),
        "r")["answer"]
    assert TASKS["math"].hub["test"] == TASKS["math500"].hub["test"]
    # --levels and the MATH subjects filter the math task only
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps(BENCHMARKS["math500"][1]) + "\n")
    env = make_env("math500", "test", path=path)
    with pytest.raises(UsageError, match="not math500"):
        filter_math(env, None, "3", say=lambda _: None)
    assert resolve_task(Args(dataset_name="algebra"), say=lambda _: None) == ("math", None,
                                                                              "algebra")
