"""Bad runs, round five (issue 69): what is planted where a run or eval.py writes, a full disk, a
launcher killed under its ranks, and a student's file that exits, loops or does not parse. Each is
one line naming the fix, with no traceback and no hang, and nothing is written outside the run.

Each class is closed where the writes are, not case by case: every file a run writes is checked for
its kind before it is opened (common/run/logger.py's kind_of, refuse_special, open_log,
check_new_file; common/run/checkpoints.py's check_run_folder), every write goes through disk_room,
every rank launched by torchrun watches its launcher (common/distributed.py), and the
checker reaches every verdict in its own process (exercises/check.py)."""

import errno
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

import eval as ev
from common.errors import PathError

ROOT = Path(__file__).resolve().parents[1]


def _regrade_args(tmp_path, **changes):
    """eval.py regrading one saved response: no model, milliseconds."""
    saved = tmp_path / "saved.jsonl"
    saved.write_text(json.dumps({"answer": "18", "response": "The answer is 18."}) + "\n")
    return replace(ev.Args(), dataset_name="gsm8k", responses=str(saved),
                   output=str(tmp_path / "out" / "e.jsonl"), **changes)


def _victim(tmp_path):
    """A folder of someone else's, with one file in it that nothing may touch."""
    victim = tmp_path / "yours"
    victim.mkdir()
    (victim / "file.txt").write_text("precious")
    return victim


def _untouched(victim):
    assert sorted(p.name for p in victim.iterdir()) == ["file.txt"]
    assert (victim / "file.txt").read_text() == "precious"


def _within(seconds, fn):
    """fn() run in a thread: its result, or a failure if it has not returned after `seconds` (an
    open that waits on a pipe forever would hang the suite instead)."""
    out = {}

    def target():
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: B036 - handed to the test's thread
            out["error"] = e

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still waiting after {seconds} s"
    if "error" in out:
        raise out["error"]
    return out.get("value")


# ---- eval.py's two files: the rule of a training run's folder -----------------------------------
@pytest.mark.parametrize("overwrite", [False, True])
def test_eval_refuses_a_link_planted_beside_its_output_even_with_overwrite(tmp_path, overwrite):
    # the summary was written through the link, without --overwrite
    victim = _victim(tmp_path)
    args = _regrade_args(tmp_path, overwrite=overwrite)
    summary = tmp_path / "out" / "e.summary.json"
    summary.parent.mkdir()
    summary.symlink_to(victim / "file.txt")
    with pytest.raises(PathError) as said:
        ev.main(args)
    assert str(said.value) == (
        f"--output: {summary} is a symbolic link (to {victim / 'file.txt'}), and nothing is "
        f"written through a link: remove it (rm {summary}), or pass another --output.")
    _untouched(victim)
    assert not (tmp_path / "out" / "e.jsonl").exists()


def test_eval_refuses_an_earlier_summary_without_overwrite(tmp_path):
    args = _regrade_args(tmp_path)
    summary = tmp_path / "out" / "e.summary.json"
    summary.parent.mkdir()
    summary.write_text("an earlier evaluation's")
    with pytest.raises(PathError, match=f"--output {summary} exists \\(an earlier evaluation\\): "
                                        "pass --overwrite"):
        ev.main(args)
    assert summary.read_text() == "an earlier evaluation's"


def test_eval_replaces_links_planted_after_its_check_and_follows_none(tmp_path, monkeypatch):
    # planted while the grading runs: the writes are renames of new files, so the links go
    victim = _victim(tmp_path)
    args = _regrade_args(tmp_path)
    output, summary = tmp_path / "out" / "e.jsonl", tmp_path / "out" / "e.summary.json"
    regrade = ev.regrade

    def plant_then_regrade(*a):
        output.parent.mkdir(exist_ok=True)
        output.symlink_to(victim / "file.txt")
        summary.symlink_to(victim / "new.txt")  # a link to nothing would create the file
        return regrade(*a)

    monkeypatch.setattr(ev, "regrade", plant_then_regrade)
    assert ev.main(args)["accuracy"] == 1.0
    assert not output.is_symlink() and json.loads(output.read_text())["answer"] == "18"
    assert not summary.is_symlink() and json.loads(summary.read_text())["num_problems"] == 1
    _untouched(victim)


@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_eval_refuses_a_pipe_or_a_folder_as_either_file_even_with_overwrite(tmp_path, kind):
    # a FIFO as --output with --overwrite: open() waited for a reader forever
    args = _regrade_args(tmp_path, overwrite=True)
    out = tmp_path / "out"
    out.mkdir()
    for name, said in (("e.jsonl", "e.jsonl"), ("e.summary.json", "e.summary.json")):
        path = out / name
        os.mkfifo(path) if kind == "fifo" else path.mkdir()
        what = "a named pipe (FIFO)" if kind == "fifo" else "a folder"
        with pytest.raises(PathError) as error:
            _within(10, lambda: ev.main(args))
        assert str(error.value) == (f"--output: {out / said} is {what}, not a file: pass the path "
                                    "of a file to write (another --output).")
        os.unlink(path) if kind == "fifo" else path.rmdir()


# ---- the run folder: every name the run writes of the kind it writes ----------------------------
@pytest.mark.parametrize("name,kind,want", [
    ("metrics.jsonl", "fifo", "a file"),  # the run hung at its first line
    ("args.json", "folder", "a file"),  # tracebacks at the first write
    ("eval.jsonl", "folder", "a file"),
    ("tb", "file", "a folder"),
    ("checkpoint-3", "file", "a folder"),
])
def test_a_run_folder_entry_of_the_wrong_kind_is_one_line_before_any_model(tmp_path, name, kind,
                                                                           want):
    from common.run.checkpoints import resume_point

    path = tmp_path / name
    {"fifo": os.mkfifo, "folder": os.mkdir, "file": lambda p: Path(p).write_text("")}[kind](path)
    what = {"fifo": "a named pipe (FIFO)", "folder": "a folder", "file": "a file"}[kind]
    with pytest.raises(PathError) as said:
        resume_point(tmp_path, resume=True, max_steps=5)
    assert str(said.value) == (
        f"--output_dir {tmp_path}: {name} there is {what}, where a run writes {want} of that name: "
        f"remove it (rm -r {path}), or pass another --output_dir.")


@pytest.mark.parametrize("reader", [False, True])
def test_the_logger_opens_no_pipe_and_waits_on_none(tmp_path, reader):
    # past the folder's check (a pipe made while the model loaded): refused at once, read or not
    from common.run.logger import Logger
    from grpo import Args

    os.mkfifo(tmp_path / "samples.jsonl")
    held = os.open(tmp_path / "samples.jsonl", os.O_RDONLY | os.O_NONBLOCK) if reader else None
    try:
        for initial_step in (0, 3):  # a new run sets the old lines aside, a resumed one cuts them
            with pytest.raises(PathError) as said:
                _within(10, lambda: Logger(Args(output_dir=str(tmp_path)), initial_step))
            assert str(said.value) == (
                f"{tmp_path / 'samples.jsonl'} is a named pipe (FIFO), where a file is written: "
                f"remove it (rm -r {tmp_path / 'samples.jsonl'}), or pass another --output_dir.")
    finally:
        if held is not None:
            os.close(held)
    from common.run.logger import open_log
    with pytest.raises(PathError, match="is a named pipe \\(FIFO\\), where a file is written"):
        _within(10, lambda: open_log(tmp_path / "samples.jsonl"))


def test_a_folder_as_args_json_is_refused_by_the_logger_too(tmp_path):
    from common.run.logger import Logger
    from grpo import Args

    (tmp_path / "args.json").mkdir()
    with pytest.raises(PathError, match=f"^{tmp_path / 'args.json'} is a folder, where a file is "
                                        "written"):
        Logger(Args(output_dir=str(tmp_path)))
    assert [p.name for p in tmp_path.iterdir()] == ["args.json"]  # no temporary file left


@pytest.mark.parametrize("below", [False, True])
def test_a_dangling_link_as_output_dir_is_one_line(tmp_path, below):
    # mkdir failed on it with FileExistsError, a traceback
    from common.run.checks import check_output_dir

    (tmp_path / "run").symlink_to(tmp_path / "gone")
    path = tmp_path / "run" / "sub" if below else tmp_path / "run"
    with pytest.raises(PathError) as said:
        check_output_dir(path)
    assert str(said.value) == (
        f"--output_dir {path}: {tmp_path / 'run'} is a symbolic link to {tmp_path / 'gone'}, which "
        "does not exist: make that folder, remove the link, or pass another path.")
    (tmp_path / "gone").mkdir()  # a link to a folder is a folder: a run folder on another disk
    check_output_dir(path)


# ---- a full disk: one line that says so, and --resume continues ---------------------------------
FULL = ("the disk is full (No space left on device) while writing {}: free some space (or pass a "
        "folder on another disk), then run the same command with --resume: it continues from the "
        "last complete checkpoint.")


def test_a_full_disk_under_the_logs_says_so_in_one_line(tmp_path):
    # /dev/full answers every write with ENOSPC, as a full disk does
    from common.run.logger import Logger
    from grpo import Args

    logger = Logger(Args(output_dir=str(tmp_path)))
    logger.metrics_file.close()
    logger.metrics_file = open("/dev/full", "a")
    with pytest.raises(PathError) as said:
        logger.log(1, {"x": 1.0})
    assert str(said.value) == FULL.format("/dev/full")
    logger.samples_file.close()
    logger.samples_file = open("/dev/full", "a")
    with pytest.raises(PathError, match="^the disk is full"):
        logger.log_samples(1, [{"response": "4"}])


def test_a_full_disk_during_a_save_says_so_and_leaves_the_last_checkpoint(tmp_path, monkeypatch):
    import torch

    import common.run.checkpoints as ck
    from common.models.loading import load_tokenizer, tiny_random_model

    model, tokenizer = tiny_random_model(), load_tokenizer("tiny-random")
    ck.save_checkpoint(tmp_path / "checkpoint-1", model, tokenizer, 1, algorithm="grpo")
    save = torch.save

    def full_disk(state, path):
        save(state, "/dev/full")  # torch's own error for a full disk: "unexpected pos ..."

    with pytest.raises(RuntimeError, match="unexpected pos"):  # the error the run used to show
        full_disk({"x": torch.zeros(100_000)}, None)
    monkeypatch.setattr(ck.torch, "save", full_disk)

    class Full:  # what statvfs says of a full disk: no blocks free for the user
        f_bavail, f_frsize = 0, 4096

    monkeypatch.setattr(os, "statvfs", lambda folder: Full)
    with pytest.raises(PathError) as said:
        ck.save_checkpoint(tmp_path / "checkpoint-2", model, tokenizer, 2, algorithm="grpo")
    assert str(said.value) == FULL.format(tmp_path / "checkpoint-2")
    # the unfinished folder is gone (its room is free again); the last checkpoint resumes
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-1"]
    monkeypatch.undo()
    assert ck.resume_point(tmp_path, True, 5)[0] == 1


def test_what_counts_as_a_full_disk():
    from common.run.logger import out_of_room

    assert out_of_room(OSError(errno.ENOSPC, "No space left on device"), "/", need=0)
    assert out_of_room(OSError(errno.EDQUOT, "Disk quota exceeded"), "/", need=0)
    # safetensors' error is no OSError; its text carries the system's words
    assert out_of_room(Exception("Error while serializing: I/O error: No space left on device "
                                 "(os error 28)"), "/", need=0)
    # any other error, with room left, is not the disk's and keeps its traceback
    assert not out_of_room(OSError(errno.EACCES, "Permission denied"), "/", need=0)
    assert not out_of_room(RuntimeError("unexpected pos 576 vs 534"), "/", need=0)
    assert out_of_room(RuntimeError("unexpected pos 576 vs 534"), "/", need=2**80)


# ---- torchrun killed with kill -9: its ranks stop within seconds --------------------------------
# The three processes of a torchrun whose agent is killed: this reaper (a subreaper, so that the
# orphaned rank becomes its child and its exit status can be read), the launcher (killed), and
# the rank, set up as torchrun sets one up and then waiting, as a rank does in a collective.
RANK = """
import importlib.util, os, sys, time
# the module alone, without common/models' face (transformers would cost seconds here)
spec = importlib.util.spec_from_file_location("distributed", "common/distributed.py")
distributed = importlib.util.module_from_spec(spec)
spec.loader.exec_module(distributed)
distributed.init_distributed()
print(os.getpid(), flush=True)
time.sleep(120)
"""
LAUNCHER = "import subprocess, sys; subprocess.Popen([sys.executable, '-c', sys.argv[1]]).wait()"
REAPER = """
import ctypes, json, os, signal, subprocess, sys, time
ctypes.CDLL(None).prctl(36, 1)  # PR_SET_CHILD_SUBREAPER: orphans below become this process's
launcher = subprocess.Popen([sys.executable, '-c', sys.argv[1], sys.argv[2]],
                            stdout=subprocess.PIPE)
rank = int(launcher.stdout.readline())
os.kill(launcher.pid, signal.SIGKILL)
launcher.wait()
start = time.time()
while not (done := os.waitpid(rank, os.WNOHANG))[0]:
    if time.time() - start > 30:
        os.kill(rank, signal.SIGKILL)
    time.sleep(0.05)
print(json.dumps({"status": os.waitstatus_to_exitcode(done[1]),
                  "seconds": time.time() - start}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a subreaper is Linux's")
def test_a_rank_whose_launcher_is_killed_stops_within_seconds():
    import socket

    with socket.socket() as s:  # a free port for the rank's rendezvous with itself
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
           "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           "TORCHELASTIC_RUN_ID": "test"}
    out = subprocess.run([sys.executable, "-c", REAPER, LAUNCHER, RANK], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    said = json.loads(out.stdout)
    # the watch looks every second; 143 = 128 + SIGTERM, what torchrun's own shutdown gives
    assert said["status"] == 143 and said["seconds"] < 5, (said, out.stderr[-2000:])
    assert out.stderr.splitlines()[-1].startswith(
        "error (rank 0): the launcher (torchrun, pid ") and out.stderr.endswith(
        ") is gone, so this rank stops too; --resume continues from the last complete "
        "checkpoint.\n")
    assert "Traceback" not in out.stderr


def test_no_watch_without_torchrun(monkeypatch):
    import common.distributed as d

    monkeypatch.delenv("RANK", raising=False)
    d.init_distributed()
    assert "launcher-watch" not in [t.name for t in threading.enumerate()]


# ---- the exercise checker: its verdict, in its own process, within a time limit ----------------
def _student(tmp_path, monkeypatch, text, name="double"):
    """An exercise whose student's file, on the path, holds `text`: its oracle doubles x."""
    from exercises.exercise import Exercise

    module = f"student_{abs(hash(text)) % 10**8}"
    (tmp_path / f"{module}.py").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    return Exercise(id="9.1", title="double", module=module, name=name,
                    oracle=lambda x: 2 * x, cases=lambda: [("x = 3", {"x": 3})])


@pytest.mark.parametrize("body,says", [
    ("return 2 * x", None),
    # each of these hung the checker, or passed it with exit status 0 and no word
    ("while True:\n        pass", "took more than 0.5 s, and was stopped: look for a loop that "
     "never ends (or give it longer with --time_limit)"),
    ("import sys; sys.exit(0)", "x = 3: your double called sys.exit(0): a function returns its "
     "result, and the checker alone ends the check"),
    ("import os; os._exit(0)", "the check ended before its verdict (exit status 0): your double or "
     "its file ends the process (sys.exit, os._exit); a check passes only when it runs to the end"),
])
def test_the_checker_reaches_its_verdict_whatever_the_function_does(tmp_path, monkeypatch, body,
                                                                    says):
    from exercises.check import check_apart

    exercise = _student(tmp_path, monkeypatch, f"def double(x):\n    {body}\n")
    start = time.time()
    assert check_apart(exercise, time_limit=0.5) == says
    assert time.time() - start < 10


def test_an_early_exit_fails_the_command_line_with_its_line(tmp_path, monkeypatch, capsys):
    import exercises.check as checker

    exercise = _student(tmp_path, monkeypatch, "import os\ndef double(x):\n    os._exit(0)\n")
    monkeypatch.setattr(checker, "all_exercises", lambda: {"9.1": exercise})
    assert checker.main(["9.1"]) == 1  # it was 0, with no output: a pass to a grader
    assert capsys.readouterr().out.splitlines() == [
        "PS9.1 double: the check ended before its verdict (exit status 0): your double or its file "
        "ends the process (sys.exit, os._exit); a check passes only when it runs to the end",
        "0 of 1 passed"]


@pytest.mark.parametrize("text,says", [
    ("def double(x):\n    return 2 * x +\n", "{path}, line 2: SyntaxError: invalid syntax; fix that "
     "line, then check again"),
    ("def double(x):\n  return 2 * x\n   y = 1\n", "{path}, line 3: IndentationError: unexpected "
     "indent; fix that line, then check again"),
    ("x = 1\nraise KeyboardInterrupt\n", "{path}, line 2: importing it raised KeyboardInterrupt"),
    ("import no_such_module_anywhere\n", "{path}, line 1: importing it raised ModuleNotFoundError: "
     "No module named 'no_such_module_anywhere'"),
    ("def triple(x):\n    return 3 * x\n", "{path} has no function double: keep its name and "
     "signature as given (`git show HEAD:{path}` shows the file as shipped)"),
    (None, "{path} is missing: restore it with `git checkout -- {path}` (your version, if you had "
     "one, is in your editor or git's history)"),
])
def test_a_students_file_that_does_not_import_is_one_line_naming_its_line(tmp_path, monkeypatch,
                                                                         text, says):
    # each was a traceback
    from exercises.check import check

    exercise = _student(tmp_path, monkeypatch, text or "")
    if text is None:
        (tmp_path / exercise.path).unlink()
    assert check(exercise) == says.format(path=exercise.path)
