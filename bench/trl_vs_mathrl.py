"""grpo.py against TRL's GRPOTrainer on identical work, in one invocation, alternating step by step.

Both sides train the embedded SmolLM2-135M-Instruct (the same fp32 safetensors), on the same
arithmetic prompts in the same order, with the same group size, completion length, temperature,
learning rate, batch shape (4 prompts x 8 samples = 32 completions per optimizer step, micro-batches
of 8), loss (`grpo`, per-sequence mean), `beta` 0 and no gradient checkpointing. Each side runs in
its own worker process for its whole run (so "reward after N steps" is one continuous run, and each
has its own peak RSS); the parent hands a baton back and forth so exactly one of them computes at
any time, and both see the same machine state.

    pip install -r requirements-bench.txt
    python bench/trl_vs_mathrl.py --steps 10            # ~20 min on a 2-core CPU

Prints the median step time of each, the ratio mathrl/TRL, each side's peak RSS, and the training
reward of the last steps. `--eval_problems N` also grades both final policies on N held-out problems
with the same greedy evaluator. grpo.py runs unmodified: the worker only wraps two of its functions
to wait for the baton and to report each step.
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

NUM_PROMPTS, G, MICRO = 4, 8, 8


def wait_for_baton():
    line = sys.stdin.readline()
    if line.strip() != "go":
        sys.exit(0)
    return time.time()


def report(**row):
    print("BENCH " + json.dumps(row), flush=True)


def trl_worker(args):
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from common.env import make_envs
    from common.models import embedded_model_dir
    from grpo import prompt_indices

    torch.manual_seed(args.seed)
    # grpo.py's env, from grpo.py's options: the same prompts (system prompt, worked example)
    env, _ = make_envs(grpo_args(args))
    # The prompts of grpo.py's updates 0..steps-1, in its order; TRL is told not to shuffle.
    order = [i for step in range(args.steps) for i in prompt_indices(step, NUM_PROMPTS, len(env),
                                                                     args.seed)]
    data = Dataset.from_list([{"prompt": env.reset(i), "index": i} for i in order])

    def reward(prompts, completions, index, **kwargs):
        return [env.score(c[0]["content"] if isinstance(c, list) else c,
                          i)[0] for c, i in zip(completions, index)]

    path = str(embedded_model_dir())
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    config = GRPOConfig(
        output_dir=args.out + "/trl", max_steps=args.steps, learning_rate=2e-5,
        lr_scheduler_type="constant",
        warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0, per_device_train_batch_size=MICRO,
        gradient_accumulation_steps=NUM_PROMPTS * G // MICRO, num_generations=G,
        max_completion_length=64,
        temperature=0.7, top_p=1.0, beta=0.0, epsilon=0.2, loss_type="grpo", scale_rewards="group",
        # num_iterations: TRL's name for num_ppo_epochs (a rename to ours broke this bench once)
        num_iterations=1, shuffle_dataset=False, gradient_checkpointing=False, bf16=False,
        use_cpu=True,
        logging_steps=1, report_to=[], save_strategy="no", seed=args.seed, dataloader_num_workers=0,
    )

    class Baton(TrainerCallback):
        def on_step_begin(self, *a, **kw):
            self.t0 = wait_for_baton()

        def on_step_end(self, *a, **kw):
            self.seconds = time.time() - self.t0

        def on_log(self, _args, state, control, logs=None, **kw):
            if logs and "reward" in logs:
                report(side="trl", step=state.global_step, seconds=self.seconds,
                       reward=logs["reward"],
                       response_len=logs.get("completions/mean_length"))

    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=data,
                          processing_class=tokenizer, callbacks=[Baton()])
    report(side="trl", ready=True)
    trainer.train()
    if args.eval_problems:
        trainer.model.save_pretrained(args.out + "/trl-final")
        tokenizer.save_pretrained(args.out + "/trl-final")
    report(side="trl", done=True,
           peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def grpo_args(args):
    """grpo.py's options in this bench; the TRL side builds its env from them too."""
    import grpo

    return grpo.Args(max_steps=args.steps, num_prompts=NUM_PROMPTS, num_generations=G,
                     micro_batch_size=MICRO, max_new_tokens=64, temperature=0.7,
                     learning_rate=2e-5, seed=args.seed, num_eval_problems=0,
                     log_interval=10**9, output_dir=args.out + "/mathrl")


def mathrl_worker(args):
    import grpo

    real_rollout, real_log = grpo.rollout, grpo.Logger.log
    clock = {}

    def rollout(*a, **kw):
        clock["t0"] = wait_for_baton()
        return real_rollout(*a, **kw)

    def log(self, step, metrics):
        real_log(self, step, metrics)
        report(side="mathrl", step=step, seconds=time.time() - clock["t0"],
               reward=metrics["reward/mean"],
               response_len=metrics["response_len/mean"], update_s=metrics["time/update_s"])

    grpo.rollout, grpo.Logger.log = rollout, log
    report(side="mathrl", ready=True)
    grpo.main(grpo_args(args))
    report(side="mathrl", done=True,
           peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def read_report(proc):
    for line in proc.stdout:
        if line.startswith("BENCH "):
            return json.loads(line[6:])
    raise RuntimeError(f"worker exited early (code {proc.wait()}); run it alone to see its error")


def main(args):
    try:
        import trl  # noqa: F401
    except ImportError:
        sys.exit("TRL is not installed: pip install -r requirements-bench.txt")
    out = args.out or tempfile.mkdtemp(prefix="bench-trl-")
    workers = {}
    for side in ("trl", "mathrl"):
        cmd = [sys.executable, __file__, "--worker", side, "--steps", str(args.steps), "--seed",
               str(args.seed),
               "--out", out, "--eval_problems", str(args.eval_problems)]
        workers[side] = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         text=True, cwd=ROOT,
                                         env={**os.environ, "TQDM_DISABLE": "1"})
        assert read_report(workers[side]).get("ready")
    rows = {"trl": [], "mathrl": []}
    for step in range(args.steps):
        # alternate who goes first
        for side in ("trl", "mathrl") if step % 2 == 0 else ("mathrl", "trl"):
            workers[side].stdin.write("go\n")
            workers[side].stdin.flush()
            row = read_report(workers[side])
            rows[side].append(row)
            print(f"step {step + 1:3d}  {side:6s}  {row['seconds']:6.1f} s  reward "
                  f"{row['reward']:.3f}", flush=True)
    peak = {}
    for side, proc in workers.items():
        proc.stdin.close()
        peak[side] = read_report(proc)["peak_rss_mb"]
        proc.wait()

    summary = summarize(rows, peak)
    if args.eval_problems:
        summary["heldout_greedy_accuracy"] = evaluate_both(out, args.eval_problems)
    print(json.dumps(summary, indent=2))
    Path(out, "summary.json").write_text(json.dumps({**summary, "rows": rows}, indent=2))
    med, last, reward = summary["median_step_s"], summary["reward_last_steps"], summary["reward"]
    print(f"median step: mathrl {med['mathrl']:.1f} s, TRL {med['trl']:.1f} s, ratio "
          f"{summary['ratio_mathrl_over_trl']:.2f}"
          f" (per completion token {summary['ratio_per_completion_token']:.2f})"
          f" | peak RSS: mathrl {peak['mathrl']:.0f} MB, TRL {peak['trl']:.0f} MB"
          f" | reward (last {last} steps): mathrl {reward['mathrl']:.3f}, TRL {reward['trl']:.3f} "
          f"| {out}")


def summarize(rows, peak):
    """Medians and ratios from the per-step rows of both sides (also usable on a saved
    summary.json's rows)."""
    med = {side: statistics.median(r["seconds"] for r in rows[side]) for side in rows}
    steps = len(rows["mathrl"])
    last = max(1, steps // 4)
    # The two runs learn at different speeds and shorter answers make cheaper steps, so the
    # step-time ratio is also given per sampled completion token (32 completions per step on both
    # sides).
    per_token = {side: sum(r["seconds"] for r in rows[side]) / sum(r["response_len"] for r in rows[side])
                 for side in rows}
    return {
        "steps": steps, "median_step_s": med, "ratio_mathrl_over_trl": med["mathrl"] / med["trl"],
        "ratio_per_completion_token": per_token["mathrl"] / per_token["trl"],
        "mean_response_len": {side: statistics.mean(r["response_len"] for r in rows[side]) for side in rows},
        "peak_rss_mb": peak, "reward_last_steps": last,
        "reward": {side: statistics.mean(r["reward"] for r in rows[side][-last:]) for side in rows},
        # grpo.py's own time/rollout_s includes the wait for the baton, so the rollout is step time
        # - update time
        "mathrl_rollout_s_median": statistics.median(r["seconds"] - r["update_s"] for r in rows["mathrl"]),
        "mathrl_update_s_median": statistics.median(r["update_s"] for r in rows["mathrl"]),
    }


def evaluate_both(out, n):
    from common.env import make_env
    from common.models import evaluate, load_policy, load_tokenizer

    env = make_env("arithmetic", "test", difficulty="1-2")
    tok = load_tokenizer("SmolLM2-135M-Instruct")
    result = {}
    for side, path in (("mathrl", max(Path(out, "mathrl").glob("checkpoint-*"))),
                       ("trl", Path(out, "trl-final"))):
        result[side] = evaluate(load_policy(str(path)), tok, env, n, 64)
    return result


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=10, help="optimizer steps for each side")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval_problems", type=int, default=0,
                   help="also grade both final policies on N held-out problems")
    p.add_argument("--out", default=None,
                   help="folder for both runs and summary.json (default: a temp dir)")
    p.add_argument("--worker", choices=["trl", "mathrl"], help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker == "trl":
        trl_worker(a)
    elif a.worker == "mathrl":
        mathrl_worker(a)
    else:
        main(a)
