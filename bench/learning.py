"""Does every file learn? Runs each algorithm file's default settings on two arithmetic tasks, one
run at a time, and writes the results table and the curves.

    python bench/learning.py      # both tasks, every file, grpo.py with 3 seeds: about 2 h, 2 cores
    # dev/notes/results/ came from these two (1 h 43 min): grpo.py's 3 seeds on the harder task only
    python bench/learning.py --tasks harder
    python bench/learning.py --tasks default --grpo_seeds 0
    python bench/learning.py --out /tmp/l -- --model_name_or_path tiny-random --max_steps 1

The tasks: "default" is each file's own default (arithmetic levels 1-2), "harder" adds level 3
(`--difficulty 1-3`: a 2-digit number times a digit, sums of three terms). Each run is
`python X.py --eval_interval 5 --seed S --output_dir OUT/TASK/X-seedS`, plus the task's flags and
whatever follows `--`, so its logs are the file's own (metrics.jsonl, eval.jsonl, samples.jsonl).
grpo.py runs once per --grpo_seeds seed and its table row is the mean and standard error over them;
the other files run with the first seed. distill.py's teacher is the last checkpoint of grpo.py's
run of the first seed on the same task (so grpo.py runs first, in the same --out).

Wall time and peak RSS are the child process's own (`os.wait4`, as `/usr/bin/time -v` reads them):
model loading and the evaluations are included. A run that finished (run.json with exit status 0)
is not run again, so an interrupted bench resumes where it stopped. After each run OUT/TASK.md (the
table) and OUT/results.json are rewritten; at the end `python -m common.run.plot` draws each task's runs
into OUT/TASK/curves_step.png and curves_time.png.

Run it alone: two runs at once share the cores, and their wall times are then not figures.
"""

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from dev.algorithms import ALGORITHMS  # noqa: E402
from common.run.plot import read_log  # noqa: E402  (reads a run's jsonl logs, resumed runs included)

# a table row each, in this order; tools.py's results are on the task its tool is for, level 6
# (bench/tool_gain.py, docs/tools.md), async_grpo.py's in its lab (bench/staleness_lab.py,
# docs/async_grpo.md), and reinforce_stepwise.py's with its calculator
# (bench/stepwise_calculator.py, docs/reinforce_stepwise.md): their rows here have not been run
FILES = [a for a in ALGORITHMS if a not in ("tools", "async_grpo", "reinforce_stepwise")]
TASKS = {"default": [], "harder": ["--difficulty", "1-3"]}


def run_dir_of(out, record):
    """The output folder of one run (a record: its task, file and seed)."""
    return out / record["task"] / f"{record['file']}-seed{record['seed']}"


def teacher_of(out, task, seed):
    """distill.py's teacher: the last checkpoint of grpo.py's run with `seed` on `task`."""
    grpo_dir = run_dir_of(out, {"task": task, "file": "grpo", "seed": seed})
    found = sorted(grpo_dir.glob("checkpoint-*/config.json"),
                   key=lambda p: int(p.parent.name.split("-")[1]))
    if not found:
        sys.exit(f"distill.py learns from grpo.py's run of seed {seed} on {task}, and "
                 f"{grpo_dir} holds no checkpoint: run with --files grpo distill")
    return str(found[-1].parent)


def run_one(file, task, seed, out, extra, teacher_seed=0):
    """One training run as a child process -> its run.json record (written next to its logs)."""
    run_dir = run_dir_of(out, {"task": task, "file": file, "seed": seed})
    record_path = run_dir / "run.json"
    if record_path.is_file():
        record = json.loads(record_path.read_text())
        if record["returncode"] == 0:
            return record
    run_dir.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, f"{file}.py", "--eval_interval", "5", "--seed", str(seed),
               "--output_dir", str(run_dir), *TASKS[task], *extra]
    if file == "distill":
        command += ["--teacher_model_name_or_path", teacher_of(out, task, teacher_seed)]
    print(f"{task} / {file} / seed {seed}: {' '.join(command[1:])}", flush=True)
    start = time.time()
    with open(run_dir / "log.txt", "w") as log:
        child = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(child.pid, 0)
    record = {"file": file, "task": task, "seed": seed, "command": command[1:],
              "returncode": os.waitstatus_to_exitcode(status),
              "wall_s": round(time.time() - start, 1),
              "peak_rss_gib": round(usage.ru_maxrss / 2**20, 2)}  # ru_maxrss is in KiB on Linux
    record_path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"  exit {record['returncode']}, {record['wall_s']:.0f} s, "
          f"{record['peak_rss_gib']} GiB", flush=True)
    return record


def accuracies(run_dir):
    """{update: held-out accuracy} from a run's eval.jsonl."""
    return {row["step"]: row["eval/accuracy"] for row in read_log(Path(run_dir) / "eval.jsonl")
            if "eval/accuracy" in row}


def mean_se(values):
    """Mean and standard error of the mean (0 for a single value)."""
    if len(values) < 2:
        return statistics.fmean(values), 0.0
    return statistics.fmean(values), statistics.stdev(values) / math.sqrt(len(values))


def work_per_update(run_dir):
    """The batch one update samples, from the run's args.json."""
    args = json.loads((Path(run_dir) / "args.json").read_text())
    if "num_envs" in args:  # appo, tppo: episodes of one line per step
        return (f"{args['num_envs']} episodes × {args['num_steps']} steps, "
                f"≤ {args['max_new_tokens']} tokens a step")
    if "num_generations" not in args:  # sft.py: worked solutions, nothing sampled
        return f"{args['num_prompts']} worked solutions, ≤ {args['max_new_tokens']} tokens"
    samples = "sample" if args["num_generations"] == 1 else "samples"
    return (f"{args['num_prompts']} prompts × {args['num_generations']} {samples}, "
            f"≤ {args['max_new_tokens']} tokens")


def table(records, out, task):
    """Markdown table of one task's runs: one row per file, seeds averaged."""
    lines = ["| file | work per update | held-out accuracy at each evaluation | wall time | "
             "peak RSS |", "|---|---|---|---|---|"]
    rows = {}
    for file in FILES:
        runs = [r for r in records if r["file"] == file and r["task"] == task
                and r["returncode"] == 0]
        if not runs:
            continue
        dirs = [run_dir_of(out, r) for r in runs]
        accs = [accuracies(d) for d in dirs]
        steps = sorted(set.intersection(*(set(a) for a in accs)))
        points = [mean_se([a[s] for a in accs]) for s in steps]
        if len(runs) > 1:
            cells = " / ".join(f"{m:.3f} ± {se:.3f}" for m, se in points)
            name = f"`{file}.py`, mean ± s.e. of {len(runs)} seeds"
        else:
            cells = " / ".join(f"{m:.3f}" for m, _ in points)
            name = f"`{file}.py`"
        wall = sum(r["wall_s"] for r in runs) / len(runs)
        rss = max(r["peak_rss_gib"] for r in runs)
        lines.append(f"| {name} | {work_per_update(dirs[0])} | at update "
                     f"{' / '.join(map(str, steps))}: {cells} | "
                     f"{int(wall // 60)} min {int(wall % 60)} s | {rss:.1f} GiB |")
        rows[file] = {"steps": steps, "accuracy": [m for m, _ in points],
                      "standard_error": [se for _, se in points], "seeds": len(runs),
                      "wall_s": wall, "peak_rss_gib": rss}
    (out / f"{task}.md").write_text("\n".join(lines) + "\n")
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", nargs="+", choices=list(TASKS), default=["harder", "default"])
    p.add_argument("--files", nargs="+", choices=FILES, default=FILES)
    p.add_argument("--grpo_seeds", nargs="+", type=int, default=[0, 1, 2],
                   help="grpo.py runs once per seed; the other files run with the first")
    p.add_argument("--out", default="runs/learning", help="folder for the runs, tables and plots")
    p.add_argument("--smooth", type=float, default=0.6,
                   help="the plots' moving average of the training reward (common/run/plot.py)")
    p.add_argument("extra", nargs="*", help="after --: flags passed to every run")
    a = p.parse_args()
    out = Path(a.out).resolve()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        sys.exit(f"cannot create --out {a.out}: {e.strerror}; pass a folder you can write")
    # results.json keeps the other tasks' results of an earlier call with the same --out
    path = out / "results.json"
    results = json.loads(path.read_text()) if path.is_file() else {"runs": [], "tables": {}}
    results["runs"] = [r for r in results["runs"] if r["task"] not in a.tasks]
    records = []
    for task in a.tasks:
        for file in a.files:
            for seed in a.grpo_seeds if file == "grpo" else a.grpo_seeds[:1]:
                records.append(run_one(file, task, seed, out, a.extra, a.grpo_seeds[0]))
                results["tables"][task] = table(records, out, task)
                path.write_text(json.dumps({"runs": results["runs"] + records,
                                            "tables": results["tables"]}, indent=1) + "\n")
    for task in a.tasks:
        done = [r for r in records if r["task"] == task and r["returncode"] == 0]
        dirs = [str(run_dir_of(out, r)) for r in done]
        labels = [f"{r['file']} s{r['seed']}" for r in done]
        if dirs:
            subprocess.run([sys.executable, "-m", "common.run.plot", *dirs,
                            "--labels", *labels, "--out", str(out / task),
                            "--smooth", str(a.smooth)],
                           cwd=ROOT, check=False)
        print((out / f"{task}.md").read_text())
    failed = [r for r in records if r["returncode"] != 0]
    if failed:
        sys.exit(f"{len(failed)} run(s) failed; their log.txt says why: "
                 + ", ".join(f"{r['task']}/{r['file']}-seed{r['seed']}" for r in failed))


if __name__ == "__main__":
    main()
