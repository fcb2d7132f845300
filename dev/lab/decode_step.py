"""Where a compiled decode step's time goes: the forward alone, then with the sampler and the
per-token bookkeeping that `generate` runs outside the compiled graph, then a profiler table.

    python dev/lab/decode_step.py                                   # a GPU: Qwen2.5-1.5B shape, bf16
    python dev/lab/decode_step.py --shape 135M --batch 8 --backend eager   # a quick CPU check

Steady-state steps over a static KV cache of --cache_len positions (the prompts' keys and values
written, the rest empty), decoded as `--compile` decodes (`compile_decoding`, packed GQA attention),
on random weights. On a GPU the forward replays as one CUDA graph; the profiler's table then says
which kernels the GPU spends a step in. Its first version gave the figures in dev/notes/performance.md
("Where a step's time goes").
"""

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from dev.lab.roofline import SHAPES, build, sync  # noqa: E402
from common.models.fast.attention import _packed_gqa  # noqa: E402
from common.models.fast.compile import _COMPILED, _static_cache, compile_decoding  # noqa: E402
from common.models.hf import KV_CACHE  # noqa: E402
from common.models.sampler import key_uniforms, row_keys, sample_token  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default=None, choices=list(SHAPES),
                   help="default: 1.5B on a GPU, 135M on a CPU")
    p.add_argument("--batch", type=int, nargs="+", default=[64, 256])
    p.add_argument("--prompt_len", type=int, default=150)
    p.add_argument("--cache_len", type=int, default=768, help="the static cache's positions")
    p.add_argument("--steps", type=int, default=40, help="decode steps per timing (best of 3)")
    p.add_argument("--backend", default="inductor", help="torch.compile's backend")
    args = p.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    shape = args.shape or ("1.5B" if device.type == "cuda" else "135M")
    model = build(shape, torch.bfloat16 if device.type == "cuda" else torch.float32, device)
    compile_decoding(model, backend=args.backend)
    forward = _COMPILED[model]
    if args.prompt_len + 2 + 6 * args.steps + 10 > args.cache_len:  # warm-up, 2 x 3 timings, profile
        p.error("--cache_len must hold the prompt and every step timed: raise it")

    with torch.no_grad(), _packed_gqa(model):
        for B in args.batch:
            ids = torch.randint(100, 40000, (B, args.prompt_len),
                                generator=torch.Generator().manual_seed(B)).to(device)
            cache = _static_cache(model, getattr(model(input_ids=ids, use_cache=True,
                                                       logits_to_keep=1), KV_CACHE), args.cache_len)
            state = dict(token=ids[:, -1], pos=torch.full((B, 1), args.prompt_len, device=device),
                         t=0, done=torch.zeros(B, dtype=torch.bool, device=device))
            attn = torch.ones(B, args.cache_len, dtype=torch.long, device=device)
            keys, eos = row_keys(torch.arange(B, device=device)), torch.tensor([2], device=device)

            def step(sample):
                out = forward(input_ids=state["token"][:, None], attention_mask=attn,
                              position_ids=state["pos"], use_cache=True, **{KV_CACHE: cache})
                logits = out.logits[:, -1]
                state["pos"] = state["pos"] + 1
                if sample:  # as generate does per token, outside the graph
                    token, lp = sample_token(logits, 1.0, 1.0, key_uniforms(keys, state["t"]))
                    alive = ~state["done"]
                    token = torch.where(alive, token, torch.full_like(token, 2))
                    lp = torch.where(alive, lp, torch.zeros_like(lp))
                    state["done"] = state["done"] | torch.isin(token, eos)
                    state["token"], state["t"] = token, state["t"] + 1

            def per_step(sample):
                best = float("inf")
                for _ in range(3):
                    sync(device)
                    t0 = time.perf_counter()
                    for _ in range(args.steps):
                        step(sample)
                    sync(device)
                    best = min(best, (time.perf_counter() - t0) / args.steps)
                return best * 1e3

            t0 = time.perf_counter()
            step(True)
            step(True)
            sync(device)
            print(f"batch {B}: first steps, compiling: {time.perf_counter() - t0:.0f} s", flush=True)
            alone, sampled = per_step(False), per_step(True)
            print(f"batch {B}: forward alone {alone:.2f} ms a step, with the sampler and "
                  f"bookkeeping {sampled:.2f} ms", flush=True)
            if B == args.batch[0]:
                from torch.profiler import ProfilerActivity, profile

                activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA]
                                                       if device.type == "cuda" else [])
                with profile(activities=activities) as prof:
                    for _ in range(10):
                        step(True)
                    sync(device)
                sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
                print(f"profile of 10 steps at batch {B}:")
                print(prof.key_averages().table(sort_by=sort, row_limit=20,
                                                max_name_column_width=60))


if __name__ == "__main__":
    main()
