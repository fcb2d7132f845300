"""Grade MATH-style final answers: is the model's `\\boxed{}` answer the same as the gold answer?

The pipeline, cheapest step first (most grades stop at step 2 or 3):
1. `last_boxed` pulls the answer out of the response (only the LAST box counts; an empty box is no
   answer).
2. `normalize` rewrites LaTeX so equal answers usually become equal strings (the PRM800K / Hendrycks
   `strip_string` idea): Unicode look-alikes to ASCII (`ascii_lookalikes`), `\\dfrac`->`\\frac`, no
   `\\left`/`\\right` or `\\Big`, spaces, units, degrees, percent; `\\over`, `\\choose`,
   `\\sin^{-1}`, scientific notation and thousands grouped by spaces, apostrophes or periods as the
   one value they write. `\\text{ or }`, `\\text{ and }`, `\\quad` separate a list like ",". A
   `\\text{}` that holds a number or a hedge word ("or", "about", ...) is kept, never dropped as a
   unit.
3. `_split` finds structure (tuples, intervals, sets, unions, set differences, matrices, `\\pm`,
   equations, inequalities), compared part by part. An inequality is its solution set over the
   reals, so `-x>-1` is `x<1` and `-1<x<3` is `(-1,3)`.
   Names count where the gold has them: `x=5` vs `y=5` differ, and a gold equation with variables on
   its right (`y=2x+3`) needs an equivalent equation (`2y=4x+6`), not `x=2x+3` or `2x+3`. A plain
   `x=5` or `5=x` grades as its value against a gold 5; `x=1, y=2` is the tuple (1,2) (variables in
   alphabetical order).
4. A small LaTeX parser turns each part into a tiny AST (nested lists). Pure rationals are compared
   exactly with `fractions.Fraction` in this process.
5. Everything else (pi, roots, logs, symbols) goes to a sympy worker subprocess that rebuilds the
   AST as sympy
   objects. Exact answers are compared exactly: the difference is evaluated to 50 digits (at three
   rational points if there are symbols), a clearly nonzero one is "different", and a near-zero one
   must be proved 0 (`simplify`, `equals`; undecided = different). Only an answer that is a plain
   decimal number (3.14159) is compared with a tolerance (1e-12 relative). A bare `e` is Euler's
   number; `i` is the imaginary unit.

The worker (common/env/grader_worker.py): a small pool of processes shared by all threads. Each
grade has a budget of TIMEOUT_S seconds of a worker's CPU time, shared by all its worker calls;
waiting for a free worker or for a starting one is not charged. An answer out of budget grades as
wrong.
`grader_counts()` counts grades, timeouts and failures. A worker runs this file (its last lines).

Safety: model text is never given to eval, `sympify` or `parse_expr` (all three call Python's eval).
The parser accepts only a whitelist of tokens, caps length and nesting depth, and refuses huge
powers before they are built, so `9^{9^{9^9}}` or 10 000 nested parentheses grade 0 in milliseconds.
"""

import atexit
import cmath
import functools
import math
import os
import re
import sys
import unicodedata
from fractions import Fraction

from common.env.grader_worker import Grade, Pool, count_grade, pool_size, serve
from common.env.timelimit import paused
# The grader's counts are read from here: common/run/run.py logs them with each update's metrics.
from common.env.grader_worker import grader_counts  # noqa: F401

MAX_LEN = 1000  # a normalised answer longer than this is only compared as a string
MAX_DEPTH = 60  # bracket/argument nesting the parser accepts; far below Python's recursion limit
MAX_DIGITS = 2000  # refuse to build numbers with more digits than this
MAX_ITEMS = 50  # elements in a tuple/set/matrix
TIMEOUT_S = 1.0  # budget for the sympy part of one grade: seconds of the worker's CPU time


# ------------------------------------------------------------------------------------------------
# 0. Unicode look-alikes and hedges (shared with the GSM8K grader in common/env/answers.py)

# minus sign, hyphen, non-breaking hyphen, figure dash, en dash, small/full-width/heavy minus
_DASHES = "\u2212\u2010\u2011\u2012\u2013\ufe63\uff0d\u2796"
_SLASHES = "\u2044\u2215"  # the fraction slash (3⁄4) and the division slash
_ZERO_WIDTH = "\u200b\u200c\u200d\u2060\ufeff\u00ad"  # invisible: "1\u200b8" looks like 18
_SUPERSCRIPTS = dict(zip("⁰¹²³⁴⁵⁶⁷⁸⁹⁺⁻", "0123456789+-"))
_SUPERSCRIPT_RUN = re.compile("[" + "".join(_SUPERSCRIPTS) + "]+")


@functools.lru_cache(maxsize=4096)
def _ascii_char(c: str) -> str:
    if c in _DASHES:
        return "-"
    if c in _SLASHES:
        return "/"
    if "\uff01" <= c <= "\uff5e":  # full-width ASCII: ＄１８ -> $18
        return chr(ord(c) - 0xFEE0)
    if c in _ZERO_WIDTH:
        return ""
    category = unicodedata.category(c)
    if category == "Nd":  # any script's decimal digit: ١٨ -> 18
        return str(unicodedata.decimal(c))
    if category == "Zs":  # no-break, thin, narrow no-break, ideographic ... spaces
        return " "
    return "\n" if category in ("Zl", "Zp") else c


def ascii_lookalikes(text: str) -> str:
    """Unicode characters that look like ASCII maths, as that ASCII: `−5` -> `-5`, `１８` -> `18`,
    `18²` -> `18^{2}`.

    Dashes used as minus, full-width forms, decimal digits of any script and odd spaces are mapped
    one by one, and the fraction slash is `/`.
    Not NFKC: that would turn `18²` into `182`. Everything else (letters, `×`, `½`) is
    left as it is.
    """
    if text.isascii():
        return text
    text = _SUPERSCRIPT_RUN.sub(lambda m: "^{" + "".join(_SUPERSCRIPTS[c] for c in m.group()) + "}",
                                text)
    return "".join(_ascii_char(c) if c > "\x7f" else c for c in text)


# Words that make an answer a guess or a choice. Number words are refused separately by the GSM8K
# grader.
HEDGE_WORDS = frozenset("""
    or nor not no maybe perhaps possibly probably likely about around approximately approx roughly
    nearly almost either neither between guess estimate estimated ish circa somewhere than least
    most over under above below instead wrong incorrect wait unless if could might plus more less
    think believe presumably tentatively tentative supposedly seemingly apparently hopefully unsure
    conceivably arguably assume assuming suppose supposing hmm
""".split())
# The words of those that say the writer doubts the answer, rather than compare it with something:
# after a box they make it a guess, where "more than", "or 6" and "not" are a solution's own words
# (MATH-500's reference solutions go on after their box with all three).
DOUBT_WORDS = frozenset("""
    maybe perhaps possibly probably presumably tentatively tentative think believe guess unsure
    supposedly seemingly apparently hopefully approximately roughly hmm
""".split())


_VULGAR = {"½": (1, 2), "⅓": (1, 3), "⅔": (2, 3), "¼": (1, 4), "¾": (3, 4), "⅕": (1, 5),
           "⅖": (2, 5), "⅗": (3, 5), "⅘": (4, 5), "⅙": (1, 6), "⅚": (5, 6), "⅛": (1, 8),
           "⅜": (3, 8), "⅝": (5, 8), "⅞": (7, 8)}
_ROOTS = {"√": "\\sqrt", "∛": "\\sqrt[3]", "∜": "\\sqrt[4]"}
_SYMBOLS = {"π": "\\pi ", "∞": "\\infty ", "ℝ": "\\mathbb{R}", "≥": "\\geq ", "≤": "\\leq ",
            "≠": "\\neq "}


def unicode_math(text: str) -> str:
    """Unicode math as LaTeX: ½ -> \\frac{1}{2} (2½ is then the mixed number 5/2), √2 ->
    \\sqrt{2}, ∛8 -> \\sqrt[3]{8}, ∜ -> \\sqrt[4]{}, π, ∞, ≥, ≤, ≠ -> \\pi, \\infty, \\geq,
    \\leq, \\neq."""
    if text.isascii():
        return text
    text = "".join(f"\\frac{{{_VULGAR[c][0]}}}{{{_VULGAR[c][1]}}}" if c in _VULGAR
                   else _SYMBOLS.get(c, c) for c in text)
    return re.sub(r"([√∛∜])\s*([0-9]+|[A-Za-z]|\([^()]*\)|\{[^{}]*\})",
                  lambda m: _ROOTS[m[1]] + "{" + m[2] + "}", text)


def doubts(text: str) -> bool:
    """Does the text say the answer before it is a guess: a word of DOUBT_WORDS, or "or" at its
    start (`\\boxed{18}, or maybe 19`)?"""
    words = re.findall(r"[a-z]+", re.sub(r"\\[a-zA-Z]+", " ", text).lower())
    return bool(DOUBT_WORDS.intersection(words)) or re.match(r"[\s,;:.(]*or\b",
                                                            text.lower()) is not None or re.search(
        r"\bgive or take\b|\bor so\b", text.lower()) is not None


def has_hedge(text: str) -> bool:
    """Does the text hold a hedge word ("or", "about", "not", "isn't", ...) or an
    approximately-equal sign? LaTeX command names are not words (`\\approx` counts as a sign,
    `\\frac` as nothing)."""
    if "≈" in text or re.search(r"\\approx(?![a-zA-Z])", text):
        return True
    words = re.findall(r"[a-z]+(?:'[a-z]+)?",
                       re.sub(r"\\[a-zA-Z]+", " ", text.replace("’", "'")).lower())
    return any(w in HEDGE_WORDS or w.endswith("n't") for w in words)


# ------------------------------------------------------------------------------------------------
# 1. Extraction


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (or `\\fbox{...}`), nested braces allowed. None if absent
    or empty. A box inside another box is read only as `\\boxed{\\boxed{X}}` (X); in
    `\\boxed{3 \\boxed{5}}` the last box is the outer one, which is no answer."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    content = _box_content(text, start)
    one_box = text.count("\\boxed") + text.count("\\fbox") == 1  # the usual case: no scan
    outer = None if one_box else _open_box_around(text, start)
    if outer is None or content is None:
        return content
    whole = _box_content(text, outer)
    alone = r"\\(?:boxed|fbox)\s*\{\s*" + re.escape(content) + r"\s*\}"
    return content if whole is not None and re.fullmatch(alone, whole) else None


def _open_box_around(text: str, start: int) -> int | None:
    """Where the outermost box still open at `start` begins, or None."""
    boxes, depth = [], 0  # (the brace depth it opened at, where it starts), innermost last
    for m in re.finditer(r"\\(?:boxed|fbox)\s*\{|[{}]", text[:start]):
        if m.group() == "}":
            depth -= 1
            if boxes and boxes[-1][0] == depth:
                boxes.pop()
        else:
            if m.group() != "{":
                boxes.append((depth, m.start()))
            depth += 1
    return boxes[0][1] if boxes else None


def box_end(text: str, start: int) -> int | None:
    """Where the box that starts at `start` ends (after its closing brace, or after the token of
    `\\boxed 5`); None if it has neither braces nor a space, or never closes."""
    i = start + (6 if text.startswith("\\boxed", start) else 5)
    if text.startswith(" ", i):  # `\boxed 5` (no braces), used by some MATH solutions
        return i + re.match(r" [^$\s]*", text[i:]).end()
    if not text.startswith("{", i):
        return None
    depth = 0
    for j in range(i, len(text)):  # a loop, not recursion: 10 000 nested braces must not crash
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return j + 1
    return None  # unbalanced


def _box_content(text: str, start: int) -> str | None:
    end = box_end(text, start)
    if end is None:
        return None
    i = start + (6 if text.startswith("\\boxed", start) else 5)
    braces = text.startswith("{", i)
    return text[i + 1 : end - 1 if braces else end].strip() or None


# ------------------------------------------------------------------------------------------------
# 2. Normalisation

# Unit words dropped after a number. Single letters (m, s, g) are left alone: they are often
# variables.
_UNITS = (
    "cm|mm|km|meters?|metres?|inch|inches|feet|foot|ft|units?|degrees?|dollars?|cents?|hours?|"
    "minutes?|seconds?|days?|weeks?|years?|mph|miles?|pounds?|square|sq|cubic"
)


# Words that change a value: never dropped as a unit ("5 thousand" is not 5, "3 squared" not 3),
# and never read as one in a GSM8K answer. Counts in words scale the number before them: a lakh is
# 100,000, a crore 10^7, a gross 144, a score 20, a grand 1,000, "5 tenths" is 0.5.
VALUE_WORDS = frozenset("""
    zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen
    sixteen seventeen eighteen nineteen twenty thirty forty fifty sixty seventy eighty ninety
    hundred hundreds thousand thousands million millions billion billions trillion trillions
    lakh lakhs lac lacs lakhs crore crores gross grosses score scores grand grands myriad googol
    dozen dozens half halves quarter quarters third thirds fourth fourths fifth fifths sixth sixths
    seventh sevenths eighth eighths ninth ninths tenth tenths hundredth hundredths thousandth
    thousandths millionth millionths twice double triple thrice times squared
    cubed factorial plus minus reciprocal reciprocals inverse inverses logarithm
""".split())
# Abbreviated scales: 3k, 2 bn, 5 mn (thousand, billion, million), any case: `3\\text{K}` is no 3
SCALE_ABBREVIATIONS = frozenset(["k", "bn", "mn", "mln", "bln"])


# Capital scale letters: 2M and 2B are two million and two billion (as in finance), never 2 of a
# unit; MM is a thousand thousand. A letter in brackets, (B), is a choice, not a scale.
_SCALE_LETTER = re.compile(r"(?<![A-Za-z(])(?:MM|M|B|Bn)(?![A-Za-z)])")


def has_value_word(text: str) -> bool:
    """Does the text hold a word of VALUE_WORDS or SCALE_ABBREVIATIONS, a capital scale letter (2M,
    2B), or any "-illion" or "-illionth" (quadrillion, zillion)? LaTeX command names are not
    words."""
    text = re.sub(r"\\[a-zA-Z]+", " ", text)
    words = re.findall(r"[a-z]+", text.lower())
    return _SCALE_LETTER.search(text) is not None or any(
        w in VALUE_WORDS or w in SCALE_ABBREVIATIONS or re.fullmatch(r"[a-z]*illion(?:th)?s?", w)
        for w in words)


def _unit(m: re.Match) -> str:
    """A \\text{} after the answer: a unit is dropped; a number, a hedge ("or 19",
    "approximately"), a word that changes the value ("thousand", "squared"), or words with more
    answer after them (`1\text{ to }2` must not become 12) are kept, which leaves the answer
    unreadable rather than wrong."""
    words = m.group(1)
    more = re.match(r"\s*[0-9A-Za-z\\(\[{]", m.string[m.end():])
    changes_value = has_value_word(words)
    keep = re.search(r"[0-9]", words) or has_hedge(words) or changes_value or more
    return f" {words} " if keep else ""


def _thousands(s: str) -> str:
    """1,000 is a number; (1,2) and 1,2 stay a tuple and a list."""
    return s.replace(",", "") if re.fullmatch(r"-?[0-9]{1,3}(,[0-9]{3})+(\.[0-9]+)?", s) else s


# Thousands grouped by an apostrophe, a space (thin or not, also `\\,`) or, two or more times, a
# period: 1'234'567, 1 234 567, 1.234.567. One period is a decimal point (1.234), and groups of
# other sizes (12 34, 1.23.456) are no number.
_GROUPS = re.compile(r"(?<![0-9.,'])[0-9]{1,3}(?:(?:'[0-9]{3})+|(?:\.[0-9]{3}){2,}"
                     r"|(?:(?:\s|\\[,;: ]|~)+[0-9]{3})+)(?![0-9]|[.'][0-9])")


def digit_groups(s: str) -> str:
    """A number written with thousands separators other than a comma, as plain digits."""
    return _GROUPS.sub(lambda m: re.sub(r"[^0-9]", "", m[0]), s)


# 3e5, 3E+05, 1.5e-3: scientific notation. With a sign and a small e, `2e-1` stays Euler's number
# minus 1, unless a decimal point or a leading zero says otherwise (1.5e-3, 2e-01).
_SCIENTIFIC = re.compile(r"(?<![0-9A-Za-z_.\\])([0-9]+(?:\.[0-9]*)?|\.[0-9]+)([eE])([+-]?)"
                         r"([0-9]{1,4})(?![0-9A-Za-z_.^])")


def _scientific(m: re.Match) -> str:
    mantissa, e, sign, exponent = m.groups()
    if sign and e == "e" and "." not in mantissa and not exponent.startswith("0"):
        return m[0]
    return f"{mantissa}\\times10^{{{sign.replace('+', '')}{int(exponent)}}}"


_INFIX = re.compile(r"\\(over|choose)(?![a-zA-Z])")


def _infix_fractions(s: str) -> str:
    """TeX's older infix commands: `{a \\over b}` is \\frac{a}{b} and `{n \\choose k}` is
    \\binom{n}{k}, each taking the whole group it stands in (or the whole answer)."""
    for _ in range(8):  # a few per answer; more are left unread (the parser refuses them)
        m = _INFIX.search(s)
        if m is None:
            break
        start, depth = m.start(), 0
        while start > 0 and not (s[start - 1] == "{" and depth == 0):
            depth += {"}": 1, "{": -1}.get(s[start - 1], 0)
            start -= 1
        end, depth = m.end(), 0
        while end < len(s) and not (s[end] == "}" and depth == 0):
            depth += {"{": 1, "}": -1}.get(s[end], 0)
            end += 1
        command = "\\frac" if m[1] == "over" else "\\binom"
        whole = f"{command}{{{s[start:m.start()].strip()}}}{{{s[m.end():end].strip()}}}"
        if 0 < start and end < len(s):  # the group's braces go: 2{1 \\over 2} is 2\\frac12
            start, end = start - 1, end + 1
        s = s[:start] + whole + s[end:]
    return s


def normalize(s: str) -> str:
    """Rewrite a LaTeX answer into a canonical string (equal answers -> usually equal strings)."""
    # `32, 349` is a list of two numbers: a comma followed by a space never groups thousands
    spaced = re.search(r",\s", s) is not None
    s = unicode_math(ascii_lookalikes(s)).strip().replace("\n", " ")
    # matrix row separator, before `\ ` below eats one of the backslashes
    s = s.replace("\\\\", ";")
    # sized delimiters are their delimiter: \Big( is (, \bigl\{ is \{; \lvert x \rvert is |x|
    s = re.sub(r"\\(?:left|right|middle|[bB]igg?[lrm]?)(?:\.|(?![a-zA-Z]))", "", s)
    s = re.sub(r"\\[lr]?vert(?![a-zA-Z])", "|", s)
    s = digit_groups(s).replace("{,}", ",")  # 1 234 567, 1'234'567, 1.234.567; 1{,}000
    s = _SCIENTIFIC.sub(_scientific, s)
    s = re.sub(r"(?<=[0-9])\s+[xX]\s+(?=10\s*\^)", r"\\times ", s)  # 3 x 10^5
    # one symbol for each relation: \ge, \geq, >= and ≥ are \geq
    for pattern, symbol in ((r"\\geq?(?![a-zA-Z])|>=", r"\\geq "),
                            (r"\\leq?(?![a-zA-Z])|<=", r"\\leq "),
                            (r"\\neq?(?![a-zA-Z])|!=", r"\\neq "), (r"\\lt(?![a-zA-Z])", "<"),
                            (r"\\gt(?![a-zA-Z])", ">")):
        s = re.sub(pattern, symbol, s)
    # [\begin{array}{cc} ... \end{array}] is a matrix; Euler's \mathrm{e} and \mathrm{i} are e, i
    s = re.sub(r"[\[(]?\s*\\begin\{array\}\{[^{}]*\}(.*?)\\end\{array\}\s*[\])]?",
               r"\\begin{pmatrix}\1\\end{pmatrix}", s)
    s = re.sub(r"\\mathrm\s*\{([ei])\}", r"\1", s)
    # {x | x > 3}, {x : x > 3}, {x \in R \mid x > 3}: the set of the x that meet the condition is
    # the condition (an inequality is compared as its solution set)
    m = re.fullmatch(r"\s*\\\{\s*([a-zA-Z])\s*(?:\\in\s*\\mathbb\s*\{R\}\s*)?"
                     r"(?:\\mid(?![a-zA-Z])|\||:)(.*)\\\}\s*", s)
    if m and re.search(rf"(?<![a-zA-Z\\]){m[1]}(?![a-zA-Z])", m[2]):
        s = m[2]
    s = re.sub(r"\\mathbb\s*\{R\}", r"(-\\infty,\\infty)", s)  # the reals, as an interval
    s = re.sub(r"\\backslash(?![a-zA-Z])", r"\\setminus ", s)
    # `x<-1 \text{ or } x>2` is the union of two solution sets, where `3 \text{ or } 4` is a list
    if re.search(r"[<>]|\\[gl]eq", s):
        s = re.sub(r"\\text\s*\{\s*or\s*\}|\\(?:lor|vee)(?![a-zA-Z])|(?<=[0-9a-zA-Z}])\s+or\s+",
                   r"\\cup ", s)
    s = re.sub(r"\\(?:mbox|textbf|textrm|mathrm|mathbf|textnormal)(?![a-zA-Z])", r"\\text", s)
    # `3 \text{ or } 4` and `3 \quad 4` are the list 3, 4 (deleting them would make 34)
    s = re.sub(r"\\text\s*\{\s*(?:or|and)\s*\}|\\q?quad(?![a-zA-Z])", ",", s)
    s = re.sub(r",\s*and\s+", ",", s)  # `19, 46, and 82` too
    s = re.sub(r",(\s*,)+", ",", s)  # `3, 5, \text{ and } 7` is 3, 5, 7
    s = re.sub(r"\\[!,;:> ]|~", " ", s)
    s = re.sub(r"\\(?:[dtcs]|nice)frac(?![a-zA-Z])", r"\\frac", s)
    s = re.sub(r"\\[dt]binom(?![a-zA-Z])", r"\\binom", s)
    s = _infix_fractions(re.sub(r"\\displaystyle(?![a-zA-Z])", "", s))
    # \operatorname{arccot} is \arccot; \sin^{-1} is the inverse function \arcsin, not 1/\sin
    s = re.sub(r"\\operatorname\*?\s*\{\s*([a-z]+)\s*\}", r"\\\1 ", s)
    s = re.sub(r"\\(sin|cos|tan|cot|sec|csc)\s*\^\s*(?:\{\s*-\s*1\s*\}|-\s*1(?![0-9]))",
               r"\\arc\1 ", s)
    # \sin 30^\circ is sin(30 pi / 180): the degree sign means something inside a function
    s = re.sub(r"(\\(?:sin|cos|tan|cot|sec|csc))\s*(\(?)\s*([0-9]+(?:\.[0-9]+)?)\s*"
               r"(?:\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|\\degree|°)\s*(\)?)",
               lambda m: (f"{m[1]}({m[3]}\\pi/180)" if bool(m[2]) == bool(m[4])
                          else m[0]), s)
    s = re.sub(r"\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|\\circ|\\degree|°", "", s)
    s = re.sub(r"\\?\$|\\?%", "", s)
    m = re.fullmatch(r"\s*\\text\{([^{}]*)\}\s*", s)
    if m:  # the whole answer is text, e.g. \text{Evelyn} or \text{(B)}
        s = m.group(1)
    # \text after something else is a unit (5\text{ cm}^2); anything left in \text{} is plain words
    s = re.sub(r"(?<=\S)\s*\\text\{([^{}]*)\}(?:\^\{?[0-9]\}?)?", _unit, s)
    s = re.sub(r"\\text\{([^{}]*)\}", r"\1", s)
    s = re.sub(rf"(?<=[0-9}}])\s*(?:{_UNITS})(\^\{{?[0-9]\}}?)?\s*$", "", s)
    # Spaces go, except between a command and a letter (`\cot x` must not become `\cotx`), and
    # between two digits: `12 34` is two numbers, which the parser refuses, not 1234
    s = re.sub(r"(\\[a-zA-Z]+)\s+(?=[a-zA-Z])|(?<=[0-9])(\s)\s*(?=[0-9])|\s+",
               lambda m: m[1] + " " if m[1] else m[2] or "", s)
    s = s.rstrip(".").rstrip().strip(",").rstrip("\\")  # `185\` is 185
    s = s if spaced else _thousands(s)
    s = re.sub(r"(?<![0-9])\.(?=[0-9])", "0.", s)  # .5 -> 0.5
    s = re.sub(r"(?<!\\log)_\{([0-9]+)\}", r"_\1", s)  # 4210_{5} -> 4210_5, but \log_{10} stays
    m = re.fullmatch(r"\(([A-Za-z])\)", s)  # multiple choice: (B) -> B
    if m:
        s = m.group(1).upper()
    # a mixed number, alone or in a tuple or after `x =`: 1\frac{4}{5} is 1 + 4/5, not 1 * 4/5
    s = _MIXED.sub(_mixed, s)
    s = _REPEATING.sub(_repeating, s)
    # (x,y)=(1,2) and f(x)=2x+1 name their value: (1,2) and 2x+1
    # 5 \geq x needs no rewriting here: inequalities are compared as solution sets (_real_set)
    return re.sub(r"^\([a-z](?:,[a-z])+\)=(?=[(\[])|^[a-zA-Z]\([a-z]\)=(?=.)", "", s)


# a whole number right before a numeric \frac, at the start of the answer or of an element
_MIXED = re.compile(r"(?:^|(?<=[(\[{,=;]))(-?)([0-9]+)\\frac(?:\{([0-9]+)\}|([0-9]))"
                    r"(?:\{([0-9]+)\}|([0-9]))(?![0-9])")
# 0.(3) and 0.1\overline{6}: repeating decimals, as exact fractions
_REPEATING = re.compile(r"(?<![0-9.])(-?)([0-9]*)\.([0-9]*)(?:\(([0-9]+)\)|\\overline\{([0-9]+)\})")


def _mixed(m: re.Match) -> str:
    sign, whole = m.group(1), int(m.group(2))
    num, den = int(m.group(3) or m.group(4)), int(m.group(5) or m.group(6))
    return f"{sign}\\frac{{{whole * den + num}}}{{{den}}}"


def _repeating(m: re.Match) -> str:
    sign, whole, fixed = m.group(1), m.group(2) or "0", m.group(3)
    period = m.group(4) or m.group(5)
    value = (Fraction(int(whole)) + Fraction(int(fixed or "0"), 10 ** len(fixed))
             + Fraction(int(period), (10 ** len(period) - 1) * 10 ** len(fixed)))
    return f"{sign}\\frac{{{value.numerator}}}{{{value.denominator}}}"


# ------------------------------------------------------------------------------------------------
# 3. Structure: tuples, intervals, sets, unions, matrices, +-, equations


def _top_level_split(s: str, sep: str) -> list[str]:
    """Split on `sep` outside of any brackets."""
    parts, depth, last, i = [], 0, 0, 0
    while i < len(s):
        c = s[i]
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif depth == 0 and s.startswith(sep, i):
            parts.append(s[last:i])
            last = i + len(sep)
            i = last
            continue
        i += 1
    return parts + [s[last:]]


def _is_one_group(s: str) -> bool:
    """True if s[0] opens a bracket that closes exactly at s[-1] (any mix of () and [], for
    intervals)."""
    depth = 0
    for i, c in enumerate(s):
        depth += 1 if c in "([{" else -1 if c in ")]}" else 0
        if depth == 0:
            return i == len(s) - 1
    return False


def _expand_pm(items: list[str]) -> list[str]:
    """`1\\pm\\sqrt2` means the two answers 1+\\sqrt2 and 1-\\sqrt2."""
    out = []
    for x in items:
        if x.count("\\pm") == 1:
            out += [x.replace("\\pm", "+"), x.replace("\\pm", "-")]
        else:
            out.append(x)
    return out


def _split(s: str) -> tuple:
    """(kind, parts): kind is matrix, union, diff (a set difference), set (unordered), tuple
    (ordered, with its brackets), ineq, eq or scalar."""
    # a vmatrix is a determinant, a number: it is no matrix, and is not evaluated here
    m = re.fullmatch(r"\\begin\{([pbB]?matrix)\}(.*)\\end\{\1\}", s)
    if m:
        rows = [r.split("&") for r in m.group(2).strip(";").split(";")]
        return "matrix", rows
    if len(parts := _top_level_split(s, "\\cup")) > 1:
        return "union", parts
    if len(parts := _top_level_split(s, "\\setminus")) == 2:  # \mathbb{R} \setminus \{0\}
        return "diff", parts
    if s.startswith("\\{") and s.endswith("\\}"):
        return "set", _expand_pm(_top_level_split(s[2:-2], ","))
    if s[:1] == "{" and _is_one_group(s) and len(parts := _top_level_split(s[1:-1], ",")) > 1:
        return "set", _expand_pm(parts)  # {-3, 3}: TeX braces only group, so this is the list -3, 3
    if s[:1] in "([" and s[-1:] in ")]" and _is_one_group(s):
        inner = _top_level_split(s[1:-1], ",")
        if len(inner) > 1:
            return "tuple", (s[0] + s[-1], inner)
    if len(parts := _top_level_split(s, ",")) > 1 or "\\pm" in s:
        parts = _expand_pm(parts)
        if len(parts) > 1:  # "3, 5, 7": a list of all solutions, order does not matter
            return "set", parts
    if (chain := _relations(s)) is not None:
        return "ineq", chain
    if len(parts := _top_level_split(s, "=")) == 2:
        return "eq", parts
    return "scalar", s


def _relations(s: str) -> tuple[list[str], list[str]] | None:
    """`-1<x\\leq3` -> (["<", "\\leq"], ["-1", "x", "3"]): a chain of inequalities outside any
    brackets, else None."""
    if not re.search(r"[<>]|\\[gln]eq", s):  # most answers: _split runs on every grade
        return None
    ops, parts, depth, last = [], [], 0, 0
    for m in re.finditer(r"[([{]|[)\]}]|\\[gln]eq(?![a-zA-Z])|<|>", s):
        if m.group() in "([{":
            depth += 1
        elif m.group() in ")]}":
            depth -= 1
        elif depth == 0:
            ops.append(m.group())
            parts.append(s[last:m.start()].strip())
            last = m.end()
    parts.append(s[last:].strip())
    if "\\neq" in ops and len(ops) > 1:  # x \neq 2 alone is a set; in a chain it is no order
        return None
    return (ops, parts) if ops and all(parts) and "=" not in s else None


# A variable that names an answer: x, y_1, \theta (not a constant such as \pi, e or i)
_LABEL = (r"(?!\\(?:pi|infty|infinity)(?![a-zA-Z])|[ei](?![a-zA-Z_]))"
          r"(?:[a-zA-Z]|\\[a-zA-Z]+)(?:_\{?[a-zA-Z0-9]+\}?)?")


def _assignment(s: str) -> tuple[str, str] | None:
    """`x=5`, `x\\in[1,2]` or `5=x` -> ("x", "5"): one variable named on one side of the only "=".
    Else None."""
    if "=" in s and len(_top_level_split(s, "=")) != 2:  # \sum_{k=1}^{n}k names no k
        return None
    if m := re.fullmatch(rf"({_LABEL})(?:=|\\in(?![a-zA-Z]))([^=]+)", s):
        return m.group(1), m.group(2)
    if m := re.fullmatch(rf"([^=]+)=({_LABEL})", s):
        return m.group(2), m.group(1)
    return None


def _label_of_a_value(s: str) -> bool:
    """`|AB|=1`, `V_{1}:V_{2}=11:21`, `\\frac{NO}{BO}=...`: one "=", a value on the right and on the
    left a name (letters, bars, ratios, subscripts), not an equation such as `a+3z=0`."""
    if s.count("=") != 1:
        return False
    left, right = s.split("=")
    name = re.sub(r"_\{?[0-9]+\}?", "", left)
    return not _has_variables(right) and not re.search(r"[0-9+\-*/^.]", name)


def _has_variables(s: str) -> bool:
    """Does a normalised answer name a variable (a letter other than the constants e and i)?"""
    return re.search(r"[a-df-hj-zA-Z]", re.sub(r"\\[a-zA-Z]+", "", s)) is not None


def _assigned_tuple(parts: list[str]) -> list[str] | None:
    """`x=1, y=2` -> ["1", "2"]: the values of distinct assigned variables in alphabetical order,
    else None."""
    pairs = [_assignment(p) for p in parts]
    if None in pairs or len({name for name, _ in pairs}) != len(pairs):
        return None
    return [value for _, value in sorted(pairs)]


# Units a gold may name: each name's dimension and size in that dimension's base unit, exact. A
# value with a unit is compared with a gold that names one in the same dimension (5 km is 5000 m).
_UNIT_TABLE = [
    ("km kilometer kilometers kilometre kilometres", "m", 1000),
    ("m meter meters metre metres", "m", 1), ("cm centimeter centimeters centimetre centimetres",
                                              "m", Fraction(1, 100)),
    ("mm millimeter millimeters millimetre millimetres", "m", Fraction(1, 1000)),
    ("nm nanometer nanometers nanometre nanometres", "m", Fraction(1, 10**9)),
    ("kg kilogram kilograms", "g", 1000), ("g gram grams", "g", 1),
    ("mg milligram milligrams", "g", Fraction(1, 1000)),
    ("s sec secs second seconds", "s", 1), ("ms millisecond milliseconds", "s", Fraction(1, 1000)),
    ("min mins minute minutes", "s", 60), ("h hr hrs hour hours", "s", 3600),
    ("J joule joules", "J", 1), ("kJ", "J", 1000), ("eV", "eV", 1), ("keV", "eV", 1000),
    ("MeV", "eV", 10**6), ("GeV", "eV", 10**9), ("W watt watts", "W", 1), ("kW", "W", 1000),
    ("Hz", "Hz", 1), ("kHz", "Hz", 1000), ("MHz", "Hz", 10**6), ("GHz", "Hz", 10**9),
    ("N newton newtons", "N", 1), ("Pa", "Pa", 1), ("kPa", "Pa", 1000),
    ("L liter liters litre litres", "L", 1), ("mL", "L", Fraction(1, 1000)), ("K kelvin", "K", 1),
]
UNITS = {name: (dimension, Fraction(size)) for names, dimension, size in _UNIT_TABLE
         for name in names.split()}
# A value, then a unit: `4.5 \mathrm{~km}`, `5\text{ km}`, `3 \times 10^{8} \mathrm{~m/s}`, `5 km`
_MEASURE = re.compile(r"(.*?[0-9}])((?:\s|~|\\[,;:! ]|/"
                      r"|\\(?:text|mathrm|mbox|textrm|rm)\s*\{[^{}]*\}"
                      r"|(?<![A-Za-z\\])[A-Za-z]+)+)")


def measure(s: str) -> tuple[str, str, Fraction] | None:
    """(value, dimension, size) of an answer that is one value and a unit of UNITS ("4.5 km" ->
    ("4.5", "m", 1000); "m/s" is a unit too), else None."""
    if len(s) > 200:  # a value and its unit are short; the scan stays cheap on a long answer
        return None
    m = _MEASURE.fullmatch(ascii_lookalikes(s).strip().rstrip("."))
    if m is None or "," in m[1] or "=" in m[1]:
        return None
    unit = re.sub(r"\\(?:text|mathrm|mbox|textrm|rm)|\\[,;:! ]|[{}~\s]", "", m[2])
    parts = [UNITS.get(p) for p in unit.split("/")]
    if not unit or len(parts) > 2 or None in parts:
        return None
    dimension = "/".join(d for d, _ in parts)
    size = parts[0][1] / (parts[1][1] if len(parts) == 2 else 1)
    return m[1].strip(), dimension, size


def _frac_tex(x: Fraction) -> str:
    return f"\\frac{{{x.numerator}}}{{{x.denominator}}}"


def in_gold_units(pred: str, gold: str) -> tuple[str, str] | None:
    """When the answer and the gold both name a unit of UNITS: (the answer's value in the gold's
    unit, the gold's value), or ("", gold) for units of two dimensions, which never agree. Else
    None: a unit on one side only is graded as before (a unit the gold does not name is dropped)."""
    g = measure(gold)
    p = None if g is None else measure(pred)
    if p is None:
        return None
    if p[1] != g[1]:
        return "", gold
    value = p[0] if p[2] == g[2] else f"({p[0]})\\cdot{_frac_tex(p[2] / g[2])}"
    return value, g[0]


# A multiple-choice letter, (A) to (E), in a text command or bare, at the start of an answer:
# `\textbf{(C)}\ 27`, `\textbf{(C) }27`, `\text{(C) } 27`, `(C)~27`
_CHOICE = re.compile(r"\s*(?:\\(?:textbf|text|mathrm|mathbf|textrm|mbox)\s*\{\s*)?\(([A-E])\)"
                     r"((?:\s|~|:|\\[,;:! ]|\\q?quad(?![a-zA-Z]))*)(.*)", re.DOTALL)


def choice(s: str) -> tuple[str, str] | None:
    """(letter, value) of an answer that starts with a choice letter: `\\textbf{(C)}\\ 27` ->
    ("C", "27"), `\\textbf{(C) 27}` -> ("C", "27"), `(C)` -> ("C", ""). Else None."""
    m = _CHOICE.fullmatch(s)
    if m is None:
        return None
    wrapped = re.match(r"\s*\\[a-z]+\s*\{", s) is not None
    value = m[3].strip()
    if wrapped:  # the command's brace closes after the letter or after the value
        if value.startswith("}"):
            value = value[1:].strip()
        elif value.endswith("}") and value.count("}") > value.count("{"):
            value = value[:-1].strip()
        else:
            return None
    return m[1], value


def _choice_answer(pred: str, gold: str) -> str | None:
    """The answer a choice letter stands beside: its value, where the gold is a value (the letter's
    value is unknown without the choices); the letter, where the gold is a letter."""
    picked = choice(pred)
    if picked is None:
        return None
    letter, value = picked
    gold_letter = choice(gold) or (
        (gold.strip(), "") if re.fullmatch(r"\s*[A-E]\s*", gold) else None)
    if gold_letter is not None:
        return letter
    return value or letter


# A hexadecimal, binary or octal literal (0x12 is no 0 * x * 12) and a number with two decimal
# points (1.5.2, the European 1.000.000): malformed numbers, which no reading makes right
MALFORMED_NUMBER = re.compile(r"(?<![0-9A-Za-z_.])0[xXbBoO][0-9A-Fa-f]|[0-9]\.[0-9]*\.[0-9]")


def math_equal(pred: str | None, gold: str) -> bool:
    """Is the extracted answer `pred` equivalent to `gold`? Both are raw LaTeX answer strings."""
    if pred is None or len(pred) > 4 * MAX_LEN:
        return False
    if MALFORMED_NUMBER.search(digit_groups(pred)):  # 1.5.2, but 1.234.567 is a million and more
        return False
    if (picked := _choice_answer(pred, gold)) is not None:  # \textbf{(C)}\ 27: the value decides
        pred = picked
        gold = choice(gold)[0] if choice(gold) else gold
    if (converted := in_gold_units(pred, gold)) is not None:  # 5 km for the gold 5000 m
        pred, gold = converted
        if not pred:
            return False
    a, b = normalize(pred), normalize(gold)
    if a == b:
        return a != ""
    if not a or len(a) > MAX_LEN or len(b) > MAX_LEN:
        return False
    grade = Grade(TIMEOUT_S)
    try:
        return _equal(a, b, grade)
    finally:
        count_grade(grade)


def _equal(a: str, b: str, grade: Grade) -> bool:
    """Is the (normalised) answer a equal to the (normalised) gold b? The order matters for
    names."""
    if a == b:
        return True
    gold, pred = _assignment(b), _assignment(a)
    if gold is not None and not _has_variables(gold[1]):  # the gold x = 5 names its value
        if pred is not None:
            # y=5 is not x=5
            return pred[0] == gold[0] and _equal(_thousands(pred[1]), _thousands(gold[1]), grade)
        b = _thousands(gold[1])
    elif gold is None and pred is not None and _split(b)[0] != "eq":  # y = 2x+3 for the gold 2x+3
        a = _thousands(pred[1])
    elif gold is None and "=" not in a and _label_of_a_value(b):
        b = _thousands(b.split("=")[1])  # |AB|=1, V_1:V_2=11:21: the gold's label names its value
    if a == b:
        return True
    (ka, pa), (kb, pb) = _split(a), _split(b)
    if ka == "set" and kb == "set" and _assigned_tuple(pb) is not None and not any(
            _assignment(x) for x in pa):
        # the values alone of a gold that names them (x=1, y=2) are read in the gold's order: 1, 2
        ka, pa, kb, pb = "tuple", ("()", pa), "tuple", ("()", [_assignment(y)[1] for y in pb])
    elif ka == "set" and kb == "tuple" and (values := _assigned_tuple(pa)) is not None:
        ka, pa = "tuple", ("()", values)  # x=1, y=2 is the point (1,2)
    elif ka == "tuple" and kb == "set" and (values := _assigned_tuple(pb)) is not None:
        kb, pb = "tuple", ("()", values)
    if _solution_set(ka, pa) or _solution_set(kb, pb):
        # -x>-1 is x<1, -1<x<3 is the interval (-1,3), \mathbb{R}\setminus\{0\} is two intervals
        sa, sb = _real_set(ka, pa, gold=False), _real_set(kb, pb, gold=True)
        return sa is not None and sb is not None and _worker_equal(sa, sb, False, 0, grade)
    if ka != kb:
        return False
    if ka == "scalar":
        return _equal_scalar(pa, pb, grade)
    if ka == "eq":
        return _equal_equation(pa, pb, grade)
    if ka == "tuple":
        (brackets_a, pa), (brackets_b, pb) = pa, pb
        if brackets_a != brackets_b:  # [1,2) is not (1,2)
            return False
    if ka == "matrix":
        if [len(r) for r in pa] != [len(r) for r in pb]:
            return False
        pa, pb = sum(pa, []), sum(pb, [])
    if len(pa) != len(pb) or len(pa) > MAX_ITEMS:
        return False
    if ka in ("tuple", "matrix"):
        return all(_equal(x, y, grade) for x, y in zip(pa, pb))
    unmatched = list(pb)  # set/union: each element must match a different gold element
    for x in pa:
        hit = next((i for i, y in enumerate(unmatched) if _equal(x, y, grade)), None)
        if hit is None:
            return False
        unmatched.pop(hit)
    return True


def _solution_set(kind: str, parts) -> bool:
    """Is an answer of this kind a set of reals given by a condition or an operation: an inequality,
    a set difference, or a union with an inequality in it (`x<-1 \\text{ or } x>2`)?"""
    return kind in ("ineq", "diff") or (
        kind == "union" and any(_relations(p) is not None for p in parts))


def _real_set(kind: str, parts, gold: bool) -> list | None:
    """An inequality chain, an interval or a union of intervals as a set AST for the worker, else
    None. A gold (1,2) may be a point, so a gold is read as an interval only where its brackets or
    an infinite end say so ([1,2), (-\\infty,3)); an answer (1,2) against a gold inequality is
    one."""
    try:
        if kind == "ineq":
            ops, exprs = parts
            return ["ineq", ops, [parse(e) for e in exprs]]
        if kind == "union":  # (1,2) in a union is an interval, never a point
            intervals = [_real_set(*_split(p), gold=False) for p in parts]
            return None if None in intervals else ["union", *intervals]
        if kind == "diff":  # \setminus takes away an interval or a finite set of points
            whole, (k, minus) = _real_set(*_split(parts[0]), gold=False), _split(parts[1])
            taken = ["finite", *map(parse, minus)] if k == "set" else (
                ["finite", parse(minus)] if k == "scalar" else _real_set(k, minus, gold=False))
            return None if None in (whole, taken) else ["diff", whole, taken]
        if kind == "tuple" and len(parts[1]) == 2:
            brackets, (lo, hi) = parts
            if gold and brackets == "()" and "\\infty" not in lo + hi:
                return None
            return ["interval", brackets[0] == "[", parse(lo), parse(hi), brackets[1] == "]"]
    except ParseError:
        pass
    return None


def _equal_scalar(a: str, b: str, grade: Grade) -> bool:
    if re.fullmatch(r"[a-zA-Z]{2,}", a) and re.fullmatch(r"[a-zA-Z]{2,}", b):
        return a.lower() == b.lower()  # words (names, directions), not products of symbols
    try:
        ta, tb = parse(a), parse(b)
    except ParseError:
        # off the whitelist (e.g. base-n numbers like 204_5): only string equality counts
        return False
    try:
        fa, fb = _rational_or_none(ta), _rational_or_none(tb)
    except (ParseError, ZeroDivisionError, OverflowError, ValueError):
        return False
    if fa is not None and fb is not None:
        return fa == fb  # exact, and no sympy needed for plain numbers
    # CRUCIAL: a tolerance only for a plain decimal number the model wrote (1.4142135623730951 vs
    # \sqrt2), within a unit of its last decimal place; anything else exactly, so 10^{15}+\sqrt2 is
    # not 10^{15}, not even written 10^{15}+\sqrt2+0.0, nor 10^{15}+0.5
    decimal = re.fullmatch(r"-?[0-9]*\.([0-9]+)", a) if fa is not None else None
    return _worker_equal(ta, tb, False, len(decimal[1]) if decimal else 0, grade)


def _worker_equal(a, b, equation: bool, approx: int, grade: Grade) -> bool:
    """sympy_equal in a worker of the pool, within the grade's budget. A time limit on the whole
    grade (common/env/timelimit.py) is held meanwhile, so that it never cuts a request from its
    reply: the worker's budget bounds this part."""
    with paused():
        return _POOL.equal(a, b, equation, approx, grade)


def _rational_or_none(node) -> Fraction | None:
    try:
        return to_fraction(node)
    except _NotRational:
        return None


def _equal_equation(a: list, b: list, grade: Grade) -> bool:
    """Equations are equal if lhs - rhs agree up to a nonzero constant factor (2x=4 vs x-2=0)."""
    try:
        ta, tb = (["+", parse(lhs), ["neg", parse(rhs)]] for lhs, rhs in (a, b))
    except ParseError:
        return False
    return _worker_equal(ta, tb, True, 0, grade)


def _plain_value(s: str) -> str:
    """An answer without the unit of UNITS it ends with, if any."""
    m = measure(s)
    return m[0] if m else s


# A decimal gold and its exponent: 1.2, 0.050, 1.2\times10^{6}, 3\cdot10^8 (after normalize)
_FIGURES = re.compile(r"(-?[0-9]+)(?:\.([0-9]+))?"
                      r"(?:\\(?:times|cdot)10\^(?:\{(-?[0-9]{1,3})\}|([0-9])))?")


def within_figures(pred: str, gold: str) -> bool:
    """Minerva's rule for a gold written as a decimal or in scientific notation: the answer's value
    is within half a unit of the gold's last written digit, so it rounds to the gold at the gold's
    significant figures (1.23e6 and 1.24e6 for the gold 1.2e6, not 1.26e6; 1/3 for 0.33). Units
    as math_equal reads them (5 km for 5000 m). An integer gold without an exponent is exact."""
    converted = in_gold_units(pred, gold)
    if converted is not None and not converted[0]:
        return False
    pred, gold = converted or (_plain_value(pred), _plain_value(gold))
    m = _FIGURES.fullmatch(normalize(gold))
    if m is None or (m[2] is None and m[3] is None and m[4] is None):
        return False
    exponent = int(m[3] or m[4] or 0)
    places = len(m[2] or "")
    gold_value = Fraction(m[1] + "." + (m[2] or "0")) * Fraction(10) ** exponent
    half_unit = Fraction(1, 2) * Fraction(10) ** (exponent - places)
    try:
        value = _rational_or_none(parse(normalize(pred)))
    except (ParseError, ZeroDivisionError, OverflowError, ValueError):
        return False
    return value is not None and abs(value - gold_value) <= half_unit


def float_value(s: str) -> float | None:
    """The value of a normalised answer as a float, from the whitelisted parser's AST (pi, e,
    roots, logs, trigonometric functions), or None if it has symbols or no finite real value."""
    try:
        value = _float(parse(s))
    except (ParseError, ValueError, OverflowError, ZeroDivisionError, TypeError):
        return None
    return value if isinstance(value, float) and math.isfinite(value) else None


_FLOAT_FUNCS = {"sin": math.sin, "cos": math.cos, "tan": math.tan, "ln": math.log, "log": math.log,
                "exp": math.exp, "arcsin": math.asin, "arccos": math.acos, "arctan": math.atan}


def _float(node) -> float:
    op, args = node[0], node[1:]
    if op == "num":
        return float(Fraction(args[0]))
    if op == "const" and args[0] in ("pi", "E"):
        return math.pi if args[0] == "pi" else math.e
    if op == "+":
        return math.fsum(_float(a) for a in args)
    if op == "*":
        return math.prod(_float(a) for a in args)
    if op == "neg":
        return -_float(args[0])
    if op == "inv":
        return 1 / _float(args[0])
    if op == "^":
        return float(math.pow(_float(args[0]), _float(args[1])))
    if op == "sqrt":
        n = 2.0 if args[1] is None else _float(args[1])
        x = _float(args[0])
        return math.copysign(abs(x) ** (1 / n), x) if n % 2 == 1 else math.sqrt(x) ** (2 / n)
    if op == "fn" and args[0] in _FLOAT_FUNCS:
        return _FLOAT_FUNCS[args[0]](_float(args[1]))
    if op == "log":
        return math.log(_float(args[0]), _float(args[1]))
    if op == "abs":
        return abs(_float(args[0]))
    raise ValueError(f"no float value for {op}")


# ------------------------------------------------------------------------------------------------
# 4. A whitelisted LaTeX parser -> AST of nested lists (JSON-safe, so it can be sent to the worker)
#   ["num", "3.5"] ["sym", "x"] ["const", "pi"|"oo"|"I"|"E"] ["+", a, b, ...] ["*", a, b, ...]
#   ["neg", a] ["inv", a] ["^", base, exp] ["sqrt", a, index|None] ["fn", "sin", a] ["log", a, base]
# ["!", a]   ["binom", n, k]   ["abs", a]   ["idx", "F", n] (F_{n-1})   ["sum", "k", lo, hi, body]
# Set ASTs (for inequalities and intervals): ["ineq", [op, ...], [a, ...]] ["interval", closed_left,
# lo, hi, closed_right] ["union", set, ...] ["diff", set, set] ["finite", a, ...]


class ParseError(ValueError):
    pass


class _NotRational(Exception):
    pass


_TOKEN = re.compile(r"[0-9]+(?:\.[0-9]*)?|\.[0-9]+|\\[a-zA-Z]+|\\[{}]|\S")
_CONSTS = {"\\pi": "pi", "\\infty": "oo", "\\infinity": "oo"}
_FUNCS = {"\\" + f for f in
          "sin cos tan cot sec csc ln log exp arcsin arccos arctan arccot arcsec arccsc".split()}
_GREEK = {"\\" + g for g in
          "alpha beta gamma delta epsilon theta lambda mu rho sigma tau phi omega".split()}
_CLOSE = {"(": ")", "[": "]", "{": "}"}


def _is_number(t: str) -> bool:
    return t[0] in "0123456789."


def _is_letter(t: str) -> bool:
    return len(t) == 1 and t.isascii() and t.isalpha()


def parse(s: str) -> list:
    """Parse a normalised LaTeX expression into an AST; raise ParseError on anything off the
    whitelist."""
    if len(s) > MAX_LEN:
        raise ParseError("too long")
    return _Parser(s).parse()


class _Parser:
    def __init__(self, s: str):
        self.toks, self.i, self.depth = _TOKEN.findall(s), 0, 0

    def peek(self):
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self):
        t = self.peek()
        if t is None:
            raise ParseError("unexpected end")
        self.i += 1
        return t

    def expect(self, t):
        if self.take() != t:
            raise ParseError(f"expected {t}")

    def parse(self):
        node = self.expr()
        if self.peek() is not None:
            raise ParseError(f"unexpected {self.peek()!r}")
        return node

    def expr(self):  # term (+|- term)*
        terms = [self.term()]
        while self.peek() in ("+", "-"):
            op = self.take()
            terms.append(self.term() if op == "+" else ["neg", self.term()])
        return terms[0] if len(terms) == 1 else ["+", *terms]

    def term(self):  # unary ((*|/|implicit) power)*
        factors = [self.unary()]
        while True:
            t = self.peek()
            if t in ("*", "\\cdot", "\\times"):
                self.take()
                factors.append(self.unary())
            elif t in ("/", "\\div"):
                self.take()
                factors.append(["inv", self.unary()])
            elif self.starts_atom(t):  # 2x, 2\sqrt{3}, (a+5)(b+2)
                if _is_number(t) and _is_number(self.toks[self.i - 1]):
                    # 1.5.2 and 1.000.000 are no numbers, not the products 1.5 * .2 and 1 * 0
                    raise ParseError(f"a number with two decimal points: {t!r}")
                factors.append(self.power())
            else:
                return factors[0] if len(factors) == 1 else ["*", *factors]

    def unary(self):
        negative = False
        while self.peek() in ("+", "-"):  # a loop, so "- - - - 1" does not recurse
            negative ^= self.take() == "-"
        node = self.power()
        return ["neg", node] if negative else node

    def power(self):  # atom ! * (^ arg)?
        node = self.atom()
        while self.peek() == "!":
            self.take()
            node = ["!", node]
        if self.peek() == "^":
            self.take()
            if self.peek() == "-":  # x^-1
                self.take()
                return ["^", node, ["neg", self.arg()]]
            return ["^", node, self.arg()]
        return node

    def starts_atom(self, t) -> bool:
        return t is not None and (
            _is_number(t) or _is_letter(t) or t in ("(", "{", "\\frac", "\\sqrt", "\\binom")
            or t in _CONSTS or t in _FUNCS or t in _GREEK or t == "\\sum"
        )

    def nest(self, step: int):
        """Track nesting: every recursion passes through atom() or a {group}, so this bounds the
        stack."""
        self.depth += step
        if self.depth > MAX_DEPTH:
            raise ParseError("nested too deeply")

    def atom(self):
        self.nest(+1)
        t = self.take()
        if _is_number(t):
            node = ["num", t]
        elif t in _CLOSE:
            node = self.expr()
            self.expect(_CLOSE[t])
        elif _is_letter(t):
            node = ["sym", t]
            if self.peek() == "_":
                self.take()
                sub = self.take()
                if sub == "{" and self.toks[self.i + 1:self.i + 2] == ["}"]:
                    sub = self.take()
                    self.expect("}")
                elif sub == "{":  # F_{n-1}: a term of a sequence, a function of its index
                    node = ["idx", t, self.expr()]
                    self.expect("}")
                    sub = None
                if sub is not None and not (sub.isascii() and sub.isalnum()):
                    raise ParseError("bad subscript")
                if sub is not None:
                    node = ["sym", f"{t}_{sub}"]
            elif t == "i":
                node = ["const", "I"]
            elif t == "e":  # Euler's number, as in \ln(e^2) or e^{i\pi}; see the module docstring
                node = ["const", "E"]
        elif t == "\\frac":
            node = ["*", self.arg(), ["inv", self.arg()]]
        elif t == "\\binom":
            node = ["binom", self.arg(), self.arg()]
        elif t == "|":  # |x|; a bar is no start of an implicit factor, so 2|x| is refused
            node = ["abs", self.expr()]
            self.expect("|")
        elif t == "\\sum":  # \sum_{k=1}^{n} k^2: the sum binds the term that follows
            self.expect("_")
            self.expect("{")
            k = self.take()
            if not _is_letter(k):
                raise ParseError("bad summation index")
            self.expect("=")
            lo = self.expr()
            self.expect("}")
            self.expect("^")
            node = ["sum", k, lo, self.arg(), self.term()]
        elif t == "\\sqrt":
            index = None
            if self.peek() == "[":
                self.take()
                index = self.expr()
                self.expect("]")
            node = ["sqrt", self.arg(), index]
        elif t in _CONSTS:
            node = ["const", _CONSTS[t]]
        elif t in _FUNCS:
            node = self.function(t[1:])
        elif t in _GREEK:
            node = ["sym", t[1:]]
        else:
            raise ParseError(f"unsupported token {t!r}")
        self.nest(-1)
        return node

    def function(self, name: str):
        """\\sin x, \\sin^2 x (the square of the sine), \\log_2 8 (base 2); \\sin^{-1} is refused
        (arcsin?)."""
        base = exponent = None
        if name == "log" and self.peek() == "_":
            self.take()
            base = self.arg()
        if self.peek() == "^":
            self.take()
            exponent = self.arg()
            if exponent[0] == "neg":
                raise ParseError("a negative power of a function")
        node = ["fn", name, self.power()] if base is None else ["log", self.power(), base]
        return node if exponent is None else ["^", node, exponent]

    def arg(self):
        """A macro argument: a {group}, or one character/command, as in \\frac12 or \\sqrt2."""
        t = self.peek()
        if t is not None and t[0] in "0123456789" and len(t) > 1:
            self.toks[self.i] = t[1:]  # \frac12: each argument is one digit
            return ["num", t[0]]
        if t == "{":
            self.take()
            self.nest(+1)
            node = self.expr()
            self.expect("}")
            self.nest(-1)
            return node
        return self.atom()


def _check_power_size(base_digits: float, exp) -> None:
    """Refuse a power before computing it if the result would be huge."""
    if abs(exp) > 10_000 or max(base_digits, 1) * abs(exp) > MAX_DIGITS:
        raise ParseError("number too large")


def to_fraction(node) -> Fraction:
    """Evaluate an AST exactly if it is a rational number; raise _NotRational if it is not."""
    op, args = node[0], node[1:]
    if op == "num":
        if len(args[0]) > MAX_DIGITS:
            raise ParseError("number too long")
        return Fraction(args[0])
    if op == "+":
        return sum((to_fraction(a) for a in args), Fraction(0))
    if op == "*":
        return math.prod((to_fraction(a) for a in args), start=Fraction(1))
    if op == "neg":
        return -to_fraction(args[0])
    if op == "inv":
        return 1 / to_fraction(args[0])
    if op == "^":
        base, exp = to_fraction(args[0]), to_fraction(args[1])
        if exp.denominator != 1:
            raise _NotRational
        _check_power_size(_digits(base), exp)
        return base ** int(exp)
    if op == "sqrt":
        x, n = to_fraction(args[0]), 2 if args[1] is None else to_fraction(args[1])
        if n not in (2, 3) or (x < 0 and n == 2):
            raise _NotRational
        root = Fraction(_iroot(abs(x.numerator), int(n)), _iroot(x.denominator, int(n)))
        if root ** int(n) != abs(x):
            raise _NotRational
        return root if x >= 0 else -root  # \sqrt[3]{-8} = -2, the real cube root
    if op == "abs":
        return abs(to_fraction(args[0]))
    if op == "!":
        x = to_fraction(args[0])
        if x.denominator != 1 or not 0 <= x <= 300:
            raise ParseError("bad factorial")
        return Fraction(math.factorial(int(x)))
    if op == "binom":
        n, k = to_fraction(args[0]), to_fraction(args[1])
        if n.denominator != 1 or k.denominator != 1 or n < 0:
            raise _NotRational  # sympy's binomial decides (or refuses) the rest
        if min(k, n - k) * math.log10(max(n, 2)) > MAX_DIGITS:  # about how many digits C(n, k) has
            raise ParseError("binomial too large")
        return Fraction(math.comb(int(n), int(k)) if k >= 0 else 0)
    raise _NotRational  # symbols, constants, functions, logs


def _digits(x: Fraction) -> float:
    """About how many decimal digits x has (bit lengths: str() of a huge int is slow, and
    refused)."""
    return max(abs(x.numerator).bit_length(), x.denominator.bit_length()) * math.log10(2)


def _iroot(n: int, k: int) -> int:
    """Integer k-th root of n >= 0, rounded (the caller checks whether it is exact)."""
    if k == 2:
        return math.isqrt(n)
    if n.bit_length() > 1000:  # beyond float range
        raise _NotRational
    r = round(n ** (1 / k))
    return next((c for c in (r - 1, r, r + 1) if c >= 0 and c**k == n), r)


# ------------------------------------------------------------------------------------------------
# 5. Comparison with sympy (runs in the worker)


def to_sympy(node):
    """Build a sympy expression from an AST (runs in the worker). Sizes are checked before
    building."""
    import sympy

    op, args = node[0], node[1:]
    if op == "num":
        return sympy.Rational(args[0])
    if op == "sym":
        return sympy.Symbol(args[0])
    if op == "const":
        return {"pi": sympy.pi, "oo": sympy.oo, "I": sympy.I, "E": sympy.E}[args[0]]
    if op == "+":
        return sympy.Add(*[to_sympy(a) for a in args])
    if op == "*":
        return sympy.Mul(*[to_sympy(a) for a in args])
    if op == "neg":
        return -to_sympy(args[0])
    if op == "inv":
        return 1 / to_sympy(args[0])
    if op == "^":
        base, exp = to_sympy(args[0]), to_sympy(args[1])
        if exp.is_Number:
            digits = _digits(Fraction(int(base.p), int(base.q))) if base.is_Rational else 1
            _check_power_size(digits, exp)
        return sympy.Pow(base, exp)
    if op == "sqrt":
        x, n = to_sympy(args[0]), sympy.Integer(2) if args[1] is None else to_sympy(args[1])
        if n.is_Integer and n % 2 == 1 and x.is_negative:  # the real odd root, as in school maths
            return -sympy.root(-x, n)
        return sympy.root(x, n)
    if op == "fn":
        name = {"ln": "log", "arcsin": "asin", "arccos": "acos", "arctan": "atan",
                "arccot": "acot", "arcsec": "asec", "arccsc": "acsc"}.get(args[0], args[0])
        return getattr(sympy, name)(to_sympy(args[1]))
    if op == "log":
        return sympy.log(to_sympy(args[0]), to_sympy(args[1]))
    if op == "abs":
        return sympy.Abs(to_sympy(args[0]))
    if op == "idx":
        return sympy.Function(args[0])(to_sympy(args[1]))
    if op == "sum":  # unevaluated: sympy's equality and evalf decide, within the budget
        k, lo, hi, body = args
        return sympy.Sum(to_sympy(body), (sympy.Symbol(k), to_sympy(lo), to_sympy(hi)))
    if op == "!":
        x = to_sympy(args[0])
        if not (x.is_Integer and 0 <= x <= 300):
            raise ParseError("bad factorial")
        return sympy.factorial(x)
    if op == "binom":
        n, k = to_sympy(args[0]), to_sympy(args[1])
        # integers were computed exactly before; this is e.g. C(5/2, 2)
        if n.is_Number and abs(n) > 1000:
            raise ParseError("binomial too large")
        return sympy.binomial(n, k)
    raise ParseError(f"unknown node {op}")


_SET_NODES = ("ineq", "interval", "union", "diff", "finite")


def to_real_set(node) -> tuple:
    """(a sympy set of reals, its variable or None) from a set AST: ["interval", closed_left, lo,
    hi, closed_right], ["union", set, ...] or ["ineq", [op, ...], [expr, ...]], a chain such as
    1 \\leq |z| \\leq 3/2 in one variable, solved over the reals (runs in the worker)."""
    import sympy

    if node[0] == "interval":
        _, closed_left, lo, hi, closed_right = node
        return sympy.Interval(to_sympy(lo), to_sympy(hi), not closed_left, not closed_right), None
    if node[0] == "union":
        return sympy.Union(*[to_real_set(n)[0] for n in node[1:]]), None
    if node[0] == "diff":
        return sympy.Complement(to_real_set(node[1])[0], to_real_set(node[2])[0]), None
    if node[0] == "finite":
        points = [to_sympy(n) for n in node[1:]]
        if not all(p.is_real for p in points):
            raise ParseError("not a set of reals")
        return sympy.FiniteSet(*points), None
    if node[0] != "ineq":
        raise ParseError("not a set")
    ops, exprs = node[1], [to_sympy(e) for e in node[2]]
    variables = set().union(*(e.free_symbols for e in exprs))
    if len(variables) != 1:
        raise ParseError("not an inequality in one variable")
    (x,) = variables
    relation = {"<": sympy.Lt, ">": sympy.Gt, "\\leq": sympy.Le, "\\geq": sympy.Ge,
                "\\neq": sympy.Ne}
    out = sympy.S.Reals
    for op, left, right in zip(ops, exprs, exprs[1:]):
        out = out & sympy.solveset(relation[op](left, right), x, sympy.S.Reals)
    return out, x


# Three points at which expressions with symbols are compared (two different polynomials or rational
# functions almost never agree at all three): exact rationals, so the comparison stays exact.
_POINTS = [(5377, 10000), (13719, 10000), (-7123, 10000)]


def sympy_equal(a, b, equation: bool = False, approx: int = 0) -> bool:
    """Are two ASTs equal as sympy expressions?

    equation: a and b are lhs - rhs of two equations, equal up to a nonzero constant factor.
    approx: the number of decimal places of the answer, when it is a plain decimal number the model
    wrote: then agreement to 1e-12 of the gold's size, and within one unit of the last decimal
    place written, is enough (1.4142135623730951 is sqrt 2, 1000000000000000.5 is not 10^15 +
    sqrt 2). Otherwise exact: the difference d = a - b must be clearly zero at 50 digits (at three
    rational points if there are symbols), and then proved zero (simplify or equals, on d or else at
    each point).
    """
    import sympy

    if a[0] in _SET_NODES or b[0] in _SET_NODES:
        (x, vx), (y, vy) = to_real_set(a), to_real_set(b)
        if vx is not None and vy is not None and vx != vy:  # y<1 is not x<1
            return False
        return x == y or (sympy.Complement(x, y) == sympy.S.EmptySet
                          and sympy.Complement(y, x) == sympy.S.EmptySet)
    x, y = to_sympy(a), to_sympy(b)
    if equation:
        ratio = sympy.simplify(x / y)
        return bool(ratio.is_number and ratio != 0 and ratio.is_finite)
    if x == y:
        return True
    d = x - y
    symbols = sorted(d.free_symbols, key=str)
    points = [{s: sympy.Rational(p + 3141 * k, q) for k, s in enumerate(symbols)} for p,
              q in _POINTS]
    points = points if symbols else [{}]
    try:
        for pt in points:
            if approx:
                if not _close(x.xreplace(pt).evalf(30), y.xreplace(pt).evalf(30), approx):
                    return False
            elif _clearly_nonzero(d.xreplace(pt), y.xreplace(pt)):
                return False
    except (TypeError, ValueError):  # oo, nan, zoo, or no numeric value: algebra decides
        return sympy.simplify(d) == 0
    # Proved for every value of the symbols, not at the three points: sin(10000 pi x) is 0 at each
    # of them (their denominators are 10,000) and is no zero function.
    return approx or _proved_zero(d)


def _clearly_nonzero(d, y) -> bool:
    """Is the number d (a difference, without symbols) nonzero at 50 digits, relative to max(1,
    |y|)? sympy's evalf of a sum raises its working precision when the terms cancel, so
    (10^15+sqrt2) - 10^15 is sqrt2 here, not 0 as in floating point."""
    import sympy

    mag, scale = sympy.Abs(d.evalf(50)), sympy.Abs(y.evalf(50))
    if not (mag.is_Number and scale.is_Number and mag.is_finite and scale.is_finite):
        raise ValueError("not a finite number")
    return bool(mag > sympy.Float(10, 50) ** -30 * max(scale, sympy.Integer(1)))


def _proved_zero(d) -> bool:
    """d == 0, proved (undecided counts as no). Cheap provers first: sympy's simplify alone takes 9
    s on sin(160x)^2 + cos(160x)^2 - 1, which fu proves in 0.02 s."""
    import sympy

    if d == 0 or (d.free_symbols and d.is_rational_function() and sympy.cancel(d) == 0):
        return True
    if d.has(sympy.sin, sympy.cos, sympy.tan, sympy.cot, sympy.sec, sympy.csc) and sympy.fu(d) == 0:
        return True
    return sympy.simplify(d) == 0 or d.equals(0) is True


def _close(u, v, decimals: int) -> bool:
    """u within 1e-12 of max(1, |v|) of v, and within 10^-decimals. The difference is taken at
    30 digits before it becomes a float: 10^15 + 0.5 and 10^15 + sqrt 2 are equal as floats to
    1e-15."""
    if not (cmath.isfinite(complex(u)) and cmath.isfinite(complex(v))):
        raise ValueError("not finite")  # inf - inf says nothing: let simplify decide
    difference = abs(complex(u - v))
    return difference <= 1e-12 * max(1.0, abs(complex(v))) and difference <= 10.0 ** -decimals


# ------------------------------------------------------------------------------------------------
# 6. The sympy worker (common/env/grader_worker.py): this process's pool, and what a worker runs


def _warm_up():
    """Import sympy and grade twice, so that a worker's first real grade is not charged for it."""
    sympy_equal(parse("\\sin^2x+\\cos^2x"), parse("1"))
    sympy_equal(parse("\\sqrt{2}+\\sqrt{3}"), parse("\\sqrt{5+2\\sqrt{6}}"))


SYMPY_TOOLS = ("solve", "simplify", "factor")  # tools.py's tools that run here, in a worker
MAX_TOOL_TEXT = 200  # characters of a tool's answer given back to the model


def sympy_tool(name: str, a) -> str:
    """A sympy tool on the AST `a` (runs in the worker): solve (for its symbols, = 0), simplify or
    factor, as sympy prints the result."""
    import sympy

    expr = to_sympy(a)
    if expr.has(sympy.Sum):  # \sum_{k=1}^{10} k is 55 (the worker's budget bounds the work)
        expr = expr.doit()
    if name == "solve":
        return str(sympy.solve(expr, sorted(expr.free_symbols, key=str) or None))
    return str({"simplify": sympy.simplify, "factor": sympy.factor}[name](expr))


def run_sympy_tool(name: str, text: str) -> str:
    """tools.py's sympy tool `name` on the model's text, in a worker of the pool within the
    grader's budget (TIMEOUT_S of CPU time): the answer as text, or a line that starts with
    "error:". Never raises. The text is parsed by this file's whitelisted parser, never by sympy's
    (which would eval it); `solve` takes "lhs = rhs" or an expression equal to 0."""
    if name not in SYMPY_TOOLS:
        return f"error: no tool {name!r}"
    try:
        # Python's power, written as TeX's; the = of \sum_{k=1} is inside its braces
        sides = _top_level_split(normalize(text.replace("**", "^")), "=")
        if len(sides) > 2 or (len(sides) == 2 and name != "solve"):
            return "error: one = at most, and only for solve"
        a = parse(sides[0]) if len(sides) == 1 else ["+", parse(sides[0]), ["neg", parse(sides[1])]]
    except ParseError as e:
        return f"error: cannot read {text.strip()[:40]!r} ({e})"
    grade = Grade(TIMEOUT_S)
    with paused():
        reply = _POOL.tool(name, a, grade)
    if reply is None or reply["timeout"] or reply["text"] is None:
        return "error: out of time" if grade.timed_out else "error: the tool failed"
    return reply["text"][:MAX_TOOL_TEXT]


_POOL = Pool(pool_size(), os.path.abspath(__file__))
atexit.register(lambda: _POOL.stop())


def _after_fork_in_child():
    global _POOL
    # the parent's workers are not ours to use or to kill (grader_worker.py starts fresh counts)
    _POOL = Pool(pool_size(), os.path.abspath(__file__))


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)

if __name__ == "__grader_worker__":  # a worker: common/env/grader_worker.py's Pool started it
    serve(int(sys.argv[3]), sympy_equal, _warm_up, sympy_tool)
