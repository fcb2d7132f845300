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
import importlib
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

ROOT = Path(__file__).resolve().parents[1]


class Wrong(Exception):
    """What is wrong with a student's function, in words."""


@dataclass
class Exercise:
    """One exercise: the function a student writes, and how it is checked.

    module, name: where the student's function is (exercises/ps1/e05_group_advantages.py: name).
    oracle: the project's function, called as the student's is.
    cases: () -> [(what the case is, keyword arguments)]: inputs on which both are compared.
    worked: [(what, keyword arguments, expected output)]: small cases worked by hand, in the
        exercise's docstring too; the oracle passes them as well (tests/test_exercises.py).
    mistakes: [(what the student probably did, that wrong function)]: where the student's output
        differs from the oracle's, the first mistake that gives the student's outputs on every
        input is named; the words may be a function (kwargs, the student's output) -> str, to
        quote the student's own numbers.
    explain: optional (kwargs, student's output, oracle's output) -> a sentence on what differs.
    """

    id: str
    title: str
    module: str
    name: str
    oracle: Callable
    cases: Callable
    worked: list = field(default_factory=list)
    mistakes: list = field(default_factory=list)
    explain: Callable | None = None

    @property
    def path(self) -> str:
        return self.module.replace(".", "/") + ".py"

    def student(self):
        """The student's function, imported fresh from its file."""
        module = importlib.import_module(self.module)
        return getattr(importlib.reload(module), self.name)


def _clone(value):
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, (list, tuple)):
        return type(value)(_clone(v) for v in value)
    if isinstance(value, dict):
        return {k: _clone(v) for k, v in value.items()}
    return value


def close(a, b, tol=1e-5) -> bool:
    """Are two outputs equal: tensors of the same shape within tol (NaN where the other has NaN),
    or tuples of such, or equal numbers?"""
    if isinstance(a, (tuple, list)) or isinstance(b, (tuple, list)):
        return (isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)) and len(a) == len(b)
                and all(close(x, y, tol) for x, y in zip(a, b)))
    if isinstance(b, torch.Tensor):
        if not isinstance(a, torch.Tensor) or a.shape != b.shape:
            return False
        if a.dtype in (torch.bool, torch.int64, torch.int32) or b.dtype in (torch.bool, torch.int64):
            return bool(torch.equal(a.long(), b.long()))
        return bool(torch.allclose(a.double(), b.double(), rtol=tol, atol=tol, equal_nan=True))
    try:
        return abs(float(a) - float(b)) <= tol * max(1.0, abs(float(b)))
    except (TypeError, ValueError):
        return a == b


def show(value) -> str:
    """A short text of an output: a tensor's shape and its first values."""
    if isinstance(value, (tuple, list)):
        return "(" + ", ".join(show(v) for v in value) + ")"
    if isinstance(value, torch.Tensor):
        flat = value.detach().double().flatten()[:8].tolist()
        numbers = ", ".join(f"{v:.4g}" for v in flat) + (", ..." if value.numel() > 8 else "")
        return f"tensor of shape {list(value.shape)}: [{numbers}]"
    return repr(value)


def run_checks(exercise: Exercise, fn: Callable) -> None:
    """Raise Wrong with the first problem found in fn, else return."""
    where = f"{exercise.name} in {exercise.path}"
    for what, kwargs, expected in exercise.worked:
        _compare(exercise, fn, what, kwargs, expected, where)
    for what, kwargs in exercise.cases():
        _compare(exercise, fn, what, kwargs, exercise.oracle(**_clone(kwargs)), where)


def _compare(exercise, fn, what, kwargs, expected, where):
    given = _clone(kwargs)
    try:
        got = fn(**given)
    except NotImplementedError:
        raise Wrong(f"not written yet: fill in {where}") from None
    except Exception as e:  # the student's bug, said in one line with the case that found it
        raise Wrong(f"{what}: your {exercise.name} raised {type(e).__name__}: {e}") from None
    for key, value in kwargs.items():
        if isinstance(value, torch.Tensor) and not torch.equal(given[key], value):
            raise Wrong(f"{what}: your {exercise.name} changed its input {key} in place; work "
                        "on a copy (the trainer reuses its tensors)")
    if close(got, expected):
        return
    if isinstance(expected, torch.Tensor) and isinstance(got, torch.Tensor) \
            and got.shape != expected.shape:
        raise Wrong(f"{what}: the output has shape {list(got.shape)}, it should have "
                    f"{list(expected.shape)}")
    for mistake, wrong in exercise.mistakes:
        if _agrees_everywhere(exercise, fn, wrong):
            said = mistake(kwargs, got) if callable(mistake) else mistake
            raise Wrong(f"{what}: {said}")
    said = exercise.explain(kwargs, got, expected) if exercise.explain else None
    raise Wrong(f"{what}: {said or ''}{' ' if said else ''}expected {show(expected)}, got "
                f"{show(got)}")


def _agrees_everywhere(exercise, fn, wrong) -> bool:
    """Does the student's function give the same outputs as a planted mistake on every input of
    the exercise? One input may not tell two mistakes apart; all of them do."""
    inputs = [kwargs for _, kwargs, _ in exercise.worked] + [kwargs for _, kwargs in
                                                             exercise.cases()]
    try:
        return all(close(fn(**_clone(kwargs)), wrong(**_clone(kwargs))) for kwargs in inputs)
    except Exception:  # the student's function or the mistake fails on some input
        return False


def all_exercises() -> dict:
    """{id: Exercise} of every problem set."""
    from exercises.ps1.checks import EXERCISES as PS1
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
