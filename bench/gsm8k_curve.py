"""A GSM8K curve: grpo.py trained on GSM8K's train split, evaluated on its test split at intervals,
greedy pass@1 and avg@k (k sampled responses per problem), then a reading of what the samples show.

    python bench/gsm8k_curve.py                      # this CPU: 8 updates, 64 test problems, 38 min
    python bench/gsm8k_curve.py --report_only        # the table and the reading again, no training
    python bench/gsm8k_curve.py --updates 100 --eval_interval 25 --test_problems 1319 \\
        --num_prompts 16 -- --bf16                   # a GPU: all 1,319 test problems
    python bench/gsm8k_curve.py --tiny --out /tmp/c  # tiny-random on a few rows: that it runs

The data: --data_dir holds gsm8k_train.jsonl and gsm8k_test.jsonl (openai/grade-school-math's files;
by default ../shared/data beside the project, as data/README.md says), or, without one, the hub's
openai/gsm8k. The run is `python grpo.py --dataset_name gsm8k` with those files, grpo.py's own
defaults (learning rate, KL, group size) except the sizes below, and whatever follows `--`; its logs
are the file's own, in --out.

What it writes to --out: the run's logs (metrics.jsonl, eval.jsonl, samples.jsonl), curve.md (the
table of the evaluations and the reading) and curve.json, and curves_step.png when matplotlib is
installed. The reading compares the first and the last updates' logged samples: how many state an
answer in the asked-for format ("The answer is N"), how many are right, and how many of the
equations they write ("12 * 3 = 36") are right, checked exactly by common/env/answers.py's
safe_arith (a parser, never Python's eval). A model that learns the format more than the arithmetic
shows it there: more answers in format, no more right equations.

Run it alone: it takes both cores, and its time is the figure that says what a run costs.
"""

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from common.env import TASKS  # noqa: E402
from common.env.answers import safe_arith  # noqa: E402
from common.run.plot import read_log  # noqa: E402

SHARED_DATA = ROOT.parent / "shared" / "data"
# "12 * 3 = 36", "$4.50 + 2 = 6.5": two or more numbers joined by + - * / x and an equals sign
EQUATION = re.compile(r"(?<![\w.])(\$?\d[\d,]*(?:\.\d+)?(?:\s*[-+*/x×]\s*\$?\d[\d,]*(?:\.\d+)?)+)"
                      r"\s*=\s*\$?(-?\d[\d,]*(?:\.\d+)?)")


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/bench/gsm8k_curve", help="the run's folder")
    p.add_argument("--data_dir", default=str(SHARED_DATA) if SHARED_DATA.is_dir() else None,
                   help="a folder with gsm8k_train.jsonl and gsm8k_test.jsonl (default: "
                        "../shared/data when it exists, else the hub's openai/gsm8k)")
    p.add_argument("--model_name_or_path", default="SmolLM2-135M-Instruct")
    p.add_argument("--updates", type=int, default=8, help="grpo.py's --max_steps")
    p.add_argument("--eval_interval", type=int, default=4, help="evaluate every this many updates")
    p.add_argument("--test_problems", type=int, default=64,
                   help="test problems per evaluation: a fixed random subset (1319: all)")
    p.add_argument("--eval_samples", type=int, default=4, help="k of avg@k, pass@k, maj@k")
    p.add_argument("--num_prompts", type=int, default=4, help="problems per update")
    p.add_argument("--num_generations", type=int, default=8, help="responses per problem")
    p.add_argument("--max_new_tokens", type=int, default=256,
                   help="training's and the evaluation's budget (GSM8K solutions of this model "
                        "average about 110 tokens)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--report_only", action="store_true", help="read the run in --out again")
    p.add_argument("--tiny", action="store_true",
                   help="tiny-random on data/few_shot_gsm8k.jsonl's rows, 2 updates: that it runs")
    p.add_argument("extra", nargs="*", help="after --: more grpo.py options")
    return p.parse_args()


def command(args, out):
    """grpo.py's command line for this curve."""
    if args.tiny:  # the worked examples of the prompts, as a train and a test file
        rows = ROOT / "data" / "few_shot_gsm8k.jsonl"
        data = ["--dataset_path", str(rows), "--eval_dataset_path", str(rows)]
        sizes = ["--model_name_or_path", "tiny-random", "--max_steps", "2", "--eval_interval", "1",
                 "--num_eval_problems", "3", "--eval_samples", "2", "--num_prompts", "2",
                 "--num_generations", "2", "--max_new_tokens", "8"]
    else:
        data = ([] if args.data_dir is None else
                ["--dataset_path", str(Path(args.data_dir) / "gsm8k_train.jsonl"),
                 "--eval_dataset_path", str(Path(args.data_dir) / "gsm8k_test.jsonl")])
        sizes = ["--model_name_or_path", args.model_name_or_path, "--max_steps",
                 str(args.updates), "--eval_interval", str(args.eval_interval),
                 "--num_eval_problems", str(args.test_problems), "--eval_samples",
                 str(args.eval_samples), "--num_prompts", str(args.num_prompts),
                 "--num_generations", str(args.num_generations), "--max_new_tokens",
                 str(args.max_new_tokens)]
    return [sys.executable, str(ROOT / "grpo.py"), "--dataset_name", "gsm8k", *data, *sizes,
            "--seed", str(args.seed), "--log_interval", "1", "--output_dir", str(out),
            *args.extra]


# ------------------------------------------------------------------------------------------------
# The reading of the samples

def equations(text):
    """(right, written): the equations "a op b ... = c" in a response, and how many hold exactly.
    'x' and '×' are read as multiplication, commas and dollar signs dropped."""
    right = written = 0
    for left, result in EQUATION.findall(text):
        left = left.replace("$", "").replace(",", "").replace("×", "*").replace("x", "*")
        value, stated = safe_arith(left), safe_arith(result.replace(",", ""))
        if value is None or stated is None:
            continue
        written += 1
        right += value == stated
    return right, written


def reading(samples):
    """What a list of logged samples shows: {responses, in_format, correct, equations,
    equations_right} as fractions (equations: per response)."""
    task = TASKS["gsm8k"]
    counts = {"in_format": 0, "correct": 0, "equations": 0, "equations_right": 0}
    for s in samples:
        reward, _, format_ok = task.grade(s["response"], str(s["answer"]))
        right, written = equations(s["response"])
        counts["in_format"] += format_ok
        counts["correct"] += reward == 1.0
        counts["equations"] += written
        counts["equations_right"] += right
    n = max(1, len(samples))
    return {"responses": len(samples), "in_format": counts["in_format"] / n,
            "correct": counts["correct"] / n, "equations_per_response": counts["equations"] / n,
            "equations_right": counts["equations_right"] / max(1, counts["equations"])}


def report(out, args, wall_s=None):
    """curve.md and curve.json from the run's logs. -> the text of curve.md"""
    evals, metrics = read_log(out / "eval.jsonl"), read_log(out / "metrics.jsonl")
    samples = read_log_lines(out / "samples.jsonl")
    if not evals:
        sys.exit(f"{out}/eval.jsonl holds no evaluation: did the run start? (see its output)")
    sets = sorted({key.split("/")[1] for row in evals for key in row
                   if key.startswith("eval/") and key.count("/") == 2})
    lines = [f"# GSM8K curve: {out}", ""]
    for name in sets:
        keys = [k for k in evals[-1] if k.startswith(f"eval/{name}/") and "num_" not in k]
        shown = [k.rsplit("/", 1)[1] for k in keys]
        lines += [f"## {name}: {evals[-1][f'eval/{name}/num_problems']} test problems", "",
                  "| update | " + " | ".join(shown) + " |",
                  "|---|" + "---|" * len(shown)]
        for row in evals:
            lines.append(f"| {row['step']} | " + " | ".join(
                f"{row[k]:.3f}" if row.get(k) is not None else "n/a" for k in keys) + " |")
        lines.append("")
    if metrics:
        lines += ["## Training", "",
                  "| update | reward/mean | response_len/mean | rollout s | update s |",
                  "|---|---|---|---|---|"]
        for row in metrics:
            lines.append(f"| {row['step']} | {row.get('reward/mean', float('nan')):.3f} | "
                         f"{row.get('response_len/mean', float('nan')):.1f} | "
                         f"{row.get('time/rollout_s', float('nan')):.0f} | "
                         f"{row.get('time/update_s', float('nan')):.0f} |")
        lines.append("")
    steps = sorted({s["step"] for s in samples})
    half = len(steps) // 2
    parts = {"first updates": [s for s in samples if s["step"] in steps[:max(1, half)]],
             "last updates": [s for s in samples if s["step"] in steps[max(1, half):]]}
    read = {name: reading(rows) for name, rows in parts.items() if rows}
    if read:
        lines += ["## What the logged samples show", "",
                  "| samples | responses | in format | correct | equations per response | "
                  "equations right |", "|---|---|---|---|---|---|"]
        for name, r in read.items():
            lines.append(f"| {name} | {r['responses']} | {r['in_format']:.2f} | "
                         f"{r['correct']:.2f} | {r['equations_per_response']:.2f} | "
                         f"{r['equations_right']:.2f} |")
        lines.append("")
    if wall_s is not None:
        lines.append(f"Wall time: {wall_s / 60:.1f} min, seed {args.seed}.")
    text = "\n".join(lines) + "\n"
    (out / "curve.md").write_text(text)
    (out / "curve.json").write_text(json.dumps({"evaluations": evals, "reading": read,
                                                "wall_s": wall_s, "seed": args.seed}, indent=1))
    return text


def read_log_lines(path):
    """Every line of a jsonl log (samples.jsonl has many lines per step), each an object with an
    integer step. A last line cut short by a crash is skipped; any other damaged line stops the
    report in one line that names it."""
    if not path.is_file():
        return []
    lines = [line for line in path.read_bytes().decode("utf-8", "replace").splitlines()
             if line.strip()]
    rows = []
    for n, line in enumerate(lines, 1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if n == len(lines):
                break
            sys.exit(f"error: {path}, line {n}: not JSON (cut short?): remove the line, or the "
                     "run's folder to run it again")
        if not isinstance(row, dict) or type(row.get("step")) is not int:
            sys.exit(f"error: {path}, line {n}: not an object with an integer step: remove the "
                     "line, or the run's folder to run it again")
        rows.append(row)
    return rows


def main():
    args = parse()
    # grpo.py runs from the project's root: paths the user gave are theirs, from where they stand
    out = Path(args.out).expanduser().resolve()
    if args.data_dir:
        args.data_dir = str(Path(args.data_dir).expanduser().resolve())
    wall = None
    if not args.report_only:
        for name in ("gsm8k_train.jsonl", "gsm8k_test.jsonl"):
            if not args.tiny and args.data_dir and not (Path(args.data_dir) / name).is_file():
                sys.exit(f"error: --data_dir {args.data_dir} has no {name}: point it at a folder "
                         "with GSM8K's two files, or leave it out for the hub's openai/gsm8k.")
        cmd = command(args, out)
        print(" ".join(cmd), flush=True)
        start = time.time()
        done = subprocess.run(cmd, cwd=ROOT)
        wall = time.time() - start
        if done.returncode:
            sys.exit(f"grpo.py stopped with exit status {done.returncode}: see its output above")
    print(report(out, args, wall))
    try:
        subprocess.run([sys.executable, "-m", "common.run.plot", str(out)], cwd=ROOT, check=False)
    except OSError:
        pass


if __name__ == "__main__":
    main()
