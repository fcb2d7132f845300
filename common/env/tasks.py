"""The tasks: where problems come from, what a prompt asks, and how a response is graded.

    TASKS["gsm8k"].load("test", "data/gsm8k_test.jsonl", seed=0)   # examples {"question", "answer"}
    TASKS["math"].grade("... so \\boxed{\\frac12}", "0.5")          # (reward, extracted, format_ok)

A task is one class registered with @register: how to load problems, how to turn a raw row into an
example, and how to grade (`Task`; arithmetic, countdown, gsm8k and math here, your own in
docs/your_own_task.md). Then what they read: data files (.jsonl, .json, .parquet) and hub rows,
`detect_task` for a file named without its task, and the worked examples of the few-shot prompts.
Number answers are graded by common/env/answers.py, MATH answers by common/env/grader.py.
"""

import json
import math
import random
import re
import sys
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

from common.env.answers import (MARKERS, MATH_MARKERS, MAX_ARITH_LEN, box_is_hedged, extract_number,
                            first_sentence, last_marker, nothing_more, numbers_equal, safe_arith,
                            retracted, tentative, to_number)
from common.errors import PathError, UsageError
from common.env.grader import (ascii_lookalikes, float_value, has_hedge, last_boxed, math_equal,
                               normalize, within_figures)
from common.env.grader_worker import count_timeout
from common.env.timelimit import OutOfTime, cpu_limit

DATA_DIR = Path(__file__).resolve().parents[2] / "data"
# CPU seconds one grade may take in this process (the sympy worker's own budget, in its process, is
# apart): a grade takes under 10 ms, and 64 hostile answers of 20,000 characters under 1 s in all
GRADE_LIMIT_S = 2.0

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
    raise _no_field(row, names, task, where)


def _no_field(row, names, task, where):
    """_field's error, for a row that holds none of `names`."""
    return UsageError(
        f"{where} has no {' / '.join(repr(n) for n in names)} field (fields found: {sorted(row)}). "
        f"The {task} task accepts rows with {TASKS[task].fields}; see data/README.md."
    )


# The longest question a row may hold: the longest of GSM8K and MATH-500 has under 2,000
# characters, and no model of this project's size reads 100,000 (some 25,000 tokens) in its context.
# A longer one is refused at once, where its first update would take minutes without a word.
MAX_QUESTION_CHARS = 100_000


def _question(row: dict, names: tuple, task: str, where: str) -> str:
    """The question of a row: text, and no longer than MAX_QUESTION_CHARS. Every task reads its
    question here, so that a list or an object never reaches a prompt."""
    question = _field(row, names, task, where)
    if not isinstance(question, str) or len(question) > MAX_QUESTION_CHARS:
        raise _bad_question(question, names, where)
    # JSON's "\ud800" escapes half of a UTF-16 pair, which no tokenizer can encode
    lone = re.search("[\ud800-\udfff]", question)
    if lone:
        raise UsageError(f"{where}: the question holds a lone surrogate ({ascii(lone[0])[1:-1]} at "
                         f"character {lone.start()}), half of a UTF-16 pair and no text: write the "
                         "whole character (or its pair of escapes) in the file, or drop the row.")
    return question


def _bad_question(question, names, where):
    """_question's error, for a question that is not text or is too long."""
    if not isinstance(question, str):
        return UsageError(f"{where}: the question is {_kind(question)}, not text; each row's "
                          f"{' / '.join(repr(n) for n in names)} field must be a string.")
    return UsageError(f"{where}: the question has {len(question):,} characters, more than the "
                      f"{MAX_QUESTION_CHARS:,} a question may have: shorten it or drop the "
                      "row (is the right field read? --question_key names another).")


def _gold(value, where: str) -> str:
    """A gold answer as text: a string as it is, a finite number in decimals (5.5, 1e20 ->
    100000000000000000000). NaN, infinity, true/false, a list or an object are refused: their text
    ("nan", "[1, 2]") would be graded as if it were the answer."""
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, float) and math.isfinite(value):
        return format(Decimal(repr(value)), "f")
    raise _bad_gold(value, where)


def _bad_gold(value, where):
    """_gold's error, for a gold answer that is neither text nor a finite number."""
    return UsageError(f"{where}: the gold answer is {_kind(value)}; it must be a string or a "
                      "finite number. Fix the row, or point --answer_key at the field that holds "
                      "the answer.")


def _label(row: dict, name: str, where: str):
    """A row's level or subject, which filters and eval.py's accuracy by level group by: absent,
    text or an integer ("Level 3", 3, "Algebra")."""
    value = row.get(name)
    if value is None or isinstance(value, str) or isinstance(value, int) and not isinstance(
            value, bool):
        return value
    raise UsageError(f"{where}: the {name} is {_kind(value)}; it must be text or an integer, such "
                     f"as {'3' if name == 'level' else repr('Algebra')}, or absent.")


def _kind(value) -> str:
    """What a JSON value is, for messages: 'a list ([1, 2])', 'NaN', 'true'."""
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if value != value else "infinite"
    name = {list: "a list", dict: "an object", str: "text"}.get(type(value), type(value).__name__)
    shown = json.dumps(value) if isinstance(value, (list, dict)) else repr(value)
    return f"{name} ({shown if len(shown) <= 40 else shown[:37] + '...'})"


class Task:
    """Base class. A task loads problems as examples {"question", "answer", ...} and grades
    responses."""

    name = ""
    fields = ""  # the accepted row fields, for error messages
    hub = {}  # split -> (dataset name, config, split name) on the Hugging Face hub
    system_prompt = ""
    # ends a stepwise episode
    final_answer = MARKERS
    options = {}  # task-specific make_env options and their defaults
    # The most new tokens a usual evaluation of the task gives a response, for eval.py's default;
    # None: eval.py's own default for the task.
    budget = None
    # The task whose data/few_shot_<name>.jsonl holds this task's worked examples, read as that task
    # reads them; None: this task's own file. A benchmark borrows MATH's, so no file is copied.
    few_shot_task = None
    # A benchmark papers report: evaluated, never trained on, so its only split is "test".
    benchmark = False

    @classmethod
    def check_split(cls, split: str) -> None:
        """Refuse a split the task does not have, before any data loads (make_env calls it): a
        benchmark's train split."""
        if cls.benchmark and split != "test":
            raise cls._only_test()

    @classmethod
    def _only_test(cls):
        """check_split's error, for a benchmark's train split."""
        return UsageError(
            f"{cls.name} is a benchmark: it is evaluated, not trained on, and has only a test "
            f"split. Evaluate it during training with --eval_datasets {cls.name}, or "
            f"afterwards with python eval.py --dataset_name {cls.name}; train on another task "
            "(e.g. --dataset_name math).")

    @classmethod
    def load(cls, split: str, path, seed: int, keys=None, **options) -> list[dict]:
        """Examples from `path` if given (a local file or a hub dataset id), else from the task's
        hub data. keys: {"question": field, "answer": field} of rows whose fields have other
        names."""
        if path is None or is_hub_id(path):
            return cls._load_hub(split, path, keys)
        # "row": the row as the file has it, whose fields a --reward_fn receives; "where": the
        # words that name it, for messages after loading (common/env/math_env.py). The training
        # and the held-out split of one file read it once (_LAST_LOADED).
        key = (cls.name, file_key(path) if Path(path).is_file() else str(path),
               tuple(sorted((keys or {}).items(), key=str)))
        if key not in _LAST_LOADED:
            _keep(_LAST_LOADED, key, [
                {**cls.from_row(rename_fields(row, keys), where), "row": row, "where": where}
                for where, row in named_rows(path, cls.name)])
        return list(_LAST_LOADED[key])  # the examples are read, never changed, downstream

    @classmethod
    def _load_hub(cls, split, path, keys):
        """Task.load's examples from the hub: the dataset id `path`, or, None, the task's own."""
        if path is not None:
            name, config, hub_split = str(path), None, split
        else:
            name, config, hub_split = cls.hub[split]
        rows = load_hub_rows(name, config, hub_split)
        examples, errors = [], []
        for i, row in enumerate(rows):
            try:
                where = f"{name} row {i + 1}"
                examples.append({**cls.from_row(rename_fields(row, keys), where), "row": row,
                                 "where": where})
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
    def worked(cls, example: dict) -> str:
        """The example's worked solution, written as a response this task's verifier pays for
        (sft.py's targets): its "solution" field as the data has it; "" where it has none."""
        return str(example.get("solution") or "").strip()

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
    (level 5); level 6 is level 5's word problems with 3-digit numbers, where a calculator helps
    (tools.py). "mixed" is levels 1-5."""

    name = "arithmetic"
    fields = "'question' and 'answer' (an integer)"
    system_prompt = ('Solve the problem. Think briefly, then end your reply with '
                     '"The answer is N." where N is a number.')
    options = {"num_examples": 10_000, "difficulty": "mixed"}

    @staticmethod
    def levels(difficulty) -> list[int]:
        """1..6, "mixed" (levels 1-5), a range "1-2", or a list "1,3" -> the list of levels to draw
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
        if not levels or any(lv not in range(1, 7) for lv in levels):
            raise UsageError("difficulty must be 1, ..., 6, a range such as '1-2', a list "
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
            if level == 6:  # the same word problems, with numbers a calculator is for
                a, b, c = rng.randint(100, 999), rng.randint(100, 999), rng.randint(11, 99)
            if level >= 5:
                question, answer, worked = cls.word_problem(rng, a, b, c)
            else:
                expr = rng.choice({
                    1: [f"{a} + {b}"],
                    2: [f"{a} + {b}", f"{a} - {b}"],
                    3: [f"{a} * {c}", f"{a} + {b} - {two()}"],
                    4: [f"{a} + {b} * {c}", f"({a} + {b}) * {c}", f"{a} * {c} - {b}",
                        f"({a} - {b}) * {c}"],
                }[level])
                question, answer = f"What is {expr}?", int(safe_arith(expr))
                worked = f"{expr} = {answer}."
            if answer >= 0:  # the worked line, as the few-shot examples end theirs
                return {"question": question, "answer": str(answer), "level": level,
                        "solution": f"{worked}\nThe answer is {answer}."}


    @staticmethod
    def word_problem(rng, a, b, c):
        """(question, answer, the worked line) of one of five word problems."""
        name, items = rng.choice(_NAMES), rng.choice(_ITEMS)
        k, bill = rng.randint(2, 12), rng.choice([50, 100, 200])
        return rng.choice([
            (f"{name} has {a} {items} and buys {c} bags with {b} {items} in each bag. How many "
             f"{items} does {name} have now?", a + c * b,
             f"{c} * {b} = {c * b} {items} in the bags, and {a} + {c * b} = {a + c * b}."),
            (f"A shop had {a + b} {items}. It sold {b} in the morning and {c} in the afternoon. "
             f"How many {items} are left?", a - c, f"{a + b} - {b} - {c} = {a - c}."),
            (f"{name} reads {b} pages a day for {c} days and then {a} more pages. How many pages "
             f"does {name} read in total?", b * c + a,
             f"{b} * {c} = {b * c} pages, and {b * c} + {a} = {b * c + a}."),
            (f"{c * k} {items} are shared equally among {c} friends. How many {items} does each "
             "friend get?", k, f"{c * k} / {c} = {k}."),
            (f"{name} buys {c} notebooks that cost {k} dollars each and pays with a {bill} dollar "
             f"bill. How much change does {name} get, in dollars?", bill - c * k,
             f"{c} * {k} = {c * k} dollars, and {bill} - {c * k} = {bill - c * k}."),
        ])

    @classmethod
    def from_row(cls, row, where):
        answer = _gold(_field(row, ("answer",), cls.name, where), where).strip()
        if to_number(answer) is None:
            raise UsageError(f"{where}: the answer {answer!r} is not a number")
        _label(row, "level", where)
        return {**row, "question": _question(row, ("question",), cls.name, where),
                "answer": answer}


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
    def worked(cls, example):
        """A generated problem's expression in the answer tags; a file's solution as it is."""
        text = super().worked(example)
        return text if not text or "<answer>" in text else f"<answer> {text} </answer>"

    @classmethod
    def from_row(cls, row, where):
        gold = row.get("answer")
        # TinyZero's ground truth
        if not ({"numbers", "nums"} & set(row)) and isinstance(gold, (str, dict)):
            try:
                gold = json.loads(gold) if isinstance(gold, str) else gold
            except ValueError:  # not JSON, or an integer of too many digits
                gold = None
            if not isinstance(gold, dict):
                raise UsageError(f"{where}: no 'numbers' (or 'nums') field, and the answer "
                                 f"{str(row['answer'])[:60]!r} is not the JSON object "
                                 '{"numbers": [...], "target": N} that holds them.')
            row = {**row, **gold}
        numbers = _field(row, ("numbers", "nums"), cls.name, where)
        if not isinstance(numbers, list) or not numbers or not all(
                _whole(n) and n >= 0 for n in numbers):
            raise UsageError(f"{where}: the numbers are {_kind(numbers)}; they must be a list of "
                             "whole numbers >= 0, such as [3, 7, 25] (the grader reads the "
                             "digits of a response, without signs or decimals).")
        target = _field(row, ("target",), cls.name, where)
        if not _whole(target):
            raise UsageError(f"{where}: the target is {_kind(target)}; it must be a whole "
                             "number, such as 24.")
        numbers, target = [int(n) for n in numbers], int(target)
        question = (
            f"Using the numbers {numbers}, create an equation that equals {target}. You can use "
            "basic "
            "arithmetic operations (+, -, *, /) and each number can only be used once. Show your "
            "work in "
            f"<think> </think> tags. And return the final answer in <answer> </answer> tags, "
            f"for example <answer> (1 + 2) / 3 </answer>."
        )
        if len(question) > MAX_QUESTION_CHARS:
            raise UsageError(f"{where}: {len(numbers):,} numbers make a question of "
                             f"{len(question):,} characters, more than the {MAX_QUESTION_CHARS:,} "
                             "a question may have: give a few numbers a row, as CountDown does.")
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
        # Nothing but arithmetic: text after a `#` is no comment, and its numbers would count as
        # used ("25 * 4 # and 7")
        if len(expr) > MAX_ARITH_LEN or not re.fullmatch(r"[0-9+\-*/×÷().\s]*", expr):
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
        question = _question(row, ("question", "problem"), cls.name, where)
        text = _gold(_field(row, ("answer", "solution"), cls.name, where), where)
        answer = text.rsplit("####", 1)[1] if "####" in text else text
        said = re.search(r"the answer is:?\s*\$?\s*([-\d,.]+?)\.?\s*$", text, re.IGNORECASE)
        if "####" not in text and said:  # LLM_RL's files end their solutions "The answer is: N"
            answer = said.group(1)
        answer = ascii_lookalikes(answer).strip()
        # to_number reads a comma as a thousands separator only (1,234): "5,5" may be 5.5 or 55
        number = to_number(answer)
        if number is None and re.fullmatch(r"-?[\d,]+(?:\.\d*)?", answer):
            raise UsageError(f"{where}: the gold answer {answer!r} is ambiguous (a decimal comma, "
                             "or thousands in groups of other than 3 digits): write it as "
                             "'#### 5.5' or '#### 1,234'.")
        if number is None:
            raise UsageError(f"{where}: no number after '####' in {text[-80:]!r}")
        answer = answer.replace(",", "")
        solution = text if "####" in text else row.get("solution", "")
        return {"question": question, "answer": answer, "solution": solution}

    @classmethod
    def worked(cls, example):
        """openai/gsm8k's solution with its last line, '#### N', written as the system prompt asks:
        'The answer is N.' (the calculator spans stay: MathEnv.solution drops them)."""
        text = super().worked(example)
        if "####" in text:
            text = f"{text.rsplit('####', 1)[0].rstrip()}\nThe answer is {example['answer']}."
        return text.strip()


def _whole(value) -> bool:
    """A whole number as JSON gives one: 3 or 3.0, not 2.7, "12", true, NaN or infinity."""
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or isinstance(value, float) and value.is_integer()


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
    final_answer = MATH_MARKERS

    @classmethod
    def from_row(cls, row, where):
        question = _question(row, ("problem", "question"), cls.name, where)
        # `is not None`, not `or`: a gold of 0 is an answer
        answer = next((row[k] for k in ("answer", "final_answer") if row.get(k) not in (None, "")),
                      None)
        answer = None if answer is None else _gold(answer, where)
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
            answer = last_boxed(_gold(_field(row, ("answer", "final_answer", "solution"),
                                             cls.name, where), where))
            if answer is None:
                raise UsageError(f"{where}: the solution has no \\boxed{{}} answer; add an "
                                 "'answer' field")
        return {
            "question": question, "answer": str(answer), "solution": row.get("solution", ""),
            "level": _label(row, "level", where),
            "subject": _label(row, "subject", where) or _label(row, "type", where),
        }

    @classmethod
    def extract(cls, response):
        """The last \\boxed{} (empty box = no answer); else the math after the last "The answer is":
        its $...$ span, after which the sentence may hold units but no hedge word and no other
        number ("$18$ (or perhaps $19$)" is no answer), or else the rest of the sentence, which must
        hold no hedge word outside \\text{} ("3 or 4" is no answer; `3 \\text{ or } 4` is the list
        3, 4). A bare number is never an answer."""
        response = ascii_lookalikes(response)
        marker = last_marker(response, MATH_MARKERS)  # the last one decides, box or words
        if marker is None:
            return None, False
        if marker[0] in ("\\boxed", "\\fbox"):
            pred = None if box_is_hedged(response) else last_boxed(response)
            return pred, pred is not None
        if tentative(response, marker.start()):  # "check whether the answer is ..."
            return None, False
        rest = re.sub(r"^[\s:*]+", "", response[marker.end() :]).split("\n", 1)[0]
        pred = None
        for start, end in (("$$", r"\$\$"), ("$", r"(?<!\\)\$"), ("\\(", r"\\\)"),
                           ("\\[", r"\\\]")):
            close = re.compile(end).search(rest, len(start)) if rest.startswith(start) else None
            if close:  # the math span: then units at most, no hedge, no other number
                pred = rest[len(start) : close.start()]
                if not nothing_more(rest[close.end() :]):
                    return None, False
                break
        if pred is None:
            pred = first_sentence(rest)
            yes_or_no = re.fullmatch(r"\W*(?:yes|no)\W*", pred, re.IGNORECASE)  # "no" is no hedge
            if not yes_or_no and has_hedge(re.sub(r"\\text\s*\{[^{}]*\}", " ", pred)):
                return None, False
        pred = pred.strip(" *").rstrip(".").strip()
        after = rest[len(first_sentence(rest)) :] + "\n" + response[marker.end() :].partition(
            "\n")[2]
        if pred and retracted(after, lambda n: math_equal(n, pred)):
            return None, False  # "The answer is 12. Actually it should be 13."
        return (pred, True) if pred else (None, False)

    @classmethod
    def grade(cls, response, answer):
        pred, format_ok = cls.extract(response)
        return float(format_ok and math_equal(pred, answer)), pred, format_ok


# ------------------------------------------------------------------------------------------------
# The benchmarks papers report, named as Qwen2.5-Math's and SimpleRL's evaluation scripts name them.
# Each is MATH with a test split only: MATH's system prompt and worked examples, a \boxed{} answer
# graded with math_equal (AIME: an integer alone), and the budget its usual evaluation gives.


class _Benchmark(MATH):
    """A benchmark: evaluated, never trained on, so its only split is "test" (`hub` maps only
    "test", whatever the hub calls that split)."""

    benchmark = True
    few_shot_task = "math"
    # Qwen2.5-Math's math_eval.py gives 2,048 new tokens a call by default, and the forks of it that
    # RL papers evaluate these benchmarks with (SimpleRL's among them) 3,000 to 4,096 for models
    # that do not "think" at length: 4,096 seldom cuts such a model's answer short.
    budget = 4096

    @classmethod
    def load(cls, split, path, seed, keys=None, **options):
        cls.check_split(split)  # make_env has checked it; Task.load called alone has not
        return super().load(split, path, seed, keys, **options)

    @classmethod
    def from_row(cls, row, where):
        # A parquet column of whole answers may hold floats (amc23's 27.0): the gold is "27", as
        # written, not "27.0".
        row = {k: int(v) if k in ("answer", "final_answer") and isinstance(v, float)
               and v.is_integer() else v for k, v in row.items()}
        return super().from_row(row, where)


class _AIME(_Benchmark):
    """AIME: every answer is an integer from 0 to 999. A response is right only when its last
    \\boxed{} holds that integer alone, in digits or in English words, in a text or bold command
    or not; leading zeros are allowed, since AIME answers are written with three digits
    (`\\boxed{033}` and `\\boxed{\\textbf{033}}` are 33, as is `\\boxed{\\text{thirty-three}}`).
    `\\boxed{33.0}`, `\\boxed{\\frac{66}{2}}` and `\\boxed{33 \\text{ ways}}` are wrong however
    their value reads: the answer sheet takes an integer, and nothing the model writes is
    evaluated. "The answer is 33" without a box is no answer."""

    fields = "'problem' (or 'question') and 'answer', an integer 0-999 (\"033\", 33 or \"33\")"

    @classmethod
    def from_row(cls, row, where):
        example = super().from_row(row, where)
        digits = _aime_integer(example["answer"])
        if digits is None:
            raise UsageError(f"{where}: the answer {example['answer']!r} is not an AIME answer, an "
                             "integer from 0 to 999: is this AIME data? (--answer_key names the "
                             "field that holds the answer)")
        return {**example, "answer": str(digits)}

    @classmethod
    def extract(cls, response):
        marker = last_marker(ascii_lookalikes(response), MATH_MARKERS)
        if marker is None or marker[0] not in ("\\boxed", "\\fbox"):
            return None, False
        return super().extract(response)

    @classmethod
    def grade(cls, response, answer):
        pred, format_ok = cls.extract(response)
        value, gold = _aime_integer(pred), _aime_integer(answer)
        return float(format_ok and value is not None and value == gold), pred, format_ok


def _aime_integer(text) -> int | None:
    """The integer 0-999 that text writes in digits alone, leading zeros allowed ("033" -> 33), or
    in English words ("thirty-three", "three hundred and five"), in a text or bold command or not
    (`\\textbf{033}`); None for anything else ("33.0", "\\frac{66}{2}", "1000", "0 3 3", None)."""
    if not isinstance(text, str):
        return None
    text = re.sub(r"^\s*\\(?:text|textbf|mathbf|mathrm|textrm|mbox)\s*\{([^{}]*)\}\s*$", r"\1",
                  text)
    digits = re.fullmatch(r"\s*0*(\d{1,3})\s*", text)
    return int(digits.group(1)) if digits else _number_words(text)


_ONES = {w: n for n, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen".split())}
_TENS = {w: 10 * n for n, w in enumerate(
    "twenty thirty forty fifty sixty seventy eighty ninety".split(), start=2)}


def _number_words(text: str) -> int | None:
    """An integer 0-999 in English words, in the one way it is written: [ONES hundred [and]] then
    TENS[-ONES] or ONES ("nine hundred ninety-nine", "three hundred and five", "zero"). Anything
    else, a scale ("thousand"), a count ("dozen"), a hedge or two numbers, is None."""
    words = re.sub(r"[\s-]+", " ", text.strip().lower()).split()
    value = 0
    if len(words) >= 2 and words[1] == "hundred" and words[0] in _ONES and _ONES[words[0]] > 0:
        value, words = 100 * _ONES[words[0]], words[2:]
        if words[:1] == ["and"] and len(words) > 1:
            words = words[1:]
    if not words:
        return value or None
    rest = None
    if len(words) == 1 and words[0] in _ONES:
        rest = _ONES[words[0]]
    elif words[0] in _TENS and (len(words) == 1 or (len(words) == 2 and words[1] in _ONES
                                                    and 0 < _ONES[words[1]] < 10)):
        rest = _TENS[words[0]] + (_ONES[words[1]] if len(words) == 2 else 0)
    if rest is None or (value and rest == 0):
        return None
    return value + rest


@register
class AIME24(_AIME):
    """AIME 2024, I and II: 30 problems. HuggingFaceH4/aime_2024 (id, problem, solution, answer,
    url, year), the AIME 2024 of open-r1, TRL's recipes and NeMo-RL; its one split is named
    "train"."""

    name = "aime24"
    hub = {"test": ("HuggingFaceH4/aime_2024", None, "train")}


@register
class AIME25(_AIME):
    """AIME 2025, I and II: 30 problems. math-ai/aime25 (problem, answer, id; split "test"), the
    AIME 2025 of verl-based recipes and AReaL's math data; opencompass/AIME2025 holds I and II as
    two configs, which one hub entry cannot name."""

    name = "aime25"
    hub = {"test": ("math-ai/aime25", None, "test")}


@register
class AMC23(_Benchmark):
    """AMC 2023: 40 problems. math-ai/amc23 (question, answer; split "test"), as verl-based
    recipes load it. Its answers are numbers, some stored as floats (27.0 reads as "27")."""

    name = "amc23"
    fields = "'question' (or 'problem') and 'answer'"
    hub = {"test": ("math-ai/amc23", None, "test")}


@register
class MATH500(_Benchmark):
    """MATH-500: the 500 MATH test problems of "Let's Verify Step by Step" (problem, solution,
    answer, subject, level, unique_id), the math task's own test split, by its benchmark name;
    --levels and the MATH subjects filter the math task only."""

    name = "math500"
    hub = {"test": ("HuggingFaceH4/MATH-500", None, "test")}


@register
class MinervaMath(_Benchmark):
    """Minerva's OCW courses: 272 science and engineering problems. math-ai/minervamath (question,
    answer; split "test"), the copy verl-based recipes and AReaL's math data load."""

    name = "minerva_math"
    fields = "'question' (or 'problem') and 'answer'"
    hub = {"test": ("math-ai/minervamath", None, "test")}

    @classmethod
    def grade(cls, response, answer):
        """MATH's grade, and for a gold written as a decimal or in scientific notation (a measured
        quantity) the gold's significant figures: an answer that rounds to it is right
        (grader.within_figures)."""
        reward, pred, format_ok = super().grade(response, answer)
        if reward or not format_ok:
            return reward, pred, format_ok
        return float(within_figures(pred, answer)), pred, format_ok


@register
class OlympiadBench(_Benchmark):
    """OlympiadBench's English, text-only, open-ended math (OE_TO_maths_en_COMP): 674 problems.
    math-ai/olympiadbench (question, final_answer, solution, ...; split "test"), the copy
    verl-based recipes and AReaL's math data load. final_answer is a list of "$...$" strings: the
    gold is the list without its $, joined with ", ", which math_equal reads as a list in any
    order (a problem of several answers asks for all of them)."""

    name = "olympiadbench"
    fields = "'question' (or 'problem') and 'final_answer': a list of \"$...$\" strings, or text"
    hub = {"test": ("math-ai/olympiadbench", None, "test")}

    @classmethod
    def from_row(cls, row, where):
        answers = row.get("final_answer")
        if isinstance(answers, list):
            if not answers or not all(isinstance(a, str) and a.strip("$ ") for a in answers):
                raise UsageError(f"{where}: the final_answer is {_kind(answers)}; it must be a "
                                 'non-empty list of answers as text, such as ["$\\\\frac{1}{2}$"].')
            row = {**row, "final_answer": ", ".join(a.strip().strip("$").strip() for a in answers)}
        if isinstance(row.get("solution"), list):  # its worked solutions: shown, never graded
            row = {**row, "solution": "\n\n".join(map(str, row["solution"]))}
        return super().from_row(row, where)

    @classmethod
    def grade(cls, response, answer):
        """MATH's grade, and OlympiadBench's own tolerance for a decimal answer: within 1e-8 of the
        gold's value, relative to it (its judger's precision, 1e-8), where MATH asks for 1e-12."""
        reward, pred, format_ok = super().grade(response, answer)
        if reward or not format_ok or not re.fullmatch(r"-?[0-9]*\.[0-9]+", normalize(pred)):
            return reward, pred, format_ok
        value, gold = float(normalize(pred)), float_value(normalize(answer))
        close = gold is not None and gold != 0 and abs(value - gold) <= 1e-8 * abs(gold)
        return float(close), pred, format_ok


def grade(task: type[Task], response: str, answer: str) -> tuple[float, str | None, bool]:
    """task.grade within GRADE_LIMIT_S of CPU time; past it, wrong and counted as a timeout."""
    try:
        with cpu_limit(GRADE_LIMIT_S):
            return task.grade(response, answer)
    except OutOfTime:
        count_timeout()
        return 0.0, None, False


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
    if not keys or all(key is None for key in keys.values()):
        return row
    return _renamed(row, keys)


def _renamed(row, keys):
    """rename_fields' row, where a --question_key or --answer_key is given."""
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


# The most bytes a data file's row may take: a .jsonl line, read a line at a time, and a whole .json
# file, which is parsed at once. The longest row in data/ is 329 bytes and a MATH solution a few KB;
# a 200 MB line took over 6 GB of memory to parse.
MAX_LINE_BYTES = 8 * 2**20
MAX_JSON_BYTES = 256 * 2**20


def read_rows(path, task: str) -> list[dict]:
    """Rows of a .jsonl, .json (a list of objects) or .parquet file. A file that is not UTF-8, a
    .jsonl line over MAX_LINE_BYTES or a .json file over MAX_JSON_BYTES is refused, naming the line
    (and the byte where the UTF-8 breaks)."""
    return _read(path, task)[0]


def named_rows(path, task: str) -> list[tuple[str, dict]]:
    """read_rows's rows, each with the words that name it in a message: "data.jsonl: row 3", and
    its line where blank lines of a .jsonl file make the two differ ("row 3 (line 5)")."""
    rows, lines = _read(path, task)
    return [(f"{path}: row {i}" + (f" (line {line})" if line not in (None, i) else ""), row)
            for i, (row, line) in enumerate(zip(rows, lines), 1)]


# The last files read, kept: a run reads its data file for its task's fields, its training split
# and its held-out split (with its few-shot file between), and a file of a million rows takes
# seconds each time. A few files only, keyed by size and time, so that a changed file is read.
_LAST_READ = {}
_LAST_LOADED = {}  # Task.load's examples of the files in _LAST_READ
KEPT_FILES = 3
SAY_READING_BYTES = 16 * 2**20  # a file this large says that it is being read, before it is


def _read(path, task):
    """(rows, the line of each row in a .jsonl file, else None each)."""
    path = Path(path)
    if not path.is_file():
        raise _not_found(path, task)
    key = (*file_key(path), MAX_LINE_BYTES, MAX_JSON_BYTES)  # read under the same limits
    if key in _LAST_READ:
        rows, lines = _LAST_READ[key]
        return list(rows), list(lines)
    if key[1] >= SAY_READING_BYTES:
        print(f"reading {path} ({key[1] / 2**20:,.0f} MB)...", flush=True)
    lines = None
    try:
        if path.suffix == ".jsonl":
            rows, lines = _jsonl_rows(path)
        else:
            rows = _other_rows(path)
    except OSError as e:  # a file it may not read, a folder named x.jsonl...
        raise PathError(f"{path} can't be read ({e.strerror or e}): pass a data file you can "
                        "read.") from None
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows) or not rows:
        raise UsageError(f"{path}: expected a non-empty list of objects with {TASKS[task].fields}")
    lines = lines or [None] * len(rows)
    _keep(_LAST_READ, key, (rows, lines))
    return list(rows), list(lines)


def _keep(kept: dict, key, value) -> None:
    """kept[key] = value, the oldest of KEPT_FILES entries let go."""
    kept[key] = value
    while len(kept) > KEPT_FILES:
        kept.pop(next(iter(kept)))


def file_key(path) -> tuple:
    """A file's identity while it is unchanged: its path, size and modification time."""
    stat = Path(path).stat()
    return str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns


def _not_found(path, task):
    """_read's error, for a path that is no file."""
    hub = sorted({name for name, _, _ in TASKS[task].hub.values()})
    alt = f", or leave path out to load {' / '.join(hub)} from the hub" if hub else ""
    return PathError(
        f"dataset file not found: {path}. Pass an existing .jsonl, .json or .parquet file with "
        f"path=... (--dataset_path on the command line){alt}."
    )


def _other_rows(path):
    """_read's rows of a file that is not .jsonl: .json, .parquet, or the error of another type."""
    if path.suffix == ".json":
        return _json_rows(path)
    if path.suffix == ".parquet":
        return _parquet_rows(path)
    raise UsageError(f"{path}: unsupported file type {path.suffix!r}; use .jsonl, .json or "
                     ".parquet")


def _jsonl_rows(path):
    """(rows, the line number of each): blank lines hold no row."""
    rows, lines, offset = [], [], 0
    with open(path, "rb") as f:
        # split on "\n" only: str.splitlines also breaks at U+2028, which a JSON string may hold as
        # it is. readline's limit keeps a line that is too long from being read whole.
        for number, raw in enumerate(iter(lambda: f.readline(MAX_LINE_BYTES + 1), b""), 1):
            text = raw.removesuffix(b"\n")
            if len(text) > MAX_LINE_BYTES:
                raise _too_long_line(path, number)
            line = _utf8(text, path, number, offset)
            offset += len(raw)
            if line.strip():
                rows.append(_json(line, path, number))
                lines.append(number)
    return rows, lines


def _too_long_line(path, number):
    """_jsonl_rows' error, for a line over MAX_LINE_BYTES."""
    return UsageError(f"{path}, line {number}: longer than {MAX_LINE_BYTES / 2**20:.3g} MB, the "
                      "most one row may take; each line of a .jsonl file is one problem (is this "
                      "the right file?).")


def _json_rows(path):
    if path.stat().st_size > MAX_JSON_BYTES:
        raise UsageError(f"{path}: {path.stat().st_size / 2**20:.3g} MB, beyond the "
                         f"{MAX_JSON_BYTES / 2**20:.3g} MB a .json file, parsed at once, may take: "
                         "write it as .jsonl, one row a line, which is read a line at a time.")
    data = path.read_bytes()
    rows = _json(_utf8(data, path), path)
    return rows.get("data", rows) if isinstance(rows, dict) else rows


def _parquet_rows(path):
    import pyarrow  # installed with datasets
    import pyarrow.parquet

    try:
        return pyarrow.parquet.read_table(path).to_pylist()
    except pyarrow.ArrowException as e:
        raise UsageError(f"{path}: not a parquet file that pyarrow reads ({e}).") from None


def _utf8(raw: bytes, path, line=None, offset=0) -> str:
    """raw decoded as UTF-8 (a byte-order mark at the file's start is dropped), or the error naming
    the line and the byte. line: the line number that raw is (None: raw is the whole file); offset:
    where raw starts in the file."""
    mark = 3 if offset == 0 and raw.startswith(b"\xef\xbb\xbf") else 0
    try:
        return raw[mark:].decode("utf-8")
    except UnicodeDecodeError as e:
        raise _not_utf8(raw, mark + e.start, path, line, offset) from None


def _not_utf8(raw, bad, path, line, offset):
    """_utf8's error, for raw whose byte `bad` breaks the UTF-8."""
    number = line if line is not None else raw.count(b"\n", 0, bad) + 1
    return UsageError(f"{path}, line {number}: not UTF-8 (byte 0x{raw[bad]:02x} at byte "
                      f"{offset + bad} of the file): save it as UTF-8, e.g. iconv -f latin1 -t "
                      f"utf-8 {path.name} > fixed{path.suffix}.")


class _TooManyDigits(ValueError):
    def __init__(self, digits):
        super().__init__(digits[:20])
        self.digits = digits


def _parse_int(digits: str) -> int:
    """A JSON integer; one past Python's limit on int-string conversion (4,300 digits) is refused
    by name, not with the ValueError that int() raises."""
    limit = sys.get_int_max_str_digits()
    if limit and len(digits.lstrip("-")) > limit:
        raise _TooManyDigits(digits)
    return int(digits)


def _json(text: str, path, line=None):
    """text parsed as JSON, or the error naming the line. line: the .jsonl line that text is."""
    try:
        return json.loads(text, parse_int=_parse_int)
    except (_TooManyDigits, json.JSONDecodeError, RecursionError) as e:
        raise _bad_json(e, text, path, line) from None


def _bad_json(e, text, path, line):
    """_json's error, for text that json.loads refused: a long integer, no JSON, or too deep."""
    if isinstance(e, _TooManyDigits):
        number = line if line is not None else text.count("\n", 0, text.find(e.digits)) + 1
        return UsageError(f"{path}, line {number}: an integer of {len(e.digits):,} digits, more "
                          f"than the {sys.get_int_max_str_digits():,} Python reads from text: "
                          "write it as a string (in quotes), or drop the row.")
    if isinstance(e, json.JSONDecodeError):
        number = line if line is not None else e.lineno
        shown = f": {text[:80]!r}. Each line of a .jsonl file is one JSON object" if line else ""
        return UsageError(f"{path}, line {number}: not valid JSON ({e.msg}, column "
                          f"{e.colno}){shown}.")
    where = f"{path}, line {line}" if line is not None else f"{path}"
    return UsageError(f"{where}: JSON nested too deeply to be a row of fields.")



# ------------------------------------------------------------------------------------------------
# What a file is for, and the worked examples of the prompts


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



def load_few_shot(task: type[Task], k: int, say=print) -> list[dict]:
    """The first k worked examples of data/few_shot_<task>.jsonl; none for a task without one."""
    if k == 0:
        return []
    # a benchmark's worked examples are MATH's, graded and read as the math task reads them
    task = TASKS[task.few_shot_task] if task.few_shot_task else task
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
