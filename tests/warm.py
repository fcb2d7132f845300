"""`subprocess.run` for the tests' `python X.py` and `torchrun` runs, forked from a warm process.

Most of a tiny end-to-end run is Python importing torch and transformers (about 8 of the 13 s of
three grpo.py updates on tiny-random). So each pytest worker starts one *warm* process that imports
them and then does nothing else; every run is a fork of it that sets its own working folder,
environment, argv and output files, then runs the script as `python X.py` would (`runpy`, as
`__main__`; an error ends it through Python's own exit, excepthook and atexit). The warm process
never ran a tensor operation or started a thread, so forking it is as safe as starting afresh.
What torch and transformers print while they are imported goes to the warm process's stderr, not
to the run's (today they print nothing).

`python -m torch.distributed.run --nproc_per_node N [--master_port P | --standalone] X.py ...` is
launched the same way: N forks, each with the variables torchrun gives its workers (RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, ...), their output in one file each for stdout and stderr as
torchrun's is, and, as torchrun does, the others stopped when one fails, with exit code 1.
torchrun's own messages (its warnings, its report of a failed worker) are not there: a test that
reads them passes `real_torchrun=True`.

A run goes to a real `subprocess.run` instead when forking could change what it sees: other
commands (`-m`, `-c`, torchrun with other options), output not captured as text, or an environment
that differs from this process's in a variable read at import time (only those in `RUNTIME_ENV`
may differ, as the warm process imported everything with this process's environment).
"""

import json
import os
import runpy
import select
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

# variables read when a script runs, not when torch or transformers are imported (pytest sets the
# second for each test)
RUNTIME_ENV = {"TEST_REWARD", "TEST_CORRECT", "PYTEST_CURRENT_TEST", "MATHRL_REWARD_FN_TIMEOUT"}
TORCHRUN = ["-m", "torch.distributed.run"]

_warm, _warm_env, _buffer = None, None, b""


def run(cmd, cwd=None, env=None, timeout=None, capture_output=False, text=False, check=False,
        real_torchrun=False, **kw):
    """As subprocess.run(cmd, ...) for the calls the tests make."""
    global _warm, _warm_env, _buffer
    env = dict(os.environ if env is None else env)
    if _warm is None or _warm.poll() is not None:
        _warm, _warm_env, _buffer = None, dict(os.environ), b""
    launch = _launch(cmd, real_torchrun)
    if launch is None or not _forkable(env, capture_output, text, kw):
        return subprocess.run(cmd, cwd=cwd, env=env, timeout=timeout,
                              capture_output=capture_output, text=text, check=check, **kw)
    argv, ranks = launch
    if _warm is None:
        _warm = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, bufsize=0, env=_warm_env,
                                 cwd=Path(__file__).parent)
    with tempfile.TemporaryDirectory() as tmp:
        out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
        request = {"argv": argv, "ranks": ranks, "cwd": str(cwd or os.getcwd()), "env": env,
                   "out": str(out), "err": str(err)}
        _warm.stdin.write((json.dumps(request) + "\n").encode())
        pids = _reply()["pids"]
        reply = _reply(timeout)
        if reply is None:  # as subprocess.run: kill it (and what it started), then raise
            for pid in pids:
                _kill(pid, signal.SIGKILL)
            _reply()
            raise subprocess.TimeoutExpired(cmd, timeout, out.read_text(), err.read_text())
        done = subprocess.CompletedProcess(cmd, reply["returncode"], out.read_text(),
                                           err.read_text())
        if check:
            done.check_returncode()
        return done


def _launch(cmd, real_torchrun):
    """(the script's argv, torchrun's variables of each rank, or None for a plain run), or None
    when the command is not one this module runs."""
    cmd = [str(c) for c in cmd]
    if len(cmd) < 2 or cmd[0] != sys.executable:
        return None
    if cmd[1].endswith(".py"):
        return cmd[1:], None
    if cmd[1:3] != TORCHRUN or real_torchrun:
        return None
    nproc, port, rest = 1, None, cmd[3:]
    while rest and rest[0].startswith("--"):
        if rest[0] == "--standalone":
            rest = rest[1:]
        elif rest[0] in ("--nproc_per_node", "--master_port") and len(rest) > 1:
            nproc, port = ((int(rest[1]), port) if rest[0] == "--nproc_per_node" else
                           (nproc, rest[1]))
            rest = rest[2:]
        else:
            return None
    if not rest or not rest[0].endswith(".py"):
        return None
    if port is None:  # --standalone: a free port, as its rendezvous finds one
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = str(s.getsockname()[1])
    ranks = [{"RANK": str(i), "LOCAL_RANK": str(i), "WORLD_SIZE": str(nproc),
              "LOCAL_WORLD_SIZE": str(nproc), "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1",
              "ROLE_RANK": str(i), "ROLE_WORLD_SIZE": str(nproc), "ROLE_NAME": "default",
              "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "TORCHELASTIC_RUN_ID": "none",
              "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0"}
             for i in range(nproc)]
    return rest, ranks


def _forkable(env, capture_output, text, kw):
    if sys.platform != "linux" or kw or not (capture_output and text):
        return False
    warm_env = os.environ if _warm_env is None else _warm_env  # the next warm process's
    changed = {k for k in set(env) | set(warm_env) if env.get(k) != warm_env.get(k)}
    return changed <= RUNTIME_ENV


def _reply(timeout=None):
    """The warm process's next line, or None after `timeout` seconds without one."""
    global _buffer
    while b"\n" not in _buffer:
        if not select.select([_warm.stdout], [], [], timeout)[0]:
            return None
        chunk = os.read(_warm.stdout.fileno(), 4096)
        if not chunk:
            raise RuntimeError("the warm process of tests/warm.py died")
        _buffer += chunk
    line, _, _buffer = _buffer.partition(b"\n")
    return json.loads(line)


def _kill(pid, sig):
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


def _serve():
    """The warm process: import, then fork the run(s) of each request line, one request at a
    time."""
    import torch  # noqa: F401
    import transformers  # noqa: F401
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM  # noqa: F401

    replies = os.dup(1)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # only the replies go to the caller
    for line in sys.stdin.buffer:
        request = json.loads(line)
        pids = []
        for rank_env in request["ranks"] or [{}]:
            pid = os.fork()
            if pid == 0:
                os.close(replies)
                _child(request, rank_env)  # never returns
            pids.append(pid)
        os.write(replies, (json.dumps({"pids": pids}) + "\n").encode())
        codes = {}
        while len(codes) < len(pids):
            pid, status = os.wait()
            codes[pid] = os.waitstatus_to_exitcode(status)
            if codes[pid] != 0:  # as torchrun: one worker failed, the others are stopped
                for other in set(pids) - set(codes):
                    _kill(other, signal.SIGTERM)
        code = codes[pids[0]] if request["ranks"] is None else int(any(codes.values()))
        os.write(replies, (json.dumps({"returncode": code}) + "\n").encode())


def _child(request, rank_env):
    os.setsid()  # its own process group: a timeout kills what it started too
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update({**request["env"], **rank_env})
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    for fd, path in ((1, request["out"]), (2, request["err"])):  # the ranks append to one file
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND), fd)
    script = request["argv"][0]
    sys.argv = list(request["argv"])
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    runpy.run_path(script, run_name="__main__")
    sys.exit(0)  # an exception or SystemExit ends the fork as it would end `python X.py`


if __name__ == "__main__":
    _serve()
