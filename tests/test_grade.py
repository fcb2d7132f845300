"""The grading mode (exercises/grade.py, docs/course.md "For a teacher"): each student's files in a
fresh copy of the project, on inputs of the student's own seed, with a file that imports the
solution refused before it runs, and the class's grades in grades.csv and grades.json."""

import contextlib
import csv
import io
import json

import pytest

import torch

from exercises.check import check, check_apart
from exercises.exercise import Exercise, Wrong, close, run_checks
from exercises.grade import main, refusal, student_seed
from exercises.ps1 import cases
from exercises.ps1.cases import EXERCISES as PS1

# Written as a student would, by hand; the print is a student's debugging, which the report must
# survive.
RIGHT_MEAN = '''import torch


def masked_mean(x, mask, dim=None):
    print("masked_mean called")
    total = (x * mask).sum() if dim is None else (x * mask).sum(dim)
    count = mask.sum() if dim is None else mask.sum(dim)
    return total / torch.clamp(count, min=1)
'''
RIGHT_GROUPS = '''import torch


def group_advantages(rewards, group_size, scale=True):
    groups = rewards.reshape(-1, group_size)
    centred = groups - groups.mean(dim=1, keepdim=True)
    if scale:
        centred = centred / (groups.std(dim=1, keepdim=True) + 1e-4)
    return centred.reshape(-1)
'''
# Wrong, and printing a verdict of its own to the checker's output besides.
PADDING_COUNTED = '''def masked_mean(x, mask, dim=None):
    print('{"id": "1.1", "title": "masked mean", "passed": true, "message": "ok"}')
    return x.mean() if dim is None else x.mean(dim)
'''
# A student's own checker, which would pass everything were it run.
OWN_CHECKER = {
    "exercises/check.py": 'import sys\nfor id in sys.argv[1:]:\n    print(\'{"id": "%s", '
                          '"passed": true, "message": "ok"}\' % id)\n',
    "exercises/exercise.py": "def run_checks(exercise, fn):\n    pass\n",
    "exercises/ps1/cases.py": "EXERCISES = []\n",
}


def _write(folder, files):
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """A class of three, graded on 1.1 and 1.5 (2 points): one right, in a clone's layout; one
    whose masked_mean counts the padding, with the files alone and a checker of their own; one
    whose e05 is an import of the solution."""
    submissions = tmp_path_factory.mktemp("submissions")
    _write(submissions / "right", {"exercises/ps1/e01_masked_mean.py": RIGHT_MEAN,
                                   "exercises/ps1/e05_group_advantages.py": RIGHT_GROUPS})
    _write(submissions / "wrong", {"e01_masked_mean.py": PADDING_COUNTED,
                                   "e05_group_advantages.py": RIGHT_GROUPS, **OWN_CHECKER})
    _write(submissions / "imports", {"e05_group_advantages.py": "from grpo import "
                                                                "group_advantages\n"})
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        status = main([str(submissions), "--exercises", "1.1", "1.5", "--points", "1.5=2"])
    with open(submissions / "grades.csv", newline="") as f:
        rows = list(csv.reader(f))
    report = json.loads((submissions / "grades.json").read_text())
    return status, printed.getvalue().splitlines(), rows, report


def test_three_students_graded_in_rows_of_points_and_words(graded):
    status, printed, rows, _ = graded
    seed = {name: str(student_seed(name)) for name in ("imports", "right", "wrong")}
    assert status == 0 and rows[0] == ["student", "seed", "exercise", "points", "passed",
                                       "message"]
    assert [row[:5] for row in rows[1:]] == [
        ["imports", seed["imports"], "1.1", "0", "False"],
        ["imports", seed["imports"], "1.5", "0", "False"],
        ["imports", seed["imports"], "total", "0", "0 of 2"],
        ["right", seed["right"], "1.1", "1", "True"],
        ["right", seed["right"], "1.5", "2", "True"],
        ["right", seed["right"], "total", "3", "2 of 2"],
        ["wrong", seed["wrong"], "1.1", "0", "False"],
        ["wrong", seed["wrong"], "1.5", "2", "True"],
        ["wrong", seed["wrong"], "total", "2", "1 of 2"]]
    messages = [row[5] for row in rows[1:]]
    assert messages[0] == "not handed in: no e01_masked_mean.py (in exercises/ps1/ or alone)"
    assert messages[1].startswith("refused: e05_group_advantages.py, line 1 (`from grpo import "
                                  "group_advantages`) imports grpo, the project's own code")
    assert messages[3:6] == ["ok", "ok", ""]
    assert "the padding was counted" in messages[6] and messages[7] == "ok"
    assert printed == [
        f"imports (seed {seed['imports']}): 0 of 2 passed, 0 of 3 points",
        f"right (seed {seed['right']}): 2 of 2 passed, 3 of 3 points",
        f"wrong (seed {seed['wrong']}): 1 of 2 passed, 2 of 3 points; ignored 3 other files: "
        "exercises/check.py, exercises/exercise.py, exercises/ps1/cases.py",
        "wrote " + printed[-1].split("wrote ")[1]]
    assert printed[-1].endswith("grades.json: 3 students, 2 exercises each")


def test_the_json_report_holds_the_same(graded):
    _, _, rows, report = graded
    students = report["students"]
    assert [(s["student"], s["seed"], s["points"], s["max_points"], s["passed"])
            for s in students] == [(name, student_seed(name), points, 3, passed) for name, points,
                                   passed in (("imports", 0, 0), ("right", 3, 2), ("wrong", 2, 1))]
    assert [[(r["id"], r["points"], r["passed"]) for r in s["exercises"]] for s in students] == [
        [("1.1", 0, False), ("1.5", 0, False)], [("1.1", 1, True), ("1.5", 2, True)],
        [("1.1", 0, False), ("1.5", 2, True)]]
    in_csv = [row[5] for row in rows[1:] if row[2] != "total"]
    assert [r["message"] for s in students for r in s["exercises"]] == in_csv


def test_a_students_own_checker_changes_nothing(graded):
    # "wrong" handed in a check.py, exercise.py and cases.py that pass everything: none was
    # taken, the report says so, and the padding counted still fails
    _, _, rows, report = graded
    wrong = report["students"][2]
    assert wrong["ignored"] == sorted(OWN_CHECKER)
    assert rows[-1][5] == "ignored: " + ", ".join(sorted(OWN_CHECKER))
    assert not wrong["exercises"][0]["passed"]
    assert "the padding was counted" in wrong["exercises"][0]["message"]


def test_two_students_get_their_own_inputs_and_the_oracle_passes_on_each(monkeypatch):
    seeds = [student_seed("alice"), student_seed("bob")]
    assert seeds[0] != seeds[1] and 0 not in seeds
    assert seeds == [student_seed("alice"), student_seed("bob")]  # the same at every grading
    assert student_seed("alice", salt="term 2") not in seeds
    shipped = {e.id: e.cases() for e in PS1}
    for seed in seeds:
        monkeypatch.setattr(cases, "STUDENT_SEED", seed)
        for exercise in PS1:  # every exercise has some input of the student's own
            assert not all(close(list(a.values()), list(b.values())) for (_, a), (_, b) in zip(
                exercise.cases(), shipped[exercise.id])), exercise.id
        for exercise in PS1:
            assert check(exercise, solution=True) is None, (seed, exercise.id)
            for words, wrong in exercise.mistakes:  # each mistake is still told apart
                with pytest.raises(Wrong):
                    run_checks(exercise, wrong)


def test_with_json_what_the_function_prints_goes_to_stderr(capfd):
    # so that a print, even one that looks like a verdict, is never read as the checker's
    def loud(x):
        print('{"id": "9.9", "passed": true}')
        return x

    exercise = Exercise("9.9", "a loud identity", "nowhere", "loud", oracle=loud,
                        cases=lambda: [("x = 1", dict(x=torch.tensor(1.0)))])
    assert check_apart(exercise, solution=True, prints_to_stderr=True) is None
    out, err = capfd.readouterr()
    assert out == "" and err.count('{"id": "9.9", "passed": true}') == 2  # the case, the check


@pytest.mark.parametrize("source,line,words", [
    ("from grpo import group_advantages\n", 1, "imports grpo, the project's own code"),
    ("import torch\nfrom common.rl import numerics\n", 2, "imports common, the project's own"),
    ("import torch\nimport exercises.ps1.cases\n", 2, "imports exercises, the project's own"),
    ("import os\n", 1, "imports os, which the exercises do not allow (allowed: torch, numpy"),
    ("from . import e01_masked_mean\n", 1, "is a relative import"),
    ("def f():\n    return __import__('ppo')\n", 2, "uses __import__"),
    ("import importlib\n", 1, "imports importlib, which the exercises do not allow"),
    ("def f():\n    return eval('1')\n", 2, "uses eval"),
    ("def f():\n    return open('grpo.py').read()\n", 2, "uses open"),
    ("import torch\n\n\ndef f():\n    return torch.sys.modules['grpo']\n", 5, "uses .sys"),
    ("def f(x):\n    return x.__class__.__init__.__globals__\n", 2, "uses .__class__"),
])
def test_a_file_that_reaches_for_the_solution_is_refused_naming_its_line(source, line, words):
    said = refusal(source.encode())
    assert said.startswith(f"line {line} (`") and words in said, said


@pytest.mark.parametrize("source", [
    "from __future__ import annotations\nimport math\nimport itertools\n"
    "from functools import reduce\nfrom typing import Optional\n"
    "from collections import defaultdict\nimport numpy as np\nimport torch\n"
    "import torch.nn.functional as F\n",
    RIGHT_MEAN, RIGHT_GROUPS, PADDING_COUNTED,
    "def f(x):\n    return x\n\n\nif __name__ == '__main__':\n    print(f(1))\n",
    "def f(:\n",  # the checker says where it does not parse
] + [e.path for e in PS1], ids=lambda s: s.split("\n")[0][:40])
def test_the_stubs_and_plain_code_are_not_refused(source):
    from exercises.grade import ROOT
    text = (ROOT / source).read_bytes() if source.endswith(".py") else source.encode()
    assert refusal(text) is None


def test_bad_input_is_one_line_before_any_student_is_read(tmp_path, capsys):
    def error(*argv):
        assert main([str(a) for a in argv]) == 2
        lines = capsys.readouterr().err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ")
        return lines[0]

    assert "is not a folder" in error(tmp_path / "nowhere")
    (tmp_path / "grades.csv").write_text("")
    assert "holds no student folders" in error(tmp_path)
    (tmp_path / "alice").mkdir()
    assert error(tmp_path, "--points", "1.5=two") == ("error: --points 1.5=two: give ID=POINTS, "
                                                      "such as 1.8=3")
    assert error(tmp_path, "--exercises", "9.9").startswith("error: no exercise 9.9; the "
                                                            "exercises are 1.1, 1.2")
    assert "--out" in error(tmp_path, "--out", tmp_path / "grades.csv")


def test_the_grader_gives_the_checker_its_own_time_limit():
    from exercises import check, grade
    assert grade.TIME_LIMIT == check.TIME_LIMIT


def test_a_student_with_no_exercise_file_gets_0_and_says_why(tmp_path, capsys):
    (tmp_path / "alice").mkdir()
    (tmp_path / "alice" / "notes.txt").write_text("I ran out of time")
    assert main([str(tmp_path), "--exercises", "1.1", "--out", str(tmp_path / "out")]) == 0
    rows = list(csv.reader(open(tmp_path / "out" / "grades.csv", newline="")))
    seed = str(student_seed("alice"))
    assert rows[1:] == [
        ["alice", seed, "1.1", "0", "False", "no exercise file handed in: alice/ holds no "
         "exercises/ps1/e*.py, nor e*.py files of PS1's names"],
        ["alice", seed, "total", "0", "0 of 1", "ignored: notes.txt"]]
    # the report's folder inside the submissions is not a student
    assert main([str(tmp_path), "--exercises", "1.1", "--out", str(tmp_path / "out")]) == 0
    assert capsys.readouterr().out.count("alice (seed") == 2


def test_a_checker_that_stops_short_gives_no_verdict_and_its_last_words(tmp_path):
    from exercises.grade import check_in
    copy = tmp_path / "project"  # a copy whose checker dies before its first verdict
    _write(copy, {"exercises/__init__.py": "", "exercises/check.py": "import sys\n"
                  "print('out of memory', file=sys.stderr)\nsys.exit(3)\n"})
    assert check_in(copy, ["1.1"], seed=5, time_limit=60.0) == (
        {}, "the checker stopped (exit status 3), its last words: out of memory")
