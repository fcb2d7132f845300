"""The sympy worker of common/env/grader.py: a small pool of worker processes that answer "are these
two expressions equal?" within a budget of CPU seconds.

One grade (a `Grade`) has a budget of common/env/grader.py's TIMEOUT_S seconds of a worker's CPU
time, shared by all its worker calls; waiting for a free worker, or for one that is starting, is not
charged. A worker stops itself at the budget (SIGPROF raises `_OutOfTime` inside sympy), and one
stuck where the signal cannot reach it is killed and replaced; an answer out of budget grades as
wrong. A worker that dies or fails to start is restarted at the next grade, and `grader_counts()`
counts grades, timeouts and failures. A worker exits by itself when the process that started it
dies, even mid-computation (SIGKILL included).

The worker's side is `serve` (its loop); the parent's is `Pool` and its `_Worker`s. The
comparison itself (sympy) is common/env/grader.py's, which a worker runs as a script: nothing here
parses or evaluates an answer.
"""

import json
import os
import queue
import select
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository: a worker imports common/ from it
START_LIMIT_S = 300.0  # give up on a worker that is alive but still not ready after this long

# ------------------------------------------------------------------------------------------------
# Counts and one grade's budget


_COUNTS = {"grades": 0, "timeouts": 0, "failures": 0}
_COUNTS_LOCK = threading.Lock()


def grader_counts() -> dict:
    """This process's counts so far (monotone, thread-safe): {"grades": math_equal calls that needed
    the sympy worker, "timeouts": those that ran out of budget, and grades of any task that ran
    past their own time limit (common/env/tasks.py `grade`; all graded wrong), "failures": worker
    starts that failed and workers that died}. timeouts / grades is the fraction of symbolic grades
    that may be wrong."""
    with _COUNTS_LOCK:
        return dict(_COUNTS)


def _count(key: str) -> None:
    with _COUNTS_LOCK:
        _COUNTS[key] += 1


def _failure(message: str) -> None:
    _count("failures")
    print(f"common/env/grader_worker.py: {message}", file=sys.stderr, flush=True)


class Grade:
    """One grade's share of the sympy worker: CPU seconds left, and whether it used the worker or
    ran out."""

    def __init__(self, budget: float):
        self.left, self.used_worker, self.timed_out = budget, False, False


def count_timeout() -> None:
    """Count a grade that ran past its own time limit (graded wrong) in grader_counts()."""
    _count("timeouts")


def count_grade(grade: Grade) -> None:
    """Count a finished grade in grader_counts(): as one that needed the worker, and as a timeout
    if it ran out of budget."""
    if grade.used_worker:
        _count("grades")
    if grade.timed_out:
        _count("timeouts")


# ------------------------------------------------------------------------------------------------
# The worker's side: a subprocess that stops itself at its CPU budget


class _OutOfTime(BaseException):
    """Raised in the worker by SIGPROF at the end of a request's CPU budget. A BaseException, so
    that sympy's own `except Exception` blocks do not swallow it."""


_ARMED = False  # the worker's SIGPROF handler raises only while a request runs


def _on_sigprof(signum, frame):
    if _ARMED:
        raise _OutOfTime


def _watch_parent(parent: int) -> None:
    """Worker thread: exit as soon as the process that started us is gone (SIGKILL included), even
    while the main thread is busy in a long simplification (sympy is Python, so this thread gets its
    turn)."""
    while os.getppid() == parent:
        time.sleep(0.2)
    os._exit(0)


def serve(parent: int, equal, warm_up, tool=None) -> None:
    """Worker loop: one JSON request {a, b, equation, approx, budget} per line on stdin, answered
    by equal(a, b, equation, approx) within `budget` CPU seconds; one JSON reply {ok, timeout, cpu}
    per line on stdout. A request {tool, a, budget} is answered by tool(name, a), a text, in the
    reply's "text" (tools.py's sympy tools). warm_up() runs once before the worker says it is
    ready."""
    global _ARMED
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the parent, which kills us
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    try:  # a runaway simplification should hit the time limit, not eat the machine's memory
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
    except (ImportError, ValueError, OSError):
        pass
    warm_up()  # before saying ready: the first grade is not charged for importing sympy
    signal.signal(signal.SIGPROF, _on_sigprof)
    print("ready", flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        start, ok, timeout, text = time.process_time(), False, False, None
        try:
            try:
                _ARMED = True
                # CPU time, not wall
                signal.setitimer(signal.ITIMER_PROF, max(float(req["budget"]), 0.001))
                if "tool" in req:
                    text = str(tool(req["tool"], req["a"]))
                    ok = True
                else:
                    ok = bool(equal(req["a"], req["b"], req["equation"], req["approx"]))
            finally:
                _ARMED = False
                signal.setitimer(signal.ITIMER_PROF, 0)
        except _OutOfTime:
            timeout = True
        except Exception as e:  # ParseError, TypeError on oo/nan, RecursionError...: not equal
            text = f"error: {type(e).__name__}"  # a tool's failure, which the model is told
        _ARMED = False
        print(json.dumps({"ok": ok, "timeout": timeout, "cpu": time.process_time() - start,
                          "text": text}), flush=True)


# ------------------------------------------------------------------------------------------------
# The parent's side: workers started, restarted and killed


def _cpu_seconds(pid: int) -> float | None:
    """CPU time (user + system) a process has used, from /proc; None where that cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


class _Worker:
    """One sympy worker process of the pool, started lazily and restarted when it dies, fails or
    runs away.

    A grade's budget is charged the CPU time the worker reports for its requests. The worker stops
    itself at the budget (SIGPROF); as a backstop, one that goes past it (stuck in C code) is killed
    and replaced.
    """

    GRACE_S = 0.5  # CPU seconds past the budget before the backstop kills the worker
    WALL_LIMIT_S = 60.0  # and wall seconds per request, whatever the load

    def __init__(self, script: str):
        self.script, self.lock = script, threading.Lock()
        self.proc, self.pid, self.ready, self.buf = None, None, False, b""

    def _spawn(self) -> bool:
        # A fresh interpreter that runs the script (not multiprocessing): it works the same under
        # pytest, torchrun and after CUDA is initialised, and does not re-import the caller's
        # __main__. The repository's root goes on its path, so that the script finds common/
        # from whatever folder the run started in. Our process id comes last: the worker watches
        # it, and tests find their workers by it.
        code = ("import runpy, sys; sys.path.insert(0, sys.argv[2]); "
                "runpy.run_path(sys.argv[1], run_name='__grader_worker__')")
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", code, self.script, str(ROOT), str(os.getpid())],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0,
            )
        except OSError as e:  # e.g. too many processes under load: retried
            self.proc = None
            _failure(f"could not start the sympy worker ({e})")
            return False
        self.pid, self.ready, self.buf = os.getpid(), False, b""
        return True

    def _read_line(self, timeout: float) -> str | None:
        """The worker's next line, or None if none came within `timeout` s; EOFError if the worker
        is gone."""
        end = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = end - time.monotonic()
            if left <= 0 or not select.select([self.proc.stdout], [], [], left)[0]:
                return None
            chunk = os.read(self.proc.stdout.fileno(), 65536)
            if not chunk:
                raise EOFError
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line.decode()

    def stop(self):
        """Kill our worker (never one inherited through a fork: that one is the parent's)."""
        if self.proc is not None and self.pid == os.getpid():
            self.proc.kill()
            self.proc.wait()
            for pipe in (self.proc.stdin, self.proc.stdout):
                pipe.close()
        self.proc, self.ready = None, False

    def _live(self) -> bool:
        """Make sure a ready worker is there: start one (and wait, uncharged, however long a live
        one takes to import sympy), or replace a dead one. A few tries; False if none would
        start."""
        if self.proc is not None and self.pid != os.getpid():
            # after a fork the worker belongs to the parent: leave it alone
            self.proc, self.ready = None, False
        if self.proc is not None and self.proc.poll() is not None:
            _failure(f"the sympy worker died (exit code {self.proc.returncode}); starting a new "
                     f"one")
            self.stop()
        for attempt in range(3):
            if self.ready:
                return True
            if self.proc is None and not self._spawn():
                time.sleep(0.5 * (attempt + 1))
                continue
            start, line = time.monotonic(), None
            try:
                while line is None and time.monotonic() - start < START_LIMIT_S:
                    line = self._read_line(1.0)
            except EOFError:
                line = "exited"
            self.ready = line == "ready"
            if not self.ready:
                _failure("the sympy worker did not start "
                         f"({line or 'not ready after %.0f s' % START_LIMIT_S})")
                self.stop()
        return self.ready

    def ask(self, request: dict, grade: Grade) -> dict | None:
        """One request within what is left of the grade's budget: the reply, or None (the worker
        died, ran away, or the budget was already used up)."""
        # CRUCIAL: the time spent waiting here for other threads is not charged to the grade
        with self.lock:
            if grade.left <= 0:  # an earlier part of this grade used the budget up
                grade.timed_out = True
                return None
            grade.used_worker = True
            if not self._live():
                return None
            request = json.dumps({**request, "budget": grade.left})
            try:
                data = (request + "\n").encode()
                while data:
                    data = data[os.write(self.proc.stdin.fileno(), data):]
            except OSError:
                _failure("the sympy worker died; starting a new one at the next grade")
                self.stop()
                return None
            reply = self._reply(grade)
            if reply is None:
                return None
            grade.left -= reply["cpu"]
            if reply["timeout"]:
                grade.timed_out, grade.left = True, 0.0
            return reply

    def _reply(self, grade: Grade) -> dict | None:
        """The worker's answer to one request; None (graded wrong) if it died or ran away."""
        start, cpu0 = time.monotonic(), _cpu_seconds(self.proc.pid)
        while True:
            try:
                line = self._read_line(0.1)
            except EOFError:
                line = ""
            if line is not None:
                try:
                    reply = json.loads(line)
                    return {"ok": reply["ok"], "timeout": reply["timeout"],
                            "cpu": float(reply["cpu"]), "text": reply.get("text")}
                except (ValueError, KeyError, TypeError):
                    _failure("the sympy worker died while grading; starting a new one at the next "
                             "grade")
                    self.stop()
                    return None
            cpu = _cpu_seconds(self.proc.pid)
            wall = time.monotonic() - start
            used = cpu - cpu0 if cpu is not None and cpu0 is not None else wall
            # stuck where SIGPROF cannot stop it
            if used > grade.left + self.GRACE_S or wall > self.WALL_LIMIT_S:
                self.stop()
                self._spawn()  # the next grade waits for it to be ready, uncharged
                grade.timed_out, grade.left = True, 0.0
                return None


class Pool:
    """A few sympy workers, each serving one grade at a time, so that an answer that runs to its
    budget holds one worker, not every grade of a batch graded from many threads. Workers start when
    first needed; serial grading only ever starts one. `script` is the file a worker runs
    (common/env/grader.py, which calls `serve` when run as __grader_worker__); `pool_size()` gives
    the size."""

    def __init__(self, size: int, script: str):
        self.workers = [_Worker(script) for _ in range(size)]
        self.idle = queue.LifoQueue()  # the worker used last is served first: it is warm
        for worker in self.workers:
            self.idle.put(worker)
        self.last = self.workers[-1]  # the one the next serial grade gets (tests look at it)

    def equal(self, a, b, equation: bool, approx: int, grade: Grade) -> bool:
        reply = self.ask({"a": a, "b": b, "equation": equation, "approx": approx}, grade)
        return reply is not None and reply["ok"] is True

    def tool(self, name: str, a, grade: Grade) -> dict | None:
        """A sympy tool (`serve`'s tool) on the AST `a`: the reply, with its "text", or None."""
        return self.ask({"tool": name, "a": a}, grade)

    def ask(self, request: dict, grade: Grade) -> dict | None:
        # CRUCIAL: the time spent waiting here for a free worker is not charged to the grade
        worker = self.idle.get()
        try:
            return worker.ask(request, grade)
        finally:
            self.last = worker
            self.idle.put(worker)

    def stop(self):
        for worker in self.workers:
            worker.stop()


def pool_size() -> int:
    """MATHRL_GRADER_WORKERS, or half the CPU cores, at most 4 (one on this project's 2-core
    machines)."""
    # half the cores (at most 4): the rest are the trainer's, which grades between its own steps
    default = min(4, (os.cpu_count() or 2) // 2)
    return max(1, int(os.environ.get("MATHRL_GRADER_WORKERS", default)))


def _after_fork_in_child():
    global _COUNTS_LOCK
    # a thread of the parent may have held the lock (common/env/grader.py starts a new pool: the
    # parent's workers are not ours to use or to kill)
    _COUNTS_LOCK = threading.Lock()
    _COUNTS.update(grades=0, timeouts=0, failures=0)  # counts are per process


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
