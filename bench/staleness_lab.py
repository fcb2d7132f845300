"""The staleness lab: what sampling k updates behind does to learning, without a correction and with
each of async_grpo.py's. The tiny random model is rewarded when its response starts with an
uppercase letter (tests/test_learning.py's task: it starts near 0.08 and can reach 1.0 within 30
updates at --learning_rate 5e-2, a rate at which each update moves the policy a lot), at k = 0, 1, 2
and 4, with --off_policy_correction none, tis, icepop and seq_mis, a few seeds each, one run at a
time (k = 0 once: there the sampler is the trainer, and every correction weighs 1).

    python bench/staleness_lab.py              # 13 settings x 3 seeds: 15-35 min on 2 cores
    python bench/staleness_lab.py --out /tmp/lab --seeds 0 --ks 0 2 --corrections none tis

OUT/table.md: for each setting, the mean over seeds of the reward of the last 5 updates, of the
first update whose reward reaches 0.8 (31 where none does), of the tokens whose weight the bound
cut and of mismatch/kl (the KL from the sampler's policy to the trainer's, per token).
OUT/staleness.png: the reward curves, one panel per correction, one line per k (the mean over
seeds). A finished run (its metrics.jsonl holds every update) is not run again.
"""

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from common.run.plot import read_log  # noqa: E402

CORRECTIONS = ["none", "tis", "icepop", "seq_mis"]
TASK = ["--model_name_or_path", "tiny-random", "--num_prompts", "4", "--num_generations", "8",
        "--max_new_tokens", "4", "--num_eval_problems", "0", "--num_few_shot", "0",
        "--temperature", "1.0"]


def command(k, correction, seed, run_dir, args):
    """The command line of one async_grpo.py run, rewarded by the test reward."""
    return [sys.executable, "tests/run_with_test_reward.py", "async_grpo", *TASK,
            "--max_steps", str(args.max_steps), "--learning_rate", str(args.learning_rate),
            "--max_staleness", str(k), "--off_policy_correction", correction, "--seed",
            str(seed), "--output_dir", str(run_dir)]


def run_one(k, correction, seed, out, args):
    """One async_grpo.py run as a child process -> its metrics.jsonl rows."""
    run_dir = out / f"k{k}-{correction}-seed{seed}"
    log = run_dir / "metrics.jsonl"
    if log.is_file() and len(read_log(log)) == args.max_steps:
        return read_log(log)
    if run_dir.exists():  # an unfinished run: start it again
        shutil.rmtree(run_dir)
    print(f"k={k} {correction} seed {seed}", flush=True)
    out_log = out / f"k{k}-{correction}-seed{seed}.log"
    with open(out_log, "w") as f:
        done = subprocess.run(command(k, correction, seed, run_dir, args), cwd=ROOT, stdout=f,
                              stderr=subprocess.STDOUT,
                              env={**os.environ, "TEST_REWARD": "first_upper"})
    if done.returncode != 0:
        raise SystemExit(f"the run failed: see {out_log}")
    return read_log(log)


def mean(values):
    return sum(values) / len(values)


def summary(rows, max_steps):
    rewards = [r["reward/mean"] for r in rows]
    reached = next((i + 1 for i, r in enumerate(rewards) if r >= 0.8), max_steps + 1)
    return {"last5": mean(rewards[-5:]), "reached": reached,
            "cut": mean([r["is_weight/clipped_frac"] for r in rows]),
            "kl": mean([r["mismatch/kl"] for r in rows])}


def settings(args):
    return [(k, c) for k in args.ks for c in args.corrections if k > 0 or c == args.corrections[0]]


def table(results, args):
    lines = ["| k | correction | reward, last 5 updates | first update at 0.8 | tokens cut | "
             "mismatch/kl | seeds |", "|---|---|---|---|---|---|---|"]
    for k, c in settings(args):
        s = [summary(rows, args.max_steps) for rows in results[k, c]]
        lines.append(f"| {k} | {c if k else 'any (all weigh 1)'} | "
                     f"{mean([x['last5'] for x in s]):.2f} | "
                     f"{mean([x['reached'] for x in s]):.1f} "
                     f"({', '.join(str(x['reached']) for x in s)}) | "
                     f"{mean([x['cut'] for x in s]):.3f} | {mean([x['kl'] for x in s]):.4f} | "
                     f"{len(s)} |")
    return "\n".join(lines) + "\n"


def figure(results, args, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(args.corrections), figsize=(4 * len(args.corrections), 3.4),
                             sharey=True, squeeze=False)
    for ax, c in zip(axes[0], args.corrections):
        for k in args.ks:
            runs = results[k, c] if k else results[0, args.corrections[0]]  # k = 0: one setting
            curve = [mean([rows[i]["reward/mean"] for rows in runs]) for i in range(args.max_steps)]
            ax.plot(range(1, args.max_steps + 1), curve, label=f"k = {k}",
                    linestyle="--" if k == 0 else "-")
        ax.set_title(f"--off_policy_correction {c}", fontsize=10)
        ax.set_xlabel("update")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(f"reward (mean of {len(args.seeds)} seeds)")
    axes[0][-1].legend(loc="lower right", fontsize=8)
    fig.suptitle(f"async_grpo.py, tiny-random, first letter uppercase, lr {args.learning_rate}",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "runs/staleness_lab")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--ks", type=int, nargs="+", default=[0, 1, 2, 4],
                        help="async_grpo.py's --max_staleness")
    parser.add_argument("--corrections", nargs="+", default=CORRECTIONS, choices=CORRECTIONS,
                        help="async_grpo.py's --off_policy_correction")
    parser.add_argument("--learning_rate", type=float, default=5e-2)
    parser.add_argument("--max_steps", type=int, default=30)
    args = parser.parse_args(argv)
    if min(args.ks) < 0:
        parser.error("--ks: a staleness is 0 or more updates")
    if args.max_steps < 1:
        parser.error("--max_steps must be at least 1")
    return args


def main():
    args = parse()
    args.out.mkdir(parents=True, exist_ok=True)
    results = {}
    for k, c in settings(args):
        results[k, c] = [run_one(k, c, seed, args.out, args) for seed in args.seeds]
    text = table(results, args)
    (args.out / "table.md").write_text(text)
    figure(results, args, args.out / "staleness.png")
    print(text + f"\n{args.out / 'staleness.png'}")


if __name__ == "__main__":
    main()
