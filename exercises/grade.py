"""Grade a class's PS1: each student's functions run in a process of their own, the verdicts in
the grader's.

    python -m exercises.grade SUBMISSIONS/                       # every exercise, every student
    python -m exercises.grade SUBMISSIONS/ --exercises 1.1 1.5   # some exercises (or 1: PS1)
    python -m exercises.grade SUBMISSIONS/ --points 1.8=3 --out grades/ --jobs 2

SUBMISSIONS holds one folder per student, named as the report names them, each holding the
student's exercise files where a clone has them (alice/exercises/ps1/e05_group_advantages.py) or
alone (alice/e05_group_advantages.py). Only files named as PS1's exercise files are taken: the
rest, a check.py, cases.py or exercise.py of the student's own among them, is ignored, and the
report says which.

Each file is first read, not run: one that imports the project's code (where the solutions are),
a module other than torch, numpy and a few of the standard library's, or reaches for the
machinery of imports, code and files (importlib, __import__, sys, exec, eval, compile, open,
getattr, a __dunder__ attribute) is refused with 0 points and its line named. That reading is a
friendly first refusal, not the defence. The defence is that the student's code and the verdict
never share a process: the student's files are run by exercises/worker.py, in a fresh empty
folder with nothing of the project's on its path, which takes their text and then each exercise's
inputs through a pipe, and sends back the outputs and gradients alone. The
oracle, the comparison and the verdict run here, in a process the student's cannot read
(exercises/exercise.py's checks, the same as `python -m exercises.check`'s).

The student's process gets, before its first line of the student's code runs: the time left of
the exercise's --time_limit for each call, --memory_limit, 16 MiB of files, no new process or
thread (Linux exempts root from that one: under root, every process left is killed after each
student), no capabilities, a fresh working directory and HOME, and no path to the project.

SEED is the student's: zlib.crc32 of the folder's name (of SALT/name with --salt), so that each
student's random inputs are their own and the same at every grading. `python -m exercises.check
--seed SEED` in the student's clone gives the same verdicts.

The report in --out (default: SUBMISSIONS itself), rewritten whole after each student: grades.csv,
one row per student (student, seed, a column per exercise, total), for a gradebook;
grades_long.csv, a row per student and exercise (student, seed, exercise, points, passed,
message); and grades.json, all of it with the files ignored and what each student's code printed.

What this does not guard against: it is not a container. The student's process runs as your user
(root without its capabilities, under root), so it can read any file you can, the project's
included, if it searches the disk for them; it can stop the grading (its 0 points are its own);
a fork bomb under root is not held; and with --jobs above 1, one student's code can stop another's
process at the same time (use --jobs 1 when in doubt). Grade in a container to close those.
"""

import argparse
import ast
import base64
import csv
import ctypes
import json
import multiprocessing
import multiprocessing.connection
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the grader's own checkout
TIME_LIMIT = 60.0  # as exercises/check.py's (not imported: that needs torch, and this comes first)
MEMORY_LIMIT = 2048  # MiB a student's process may take beyond torch's own
FILE_BYTES = 16 << 20  # what a student's process may write to one file, its prints included
LARGEST_FILE = 1 << 20  # a handed-in exercise file larger than this is refused
# The students' process's code, read once: it runs from this text, not from a file on the way.
WORKER = (Path(__file__).parent / "worker.py").read_text()
# What a student's file may import: what PS1's functions need, and nothing that reads files or
# finds the project's code.
ALLOWED_IMPORTS = ("torch", "numpy", "math", "itertools", "functools", "operator", "typing",
                   "collections", "dataclasses", "__future__")
ALLOWED_SAID = ("torch, numpy and the standard library's math, itertools, functools, operator, "
                "typing, collections, dataclasses")
# Names that reach a module, code or a file by its name or text: the ways round the list above.
REFUSED_NAMES = {"__import__", "importlib", "builtins", "__builtins__", "sys", "os", "exec",
                 "eval", "compile", "open", "globals", "locals", "vars", "getattr", "setattr",
                 "delattr", "breakpoint"}
REFUSED_ATTRIBUTES = {"modules", "sys", "os", "importlib", "builtins"}  # sys.modules, torch.os
FREE_DUNDERS = {"__name__", "__doc__"}  # `if __name__ == "__main__":` to try a function out


def student_seed(name: str, salt: str = "") -> int:
    """The seed of a student's inputs, from their folder's name: the same at every grading. 0
    gives the inputs as shipped, the same for everyone, so it is never given."""
    # The name's own bytes, whatever they are (a folder name need not be UTF-8).
    return zlib.crc32(os.fsencode(f"{salt}/{name}" if salt else name)) or 1


def project_modules() -> set:
    """The names the project's code is imported by: the root's files and folders."""
    return {p.stem if p.suffix == ".py" else p.name for p in ROOT.iterdir()
            if not p.name.startswith((".", "_")) and (p.is_dir() or p.suffix == ".py")}


def refusal(source: bytes) -> str | None:
    """Why a student's file is refused, naming the first line at fault, or None. The file is
    parsed, never run. One that does not parse is not refused here: the checker says where."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    project, found = project_modules(), []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            if isinstance(node, ast.ImportFrom) and node.level:
                found.append((_place(node), "is a relative import, of the files next to "
                                           f"yours (allowed: {ALLOWED_SAID})"))
                continue
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
            for top in dict.fromkeys(n.split(".")[0] for n in names):
                if top in project:
                    found.append((_place(node), f"imports {top}, the project's own code, where the "
                                               "solution is: write the function yourself "
                                               f"(allowed: {ALLOWED_SAID})"))
                elif top not in ALLOWED_IMPORTS:
                    found.append((_place(node), f"imports {top}, which the exercises do not allow "
                                               f"(allowed: {ALLOWED_SAID})"))
        elif isinstance(node, ast.Name) and (node.id in REFUSED_NAMES or _dunder(node.id)
                                             and node.id not in FREE_DUNDERS):
            found.append((_place(node), f"uses {node.id}, a way to modules, code or files by their "
                                       "name: write the function with plain Python and torch"))
        elif isinstance(node, ast.Attribute) and (node.attr in REFUSED_ATTRIBUTES
                                                  or _dunder(node.attr)):
            found.append((_place(node), f"uses .{node.attr}, a way into Python's modules or "
                                       "internals: write the function with plain Python and torch"))
    if not found:
        return None
    (line, *_), why = min(found, key=lambda f: f[0])  # the first in reading order
    text = source.decode(errors="replace").splitlines()[line - 1].strip()
    return f"line {line} (`{text[:80]}{'...' if len(text) > 80 else ''}`) {why}"


def _place(node) -> tuple:
    return node.lineno, node.col_offset, node.end_col_offset  # x.__class__ before its .__init__


def _dunder(name: str) -> bool:
    return len(name) > 4 and name.startswith("__") and name.endswith("__")




def shown(name: str) -> str:
    """A name as the report prints it, whatever its bytes: what is not UTF-8 as \\xNN, a control
    character as its escape, and a leading =, +, - or @ behind a ' (else a spreadsheet would read
    it as a formula)."""
    text = os.fsencode(name).decode("utf-8", "backslashreplace")
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return "'" + text if text[:1] in ("=", "+", "-", "@") else text


def handed_in(folder: Path, names) -> tuple[dict, dict, list]:
    """The student's exercise files, {file name: bytes}, from folder/exercises/ps1/ or else from
    folder itself; {file name: why it is refused} for one that is a link or too large; and the
    folder's other files (hidden folders and caches left out), ignored, as the report shows them."""
    taken, refused, used = {}, {}, set()
    for where in (folder / "exercises" / "ps1", folder):
        for name in names:
            path = where / name
            if name in taken or name in refused or not os.path.lexists(path):
                continue
            used.add(path)
            if path.resolve() != folder.resolve() / path.relative_to(folder):  # a link on the way
                refused[name] = f"{name} is a link: hand in the file itself"
            elif not path.is_file():
                used.discard(path)
            elif path.stat().st_size > LARGEST_FILE:
                refused[name] = (f"{name} is {path.stat().st_size:,} bytes, more than the "
                                 f"{LARGEST_FILE >> 20} MiB an exercise file may be")
            else:
                taken[name] = path.read_bytes()
    ignored = []
    for here, folders, files in os.walk(folder):
        folders[:] = sorted(f for f in folders if not f.startswith(".") and f != "__pycache__")
        ignored += [shown(str((Path(here) / f).relative_to(folder))) for f in sorted(files)
                    if Path(here) / f not in used]
    return taken, refused, ignored


# ---- the student's process ----------------------------------------------------------------------


class Stopped(BaseException):
    """The student's process was stopped or failed mid-check: the exercise's verdict, in words.
    A BaseException, so that the checks' `except Exception` around the student's call lets it
    through to the grader."""


class StudentProcess:
    """exercises/worker.py running one student's files, started when first asked and again after
    a call that ended it: the pipes to it and the folder it runs in."""

    def __init__(self, files: dict, limits: dict):
        self.files, self.limits, self.process, self.count = files, limits, None, 0
        self.folder = Path(tempfile.mkdtemp(prefix="student-", dir=limits.get("scratch")))
        self.printed = b""

    def start(self):
        work = self.folder / f"work-{self.count}"
        work.mkdir()  # a fresh one at each start: what a killed run left there is not read
        requests_in, self.requests = os.pipe()
        self.answers, answers_out = os.pipe()
        os.set_blocking(self.requests, False)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(work),
               "TMPDIR": str(work), "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1",
               "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        limits = dict(memory_bytes=self.limits["memory_mib"] << 20, file_bytes=FILE_BYTES,
                      cpu_seconds=int(self.limits["cpu_seconds"]))
        self.out = open(self.folder / "printed.txt", "ab")
        self.process = subprocess.Popen(
            [sys.executable, "-I", "-B", "-c", WORKER, str(requests_in),
             str(answers_out), json.dumps(limits)], cwd=work, env=env, stdin=subprocess.DEVNULL,
            stdout=self.out, stderr=subprocess.STDOUT, pass_fds=(requests_in, answers_out),
            start_new_session=True)
        os.close(requests_in)
        os.close(answers_out)
        try:
            ready = self._receive(time.monotonic() + 120)
        except Stopped:
            ready = None
        if not (isinstance(ready, dict) and ready.get("ready")):
            last = self.read_printed().strip().splitlines()[-1:] or ["nothing"]
            self.stop()
            raise RuntimeError(f"the students' process (exercises/worker.py) did not start: "
                               f"{last[0][:300]}")

    def ask(self, message: dict, deadline: float, name: str) -> dict:
        """The worker's answer to one request, by the deadline; Stopped (and the process ended)
        when it overruns, ends, or answers out of form."""
        if self.process is None:
            self.start()
        self.count += 1
        message["id"] = self.count
        from exercises.worker import send

        def writable():
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([], [self.requests], [], left)[1]:
                raise Stopped("took more than the time limit to take its inputs, and was stopped")
        try:
            send(self.requests, message, writable)
            answer = self._receive(deadline, name)
        except BrokenPipeError:
            self.stop()
            raise Stopped("the check ended before its verdict: your code or its file ends the "
                          "process (sys.exit, os._exit); a check passes only when it runs to "
                          "the end") from None
        except Stopped:
            self.stop()
            raise
        if answer.get("id") != self.count:
            self.stop()
            raise Stopped("the process running your code answered out of turn: something in it "
                          "writes to the grader's pipe")
        return answer

    def _receive(self, deadline, name=""):
        from exercises.worker import receive

        def wait():
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.answers], [], [], left)[0]:
                raise Stopped(f"took more than {self.limits['time_limit']:g} s, and was stopped: "
                              "look for a loop that never ends (or give it longer with "
                              "--time_limit)")
        try:
            return receive(self.answers, wait)
        except EOFError:
            try:
                status = self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                status = "?"
            said = {-signal.SIGKILL: " (killed: past its CPU time, or by a signal)",
                    -signal.SIGXCPU: " (past its CPU time)"}.get(status, "")
            raise Stopped(f"the check ended before its verdict (exit status {status}{said}): your "
                          f"{name or 'code'} or its file ends the process (sys.exit, os._exit); "
                          "a check passes only when it runs to the end") from None
        except (ValueError, RecursionError) as e:
            raise Stopped(f"the process running your code answered out of form ({e}): something "
                          "in it writes to the grader's pipe") from None

    def read_printed(self) -> str:
        """What the student's code printed, its first 2,000 characters."""
        try:
            with open(self.folder / "printed.txt", "rb") as f:
                text = f.read(2000)
        except OSError:
            return ""
        return text.decode("utf-8", "backslashreplace")

    def stop(self):
        """End the process and whatever it started: its session, then any child it left."""
        if self.process is not None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            self.process.wait()
            for fd in (self.requests, self.answers):
                os.close(fd)
            self.out.close()
            self.process = None
        _reap_orphans()

    def close(self):
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)


REAPER = False  # set in a grading process (_serve), the only one whose children are all students'


def _reap_orphans():
    """Kill and reap every child of a grading process: it is a subreaper, so what a student's
    process forked and left (possible under root) has come to it."""
    if not REAPER:
        return
    me = str(os.getpid())
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                parent = f.read().rsplit(")", 1)[1].split()[1]
        except (OSError, IndexError):
            continue
        if parent == me:
            try:
                os.kill(int(entry), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG) == (0, 0):
                break
        except ChildProcessError:
            break


class Remote:
    """A student's function in their process, called as the checks call a function: the
    keyword arguments go over the pipe, and the output (or what it raised) comes back."""

    def __init__(self, student: StudentProcess, module: str, name: str, deadline: float):
        self.student, self.module, self.name, self.deadline = student, module, name, deadline

    def _ask(self, kwargs, grad=None):
        from exercises.worker import encode

        return self.student.ask(dict(op="call", module=self.module, kwargs=encode(kwargs),
                                     grad=grad), self.deadline, self.name)

    def __call__(self, **kwargs):
        import torch

        from exercises.worker import decode

        answer = self._ask(kwargs)
        _raise_theirs(answer)
        try:
            output = decode(answer["output"])
            changed = {k: decode(v) for k, v in dict(answer.get("changed") or {}).items()}
        except (KeyError, ValueError, TypeError, RecursionError) as e:
            raise Stopped(f"the process running your code answered out of form ({e})") from None
        for key, now in changed.items():  # an input changed in place there is changed here too
            value = kwargs.get(key)
            if isinstance(value, torch.Tensor) and isinstance(now, torch.Tensor):
                if now.shape == value.shape and now.dtype == value.dtype:
                    value.copy_(now)
                else:
                    value.resize_(0)
        return output

    def gradients(self, kwargs, names):
        import torch

        from exercises.worker import decode

        answer = self._ask(kwargs, grad=list(names))
        _raise_theirs(answer)
        try:
            grads = decode(answer["grads"])
            assert grads is None or (isinstance(grads, dict) and set(grads) == set(names) and all(
                isinstance(g, torch.Tensor) and g.shape == kwargs[n].shape
                for n, g in grads.items()))
        except (KeyError, ValueError, TypeError, RecursionError, AssertionError):
            raise Stopped("the process running your code sent gradients out of form") from None
        return grads if grads is None else {n: g.double() for n, g in grads.items()}


_RAISED = {}


def _raise_theirs(answer):
    """What the student's function raised, raised here under its own name, so that the checks
    word it as they word a local one."""
    kind = answer.get("raised")
    if kind is None:
        return
    if kind == "SystemExit":
        from exercises.worker import decode
        try:
            code = decode(answer.get("code"))
        except (ValueError, TypeError, RecursionError):
            code = None
        raise SystemExit(code)
    message = str(answer.get("message", ""))[:500]
    if kind == "NotImplementedError":
        raise NotImplementedError(message)
    kind = kind if isinstance(kind, str) and kind.isidentifier() and len(kind) < 60 \
        else "Exception"
    if kind not in _RAISED:  # an Exception of the student's type's name, never the type itself
        _RAISED[kind] = type(kind, (Exception,), {"__module__": "builtins"})
    raise _RAISED[kind](message)


def loaded(student: StudentProcess, exercise, deadline: float) -> Remote:
    """The student's function for an exercise, as a Remote; Wrong, worded as the checker words
    it, when its file does not import or holds no such function."""
    from exercises.exercise import Wrong

    module = Path(exercise.path).stem
    answer = student.ask(dict(op="load", module=module, name=exercise.name,
                              source=base64.b64encode(student.files[Path(exercise.path).name])
                              .decode()), deadline, exercise.name)
    error, path = answer.get("error"), exercise.path
    if error == "syntax":
        raise Wrong(f"{path}, line {answer.get('line')}: {answer.get('type')}: "
                    f"{answer.get('message')}; fix that line, then check again")
    if error == "raised":
        said = str(answer.get("message") or "")
        raise Wrong(f"{path}, line {answer.get('line') or '?'}: importing it raised "
                    f"{answer.get('type')}{f': {said}' if said else ''}")
    if error is not None or answer.get("loaded") is not True:
        raise Wrong(f"{path} has no function {exercise.name}: keep its name and signature as "
                    f"given (`git show HEAD:{path}` shows the file as shipped)")
    return Remote(student, module, exercise.name, deadline)


# ---- one student --------------------------------------------------------------------------------


def grade(folder: Path, exercises: list, all_names: list, seed: int, points: dict,
          limits: dict) -> dict:
    """One student's grades: the total and a row per exercise. Runs in a grading process."""
    from exercises.exercise import Wrong, run_checks
    from exercises.ps1 import cases

    taken, refused, ignored = handed_in(folder, all_names)
    rows = {}
    student = StudentProcess(taken, limits)
    cases.STUDENT_SEED = seed
    try:
        for exercise in exercises:
            name = Path(exercise.path).name
            why = None
            if not taken and not refused:
                why = (f"no exercise file handed in: {shown(folder.name)}/ holds no "
                       "exercises/ps1/e*.py, nor e*.py files of PS1's names")
            elif name in refused:
                why = f"refused: {refused[name]}"
            elif name not in taken:
                why = f"not handed in: no {name} (in exercises/ps1/ or alone)"
            elif (said := refusal(taken[name])):
                why = f"refused: {name}, {said}"
            if why is None:
                try:
                    run_checks(exercise, loaded(student, exercise,
                                                time.monotonic() + limits["time_limit"]))
                    why = ""
                except Wrong as e:
                    why = str(e)
                except Stopped as e:
                    why = str(e)
            rows[exercise.id] = dict(passed=why == "", message=why or "ok")
        printed = student.read_printed()
    finally:
        cases.STUDENT_SEED = 0
        student.close()
    results = [dict(id=e.id, title=e.title, points=points[e.id] if rows[e.id]["passed"] else 0,
                    **rows[e.id]) for e in exercises]
    return dict(student=shown(folder.name), seed=seed, points=sum(r["points"] for r in results),
                max_points=sum(points[e.id] for e in exercises),
                passed=sum(r["passed"] for r in results), exercises=results, ignored=ignored,
                printed=printed)


# ---- the grading processes ----------------------------------------------------------------------
# The checks run in processes of the grader's own, one per --jobs, so that students are graded side
# by side and the grader's seed of one student never meets another's. Each is made unreadable to
# other processes of the user (not dumpable), and takes in what its students' processes leave.


def _serve(connection, ids, points, limits):
    global REAPER
    REAPER = True
    libc = ctypes.CDLL(None)
    libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: no /proc/<this>/fd, mem or cwd to open
    libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: what a student's process forks, here
    libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG: gone with the grader
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the grader's to handle
    import torch

    torch.set_num_threads(1)
    from exercises.check import all_exercises

    everything = all_exercises()
    chosen = [everything[i] for i in ids]
    all_names = [Path(e.path).name for e in everything.values()]
    connection.send("ready")
    while True:
        try:
            index, folder, seed = connection.recv()
        except EOFError:
            return
        try:
            student = grade(Path(folder), chosen, all_names, seed, points, limits)
        except RuntimeError as e:  # the students' process could not start: the grader's fault
            connection.send((index, None, str(e)))
            continue
        except Exception as e:  # the grader's own bug on this student's files: said, not hidden
            student = _stopped_student(Path(folder), seed, chosen, points,
                                       f"not graded: the grader failed on this student "
                                       f"({type(e).__name__}: {e}); please report it")
        connection.send((index, student, None))


class _Slot:
    def __init__(self, context, ids, points, limits):
        self.connection, theirs = context.Pipe()
        self.process = context.Process(target=_serve, args=(theirs, ids, points, limits),
                                       daemon=True)
        self.process.start()
        theirs.close()
        self.job = None  # the index of the student it grades
        self.ready = False  # it says so once it has imported the checks


def _stopped_student(folder, seed, exercises, points, why=None):
    why = why or ("not graded: the grading process was killed while grading this student (by "
                  "the student's code, or from outside)")
    return dict(student=shown(folder.name), seed=seed, points=0,
                max_points=sum(points[e.id] for e in exercises), passed=0,
                exercises=[dict(id=e.id, title=e.title, points=0, passed=False, message=why)
                           for e in exercises], ignored=[], printed="")


def grade_class(folders, seeds, exercises, points, limits, jobs, done):
    """Grade every folder, `jobs` at a time; done(index, student) as each is graded."""
    context = multiprocessing.get_context("spawn")
    ids = [e.id for e in exercises]
    # The students' folders, under one the grader removes, even after a grading process is killed.
    limits = dict(limits, scratch=tempfile.mkdtemp(prefix="grade-"))
    queue = list(range(len(folders)))
    slots = [_Slot(context, ids, points, limits) for _ in range(min(jobs, len(folders)))]
    try:
        while queue or any(s.job is not None for s in slots):
            for slot in slots:
                if slot.job is None and queue:
                    index = queue.pop(0)
                    slot.job = index
                    slot.connection.send((index, str(folders[index]), seeds[index]))
            busy = [s for s in slots if s.job is not None]
            ready = multiprocessing.connection.wait(
                [s.connection for s in busy] + [s.process.sentinel for s in busy])
            for k, slot in enumerate(slots):
                if slot.job is None:
                    continue
                if slot.connection not in ready and slot.process.sentinel not in ready:
                    continue
                try:
                    message = slot.connection.recv() if slot.connection.poll() else None
                except (EOFError, OSError):  # its end closed: it died
                    message = None
                if message == "ready":
                    slot.ready = True
                elif message is not None:
                    index, student, failed = message
                    if failed:
                        raise RuntimeError(failed)
                    slot.job = None
                    done(index, student)
                elif not slot.process.is_alive() and not slot.ready:
                    raise RuntimeError(f"a grading process stopped before its first student (exit "
                                       f"status {slot.process.exitcode}): python -m "
                                       "exercises.check --solution shows why")
                elif not slot.process.is_alive():  # died mid-student: a fresh one in its place
                    index, slot.job = slot.job, None
                    slot.connection.close()
                    slots[k] = _Slot(context, ids, points, limits)
                    done(index, _stopped_student(folders[index], seeds[index], exercises,
                                                 points))
    finally:
        for slot in slots:
            slot.connection.close()
            slot.process.kill()
            slot.process.join()
        shutil.rmtree(limits["scratch"], ignore_errors=True)


# ---- the report ---------------------------------------------------------------------------------


def _number(x):
    return int(x) if float(x).is_integer() else x


def _cell(text) -> str:
    """A message as a CSV cell: a leading =, +, - or @ behind a ', as shown() does for names."""
    text = str(text)
    return "'" + text if text[:1] in ("=", "+", "-", "@") else text


def _write_whole(path: Path, write) -> None:
    """Write a file by rename: a reader, or a crash, sees the old file or the new, never half."""
    part = path.with_name(f".{path.name}.part")
    with open(part, "w", newline="", encoding="utf-8") as f:
        write(f)
    os.replace(part, path)


def write_reports(out: Path, students: list, exercises: list) -> None:
    """grades.csv (a row per student), grades_long.csv (a row per student and exercise) and
    grades.json, each rewritten whole."""
    def wide(f):
        writer = csv.writer(f)
        writer.writerow(["student", "seed", *[e.id for e in exercises], "total"])
        for s in students:
            by_id = {r["id"]: r for r in s["exercises"]}
            writer.writerow([s["student"], s["seed"],
                             *[f"{by_id[e.id]['points']:g}" for e in exercises],
                             f"{s['points']:g}"])

    def long(f):
        writer = csv.writer(f)
        writer.writerow(["student", "seed", "exercise", "points", "passed", "message"])
        for s in students:
            for r in s["exercises"]:
                writer.writerow([s["student"], s["seed"], r["id"], f"{r['points']:g}",
                                 r["passed"], _cell(r["message"])])

    report = [dict(s, points=_number(s["points"]), max_points=_number(s["max_points"]),
                   exercises=[dict(r, points=_number(r["points"])) for r in s["exercises"]])
              for s in students]
    _write_whole(out / "grades.csv", wide)
    _write_whole(out / "grades_long.csv", long)
    _write_whole(out / "grades.json", lambda f: f.write(json.dumps({"students": report},
                                                                   indent=1) + "\n"))


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, as the grader's other errors, not argparse's usage
        print(f"error: {message} (python -m exercises.grade --help)", file=sys.stderr)
        sys.exit(2)


def main(argv=None) -> int:
    parser = _Parser(description=__doc__.split("\n\n")[0],
                     epilog="A student's seed, in the report, gives their inputs again: python "
                            "-m exercises.check --seed SEED in their clone. Their code runs as "
                            "your user, in a process apart: grade in a container to keep it from "
                            "your files.")
    parser.add_argument("submissions", metavar="SUBMISSIONS",
                        help="a folder of one folder per student, each holding the student's "
                             "exercises/ps1/e*.py, or the e*.py files alone "
                             "(SUBMISSIONS/alice/e05_group_advantages.py); any other file is "
                             "ignored, and the report names it")
    parser.add_argument("--exercises", nargs="+", default=[], metavar="ID",
                        help="the exercises to grade (1.5) or problem sets (1); default: all")
    parser.add_argument("--points", nargs="+", default=[], metavar="ID=POINTS",
                        help="an exercise's points when passed (1.8=3); default: 1 each")
    parser.add_argument("--out", type=Path, metavar="FOLDER",
                        help="where grades.csv, grades_long.csv and grades.json go (default: "
                             "SUBMISSIONS)")
    parser.add_argument("--salt", default="",
                        help="mixed into each student's seed, so that a student cannot work out "
                             "their inputs from their name alone; the seeds are in the report")
    parser.add_argument("--time_limit", type=float, default=TIME_LIMIT, metavar="SECONDS",
                        help="the most an exercise's checks may take; each call of a student's "
                             "function gets what is left of it (default: %(default)g)")
    parser.add_argument("--memory_limit", type=int, default=MEMORY_LIMIT, metavar="MIB",
                        help="the memory a student's process may take beyond torch's own "
                             "(default: %(default)d)")
    parser.add_argument("--jobs", type=int, default=1, metavar="N",
                        help="students graded at once, each in a process of its own; up to the "
                             "machine's cores (default: %(default)d)")
    args = parser.parse_args(argv)

    # Each mistake of the command line in one line, before a student's folder is read.
    if not sys.platform.startswith("linux"):
        return _error(f"the grading mode runs on Linux (it holds students' processes apart with "
                      f"Linux's prctl and /proc), not {sys.platform}: grade in a Linux container "
                      "or machine; python -m exercises.check works here")
    submissions = Path(args.submissions)
    if not submissions.is_dir():
        return _error(f"{submissions} is not a folder: give the folder that holds one folder per "
                      "student")
    out = args.out or submissions
    if out.exists() and not out.is_dir():
        return _error(f"--out {out} is a file: give a folder for the grades")
    folders = sorted((p for p in submissions.iterdir() if p.is_dir() and not p.is_symlink()
                      and not p.name.startswith(".") and p.resolve() != out.resolve()
                      and p.name != "__pycache__"), key=lambda p: os.fsencode(p.name))
    if not folders:
        return _error(f"{submissions} holds no student folders: put each student's files in a "
                      f"folder of their own ({submissions}/alice/e05_group_advantages.py)")
    if not args.time_limit > 0:
        return _error(f"--time_limit {args.time_limit:g}: give the seconds an exercise may take, "
                      f"more than 0 (the default is {TIME_LIMIT:g})")
    if not args.memory_limit >= 64:
        return _error(f"--memory_limit {args.memory_limit}: give 64 MiB or more (the default is "
                      f"{MEMORY_LIMIT})")
    if args.jobs < 1:
        return _error(f"--jobs {args.jobs}: give 1 or more students at once (this machine has "
                      f"{os.cpu_count()} cores)")
    wanted_points = {}
    for given in args.points:
        id, _, value = given.partition("=")
        try:
            wanted_points[id] = float(value)
        except ValueError:
            return _error(f"--points {given}: give ID=POINTS, such as 1.8=3")
        if not wanted_points[id] >= 0:
            return _error(f"--points {given}: give 0 points or more")

    from exercises.check import all_exercises  # torch and the algorithm files: the slow part

    everything = all_exercises()
    chosen = [e for e in everything.values() if not args.exercises
              or any(e.id == i or e.id.split(".")[0] == i for i in args.exercises)]
    if not chosen:
        return _error(f"no exercise {' '.join(args.exercises)}; the exercises are "
                      f"{', '.join(everything)}")
    unknown = [id for id in wanted_points if id not in everything]
    if unknown:
        return _error(f"--points {unknown[0]}: no such exercise; the exercises are "
                      f"{', '.join(everything)}")
    points = {e.id: wanted_points.get(e.id, 1.0) for e in chosen}
    out.mkdir(parents=True, exist_ok=True)
    limits = dict(time_limit=args.time_limit, memory_mib=args.memory_limit,
                  cpu_seconds=len(chosen) * args.time_limit + 120)
    seeds = [student_seed(folder.name, args.salt) for folder in folders]
    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: students cannot read this one

    graded = {}

    def done(index, student):
        graded[index] = student
        write_reports(out, [graded[i] for i in sorted(graded)], chosen)
        ignored = student["ignored"]
        said = (f"; ignored {len(ignored)} other file{'s' * (len(ignored) != 1)}: "
                f"{', '.join(ignored[:5])}{', ...' if len(ignored) > 5 else ''}"
                if ignored else "")
        print(f"{student['student']} (seed {student['seed']}): {student['passed']} of "
              f"{len(chosen)} passed, {student['points']:g} of {student['max_points']:g} "
              f"points{said}", flush=True)

    try:
        grade_class(folders, seeds, chosen, points, limits, args.jobs, done)
    except KeyboardInterrupt:
        print(f"error: interrupted (Ctrl-C) after {len(graded)} of {len(folders)} students; "
              f"{out / 'grades.csv'} holds those", file=sys.stderr)
        return 130
    except RuntimeError as e:
        return _error(f"{e}; {len(graded)} of {len(folders)} students graded")
    print(f"wrote {out / 'grades.csv'}, grades_long.csv and grades.json: {len(graded)} students, "
          f"{len(chosen)} exercises each")
    return 0


def _error(message) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
