"""Bad input never hangs, lies or writes outside its run (issue 52): a number out of range, a data
file that is too big, not UTF-8 or repeats its rows, a checkpoint of another file or kind, a link
planted in the run folder, a path given with ~. Each is one line, `error: ...`, naming the flag or
file and the fix, with exit status 1, no traceback, and before any model loads where it can be found
that early. tests/test_reliability.py holds the earlier checks of the same kind."""

import importlib
import math
import sys
import time
import typing
from dataclasses import fields, replace
from pathlib import Path

import pytest
import warm  # tests/warm.py: `python X.py` runs forked from a warm process

from common.algorithms import ALGORITHMS
from common.errors import UsageError

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--model_name_or_path", "tiny-random", "--max_new_tokens", "8", "--num_eval_problems", "4",
        "--num_prompts", "2", "--num_generations", "4", "--micro_batch_size", "2"]


def fails_in_one_line(cmd, says, within=60):
    """Run `cmd` (python X.py ...): it must exit 1 within `within` seconds with the one line
    `error: <says>...` on stderr, nothing else there, and no traceback. -> the line."""
    start = time.time()
    out = warm.run([sys.executable, *cmd], cwd=ROOT, capture_output=True, text=True, timeout=600)
    took = time.time() - start
    assert out.returncode == 1, out.stdout[-2000:] + out.stderr[-2000:]
    assert "Traceback" not in out.stderr and out.stderr.count("\n") == 1, out.stderr[-3000:]
    assert out.stderr.startswith(f"error: {says}"), out.stderr
    assert took < within, f"{took:.0f} s"
    return out.stderr.strip()


# ---- numbers: every one in its range, every real one finite, sizes that memory holds ----------------------
@pytest.mark.parametrize("flags,says", [
    # a flat distribution sampled, and the run exited 0
    (["--temperature", "inf"], "--temperature inf: must be a finite number (the default is 0.7)."),
    # weights of 1e30 after two updates, exit 0
    (["--learning_rate", "1e30"], "--learning_rate 1e+30: must be in [0, 1] (the default is 5e-06)."),
    # merged weights of 2e8 after two updates, exit 0
    (["--lora_r", "4", "--lora_alpha", "1000000000000"],
     ("--lora_alpha 1000000000000: adapters are scaled by lora_alpha / lora_r = 2.5e+11, which must be at "
      "most 64 (the default, 2 * lora_r, scales by 2); pass --lora_alpha 256 or less.")),
    # silently became 2 * lora_r
    (["--lora_r", "4", "--lora_alpha", "0"], "--lora_alpha 0: must be >= 1 (leave it out for its default)."),
    # 8 GB in a minute
    (["--num_prompts", "1000000000000"], "--num_prompts 1000000000000: must be in [1, 65536] (the default is 4)."),
    (["--num_generations", "1000000000000"],
     "--num_generations 1000000000000: must be in [1, 4096] (the default is 8)."),
    # each within its bound, the product beyond any memory
    (["--num_prompts", "65536", "--num_generations", "4096"],
     "--num_prompts 65536 x --num_generations 4096 over 1 process(es) is 268435456 sequences a rank"),
    # tracebacks from peft and from the sampling loop
    (["--lora_r", "-1"], "--lora_r -1: must be in [0, 4096] (the default is 0)."),
    (["--max_sampling_rounds", "0", "--dynamic_sampling"],
     "--max_sampling_rounds 0: must be in [1, 64] (the default is 4)."),
])
def test_a_number_out_of_range_is_one_line_before_any_model_loads(flags, says, tmp_path):
    fails_in_one_line(["grpo.py", *TINY, *flags, "--output_dir", str(tmp_path / "run")], says, within=30)
    assert not (tmp_path / "run").exists()  # refused before the run wrote anything


def _float_fields(args_class):
    """The options that hold a real number or a list of them (float, Optional[float], list[float]...)."""
    hints = typing.get_type_hints(args_class)
    return [f.name for f in fields(args_class) if "float" in str(hints[f.name])]


@pytest.mark.parametrize("algo", [*ALGORITHMS, "eval"])
def test_every_real_valued_option_of_every_file_must_be_finite(algo, tmp_path):
    # a class check: an option added later is covered without a line of its own
    module = importlib.import_module(algo)
    args = replace(module.Args(), model_name_or_path="tiny-random")
    if algo == "eval":
        args = replace(args, output=str(tmp_path / "out.jsonl"))
        check = module.check_args
    else:
        args = replace(args, output_dir=str(tmp_path))


        def check(a):
            module.check_args(a, world_size=1)
    names = _float_fields(module.Args)
    assert {"temperature", "top_p", "reward_weights"} <= set(names)
    for name in names:
        value = [1.0, math.nan] if name == "reward_weights" else math.inf
        if name == "max_grad_norm":  # inf is its "no clipping"
            value = math.nan
        with pytest.raises(UsageError, match=rf"^--{name} ") as e:
            check(replace(args, **{name: value}))
        assert "finite" in str(e.value) or "must be" in str(e.value), e.value


def test_help_shows_each_number_option_s_range():
    from common.args import make_parser
    from grpo import Args

    text = " ".join(make_parser(Args).format_help().split())
    assert "prompts per update, over all ranks (default: 4; in [1, 65536])" in text
    assert "(default: 5e-06; in [0, 1])" in text  # --learning_rate
    assert "lora_alpha / lora_r, at most 64 (None: 2 * lora_r) (default: None; >= 1)" in text


# ---- data files: a size per row, UTF-8 named where it breaks ------------------------------------------------
ROW = '{"question": "What is 2 + 3?", "answer": "5", "level": 1}'


def test_a_data_line_too_long_to_be_a_row_is_one_line_naming_the_file_and_line(tmp_path):
    from common.tasks import MAX_LINE_BYTES

    data = tmp_path / "train.jsonl"
    # a 200 MB line took over 14 GB and two minutes before this; one byte over the limit will do
    data.write_text(ROW + "\n" + '{"question": "' + "x" * MAX_LINE_BYTES + '", "answer": "1"}\n')
    fails_in_one_line(["grpo.py", *TINY, "--dataset_path", str(data), "--output_dir", str(tmp_path / "run")],
                      f"{data}, line 2: longer than 8 MB, the most one row may take", within=30)
    assert not (tmp_path / "run").exists()


def test_a_data_file_that_is_not_utf8_names_the_line_and_the_byte(tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_bytes((ROW + "\n").encode() + '{"question": "Combien font 2 + 3, café?", "answer": "5"}\n'
                     .encode("latin-1"))
    byte = len(ROW) + 1 + len('{"question": "Combien font 2 + 3, caf')
    fails_in_one_line(["grpo.py", *TINY, "--dataset_path", str(data), "--output_dir", str(tmp_path / "run")],
                      f"{data}, line 2: not UTF-8 (byte 0xe9 at byte {byte} of the file): save it as UTF-8, "
                      "e.g. iconv -f latin1 -t utf-8 train.jsonl > fixed.jsonl.", within=30)


def test_data_files_too_big_nested_or_not_parquet_are_refused_and_a_bom_is_read(tmp_path, monkeypatch):
    from common import tasks

    json_file = tmp_path / "train.json"
    json_file.write_text("[" + ",".join([ROW] * 20_000) + "]")  # 1.11 MB
    assert len(tasks.read_rows(json_file, "arithmetic")) == 20_000
    monkeypatch.setattr(tasks, "MAX_JSON_BYTES", 2**20)  # parsed whole: a size for the file
    with pytest.raises(UsageError, match=r"train.json: 1.11 MB, beyond the 1 MB a .json file, parsed at once, "
                                         r"may take: write it as .jsonl"):
        tasks.read_rows(json_file, "arithmetic")
    (tmp_path / "deep.jsonl").write_text("[" * 100_000 + "\n")
    with pytest.raises(UsageError, match=r"deep.jsonl, line 1: JSON nested too deeply"):
        tasks.read_rows(tmp_path / "deep.jsonl", "arithmetic")
    (tmp_path / "bad.parquet").write_text(ROW)
    with pytest.raises(UsageError, match=r"bad.parquet: not a parquet file that pyarrow reads"):
        tasks.read_rows(tmp_path / "bad.parquet", "arithmetic")
    # a byte-order mark (Windows editors write one) is not part of the first row
    (tmp_path / "bom.jsonl").write_bytes(b"\xef\xbb\xbf" + (ROW + "\n" + ROW).encode())
    assert [r["answer"] for r in tasks.read_rows(tmp_path / "bom.jsonl", "arithmetic")] == ["5", "5"]


# ---- a data file's held-out fifth: no question on both sides --------------------------------------------------
def _rows(questions):
    return "".join(f'{{"question": "What is {q} + 1?", "answer": "{q + 1}", "level": 1}}\n' for q in questions)


def test_a_repeated_question_is_held_out_or_trained_on_with_all_its_copies(tmp_path):
    from common.env import make_envs
    from grpo import Args

    path = tmp_path / "train.jsonl"
    # 20 questions, the first 10 three times over: they leaked into both halves
    path.write_text(_rows(list(range(10)) * 3 + list(range(10, 20))))
    said = []
    train, held = make_envs(Args(dataset_path=str(path), num_eval_problems=200), say=said.append)
    trained = {ex["question"] for ex in train.examples}
    evaluated = [ex["question"] for ex in held.examples]
    assert len(evaluated) == 4 == len(set(evaluated))  # a fifth of the 20 questions, once each
    assert not trained & set(evaluated)
    assert len(trained) == 16 and len(train) + sum(3 if int(q.split()[2]) < 10 else 1 for q in evaluated) == 40
    assert said[-1] == (f"{path}: no --eval_dataset_path, so 4 of its 20 distinct questions are held out "
                        f"for evaluation and {len(train)} rows of the others train (40 rows: a repeated "
                        "question is held out or trained on with all its copies)")
    # a file without repeats splits as it did when rows were drawn: the same seeded sample of rows
    import random

    path.write_text(_rows(range(20)))
    said = []
    train, held = make_envs(Args(dataset_path=str(path), num_eval_problems=200), say=said.append)
    drawn = sorted(random.Random(0).sample(range(20), 4))
    assert [ex["question"] for ex in held.examples] == [f"What is {i} + 1?" for i in drawn]
    assert said[-1] == f"{path}: no --eval_dataset_path, so 4 of its 20 rows are held out for evaluation and 16 train"
