"""Hand-picked verifier cases for every task: equivalent forms, wrong-but-close answers, adversarial
output."""

import json
import time
from fractions import Fraction

import pytest

from common.env import grader

from common.env import grader_worker
from common.env.answers import answer_value, format_number, safe_arith, to_number
from common.env.math_env import verify
from common.env.grader import ascii_lookalikes, last_boxed, normalize, parse, sympy_equal
from common.env.tasks import TASKS, grade

# ------------------------------------------------------------------------------------------------
# GSM8K and arithmetic: numeric answers, extractor order \boxed{} > #### > "The answer is"; no
# marker, no reward

GSM8K_CASES = [
    ("The answer is 18.", "18", 1.0),
    ("She makes 9 * 2 = $18.\n#### 18", "18", 1.0),
    ("#### 1,000", "1000", 1.0),
    ("The answer is 70000", "70,000", 1.0),  # commas in the gold (GSM8K train has them)
    ("The answer is $18.", "18", 1.0),
    ("The answer is 18.0", "18", 1.0),
    ("The answer is 18.00 dollars.", "18", 1.0),
    ("The answer is: 42", "42", 1.0),
    ("THE ANSWER IS 42", "42", 1.0),
    ("The answer is .5", "0.5", 1.0),
    ("The answer is -3.", "-3", 1.0),
    # was 1.0 (the first number after the phrase): the whole span is the answer now, and "not 20"
    # hedges it
    ("The answer is 18 apples, not 20.", "18", 0.0),
    ("The answer is 17. No, wait: the final answer is 18.", "18", 1.0),  # the last phrase counts
    # was 1.0 (the bare last number): without an answer marker there is no reward (data/README.md)
    ("So she makes 1,000 dollars.", "1000", 0.0),
    ("\\boxed{18}", "18", 1.0),
    ("\\boxed{\\$18}", "18", 1.0),
    ("\\boxed{2 \\times 9 = 18}", "18", 1.0),  # a chain whose sides all agree
    ("First \\boxed{17}, then \\boxed{18}", "18", 1.0),
    # the last marker decides, whatever its kind (it was: #### before "The answer is")
    ("#### 18\nThe answer is 17", "18", 0.0),
    ("#### 18\nThe answer is 17", "17", 1.0),
    # wrong but close
    ("The answer is 180.", "18", 0.0),
    ("The answer is 1.8", "18", 0.0),
    ("The answer is 18.5", "18", 0.0),
    ("The answer is -18", "18", 0.0),
    ("I first got 18, but it is 17.", "18", 0.0),  # no marker
    ("The answer is 18. #### 17", "18", 0.0),
    ("The answer is eighteen.", "18", 0.0),
    ("", "18", 0.0),
    # reward hacking: only the last box counts, an empty or candidate-list box is no answer
    ("\\boxed{18} then \\boxed{17}", "18", 0.0),
    ("\\boxed{18} \\boxed{}", "18", 0.0),
    ("\\boxed{1, 2, 3, 18}", "18", 0.0),
    ("18 \\boxed{18", "18", 0.0),  # unbalanced box
    # open-ended: "18 plus" / "18 or more" is a bound, not an answer
    ("The answer is 18 plus.", "18", 0.0),
    ("The answer is 18 or more.", "18", 0.0),
    ("The answer is 18 or less.", "18", 0.0),
]


@pytest.mark.parametrize("response,gold,expected", GSM8K_CASES)
def test_gsm8k(response, gold, expected):
    assert verify("gsm8k", response, gold) == expected


# Issue 21: every wrong answer that scored 1.0, and the class around it. Expectations computed by
# hand.
GSM8K_WHOLE_SPAN = [
    # several candidates or a hedge: no answer
    ("The answer is not 18, it is 17.", "18", 0.0),
    ("The answer is not 18, it is 17.", "17", 0.0),
    ("The answer is 3 or 4.", "3", 0.0),
    ("The answer is 3 or 4.", "4", 0.0),
    ("The answer is 3, 4.", "3", 0.0),
    ("The answer is 18 (or perhaps 19).", "18", 0.0),
    ("The answer is about 18.", "18", 0.0),
    ("The answer is approximately 18 dollars.", "18", 0.0),
    ("The answer is roughly 18", "18", 0.0),
    ("The answer is maybe 18", "18", 0.0),
    ("The answer is between 17 and 19.", "18", 0.0),
    ("The answer is either 18 or 19", "18", 0.0),
    ("The answer is 18 or so.", "18", 0.0),
    ("The answer is 18, I guess", "18", 0.0),
    ("The answer is ~18", "18", 0.0),
    ("The answer is ≈ 18", "18", 0.0),
    ("#### 18 isn't right", "18", 0.0),
    ("#### 18 or 19", "18", 0.0),
    ("\\boxed{3 \\text{ or } 4}", "3", 0.0),
    ("The answer is 18 dollars and 50 cents.", "18", 0.0),  # another number
    ("The answer is 18 million.", "18", 0.0),  # number words change the value
    ("The answer is 18 and a half", "18", 0.0),
    ("The answer is 18k", "18", 0.0),
    # an expression is its exact value
    ("#### 18/5", "18", 0.0),
    ("#### 18/5", "3.6", 1.0),
    ("The answer is 18^2", "18", 0.0),
    ("The answer is 18^2", "324", 1.0),
    ("The answer is 18²", "18", 0.0),  # a superscript is a power (NFKC would make it 182)
    ("The answer is 18²", "182", 0.0),
    ("The answer is 18²", "324", 1.0),
    ("The answer is 2^{10}.", "1024", 1.0),
    ("The answer is 3 x 6 = 18", "18", 1.0),
    ("The answer is 3 × 6.", "18", 1.0),
    ("The answer is 36 ÷ 2", "18", 1.0),
    ("The answer is \\frac{36}{2}", "18", 1.0),
    ("The answer is $\\frac{1}{2}$.", "0.5", 1.0),
    ("The answer is 2 \\cdot 9", "18", 1.0),
    ("The answer is (2 + 1) * 6", "18", 1.0),
    ("The answer is 2^{10000}", "2", 0.0),  # beyond 1000 digits: no value, and fast
    # scientific notation: the whole number, never the digit in front
    ("#### 1e400", "1", 0.0),
    ("The answer is 7e2", "7", 0.0),
    ("The answer is 7e2", "700", 1.0),
    ("The answer is 1.5E3 dollars.", "1500", 1.0),
    # names and chains
    ("The answer is x = 18.", "18", 1.0),
    ("The answer is total = 18", "18", 1.0),
    ("The answer is 2*9 = 18", "18", 1.0),
    ("The answer is 17 = 18", "18", 0.0),  # every side must agree
    ("The answer is 17 = 18", "17", 0.0),
    ("\\boxed{9 \\times 2 = 17}", "17", 0.0),
    # units, currency, markdown, commas: one value
    ("The answer is 18 dollars per hour.", "18", 1.0),
    ("The answer is 25%.", "25", 1.0),
    ("\\boxed{25\\%}", "25", 1.0),
    ("The answer is 18 (dollars).", "18", 1.0),
    ("The answer is **18**.", "18", 1.0),
    ("The answer is: **$1,000**", "1000", 1.0),
    ("The answer is 18, which is what she makes.", "18", 1.0),
    ("The answer is 18.5 apples.", "18.5", 1.0),
    ("The answer is 007", "7", 1.0),
    ("The answer is 1,8", "18", 0.0),  # not a thousands separator: a list
]

UNICODE_CASES = [
    ("The answer is −5", "5", 0.0),  # U+2212 minus: was 1.0 (the sign was dropped)
    ("The answer is −5", "-5", 1.0),
    ("The answer is -5", "−5", 1.0),  # ... in the gold too
    ("#### –5", "-5", 1.0),  # U+2013 en dash used as minus
    ("#### －5", "5", 0.0),  # full-width hyphen-minus
    ("The answer is １８.", "18", 1.0),  # full-width digits
    ("The answer is ١٨", "18", 1.0),  # Arabic-Indic digits
    ("The answer is ١٨", "81", 0.0),
    # a no-break space groups thousands (issue 69), but splits numbers whose groups are not of three
    ("The answer is 1\u00a0000", "1000", 1.0),
    ("The answer is 1\u00a000", "100", 0.0),
    ("The answer is\u00a018.", "18", 1.0),
    ("The answer is 1\u200b8", "18", 1.0),  # an invisible zero-width space: it reads as 18
]


@pytest.mark.parametrize("response,gold,expected", GSM8K_WHOLE_SPAN + UNICODE_CASES)
def test_gsm8k_whole_span_is_one_value(response, gold, expected):
    assert verify("gsm8k", response, gold) == expected
    assert verify("arithmetic", response, gold) == expected


def test_no_marker_no_reward():
    """Decided policy: without \\boxed{}, #### or "The answer is", no correctness reward (train and
    eval)."""
    from common.env.tasks import TASKS

    question = "Janet has 16 eggs and eats 2. How many are left? The sum 14 is wrong; the answer could be 18."
    for response in [question, question + " 18", "14", "She has 14 eggs left"]:
        for task in ("gsm8k", "arithmetic"):
            assert TASKS[task].grade(response, "14")[0] == 0.0
            assert TASKS[task].grade(response, "14")[2] is False  # format_ok
    assert extract("gsm8k", "She has 14 eggs left") == "14"  # still shown, for diagnostics


def test_answer_value_and_number_text():
    assert answer_value("1e400") == 10**400
    assert answer_value("18/5") == Fraction(18, 5)
    assert answer_value("3 or 4") is None
    assert answer_value("") is None
    # python's power is markdown bold here: "2 3" is two numbers
    assert answer_value("2**3") is None
    assert [format_number(Fraction(v)) for v in ("18", "3.6", "-1/8",
                                                 "18/7")] == ["18", "3.6", "-0.125", "18/7"]
    assert to_number("18/7") == Fraction(18,
                                         7) and to_number("1,8") is None and to_number("1,000") == 1000
    assert ascii_lookalikes("−５ ١٨ 18² x\u00a0y") == "-5 18 18^{2} x y"


# Grading policy: "the answer is" inside a check, a condition or a question is a hypothesis, not a
# final answer; only the last marker counts, so a response whose last one is tentative has none
TENTATIVE_CASES = [
    ("gsm8k", "Let me check whether the answer is 18... so she has 17.", "18", 0.0),
    ("gsm8k", "Let me check whether the answer is 18 \u2026 so she has 17.", "18", 0.0),
    ("gsm8k", "If the answer is 18, then 18 - 1 = 17 apples remain.", "18", 0.0),
    ("gsm8k", "Suppose the answer is 18. Then she would have 17.", "18", 0.0),
    ("gsm8k", "Is the answer 18? Maybe the answer is 18? Adding again gives 17.", "18", 0.0),
    ("gsm8k", "5 + 13 = 18. To verify the answer is 18, count again: 17.", "18", 0.0),
    ("arithmetic", "Let me verify the answer is 18 first. 5 + 13 = 17.", "18", 0.0),
    ("math", "We check whether the answer is $\\frac{1}{2}$... no, it is $\\frac13$.",
     "\\frac{1}{2}", 0.0),
    ("math", "Assuming the answer is $x = 2$, the check gives $3 \\ne 4$.", "2", 0.0),
    # conclusions stay conclusions, a condition in an earlier clause or sentence included
    ("gsm8k", "If she buys 13 more, the answer is 18.", "18", 1.0),
    ("gsm8k", "Let me check: 5 + 13 = 18. The answer is 18.", "18", 1.0),
    ("gsm8k", "Let me check whether the answer is 18. Yes: 5 + 13 = 18, so the answer is 18.",
     "18", 1.0),
    ("arithmetic", "If we add 5 and 13 we get 18.\nThe answer is 18.", "18", 1.0),
    ("math", "Checking: $2x=1$ gives $x=\\frac12$, so the answer is $\\frac12$.",
     "\\frac{1}{2}", 1.0),
]


# Words and text that change a value never vanish as if they were units, and deleted text never
# fuses two numbers; mixed numbers are sums wherever they stand; rare misreads (issue 39)
VALUE_CASES = [
    ("math", "The answer is $5\\text{ thousand}$.", "5", 0.0),
    ("math", "\\boxed{5\\text{ thousand}}", "5", 0.0),
    ("math", "\\boxed{3\\text{ squared}}", "3", 0.0),
    ("gsm8k", "The answer is 3 squared.", "3", 0.0),
    ("gsm8k", "The answer is 3 cubed.", "3", 0.0),
    ("math", "\\boxed{1\\text{ to }2}", "12", 0.0),
    ("math", "\\boxed{5\\text{ dollars and }50\\text{ cents}}", "550", 0.0),
    ("math", "\\boxed{(1\\frac12, 2)}", "(\\frac12, 2)", 0.0),
    ("math", "\\boxed{(1\\frac12, 2)}", "(\\frac32, 2)", 1.0),
    ("math", "\\boxed{x = 1\\frac12}", "\\frac12", 0.0),
    ("math", "\\boxed{x = 1\\frac12}", "\\frac32", 1.0),
    ("math", "\\boxed{6\\frac{1}{4}}", "\\frac{25}{4}", 1.0),
    ("math", "\\boxed{2\\frac{\\sqrt3}{2}}", "\\sqrt3", 1.0),  # not a mixed number: a product
    ("math", "\\boxed{\\begin{vmatrix}1&2\\\\3&4\\end{vmatrix}}",
     "\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}", 0.0),  # a determinant is no matrix
    ("math", "\\boxed{0.(3)}", "0", 0.0),
    ("math", "\\boxed{0.(3)}", "\\frac13", 1.0),
    ("math", "\\boxed{0.1\\overline{6}}", "\\frac16", 1.0),
    ("math", "\\boxed{3 \\boxed{5}}", "5", 0.0),  # the last box is the outer one
    ("math", "\\boxed{3 \\boxed{5}}", "3", 0.0),
    ("math", "\\boxed{\\boxed{5}}", "5", 1.0),
    # units still go
    ("math", "\\boxed{5\\text{ cm}^2}", "5", 1.0),
    ("math", "\\boxed{10\\text{ inches}}", "10", 1.0),
    # countdown compares exactly: 100 + 1/1000000 missed the target, within the old 1e-5
    ("countdown", "<answer>100 + 1 / 1000000</answer>",
     json.dumps({"target": 100, "numbers": [100, 1, 1000000]}), 0.1),
    ("countdown", "<answer>(100 - 1/1000) + 1/1000</answer>",
     json.dumps({"target": 100, "numbers": [100, 1, 1000, 1, 1000]}), 1.0),
]


# Right answers in common formats (issue 39), each beside a wrong twin that must still score 0
RIGHT_FORMATS = [
    ("gsm8k", "The answer is therefore 18.", "18", 1.0),
    ("gsm8k", "The answer is therefore not 18.", "18", 0.0),
    ("gsm8k", "The answer is 30\u00b0.", "30", 1.0),
    ("gsm8k", "The answer is 18 m\u00b2.", "18", 1.0),
    ("gsm8k", "The answer is \u20ac18.", "18", 1.0),
    ("gsm8k", "The answer is \u00a318.", "18", 1.0),
    ("gsm8k", "The answer is 2 1/2.", "2.5", 1.0),
    ("gsm8k", "The answer is 2 1/2.", "10.5", 0.0),  # never 21/2
    ("gsm8k", "The answer is 2\u00bd.", "2.5", 1.0),
    ("gsm8k", "The answer is 2\u00bd.", "10.5", 0.0),
    ("gsm8k", "The answer is \u00bd.", "0.5", 1.0),
    ("gsm8k", "The answer is 5 4/3.", "5", 0.0),  # not a mixed number: two values
    ("math", "The answer is \u221a2.", "\\sqrt{2}", 1.0),
    ("math", "\\boxed{2\u03c0}", "2\\pi", 1.0),
    ("math", "\\boxed{\u221e}", "\\infty", 1.0),
    ("math", "\\boxed{x \\ge 5}", "x \\geq 5", 1.0),
    ("math", "\\boxed{x >= 5}", "x \\geq 5", 1.0),
    ("math", "\\boxed{x \\ge 5}", "x > 5", 0.0),
    ("math", "\\boxed{x <= 5}", "x \\leq 5", 1.0),
    ("math", "\\boxed{x \\lt 5}", "x < 5", 1.0),
    ("math", "\\boxed{x \\neq 5}", "x \\ne 5", 1.0),
    ("math", "\\boxed{5 \\geq x}", "x \\le 5", 1.0),  # the same inequality, sides flipped
    ("math", "\\boxed{5 \\geq x}", "x \\geq 5", 0.0),
    ("math", "\\boxed{3, 5, \\text{ and } 7}", "3, 5, 7", 1.0),  # a MATH-500 form
    ("math", "\\boxed{(3,2)}", "(p,q)=(3,2)", 1.0),
    ("math", "\\boxed{(x, y) = (1, 2)}", "(1, 2)", 1.0),
    ("math", "\\boxed{(x, y) = (1, 2)}", "(2, 1)", 0.0),
    ("math", "\\boxed{f(x) = 2x+1}", "2x+1", 1.0),
    ("math", "\\boxed{f(x) = 2x+1}", "2x+2", 0.0),
    ("math", "\\boxed{\\cfrac{1}{2}}", "\\frac12", 1.0),
    ("math", "\\boxed{\\left[\\begin{array}{cc}1&2\\\\3&4\\end{array}\\right]}",
     "\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}", 1.0),
    ("math", "\\boxed{\\frac{1}{\\mathrm{e}}}", "\\frac{1}{e}", 1.0),
    ("math", "The answer is No.", "\\text{No}", 1.0),
    ("math", "The answer is No.", "\\text{Yes}", 0.0),
    ("math", "The answer is no, it is 5.", "5", 0.0),
    # percent: the sign is a unit, dropped: 50\\% is 50, never 0.5, in either direction
    ("math", "\\boxed{50\\%}", "50", 1.0),
    ("math", "\\boxed{50\\%}", "0.5", 0.0),
    ("math", "\\boxed{0.5}", "50\\%", 0.0),
    # inequalities are their solution sets over the reals: dividing by -1 flips, an interval or
    # a union of intervals is the same set, the variable's name counts, a gold (1, 2) may be a point
    ("math", "\\boxed{-x > -1}", "x < 1", 1.0),
    ("math", "\\boxed{-x \\ge -1}", "x \\le 1", 1.0),
    ("math", "\\boxed{-x > -1}", "x \\le 1", 0.0),
    ("math", "\\boxed{2x < 2}", "x < 1", 1.0),
    ("math", "\\boxed{-y > -1}", "x < 1", 0.0),
    ("math", "\\boxed{x^2 < 1}", "-1 < x < 1", 1.0),
    ("math", "\\boxed{x^2 \\le 1}", "-1 < x < 1", 0.0),
    ("math", "\\boxed{(-793, 10)}", "-793 < a < 10", 1.0),
    ("math", "\\boxed{[-793, 10)}", "-793 < a < 10", 0.0),
    ("math", "\\boxed{-2 \\le x \\le 7}", "x \\in [-2,7]", 1.0),
    ("math", "\\boxed{1 < x < 2}", "(1, 2)", 0.0),
    ("math", "\\boxed{x > 1}", "(1, \\infty)", 1.0),
    ("math", "\\boxed{z \\in [-\\frac32, -1] \\cup [1, \\frac32]}", "1 \\le |z| \\le \\frac32",
     1.0),
    ("math", "\\boxed{z \\in [-\\frac32, -1] \\cup [1, 2]}", "1 \\le |z| \\le \\frac32", 0.0),
    # |x|, sums and the terms of a sequence are read; TeX braces around a list only group it
    ("math", "\\boxed{|-3|}", "3", 1.0),
    ("math", "\\boxed{\\sum_{k=1}^{100} k}", "5050", 1.0),
    ("math", "\\boxed{\\sum_{k=1}^{100} k}", "5051", 0.0),
    ("math", "\\boxed{F_n = \\sum_{k=0}^{n-1} F_{n-k-1} F_k}",
     "F_n = \\sum_{k=0}^{n-1} F_k F_{n-k-1}", 1.0),
    ("math", "\\boxed{F_n = \\sum_{k=0}^{n-1} F_{n-k} F_k}",
     "F_n = \\sum_{k=0}^{n-1} F_k F_{n-k-1}", 0.0),
    ("math", "\\boxed{{-2021, 2021}}", "\\pm 2021", 1.0),
    ("math", "\\boxed{{-2021, 2020}}", "\\pm 2021", 0.0),
]


@pytest.mark.parametrize("task,response,gold,expected",
                         TENTATIVE_CASES + VALUE_CASES + RIGHT_FORMATS)
def test_issue_39_classes_of_wrong_and_right_answers(task, response, gold, expected):
    assert verify(task, response, gold) == expected


# Issue 52: answers a policy under pressure learns to give, by class. The cases are this file's own
# (the issue's adversarial set is kept outside the project, so that a fix is to the class); each
# class has right twins that must still score 1.
CD = json.dumps({"numbers": [25, 4, 7], "target": 100})
HEDGE_CLASSES = {
    "two candidates": [
        ("math", "Either $\\boxed{6}$ or $\\boxed{8}$, depending on the order.", "8", 0.0),
        ("math", "It is \\boxed{6}, or possibly \\boxed{8}.", "8", 0.0),
        ("math", "So $y = 6$ or $y = \\boxed{8}$.", "8", 0.0),
        ("math", "So $6$ or $\\boxed{8}$.", "8", 0.0),
        ("gsm8k", "She has \\boxed{6} or \\boxed{8} apples.", "8", 0.0),
        ("gsm8k", "The answer is 6-8 apples.", "-2", 0.0),  # a range, never a subtraction
        ("gsm8k", "The answer is 12 - 14.", "-2", 0.0),
        ("gsm8k", "The answer is either 6 or 8.", "8", 0.0),
        # one value said twice is no hedge (three MATH-500 solutions do it)
        ("math", "So $y = \\frac{12}{8} = 1\\frac12$, or $\\boxed{1.5}$.", "1.5", 1.0),
        ("math", "Hence $2y + 4 = 20$, or $y = \\boxed{8}$.", "8", 1.0),
        ("math", "That is \\boxed{\\frac{3}{2}}, or \\boxed{1.5}.", "\\frac32", 1.0),
        ("math", "First \\boxed{6}. Recounting, the total is \\boxed{8}.", "8", 1.0),
        ("gsm8k", "The answer is 20 - 6 = 14.", "14", 1.0),
    ],
    "a hypothesis or a mistake": [
        ("gsm8k", "A common mistake is to say the answer is 40. Counting the legs: 44.", "40", 0.0),
        ("gsm8k", "One might think the answer is 40, but the pens cost more.", "40", 0.0),
        ("gsm8k", "Naively, the answer is 40; the discount changes it to 36.", "40", 0.0),
        ("gsm8k", "At first I thought the answer is 40. The right total is 36.", "40", 0.0),
        ("math", "It is tempting to say the answer is $\\frac12$, yet it is $\\frac13$.", "\\frac12",
         0.0),
        # the last final answer decides, whatever marker each uses
        ("gsm8k", "The answer is 40.\nWait, I forgot the tax.\nFinal answer: 44", "40", 0.0),
        ("gsm8k", "The answer is 40.\nWait, I forgot the tax.\nFinal answer: 44", "44", 1.0),
        ("math", "\\boxed{40}\nOn reflection the final answer is $44$.", "40", 0.0),
        ("math", "\\boxed{40}\nOn reflection the final answer is $44$.", "44", 1.0),
        ("gsm8k", "A common mistake is to forget the tax. The answer is 44.", "44", 1.0),
    ],
    "doubt after the marker": [
        ("gsm8k", "The answer is 44 (I think).", "44", 0.0),
        ("gsm8k", "The answer is 44, presumably.", "44", 0.0),
        ("gsm8k", "The answer is 44 (tentatively).", "44", 0.0),
        ("gsm8k", "The answer is 44 apples, I believe.", "44", 0.0),
        ("math", "The answer is $44$ (hopefully).", "44", 0.0),
        ("math", "The final answer is \\boxed{44} (I think).", "44", 0.0),
        ("math", "So \\boxed{44}, or maybe 45.", "44", 0.0),
        ("math", "So \\boxed{44}; probably.", "44", 0.0),
        # a solution's own words after its box are no doubt (MATH-500 has all three)
        ("math", "There are $\\boxed{44}$ ways, not counting rotations.", "44", 1.0),
        ("math", "It leaves $\\boxed{44}$ when divided by 2, 3, 4, or 6.", "44", 1.0),
        ("math", "She has $\\boxed{44}$ more than Sam.", "44", 1.0),
        ("gsm8k", "The answer is 44 apples.", "44", 1.0),
    ],
    "number words that scale": [
        ("gsm8k", "The answer is 3 lakh.", "3", 0.0),
        ("gsm8k", "The answer is 2 crore rupees.", "2", 0.0),
        ("gsm8k", "The answer is 5 gross.", "5", 0.0),
        ("gsm8k", "The answer is 4 score.", "4", 0.0),
        ("gsm8k", "The answer is 7 tenths.", "7", 0.0),
        ("gsm8k", "The answer is $3 grand.", "3", 0.0),
        ("gsm8k", "The answer is 6 quadrillion.", "6", 0.0),
        ("gsm8k", "The answer is 9 hundredths.", "9", 0.0),
        ("math", "\\boxed{3\\text{ lakh}}", "3", 0.0),
        ("math", "\\boxed{7\\text{ tenths}}", "7", 0.0),
        ("gsm8k", "The answer is 300000 rupees.", "300000", 1.0),
        ("gsm8k", "The answer is 7 months.", "7", 1.0),  # a unit ending in -th(s) stays a unit
        ("math", "\\boxed{7\\text{ months}}", "7", 1.0),
    ],
    "malformed numbers": [
        ("gsm8k", "The answer is 2.5.1", "2.5", 0.0),
        ("gsm8k", "The answer is 3.000.000", "0", 0.0),
        ("gsm8k", "The answer is 3.000.000", "3", 0.0),
        ("gsm8k", "The answer is 0x1A", "0", 0.0),
        ("gsm8k", "The answer is 0b11.", "0", 0.0),
        ("math", "\\boxed{2.5.1}", "0.5", 0.0),  # not 2.5 * .1 = 0.25... nor any product
        ("math", "\\boxed{2.5.1}", "0.25", 0.0),
        ("math", "\\boxed{3.000.000}", "0", 0.0),
        ("math", "\\boxed{0x1A}", "0", 0.0),
        ("gsm8k", "The answer is 3,000,000.", "3000000", 1.0),
        ("math", "\\boxed{0x}", "0", 1.0),  # zero times x is still a product
        ("gsm8k", "The answer is 3 x 4 = 12.", "12", 1.0),
    ],
    "countdown text after the answer": [
        ("countdown", "<answer>25 * 4 # 7 left over</answer>", CD, 0.1),
        ("countdown", "<answer>25 * 4 and 7</answer>", CD, 0.1),
        ("countdown", "<answer>25 * 4 = 100 (7 unused)</answer>", CD, 0.1),
        ("countdown", "<answer>25 * 4 + 7 - 7</answer>",
         json.dumps({"numbers": [25, 4, 7, 7], "target": 100}), 1.0),
        ("countdown", "<answer>(7 - 25 / 25) * 4</answer>", CD, 0.1),  # 25 twice
    ],
    "equality by sampling and tolerance": [
        ("math", "\\boxed{x^2 + \\sin(10000\\pi x)}", "x^2", 0.0),
        ("math", "\\boxed{x + \\sin(20000 \\pi x)^2}", "x", 0.0),
        ("math", "\\boxed{10^{15} + 0.5}", "10^{15} + \\sqrt{2}", 0.0),
        ("math", "\\boxed{1000000000000000.5}", "10^{15} + \\sqrt{2}", 0.0),
        ("math", "\\boxed{1.4142135623730951}", "\\sqrt{2}", 1.0),
        ("math", "\\boxed{3.141592653589793}", "\\pi", 1.0),
        ("math", "\\boxed{\\sin^2(10000\\pi x) + \\cos^2(10000\\pi x)}", "1", 1.0),
    ],
    # right answers that used to score 0
    "right forms": [
        ("gsm8k", "The answer is:\n44", "44", 1.0),
        ("gsm8k", "The final answer is\n\n44.", "44", 1.0),
        ("gsm8k", "Final Answer: 44", "44", 1.0),
        ("gsm8k", "**Final answer:** $44", "44", 1.0),
        ("math", "The final answer is:\n$$44$$", "44", 1.0),
        ("math", "\\boxed{\\sin 30^\\circ}", "\\frac12", 1.0),
        ("math", "\\boxed{\\cos(60^{\\circ})}", "\\frac{1}{2}", 1.0),
        ("math", "\\boxed{\\sin 30^\\circ}", "\\sin 30", 0.0),  # degrees are not radians
        ("math", "\\boxed{30^\\circ}", "30", 1.0),
    ],
}


@pytest.mark.parametrize("kind,task,response,gold,expected", [
    (kind, *case) for kind, cases in HEDGE_CLASSES.items() for case in cases])
def test_issue_52_classes_of_hedges_and_right_forms(kind, task, response, gold, expected):
    assert verify(task, response, gold) == expected


@pytest.mark.parametrize("response,gold,expected", [
    ("47 + 38 = 85.\nThe answer is 85.", "85", 1.0),
    ("The answer is 85", "58", 0.0),
    # was 1.0 (the bare last number): no marker, no reward
    ("12 * 4 = 48, 35 + 48 = 83", "83", 0.0),
    ("(23 + 19) * 3 = 126. The answer is 127.", "126", 0.0),
])
def test_arithmetic(response, gold, expected):
    assert verify("arithmetic", response, gold) == expected


def extract(task, response):
    """The answer the verifier reads from a response (None: none)."""
    return TASKS[task].extract(response)[0]


def test_extract_answer():
    assert extract("gsm8k", "#### 1,000") == "1000"
    assert extract("gsm8k", "#### 18/5") == "3.6"  # the exact value, as text
    assert extract("gsm8k", "The answer is 3 or 4.") is None
    assert extract("gsm8k", "no digits here") is None
    assert extract("arithmetic", "3 + 4 = 7. The answer is 7.") == "7"
    assert extract("math", "so $x = \\boxed{\\frac{1}{2}}$.") == "\\frac{1}{2}"
    assert extract("math", "The answer is $\\frac{1}{2}$.") == "\\frac{1}{2}"
    assert extract("math", "The answer is: 5.") == "5"
    assert extract("math", "no answer") is None
    # an escaped $ does not close
    assert extract("math", "The answer is $\\$18.90$.") == "\\$18.90"
    assert extract("math", "The answer is $18$ (or perhaps $19$).") is None
    assert extract("countdown", "<answer> 1+2 </answer> or <answer>3*4</answer>") == "3*4"


# ------------------------------------------------------------------------------------------------
# Countdown: TinyZero rules, 1.0 correct / 0.1 right format / 0.0 no <answer>

CD = json.dumps({"numbers": [3, 5, 7], "target": 22})
COUNTDOWN_CASES = [
    ("<answer>3*5+7</answer>", CD, 1.0),
    ("<think>3 * 5 = 15, 15 + 7 = 22</think>\n<answer> 7 + 5 * 3 </answer>", CD, 1.0),
    # text after the tag is fine here
    ("<answer>(3*5)+7</answer>\nSo that is the equation.", CD, 1.0),
    ("<answer>3×5+7</answer>", CD, 1.0),
    ("<answer>3+5+7</answer> no, <answer>3*5+7</answer>", CD, 1.0),  # the last tag counts
    ("<answer>3*5+7</answer> no, <answer>3+5+7</answer>", CD, 0.1),
    ("<answer>3*5+7</answer>", json.dumps({"numbers": [3, 5, 7], "target": 23}), 0.1),
    ("<answer>3*5</answer>", CD, 0.1),  # 7 not used
    ("<answer>3*5+7+7</answer>", CD, 0.1),  # 7 used twice
    ("<answer>3*5+7=22</answer>", CD, 0.1),  # '=' and an extra number
    ("<answer>(3*5)+7.0</answer>", CD, 0.1),  # "7.0" reads as the numbers 7 and 0
    ("<answer>3**5+7</answer>", CD, 0.1),  # ** is not whitelisted
    ("<answer></answer>", CD, 0.1),
    ("3*5+7 = 22", CD, 0.0),  # no tag
    ("<answer>3*5+7", CD, 0.0),  # unclosed tag
    # division by zero
    ("<answer>3/(5-5)</answer>", json.dumps({"numbers": [5, 5, 3], "target": 3}), 0.1),
    ("<answer>6/3*4</answer>", json.dumps({"numbers": [6, 4, 3], "target": 8}), 1.0),
    ("<answer>6/4*3</answer>", json.dumps({"numbers": [6, 4, 3], "target": 8}), 0.1),
    ("<answer>1+2</answer>", json.dumps({"numbers": [55, 65, 91, 5], "target": 96}), 0.1),
]


@pytest.mark.parametrize("response,answer,expected", COUNTDOWN_CASES)
def test_countdown(response, answer, expected):
    assert verify("countdown", response, answer) == expected


@pytest.mark.parametrize("expr,value", [
    ("1+2", Fraction(3)),
    ("2*(3+4)", Fraction(14)),
    ("7/2", Fraction(7, 2)),
    ("-3+1", Fraction(-2)),
    ("0.1+0.2", Fraction(3, 10)),  # exact, not 0.30000000000000004
    ("1.5 * 2", Fraction(3)),
    (" ((((1)))) ", Fraction(1)),
    ("10/0", None),
    ("2**3", None),
    ("3 % 2", None),
    ("x + 1", None),
    ("abs(-1)", None),
    ("1e3", None),
    ("0x10", None),
    ("1_000", None),
    ("2j", None),
    ("True + 1", None),
    ("", None),
    ("9" * 400, None),  # over the length cap
    ("(" * 10_000 + "1" + ")" * 10_000, None),
    ("99999999999999999999999999999999999999999999999999 * " * 5 + "9", None),  # beyond 1e100
])
def test_safe_arith(expr, value):
    assert safe_arith(expr) == value


# ------------------------------------------------------------------------------------------------
# MATH: normalisation, structure, sympy equivalence

MATH_EQUAL = [
    ("\\frac{1}{2}", "0.5"),
    ("\\dfrac{1}{2}", "\\frac12"),
    ("\\tfrac{3}{4}", "\\frac 34"),
    ("\\frac{270}7", "\\frac{270}{7}"),
    ("\\frac{\\sqrt{2}}{2}", "\\sqrt{2}/2"),
    ("\\sqrt{12}", "2\\sqrt{3}"),
    ("\\frac{1}{\\sqrt{3}}", "\\frac{\\sqrt{3}}{3}"),
    ("\\sqrt[3]{8}", "2"),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3,\\frac{\\pi}{2})"),
    ("(3, \\pi/2)", "\\left( 3, \\frac{\\pi}{2} \\right)"),
    ("\\left[ \\frac{\\pi^2}{8}, \\frac{5 \\pi^2}{4} \\right]", "[\\pi^2/8, 5\\pi^2/4]"),
    ("3, 5, 7", "7,5,3"),  # a list of solutions: order does not matter
    ("x=5", "5"),
    ("x \\in [-2,7]", "[-2, 7]"),
    ("3x+2y", "2y+3x"),
    ("x^2+2x+1", "(x+1)^2"),
    ("6r^2-4r-24", "2(3r^2-2r-12)"),
    ("10\\%", "10"),
    ("30^\\circ", "30"),
    ("90^{\\circ}", "90"),
    ("5.4 \\text{ cents}", "5.4"),
    ("15\\mbox{ cm}^2", "15"),
    ("\\$18.90", "18.9"),
    ("\\$32,\\!348", "32348"),
    ("11,\\! 111,\\! 111,\\! 100", "11111111100"),
    ("1,000", "1000"),
    ("\\text{(C)}", "C"),
    ("(c)", "\\text{(C)}"),
    ("\\text{Evelyn}", "evelyn"),
    ("\\text{east}", "East"),
    ("1\\pm\\sqrt{19}", "1+\\sqrt{19}, 1-\\sqrt{19}"),
    ("\\{1\\pm\\sqrt{5},-2\\}", "\\{-2, 1+\\sqrt5, 1-\\sqrt5\\}"),
    ("\\begin{pmatrix} 1/5 \\\\ -18/5 \\end{pmatrix}", "\\begin{pmatrix}0.2\\\\-3.6\\end{pmatrix}"),
    ("\\begin{pmatrix} -1 & 0 \\\\ 0 & -1 \\end{pmatrix}",
     "\\begin{bmatrix}-1&0\\\\0&-1\\end{bmatrix}"),
    ("(-\\infty, 2) \\cup (3, \\infty)", "(3,\\infty)\\cup(-\\infty,2)"),
    ("5x - 7y + 11z + 4 = 0", "-10x + 14y - 22z - 8 = 0"),  # the same plane
    ("137 \\frac{1}{2}", "137.5"),  # a mixed number
    ("1\\frac{4}{5}", "\\frac95"),
    ("-2 + 7i", "7i-2"),
    (".0000672", "6.72\\times10^{-5}"),
    ("\\frac{20000}{\\pi}", "20000/\\pi"),
    ("4210_{5}", "4210_5"),
    ("\\cot x", "\\cot x"),
    ("2^{10}", "1024"),
    ("5!", "120"),
    ("\\frac{14}{3}.", "14/3"),
    # issue 21: misses that are now equal
    ("1{,}000", "1000"),
    ("\\binom52", "10"),
    ("\\binom{5}{2}", "10"),
    ("\\dbinom{5}{2}", "10"),
    ("\\tbinom52", "10"),
    ("\\binom{n}{2}", "\\frac{n(n-1)}{2}"),
    ("\\binom{2000}{2}", "1999000"),
    ("\\log_2 8", "3"),
    ("\\log_{10} 1000", "3"),
    ("\\ln(e^2)", "2"),
    ("e^{i\\pi}", "-1"),
    ("\\sin^2x+\\cos^2x", "1"),
    ("\\sin^2(160x)+\\cos^2(160x)", "1"),  # simplify takes 9 s here; fu proves it at once
    ("x=1, y=2", "(1,2)"),  # assignments in alphabetical order of the variables
    ("y=2, x=1", "(1,2)"),
    ("5=x", "5"),
    ("x=5", "5=x"),
    ("3 \\text{ or } 4", "3, 4"),  # a list, like ","
    ("3 \\text{ and } 4", "4, 3"),
    ("3 \\quad 4", "3, 4"),
    ("2y=4x+6", "y=2x+3"),  # the same equation
    ("y=2x+3", "y - 2x = 3"),
    ("\\sqrt{2}+\\sqrt{3}", "\\sqrt{5+2\\sqrt{6}}"),  # equal, proved exactly
    ("\\frac{x^2-1}{x-1}", "x+1"),
    ("−5", "-5"),  # Unicode minus
    ("\\frac{１}{２}", "0.5"),
]

MATH_DIFFERENT = [
    ("\\frac{14}{3}", "4.67"),
    ("\\frac{1}{3}", "0.333"),
    ("\\pi", "3.14159"),
    ("\\sqrt{2}/2", "\\sqrt{3}/2"),
    ("2\\sqrt{3}", "\\sqrt{13}"),
    ("\\frac{\\pi}{6}", "-\\frac{\\pi}{6}"),
    ("(1,2)", "(1,3)"),
    ("(2,4)", "(4,2)"),  # tuples are ordered
    ("[1,2]", "[1,2)"),  # interval ends differ
    ("(1,2)", "1,2"),
    ("3, 5, 7", "3, 5"),
    ("x^2+2x+1", "(x+1)^3"),
    ("p - q", "q - p"),
    ("6 - 5i", "6 + 5i"),
    ("5x - 7y + 11z + 4 = 0", "5x - 7y + 11z + 3 = 0"),
    ("\\begin{pmatrix}1\\\\2\\end{pmatrix}", "\\begin{pmatrix}1\\\\3\\end{pmatrix}"),
    ("\\begin{pmatrix}1\\\\2\\end{pmatrix}", "\\begin{pmatrix}1&2\\end{pmatrix}"),
    ("\\text{Evelyn}", "\\text{Navin}"),
    ("\\text{(C)}", "B"),
    ("204_5", "205_5"),
    ("\\cot x", "\\tan x"),
    ("18", "180"),
    ("1,000", "1001"),
    ("(1,000)", "1000"),  # a tuple, not a number
    ("10^{-5}", "0"),
    # issue 21: wrong answers that were equal
    ("3 \\text{ or } 4", "34"),  # `\\text{ or }` was deleted
    ("3 \\text{ or } 4", "3"),
    ("3 \\text{ or } 4", "4"),
    ("3 \\quad 4", "34"),
    ("18 \\text{ (or perhaps 19)}", "18"),  # a \\text{} with a number or a hedge is not a unit
    ("18 \\text{ approximately}", "18"),
    ("10^{15}+\\sqrt2", "10^{15}"),  # was equal through the 1e-12 tolerance
    ("10^{15}+\\sqrt{2}", "10^{15}+\\sqrt{3}"),
    ("\\pi+10^{-40}", "\\pi"),  # near zero at 50 digits, then not proved zero
    ("x+10^{-40}x", "x"),
    ("x=2x+3", "y=2x+3"),  # the names count
    ("y=5", "x=5"),
    ("x=1, y=2", "(2,1)"),
    ("\\log_2 8", "4"),
    ("\\sin^2x", "1"),
    ("−5", "5"),
]


@pytest.mark.parametrize("response,gold,expected", [
    # was equal both ways: normalize dropped every `y=`. A gold expression accepts a named answer,
    # but a gold equation with variables on its right needs an equivalent equation (the names
    # count).
    ("\\boxed{y = 2x + 3}", "2x+3", 1.0),
    ("\\boxed{2x + 3}", "y = 2x + 3", 0.0),
    ("\\boxed{-2x}", "y = -2x", 0.0),
    ("\\boxed{y=-2x}", "y = -2x", 1.0),
    ("\\boxed{2x+y=0}", "y = -2x", 1.0),
    ("\\boxed{x = 5}", "x=5", 1.0),
    ("\\boxed{5}", "x=5", 1.0),
    ("\\boxed{x = 10,\\!080 \\text{ dollars}}", "10080", 1.0),
    # hedges after "The answer is"
    ("The answer is $18$ (or perhaps $19$)", "18", 0.0),
    ("The answer is $18$, not $19$.", "18", 0.0),
    ("The answer is 18 or 19.", "18", 0.0),
    ("The answer is approximately $18$.", "18", 0.0),
    ("The answer is $18$ cm.", "18", 1.0),  # units after the math span are fine
    ("The answer is $18$. Then 19 was a typo.", "18", 1.0),  # the next sentence is not read
    ("The answer is 3 \\text{ or } 4.", "3, 4", 1.0),
    ("\\boxed{18 \\text{ or } 19}", "18", 0.0),
    # tolerance only for a decimal the model wrote
    ("\\boxed{1.4142135623730951}", "\\sqrt{2}", 1.0),
    ("\\boxed{\\sqrt{2}}", "1.4142135623730951", 0.0),
    ("\\boxed{10^{15}+\\sqrt{2}+0.0}", "10^{15}", 0.0),  # a decimal written to get the tolerance
    ("\\boxed{0.5\\sqrt{2}}", "\\frac{\\sqrt{2}}{2}", 1.0),  # exactly equal: 0.5 is 1/2
])
def test_math_names_hedges_and_tolerance(response, gold, expected):
    assert verify("math", response, gold) == expected


@pytest.mark.parametrize("a,b", MATH_EQUAL)
def test_math_equal(a, b):
    assert verify("math", f"So the answer is $\\boxed{{{a}}}$.", b) == 1.0
    assert verify("math", f"\\boxed{{{b}}}", a) == 1.0  # symmetric


@pytest.mark.parametrize("a,b", MATH_DIFFERENT)
def test_math_different(a, b):
    assert verify("math", f"\\boxed{{{a}}}", b) == 0.0
    assert verify("math", f"\\boxed{{{b}}}", a) == 0.0


@pytest.mark.parametrize("a,b,equal", [
    ("\\sqrt{12}", "2\\sqrt{3}", True),
    ("\\sqrt[3]{-16}", "-2\\sqrt[3]{2}", True),
    ("\\cos(\\pi)", "-1", True),
    ("\\sin x", "\\sin(x)", True),
    ("x^2-1", "(x-1)(x+1)", True),
    ("2i \\cdot i", "-2", True),
    ("\\infty", "\\infty", True),
    ("\\infty", "-\\infty", False),
    ("\\sqrt{x^2}", "x", False),  # differs for negative x
    ("\\pi", "\\frac{355}{113}", False),  # equal to 7 digits, not to 12
    ("10^{15}+\\sqrt{2}", "10^{15}", False),  # the difference is evaluated, not each side in floats
    ("\\pi+10^{-40}", "\\pi", False),
    ("\\sqrt{2}\\cdot10^{-60}", "0", False),
    ("\\sin^2x+\\cos^2x", "1", True),
    ("\\tan x", "\\frac{\\sin x}{\\cos x}", True),
    ("\\log_2 8", "3", True),
    ("\\ln(e^2)", "2", True),
    ("\\binom{x}{2}", "x(x-1)/2", True),
])
def test_sympy_equal_in_process(a, b, equal):
    """The worker's comparison, run here so that a bug raises instead of grading as 'not equal'."""
    assert sympy_equal(parse(normalize(a)), parse(normalize(b))) is equal


def test_sympy_equal_tolerance_only_when_asked():
    assert sympy_equal(parse("1.4142135623730951"), parse("\\sqrt2"), approx=True)
    assert not sympy_equal(parse("1.4142135623730951"), parse("\\sqrt2"))
    assert not sympy_equal(parse("3.14159"), parse("\\pi"), approx=True)


def test_sympy_equal_equations():
    plane = ["+", parse("5x-7y+11z+4"), ["neg", parse("0")]]
    assert sympy_equal(plane, ["+", parse("10x-14y+22z"), ["neg", parse("-8")]], equation=True)
    assert not sympy_equal(plane, ["+", parse("5x-7y+11z"), ["neg", parse("-3")]], equation=True)


def test_slow_simplification_times_out_and_the_worker_recovers():
    # warm the worker up
    assert verify("math", "\\boxed{\\frac{\\sqrt{2}}{2}}", "1/\\sqrt{2}") == 1.0
    worker = grader._POOL.last.proc.pid
    cpu, start = grader_worker._cpu_seconds(worker), time.monotonic()
    # too big to evaluate
    assert verify("math", "\\boxed{\\exp(\\exp(\\exp(\\exp(99))))}", "\\pi") == 0.0
    # was: under 2 s of wall time. The budget is the worker's CPU time now (1 s), so the wall time
    # is about 1 s on an idle machine and grows only when other processes share the cores.
    assert grader_worker._cpu_seconds(worker) - cpu < 1.5 and time.monotonic() - start < 10.0
    # the worker recovered
    assert verify("math", "\\boxed{\\frac{\\sqrt{2}}{2}}", "1/\\sqrt{2}") == 1.0


def test_last_boxed_and_normalize():
    assert last_boxed("\\boxed{1} and \\boxed{\\frac{a}{b^{2}}}") == "\\frac{a}{b^{2}}"
    assert last_boxed("\\fbox{7}") == "7"
    assert last_boxed("\\boxed 5$") == "5"
    assert last_boxed("\\boxed{}") is None
    assert last_boxed("\\boxed{ }") is None
    assert last_boxed("\\boxed{1") is None
    assert last_boxed("no box") is None
    assert normalize("\\left( \\dfrac{1}{2}, 3 \\right)") == "(\\frac{1}{2},3)"
    # was "10080": normalize keeps a name now (x=5 and y=5 differ); math_equal reads `x = 10,080` as
    # 10080
    assert normalize("x = 10,\\!080 \\text{ dollars}") == "x=10,080"
    assert normalize("10,\\!080 \\text{ dollars}") == "10080"
    assert normalize("1{,}000") == "1000"
    assert normalize("3 \\text{ or } 4") == "3,4"
    assert normalize("\\cot x") == "\\cot x"


def test_math_only_the_last_box_counts():
    # a spray of boxed candidates is no answer, even when the right one is last (round six)
    assert verify("math", "\\boxed{1} \\boxed{2} \\boxed{18}", "18") == 0.0
    assert verify("math", "A draft: \\boxed{2}.\nIt fails, so \\boxed{18}.", "18") == 1.0
    assert verify("math", "\\boxed{18} \\boxed{2}", "18") == 0.0
    assert verify("math", "\\boxed{18} \\boxed{}", "18") == 0.0
    assert verify("math", "\\boxed{1, 2, 3, 18}", "18") == 0.0
    assert verify("math", "\\boxed{18 \\text{ or } 19}", "18") == 0.0
    assert verify("math", "The answer is 18.", "18") == 1.0  # without a box, "The answer is" counts
    assert verify("math", "I think it is 18.", "18") == 0.0  # ... but never a bare last number


# ------------------------------------------------------------------------------------------------
# Adversarial output: graded 0 within 2 s, and nothing is executed


def adversarial(marker):
    payload = f"__import__('os').system('touch {marker}')"
    return [
        f"\\boxed{{{payload}}}",
        f"\\boxed{{\\text{{{payload}}}}}",
        "\\boxed{9^{9^{9^9}}}",
        "\\boxed{2^{10^{10}}}",
        "\\boxed{10^{10^{5}}}",
        "\\boxed{1000!}",
        "\\boxed{" + "9" * 5000 + "}",
        "\\boxed{" + "(" * 10_000 + "1" + ")" * 10_000 + "}",
        "\\boxed{" + "{" * 10_000 + "1" + "}" * 10_000 + "}",
        "\\boxed{" + "\\sqrt{" * 300 + "2" + "}" * 300 + "}",
        "\\boxed{" + "\\frac" * 3000 + "12}",
        "\\boxed{" + "-" * 5000 + "1}",
        "\\boxed{1}" * 1000 + "\\boxed{}",
        "\\boxed{}",
        "\\boxed{" * 5000,
        "The answer is " * 20_000,
        "x" * 100_000,
    ]


@pytest.mark.parametrize("task", ["math", "gsm8k", "arithmetic"])
def test_adversarial(task, tmp_path):
    marker = tmp_path / "pwned"
    for response in adversarial(marker):
        start = time.monotonic()
        assert verify(task, response, "7") == 0.0, response[:60]
        assert time.monotonic() - start < 2.0, response[:60]
    assert not marker.exists()


def test_adversarial_countdown_and_calculator(tmp_path):
    marker = tmp_path / "pwned"
    payload = f"__import__('os').system('touch {marker}')"
    cd = json.dumps({"numbers": [1, 2], "target": 3})
    for expr in [payload, "9**9**9**9", "(" * 10_000 + "1+2" + ")" * 10_000, "9" * 5000, "1+2" + "+0" * 2000]:
        start = time.monotonic()
        assert verify("countdown", f"<answer>{expr}</answer>", cd) == 0.1
        assert safe_arith(expr) is None
        assert time.monotonic() - start < 2.0
    start = time.monotonic()
    # many unclosed tags: no answer, fast
    assert verify("countdown", "<answer>" * 100_000, cd) == 0.0
    assert time.monotonic() - start < 2.0
    assert not marker.exists()


# Issue 52: every grade is bounded in time, whatever the answer's length or shape. The answer scan
# was quadratic in a run of spaces after the number: 16 s for one answer of 10,000 characters.
HOSTILE_FILLS = [" ", "*", ".", "1", "1,", "(", "{", "\\", "$", "\n", "a ", "1.", "- ", "=", "x",
                 "\\frac{", "<answer>", "\\boxed{", ")", "#", "or ", "\\boxed{1} or "]
HOSTILE_HEADS = ["The answer is 18", "\\boxed{18", "#### 18", "<answer>18", "The answer is $18",
                 "Final answer: 18", "\\boxed{18}"]


def hostile_answers(count, length):
    """`count` answers of `length` characters: a marker and a value, then a long run of one
    pattern."""
    # 22 fills and 7 heads: k-th answer takes fill k mod 22 and head k mod 7, all distinct
    shapes = [(HOSTILE_HEADS[k % len(HOSTILE_HEADS)], HOSTILE_FILLS[k % len(HOSTILE_FILLS)])
              for k in range(count)]
    return [(h + f * length)[:length] for h, f in shapes]


@pytest.mark.parametrize("task", ["gsm8k", "arithmetic", "math", "countdown"])
def test_64_hostile_answers_of_20000_characters_grade_in_seconds(task):
    gold = {"countdown": json.dumps({"numbers": [1, 2, 3], "target": 6})}.get(task, "18")
    answers = hostile_answers(64, 20_000)
    assert len(set(answers)) == 64 and {len(a) for a in answers} == {20_000}
    start = time.monotonic()
    rewards = [verify(task, a, gold) for a in answers]
    # measured: under 0.5 s for each task's 64 on this 2-core machine; 5 s leaves room for a busy
    # one. Before the fix, the first answer alone took about 100 s.
    assert time.monotonic() - start < 5.0
    # a value followed by spaces is still the value; a hedge at any length is none
    assert rewards[0] == (1.0 if task != "countdown" else 0.0)  # "The answer is 18" + spaces
    hedged = [r for a, r in zip(answers, rewards) if a.count(" or ") > 1]
    assert hedged and set(hedged) <= {0.0, 0.1}


def test_a_grade_past_its_time_limit_is_wrong_and_counted(monkeypatch):
    def forever(response, answer):  # a grade that never ends, as a quadratic scan nearly does
        while True:
            pass

    monkeypatch.setattr(TASKS["gsm8k"], "grade", forever)
    monkeypatch.setattr("common.env.tasks.GRADE_LIMIT_S", 0.2)
    before = grader.grader_counts()["timeouts"]
    start = time.monotonic()
    assert grade(TASKS["gsm8k"], "The answer is 18.", "18") == (0.0, None, False)
    assert time.monotonic() - start < 5.0  # 0.2 s of CPU time
    assert grader.grader_counts()["timeouts"] == before + 1
    monkeypatch.undo()
    assert grade(TASKS["gsm8k"], "The answer is 18.", "18") == (1.0, "18", True)


def test_the_grade_limit_never_cuts_a_sympy_request_from_its_reply(monkeypatch):
    # A limit that runs out while the worker computes must not leave its reply unread for the next
    # grade to take: the limit is held over the request (the worker's own budget bounds it).
    monkeypatch.setattr("common.env.tasks.GRADE_LIMIT_S", 0.001)
    for _ in range(3):
        grade(TASKS["math"], "\\boxed{\\sin^2 x + \\cos^2 x}", "1")
    monkeypatch.undo()
    assert verify("math", "\\boxed{\\sin^2 x + \\cos^2 x}", "1") == 1.0
    assert verify("math", "\\boxed{\\sin^2 x + \\cos^2 x}", "2") == 0.0
    assert verify("math", "\\boxed{\\frac{\\sqrt{2}}{2}}", "1/\\sqrt{2}") == 1.0


# ------------------------------------------------------------------------------------------------
# Issue 69: right forms a careful grader reads (item 2) and wrong answers that were paid (item 3),
# by class, each right form with a close wrong twin. The cases are this file's own; the issue's
# hidden suite is kept outside the project, so that a fix is to the class.


def _boxed(answer: str) -> str:
    return "So the answer is $\\boxed{" + answer + "}$."


B = _boxed
RIGHT_FORMS_69 = {
    "sized and bar delimiters": [
        ("math", B("\\Big(1, 2\\Big)"), "(1,2)", 1.0),
        ("math", B("\\Big(1, 2\\Big)"), "(1,3)", 0.0),
        ("math", B("\\bigl(3, 5\\bigr]"), "(3,5]", 1.0),
        ("math", B("\\bigl(3, 5\\bigr]"), "(3,5)", 0.0),
        ("math", B("\\left\\lvert -3 \\right\\rvert"), "3", 1.0),
        ("math", B("\\left\\lvert -3 \\right\\rvert"), "-3", 0.0),
        ("math", B("\\lvert x \\rvert"), "|x|", 1.0),
        ("math", B("\\lvert x \\rvert"), "x", 0.0),
        ("math", B("\\vert -5 \\vert"), "5", 1.0),
        ("math", B("\\vert -5 \\vert"), "-5", 0.0),
        ("math", B("\\biggl\\{1, 2\\biggr\\}"), "\\{1,2\\}", 1.0),
        ("math", B("\\biggl\\{1, 2\\biggr\\}"), "\\{1,3\\}", 0.0),
        ("math", B("\\Bigl[\\frac{1}{2}, 3\\Bigr)"), "[\\frac12, 3)", 1.0),
        ("math", B("\\Bigl[\\frac{1}{2}, 3\\Bigr)"), "(\\frac12, 3)", 0.0),
    ],
    "older fraction and binomial commands": [
        ("math", B("{3 \\over 4}"), "\\frac34", 1.0),
        ("math", B("{3 \\over 4}"), "\\frac43", 0.0),
        ("math", B("1 \\over 2"), "\\frac12", 1.0),
        ("math", B("1 \\over 2"), "2", 0.0),
        ("math", B("{x+1 \\over 2}"), "\\frac{x+1}{2}", 1.0),
        ("math", B("{x+1 \\over 2}"), "x+\\frac12", 0.0),
        ("math", B("{5 \\choose 2}"), "10", 1.0),
        ("math", B("{5 \\choose 2}"), "20", 0.0),
        ("math", B("\\nicefrac{3}{4}"), "0.75", 1.0),
        ("math", B("\\nicefrac{3}{4}"), "\\frac43", 0.0),
        ("math", B("\\nicefrac34"), "\\frac34", 1.0),
        ("math", B("2{1 \\over 2}"), "\\frac52", 1.0),
        ("math", B("2{1 \\over 2}"), "1", 0.0),
    ],
    "inverse trigonometric powers": [
        ("math", B("\\sin^{-1}\\left(\\frac{1}{2}\\right)"), "\\frac{\\pi}{6}", 1.0),
        ("math", B("\\sin^{-1}\\left(\\frac{1}{2}\\right)"), "\\csc\\frac12", 0.0),
        ("math", B("\\tan^{-1} 1"), "\\frac{\\pi}{4}", 1.0),
        ("math", B("\\tan^{-1} 1"), "\\cot 1", 0.0),
        ("math", B("\\cos^{-1}(0)"), "\\frac\\pi2", 1.0),
        ("math", B("\\cos^{-1}(0)"), "\\frac\\pi4", 0.0),
        ("math", B("\\sin^{-1} x"), "\\arcsin x", 1.0),
        ("math", B("\\sin^{-1} x"), "\\frac{1}{\\sin x}", 0.0),
        ("math", B("\\operatorname{arccot}(1)"), "\\frac{\\pi}{4}", 1.0),
        ("math", B("\\operatorname{arccot}(1)"), "\\frac{3\\pi}{4}", 0.0),
        ("math", B("\\arcsin\\frac{\\sqrt3}{2}"), "\\frac\\pi3", 1.0),
        ("math", B("\\arcsin\\frac{\\sqrt3}{2}"), "\\frac\\pi6", 0.0),
        ("math", B("(\\sin x)^{-1}"), "\\csc x", 1.0),
        ("math", B("(\\sin x)^{-1}"), "\\arcsin x", 0.0),
    ],
    "set differences": [
        ("math", B("\\mathbb{R} \\setminus \\{0\\}"), "(-\\infty,0)\\cup(0,\\infty)", 1.0),
        ("math", B("\\mathbb{R} \\setminus \\{0\\}"), "(-\\infty,0)\\cup(1,\\infty)", 0.0),
        ("math", B("\\mathbb{R} \\backslash \\{2\\}"), "(-\\infty,2)\\cup(2,\\infty)", 1.0),
        ("math", B("\\mathbb{R} \\backslash \\{2\\}"), "(-\\infty,\\infty)", 0.0),
        ("math", B("[0, 5] \\setminus \\{3\\}"), "[0,3)\\cup(3,5]", 1.0),
        ("math", B("[0, 5] \\setminus \\{3\\}"), "[0,3]\\cup(3,5]", 0.0),
        ("math", B("(-\\infty, \\infty) \\setminus \\{-1, 1\\}"),
         "(-\\infty,-1)\\cup(-1,1)\\cup(1,\\infty)", 1.0),
        ("math", B("(-\\infty, \\infty) \\setminus \\{-1, 1\\}"),
         "(-\\infty,-1)\\cup(1,\\infty)", 0.0),
    ],
    "scientific notation": [
        ("math", B("3 \\times 10^{5}"), "300000", 1.0),
        ("math", B("3 \\times 10^{5}"), "3 \\times 10^{4}", 0.0),
        ("math", B("3\\cdot 10^5"), "300{,}000", 1.0),
        ("math", B("3e5"), "300000", 1.0),
        ("math", B("3e5"), "15e", 0.0),
        ("math", B("3E+05"), "300000", 1.0),
        ("math", B("3E+05"), "30000", 0.0),
        ("math", B("1.5e-3"), "0.0015", 1.0),
        ("math", B("1.5e-3"), "1.5", 0.0),
        ("math", B("3 x 10^5"), "300000", 1.0),
        ("math", B("3 x 10^5"), "3 \\times 10^6", 0.0),
        ("math", B("2e"), "2e", 1.0),  # Euler's number stays
        ("gsm8k", "The answer is 3 \\times 10^{5}.", "300000", 1.0),
        ("gsm8k", "The answer is 3E+05.", "300000", 1.0),
        ("gsm8k", "The answer is 3 x 10^5.", "300000", 1.0),
        ("gsm8k", "The answer is 3 x 10^5.", "30", 0.0),
    ],
    "thousands separators": [
        ("math", B("1\\,234\\,567"), "1234567", 1.0),
        ("math", B("1{,}234{,}567"), "1234567", 1.0),
        ("math", B("1 234 567"), "1234567", 1.0),
        ("math", B("1'234'567"), "1234567", 1.0),
        ("math", B("1.234.567"), "1234567", 1.0),
        ("math", B("12 34"), "1234", 0.0),
        ("math", B("1'23"), "123", 0.0),
        ("math", B("1.23.456"), "123456", 0.0),
        ("math", B("1.234"), "1234", 0.0),
        ("gsm8k", "The answer is 1\u2009234\u2009567.", "1234567", 1.0),
        ("gsm8k", "The answer is 1 234 567.", "1234567", 1.0),
        ("gsm8k", "The answer is 1'234'567.", "1234567", 1.0),
        ("gsm8k", "The answer is 1.234.567.", "1234567", 1.0),
        ("gsm8k", "#### 1\\,234", "1234", 1.0),
        ("gsm8k", "The answer is 12 34.", "1234", 0.0),
        ("gsm8k", "The answer is 1.234.5", "12345", 0.0),
    ],
    "unicode minus, hyphens, roots, fraction slash": [
        ("math", B("\u22125"), "-5", 1.0),
        ("math", B("\u22125"), "5", 0.0),
        ("math", B("\u20135"), "-5", 1.0),
        ("math", B("\u20105"), "-5", 1.0),
        ("math", B("\u20115"), "-5", 1.0),
        ("math", B("\u20115"), "5", 0.0),
        ("math", B("\u221a2"), "\\sqrt2", 1.0),
        ("math", B("\u221b8"), "2", 1.0),
        ("math", B("\u221b8"), "\\sqrt8", 0.0),
        ("math", B("\u221c16"), "2", 1.0),
        ("math", B("3\u20444"), "\\frac34", 1.0),
        ("math", B("3\u20444"), "\\frac43", 0.0),
        ("math", B("1\u22153"), "\\frac13", 1.0),
        ("gsm8k", "The answer is \u22125.", "-5", 1.0),
        ("gsm8k", "The answer is \u20115.", "-5", 1.0),
        ("gsm8k", "The answer is 3\u20444.", "0.75", 1.0),
        ("gsm8k", "The answer is 3\u20444.", "34", 0.0),
        ("gsm8k", "The answer is \u221b8.", "2", 0.0),  # GSM8K wants a number
    ],
    "inequalities for an interval": [
        ("math", B("x > 3"), "(3, \\infty)", 1.0),
        ("math", B("x > 3"), "[3, \\infty)", 0.0),
        ("math", B("\\{x \\mid x > 3\\}"), "(3, \\infty)", 1.0),
        ("math", B("\\{x \\mid x \\geq 3\\}"), "(3, \\infty)", 0.0),
        ("math", B("\\{x : -2 \\le x < 5\\}"), "[-2, 5)", 1.0),
        ("math", B("\\{x : -2 \\le x < 5\\}"), "[-2, 5]", 0.0),
        ("math", B("\\{x \\in \\mathbb{R} \\mid x < 1\\}"), "(-\\infty, 1)", 1.0),
        ("math", B("\\{x \\in \\mathbb{R} \\mid x < 1\\}"), "(-\\infty, 1]", 0.0),
        ("math", B("\\{x | x \\le 0\\}"), "(-\\infty, 0]", 1.0),
        ("math", B("x < -1 \\text{ or } x > 2"), "(-\\infty,-1)\\cup(2,\\infty)", 1.0),
        ("math", B("x < -1 \\text{ or } x > 2"), "(-\\infty,-1)\\cup[2,\\infty)", 0.0),
        ("math", B("x \\neq 2"), "(-\\infty,2)\\cup(2,\\infty)", 1.0),
        ("math", B("x \\neq 2"), "(-\\infty,2)\\cup(3,\\infty)", 0.0),
        ("math", B("\\{x \\mid x > 3\\}"), "x > 3", 1.0),
    ],
}
WRONG_PAID_69 = {
    "magnitude suffix": [
        ("gsm8k", "The answer is 5 million.", "5", 0.0),
        ("math", "The answer is $5$ million.", "5", 0.0),
        ("math", "The answer is $5$ thousand dollars.", "5", 0.0),
        ("math", B("5\\text{ thousand}"), "5", 0.0),
        ("math", B("5\\text{ thousand}"), "5000", 0.0),
        ("math", B("3\\text{k}"), "3", 0.0),
        ("math", B("3\\text{ K}"), "3", 0.0),
        ("math", B("2\\text{ bn}"), "2", 0.0),
        ("math", B("3k"), "3", 0.0),
        ("gsm8k", "The answer is 3k.", "3", 0.0),
        ("gsm8k", "The answer is \\boxed{3k}.", "3", 0.0),
        ("gsm8k", "The answer is \\boxed{5\\text{ thousand}}.", "5", 0.0),
        ("gsm8k", "The town has \\boxed{5} million people.", "5", 0.0),
        ("math", "The town has $\\boxed{5}$ million people.", "5", 0.0),
        ("math", "The town has $\\boxed{5}$ thousand people.", "5", 0.0),
        # right twins
        ("math", "The town has $\\boxed{5000}$ people.", "5000", 1.0),
        ("gsm8k", "The answer is 5000 people.", "5000", 1.0),
        ("math", B("3\\text{ km}"), "3", 1.0),
    ],
    "a word that changes the value": [
        ("math", "The answer is the reciprocal of $\\boxed{4}$.", "4", 0.0),
        ("math", "It is the inverse of $\\boxed{2}$.", "2", 0.0),
        ("math", "So $x$ is the negative of \\boxed{3}.", "3", 0.0),
        ("gsm8k", "The answer is the reciprocal of 4.", "4", 0.0),
        ("gsm8k", "The answer is the negative of \\boxed{3}.", "3", 0.0),
        ("math", "The answer is the reciprocal of $4$.", "4", 0.0),
        ("math", "The answer is the inverse of 2.", "2", 0.0),
        ("math", "The answer is twice $\\boxed{3}$.", "3", 0.0),
        ("math", B("\\text{the reciprocal of }4"), "4", 0.0),
        # right twins
        ("math", "The sum of the roots is $\\boxed{4}$.", "4", 1.0),
        ("math", "The reciprocal of 4 is $\\boxed{\\frac14}$.", "\\frac14", 1.0),
        ("math", "The negative root is $\\boxed{-3}$.", "-3", 1.0),
    ],
    "a guess, a draft or a counterfactual": [
        ("math", "My first guess was $\\boxed{12}$. Checking again, it is 15.", "12", 0.0),
        ("math", "If it were $\\boxed{12}$, the sum would be 24, but it is 15.", "12", 0.0),
        ("gsm8k", "My draft answer: \\boxed{12}. On a second look it is 15.", "12", 0.0),
        ("gsm8k", "My first draft said the answer is 12. Recounting, it is 15.", "12", 0.0),
        ("math", "At first I guessed \\boxed{12}, but the total is 15.", "12", 0.0),
        ("gsm8k", "Initially I got \\boxed{12}; correcting the tax, 15.", "12", 0.0),
        ("math", "Suppose it were \\boxed{12}: then 3 would be left, so it is 15.", "12", 0.0),
        # right twins
        ("math", "My first guess was 12. Checking again, it is $\\boxed{15}$.", "15", 1.0),
        ("math", "If it were 12, the sum would be 24, but it is \\boxed{15}.", "15", 1.0),
        ("math", "My first guess was $\\boxed{12}$, and checking confirms 12.", "12", 1.0),
        ("math", "So the answer is $\\boxed{12}$. We check: 3 times 4 is 12.", "12", 1.0),
    ],
    "a question mark in a box": [
        ("math", B("12?"), "12", 0.0),
        ("gsm8k", "The answer is \\boxed{12?}", "12", 0.0),
        ("math", "Is it $\\boxed{12}$?", "12", 0.0),
        ("gsm8k", "Is it \\boxed{12}?", "12", 0.0),
        ("math", B("12"), "12", 1.0),
    ],
}


@pytest.mark.parametrize("kind,task,response,gold,expected", [
    (kind, *case) for table in (RIGHT_FORMS_69, WRONG_PAID_69) for kind, cases in table.items()
    for case in cases])
def test_issue_69_right_forms_and_their_wrong_twins(kind, task, response, gold, expected):
    assert verify(task, response, gold) == expected


def test_issue_69_each_class_has_a_right_form_and_a_wrong_twin():
    for table in (RIGHT_FORMS_69, WRONG_PAID_69):
        for kind, cases in table.items():
            assert {case[-1] for case in cases} == {0.0, 1.0}, kind


def test_issue_69_normal_forms():
    # the rewrites themselves, so that a right form is read as the value, not matched by luck
    assert normalize("2{1 \\over 2}") == "\\frac{5}{2}"  # a mixed number, as 2\\frac12
    assert normalize("{5 \\choose 2}") == "\\binom{5}{2}"
    assert normalize("3E+05") == "3\\times10^{5}"
    assert normalize("2e-1") == "2e-1"  # Euler's number minus one: a sign needs a point or a 0
    assert normalize("2e-01") == "2\\times10^{-1}"
    assert normalize("\\sin^{-1}x") == "\\arcsin x"
    assert normalize("\\{x \\mid x > 3\\}") == "x>3"
    assert normalize("\\{x \\mid 3 > 2\\}") == "\\{x\\mid3>2\\}"  # no condition on x
    assert normalize("12 34") == "12 34" and normalize("1 234") == "1234"
    assert grader.digit_groups("1.234.567 and 1.234 and 1'23") == "1234567 and 1.234 and 1'23"
