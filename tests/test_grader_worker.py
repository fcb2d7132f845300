"""The sympy worker of common/env/grader.py (common/env/grader_worker.py) under load and under failure: many
threads and processes at once, a killed worker, a killed parent, runaway answers and the counters.
About 20 s on 2 cores."""

import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from common.env import grader

from common.env import grader_worker
from common.env.grader import math_equal
from common.env.grader_worker import grader_counts

ROOT = Path(__file__).resolve().parents[1]
SLOW = "\\exp(\\exp(\\exp(\\exp(99))))"  # sympy evaluates this until its budget runs out


def symbolic_cases(n, offset=0):
    """n correct (answer, gold) pairs, all different, that only sympy can decide (no two are equal
    strings, none is a rational number)."""
    ks = [k for k in range(2, 1000) if int(k**0.5) ** 2 != k][offset : offset + n]
    forms = [
        lambda k: (f"\\sqrt{{{k}}}+\\sqrt{{3}}", f"\\sqrt{{3}}+\\sqrt{{{k}}}"),
        lambda k: (f"(\\sqrt{{{k}}}+1)^2", f"{k}+1+2\\sqrt{{{k}}}"),
        lambda k: (f"\\frac{{1}}{{\\sqrt{{{k}}}}}", f"\\frac{{\\sqrt{{{k}}}}}{{{k}}}"),
        lambda k: (f"\\sin^2({k}x)+\\cos^2({k}x)+\\pi", "1+\\pi"),
    ]
    return [forms[i % 4](k) for i, k in enumerate(ks)]


def worker_pids(parents):
    """Live sympy workers (not zombies) started by any of the process ids `parents`, found through
    /proc."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            args = [a.decode() for a in (d / "cmdline").read_bytes().split(b"\0") if a]
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if any("__grader_worker__" in a for a in args) and args[-1] in {str(p) for p in parents} and state != "Z":
            found.append(int(d.name))
    return found


def gone_within(pid, seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True  # exited; only waiting for its new parent to reap it
        except OSError:
            return True
        time.sleep(0.05)
    return False


def test_64_threads_at_once_all_correct():
    cases = symbolic_cases(64)
    assert all(math_equal(*c) for c in cases[:2])  # the cases are right (and the worker is up)
    before, barrier = grader_counts(), threading.Barrier(64)

    def grade(case):
        barrier.wait()  # all 64 at once: 63 of them wait for the worker, uncharged
        return math_equal(*case)

    with ThreadPoolExecutor(64) as pool:
        results = list(pool.map(grade, cases))
    after = grader_counts()
    assert sum(results) == 64
    assert after["grades"] - before["grades"] == 64  # every one needed the worker
    assert after["timeouts"] == before["timeouts"]


def test_waiting_for_the_lock_is_not_charged():
    assert math_equal("\\sqrt{8}", "2\\sqrt{2}")
    result = []
    with grader._POOL.last.lock:  # another grade holds the worker for 1.5 budgets
        t = threading.Thread(target=lambda: result.append(math_equal("\\sqrt{12}+\\pi",
                                                                     "\\pi+2\\sqrt{3}")))
        t.start()
        time.sleep(1.5 * grader.TIMEOUT_S)
    t.join()
    assert result == [True]


@pytest.mark.slow  # the second tier: 32 processes
def test_32_processes_at_once_all_correct_and_no_worker_left():
    code = (
        "import sys; from common.env.grader import math_equal, grader_counts; "
        "cases = [tuple(sys.argv[i:i + 2]) for i in (1, 3)]; "
        "print(sum(math_equal(*c) for c in cases), grader_counts()['timeouts'], "
        "grader_counts()['failures'])"
    )
    cases = symbolic_cases(64, offset=100)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", code, *cases[2 * i], *cases[2 * i + 1]],
                              cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for i in range(32)]
    outs = [p.communicate(timeout=300) for p in procs]  # all 32 were started before the first wait
    assert [p.returncode for p in procs] == [0] * 32, [err[-500:] for _, err in outs if err][:2]
    # 2/2 correct, no timeout or failure
    assert [out.split() for out, _ in outs] == [["2", "0", "0"]] * 32
    assert "did not start" not in "".join(err for _, err in outs)
    time.sleep(0.5)
    assert worker_pids([p.pid for p in procs]) == []


def test_a_worker_killed_mid_grade_is_restarted(monkeypatch):
    assert math_equal("\\sqrt{8}", "2\\sqrt{2}")
    pid, before = grader._POOL.last.proc.pid, grader_counts()
    monkeypatch.setattr(grader, "TIMEOUT_S", 30.0)
    result = []
    t = threading.Thread(target=lambda: result.append(math_equal(SLOW, "\\pi")))
    t.start()
    time.sleep(0.5)  # busy on SLOW
    os.kill(pid, signal.SIGKILL)
    t.join(10)
    assert result == [False]
    assert grader_counts()["failures"] == before["failures"] + 1
    monkeypatch.setattr(grader, "TIMEOUT_S", 1.0)
    assert math_equal("\\sqrt{18}", "3\\sqrt{2}")  # a new worker
    assert grader._POOL.last.proc.pid != pid
    os.kill(grader._POOL.last.proc.pid, signal.SIGKILL)  # killed while idle: noticed at the next grade
    time.sleep(0.2)
    assert math_equal("\\sqrt{27}", "3\\sqrt{3}")
    assert grader_counts()["failures"] == before["failures"] + 2


def test_failed_starts_are_retried_and_never_disable_grading(monkeypatch):
    grader._POOL.last.stop()
    before = grader_counts()
    # every start fails: the worker exits at once
    monkeypatch.setattr(sys, "executable", "/bin/false")
    assert not math_equal("\\sqrt{8}", "2\\sqrt{2}")
    assert grader_counts()["failures"] == before["failures"] + 3  # three tries in that grade
    monkeypatch.undo()
    assert math_equal("\\sqrt{8}", "2\\sqrt{2}")  # no "broken" flag: the next grade starts a worker


def test_parent_killed_while_its_worker_is_busy_leaves_no_orphan():
    code = (
        "from common.env import grader; grader.TIMEOUT_S = 60.0; "
        "assert grader.math_equal('\\\\sqrt{8}', '2\\\\sqrt{2}'); "
        "print(grader._POOL.last.proc.pid, flush=True); "
        f"grader.math_equal({SLOW!r}, '\\\\pi')"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": str(ROOT)},
                              stdout=subprocess.PIPE, text=True)
    worker = int(parent.stdout.readline())
    time.sleep(0.5)
    assert worker_pids([parent.pid]) == [worker]  # alive, and busy on SLOW
    parent.kill()  # SIGKILL: no atexit, no cleanup in the parent
    parent.wait()
    assert gone_within(worker, 5.0)


def test_timeouts_are_counted_once_per_grade():
    assert math_equal("\\sqrt{8}", "2\\sqrt{2}")
    before, worker = grader_counts(), grader._POOL.last.proc.pid

    # the worker's CPU seconds: what the budget counts (wall time also grows with the machine's
    # load)
    def cpu():
        return grader_worker._cpu_seconds(worker)

    used = cpu()
    assert not math_equal(SLOW, "\\pi")
    assert 0.9 < cpu() - used < 1.5  # the budget, plus a little
    # a set grade with two runaway elements shares one budget: one timeout, not two, and not 2 s
    used = cpu()
    assert not math_equal(f"\\{{{SLOW}, {SLOW}+1\\}}", "\\{\\pi, \\pi+1\\}")
    assert 0.9 < cpu() - used < 1.5
    assert grader._POOL.last.proc.pid == worker  # it stopped itself at the budget: no restart needed
    after = grader_counts()
    assert (after["grades"] - before["grades"], after["timeouts"] - before["timeouts"]) == (2, 2)
    assert math_equal("\\sqrt{8}+\\pi", "\\pi+2\\sqrt{2}")  # the worker survived its timeouts
    assert grader_counts()["timeouts"] == after["timeouts"]
    assert set(grader_counts()) == {"grades", "timeouts", "failures"}


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork")
def test_a_forked_child_starts_its_own_worker_and_counts():
    assert math_equal("\\sqrt{8}", "2\\sqrt{2}")
    parent_worker = grader._POOL.last.proc.pid
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: a fresh count and its own worker; the parent's is left alone
        ok = grader_counts()["grades"] == 0 and math_equal("\\sqrt{12}", "2\\sqrt{3}")
        ok = ok and grader._POOL.last.proc.pid != parent_worker and grader_counts()["grades"] == 1
        os.write(write, b"1" if ok else b"0")
        grader._POOL.last.stop()
        os._exit(0)
    os.close(write)
    assert os.read(read, 1) == b"1"
    os.waitpid(pid, 0)
    assert grader._POOL.last.proc.pid == parent_worker and math_equal("\\sqrt{27}", "3\\sqrt{3}")


POOL_ORDER = (  # every worker of the pool started first (two short runaways at once), then:
    "import threading, time; from common.env import grader; done = []; grader.TIMEOUT_S = 0.3; "
    "ts = [threading.Thread(target=grader.math_equal, args=(SLOW, '\\\\pi')) for _ in (0, 1)]; "
    "[t.start() for t in ts]; [t.join() for t in ts]; grader.TIMEOUT_S = 1.0; "
    "slow = threading.Thread(target=lambda: (grader.math_equal(SLOW, '\\\\pi'), "
    "done.append('runaway'))); slow.start(); time.sleep(0.3); "
    "grader.math_equal('\\\\sqrt{12}', '2\\\\sqrt{3}'); done.append('quick'); slow.join(); "
    "print(' '.join(done))"
)


@pytest.mark.parametrize("workers,order", [("1", "runaway quick"), ("2", "quick runaway")])
def test_a_runaway_answer_holds_one_worker_of_the_pool_not_every_grade(workers, order):
    # with one worker the quick grade waits for the runaway's whole budget; with two it does not
    out = subprocess.run([sys.executable, "-c", POOL_ORDER.replace("SLOW", repr(SLOW))], cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT),
                              "MATHRL_GRADER_WORKERS": workers},
                         capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == order.split(), out.stderr[-2000:]


def test_parent_killed_leaves_no_worker_of_its_pool():
    # both workers started by two short runaways at once, then idle when the parent dies
    code = (
        "import threading, time; from common.env import grader; grader.TIMEOUT_S = 0.2; "
        "ts = [threading.Thread(target=grader.math_equal, args=(SLOW, '\\\\pi')) for _ in (0, 1)]; "
        "[t.start() for t in ts]; [t.join() for t in ts]; "
        "print(' '.join(str(w.proc.pid) for w in grader._POOL.workers), flush=True); "
        "time.sleep(60)"
    ).replace("SLOW", repr(SLOW))
    parent = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": str(ROOT),
                                   "MATHRL_GRADER_WORKERS": "2"},
                              stdout=subprocess.PIPE, text=True)
    workers = [int(p) for p in parent.stdout.readline().split()]
    assert len(set(workers)) == 2 and sorted(worker_pids([parent.pid])) == sorted(workers)
    parent.kill()  # SIGKILL: no atexit, no cleanup in the parent
    parent.wait()
    assert all(gone_within(w, 5.0) for w in workers)
