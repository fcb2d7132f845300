"""Grade a class's PS1: each student's files checked in a fresh copy of the project.

    python -m exercises.grade SUBMISSIONS/                       # every exercise, every student
    python -m exercises.grade SUBMISSIONS/ --exercises 1.1 1.5   # some exercises (or 1: PS1)
    python -m exercises.grade SUBMISSIONS/ --points 1.8=3 --out grades/

SUBMISSIONS holds one folder per student, named as the report names them, each holding the
student's exercise files where a clone has them (alice/exercises/ps1/e05_group_advantages.py) or
alone (alice/e05_group_advantages.py). Only files named as PS1's exercise files are taken: the
rest, a check.py, cases.py or exercise.py of the student's own among them, is ignored, and the
report says which.

For each student the grader copies its own checkout's code (the algorithm files at the root,
common/ and exercises/) to a temporary folder, puts the student's exercise files over the stubs
there, and runs `python -m exercises.check --json --seed SEED` in it: each exercise in a process of
its own, under the checker's time limit. Before that each file is read, not run: one that imports
the project's code (where the solutions are), a module other than torch, numpy and a few of the
standard library's, or reaches for the machinery of imports, code and files (importlib,
__import__, sys, exec, eval, compile, open, getattr, a __dunder__ attribute) is refused with 0
points and its line named.

SEED is the student's: zlib.crc32 of the folder's name (of SALT/name with --salt), so that each
student's random inputs are their own and the same at every grading. `python -m exercises.check
--seed SEED` in the student's clone gives the same verdicts.

The report, grades.csv and grades.json in --out (default: SUBMISSIONS itself): a row per student
and exercise (student, seed, exercise, points, passed, message), then a total per student.

This is not a sandbox: the students' code runs with the rights of whoever runs the grader, and
the reading above stops the easy ways to the solution, not a determined attacker. Run it in a
container.
"""

import argparse
import ast
import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the grader's own checkout: the code it copies
COPIED = ("common", "exercises")  # with the root's *.py, the algorithm files: all a check imports
TIME_LIMIT = 60.0  # as exercises/check.py's (not imported: that needs torch, and this comes first)

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
    return zlib.crc32((f"{salt}/{name}" if salt else name).encode()) or 1


def project_modules() -> set:
    """The names the project's code is imported by: the root's files and folders."""
    return {p.stem if p.suffix == ".py" else p.name for p in ROOT.iterdir()
            if not p.name.startswith((".", "_")) and (p.is_dir() or p.suffix == ".py")}


def refusal(source: bytes) -> str | None:
    """Why a student's file is refused, naming the first line at fault, or None. The file is
    parsed, never run. One that does not parse is not refused here: the checker says where."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
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


def handed_in(folder: Path, names) -> tuple[dict, list]:
    """The student's exercise files, {file name: path}, from folder/exercises/ps1/ or else from
    folder itself, and the folder's other files (hidden folders and caches left out), ignored."""
    taken = {}
    for where in (folder / "exercises" / "ps1", folder):
        for name in names:
            if name not in taken and (where / name).is_file():
                taken[name] = where / name
    ignored = []
    for here, folders, files in os.walk(folder):
        folders[:] = sorted(f for f in folders if not f.startswith(".") and f != "__pycache__")
        ignored += [str((Path(here) / f).relative_to(folder)) for f in sorted(files)
                    if Path(here) / f not in taken.values()]
    return taken, ignored


def fresh_copy(dest: Path) -> None:
    """The grader's own code into dest: the algorithm files and COPIED, caches left out."""
    for path in sorted(ROOT.glob("*.py")):
        shutil.copyfile(path, dest / path.name)
    for name in COPIED:
        shutil.copytree(ROOT / name, dest / name,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


def check_in(copy: Path, ids: list, seed: int, time_limit: float) -> tuple[dict, str]:
    """Run the checker in the copy on the exercises ids: ({id: its JSON verdict}, why the checker
    stopped short, or ''). The checker and its children run in a process group of their own, so
    that a function still looping when the time is up is stopped with them."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the copy's code, no other
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    command = [sys.executable, "-m", "exercises.check", "--json", "--seed", str(seed),
               "--time_limit", repr(time_limit), *ids]
    # The checker's own time limit holds each exercise; this one, the whole, only if that fails.
    timeout = len(ids) * (time_limit + 10) + 300
    errors = copy.parent / "stderr.txt"  # the student's prints go there: a file, however many
    with open(errors, "w") as err:
        process = subprocess.Popen(command, cwd=copy, env=env, stdout=subprocess.PIPE, stderr=err,
                                   text=True, start_new_session=True)
        try:
            out, _ = process.communicate(timeout=timeout)
            stopped = ""
        except subprocess.TimeoutExpired:
            _kill_group(process)
            out, _ = process.communicate()
            stopped = f"the checker took more than {timeout:g} s in all and was stopped"
        except BaseException:  # Ctrl-C: the checker's group is not the terminal's, so stop it
            _kill_group(process)
            raise
        _kill_group(process)  # a child left behind, if any
    verdicts = {}
    for line in out.splitlines():
        try:
            verdict = json.loads(line)
        except ValueError:
            continue
        if isinstance(verdict, dict) and verdict.get("id") in ids:
            verdicts[verdict["id"]] = verdict
    if not stopped and len(verdicts) < len(ids):
        last = errors.read_text(errors="replace").strip().splitlines()[-1:] or ["nothing"]
        stopped = (f"the checker stopped (exit status {process.returncode}), its last words: "
                   f"{last[0][:200]}")
    return verdicts, stopped


def _kill_group(process):
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def grade(folder: Path, exercises: list, all_names: list, seed: int, points: dict,
          time_limit: float) -> dict:
    """One student's grades: the total and a row per exercise."""
    taken, ignored = handed_in(folder, all_names)
    rows, to_check = {}, []
    for exercise in exercises:
        name = Path(exercise.path).name
        if not taken:
            why = (f"no exercise file handed in: {folder.name}/ holds no exercises/ps1/e*.py, nor "
                   "e*.py files of PS1's names")
        elif name not in taken:
            why = f"not handed in: no {name} (in exercises/ps1/ or alone)"
        else:
            why = refusal(taken[name].read_bytes())
            why = f"refused: {name}, {why}" if why else None
        if why:
            rows[exercise.id] = dict(passed=False, message=why)
        else:
            to_check.append(exercise)
    if to_check:
        with tempfile.TemporaryDirectory(prefix=f"grade-{seed}-") as tmp:
            copy = Path(tmp) / "project"
            copy.mkdir()
            fresh_copy(copy)
            for exercise in to_check:  # the student's text over the stub (a link is not followed)
                (copy / exercise.path).write_bytes(taken[Path(exercise.path).name].read_bytes())
            verdicts, stopped = check_in(copy, [e.id for e in to_check], seed, time_limit)
        for exercise in to_check:
            verdict = verdicts.get(exercise.id) or dict(passed=False,
                                                        message=f"no verdict: {stopped}")
            rows[exercise.id] = dict(passed=verdict["passed"] is True,
                                     message=str(verdict["message"]))
    results = [dict(id=e.id, title=e.title, points=points[e.id] if rows[e.id]["passed"] else 0,
                    **rows[e.id]) for e in exercises]
    return dict(student=folder.name, seed=seed, points=sum(r["points"] for r in results),
                max_points=sum(points[e.id] for e in exercises),
                passed=sum(r["passed"] for r in results), exercises=results, ignored=ignored)


def _number(x):
    return int(x) if float(x).is_integer() else x


def write_reports(out: Path, students: list) -> None:
    """grades.csv, a row per student and exercise then the student's total, and grades.json."""
    with open(out / "grades.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["student", "seed", "exercise", "points", "passed", "message"])
        for s in students:
            for r in s["exercises"]:
                writer.writerow([s["student"], s["seed"], r["id"], f"{r['points']:g}",
                                 r["passed"], r["message"]])
            writer.writerow([s["student"], s["seed"], "total", f"{s['points']:g}",
                             f"{s['passed']} of {len(s['exercises'])}",
                             f"ignored: {', '.join(s['ignored'])}" if s["ignored"] else ""])
    report = [dict(s, points=_number(s["points"]), max_points=_number(s["max_points"]),
                   exercises=[dict(r, points=_number(r["points"])) for r in s["exercises"]])
              for s in students]
    (out / "grades.json").write_text(json.dumps({"students": report}, indent=1) + "\n")


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, as the grader's other errors, not argparse's usage
        print(f"error: {message} (python -m exercises.grade --help)", file=sys.stderr)
        sys.exit(2)


def main(argv=None) -> int:
    parser = _Parser(description=__doc__.split("\n\n")[0],
                     epilog="A student's seed, in the report, gives their inputs again: python "
                            "-m exercises.check --seed SEED in their clone. Their code runs with "
                            "your rights: grade in a container.")
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
                        help="where grades.csv and grades.json go (default: SUBMISSIONS)")
    parser.add_argument("--salt", default="",
                        help="mixed into each student's seed, so that a student cannot work out "
                             "their inputs from their name alone; the seeds are in the report")
    parser.add_argument("--time_limit", type=float, default=TIME_LIMIT, metavar="SECONDS",
                        help="the most an exercise's checks may take (default: %(default)g)")
    args = parser.parse_args(argv)

    # Each mistake of the command line in one line, before a student's folder is read.
    submissions = Path(args.submissions)
    if not submissions.is_dir():
        return _error(f"{submissions} is not a folder: give the folder that holds one folder per "
                      "student")
    out = args.out or submissions
    if out.exists() and not out.is_dir():
        return _error(f"--out {out} is a file: give a folder for grades.csv and grades.json")
    folders = sorted(p for p in submissions.iterdir() if p.is_dir() and not p.name.startswith(".")
                     and p.resolve() != out.resolve() and p.name != "__pycache__")
    if not folders:
        return _error(f"{submissions} holds no student folders: put each student's files in a "
                      f"folder of their own ({submissions}/alice/e05_group_advantages.py)")
    if not args.time_limit > 0:
        return _error(f"--time_limit {args.time_limit:g}: give the seconds an exercise may take, "
                      f"more than 0 (the default is {TIME_LIMIT:g})")
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
    all_names = [Path(e.path).name for e in everything.values()]
    out.mkdir(parents=True, exist_ok=True)

    students = []
    try:
        for folder in folders:
            seed = student_seed(folder.name, args.salt)
            student = grade(folder, chosen, all_names, seed, points, args.time_limit)
            students.append(student)
            ignored = student["ignored"]
            said = (f"; ignored {len(ignored)} other file{'s' * (len(ignored) != 1)}: "
                    f"{', '.join(ignored[:5])}{', ...' if len(ignored) > 5 else ''}"
                    if ignored else "")
            print(f"{folder.name} (seed {seed}): {student['passed']} of {len(chosen)} passed, "
                  f"{student['points']:g} of {student['max_points']:g} points{said}", flush=True)
    except KeyboardInterrupt:
        print(f"error: interrupted (Ctrl-C) after {len(students)} of {len(folders)} students; no "
              "report written", file=sys.stderr)
        return 130
    write_reports(out, students)
    print(f"wrote {out / 'grades.csv'} and {out / 'grades.json'}: {len(students)} students, "
          f"{len(chosen)} exercises each")
    return 0


def _error(message) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
