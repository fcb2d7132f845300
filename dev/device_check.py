"""Everything a short GPU lease should measure, as one script with a time budget per stage.

    python dev/device_check.py --out DIR                         # a GPU: the real sizes
    python dev/device_check.py --out DIR --tiny                  # a CPU: tiny sizes, ~2 min
    python dev/device_check.py --out DIR --stages env roofline --budget_s 200

dev/notes/gpu.md has the two calls that carry the embedded model to a lent GPU and run this.

A GPU is lent to this project only sometimes, for 15 minutes in all, so a device check cannot be
written on the spot: this script is, and a test runs it with --tiny on a CPU so that it still works
when a GPU comes. The stages (STAGES runs them by value: env, the three at the sizes people train,
cuda_graphs, model, trl_pair, grpo, fsdp_rollout, async_one_gpu, then the rest in this list's
order), each one a process of its own, stopped at its time cap or at the end of --budget_s,
whichever is first; a stage that fails or runs out of time does not stop the next:

- env: the device, its memory, the versions of torch and transformers;
- roofline_shapes, trl_pair_1.5B, memory_table: at Qwen2.5's shapes on random weights (no model
  file). dev/lab/roofline.py at 1.5B, 7B and 0.5B, 64 and 256 rows, 512 new tokens, decoding as
  the files do on a GPU (the step a CUDA graph) for every shape first, then eager, then compiled,
  each against the HBM-bound (120 s: what fits); bench/trl_vs_mathrl.py --shape 1.5B, both sides
  drawing every token to the budget (16 prompts x 8 samples, 256 tokens, 4 steps; 150 s);
  bench/memory.py gpu, the peak memory of 2 updates of grpo.py in six configurations (the
  defaults, --bf16, --gradient_checkpointing, --lora_r 16, --fsdp, --bf16 --offload_optimizer) at
  1.5B, 0.5B, 3B and 7B, each run capped at 24 and at 80 GiB, out of memory a row (150 s: the 1.5B
  shape under 24 GiB first);
- fsdp_rollout: grpo.py's default command under --fsdp (torchrun, one process) against the same
  without it, 4 updates each, the ratio of the median time/rollout_s after the first (90 s);
- async_one_gpu: `torchrun --nproc_per_node 2 async_grpo.py` on the one GPU against grpo.py, at 16
  prompts x 8 samples x 256 tokens, 5 updates each, the ratio of the median seconds an update after
  the first (100 s);
- model: the embedded SmolLM2-135M converted once from its GGUF (see dev/carry.py);
- cuda_graphs: dev/lab/cuda_graphs.py, eager decoding against its step captured as a CUDA graph (the
  default on a GPU) at 32 and 128 rows, and the checks that the graph draws the tokens of the
  same step run without one, also after the weights change (random weights: no model file);
- trl_pair, trl_pair_eager, trl_pair_compile: bench/trl_vs_mathrl.py --device cuda at a GPU's
  batch (16 prompts x 8 samples, 256 new tokens, 10 steps), grpo.py's default command
  (micro-batches fitted to memory, the decode step a CUDA graph) against TRL's GRPOTrainer, then
  with --no_cuda_graphs and with --compile (TRL's wheels come in dev/carry.py's first piece);
- grpo, grpo_compile: `python grpo.py --bf16` for 20 updates, as it is and --compile, held-out
  accuracy at updates 0, 10 and 20;
- two_processes, fsdp, lora, gradient_checkpointing, plain: grpo.py for 3 updates under `torchrun
  --nproc_per_node 2` on the one GPU, under --fsdp (one process), with --lora_r 16, with
  --gradient_checkpointing, on the plain path (--plain: the plain Decoder, token_logprobs' own
  lines);
- grpo_big: a GPU-sized batch (64 prompts x 8 samples, 256 new tokens), 3 updates;
- the other algorithm files (dapo.py among them): 5 updates each in bf16;
- eval: eval.py on the newest checkpoint a stage wrote (the embedded model without one);
- gsm8k_curve: bench/gsm8k_curve.py at a GPU's batch (16 prompts x 8 samples, 40 updates), all
  1,319 GSM8K test problems at updates 0, 20 and 40, greedy and avg@4; GSM8K's files travel with
  the model's second piece (dev/carry.py), found by --data_dir;
- cold_start: bench/cold_start.py at a GPU's batch: sft.py for 60 updates of 64 worked solutions,
  then grpo.py from its checkpoint for 40 updates of 16 prompts x 8 samples, all 1,319 test
  problems at the start, after SFT and after RL;
- fused_projections, roofline, roofline_grow, update_mfu: dev/lab/fused_projections.py (64 and 256
  rows), dev/lab/roofline.py, the same with a static cache that grows, and dev/lab/update_mfu.py, at
  the Qwen2.5-1.5B shape on random weights (no model file needed).
The order is by value: a lease cut short still returns the stages that matter most. With --tiny no
stage has a time cap (a slow CPU must not fail the test that runs it); --budget_s still bounds the
whole.

For each training stage: seconds per update for the rollout and the update (the first update apart,
since it holds compiling and warm-up, then the median of the rest; the whole update's from the
log's clock), sampled tokens per second, the held-out accuracies, peak GPU memory (torch's
allocator; peak RSS on a CPU), whether every logged number is finite, and whether the last
checkpoint loads with from_pretrained and holds finite weights. Written to DIR/device_check.json
after every stage (so a lease cut short still returns the stages done), all the logs to
DIR/logs.txt, and a table printed at the end, with the ratios of the compared stages and the tables
of memory_table and roofline_shapes under it.
"""

import argparse
import json
import math
import os
import resource
import runpy
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dev.algorithms import ALGORITHMS, STEPWISE  # noqa: E402
# every algorithm file but grpo.py, 5 updates each; the stepwise ones first (they ran the least)
FILES = sorted((a for a in ALGORITHMS if a != "grpo"), key=lambda a: a not in STEPWISE)
# grpo.py for 3 updates each way a GPU run can be launched besides the default
WAYS = ["two_processes", "fsdp", "lora", "gradient_checkpointing", "plain"]
# dev/lab/<name>.py on random weights; roofline_grow: roofline.py with a growing static cache;
# roofline_shapes: roofline.py at Qwen2.5's shapes, the files' decoding against eager and compiled
BENCHES = ["cuda_graphs", "roofline_shapes", "fused_projections", "roofline", "roofline_grow",
           "update_mfu"]
TRL_PAIRS = ["trl_pair", "trl_pair_eager", "trl_pair_compile", "trl_pair_1.5B"]
# two runs in one stage, one after the other, and the figure the ratio of the first's median to the
# second's: (the figure read_run gives, the first run's folder, the second's)
COMPARED = {"fsdp_rollout": ("time/rollout_s", "fsdp", "without"),
            "async_one_gpu": ("s per update", "async_two_processes", "grpo")}
# at the sizes people train, on random weights (no model file): before the model's stage
SIZES = ["roofline_shapes", "trl_pair_1.5B", "memory_table"]
STAGES = ["env", *SIZES, "cuda_graphs", "model", "trl_pair", "grpo", *COMPARED, *TRL_PAIRS[1:3],
          *WAYS, "grpo_compile", "grpo_big", *FILES, "eval", "gsm8k_curve", "cold_start",
          *(b for b in BENCHES if b not in ("cuda_graphs", "roofline_shapes"))]
# GSM8K's train and test files for the gsm8k_curve stage: ../shared/data here, and on a lent GPU
# the copy dev/carry.py puts beside the model's second piece (--data_dir)
DATA_DIRS = [ROOT.parent / "shared" / "data", ROOT / ".dev" / "b" / "data"]


def stage_plan(name, tiny, work, data_dir=None):
    """(command, time cap in seconds) of a stage; the command is None for the in-process ones.
    With `tiny` the cap is infinite: a CPU's speed is not what the tiny run checks. data_dir:
    GSM8K's files, for gsm8k_curve."""
    command, cap = _stage_plan(name, tiny, work, data_dir)
    return command, math.inf if tiny else cap


def _stage_plan(name, tiny, work, data_dir=None):
    py = [sys.executable]
    if name == "gsm8k_curve":  # bench/gsm8k_curve.py at a GPU's batch, all 1,319 test problems
        sizes = (["--tiny"] if tiny else
                 ["--updates", "40", "--eval_interval", "20", "--test_problems", "1319",
                  "--num_prompts", "16", "--num_generations", "8", "--eval_samples", "4",
                  *(["--data_dir", str(data_dir)] if data_dir else []),
                  "--", "--bf16", "--eval_batch_size", "256"])
        # estimated from grpo.py's ~1.5 s an update at this batch and ~60 s an evaluation of the
        # 1,319 problems, greedy and 4 samples, in 256-row batches: about 4.5 min
        return py + [str(ROOT / "bench" / "gsm8k_curve.py"), "--out", str(work / name),
                     *sizes], 360
    if name == "cold_start":  # bench/cold_start.py at a GPU's batch, all 1,319 test problems
        sizes = (["--tiny"] if tiny else
                 ["--sft_updates", "60", "--sft_batch", "64", "--rl_updates", "40",
                  "--test_problems", "1319", "--num_prompts", "16", "--num_generations", "8",
                  "--eval_samples", "4", *(["--data_dir", str(data_dir)] if data_dir else []),
                  "--", "--bf16", "--eval_batch_size", "256"])
        # estimated from gsm8k_curve's: three evaluations of ~60 s, 40 RL updates of ~1.5 s,
        # and 60 SFT updates of 64 solutions at well under a second each: about 5 min
        return py + [str(ROOT / "bench" / "cold_start.py"), "--out", str(work / name),
                     *sizes], 420
    if name in ("env", "model"):
        return None, 120
    if name in TRL_PAIRS:  # bench/trl_vs_mathrl.py, both sides in bf16 on the GPU
        sizes = (["--device", "cpu", "--model_name_or_path", "tiny-random", "--num_prompts", "1",
                  "--max_new_tokens", "8", "--steps", "2"] if tiny else
                 ["--device", "cuda", "--num_prompts", "16", "--max_new_tokens", "256",
                  "--steps", "10"])
        options = ["--mathrl_option=--micro_batch_size=fit"]  # grpo.py's default command
        if name == "trl_pair_1.5B":  # random weights of Qwen2.5-1.5B's shape, every token drawn
            # (--shape's --ignore_eos); estimated ~12 s a TRL step and ~5 s a mathrl one at this
            # shape, and ~40 s to build, save and load the model: 4 steps fit ~2.5 min
            sizes = (["--device", "cpu", "--shape", "tiny", "--num_prompts", "1",
                      "--max_new_tokens", "8", "--steps", "2"] if tiny else
                     ["--device", "cuda", "--shape", "1.5B", "--num_prompts", "16",
                      "--max_new_tokens", "256", "--steps", "4"])
            return py + [str(ROOT / "bench" / "trl_vs_mathrl.py"), *sizes, *options,
                         "--out", str(work / name)], 150
        if name != "trl_pair":  # the default captures its decode step as a CUDA graph
            options.append("--mathrl_option=" + {"trl_pair_eager": "--no_cuda_graphs",
                                                 "trl_pair_compile": "--compile"}[name])
        # the H200's second lease: 117, 103 and 133 s for 6 steps (two of them warm-up) and two
        # model loads; 10 steps, so that the warm-up weighs less in the median
        return py + [str(ROOT / "bench" / "trl_vs_mathrl.py"), *sizes, *options,
                     "--out", str(work / name)], 200
    if name == "eval":  # the newest checkpoint of a stage before, or the embedded model
        found = sorted(work.glob("*/checkpoint-*/config.json"), key=lambda p: p.stat().st_mtime)
        model = str(found[-1].parent) if found else ("tiny-random" if tiny else
                                                     "SmolLM2-135M-Instruct")
        return py + [str(ROOT / "eval.py"), "--model_name_or_path", model, "--bf16",
                     "--num_eval_problems", "8" if tiny else "200", "--output",
                     str(work / "eval" / "eval.jsonl")], 90
    if name == "memory_table":  # bench/memory.py gpu: a row per run, as it ends
        # tiny: the capped launcher once, in fp32 (a CPU's bf16 is slow; --offload_optimizer's
        # update is tests/test_bf16.py's and tests/test_offload.py's, --fsdp's torchrun is
        # fsdp_rollout's)
        sizes = (["--shapes", "tiny", "--configs", "default",
                  "--updates", "1", *(f"--grpo_option=--{k}={v}" for k, v in
                                      (("num_prompts", 2), ("num_generations", 2),
                                       ("max_new_tokens", 8)))] if tiny else [])
        # ~20 s a run at 1.5B (a process, the model's load, 2 updates): the cap holds the 1.5B
        # shape under 24 GiB in all six configurations, then what it reaches of the rest
        return py + [str(ROOT / "bench" / "memory.py"), "gpu", *sizes, "--out",
                     str(work / name)], 150
    if name in COMPARED:
        return compared_plan(name, tiny, work)
    if name in BENCHES:
        if name == "roofline_shapes":  # the files' default decoding first, at every shape
            sizes = (["--shapes", "tiny", "--batch", "8", "--new_tokens", "8", "--prompt_len",
                      "16", "--modes", "default", "eager"] if tiny else
                     ["--shapes", "1.5B", "7B", "0.5B", "--batch", "64", "256", "--new_tokens",
                      "512", "--modes", "default", "eager", "compile"])
            # estimated: the default's 12 rows in ~60 s (two rollouts of 512 steps of 3-12 ms
            # each), then eager's 1.5B rows (~25 s each); compiled rows only past the cap
            return py + [str(ROOT / "dev" / "lab" / "roofline.py"), *sizes, "--rollout_only",
                         "--bf16"], 120
        if name == "cuda_graphs":  # on random weights, so before the model's second piece
            sizes = (["--device", "cpu", "--shape", "tiny", "--rows", "8", "--new_tokens", "8",
                      "--repeat", "1"] if tiny else ["--repeat", "1"])
            return py + [str(ROOT / "dev" / "lab" / "cuda_graphs.py"), *sizes, "--out",
                         str(work / "cuda_graphs.json")], 200  # 120 s did 32 rows, not 128
        if name == "roofline":
            sizes = (["--shapes", "tiny", "--batch", "8", "--new_tokens", "8", "--prompt_len",
                      "16"] if tiny else
                     ["--shapes", "1.5B", "--batch", "64", "256", "--new_tokens", "512",
                      "--compile"])
        elif name == "roofline_grow":  # against the roofline stage's row of 64
            sizes = (["--shapes", "tiny", "--batch", "8", "--new_tokens", "8", "--prompt_len",
                      "16"] if tiny else
                     ["--shapes", "1.5B", "--batch", "64", "--new_tokens", "512"])
            sizes += ["--compile", "--rollout_only", "--grow_static_cache"]
        elif name == "fused_projections":  # eager decoding, q/k/v and gate/up fused or not
            sizes = (["--shape", "tiny", "--batch", "8", "--new_tokens", "8", "--repeat", "1"]
                     if tiny else ["--shape", "1.5B", "--batch", "64", "256", "--repeat", "3"])
        else:
            sizes = (["--shape", "tiny", "--micro_batch_size", "8", "--prompt_len", "16",
                      "--response_len", "16"] if tiny else
                     ["--shape", "1.5B", "--micro_batch_size", "8", "16", "32"])
        script = "roofline" if name == "roofline_grow" else name
        return py + [str(ROOT / "dev" / "lab" / f"{script}.py"), *sizes, "--bf16"], 200
    file = "grpo" if name.startswith("grpo") or name in WAYS else name
    run = ["--bf16", "--output_dir", str(work / name)]
    if tiny and name in WAYS:  # that the launch works, at the least work
        run += ["--model_name_or_path", "tiny-random", "--num_eval_problems", "2",
                "--num_prompts", "2", "--num_generations", "2", "--max_new_tokens", "8"]
    elif tiny:  # bf16 on a CPU is slow: small batches (grpo_big sets its own below)
        run += ["--model_name_or_path", "tiny-random", "--num_eval_problems", "8",
                "--max_new_tokens", "8"]
        run += (["--num_envs", "2"] if name in ("appo", "tppo") else
                # sft.py samples nothing; tiny-random spells a worked line in up to 22 tokens
                ["--num_prompts", "2", "--max_new_tokens", "24"] if name == "sft" else
                ["--num_prompts", "2", "--num_generations", "2"])
    if name in WAYS:
        run += ["--max_steps", "1" if tiny else "3", "--no_eval_on_start"]
        run += {"fsdp": ["--fsdp"], "lora": ["--lora_r", "16"],
                "gradient_checkpointing": ["--gradient_checkpointing"],
                "plain": ["--plain"]}.get(name, [])
        if not tiny:
            run += ["--num_eval_problems", "64"]
        if name in ("two_processes", "fsdp"):  # torchrun: ranks on the one device
            launch = py + ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                           "2" if name == "two_processes" else "1", str(ROOT / "grpo.py")]
            return launch + run, 120
        child = [str(ROOT / "dev" / "device_check.py"), "--child", str(work / f"{name}.child.json"),
                 "--", str(ROOT / "grpo.py")]
        return py + child + run, 90
    if name.startswith("grpo"):
        steps, interval = (2, 1) if tiny else ((3, 3) if name == "grpo_big" else (20, 10))
        run += ["--max_steps", str(steps), "--eval_interval", str(interval)]
        if name == "grpo_compile":
            run += ["--compile"]
        if name == "grpo_big":
            run += (["--num_prompts", "4", "--num_generations", "4", "--max_new_tokens", "16"]
                    if tiny else
                    ["--num_prompts", "64", "--num_generations", "8", "--max_new_tokens", "256"])
        # caps from the H100 run of 2026-11-27 (92, 140 and ~25 s an update), with some room
        cap = {"grpo": 120, "grpo_compile": 170, "grpo_big": 110}[name]
    else:
        # these show that each file trains and saves in bf16 on the device: no learning curve,
        # so no evaluation before the first update and a small one after the last
        run += ["--max_steps", "2" if tiny else "5", "--no_eval_on_start"]
        if not tiny:
            run += ["--num_eval_problems", "64"]
        if name == "distill":  # the teacher: the grpo stage's last checkpoint, or the student
            found = sorted((work / "grpo").glob("checkpoint-*/config.json"),
                           key=lambda p: p.stat().st_mtime)
            run += ["--teacher_model_name_or_path", str(found[-1].parent) if found else
                    "tiny-random" if tiny else "SmolLM2-135M-Instruct"]
        cap = 60
    child = [str(ROOT / "dev" / "device_check.py"), "--child", str(work / f"{name}.child.json"),
             "--", str(ROOT / f"{file}.py")]
    return py + child + run, cap


def compared_plan(name, tiny, work):
    """A COMPARED stage: two runs, one after the other, in one shell (so the stage's cap bounds
    both). fsdp_rollout: grpo.py's default batch under --fsdp (torchrun, one process; its rollout
    decodes through the captured step of an unsharded twin, not yet timed on a GPU) against the
    same command without it, 4 updates each; async_one_gpu:
    async_grpo.py under torchrun with two processes on the one GPU (rank 0 trains, rank 1 samples)
    against grpo.py, at 16 prompts x 8 samples x 256 tokens, 5 updates each."""
    py = [sys.executable]
    torchrun = py + ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node"]
    common = ["--num_eval_problems", "0", "--no_eval_on_start"]
    if tiny:  # fp32: bf16's matmuls are slow on a CPU, and the launches are what is checked
        common += ["--model_name_or_path", "tiny-random", "--num_prompts", "2",
                   "--num_generations", "2", "--max_new_tokens", "8", "--max_steps", "2"]
    elif name == "async_one_gpu":
        common += ["--num_prompts", "16", "--num_generations", "8", "--max_new_tokens", "256",
                   "--max_steps", "5"]
    else:
        common += ["--max_steps", "4"]
    common = common if tiny else ["--bf16", *common]
    _, first, second = COMPARED[name]
    if name == "fsdp_rollout":
        runs = [torchrun + ["1", str(ROOT / "grpo.py"), "--fsdp"], py + [str(ROOT / "grpo.py")]]
        # estimated from the second lease (--fsdp 1.39 s a rollout when it decoded eagerly, the
        # default 0.28 s, ~20 s to start a run): ~70 s
        cap = 90
    else:
        runs = [torchrun + ["2", str(ROOT / "async_grpo.py")], py + [str(ROOT / "grpo.py")]]
        # grpo.py ~1.1 s an update at this batch (the TRL pair's), ~25 s to start each run
        cap = 100
    a, b = (shlex.join(run + common + ["--output_dir", str(work / name / folder)])
            for run, folder in zip(runs, (first, second)))
    # both run whatever the first does; the stage fails if either does
    return ["sh", "-c", f"{a}; a=$?; {b}; b=$?; [ $a -eq 0 ] && exit $b; exit $a"], cap


# ----------------------------------------------------------------------------------------------
# in the child process: run an algorithm file as `python X.py ...` would, then read its peak
# memory and load its last checkpoint


def peak_memory_gib():
    import torch

    if torch.cuda.is_available():
        return {"peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30,
                "peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30}
    return {"peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}


def load_last_checkpoint(output_dir):
    """{checkpoint, loads, finite} for the newest checkpoint-N in output_dir."""
    import torch
    from transformers import AutoModelForCausalLM

    from common.run.checkpoints import checkpoints

    found = checkpoints(output_dir)  # newest first
    if not found:
        return {"checkpoint": None, "loads": False}
    model = AutoModelForCausalLM.from_pretrained(str(found[0]))
    finite = all(bool(torch.isfinite(p).all()) for p in model.parameters())
    return {"checkpoint": found[0].name, "loads": True, "finite": finite}


def child(out_json, argv):
    sys.argv = argv
    sys.path.insert(0, str(ROOT))
    result = {}
    try:
        runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as e:  # an algorithm file's own error exit: keep it, and stop here
        if e.code not in (None, 0):
            result["exit"] = str(e.code)
    result.update(peak_memory_gib())
    if "exit" not in result:
        output_dir = argv[argv.index("--output_dir") + 1]
        result.update(load_last_checkpoint(output_dir))
    Path(out_json).write_text(json.dumps(result))


# ----------------------------------------------------------------------------------------------
# in the parent: each stage's figures


def env_stage(tiny):
    import platform

    import torch
    import transformers

    info = {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "cuda": torch.cuda.is_available()}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(device=props.name, memory_gib=props.total_memory / 2**30,
                    multiprocessors=props.multi_processor_count)
    else:
        info.update(device=f"CPU, {os.cpu_count()} cores")
    return info


def model_stage(tiny):
    """The embedded model, converted here once, so that the first training stage is not charged
    for it."""
    from common.models.loading import embedded_model_dir, embedded_tokenizer_dir

    folder = embedded_tokenizer_dir() if tiny else embedded_model_dir()
    return {"folder": str(folder), "files": sorted(p.name for p in folder.iterdir())}


def finite(x):
    """Whether a logged value is finite: the logs write NaN and inf as null (common.run.logger)."""
    return x is not None and (not isinstance(x, float) or math.isfinite(x))


def read_run(folder, child_json):
    """The figures of a training stage from its metrics.jsonl, eval.jsonl and the child's JSON."""
    figures = {}
    metrics_file, eval_file = Path(folder) / "metrics.jsonl", Path(folder) / "eval.jsonl"
    rows = ([json.loads(line) for line in metrics_file.read_text().splitlines()]
            if metrics_file.exists() else [])
    if rows:
        figures["updates"] = len(rows)
        first, rest = rows[0], rows[1:] or rows[:1]
        for key in ("time/rollout_s", "time/update_s", "tokens_per_s"):
            if key in first:
                figures[f"first {key}"] = first[key]
                figures[f"median {key}"] = statistics.median(r[key] for r in rest)
        if len(rows) > 1 and "time" in first:  # the log's clock: each update after the first
            figures["median s per update"] = statistics.median(
                b["time"] - a["time"] for a, b in zip(rows, rows[1:]))
        figures["nonfinite"] = sorted({k for r in rows for k, v in r.items() if not finite(v)})
        figures["last"] = {k: v for k, v in rows[-1].items()
                           if "loss" in k or k in ("reward/mean", "accuracy", "grad_norm")}
    if eval_file.exists():
        figures["eval"] = {json.loads(line)["step"]: json.loads(line)["eval/accuracy"]
                           for line in eval_file.read_text().splitlines()}
    if Path(child_json).exists():
        figures.update(json.loads(Path(child_json).read_text()))
    return figures


def figures_of(name, lines, work):
    """What a stage's process left: a bench's table lines, a TRL pair's summary, eval.py's
    accuracy, or a training run's figures (a torchrun stage's checkpoint is loaded here)."""
    if name in BENCHES:
        marker = "side by side (shape, rows, new tokens, then mode):"  # roofline.py's end
        if marker in lines:  # the table once, in its final order, not its rows as they came
            end = lines.index(marker)
            lines = [line for line in lines[:end] if not line.startswith("|")] + lines[end + 1:]
        return {"table": [line for line in lines if line.startswith(("|", "(the first", "(on a"))
                          or "GB/s" in line or "peak" in line or "fused / separate" in line]}
    if name == "memory_table":
        path = work / name / "rows.jsonl"
        rows = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
        return {"rows": rows, "table": [line for line in lines if line.startswith("|")]}
    if name in COMPARED:
        key, first, second = COMPARED[name]
        runs = {run: read_run(work / name / run, work / name / "none") for run in (first, second)}
        a, b = (runs[run].get(f"median {key}") for run in (first, second))
        figures = {"runs": runs}
        if a and b:
            figures["ratio"] = a / b
            figures["line"] = f"median {key}: {first} {a:.2f} / {second} {b:.2f} = {a / b:.2f}"
        return figures
    if name in TRL_PAIRS:
        path = work / name / "summary.json"
        summary = json.loads(path.read_text()) if path.exists() else {}
        summary.pop("rows", None)
        # a pair cut at its cap writes no summary: its steps as they came are then the figures
        steps = [] if summary else [line for line in lines if line.startswith("step ")]
        return {**summary, "line": [line for line in lines if line.startswith("median step")],
                **({"steps": steps} if steps else {})}
    if name == "eval":
        return {"lines": [line for line in lines if line.startswith(("accuracy", "pass@"))]}
    if name == "gsm8k_curve":  # the curve's table and the reading of its samples
        path = work / name / "curve.json"
        return json.loads(path.read_text()) if path.exists() else {}
    if name == "cold_start":  # the three stages' evaluations and the reading of the samples
        path = work / name / "cold_start.json"
        return json.loads(path.read_text()) if path.exists() else {}
    figures = read_run(work / name, work / f"{name}.child.json")
    if name in ("two_processes", "fsdp") and "updates" in figures:  # no child to load it
        figures.update(load_last_checkpoint(work / name))
    return figures


def run_process(cmd, timeout, why, log):
    """Run cmd in its own process group, its output appended to `log` (tqdm's carriage-return
    redraws kept to their last state); stop the whole group at `timeout`. -> (status, lines)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TQDM_MININTERVAL": "5"}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=None if math.isinf(timeout) else timeout)
        status = "ok" if proc.returncode == 0 else f"failed (exit {proc.returncode})"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        status = f"stopped at {why} ({timeout:.0f} s)"
    text = out.decode(errors="replace")
    lines = [line.split("\r")[-1] for line in text.splitlines()]
    log.write("\n".join(lines) + "\n")
    return status, lines


def summary(results):
    head = ("| stage | status | s | eval accuracy | rollout s | update s | tokens/s | peak GiB "
            "| checkpoint |")
    table = [head, "|" + "---|" * 9]
    for name, r in results.items():
        f = r.get("figures", {})
        acc = " / ".join(f"{v:.3f}" for v in f.get("eval", {}).values()) or "-"
        mem = f.get("peak_allocated_gib", f.get("peak_rss_gib"))
        ckpt = ("loads" + ("" if f.get("finite") else ", NOT finite")) if f.get("loads") else "-"

        def num(key, fmt):
            return format(f[key], fmt) if key in f else "-"

        table.append(f"| {name} | {r['status']} | {r['seconds']:.0f} | {acc} | "
                     f"{num('median time/rollout_s', '.2f')} | "
                     f"{num('median time/update_s', '.2f')} "
                     f"| {num('median tokens_per_s', '.0f')} | "
                     f"{'-' if mem is None else format(mem, '.2f')} | {ckpt} |")
    return "\n".join(table + figure_lines(results))


def figure_lines(results):
    """The figures of the stages the table's columns do not hold: the compared runs' ratios, the
    1.5B pair's, the memory table and the roofline at each shape."""
    lines = []
    for name in [*COMPARED, "trl_pair_1.5B"]:
        f = results.get(name, {}).get("figures", {})
        for line in [f["line"]] if isinstance(f.get("line"), str) else f.get("line", []):
            lines.append(f"{name}: {line}")
        if name == "trl_pair_1.5B" and "mean_response_len" in f:
            lines.append(f"{name}: tokens a response, mathrl {f['mean_response_len']['mathrl']:.0f}"
                         f", TRL {f['mean_response_len']['trl']:.0f}")
    for name in ("memory_table", "roofline_shapes"):
        table = results.get(name, {}).get("figures", {}).get("table", [])
        if table:
            lines += ["", f"{name}:", *table]
    return ([""] if lines else []) + lines


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="folder for device_check.json and logs.txt")
    p.add_argument("--work", default=None,
                   help="folder for the runs' output folders, emptied stage by stage (default: "
                        "/tmp/device_check; --out keeps only the two files that come back)")
    p.add_argument("--stages", nargs="+", default=STAGES, choices=STAGES)
    p.add_argument("--budget_s", type=float, default=None,
                   help="stop starting stages after this many seconds; a running one is cut at "
                        "the budget's end (default: 575 on a GPU, none with --tiny)")
    p.add_argument("--tiny", action="store_true",
                   help="tiny sizes and the tiny-random model: a CPU check that the script runs")
    p.add_argument("--data_dir", default=next((str(d) for d in DATA_DIRS if d.is_dir()), None),
                   help="GSM8K's gsm8k_train.jsonl and gsm8k_test.jsonl, for gsm8k_curve "
                        "(default: ../shared/data, or .dev/b/data as dev/carry.py leaves them)")
    args = p.parse_args()
    if args.budget_s is None:
        args.budget_s = math.inf if args.tiny else 575
    start = time.perf_counter()
    out = Path(args.out)
    work = Path(args.work or "/tmp/device_check")
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(ROOT))
    results = {}
    with open(out / "logs.txt", "a") as log:
        for name in args.stages:
            left = args.budget_s - (time.perf_counter() - start)
            cmd, cap = stage_plan(name, args.tiny, work, args.data_dir)
            t0 = time.perf_counter()
            log.write(f"\n===== {name}: {' '.join(cmd) if cmd else 'in process'}\n")
            log.flush()
            if left < 15:
                results[name] = {"status": "skipped: the budget is spent"}
            elif cmd is None:
                try:
                    figures = (env_stage if name == "env" else model_stage)(args.tiny)
                    results[name] = {"status": "ok", "figures": figures}
                except Exception as e:  # noqa: BLE001 -- the next stages still run
                    results[name] = {"status": f"failed: {type(e).__name__}: {e}"}
            else:
                shutil.rmtree(work / name, ignore_errors=True)
                (work / f"{name}.child.json").unlink(missing_ok=True)
                why = "its cap" if cap <= left else "the budget's end"
                status, lines = run_process(cmd, min(cap, left), why, log)
                results[name] = {"status": status, "command": " ".join(cmd[1:])}
                results[name]["figures"] = figures_of(name, lines, work)
                if "exit" in results[name]["figures"]:  # the file's own one-line error
                    results[name]["status"] = f"failed: {results[name]['figures']['exit']}"
            results[name]["seconds"] = time.perf_counter() - t0
            log.flush()
            (out / "device_check.json").write_text(json.dumps(results, indent=1))
            print(f"[{time.perf_counter() - start:4.0f} s] {name}: {results[name]['status']}",
                  flush=True)
    if "figures" in results.get("env", {}):
        print(", ".join(f"{k} {v}" for k, v in results["env"]["figures"].items()))
    print(summary(results))
    for name in (b for b in BENCHES if b != "roofline_shapes"):  # summary() printed that one
        for line in results.get(name, {}).get("figures", {}).get("table", []):
            print(line)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[4:])
    else:
        main()
