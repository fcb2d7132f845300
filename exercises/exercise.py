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
    explain: optional (kwargs, student's output, oracle's output) -> a sentence on what differs,
        where neither a listed mistake nor the kind of mistake (_form, _likely) is found.
    differentiable: the names of the float inputs that the training differentiates the output
        through (the policy's log-probs, the critic's values); on each case the gradient of a
        random projection of the output with respect to each is compared with the oracle's, so
        that a detached or no_grad answer with the right numbers fails. () where the file uses
        the output as a constant (advantages, weights, token ids).
    constants: the float inputs that the file detaches, so that the output is a number and not a
        function of the weights (distillation's advantage of the log-probs): the output must carry
        no gradient to them, and one that does fails.
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
    constants: tuple = ()

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
    """Are two outputs equal: tensors of the same shape and dtype (dtype_problem) within tol (NaN
    where the other has NaN), or tuples of such, or equal numbers? Nothing is cast to the other's
    dtype first: an integer tensor is not equal to floats it would round to."""
    if isinstance(a, (tuple, list)) or isinstance(b, (tuple, list)):
        return (isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)) and len(a) == len(b)
                and all(close(x, y, tol) for x, y in zip(a, b)))
    if isinstance(b, torch.Tensor):
        if not isinstance(a, torch.Tensor) or a.shape != b.shape or dtype_problem(a, b):
            return False
        if not b.is_floating_point():  # the same integer or bool dtype: equal entries
            return bool(torch.equal(a, b))
        return bool(torch.allclose(a.double(), b.double(), rtol=tol, atol=tol, equal_nan=True))
    try:
        return abs(float(a) - float(b)) <= tol * max(1.0, abs(float(b)))
    except (TypeError, ValueError):
        return a == b


def _dtype(t) -> str:
    return str(t.dtype).removeprefix("torch.")


def dtype_problem(got, expected) -> str | None:
    """What is wrong with the dtype of a tensor output, in words, or None: floats where floats are
    asked for, of at least their precision (float64 for float32 is right, bfloat16 is not); the
    very dtype asked for where it is an integer or a bool one (int64 indices, a bool mask)."""
    if expected.is_floating_point():
        if not got.is_floating_point():
            return f"the output is {_dtype(got)}, where floats ({_dtype(expected)}) are asked for"
        if torch.finfo(got.dtype).eps > torch.finfo(expected.dtype).eps:
            return (f"the output is {_dtype(got)}, of less precision than the {_dtype(expected)} "
                    "asked for")
        return None
    if got.dtype != expected.dtype:
        asked = "True/False" if expected.dtype == torch.bool else "whole numbers"
        return f"the output is {_dtype(got)}, where {_dtype(expected)} ({asked}) is asked for"
    return None


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
        raise Wrong(f"{what}: your {exercise.name} raised {type(e).__name__}: {e}"
                    f"{_raised(str(e))}") from None
    for key, value in kwargs.items():
        if isinstance(value, torch.Tensor) and not torch.equal(given[key], value):
            raise Wrong(f"{what}: your {exercise.name} changed its input {key} in place; work "
                        "on a copy (the trainer reuses its tensors)")
    if close(got, expected):
        return
    # The case in words first (its inputs, what is wrong with the output's form, else where it
    # differs, the expected and the got), then the mistake it looks like: one of the listed
    # mistakes when it gives the same outputs on every input, else the kind of mistake that the
    # form or the numbers of this case show (_form, _likely).
    form, kind = _form(got, expected, kwargs) or (None, None)
    case = f"{what}: {form or difference(got, expected)}"
    for mistake, wrong in exercise.mistakes:
        if _agrees_everywhere(exercise, fn, wrong):
            said = mistake(kwargs, got) if callable(mistake) else mistake
            raise Wrong(f"{case}. {LIKELY}{said}")
    said = kind if form else _likely(got, expected, kwargs)
    if said:
        raise Wrong(f"{case}. {LIKELY}{said}")
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


# ---- the kind of mistake ------------------------------------------------------------------------
# Where no listed mistake gives the student's numbers, the numbers themselves often show the kind:
# a dtype or a shape that is not the one asked for, a NaN where the expected is finite, the
# expected with its sign flipped, scaled, transposed or moved one position. Each kind is said in a
# sentence after LIKELY, so that a message names its mistake exactly when it holds one of NAMING.

LIKELY = "The likely mistake: "
NAMING = (LIKELY, "the output carries no gradient:", "no gradient reaches ")


def names_the_mistake(message: str) -> bool:
    """Does a checker's message say in words what the mistake is (not only where numbers differ)?"""
    return any(phrase in message for phrase in NAMING)


# torch's words for an error, and the kind of mistake that raises it
_ERRORS = (
    ("Boolean value of Tensor with more than one value is ambiguous",
     "a Python if, and, or, max or min on a tensor of several entries: use the tensor's own "
     "operations (torch.where, torch.clamp, torch.maximum)"),
    ("must match the size of tensor",
     "the wrong dimension: two tensors of shapes that do not broadcast were combined (a [b] "
     "tensor against a [b, R] one needs [:, None]), or one was reduced along the wrong dimension"),
    ("out of bounds for dimension",
     "the wrong dimension: an index ran past a dimension's size: x[t] indexes rows where x[:, t] "
     "indexes positions, or a loop ran over the wrong dimension's length"),
    ("tensors used as indices must be",
     "a wrong dtype: a float tensor was used as an index or a mask; a mask that selects is bool "
     "(mask.bool(), mask > 0), and indices are int64"),
)


def _raised(words: str) -> str:
    """The likely mistake behind an error the student's function raised, as a sentence to add
    to its message, or "" when its words are not among torch's usual ones."""
    for fragment, said in _ERRORS:
        if fragment in words:
            return f". {LIKELY}{said}"
    return ""


def _kind_of(value) -> str:
    if isinstance(value, bool):
        return "a Python bool"
    if isinstance(value, (int, float)):
        return f"a Python {type(value).__name__}"
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)}"
    if isinstance(value, torch.Tensor):
        return "one tensor"
    return f"a {type(value).__name__}"


def _form(got, expected, kwargs):
    """What is wrong with the form of an output (a tuple of the wrong length, not a tensor, the
    wrong shape or dtype) and the kind of mistake it shows (or None), in words; None when the
    output's form is the expected's."""
    if isinstance(expected, (tuple, list)):
        n = len(expected)
        if not isinstance(got, (tuple, list)) or len(got) != n:
            return (f"the output is {_kind_of(got)}, it should be a tuple of {n} tensors "
                    f"({show(expected)})", f"the wrong form: return the {n} outputs together, "
                    "as a tuple")
        for k, (a, b) in enumerate(zip(got, expected)):
            said = _form(a, b, kwargs)
            if said:
                return f"output {k} of the {n}: {said[0]}", said[1]
        return None
    if not isinstance(expected, torch.Tensor):
        return None
    if not isinstance(got, torch.Tensor):
        return (f"the output is {_kind_of(got)}, {show(got)}, it should be a tensor "
                f"({_dtype(expected)}, shape {list(expected.shape)})", "not a tensor: build the "
                "output with torch (torch.tensor(..., dtype=...), torch.stack, torch.where) and "
                "keep it one; .item(), .tolist() and Python numbers lose its dtype and its "
                "gradient")
    if got.shape != expected.shape:
        return (f"the output has shape {list(got.shape)}, it should have "
                f"{list(expected.shape)}", _wrong_dimension(list(got.shape),
                                                            list(expected.shape), kwargs))
    problem = dtype_problem(got, expected)
    if problem:
        same = torch.allclose(got.detach().double(), expected.double(), rtol=1e-5, atol=1e-5,
                              equal_nan=True)
        values = "the values are right" if same else difference(got, expected)
        return f"{problem} ({values})", _dtype_cause(got, expected)
    return None


def _dtype_cause(got, expected) -> str:
    if expected.is_floating_point() and got.is_floating_point():
        return (f"a wrong dtype: the computation stayed in the input's {_dtype(got)}; compute in "
                f"{_dtype(expected)} (.float()) as asked, so that small terms are not lost")
    if expected.is_floating_point():
        return ("a wrong dtype: integer arithmetic on the way (an int64 input such as lengths or "
                "a mask, //, torch.zeros_like or torch.tensor of whole numbers); make the output "
                "float (.float(), torch.zeros(shape))")
    if expected.dtype == torch.bool:
        return ("a wrong dtype: a mask of True and False is a bool tensor, as a comparison gives "
                "it; .float(), .long() or arithmetic made it numbers")
    if got.is_floating_point():
        return (f"a wrong dtype: indices, rows and ids are {_dtype(expected)} (torch.long); a "
                "float tensor (torch.Tensor(list), torch.tensor([]) of an empty list, a division) "
                f"cannot index; build it with dtype=torch.{_dtype(expected)}")
    return (f"a wrong dtype: {_dtype(got)} where {_dtype(expected)} is asked (searchsorted's "
            f"out_int32, .int(), a bool mask); convert with .to(torch.{_dtype(expected)})")


def _wrong_dimension(g, e, kwargs):
    """The shape g where e is expected, as a mistake of dimensions in words, or None."""
    def drop(shape, k):
        return shape[:k] + shape[k + 1:]

    if len(g) == len(e) >= 2 and g == e[::-1]:
        return ("the wrong dimension: the output is the expected's transpose (its dimensions "
                "swapped): a view, a stack or a loop along the other dimension")
    if len(g) == len(e) + 1:
        extra = [k for k in range(len(g)) if g[k] == 1 and drop(g, k) == e]
        if extra:
            return (f"the wrong dimension: a dimension of size 1 too many (dimension {extra[-1]}): "
                    "keepdim=True, [:, None], unsqueeze or a gather's index left in, or a "
                    "view(-1, G) not flattened back; drop it")
    if len(g) + 1 == len(e):
        lost = [k for k in range(len(e)) if drop(e, k) == g]
        if lost:
            return (f"the wrong dimension: dimension {lost[-1]} of the expected (of size "
                    f"{e[lost[-1]]}) is missing: a sum or a mean over it, a squeeze, or a value "
                    "per row that was not expanded across it")
    if len(g) < len(e):
        return ("the wrong dimension: the output has fewer dimensions than asked: it was reduced "
                "(a sum or a mean over every entry) where one value per entry or row is asked")
    for name, x in kwargs.items():  # an input reduced over another of its dimensions
        if isinstance(x, torch.Tensor) and x.dim() == len(e) + 1:
            s = list(x.shape)
            right = [k for k in range(len(s)) if drop(s, k) == e]
            wrong = [k for k in range(len(s)) if drop(s, k) == g]
            if right and wrong:
                return (f"the wrong dimension: the output has the shape of {name} {s} reduced "
                        f"over dimension {wrong[0]}, where it is reduced over dimension "
                        f"{right[0]}")
    if len(g) > len(e):
        return (f"the wrong dimension: the output keeps {len(g) - len(e)} dimension(s) more than "
                "asked: a sum or a mean over them is missing, or a broadcast made them")
    if len(g) == len(e):
        differ = [k for k in range(len(e)) if g[k] != e[k]]
        one_off = len(differ) == 1 and abs(g[differ[0]] - e[differ[0]]) == 1
        if all(g[k] == 1 for k in differ) and not (one_off and e[differ[0]] == 2):
            return (f"the wrong dimension: size 1 where the expected has {e[differ[0]]} "
                    f"(dimension {differ[0]}): a value per row was not expanded across it")
        if one_off:
            k = differ[0]
            return (f"an off-by-one: dimension {k} has {g[k]} where {e[k]} entries are asked: a "
                    "bound, a slice or a count one off (< for <=, [:n - 1], range(n - 1))"
                    + (", or a value per row not expanded across it" if g[k] == 1 else ""))
        if sorted(g) == sorted(e):
            return ("the wrong dimension: the output's dimensions are in another order: a "
                    "transpose or permute is missing or extra")
    return None


def _likely(got, expected, kwargs):
    """The kind of mistake that the numbers of one case show, in a sentence, or None: a NaN where
    the expected is finite, the expected with its sign flipped, transposed, moved one position,
    scaled or rounded, or the expected everywhere but where it (or a mask) is 0."""
    if isinstance(expected, (tuple, list)):
        if len(expected) == 2 and close(got[0], expected[1]) and close(got[1], expected[0]):
            return "the wrong order: the two outputs are swapped"
        for a, b in zip(got, expected):
            if not close(a, b):
                return _likely(a, b, kwargs)
        return None
    if not isinstance(expected, torch.Tensor) or expected.numel() == 0:
        return None
    a, b = got.detach().double(), expected.double()
    bad = ~torch.isfinite(a) & torch.isfinite(b)
    if bad.any():
        if a[bad].isnan().any():
            return ("a NaN on an edge: your output is NaN where the expected is finite: a 0 / 0 "
                    "(a count of 0: an all-zero mask, a row with no counted token, n - 1 with "
                    "n = 1, a buffer of 0), or 0 x log 0 (the log of a probability that "
                    "underflowed): guard the count, and stay in log space (log_softmax, "
                    "logsigmoid, logaddexp)")
        return ("an inf on an edge: your output is inf where the expected is finite: the log of "
                "a probability that underflowed to 0, an exp that overflowed, or a division by "
                "0: stay in log space (log_softmax, logsigmoid, the exp of a difference of "
                "log-probs, not a quotient of exps)")
    if not torch.isfinite(a).all() or not torch.isfinite(b).all():
        return None

    def same(x, y):
        return x.shape == y.shape and bool(torch.allclose(x, y, rtol=1e-5, atol=1e-5))

    if b.any() and same(a, -b):
        return "the sign is flipped: your output is the expected's negative everywhere"
    if (b < 0).any() and same(a, b.abs()):
        return ("the sign is lost: your output is the expected's absolute value: an abs, a "
                "square or its root, or a clamp at 0 where the value may be negative")
    if b.any() and not a.any():
        return ("all zeros: your output is 0 everywhere, where the expected is not: a term "
                "multiplied by a zero (a mask or a weight of zeros, a value minus itself), or an "
                "output that was never filled in")
    if expected.dtype == torch.bool and same(a, 1 - b):
        return ("the condition is inverted: your output is True exactly where the expected is "
                "False: a comparison the wrong way round (< for >=) or a not (~) missing or extra")
    if b.numel() >= 2:
        offset = (a - b).flatten()[0]
        if abs(float(offset)) > 1e-6 and same(a - b, offset.expand_as(b)):
            return (f"a constant offset: your output is the expected {float(offset):+.4g} "
                    "everywhere: a term added or left out (a 1, a mean not subtracted, the log of "
                    "a constant)")
    if b.dim() >= 2 and b.shape[-1] == b.shape[-2] and same(a, b.transpose(-1, -2)) \
            and not same(b, b.transpose(-1, -2)):
        return ("the wrong dimension: your output is the expected transposed: the two last "
                "dimensions are swapped")
    for d in range(b.dim()):
        n = b.shape[d]
        if n < 2 or not b.narrow(d, 0, n - 1).any():
            continue
        for shift, way in ((1, "later"), (-1, "earlier")):
            ours = a.narrow(d, max(shift, 0), n - 1)
            theirs = b.narrow(d, max(-shift, 0), n - 1)
            if theirs.any() and same(ours, theirs):
                return (f"an off-by-one: your output is the expected moved one position {way} "
                        f"along dimension {d}: a slice, an index or a mask one position off")
    if b.is_floating_point() and (b != 0).sum() >= 2:
        c = float((a * b).sum() / (b * b).sum())
        if abs(c - 1) > 1e-3 and abs(c) > 1e-6 and same(a, c * b):
            return (f"a constant factor: your output is {c:.4g} times the expected everywhere: a "
                    "factor missing or extra (a 1/2, a normaliser, a count, a std or an eps taken "
                    "otherwise, a mean where a sum is asked or a sum where a mean is)")
    if expected.is_floating_point() and (b != b.round()).any() and a.any() \
            and (a == a.round()).all() \
            and any(same(a, f(b)) for f in (torch.trunc, torch.floor, torch.round)):
        return ("whole numbers: your output is the expected rounded: integer division (//) or "
                "an integer tensor on the way (an int64 input, .long(), round())")
    differ = ~torch.isclose(a, b, rtol=1e-5, atol=1e-5)
    for name, m in kwargs.items():  # a mask among the inputs, of the output's shape
        if "mask" in name and isinstance(m, torch.Tensor) and m.shape == b.shape \
                and (m == 0).any() and (m != 0).any() and bool((m[differ] == 0).all()):
            return (f"the padding: your output differs only where {name} is 0: what the mask "
                    "leaves out (padding) gets the value the exercise gives it (0 unless it says "
                    "otherwise): multiply by the mask, or leave those entries out")
    # The patterns below are read off the entries that differ: two at least, so that one entry
    # that happens to fit is not taken for a pattern.
    if differ.sum() < 2:
        return None
    if not expected.is_floating_point():
        step = (a - b)[differ]
        if expected.dtype != torch.bool and ((step == 1).all() or (step == -1).all()):
            return (f"an off-by-one: every entry that differs is the expected {int(step[0]):+d}: "
                    "a bound taken or not (<= for <, searchsorted's right=), or a +1 or -1 "
                    "missing or extra")
        return None
    if (b == 0).any() and b.any() and bool((b[differ] == 0).all()):
        return ("what should be 0 is not: your output differs only where the expected is 0 (the "
                "padding, a cut or masked entry, an edge that gives 0)")
    if a.any() and bool((a[differ] == 0).all()):
        return ("zeroed: your output is 0 where the expected is not, and right elsewhere: a mask, "
                "a cut or a clamp that removes too much")
    return None


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
    names = exercise.differentiable + exercise.constants
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
    inputs = " and ".join(exercise.differentiable)
    likely = None
    if got is None:
        said = (f"{what}: the values are right, but the output carries no gradient: it was "
                "computed under torch.no_grad(), or from detached numbers (.detach(), .item(), "
                f".tolist(), numpy). The training differentiates it through {inputs}, so with "
                "no gradient nothing learns")
    else:
        if expected is None:  # the file's output carries no gradient: 0 wherever it could go
            expected = {n: torch.zeros_like(g) for n, g in got.items()}
        name = next(n for n in names if not _grad_close(got[n], expected[n]))
        differs = ~torch.isclose(got[name], expected[name], rtol=1e-4, atol=1e-6)
        if name in exercise.constants:
            said = (f"{what}: the values are right, but the output carries a gradient to {name}, "
                    "which the file holds constant (detached): the training would differentiate "
                    "the loss through it too")
            likely = ("a gradient through what should be a constant: a .detach() is missing "
                      f"where {name} enters the output")
        elif not got[name].any():
            said = (f"{what}: the values are right, but no gradient reaches {name}: a term that "
                    "depends on it was detached (.detach(), torch.no_grad(), .item()) and acts "
                    "as a constant")
        else:
            where = difference(got[name], expected[name], "the gradient")
            said = (f"{what}: the values are right, but the gradient with respect to {name} is "
                    f"not the file's (of one random projection of the output: {where}): part of "
                    "the expression was detached, or computed in a way that moves its gradient")
            if bool((expected[name][differs] == 0).all()):  # a gradient where the file has none
                likely = ("a gradient through what should be a constant: where the file's "
                          "gradient is 0 (a clipped or masked entry, a detached term) yours is "
                          "not: a straight-through trick or a missing .detach() lets it through")
            else:
                likely = (f"a term was detached: part of the expression that depends on {name} "
                          "acts as a constant (.detach(), .data, .item(), a Python number, "
                          "torch.no_grad()), so its share of the gradient is lost")
    for mistake, wrong in exercise.mistakes:  # a mistake in the gradient alone, when listed
        if _agrees_everywhere(exercise, fn, wrong) and all(
                _gradients_agree(gradients(fn, k, names), gradients(wrong, k, names))
                for _, k in cases):
            likely = mistake(kwargs, got) if callable(mistake) else mistake
            break
    raise Wrong(f"{said}. {LIKELY}{likely}" if likely else said)
