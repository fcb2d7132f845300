"""Bucketed gradient averaging (common/distributed.py: `average_gradients`): the buckets cut
as worked by hand, and over two gloo processes the mean of every rank's gradient, bit for bit what
one all_reduce per parameter gives, with one all_reduce per bucket. (The files' 1-vs-2-process
tests, tests/test_grpo.py and tests/test_sharding.py among them, run it inside whole updates.)"""

import torch
import torch.distributed as dist

from common import distributed
from common.distributed import average_gradients, gradient_buckets
from gloo_ranks import run_ranks


def sizes(buckets):
    return [[g.numel() for g in bucket] for bucket in buckets]


def test_the_buckets_are_cut_as_worked_by_hand():
    # fp32: 4 bytes an element, buckets of 160 bytes (40 elements). 10 + 30 fill one; 5 starts the
    # next, which 100 would overflow, so 100 (more than a bucket) is a bucket of its own; then a
    # bf16 gradient starts another bucket whatever the room (one flat tensor holds one dtype).
    grads = [torch.zeros(10), torch.zeros(3, 10), torch.zeros(5), torch.zeros(100),
             torch.zeros(2, dtype=torch.bfloat16), torch.zeros(8, dtype=torch.bfloat16),
             torch.zeros(1)]
    assert sizes(gradient_buckets(grads, 160)) == [[10, 30], [5], [100], [2, 8], [1]]
    assert sizes(gradient_buckets(grads, 10**9)) == [[10, 30, 5, 100], [2, 8], [1]]
    assert list(gradient_buckets([], 160)) == []


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Parameter(torch.zeros(10))
        self.b = torch.nn.Parameter(torch.zeros(3, 10))
        self.frozen = torch.nn.Parameter(torch.zeros(4), requires_grad=False)
        self.c = torch.nn.Parameter(torch.zeros(5))
        self.d = torch.nn.Parameter(torch.zeros(100))
        self.e = torch.nn.Parameter(torch.zeros(6, dtype=torch.bfloat16))


def gradients(rank):
    """Each rank's gradients: different on every rank and in every parameter, in sizes 10^rank
    apart, so that a gradient copied back to another's place, or not divided, shows."""
    g = torch.Generator().manual_seed(rank)
    return {n: torch.randn(p.shape, generator=g).to(p.dtype) * 10 ** rank
            for n, p in Model().named_parameters() if p.requires_grad}


def worker(rank, world):
    calls = []
    reduce = dist.all_reduce

    def counted(tensor, *args, **kwargs):
        calls.append(tensor.numel())
        return reduce(tensor, *args, **kwargs)

    dist.all_reduce = counted
    results = {}
    for bucket_bytes in (160, distributed.BUCKET_BYTES):
        model = Model()
        for n, p in model.named_parameters():
            if p.requires_grad:
                p.grad = gradients(rank)[n].clone()
        calls.clear()
        average_gradients(model, bucket_bytes)
        results[bucket_bytes] = ({n: p.grad.clone() for n, p in model.named_parameters()
                                  if p.grad is not None}, list(calls))
    dist.all_reduce = reduce
    # the per-parameter mean, one all_reduce each, as average_gradients did before buckets
    alone = {}
    for n, g in gradients(rank).items():
        dist.all_reduce(g)
        alone[n] = g.div_(2)
    return results, alone


def test_two_processes_average_in_buckets_what_each_parameter_averages_alone():
    got = dict(enumerate(run_ranks(worker, 2)))
    r0, r1 = gradients(0), gradients(1)
    for rank in range(2):
        results, alone = got[rank]
        # 160-byte buckets: a+b (40 elements), c (5), d (100), e (bf16, 6); one bucket of 25 MiB
        # holds every fp32 gradient, and the bf16 one is a second
        assert results[160][1] == [40, 5, 100, 6]
        assert results[distributed.BUCKET_BYTES][1] == [145, 6]
        for bucket_bytes in results:
            grads = results[bucket_bytes][0]
            assert sorted(grads) == ["a", "b", "c", "d", "e"]  # the frozen weight has none
            for n, g in grads.items():
                assert torch.equal(g, alone[n])  # bit for bit
                assert g.dtype == r0[n].dtype
                assert torch.allclose(g.float(), (r0[n].float() + r1[n].float()) / 2,
                                      rtol=1e-2 if g.dtype == torch.bfloat16 else 1e-6)
    assert all(torch.equal(got[0][0][160][0][n], got[1][0][160][0][n]) for n in r0)


def test_one_process_leaves_the_gradients_as_they_are():
    model = Model()
    for n, p in model.named_parameters():
        if p.requires_grad:
            p.grad = gradients(0)[n].clone()
    average_gradients(model, 160)
    assert all(torch.equal(p.grad, gradients(0)[n]) for n, p in model.named_parameters()
               if p.grad is not None)
