"""`run_ranks(work, world)`: `work(rank, world)` in `world` forked processes that share a gloo
group, each one's return value brought back (as bytes of torch.save: torch would otherwise share
tensors through a process that has exited), in rank order. The tests of collectives that a file's
own torchrun launch would make slow use it."""

import io
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _rank(work, rank, world, port, out):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        buffer = io.BytesIO()
        torch.save((rank, work(rank, world)), buffer)
        out.put(buffer.getvalue())
    finally:
        dist.destroy_process_group()


def run_ranks(work, world, timeout=120):
    with socket.socket() as s:  # a port no one listens on: pytest -n 2 runs tests side by side
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    context = mp.get_context("fork")
    out = context.SimpleQueue()
    workers = [context.Process(target=_rank, args=(work, rank, world, port, out))
               for rank in range(world)]
    for w in workers:
        w.start()
    got = dict(torch.load(io.BytesIO(out.get())) for _ in workers)
    for w in workers:
        w.join(timeout=timeout)
        assert w.exitcode == 0
    return [got[rank] for rank in range(world)]
