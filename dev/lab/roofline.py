"""How close rollouts and updates come to what the hardware allows.

    python dev/lab/roofline.py                          # CPU: SmolLM2-135M shape, ~5 min on 2 cores
    python dev/lab/roofline.py --shapes 135M 0.5B --batch 8 32 --new_tokens 64 256
    python dev/lab/roofline.py --shapes 1.5B --batch 64 256 --new_tokens 512 --bf16   # a GPU
    python dev/lab/roofline.py --shapes 1.5B 7B --batch 64 --bf16 --modes default eager   # a GPU
    python dev/lab/roofline.py --batch 8 32 --new_tokens 64 --compile   # --compile's decoding
    python dev/lab/roofline.py --batch 32 --new_tokens 64 [--torch_linears]   # packed linears or not
    python dev/lab/roofline.py --batch 32 --new_tokens 64 --rollout_only [--unfused]   # fused or not
    python dev/lab/roofline.py --batch 8 --new_tokens 256 --compile [--grow_static_cache]   # growing

First it measures the device: memory bandwidth (a large copy, bytes read plus written per second)
and matmul FLOP/s (square fp32 and bf16 matmuls; on a CPU in fp32 the better of torch's matmul
and oneDNN's packed linear, which `generate` decodes with there). Then, on random-weight models
built offline from real configs (SmolLM2-135M, Qwen2.5-0.5B / 1.5B / 3B / 7B shapes):

- rollout: `generate` with the FastDecoder at each batch size and response length (prompts of
  --prompt_len tokens, sampling at temperature 1, every row its own seed), in each of --modes, a row
  each: `default` decodes as the files do on the device (on a GPU the step captured as a CUDA graph,
  `capture_decoding`, as `trained_policy` sets it up; on a CPU eagerly, since a capture needs CUDA),
  `compile` as `--compile` does and `eager` as `--no_cuda_graphs` does; every mode with the speedups
  the files get on the device (`Speedups.for_device`). Rows print mode by mode as they are measured
  (a run cut short keeps the modes asked for first), then, with several modes, side by side. Its
  bound is the sum, over the prefill and every decode step, of the larger of the time to read the
  weights and the KV cache at the measured bandwidth and the time to do the step's FLOPs at the
  measured matmul peak; `of bound` is that bound over the measured time (1.0 = at the hardware's
  limit). `linears alone` is the same fraction for a decode step halfway through the responses
  whose only cost would be its linear layers, each run as `generate` runs it: the most any decoding
  with those matmul kernels can reach, since attention, norms and the sampler only add.
- update: a forward and backward pass of `common.models.logprobs.token_logprobs` over the same sequences, in
  micro-batches of --micro_batch_size; MFU is its FLOPs (6 per parameter per token, plus attention;
  a prompt shared by 8 rows counted once, as token_logprobs runs it once) over the time, against
  the measured matmul peak.

The default shape is the default GRPO rollout (4 prompts x 8 samples = 32 rows, 64 new tokens, a
prompt of about 150 tokens with the worked example). With matplotlib, --plot writes the tables as a
figure of tokens/s against batch size and response length. --compile is `--modes compile` (a static KV
cache and a compiled forward, `compile_decoding`); the first rollout of each shape and batch compiles
it, and its seconds are printed apart. --torch_linears decodes a CPU model through torch's
own linear instead of oneDNN's packed weights (common/models/fast/linears.py), and --unfused runs q/k/v and
gate/up as separate matmuls (common/models/fast/fused.py), each for a before and after; with --compile,
--grow_static_cache lets the static cache grow as it fills (`Speedups.grow_static_cache`, off by
default until a GPU measures it); --rollout_only skips the update.
"""

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.memory import SHAPES as QWEN  # noqa: E402
from common.models.fast.compile import _COMPILED, compile_decoding  # noqa: E402
from common.models.fast.graphs import capture_decoding  # noqa: E402
from common.models.fast.fused import _fused_projections  # noqa: E402
from common.models.fast.linears import _onednn_linears, _onednn_works, _pack, _packed_linear  # noqa: E402
from common.models.fast.decoding import Speedups, fast_decoding  # noqa: E402
from common.models.logprobs import token_logprobs  # noqa: E402
from common.models.loading import load_tokenizer  # noqa: E402
from common.models.sampler import generate  # noqa: E402

SMOL = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
            num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True)
# "tiny" is for dev/device_check.py's run on a CPU, which checks that the script still works
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=49152, tie_word_embeddings=True)
SHAPES = {"135M": ("llama", SMOL), **{k: ("qwen2", v) for k, v in QWEN.items()},
          "tiny": ("llama", TINY)}


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, device, repeat=3):
    """The best of `repeat` timings of fn() after one warm-up call, in seconds."""
    fn()
    best = float("inf")
    for _ in range(repeat):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        best = min(best, time.perf_counter() - t0)
    return best


def device_peaks(device):
    """(bytes/s of a large copy, counting the read and the write; {dtype: matmul FLOP/s})."""
    n = (256 if device.type == "cpu" else 2048) * 2**20 // 4
    src = torch.empty(n, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    bandwidth = 2 * src.numel() * 4 / timed(lambda: dst.copy_(src), device, repeat=5)
    flops = {}
    for dtype in (torch.float32, torch.bfloat16):
        # bf16 matmuls are ~100x slower than fp32 on a CPU: a smaller one suffices to say so
        size = 8192 if device.type == "cuda" else 2048 if dtype == torch.float32 else 512
        a = torch.randn(size, size, device=device).to(dtype)
        b = torch.randn(size, size, device=device).to(dtype)
        # the best of 10: on a shared host single timings of this matmul ranged over 82-133 GFLOP/s
        flops[dtype] = 2 * size**3 / timed(lambda: a @ b, device, repeat=10)
        if device.type == "cpu" and dtype == torch.float32 and _onednn_works():
            # generate's linears run through oneDNN on a CPU: the peak is the better of the two
            w = _pack(b.T.contiguous())
            packed = timed(lambda: _packed_linear(a, w), device, repeat=10)
            flops[dtype] = max(flops[dtype], 2 * size**3 / packed)
    return bandwidth, flops


def build(shape, dtype, device):
    from transformers import LlamaConfig, Qwen2Config

    kind, fields = SHAPES[shape]
    config = (LlamaConfig if kind == "llama" else Qwen2Config)(
        **fields, max_position_embeddings=8192, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    torch.manual_seed(0)
    from transformers import AutoModelForCausalLM

    # initialised where it runs: a 7B shape's random init takes minutes on a CPU, moments on a GPU
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config).to(dtype=dtype)
    model.config.use_cache = False
    return model.eval()


class Shape:
    """What one token costs a model: the weights it reads, its FLOPs, its KV bytes per position."""

    def __init__(self, model, dtype):
        c = model.config
        self.bytes = torch.finfo(dtype).bits // 8
        self.layers, self.hidden = c.num_hidden_layers, c.hidden_size
        head_dim = c.hidden_size // c.num_attention_heads
        total = sum(p.numel() for p in model.parameters())
        embedding = c.vocab_size * c.hidden_size
        # a decode step reads every weight once; the embedding table is read whole only when it is
        # also the head (tied), else a row per sequence
        self.read_params = total if c.tie_word_embeddings else total - embedding
        self.matmul_params = total - (0 if c.tie_word_embeddings else embedding)  # the head's too
        self.body_params = total - embedding
        self.vocab = c.vocab_size
        self.kv_per_position = 2 * self.layers * c.num_key_value_heads * head_dim * self.bytes

    def attention_flops(self, queries, keys):
        """QK^T and AV of `queries` positions over `keys` positions, all layers."""
        return 4 * self.layers * self.hidden * queries * keys


def step_bound(s, batch, context, bandwidth, peak):
    """Seconds of a decode step of `batch` rows over `context` positions at the hardware's limit."""
    bytes_read = s.read_params * s.bytes + s.kv_per_position * context * batch
    flops = 2 * s.matmul_params * batch + s.attention_flops(batch, context)
    return max(bytes_read / bandwidth, flops / peak)


def rollout_bound(s, batch, prompt_len, new_tokens, bandwidth, peak):
    """Seconds of the prefill plus every decode step at the hardware's limit."""
    prefill = 2 * s.body_params * prompt_len + s.attention_flops(prompt_len, prompt_len / 2)
    total = (prefill + 2 * s.vocab * s.hidden) / peak  # the distinct prompts: one per group of 8
    total *= max(1, batch // 8)
    for t in range(1, new_tokens):
        total += step_bound(s, batch, prompt_len + t, bandwidth, peak)
    return total


def linears_alone(model, batch, device, pack, fuse):
    """Seconds of one decode step's linear layers and nothing else, at `batch` rows, each through
    the op the FastDecoder uses (oneDNN's packed weights on a CPU, unless --torch_linears; q/k/v and
    gate/up as one matmul each, unless --unfused). A rollout can come no closer to the bound than
    its linear layers do: what is left of a step (attention, norms, the sampler) only adds."""
    dtype = next(model.parameters()).dtype
    with torch.no_grad(), _fused_projections(model, fuse) as fused:
        # the layers that still run their own matmul, and the fused ones
        stacked = [f for _, f, _ in fused.values()]
        linears = [m for m in model.modules()
                   if isinstance(m, torch.nn.Linear) and "forward" not in vars(m)] + stacked
        inputs = {n: torch.randn(batch, n, device=device, dtype=dtype)
                  for n in {m.in_features for m in linears}}
        with _onednn_linears(model, pack, also=stacked):
            return timed(lambda: [m(inputs[m.in_features]) for m in linears], device, repeat=5)


def update_flops(s, batch, prompt_len, new_tokens, groups):
    """Forward and backward (3x the forward) of token_logprobs: the body on each of the `groups`
    distinct prompts once (token_logprobs shares a prompt's forward among its rows), then on every
    row's response positions, and the head on the response positions."""
    P, R = prompt_len, new_tokens
    forward = (2 * s.body_params * (P * groups + R * batch) + 2 * s.vocab * s.hidden * R * batch
               + s.attention_flops(P, P / 2) * groups + s.attention_flops(R, P + R / 2) * batch)
    return 3 * forward


MODES = ["default", "compile", "eager"]
MODE_HELP = {"default": "the files' default: on a GPU the decode step captured as a CUDA graph "
                        "(capture_decoding), on a CPU eager",
             "compile": "--compile: a static KV cache and a compiled forward (compile_decoding)",
             "eager": "--no_cuda_graphs: every op of a step launched on its own"}


def decode_as(model, mode, compiled):
    """Register how `model` decodes in `mode` (MODES), as trained_policy does for the files.
    compiled: the model's torch.compile wrapper, kept across modes so that coming back to
    `compile` does not compile again. -> whether the step is captured or compiled."""
    _COMPILED.pop(model, None)
    if mode == "default":
        capture_decoding(model)  # a GPU captures (or declines, as the files would); a CPU: eager
    elif mode == "compile":
        if model in compiled:
            _COMPILED[model] = compiled[model]
        else:
            compile_decoding(model)
            compiled[model] = _COMPILED[model]
    return model in _COMPILED


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", nargs="+", default=["135M"], choices=list(SHAPES))
    p.add_argument("--batch", type=int, nargs="+", default=[8, 32])
    p.add_argument("--new_tokens", type=int, nargs="+", default=[64, 128])
    p.add_argument("--prompt_len", type=int, default=150)
    p.add_argument("--micro_batch_size", type=int, default=8)
    p.add_argument("--bf16", action="store_true", help="bf16 weights (a GPU); fp32 otherwise")
    p.add_argument("--plot", default=None, help="write a figure here (needs matplotlib)")
    p.add_argument("--rollout_only", action="store_true",
                   help="skip the update (its figures print as -): a GPU's short leases")
    p.add_argument("--torch_linears", action="store_true",
                   help="on a CPU, decode through torch's own linear, not oneDNN's packed weights")
    p.add_argument("--unfused", action="store_true",
                   help="decode q/k/v and gate/up as separate matmuls, not one each")
    p.add_argument("--grow_static_cache", action="store_true",
                   help="with --compile: a static cache that grows as it fills")
    p.add_argument("--modes", nargs="+", choices=MODES, default=None,
                   help="how to decode, each in its own rows, in this order: "
                        + "; ".join(f"{m}: {h}" for m, h in MODE_HELP.items())
                        + " (default: all three on a GPU, default alone on a CPU)")
    p.add_argument("--compile", action="store_true", help="the same as --modes compile")
    args = p.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    modes = ["compile"] if args.compile else args.modes or (
        MODES if device.type == "cuda" else ["default"])
    # what the files decode with on this device (Speedups.for_device), less what is asked off
    base = Speedups.for_device(device)
    speedups = replace(base, packed_linears=base.packed_linears and not args.torch_linears,
                       fused_projections=not args.unfused,
                       grow_static_cache=args.grow_static_cache)
    dtype = torch.bfloat16 if args.bf16 else torch.float32
    bandwidth, flops = device_peaks(device)
    peak = flops[dtype]
    name = (torch.cuda.get_device_name() if device.type == "cuda"
            else f"CPU, {torch.get_num_threads()} threads")
    print(f"{name}: copy {bandwidth / 1e9:.1f} GB/s, matmul fp32 {flops[torch.float32] / 1e9:.0f} "
          f"GFLOP/s, bf16 {flops[torch.bfloat16] / 1e9:.0f} GFLOP/s; weights in {dtype}")
    if device.type == "cpu" and "default" in modes:
        print("(on a CPU the mode `default` decodes eagerly, as the files do there: capturing a "
              "step as a CUDA graph needs CUDA)")
    if not args.rollout_only and len(modes) > 1:
        print(f"(the update does not depend on the mode: it is measured in the {modes[0]} rows)")
    tok = load_tokenizer("tiny-random")
    rows = []
    header = ("| shape | batch | new tokens | mode | rollout tokens/s | of bound | linears alone | "
              "update tokens/s | MFU |")
    print(header + "\n" + "|---" * 9 + "|")
    # mode by mode, so that a run cut short has each shape's rows of the modes asked for first
    # (device_check's stage: the files' default at every shape before eager and compiled); each
    # shape's model is built once and kept for every mode
    models, compiled, alone = {}, {}, {}
    for mode in modes:
        for shape in args.shapes:
            if shape not in models:
                models[shape] = build(shape, dtype, device)
            model = models[shape]
            captured = decode_as(model, mode, compiled)
            label = mode if captured or mode == "eager" else f"{mode} (eager)"
            s = Shape(model, dtype)
            for batch in args.batch:
                # the linear layers alone, at any response length and mode but compile's (its
                # weights are not packed for oneDNN)
                pack = speedups.packed_linears and mode != "compile"
                if (shape, batch, pack) not in alone:
                    alone[shape, batch, pack] = linears_alone(model, batch, device, pack,
                                                              speedups.fused_projections)
                t_alone = alone[shape, batch, pack]
                for new in args.new_tokens:
                    row = measure(model, tok, s, args, device, speedups, batch, new,
                                  update=mode == modes[0] and not args.rollout_only,
                                  compiling=mode == "compile", peaks=(bandwidth, peak),
                                  what=f"{shape}, batch {batch}, {new} tokens")
                    # the step halfway through the responses, against its linear layers alone
                    row["alone"] = step_bound(s, batch, args.prompt_len + new // 2, bandwidth,
                                              peak) / t_alone
                    row.update(shape=shape, batch=batch, new=new, mode=label, t_alone=t_alone)
                    rows.append(row)
                    print(table_row(row), flush=True)
            _COMPILED.pop(model, None)  # a captured step's graph holds its cache: let it go
    if len(modes) > 1:
        order = {m: i for i, m in enumerate(modes)}
        print("\nside by side (shape, rows, new tokens, then mode):")
        print(header + "\n" + "|---" * 9 + "|")
        for row in sorted(rows, key=lambda r: (args.shapes.index(r["shape"]), r["batch"],
                                               r["new"], order[r["mode"].split()[0]])):
            print(table_row(row))
    if args.plot:
        plot(rows, args.plot)


def measure(model, tok, s, args, device, speedups, batch, new, update, compiling, peaks, what):
    """One rollout of `batch` rows and `new` tokens timed after one warm-up rollout (which
    captures or compiles the step), and, if `update`, the update over its sequences."""
    bandwidth, peak = peaks
    g = torch.Generator().manual_seed(0)
    # groups of 8 rows share a prompt, as a GRPO rollout does
    prompts = [torch.randint(100, 40000, (args.prompt_len,), generator=g).tolist()
               for _ in range(max(1, batch // 8))]
    prompts = [prompts[i // 8] for i in range(batch)]
    out = {}

    def roll():
        with fast_decoding(model, speedups=speedups) as decoder:
            out["gen"] = generate(model, tok, prompts, new, 1.0, 1.0,
                                  seeds=list(range(batch)), decoder=decoder)

    if compiling:  # the first rollout of a shape compiles it
        t0 = time.perf_counter()
        roll()
        print(f"(the first rollout of {what}, compiling: {time.perf_counter() - t0:.0f} s)",
              flush=True)
    t_roll = timed(roll, device, repeat=1)
    sampled = out["gen"].response_mask.sum().item()
    bound = rollout_bound(s, batch, args.prompt_len, new, bandwidth, peak)
    ids, mask = out["gen"].sequences()
    R = out["gen"].response_ids.shape[1]

    def step():
        model.zero_grad(set_to_none=True)
        for i in range(0, batch, args.micro_batch_size):
            lp, _ = token_logprobs(model, ids[i:i + args.micro_batch_size],
                                   mask[i:i + args.micro_batch_size], R)
            lp.sum().backward()

    update_tps = mfu = float("nan")
    if update:
        model.train()
        t_update = timed(step, device, repeat=1)
        model.eval()
        model.zero_grad(set_to_none=True)  # the gradients would stay for the other modes
        update_tps = batch * R / t_update
        mfu = update_flops(s, batch, args.prompt_len, R, max(1, batch // 8)) / t_update / peak
    return {"tokens_per_s": sampled / t_roll, "of_bound": bound / t_roll,
            "update_tokens_per_s": update_tps, "mfu": mfu}


def table_row(r):
    return (f"| {r['shape']} | {r['batch']} | {r['new']} | {r['mode']} | "
            f"{r['tokens_per_s']:.0f} | {r['of_bound']:.2f} | "
            f"{r['alone']:.2f} ({1e3 * r['t_alone']:.0f} ms) | {r['update_tokens_per_s']:.0f} | "
            f"{r['mfu']:.2f} |").replace("nan", "-")


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for key in sorted({(r["shape"], r["new"], r["mode"]) for r in rows}):
        pts = [(r["batch"], r["tokens_per_s"], r["of_bound"]) for r in rows
               if (r["shape"], r["new"], r["mode"]) == key]
        axes[0].plot([x for x, _, _ in pts], [y for _, y, _ in pts], "o-",
                     label=f"{key[0]}, {key[1]} new tokens, {key[2]}")
        axes[1].plot([x for x, _, _ in pts], [f for _, _, f in pts], "o-")
    axes[0].set(xlabel="batch (rows)", ylabel="rollout tokens/s", xscale="log", yscale="log")
    axes[1].set(xlabel="batch (rows)", ylabel="fraction of the bound", xscale="log", ylim=(0, 1))
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
