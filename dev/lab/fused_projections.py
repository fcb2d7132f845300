"""Fused projections (common/models/fast/fused.py) against separate ones, in the same process, alternating:
a rollout of `generate` (the FastDecoder, with the device's speedups) with q/k/v and gate/up as one
matmul each, then the same rollout with them apart, --repeat times, at each --batch; and one decode step's linear layers alone, both ways. Medians, and
their ratio (below 1: fused is faster). The samples are the same both ways (the script checks).

    python dev/lab/fused_projections.py                # CPU: SmolLM2-135M shape, 32 rows, ~2 min
    python dev/lab/fused_projections.py --shape 1.5B --batch 64 256 --bf16     # a GPU

Random weights of the real shape, prompts of 150 tokens shared by groups of 8 rows, as in
dev/lab/roofline.py.
"""

import argparse
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dev.lab.roofline import SHAPES, build, linears_alone, sync  # noqa: E402
from common.models.fast.decoding import Speedups, fast_decoding  # noqa: E402
from common.models.loading import load_tokenizer  # noqa: E402
from common.models.sampler import generate  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="135M", choices=sorted(SHAPES))
    p.add_argument("--batch", type=int, nargs="+", default=[32])
    p.add_argument("--new_tokens", type=int, default=64)
    p.add_argument("--repeat", type=int, default=6)
    p.add_argument("--bf16", action="store_true", help="bf16 weights (a GPU); fp32 otherwise")
    args = p.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if args.bf16 else torch.float32
    model = build(args.shape, dtype, device)
    tok = load_tokenizer("tiny-random")
    for batch in args.batch:
        measure(model, tok, batch, args, device, dtype)


def measure(model, tok, batch, args, device, dtype):
    """The fused and the separate projections, in turn, --repeat times at `batch` rows, with the
    other speedups as the device gets them."""
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(100, 40000, (150,), generator=g).tolist()
               for _ in range(max(1, batch // 8))]
    prompts = [prompts[i // 8] for i in range(batch)]
    rollout, linears, tokens = {True: [], False: []}, {True: [], False: []}, {}
    for _ in range(args.repeat):
        for fused in (True, False):
            speedups = replace(Speedups.for_device(device), fused_projections=fused)
            sync(device)
            t0 = time.perf_counter()
            with fast_decoding(model, speedups=speedups) as decoder:
                gen = generate(model, tok, prompts, args.new_tokens, 1.0, 1.0,
                               seeds=list(range(batch)), decoder=decoder)
            sync(device)
            rollout[fused].append(time.perf_counter() - t0)
            tokens[fused] = gen.response_ids.tolist()
            linears[fused].append(linears_alone(model, batch, device,
                                                device.type == "cpu" and not args.bf16, fused))
    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    print(f"{name}, {args.shape}, {batch} rows, {args.new_tokens} new tokens, {dtype}; "
          f"medians of {args.repeat}")
    print("| projections | rollout s | one step's linears, ms |")
    print("|---|---|---|")
    for fused in (True, False):
        print(f"| {'fused' if fused else 'separate'} | {statistics.median(rollout[fused]):.3f} | "
              f"{1e3 * statistics.median(linears[fused]):.1f} |")
    ratio = {name: statistics.median(d[True]) / statistics.median(d[False])
             for name, d in (("rollout", rollout), ("linears", linears))}
    print(f"fused / separate: rollout {ratio['rollout']:.3f}, linears {ratio['linears']:.3f}; "
          f"same tokens: {tokens[True] == tokens[False]}")


if __name__ == "__main__":
    main()
