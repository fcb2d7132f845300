"""Does the tool help? tools.py on the task it was made for (arithmetic level 6: word problems with
3-digit numbers), with the calculator and without it (`--tools none`, the same worked example done
by hand), a few seeds each, one run at a time.

    python bench/tool_gain.py                          # 3 seeds x 2, 10 updates: about 1 h, 2 cores
    python bench/tool_gain.py --out /tmp/g --seeds 0 -- --model_name_or_path tiny-random --max_steps 1

Each run is `python tools.py --difficulty 6 --max_steps M --seed S --tools T --output_dir
OUT/T-seedS` plus whatever follows `--`; it is evaluated before and after training on the 100
held-out level-6 problems (greedy, with its tools). A finished run (run.json, exit status 0) is not
run again. OUT/table.md gets the mean and standard error over seeds of the held-out accuracy before
and after, the tool calls per response and the wall time; `python -m common.run.plot` draws the runs
into OUT/curves_step.png. Run it alone: wall times under a shared CPU are not figures.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.learning import accuracies, mean_se  # noqa: E402
from common.run.plot import read_log  # noqa: E402

SETTINGS = {"calc": "with the calculator", "none": "without a tool"}


def command(tools, seed, run_dir, max_steps, extra):
    """The command line of one tools.py run."""
    return [sys.executable, "tools.py", "--difficulty", "6", "--max_steps", str(max_steps),
            "--seed", str(seed), "--tools", tools, "--output_dir", str(run_dir), *extra]


def run_one(tools, seed, out, max_steps, extra):
    """One tools.py run as a child process -> its run.json record."""
    run_dir = out / f"{tools}-seed{seed}"
    record_path = run_dir / "run.json"
    if record_path.is_file() and json.loads(record_path.read_text())["returncode"] == 0:
        return json.loads(record_path.read_text())
    run_dir.mkdir(parents=True, exist_ok=True)
    command_line = command(tools, seed, run_dir, max_steps, extra)
    print(f"{tools} / seed {seed}: {' '.join(command_line[1:])}", flush=True)
    start = time.time()
    with open(run_dir / "log.txt", "w") as log:
        child = subprocess.Popen(command_line, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        _, status, _ = os.wait4(child.pid, 0)
    record = {"tools": tools, "seed": seed, "command": command_line[1:],
              "returncode": os.waitstatus_to_exitcode(status),
              "wall_s": round(time.time() - start, 1)}
    record_path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"  exit {record['returncode']}, {record['wall_s']:.0f} s", flush=True)
    return record


def table(records, out):
    """One row per setting: accuracy before and after (mean ± s.e. over seeds), each seed's
    accuracy after, the last update's tool calls per response, the mean wall time."""
    lines = ["| tools.py on level 6 | held-out accuracy before | after | each seed after | "
             "tool calls per response, last update | wall time |", "|---|---|---|---|---|---|"]
    for tools, name in SETTINGS.items():
        runs = [r for r in records if r["tools"] == tools and r["returncode"] == 0]
        if not runs:
            continue
        accs = [accuracies(out / f"{tools}-seed{r['seed']}") for r in runs]
        first, last = min(accs[0]), max(accs[0])
        before, after = mean_se([a[first] for a in accs]), mean_se([a[last] for a in accs])
        calls = [read_log(out / f"{tools}-seed{r['seed']}" / "metrics.jsonl")[-1]
                 ["tools/call_frequency"] for r in runs]
        wall = sum(r["wall_s"] for r in runs) / len(runs)
        lines.append(f"| {name}, {len(runs)} seeds | {before[0]:.3f} ± {before[1]:.3f} | "
                     f"{after[0]:.3f} ± {after[1]:.3f} (update {last}) | "
                     f"{' / '.join(f'{a[last]:.2f}' for a in accs)} | "
                     f"{sum(calls) / len(calls):.2f} | {int(wall // 60)} min {int(wall % 60)} s |")
    (out / "table.md").write_text("\n".join(lines) + "\n")
    return lines


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--max_steps", type=int, default=10, help="updates of each run")
    p.add_argument("--out", default="runs/tool_gain", help="folder for the runs and the table")
    p.add_argument("extra", nargs="*", help="after --: flags passed to every run")
    args = p.parse_args(argv)
    if args.max_steps < 1:
        p.error("--max_steps must be at least 1")
    return args


def main():
    args = parse()
    out = Path(args.out).resolve()
    records = [run_one(tools, seed, out, args.max_steps, args.extra)
               for seed in args.seeds for tools in SETTINGS]
    print("\n".join(table(records, out)))
    dirs = [str(out / f"{r['tools']}-seed{r['seed']}") for r in records if r["returncode"] == 0]
    subprocess.run([sys.executable, "-m", "common.run.plot", *dirs, "--out", str(out), "--labels",
                    *(Path(d).name for d in dirs)], cwd=ROOT, check=False)
    return 0 if all(r["returncode"] == 0 for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
