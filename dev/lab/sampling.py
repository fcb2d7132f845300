"""The per-token cost of drawing one seeded sample per row, two ways, in the same run:

- per-row generators (what the sampler did before): a torch.Generator per row and one
  `torch.multinomial` call per row, a Python loop of B calls at every token;
- vectorized (what it does now): `row_uniforms` hashes (seed, token index) into one uniform per row,
  and `inverse_cdf` draws every row at once.

Both sample from softmax(logits / temperature) of the same random logits, and each row's draw depends
on its own seed only.

    python dev/lab/sampling.py                            # B = 8, 32, 128 rows, SmolLM2's 49,152 tokens
    python dev/lab/sampling.py --batch 64 256 --vocab 151936 --tokens 32   # a Qwen2.5 vocabulary
"""

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from common.models.sampler import row_uniforms, sample_token  # noqa: E402


def per_row_generators(logits, temperature, generators):
    """The earlier sample_token, token and log-prob."""
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    probs = logp.exp()
    token = torch.cat([torch.multinomial(p, 1, generator=g) for p, g in zip(probs, generators)])
    return token, logp.gather(-1, token[:, None])[:, 0]


def ms_per_token(step, tokens):
    step(0)  # warm-up
    t0 = time.perf_counter()
    for t in range(tokens):
        step(t)
    return (time.perf_counter() - t0) / tokens * 1e3


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, nargs="+", default=[8, 32, 128])
    p.add_argument("--vocab", type=int, default=49152)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.7)
    args = p.parse_args()
    torch.manual_seed(0)
    print(f"{torch.get_num_threads()} threads, vocabulary {args.vocab}, {args.tokens} tokens")
    print("| rows | per-row generators ms/token | vectorized ms/token | ratio |")
    print("|---|---|---|---|")
    for batch in args.batch:
        logits = torch.randn(batch, args.vocab)
        seeds = torch.arange(batch) * 1_000_003 + 12345
        generators = [torch.Generator().manual_seed(int(s)) for s in seeds]
        old = ms_per_token(lambda t: per_row_generators(logits, args.temperature, generators),
                           args.tokens)
        new = ms_per_token(lambda t: sample_token(logits, args.temperature, 1.0,
                                                  row_uniforms(seeds, t)), args.tokens)
        print(f"| {batch} | {old:.2f} | {new:.2f} | {new / old:.2f} |", flush=True)


if __name__ == "__main__":
    main()
