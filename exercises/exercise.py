"""What an exercise is and how a student's function is held to it: the oracle on the same inputs,
the hand-worked cases, and the mistakes named when the student's output matches one. The problem
sets (exercises/ps1/cases.py) are made of these; exercises/check.py runs them."""

import importlib
import traceback
from dataclasses import dataclass, field
from typing import Callable

import torch

from exercises.worker import projected_gradients


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
    differentiable: the names of the float inputs that the training differentiates the output
        through (the policy's log-probs, the critic's values); on each case the gradient of a
        random projection of the output with respect to each is compared with the oracle's, so
        that a detached or no_grad answer with the right numbers fails. () where the file uses
        the output as a constant (advantages, weights, token ids).
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
    differentiable: tuple = ()

    @property
    def path(self) -> str:
        return self.module.replace(".", "/") + ".py"

    def student(self):
        """The student's function, imported fresh from its file. A file that is missing, does not
        parse, or stops while it is imported (an error, a KeyboardInterrupt, sys.exit) is Wrong,
        said in one line with the file and its line."""
        try:
            module = importlib.import_module(self.module)
            module = importlib.reload(module)
        except ModuleNotFoundError as e:
            if e.name != self.module and not self.module.startswith(f"{e.name}."):
                raise Wrong(f"{self.path}, line {_line_in(e, self.path)}: importing it raised "
                            f"ModuleNotFoundError: {e}") from None
            raise Wrong(f"{self.path} is missing: restore it with `git checkout -- {self.path}` "
                        "(your version, if you had one, is in your editor or git's history)") \
                from None
        except SyntaxError as e:  # IndentationError too
            raise Wrong(f"{self.path}, line {e.lineno}: {type(e).__name__}: {e.msg}; fix that "
                        "line, then check again") from None
        except BaseException as e:  # what the file runs on import: it is the student's
            raise Wrong(f"{self.path}, line {_line_in(e, self.path)}: importing it raised "
                        f"{type(e).__name__}{f': {e}' if str(e) else ''}") from None
        if not callable(getattr(module, self.name, None)):
            raise Wrong(f"{self.path} has no function {self.name}: keep its name and signature "
                        f"as given (`git show HEAD:{self.path}` shows the file as shipped)")
        return getattr(module, self.name)


def _line_in(error, path) -> str:
    """The line of `path` where `error` was raised (its last frame in that file), or '?'."""
    lines = [f.lineno for f in traceback.extract_tb(error.__traceback__)
             if f.filename.endswith(path)]
    return str(lines[-1]) if lines else "?"


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
    """A short text of an output: a small tensor as its numbers ([[0.5, 0.75]]), a larger one as its
    shape and first values."""
    if isinstance(value, (tuple, list)):
        return "(" + ", ".join(show(v) for v in value) + ")"
    if isinstance(value, torch.Tensor):
        if value.numel() <= 8:
            return _numbers(value.detach().tolist() if value.dtype == torch.bool
                            else value.detach().double().tolist())
        flat = value.detach().double().flatten()[:8].tolist()
        numbers = ", ".join(f"{v:.4g}" for v in flat) + ", ..."
        return f"tensor of shape {list(value.shape)}: [{numbers}]"
    return repr(value)


def _numbers(values) -> str:
    if isinstance(values, list):
        return "[" + ", ".join(_numbers(v) for v in values) + "]"
    return str(values) if isinstance(values, bool) else f"{values + 0.0:.4g}"  # no "-0"


def run_checks(exercise: Exercise, fn: Callable) -> None:
    """Raise Wrong with the first problem found in fn, else return. The values first, on the
    hand-worked cases (the smallest, so that a failure is said on numbers a student can follow)
    and then the random ones; then, once every value is right, the gradients."""
    where = f"{exercise.name} in {exercise.path}"
    cases = [(what, kwargs) for what, kwargs, _ in exercise.worked] + exercise.cases()
    for what, kwargs, expected in exercise.worked:
        _compare(exercise, fn, what, kwargs, expected, where)
    for what, kwargs in cases[len(exercise.worked):]:
        _compare(exercise, fn, what, kwargs, exercise.oracle(**_clone(kwargs)), where)
    for what, kwargs in cases:
        _compare_gradients(exercise, fn, what, kwargs, cases)


def _compare(exercise, fn, what, kwargs, expected, where):
    given = _clone(kwargs)
    try:
        got = fn(**given)
    except NotImplementedError:
        raise Wrong(f"not written yet: fill in {where}") from None
    except SystemExit as e:  # a pass by exit status that no check gave
        raise Wrong(f"{what}: your {exercise.name} called sys.exit({e.code!r}): a function returns "
                    "its result, and the checker alone ends the check") from None
    except (Exception, KeyboardInterrupt) as e:  # the student's bug, said with the case it met
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
    # The case in words first (its inputs, where the output differs, the expected and the got),
    # then the mistake it looks like, when one of the listed mistakes gives the same numbers.
    case = f"{what}: {difference(got, expected)}"
    for mistake, wrong in exercise.mistakes:
        if _agrees_everywhere(exercise, fn, wrong):
            said = mistake(kwargs, got) if callable(mistake) else mistake
            raise Wrong(f"{case}. The likely mistake: {said}")
    said = exercise.explain(kwargs, got, expected) if exercise.explain else None
    raise Wrong(f"{case}{'. ' + said if said else ''}")


def difference(got, expected, noun="the output") -> str:
    """Where two outputs differ, in words: the first entry that differs (its index, the expected
    and the got), and the whole outputs when they are short."""
    if isinstance(expected, (tuple, list)) and isinstance(got, (tuple, list)) \
            and len(got) == len(expected):
        for k, (a, b) in enumerate(zip(got, expected)):
            if not close(a, b):
                return f"output {k} of the {len(expected)}: {difference(a, b)}"
    if isinstance(expected, torch.Tensor) and isinstance(got, torch.Tensor) \
            and got.shape == expected.shape and expected.dim() > 0:
        a, b = got.detach().double(), expected.detach().double()
        differs = (a != b) if not expected.is_floating_point() else ~torch.isclose(
            a, b, rtol=1e-5, atol=1e-5, equal_nan=True)  # as close() compares them
        if differs.any():
            index = [int(i) for i in differs.nonzero()[0]]
            where = (f"row {index[0]}" if len(index) == 1
                     else f"row {index[0]}, position {', '.join(map(str, index[1:]))}")
            first = f"at {where} {noun} should be {b[tuple(index)].item():.4g}, yours is " \
                    f"{a[tuple(index)].item():.4g}"
            if expected.numel() <= 8:
                return f"{first} (expected {show(expected)}, got {show(got)})"
            count = int(differs.sum())
            return f"{first}; {count} of the {expected.numel()} entries differ"
    return f"expected {show(expected)}, got {show(got)}"


def _agrees_everywhere(exercise, fn, wrong) -> bool:
    """Does the student's function give the same outputs as a planted mistake on every input of
    the exercise? One input may not tell two mistakes apart; all of them do."""
    inputs = [kwargs for _, kwargs, _ in exercise.worked] + [kwargs for _, kwargs in
                                                             exercise.cases()]
    try:
        return all(close(fn(**_clone(kwargs)), wrong(**_clone(kwargs))) for kwargs in inputs)
    except Exception:  # the student's function or the mistake fails on some input
        return False


# ---- gradients ---------------------------------------------------------------------------------
# A loss built from the right numbers can still fail to train: computed under torch.no_grad(), or
# from a detached ratio, its values agree with the oracle's and its gradient is 0. The check takes
# the gradient of one fixed random projection of the output, sum(w * output), with respect to each
# input the training differentiates through, from the student's function and from the oracle's.


def gradients(fn, kwargs, names):
    """{name: d sum(w * output) / d input} for the inputs `names`, with w a fixed random
    projection; None where the output carries no gradient at all. A student's function that runs
    in a process of its own (the grading mode) takes its gradients there, by the same code."""
    if hasattr(fn, "gradients"):
        return fn.gradients(kwargs, names)
    return projected_gradients(fn, _clone(kwargs), names)


def _grad_close(a, b) -> bool:
    return torch.allclose(a, b, rtol=1e-4, atol=1e-6)


def _gradients_agree(a, b) -> bool:
    """Equal gradients; an output without any gradient (None) agrees with gradients of 0, since
    a right answer may return a constant where the oracle's gradient is 0 (an all-padding mask)."""
    if a is None and b is None:
        return True
    if a is None or b is None:
        return not any(g.any() for g in (a or b).values())
    return all(_grad_close(a[n], b[n]) for n in b)


def _compare_gradients(exercise, fn, what, kwargs, cases):
    names = exercise.differentiable
    if not names:
        return
    expected = gradients(exercise.oracle, kwargs, names)
    try:
        got = gradients(fn, kwargs, names)
    except (Exception, KeyboardInterrupt) as e:
        raise Wrong(f"{what}: the values are right, but with gradients on (inputs that require "
                    f"grad, as in training) your {exercise.name} raised {type(e).__name__}: "
                    f"{e}") from None
    if _gradients_agree(got, expected):
        return
    inputs = " and ".join(names)
    if got is None:
        said = (f"{what}: the values are right, but the output carries no gradient: it was "
                "computed under torch.no_grad(), or from detached numbers (.detach(), .item(), "
                f".tolist(), numpy). The training differentiates it through {inputs}, so with "
                "no gradient nothing learns")
    else:
        name = next(n for n in names if not _grad_close(got[n], expected[n]))
        if not got[name].any():
            said = (f"{what}: the values are right, but no gradient reaches {name}: a term that "
                    "depends on it was detached (.detach(), torch.no_grad(), .item()) and acts "
                    "as a constant")
        else:
            where = difference(got[name], expected[name], "the gradient")
            said = (f"{what}: the values are right, but the gradient with respect to {name} is "
                    f"not the file's (of one random projection of the output: {where}): part of "
                    "the expression was detached, or computed in a way that moves its gradient")
    for mistake, wrong in exercise.mistakes:  # a mistake in the gradient alone, when listed
        if _agrees_everywhere(exercise, fn, wrong) and all(
                _gradients_agree(gradients(fn, k, names), gradients(wrong, k, names))
                for _, k in cases):
            said += ". The likely mistake: " + (mistake(kwargs, got) if callable(mistake)
                                                else mistake)
            break
    raise Wrong(said)
