"""Number answers: how a response's final answer is found and read as one exact value (the
GSM8K-style grading of the arithmetic and gsm8k tasks; MATH's own sits in common/env/grader.py).

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

from common.env.grader import (MALFORMED_NUMBER, ascii_lookalikes, box_end, digit_groups, doubts,
                           has_hedge, has_value_word, last_boxed, math_equal, unicode_math)

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
        return _power(node, src)
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITH_OPS:
        value = _ARITH_OPS[type(node.op)](_arith(node.left, src, powers),
                                          _arith(node.right, src, powers))
        limit = _MAX_ANSWER if powers else _MAX_VALUE
        if abs(value.numerator) > limit or value.denominator > limit:
            raise ValueError("too large")
        return value
    raise ValueError(f"not arithmetic: {type(node).__name__}")


def _power(node: ast.BinOp, src: str) -> Fraction:
    """_arith's `**`, read in final answers only (powers=True): an integer power of bounded size."""
    base, exp = _arith(node.left, src, True), _arith(node.right, src, True)
    digits = max(abs(base.numerator).bit_length(), base.denominator.bit_length(), 4) * 0.30103
    # refused before it is built
    if exp.denominator != 1 or digits * abs(exp) > _MAX_ANSWER_DIGITS + 4:
        raise ValueError("power too large or not an integer power")
    return base ** int(exp)


# ------------------------------------------------------------------------------------------------
# The final answer: found after the last marker, read as one value

# 1,000 (thousands separators only), 18, 18.5, -3, .5; "18." matches as 18. ASCII digits only: text
# is passed through ascii_lookalikes first, so other scripts' digits are already 0-9.
_NUMBER = re.compile(r"-?(?:[0-9]{1,3}(?:,[0-9]{3})+(?![0-9])|[0-9]+)(?:\.[0-9]+)?|-?\.[0-9]+")
# "The (final) answer is" and "Final answer:" ("**Final Answer:** 18"). A bare "Answer:" is not
# one: the plain template's prompts end with it, and a base model that runs on writes the next.
ANSWER_IS = re.compile(r"the (?:final )?answer is|\bfinal answer\W{0,4}:", re.IGNORECASE)
# Every answer marker of a GSM8K-style answer, and of a MATH one (MATH has no ####)
MARKERS = re.compile(r"\\boxed|\\fbox|####|" + ANSWER_IS.pattern, re.IGNORECASE)
MATH_MARKERS = re.compile(r"\\boxed|\\fbox|" + ANSWER_IS.pattern, re.IGNORECASE)
_SENTENCE_END = re.compile(r"\n|[.!?](?=\s|\Z)")  # the '.' of 18.5 is no sentence end
# Two plain numbers joined by a dash and nothing else: a range ("3-5 apples"), not a subtraction
_RANGE = re.compile(r"\$?[0-9][0-9,.]*\s*-\s*\$?[0-9][0-9,.]*(?:\s*[A-Za-z%][A-Za-z%'\s]*)?")
_LEADING = re.compile(r"^(?:[:=$€£¥₹*\s]|\\\(|\\\[|\\\$)+")
_FILLER = re.compile(r"^(?:therefore|thus|so|then|simply|just|clearly|indeed)\b[\s,:]*",
                     re.IGNORECASE)
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


def _strip_end(s: str) -> str:
    """s without trailing punctuation, spaces, \\) and \\] (a regex is quadratic in spaces)."""
    while (t := s.rstrip(".,;:!?$€°* \t\n\r").removesuffix("\\)").removesuffix("\\]")) != s:
        s = t
    return s


def answer_value(span: str) -> Fraction | None:
    """The exact value of a span if it is one value (1,000, $18, 2*9 = 18, x = 18, then units), else
    None: a hedge ("or", "I think"), number word, ≈, range ("3-5") or malformed number (0x12)."""
    s = span.strip()
    if len(s) > 4 * MAX_ARITH_LEN:  # no answer is this long, and every scan below stays short
        return None
    for _ in range(5):  # leading ': = $ € £ **' and trailing punctuation, in any order
        s = _strip_end(_LEADING.sub("", s))
        s = _FILLER.sub("", s)  # "the answer is therefore 18"
    # 30°, 18 m^2 (18 m² reads so): a degree sign and a squared unit go with the units
    s = re.sub(r"\b(m|cm|mm|km|ft|in|yd|mi|units?|meters?|feet|inches)\^\{?[23]\}?", r"\1", s)
    s = s.replace("°", " ")
    approximate = re.search(r"[~≈±]|\\(?:approx|sim|pm)(?![a-zA-Z])", s)
    s = digit_groups(s)  # 1 234 567, 1'234'567, 1.234.567
    if (not s or len(s) > MAX_ARITH_LEN or has_hedge(s) or approximate or has_value_word(s)
            or MALFORMED_NUMBER.search(s) or _RANGE.fullmatch(s)):
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
# A hypothesis named as a guess or a mistake is no answer either: "One might guess the answer is
# 18", "A common mistake is to say the answer is 18", "A naive approach says the answer is 18".
_TENTATIVE = frozenset("""
    if whether suppose supposing assume assuming unless maybe perhaps check checking verify
    verifying test testing might could would guess guessed think thinks thought believe mistake
    mistaken mistakenly naive naively wrong wrongly incorrect incorrectly error erroneously
    tempting seem seems seemed claim claims hypothesis initially originally draft drafted
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


def last_marker(response: str, markers: re.Pattern = MARKERS) -> re.Match | None:
    """The last answer marker of any kind: a box, `####`, "The answer is", "Final answer:"."""
    last = None
    for last in markers.finditer(response):
        pass
    return last


def _box_end(text: str, start: int) -> int:
    """grader.box_end, or the end of the text for a box never closed."""
    end = box_end(text, start)
    return len(text) if end is None else end


# A value right before "or" and the box: "$x = 3$ or $x = \\boxed{4}$", "3 or \\boxed{4}"
_OR_BEFORE_BOX = re.compile(r"(?:\$([^$]{1,200})\$|(-?[0-9][0-9.,]*))\s*,?\s*(?:or|either)\s*\$?\s*"
                            r"(?:([A-Za-z])\s*=\s*)?\$?\s*$", re.IGNORECASE)


def _candidate_before(text: str, start: int) -> str | None:
    """The value another candidate gives just before "or" and the box at `start`, or None. A box
    named `x = ` needs a candidate named `x = ` too: in "$360 + 2x = 600$, or $x = \\boxed{120}$"
    (a MATH-500 solution) the equation is no candidate, and "or" says the same in other words."""
    m = _OR_BEFORE_BOX.search(text[max(0, start - 300) : start])
    if m is None:
        return None
    chain = (m[1] or m[2]).split("=")
    if m[3]:
        return chain[-1] if len(chain) == 2 and chain[0].strip() == m[3] else None
    return None if re.search(r"[A-Za-z]", re.sub(r"\\[a-zA-Z]+", "", chain[-1])) else chain[-1]


# A word right before a box that makes the box's value another one: "the reciprocal of
# $\\boxed{4}$" is 1/4, "twice \\boxed{3}" is 6
_CHANGES_BEFORE = re.compile(r"\b(?:reciprocal|inverse|negative|opposite|negation|square|cube|root"
                             r"|logarithm|log|factorial|half|twice|double|triple|thrice|minus)"
                             r"(?:\s+of)?(?:\s+the)?(?:\s|\$|\\\(|\\\[)*$", re.IGNORECASE)
# Words that make a box a draft: a guess, a first try, a supposition, a counterfactual ("it were")
_DRAFT = frozenset("""
    guess guessed guessing draft drafted initially originally tentative tentatively hypothetically
    suppose supposing assume assuming were estimate estimated thought
""".split())
# A word right before a box that makes it an estimate: "about $\\boxed{12}$". A sign (`\\approx
# \\boxed{32,\\!348}`, to the nearest dollar) is a rounding the question asked for, as one MATH-500
# solution writes, and a bound ("at most $\\boxed{2}$") is the answer to a question of "at most".
_HEDGE_BEFORE = re.compile(r"(?<![\\a-zA-Z])(?:about|approximately|approx|roughly|around|nearly"
                           r"|almost|circa)"
                           r"(?:\s|\$|\\\(|\\\[)*$", re.IGNORECASE)
# Words right before a box that make it a trial: "Let's try $\\boxed{12}$", "Testing \\boxed{12}"
_TRIAL_BEFORE = re.compile(r"(?<![\\a-zA-Z])(?:try|trying|tried|test|testing|tested|attempt"
                           r"|attempting"
                           r"|plug(?:ging)?\s+in)(?:\s+with)?(?:\s|\$|\\\(|\\\[)*$",
                           re.IGNORECASE)
_NUMBER_WORD_AFTER = frozenset("""
    zero one two three four five six seven eight nine ten eleven twelve times
""".split())


def box_is_hedged(text: str) -> bool:
    """Is the last box one candidate of two, a guess, a draft, or a value that words change? Grading
    policy (data/README.md): such a box is no answer.

    - Two candidates: a box before it in the same sentence with a hedge word between them
      (`\\boxed{3} or \\boxed{4}`), or a value right before "or" and the box (`x = 3 or x =
      \\boxed{4}`), when the two values differ: "$1\\frac14$, or $\\boxed{1.25}$" restates one
      value, as three MATH-500 solutions do.
    - A guess: doubt in the rest of its sentence (`\\boxed{18} (I think)`, `\\boxed{18}, or maybe
      19`), a question mark in the box (`\\boxed{12?}`) or at the end of its sentence.
    - A draft: its sentence calls it a guess, a draft or a supposition ("My first guess was
      \\boxed{12}", "If it were \\boxed{12}") and a number after it differs from it.
    - Its value changed by the words around it: "the reciprocal of \\boxed{4}", "\\boxed{5}
      million", or made a bound or an estimate: "about \\boxed{12}", "at least \\boxed{12}".
    - A spray: another box with a different value beside it, only punctuation, "and" or "or"
      between them (`\\boxed{12}, \\boxed{13}`), or three different values boxed in the text.
    - Retracted: a later sentence takes it back (`retracted`)."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    content = last_boxed(text)
    before = max(text.rfind("\\boxed", 0, start), text.rfind("\\fbox", 0, start))
    other = None
    if before >= 0:
        between = text[_box_end(text, before) : start]
        if between and first_sentence(between) == between and has_hedge(between):
            other = last_boxed(text[: _box_end(text, before)])
    other = other if other is not None else _candidate_before(text, start)
    if other is not None and content is not None and not math_equal(other, content):
        return True
    after = text[_box_end(text, start) :]
    sentence_end = _SENTENCE_END.search(after)
    if "?" in (content or "") or (sentence_end and after[sentence_end.start()] == "?"):
        return True
    word_after = re.match(r"(?:[\s$)\]}.,]|\\[()\[\],; ]|\\text\s*\{)*([A-Za-z]+)", after)
    if word_after and word_after[1].lower() not in _NUMBER_WORD_AFTER and has_value_word(
            word_after[1]):
        return True  # \boxed{5} million, \boxed{5}\text{ thousand}
    near = text[max(0, start - 300) : start]
    if _CHANGES_BEFORE.search(near) or _HEDGE_BEFORE.search(near):
        return True
    if content is not None and (_sprayed(text, start, content)
                                or retracted(after, lambda n: math_equal(n, content))):
        return True
    if content is not None and _drafted(near, after, content):
        return True
    return doubts(first_sentence(after))


# What may stand between two boxes of a spray: punctuation, math delimiters and spaces, "and", "or"
_BESIDE = re.compile(r"(?:[\s$,;/|&~.:()\[\]]|\\[()\[\],;: ]|\\q?quad(?![a-zA-Z])"
                     r"|\\text\s*\{\s*(?:and|or)?\s*\}|\b(?:and|or)\b)*")
MAX_BOXES_READ = 30  # a spray is judged on the last boxes only: 1,000 boxes grade fast


def _sprayed(text: str, start: int, content: str) -> bool:
    """Is the last box (at `start`, holding `content`) one of a spray of candidates: a box of
    another value right beside it (nothing but punctuation, "and" or "or" between), or three or more
    different values boxed in the text? A draft box and a final one are two values, and the same
    value boxed twice is one."""
    starts = [m.start() for m in re.finditer(r"\\boxed|\\fbox", text[:start])][-MAX_BOXES_READ:]
    values = [content]  # one of each value, the last box's first
    for k, other in enumerate(reversed(starts)):
        end = box_end(text, other)
        inside = None if end is None else last_boxed(text[other:end])
        if inside is None:
            continue
        new = all(not math_equal(inside, v) for v in values)
        if new and k == 0 and _BESIDE.fullmatch(text[end:start]):
            return True  # \boxed{12}, \boxed{13}
        values += [inside] if new else []
        if len(values) >= 3:
            return True
    return False


# Words that take an answer back: a sentence after the answer that holds one and then another
# number, but not the answer's own, is a correction, which leaves no answer.
_RETRACT_WORDS = frozenset("""
    wrong incorrect mistake mistaken error erred oops scratch correction typo miscounted
    miscalculated actually wait hmm instead rather redo recount recounting recalculate
    recalculating recompute recomputing forgot dropped missed
""".split())
_RETRACT_PHRASE = re.compile(r"\b(?:second thought|i mean|should (?:be|have been)|no,|no wait)",
                             re.IGNORECASE)
# A sentence that calls the answer wrong: "That's wrong.", "12 is incorrect."
_SAID_WRONG = re.compile(r"(?:\b(?:that|this|it)|(?<![0-9.])(-?[0-9]+(?:\.[0-9]+)?))(?:'s| is| was)"
                         r" (?:wrong|incorrect|a mistake|not right)", re.IGNORECASE)
_LATER_NUMBER = re.compile(r"(?<![0-9.A-Za-z_^])-?[0-9]+(?:\.[0-9]+)?")


def retracted(after: str, same) -> bool:
    """Does the text after an answer take it back? `same(number)` says whether a number is the
    answer's value. A retraction is a word of _RETRACT_WORDS (or a phrase: "on second thought", "I
    mean", "should be") followed, within its sentence and the next, by a number that is not the
    answer, when that stretch holds no number equal to the answer; or a sentence that calls it
    wrong ("That's wrong.", "12 is wrong" after 12). So "Wait, let me verify: 3 * 4 = 12" after the
    answer 12 retracts nothing, nor does "It is a common mistake to count 48, ... the correct
    answer of 63" after 63 (a MATH-500 solution). Grading policy (data/README.md)."""
    if not after.strip():
        return False
    low = after[:4000].lower()  # a correction comes soon after its answer; a long tail stays cheap
    if any(m[1] is None or same(m[1]) for m in _SAID_WRONG.finditer(low)):
        return True
    cues = [m.start() for m in re.finditer(r"[a-z]+", low) if m[0] in _RETRACT_WORDS]
    cues += [m.start() for m in _RETRACT_PHRASE.finditer(low)]
    for at in sorted(cues)[:8]:
        first = _SENTENCE_END.search(low, at)
        second = first and _SENTENCE_END.search(low, first.end())
        stretch = low[at : second.start() if second else len(low)]
        numbers = list(dict.fromkeys(_LATER_NUMBER.findall(stretch)))[:5]
        if numbers and not any(same(n) for n in numbers):
            return True
    return False


def _drafted(before: str, after: str, content: str) -> bool:
    """Does the box's sentence (`before` it) call it a draft, or the words right before it a trial
    ("Let's try"), while a number after it differs?"""
    cut = max([m.end() for m in re.finditer(r"[.!?](?=\s)|\n", before)] + [0])
    if not (_DRAFT.intersection(re.findall(r"[a-z]+", before[cut:].lower()))
            or _TRIAL_BEFORE.search(before)):
        return False
    later = re.findall(r"(?<![0-9.])-?[0-9]+(?:\.[0-9]+)?", after)
    return any(not math_equal(number, content) for number in dict.fromkeys(later[:5]))


def nothing_more(after: str) -> bool:
    """The rest of the sentence after an answer holds no other number, no hedge and no word that
    changes the value ("$5$ million"); units are fine."""
    rest = first_sentence(after)
    return re.search(r"[0-9]", rest) is None and not has_hedge(rest) and not has_value_word(rest)


def extract_number(response: str) -> tuple[str | None, bool]:
    """GSM8K-style answer: (its exact value as text, format_ok). Grading policy (data/README.md):
    the answer is the WHOLE text at the last marker, and must be one value (`answer_value`).
    Without a marker there is none: format_ok is False and the reward 0 (a response that repeats
    the question must not score); the last number is still returned, for diagnostics."""
    response = unicode_math(ascii_lookalikes(response))  # −5 and １８ read as ASCII
    marker = last_marker(response)
    if marker is None:
        numbers = _NUMBER.findall(response)[-1:]
        return (numbers[0].replace(",", "") if numbers else None), False
    if marker[0] in ("\\boxed", "\\fbox"):  # its content, unless it hedges
        span = None if box_is_hedged(response) else last_boxed(response)
        after = ""  # box_is_hedged has read what follows a box
    elif marker[0] == "####":  # the rest of its line
        span, _, after = response[marker.end() :].partition("\n")
    else:  # "The answer is": the rest of its sentence, unless it is a hypothesis
        rest = response[marker.end() :].lstrip(" \t\n:*")  # "The answer is:\n18"
        span = None if tentative(response, marker.start()) else first_sentence(rest)
        after = rest[len(span or "") :]
    value = None if span is None else answer_value(span)
    if value is not None and retracted(after, lambda n: to_number(n) == value):
        value = None  # "The answer is 12. Actually it should be 13."
    return (None, False) if value is None else (format_number(value), True)


def numbers_equal(pred: str | None, gold: str) -> bool:
    """Exact numeric equality: 18 == 18.0 == 18. == 36/2; 180, 1.8, 18.5 and 1,8 are not 18."""
    a, b = (to_number(pred) if pred is not None else None), to_number(gold)
    return a is not None and a == b

