"""Decoding on a GPU with its step captured as a CUDA graph (the default there:
common/models/fast/graphs.py) against eager decoding, on SmolLM2-135M's shape with random weights, in bf16
autocast over fp32 weights as the files run; rows in groups of 8 that share a 150-token prompt, as a
GRPO rollout:

    python dev/lab/cuda_graphs.py                     # a GPU: 32 and 128 rows x 256 new tokens
    python dev/lab/cuda_graphs.py --device cpu --shape tiny --rows 8 --new_tokens 8   # the checks

For each row count, milliseconds per decode step of a whole rollout (`generate`, the sampling and
bookkeeping of every step included) of three decoders:
- eager: the FastDecoder as a GPU gets it without a graph (`--no_cuda_graphs`): a launch per op;
- static: the captured step's function run without a graph (a static KV cache, its own mask);
- graph: the same, captured at the rollout's first step and replayed (not on a CPU).
And the checks: the graph's tokens and log-probs equal the static step's, also after every weight
is changed in place (an optimizer step, which a replay must see: the graph reads the weights, it
holds no copy of them); and how many rows draw all of eager decoding's tokens (in bf16 the static
cache's attention sums over its masked columns too, in another order, so a row can part from eager
decoding at a near-tie). Results to --out as JSON.
"""

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from dev.lab.roofline import SHAPES, build, sync  # noqa: E402
from common.models.fast.compile import _COMPILED  # noqa: E402
from common.models.fast.graphs import capture_decoding  # noqa: E402
from common.models.fast.decoding import fast_decoding  # noqa: E402
from common.models.loading import load_tokenizer  # noqa: E402
from common.models.sampler import generate  # noqa: E402


def rollout(model, tok, prompts, new_tokens, device):
    """One rollout, bf16 autocast -> (the Generation, its seconds)."""
    sync(device)
    t0 = time.perf_counter()
    with (torch.autocast(device.type, dtype=torch.bfloat16),
          fast_decoding(model) as decoder):
        gen = generate(model, tok, prompts, new_tokens, temperature=1.0,
                       seeds=list(range(len(prompts))), decoder=decoder)
    sync(device)
    return gen, time.perf_counter() - t0


def decode_as(model, how):
    """Register the decoder `how` for the model: eager, static or graph."""
    _COMPILED.pop(model, None)
    if how != "eager":
        capture_decoding(model, graphs=how == "graph")
    assert (model in _COMPILED) == (how != "eager"), f"{how} decoding could not be set up"


def same(a, b):
    """(tokens equal, the largest log-prob difference) of two Generations."""
    equal = a.response_ids.shape == b.response_ids.shape and torch.equal(a.response_ids,
                                                                         b.response_ids)
    diff = (a.logprobs - b.logprobs).abs().max().item() if equal else float("nan")
    return equal, diff


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--shape", default="135M", choices=list(SHAPES))
    p.add_argument("--rows", type=int, nargs="+", default=[32, 128])
    p.add_argument("--new_tokens", type=int, default=256)
    p.add_argument("--repeat", type=int, default=2, help="timed rollouts per decoder (the best)")
    p.add_argument("--out", default=None, help="a JSON file for the results")
    args = p.parse_args()
    device = torch.device(args.device)
    model = build(args.shape, torch.float32, device)
    model.config._attn_implementation = "sdpa"
    eos = model.config.eos_token_id
    with torch.no_grad():  # no row stops early: every rollout is new_tokens steps
        model.lm_head.weight[eos] = 0.0
    tok = load_tokenizer("tiny-random")
    hows = ["eager", "static"] + (["graph"] if device.type == "cuda" else [])
    results = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
               "shape": args.shape, "new_tokens": args.new_tokens, "rows": {}}
    print("| rows | " + " | ".join(f"{h} ms/step" for h in hows) + " | graph/eager | checks |")
    print("|---|" + "---|" * (len(hows) + 2))
    for rows in args.rows:
        g = torch.Generator().manual_seed(rows)
        groups = [torch.randint(100, 40000, (150,), generator=g).tolist()
                  for _ in range(max(1, rows // 8))]
        prompts = [groups[i * len(groups) // rows] for i in range(rows)]
        gens, ms = {}, {}
        for how in hows:
            decode_as(model, how)
            gens[how], _ = rollout(model, tok, prompts, args.new_tokens, device)  # warm-up
            best = min(rollout(model, tok, prompts, args.new_tokens, device)[1]
                       for _ in range(args.repeat))
            ms[how] = 1000 * best / gens[how].response_ids.shape[1]
        last = hows[-1]  # the graph; on a CPU (no graph) the static step checks itself
        row = {"ms_per_step": ms, "steps": gens[last].response_ids.shape[1]}
        row["graph_equals_static"], row["graph_minus_static_max"] = same(gens[last],
                                                                         gens["static"])
        row["rows_as_eager"] = sum(torch.equal(a, b) for a, b in
                                   zip(gens[last].response_ids, gens["eager"].response_ids))
        # an optimizer step changes every weight in place: the replays must read the new values
        with torch.no_grad():
            for w in model.parameters():
                w.mul_(1.01)
        after = {}
        for how in ("static", last):
            decode_as(model, how)
            after[how], _ = rollout(model, tok, prompts, args.new_tokens, device)
        row["after_update_equal"], row["after_update_max"] = same(after[last], after["static"])
        row["update_changed_tokens"] = not torch.equal(after["static"].response_ids,
                                                       gens["static"].response_ids)
        with torch.no_grad():
            for w in model.parameters():
                w.div_(1.01)
        results["rows"][rows] = row
        checks = (f"graph = static: {row['graph_equals_static']} "
                  f"(max |dlogp| {row['graph_minus_static_max']:.1e}), after an update: "
                  f"{row['after_update_equal']}; rows as eager {row['rows_as_eager']}/{rows}")
        ratio = ms[last] / ms["eager"]
        row["ratio"] = ratio
        print(f"| {rows} | " + " | ".join(f"{ms[h]:.2f}" for h in hows) +
              f" | {ratio:.2f} | {checks} |", flush=True)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
