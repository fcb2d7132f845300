"""PS3, failure modes: labs that make a run go wrong on purpose, beside one that goes right.

    python -m exercises.labs                 # the labs, their runs and their questions
    python -m exercises.labs lr              # run one lab: its runs, then its table and curves
    python -m exercises.labs lr kl --out runs/labs
    python -m exercises.labs lr --out /tmp/labs -- --model_name_or_path tiny-random --max_steps 1

Each lab is two runs of a real file with one thing changed, short enough for 2 cores (10 updates of
the embedded model), run side by side with a core each. The runs are the files' own (`python grpo.py FLAGS --output_dir ...`), so their
logs are what any run writes: metrics.jsonl, eval.jsonl, samples.jsonl. A lab prints a table of the
numbers its question is about, and draws both runs' curves (`python -m common.run.plot`) into its
folder. Runs with the same flags are shared between labs and are not run twice; a finished run is
not run again, so a lab that was stopped resumes. The questions and the answers, with the figures
measured here: docs/course.md#ps3-failure-modes.
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from common.run.plot import plot_runs, read_log  # noqa: E402

# Every lab run: 10 updates on arithmetic levels 1-3 (where about half the groups of 8 are all right
# or all wrong), a held-out evaluation of 200 problems at updates 5 and 10 (before training every
# run scores the same, 0.235, so that evaluation is skipped), 8 responses of each update in
# samples.jsonl.
SHORT = ["--difficulty", "1-3", "--max_steps", "10", "--eval_interval", "5", "--no_eval_on_start",
         "--log_interval", "1"]
# The run most labs compare against: grpo.py's defaults on that task.
BASE = ("grpo.py defaults", "grpo.py", SHORT)
# The step too large of the first lab, which the second lab tries to hold back with a KL penalty.
TOO_LARGE = ("lr 2e-5", "grpo.py", [*SHORT, "--learning_rate", "2e-5"])
LOOSE = "exercises/loose_reward.py:contains_answer"
# One update of 2 prompts x 8 and no evaluation: bf16 is about 10 times slower than fp32 on a CPU.
ONE_UPDATE = [*SHORT[:2], "--max_steps", "1", "--num_prompts", "2", "--num_eval_problems", "0"]


@dataclass
class Lab:
    """A failure mode: its runs (label, file, flags), the per-update metrics its table shows (the
    mean over the updates), and the question it asks."""

    name: str
    title: str
    runs: list
    metrics: list
    question: str


LABS = [
    Lab("lr", "a learning rate too large",
        [BASE, TOO_LARGE],
        ["reward/mean", "zero_std_frac", "entropy", "grad_norm"],
        "The default was 2e-5 until the runs of this lab. What happens to held-out accuracy at 2e-5, "
        "and which logged number shows it first?"),
    Lab("kl", "no KL penalty against a large one",
        [TOO_LARGE, ("lr 2e-5, beta 0.5", "grpo.py", [*TOO_LARGE[2], "--beta", "0.5"])],
        ["reward/mean", "kl_ref", "entropy", "grad_norm"],
        "Does a KL penalty to the reference keep a too-large step from doing harm? How large is "
        "the KL term against the policy loss?"),
    Lab("std", "dividing by the group's std",
        [BASE, ("dr_grpo (no std, token sum)", "grpo.py", [*SHORT, "--loss_type", "dr_grpo"])],
        ["reward/mean", "zero_std_frac", "grad_norm", "response_len/mean"],
        "A group of 8 with one right answer gives it an advantage of 2.47 with the std and 0.875 "
        "without. Which questions does the std up-weight, and what does that do here?"),
    Lab("length", "per-sequence against per-token normalisation",
        [BASE, ("bnpo (token mean)", "grpo.py", [*SHORT, "--loss_type", "bnpo"])],
        ["reward/mean", "response_len/mean", "truncated_frac", "grad_norm"],
        "grpo divides each response's loss by its own length, bnpo by the batch's tokens. Who "
        "gains from the first: short right answers or long wrong ones? Does length move here?"),
    Lab("loose", "a loose verifier and its shortcut",
        [BASE, ("paid by a loose verifier", "grpo.py",
                [*SHORT, "--reward_fn", LOOSE, "--reward_weights", "0", "1"])],
        ["reward/mean", "rewards/verifier/mean", "response_len/mean", "numbers/mean"],
        "The loose verifier pays any response that writes the answer anywhere. How many paid "
        "responses does the real verifier call wrong, and what do they look like in samples.jsonl?"),
    Lab("bf16", "the sampler and the trainer disagree under --bf16",
        [("fp32", "grpo.py", [*ONE_UPDATE]), ("bf16", "grpo.py", [*ONE_UPDATE, "--bf16"])],
        ["mismatch/abs", "mismatch/kl", "clipfrac", "approx_kl"],
        "Before the first update the policy that sampled and the policy that trains are the same "
        "weights. Why is their log-prob ratio not 1, and what does --tis_cap do about it?"),
]
BY_NAME = {lab.name: lab for lab in LABS}


def run_dir(out, label):
    return out / "runs" / re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")


def run_all(out, runs, extra=()):
    """A lab's runs as child processes, side by side with their share of the cores each (one
    thread each on 2 cores, faster than one after the other with two threads, where much of a
    decode step waits on its threads), except those that finished before -> their records."""
    started, records = [], {}
    threads = max(1, (os.cpu_count() or 1) // len(runs))
    for label, file, flags in runs:
        folder = run_dir(out, label)
        record_path = folder / "run.json"
        if record_path.is_file() and json.loads(record_path.read_text())["returncode"] == 0:
            records[label] = json.loads(record_path.read_text())
            continue
        if folder.exists():  # a run cut short: start it again from nothing
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        command = [sys.executable, file, *flags, *extra, "--output_dir", str(folder)]
        print(f"  {label}: OMP_NUM_THREADS={threads} python {' '.join(command[1:])}", flush=True)
        log = open(folder / "log.txt", "w")  # noqa: SIM115 (closed when the child ends)
        child = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                 env={**os.environ, "OMP_NUM_THREADS": str(threads)})
        started.append((label, folder, command, child, log, time.time()))
    for label, folder, command, child, log, start in started:
        code = child.wait()
        log.close()
        records[label] = {"label": label, "command": command[1:], "returncode": code,
                          "wall_s": round(time.time() - start, 1), "threads": threads}
        (folder / "run.json").write_text(json.dumps(records[label], indent=1) + "\n")
        if code:
            sys.exit(f"error: {label} exited with {code}; its log: {folder / 'log.txt'}")
    return records


def numbers_per_response(folder):
    """{update: mean count of numbers per logged response} from samples.jsonl."""
    texts = {}
    path = folder / "samples.jsonl"
    for line in path.read_text().splitlines() if path.is_file() else []:
        row = json.loads(line)  # one logged response per line
        texts.setdefault(row["step"], []).append(row["response"])
    return {step: statistics.fmean(len(re.findall(r"\d+", t)) for t in group)
            for step, group in texts.items()}


def summary(lab, out):
    """A markdown table: each run's held-out accuracy at each evaluation, its metrics' means over
    the updates, and its wall time."""
    head = ["run", "held-out accuracy", *[f"`{m}`" for m in lab.metrics], "wall time"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, _, _ in lab.runs:
        folder = run_dir(out, label)
        evals = [r for r in read_log(folder / "eval.jsonl") if "eval/accuracy" in r]
        metrics = read_log(folder / "metrics.jsonl")
        numbers = numbers_per_response(folder)
        cells = [" / ".join(f"{r['eval/accuracy']:.3f}" for r in evals) or "-"]
        for key in lab.metrics:
            values = (list(numbers.values()) if key == "numbers/mean" else
                      [r[key] for r in metrics if isinstance(r.get(key), (int, float))])
            cells.append(f"{statistics.fmean(values):.3g}" if values else "-")
        wall = json.loads((folder / "run.json").read_text())["wall_s"]
        cells.append(f"{int(wall // 60)} min {int(wall % 60)} s")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Flags after -- go to every run (a smaller model for a dry run, say).")
    parser.add_argument("labs", nargs="*", help=f"labs to run: {', '.join(BY_NAME)}")
    parser.add_argument("--out", default="runs/labs", help="folder for the runs and the tables")
    argv = sys.argv[1:] if argv is None else argv
    cut = argv.index("--") if "--" in argv else len(argv)
    args, extra = parser.parse_args(argv[:cut]), argv[cut + 1:]
    unknown = [name for name in args.labs if name not in BY_NAME]
    if unknown:
        sys.exit(f"error: no lab {', '.join(unknown)}; the labs are {', '.join(BY_NAME)}")
    if not args.labs:
        for lab in LABS:
            print(f"{lab.name}: {lab.title}\n  runs: {'; '.join(r[0] for r in lab.runs)}\n"
                  f"  question: {lab.question}")
        return
    out = Path(args.out).expanduser()
    for name in args.labs:
        lab = BY_NAME[name]
        print(f"lab {name}: {lab.title}", flush=True)
        run_all(out, lab.runs, extra)
        table = summary(lab, out)
        (out / f"{name}.md").write_text(table)
        print(table + f"\nquestion: {lab.question}")
        folders = [run_dir(out, label) for label, _, _ in lab.runs]
        if all((f / "eval.jsonl").is_file() for f in folders):
            plot_runs(folders, out / name, labels=[label for label, _, _ in lab.runs])


if __name__ == "__main__":
    main()
