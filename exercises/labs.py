"""PS3, failure modes: labs that make a run go wrong on purpose, beside one that goes right.

    python -m exercises.labs                 # the labs, their runs and their questions
    python -m exercises.labs lr              # run one lab: its runs, then its table and curves
    python -m exercises.labs lr kl --out runs/labs
    python -m exercises.labs lr --out /tmp/labs -- --model_name_or_path tiny-random --max_steps 1
    python -m exercises.labs lr --key        # the numbers its answer cites, read off its runs' logs
    python -m exercises.labs lr --key -- --seed 1       # a variant's runs, and their answer key

Each lab is two runs of a real file with one thing changed, short enough for 2 cores (10 updates of
the embedded model), run side by side with a core each. The runs are the files' own (`python grpo.py FLAGS --output_dir ...`), so their
logs are what any run writes: metrics.jsonl, eval.jsonl, samples.jsonl. A lab prints a table of the
numbers its question is about, and draws both runs' curves (`python -m common.run.plot`) into its
folder. Runs with the same flags are shared between labs and are not run twice; a finished run is
not run again, so a lab that was stopped resumes. The questions and the answers, with the figures
measured here: docs/course.md#ps3-failure-modes.

--key prints a lab's answer key: the numbers its answer cites (held-out accuracies, the update
where every answer is wrong, the KL term beside the policy loss, the responses a loose verifier
pays for a wrong answer, ...), read off its runs' logs by one function per lab (KEYS). Flags after
-- make a variant (another seed, beta or learning rate): its runs go to a folder of their own under
--out, named after the flags, so that a teacher who hands out a variant has its key from one
command.
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
from common.run.plot import plot_runs  # noqa: E402

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
        "weights. Why is their log-prob ratio not 1, and what does truncated importance sampling "
        "(async_grpo.py --off_policy_correction tis) do about it?"),
]
BY_NAME = {lab.name: lab for lab in LABS}


def run_dir(out, label):
    return out / "runs" / re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")


def variant_dir(out, extra):
    """The folder of the labs run with the flags after -- (`extra`): `out` itself without any, else
    a folder under it named after them (`--seed 1` -> out/seed-1), so that a variant's runs are
    never taken for the runs of the labs' own flags, nor the other way round."""
    name = re.sub(r"[^A-Za-z0-9.]+", "-", " ".join(extra)).strip("-.")
    return out / name if extra else out


def run_all(out, runs, extra=()):
    """A lab's runs as child processes, side by side with their share of the cores each (one
    thread each on 2 cores, faster than one after the other with two threads, where much of a
    decode step waits on its threads), except those that finished before -> their records."""
    started, records = [], {}
    threads = max(1, (os.cpu_count() or 1) // len(runs))
    for label, file, flags in runs:
        folder = run_dir(out, label)
        record_path = folder / "run.json"
        if record_path.is_file() and read_record(folder)["returncode"] == 0:
            records[label] = read_record(folder)
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


@dataclass
class Logs:
    """What one run wrote: its label, metrics.jsonl and eval.jsonl rows in step order, every line of
    samples.jsonl (several per update, so not read_log, which keeps one row per step), and its
    options as args.json has them."""

    label: str
    metrics: list
    evals: list
    samples: list
    args: dict

    def series(self, key):
        """[(update, value)] of the updates that logged `key` as a number."""
        return [(r["step"], r[key]) for r in self.metrics if isinstance(r.get(key), (int, float))]

    def mean(self, key):
        values = [v for _, v in self.series(key)]
        return statistics.fmean(values) if values else None


class Damaged(Exception):
    """A run's file the labs cannot read, in one line: the file, the line and what it lacks."""


AGAIN = "remove that run's folder and run the lab again to make it afresh"


def _text(path):
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise Damaged(f"{path}: byte {e.start} is not text (binary bytes in a log): {AGAIN}") \
            from None


def _object(path, text, where=""):
    """The JSON object of a file (or of one of its lines, `where` saying which)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise Damaged(f"{path}{where}: not JSON ({e.msg}, cut short?): {AGAIN}") from None
    if not isinstance(value, dict):
        raise Damaged(f"{path}{where}: a JSON {type(value).__name__}, where an object is "
                      f"expected: {AGAIN}")
    return value


def _number(path, where, row, key, kinds=(int, float)):
    value = row.get(key)
    if not isinstance(value, kinds) or isinstance(value, bool):
        said = "no" if key not in row else f"{value!r} as its"
        raise Damaged(f"{path}{where}: {said} {key!r}, where a number is expected: {AGAIN}")
    return value


NUMBERS = ("time", "eval/accuracy", "reward", "advantage", "learning_rate", "beta",
           "max_grad_norm", "num_prompts", "num_generations")  # where a key reads a number
TEXTS = ("response", "answer", "loss_type", "dataset_name")  # where it reads text


def _check_fields(path, where, row):
    for key in NUMBERS:
        if key in row and row[key] is not None:
            _number(path, where, row, key)
    for key in TEXTS:
        if key in row and not isinstance(row[key], str):
            raise Damaged(f"{path}{where}: {row[key]!r} as its {key!r}, where text is expected: "
                          f"{AGAIN}")


def read_rows(path, one_per_step=True):
    """A run's jsonl log, checked: each line an object with an integer step (and numbers where
    the labs read numbers), in step order, the last line of a step kept (a resumed run replays
    some). A last line cut short by a crash is skipped, as the runs themselves skip it."""
    if not path.is_file():
        return []
    lines = _text(path).splitlines()
    rows = []
    for n, line in enumerate(lines, 1):
        if n == len(lines):  # the last: cut short by a crash if it does not parse
            try:
                json.loads(line)
            except json.JSONDecodeError:
                break
        row = _object(path, line, f", line {n}")
        _number(path, f", line {n}", row, "step", int)
        _check_fields(path, f", line {n}", row)
        rows.append(row)
    if not one_per_step:
        return rows
    by_step = {row["step"]: row for row in rows}
    return [by_step[s] for s in sorted(by_step)]


def read_record(folder, key="returncode"):
    """run.json, checked for `key`: the run's exit status, or its wall time (wall_s)."""
    path = folder / "run.json"
    record = _object(path, _text(path))
    _number(path, "", record, key, int if key == "returncode" else (int, float))
    return record


def read_run(out, label):
    """The logs of a lab's run `label` under `out` (Logs), each file checked (read_rows)."""
    folder = run_dir(out, label)
    samples = read_rows(folder / "samples.jsonl", one_per_step=False)
    args_path = folder / "args.json"
    args = _object(args_path, _text(args_path)) if args_path.is_file() else {}
    _check_fields(args_path, "", args)
    return Logs(label, read_rows(folder / "metrics.jsonl"),
                [r for r in read_rows(folder / "eval.jsonl") if "eval/accuracy" in r], samples,
                args)


def numbers_per_response(samples):
    """{update: mean count of numbers per logged response} from samples.jsonl's rows."""
    texts = {}
    for row in samples:
        if isinstance(row.get("response"), str):
            texts.setdefault(row["step"], []).append(row["response"])
    return {step: statistics.fmean(len(re.findall(r"\d+", t)) for t in group)
            for step, group in texts.items()}


def summary(lab, out):
    """A markdown table: each run's held-out accuracy at each evaluation, its metrics' means over
    the updates, and its wall time."""
    head = ["run", "held-out accuracy", *[f"`{m}`" for m in lab.metrics], "wall time"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, _, _ in lab.runs:
        run = read_run(out, label)
        numbers = list(numbers_per_response(run.samples).values())
        cells = [" / ".join(f"{r['eval/accuracy']:.3f}" for r in run.evals) or "-"]
        for key in lab.metrics:
            mean = (statistics.fmean(numbers) if numbers else None) if key == "numbers/mean" \
                else run.mean(key)
            cells.append(f"{mean:.3g}" if mean is not None else "-")
        wall = read_record(run_dir(out, label), "wall_s")["wall_s"]
        cells.append(f"{int(wall // 60)} min {int(wall % 60)} s")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------
# Answer keys: the numbers each lab's answer cites, read off its runs' logs, so that a teacher who
# varies a lab's flags has the key of the variant without reading the logs by hand.
# ------------------------------------------------------------------------------------------------
def num(value, digits=3):
    """A number as the answers write it: 3 significant digits, '-' when the run did not log it."""
    return "-" if value is None else f"{value:.{digits}g}"


def accuracies(run):
    """'held-out accuracy 0.355 at update 5, 0.390 at update 10'."""
    cells = [f"{r['eval/accuracy']:.3f} at update {r['step']}" for r in run.evals]
    return "held-out accuracy " + (", ".join(cells) if cells else "not evaluated")


def by_update(run, key, scale=1.0):
    """'1: 0.30, 2: 0.06, ...': a metric in each update, times `scale`."""
    return ", ".join(f"{step}: {num(v * scale, 2)}" for step, v in run.series(key)) or "not logged"


def spread(run, key):
    """'mean 0.300, from 0.0625 at update 9 to 0.562 at update 4'."""
    rows = run.series(key)
    if not rows:
        return "not logged"
    low, high = min(rows, key=lambda r: r[1]), max(rows, key=lambda r: r[1])
    return (f"mean {num(run.mean(key))}, from {num(low[1])} at update {low[0]} to "
            f"{num(high[1])} at update {high[0]}")


def all_wrong_updates(run):
    """The updates where every group's answers were alike (zero_std_frac 1.0) and none was right
    (reward/mean 0): no group has an advantage, so the update has no gradient."""
    rewards = dict(run.series("reward/mean"))
    return [step for step, v in run.series("zero_std_frac") if v == 1.0 and rewards.get(step) == 0]


def key_lr(runs):
    lines = []
    for run in runs:
        lines.append(f"{run.label} (learning rate {run.args.get('learning_rate', '?')}): "
                     f"{accuracies(run)}")
        lines.append(f"  reward/mean by update: {by_update(run, 'reward/mean')}")
        full = [step for step, v in run.series("zero_std_frac") if v == 1.0]
        grads = dict(run.series("grad_norm"))
        lines.append("  zero_std_frac 1.0 (every group alike) first at update "
                     f"{full[0]}, where grad_norm is {num(grads.get(full[0]))}" if full else
                     "  zero_std_frac never 1.0")
        wrong = all_wrong_updates(run)
        lines.append(f"  every response wrong (zero_std_frac 1.0 and reward/mean 0) in updates "
                     f"{', '.join(map(str, wrong))}" if wrong else
                     "  no update with every response wrong")
        lines.append(f"  means over the updates: zero_std_frac {num(run.mean('zero_std_frac'))}, "
                     f"entropy {num(run.mean('entropy'))}, grad_norm {num(run.mean('grad_norm'))}")
    return lines


def key_kl(runs):
    lines = []
    for run in runs:
        beta = run.args.get("beta", 0.0)
        lines.append(f"{run.label} (beta {beta}): {accuracies(run)}")
        last = run.series("reward/mean")[-1:] or [("-", None)]
        lines.append(f"  reward/mean in its last update ({last[0][0]}): {num(last[0][1])}; "
                     f"entropy mean {num(run.mean('entropy'))}")
        if not run.series("kl_ref"):
            lines.append("  no kl_ref: without a KL penalty no reference model is loaded")
            continue
        lines.append(f"  kl_ref (k3, per token) by update: {by_update(run, 'kl_ref')}")
        lines.append(f"  beta x kl_ref by update: {by_update(run, 'kl_ref', beta)}")
        lines.append(f"  pg_loss by update: {by_update(run, 'pg_loss')}")
        terms = [beta * v for _, v in run.series("kl_ref")]
        losses = [v for _, v in run.series("pg_loss")] or [None]
        lines.append(f"  beta x kl_ref from {num(min(terms), 2)} to {num(max(terms), 2)}; pg_loss "
                     f"from {num(min(losses), 2)} to {num(max(losses), 2)}")
    return lines


def key_std(runs):
    lines = []
    for run in runs:
        clip = run.args.get("max_grad_norm")
        grads = run.series("grad_norm")
        loss_type = run.args.get("loss_type", "?")
        lines.append(f"{run.label} (--loss_type {loss_type}): {accuracies(run)}")
        lines.append(f"  grad_norm {spread(run, 'grad_norm')}")
        if clip:
            # grad_norm is the norm before the clip: above max_grad_norm, the step was clipped
            above = sum(v > clip for _, v in grads)
            lines.append(f"  grad_norm above --max_grad_norm {clip} (clipped) in {above} of "
                         f"{len(grads)} updates")
        advantages = [abs(s["advantage"]) for s in run.samples
                      if isinstance(s.get("advantage"), (int, float))]
        lines.append(f"  means over the updates: zero_std_frac {num(run.mean('zero_std_frac'))}, "
                     f"reward/mean {num(run.mean('reward/mean'))}, response_len/mean "
                     f"{num(run.mean('response_len/mean'))}; largest |advantage| in samples.jsonl "
                     f"{num(max(advantages)) if advantages else '-'}")
    return lines


def key_length(runs):
    lines = []
    for run in runs:
        loss_type = run.args.get("loss_type", "?")
        lines.append(f"{run.label} (--loss_type {loss_type}): {accuracies(run)}")
        lines.append(f"  response_len/mean {spread(run, 'response_len/mean')}")
        lines.append(f"  means over the updates: truncated_frac {num(run.mean('truncated_frac'))}, "
                     f"grad_norm {num(run.mean('grad_norm'))}")
        lines.append(f"  pg_loss by update: {by_update(run, 'pg_loss')}")
    first, second = (dict(run.series("pg_loss")) for run in runs)
    steps = sorted(set(first) & set(second))
    # how many updates from the first the two losses agree to 3 decimals: the same loss until the
    # runs' samples part
    agree = next((k for k, step in enumerate(steps) if abs(first[step] - second[step]) >= 5e-4),
                 len(steps))
    lines.append(f"pg_loss of the two runs agrees to 3 decimals in the first {agree} of "
                 f"{len(steps)} updates")
    return lines


def key_loose(runs):
    from common.env.math_env import verify  # the project's verifier, which the loose one is not
    lines = []
    for run in runs:
        numbers = list(numbers_per_response(run.samples).values())
        lines.append(f"{run.label}: {accuracies(run)}; numbers per response "
                     f"{num(statistics.fmean(numbers) if numbers else None)}")
    run = runs[-1]  # the run the loose verifier pays
    per_update = run.args.get("num_prompts", 4) * run.args.get("num_generations", 8)
    verifier = dict(run.series("rewards/verifier/mean"))
    agree = 0
    for step, paid in run.series("reward/mean"):
        right = verifier.get(step)
        if right is None:
            continue
        extra = round((paid - right) * per_update)
        agree += extra == 0
        lines.append(f"  update {step}: the loose verifier paid {num(paid)}, the real one "
                     f"{num(right)}: {extra} of {per_update} responses paid more than right")
    lines.append(f"  the two agree in {agree} of {len(verifier)} updates")
    task = run.args.get("dataset_name", "arithmetic")
    wrong_paid = [s for s in run.samples if (s.get("reward") or 0) > 0 and "response" in s
                  and "answer" in s and verify(task, s["response"], s["answer"]) == 0]
    counts = {}
    for s in wrong_paid:
        counts[s["step"]] = counts.get(s["step"], 0) + 1
    by_step = ", ".join(f"{step}: {n}" for step, n in counts.items())
    lines.append(f"  in samples.jsonl ({len(run.samples)} responses logged): {len(wrong_paid)} "
                 f"paid for a wrong answer" + (f" (by update, {by_step})" if wrong_paid else ""))
    if wrong_paid:
        s = wrong_paid[0]
        lines.append(f"  for instance, update {s['step']}: {s['question']!r} (gold {s['answer']}) "
                     f"answered {s['response']!r}, paid {s['reward']}")
    return lines


def key_bf16(runs):
    lines = []
    for run in runs:
        times = [run.mean(k) for k in ("time/rollout_s", "time/update_s")]
        lines.append(f"{run.label}: mismatch/abs {num(run.mean('mismatch/abs'), 2)}, mismatch/kl "
                     f"{num(run.mean('mismatch/kl'), 2)}, clipfrac {num(run.mean('clipfrac'), 2)}, "
                     f"approx_kl {num(run.mean('approx_kl'), 2)}, rollout and update "
                     f"{num(sum(times)) if None not in times else '-'} s")
    low, high = (run.mean("mismatch/abs") for run in runs)
    if low and high:
        lines.append(f"mismatch/abs of {runs[1].label} is {high / low:,.0f} times that of "
                     f"{runs[0].label}")
    return lines


KEYS = {"lr": key_lr, "kl": key_kl, "std": key_std, "length": key_length, "loose": key_loose,
        "bf16": key_bf16}


def answer_key(lab, out):
    """The lines of a lab's answer key, from the logs of its runs under `out`."""
    return [f"answer key of lab {lab.name}, from {out}:",
            *KEYS[lab.name]([read_run(out, label) for label, _, _ in lab.runs])]


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Flags after -- go to every run (another seed, a smaller model for a dry run): "
               "the runs of those flags go to a folder of their own under --out, named after them.")
    parser.add_argument("labs", nargs="*", help=f"labs to run: {', '.join(BY_NAME)}")
    parser.add_argument("--out", default="runs/labs", help="folder for the runs and the tables")
    parser.add_argument("--key", action="store_true",
                        help="also print each lab's answer key: the numbers its answer cites, read "
                             "off its runs' logs (the runs are made first if they are not there)")
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
    out = variant_dir(Path(args.out).expanduser(), extra)
    try:
        run_labs(args, out, extra)
    except Damaged as e:  # a run's file that cannot be read: one line, the file and the fix
        sys.exit(f"error: {e}")


def run_labs(args, out, extra):
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
        if args.key:
            key = "\n".join(answer_key(lab, out)) + "\n"
            (out / f"{name}-key.txt").write_text(key)
            print("\n" + key, end="")


if __name__ == "__main__":
    main()
