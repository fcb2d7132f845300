"""Memory per rank of the trained and frozen models: a table computed from the parameter counts of
real model shapes, and a measurement of random-weight models of those shapes, built offline.

    python bench/memory.py table                  # GiB per rank, 0.5B to 14B, GRPO and PPO
    python bench/memory.py measure                # CPU: a 0.5B-shaped grpo.py --fsdp update, 1 vs 2 ranks
    python bench/memory.py measure --size 1.5B --algo ppo --processes 1 2 4

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
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
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
    "7B": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
               num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
               tie_word_embeddings=False),
    "14B": dict(hidden_size=5120, intermediate_size=13824, num_hidden_layers=48,
                num_attention_heads=40, num_key_value_heads=8, vocab_size=152064,
                tie_word_embeddings=False),
}
GiB = 2**30


def config(size):
    from transformers import Qwen2Config

    return Qwen2Config(**SHAPES[size], max_position_embeddings=4096, rope_theta=1e6,
                       bos_token_id=1, eos_token_id=2, pad_token_id=2)


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


def build(size, folder):
    """A random-weight model of the shape, with the embedded tokenizer (ids past its vocabulary
    decode to nothing, which is all a memory measurement needs)."""
    import torch
    from transformers import Qwen2ForCausalLM

    from common.models.loading import load_tokenizer

    torch.manual_seed(0)
    Qwen2ForCausalLM(config(size)).save_pretrained(folder)
    load_tokenizer("tiny-random").save_pretrained(folder)


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

    held = {}
    algo.save_checkpoint = lambda *a, **k: None  # the gathered checkpoint would dominate rank 0

    def count(path, policy, tokenizer, step, optimizers, **kw):
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

    algo.save_checkpoint = count
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


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("table")
    m = sub.add_parser("measure")
    m.add_argument("--size", default="0.5B", choices=list(SHAPES))
    m.add_argument("--algo", default="grpo", choices=["grpo", "ppo"])
    m.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    o = sub.add_parser("_one")
    o.add_argument("--algo")
    o.add_argument("--model")
    o.add_argument("--out")
    a = parser.parse_args()
    {"table": lambda: table(), "measure": lambda: measure(a), "_one": lambda: one(a)}[a.command]()
