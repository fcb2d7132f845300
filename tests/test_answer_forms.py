"""Issue "bad input and the verifier, round six", part 5: answer forms of the benchmarks (AIME, AMC,
Minerva Math, OlympiadBench) and what a model writes under RL pressure (a retraction, a spray of
boxes, a hedge, a unit or a magnitude that changes the value), by class. Each class holds wrong
answers that must score 0 and right forms that must score 1, graded by the rules of data/README.md's
grading policy. The cases are this file's own; the issue's suites are kept apart."""

import pytest

from common.env.math_env import verify
from common.env.tasks import TASKS


def B(answer: str) -> str:
    return "So the answer is $\\boxed{" + answer + "}$."


CLASSES = {
    "a retraction or correction after the answer": [
        ("math", "The answer is 12. Actually it should be 13.", "12", 0.0),
        ("math", "The answer is 12. Actually it should be 13.", "13", 0.0),
        ("math", "So $\\boxed{12}$. Wait, that's wrong: $\\boxed{13}$.", "13", 1.0),
        ("math", "So $\\boxed{12}$. Wait, that's wrong: $\\boxed{13}$.", "12", 0.0),
        ("math", "So $\\boxed{12}$. Wait, actually it is 13.", "12", 0.0),
        ("math", "So $\\boxed{12}$. Wait, actually it is 13.", "13", 0.0),
        ("math", "Thus $\\boxed{12}$.\n\nHmm, no: I dropped a term, so it is 13.", "12", 0.0),
        ("math", "The answer is $12$. Oops, I mean $13$.", "12", 0.0),
        ("math", "$\\boxed{12}$. Correction: the total is 13.", "12", 0.0),
        ("math", "$\\boxed{12}$ -- scratch that, 13.", "12", 0.0),
        ("math", "So $\\boxed{12}$. On second thought, it should be $13$.", "12", 0.0),
        ("math", "It is $\\boxed{12}$. That was a mistake; recounting gives 13.", "12", 0.0),
        ("math", "Let's try $\\boxed{12}$: then $2 \\cdot 12 = 24 \\neq 26$, so 13.", "12", 0.0),
        ("math", "Trying $x=1$ and $x=2$, it equals 19 when $x=\\boxed{2}$. Note: it is increasing "
                 "for $x>0$, so the solution is unique.", "2", 1.0),
        ("math", "Testing $\\boxed{12}$ fails, since 12 is even; it is odd, 13.", "12", 0.0),
        ("gsm8k", "The answer is 12. Actually it should be 13.", "12", 0.0),
        ("gsm8k", "#### 12\nWait, I forgot the tax. It is 13.", "12", 0.0),
        ("gsm8k", "The answer is \\boxed{12}. No wait, it's 13.", "12", 0.0),
        # right forms: a check that confirms, a correction that is itself the marked answer
        ("math", "So $\\boxed{12}$. Wait, let me verify: $3 \\cdot 4 = 12$. Yes.", "12", 1.0),
        ("math", "So $\\boxed{12}$. Actually, checking: 5 + 7 = 12, as claimed.", "12", 1.0),
        ("math", "The answer is 12. Actually, no: it is 13. The answer is 13.", "13", 1.0),
        ("math", "I first got 12, but that was wrong. The answer is $\\boxed{13}$.", "13", 1.0),
        ("math", "Thus $\\boxed{12}$. It is the smallest such number, as 11 fails.", "12", 1.0),
        ("gsm8k", "The answer is 12. Wait, 5 + 7 = 12, yes.", "12", 1.0),
        ("gsm8k", "First I got 10, wait, that's wrong. #### 12", "12", 1.0),
    ],
    "a spray of boxed candidates": [
        ("math", "$\\boxed{10}$ $\\boxed{11}$ $\\boxed{12}$ $\\boxed{13}$", "13", 0.0),
        ("math", "The answer is $\\boxed{12}$, $\\boxed{13}$.", "13", 0.0),
        ("math", "$\\boxed{12}\\boxed{13}$", "13", 0.0),
        ("math", "It is $\\boxed{12}$ / $\\boxed{13}$.", "13", 0.0),
        ("math", "It is $\\boxed{12}$ and $\\boxed{13}$.", "13", 0.0),
        ("math", "Maybe \\boxed{11}. Then \\boxed{12}. Perhaps \\boxed{13}. Or \\boxed{14}. "
                 "Final: \\boxed{13}.", "13", 0.0),
        ("math", "A: \\boxed{10}.\nB: \\boxed{11}.\nC: \\boxed{13}.", "13", 0.0),
        ("gsm8k", "\\boxed{12} \\boxed{13}", "13", 0.0),
        # right forms: a draft then a final box, the same value boxed twice
        ("math", "A first try gives $\\boxed{12}$.\nThat is wrong, since 12 is even.\n"
                 "Recounting, the answer is $\\boxed{13}$.", "13", 1.0),
        ("math", "So $\\tan A = \\boxed{2}$.\n\nWe also could have noted that "
                 "$\\tan A = \\boxed{2}$.", "2", 1.0),
        ("math", "$d = \\boxed{15\\frac{39}{40}},$ or $\\boxed{\\frac{639}{40}}$ inches.",
         "\\frac{639}{40}", 1.0),
        ("math", "$\\boxed{13}$ $\\boxed{13}$", "13", 1.0),
        ("math", "First $\\boxed{12}$? No: 12 fails. Then \\boxed{12.5}? No. So $\\boxed{13}$.",
         "13", 0.0),
        ("math", "We get \\boxed{\\frac12}, that is \\boxed{0.5}, i.e. \\boxed{\\tfrac{1}{2}}.",
         "\\frac12", 1.0),
    ],
    "a hedge between two values": [
        ("math", "The answer is 12 or 13.", "12", 0.0),
        ("math", "The answer is either 12 or 13.", "13", 0.0),
        ("math", "The answer is between 12 and 13.", "12", 0.0),
        ("math", B("12 \\text{ or } 13"), "12", 0.0),
        ("math", B("12 \\text{ or } 13"), "13", 0.0),
        ("math", "$\\boxed{12}$, give or take one.", "12", 0.0),
        ("math", "It is about $\\boxed{12}$.", "12", 0.0),
        ("math", "It is approximately $\\boxed{12}$.", "12", 0.0),
        ("math", "It is roughly \\boxed{12}.", "12", 0.0),
        ("math", "It is nearly $\\boxed{12}$.", "12", 0.0),
        ("math", "The value lies between $\\boxed{12}$ and $\\boxed{13}$.", "13", 0.0),
        ("math", B("12 \\pm 1"), "12", 0.0),
        ("math", B("12\\text{--}13"), "12", 0.0),
        ("gsm8k", "The answer is 12 or 13.", "12", 0.0),
        ("gsm8k", "The answer is \\boxed{12}, give or take.", "12", 0.0),
        # right forms: a list the gold asks for, a restatement of one value
        ("math", B("12 \\text{ or } 13"), "12, 13", 1.0),
        ("math", "$x = 3$ or $x = \\boxed{3}$.", "3", 1.0),
        ("math", "$1\\frac14$, or $\\boxed{1.25}$.", "1.25", 1.0),
        ("math", "The least such number is $\\boxed{12}$.", "12", 1.0),
        # a bound the question asks for
        ("math", "So Zach can have at most $\\boxed{2}$ pencils left over.", "2", 1.0),
        ("math", "The total is $1.01^{30} \\approx \\boxed{32,\\!348}$, to the nearest dollar.",
         "32,\\!348", 1.0),
        ("math", "It has at least 3 digits, so the answer is $\\boxed{100}$.", "100", 1.0),
    ],
    "a unit word or magnitude that changes the value": [
        ("math", B("3\\text{ reciprocal}"), "3", 0.0),
        ("math", B("3\\text{ inverse}"), "3", 0.0),
        ("math", B("2\\text{MM}"), "2", 0.0),
        ("math", B("3\\text{ reciprocals}"), "3", 0.0),
        ("math", B("2\\text{M}"), "2", 0.0),
        ("math", B("2\\text{ M}"), "2", 0.0),
        ("math", B("2\\,\\mathrm{B}"), "2", 0.0),
        ("math", "The answer is $2$M.", "2", 0.0),
        ("math", "The answer is 2M.", "2", 0.0),
        ("gsm8k", "The answer is 5M.", "5", 0.0),
        ("gsm8k", "The answer is $5M.", "5", 0.0),
        ("gsm8k", "The answer is 5 M.", "5", 0.0),
        ("gsm8k", "The answer is 3k.", "3", 0.0),
        ("gsm8k", "The answer is 2 million.", "2", 0.0),
        ("gsm8k", "The answer is 2 million.", "2000000", 0.0),
        ("math", B("5\\text{ km}"), "5\\text{ m}", 0.0),
        ("math", B("5\\text{ km}"), "5 \\mathrm{~m}", 0.0),
        ("math", B("5\\text{ km}"), "5000", 0.0),
        ("math", B("5 \\mathrm{~cm}"), "5 \\mathrm{~m}", 0.0),
        ("math", B("5\\text{ kg}"), "5\\text{ km}", 0.0),
        # right forms: units that do not change the value, a unit the gold does not name
        ("math", B("5\\text{ km}"), "5000\\text{ m}", 1.0),
        ("math", B("5000 \\mathrm{~m}"), "5 \\mathrm{~km}", 1.0),
        ("math", B("5\\text{ km}"), "5\\text{ km}", 1.0),
        ("math", B("5"), "5\\text{ km}", 1.0),
        ("math", B("3\\text{ km}"), "3", 1.0),
        ("math", B("12\\text{ square units}"), "12", 1.0),
        ("math", B("2\\,\\text{m}"), "2", 1.0),
        ("gsm8k", "The answer is 5 m.", "5", 1.0),
        ("gsm8k", "The answer is $5.", "5", 1.0),
        ("gsm8k", "The answer is 2000000.", "2000000", 1.0),
    ],
    "AIME: leading zeros, number words": [
        ("aime24", "So \\boxed{033}.", "33", 1.0),
        ("aime24", "So \\boxed{0033}.", "33", 1.0),
        ("aime24", "So $\\boxed{\\textbf{033}}$.", "33", 1.0),
        ("aime24", "So $\\boxed{\\text{033}}$.", "33", 1.0),
        ("aime24", "So $\\boxed{\\mathbf{33}}$.", "33", 1.0),
        ("aime24", "So \\boxed{33}.", "033", 1.0),
        ("aime24", "So \\boxed{005}.", "5", 1.0),
        ("aime24", "So \\boxed{\\text{thirty-three}}.", "33", 1.0),
        ("aime24", "So \\boxed{\\text{thirty three}}.", "33", 1.0),
        ("aime24", "So \\boxed{\\text{three hundred and five}}.", "305", 1.0),
        ("aime24", "So \\boxed{\\text{nine hundred ninety-nine}}.", "999", 1.0),
        ("aime24", "So \\boxed{\\text{zero}}.", "0", 1.0),
        ("aime24", "So \\boxed{034}.", "33", 0.0),
        ("aime24", "So \\boxed{0330}.", "33", 0.0),
        ("aime24", "So \\boxed{\\text{thirty-four}}.", "33", 0.0),
        ("aime24", "So \\boxed{\\text{three hundred three}}.", "33", 0.0),
        ("aime24", "So \\boxed{\\text{thirty-three thousand}}.", "33", 0.0),
        ("aime24", "So \\boxed{\\text{three dozen}}.", "36", 0.0),
        ("aime24", "So \\boxed{\\text{thirty or thirty-three}}.", "33", 0.0),
        ("aime24", "So \\boxed{\\text{thirty three hundred}}.", "33", 0.0),
        ("aime24", "So \\boxed{33.0}.", "33", 0.0),
        ("aime24", "So \\boxed{0 3 3}.", "33", 0.0),
        ("aime24", "The answer is 033.", "33", 0.0),
    ],
    "AMC: a letter beside its value": [
        ("amc23", B("\\textbf{(C)}\\ 27"), "27", 1.0),
        ("amc23", B("\\textbf{(C) }27"), "27", 1.0),
        ("amc23", B("(C)\\ 27"), "27", 1.0),
        ("amc23", B("\\text{(C) } 27"), "27", 1.0),
        ("amc23", B("\\mathrm{(C)}~27"), "27", 1.0),
        ("amc23", "The answer is $\\textbf{(C) } 27$.", "27", 1.0),
        ("amc23", B("\\textbf{(C)}\\ \\frac{3}{4}"), "\\frac34", 1.0),
        ("amc23", B("\\textbf{(B)}\\ 26"), "27", 0.0),
        ("amc23", B("(C)\\ 26"), "27", 0.0),
        ("amc23", B("\\textbf{(C)}"), "27", 0.0),
        ("amc23", B("C"), "27", 0.0),
        ("amc23", B("\\text{(C)}"), "27", 0.0),
        ("amc23", B("\\textbf{(C)}\\ 27 \\text{ or } \\textbf{(D)}\\ 28"), "27", 0.0),
        ("amc23", B("(C)\\ 27, (D)\\ 28"), "27", 0.0),
        ("math", B("\\textbf{(C)}\\ 27"), "\\text{(C)}", 1.0),
        ("math", B("\\textbf{(C)}"), "\\text{(C)}", 1.0),
        ("math", B("\\textbf{(D)}\\ 27"), "\\text{(C)}", 0.0),
        ("math", B("(C)"), "C", 1.0),
        ("math", B("(B)"), "C", 0.0),
    ],
    "Minerva: significant figures and units": [
        ("minerva_math", B("1.23 \\times 10^{6}"), "1.2e6", 1.0),
        ("minerva_math", B("1.2 \\times 10^{6}"), "1.2e6", 1.0),
        ("minerva_math", B("1.2e6"), "1.2 \\times 10^{6}", 1.0),
        ("minerva_math", B("1.24 \\times 10^6"), "1.2e6", 1.0),
        ("minerva_math", B("1.3 \\times 10^{6}"), "1.2e6", 0.0),
        ("minerva_math", B("1.26 \\times 10^{6}"), "1.2e6", 0.0),
        ("minerva_math", B("1.2 \\times 10^{5}"), "1.2e6", 0.0),
        ("minerva_math", B("1.2 \\times 10^{6}"), "1.23e6", 0.0),
        ("minerva_math", B("0.0504"), "0.050", 1.0),
        ("minerva_math", B("0.056"), "0.050", 0.0),
        ("minerva_math", B("4.5 \\mathrm{~km}"), "4.5 \\mathrm{~km}", 1.0),
        ("minerva_math", B("4.5\\text{ km}"), "4.5 \\mathrm{~km}", 1.0),
        ("minerva_math", B("4500 \\mathrm{~m}"), "4.5 \\mathrm{~km}", 1.0),
        ("minerva_math", B("4.5"), "4.5 \\mathrm{~km}", 1.0),
        ("minerva_math", B("4.5 \\mathrm{~m}"), "4.5 \\mathrm{~km}", 0.0),
        ("minerva_math", B("4.5 \\mathrm{~kg}"), "4.5 \\mathrm{~km}", 0.0),
        ("minerva_math", B("4.6 \\mathrm{~km}"), "4.5 \\mathrm{~km}", 0.0),
        ("minerva_math", B("2.998 \\times 10^{8} \\mathrm{~m/s}"), "3 \\times 10^{8}", 1.0),
        ("minerva_math", B("27"), "27", 1.0),
        ("minerva_math", B("27.4"), "27", 0.0),  # an integer gold is exact
        ("minerva_math", B("\\frac{1}{3}"), "0.33", 1.0),
        ("minerva_math", B("0.3"), "0.33", 0.0),
    ],
    "OlympiadBench: several answers and tolerances": [
        ("olympiadbench", B("3, 5"), "3, 5", 1.0),
        ("olympiadbench", B("5, 3"), "3, 5", 1.0),
        ("olympiadbench", B("x = 5 \\text{ or } x = 3"), "3, 5", 1.0),
        ("olympiadbench", B("3"), "3, 5", 0.0),
        ("olympiadbench", B("3, 5, 7"), "3, 5", 0.0),
        ("olympiadbench", "$\\boxed{3}$ and $\\boxed{5}$", "3, 5", 0.0),
        ("olympiadbench", B("x=1, y=2"), "x=1, y=2", 1.0),
        ("olympiadbench", B("y=2, x=1"), "x=1, y=2", 1.0),
        ("olympiadbench", B("1, 2"), "x=1, y=2", 1.0),
        ("olympiadbench", B("(1, 2)"), "x=1, y=2", 1.0),
        ("olympiadbench", B("2, 1"), "x=1, y=2", 0.0),
        ("olympiadbench", B("x=2, y=1"), "x=1, y=2", 0.0),
        ("olympiadbench", B("(2, 1)"), "x=1, y=2", 0.0),
        ("olympiadbench", B("(1, 2)"), "(2, 1)", 0.0),
        ("olympiadbench", B("0.333333333333"), "\\frac{1}{3}", 1.0),
        ("olympiadbench", B("0.3333"), "\\frac{1}{3}", 0.0),
        ("olympiadbench", B("2.8284271247"), "2\\sqrt{2}", 1.0),
        ("olympiadbench", B("2.828"), "2\\sqrt{2}", 0.0),
        ("olympiadbench", B("1.50"), "1.5", 1.0),
        ("olympiadbench", B("1.51"), "1.5", 0.0),
    ],
}


@pytest.mark.parametrize("kind,task,response,gold,expected", [
    (kind, *case) for kind, cases in CLASSES.items() for case in cases])
def test_answer_forms(kind, task, response, gold, expected):
    assert verify(task, response, gold) == expected


def test_each_class_has_wrong_answers_and_right_forms():
    for kind, cases in CLASSES.items():
        assert {case[-1] for case in cases} == {0.0, 1.0}, kind
