"""Learning curves of one or several runs, on the same axes:

    python -m common.run.plot runs/grpo runs/ppo [--out plots/] [--labels GRPO PPO] [--smooth 0.9]

Reads each run folder's metrics.jsonl (one line per update) and eval.jsonl (held-out greedy
accuracy, and each --eval_datasets set's greedy pass@1 and sampled avg@k; step 0 is before
training) and draws four panels: training reward, held-out accuracy,
response length and KL (`kl_ref` when the run used a reference model, else `approx_kl`). One PNG has
them against the update step (curves_step.png), one against wall-clock time (curves_time.png). They
go to --out (default: the first run folder) and their paths are printed. matplotlib is optional:
`pip install matplotlib`.
"""

import argparse
import os
import json
import sys
from pathlib import Path

# (key, log file, panel title, y label)
PANELS = [
    ("reward/mean", "metrics", "Training reward", "mean reward per update"),
    ("eval/accuracy", "eval", "Held-out accuracy", "greedy pass@1 (dashed: avg@k)"),
    ("response_len/mean", "metrics", "Response length", "mean tokens per response"),
    ("kl", "metrics", "KL", None),  # y label: the key(s) actually plotted
]
# No estimator in the label: grpo/ppo log k3 to the reference, reinforce logs k1 (its
# KL-in-the-return term).
KL_LABELS = {"kl_ref": "kl_ref (policy vs reference)", "approx_kl": "approx_kl (old vs new policy)"}


def read_log(path):
    """Rows of a run's jsonl log, one per step, in step order. A resumed run restarts its clock, so
    its times are shifted to continue from the line before; a step logged twice (replayed after a
    resume) keeps its last line; a line cut short by a crash is skipped."""
    rows, offset, last = [], 0.0, 0.0
    if not path.is_file():
        return rows
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(row, dict) or "step" not in row:
            continue
        if "time" in row:
            if row["time"] + offset < last:  # the clock went back: the run was restarted
                offset = last
            row["time"] += offset
            last = row["time"]
        rows.append(row)
    by_step = {row["step"]: row for row in rows}
    return [by_step[s] for s in sorted(by_step)]


def kl_key(metrics):
    """kl_ref if the run logged it (it used a reference model), else approx_kl."""
    return "kl_ref" if any("kl_ref" in row for row in metrics) else "approx_kl"


def series(rows, key):
    """(steps, times, values) of the rows that hold `key` as a number: a null (a NaN or inf, as the
    logs write them) leaves a gap, not a point."""
    rows = [row for row in rows if isinstance(row.get(key), (int, float))]
    steps, times = [r["step"] for r in rows], [r.get("time", float("nan")) for r in rows]
    return steps, times, [float(r[key]) for r in rows]


def eval_keys(rows):
    """The held-out panel's curves of one run: [(key, what it is)], each set's greedy pass@1 and
    avg@k when the run logged sets (--eval_datasets, --eval_samples: eval/<set>/<metric>), else
    eval/accuracy alone."""
    keys = list(dict.fromkeys(k for row in rows for k in row if k.startswith("eval/")
                              and k.count("/") == 2 and k.rsplit("/", 1)[1].startswith(
                                  ("greedy_pass@1", "avg@"))))
    if not keys:
        return [("eval/accuracy", None)]
    return [(k, f"{k.split('/')[1]} {k.rsplit('/', 1)[1].replace('greedy_pass@1', 'greedy')}")
            for k in keys]


def ema(values, alpha):
    """Exponential moving average with bias correction (the first points are not pulled towards
    0)."""
    out, avg = [], 0.0
    for t, v in enumerate(values, 1):
        avg = alpha * avg + (1 - alpha) * v
        out.append(avg / (1 - alpha ** t))
    return out


def run_labels(run_dirs):
    """The folder names, with the parent folder added where two runs share a name."""
    names = [Path(d).resolve().name for d in run_dirs]
    return [f"{Path(d).resolve().parent.name}/{n}" if names.count(n) > 1 else n
            for d, n in zip(run_dirs, names)]


def plot_runs(run_dirs, out_dir, labels=None, smooth=0.0):
    """Draw curves_step.png and curves_time.png into out_dir; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    labels = labels or run_labels(run_dirs)
    runs = [{"metrics": read_log(Path(d) / "metrics.jsonl"),
             "eval": read_log(Path(d) / "eval.jsonl")} for d in run_dirs]
    max_time = max([row.get("time",
                            0) for run in runs for rows in run.values() for row in rows] or [0])
    unit, scale = ("h", 3600) if max_time >= 3 * 3600 else ("min",
                                                            60) if max_time >= 180 else ("s", 1)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for x_name, x_label in (("step", "update step"), ("time", f"wall-clock time ({unit})")):
        # the same x range in every panel
        fig, axes = plt.subplots(2, 2, figsize=(12, 8), sharex=True)
        for ax, (key, log, title, y_label) in zip(axes.flat, PANELS):
            used = set()
            kl_keys = {kl_key(run["metrics"]) for run in runs if run["metrics"]}
            curves = [(i, run, label, k, what) for i, (run, label) in enumerate(zip(runs, labels))
                      for k, what in (eval_keys(run["eval"]) if log == "eval" else [(key, None)])]
            for n, (i, run, label, panel_key, what) in enumerate(curves):
                panel_key = kl_key(run["metrics"]) if key == "kl" else panel_key
                # runs with and without a reference: say which is which
                if key == "kl" and len(kl_keys) > 1:
                    label = f"{label} ({panel_key})"
                steps, times, values = series(run[log], panel_key)
                if not values:
                    continue
                used.add(panel_key)
                x = steps if x_name == "step" else [t / scale for t in times]
                # one color per run, or per set when one run has several held-out curves
                color = colors[(n if len(runs) == 1 else i) % len(colors)]
                # a short run (even one point) stays visible
                marker = "." if len(values) < 30 else None
                if log == "eval":  # a few points: markers, no smoothing; sampled ones dashed
                    style = "s--" if what and "avg@" in what else "o-"
                    ax.plot(x, values, style, color=color,
                            label=f"{label} {what}" if what else label)
                elif smooth > 0:
                    ax.plot(x, values, color=color, alpha=0.25)
                    ax.plot(x, ema(values, smooth), color=color, marker=marker, label=label)
                else:
                    ax.plot(x, values, color=color, marker=marker, label=label)
            if key == "kl":
                title = f"KL ({' / '.join(sorted(used))})" if used else title
                y_label = KL_LABELS.get(*used, *used) if len(used) == 1 else "KL estimate"
            ax.set_title(title)
            ax.set_xlabel(x_label)
            ax.tick_params(labelbottom=True)  # sharex would hide the top row's ticks
            if x_name == "step":
                ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_ylabel(y_label)
            ax.grid(alpha=0.3)
            if used:
                ax.legend(fontsize="small")
            else:
                ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes,
                        color="gray")
        against = "update step" if x_name == "step" else "wall-clock time"
        smoothed = f" (training curves smoothed, EMA {smooth})" if smooth > 0 else ""
        fig.suptitle(f"{', '.join(labels)} vs {against}{smoothed}")
        fig.tight_layout()
        path = out_dir / f"curves_{x_name}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)
    return paths


def newest_run(folder):
    """A run folder as given, or, for a file's folder of runs (runs/grpo) or its latest link, the
    run that link names."""
    folder = Path(folder)
    if (folder / "latest").is_symlink():
        return str(folder / os.readlink(folder / "latest"))
    return str(folder.parent / os.readlink(folder)) if folder.is_symlink() else str(folder)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m common.run.plot", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR",
                        help="run folders holding metrics.jsonl / eval.jsonl")
    parser.add_argument("--out", default=None,
                        help="folder for the PNG files (default: the first RUN_DIR)")
    parser.add_argument("--labels", nargs="+", default=None,
                        help="legend names, one per RUN_DIR (default: folder names)")
    parser.add_argument("--smooth", type=float, default=0.0,
                        help="EMA weight in [0, 1) for the per-update curves, e.g. 0.9 (default 0: "
                             "raw)")
    args = parser.parse_args(argv)
    # runs/grpo (or runs/grpo/latest) stands for the newest run of grpo.py, labelled grpo
    run_dirs, labels = [newest_run(d) for d in args.run_dirs], args.labels
    if labels is None and run_dirs != args.run_dirs:
        labels = [Path(d).parent.name if Path(d).name == "latest" else Path(d).name
                  for d in args.run_dirs]
    for d in run_dirs:
        if not (Path(d) / "metrics.jsonl").is_file() and not (Path(d) / "eval.jsonl").is_file():
            parser.error(f"{d} is not a run folder: it has no metrics.jsonl or eval.jsonl (pass "
                         "the --output_dir of a run)")
    if labels is not None and len(labels) != len(run_dirs):
        parser.error(f"--labels has {len(labels)} names for {len(run_dirs)} run folders")
    if not 0 <= args.smooth < 1:
        parser.error("--smooth must be in [0, 1)")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("common.run.plot needs matplotlib, an optional dependency: pip install matplotlib",
              file=sys.stderr)
        return 1
    for path in plot_runs(run_dirs, args.out or run_dirs[0], labels, args.smooth):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
