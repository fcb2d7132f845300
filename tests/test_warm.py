"""tests/warm.py, the forked runs of the other tests: what `python X.py` gives, it gives (output,
exit code, the one-line error of sys.exit("..."), a traceback, the environment, argv, the working
folder), and a run past its timeout is killed with what it started."""

import os
import subprocess
import sys
import time

import pytest

import warm

SCRIPT = r'''
import os, sys, pathlib
print("argv", sys.argv[1:], "cwd", pathlib.Path.cwd().name, "reward", os.environ.get("TEST_REWARD"))
print("to stderr", file=sys.stderr)
mode = sys.argv[1]
if mode == "message":
    sys.exit("error: --x must be positive")
if mode == "code":
    sys.exit(3)
if mode == "raise":
    raise ValueError("boom")
if mode == "sleep":
    import subprocess, time
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    pathlib.Path(sys.argv[2]).write_text(str(child.pid))
    time.sleep(60)
'''


@pytest.mark.parametrize("mode", ["ok", "message", "code", "raise"])
def test_a_forked_run_gives_what_python_gives(tmp_path, mode):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    (tmp_path / "here").mkdir()
    cmd = [sys.executable, str(script), mode]
    env = {**os.environ, "TEST_REWARD": "tie"}
    forked = warm.run(cmd, cwd=tmp_path / "here", env=env, capture_output=True, text=True)
    real = subprocess.run(cmd, cwd=tmp_path / "here", env=env, capture_output=True, text=True)
    code = {"ok": 0, "message": 1, "code": 3, "raise": 1}[mode]
    assert forked.returncode == real.returncode == code
    assert forked.stdout == real.stdout == f"argv ['{mode}'] cwd here reward tie\n"
    # the traceback names the same lines; only the frames above the script's differ (runpy's)
    assert forked.stderr.splitlines()[-1] == real.stderr.splitlines()[-1]
    assert forked.stderr.startswith("to stderr\n")
    if mode == "message":
        assert forked.stderr == "to stderr\nerror: --x must be positive\n"


def test_a_run_past_its_timeout_is_killed_with_what_it_started(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    started = time.time()
    with pytest.raises(subprocess.TimeoutExpired):
        warm.run([sys.executable, str(script), "sleep", str(tmp_path / "pid")], timeout=5,
                 capture_output=True, text=True)
    assert time.time() - started < 50  # not the minute of its sleep
    pid = int((tmp_path / "pid").read_text())
    time.sleep(0.5)
    with open(f"/proc/{pid}/stat") if os.path.exists(f"/proc/{pid}") else open(os.devnull) as f:
        state = f.read().split()[2:3]
    assert state in ([], ["Z"])  # gone, or a zombie waiting for its reaper
    # the next run works
    ok = warm.run([sys.executable, str(script), "ok"], capture_output=True, text=True)
    assert ok.returncode == 0


DISTRIBUTED = r'''
import os, sys
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
if sys.argv[1] == "fail" and rank == 1:
    sys.exit("error (rank 1): bad here")
x = torch.tensor([float(rank + 1)])
dist.all_reduce(x)  # rank 0 waits here for a failed rank 1 until it is stopped
# one write (print makes two, which the other rank's can come between)
local = os.environ["LOCAL_RANK"]
sys.stdout.write(f"rank {rank} of {dist.get_world_size()} local {local}: {x.item()}\n")
dist.destroy_process_group()
'''


@pytest.mark.slow  # the second tier: torchrun
def test_a_torchrun_launch_forks_its_ranks_with_torchrun_s_variables(tmp_path):
    script = tmp_path / "dist.py"
    script.write_text(DISTRIBUTED)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(script), "ok"]
    forked = warm.run(cmd, capture_output=True, text=True, timeout=300)
    real = warm.run(cmd, capture_output=True, text=True, timeout=300, real_torchrun=True)
    assert forked.returncode == real.returncode == 0
    assert sorted(forked.stdout.splitlines()) == sorted(real.stdout.splitlines()) == [
        "rank 0 of 2 local 0: 3.0", "rank 1 of 2 local 1: 3.0"]
    # one rank fails: the other, stuck in its all_reduce, is stopped and torchrun's exit is 1
    failed = warm.run([*cmd[:-1], "fail"], capture_output=True, text=True, timeout=300)
    assert failed.returncode == 1 and "error (rank 1): bad here" in failed.stderr


def test_what_forking_could_change_runs_as_a_real_process():
    env = {**os.environ, "HF_HUB_OFFLINE": "0" if os.environ.get("HF_HUB_OFFLINE") == "1" else "1"}
    assert warm._launch([sys.executable, "grpo.py", "--x"], False) == (["grpo.py", "--x"], None)
    assert not warm._forkable(env, True, True, {})  # HF_HUB_OFFLINE is read at import
    assert warm._forkable({**os.environ, "TEST_REWARD": "x"}, True, True, {})
    assert not warm._forkable(dict(os.environ), True, False, {})  # bytes, not text
    assert warm._launch([sys.executable, "-c", "pass"], False) is None
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    argv, ranks = warm._launch([*torchrun, "--master_port", "29600", "grpo.py", "--x"], False)
    assert argv == ["grpo.py", "--x"] and [r["RANK"] for r in ranks] == ["0", "1"]
    assert {r["MASTER_PORT"] for r in ranks} == {"29600"} and ranks[1]["WORLD_SIZE"] == "2"
    assert warm._launch([*torchrun, "--nnodes", "2", "grpo.py"], False) is None  # not emulated
    assert warm._launch([*torchrun, "grpo.py"], True) is None  # asked for the real one
