"""Grade MATH-style final answers: is the model's `\\boxed{}` answer the same as the gold answer?

The pipeline, cheapest step first (most grades stop at step 2 or 3):
1. `last_boxed` pulls the answer out of the response (only the LAST box counts; an empty box is no answer).
2. `normalize` rewrites LaTeX so equal answers usually become equal strings (the PRM800K / Hendrycks
   `strip_string` idea): `\\dfrac`->`\\frac`, no `\\left`/`\\right`, spaces, units, degrees, percent, `x=`.
3. `_split` finds structure (tuples, intervals, sets, unions, matrices, `\\pm`, equations), compared part by part.
4. A small LaTeX parser turns each part into a tiny AST (nested lists). Pure rationals are compared
   exactly with `fractions.Fraction` in this process.
5. Everything else (pi, roots, symbols) goes to a sympy worker subprocess that rebuilds the AST as sympy
   objects and compares them to 30 digits (at three points if there are symbols; `simplify(a - b) == 0`
   where that fails), with a 1 s deadline per grade; a timeout grades as wrong.

Safety: model text is never given to eval, `sympify` or `parse_expr` (all three call Python's eval). The
parser accepts only a whitelist of tokens, caps length and nesting depth, and refuses huge powers before
they are built, so `9^{9^{9^9}}` or 10 000 nested parentheses grade 0 in milliseconds.
"""

import atexit
import cmath
import functools
import json
import math
import os
import re
import select
import subprocess
import sys
import threading
import time
import unicodedata
from fractions import Fraction

MAX_LEN = 1000  # a normalised answer longer than this is only compared as a string
MAX_DEPTH = 60  # bracket/argument nesting the parser accepts; far below Python's recursion limit
MAX_DIGITS = 2000  # refuse to build numbers with more digits than this
MAX_ITEMS = 50  # elements in a tuple/set/matrix
TIMEOUT_S = 1.0  # budget for the sympy part of one grade


# ---------------------------------------------------------------------------------------------------
# 0. Unicode look-alikes and hedges (shared with the GSM8K grader in common/env.py)

_DASHES = "\u2212\u2012\u2013\ufe63\uff0d\u2796"  # minus sign, figure dash, en dash, small/full-width/heavy minus
_ZERO_WIDTH = "\u200b\u200c\u200d\u2060\ufeff\u00ad"  # invisible: "1\u200b8" looks like 18
_SUPERSCRIPTS = dict(zip("⁰¹²³⁴⁵⁶⁷⁸⁹⁺⁻", "0123456789+-"))
_SUPERSCRIPT_RUN = re.compile("[" + "".join(_SUPERSCRIPTS) + "]+")


@functools.lru_cache(maxsize=4096)
def _ascii_char(c: str) -> str:
    if c in _DASHES:
        return "-"
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
    """Unicode characters that look like ASCII maths, as that ASCII: `−5` -> `-5`, `１８` -> `18`, `18²` -> `18^{2}`.

    Dashes used as minus, full-width forms, decimal digits of any script and odd spaces are mapped one by one.
    Not NFKC: that would turn `18²` into `182`. Everything else (letters, `×`, `½`) is left as it is.
    """
    if text.isascii():
        return text
    text = _SUPERSCRIPT_RUN.sub(lambda m: "^{" + "".join(_SUPERSCRIPTS[c] for c in m.group()) + "}", text)
    return "".join(_ascii_char(c) if c > "\x7f" else c for c in text)


# Words that make an answer a guess or a choice. Number words are refused separately by the GSM8K grader.
HEDGE_WORDS = frozenset("""
    or nor not no maybe perhaps possibly probably likely about around approximately approx roughly nearly almost
    either neither between guess estimate estimated ish circa somewhere than least most over under above below
    instead wrong incorrect wait unless if could might
""".split())


def has_hedge(text: str) -> bool:
    """Does the text hold a hedge word ("or", "about", "not", "isn't", ...) or an approximately-equal sign?
    LaTeX command names are not words (`\\approx` counts as a sign, `\\frac` as nothing)."""
    if "≈" in text or re.search(r"\\approx(?![a-zA-Z])", text):
        return True
    words = re.findall(r"[a-z]+(?:'[a-z]+)?", re.sub(r"\\[a-zA-Z]+", " ", text.replace("’", "'")).lower())
    return any(w in HEDGE_WORDS or w.endswith("n't") for w in words)


# ---------------------------------------------------------------------------------------------------
# 1. Extraction


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (or `\\fbox{...}`), nested braces allowed. None if absent or empty."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    i = start + (6 if text.startswith("\\boxed", start) else 5)
    if text.startswith(" ", i):  # `\boxed 5` (no braces), used by some MATH solutions
        content = re.match(r" ([^$\s]*)", text[i:]).group(1)
        return content.strip() or None
    if not text.startswith("{", i):
        return None
    depth = 0
    for j in range(i, len(text)):  # a loop, not recursion: 10 000 nested braces must not crash
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1 : j].strip() or None
    return None  # unbalanced


# ---------------------------------------------------------------------------------------------------
# 2. Normalisation

# Unit words dropped after a number. Single letters (m, s, g) are left alone: they are often variables.
_UNITS = (
    "cm|mm|km|meters?|metres?|inch|inches|feet|foot|ft|units?|degrees?|dollars?|cents?|hours?|minutes?|"
    "seconds?|days?|weeks?|years?|mph|miles?|pounds?|square|sq|cubic"
)


def normalize(s: str) -> str:
    """Rewrite a LaTeX answer into a canonical string (equal answers -> usually equal strings)."""
    s = s.strip().replace("\n", " ")
    s = s.replace("\\\\", ";")  # matrix row separator, before `\ ` below eats one of the backslashes
    s = re.sub(r"\\(?:left|right)(?:\.|(?![a-zA-Z]))", "", s)
    s = re.sub(r"\\[!,;:> ]|\\q?quad(?![a-zA-Z])|~", " ", s)
    s = re.sub(r"\\[dt]frac(?![a-zA-Z])", r"\\frac", s)
    s = re.sub(r"\\(?:mbox|textbf|textrm|mathrm|mathbf|textnormal)(?![a-zA-Z])", r"\\text", s)
    s = re.sub(r"\\displaystyle(?![a-zA-Z])", "", s)
    s = re.sub(r"\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|\\circ|\\degree|°", "", s)
    s = re.sub(r"\\?\$|\\?%", "", s)
    m = re.fullmatch(r"\s*\\text\{([^{}]*)\}\s*", s)
    if m:  # the whole answer is text, e.g. \text{Evelyn} or \text{(B)}
        s = m.group(1)
    # \text after something else is a unit (5\text{ cm}^2); anything left in \text{} is plain words
    s = re.sub(r"(?<=\S)\s*\\text\{[^{}]*\}(\^\{?\d\}?)?", "", s)
    s = re.sub(r"\\text\{([^{}]*)\}", r"\1", s)
    s = re.sub(rf"(?<=[\d}}])\s*(?:{_UNITS})(\^\{{?\d\}}?)?\s*$", "", s)
    # Spaces go, except between a command and a letter (`\cot x` must not become `\cotx`)
    s = re.sub(r"(\\[a-zA-Z]+)\s+(?=[a-zA-Z])|\s+", lambda m: m.group(1) + " " if m.group(1) else "", s)
    s = re.sub(r"^(?:[a-zA-Z]|\\[a-zA-Z]+)(?:_\{?\w+\}?)?(?:=|\\in(?![a-zA-Z]))(?!.*=)", "", s)  # x=5
    s = s.rstrip(".").rstrip()
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", s):  # 1,000 is a number; (1,2) stays a tuple
        s = s.replace(",", "")
    s = re.sub(r"(?<![\d])\.(?=\d)", "0.", s)  # .5 -> 0.5
    s = re.sub(r"_\{(\d+)\}", r"_\1", s)  # 4210_{5} -> 4210_5
    m = re.fullmatch(r"\(([A-Za-z])\)", s)  # multiple choice: (B) -> B
    if m:
        s = m.group(1).upper()
    m = re.fullmatch(r"(-?)(\d+)\\frac\{?(\d+)\}?\{?(\d+)\}?", s)
    if m:  # a mixed number: 1\frac{4}{5} is 1 + 4/5, not 1 * 4/5
        sign, whole, num, den = m.groups()
        s = f"{sign}\\frac{{{int(whole) * int(den) + int(num)}}}{{{den}}}"
    return s


# ---------------------------------------------------------------------------------------------------
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
    """True if s[0] opens a bracket that closes exactly at s[-1] (any mix of () and [], for intervals)."""
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
    """(kind, parts): kind is matrix, union, set (unordered), tuple (ordered, with its brackets), eq or scalar."""
    m = re.fullmatch(r"\\begin\{([pbvB]?matrix)\}(.*)\\end\{\1\}", s)
    if m:
        rows = [r.split("&") for r in m.group(2).strip(";").split(";")]
        return "matrix", rows
    if len(parts := _top_level_split(s, "\\cup")) > 1:
        return "union", parts
    if s.startswith("\\{") and s.endswith("\\}"):
        return "set", _expand_pm(_top_level_split(s[2:-2], ","))
    if s[:1] in "([" and s[-1:] in ")]" and _is_one_group(s):
        inner = _top_level_split(s[1:-1], ",")
        if len(inner) > 1:
            return "tuple", (s[0] + s[-1], inner)
    if len(parts := _top_level_split(s, ",")) > 1 or "\\pm" in s:
        parts = _expand_pm(parts)
        if len(parts) > 1:  # "3, 5, 7": a list of all solutions, order does not matter
            return "set", parts
    if len(parts := _top_level_split(s, "=")) == 2:
        return "eq", parts
    return "scalar", s


def math_equal(pred: str | None, gold: str) -> bool:
    """Is the extracted answer `pred` equivalent to `gold`? Both are raw LaTeX answer strings."""
    if pred is None or len(pred) > 4 * MAX_LEN:
        return False
    a, b = normalize(pred), normalize(gold)
    if a == b:
        return a != ""
    if not a or len(a) > MAX_LEN or len(b) > MAX_LEN:
        return False
    return _equal(a, b, time.monotonic() + TIMEOUT_S)


def _equal(a: str, b: str, deadline: float) -> bool:
    if a == b:
        return True
    (ka, pa), (kb, pb) = _split(a), _split(b)
    if ka != kb:
        return False
    if ka == "scalar":
        return _equal_scalar(pa, pb, deadline)
    if ka == "eq":
        return _equal_equation(pa, pb, deadline)
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
        return all(_equal(x, y, deadline) for x, y in zip(pa, pb))
    unmatched = list(pb)  # set/union: each element must match a different gold element
    for x in pa:
        hit = next((i for i, y in enumerate(unmatched) if _equal(x, y, deadline)), None)
        if hit is None:
            return False
        unmatched.pop(hit)
    return True


def _equal_scalar(a: str, b: str, deadline: float) -> bool:
    if re.fullmatch(r"[a-zA-Z]{2,}", a) and re.fullmatch(r"[a-zA-Z]{2,}", b):
        return a.lower() == b.lower()  # words (names, directions), not products of symbols
    try:
        ta, tb = parse(a), parse(b)
    except ParseError:
        return False  # off the whitelist (e.g. base-n numbers like 204_5): only string equality counts
    try:
        return to_fraction(ta) == to_fraction(tb)  # exact, and no sympy needed for plain numbers
    except _NotRational:
        return _WORKER.equal(ta, tb, False, deadline)
    except (ParseError, ZeroDivisionError, OverflowError, ValueError):
        return False


def _equal_equation(a: list, b: list, deadline: float) -> bool:
    """Equations are equal if lhs - rhs agree up to a nonzero constant factor (2x=4 vs x-2=0)."""
    try:
        ta, tb = (["+", parse(lhs), ["neg", parse(rhs)]] for lhs, rhs in (a, b))
    except ParseError:
        return False
    return _WORKER.equal(ta, tb, True, deadline)


# ---------------------------------------------------------------------------------------------------
# 4. A whitelisted LaTeX parser -> AST of nested lists (JSON-safe, so it can be sent to the worker)
#   ["num", "3.5"] ["sym", "x"] ["const", "pi"|"oo"|"I"] ["+", a, b, ...] ["*", a, b, ...]
#   ["neg", a] ["inv", a] ["^", base, exp] ["sqrt", a, index|None] ["fn", "sin", a] ["!", a]


class ParseError(ValueError):
    pass


class _NotRational(Exception):
    pass


_TOKEN = re.compile(r"\d+(?:\.\d*)?|\.\d+|\\[a-zA-Z]+|\\[{}]|\S")
_CONSTS = {"\\pi": "pi", "\\infty": "oo", "\\infinity": "oo"}
_FUNCS = {"\\" + f for f in "sin cos tan cot sec csc ln log exp arcsin arccos arctan".split()}
_GREEK = {"\\" + g for g in "alpha beta gamma delta epsilon theta lambda mu rho sigma tau phi omega".split()}
_CLOSE = {"(": ")", "[": "]", "{": "}"}


def parse(s: str) -> list:
    """Parse a normalised LaTeX expression into an AST; raise ParseError on anything off the whitelist."""
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
            t[0].isdigit() or t[0] == "." or t.isalpha() or t in ("(", "{", "\\frac", "\\sqrt")
            or t in _CONSTS or t in _FUNCS or t in _GREEK
        )

    def nest(self, step: int):
        """Track nesting: every recursion passes through atom() or a {group}, so this bounds the stack."""
        self.depth += step
        if self.depth > MAX_DEPTH:
            raise ParseError("nested too deeply")

    def atom(self):
        self.nest(+1)
        t = self.take()
        if t[0].isdigit() or t[0] == ".":
            node = ["num", t]
        elif t in _CLOSE:
            node = self.expr()
            self.expect(_CLOSE[t])
        elif len(t) == 1 and t.isalpha():
            node = ["sym", t]
            if self.peek() == "_":
                self.take()
                sub = self.take()
                if sub == "{":
                    sub = self.take()
                    self.expect("}")
                if not sub.isalnum():
                    raise ParseError("bad subscript")
                node = ["sym", f"{t}_{sub}"]
            elif t == "i":
                node = ["const", "I"]
        elif t == "\\frac":
            node = ["*", self.arg(), ["inv", self.arg()]]
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
            node = ["fn", t[1:], self.power()]
        elif t in _GREEK:
            node = ["sym", t[1:]]
        else:
            raise ParseError(f"unsupported token {t!r}")
        self.nest(-1)
        return node

    def arg(self):
        """A macro argument: a {group}, or one character/command, as in \\frac12 or \\sqrt2."""
        t = self.peek()
        if t is not None and t[0].isdigit() and len(t) > 1:
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
    if op == "!":
        x = to_fraction(args[0])
        if x.denominator != 1 or not 0 <= x <= 300:
            raise ParseError("bad factorial")
        return Fraction(math.factorial(int(x)))
    raise _NotRational  # symbols, constants, functions


def _digits(x: Fraction) -> float:
    """About how many decimal digits x has (bit lengths: str() of a huge int is slow, and refused)."""
    return max(abs(x.numerator).bit_length(), x.denominator.bit_length()) * math.log10(2)


def _iroot(n: int, k: int) -> int:
    """Integer k-th root of n >= 0, rounded (the caller checks whether it is exact)."""
    if k == 2:
        return math.isqrt(n)
    if n.bit_length() > 1000:  # beyond float range
        raise _NotRational
    r = round(n ** (1 / k))
    return next((c for c in (r - 1, r, r + 1) if c >= 0 and c**k == n), r)


# ---------------------------------------------------------------------------------------------------
# 5. The sympy worker: a subprocess we can kill when a simplification runs too long


def to_sympy(node):
    """Build a sympy expression from an AST (runs in the worker). Sizes are checked before building."""
    import sympy

    op, args = node[0], node[1:]
    if op == "num":
        return sympy.Rational(args[0])
    if op == "sym":
        return sympy.Symbol(args[0])
    if op == "const":
        return {"pi": sympy.pi, "oo": sympy.oo, "I": sympy.I}[args[0]]
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
        name = {"ln": "log", "arcsin": "asin", "arccos": "acos", "arctan": "atan"}.get(args[0], args[0])
        return getattr(sympy, name)(to_sympy(args[1]))
    if op == "!":
        x = to_sympy(args[0])
        if not (x.is_Integer and 0 <= x <= 300):
            raise ParseError("bad factorial")
        return sympy.factorial(x)
    raise ParseError(f"unknown node {op}")


def sympy_equal(a, b, equation: bool = False) -> bool:
    """Are two ASTs equal as sympy expressions? For equations (a, b = lhs - rhs) equal up to a constant factor."""
    import sympy

    x, y = to_sympy(a), to_sympy(b)
    if equation:
        ratio = sympy.simplify(x / y)
        return bool(ratio.is_number and ratio != 0 and ratio.is_finite)
    if x == y:
        return True
    # Compare numerically to 30 digits: as is for numbers, and at three points for expressions with
    # symbols (two different polynomials or rational functions almost never agree at all three).
    symbols = sorted((x - y).free_symbols, key=str)
    points = [{s: sympy.Float(p + 0.3141 * k) for k, s in enumerate(symbols)} for p in (0.5377, 1.3719, -0.7123)]
    try:
        return all(_close(x.evalf(30, subs=pt), y.evalf(30, subs=pt)) for pt in points)
    except (TypeError, ValueError):  # oo, nan, zoo: fall back to algebra
        return sympy.simplify(x - y) == 0


def _close(u, v) -> bool:
    u, v = complex(u), complex(v)
    if not (cmath.isfinite(u) and cmath.isfinite(v)):
        raise ValueError("not finite")  # inf - inf says nothing: let simplify decide
    return abs(u - v) <= 1e-12 * max(1.0, abs(v))


def _serve() -> None:
    """Worker loop: one JSON request per line on stdin, one JSON bool per line on stdout."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the parent, which kills us
    try:  # a runaway simplification should hit the time limit, not eat the machine's memory
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
    except (ImportError, ValueError, OSError):
        pass
    import sympy  # noqa: F401  (import before saying ready, so the first grade is not charged for it)

    print("ready", flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        try:
            ok = sympy_equal(req["a"], req["b"], req["equation"])
        except Exception:  # ParseError, TypeError on oo/nan, RecursionError, MemoryError: not equal
            ok = False
        print(json.dumps(ok), flush=True)


class _Worker:
    """One sympy worker per process, started lazily, restarted after a timeout or a fork."""

    def __init__(self):
        self.proc, self.pid, self.ready, self.broken = None, None, False, False
        self.lock = threading.Lock()

    def _spawn(self):
        # A fresh interpreter that runs this file (not multiprocessing): it works the same under pytest,
        # torchrun and after CUDA is initialised, and does not re-import the caller's __main__.
        code = "import runpy, sys; runpy.run_path(sys.argv[1], run_name='__grader_worker__')"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code, os.path.abspath(__file__)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1,
        )
        self.pid, self.ready = os.getpid(), False

    def _readline(self, timeout: float) -> str | None:
        ready, _, _ = select.select([self.proc.stdout], [], [], max(timeout, 0.0))
        return self.proc.stdout.readline().strip() if ready else None

    def stop(self):
        if self.proc is not None and self.pid == os.getpid():
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def equal(self, a, b, equation: bool, deadline: float) -> bool:
        with self.lock:
            if self.broken or time.monotonic() >= deadline:  # an earlier part of this grade used the budget up
                return False
            if self.proc is None or self.pid != os.getpid() or self.proc.poll() is not None:
                self.proc = None  # after a fork the worker belongs to the parent: leave it alone
                self._spawn()
            if not self.ready:  # importing sympy (~0.5 s) is not charged to the grade
                started = time.monotonic()
                self.ready = self._readline(60.0) == "ready"
                if not self.ready:
                    self.stop()
                    self.broken = True
                    print("common/grader.py: the sympy worker did not start; symbolic answers grade as wrong", file=sys.stderr)
                    return False
                deadline += time.monotonic() - started
            try:
                self.proc.stdin.write(json.dumps({"a": a, "b": b, "equation": equation}) + "\n")
                self.proc.stdin.flush()
            except OSError:  # the worker died
                self.stop()
                return False
            reply = self._readline(deadline - time.monotonic())
            if not reply:  # timeout (or the worker died): kill it, start the next one now, grade as wrong
                self.stop()
                self._spawn()
                return False
            return reply == "true"


_WORKER = _Worker()
atexit.register(_WORKER.stop)

if __name__ == "__grader_worker__":
    _serve()
