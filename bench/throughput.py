"""Rollout and update throughput of each algorithm file, on the same machine in the same invocation.

Each file runs unmodified with its own defaults (so each does the work its docs describe), for
`--steps` updates, with evaluation off; the first update is a warm-up and is left out. From each
update's metrics.jsonl line:

    rollout tokens/s = response tokens sampled / time/rollout_s     (the `tokens_per_s` metric)
    update tokens/s  = response tokens trained on / time/update_s

plus the response length, so a file that samples longer answers is not mistaken for a slower one.
Response tokens are the ones every file samples and trains on; prompt tokens are extra work that
differs per file (stepwise files re-read the episode so far). Numbers are medians over the measured
updates.

    python bench/throughput.py                  # every file, embedded model, ~17 min on 2 cores
    python bench/throughput.py --algos grpo ppo --steps 4
    python bench/throughput.py --model_name_or_path tiny-random --steps 2     # a quick check of the script
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from dev.algorithms import ALGORITHMS  # noqa: E402


def command(algo, args, out):
    """The command line of one file's run: its own defaults, evaluation off."""
    return [sys.executable, str(ROOT / f"{algo}.py"), "--model_name_or_path",
            args.model_name_or_path, "--max_steps", str(args.steps), "--num_eval_problems", "0",
            "--output_dir", out, "--seed", str(args.seed), *(["--bf16"] if args.bf16 else [])]


def measure(algo, args, out):
    cmd = command(algo, args, out)
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "TQDM_DISABLE": "1"})
    if proc.returncode != 0:
        sys.exit(f"{algo}.py failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in Path(out, "metrics.jsonl").read_text().splitlines()]
    rows = rows[1:] or rows  # the first update pays for warm-up (allocator, thread pools)
    sampled = [r["tokens_per_s"] * r["time/rollout_s"] for r in rows]
    return {
        "rollout_tokens_per_s": statistics.median(r["tokens_per_s"] for r in rows),
        "update_tokens_per_s": statistics.median(n / r["time/update_s"] for n,
                                                 r in zip(sampled, rows)),
        "response_tokens_per_update": statistics.median(sampled),
        "response_len": statistics.median(r["response_len/mean"] for r in rows),
        "rollout_s": statistics.median(r["time/rollout_s"] for r in rows),
        "update_s": statistics.median(r["time/update_s"] for r in rows),
        "wall_s": time.time() - t0,
    }


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--algos", nargs="+", default=list(ALGORITHMS), choices=ALGORITHMS)
    p.add_argument("--steps", type=int, default=3, help="updates per file (the first is a warm-up)")
    p.add_argument("--model_name_or_path", default="SmolLM2-135M-Instruct")
    p.add_argument("--bf16", action="store_true", help="pass --bf16 to every file (GPU)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None,
                   help="folder for the runs and throughput.json (default: a temp dir)")
    args = p.parse_args(argv)
    if args.steps < 1:
        p.error("--steps must be >= 1")
    return args


def main():
    args = parse()
    out = args.out or tempfile.mkdtemp(prefix="bench-throughput-")
    results = {}
    print(f"{'file':10s} {'rollout tok/s':>14s} {'update tok/s':>13s} {'resp tokens':>12s} "
          f"{'resp len':>9s}"
          f" {'rollout s':>10s} {'update s':>9s}", flush=True)
    for algo in args.algos:
        r = results[algo] = measure(algo, args, f"{out}/{algo}")
        print(f"{algo + '.py':10s} {r['rollout_tokens_per_s']:14.1f} "
              f"{r['update_tokens_per_s']:13.1f}"
              f" {r['response_tokens_per_update']:12.0f} {r['response_len']:9.1f} "
              f"{r['rollout_s']:10.1f}"
              f" {r['update_s']:9.1f}", flush=True)
    Path(out,
         "throughput.json").write_text(json.dumps({"args": vars(args), "results": results},
                                                  indent=2))
    print(f"wrote {out}/throughput.json")


if __name__ == "__main__":
    main()
