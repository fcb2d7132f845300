"""PS1's checker against its stubs: every rule a stub states about its output has a case that tries
it (exercises/ps1/cases.py RULES), outputs are compared with their dtype, and the wrong answers
students write (tests/data/wrong_answers.py) fail, most of them with their mistake named."""

import ast
import functools
import importlib.util
import re
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from exercises.exercise import NAMING, Wrong, close, names_the_mistake, run_checks
from exercises.ps1.cases import EXERCISES as PS1
from exercises.ps1.cases import NOT_RULES, RULES

ROOT = Path(__file__).resolve().parents[1]
BY_ID = {e.id: e for e in PS1}


def _load(name):
    """tests/data/NAME.py (tests/data is not a package: the project has a data/ of its own)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "tests" / "data" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BREAKERS = _load("rule_breakers")
WRONG, HELD_OUT = _load("wrong_answers").WRONG, _load("wrong_answers").HELD_OUT
BLIND = _load("blind_wrong_answers").BLIND


def _docstrings(exercise):
    """The stub's module docstring and its function's, as written."""
    tree = ast.parse((ROOT / exercise.path).read_text())
    function = next(n for n in tree.body if isinstance(n, ast.FunctionDef))
    return [ast.get_docstring(tree), ast.get_docstring(function) or ""]


def _flat(text):
    return " ".join(text.split())


def _units(text):
    """A docstring's sentences, and each line of its equation blocks on its own; the worked cases
    (held to the checker's by tests/test_exercises.py) and the Check: line left out."""
    units = []
    for paragraph in re.split(r"\n\s*\n", text):
        lines = paragraph.split("\n")
        if paragraph.startswith(("Worked cases", "- ")):
            continue
        if all(line.startswith("    ") for line in lines):  # an equation block
            units += [_flat(line) for line in lines]
            continue
        flat = _flat(" ".join(line for line in lines if not line.startswith("Check: ")))
        units += [u for u in re.split(r"(?<=[.?!])\s+(?=[A-Z\"(])", flat) if u]
    return units


# The words that make a sentence read as a rule on the output.
RULE_WORDS = re.compile(r"\b(must|never|gives?|gets?|dtype|int64|int32|float\w*|bool|shape|NaN|"
                        r"inf|empty|exactly|overflows?|underflows?|n = 1|all-zero|all equal|only|"
                        r"no)\b|->")


def test_every_exercise_has_rules_each_quoted_from_its_stub():
    assert set(RULES) == set(BY_ID)
    for e in PS1:
        doc = _flat(" ".join(_docstrings(e)))
        texts = [rule for rule, _ in RULES[e.id]] + [text for text, _ in NOT_RULES.get(e.id, [])]
        assert len(set(texts)) == len(texts), e.id
        for text in texts:
            assert text in doc, (e.id, text)


def test_every_case_a_rule_names_is_a_case_of_its_exercise():
    for e in PS1:
        cases = {what for what, _, _ in e.worked} | {what for what, _ in e.cases()}
        for rule, named in RULES[e.id]:
            assert named and set(named) <= cases, (e.id, rule, set(named) - cases)


def test_every_sentence_that_reads_as_a_rule_is_a_rule_or_said_not_to_be():
    for e in PS1:
        quoted = [rule for rule, _ in RULES[e.id]] + [text for text, _ in NOT_RULES.get(e.id, [])]
        for text in _docstrings(e):
            for unit in _units(text):
                if RULE_WORDS.search(unit):
                    assert any(q in unit or unit in q for q in quoted), (e.id, unit)


def test_the_sentence_reader_finds_rules_where_a_stub_states_them():
    # the reader itself, on PS1.1's docstring: the all-zero rule is a sentence of its own, and
    # each line of an equation block is one unit
    units = _units(_docstrings(BY_ID["1.1"])[0])
    assert "An all-zero mask gives 0, not NaN (a micro-batch may hold only padding)." in units
    assert "masked_mean(x, mask) = sum(x * mask) / max(1, sum(mask))" in units
    assert not any(u.startswith("- x = [[1, 2, 3, 4]]") for u in units)  # a worked case


RULE_LIST = [(e.id, rule) for e in PS1 for rule, _ in RULES[e.id]]


def test_every_rule_has_a_breaker():
    for e in PS1:
        assert set(BREAKERS.BREAKERS[e.id]) == {rule for rule, _ in RULES[e.id]}, e.id


@pytest.mark.parametrize("id,rule", RULE_LIST, ids=[f"{id}-{k}" for k, (id, _) in enumerate(
    RULE_LIST)])
def test_a_function_right_but_for_one_rule_fails_on_the_cases_that_rule_names(id, rule):
    exercise = BY_ID[id]
    named = dict(RULES[id])[rule]
    breaker = BREAKERS.BREAKERS[id][rule]
    if breaker == BREAKERS.NO_GRADIENT:
        def breaker(**kwargs):
            with torch.no_grad():
                return exercise.oracle(**kwargs)
    only = replace(exercise, worked=[w for w in exercise.worked if w[0] in named],
                   cases=lambda: [c for c in exercise.cases() if c[0] in named])
    with pytest.raises(Wrong):
        run_checks(only, breaker)
    # and the rule's cases do not fail the file's own function
    run_checks(only, exercise.oracle)


# ---- dtypes ------------------------------------------------------------------------------------


def test_no_comparison_casts_the_expected_to_the_outputs_dtype():
    # [0, 0, -1] is [0, -0.5, -1] truncated to integers; even equal values differ in dtype
    assert not close(torch.tensor([0, 0, -1]), torch.tensor([0.0, -0.5, -1]))
    assert not close(torch.tensor([0, 0, -1]), torch.tensor([0.0, 0, -1]))
    assert not close(torch.tensor([1.0, 2]), torch.tensor([1, 2]))
    assert not close(torch.tensor([1, 2], dtype=torch.int32), torch.tensor([1, 2]))
    assert not close(torch.tensor([1, 0]), torch.tensor([True, False]))
    assert close(torch.tensor([0.5], dtype=torch.float64), torch.tensor([0.5]))  # more precision
    assert not close(torch.tensor([0.5], dtype=torch.bfloat16), torch.tensor([0.5]))


def test_integers_where_floats_are_asked_for_fail_with_their_own_words():
    def overlong_penalty(lengths, max_new_tokens, buffer_len, factor):
        excess = (lengths - (max_new_tokens - buffer_len)).clamp(min=0)
        return (-factor * excess / max(buffer_len, 1)).long()  # truncated to whole numbers

    with pytest.raises(Wrong) as said:
        run_checks(BY_ID["1.20"], overlong_penalty)
    assert str(said.value).startswith(
        "lengths [10, 18, 20], max_new_tokens 20, buffer_len 4, factor 1: the buffer starts after "
        "16 tokens: the output is int64, where floats (float32) are asked for (at row 1 the output "
        "should be -0.5, yours is 0 (expected [0, -0.5, -1], got [0, 0, -1])). The likely mistake: "
        "a wrong dtype: integer arithmetic on the way")


def test_floats_where_indices_are_asked_for_fail_with_their_own_words():
    def preference_pairs(scores, group_size):
        s = scores.view(-1, group_size)
        keep = s.max(1).values > s.min(1).values
        first = torch.arange(len(s)) * group_size
        return ((first + s.argmax(1))[keep].float(), (first + s.argmin(1))[keep].float())

    with pytest.raises(Wrong) as said:
        run_checks(BY_ID["1.12"], preference_pairs)
    assert str(said.value) == (
        "[0, 1, 0, 1 | 1, 1, 1, 1]: rows 1 over 0; the tied prompt gives none: output 0 of the 2: "
        "the output is float32, where int64 (whole numbers) is asked for (the values are right). "
        "The likely mistake: a wrong dtype: indices, rows and ids are int64 (torch.long); a float "
        "tensor (torch.Tensor(list), torch.tensor([]) of an empty list, a division) cannot index; "
        "build it with dtype=torch.int64")


# ---- the kind of mistake, said in words --------------------------------------------------------


def test_a_nan_on_an_edge_is_named():
    def masked_mean(x, mask, dim=None):  # the clamp on the count only with dim
        if dim is None:
            return (x * mask).sum() / mask.sum()
        return (x * mask).sum(dim) / mask.sum(dim).clamp(min=1)

    with pytest.raises(Wrong) as said:
        run_checks(BY_ID["1.1"], masked_mean)
    assert str(said.value).startswith(
        "x [2, 3] with an all-zero mask, dim=None: a micro-batch of padding only: expected 0, got "
        "nan. The likely mistake: a NaN on an edge: your output is NaN where the expected is "
        "finite: a 0 / 0 (a count of 0: an all-zero mask")


def test_a_dimension_kept_is_named():
    def rloo_baselines(episode_returns, group_size):
        r = episode_returns.view(-1, group_size)
        return (r.sum(1, keepdim=True) - r) / (group_size - 1)  # [N / k, k], not [N]

    with pytest.raises(Wrong) as said:
        run_checks(BY_ID["1.7"], rloo_baselines)
    assert str(said.value) == (
        "one group [1, 0, 0, 1]: b_0 = (0 + 0 + 1) / 3: the output has shape [1, 4], it should "
        "have [4]. The likely mistake: the wrong dimension: a dimension of size 1 too many "
        "(dimension 0): keepdim=True, [:, None], unsqueeze or a gather's index left in, or a "
        "view(-1, G) not flattened back; drop it")


def test_a_gradient_through_what_the_file_holds_constant_is_named():
    def distill_advantages(old_logprobs, teacher_logprobs, reward_advantages, loss_form):
        shares = reward_advantages[:, None].expand_as(old_logprobs)
        return shares + (teacher_logprobs - old_logprobs) if loss_form == "sampled" else shares

    with pytest.raises(Wrong) as said:
        run_checks(BY_ID["1.18"], distill_advantages)
    assert str(said.value) == (
        "pi_old [0.5, 0.25], pi_T [0.25, 0.5], A_i = 1, sampled: the values are right, but the "
        "output carries a gradient to old_logprobs, which the file holds constant (detached): the "
        "training would differentiate the loss through it too. The likely mistake: a gradient "
        "through what should be a constant: a .detach() is missing where old_logprobs enters the "
        "output")


def test_a_gradient_past_the_clip_is_named():
    # a straight-through clip: the values of the clip, and the gradient of the unclipped ratio
    # where the file's is 0 (ratio 1.5 > 1 + epsilon with A = 1: the clipped term wins)
    def clipped_surrogate(logprobs, old_logprobs, advantages, epsilon):
        ratio = torch.exp(logprobs - old_logprobs)
        clipped = ratio + (ratio.clamp(1 - epsilon, 1 + epsilon) - ratio).detach()
        return torch.max(-advantages * ratio, -advantages * clipped)

    with pytest.raises(Wrong) as said:
        run_checks(BY_ID["1.9"], clipped_surrogate)
    message = str(said.value)
    assert message.startswith(
        "ratios 1.5 and 0.5, A = 1, epsilon 0.2: max(-1.5, -1.2) and max(-0.5, -0.8): the values "
        "are right, but the gradient with respect to logprobs is not the file's (of one random "
        "projection of the output: at row 0, position 0 the gradient should be 0, yours is ")
    assert message.endswith("The likely mistake: a gradient through what should be a constant: "
                            "where the file's gradient is 0 (a clipped or masked entry, a "
                            "detached term) yours is not: a straight-through trick or a missing "
                            ".detach() lets it through")


def test_an_error_that_torch_raises_is_read_for_its_mistake():
    def masked_mean(x, mask, dim=None):  # the stub's max(1, ...) in Python, on a tensor
        total = (x * mask).sum() if dim is None else (x * mask).sum(dim)
        return total / max(1, mask.sum() if dim is None else mask.sum(dim))

    with pytest.raises(Wrong) as said:
        run_checks(BY_ID["1.1"], masked_mean)
    assert str(said.value) == (
        "x = [[1, 2], [3, 4]], mask = [[1, 1], [0, 0]], dim=1: the second row is all padding: your "
        "masked_mean raised RuntimeError: Boolean value of Tensor with more than one value is "
        "ambiguous. The likely mistake: a Python if, and, or, max or min on a tensor of several "
        "entries: use the tensor's own operations (torch.where, torch.clamp, torch.maximum)")


def test_a_message_names_its_mistake_exactly_when_it_holds_a_naming_phrase():
    assert NAMING[0] == "The likely mistake: "
    assert names_the_mistake("x: expected 1, got 2. The likely mistake: the sign is flipped")
    assert names_the_mistake("x: the values are right, but no gradient reaches logp: a term ...")
    assert not names_the_mistake("x: at row 0 the output should be 1, yours is 2")


# ---- the catalogue of wrong answers ------------------------------------------------------------

CLASSES = {"detached", "not detached", "off-by-one", "dimension", "dtype", "nan", "edge",
           "formula"}


def test_the_catalogue_spans_every_exercise_and_every_class():
    assert set(WRONG) == set(BY_ID) == set(HELD_OUT)
    assert all(len(rows) >= 3 for rows in WRONG.values())
    assert sum(map(len, WRONG.values())) >= 70
    assert {cls for rows in WRONG.values() for _, cls, _ in rows} == CLASSES


@functools.cache
def _verdicts(name):
    """{(id, label): the checker's message, or None where the wrong answer passed}, and the
    classes of those named and not, for the catalogue WRONG or HELD_OUT; once each."""
    said, by_class = {}, Counter()
    for exercise, rows in {"WRONG": WRONG, "HELD_OUT": HELD_OUT, "BLIND": BLIND}[name].items():
        for label, cls, fn in rows:
            try:
                run_checks(BY_ID[exercise], fn)
                said[exercise, label] = None
            except Wrong as e:
                said[exercise, label] = str(e)
                by_class[cls, names_the_mistake(str(e))] += 1
    return said, by_class


def _figures(said, by_class):
    caught = [m for m in said.values() if m is not None]
    named = sum(map(names_the_mistake, caught))
    classes = ", ".join(f"{c} {by_class[c, True]} of {by_class[c, True] + by_class[c, False]}"
                        for c in sorted({c for c, _ in by_class}))
    return f"{len(said)} wrong answers, {len(caught)} caught, {named} named ({classes})", named


def test_every_wrong_answer_fails_and_at_least_4_in_5_are_named():
    said, by_class = _verdicts("WRONG")
    figures, named = _figures(said, by_class)
    print("\n" + figures)
    assert [key for key, message in said.items() if message is None] == []
    assert named >= 0.8 * len(said)


def test_every_held_out_wrong_answer_fails():
    # written after the checker was shaped on WRONG; how many it names is printed, not bounded:
    # the figure for wrong answers the checker was not tuned on
    said, by_class = _verdicts("HELD_OUT")
    print("\nheld out: " + _figures(said, by_class)[0])
    assert [key for key, message in said.items() if message is None] == []


def test_every_blind_wrong_answer_fails_and_the_page_says_how_many_are_named():
    # written from the stubs alone, by a hand that never saw the checker: the honest figure
    said, by_class = _verdicts("BLIND")
    print("\nblind: " + _figures(said, by_class)[0])
    assert set(BLIND) == set(BY_ID) and [key for key, m in said.items() if m is None] == []
    named = sum(map(names_the_mistake, said.values()))
    assert (f"{len(said)} more written blind, from the stubs alone, by a hand that never saw the "
            f"checker: every one fails and {named} are named") in _flat(
        (ROOT / "docs" / "course.md").read_text())


def test_the_course_page_quotes_the_catalogues_figures():
    said, held = _verdicts("WRONG")[0], _verdicts("HELD_OUT")[0]
    figures = [len(said), sum(map(names_the_mistake, filter(None, said.values()))), len(held),
               sum(map(names_the_mistake, filter(None, held.values())))]
    page = _flat((ROOT / "docs" / "course.md").read_text())
    assert (f"runs {figures[0]} wrong answers written as students write them "
            f"(`tests/data/wrong_answers.py`): every one fails, {figures[1]} of them with the "
            f"mistake named; of {figures[2]} more written after the checker was shaped on those, "
            f"every one fails and {figures[3]} are named") in page
