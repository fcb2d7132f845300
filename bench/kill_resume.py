"""SIGKILL a training run at random moments, --resume it after every kill, and compare the end with
an uninterrupted run of the same command: the final weights (and critic), and metrics.jsonl,
eval.jsonl and samples.jsonl line for line, times aside.

    python bench/kill_resume.py                        # grpo, 20 kills, tiny-random model, ~4 min on 2 cores
    python bench/kill_resume.py --algo ppo --kills 20
    python bench/kill_resume.py --algo appo --kills 5 --seed 1

Every attempt runs the same command with --resume --save_interval 1 (a checkpoint after every
update) and the test reward of tests/run_with_test_reward.py, so that every update changes the
weights. One kill in five lands in the imports or while the models load; one in four within 50 ms of
a checkpoint-N.tmp folder appearing, i.e. in the middle of a checkpoint write; the others at a
random time within two updates' time after the run starts working (its logger writes args.json): in
an evaluation, a rollout, an update or a checkpoint write. Timing kills from these moments, not from
the start, keeps each attempt's progress small on a busy machine too. A kill after which the output
folder holds a checkpoint-N.tmp written by that attempt interrupted a save. After the last kill the
run goes to the end.
"""

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from dev.algorithms import ALGORITHMS  # noqa: E402

SMALL = {  # a few seconds per attempt on 2 cores, evaluations and sample logs inside the run
    "grpo": ["--num_prompts", "2", "--num_generations", "4", "--max_new_tokens", "8"],
    "reinforce": ["--num_prompts", "2", "--num_generations", "4", "--max_new_tokens", "8"],
    "ppo": ["--num_prompts", "4", "--max_new_tokens", "8"],
    "appo": ["--num_envs", "2", "--num_steps", "2", "--max_new_tokens", "4",
             "--eval_max_new_tokens", "8"],
    "tppo": ["--num_envs", "2", "--num_steps", "2", "--max_new_tokens", "4",
             "--eval_max_new_tokens", "8"],
    "online_dpo": ["--num_prompts", "4", "--max_new_tokens", "8"],
}
# wall-clock fields differ between runs
VOLATILE = ("time", "tokens_per_s", "time/rollout_s", "time/update_s")


def command(algo, max_steps, out):
    return [sys.executable, str(ROOT / "tests/run_with_test_reward.py"), algo, "--model_name_or_path", "tiny-random",
            *SMALL[algo], "--num_eval_problems", "4", "--eval_interval", "3", "--log_interval", "2",
            "--learning_rate", "1e-3", "--temperature", "1.0", "--max_steps", str(max_steps), "--save_interval", "1",
            "--output_dir", str(out)]


def attempt(cmd, log, delay, ready=None):
    """Run cmd and SIGKILL it `delay` seconds after it starts, or after ready() first holds if
    given, unless it has exited by then. Returns (killed, exit code)."""
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "TQDM_DISABLE": "1"})
    start = None if ready else time.time()
    while proc.poll() is None:
        if start is None and ready():
            start = time.time()
        if start is not None and time.time() - start >= delay:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            return True, -9
        time.sleep(0.01)
    return False, proc.returncode


def lines(path):
    """A jsonl log without its wall-clock fields."""
    rows = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
    return [{k: v for k, v in row.items() if k not in VOLATILE} for row in rows]


def max_weight_diff(a, b):
    """Largest |difference| between the two final checkpoints: the policy and any tensors in
    trainer_state's extra."""
    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    diff = max((wa[k] - wb[k]).abs().max().item() for k in wa)
    ea = torch.load(a / "trainer_state.pt", weights_only=True)["extra"]
    eb = torch.load(b / "trainer_state.pt", weights_only=True)["extra"]
    for name, state in ea.items():
        if isinstance(state, dict):
            diff = max([diff] + [(v - eb[name][k]).abs().max().item() for k,
                                 v in state.items() if torch.is_tensor(v)])
    return diff


def kill_and_resume(algo="grpo", kills=20, max_steps=None, seed=0,
                    out=ROOT / "bench/out/kill_resume"):
    """Returns a summary dict: kills made, kills that interrupted a save, crashes on resume, the
    final weights' largest difference from the uninterrupted run, and whether the three logs match
    it line for line."""
    out = Path(out) / algo
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    # room for attempts that get further than planned on a busy machine
    max_steps = max_steps or 4 * kills + 4
    rng = random.Random(seed)
    straight, killed = out / "straight", out / "killed"
    with open(out / "straight.log", "w") as log:
        t0 = time.time()
        proc = subprocess.Popen(command(algo, max_steps, straight), cwd=ROOT, stdout=log,
                                stderr=subprocess.STDOUT,
                                env={**os.environ, "TQDM_DISABLE": "1"})
        # seconds until the logger starts (models loaded), and until the first update
        startup = first = None
        while proc.poll() is None:
            if startup is None and (straight / "args.json").exists():
                startup = time.time() - t0
            if first is None and (straight / "metrics.jsonl").exists() and (straight / "metrics.jsonl").read_text():
                first = time.time() - t0
            time.sleep(0.01)
        total = time.time() - t0
    assert proc.returncode == 0, (out / "straight.log").read_text()[-2000:]
    per_update = (total - first) / max(1, max_steps - 1)
    made, in_save, crashes, attempts = 0, 0, [], 0
    with open(out / "killed.log", "w") as log:
        while made < kills:
            attempts += 1
            started = time.time()
            cmd = command(algo, max_steps, killed) + ["--resume"]
            where = rng.random()
            if where < 0.2:  # in the imports or while the models load
                was_killed, code = attempt(cmd, log, rng.uniform(0.2, startup))
            # inside a checkpoint write, on purpose: within 50 ms of its .tmp folder appearing
            elif where < 0.45:
                saving = lambda: any(p.name.endswith(".tmp") and p.stat().st_mtime >= started
                                     for p in killed.glob("checkpoint-*"))
                was_killed, code = attempt(cmd, log, rng.uniform(0, 0.05), saving)
            # once the run works (its logger has written args.json): an eval, a rollout, an update,
            # a save
            else:
                ready = lambda: (killed / "args.json").exists() and (killed / "args.json").stat().st_mtime >= started
                was_killed, code = attempt(cmd, log, rng.uniform(0, 2 * per_update), ready)
            if was_killed:
                made += 1
                in_save += any(p.name.endswith(".tmp") and p.stat().st_mtime >= started for p in killed.glob("checkpoint-*"))
            elif code != 0:
                crashes.append(code)
                break
            else:
                break  # finished before all the kills were made
        if not crashes:
            _, code = attempt(command(algo, max_steps, killed) + ["--resume"], log, 3600)
            if code != 0:
                crashes.append(code)
    final = f"checkpoint-{max_steps}"
    summary = {"algo": algo, "max_steps": max_steps, "attempts": attempts, "kills": made,
               "kills_during_save": in_save,
               "crashes": crashes, "seconds_to_start": round(startup, 2),
               "seconds_per_update": round(per_update, 2)}
    if not crashes:
        summary["max_abs_weight_diff"] = max_weight_diff(straight / final, killed / final)
        summary["logs_match"] = {name: lines(straight / name) == lines(killed / name)
                                 for name in ("metrics.jsonl", "eval.jsonl", "samples.jsonl")}
    return summary


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--algo", default="grpo", choices=ALGORITHMS)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--max_steps", type=int, default=None, help="Default: 4 * kills + 4.")
    parser.add_argument("--seed", type=int, default=0, help="Seeds the kill times.")
    parser.add_argument("--out", default=str(ROOT / "bench/out/kill_resume"))
    args = parser.parse_args()
    summary = kill_and_resume(args.algo, args.kills, args.max_steps, args.seed, args.out)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
