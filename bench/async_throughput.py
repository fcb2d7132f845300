"""Does sampling beside training pay on this machine? Seconds per update of the synchronous run
(grpo.py: sample, then train, each with every core) against async_grpo.py with the sampler one
update behind, in one process (the same work in the same order: no gain expected) and in two
(torchrun: rank 1 samples while rank 0 trains, each with half the cores).

    python bench/async_throughput.py                 # the default model and task, 8 updates each
    python bench/async_throughput.py --max_steps 4 -- --model_name_or_path tiny-random

Each run is the file's defaults (SmolLM2-135M-Instruct, 4 prompts x 8 samples x 64 tokens, fp32)
with --max_steps M, no evaluation, and whatever follows `--`. The figure is the mean time of an
update after the first (metrics.jsonl's clock: the first update holds the start-up and, with two
processes, the sampler filling its first batches), and its ratio to the synchronous run's. Run it
alone: a second job on the cores would make the figures meaningless.
"""

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SETTINGS = {  # name: (command prefix, the file's own options)
    "grpo.py (synchronous)": ([sys.executable, "grpo.py"], []),
    "async_grpo.py, one process, k = 1": ([sys.executable, "async_grpo.py"],
                                          ["--max_staleness", "1"]),
    "async_grpo.py, two processes, k = 1": ([sys.executable, "-m", "torch.distributed.run",
                                             "--nproc_per_node", "2", "--master_port", "PORT",
                                             "async_grpo.py"], ["--max_staleness", "1"]),
}


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return str(sock.getsockname()[1])


def command(name, run_dir, max_steps, extra):
    """The command line of one setting's run."""
    prefix, options = SETTINGS[name]
    return [a.replace("PORT", free_port()) for a in prefix] + [
        *options, "--max_steps", str(max_steps), "--num_eval_problems", "0",
        "--output_dir", str(run_dir), *extra]


def run_one(name, out, max_steps, extra):
    run_dir = out / f"run{list(SETTINGS).index(name)}"
    shutil.rmtree(run_dir, ignore_errors=True)  # an earlier run's
    command_line = command(name, run_dir, max_steps, extra)
    print(f"{name}: {' '.join(command_line[1:])}", flush=True)
    start = time.time()
    with open(f"{run_dir}.log", "w") as log:
        done = subprocess.run(command_line, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                              env={k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"})
    if done.returncode != 0:
        raise SystemExit(f"{name} failed: see {run_dir}.log")
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    clock = [r["time"] for r in rows]
    per_update = (clock[-1] - clock[0]) / (len(clock) - 1)
    wait = sum(r.get("time/wait_s", r["time/rollout_s"]) for r in rows[1:]) / (len(rows) - 1)
    return {"name": name, "s_per_update": per_update, "wait_s": wait,
            "rollout_s": sum(r["time/rollout_s"] for r in rows[1:]) / (len(rows) - 1),
            "update_s": sum(r["time/update_s"] for r in rows[1:]) / (len(rows) - 1),
            "reward": [round(r["reward/mean"], 3) for r in rows], "wall_s": time.time() - start}


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "runs/async_throughput")
    parser.add_argument("--max_steps", type=int, default=8)
    parser.add_argument("extra", nargs="*", help="after --: options every run gets")
    args = parser.parse_args(argv)
    if args.max_steps < 2:  # the figure is the mean of the updates after the first
        parser.error("--max_steps must be at least 2: the first update is left out")
    return args


def main():
    args = parse()
    args.out.mkdir(parents=True, exist_ok=True)
    results = [run_one(name, args.out, args.max_steps, args.extra) for name in SETTINGS]
    base = results[0]["s_per_update"]
    lines = ["| run | s per update (after the first) | against grpo.py | trainer's wait for its "
             "batch, s | sampling, s | update, s |", "|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['name']} | {r['s_per_update']:.1f} | {r['s_per_update'] / base:.2f}x "
                     f"| {r['wait_s']:.1f} | {r['rollout_s']:.1f} | {r['update_s']:.1f} |")
    text = "\n".join(lines) + "\n"
    (args.out / "table.md").write_text(text)
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    print(text)


if __name__ == "__main__":
    main()
