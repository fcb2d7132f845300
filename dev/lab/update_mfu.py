"""Update MFU by micro-batch size, and where one micro-batch's time goes.

    python dev/lab/update_mfu.py                                    # CPU: SmolLM2-135M shape, fp32
    python dev/lab/update_mfu.py --shape 1.5B --micro_batch_size 8 16 32 --bf16     # a GPU

One update micro-batch is a forward and backward pass of `common.models.logprobs.token_logprobs` over rows of
a --prompt_len-token prompt (one per 8 rows, as a GRPO group) and a --response_len-token response,
on a random-weight model of a real shape (`dev/lab/roofline.py`'s). For each micro-batch size it
prints the best of 3 timings, tokens/s and MFU (FLOPs counted as `roofline.update_flops` counts
them, against the matmul peak measured first); then PyTorch's profiler table of one micro-batch of
the first size, sorted by device time (CPU time on a CPU).
"""

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from roofline import SHAPES, Shape, build, device_peaks, sync, timed, update_flops  # noqa: E402

from common.models.logprobs import token_logprobs  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="135M", choices=list(SHAPES))
    p.add_argument("--micro_batch_size", type=int, nargs="+", default=[8])
    p.add_argument("--prompt_len", type=int, default=150)
    p.add_argument("--response_len", type=int, default=None,
                   help="default: 512 on a GPU, 64 on a CPU")
    p.add_argument("--bf16", action="store_true", help="bf16 weights (a GPU); fp32 otherwise")
    args = p.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if args.bf16 else torch.float32
    P, R = args.prompt_len, args.response_len or (512 if device.type == "cuda" else 64)
    _, flops = device_peaks(device)
    peak = flops[dtype]
    model = build(args.shape, dtype, device).train()
    s = Shape(model, dtype)
    print(f"{args.shape} in {dtype} on {device}: matmul peak {peak / 1e12:.2f} TFLOP/s, "
          f"prompts of {P} tokens, responses of {R}", flush=True)
    g = torch.Generator().manual_seed(0)

    def batch(rows):
        groups = max(1, rows // 8)
        prompts = torch.randint(100, 40000, (groups, P), generator=g).repeat_interleave(rows // groups, 0)
        ids = torch.cat([prompts, torch.randint(100, 40000, (rows, R), generator=g)], 1).to(device)
        return ids, torch.ones_like(ids)

    def step(ids, mask):
        model.zero_grad(set_to_none=True)
        logprobs, _ = token_logprobs(model, ids, mask, R)
        logprobs.sum().backward()

    print("| micro-batch | ms | tokens/s | MFU |\n|---|---|---|---|")
    for rows in args.micro_batch_size:
        ids, mask = batch(rows)
        best = timed(lambda: step(ids, mask), device)
        mfu = update_flops(s, rows, P, R, max(1, rows // 8)) / best / peak
        print(f"| {rows} | {best * 1e3:.0f} | {rows * R / best:.0f} | {mfu:.2f} |", flush=True)
    ids, mask = batch(args.micro_batch_size[0])
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        step(ids, mask)
        sync(device)
    key = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
    print(prof.key_averages().table(sort_by=key, row_limit=20, max_name_column_width=50))


if __name__ == "__main__":
    main()
