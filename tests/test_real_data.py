"""Grade the real GSM8K and MATH-500 reference solutions (from ../shared/data, skipped when absent).

A correct verifier grades every reference solution correct against its own answer, and grades it
wrong against the same answer with its final number changed.
"""

import json
import re
import time
from pathlib import Path

import pytest

from common.env.math_env import make_env, verify

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"
pytestmark = pytest.mark.skipif(not (SHARED / "math500_test.jsonl").is_file(),
                                reason=f"{SHARED} not found")


def change_last_digit(answer: str) -> str | None:
    """The answer with its final number changed (last digit + 1), skipping unit exponents like
    cm^2."""
    units = [m.span() for m in re.finditer(r"\\(?:mbox|text)\{[^{}]*\}\^\{?\d", answer)]
    digits = [m.start() for m in re.finditer(r"\d", answer) if not any(a <= m.start() < b for a,
                                                                       b in units)]
    if not digits:
        return None
    i = digits[-1]
    return answer[:i] + str((int(answer[i]) + 1) % 10) + answer[i + 1 :]


def test_gsm8k_reference_solutions():
    env = make_env("gsm8k", path=SHARED / "gsm8k_test.jsonl")
    assert len(env) == 1319
    correct = sum(verify("gsm8k", ex["solution"], ex["answer"]) for ex in env.examples)
    wrong_gold = [str(int(ex["answer"]) + 1) for ex in env.examples]
    false_pos = sum(verify("gsm8k", ex["solution"], gold) for ex,
                    gold in zip(env.examples, wrong_gold))
    changed = [ex["solution"].rsplit("####", 1)[0] + "#### " + gold for ex,
               gold in zip(env.examples, wrong_gold)]
    false_pos += sum(verify("gsm8k", text, ex["answer"]) for ex, text in zip(env.examples, changed))
    print(f"\nGSM8K test: {correct:.0f}/1319 reference solutions graded correct; "
          f"{false_pos:.0f}/2638 perturbed graded correct")
    assert correct == 1319
    assert false_pos == 0


def test_gsm8k_echoing_the_question_is_never_rewarded():
    """No answer marker, no reward: the question echoed (30 of 1,319 scored 1.0 through the bare
    last-number fallback), or echoed with the gold's digits after it, scores 0 on every test
    problem."""
    env = make_env("gsm8k", path=SHARED / "gsm8k_test.jsonl")
    echo = sum(verify("gsm8k", ex["question"], ex["answer"]) for ex in env.examples)
    echo_gold = sum(verify("gsm8k", f"{ex['question']} {ex['answer']}",
                           ex["answer"]) for ex in env.examples)
    echo_gold += sum(verify("gsm8k", f"{ex['question']}\n{ex['answer']}",
                            ex["answer"]) for ex in env.examples)
    marked = sum(verify("gsm8k", f"{ex['question']}\nThe answer is {ex['answer']}.",
                        ex["answer"]) for ex in env.examples)
    print(f"\nGSM8K test: echo {echo:.0f}/1319, echo + gold digits {echo_gold:.0f}/2638, with a "
          f"marker {marked:.0f}/1319")
    assert echo == 0 and echo_gold == 0
    assert marked == 1319  # the same text with "The answer is" does score


def test_gsm8k_hedged_and_lookalike_answers_are_wrong():
    """Each reference solution with its answer line hedged, listed, or given a Unicode minus."""
    env = make_env("gsm8k", path=SHARED / "gsm8k_test.jsonl")
    hedged = 0
    for ex in env.examples:
        body, gold = ex["solution"].rsplit("####", 1)[0], ex["answer"]
        other = str(int(gold) + 1)
        for line in (f"#### {gold} or {other}", f"#### {other} or {gold}",
                     f"#### not {other}, {gold}",
                     f"#### about {gold}", f"#### {gold}, {other}", f"#### {other}/1 = {gold}"):
            hedged += verify("gsm8k", body + line, gold)
        if int(gold) > 0:
            hedged += verify("gsm8k", body + f"#### \u2212{gold}", gold)  # −N is not N
            assert verify("gsm8k", body + f"#### \u2212{gold}", f"-{gold}") == 1.0
    print(f"\nGSM8K test: {hedged:.0f} hedged or look-alike answers graded correct")
    assert hedged == 0


def test_math500_reference_solutions():
    env = make_env("math", path=SHARED / "math500_test.jsonl")
    assert len(env) == 500
    start = time.monotonic()
    correct = sum(verify("math", ex["solution"], ex["answer"]) for ex in env.examples)
    seconds = time.monotonic() - start
    perturbed = [(ex, change_last_digit(ex["answer"])) for ex in env.examples]
    perturbed = [(ex, wrong) for ex, wrong in perturbed if wrong is not None]
    start = time.monotonic()
    false_pos = [wrong for ex, wrong in perturbed if verify("math", ex["solution"], wrong)]
    seconds_perturbed = time.monotonic() - start
    print(f"\nMATH-500: {correct:.0f}/500 reference solutions graded correct in {seconds:.2f} s; "
          f"{len(false_pos)}/{len(perturbed)} perturbed answers graded correct in "
          f"{seconds_perturbed:.2f} s")
    assert correct >= 499
    assert false_pos == []


def test_math500_answer_is_forms_and_hedges():
    """Every gold answer written after "The answer is" grades correct; hedged or listed with a wrong
    one, never."""
    env = make_env("math", path=SHARED / "math500_test.jsonl")
    golds = [ex["answer"] for ex in env.examples]
    plain = sum(verify("math", f"The answer is ${gold}$.", gold) for gold in golds)
    wrongs = [(gold, change_last_digit(gold)) for gold in golds]
    wrongs = [(gold, wrong) for gold, wrong in wrongs if wrong is not None]
    start = time.monotonic()
    hedged = sum(verify("math", f"The answer is ${gold}$ (or perhaps ${wrong}$).", gold) for gold,
                 wrong in wrongs)
    hedged += sum(verify("math", f"\\boxed{{{gold} \\text{{ or }} {wrong}}}", gold) for gold,
                  wrong in wrongs)
    hedged += sum(verify("math", f"\\boxed{{{wrong} \\quad {gold}}}", gold) for gold,
                  wrong in wrongs)
    seconds = time.monotonic() - start
    print(f"\nMATH-500: 'The answer is $gold$.' {plain:.0f}/500 correct; "
          f"{hedged:.0f}/{3 * len(wrongs)} hedged or "
          f"listed answers graded correct in {seconds:.2f} s")
    assert plain == 500
    assert hedged == 0


def test_math500_equivalent_rewrites():
    """The reference answers rewritten the way models write them still grade correct."""
    rows = [json.loads(line) for line in open(SHARED / "math500_test.jsonl")]
    rewrites = {
        "\\frac{14}{3}": "14/3", "\\frac{1}{2}": "0.5", "\\dfrac{17}{50}": "0.34",
        "10,\\!080": "10080",
        "\\$18.90": "18.9", "2\\sqrt{5}": "\\sqrt{20}",
        "\\left( 3, \\frac{\\pi}{2} \\right)": "(3, \\pi/2)",
        "\\frac{\\sqrt{3}}{3}": "1/\\sqrt{3}", "x^3+3x-6": "3x + x^3 - 6",
        "(-\\infty, 0]": "(-\\infty,0]",
        "\\text{(C)}": "C", "90^\\circ": "90", "x=5": "5", "-2 + 7i": "7i - 2",
        "1 \\pm \\sqrt{19}": "1-\\sqrt{19},1+\\sqrt{19}",
    }
    answers = {row["answer"] for row in rows}
    found = {gold: pred for gold, pred in rewrites.items() if gold in answers}
    assert len(found) >= 12
    for gold, pred in found.items():
        assert verify("math", f"\\boxed{{{pred}}}", gold) == 1.0, (gold, pred)
