"""The grading mode (exercises/grade.py, docs/course.md "For a teacher"): each student's functions in
a process apart (exercises/worker.py), on inputs of the student's own seed, with a file that imports
the solution refused before it runs; students who attack the grader get nothing for it; and the
class's grades in grades.csv (a row per student), grades_long.csv and grades.json."""

import contextlib
import csv
import io
import json
import math
import os
import shutil
import sys
import tempfile
import zlib
from pathlib import Path
from unittest import mock

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
    rows, long_rows = (list(csv.reader(open(submissions / name, newline="")))
                       for name in ("grades.csv", "grades_long.csv"))
    report = json.loads((submissions / "grades.json").read_text())
    return status, printed.getvalue().splitlines(), rows, long_rows, report


def test_three_students_graded_in_a_row_each_and_a_long_form(graded):
    status, printed, rows, long_rows, _ = graded
    seed = {name: str(student_seed(name)) for name in ("imports", "right", "wrong")}
    # a row per student, a column per exercise and the total: what a gradebook takes
    assert status == 0 and rows == [["student", "seed", "1.1", "1.5", "total"],
                                    ["imports", seed["imports"], "0", "0", "0"],
                                    ["right", seed["right"], "1", "2", "3"],
                                    ["wrong", seed["wrong"], "0", "2", "2"]]
    assert long_rows[0] == ["student", "seed", "exercise", "points", "passed", "message"]
    assert [row[:5] for row in long_rows[1:]] == [
        ["imports", seed["imports"], "1.1", "0", "False"],
        ["imports", seed["imports"], "1.5", "0", "False"],
        ["right", seed["right"], "1.1", "1", "True"],
        ["right", seed["right"], "1.5", "2", "True"],
        ["wrong", seed["wrong"], "1.1", "0", "False"],
        ["wrong", seed["wrong"], "1.5", "2", "True"]]
    messages = [row[5] for row in long_rows[1:]]
    assert messages[0] == "not handed in: no e01_masked_mean.py (in exercises/ps1/ or alone)"
    assert messages[1].startswith("refused: e05_group_advantages.py, line 1 (`from grpo import "
                                  "group_advantages`) imports grpo, the project's own code")
    assert messages[2:4] == ["ok", "ok"]
    assert "the padding was counted" in messages[4] and messages[5] == "ok"
    assert printed == [
        f"imports (seed {seed['imports']}): 0 of 2 passed, 0 of 3 points",
        f"right (seed {seed['right']}): 2 of 2 passed, 3 of 3 points",
        f"wrong (seed {seed['wrong']}): 1 of 2 passed, 2 of 3 points; ignored 3 other files: "
        "exercises/check.py, exercises/exercise.py, exercises/ps1/cases.py",
        "wrote " + printed[-1].split("wrote ")[1]]
    assert printed[-1].endswith("grades.json: 3 students, 2 exercises each")


def test_the_json_report_holds_the_same_and_what_each_student_printed(graded):
    _, _, _, long_rows, report = graded
    students = report["students"]
    assert [(s["student"], s["seed"], s["points"], s["max_points"], s["passed"])
            for s in students] == [(name, student_seed(name), points, 3, passed) for name, points,
                                   passed in (("imports", 0, 0), ("right", 3, 2), ("wrong", 2, 1))]
    assert [[(r["id"], r["points"], r["passed"]) for r in s["exercises"]] for s in students] == [
        [("1.1", 0, False), ("1.5", 0, False)], [("1.1", 1, True), ("1.5", 2, True)],
        [("1.1", 0, False), ("1.5", 2, True)]]
    assert [r["message"] for s in students for r in s["exercises"]] == [
        row[5] for row in long_rows[1:]]
    # the student's prints are kept apart, as theirs: a verdict printed is only a print
    assert students[1]["printed"].startswith("masked_mean called\n")
    assert students[2]["printed"].startswith('{"id": "1.1", "title": "masked mean", "passed": '
                                             "true")
    assert students[0]["printed"] == ""


def test_a_students_own_checker_changes_nothing(graded):
    # "wrong" handed in a check.py, exercise.py and cases.py that pass everything: none was
    # taken, the report says so, and the padding counted still fails
    _, _, _, _, report = graded
    wrong = report["students"][2]
    assert wrong["ignored"] == sorted(OWN_CHECKER)
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
    with mock.patch.object(sys, "platform", "darwin"):
        assert error(tmp_path).startswith("error: the grading mode runs on Linux (it holds")
    (tmp_path / "grades.csv").write_text("")
    assert "holds no student folders" in error(tmp_path)
    (tmp_path / "alice").mkdir()
    assert error(tmp_path, "--points", "1.5=two") == ("error: --points 1.5=two: give ID=POINTS, "
                                                      "such as 1.8=3")
    assert error(tmp_path, "--exercises", "9.9").startswith("error: no exercise 9.9; the "
                                                            "exercises are 1.1, 1.2")
    assert "--out" in error(tmp_path, "--out", tmp_path / "grades.csv")
    assert error(tmp_path, "--jobs", "0").startswith("error: --jobs 0: give 1 or more")
    assert "--memory_limit 10: give 64 MiB or more" in error(tmp_path, "--memory_limit", "10")


def test_the_grader_gives_the_checker_its_own_time_limit():
    from exercises import check, grade
    assert grade.TIME_LIMIT == check.TIME_LIMIT


def test_a_student_with_no_exercise_file_gets_0_and_says_why(tmp_path, capsys):
    (tmp_path / "alice").mkdir()
    (tmp_path / "alice" / "notes.txt").write_text("I ran out of time")
    assert main([str(tmp_path), "--exercises", "1.1", "--out", str(tmp_path / "out")]) == 0
    rows = list(csv.reader(open(tmp_path / "out" / "grades_long.csv", newline="")))
    seed = str(student_seed("alice"))
    assert rows[1:] == [["alice", seed, "1.1", "0", "False", "no exercise file handed in: alice/ "
                         "holds no exercises/ps1/e*.py, nor e*.py files of PS1's names"]]
    report = json.loads((tmp_path / "out" / "grades.json").read_text())
    assert report["students"][0]["ignored"] == ["notes.txt"]
    # the report's folder inside the submissions is not a student
    assert main([str(tmp_path), "--exercises", "1.1", "--out", str(tmp_path / "out")]) == 0
    assert capsys.readouterr().out.count("alice (seed") == 2


# ---- the grading process, against students who attack it -----------------------------------------
# Each of these passes the reading (the attack is in what the code does, not in a name the reading
# refuses): the defence under test is the process apart. Each also hands in a right e05, which
# must keep its point.
_OS = 'o = operator.attrgetter("os")(torch)\n'
HOSTILE = {
    # torch's comparisons made always-true: in the student's process, not the grader's
    "patcher": "import torch\ntorch.allclose = lambda *a, **k: True\n"
               "torch.equal = lambda *a, **k: True\n\n\n"
               "def masked_mean(x, mask, dim=None):\n    return x.sum()\n",
    # a verdict written to the grader's own stdout through /proc
    "forger": "import operator\nimport numpy\nimport torch\n" + _OS +
              "def masked_mean(x, mask, dim=None):\n"
              "    numpy.savetxt(f'/proc/{o.getppid()}/fd/1', numpy.zeros(1), header="
              "'{\"id\": \"1.1\", \"passed\": true, \"message\": \"ok\"}')\n"
              "    return x.sum()\n",
    # a framed answer of its own on the grader's pipe, the worker's fd taken from its argv
    "framer": "import operator\nimport torch\n" + _OS +
              "fd = int(operator.attrgetter('sys.argv')(torch)[2])\n\n\n"
              "def masked_mean(x, mask, dim=None):\n"
              "    text = '{\"id\": 2, \"passed\": true, \"output\": {\"t\": \"float\", \"v\": "
              "1.5}}'.encode()\n"
              "    o.write(fd, len(text).to_bytes(8, 'big') + text)\n    return x.sum()\n",
    # the project's own function looked up by a string the reading cannot see
    "reacher": "import operator\nimport torch\n\n\ndef masked_mean(x, mask, dim=None):\n"
               "    modules = operator.attrgetter('sys.modules')(torch)\n"
               "    return modules['common.rl.numerics'].masked_mean(x, mask, dim)\n",
    # a child left behind, reading a pipe no one writes (where forking is allowed: under root)
    "forker": "import operator\nimport torch\n" + _OS +
              "def masked_mean(x, mask, dim=None):\n    if o.fork() == 0:\n"
              "        o.read(o.pipe()[0], 1)\n    return x.sum()\n",
    "hog": "import torch\n\n\ndef masked_mean(x, mask, dim=None):\n"
           "    return torch.ones(10**10).sum()\n",  # 40 GB, past --memory_limit
    "flooder": "def masked_mean(x, mask, dim=None):\n    while True:\n"
               "        print('x' * 100000)\n",
}


@pytest.fixture(scope="module")
def hostile_class(tmp_path_factory):
    """The hostile students, one right one, one with a file named in invalid UTF-8 and one whose
    folder's name is not UTF-8, graded on 1.1 and 1.5 two at a time."""
    submissions = tmp_path_factory.mktemp("hostile")
    for name, text in HOSTILE.items():
        _write(submissions / name, {"e01_masked_mean.py": text,
                                    "e05_group_advantages.py": RIGHT_GROUPS})
    _write(submissions / "right", {"e01_masked_mean.py": RIGHT_MEAN,
                                   "e05_group_advantages.py": RIGHT_GROUPS})
    _write(submissions / "odd", {"e01_masked_mean.py": RIGHT_MEAN})
    open(os.path.join(os.fsencode(submissions / "odd"), b"notes\xff.txt"), "wb").write(b"\xfe")
    os.mkdir(os.path.join(os.fsencode(submissions), b"caf\xe9"))
    (submissions / os.fsdecode(b"caf\xe9") / "e05_group_advantages.py").write_text(RIGHT_GROUPS)
    printed, scratch = io.StringIO(), tmp_path_factory.mktemp("scratch")
    tempfile.tempdir = str(scratch)  # the students' folders here: their processes are told apart
    try:
        with contextlib.redirect_stdout(printed):
            status = main([str(submissions), "--exercises", "1.1", "1.5", "--jobs", "2"])
    finally:
        tempfile.tempdir = None
    report = json.loads((submissions / "grades.json").read_text())
    return status, printed.getvalue(), report, submissions, scratch


def test_each_hostile_student_gets_no_point_for_what_it_did_not_solve(hostile_class):
    status, printed, report, *_ = hostile_class
    by_name = {s["student"]: s for s in report["students"]}
    assert status == 0 and '"passed": true' not in printed  # the forged verdict went nowhere
    for name in HOSTILE:
        first, fifth = by_name[name]["exercises"]
        assert (first["passed"], first["points"], fifth["passed"], fifth["points"]) == (
            False, 0, True, 1), (name, first["message"])
    said = {name: by_name[name]["exercises"][0]["message"] for name in HOSTILE}
    assert said["patcher"].endswith("expected 1.5, got 10")  # the grader's torch is its own
    assert "raised KeyError: 'common.rl.numerics'" in said["reacher"]  # no solution there
    assert "MiB" not in said["hog"] and "raised RuntimeError" in said["hog"]
    assert "raised OSError: [Errno 27] File too large" in said["flooder"]
    assert said["framer"].startswith("the process running your code answered out of turn")
    assert "raised PermissionError" in said["forger"]  # the grader's /proc/PID/fd: not for it
    assert by_name["flooder"]["printed"] == "x" * 2000  # the prints, kept apart and cut


def test_the_rest_of_a_hostile_class_is_graded_as_if_alone(hostile_class, tmp_path):
    _, _, report, submissions, _ = hostile_class
    by_name = {s["student"]: s for s in report["students"]}
    _write(tmp_path / "right", {"e01_masked_mean.py": RIGHT_MEAN,
                                "e05_group_advantages.py": RIGHT_GROUPS})
    with contextlib.redirect_stdout(io.StringIO()):
        assert main([str(tmp_path), "--exercises", "1.1", "1.5"]) == 0
    alone = json.loads((tmp_path / "grades.json").read_text())["students"][0]
    assert by_name["right"]["exercises"] == alone["exercises"]
    assert [r["message"] for r in alone["exercises"]] == ["ok", "ok"]


def test_what_a_student_forked_is_gone_when_the_grading_ends(hostile_class):
    # the forker's children wait for ever: no process is left that runs in that grading's folders
    scratch = str(hostile_class[4])
    left = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink(f"/proc/{pid}/cwd").startswith(scratch):
                left.append(pid)
        except OSError:
            continue
    assert left == []


def test_any_file_or_folder_name_is_a_row_not_a_crash(hostile_class):
    _, printed, report, submissions, _ = hostile_class
    names = [s["student"] for s in report["students"]]
    assert names == sorted(names, key=lambda n: n.encode()) or "caf\\xe9" in names
    odd = next(s for s in report["students"] if s["student"] == "odd")
    assert odd["ignored"] == ["notes\\xff.txt"] and odd["exercises"][0]["passed"]
    cafe = next(s for s in report["students"] if s["student"] == "caf\\xe9")
    assert cafe["seed"] == zlib.crc32(b"caf\xe9") and cafe["exercises"][1]["passed"]
    rows = list(csv.reader(open(submissions / "grades.csv", newline="", encoding="utf-8")))
    assert len(rows) == 1 + len(HOSTILE) + 3 and ["caf\\xe9", str(zlib.crc32(b"caf\xe9")), "0",
                                                  "1", "1"] in rows


def test_a_student_that_kills_its_grading_process_gets_0_and_the_class_goes_on(tmp_path):
    _write(tmp_path / "killer", {"e01_masked_mean.py": "import operator\nimport torch\n" + _OS +
                                 "def masked_mean(x, mask, dim=None):\n"
                                 "    o.kill(o.getppid(), 9)\n",
                                 "e05_group_advantages.py": RIGHT_GROUPS})
    _write(tmp_path / "right", {"e05_group_advantages.py": RIGHT_GROUPS})
    with contextlib.redirect_stdout(io.StringIO()):
        assert main([str(tmp_path), "--exercises", "1.1", "1.5"]) == 0
    killer, right = json.loads((tmp_path / "grades.json").read_text())["students"]
    assert killer["points"] == 0 and killer["exercises"][0]["message"].startswith(
        "not graded: the grading process was killed while grading this student")
    assert right["exercises"][1]["passed"] and right["points"] == 1


def test_a_folder_name_that_a_spreadsheet_would_run_is_quoted(tmp_path):
    _write(tmp_path / "=HYPERLINK(1)", {"e05_group_advantages.py": RIGHT_GROUPS})
    with contextlib.redirect_stdout(io.StringIO()):
        assert main([str(tmp_path), "--exercises", "1.5"]) == 0
    rows = list(csv.reader(open(tmp_path / "grades.csv", newline="")))
    assert rows[1][0] == "'=HYPERLINK(1)" and rows[1][2:] == ["1", "1"]


def test_a_link_or_a_huge_file_is_refused(tmp_path):
    from exercises.grade import ROOT
    (tmp_path / "linker").mkdir()
    (tmp_path / "linker" / "e01_masked_mean.py").symlink_to(ROOT / "common/rl/numerics.py")
    _write(tmp_path / "huge", {"e01_masked_mean.py": "#" * (1 << 20) + "\n"})
    (tmp_path / "binary").mkdir()  # any byte in a file: a row that says where, never a crash
    (tmp_path / "binary" / "e01_masked_mean.py").write_bytes(b"def f():\n    \x00\xff\xfe\n")
    with contextlib.redirect_stdout(io.StringIO()):
        assert main([str(tmp_path), "--exercises", "1.1"]) == 0
    binary, huge, linker = json.loads((tmp_path / "grades.json").read_text())["students"]
    assert binary["exercises"][0]["message"].startswith("exercises/ps1/e01_masked_mean.py, line ")
    assert "SyntaxError" in binary["exercises"][0]["message"]
    assert linker["exercises"][0]["message"] == ("refused: e01_masked_mean.py is a link: hand in "
                                                 "the file itself")
    assert huge["exercises"][0]["message"] == ("refused: e01_masked_mean.py is 1,048,577 bytes, "
                                               "more than the 1 MiB an exercise file may be")


def test_the_wire_carries_values_and_refuses_what_is_out_of_form():
    from exercises.worker import MAX_MESSAGE, Opaque, decode, encode, receive
    value = (torch.tensor([[1.5, -0.0]]), torch.tensor(3), torch.zeros(0, 4, dtype=torch.bool),
             [2**70, 0.25, float("nan"), None, True, "s"], {"k": torch.tensor([1], dtype=torch.int8)})
    back = decode(json.loads(json.dumps(encode(value))))
    assert isinstance(back, tuple) and close(back[:3], value[:3]) and back[1].dtype == torch.int64
    assert back[2].shape == (0, 4) and back[2].dtype == torch.bool
    assert back[3][:2] == [2**70, 0.25] and math.isnan(back[3][2]) and back[3][3:] == [None, True,
                                                                                         "s"]
    assert torch.equal(back[4]["k"], value[4]["k"]) and back[4]["k"].dtype == torch.int8
    opaque = decode(encode(iter([1])))
    assert isinstance(opaque, Opaque) and repr(opaque).startswith("<list_iterator")
    for bad in ({"t": "tensor", "dtype": "float32", "shape": [3], "data": "AAAA"},  # 3 bytes
                {"t": "tensor", "dtype": "object", "shape": [], "data": ""},
                {"t": "tensor", "dtype": "float32", "shape": [-1], "data": ""},
                {"t": "pickle", "v": "gASV"}, {"t": "int", "v": "9" * 6000}, [1, 2]):
        with pytest.raises(ValueError):
            decode(bad)
    read, write = os.pipe()
    os.write(write, (MAX_MESSAGE + 1).to_bytes(8, "big"))
    with pytest.raises(ValueError, match="more than the 64 MiB"):
        receive(read)
    os.close(read)
    os.close(write)


def test_a_class_of_right_students_gets_full_marks_and_the_same_grades_at_any_jobs(tmp_path):
    # tests/data/right_answers: a right answer to each exercise, written as a student would;
    # four students, each on inputs of their own seed
    answers = Path(__file__).parent / "data" / "right_answers"
    for name in ("ada", "bo", "cy", "di"):
        shutil.copytree(answers, tmp_path / "class" / name)
    reports = []
    for jobs in ("1", "4"):
        with contextlib.redirect_stdout(io.StringIO()):
            assert main([str(tmp_path / "class"), "--jobs", jobs, "--out",
                         str(tmp_path / jobs)]) == 0
        reports.append(json.loads((tmp_path / jobs / "grades.json").read_text())["students"])
    assert reports[0] == reports[1]
    assert [(s["student"], s["points"], s["passed"]) for s in reports[0]] == [
        (name, len(PS1), len(PS1)) for name in ("ada", "bo", "cy", "di")]
    rows = list(csv.reader(open(tmp_path / "1" / "grades.csv", newline="")))
    assert rows[0] == ["student", "seed", *[e.id for e in PS1], "total"]
    assert rows[1] == ["ada", str(student_seed("ada")), *["1"] * len(PS1), str(len(PS1))]


def test_a_loop_an_exit_and_a_crash_fail_their_exercise_and_the_next_gets_a_fresh_process(
        tmp_path):
    exiter = "import operator\nimport torch\n" + _OS + "\n\ndef masked_mean(x, mask, dim=None):\n" \
             "    o._exit(0)\n"
    for name, first in (("looper", "def masked_mean(x, mask, dim=None):\n    while True:\n"
                                   "        pass\n"),
                        ("exiter", exiter),
                        ("importer", "raise SystemExit(0)\n"),
                        ("typo", "def masked_mean(x, mask, dim=None)\n    return x\n")):
        _write(tmp_path / name, {"e01_masked_mean.py": first,
                                 "e05_group_advantages.py": RIGHT_GROUPS})
    with contextlib.redirect_stdout(io.StringIO()):
        assert main([str(tmp_path), "--exercises", "1.1", "1.5", "--time_limit", "3"]) == 0
    said = {s["student"]: [(r["passed"], r["message"]) for r in s["exercises"]]
            for s in json.loads((tmp_path / "grades.json").read_text())["students"]}
    assert {name: rows[1] for name, rows in said.items()} == dict.fromkeys(said, (True, "ok"))
    assert said["looper"][0] == (False, "took more than 3 s, and was stopped: look for a loop "
                                        "that never ends (or give it longer with --time_limit)")
    assert said["exiter"][0][1].startswith("the check ended before its verdict (exit status 0): "
                                           "your masked_mean or its file ends the process")
    assert said["importer"][0][1] == ("exercises/ps1/e01_masked_mean.py, line 1: importing it "
                                      "raised SystemExit: 0")
    assert said["typo"][0][1] == ("exercises/ps1/e01_masked_mean.py, line 1: SyntaxError: "
                                  "expected ':'; fix that line, then check again")
