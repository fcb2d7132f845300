"""The exercises' checker: runs an exercise's checks on your function and says in words what is
wrong with it.

    python -m exercises.check 1.5           # PS1.5: your group_advantages against grpo.py's
    python -m exercises.check 1             # every exercise of PS1
    python -m exercises.check               # every exercise
    python -m exercises.check --solution    # the project's own functions in your place (all pass)

The reference is the project itself: each exercise's oracle is the function of the algorithm file
(or of common/) that the exercise asks you to write, called on the same inputs, so that an
exercise and the code it teaches cannot drift apart. Where your output differs, the checker runs
the mistakes students make most often (the wrong axis, the mask forgotten, the ratio inverted) on
the same inputs, and when yours matches one of them it names it.
"""

import argparse
import sys

from exercises.exercise import Exercise, Wrong, run_checks
from exercises.ps1.cases import EXERCISES as PS1


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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("ids", nargs="*", help="exercises (1.5) or problem sets (1); default: all")
    parser.add_argument("--solution", action="store_true",
                        help="check the project's own functions instead of yours (they all pass)")
    args = parser.parse_args(argv)
    exercises = all_exercises()
    chosen = [e for e in exercises.values()
              if not args.ids or any(e.id == i or e.id.split(".")[0] == i for i in args.ids)]
    if not chosen:
        print(f"error: no exercise {' '.join(args.ids)}; the exercises are "
              f"{', '.join(exercises)}", file=sys.stderr)
        return 2
    failed = 0
    for exercise in chosen:
        problem = check(exercise, args.solution)
        failed += problem is not None
        status = "ok" if problem is None else problem
        print(f"PS{exercise.id} {exercise.title}: {status}")
    print(f"{len(chosen) - failed} of {len(chosen)} passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
