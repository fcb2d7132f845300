"""How long the grading mode takes for a class, one student at a time and several at once.

    python bench/grade_class.py                      # 40 right students, --jobs 1 then 2
    python bench/grade_class.py --students 8 --jobs 1 2 4

The class is made of copies of tests/data/right_answers/ (a right answer to each of PS1's
exercises), one folder per student, so that each student has inputs of their own seed and every
exercise runs every check, gradients included. Each --jobs value grades the whole class with
`python -m exercises.grade` in a fresh process, so that the figure includes the grader's own start.
Printed: the wall time, the seconds a student, the speedup against the first --jobs value, and
whether every run gave every student full marks and the same grades.
"""

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ANSWERS = ROOT / "tests" / "data" / "right_answers"


def make_class(folder: Path, students: int) -> None:
    for k in range(students):
        shutil.copytree(ANSWERS, folder / f"student{k:02d}")


def grade(folder: Path, jobs: int, out: Path) -> tuple[float, list]:
    """(wall seconds, the report's students) of one grading of the class."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "exercises.grade", str(folder), "--jobs", str(jobs),
                    "--out", str(out)], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    seconds = time.perf_counter() - start
    return seconds, json.loads((out / "grades.json").read_text())["students"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--students", type=int, default=40, help="the class's size")
    parser.add_argument("--jobs", type=int, nargs="+", default=[1, 2],
                        help="the --jobs values to time, the first the baseline")
    args = parser.parse_args(argv)
    if args.students < 1 or min(args.jobs) < 1:
        parser.error(f"--students {args.students} --jobs {' '.join(map(str, args.jobs))}: give "
                     "1 or more of each")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "class"
        make_class(folder, args.students)
        runs = []
        for jobs in args.jobs:
            seconds, students = grade(folder, jobs, Path(tmp) / f"out-{jobs}")
            runs.append((jobs, seconds, students))
            full = all(s["points"] == s["max_points"] for s in students)
            print(f"--jobs {jobs}: {seconds:.1f} s for {args.students} students "
                  f"({seconds / args.students:.2f} s each), {runs[0][1] / seconds:.2f}x the "
                  f"--jobs {args.jobs[0]} run; every student full marks: {full}", flush=True)
    same = all(students == runs[0][2] for _, _, students in runs)
    print(f"the same grades at every --jobs: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
