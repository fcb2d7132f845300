"""An --fsdp rollout through the captured step (common/models/fast/graphs.py: a sharded model
decodes through its twin, lent the gathered weights): over two gloo processes, each rank draws the
tokens that the sharded model's own eager decoding draws, also after the weights change, and no
FSDP hook runs while it decodes; under --bf16 it draws, bit for bit, what a whole model with the
gathered bf16 weights draws through the same step. On a CPU the step runs without a CUDA graph
(graphs=False), as the other CPU tests of the captured step do."""

import torch

from common.models.fast.compile import _COMPILED
from common.models.fast.graphs import _TWINS, CapturedStep, capture_decoding
from common.models.hf import decoder_layers
from common.models.loading import load_policy, load_tokenizer
from common.models.sampler import encode_prompts
from common.models.sharding import shard
from gloo_ranks import run_ranks
from sampling import fast_generate

QUESTIONS = ["What is 2 + 3?", "What is 17 - 9?", "Name a prime.", "What is 6 * 7?"]


def sharded():
    policy = load_policy("tiny-random")
    return shard(policy, decoder_layers(policy), bf16=False)


def worker(rank, world):
    from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState

    hooks = []
    pre_forward = FSDPState._pre_forward

    def counted(self, *args, **kwargs):
        hooks.append(1)
        return pre_forward(self, *args, **kwargs)

    FSDPState._pre_forward = counted
    tok = load_tokenizer("tiny-random")
    eager, captured = sharded(), sharded()
    capture_decoding(captured, graphs=False)
    assert isinstance(_COMPILED[_TWINS[captured]], CapturedStep) and eager not in _TWINS
    # each rank its own prompts and seeds, as a rollout shares them out
    prompts = encode_prompts(tok, QUESTIONS[rank::world])
    seeds = [rank * 100 + k for k in range(len(prompts))]
    rows = []
    for rollout in range(2):
        hooks.clear()
        a = fast_generate(eager, tok, prompts, 10, 1.0, 1.0, seeds=seeds)
        eager_hooks = len(hooks)
        hooks.clear()
        b = fast_generate(captured, tok, prompts, 10, 1.0, 1.0, seeds=seeds)
        rows.append((a.response_ids.tolist(), b.response_ids.tolist(),
                     a.response_mask.tolist(), b.response_mask.tolist(),
                     (a.logprobs - b.logprobs).abs().max().item(), eager_hooks, len(hooks),
                     a.response_mask.sum().item()))
        # an optimizer step's worth of change, the same on both (each rank on its shard)
        with torch.no_grad():
            for p, q in zip(eager.parameters(), captured.parameters()):
                local = p.to_local()
                noise = torch.randn(local.shape, generator=torch.Generator().manual_seed(
                    local.numel() + rank)) * 0.05
                local.add_(noise)
                q.to_local().add_(noise)
    FSDPState._pre_forward = pre_forward
    return rows, bf16_twin_against_whole(tok, prompts, seeds)


def test_two_ranks_decode_through_the_twin_the_tokens_of_the_sharded_model():
    got = dict(enumerate(run_ranks(worker, 2)))
    first = {}
    for rank, (rows, (same_ids, same_logprobs, bf16_tokens)) in got.items():
        # under --bf16: bit for bit the step of a whole model with the gathered bf16 weights
        assert same_ids and same_logprobs and bf16_tokens >= 2 * 2
        for rollout, (ids_a, ids_b, mask_a, mask_b, logprob_gap, eager_hooks, twin_hooks,
                      tokens) in enumerate(rows):
            assert ids_a == ids_b and mask_a == mask_b
            assert logprob_gap < 1e-5
            # the eager decoding runs FSDP's hook at each of 3 units (2 layers and the root) for
            # each forward: at least the prefill and one decode step; the twin's, none
            assert eager_hooks >= 3 * 2 and eager_hooks % 3 == 0
            assert twin_hooks == 0
            assert tokens >= 2 * 4  # each row drew tokens
            first.setdefault(rank, []).append(ids_a)
    # the weights changed between the rollouts, and so did what was drawn
    assert all(a != b for a, b in first.values())


def bf16_twin_against_whole(tok, prompts, seeds):
    """Under --bf16 FSDP gathers bf16 weights. Any two paths that round differently draw different
    tokens from tiny-random, whose distributions are nearly flat; so the twin is held to the same
    step on a whole model with those weights. -> (same tokens, same log-probs, tokens drawn)"""
    whole = load_policy("tiny-random")
    for p in whole.parameters():  # what FSDP's mixed precision gathers: bf16 weights, the
        p.data = p.data.to(torch.bfloat16)  # buffers (the rotary frequencies) left fp32
    capture_decoding(whole, graphs=False)
    policy = load_policy("tiny-random")
    capture_decoding(shard(policy, decoder_layers(policy), bf16=True), graphs=False)
    kw = dict(seeds=seeds, autocast_dtype=torch.bfloat16)
    a = fast_generate(whole, tok, prompts, 12, 1.0, 1.0, **kw)
    b = fast_generate(policy, tok, prompts, 12, 1.0, 1.0, **kw)
    return (a.response_ids.tolist() == b.response_ids.tolist(),
            torch.equal(a.logprobs, b.logprobs), a.response_mask.sum().item())
