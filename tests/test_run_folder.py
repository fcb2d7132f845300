"""A run folder per run: without --output_dir each run writes to a new runs/<file>/<date>_<time>,
runs/<file>/latest names the newest, --resume continues it; under torchrun a user error is one
line, said by rank 0, and every rank leaves with the same status."""

import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

import eval as ev
import grpo
from common.errors import PathError
from common.run.checkpoints import point_latest, run_folder

ROOT = Path(__file__).resolve().parents[1]
STAMP = r"runs/grpo/\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d"


def test_each_run_gets_a_folder_of_its_own_and_latest_names_the_newest(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = grpo.Args()
    assert args.output_dir is None
    first = run_folder(args, is_main=True)
    second = run_folder(args, is_main=True)  # in the same second: a -2 after the name
    assert re.fullmatch(STAMP, first) and second == first + "-2", (first, second)
    assert Path(first).is_dir() and Path(second).is_dir()
    assert not (tmp_path / "runs/grpo/latest").exists()  # named only once a run has begun
    point_latest(first)
    point_latest(second)
    assert os.readlink("runs/grpo/latest") == Path(second).name
    # --resume without --output_dir: the run latest names, as a real folder, not the link
    assert run_folder(replace(args, resume=True), is_main=True) == second
    # --output_dir given: that folder, untouched by any of this
    assert run_folder(replace(args, output_dir="mine"), is_main=True) == "mine"
    assert not Path("mine").exists()


def test_resume_with_no_earlier_run_names_the_fix(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(PathError, match=r"^--resume continues the latest run in runs/grpo, but "
                                        r"runs/grpo/latest names none: pass --output_dir FOLDER"):
        run_folder(replace(grpo.Args(), resume=True), is_main=True)


def test_a_second_evaluation_of_a_model_is_written_beside_the_first(tmp_path):
    first = tmp_path / "m-arithmetic-test.jsonl"
    assert ev.free_output(first) == first
    first.write_text("")
    assert ev.free_output(first) == tmp_path / "m-arithmetic-test-2.jsonl"
    (tmp_path / "m-arithmetic-test-2.summary.json").write_text("{}")  # a summary alone takes it
    assert ev.free_output(first) == tmp_path / "m-arithmetic-test-3.jsonl"
    folder = tmp_path / "m-sets"
    folder.mkdir()
    assert ev.free_output(folder) == tmp_path / "m-sets-2"


@pytest.mark.slow  # the second tier: three starts of grpo.py
def test_a_failed_start_leaves_no_folder_and_two_runs_leave_two(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    quick = ["--model_name_or_path", "tiny-random", "--max_steps", "1", "--num_eval_problems",
             "2", "--no_eval_on_start", "--max_new_tokens", "4"]
    bad = subprocess.run([sys.executable, str(ROOT / "grpo.py"), *quick, "--dataset_name",
                          "nosuch"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert bad.returncode == 1 and bad.stderr.strip().splitlines()[-1].startswith(
        "error: --dataset_name 'nosuch'"), bad.stderr[-2000:]
    assert list((tmp_path / "runs/grpo").iterdir()) == []  # its empty folder went with it
    said = []
    for _ in range(2):  # the Quickstart's command twice in a row
        out = subprocess.run([sys.executable, str(ROOT / "grpo.py"), *quick], cwd=tmp_path,
                             env=env, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-2000:]
        said.append(re.search(rf"^run folder: ({STAMP}(-\d+)?)$", out.stdout, re.M).group(1))
    assert said[0] != said[1]
    assert sorted(p.name for p in (tmp_path / "runs/grpo").iterdir()) == sorted(
        [Path(said[0]).name, Path(said[1]).name, "latest"])
    assert os.readlink(tmp_path / "runs/grpo/latest") == Path(said[1]).name
    assert (tmp_path / said[1] / "checkpoint-1" / "config.json").is_file()


LAUNCHER_LINE = re.compile(r"^[WEI]\d{4} ")  # torchrun's own log lines: W1202 20:17:00.92 ...


@pytest.mark.slow  # the second tier: torchrun
@pytest.mark.parametrize("flags,says,status", [
    (["--max_steps", "0"], "error: --max_steps 0: must be >= 1 (the default is 20).", 1),
    (["--max_steps", "abc"], "grpo.py: error: argument --max_steps/--max-steps: invalid int "
                             "value: 'abc'", 2),
    # found later, in main, by the task's data (make_envs), which every rank reads alike
    (["--dataset_name", "no_such_task"], "error: --dataset_name 'no_such_task': not a task "
     "(arithmetic, countdown, gsm8k, math), a MATH subject (prealgebra, algebra, number_theory, "
     "counting_and_probability, geometry, intermediate_algebra, precalculus), a benchmark (aime24, "
     "aime25, amc23, math500, minerva_math, olympiadbench), a data file or a hub dataset id.", 1)])
def test_under_torchrun_an_option_error_is_said_once_last_and_every_rank_exits_alike(
        flags, says, status, tmp_path):
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                          str(ROOT / "grpo.py"), "--model_name_or_path", "tiny-random", *flags],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    lines = out.stderr.splitlines()
    assert sum(says in line for line in lines) == 1, out.stderr[-3000:]
    # the last line of ours, before torchrun's first error line and its summary
    first_launcher_error = next(k for k, line in enumerate(lines) if line.startswith("E1"))
    ours = [line for line in lines[:first_launcher_error] if not LAUNCHER_LINE.match(line)]
    assert ours[-1] == says, out.stderr[-3000:]
    assert re.findall(r"exitcode\s+: (-?\d+)", out.stderr) == [str(status)] * 2, out.stderr[-3000:]
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs/grpo").iterdir())
