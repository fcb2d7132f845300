"""Memory per rank of the trained and frozen models: a table computed from the parameter counts of
real model shapes, and a measurement of random-weight models of those shapes, built offline.

    python bench/memory.py table                  # GiB per rank, 0.5B to 14B, GRPO and PPO
    python bench/memory.py measure                # CPU: a 0.5B-shaped grpo.py --fsdp update, 1 vs 2 ranks
    python bench/memory.py measure --size 1.5B --algo ppo --processes 1 2 4
    python bench/memory.py gpu --out runs/memory_gpu  # a GPU: grpo.py's peak memory, under caps
    python bench/memory.py gpu --shapes tiny --configs default fsdp --updates 1 \
        --grpo_option=--num_prompts=2   # a CPU: that it runs (peak RSS)

The table counts what scales with the model, in bytes per parameter P, with --bf16 (the setting for
a GPU):
- a trained model with AdamW: fp32 weights, gradients and two moments, 16 P, on every rank (DDP) or
  16 P / N sharded over N ranks (--fsdp), plus, under --fsdp, the bf16 copy that a rollout gathers
  (2 P, freed after it; training gathers one layer at a time);
- LoRA (--lora_r 8, all linear modules): the frozen base in bf16 (2 P, sharded as 2 P / N under
  --fsdp) and adapters with their AdamW state (16 bytes each, under 1 % of P at r 8);
- PPO: a second trained model, the critic, as big as the policy (as oat's and TRL's); with LoRA it
  is trained whole, so `--critic_type shared` is the choice that fits (a value head on the policy);
- --offload_optimizer: on the device the policy's bf16 weights and gradients, 4 P (its fp32
  masters and AdamW moments, 12 P, are in the CPU's memory, not counted); PPO's critic keeps its
  own fp32 AdamW;
- a reference for the KL (--beta > 0, counted for PPO as oat runs it; GRPO's default is 0): a whole
  bf16 copy on every rank (2 P), or nothing with LoRA (the policy with its adapters off).
Activations, the KV cache of a rollout and the logits come on top and depend on the batch.

`measure` runs one update of grpo.py (or ppo.py) under torchrun with --fsdp on a random model of the
chosen shape, fp32 (no --bf16 on a CPU), no checkpoint, and prints per rank: the bytes of trained
state it holds (the shards of weights, gradients and AdamW moments, counted from the tensors), and
its peak RSS (which also holds the whole fp32 model each rank reads before sharding, the gathered
rollout copy, activations and the code).

`gpu` runs grpo.py for --updates updates (2) on a random-weight model of each shape (saved in bf16,
loaded by the file as it loads any model) in each configuration: its defaults, --bf16,
--gradient_checkpointing, --lora_r 16, --fsdp (torchrun, one process) and --bf16
--offload_optimizer (ZeRO-Offload), each run a process of its own capped at each of --caps_gib
(24 and 80 GiB: torch.cuda.set_per_process_memory_fraction, set by `_gpu_one` before the file
runs). The default batch (4 prompts x 8 samples x 64 tokens) with micro-batches of 8, no
evaluation, no checkpoint written. It prints a row per run as it ends, also to rows.jsonl: torch's
peak allocation and reservation, or "out of memory", which is a row, not a failure; a run whose
weights, gradients and AdamW state alone pass the cap (computed from the parameter count) is not
started, and its row says so. The order is by value, for a short lease: the first shape (1.5B)
under the first cap in every configuration, then the others shape by shape. On a CPU there is no
cap and the rows give peak RSS.
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# Qwen2.5 shapes (their config.json files), biases on q, k, v as in Qwen2
SHAPES = {
    "0.5B": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                 num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                 tie_word_embeddings=True),
    "1.5B": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                 num_attention_heads=12, num_key_value_heads=2, vocab_size=151936,
                 tie_word_embeddings=True),
    "3B": dict(hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
               num_attention_heads=16, num_key_value_heads=2, vocab_size=151936,
               tie_word_embeddings=True),
    "7B": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
               num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
               tie_word_embeddings=False),
    "14B": dict(hidden_size=5120, intermediate_size=13824, num_hidden_layers=48,
                num_attention_heads=40, num_key_value_heads=8, vocab_size=152064,
                tie_word_embeddings=False),
}
# a Qwen2 shape for the CPU checks (the tests, dev/device_check.py --tiny), not in the table; its
# vocabulary is the embedded tokenizer's, which the random models are saved with
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=49152, tie_word_embeddings=True)
GiB = 2**30


def config(size):
    from transformers import Qwen2Config

    return Qwen2Config(**(TINY if size == "tiny" else SHAPES[size]), max_position_embeddings=4096,
                       rope_theta=1e6, bos_token_id=1, eos_token_id=2, pad_token_id=2)


def counts(size, lora_r=8):
    """(parameters, LoRA parameters at rank lora_r on every linear module of the blocks)."""
    import torch
    from transformers import Qwen2ForCausalLM

    with torch.device("meta"):
        model = Qwen2ForCausalLM(config(size))
    params = sum(p.numel() for p in model.parameters())
    lora = sum(lora_r * (m.in_features + m.out_features) for name, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and ".layers." in name)
    return params, lora


def per_rank(P, lora, algo, setting, ranks=8):
    """Bytes per rank of weights, gradients, optimizer states and frozen copies (see the docstring)."""
    n = ranks if setting.endswith("fsdp") else 1
    if setting == "offload":  # the device's share: bf16 weights and gradients (the rest on the CPU)
        policy = 4 * P
        reference = 2 * P if algo == "ppo" else 0.0
    elif setting.startswith("lora"):
        policy = 2 * P / n + 16 * lora
        reference = 0.0
    else:
        policy = 16 * P / n
        reference = 2 * P if algo == "ppo" else 0.0
    critic = 16 * P / n if algo == "ppo" else 0.0
    rollout_copy = 2 * P if n > 1 else 0.0  # --fsdp: the weights gathered for a rollout, bf16
    return policy + critic + reference + rollout_copy


def table():
    settings = [("ddp", "DDP (whole on every rank)"), ("fsdp", "--fsdp, 8 ranks"),
                ("lora", "--lora_r 8"), ("lora_fsdp", "--lora_r 8 --fsdp, 8 ranks"),
                ("offload", "--offload_optimizer (GPU)")]
    print("| model | parameters | algorithm | " + " | ".join(s[1] for s in settings) + " |")
    print("|---|---|---|" + "---|" * len(settings))
    for size in SHAPES:
        P, lora = counts(size)
        for algo in ("grpo", "ppo"):
            cells = [f"{per_rank(P, lora, algo, s) / GiB:.1f}" for s, _ in settings]
            print(f"| {size} | {P / 1e9:.2f} B | {algo} | " + " | ".join(cells) + " |")


def build(size, folder, dtype=None, device="cpu"):
    """A random-weight model of the shape, with the embedded tokenizer (ids past its vocabulary
    decode to nothing, which is all a memory or speed measurement needs). dtype: what it is saved
    in (None: fp32; bf16 halves a 7B folder to 15 GB, and a file loads it back in fp32); device:
    where the random weights are drawn (a GPU draws a 7B model in seconds, a CPU in minutes)."""
    import torch
    from transformers import Qwen2ForCausalLM

    from common.models.loading import load_tokenizer

    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(config(size))
    model.to(dtype=dtype or torch.float32).save_pretrained(folder)
    load_tokenizer("tiny-random").save_pretrained(folder)
    del model
    if torch.device(device).type == "cuda":  # the runs that load it are other processes
        torch.cuda.empty_cache()
    return Path(folder)


def measure(args):
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / f"random-{args.size}"
        build(args.size, model)
        rows = []
        for n in args.processes:
            out = Path(tmp) / f"out-{n}.json"
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(n),
                   "--master_port", str(29600 + n), __file__, "_one", "--algo", args.algo,
                   "--model", str(model), "--out", str(out)]
            subprocess.run(cmd, check=True, cwd=ROOT,
                           env={**os.environ, "OMP_NUM_THREADS": str(max(1, 2 // n))})
            rows.append((n, json.loads(out.read_text())))
    print(f"\n{args.algo}.py --fsdp, one update, {args.size}-shaped random model, fp32 on CPU")
    print("| processes | trained state per rank (GiB) | ratio to 1 process | peak RSS per rank "
          "(GiB) |")
    print("|---|---|---|---|")
    base = rows[0][1]["state"][0]
    for n, r in rows:
        print(f"| {n} | {' / '.join(f'{s / GiB:.2f}' for s in r['state'])} | "
              f"{max(r['state']) / base:.3f} | {' / '.join(f'{m / GiB:.2f}' for m in r['rss'])} |")


def one(args):
    """Inside torchrun: one update with no checkpoint, then each rank's shard bytes and peak RSS."""
    import torch
    import torch.distributed as dist

    algo = __import__(args.algo)
    from common.run.args import parse_args

    import common.run.run as run_module

    held = {}

    # in place of the checkpoint, which would gather the whole model on rank 0: the trained state
    # each rank holds, counted from its tensors
    def count(path, policy, tokenizer, step, optimizers=None, **kw):
        total = 0
        for module, optimizer in optimizers.values():
            for p in module.parameters():
                local = p.to_local() if hasattr(p, "to_local") else p
                if p.requires_grad:  # weights, gradient
                    total += 2 * local.numel() * local.element_size()
            for state in optimizer.state.values():
                for v in state.values():
                    if torch.is_tensor(v) and v.numel() > 1:
                        v = v.to_local() if hasattr(v, "to_local") else v
                        total += v.numel() * v.element_size()
        held["state"] = total

    run_module.save_checkpoint = count
    argv = ["--model_name_or_path", args.model, "--fsdp", "--max_steps", "1", "--num_prompts", "4",
            "--max_new_tokens", "16", "--micro_batch_size", "2", "--num_eval_problems", "0",
            "--output_dir", str(Path(args.out).with_suffix("")), "--learning_rate", "1e-6"]
    if args.algo == "grpo":
        argv += ["--num_generations", "2"]
    algo.main(parse_args(algo.Args, argv))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (held["state"], rss))
    if dist.get_rank() == 0:
        Path(args.out).write_text(json.dumps({"state": [g[0] for g in gathered],
                                              "rss": [g[1] for g in gathered]}))


# ----------------------------------------------------------------------------------------------
# `gpu`: peak memory of a few grpo.py updates, configuration by configuration, under a cap

# the configurations of the `gpu` table: grpo.py's flags
CONFIGS = {"default": [], "bf16": ["--bf16"],
           "gradient_checkpointing": ["--gradient_checkpointing"],
           "lora_r_16": ["--lora_r", "16"], "fsdp": ["--fsdp"],
           "bf16_offload_optimizer": ["--bf16", "--offload_optimizer"]}


def state_bytes(P, config):
    """The least a configuration holds on the device before any activation, in bytes, from the
    parameter count: fp32 weights, gradients and two AdamW moments (16 P; --fsdp on one rank
    too); LoRA's frozen fp32 base (4 P); ZeRO-Offload's bf16 weights and gradients (4 P, the fp32
    master and the moments on the CPU). A run whose state alone passes the cap is not started."""
    return {"lora_r_16": 4, "bf16_offload_optimizer": 4}.get(config, 16) * P


def has_option(flag):
    """Whether grpo.py takes `flag`: its Args are dataclass fields in grpo.py or common/ (read as
    text: importing grpo.py here would cost the parent the seconds each run's process spends)."""
    field = flag.lstrip("-") + ":"
    files = [ROOT / "grpo.py", *(ROOT / "common").rglob("*.py")]
    return any(field in f.read_text() for f in files)


def gpu_table(args):
    """Each configuration of grpo.py for `--updates` updates of a random-weight model of each
    shape, under each cap, in order of value: the first shape under the first cap in every
    configuration, then the rest shape by shape. One process per run, a row per run written to
    rows.jsonl as it ends; running out of memory is a row, not a failure."""
    import torch

    cuda = torch.cuda.is_available()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows_file = out / "rows.jsonl"
    rows_file.unlink(missing_ok=True)
    caps = args.caps_gib if cuda else [None]  # a CPU has no cap to set: peak RSS, uncapped
    first = [(args.shapes[0], caps[0], c) for c in args.configs]
    runs = first + [(s, cap, c) for s in args.shapes for cap in caps for c in args.configs
                    if (s, cap, c) not in first]
    folders = {}
    print("| shape | configuration | cap GiB | status | peak allocated GiB | peak reserved GiB "
          "| peak RSS GiB | s |")
    print("|---" * 8 + "|", flush=True)
    for shape, cap, name in runs:
        row = {"shape": shape, "config": name, "flags": " ".join(CONFIGS[name]), "cap_gib": cap}
        t0 = time.perf_counter()
        P = counts(shape)[0] if shape != "tiny" else None
        flag = CONFIGS[name][-1] if CONFIGS[name] else None
        if flag and flag.startswith("--") and not has_option(flag):
            row["status"] = f"skipped: grpo.py has no {flag}"
        elif cap and P and state_bytes(P, name) > cap * GiB:
            row["status"] = (f"out of memory (computed, not run: {state_bytes(P, name) / GiB:.0f} "
                             f"GiB of weights, gradients and AdamW state)")
        else:
            if shape not in folders:  # built when first needed: a 7B folder is 15 GB of disk
                folders[shape] = build(shape, out / f"random-{shape}", torch.bfloat16,
                                       "cuda" if cuda else "cpu")
            row.update(one_gpu_run(args, folders[shape], name, cap, out / "runs" / f"{shape}-"
                                   f"{name}-{cap}"))
        row["seconds"] = time.perf_counter() - t0
        with open(rows_file, "a") as f:
            f.write(json.dumps(row) + "\n")
        print(gpu_row(row), flush=True)


def gpu_row(r):
    def gib(key):
        return f"{r[key]:.2f}" if r.get(key) is not None else "-"

    return (f"| {r['shape']} | {r['flags'] or 'default'} | {r['cap_gib'] or '-'} | {r['status']} | "
            f"{gib('peak_allocated_gib')} | {gib('peak_reserved_gib')} | {gib('peak_rss_gib')} | "
            f"{r['seconds']:.0f} |")


def one_gpu_run(args, model, name, cap, folder):
    """grpo.py in a process of its own (under torchrun for --fsdp), through `_gpu_one`, which caps
    its memory before the file runs. -> the row's status and peaks."""
    import shutil

    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    result = folder / "result.json"
    run = [str(ROOT / "grpo.py"), "--model_name_or_path", str(model), "--max_steps",
           str(args.updates), "--num_eval_problems", "0", "--no_eval_on_start",
           # a fixed micro-batch: the fit reads the device's free memory, not the cap
           "--micro_batch_size", "8", "--output_dir", str(folder / "run"),
           *args.grpo_option, *CONFIGS[name]]
    wrapper = [__file__, "_gpu_one", "--out", str(result),
               *(["--cap_gib", str(cap)] if cap else []), "--", *run]
    launch = ([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
               "1"] if name == "fsdp" else [sys.executable])
    with open(folder / "log.txt", "w") as log:
        try:
            done = subprocess.run(launch + wrapper, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                  timeout=args.run_timeout_s)
            code = done.returncode
        except subprocess.TimeoutExpired:
            code = None
    if result.exists():
        return json.loads(result.read_text())
    return {"status": f"stopped at {args.run_timeout_s:.0f} s" if code is None else
            f"failed (exit {code}): see {folder / 'log.txt'}"}


def gpu_one(args, argv):
    """Inside the run's process: cap this process's share of the GPU, run the file as `python
    grpo.py ...` would (its checkpoint not written: a 7B one is 30 GB of disk), and write its
    status and peak memory."""
    import runpy

    import torch

    import common.run.run

    if args.cap_gib and torch.cuda.is_available():
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, args.cap_gib * GiB / total))
    common.run.run.save_checkpoint = lambda *a, **k: None
    sys.argv = argv
    status = "ok"
    try:
        runpy.run_path(argv[0], run_name="__main__")
    except torch.OutOfMemoryError:
        status = "out of memory"
    except SystemExit as e:  # the file's own error exit (which may say it ran out)
        if e.code not in (None, 0):
            status = "out of memory" if "out of memory" in str(e.code) else f"failed: {e.code}"
    except RuntimeError as e:  # some ops report running out as a plain RuntimeError
        status = "out of memory" if "out of memory" in str(e) else f"failed: {e}"[:300]
    result = {"status": status}
    if torch.cuda.is_available():
        result.update(peak_allocated_gib=torch.cuda.max_memory_allocated() / GiB,
                      peak_reserved_gib=torch.cuda.max_memory_reserved() / GiB)
    result["peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    if int(os.environ.get("RANK", "0")) == 0:
        Path(args.out).write_text(json.dumps(result))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("table")
    m = sub.add_parser("measure")
    m.add_argument("--size", default="0.5B", choices=[*SHAPES, "tiny"])
    m.add_argument("--algo", default="grpo", choices=["grpo", "ppo"])
    m.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    o = sub.add_parser("_one")
    o.add_argument("--algo")
    o.add_argument("--model")
    o.add_argument("--out")
    g = sub.add_parser("gpu", help="peak memory of grpo.py's configurations, shape by shape, "
                                   "each run capped at a share of the GPU")
    g.add_argument("--shapes", nargs="+", default=["1.5B", "0.5B", "3B", "7B"],
                   choices=[*SHAPES, "tiny"],
                   help="random-weight models of these Qwen2.5 shapes (tiny: a CPU check)")
    g.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS),
                   help="grpo.py's configurations: " + "; ".join(
                       f"{k}: {' '.join(v) or 'its defaults'}" for k, v in CONFIGS.items()))
    g.add_argument("--caps_gib", type=float, nargs="+", default=[24, 80],
                   help="each run's process is capped at this much GPU memory "
                        "(torch.cuda.set_per_process_memory_fraction); ignored on a CPU")
    g.add_argument("--updates", type=int, default=2, help="grpo.py's --max_steps in each run")
    g.add_argument("--grpo_option", action="append", default=[],
                   help="a grpo.py flag every run gets, repeated: --grpo_option=--num_prompts=2")
    g.add_argument("--run_timeout_s", type=float, default=300,
                   help="stop a run that takes longer (its row says so)")
    g.add_argument("--out", default="runs/memory_gpu", help="folder for rows.jsonl and the runs")
    u = sub.add_parser("_gpu_one")
    u.add_argument("--out")
    u.add_argument("--cap_gib", type=float, default=None)
    u.add_argument("argv", nargs=argparse.REMAINDER)
    a = parser.parse_args()
    {"table": lambda: table(), "measure": lambda: measure(a), "_one": lambda: one(a),
     "gpu": lambda: gpu_table(a),
     "_gpu_one": lambda: gpu_one(a, a.argv[1:] if a.argv[:1] == ["--"] else a.argv)}[a.command]()
