"""Evaluate a model (a checkpoint folder or a hub id) on a task, or regrade saved completions.

    python eval.py --model_name_or_path runs/grpo/latest/checkpoint-20   # greedy pass@1, arithmetic
    python eval.py --model_name_or_path runs/grpo/latest/checkpoint-20 --n 8 --temperature 0.6 \\
        --k 1 4 8
    python eval.py --dataset_name gsm8k --dataset_path data/gsm8k_test.jsonl --bf16 \\
        --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct
    python eval.py --dataset_name gsm8k --responses runs/eval/grpo_checkpoint-20-gsm8k-test.jsonl
    python eval.py --dataset_name prealgebra --levels 1-3 --model_name_or_path ...   # MATH-500's
    python eval.py --dataset_name test.jsonl --model_name_or_path ...   # the task its fields say
    python eval.py --eval_datasets gsm8k math500 aime24 --n 4 --temperature 0.6 --k 1 4 \\
        --model_name_or_path ...     # several sets, one model load, one table (runs/eval/<model>/)
    torchrun --nproc_per_node 8 eval.py --model_name_or_path ... --dataset_name math \\
        --num_generations 4 --temperature 0.6

The data options are training's (common/run/args.py's DataArgs), read by the same code
(common/env/math_env.py's `resolve_task`): --dataset_name is a task, a benchmark (aime24, aime25,
amc23, math500, minerva_math, olympiadbench: data/README.md has their hub ids and answer
conventions; offline, --dataset_path a file of the same columns), a MATH subject, a data file or a
hub dataset id, and a problem is prompted as in training. --eval_datasets names several such sets,
as training's option of that name does; each is evaluated at its task's default budget.

Metrics, over the evaluated problems (a problem is solved by a sample whose reward is exactly 1.0):
- accuracy = pass@1: the mean fraction of correct samples per problem (greedy: the fraction of
  problems solved).
- pass@k: the chance that at least one of k samples is correct, with the unbiased estimator of Chen
  et al. 2021
  ("Evaluating Large Language Models Trained on Code", arXiv:2107.03374) from n >= k samples with c
  correct:
      pass@k = 1 - C(n - c, k) / C(n, k)
- maj@k: the majority answer of the first k samples is correct. Only answers in the task's format
  vote (a bare number without "The answer is" or "####" is no answer). Answers are grouped by value:
  numbers compare numerically (18 == 18.0 == 18.00), MATH answers by the normalised LaTeX string of
  common/env/grader.py (so `\\frac{1}{2}` and `0.5` are two different votes), anything else by its
  text without spaces. A sample with no extracted answer never wins; a tie goes to the answer seen
  first.

Writes one JSON line per problem (the n responses with reward, correct, extracted answer, length;
per-problem pass@k and maj@k) to --output and a summary next to it (<output>.summary.json).

--responses FILE regrades saved completions with the task's verifier, without loading any model. It
reads (a) this script's own output, (b) rows with `response` (a string) or `responses` (a list) and
the gold `answer`, or (c) a GSM8K / MATH reference file as it comes (rows without a response): then
the reference solution (`answer` ending in `#### N` for gsm8k, `solution` with \\boxed{} for math)
is graded as the response, which checks the verifier: `python eval.py --dataset_name gsm8k
--responses gsm8k_test.jsonl` gives 1319/1319.
--response_field NAME picks the field to grade explicitly.
"""

import json
import os
import re
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Optional

import torch
from tqdm.auto import tqdm

from common import PathError, UsageError, all_gather_objects, init_distributed, print0, set_seed
from common.env import (MATH_SUBJECTS, TASKS, Reasoning, eval_set_env, eval_set_name,
                        filter_math, grade as task_grade, make_env, make_env_options,
                        named_rows, rename_fields, resolve_task)
from common.models import (capture_decoding, check_model_name, encode_prompts, load_policy,
                           load_tokenizer, max_positions, read_reasoning, read_template_kwargs)
from common.run import (DataArgs, check_new_file, check_output_dir, check_ranges, check_unused,
                        chosen_problems, parse_args, problem_metrics, replace_file,
                        sample_problems)

# what each response's record says of its thinking, where thinking is expected: tokens inside the
# block, whether it never closed, tokens of the answer after it (the run's think/ metrics)
THINK_FIELDS = ("think_tokens", "unclosed", "answer_tokens")
# the name of a run folder of runs/<file>/ (common/run/checkpoints.py's run_folder)
RUN_STAMP = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}_[0-9]{2}-[0-9]{2}-[0-9]{2}(-[0-9]+)?")
# Long enough for the usual answers of each task; arithmetic keeps the training budget of grpo.py so
# that the numbers match the held-out accuracy in a run's eval.jsonl. A benchmark's is its task's
# `budget` (common/env/tasks.py), the one its usual evaluation gives.
DEFAULT_MAX_NEW_TOKENS = {"arithmetic": 64, "countdown": 256, "gsm8k": 512, "math": 1024}


def default_budget(task):
    """The default --max_new_tokens of a task's evaluation."""
    return TASKS[task].budget or DEFAULT_MAX_NEW_TOKENS.get(task, 512)


@dataclass
class Args(DataArgs):
    """eval.py's options: the data options of training (`DataArgs`), then the model, sampling,
    pass@k and where results go."""

    model_name_or_path: str = "SmolLM2-135M-Instruct"
    """a checkpoint folder, a hub id, 'SmolLM2-135M-Instruct' or 'tiny-random' (not with
    --responses)"""
    seed: int = 0
    """seeds sampling (sample j of problem i has its own seed) and train-split generation"""
    max_new_tokens: Optional[int] = None
    """response length limit (default per task: arithmetic 64 as in training, countdown 256, gsm8k
    512, math 1024, the benchmarks 4096)"""
    temperature: float = 0.0
    """sampling temperature; 0 is greedy (then --num_generations must be 1)"""
    top_p: float = 1.0
    """nucleus sampling mass"""
    max_thinking_tokens: Optional[int] = None
    """thinking budget: past this many tokens in a <think> block the sampler closes it (s1's
    budget forcing, as training's option; docs/thinking.md)"""
    bf16: bool = False
    """bfloat16 autocast for forwards"""
    cuda_graphs: bool = True
    """on a GPU, each decode step over a static KV cache replays as one CUDA graph, captured at a
    rollout's first step in milliseconds (--no_cuda_graphs: one kernel launch per op, as
    model.generate does; docs/gpu.md)"""
    split: str = "test"
    """'test' (held-out) or 'train'; not used with a data file"""
    num_eval_problems: Optional[int] = None
    """problems to evaluate (default: all): the fixed random subset training evaluates; with
    --responses, the first N rows"""
    num_generations: int = field(default=1, metadata={"aliases": ["--n"]})
    """n: samples per problem (--n; torchrun takes --n for itself, so write --num_generations
    there)"""
    k: list[int] = field(default_factory=list)
    """k values of pass@k and maj@k, each <= n, e.g. --k 1 4 8 (default: 1 and n)"""
    eval_batch_size: int = field(default=64, metadata={"aliases": ["--batch_size"]})
    """sequences per generate call (problems x n samples), as training's --eval_batch_size"""
    output: Optional[str] = None
    """the per-problem jsonl to write, and <output>.summary.json (default: runs/eval/...)"""
    overwrite: bool = False
    """replace an existing --output (without it, an earlier evaluation's file is never lost)"""
    responses: Optional[str] = None
    """regrade the completions saved in this jsonl/json/parquet file (no model is loaded)"""
    response_field: Optional[str] = None
    """with --responses: the field to grade (default: responses, response, or the reference)"""
    eval_datasets: Optional[list[str]] = None
    """several sets in one call, each a task, benchmark (aime24, aime25, amc23, math500,
    minerva_math, olympiadbench), MATH subject, data file or hub dataset id, read as --dataset_name
    reads one, or TASK=FILE (offline: aime24=aime.jsonl), each at its own default budget: one model
    load, one table. --output is then a folder, with <set>.jsonl and its summary per set and
    table.md (default: runs/eval/<model>/)"""


# The options that another option turns off: (the option; whether this evaluation reads it; the
# option that would), refused by check_unused when given another value than the default. A regrade
# (--responses) loads no model and samples nothing.
READ_ONLY_WITH = [
    *((name, lambda a: a.responses is None, "a model to sample (--responses regrades saved "
       "completions)") for name in ("model_name_or_path", "temperature", "top_p", "num_generations",
                                    "max_new_tokens", "max_thinking_tokens", "eval_batch_size",
                                    "bf16", "cuda_graphs")),
    ("top_p", lambda a: a.temperature > 0, "--temperature above 0 (greedy takes the top token)"),
    ("response_field", lambda a: a.responses is not None, "--responses"),
]


def check_args(args):
    """Every argument error before any data or model loads, each with the fix."""
    if args.split not in ("train", "test"):
        raise UsageError(f"--split must be 'train' or 'test', got {args.split!r}")
    # the ranges training has (sizes >= 1 and within what memory holds, every real number finite)
    check_ranges(args)
    read_template_kwargs(args.chat_template_kwargs, args.template)  # a JSON object, for chat
    check_unused(args, [(name, read(args), needs) for name, read, needs in READ_ONLY_WITH])
    if args.num_generations > 1 and args.temperature == 0:
        raise UsageError(f"--n {args.num_generations} with --temperature 0 gives "
                         f"{args.num_generations} copies of the greedy answer; "
                         f"sample with e.g. --temperature 0.6, or use --n 1.")
    if args.temperature < 0 or not 0 < args.top_p <= 1:
        raise UsageError("--temperature must be >= 0 and --top_p in (0, 1].")
    if args.num_eval_problems is not None and args.num_eval_problems < 1:
        raise UsageError("--num_eval_problems must be >= 1 (leave it out for all problems).")
    if args.responses is not None and args.reward_fn:
        raise UsageError("--reward_fn scores the completions eval.py samples; --responses regrades "
                         "saved ones with the task's verifier alone: leave one of them out.")
    if args.responses is not None and (args.levels or args.dataset_name.lower() in MATH_SUBJECTS):
        raise UsageError("--responses regrades every row of its file, so a MATH subject or "
                         "--levels would filter nothing: pass --dataset_name math and no --levels.")
    if args.responses is None:
        bad = [k for k in args.k if not 1 <= k <= args.num_generations]
        if bad:
            raise UsageError(f"--k {bad}: every k must be between 1 and --n "
                             f"({args.num_generations}); raise --n to estimate pass@{max(bad)}.")
        check_model_name(args.model_name_or_path)
    elif not Path(args.responses).is_file():
        raise PathError(f"--responses {args.responses}: no such file. Pass a jsonl written "
                        "by eval.py, or "
                        f"rows with 'response' and 'answer' fields.")
    if args.eval_datasets is not None:
        check_sets(args)
    if args.eval_datasets:  # --output is then a folder: one that is a file is said first
        check_output_dir(table_path_of(args).parent, "--output")
    if args.output is None and not args.overwrite:  # a second evaluation of a model: beside it
        args.output = str(free_output(Path(default_output(args))))
    # checked now: generations must not be lost at the end. Every file eval.py writes, each
    # absent or (with --overwrite) a file, never a link, a folder or a pipe (check_new_file)
    for output in outputs(args).values():
        for path in (output, summary_path_of(output)):
            check_new_file(path, "--output", args.overwrite)
        check_output_dir(output.parent, "--output")
    if args.eval_datasets:
        check_new_file(table_path_of(args), "--output", args.overwrite)


def check_sets(args):
    """--eval_datasets: sets given there alone, each named once."""
    one_set = [f"--{f.name}" for f in fields(args)
               if f.name in ("dataset_path", "question_key", "answer_key", "system_prompt",
                             "levels", "reward_fn", "responses")
               and getattr(args, f.name) is not None]
    if args.dataset_name != "arithmetic":
        one_set.insert(0, "--dataset_name")
    if one_set:
        raise UsageError(f"{' and '.join(one_set)} describe one set, and --eval_datasets names "
                         "several, each read with its task's own fields and prompt: drop "
                         f"{'it' if len(one_set) == 1 else 'them'}, or evaluate that one set "
                         "without --eval_datasets.")
    names = [eval_set_name(given) for given in args.eval_datasets]
    for given, name in zip(args.eval_datasets, names):
        # a set's name is a file name in the --output folder (NAME.jsonl): nothing that leaves it
        if not name or name in (".", "..") or name.startswith(".") or any(
                c in name for c in "/\\") or not name.isprintable():
            raise UsageError(f"--eval_datasets {given}: the set's name {name!r} is the name of "
                             "its files in the --output folder, so it may not be empty, start "
                             "with a dot or hold a / or \\: name it with letters, digits, - and _ "
                             f"(NAME=FILE, such as {_safe_name(name)}={given.split('=', 1)[-1]}).")
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise UsageError(f"--eval_datasets names the set {twice[0]!r} twice: give each once (a "
                         "file goes by its stem, so rename one of two files of one name).")


def _safe_name(name: str) -> str:
    """A name like `name` that check_sets takes: its letters, digits, - and _."""
    return "".join(c for c in name if c.isalnum() or c in "-_") or "set"


def outputs(args):
    """{set name: the per-problem jsonl eval.py writes for it}: --output (or its default) for one
    set; with --eval_datasets, <set>.jsonl in the --output folder."""
    if not args.eval_datasets:
        return {None: Path(args.output or default_output(args))}
    folder = Path(args.output or default_output(args))
    return {eval_set_name(given): folder / f"{eval_set_name(given)}.jsonl"
            for given in args.eval_datasets}


def table_path_of(args):
    """--eval_datasets: the table of every set, table.md in the --output folder."""
    return Path(args.output or default_output(args)) / "table.md"


def summarize(records, ks):
    """Dataset-level numbers from the per-problem records."""
    samples = [s for r in records for s in r["responses"]]
    P = len(records)
    summary = {
        "num_problems": P,
        "num_samples": len(samples),
        "accuracy": sum(r["num_correct"] / len(r["responses"]) for r in records) / P,
        **{f"pass@{k}": sum(r[f"pass@{k}"] for r in records) / P for k in ks},
        **{f"maj@{k}": sum(r[f"maj@{k}"] for r in records) / P for k in ks},
        "reward/mean": sum(s["reward"] for s in samples) / len(samples),
        "format_ok_frac": sum(bool(s["format_ok"]) for s in samples) / len(samples),
        "no_answer_frac": sum(s["pred"] is None for s in samples) / len(samples),
    }
    for name in samples[0].get("rewards", {}):  # each --reward_fn's mean, None left out
        values = [s["rewards"][name] for s in samples if s["rewards"][name] is not None]
        summary[f"rewards/{name}/mean"] = sum(values) / len(values) if values else None
    if all("length" in s for s in samples):  # regraded files may not know the token counts
        summary["response_len/mean"] = sum(s["length"] for s in samples) / len(samples)
    if all("truncated" in s for s in samples):
        summary["truncated_frac"] = sum(bool(s["truncated"]) for s in samples) / len(samples)
    if all("think_tokens" in s for s in samples):  # a thinking model's (docs/thinking.md)
        for field, key in zip(THINK_FIELDS, ("len_mean", "unclosed_frac", "answer_len_mean")):
            summary[f"think/{key}"] = sum(s[field] for s in samples) / len(samples)
    if all("level" in r for r in records):  # where a mix gains or loses (docs/grpo.md#results)
        for level in sorted({r["level"] for r in records}, key=str):
            rows = [r for r in records if r["level"] == level]
            summary[f"accuracy/level_{level}"] = sum(
                r["num_correct"] / len(r["responses"]) for r in rows) / len(rows)
    return summary


def grade(task, response, gold):
    """The task's verifier on one response: what env.score gives, for rows that are not in an
    env."""
    final = Reasoning().split(response)[1] or ""  # graded after a <think> block (data/README.md)
    reward, pred, format_ok = task_grade(TASKS[task], final, gold)
    return {"response": response, "reward": reward, "correct": reward == 1.0, "pred": pred,
            "format_ok": format_ok}


# ------------------------------------------------------------------------------------------------
# Saved completions (--responses)
# ------------------------------------------------------------------------------------------------
def saved_responses(row, task, response_field, where):
    """(name of the field read, list of {"response": text, ...}) of one saved row."""
    if response_field is not None:
        name = response_field
    else:
        name = next((f for f in ("responses", "response") if f in row), None)
        if name is None and task == "gsm8k" and "####" in str(row.get("answer", "")):
            name = "answer"  # a GSM8K reference row: its solution text is the response
        elif name is None and issubclass(TASKS[task], TASKS["math"]) and "\\boxed" in str(
                row.get("solution", "")):
            name = "solution"  # a MATH reference row
    if name is None or name not in row:
        wanted = repr(name) if name else "'response' or 'responses'"
        raise UsageError(
            f"{where} has no {wanted} field (fields found: {sorted(row)}). Regrading needs the "
            "completions in "
            "'response' (a string) or 'responses' (a list), or --response_field NAME for another "
            "field.")
    value = row[name]
    items = value if isinstance(value, list) else [value]
    out = []
    for item in items:
        if isinstance(item, dict) and isinstance(item.get("response"), str):
            out.append(item)
        elif isinstance(item, str):
            out.append({"response": item})
        else:
            raise UsageError(f"{where}: field {name!r} must hold a string, a list of strings, or a "
                             "list of "
                             f"{{'response': ...}} objects; got {type(item).__name__}")
    if not out:
        raise UsageError(f"{where}: field {name!r} is an empty list")
    return name, out


def gold_answer(task, row, where):
    """The gold answer of a saved row, derived from it exactly as the env derives it from a data
    file (the number after '####' for gsm8k, the `answer` or last \\boxed{} for math); the question
    may be absent. eval.py's output keeps countdown's gold as JSON, which the countdown task
    reads as it reads TinyZero's rows; every field is checked there, as in a data file."""
    return TASKS[task].from_row({"question": "", **row}, where)["answer"]


def regrade(args, task):
    """Records from a file of saved completions, graded again with the task's verifier."""
    rows = named_rows(args.responses, task)[: args.num_eval_problems]
    records, fields_used = [], set()
    for i, (where, row) in enumerate(tqdm(rows, desc="regrade", dynamic_ncols=True)):
        row = rename_fields(row, {"question": args.question_key, "answer": args.answer_key})
        name, saved = saved_responses(row, task, args.response_field, where)
        fields_used.add(name)
        gold = gold_answer(task, row, where)
        samples = []
        for s in saved:
            # only generation knows these
            kept = {k: s[k] for k in ("length", "truncated") if k in s}
            samples.append({**grade(task, s["response"], gold), **kept})
        records.append({"index": row.get("index", i),
                        "question": row.get("question", row.get("problem")),
                        "answer": gold, "responses": samples})
    print0(f"graded field {' / '.join(repr(f) for f in sorted(fields_used))} of {len(rows)} rows "
           f"of {args.responses}"
           + ("  (the reference solutions: this checks the verifier, not a model)"
              if fields_used & {"answer", "solution"} and args.response_field is None else ""))
    return records


# ------------------------------------------------------------------------------------------------
# Generation
# ------------------------------------------------------------------------------------------------
def sample_and_grade(policy, tokenizer, env, indices, args, max_new_tokens, show_bar):
    """n samples for each problem in `indices`, graded by the env. Sample j of problem i is drawn
    with its own seed, so the results do not depend on the batch size or on how many processes share
    the problems."""
    autocast = torch.autocast(next(policy.parameters()).device.type, dtype=torch.bfloat16,
                              enabled=args.bf16)
    per_batch = max(1, args.eval_batch_size // args.num_generations)
    records = []
    bar = tqdm(total=len(indices), desc="eval", dynamic_ncols=True, disable=not show_bar)
    for start in range(0, len(indices), per_batch):
        chunk = indices[start:start + per_batch]
        # rows problem by problem, (seed, problem, sample) seeding each: as training samples them
        gen, texts, graded = sample_problems(policy, tokenizer, env, chunk, args.num_generations,
                                             max_new_tokens, args.temperature, args.seed,
                                             args.top_p, autocast)
        lengths = gen.response_mask.sum(1).tolist()  # [B]
        truncated = gen.truncated.tolist()  # [B]
        # where thinking is expected the env counted each response's thinking as it graded it
        thought = [dict(zip(THINK_FIELDS, row)) for row in env.think_log[-len(texts):]
                   ] if env.tokenizer else []
        env.think_log.clear()
        for p, i in enumerate(chunk):
            samples = []
            for row in range(p * args.num_generations, (p + 1) * args.num_generations):
                reward, info = graded[row]
                samples.append({"response": texts[row], "reward": reward,
                                "correct": bool(info["correct"]),
                                "pred": info["pred"], "format_ok": bool(info["format_ok"]),
                                "length": lengths[row], "truncated": truncated[row],
                                **(thought[row] if thought else {}),
                                **({"rewards": info["rewards"]} if "rewards" in info else {})})
            example = env.examples[i]
            level = example.get("row", {}).get("level")  # arithmetic and MATH rows carry one
            records.append({"index": i, "question": example["question"],
                            "answer": example["answer"],
                            **({"level": level} if level is not None else {}),
                            "responses": samples})
        bar.update(len(chunk))
    bar.close()
    return records


def summary_path_of(output):
    """<output>.summary.json, beside the per-problem jsonl."""
    return output.with_name(output.name.removesuffix(".jsonl") + ".summary.json")


def free_output(path):
    """The default --output, or, where an earlier evaluation took it, its first free name with -2,
    -3... added, so that eval.py run twice as written keeps both evaluations."""
    taken = lambda p: os.path.lexists(p) or os.path.lexists(summary_path_of(p))  # noqa: E731
    free = path
    for n in range(2, 10_000):
        if not taken(free):
            break
        free = path.with_name(path.name.removesuffix(".jsonl") + f"-{n}"
                              + (".jsonl" if path.suffix == ".jsonl" else ""))
    if free != path:
        print0(f"{path} holds an earlier evaluation: writing {free}")
    return free


def default_output(args):
    if args.responses is not None:
        return f"runs/eval/{Path(args.responses).stem}-regraded.jsonl"
    # runs/grpo/checkpoint-20 -> grpo_checkpoint-20; runs/grpo/latest/checkpoint-20 -> its run's
    # date: grpo_2026-12-02_10-30-00_checkpoint-20
    path = Path(args.model_name_or_path)
    parts = (path.resolve() if path.is_dir() else path).parts
    dated = len(parts) > 2 and RUN_STAMP.fullmatch(parts[-2])
    model = "_".join(parts[-3:] if dated else parts[-2:])
    if args.eval_datasets:  # a folder: one jsonl per set, and the table
        sampled = f"-n{args.num_generations}-t{args.temperature:g}" if args.temperature > 0 else ""
        return f"runs/eval/{model}{sampled}"
    data = Path(args.dataset_path).stem if args.dataset_path else args.split
    data = f"{args.dataset_name}-{data}"
    if Path(args.dataset_name).stem != args.dataset_name:  # a data file or hub id: its own name
        data = Path(args.dataset_name).stem
    sampled = f"-n{args.num_generations}-t{args.temperature:g}" if args.temperature > 0 else ""
    return f"runs/eval/{model}-{data}{sampled}.jsonl"


# ------------------------------------------------------------------------------------------------
# Main
# ------------------------------------------------------------------------------------------------
def main(args):
    """-> the summary of the set evaluated ({set name: summary} with --eval_datasets)."""
    check_args(args)
    t0 = time.time()
    if args.responses is not None:  # regrade: no model, no env, one process
        task = resolve_task(args, print0)[0]
        records = regrade(args, task)
        n_min = min(len(r["responses"]) for r in records)
        bad = [k for k in args.k if not 1 <= k <= n_min]
        if bad:
            raise UsageError(f"--k {bad}: a row of {args.responses} has only {n_min} response(s); "
                             f"use k <= {n_min}.")
        ks = sorted(set(args.k or [1, n_min]))
        return report(args, task, records, ks, None, outputs(args)[None], t0, is_main=True)
    dist_info = init_distributed()
    rank, world, is_main = dist_info.rank, dist_info.world_size, dist_info.is_main
    set_seed(args.seed)
    # Every set's problems read before the model loads, so that a bad name or file fails at once
    sets = {name: data_set(args, given) for name, given in
            (zip(outputs(args), args.eval_datasets) if args.eval_datasets else [(None, None)])}
    ks = sorted(set(args.k or [1, args.num_generations]))
    tokenizer = load_tokenizer(args.model_name_or_path, template_kwargs=args.chat_template_kwargs)
    for s in sets.values():  # graded past a reasoning block, where the prompts leave one open
        read_reasoning(tokenizer, s["env"], args.max_thinking_tokens)
    # every evaluated prompt, with the answer's tokens, fits the model's positions (its config's,
    # read before the weights load)
    positions = max_positions(args.model_name_or_path)
    for s in sets.values():
        if positions:
            s["env"].check_prompt_lengths(
                lambda ps: [len(ids) for ids in encode_prompts(tokenizer, ps)], positions,
                s["max_new_tokens"], args.model_name_or_path, s["indices"])
    policy = load_policy(args.model_name_or_path, device=dist_info.device)
    policy.eval()
    if args.cuda_graphs:
        capture_decoding(policy)  # on a GPU; a CPU decodes as before
    mode = ("greedy" if args.temperature == 0
            else f"temperature {args.temperature}, top_p {args.top_p}")
    summaries = {}
    for name, s in sets.items():
        print0(f"eval | {args.model_name_or_path} | {s['what']}: {len(s['indices'])} of "
               f"{len(s['env'])} problems x {args.num_generations} sample(s) ({mode}) | "
               f"max_new_tokens {s['max_new_tokens']} | {world} process(es) on "
               f"{dist_info.device}")
        # Under torchrun each rank takes a strided share of the problems; rank 0 writes them all.
        local = sample_and_grade(policy, tokenizer, s["env"], s["indices"][rank::world], args,
                                 s["max_new_tokens"], is_main)
        records = sorted((r for part in all_gather_objects(local) for r in part),
                         key=lambda r: r["index"])
        summaries[name] = report(args, s["task"], records, ks, s["max_new_tokens"],
                                 outputs(args)[name], t0, is_main, s["given"])
    if args.eval_datasets and is_main:
        table = sets_table(summaries, ks, {name: s["max_new_tokens"] for name, s in sets.items()})
        replace_file(table_path_of(args), table, then="then run eval.py again, with --overwrite")
        print(table + f"wrote {table_path_of(args)}")
    return summaries if args.eval_datasets else summaries[None]


def data_set(args, given):
    """One set to evaluate: --dataset_name as training reads it (a task, a benchmark, a MATH
    subject, a data file or a hub dataset id), or, with --eval_datasets, the entry `given`. ->
    {"task", "env", "indices", "max_new_tokens", "what", "given"}"""
    if given is None:
        task, path, subject = resolve_task(args, print0)
        env = make_env(task, args.split, path=path, seed=args.seed, say=print0,
                       **make_env_options(args, task))
        if subject or args.levels:
            filter_math(env, subject, args.levels, print0)
        what = f"{subject or task} {path or args.split}"
    else:
        env = eval_set_env(args, given, args.split, print0)
        task, what = env.task.name, f"{given} ({env.task.name})"
    # all problems, or the fixed random subset that training's evaluation reads
    indices = chosen_problems(len(env), args.num_eval_problems or len(env))
    budget = args.max_new_tokens or default_budget(task)
    if (args.max_thinking_tokens or 0) >= budget:
        raise UsageError(f"--max_thinking_tokens {args.max_thinking_tokens} must be below the "
                         f"{what} set's --max_new_tokens {budget}, which holds the thinking, its "
                         "close and the answer: raise --max_new_tokens or lower the budget.")
    return {"task": task, "env": env, "indices": indices, "max_new_tokens": budget, "what": what,
            "given": given}


def report(args, task, records, ks, max_new_tokens, output, t0, is_main, given=None):
    """The per-problem metrics and the summary of one set, written to `output` and its
    summary.json and printed (rank 0). -> the summary"""
    for r in records:
        r.update(problem_metrics(task, r["responses"], ks))
    summary = summarize(records, ks)
    if not is_main:
        return summary
    summary_path = summary_path_of(output)
    config = asdict(args)
    config["max_new_tokens"] = max_new_tokens
    if given is not None:
        config["dataset_name"] = given  # the set this file holds
    # each file by the rename of a new one (replace_file): a link or a pipe planted there since
    # the check is replaced, never written through, and a full disk is one line
    again = "then run eval.py again, with --overwrite"
    replace_file(output, "".join(json.dumps(r) + "\n" for r in records), then=again)
    replace_file(summary_path, json.dumps({**summary, "time_s": round(time.time() - t0, 2),
                                           "args": config}, indent=2), then=again)

    P = summary["num_problems"]
    if all(len(r["responses"]) == 1 for r in records):
        solved = sum(r["num_correct"] for r in records)
        print(f"accuracy: {summary['accuracy']:.4f} ({solved}/{P} correct)")
    else:
        print(f"accuracy (pass@1, mean over samples): {summary['accuracy']:.4f} on {P} problems")
    for k in ks:
        if k > 1:
            print(f"pass@{k}: {summary[f'pass@{k}']:.4f}   maj@{k}: {summary[f'maj@{k}']:.4f}")
    extra = [f"mean reward {summary['reward/mean']:.4f}",
             f"answer format ok {summary['format_ok_frac']:.3f}"]
    if "response_len/mean" in summary:
        extra.append(f"mean response length {summary['response_len/mean']:.1f} tokens")
    if "truncated_frac" in summary:
        extra.append(f"truncated {summary['truncated_frac']:.3f}")
    by_level = {k.removeprefix("accuracy/level_"): v for k, v in summary.items()
                if k.startswith("accuracy/level_")}
    if by_level:
        extra.append("accuracy by level " + ", ".join(f"{k}: {v:.3f}" for k, v in by_level.items()))
    print(" | ".join(extra))
    print(f"wrote {output} and {summary_path}")
    return summary


def sets_table(summaries, ks, budgets):
    """--eval_datasets: one markdown table, a row per set: problems, samples each, its budget,
    pass@1 (greedy, or the mean over samples: avg@n), pass@k and maj@k, the answers in format and
    the responses cut at the budget."""
    more = [k for k in ks if k > 1]
    head = (["set", "problems", "samples", "max_new_tokens", "pass@1"]
            + [f"{m}@{k}" for k in more for m in ("pass", "maj")] + ["format ok", "truncated"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, s in summaries.items():
        cells = [name, str(s["num_problems"]), str(s["num_samples"] // s["num_problems"]),
                 str(budgets[name]), f"{s['accuracy']:.4f}"]
        cells += [f"{s[f'{m}@{k}']:.4f}" for k in more for m in ("pass", "maj")]
        cells += [f"{s['format_ok_frac']:.3f}",
                  f"{s['truncated_frac']:.3f}" if "truncated_frac" in s else "n/a"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main(parse_args(Args))
