"""How much faster a leaner CPU decode could be: an upper estimate, not what `generate` runs.

    python dev/lab/decode_sketch.py       # SmolLM2-135M shape, the default GRPO rollout, ~2 min
    python dev/lab/decode_sketch.py --repeat 3

`generate` decodes through transformers' forward. This sketch writes the decode step of a
Llama-shaped model out by hand, as gpt-fast does, and changes two things:
- no glue around the layers (kwargs, masks rebuilt every token, cache objects, output objects): a
  step calls the model's own norms, rotary embedding and linear layers (through the same packed
  weights as `generate`), attention and the head;
- the prompt's keys and values are kept once per GRPO group and read once for the group's rows
  (its 8 rows x 3 query heads per key/value head become 24 queries of one matmul), while `generate`
  copies them to every row and reads them once per row.
It leaves out what a real engine needs (rows that finish early, stop strings, left padding, the
stepwise files' PrefixCache), so it bounds from above what such an engine would gain. Both sample
the same way (`sample_token` with per-row seeds), on random weights, prompts as dev/lab/roofline.py's.
Printed: tokens/s of each, alternating, their fraction of the roofline bound, and how many rows
drew the same tokens both ways (up to rounding, about 1e-6 in the logits, all of them should).
"""

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from dev.lab.roofline import Shape, build, device_peaks, rollout_bound  # noqa: E402
from common.models.fast.attention import _packed_gqa  # noqa: E402
from common.models.fast.linears import _onednn_linears  # noqa: E402
from common.models.fast.decoding import fast_decoding  # noqa: E402
from common.models.hf import KV_CACHE  # noqa: E402
from common.models.loading import load_tokenizer  # noqa: E402
from common.models.sampler import generate, key_uniforms, row_keys, sample_token  # noqa: E402


def sketch_rollout(model, prompts, group, new_tokens, seeds):
    """Prefill each distinct prompt once, then decode every row for new_tokens tokens by hand."""
    c = model.config
    Hq, Hk = c.num_attention_heads, c.num_key_value_heads
    D, G = c.hidden_size // Hq, Hq // Hk
    ids = torch.tensor(prompts[::group])  # [P, W], one row per group (equal lengths: no padding)
    P, W = ids.shape
    B = P * group
    layers = model.model.layers
    with torch.no_grad(), _packed_gqa(model), _onednn_linears(model, True):
        out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
        prompt_kv = [(layer.keys, layer.values) for layer in getattr(out, KV_CACHE).layers]
        response_kv = [(torch.empty(B, Hk, new_tokens, D), torch.empty(B, Hk, new_tokens, D))
                       for _ in layers]
        logits = out.logits[:, -1].repeat_interleave(group, 0)
        keys, tokens = row_keys(torch.tensor(seeds)), []
        for t in range(new_tokens):
            token, _ = sample_token(logits, 1.0, 1.0, key_uniforms(keys, t))
            tokens.append(token)
            if t == new_tokens - 1:
                break
            x = model.model.embed_tokens(token)  # [B, H]
            cos, sin = model.model.rotary_emb(x[:, None], torch.full((B, 1), W + t))  # [B, 1, D]
            for (Kp, Vp), (Kr, Vr), layer in zip(prompt_kv, response_kv, layers):
                attn, mlp = layer.self_attn, layer.mlp
                h = layer.input_layernorm(x)
                q, k = apply_rotary_pos_emb(attn.q_proj(h).view(B, Hk, G, D),
                                            attn.k_proj(h).view(B, Hk, 1, D), cos, sin)
                Kr[:, :, t], Vr[:, :, t] = k[:, :, 0], attn.v_proj(h).view(B, Hk, D)
                # the group's rows x query heads as one matmul over the group's prompt keys
                qg = q.view(P, group, Hk, G, D).transpose(1, 2).reshape(P, Hk, group * G, D)
                sp = (qg @ Kp.transpose(-1, -2)).view(P, Hk, group, G, W).transpose(1, 2)
                sr = q @ Kr[:, :, :t + 1].transpose(-1, -2)  # [B, Hk, G, t + 1]
                probs = (torch.cat([sp.reshape(B, Hk, G, W), sr], -1) * attn.scaling).softmax(-1)
                pp, pr = probs.split([W, t + 1], -1)
                pp = pp.reshape(P, group, Hk, G, W).transpose(1, 2).reshape(P, Hk, group * G, W)
                a = ((pp @ Vp).view(P, Hk, group, G, D).transpose(1, 2).reshape(B, Hk, G, D)
                     + pr @ Vr[:, :, :t + 1])
                x = x + attn.o_proj(a.reshape(B, Hq * D))
                h = layer.post_attention_layernorm(x)
                x = x + mlp.down_proj(F.silu(mlp.gate_proj(h)) * mlp.up_proj(h))
            logits = model.lm_head(model.model.norm(x))
    return torch.stack(tokens, 1)


def fast_rollout(model, tok, prompts, new_tokens, seeds):
    """What the algorithm files sample: `generate` with the FastDecoder."""
    with fast_decoding(model) as decoder:
        return generate(model, tok, prompts, new_tokens, 1.0, 1.0, seeds=seeds, decoder=decoder)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--group", type=int, default=8, help="rows per prompt (GRPO's group)")
    p.add_argument("--prompt_len", type=int, default=150)
    p.add_argument("--new_tokens", type=int, default=64)
    p.add_argument("--repeat", type=int, default=2, help="timings of each, alternating")
    args = p.parse_args()
    device = torch.device("cpu")
    model = build("135M", torch.float32, device)  # the Llama shape the sketch is written for
    bandwidth, flops = device_peaks(device)
    B = args.prompts * args.group
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(100, 40000, (args.prompt_len,), generator=g).tolist()
               for _ in range(args.prompts)]
    prompts = [prompts[i // args.group] for i in range(B)]
    seeds = list(range(B))
    bound = rollout_bound(Shape(model, torch.float32), B, args.prompt_len, args.new_tokens,
                          bandwidth, flops[torch.float32])
    tok = load_tokenizer("tiny-random")
    runs = {
        "generate": lambda: fast_rollout(model, tok, prompts, args.new_tokens, seeds),
        "sketch": lambda: sketch_rollout(model, prompts, args.group, args.new_tokens, seeds),
    }
    best, out = {}, {}
    for name, run in runs.items():  # warm-up
        out[name] = run()
    for _ in range(args.repeat):
        for name, run in runs.items():
            t0 = time.perf_counter()
            run()
            best[name] = min(best.get(name, float("inf")), time.perf_counter() - t0)
    print(f"CPU, {torch.get_num_threads()} threads: copy {bandwidth / 1e9:.1f} GB/s, matmul fp32 "
          f"{flops[torch.float32] / 1e9:.0f} GFLOP/s; {B} rows, {args.new_tokens} new tokens, "
          f"best of {args.repeat}")
    sampled = out["generate"].response_mask.sum().item()
    for name, seconds in best.items():
        n = sampled if name == "generate" else out[name].numel()
        print(f"{name:9s} {n / seconds:6.0f} tokens/s  {bound / seconds:.2f} of bound  "
              f"({seconds:.2f} s)")
    same = (out["generate"].response_ids == out["sketch"]).all(1).sum().item()
    print(f"sketch / generate: {best['generate'] / best['sketch']:.2f}x; rows with the same tokens "
          f"both ways: {same} of {B}")


if __name__ == "__main__":
    main()
