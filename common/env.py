"""Tasks, verifiers and a gym-like environment for RL on verifiable math.

    env = make_env("gsm8k", split="train")            # or arithmetic, countdown, math
    obs = env.reset()                                 # chat messages (or a plain prompt string)
    obs, reward, done, info = env.step(response)   # info: correct, format_ok, pred, answer, steps
    verify("gsm8k", response, "18")                   # the same grading as a pure function

A task is one class registered with @register: how to load problems, how to turn a raw row into an
example, and how to grade. MATH answers are graded by common/grader.py (LaTeX normalisation +
sympy). Nothing here ever calls eval on model text: arithmetic goes through `safe_arith`, an AST
whitelist. Grading policy (data/README.md): the answer is the whole span after the last marker
(\boxed{}, ####, "The answer is"), it must be one value (no hedge, no second candidate), and without
a marker there is no reward.
"""

import ast
import json
import math
import operator
import random
import re
from fractions import Fraction
from pathlib import Path

from common.errors import PathError, UsageError
from common.grader import ascii_lookalikes, has_hedge, last_boxed, math_equal, unicode_math
from common.rewards import call_reward_fn, load_reward_fn, weighted_sum

DATA_DIR = Path(__file__).resolve().parents[1] / "data"

# ------------------------------------------------------------------------------------------------
# Safe arithmetic and number extraction


_ARITH_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
              ast.Div: operator.truediv}
_MAX_ARITH_LEN = 300  # calculator expressions are short; the cap also bounds the AST depth
_MAX_VALUE = 10**100
_MAX_ANSWER_DIGITS = 1000  # a final answer may be larger (1e400), but not much
_MAX_ANSWER = 10 ** (_MAX_ANSWER_DIGITS + 1)


def safe_arith(expr: str) -> Fraction | None:
    """Exact value of an arithmetic expression with + - * / ( ) and decimal numbers, else None.

    The expression is parsed with `ast` and only whitelisted nodes are walked: no names, calls,
    attributes or `**`, so `__import__('os')` is simply not arithmetic. Division by zero, over-long
    input and values beyond 1e100 also give None.
    """
    return _safe_eval(expr, powers=False)


def _safe_eval(expr: str, powers: bool) -> Fraction | None:
    """safe_arith, and with powers=True also `**` with an integer exponent, for final answers
    (values up to 1000 digits)."""
    expr = expr.replace("×", "*").replace("÷", "/").replace("−", "-").strip()
    if len(expr) > _MAX_ARITH_LEN:
        return None
    try:
        return _arith(ast.parse(expr, mode="eval").body, expr, powers)
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError, MemoryError, OverflowError):
        return None


def _arith(node: ast.AST, src: str, powers: bool = False) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        text = ast.get_source_segment(src, node)
        # Python also accepts 1e9, 0x1F, 1_000, 2j
        if not re.fullmatch(r"[0-9]+(?:\.[0-9]*)?|\.[0-9]+", text):
            raise ValueError(text)
        return Fraction(text)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        value = _arith(node.operand, src, powers)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and powers and isinstance(node.op, ast.Pow):
        base, exp = _arith(node.left, src, powers), _arith(node.right, src, powers)
        digits = max(abs(base.numerator).bit_length(), base.denominator.bit_length(), 4) * 0.30103
        # refused before it is built
        if exp.denominator != 1 or digits * abs(exp) > _MAX_ANSWER_DIGITS + 4:
            raise ValueError("power too large or not an integer power")
        return base ** int(exp)
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITH_OPS:
        value = _ARITH_OPS[type(node.op)](_arith(node.left, src, powers),
                                          _arith(node.right, src, powers))
        limit = _MAX_ANSWER if powers else _MAX_VALUE
        if abs(value.numerator) > limit or value.denominator > limit:
            raise ValueError("too large")
        return value
    raise ValueError(f"not arithmetic: {type(node).__name__}")


# 1,000 (thousands separators only), 18, 18.5, -3, .5; "18." matches as 18. ASCII digits only: text
# is passed through ascii_lookalikes first, so other scripts' digits are already 0-9.
_NUMBER = re.compile(r"-?(?:[0-9]{1,3}(?:,[0-9]{3})+(?![0-9])|[0-9]+)(?:\.[0-9]+)?|-?\.[0-9]+")
_ANSWER_IS = re.compile(r"the (?:final )?answer is", re.IGNORECASE)
_SENTENCE_END = re.compile(r"\n|[.!?](?=\s|\Z)")  # the '.' of 18.5 is no sentence end
# Words that add a number (or multiply one): "18 million", "18 and a half", "18k", "3 times 6"
_NUMBER_WORDS = frozenset("""
    zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen
    sixteen seventeen eighteen nineteen twenty thirty forty fifty sixty seventy eighty ninety
    hundred hundreds thousand thousands million millions billion billions trillion dozen dozens half
    halves quarter quarters third thirds twice double triple times k bn mn squared cubed
""".split())
_UNIT_TAIL = re.compile(r"[A-Za-z%'\-/,()*\s]*")  # what may follow the value: words and %, no digit


def _sentence(text: str) -> str:
    """Text up to the end of its first sentence: a newline, or . ! ? followed by whitespace or the
    end."""
    m = _SENTENCE_END.search(text)
    return text[: m.start()] if m else text


def to_number(s: str) -> Fraction | None:
    """'1,000' -> 1000, '18.0' -> 18, '-.5' -> -1/2, '18/7' -> 18/7; None if s is not a plain
    number."""
    s = ascii_lookalikes(s).strip()
    if len(s) > _MAX_ANSWER_DIGITS + 100:
        return None
    if re.fullmatch(r"-?[0-9]{1,3}(?:,[0-9]{3})+(?:\.[0-9]*)?", s):  # 1,000 but not 1,8
        s = s.replace(",", "")
    if re.fullmatch(r"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)|-?[0-9]+/[0-9]*[1-9][0-9]*", s):
        return Fraction(s)
    return None


def format_number(value: Fraction) -> str:
    """The canonical text of an exact value: 18, 3.6, -0.125, or 18/7 where no decimal is exact."""
    if value.denominator == 1:
        return str(value.numerator)
    d, places = value.denominator, 0
    while d % 10 == 0 or d % 2 == 0 or d % 5 == 0:
        d, places = (d // 10 if d % 10 == 0 else d // 2 if d % 2 == 0 else d // 5), places + 1
    if d != 1:
        return f"{value.numerator}/{value.denominator}"
    digits = str(abs(value.numerator) * 10**places // value.denominator).rjust(places + 1, "0")
    return ("-" if value < 0 else "") + digits[:-places] + "." + digits[-places:]


def _to_python_arith(s: str) -> str:
    """An answer span in the syntax of _safe_eval: LaTeX fractions, \\cdot, x, ^, 7e2, 1,000
    rewritten."""
    s = re.sub(r"\\(?:text|mbox|mathrm|textrm|textbf|mathbf)\s*\{([^{}]*)\}", r" \1 ", s)
    # ** is bold
    s = s.replace("\\$", "").replace("$", "").replace("\\%",
                                                      "%").replace("{,}", ",").replace("**", " ")
    s = re.sub(r"\\(?:left|right)(?![a-zA-Z])|\\[!,;:]", "", s)
    # a mixed number: 2\frac{1}{2} and 2 1/2 are 2 + 1/2
    s = re.sub(r"(?<![0-9.])([0-9]+)\s*\\[dtc]?frac\s*\{([0-9]+)\}\s*\{([0-9]+)\}",
               r"(\1+\2/\3)", s)
    s = re.sub(r"(?<![0-9./])([0-9]+)\s+([0-9]+)/([0-9]+)(?![0-9./])",
               lambda m: f"({m[1]}+{m[2]}/{m[3]})" if int(m[2]) < int(m[3]) else m[0], s)
    for _ in range(10):  # \frac{a}{b}, innermost first
        s, n = re.subn(r"\\[dtc]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}", r"((\1)/(\2))", s)
        if not n:
            break
    s = re.sub(r"\\[dt]?frac\s*([0-9])\s*([0-9])", r"((\1)/(\2))", s)
    s = re.sub(r"\\(?:cdot|times)(?![a-zA-Z])|[×·⋅∙]", "*", s)
    s = re.sub(r"\\div(?![a-zA-Z])|÷", "/", s)
    s = re.sub(r"(?<=[0-9)])\s*[xX]\s*(?=[0-9(])", "*", s)  # 3 x 6
    # scientific notation: 7e2 = 700, 1e400 = 10^400 (never the 1 in front)
    s = re.sub(r"(?<![0-9A-Za-z_.])([0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
               r"[eE]([+-]?[0-9]{1,4})(?![0-9A-Za-z])",
               r"(\1*10^(\2))", s)
    s = s.replace("{", "(").replace("}", ")")
    # 1,000 but not 1,8
    thousands = r"(?<![0-9.])(?<![0-9],)[0-9]{1,3}(?:,[0-9]{3})+(?![0-9]|,[0-9])"
    s = re.sub(thousands, lambda m: m.group().replace(",", ""), s)
    s = re.sub(r"(?<![0-9.])0+(?=[0-9])", "", s)  # 007 -> 7 (Python refuses leading zeros)
    return s.replace("^", "**")


def _side_value(side: str) -> Fraction | None:
    """One side of an answer: an arithmetic expression, then unit words at most ("18 dollars",
    "25%")."""
    m = re.match(r"[0-9.+\-*/()\s]*", side)
    expr, tail = side[: m.end()].rstrip(), side[m.end() :]
    while expr and expr[-1] in "(*" and not expr.endswith("**"):  # "18 (dollars)", "*18* apples"
        expr, tail = expr[:-1].rstrip(), expr[-1] + tail
    if not expr or not _UNIT_TAIL.fullmatch(tail):
        return None
    return _safe_eval(expr, powers=True)


def answer_value(span: str) -> Fraction | None:
    """The exact value of a final-answer span, or None if it is not exactly one value.

    One value: a number or an arithmetic expression of numbers (+ - * / x × ÷ ^, parentheses,
    \\frac, \\cdot, \\times, 1,000, $, 7e2), then unit words at most. `x = 18` and `total = 18` name
    it; a chain `2*9 = 18` must agree on every side. Not one value: a hedge word ("or", "not",
    "about", ...), a number word ("million", "half"), ≈ or ~, another number after the units, a list
    ("3, 4").
    """
    s = span.strip()
    for _ in range(5):  # leading ': = $ € £ **' and trailing punctuation, in any order
        s = re.sub(r"^(?:[:=$€£¥₹*\s]|\\\(|\\\[|\\\$)+|(?:[.,;:!?$€°*\s]|\\\)|\\\])+$", "", s)
        # "the answer is therefore 18"
        s = re.sub(r"^(?:therefore|thus|so|then|simply|just|clearly|indeed)\b[\s,:]*", "", s,
                   flags=re.IGNORECASE)
    # 30°, 18 m^2 (18 m² reads so): a degree sign and a squared unit go with the units
    s = re.sub(r"\b(m|cm|mm|km|ft|in|yd|mi|units?|meters?|feet|inches)\^\{?[23]\}?", r"\1", s)
    s = s.replace("°", " ")
    approximate = re.search(r"[~≈±]|\\(?:approx|sim|pm)(?![a-zA-Z])", s)
    if not s or len(s) > _MAX_ARITH_LEN or has_hedge(s) or approximate:
        return None
    words = re.findall(r"[a-z]+", re.sub(r"\\[a-zA-Z]+", " ", s).lower())
    if any(w in _NUMBER_WORDS for w in words):
        return None
    sides = _to_python_arith(s).split("=")
    if len(sides) > 1 and re.fullmatch(r"\s*[A-Za-z][A-Za-z_'\s]*", sides[0]):  # x = 18, total = 18
        sides = sides[1:]
    values = [_side_value(side) for side in sides]
    if None in values or len(set(values)) != 1:
        return None
    return values[0]


# Words that make "the answer is" a hypothesis rather than a conclusion when they come earlier in
# its clause: "Let me check whether the answer is 18", "if the answer is 18, then ...".
_TENTATIVE = frozenset("""
    if whether suppose supposing assume assuming unless maybe perhaps check checking verify
    verifying test testing
""".split())


def tentative(response: str, marker_start: int) -> bool:
    """Is the "answer is" marker at marker_start a hypothesis, a check or a question? Its clause
    (from the last , ; : or sentence end before it) holds a word of _TENTATIVE, or its sentence
    ends in '?'. Grading policy (data/README.md): such a marker is no final answer."""
    before = response[:marker_start]
    cut = max([before.rfind(c) for c in ",;:\n"] + [m.end() for m in re.finditer(
        r"[.!?](?=\s)", before)] + [0])
    words = re.findall(r"[a-z]+", before[cut:].lower())
    rest = response[marker_start:]
    end = _SENTENCE_END.search(rest)
    return bool(_TENTATIVE.intersection(words)) or (end is not None and rest[end.start()] == "?")


def _final_span(response: str) -> tuple[str | None, bool]:
    """(the final answer's text, whether an answer marker was found), markers in this order: the
    content of the last \\boxed{}, the rest of the line after the last ####, the rest of the
    sentence after the last "The (final) answer is". Text after a box is not read: a box is where
    the answer goes."""
    if "\\boxed" in response or "\\fbox" in response:
        return last_boxed(response), True
    if "####" in response:
        return response.rsplit("####", 1)[1].split("\n", 1)[0], True
    if matches := list(_ANSWER_IS.finditer(response)):
        if tentative(response, matches[-1].start()):  # the last one decides: no answer
            return None, True
        return _sentence(response[matches[-1].end() :]), True
    return None, False


def _nothing_more(after: str) -> bool:
    """The rest of the sentence after an answer holds no other number and no hedge (units are
    fine)."""
    rest = _sentence(after)
    return re.search(r"[0-9]", rest) is None and not has_hedge(rest)


def extract_number(response: str) -> tuple[str | None, bool]:
    """GSM8K-style answer: (its exact value as text, format_ok).

    Grading policy (data/README.md): the final answer is the WHOLE text after the last answer
    marker: the last \\boxed{}; else the rest of the line after the last `####`; else the rest of
    the sentence after the last "The (final) answer is". It must be one value (see `answer_value`):
    "The answer is 3 or 4." or "#### 18, not 17" is no answer, and `#### 18/5` is 3.6. Unicode
    look-alikes (−5, １８) count as the ASCII they look like.

    Without a marker there is no answer to grade: format_ok is False and the reward is 0, in
    training and in evaluation alike (a response that only repeats the question must not score). The
    last number in the text is still returned as pred, for diagnostics.
    """
    response = unicode_math(ascii_lookalikes(response))
    span, marked = _final_span(response)
    if not marked:
        numbers = _NUMBER.findall(response)[-1:]
        return (numbers[0].replace(",", "") if numbers else None), False
    value = None if span is None else answer_value(span)
    return (None, False) if value is None else (format_number(value), True)


def numbers_equal(pred: str | None, gold: str) -> bool:
    """Exact numeric equality: 18 == 18.0 == 18. == 36/2; 180, 1.8, 18.5 and 1,8 are not 18."""
    a, b = (to_number(pred) if pred is not None else None), to_number(gold)
    return a is not None and a == b


# ------------------------------------------------------------------------------------------------
# Tasks and the registry

TASKS: dict[str, type["Task"]] = {}


def register(cls):
    """Class decorator: adding a task is one registered Task subclass."""
    TASKS[cls.name] = cls
    return cls


def _field(row: dict, names: tuple, task: str, where: str):
    for name in names:
        if row.get(name) is not None:
            return row[name]
    raise UsageError(
        f"{where} has no {' / '.join(repr(n) for n in names)} field (fields found: {sorted(row)}). "
        f"The {task} task accepts rows with {TASKS[task].fields}; see data/README.md."
    )


class Task:
    """Base class. A task loads problems as examples {"question", "answer", ...} and grades
    responses."""

    name = ""
    fields = ""  # the accepted row fields, for error messages
    hub = {}  # split -> (dataset name, config, split name) on the Hugging Face hub
    system_prompt = ""
    # ends a stepwise episode
    final_answer = re.compile(r"\\boxed|\\fbox|####|the (?:final )?answer is", re.IGNORECASE)
    options = {}  # task-specific make_env options and their defaults

    @classmethod
    def load(cls, split: str, path, seed: int, keys=None, **options) -> list[dict]:
        """Examples from `path` if given (a local file or a hub dataset id), else from the task's
        hub data. keys: {"question": field, "answer": field} of rows whose fields have other
        names."""
        if path is not None and is_hub_id(path):
            name, config, hub_split = str(path), None, split
        elif path is not None:
            rows = read_rows(path, cls.name)
            # "row": the row as the file has it, whose fields a --reward_fn receives
            return [{**cls.from_row(rename_fields(row, keys), f"{path}: row {i + 1}"), "row": row}
                    for i, row in enumerate(rows)]
        else:
            name, config, hub_split = cls.hub[split]
        rows = load_hub_rows(name, config, hub_split)
        examples, errors = [], []
        for i, row in enumerate(rows):
            try:
                examples.append({**cls.from_row(rename_fields(row, keys), f"{name} row {i + 1}"),
                                 "row": row})
            # hub data is not ours to fix: skip an odd row, e.g. a solution without \boxed{}
            except ValueError as e:
                errors.append(e)
        if errors and not examples:
            raise errors[0]
        if errors:
            print(f"{name}: skipped {len(errors)} of {len(rows)} rows, e.g. {errors[0]}")
        return examples

    @classmethod
    def from_row(cls, row: dict, where: str) -> dict:
        """Turn a raw row (file, hub or few-shot) into an example; raise ValueError naming a missing
        field."""
        raise NotImplementedError

    @classmethod
    def extract(cls, response: str) -> tuple[str | None, bool]:
        """(extracted answer or None, whether the answer was in the asked-for format)."""
        return extract_number(response)

    @classmethod
    def grade(cls, response: str, answer: str) -> tuple[float, str | None, bool]:
        """(reward, extracted answer, format_ok). Without the asked-for format there is no
        reward."""
        pred, format_ok = cls.extract(response)
        return float(format_ok and numbers_equal(pred, answer)), pred, format_ok


class _Generated(Task):
    """A task whose problems are generated from a seed; "test" is a fixed file shipped in data/."""

    options = {"num_examples": 10_000}

    @classmethod
    def generate(cls, rng: random.Random, **options) -> dict:
        raise NotImplementedError

    @classmethod
    def load(cls, split, path, seed, keys=None, num_examples=10_000, **options):
        if path is not None or split == "test":
            return super().load(split,
                                path if path is not None else DATA_DIR / f"{cls.name}_test.jsonl",
                                seed,
                                keys)
        test = {ex["question"] for ex in super().load(split, DATA_DIR / f"{cls.name}_test.jsonl",
                                                      seed)}
        rng, examples = random.Random(seed), []
        while len(examples) < num_examples:
            ex = cls.generate(rng, **options)
            if ex["question"] not in test:  # train never contains a held-out problem
                examples.append(ex)
        return examples


_NAMES = ["Sam", "Mia", "Leo", "Ava", "Noah", "Emma", "Omar", "Lily"]
_ITEMS = ["apples", "marbles", "stickers", "cookies", "pencils", "cards"]


@register
class Arithmetic(_Generated):
    """Generated integer arithmetic, from 2-digit addition (level 1) to two-step word problems
    (level 5)."""

    name = "arithmetic"
    fields = "'question' and 'answer' (an integer)"
    system_prompt = ('Solve the problem. Think briefly, then end your reply with '
                     '"The answer is N." where N is a number.')
    options = {"num_examples": 10_000, "difficulty": "mixed"}

    @staticmethod
    def levels(difficulty) -> list[int]:
        """1..5, "mixed" (all five), a range "1-2", or a list "1,3" -> the list of levels to draw
        from."""
        text = str(difficulty).strip()
        try:
            if text == "mixed":
                levels = [1, 2, 3, 4, 5]
            elif "-" in text:
                lo, hi = (int(x) for x in text.split("-"))
                levels = list(range(lo, hi + 1))
            else:
                levels = [int(x) for x in text.split(",")]
        except ValueError:
            levels = []
        if not levels or any(lv not in range(1, 6) for lv in levels):
            raise UsageError("difficulty must be 1, 2, 3, 4, 5, a range such as '1-2', a list "
                             "such as '1,3', "
                             f"or 'mixed', got {difficulty!r}")
        return levels

    @classmethod
    def load(cls, split, path, seed, keys=None, num_examples=10_000, difficulty="mixed"):
        levels = cls.levels(difficulty)
        examples = super().load(split, path, seed, keys, num_examples, difficulty=difficulty)
        if split == "test" and path is None:
            # the held-out file mixes levels
            examples = [ex for ex in examples if ex["level"] in levels]
        return examples

    @classmethod
    def generate(cls, rng, difficulty="mixed"):
        levels = cls.levels(difficulty)
        level = rng.choice(levels) if len(levels) > 1 else levels[0]
        two, one = (lambda: rng.randint(10, 99)), (lambda: rng.randint(2, 9))
        while True:  # redraw the rare problem with a negative answer
            a, b, c = two(), two(), one()
            if level == 5:
                question, answer = cls.word_problem(rng, a, b, c)
            else:
                expr = rng.choice({
                    1: [f"{a} + {b}"],
                    2: [f"{a} + {b}", f"{a} - {b}"],
                    3: [f"{a} * {c}", f"{a} + {b} - {two()}"],
                    4: [f"{a} + {b} * {c}", f"({a} + {b}) * {c}", f"{a} * {c} - {b}",
                        f"({a} - {b}) * {c}"],
                }[level])
                question, answer = f"What is {expr}?", int(safe_arith(expr))
            if answer >= 0:
                return {"question": question, "answer": str(answer), "level": level}


    @staticmethod
    def word_problem(rng, a, b, c):
        name, items = rng.choice(_NAMES), rng.choice(_ITEMS)
        k, bill = rng.randint(2, 12), rng.choice([50, 100, 200])
        return rng.choice([
            (f"{name} has {a} {items} and buys {c} bags with {b} {items} in each bag. How many "
             f"{items} does {name} have now?", a + c * b),
            (f"A shop had {a + b} {items}. It sold {b} in the morning and {c} in the afternoon. "
             f"How many {items} are left?", a - c),
            (f"{name} reads {b} pages a day for {c} days and then {a} more pages. How many pages "
             f"does {name} read in total?", b * c + a),
            (f"{c * k} {items} are shared equally among {c} friends. How many {items} does each "
             "friend get?", k),
            (f"{name} buys {c} notebooks that cost {k} dollars each and pays with a {bill} dollar "
             f"bill. How much change does {name} get, in dollars?", bill - c * k),
        ])

    @classmethod
    def from_row(cls, row, where):
        answer = str(_field(row, ("answer",), cls.name, where)).strip()
        if to_number(answer) is None:
            raise UsageError(f"{where}: the answer {answer!r} is not a number")
        return {**row, "question": _field(row, ("question",), cls.name, where), "answer": answer}


@register
class Countdown(_Generated):
    """TinyZero's CountDown: combine all given numbers once each with + - * / to reach the
    target."""

    name = "countdown"
    fields = "'numbers' (or 'nums') and 'target'"
    system_prompt = (
        "You are a helpful assistant. You first think about the reasoning process in the mind "
        "and then provide the user with the answer."
    )
    # [^<]: linear time even on "<answer>" * 10**5
    final_answer = re.compile(r"<answer>[^<]*</answer>")

    @classmethod
    def generate(cls, rng):
        size = rng.choice((3, 4))
        while True:  # combine random pairs until one value is left; keep targets in 1..100
            numbers = [rng.randint(1, 99) for _ in range(size)]
            values = [(n, str(n)) for n in numbers]
            while len(values) > 1:
                x, ex = values.pop(rng.randrange(len(values)))
                y, ey = values.pop(rng.randrange(len(values)))
                # Intermediate values stay integers (division only when exact): fast, and how people
                # solve it
                op = rng.choice("+-*/" if y != 0 and x % y == 0 else "+-*")
                value = {"+": x + y, "-": x - y, "*": x * y, "/": x // y if op == "/" else 0}[op]
                values.append((value, f"({ex} {op} {ey})"))
            target, solution = values[0]
            if 1 <= target <= 100:
                return cls.from_row({"numbers": numbers, "target": target,
                                     "solution": solution[1:-1]}, "generated")

    @classmethod
    def from_row(cls, row, where):
        gold = row.get("answer")
        # TinyZero's ground truth
        if not ({"numbers", "nums"} & set(row)) and isinstance(gold, (str, dict)):
            try:
                row = {**row, **(json.loads(gold) if isinstance(gold, str) else gold)}
            except ValueError:
                pass
        numbers = [int(n) for n in _field(row, ("numbers", "nums"), cls.name, where)]
        target = int(_field(row, ("target",), cls.name, where))
        question = (
            f"Using the numbers {numbers}, create an equation that equals {target}. You can use "
            "basic "
            "arithmetic operations (+, -, *, /) and each number can only be used once. Show your "
            "work in "
            f"<think> </think> tags. And return the final answer in <answer> </answer> tags, "
            f"for example <answer> (1 + 2) / 3 </answer>."
        )
        answer = json.dumps({"numbers": numbers, "target": target})
        return {"question": question, "answer": answer, "numbers": numbers, "target": target,
                "solution": row.get("solution", "")}

    @classmethod
    def extract(cls, response):
        # Deliberate deviation from TinyZero/oat, which read only the LAST LINE: instruct models
        # often add a closing sentence after the tag. The LAST <answer> in the whole response counts
        # instead. (rfind, not a regex: a lazy regex is quadratic on a response of many unclosed
        # tags)
        end = response.rfind("</answer>")
        start = response.rfind("<answer>", 0, max(end, 0))
        if end < 0 or start < 0:
            return None, False
        return response[start + len("<answer>") : end].strip(), True

    @classmethod
    def grade(cls, response, answer):
        """TinyZero rules: no tag 0.0; wrong numbers, bad expression or wrong value 0.1; correct
        1.0."""
        expr, format_ok = cls.extract(response)
        if expr is None:
            return 0.0, None, False
        gold = json.loads(answer)
        if len(expr) > _MAX_ARITH_LEN:
            return 0.1, expr, True
        used = sorted(int(n) for n in re.findall(r"[0-9]+", expr))
        value = safe_arith(expr)
        if used != sorted(gold["numbers"]) or value is None:
            return 0.1, expr, True
        # exactly: with a tolerance, 100001/1000 would pass for 100 (safe_arith is exact)
        return (1.0 if value == Fraction(gold["target"]) else 0.1), expr, True


@register
class GSM8K(Task):
    """Grade-school word problems (openai/gsm8k). Gold = the number after '####'."""

    name = "gsm8k"
    fields = ("'question' (or 'problem') and 'answer' (or 'solution'): solution text ending '#### "
              "N' or "
              "'The answer is: N', or just N")
    hub = {"train": ("openai/gsm8k", "main", "train"), "test": ("openai/gsm8k", "main", "test")}
    system_prompt = (
        'Solve the math word problem step by step. Write one step per line, and end with "The '
        'answer is N." '
        "where N is a number."
    )

    @classmethod
    def from_row(cls, row, where):
        question = _field(row, ("question", "problem"), cls.name, where)
        text = str(_field(row, ("answer", "solution"), cls.name, where))
        answer = text.rsplit("####", 1)[1] if "####" in text else text
        said = re.search(r"the answer is:?\s*\$?\s*([-\d,.]+?)\.?\s*$", text, re.IGNORECASE)
        if "####" not in text and said:  # LLM_RL's files end their solutions "The answer is: N"
            answer = said.group(1)
        answer = ascii_lookalikes(answer).strip().replace(",", "")
        if to_number(answer) is None:
            raise UsageError(f"{where}: no number after '####' in {text[-80:]!r}")
        solution = text if "####" in text else row.get("solution", "")
        return {"question": question, "answer": answer, "solution": solution}


def _is_prose(answer: str) -> bool:
    """Does a gold answer read as sentences (a worked solution) rather than an answer? Four words
    in a row outside math, as in "We have 3 + 4 = 7 apples", which no answer of MATH has."""
    outside = re.sub(r"\$[^$]*\$|\\\(.*?\\\)|\\text\{[^{}]*\}", " ", answer)
    return re.search(r"[A-Za-z]{2,}(?:\s+[A-Za-z]+[,.]?){3}", outside) is not None


@register
class MATH(Task):
    """Competition math (Hendrycks MATH). Gold = `answer`, or the last \\boxed{} of `solution`."""

    name = "math"
    fields = ("'problem' (or 'question') and one of 'answer', 'final_answer', or 'solution' with a "
              "\\boxed{} answer")
    # MATH-500 for test; the full 7,500-problem MATH train split for train (MATH-500 comes from MATH
    # test).
    hub = {"train": ("DigitalLearningGmbH/MATH-lighteval", "default", "train"),
           "test": ("HuggingFaceH4/MATH-500", None, "test")}
    system_prompt = "Please reason step by step, and put your final answer within \\boxed{}."
    final_answer = re.compile(r"\\boxed|\\fbox|the (?:final )?answer is", re.IGNORECASE)

    @classmethod
    def from_row(cls, row, where):
        question = _field(row, ("problem", "question"), cls.name, where)
        answer = row.get("answer") or row.get("final_answer")
        if answer is not None and ("\\boxed" in str(answer) or "\\fbox" in str(answer)):
            answer = last_boxed(str(answer))  # a worked solution as the gold: its final answer
            if answer is None:
                raise UsageError(f"{where}: the answer field holds a solution whose \\boxed{{}} is "
                                 "empty; point --answer_key at the final answer")
        elif answer is not None and _is_prose(str(answer)):
            raise UsageError(f"{where}: the answer field holds text, not a final answer "
                             f"({str(answer)[:60]!r}...); point --answer_key at the final answer, "
                             "or at a solution that ends in \\boxed{}")
        if answer is None:
            answer = last_boxed(_field(row, ("answer", "final_answer", "solution"), cls.name,
                                       where))
            if answer is None:
                raise UsageError(f"{where}: the solution has no \\boxed{{}} answer; add an "
                                 "'answer' field")
        return {
            "question": question, "answer": str(answer), "solution": row.get("solution", ""),
            "level": row.get("level"), "subject": row.get("subject") or row.get("type"),
        }

    @classmethod
    def extract(cls, response):
        """The last \\boxed{} (empty box = no answer); else the math after the last "The answer is":
        its $...$ span, after which the sentence may hold units but no hedge word and no other
        number ("$18$ (or perhaps $19$)" is no answer), or else the rest of the sentence, which must
        hold no hedge word outside \\text{} ("3 or 4" is no answer; `3 \\text{ or } 4` is the list
        3, 4). A bare number is never an answer."""
        response = ascii_lookalikes(response)
        if "\\boxed" in response or "\\fbox" in response:
            pred = last_boxed(response)
            return pred, pred is not None
        if not (matches := list(_ANSWER_IS.finditer(response))):
            return None, False
        if tentative(response, matches[-1].start()):  # "check whether the answer is ..."
            return None, False
        rest = re.sub(r"^[\s:*]+", "", response[matches[-1].end() :].split("\n", 1)[0])
        pred = None
        for start, end in (("$$", r"\$\$"), ("$", r"(?<!\\)\$"), ("\\(", r"\\\)"),
                           ("\\[", r"\\\]")):
            close = re.compile(end).search(rest, len(start)) if rest.startswith(start) else None
            if close:  # the math span: then units at most, no hedge, no other number
                pred = rest[len(start) : close.start()]
                if not _nothing_more(rest[close.end() :]):
                    return None, False
                break
        if pred is None:
            pred = _sentence(rest)
            yes_or_no = re.fullmatch(r"\W*(?:yes|no)\W*", pred, re.IGNORECASE)  # "no" is no hedge
            if not yes_or_no and has_hedge(re.sub(r"\\text\s*\{[^{}]*\}", " ", pred)):
                return None, False
        pred = pred.strip(" *").rstrip(".").strip()
        return (pred, True) if pred else (None, False)

    @classmethod
    def grade(cls, response, answer):
        pred, format_ok = cls.extract(response)
        return float(format_ok and math_equal(pred, answer)), pred, format_ok


# ------------------------------------------------------------------------------------------------
# Files


def is_hub_id(path) -> bool:
    """'owner/name' that is no local file: a dataset on the Hugging Face hub."""
    text = str(path)
    return not Path(text).exists() and re.fullmatch(r"[\w.-]+/[\w.-]+", text) is not None \
        and Path(text).suffix not in (".jsonl", ".json", ".parquet")


def load_hub_rows(name, config, split) -> list[dict]:
    try:
        from datasets import load_dataset  # lazy: generated tasks stay fast and offline

        return list(load_dataset(name, config, split=split))
    except Exception as e:
        raise PathError(
            f"could not load {name} (split {split!r}) from the Hugging Face hub "
            f"({type(e).__name__}: {e}). If "
            "you are offline, pass a local .jsonl/.json/.parquet file (--dataset_path for "
            "training, "
            f"--eval_dataset_path for evaluation); see data/README.md."
        ) from e


def rename_fields(row: dict, keys) -> dict:
    """The row with keys["question"] / keys["answer"] (oat's --input_key / --output_key) copied to
    the names the tasks read."""
    if not keys:
        return row
    row = dict(row)
    for name, key in keys.items():
        if key is None:
            continue
        if key not in row:
            raise UsageError(f"--{name}_key {key!r}: the rows have no such field (fields: "
                             f"{sorted(row)})")
        row[name] = row.pop(key)
        if name == "answer":
            row.pop("final_answer", None)  # the named field wins over the task's usual ones
    return row


def read_rows(path, task: str) -> list[dict]:
    """Rows of a .jsonl, .json (a list of objects) or .parquet file."""
    path = Path(path)
    if not path.is_file():
        hub = sorted({name for name, _, _ in TASKS[task].hub.values()})
        alt = f", or leave path out to load {' / '.join(hub)} from the hub" if hub else ""
        raise PathError(
            f"dataset file not found: {path}. Pass an existing .jsonl, .json or .parquet file with "
            f"path=... (--dataset_path on the command line){alt}."
        )
    if path.suffix == ".jsonl":
        rows = []
        # split on "\n" only: str.splitlines also breaks at U+2028, which a JSON string may hold as
        # it is
        for number, line in enumerate(path.read_text().split("\n"), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise UsageError(f"{path}, line {number}: not valid JSON ({e.msg}, column "
                                     f"{e.colno}): "
                                     f"{line[:80]!r}. Each line of a .jsonl file is one JSON "
                                     "object.") from None
    elif path.suffix == ".json":
        try:
            rows = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise UsageError(f"{path}, line {e.lineno}: not valid JSON ({e.msg}, column "
                             f"{e.colno}).") from None
        rows = rows.get("data", rows) if isinstance(rows, dict) else rows
    elif path.suffix == ".parquet":
        import pyarrow.parquet  # installed with datasets

        rows = pyarrow.parquet.read_table(path).to_pylist()
    else:
        raise UsageError(f"{path}: unsupported file type {path.suffix!r}; use .jsonl, .json or "
                         ".parquet")
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows) or not rows:
        raise UsageError(f"{path}: expected a non-empty list of objects with {TASKS[task].fields}")
    return rows


# ------------------------------------------------------------------------------------------------
# The environment

ENV_OPTIONS = {
    "template": "chat", "system_prompt": None, "num_few_shot": 0, "stepwise": False,
    "step_tag": "\n", "max_steps": 10, "reward_fn": None, "calc_annotations": False, "keys": None,
    "reward_funcs": (), "reward_weights": None,
}
# a GSM8K-style calculator span in a few-shot solution
CALC_ANNOTATION = re.compile(r"<<[^<>\n]*>>")


def _task(name: str) -> type[Task]:
    if name not in TASKS:
        raise UsageError(f"unknown task {name!r}; the tasks are {', '.join(TASKS)}. For your own "
                         "data and reward, pass a file with the task whose answers it holds and "
                         "--reward_fn file.py:name (docs/your_own_task.md)")
    return TASKS[name]


def verify(task: str, response: str, answer: str) -> float:
    """Reward in [0, 1] for a full response against a gold answer (countdown: 1.0 / 0.1 / 0.0).
    Pure."""
    return _task(task).grade(response, answer)[0]


def make_env(task: str, split: str = "train", path=None, seed: int = 0, say=print,
             **options) -> "MathEnv":
    """Build an env over a task's problems.

    task: one of TASKS ("arithmetic", "countdown", "gsm8k", "math").
    split: "train" or "test". gsm8k/math load the hub split; generated tasks use
    data/<task>_test.jsonl
        for "test" and generate `num_examples` problems from `seed` for "train", excluding test
        problems.
    path: a local .jsonl/.json/.parquet file to use instead (the split is then ignored).
    seed: seeds problem generation and the env's own RNG for `reset()`.
    Options:
        template="chat"      "chat": a list of {"role", "content"} messages; "plain": one string
        system_prompt=None   None = the task's default; "" = no system prompt
        num_few_shot=0       worked examples from data/few_shot_<task>.jsonl put before the question
        stepwise=False       one action = one reasoning step (a line) instead of the whole response
        step_tag="\\n"        appended after each step in stepwise mode (OpenR uses " ки\\n")
        max_steps=10         a stepwise episode ends after this many steps
        reward_fn=None       reward_fn(example, steps, done) -> float replaces the per-step reward
                             (default: the verifier on the final step, 0.0 before)
        reward_funcs=()      (name, function) pairs in TRL's convention (common/rewards.py), added
                             to the verifier's reward of every graded response
        reward_weights=None  the verifier's weight, then each function's (default: 1 each)
        calc_annotations=False  keep the <<expr>> calculator spans of the few-shot solutions
                             ("4 * 7 = <<4*7>>28"), for a policy that has a calculator; by default
                             they are removed
        difficulty="mixed"   arithmetic only: 1..5 (see Arithmetic), a range "1-2", a list "1,3",
                             or "mixed"
        num_examples=10000   generated tasks only: size of the train split
    """
    cls = _task(task)
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    unknown = sorted(set(options) - set(ENV_OPTIONS) - set(cls.options))
    if unknown:
        raise UsageError(f"unknown option(s) {unknown} for task {task!r}; accepted: "
                         f"{sorted({**ENV_OPTIONS, **cls.options})}")
    env_options = {k: options.get(k, default) for k, default in ENV_OPTIONS.items()}
    task_options = {k: options.get(k, default) for k, default in cls.options.items()}
    keys = env_options.pop("keys")
    _check_options(**env_options)  # fail on a bad option before loading any data
    few_shot = load_few_shot(cls, env_options.pop("num_few_shot"), say)
    examples = cls.load(split, path, seed, keys, **task_options)
    return MathEnv(cls, examples, seed=seed, few_shot=few_shot, **env_options)


MATH_SUBJECTS = ("prealgebra", "algebra", "number_theory", "counting_and_probability", "geometry",
                 "intermediate_algebra", "precalculus")


def detect_task(rows: list[dict]) -> str:
    """The task a data file is for, from the fields of its first row: countdown (numbers and a
    target), math (a \\boxed solution, OpenR's final_answer, or a problem without a worked answer),
    gsm8k (a '####' or "The answer is: N" solution, or a word problem), else arithmetic (a level and
    a number)."""
    row = rows[0]
    text = " ".join(str(row.get(k, "")) for k in ("answer", "solution", "final_answer"))
    if ("numbers" in row or "nums" in row) and "target" in row:
        return "countdown"
    if "\\boxed" in text:
        return "math"
    if "####" in text or re.search(r"the answer is:?\s*\$?-?[\d,.]+\.?\s*$", text, re.IGNORECASE):
        return "gsm8k"
    if "problem" in row or "final_answer" in row:
        return "math"
    return "arithmetic" if "level" in row else "gsm8k"


def resolve_task(args, say=print):
    """(task, data path, MATH subject) of the options: --dataset_name may be a task, a MATH
    subject (the math task, filtered to that subject) or a data file or hub dataset id (the task
    read off its fields). A --dataset_path file given with the default task (arithmetic) whose rows
    are not arithmetic is read as the task its fields say. Reads one row at most: no heavy work."""
    task, path, subject = args.dataset_name, args.dataset_path, None
    if task.lower() in MATH_SUBJECTS:
        task, subject = "math", task.lower()
    elif task not in TASKS and (Path(task).is_file() or is_hub_id(task)):  # TRL's way: the data
        task, path = None, path or task
    elif task not in TASKS:
        raise UsageError(f"--dataset_name {task!r}: not a task ({', '.join(TASKS)}), a MATH "
                         f"subject ({', '.join(MATH_SUBJECTS)}), a data file or a hub dataset id.")
    keys = {"question": args.question_key, "answer": args.answer_key}
    if path is not None and Path(path).is_file() and task in (None, "arithmetic"):
        found = detect_task([rename_fields(read_rows(path, "arithmetic")[0], keys)])
        if task is not None and found != task:
            say(f"{path}: its fields are those of the {found} task, not arithmetic: reading it as "
                f"{found}")
        task = found
    elif task is None:  # a hub dataset named by --dataset_name: its fields decide
        task = detect_task([rename_fields(load_hub_rows(path, None, "train")[0], keys)])
    return task, path, subject


def resolve_dataset(args, say=print):
    """(--dataset_name, --dataset_path) as they are run, for args.json: a data file or hub dataset
    given as --dataset_name becomes its task and the path, a MATH subject stays itself."""
    task, path, subject = resolve_task(args, say)
    return subject or task, path


def make_envs(args, stepwise_options=None, stepwise_eval=False, say=print):
    """(train env, held-out env or None when args.num_eval_problems is 0), from the options all five
    files share (common/args.py): the task and its files (`resolve_task`), keys, filters, template,
    system prompt, few-shot examples and your own reward functions. A training file without an
    --eval_dataset_path gives up a held-out slice of its rows (`hold_out`)."""
    task, path, subject = resolve_task(args, say)
    options = dict(template=args.template, num_few_shot=args.num_few_shot,
                   system_prompt=args.system_prompt,
                   keys={"question": args.question_key, "answer": args.answer_key},
                   reward_funcs=[load_reward_fn(spec) for spec in args.reward_fn or ()],
                   reward_weights=args.reward_weights)
    if task == "arithmetic":
        options["difficulty"] = args.difficulty
    train = make_env(task, "train", path=path, seed=args.seed, say=say,
                     **{**options, **(stepwise_options or {})})
    evaluation = None
    if args.num_eval_problems:
        eval_options = {**options, **((stepwise_options or {}) if stepwise_eval else {})}
        own_file = args.eval_dataset_path is None and path is not None and Path(path).is_file()
        evaluation = make_env(task, "test", path=path if own_file else args.eval_dataset_path,
                              seed=args.seed, say=lambda _: None, **eval_options)
        if own_file:
            hold_out(train, evaluation, args.num_eval_problems, args.seed, path, say)
    for env in (train, evaluation):
        if env is not None and (subject or args.levels):
            filter_math(env, subject, args.levels, say)
    return train, evaluation


def hold_out(train, evaluation, num_eval_problems, seed, path, say=print):
    """Split one file's problems, in place: a seeded random fifth of them (at most
    num_eval_problems) for evaluation, the rest for training. train and evaluation hold the same
    rows in the same order (both read `path`)."""
    n = min(num_eval_problems, len(train) // 5)
    if n == 0:
        say(f"{path}: {len(train)} rows are too few to hold a fifth out, so evaluation reads the "
            "training rows (--eval_dataset_path for a held-out file)")
        return
    held = set(random.Random(seed).sample(range(len(train)), n))
    evaluation.examples = [ex for i, ex in enumerate(evaluation.examples) if i in held]
    train.examples = [ex for i, ex in enumerate(train.examples) if i not in held]
    say(f"{path}: no --eval_dataset_path, so {n} of its {len(train) + n} rows are held out for "
        f"evaluation and {len(train)} train")


def filter_math(env, subject, levels, say):
    """Keep the problems of one MATH subject and/or some levels, in place. Subjects are spelled
    as the hub's 'type' or MATH-500's 'subject' ("Counting & Probability"); levels as 3 or
    "Level 3"."""
    if env.task.name != "math":
        raise UsageError(f"--levels and MATH subjects filter the math task, not {env.task.name}.")
    examples = env.examples
    if subject is not None:
        if not any(ex.get("subject") for ex in examples):
            say(f"--dataset_name {subject}: these rows have no 'subject' field, so all "
                f"{len(examples)} problems are used")
        else:
            examples = [ex for ex in examples if _subject_key(ex.get("subject")) == subject]
    if levels is not None:
        wanted = set(Arithmetic.levels(levels))
        if not any(ex.get("level") for ex in examples):
            say(f"--levels {levels}: these rows have no 'level' field, so no level filter applies")
        else:
            examples = [ex for ex in examples if _level_number(ex.get("level")) in wanted]
    if not examples:
        raise UsageError(f"no problem of subject {subject} and levels {levels} in this data")
    env.examples = examples


def _subject_key(subject) -> str:
    """'Counting & Probability' -> 'counting_and_probability', as in MATH_SUBJECTS."""
    return str(subject or "").lower().replace("&", "and").replace(" ", "_")


def _level_number(level) -> int:
    """'Level 3' or 3 -> 3; a missing or unreadable level -> 0 (kept by no filter)."""
    digits = re.sub(r"\D", "", str(level or ""))
    return int(digits) if digits else 0


def _check_options(template, system_prompt, num_few_shot, stepwise, step_tag, max_steps, reward_fn,
                   calc_annotations, reward_funcs, reward_weights):
    if template not in ("chat", "plain"):
        raise ValueError(f"template must be 'chat' or 'plain', got {template!r}")
    if not isinstance(num_few_shot, int) or num_few_shot < 0:
        raise ValueError(f"num_few_shot must be an integer >= 0, got {num_few_shot!r}")
    if not isinstance(max_steps, int) or max_steps < 1:
        raise ValueError(f"max_steps must be an integer >= 1, got {max_steps!r}")
    if reward_fn is not None and not callable(reward_fn):
        raise ValueError("reward_fn must be a callable reward_fn(example, steps, done) -> float, "
                         "or None")
    if reward_weights is not None and len(reward_weights) != 1 + len(reward_funcs):
        raise UsageError(f"--reward_weights {' '.join(map(str, reward_weights))}: give "
                         f"{1 + len(reward_funcs)} weights, the verifier's first, then one per "
                         f"--reward_fn ({', '.join(name for name, _ in reward_funcs) or 'none'})")
    if reward_weights is not None and not all(math.isfinite(w) for w in reward_weights):
        raise UsageError(f"--reward_weights {' '.join(map(str, reward_weights))}: every weight "
                         "must be a finite number (negative ones are penalties)")


class MathEnv:
    """A gym-like env over a list of problems; single-turn (one action = one response) or
    stepwise."""

    def __init__(self, task, examples, seed, template, system_prompt, few_shot, stepwise, step_tag,
                 max_steps, reward_fn, calc_annotations, reward_funcs=(), reward_weights=None):
        self.task, self.examples, self.rng = task, examples, random.Random(seed)
        self.reward_funcs = list(reward_funcs)  # (name, function): your own rewards
        self.reward_weights = reward_weights or [1.0] * (1 + len(self.reward_funcs))
        self.reward_log = {}  # name -> the values since reward_metrics() last read them
        self.calc_annotations = calc_annotations
        self.template, self.stepwise, self.step_tag = template, stepwise, step_tag
        self.max_steps, self.reward_fn, self.few_shot = max_steps, reward_fn, few_shot
        self.system_prompt = task.system_prompt if system_prompt is None else system_prompt
        self.index, self.steps, self.done = None, [], True

    def __len__(self):
        return len(self.examples)

    def sample_fields(self, index: int) -> dict:
        """The question and gold answer of problem `index`, for sample logs."""
        return {"question": self.examples[index]["question"],
                "answer": self.examples[index]["answer"]}

    def _solution(self, example) -> str:
        """A few-shot solution, one step per line; in stepwise mode each line carries the step tag.
        Without calc_annotations its calculator spans go: a model that has no calculator should not
        learn to call one."""
        text = example["solution"]
        text = text if self.calc_annotations else CALC_ANNOTATION.sub("", text)
        if not self.stepwise:
            return text
        return "".join(line + self.step_tag for line in text.split("\n"))

    def prompt(self, index: int):
        """The prompt for problem `index`: chat messages or, for template="plain", one string."""
        question = self.examples[index]["question"]
        if self.template == "plain":
            parts = [self.system_prompt] if self.system_prompt else []
            parts += [f"Question: {ex['question']}\nAnswer: {self._solution(ex)}"
                      for ex in self.few_shot]
            return "\n\n".join(parts + [f"Question: {question}\nAnswer:"])
        messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        for ex in self.few_shot:
            messages += [{"role": "user", "content": ex["question"]},
                         {"role": "assistant", "content": self._solution(ex)}]
        return messages + [{"role": "user", "content": question}]

    def reset(self, index: int | None = None):
        """Start an episode on problem `index` (None: drawn with the env's seeded RNG). Returns the
        prompt."""
        self.index = self.rng.randrange(len(self.examples)) if index is None else index
        self.steps, self.done = [], False
        self._prompt = self.prompt(self.index)
        return self._prompt

    def verify(self, response: str, index: int) -> tuple[float, dict]:
        """The task's verifier on a full response to problem `index`: (reward, info)."""
        answer = self.examples[index]["answer"]
        reward, pred, format_ok = self.task.grade(response, answer)
        return reward, {"correct": reward == 1.0, "format_ok": format_ok, "pred": pred,
                        "answer": answer, "steps": 1}

    def score(self, response: str, index: int) -> tuple[float, dict]:
        """Grade a full response to problem `index`: (reward, info)."""
        return self.score_all([response], [index])[0]

    def score_all(self, responses: list, indices: list, completion_ids=None) -> list:
        """Grade responses (response k answers problem indices[k]): [(reward, info)]. The reward is
        the task's verifier, plus each --reward_fn called once on the whole batch, weighted."""
        graded = [self.verify(response, index) for response, index in zip(responses, indices)]
        if not self.reward_funcs:
            return graded
        chat = self.template == "chat"
        prompts = [self.prompt(i) for i in indices]
        completions = [[{"role": "assistant", "content": r}] if chat else r for r in responses]
        rows = [self.examples[i].get("row", self.examples[i]) for i in indices]
        columns = [[reward for reward, _ in graded]] + [
            call_reward_fn(name, fn, prompts, completions, completion_ids, rows)
            for name, fn in self.reward_funcs]
        names = ["verifier"] + [name for name, _ in self.reward_funcs]
        for name, column in zip(names, columns):
            self.reward_log.setdefault(name, []).extend(v for v in column if v is not None)
        total = weighted_sum(columns, self.reward_weights)
        return [(reward, {**info, "rewards": dict(zip(names, values))})
                for reward, (_, info), values in zip(total, graded, zip(*columns))]

    def reward_metrics(self) -> dict:
        """{"rewards/<name>/mean": ...} of the verifier and each --reward_fn over the responses
        graded since the last call (None values left out; NaN where none was graded, so that every
        update and every rank logs the same keys); {} without a --reward_fn."""
        if not self.reward_funcs:
            return {}
        names = ["verifier"] + [name for name, _ in self.reward_funcs]
        out = {f"rewards/{name}/mean": sum(values) / len(values) if values else math.nan
               for name in names for values in [self.reward_log.get(name, [])]}
        self.reward_log.clear()  # in place: the stepwise episodes' copies of this env share it
        return out

    def step(self, action: str):
        """Single-turn: grade the whole response; obs is None, done is True.
        Stepwise: append one step; done when it holds a final answer or after max_steps. obs is the
        new state."""
        if self.done:
            raise RuntimeError("the episode is over (or never started): call env.reset() first")
        example = self.examples[self.index]
        if not self.stepwise:
            self.steps, self.done, obs = [action], True, None
            reward, info = self.score(action, self.index)
        else:
            tag = self.step_tag.strip()
            self.steps.append((action.replace(tag, "") if tag else action).rstrip())
            answered = bool(self.task.final_answer.search(self.steps[-1]))
            self.done = answered or len(self.steps) >= self.max_steps
            if self.done:  # the outcome verifier reads the whole solution, without step tags
                reward, info = self.score("\n".join(self.steps), self.index)
            else:
                reward, info = 0.0, {"correct": False, "format_ok": False, "pred": None,
                                     "answer": example["answer"]}
            info["cut"] = self.done and not answered  # ended by the step limit, not by an answer
            obs = self._state()
        info["steps"] = len(self.steps)
        if self.reward_fn is not None:  # process reward hook (APPO/TPPO): scores every step
            reward = float(self.reward_fn(example, list(self.steps), self.done))
        return obs, reward, self.done, info

    def _state(self):
        """The prompt plus the steps so far; chat puts them in a trailing assistant message to
        continue."""
        text = "".join(step + self.step_tag for step in self.steps)
        if self.template == "plain":
            return self._prompt + text
        return self._prompt + [{"role": "assistant", "content": text}]


def load_few_shot(task: type[Task], k: int, say=print) -> list[dict]:
    """The first k worked examples of data/few_shot_<task>.jsonl; none for a task without one."""
    if k == 0:
        return []
    path = DATA_DIR / f"few_shot_{task.name}.jsonl"
    if not path.is_file():  # a task of your own: the system prompt alone states the format
        say(f"task {task.name}: no worked examples ({path.relative_to(DATA_DIR.parent)} does not "
            "exist), so the prompts have none")
        return []
    rows = read_rows(path, task.name)
    if k > len(rows):
        raise UsageError(f"num_few_shot={k} but {path} has {len(rows)} examples; use num_few_shot "
                         f"<= {len(rows)}")
    return [task.from_row(row, f"{path}: row {i + 1}") for i, row in enumerate(rows[:k])]
