"""Host work per decode step and per update micro-batch, measured on a CPU. On a GPU an eager step is
host work: every top-level op is a kernel launch the Python process must issue, whatever the
compute. So this counts them (torch.profiler, ops not nested in another op) on a model of SmolLM2's
depth and attention shape (30 layers, 9 query and 3 key/value heads) at a tiny width, where compute
is nothing and what is left is the launches and the Python around them:

- per decode step (the difference between 17 and 1 new tokens, / 16): `model.generate` (TRL's
  path, with TRL GRPOConfig's sampling settings), `generate` with its plain `Decoder`, and
  `generate` with the FastDecoder the files use, with the speedups a GPU gets
  (`Speedups.for_device("cuda")`) and those a CPU gets;
- per update micro-batch: `token_logprobs` and its backward, the files' fast path against the plain
  forward and backward.

    python dev/lab/host_ops.py                  # 32 and 128 rows, a few seconds
    python dev/lab/host_ops.py --rows 32 --json

The figures are in dev/notes/gpu.md ("Host work"). Wall time per step is the CPU's, for scale only.
"""

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from common.models.fast.decoding import Speedups, fast_decoding  # noqa: E402
from common.models.logprobs import token_logprobs  # noqa: E402
from common.models.sampler import generate  # noqa: E402

# SmolLM2-135M's depth and heads, 8 dimensions per head: the launches of the real model, no compute
SHAPE = dict(hidden_size=72, intermediate_size=192, num_hidden_layers=30, num_attention_heads=9,
             num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True)
EOS = SHAPE["vocab_size"] - 1


def build(layers=SHAPE["num_hidden_layers"]):
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    config = LlamaConfig(**{**SHAPE, "num_hidden_layers": layers}, bos_token_id=1,
                         eos_token_id=EOS, pad_token_id=0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    # no row may stop early: the end-of-sequence token is never sampled
    with torch.no_grad():
        model.lm_head.weight[EOS] = 0.0
        model.model.embed_tokens.weight[EOS] = 0.0
    return model.eval()


def top_level_ops(fn):
    """(aten ops fn runs that no other aten op runs, its wall seconds without the profiler)."""
    t0 = time.perf_counter()
    fn()
    seconds = time.perf_counter() - t0
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    count = 0
    for event in prof.events():
        parent = event.cpu_parent
        while parent is not None and not parent.name.startswith("aten::"):
            parent = parent.cpu_parent
        count += event.name.startswith("aten::") and parent is None
    return count, seconds


def samplers(model, tokenizer, prompts):
    """{name: fn(new_tokens)} of the three ways to sample `prompts`."""
    from transformers import GenerationConfig

    from common.models.sampler import left_pad

    ids, mask = left_pad(prompts, 0)
    seeds = list(range(len(prompts)))

    def hf(new):  # TRL's GRPOTrainer: model.generate with these settings (top_k 0: none)
        config = GenerationConfig(max_new_tokens=new, min_new_tokens=new, do_sample=True,
                                  temperature=0.7, top_p=1.0, top_k=0, repetition_penalty=1.0,
                                  pad_token_id=0, eos_token_id=EOS, disable_compile=True)
        with torch.no_grad():
            model.generate(input_ids=ids, attention_mask=mask, generation_config=config)

    def ours(speedups):
        def run(new):
            context = (contextlib.nullcontext(None) if speedups is None
                       else fast_decoding(model, speedups=speedups))
            with context as decoder:
                gen = generate(model, tokenizer, prompts, new, 0.7, seeds=seeds, decoder=decoder)
            assert gen.response_mask.all(), "a row stopped early"
        return run
    return {"model.generate": hf, "plain Decoder": ours(None),
            "FastDecoder (a GPU's speedups)": ours(Speedups.for_device("cuda")),
            "FastDecoder (a CPU's speedups)": ours(Speedups.for_device("cpu"))}


def per_step(fn, steps=16):
    """Top-level ops and wall seconds of one decode step: (17 new tokens - 1 new token) / 16."""
    fn(1), fn(steps + 1)  # warm-up
    ops_1, s_1 = top_level_ops(lambda: fn(1))
    ops_n, s_n = top_level_ops(lambda: fn(steps + 1))
    return (ops_n - ops_1) / steps, (s_n - s_1) / steps


def update_ops(model, rows, prompt_len=150, response_len=24):
    """Top-level ops of one micro-batch's token_logprobs and backward: {fast, plain}."""
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(3, 40000, (prompt_len,), generator=g)
    ids = torch.cat([prompt.expand(rows, -1),
                     torch.randint(3, 40000, (rows, response_len), generator=g)], 1)
    mask = torch.ones_like(ids)
    out = {}
    for fast in (True, False):
        def step():
            model.zero_grad(set_to_none=True)
            logprobs, entropy = token_logprobs(model, ids, mask, response_len, 0.7, fast=fast)
            (logprobs.sum() + entropy.sum()).backward()
        step()
        out["fast" if fast else "plain"] = top_level_ops(step)[0]
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[32, 128])
    parser.add_argument("--prompt_len", type=int, default=150)
    parser.add_argument("--layers", type=int, default=SHAPE["num_hidden_layers"])
    parser.add_argument("--micro_batch", type=int, default=8, help="rows of the update's forward")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON line")
    args = parser.parse_args()
    torch.set_num_threads(1)  # host work is one thread's; the same count on any machine
    model = build(args.layers)
    tokenizer = SimpleNamespace(pad_token_id=0, eos_token_id=EOS)
    figures = {"decode": {}, "update": {}}
    for rows in args.rows:
        g = torch.Generator().manual_seed(rows)
        # a GRPO batch: groups of 8 rows share a prompt
        questions = [torch.randint(3, 40000, (args.prompt_len,), generator=g).tolist()
                     for _ in range(max(1, rows // 8))]
        prompts = [questions[i % len(questions)] for i in range(rows)]
        row = {}
        for name, fn in samplers(model, tokenizer, prompts).items():
            ops, seconds = per_step(fn)
            row[name] = {"ops": round(ops, 1), "ms": round(seconds * 1e3, 2)}
        figures["decode"][rows] = row
    model.train()
    figures["update"] = update_ops(model, args.micro_batch, args.prompt_len)
    if args.json:
        print(json.dumps(figures))
        return
    for rows, row in figures["decode"].items():
        base = row["model.generate"]["ops"]
        print(f"decode step, {rows} rows:")
        for name, f in row.items():
            print(f"  {name:32s} {f['ops']:7.1f} top-level ops ({f['ops'] / base:.2f}x "
                  f"model.generate's)  {f['ms']:6.2f} ms on this CPU")
    u = figures["update"]
    print(f"update micro-batch of {args.micro_batch} rows, token_logprobs + backward: fast "
          f"{u['fast']} top-level ops, plain forward + backward {u['plain']} "
          f"({u['fast'] / u['plain']:.2f}x)")


if __name__ == "__main__":
    main()
