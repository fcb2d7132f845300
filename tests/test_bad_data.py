"""Data read wrong, data that gave tracebacks, sizes nobody checked (issue 69). Each field is
checked where every task reads it (common/env/tasks.py: `_question`, `_gold`, countdown's numbers
and target, `_json` for every file), so training and `eval.py --responses` give the same one line,
naming the file and the row, with the fix. Most cases call the loader in this process; two run
the real entry points."""

import json
import sys
from pathlib import Path

import pytest
import warm  # tests/warm.py: `python X.py` runs forked from a warm process

from common.errors import UsageError
from common.env.math_env import make_env
from common.env.tasks import MAX_QUESTION_CHARS

ROOT = Path(__file__).resolve().parents[1]
GOLD_FIX = ("it must be a string or a finite number. Fix the row, or point --answer_key at the "
            "field that holds the answer.")
NUMBERS_FIX = ("they must be a list of whole numbers >= 0, such as [3, 7, 25] (the grader reads "
               "the digits of a response, without signs or decimals).")


def _file(tmp_path, *lines):
    path = tmp_path / "data.jsonl"
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n"
                            for line in lines))
    return path


@pytest.mark.parametrize("task,line,says", [
    # read wrong without a word: fractions and a string became other integers ([1, 2, 3], [1, 2])
    ("countdown", {"numbers": [1.5, 2.7, 3], "target": 5},
     f"the numbers are a list ([1.5, 2.7, 3]); {NUMBERS_FIX}"),
    ("countdown", {"numbers": "12", "target": 5}, f"the numbers are text ('12'); {NUMBERS_FIX}"),
    # a negative number can never be matched: the grader reads digits without their sign
    ("countdown", {"numbers": [-3, 4], "target": 1},
     f"the numbers are a list ([-3, 4]); {NUMBERS_FIX}"),
    # tracebacks: int(NaN) and int(inf)
    ("countdown", '{"numbers": [1, 2], "target": NaN}',
     "the target is NaN; it must be a whole number, such as 24."),
    ("countdown", '{"numbers": [1, 2], "target": 1e999}',
     "the target is infinite; it must be a whole number, such as 24."),
    ("countdown", {"numbers": [1, 2], "target": 2.5},
     "the target is float (2.5); it must be a whole number, such as 24."),
    # TinyZero's gold as JSON that is not an object: a traceback from {**row, **[1, 2]}
    ("countdown", {"question": "q", "answer": "[1, 2]"},
     "no 'numbers' (or 'nums') field, and the answer '[1, 2]' is not the JSON object "
     '{"numbers": [...], "target": N} that holds them.'),
    # "#### 5,5" became 55
    ("gsm8k", {"question": "q", "answer": "so #### 5,5"},
     "the gold answer '5,5' is ambiguous (a decimal comma, or thousands in groups of other than 3 "
     "digits): write it as '#### 5.5' or '#### 1,234'."),
    ("gsm8k", {"question": "q", "answer": "The answer is: 12,34"},
     "the gold answer '12,34' is ambiguous"),
    # MATH golds became the strings 'nan' (which a boxed nan matched), '[1, 2]', "{'a': 1}"
    ("math", '{"problem": "p", "answer": NaN}', f"the gold answer is NaN; {GOLD_FIX}"),
    ("math", {"problem": "p", "answer": [1, 2]}, f"the gold answer is a list ([1, 2]); {GOLD_FIX}"),
    ("math", {"problem": "p", "answer": {"a": 1}},
     f'the gold answer is an object ({{"a": 1}}); {GOLD_FIX}'),
    ("math", {"problem": "p", "answer": True}, f"the gold answer is true; {GOLD_FIX}"),
    ("arithmetic", '{"question": "q", "answer": Infinity}',
     f"the gold answer is infinite; {GOLD_FIX}"),
    # a question that is a list or an object: a traceback in the chat template or the hold-out split
    ("gsm8k", {"question": ["a"], "answer": "#### 3"},
     "the question is a list ([\"a\"]), not text; each row's 'question' / 'problem' field must be "
     "a string."),
    ("math", {"problem": {"a": 1}, "answer": "3"},
     "the question is an object ({\"a\": 1}), not text; each row's 'problem' / 'question' field "
     "must be a string."),
    ("arithmetic", {"question": 7, "answer": "3", "level": 1},
     "the question is int (7), not text; each row's 'question' field must be a string."),
    # eval.py groups its accuracy by level: a list there was a traceback at the very end
    ("math", {"problem": "p", "answer": "3", "level": [3]},
     "the level is a list ([3]); it must be text or an integer, such as 3, or absent."),
    ("math", {"problem": "p", "answer": "3", "type": {"a": 1}},
     "the type is an object ({\"a\": 1}); it must be text or an integer, such as 'Algebra', or "
     "absent."),
])
def test_a_field_of_the_wrong_kind_is_one_line_naming_the_row(task, line, says, tmp_path):
    path = _file(tmp_path, {"numbers": [1, 2], "target": 3} if task == "countdown" else
                 {"question": "q", "problem": "p", "answer": "3", "level": 1}, line)
    with pytest.raises(UsageError) as e:
        make_env(task, path=path)
    assert str(e.value).startswith(f"{path}: row 2: {says}"), str(e.value)


def test_a_row_after_blank_lines_is_named_with_its_line(tmp_path):
    path = _file(tmp_path, {"question": "q", "answer": "#### 1"}, "", " ",
                 {"question": "q", "answer": "#### 5,5"})
    with pytest.raises(UsageError, match=r"data.jsonl: row 2 \(line 4\): the gold answer '5,5' is "
                                         "ambiguous"):
        make_env("gsm8k", path=path)


@pytest.mark.parametrize("task,row,answer", [
    ("gsm8k", {"question": "q", "answer": "#### 1,234"}, "1234"),
    ("gsm8k", {"question": "q", "answer": "#### 5.5"}, "5.5"),
    ("gsm8k", {"question": "q", "answer": "#### -1,234,567.5"}, "-1234567.5"),
    ("gsm8k", {"question": "q", "answer": 5.5}, "5.5"),
    ("gsm8k", {"question": "q", "answer": 1e20}, "100000000000000000000"),
    ("math", {"problem": "p", "answer": 0}, "0"),  # a gold of 0 once fell through to the solution
    ("math", {"problem": "p", "answer": 0.25}, "0.25"),
    ("countdown", {"numbers": [3.0, 4], "target": 12.0}, '{"numbers": [3, 4], "target": 12}'),
])
def test_the_usual_forms_still_read(task, row, answer, tmp_path):
    assert make_env(task, path=_file(tmp_path, row)).examples[0]["answer"] == answer


def test_an_integer_past_4300_digits_is_one_line(tmp_path):
    path = _file(tmp_path, {"question": "q", "answer": "3"},
                 '{"question": "q", "answer": ' + "1" * 5000 + "}")
    with pytest.raises(UsageError) as e:
        make_env("gsm8k", path=path)
    assert str(e.value) == (f"{path}, line 2: an integer of 5,000 digits, more than the 4,300 "
                            "Python reads from text: write it as a string (in quotes), or drop "
                            "the row.")
    # a .json file names the line too
    whole = tmp_path / "data.json"
    whole.write_text('[{"question": "q", "answer": "3"},\n {"question": "q", "answer": -'
                     + "2" * 4301 + "}]")
    with pytest.raises(UsageError, match=r"data.json, line 2: an integer of 4,302 digits"):
        make_env("gsm8k", path=whole)


def test_a_question_longer_than_the_bound_is_one_line(tmp_path):
    path = _file(tmp_path, {"question": "x" * MAX_QUESTION_CHARS, "answer": "#### 1"},
                 {"question": "x" * 400_000, "answer": "#### 1"})
    with pytest.raises(UsageError) as e:
        make_env("gsm8k", path=path)
    assert str(e.value) == (f"{path}: row 2: the question has 400,000 characters, more than the "
                            "100,000 a question may have: shorten it or drop the row (is the "
                            "right field read? --question_key names another).")
    # countdown writes its question from the numbers: 30,000 of them make one as long
    path = _file(tmp_path, {"numbers": [10] * 30_000, "target": 5})
    with pytest.raises(UsageError, match=r"row 1: 30,000 numbers make a question of 120,2\d\d "
                                         "characters, more than the 100,000"):
        make_env("countdown", path=path)


class _Bytes:
    """A tokenizer of one token per byte of the text, as the sampler would count a prompt."""

    calls = 0

    def __call__(self, prompts):
        self.calls += len(prompts)
        return [len("".join(m["content"] for m in p).encode()) for p in prompts]


def test_a_prompt_past_the_models_positions_names_the_row_and_the_fix(tmp_path):
    rows = [{"question": "What is 1 + 1?", "answer": "2"}, {"question": "y" * 300, "answer": "1"},
            {"question": "z" * 200, "answer": "1"}]
    env = make_env("gsm8k", path=_file(tmp_path, *rows), num_few_shot=0, system_prompt="")
    count = _Bytes()
    # 300 tokens + 100 new pass 350 positions; the fix is a --max_new_tokens of 50
    with pytest.raises(UsageError) as e:
        env.check_prompt_lengths(count, 350, 100, "tiny-random")
    assert str(e.value) == (f"{tmp_path / 'data.jsonl'}: row 2: the prompt is 300 tokens, which "
                            "with --max_new_tokens 100 passes the 350 positions of tiny-random: "
                            "lower --max_new_tokens to 50 or less, or shorten the question.")
    # only the prompt without a question (8 bytes of bound with the slack) and row 2 (308 > 250)
    # were tokenized: rows 1 and 3 (22 and 208) fit by their bytes alone
    assert count.calls == 2
    # longer than the positions themselves: no --max_new_tokens helps
    with pytest.raises(UsageError, match="row 2: the prompt is 300 tokens, which with "
                                         "--max_new_tokens 8 passes the 250 positions of m: "
                                         "shorten the question or drop the row.$"):
        env.check_prompt_lengths(_Bytes(), 250, 8, "m")
    env.check_prompt_lengths(_Bytes(), 308, 8, "m")  # 300 + 8 fits
    env.check_prompt_lengths(_Bytes(), 250, 8, "m", indices=[0, 2])  # row 2 is not evaluated


def test_eval_refuses_a_malformed_countdown_gold_and_a_long_prompt(tmp_path):
    # the only entry-point runs here: eval.py --responses (no model), then eval.py with one
    bad = tmp_path / "responses.jsonl"
    bad.write_text(json.dumps({"question": "q", "answer": '{"numbers": [1, 2], "target"',
                               "responses": ["<answer>1 + 2</answer>"]}) + "\n")
    out = warm.run([sys.executable, "eval.py", "--dataset_name", "countdown", "--responses",
                    str(bad), "--output", str(tmp_path / "o.jsonl")],
                   cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert out.stderr.splitlines()[-1] == (
        f"error: {bad}: row 1: no 'numbers' (or 'nums') field, and the answer "
        "'{\"numbers\": [1, 2], \"target\"' is not the JSON object {\"numbers\": [...], "
        "\"target\": N} that holds them.")
    assert not (tmp_path / "o.jsonl").exists()

    long = _file(tmp_path, {"question": "What is 1 + 1?", "answer": "2"},
                 {"question": "What is " + " + ".join(["1"] * 1500) + "?", "answer": "1500"})
    out = warm.run([sys.executable, "eval.py", "--model_name_or_path", "tiny-random",
                    "--dataset_name", "gsm8k", "--dataset_path", str(long), "--num_few_shot", "0",
                    "--max_new_tokens", "8", "--output", str(tmp_path / "o.jsonl")],
                   cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-2000:]
    # tiny-random has 4,096 positions; "1 + " is two tokens of SmolLM2's tokenizer
    assert out.stderr.splitlines()[-1].startswith(
        f"error: {long}: row 2: the prompt is ")
    assert out.stderr.splitlines()[-1].endswith(
        " tokens, which with --max_new_tokens 8 passes the 4,096 positions of tiny-random: "
        "shorten the question or drop the row.")
    assert not (tmp_path / "o.jsonl").exists()
