"""The exercises' checker: runs an exercise's checks on your function and says in words what is
wrong with it.

    python -m exercises.check 1.5           # PS1.5: your group_advantages against grpo.py's
    python -m exercises.check 1             # every exercise of PS1
    python -m exercises.check               # every exercise
    python -m exercises.check --solution    # the project's own functions in your place (all pass)
    python -m exercises.check --seed 1234   # other random inputs (a grader's, for one student)
    python -m exercises.check --json        # one JSON object per exercise, for a program to read

The reference is the project itself: each exercise's oracle is the function of the algorithm file
(or of common/) that the exercise asks you to write, called on the same inputs, so that an
exercise and the code it teaches cannot drift apart. Where your output differs, the checker runs
the mistakes students make most often (the wrong axis, the mask forgotten, the ratio inverted) on
the same inputs, and when yours matches one of them it names it.

Each exercise is checked in a process of its own, which the checker waits on for at most
--time_limit seconds: a function that loops forever is stopped and said to, and one that ends the
process (sys.exit, os._exit) fails, since a check passes only when the checker reaches its verdict.
The exit status is 0 only when every exercise checked passed. A class is graded with
exercises/grade.py, which runs the same checks with each student's functions in a process apart.
"""

import argparse
import json
import multiprocessing
import os
import sys

from exercises.exercise import Exercise, Wrong, run_checks
from exercises.ps1 import cases
from exercises.ps1.cases import EXERCISES as PS1

TIME_LIMIT = 60.0  # seconds an exercise's checks may take; the project's own take under 1 s each


def all_exercises() -> dict:
    """{id: Exercise} of every problem set."""
    return {e.id: e for e in PS1}


def check(exercise: Exercise, solution: bool = False) -> str | None:
    """None if the student's function passes (the oracle's, with solution), else what is wrong."""
    try:
        run_checks(exercise, exercise.oracle if solution else exercise.student())
    except Wrong as e:
        return str(e)
    return None


def check_apart(exercise: Exercise, solution: bool = False, time_limit: float = TIME_LIMIT,
                prints_to_stderr: bool = False) -> str | None:
    """check() in a child process: None if the function passes, else what is wrong, including
    what a process cannot say of itself (that it looped past the time limit, or exited before its
    verdict). The child is forked, so nothing is imported again. prints_to_stderr: what the
    student's code prints goes to stderr, so that stdout holds the checker's verdicts alone."""
    sys.stdout.flush()  # else the child would print the parent's buffered lines a second time
    sys.stderr.flush()
    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_check_and_send, args=(exercise, solution, send,
                                                          prints_to_stderr), daemon=True)
    child.start()
    send.close()  # the child's end: when the child is gone, recv() sees the end of the pipe
    try:
        if not receive.poll(time_limit):
            return (f"took more than {time_limit:g} s, and was stopped: look for a loop that never "
                    "ends (or give it longer with --time_limit)")
        try:
            return receive.recv()
        except EOFError:  # the child ended without a verdict
            child.join()
            return (f"the check ended before its verdict (exit status {child.exitcode}): your "
                    f"{exercise.name} or its file ends the process (sys.exit, os._exit); a check "
                    "passes only when it runs to the end")
    finally:
        child.kill()
        child.join()
        receive.close()


def _check_and_send(exercise, solution, send, prints_to_stderr=False):
    # A forked child of a process that ran torch's OpenMP threads hangs in its first parallel op
    # unless it runs on one thread (torch's DataLoader workers do the same).
    import torch

    torch.set_num_threads(1)
    if prints_to_stderr:  # the child's own stdout, the file descriptor too: the parent's is kept
        os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
        sys.stdout = sys.stderr
    try:
        verdict = check(exercise, solution)
    except Exception as e:  # outside the student's function: the checker's own bug
        verdict = f"the checker failed ({type(e).__name__}: {e}); please report it"
    send.send(verdict)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("ids", nargs="*", help="exercises (1.5) or problem sets (1); default: all")
    parser.add_argument("--solution", action="store_true",
                        help="check the project's own functions instead of yours (they all pass)")
    parser.add_argument("--time_limit", type=float, default=TIME_LIMIT, metavar="SECONDS",
                        help="the most an exercise's checks may take (default: %(default)g)")
    parser.add_argument("--seed", type=int, default=0,
                        help="draw the random inputs from this seed (a grader gives each student "
                             "one); 0, the default, gives the inputs as shipped")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object a line per exercise (id, title, passed, "
                             "message) and nothing else on stdout; what your code prints goes to "
                             "stderr")
    args = parser.parse_args(argv)
    exercises = all_exercises()
    chosen = [e for e in exercises.values()
              if not args.ids or any(e.id == i or e.id.split(".")[0] == i for i in args.ids)]
    if not chosen:
        print(f"error: no exercise {' '.join(args.ids)}; the exercises are "
              f"{', '.join(exercises)}", file=sys.stderr)
        return 2
    if not args.time_limit > 0:
        print(f"error: --time_limit {args.time_limit:g}: give the seconds an exercise may take, "
              f"more than 0 (the default is {TIME_LIMIT:g})", file=sys.stderr)
        return 2
    if args.seed < 0:
        print(f"error: --seed {args.seed}: give a seed of 0 or more (0 gives the inputs as "
              "shipped)", file=sys.stderr)
        return 2
    cases.STUDENT_SEED = args.seed  # read as each check draws its inputs, in its forked child too
    failed = 0
    try:
        for exercise in chosen:
            problem = check_apart(exercise, args.solution, args.time_limit, args.json)
            failed += problem is not None
            status = "ok" if problem is None else problem
            if args.json:
                print(json.dumps({"id": exercise.id, "title": exercise.title,
                                  "passed": problem is None, "message": status}), flush=True)
            else:
                print(f"PS{exercise.id} {exercise.title}: {status}", flush=True)
    except KeyboardInterrupt:  # Ctrl-C: no verdict on the rest, and no pass
        print("error: interrupted (Ctrl-C) before every exercise was checked", file=sys.stderr)
        return 130
    finally:  # main() called in a process that goes on (a test) leaves the inputs as shipped
        cases.STUDENT_SEED = 0
    if not args.json:  # a program counts the objects itself
        print(f"{len(chosen) - failed} of {len(chosen)} passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
