"""A cold start on GSM8K: sft.py on GSM8K's worked train solutions, then grpo.py from its checkpoint,
evaluated on the same test problems at the start, after SFT and after RL (greedy pass@1, and avg@k,
pass@k and maj@k of k sampled responses), then a reading of what the samples show.

    python bench/cold_start.py                       # this CPU: 32 + 8 updates, 64 test problems
    python bench/cold_start.py --report_only         # the table and the reading again
    python bench/cold_start.py --sft_updates 100 --rl_updates 40 --test_problems 1319 \\
        --num_prompts 16 --sft_batch 64 -- --bf16    # a GPU: all 1,319 test problems
    python bench/cold_start.py --tiny --out /tmp/c   # tiny-random on a few rows: that it runs

It answers what bench/gsm8k_curve.py found: with the embedded model GSM8K's reward is too rare for
GRPO to learn from (5 right samples of 256). A short supervised pass on worked solutions first is
the standard fix (DeepSeek-R1's cold start, TRL's SFTTrainer before GRPOTrainer); this measures
what it does here. The RL stage is the curve's run (grpo.py's defaults, the curve's sizes) from the
SFT checkpoint instead of the base model, and the start is the curve's update 0.

The data: --data_dir holds gsm8k_train.jsonl and gsm8k_test.jsonl (by default ../shared/data beside
the project), as for bench/gsm8k_curve.py. sft.py refuses a solution longer than the response
budget, so the SFT stage trains on the train rows whose worked solution fits --max_new_tokens
(written to OUT/train_fit.jsonl; with SmolLM2's tokenizer 7,442 of 7,473 at 256 tokens); RL and
every evaluation use the budget as it is.

What it writes to --out: sft/ and grpo/, each run's logs and checkpoints, cold_start.md (the table
and the reading) and cold_start.json. Run it alone: it takes both cores.
"""

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from common.run.plot import read_log  # noqa: E402
from gsm8k_curve import read_log_lines, reading  # noqa: E402

SHARED_DATA = ROOT.parent / "shared" / "data"


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/bench/cold_start", help="the runs' folder")
    p.add_argument("--data_dir", default=str(SHARED_DATA) if SHARED_DATA.is_dir() else None,
                   help="a folder with gsm8k_train.jsonl and gsm8k_test.jsonl (default: "
                        "../shared/data when it exists)")
    p.add_argument("--model_name_or_path", default="SmolLM2-135M-Instruct")
    p.add_argument("--sft_updates", type=int, default=32, help="sft.py's --max_steps")
    p.add_argument("--sft_batch", type=int, default=8, help="sft.py's --num_prompts: solutions "
                                                           "an update")
    p.add_argument("--sft_learning_rate", type=float, default=2e-5,
                   help="sft.py's --learning_rate (its default, TRL's)")
    p.add_argument("--rl_updates", type=int, default=8, help="grpo.py's --max_steps")
    p.add_argument("--test_problems", type=int, default=64,
                   help="test problems per evaluation: a fixed random subset (1319: all)")
    p.add_argument("--eval_samples", type=int, default=4, help="k of avg@k, pass@k, maj@k")
    p.add_argument("--num_prompts", type=int, default=4, help="grpo.py's problems per update")
    p.add_argument("--num_generations", type=int, default=8, help="responses per problem")
    p.add_argument("--max_new_tokens", type=int, default=256,
                   help="the response budget of both stages and of every evaluation")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--report_only", action="store_true", help="read the runs in --out again")
    p.add_argument("--tiny", action="store_true",
                   help="tiny-random on data/few_shot_gsm8k.jsonl's rows: that it runs")
    p.add_argument("extra", nargs="*", help="after --: more options for both files")
    return p.parse_args()


def fitting_rows(args, out):
    """The train file's rows whose worked solution fits the budget, written to out: sft.py's fix
    for a budget shorter than the longest solution. -> (the file, rows kept, rows read)"""
    from common.env import make_env
    from common.models import load_tokenizer

    source = train_file(args)
    env = make_env("gsm8k", "train", path=source)
    tokenizer = load_tokenizer(args.model_name_or_path)
    texts = env.solutions(say=lambda _: None)
    # sft.py's count: the solution's tokens and its end token
    lengths = [len(ids) + 1 for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
    rows = [json.loads(line) for line in Path(source).read_text().splitlines() if line.strip()]
    kept = [row for row, n in zip(rows, lengths) if n <= args.max_new_tokens]
    fit = out / "train_fit.jsonl"
    fit.write_text("".join(json.dumps(row) + "\n" for row in kept))
    return fit, len(kept), len(rows)


def train_file(args):
    if args.tiny:  # the worked examples of the prompts, as a train and a test file
        return ROOT / "data" / "few_shot_gsm8k.jsonl"
    return Path(args.data_dir) / "gsm8k_train.jsonl"


def test_file(args):
    return train_file(args) if args.tiny else Path(args.data_dir) / "gsm8k_test.jsonl"


def commands(args, out, fit):
    """(sft.py's command line, grpo.py's): the same test problems, budget and seed."""
    model = "tiny-random" if args.tiny else args.model_name_or_path
    sft_steps, rl_steps = (2, 1) if args.tiny else (args.sft_updates, args.rl_updates)
    shared = ["--dataset_name", "gsm8k", "--eval_dataset_path", str(test_file(args)),
              "--num_eval_problems", "3" if args.tiny else str(args.test_problems),
              "--eval_samples", "2" if args.tiny else str(args.eval_samples),
              "--seed", str(args.seed), "--log_interval", "1", *args.extra]
    budget = str(args.max_new_tokens)
    sft = [sys.executable, str(ROOT / "sft.py"), "--model_name_or_path", model,
           "--dataset_path", str(fit), "--max_steps", str(sft_steps),
           "--num_prompts", "2" if args.tiny else str(args.sft_batch),
           "--learning_rate", str(args.sft_learning_rate), "--output_dir", str(out / "sft"),
           # tiny-random's tokens of a worked solution: up to 400 (it spells them out)
           "--max_new_tokens", "400" if args.tiny else budget, *shared]
    grpo = [sys.executable, str(ROOT / "grpo.py"),
            "--model_name_or_path", str(out / "sft" / f"checkpoint-{sft_steps}"),
            "--dataset_path", str(train_file(args)), "--max_steps", str(rl_steps),
            "--no_eval_on_start",  # the SFT run's last evaluation is this run's start
            "--num_prompts", "2" if args.tiny else str(args.num_prompts),
            "--num_generations", "2" if args.tiny else str(args.num_generations),
            "--max_new_tokens", "8" if args.tiny else budget, "--output_dir", str(out / "grpo"),
            *shared]
    return sft, grpo


def report(out, args, wall=None):
    """cold_start.md and cold_start.json from the two runs' logs. -> the text of cold_start.md"""
    sft_evals, rl_evals = read_log(out / "sft" / "eval.jsonl"), read_log(out / "grpo" / "eval.jsonl")
    if len(sft_evals) < 2 or not rl_evals:
        sys.exit(f"{out}: the runs hold {len(sft_evals)} SFT and {len(rl_evals)} RL evaluations "
                 "(2 and 1 expected): did they finish? (see their output)")
    stages = [("start (the base model)", sft_evals[0]),
              (f"after SFT ({sft_evals[-1]['step']} updates)", sft_evals[-1]),
              (f"after RL ({rl_evals[-1]['step']} more updates)", rl_evals[-1])]
    name = next(k.split("/")[1] for k in sft_evals[0] if k.count("/") == 2)
    keys = [k for k in sft_evals[0] if k.startswith(f"eval/{name}/") and "num_" not in k]
    lines = [f"# A cold start on GSM8K: {out}", "",
             f"{sft_evals[0][f'eval/{name}/num_problems']} test problems, the same at each stage.",
             "", "| stage | " + " | ".join(k.rsplit("/", 1)[1] for k in keys) + " |",
             "|---|" + "---|" * len(keys)]
    lines += [f"| {stage} | " + " | ".join(f"{row[k]:.3f}" if row.get(k) is not None else "n/a"
                                           for k in keys) + " |" for stage, row in stages]
    sft_metrics = read_log(out / "sft" / "metrics.jsonl")
    rl_metrics = read_log(out / "grpo" / "metrics.jsonl")
    if sft_metrics:
        losses = [row["loss"] for row in sft_metrics]
        quarter = max(1, len(losses) // 4)
        lines += ["", f"SFT loss (nats per solution token): first {quarter} updates "
                      f"{sum(losses[:quarter]) / quarter:.3f}, last {quarter} "
                      f"{sum(losses[-quarter:]) / quarter:.3f}."]
    if rl_metrics:
        lines += ["", "| RL update | reward/mean | zero_std_frac | response_len/mean | rollout s | "
                      "update s |", "|---|---|---|---|---|---|"]
        lines += [f"| {row['step']} | {row.get('reward/mean', float('nan')):.3f} | "
                  f"{row.get('zero_std_frac', float('nan')):.2f} | "
                  f"{row.get('response_len/mean', float('nan')):.1f} | "
                  f"{row.get('time/rollout_s', float('nan')):.0f} | "
                  f"{row.get('time/update_s', float('nan')):.0f} |" for row in rl_metrics]
    samples = read_log_lines(out / "grpo" / "samples.jsonl")
    steps = sorted({s["step"] for s in samples})
    half = max(1, len(steps) // 2)
    parts = {"first RL updates (the SFT model's samples)":
             [s for s in samples if s["step"] in steps[:half]],
             "last RL updates": [s for s in samples if s["step"] in steps[half:]]}
    read = {part: reading(rows) for part, rows in parts.items() if rows}
    if read:
        lines += ["", "| samples | responses | in format | correct | equations per response | "
                      "equations right |", "|---|---|---|---|---|---|"]
        lines += [f"| {part} | {r['responses']} | {r['in_format']:.2f} | {r['correct']:.2f} | "
                  f"{r['equations_per_response']:.2f} | {r['equations_right']:.2f} |"
                  for part, r in read.items()]
    if wall:
        lines += ["", "Wall time: " + ", ".join(f"{k} {v / 60:.1f} min" for k, v in wall.items())
                  + f"; seed {args.seed}."]
    text = "\n".join(lines) + "\n"
    (out / "cold_start.md").write_text(text)
    (out / "cold_start.json").write_text(json.dumps(
        {"stages": {stage: row for stage, row in stages}, "reading": read, "wall_s": wall,
         "seed": args.seed}, indent=1))
    return text


def main():
    args = parse()
    out = Path(args.out)
    wall = None
    if not args.report_only:
        for name in ("gsm8k_train.jsonl", "gsm8k_test.jsonl"):
            if not args.tiny and (args.data_dir is None or not (Path(args.data_dir) / name).is_file()):
                sys.exit(f"error: --data_dir {args.data_dir} has no {name}: point it at a folder "
                         "with GSM8K's two files (data/README.md says where they come from).")
        out.mkdir(parents=True, exist_ok=True)
        print(f"reading the worked solutions of {train_file(args)}", flush=True)
        fit, kept, read_rows = fitting_rows(args, out)
        print(f"{kept:,} of {read_rows:,} train solutions fit {args.max_new_tokens} tokens: "
              f"{fit}", flush=True)
        wall = {}
        for stage, cmd in zip(("SFT", "RL"), commands(args, out, fit)):
            print(" ".join(cmd), flush=True)
            start = time.time()
            done = subprocess.run(cmd, cwd=ROOT)
            wall[stage] = time.time() - start
            if done.returncode:
                sys.exit(f"{Path(cmd[1]).name} stopped with exit status {done.returncode}: see "
                         "its output above")
    print(report(out, args, wall))


if __name__ == "__main__":
    main()
