"""The env interface: make_env, reset/step in single-turn and stepwise mode, seeding, data files,
errors."""

import importlib.util
import json

import pytest

from common.env.answers import safe_arith
from common.env.math_env import make_env, make_envs, verify
from common.errors import PathError, UsageError
from common.env.tasks import DATA_DIR, TASKS, detect_task, load_few_shot
from grpo import Args  # the options of a file: TrainArgs's and the file's own (the seed)

JANET = {
    "question": "Janet's ducks lay 16 eggs per day. She eats 3 and bakes with 4. She sells the "
                "rest for $2 each. How much does she make?",
    "answer": "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 eggs.\nShe makes 9 * 2 = "
              "$<<9*2=18>>18.\n#### 18",
}


@pytest.fixture
def gsm8k_file(tmp_path):
    path = tmp_path / "gsm8k.jsonl"
    path.write_text(json.dumps(JANET) + "\n")
    return path


def test_countdown_one_liner():
    env = make_env("countdown")
    obs = env.reset()
    assert [m["role"] for m in obs] == ["system", "user"]
    assert "<answer> </answer>" in obs[1]["content"]
    obs, reward, done, info = env.step("<answer>1+2</answer>")
    assert (obs, reward, done) == (None, 0.1, True)
    assert info == {"correct": False, "format_ok": True, "pred": "1+2",
                    "answer": env.examples[env.index]["answer"], "steps": 1}


def test_registry():
    assert list(TASKS) == ["arithmetic", "countdown", "gsm8k", "math", "aime24", "aime25", "amc23",
                           "math500", "minerva_math", "olympiadbench"]  # tests/test_benchmarks.py


def test_single_turn_gsm8k_from_file(gsm8k_file):
    env = make_env("gsm8k", path=gsm8k_file)
    assert len(env) == 1
    assert env.examples[0]["answer"] == "18"
    assert env.examples[0]["solution"] == JANET["answer"]
    assert env.reset(0)[-1] == {"role": "user", "content": JANET["question"]}
    assert env.step("She makes 9 * 2 = 18 dollars. The answer is 18.") == (
        None, 1.0, True,
        {"correct": True, "format_ok": True, "pred": "18", "answer": "18", "steps": 1})
    env.reset(0)
    # right number, but no answer marker
    _, reward, _, info = env.step("She makes 18 dollars a day")
    # was (1.0, True, False): without a marker there is no reward (data/README.md, "Grading policy")
    assert (reward, info["correct"], info["format_ok"], info["pred"]) == (0.0, False, False, "18")
    env.reset(0)
    assert env.step("#### 18 or 17")[1:] == (0.0, True,
                                             {"correct": False, "format_ok": False, "pred": None,
                                                          "answer": "18", "steps": 1})
    with pytest.raises(RuntimeError, match="reset"):
        env.step("again")
    assert env.score("The answer is 17.", 0) == (0.0,
                                                 {"correct": False, "format_ok": True, "pred": "17",
                                                  "answer": "18", "steps": 1})


def test_stepwise_plain_with_openr_tag(gsm8k_file):
    env = make_env("gsm8k", path=gsm8k_file, template="plain", system_prompt="", stepwise=True,
                   step_tag=" ки\n")
    prompt = env.reset(0)
    assert prompt == f"Question: {JANET['question']}\nAnswer:"
    # the tag text is stripped, then re-added
    obs, reward, done, info = env.step(" Janet sells 16 - 3 - 4 = 9 eggs. ки\n")
    assert obs == prompt + " Janet sells 16 - 3 - 4 = 9 eggs. ки\n"
    assert (reward, done, info["steps"], info["correct"]) == (0.0, False, 1, False)
    obs, reward, done, _ = env.step(" She makes 9 * 2 = 18 dollars.\n")
    assert (reward, done) == (0.0, False)
    obs, reward, done, info = env.step(" The answer is 18.")
    assert obs == prompt + " Janet sells 16 - 3 - 4 = 9 eggs. ки\n She makes 9 * 2 = 18 dollars. ки\n The answer is 18. ки\n"
    assert (reward, done) == (1.0, True)
    assert info == {"correct": True, "format_ok": True, "pred": "18", "answer": "18", "steps": 3,
                    "cut": False}


def test_stepwise_chat_state_and_max_steps(gsm8k_file):
    env = make_env("gsm8k", path=gsm8k_file, stepwise=True, max_steps=2)
    prompt = env.reset(0)
    obs, *_ = env.step("Janet sells 9 eggs.\n")
    assert obs == prompt + [{"role": "assistant", "content": "Janet sells 9 eggs.\n"}]
    # max_steps reached, no final answer
    obs, reward, done, info = env.step("Each costs 2 dollars.")
    assert obs[-1]["content"] == "Janet sells 9 eggs.\nEach costs 2 dollars.\n"
    assert (reward, done, info["steps"], info["pred"], info["format_ok"],
            info["cut"]) == (0.0, True, 2, "2", False, True)


def test_stepwise_countdown_ends_on_answer_tag():
    env = make_env("countdown", split="test", stepwise=True)
    env.reset(0)
    ex = env.examples[0]
    assert env.step("<think>let me try</think>")[1:3] == (0.0, False)
    _, reward, done, info = env.step(f"<answer>{ex['solution']}</answer>")
    assert (reward, done, info["correct"], info["steps"]) == (1.0, True, True, 2)


def test_reward_fn_hook(gsm8k_file):
    calls = []

    def reward_fn(example, steps, done):
        calls.append((example["answer"], steps, done))
        return 0.5 * len(steps)

    env = make_env("gsm8k", path=gsm8k_file, stepwise=True, reward_fn=reward_fn)
    env.reset(0)
    rewards = [env.step(s)[1] for s in ["Janet sells 9 eggs.", "9 * 2 = 18.", "The answer is 18."]]
    assert rewards == [0.5, 1.0, 1.5]
    assert calls == [
        ("18", ["Janet sells 9 eggs."], False),
        ("18", ["Janet sells 9 eggs.", "9 * 2 = 18."], False),
        ("18", ["Janet sells 9 eggs.", "9 * 2 = 18.", "The answer is 18."], True),
    ]
    # single-turn: one call, done=True
    env = make_env("gsm8k", path=gsm8k_file, reward_fn=reward_fn)
    env.reset(0)
    assert env.step("The answer is 17.")[1] == 0.5
    assert calls[-1] == ("18", ["The answer is 17."], True)


def test_few_shot_chat_and_plain():
    env = make_env("arithmetic", split="test", num_few_shot=2, system_prompt="Be brief.")
    msgs = env.reset(0)
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert msgs[1:3] == [{"role": "user", "content": "What is 47 + 38?"},
                         {"role": "assistant", "content": "47 + 38 = 85.\nThe answer is 85."}]
    assert msgs[-1]["content"] == env.examples[0]["question"]
    env = make_env("arithmetic", split="test", num_few_shot=1, template="plain",
                   system_prompt="Be brief.")
    assert env.reset(0) == f"Be brief.\n\nQuestion: What is 47 + 38?\nAnswer: 47 + 38 = 85.\nThe answer is 85.\n\nQuestion: {env.examples[0]['question']}\nAnswer:"
    env = make_env("gsm8k", path=DATA_DIR / "few_shot_gsm8k.jsonl", num_few_shot=1, stepwise=True,
                   step_tag=" ки\n")
    assert env.reset(0)[2]["content"].endswith("24 - 19 = 5 muffins are left. ки\nThe answer is 5. "
                                               "ки\n")


def test_few_shot_calculator_spans_are_shown_only_to_a_policy_with_a_calculator():
    path = DATA_DIR / "few_shot_gsm8k.jsonl"
    without = make_env("gsm8k", path=path, num_few_shot=2, stepwise=True).reset(0)
    assert without[4]["content"] == "He works 6 + 4 = 10 hours.\nHe earns 10 * 12 = $120.\nThe answer is 120.\n"
    with_calc = make_env("gsm8k", path=path, num_few_shot=2, stepwise=True,
                         calc_annotations=True).reset(0)
    assert with_calc[4]["content"] == ("He works 6 + 4 = <<6+4>>10 hours.\nHe earns 10 * 12 = "
                                       "$<<10*12>>120.\n"
                                       "The answer is 120.\n")
    single_turn = make_env("arithmetic", split="test", num_few_shot=3, template="plain").reset(0)
    assert "<<" not in single_turn and "140 + 42 = 182." in single_turn


# the benchmarks borrow math's file (tests/test_benchmarks.py)
@pytest.mark.parametrize("task", [name for name in TASKS if not TASKS[name].few_shot_task])
def test_few_shot_files_are_correct(task):
    num_rows = len((DATA_DIR / f"few_shot_{task}.jsonl").read_text().splitlines())
    assert num_rows >= (4 if task == "countdown" else 8)
    for ex in load_few_shot(TASKS[task], num_rows):
        assert verify(task, ex["solution"], ex["answer"]) == 1.0, ex
        # one step per line; only the last line holds the final answer
        lines = ex["solution"].split("\n")
        assert TASKS[task].final_answer.search(lines[-1])
        assert not any(TASKS[task].final_answer.search(line) for line in lines[:-1])


def test_seeding_and_splits():
    a, b, c = (make_env("arithmetic", seed=s, num_examples=500) for s in (0, 0, 1))
    assert a.examples == b.examples
    assert a.examples != c.examples
    assert [a.reset() for _ in range(5)] == [b.reset() for _ in range(5)]
    test = make_env("arithmetic", split="test")
    assert len(test) == 500
    assert [len(make_env("arithmetic", split="test",
                         difficulty=d)) for d in range(1, 6)] == [100] * 5
    assert len(make_env("arithmetic", split="test", difficulty="1-2")) == 200
    assert {ex["level"] for ex in make_env("arithmetic", split="test",
                                           difficulty="1,3").examples} == {1, 3}
    assert {ex["level"] for ex in make_env("arithmetic", difficulty="4-5",
                                           num_examples=200).examples} == {4, 5}
    assert make_env("arithmetic", difficulty="2", num_examples=5).examples == make_env(
        "arithmetic", difficulty=2, num_examples=5).examples  # "2" from the command line is level 2
    level1 = make_env("arithmetic", difficulty=1, num_examples=3000)
    assert {ex["level"] for ex in level1.examples} == {1}
    assert not {ex["question"] for ex in level1.examples} & {ex["question"] for ex in test.examples}
    cd = make_env("countdown", num_examples=2000)
    cd_test = make_env("countdown", split="test")
    assert len(cd) == 2000 and len(cd_test) == 500
    assert not {ex["question"] for ex in cd.examples} & {ex["question"] for ex in cd_test.examples}
    assert make_env("countdown", seed=3,
                    num_examples=50).examples == make_env("countdown", seed=3,
                                                          num_examples=50).examples


def test_generated_problems_are_right():
    for ex in make_env("countdown", split="test").examples:
        assert 3 <= len(ex["numbers"]) <= 4 and 1 <= ex["target"] <= 100
        assert verify("countdown", f"<answer>{ex['solution']}</answer>", ex["answer"]) == 1.0
    for ex in make_env("arithmetic", split="test").examples:
        if ex["level"] < 5:
            assert safe_arith(ex["question"].removeprefix("What is ").removesuffix("?")) == int(ex["answer"])
        assert int(ex["answer"]) >= 0
    first = {"question": "What is 66 + 24?", "answer": "90", "level": 1}
    # a file's row is kept as it is: its fields are what a --reward_fn receives; "where" names it
    assert make_env("arithmetic", split="test").examples[0] == {
        **first, "row": first, "where": f"{DATA_DIR / 'arithmetic_test.jsonl'}: row 1"}


def test_make_splits_is_deterministic(tmp_path):
    spec = importlib.util.spec_from_file_location("make_splits", DATA_DIR / "make_splits.py")
    make_splits = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_splits)
    make_splits.DATA_DIR = tmp_path
    make_splits.main()
    for name in ("arithmetic_test.jsonl", "countdown_test.jsonl"):
        assert (tmp_path / name).read_text() == (DATA_DIR / name).read_text()


def test_local_file_formats(tmp_path):
    # OpenR's math_500.jsonl spelling
    rows = [{"problem": "What is 1/2 + 1/2?", "final_answer": "1"}]
    (tmp_path / "openr.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    assert make_env("math", path=tmp_path / "openr.jsonl").examples[0]["answer"] == "1"
    rows = [{"problem": "p", "solution": "so $\\boxed{\\frac{1}{2}}$"}]
    (tmp_path / "m.json").write_text(json.dumps(rows))
    assert make_env("math", path=tmp_path / "m.json").examples[0]["answer"] == "\\frac{1}{2}"
    pyarrow = pytest.importorskip("pyarrow")
    import pyarrow.parquet

    pyarrow.parquet.write_table(pyarrow.Table.from_pylist([JANET]), tmp_path / "g.parquet")
    assert make_env("gsm8k", path=tmp_path / "g.parquet").examples[0]["answer"] == "18"
    # TinyZero's spelling
    (tmp_path / "cd.jsonl").write_text(json.dumps({"nums": [2, 3], "target": 6}))
    assert make_env("countdown",
                    path=tmp_path / "cd.jsonl").examples[0]["answer"] == '{"numbers": [2, 3], "target": 6}'


def test_errors(tmp_path):
    with pytest.raises(ValueError,
                       match="unknown task 'gsm9k'; the tasks are arithmetic, countdown, "
                             r"gsm8k, math\. For your own data and reward, pass a file .* "
                             r"--reward_fn file\.py:name \(docs/your_own_task\.md\)"):
        make_env("gsm9k")
    with pytest.raises(ValueError, match="the tasks are"):
        verify("gsm9k", "1", "1")
    with pytest.raises(PathError,
                       match=r"nope\.jsonl.*path=.*--dataset_path.*openai/gsm8k"):
        make_env("gsm8k", path=tmp_path / "nope.jsonl")
    (tmp_path / "bad.jsonl").write_text(json.dumps({"q": "1+1?", "a": "2"}))
    with pytest.raises(ValueError,
                       match=r"row 1 has no 'question' / 'problem' field \(fields found: \['a', "
                             r"'q'\]\)\. The gsm8k task accepts"):
        make_env("gsm8k", path=tmp_path / "bad.jsonl")
    (tmp_path / "bad_math.jsonl").write_text(json.dumps({"problem": "p", "level": 1}))
    with pytest.raises(ValueError, match="'answer' / 'final_answer' / 'solution' field"):
        make_env("math", path=tmp_path / "bad_math.jsonl")
    (tmp_path / "nohash.jsonl").write_text(json.dumps({"question": "q",
                                                       "answer": "it is eighteen"}))
    with pytest.raises(ValueError, match="no number after '####'"):
        make_env("gsm8k", path=tmp_path / "nohash.jsonl")
    (tmp_path / "data.csv").write_text("question,answer\n")
    with pytest.raises(ValueError, match=r"unsupported file type '\.csv'"):
        make_env("gsm8k", path=tmp_path / "data.csv")
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['temperature'\]"):
        make_env("countdown", temperature=1.0)
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['difficulty'\]"):
        make_env("countdown", difficulty=2)
    with pytest.raises(ValueError, match="difficulty must be"):
        make_env("arithmetic", difficulty=9)
    with pytest.raises(ValueError, match="difficulty must be"):
        make_env("arithmetic", difficulty="easy")
    with pytest.raises(ValueError, match="template must be"):
        make_env("arithmetic", template="alpaca")
    with pytest.raises(ValueError, match="split must be"):
        make_env("arithmetic", split="validation")
    with pytest.raises(ValueError,
                       match="num_few_shot=99 but .*few_shot_countdown.jsonl has 4 examples"):
        make_env("countdown", num_few_shot=99)
    with pytest.raises(ValueError, match="reward_fn must be"):
        make_env("countdown", reward_fn=1.0)


def test_hub_loading(monkeypatch, capsys):
    """The hub path with datasets.load_dataset replaced (no network in tests)."""
    datasets = pytest.importorskip("datasets")
    calls = []

    def fake_load_dataset(name, config, split):
        calls.append((name, config, split))
        if name == "openai/gsm8k":
            return [JANET]
        return [{"problem": "p1", "solution": "so \\boxed{1}",
                 "type": "Algebra"}, {"problem": "p2", "solution": "no box"}]

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    assert make_env("gsm8k", split="test").examples[0]["answer"] == "18"
    env = make_env("math")
    assert [(ex["question"], ex["answer"],
             ex["subject"]) for ex in env.examples] == [("p1", "1", "Algebra")]
    assert "skipped 1 of 2 rows" in capsys.readouterr().out  # the row without \boxed{}
    make_env("math", split="test")
    assert calls == [
        ("openai/gsm8k", "main", "test"),
        ("DigitalLearningGmbH/MATH-lighteval", "default", "train"),
        ("HuggingFaceH4/MATH-500", None, "test"),
    ]


# ---- which task a file is for; MATH subjects and levels ----------------------------------------------------
MATH500_ROWS = [  # MATH-500's fields: problem, solution, answer, subject, level
    {"problem": "What is $2+3$?", "solution": "$\\boxed{5}$", "answer": "5",
     "subject": "Prealgebra", "level": 1},
    {"problem": "Solve $x+1=3$.", "solution": "$x=\\boxed{2}$", "answer": "2",
     "subject": "Algebra", "level": 2},
    {"problem": "How many ways to pick 2 of 4?", "solution": "$\\boxed{6}$", "answer": "6",
     "subject": "Counting & Probability", "level": 3},
    {"problem": "What is $10\\div 2$?", "solution": "$\\boxed{5}$", "answer": "5",
     "subject": "Prealgebra", "level": 4},
]


@pytest.mark.parametrize("row, task", [
    (MATH500_ROWS[0], "math"),
    ({"problem": "What is $1+1$?", "final_answer": "2"}, "math"),  # OpenR's math_500.jsonl
    ({"problem": "p", "solution": "so \\boxed{1}", "type": "Algebra", "level": "Level 1"}, "math"),
    (JANET, "gsm8k"),
    ({"question": "q", "answer": "so 4 + 5 = 9. The answer is: 9"}, "gsm8k"),  # LLM_RL's files
    ({"nums": [2, 3], "target": 6}, "countdown"),  # TinyZero's
    ({"question": "What is 2 + 3?", "answer": "5", "level": 1}, "arithmetic"),
])
def test_a_files_task_is_read_off_its_first_row(row, task):
    assert detect_task([row]) == task


def test_a_math_file_given_with_the_default_task_is_read_as_math(tmp_path):
    path = tmp_path / "math500.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in MATH500_ROWS))
    args = Args(dataset_path=str(path), num_eval_problems=0)
    said = []
    train, _ = make_envs(args, say=said.append)
    assert train.source == ("math", str(path))  # what args.json records
    assert train.task.name == "math" and len(train) == 4
    assert said == [f"{path}: its fields are those of the math task, not arithmetic: reading it as "
                    f"math"]
    assert args.dataset_name == "arithmetic"  # as given: only main writes args


@pytest.mark.parametrize("name, levels, questions", [
    ("prealgebra", None, ["What is $2+3$?", "What is $10\\div 2$?"]),
    ("prealgebra", "1-3", ["What is $2+3$?"]),
    ("counting_and_probability", None, ["How many ways to pick 2 of 4?"]),  # "&" spelled "and"
    ("math", "2,4", ["Solve $x+1=3$.", "What is $10\\div 2$?"]),
])
def test_math_subjects_and_levels_filter_both_splits(tmp_path, name, levels, questions):
    path = tmp_path / "math500.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in MATH500_ROWS))
    args = Args(dataset_name=name, dataset_path=str(path), eval_dataset_path=str(path),
                     levels=levels)
    train, held_out = make_envs(args, say=lambda _: None)
    assert [ex["question"] for ex in train.examples] == questions
    assert [ex["question"] for ex in held_out.examples] == questions
    assert train.source == (name, str(path))  # args.json records the subject that was run


def test_math_filters_say_what_they_cannot_do(tmp_path):
    path = tmp_path / "openr.jsonl"  # OpenR's rows carry neither subject nor level
    path.write_text(json.dumps({"problem": "What is $1+1$?", "final_answer": "2"}) + "\n")
    said = []
    args = Args(dataset_name="prealgebra", dataset_path=str(path), num_eval_problems=0,
                     levels="1")
    assert len(make_envs(args, say=said.append)[0]) == 1
    assert said == ["--dataset_name prealgebra: these rows have no 'subject' field, so all 1 "
                    "problems are used",
                    "--levels 1: these rows have no 'level' field, so no level filter applies"]
    with pytest.raises(ValueError, match="--levels and MATH subjects filter the math task, not "
                                         "arithmetic"):
        make_envs(Args(levels="1-2", num_eval_problems=0), say=lambda _: None)
    path.write_text(json.dumps(MATH500_ROWS[1]) + "\n")
    with pytest.raises(ValueError, match="no problem of subject geometry and levels None"):
        make_envs(Args(dataset_name="geometry", dataset_path=str(path), num_eval_problems=0),
                  say=lambda _: None)
    with pytest.raises(ValueError, match="--dataset_name 'algebre': not a task"):
        make_envs(Args(dataset_name="algebre", num_eval_problems=0), say=lambda _: None)



def test_a_question_with_a_lone_surrogate_is_one_line_not_a_traceback(tmp_path):
    # JSON may hold "\ud800", which no tokenizer encodes: the row is named, before any model loads
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"question": "What is 1 + 2?", "answer": "3"}) + "\n"
                    + json.dumps({"question": "Tom has \ud800 apples and 3 more?", "answer": "3"}))
    with pytest.raises(UsageError) as e:
        make_env("gsm8k", path=str(path))
    assert str(e.value) == (f"{path}: row 2: the question holds a lone surrogate (\\ud800 at "
                            "character 8), half of a UTF-16 pair and no text: write the whole "
                            "character (or its pair of escapes) in the file, or drop the row.")


def test_a_data_file_is_parsed_once_for_its_fields_and_both_splits_and_again_when_changed(
        tmp_path, monkeypatch, capsys):
    import os

    from common.env import tasks
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(f'{{"question": "What is {i} + 1?", "answer": "{i + 1}"}}\n'
                            for i in range(40)))
    parsed = []
    real = tasks._jsonl_rows
    monkeypatch.setattr(tasks, "_jsonl_rows", lambda p: parsed.append(p) or real(p))
    monkeypatch.setattr(tasks, "SAY_READING_BYTES", 100)  # this file counts as large
    monkeypatch.setattr(tasks, "_LAST_READ", {})
    monkeypatch.setattr(tasks, "_LAST_LOADED", {})
    train = make_env("gsm8k", "train", path=str(path), num_few_shot=0)
    test = make_env("gsm8k", "test", path=str(path), num_few_shot=0)
    assert len(parsed) == 1 and [train.examples[k]["answer"] for k in (0, 39)] == ["1", "40"]
    assert test.examples[0]["answer"] == "1"
    assert capsys.readouterr().out.splitlines()[0] == f"reading {path} (0 MB)..."
    path.write_text('{"question": "What is 1 + 1?", "answer": "2"}\n')  # changed: read again
    os.utime(path, ns=(1, 1))
    assert [e["answer"] for e in make_env("gsm8k", "train", path=str(path),
                                          num_few_shot=0).examples] == ["2"]
    assert len(parsed) == 2
