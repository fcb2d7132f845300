"""mathrl against TRL on identical work, in one invocation, alternating step by step.

Three pairs (`--algo`):
- grpo: `grpo.py` against TRL 1.16's GRPOTrainer (`beta` 0, the `grpo` loss, per-sequence mean);
- rloo: `reinforce.py --baseline rloo` against TRL 1.16's RLOOTrainer (`beta` 0.05, the k1 KL of
  every response summed into its reward, summed token log-probs, the leave-one-out baseline);
- ppo: `ppo.py` against the PPOTrainer of TRL 1.12, the last release that ships one
  (trl.experimental.ppo; it needs its own environment, `--trl_python`, see below).

Both sides train the embedded SmolLM2-135M-Instruct (the same fp32 safetensors), on the same
arithmetic prompts in the same order, with the same group size, completion length, temperature,
learning rate, batch shape (4 prompts x 8 samples = 32 completions per optimizer step, micro-batches
of 8) and no gradient checkpointing. Each side runs in its own worker process for its whole run (so
"reward after N steps" is one continuous run, and each has its own peak RSS); the parent hands a
baton back and forth so exactly one of them computes at any time, and both see the same machine
state.

    pip install -r requirements-bench.txt
    python bench/trl_vs_mathrl.py --steps 10                 # ~15 min on a 2-core CPU
    python bench/trl_vs_mathrl.py --algo rloo --steps 10
    python -m venv --system-site-packages .venv-trl112 && .venv-trl112/bin/pip install trl==1.12.0
    python bench/trl_vs_mathrl.py --algo ppo --steps 10 --trl_python .venv-trl112/bin/python

On a GPU (`--device cuda`) both sides run there in bf16 autocast over fp32 weights (TRL:
`use_cpu=False, bf16=True`; mathrl: `--bf16`), and a batch of a GPU's size is asked for with
`--num_prompts` and `--max_new_tokens`; `--mathrl_option` gives the mathrl file its own options
(its command-line flags), e.g. its default command on a GPU, micro-batches fitted to memory, or
`--compile`:

    python bench/trl_vs_mathrl.py --device cuda --num_prompts 16 --max_new_tokens 256 --steps 6 \\
        --mathrl_option=--micro_batch_size=fit
    python bench/trl_vs_mathrl.py --device cuda --num_prompts 16 --max_new_tokens 256 --steps 6 \\
        --mathrl_option=--micro_batch_size=fit --mathrl_option=--compile

At a real model's size, on random weights: `--shape 1.5B` builds a model of Qwen2.5-1.5B's shape
offline (bench/memory.py's shapes, the embedded tokenizer) that both sides train, and with it
`--ignore_eos`: random text would end at a random EOS, so both sides draw every token to
--max_new_tokens (TRL through `min_new_tokens`, mathrl with no token counted as an EOS) and do the
same work; `mean_response_len` shows it. `--shape tiny` is the CPU's check of the same path:

    python bench/trl_vs_mathrl.py --device cuda --shape 1.5B --num_prompts 16 --max_new_tokens 256 \
        --steps 4 --mathrl_option=--micro_batch_size=fit

Prints the median step time of each, the ratio mathrl/TRL, each side's peak RSS, and the training
reward of the last steps. `--eval_problems N` also grades both final policies on N held-out problems
with the same greedy evaluator. The mathrl file runs unmodified: the worker only wraps two of its
functions to wait for the baton and to report each step.
"""

import argparse
import importlib
import json
import math
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

MICRO = 8
MATHRL_FILE = {"grpo": "grpo", "rloo": "reinforce", "ppo": "ppo", "online_dpo": "online_dpo"}
TRL_TRAINER = {"grpo": "trl.GRPOTrainer", "rloo": "trl.RLOOTrainer",
               "ppo": "trl.experimental.ppo.PPOTrainer",
               "online_dpo": "trl.experimental.online_dpo.OnlineDPOTrainer"}


def wait_for_baton():
    line = sys.stdin.readline()
    if line.strip() != "go":
        sys.exit(0)
    return time.time()


def report(**row):
    print("BENCH " + json.dumps(row), flush=True)


def trl_prompts(args):
    """The mathrl file's env, from its options (the same system prompt and worked example), and the
    prompts of its updates 0..steps-1 in its order, as (text, index) pairs; TRL is told not to
    shuffle."""
    from common.env import prompt_indices
    from common.env.math_env import make_envs

    env, _ = make_envs(mathrl_args(args))
    num_prompts, g = batch_shape(args.algo, args.num_prompts)
    order = [i for step in range(args.steps)
             for i in prompt_indices(step, num_prompts, len(env), args.seed)]
    return env, [(env.reset(i), i) for i in order]


def trl_worker(args):
    """TRL 1.16's GRPOTrainer, RLOOTrainer or OnlineDPOTrainer: all take reward functions."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

    from common.models.loading import base_model_path

    torch.manual_seed(args.seed)
    env, prompts = trl_prompts(args)
    data = Dataset.from_list([{"prompt": text, "index": i} for text, i in prompts])

    def reward(prompts, completions, index, **kwargs):
        return [env.score(c[0]["content"] if isinstance(c, list) else c,
                          i)[0] for c, i in zip(completions, index)]

    path = base_model_path(args.model_name_or_path)  # a folder both sides load
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    num_prompts, g = batch_shape(args.algo, args.num_prompts)
    shared = trl_options(args)
    if args.algo == "online_dpo":  # its own options: prompts per step, two answers each
        from torch.utils.data import SequentialSampler
        from trl.experimental.online_dpo import OnlineDPOConfig as Config
        from trl.experimental.online_dpo import OnlineDPOTrainer

        class Trainer(OnlineDPOTrainer):  # online_dpo.py's prompt order, not a shuffle
            def _get_train_sampler(self, *a, **kw):
                return SequentialSampler(self.train_dataset)
        for name in ("max_completion_length", "num_generations", "epsilon", "num_iterations",
                     "shuffle_dataset"):
            shared.pop(name)
        shared["gradient_accumulation_steps"] = num_prompts // MICRO  # MICRO prompts a micro-step
        config = Config(**shared, max_new_tokens=args.max_new_tokens, beta=0.1, loss_type="sigmoid")
    elif args.algo == "grpo":
        from trl import GRPOConfig as Config
        from trl import GRPOTrainer as Trainer
        config = Config(**shared, beta=0.0, loss_type="grpo", scale_rewards="group")
    else:  # rloo: k1 KL summed per response, in the reward; summed log-probs; raw advantages
        from trl import RLOOConfig as Config
        from trl import RLOOTrainer as Trainer
        config = Config(**shared, beta=0.05, normalize_advantages=False)

    class Baton(TrainerCallback):
        def on_step_begin(self, *a, **kw):
            self.t0 = wait_for_baton()

        def on_step_end(self, *a, **kw):
            self.seconds = time.time() - self.t0

        def on_log(self, _args, state, control, logs=None, **kw):
            reward = (logs or {}).get("reward", (logs or {}).get("objective/scores"))
            if reward is not None:  # OnlineDPOTrainer logs its mean score as objective/scores
                report(side="trl", step=state.global_step, seconds=self.seconds, reward=reward,
                       response_len=logs.get("completions/mean_length", math.nan))

    trainer = Trainer(model=model, reward_funcs=reward, args=config, train_dataset=data,
                      processing_class=tokenizer, callbacks=[Baton()])
    report(side="trl", ready=True)
    trainer.train()
    if args.eval_problems:
        trainer.model.save_pretrained(args.out + "/trl-final")
        tokenizer.save_pretrained(args.out + "/trl-final")
    report(side="trl", done=True,
           peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def trl_ppo_worker(args):
    """TRL 1.12's PPOTrainer, the last one TRL ships. It takes a reward *model*, read through
    `get_reward` (the backbone's last hidden state, through `.score`, at the last token): the
    verifier is wrapped as such a model, with no weights, that grades the decoded response."""
    import types

    import torch
    from datasets import Dataset
    from torch.utils.data import DataLoader
    from transformers import (AutoModelForCausalLM, AutoModelForSequenceClassification,
                              AutoTokenizer, DataCollatorWithPadding, TrainerCallback)
    from trl.experimental.ppo import PPOConfig, PPOTrainer, ppo_trainer

    from common.models.loading import base_model_path
    from common.models.sampler import encode_prompts

    torch.manual_seed(args.seed)
    env, prompts = trl_prompts(args)
    path = base_model_path(args.model_name_or_path)  # a folder both sides load
    tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    # TRL's PPO takes every pad token for padding (attention masks, where a response ends); the
    # embedded tokenizer pads with EOS, which also closes each chat turn inside the prompt, so it
    # gets <|endoftext|> (in the vocabulary, never in a prompt) as TRL's example gets [PAD].
    tokenizer.pad_token = "<|endoftext|>"
    ids = encode_prompts(tokenizer, [text for text, _ in prompts])
    data = Dataset.from_list([{"input_ids": x} for x in ids])
    table = {tuple(x): i for x, (_, i) in zip(ids, prompts)}
    lengths = sorted({len(x) for x in ids})
    seen = {"tokens": 0, "rows": 0}

    class Verifier(torch.nn.Module):  # what get_reward reads: a backbone and a score head
        base_model_prefix = "backbone"

        def __init__(self):
            super().__init__()
            self.backbone, self.score = self._grade, lambda hidden: hidden

        def _grade(self, input_ids, attention_mask, **kw):
            rows = []
            for tokens, mask in zip(input_ids.tolist(), attention_mask.tolist()):
                tokens = [t for t, m in zip(tokens, mask) if m]  # prompt + response
                n = next(n for n in lengths if tuple(tokens[:n]) in table)
                response = tokens[n:]
                seen["tokens"] += len(response)
                seen["rows"] += 1
                text = tokenizer.decode(response, skip_special_tokens=True)
                rows.append(env.score(text, table[tuple(tokens[:n])])[0])
            score = torch.tensor(rows, dtype=torch.float32)
            # the same score at every position: get_reward reads the last token's
            return types.SimpleNamespace(
                hidden_states=[score[:, None, None].expand(*input_ids.shape, 1)])

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    ref_model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    # the value model: the policy's body and one linear layer, as ppo.py's separate critic
    value_model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1,
                                                                     dtype=torch.float32)
    value_model.config.pad_token_id = tokenizer.pad_token_id
    num_prompts, g = batch_shape(args.algo, args.num_prompts)
    config = PPOConfig(
        output_dir=args.out + "/trl", total_episodes=args.steps * num_prompts * g,
        learning_rate=2e-5, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        per_device_train_batch_size=MICRO, gradient_accumulation_steps=num_prompts * g // MICRO,
        # generation, and the no-grad forwards of the reference and the value model, in one batch
        local_rollout_forward_batch_size=num_prompts * g,
        num_ppo_epochs=1, num_mini_batches=1, response_length=args.max_new_tokens, temperature=0.7,
        stop_token="eos", missing_eos_penalty=None, kl_coef=0.05, kl_estimator="k1",
        cliprange=0.2, cliprange_value=0.2, vf_coef=0.1, gamma=1.0, lam=0.95,
        whiten_rewards=False, num_sample_generations=0, gradient_checkpointing=False,
        bf16=args.device == "cuda", use_cpu=args.device != "cuda", logging_steps=1, report_to=[],
        save_strategy="no", seed=args.seed, dataloader_num_workers=0,
    )
    real_generation = ppo_trainer.batch_generation
    clock = {}

    def batch_generation(*a, **kw):  # the first thing of every step but the data's next batch
        clock["t0"] = wait_for_baton()
        return real_generation(*a, **kw)

    ppo_trainer.batch_generation = batch_generation

    class Baton(TrainerCallback):
        def on_log(self, _args, state, control, logs=None, **kw):
            if logs and "objective/scores" in logs:
                self.logs = logs

        def on_step_end(self, _args, state, control, **kw):
            report(side="trl", step=state.global_step, seconds=time.time() - clock["t0"],
                   reward=self.logs["objective/scores"],
                   response_len=seen["tokens"] / max(1, seen["rows"]))
            seen.update(tokens=0, rows=0)

    collate = DataCollatorWithPadding(tokenizer)
    trainer = PPOTrainer(args=config, processing_class=tokenizer, model=model, ref_model=ref_model,
                         reward_model=Verifier(), train_dataset=data, value_model=value_model,
                         eval_dataset=data, data_collator=collate, callbacks=[Baton()])
    # PPOTrainer shuffles its prompts; the mathrl file's order instead, batch by batch
    trainer.dataloader = trainer.accelerator.prepare(
        DataLoader(data, batch_size=num_prompts * g, shuffle=False, collate_fn=collate,
                   drop_last=True))
    report(side="trl", ready=True)
    trainer.train()
    if args.eval_problems:
        model.save_pretrained(args.out + "/trl-final")
        tokenizer.save_pretrained(args.out + "/trl-final")
    report(side="trl", done=True,
           peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def batch_shape(algo, num_prompts=None):
    """(prompts, samples per prompt) of one update: 32 completions on every pair by default (PPO
    samples each prompt once, as TRL's PPOTrainer does; online DPO twice); num_prompts: more."""
    prompts, g = {"ppo": (32, 1), "online_dpo": (16, 2)}.get(algo, (4, 8))
    return num_prompts or prompts, g


def trl_options(args):
    """The options every TRL trainer here shares (its Config's keyword arguments)."""
    num_prompts, g = batch_shape(args.algo, args.num_prompts)
    cuda = args.device == "cuda"
    return dict(
        output_dir=args.out + "/trl", max_steps=args.steps, learning_rate=2e-5,
        lr_scheduler_type="constant",
        warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0, per_device_train_batch_size=MICRO,
        gradient_accumulation_steps=num_prompts * g // MICRO, num_generations=g,
        max_completion_length=args.max_new_tokens, temperature=0.7, top_p=1.0, epsilon=0.2,
        # num_iterations: TRL's name for num_ppo_epochs (a rename to ours broke this bench once)
        num_iterations=1, shuffle_dataset=False, gradient_checkpointing=False,
        # a GPU: bf16 autocast over fp32 weights, as mathrl's --bf16
        bf16=cuda, use_cpu=not cuda,
        logging_steps=1, report_to=[], save_strategy="no", seed=args.seed, dataloader_num_workers=0,
        # --ignore_eos: transformers' MinNewTokensLengthLogitsProcessor masks the EOS until the end
        **({"generation_kwargs": {"min_new_tokens": args.max_new_tokens}}
           if getattr(args, "ignore_eos", False) else {}),
    )


def mathrl_args(args):
    """The mathrl file's options in this bench; the TRL side builds its env from them too."""
    num_prompts, g = batch_shape(args.algo, args.num_prompts)
    shared = dict(max_steps=args.steps, num_prompts=num_prompts, num_generations=g,
                  micro_batch_size=MICRO, max_new_tokens=args.max_new_tokens, temperature=0.7,
                  learning_rate=2e-5, seed=args.seed, num_eval_problems=0,
                  log_interval=10**9, output_dir=args.out + "/mathrl",
                  bf16=args.device == "cuda", model_name_or_path=args.model_name_or_path)
    module = importlib.import_module(MATHRL_FILE[args.algo])
    if args.algo == "rloo":  # TRL's RLOO: KL in the reward (k1, summed), log-probs summed
        shared.update(baseline="rloo", beta=0.05, kl_estimator="k1", kl_penalty="reward",
                      length_normalize=False)
    if args.algo == "online_dpo":  # TRL's rule for ties (the first answer is chosen), beta 0.1,
        # micro-batches of 8 pairs as TRL's 8 prompts per device and step
        shared.update(beta=0.1, preference_loss="sigmoid", ties="first", missing_eos_penalty=0.0)
    if args.algo == "ppo":  # TRL's PPOTrainer: one optimizer (one learning rate), a linear value
        # head on a copy of the policy, k1 KL in the reward, GAE lambda 0.95, whitened advantages
        shared.update(critic_learning_rate=2e-5, critic_type="separate", critic_num_layers=0,
                      num_ppo_epochs=1, num_mini_batches=1, beta=0.05, kl_estimator="k1",
                      kl_penalty="reward", loss_type="dapo", cliprange_value=0.2, vf_coef=0.1,
                      gamma=1.0, gae_lambda=0.95, whiten_advantages=True, whiten_rewards=False,
                      missing_eos_penalty=0.0)
    return apply_options(module, module.Args(**shared), args.mathrl_option)


def apply_options(module, base, options):
    """`base` with the mathrl file's own command-line flags `options` on top (["--compile",
    "--micro_batch_size=fit"]); --micro_batch_size=fit leaves it unset, as the file's default
    command does (on a GPU: fitted to its memory)."""
    from dataclasses import replace

    from common.run.args import parse_args

    options = list(options or ())
    fit = "--micro_batch_size=fit" in options
    options = [o for o in options if o != "--micro_batch_size=fit"]
    given = parse_args(module.Args, options)
    flags = {o.split("=")[0].lstrip("-").replace("-", "_") for o in options if o.startswith("--")}
    # --no_X sets the field X (--no_cuda_graphs)
    flags = {f[3:] if f.startswith("no_") and hasattr(given, f[3:]) else f for f in flags}
    changed = {name: getattr(given, name) for name in flags if hasattr(given, name)}
    changed.update(micro_batch_size=None) if fit else None
    return replace(base, **changed)


def mathrl_worker(args):
    from common.run.logger import Logger

    module = importlib.import_module(MATHRL_FILE[args.algo])
    real_rollout, real_log = module.rollout, Logger.log
    clock = {}

    def rollout(*a, **kw):
        clock["t0"] = wait_for_baton()
        return real_rollout(*a, **kw)

    def log(self, step, metrics):
        real_log(self, step, metrics)
        report(side="mathrl", step=step, seconds=time.time() - clock["t0"],
               reward=metrics["reward/mean"],
               response_len=metrics["response_len/mean"], update_s=metrics["time/update_s"])

    module.rollout, Logger.log = rollout, log
    if args.ignore_eos:  # generate then stops no row early: no token is an EOS
        import common.models.sampler as sampler

        sampler.eos_token_ids = lambda model, tokenizer: [-1]
    report(side="mathrl", ready=True)
    module.main(mathrl_args(args))
    report(side="mathrl", done=True,
           peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def check_trl(python, algo):
    """One clear error, before any model loads, when the TRL side's Python lacks the trainer."""
    trainer = TRL_TRAINER[algo]
    probe = subprocess.run([python, "-c", f"import trl, {trainer.rsplit('.', 1)[0]} as m; "
                            f"print(trl.__version__, hasattr(m, '{trainer.rsplit('.', 1)[1]}'))"],
                           capture_output=True, text=True)
    version, found = (probe.stdout.split() + ["", ""])[:2]
    if probe.returncode != 0 or found != "True":
        fix = ("pip install -r requirements-bench.txt" if algo != "ppo" else
               "python -m venv --system-site-packages .venv-trl112 && "
               ".venv-trl112/bin/pip install trl==1.12.0, then --trl_python .venv-trl112/bin/python")
        sys.exit(f"--algo {algo} needs TRL's {trainer} in {python} (found TRL "
                 f"{version or 'not installed'}): {fix}")
    print(f"{MATHRL_FILE[algo]}.py against TRL {version}'s {trainer}", flush=True)


def read_report(proc):
    for line in proc.stdout:
        if line.startswith("BENCH "):
            return json.loads(line[6:])
    raise RuntimeError(f"worker exited early (code {proc.wait()}); run it alone to see its error")


def random_model(shape, out, device):
    """A random-weight model of a Qwen2.5 shape (bench/memory.py's, "tiny" for a CPU check), built
    here offline with the embedded tokenizer, in a folder both sides load. -> its path"""
    import torch

    from bench.memory import build

    folder = Path(out) / f"random-{shape}"
    if not (folder / "config.json").exists():
        # drawn on the GPU (seconds for 1.5B) and saved in bf16 (half the disk); both sides load
        # it in fp32
        build(shape, folder, torch.bfloat16, device)
    return str(folder)


def main(args):
    check_trl(args.trl_python, args.algo)
    out = args.out or tempfile.mkdtemp(prefix="bench-trl-")
    if args.shape:  # random weights: the text means nothing, so both sides draw every token
        args.model_name_or_path = random_model(args.shape, out, args.device)
        args.ignore_eos = True
        print(f"a random-weight model of the {args.shape} shape: {args.model_name_or_path}; "
              f"every response {args.max_new_tokens} tokens", flush=True)
    workers = {}
    for side in ("trl", "mathrl"):
        python = args.trl_python if side == "trl" else sys.executable
        cmd = [python, __file__, "--worker", side, "--algo", args.algo, "--steps", str(args.steps),
               "--seed", str(args.seed), "--out", out, "--eval_problems", str(args.eval_problems),
               "--device", args.device, "--max_new_tokens", str(args.max_new_tokens),
               "--model_name_or_path", args.model_name_or_path,
               *(["--ignore_eos"] if args.ignore_eos else []),
               *(["--num_prompts", str(args.num_prompts)] if args.num_prompts else []),
               *[f"--mathrl_option={o}" for o in args.mathrl_option]]
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
    from common.env.math_env import make_env
    from common.run.evaluation import evaluate
    from common.models.loading import load_policy, load_tokenizer

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
    p.add_argument("--algo", choices=sorted(MATHRL_FILE), default="grpo",
                   help="grpo: grpo.py vs GRPOTrainer; rloo: reinforce.py --baseline rloo vs "
                        "RLOOTrainer; ppo: ppo.py vs TRL 1.12's PPOTrainer")
    p.add_argument("--trl_python", default=sys.executable,
                   help="the Python whose TRL runs the TRL side (--algo ppo: one with TRL 1.12)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="cuda: both sides on the GPU, in bf16 autocast over fp32 weights")
    p.add_argument("--num_prompts", type=int, default=None,
                   help="prompts per step (default: 4 x 8 samples; 32 for ppo; 16 x 2, online_dpo)")
    p.add_argument("--max_new_tokens", type=int, default=64, help="completion length limit")
    p.add_argument("--model_name_or_path", default="SmolLM2-135M-Instruct",
                   help="the policy both sides train (tiny-random: a check that the bench runs)")
    p.add_argument("--mathrl_option", action="append", default=[],
                   help="a flag of the mathrl file, repeated: --mathrl_option=--compile; "
                        "--mathrl_option=--micro_batch_size=fit leaves the micro-batch to the file")
    p.add_argument("--shape", default=None, choices=["tiny", "0.5B", "1.5B", "3B", "7B"],
                   help="both sides train a random-weight model of this Qwen2.5 shape, built "
                        "offline (bench/memory.py's), with --ignore_eos (tiny: a CPU check)")
    p.add_argument("--ignore_eos", action="store_true",
                   help="no EOS ends a response: both sides draw --max_new_tokens tokens for "
                        "every one (TRL: min_new_tokens; mathrl: no token counts as an EOS)")
    p.add_argument("--worker", choices=["trl", "mathrl"], help=argparse.SUPPRESS)
    a = p.parse_args()
    if (a.shape or a.ignore_eos) and a.algo == "ppo":  # PPOConfig takes no generation_kwargs
        p.error("--shape and --ignore_eos: not with --algo ppo")
    if a.worker == "trl":
        (trl_ppo_worker if a.algo == "ppo" else trl_worker)(a)
    elif a.worker == "mathrl":
        mathrl_worker(a)
    else:
        main(a)
