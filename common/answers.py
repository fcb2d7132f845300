"""Number answers: how a response's final answer is found and read as one exact value (the
GSM8K-style grading of the arithmetic and gsm8k tasks; MATH's own sits in common/grader.py).

    extract_number("So 9 * 2 = 18. The answer is 18 dollars.")   # ("18", True)
    numbers_equal("18.0", "18")                                    # True

Grading policy (data/README.md): the answer is the whole span after the last marker (\\boxed{},
####, "The answer is"), it must be one value (`answer_value`: no hedge, no second candidate), and
without a marker there is no reward. Nothing here ever calls eval on model text: arithmetic goes
through `safe_arith`, an AST whitelist, and values are exact `Fraction`s.
"""

import ast
import operator
import re
from fractions import Fraction

from common.grader import ascii_lookalikes, has_hedge, last_boxed, unicode_math

# ------------------------------------------------------------------------------------------------
# Safe arithmetic


_ARITH_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
              ast.Div: operator.truediv}
MAX_ARITH_LEN = 300  # calculator expressions are short; the cap also bounds the AST depth
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
    if len(expr) > MAX_ARITH_LEN:
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


# ------------------------------------------------------------------------------------------------
# The final answer: found after the last marker, read as one value

# 1,000 (thousands separators only), 18, 18.5, -3, .5; "18." matches as 18. ASCII digits only: text
# is passed through ascii_lookalikes first, so other scripts' digits are already 0-9.
_NUMBER = re.compile(r"-?(?:[0-9]{1,3}(?:,[0-9]{3})+(?![0-9])|[0-9]+)(?:\.[0-9]+)?|-?\.[0-9]+")
ANSWER_IS = re.compile(r"the (?:final )?answer is", re.IGNORECASE)
_SENTENCE_END = re.compile(r"\n|[.!?](?=\s|\Z)")  # the '.' of 18.5 is no sentence end
# Words that add a number (or multiply one): "18 million", "18 and a half", "18k", "3 times 6"
_NUMBER_WORDS = frozenset("""
    zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen
    sixteen seventeen eighteen nineteen twenty thirty forty fifty sixty seventy eighty ninety
    hundred hundreds thousand thousands million millions billion billions trillion dozen dozens half
    halves quarter quarters third thirds twice double triple times k bn mn squared cubed
""".split())
_UNIT_TAIL = re.compile(r"[A-Za-z%'\-/,()*\s]*")  # what may follow the value: words and %, no digit


def first_sentence(text: str) -> str:
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
    if not s or len(s) > MAX_ARITH_LEN or has_hedge(s) or approximate:
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
    if matches := list(ANSWER_IS.finditer(response)):
        if tentative(response, matches[-1].start()):  # the last one decides: no answer
            return None, True
        return first_sentence(response[matches[-1].end() :]), True
    return None, False


def nothing_more(after: str) -> bool:
    """The rest of the sentence after an answer holds no other number and no hedge (units are
    fine)."""
    rest = first_sentence(after)
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

