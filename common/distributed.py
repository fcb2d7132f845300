"""Processes and seeds: torchrun's ranks (or one process, the world_size == 1 case), the
collectives the algorithm files use, and the seeds that make 1 process and N processes draw the
same samples (and a resumed run draw what the uninterrupted run would have). The order of the
problems is the env's (common/env/math_env.py), the order of an update's minibatches the run's
(common/run/run.py)."""

import atexit
import os
import random
import sys
import threading
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist


def is_dtensor(tensor) -> bool:
    """True for a DTensor (a sharded parameter, gradient or norm). torch.distributed.tensor takes
    about 1 s to import, which every run without --fsdp would pay for nothing: nothing is sharded
    before common.models.sharding.shard has imported it."""
    if "torch.distributed.tensor" not in sys.modules:
        return False
    from torch.distributed.tensor import DTensor

    return isinstance(tensor, DTensor)


# ------------------------------------------------------------------------------------------------
# Distributed (torchrun sets RANK/WORLD_SIZE/LOCAL_RANK; without them this is the world_size == 1
# case)
# ------------------------------------------------------------------------------------------------
@dataclass
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self):
        return self.rank == 0


def init_distributed():
    """This process's rank and device: the only process, or, under torchrun, `_join_torchrun`'s."""
    use_cuda = torch.cuda.is_available()
    if "RANK" not in os.environ:
        return DistInfo(device=torch.device("cuda" if use_cuda else "cpu"))
    return _join_torchrun(use_cuda)


def _join_torchrun(use_cuda):
    """init_distributed under torchrun: initialise from its environment, nccl on CUDA, gloo on
    CPU, and gloo where ranks share a GPU (more ranks on this machine than GPUs: a check of two
    processes on one device), since NCCL refuses two ranks on one device."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ["LOCAL_RANK"])
    if "TORCHELASTIC_RUN_ID" in os.environ:  # started by torchrun, which is this rank's parent
        watch_launcher(rank)
    shared_gpu = False
    if use_cuda:
        gpus = torch.cuda.device_count()
        shared_gpu = gpus < int(os.environ.get("LOCAL_WORLD_SIZE", world))
        torch.cuda.set_device(local % gpus)
        device = torch.device("cuda", local % gpus)
    else:
        device = torch.device("cpu")
        # N processes on one CPU would each start one thread per core and fight over them.
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))
    if not dist.is_initialized():
        nccl = use_cuda and not shared_gpu
        dist.init_process_group("nccl" if nccl else "gloo", device_id=device if nccl else None)
        # A process that exits with its groups alive leaves their threads to C++'s own teardown,
        # where gloo can abort a finished run ("terminate called without an active exception").
        atexit.register(_leave_groups)
    return DistInfo(rank, world, local, device)


def _leave_groups():
    if dist.is_initialized():
        dist.destroy_process_group()


# The exit status of a rank whose launcher died: 128 + SIGTERM, what torchrun's own shutdown of
# its ranks gives them. Nothing reads it (the launcher is gone), but it says "stopped from outside".
LAUNCHER_GONE = 143
_WATCHING = False  # one watch a process, however often init_distributed is called


def watch_launcher(rank, interval=1.0):
    """Stop this rank within `interval` seconds of its launcher's death. torchrun's agent is each
    rank's parent; killed with kill -9 it cannot stop its ranks, and they would train on and save
    into the run folder, orphans racing the run that a resume loop starts next. A daemon thread
    compares os.getppid() with the parent seen now: an orphan is handed to another parent (init or
    a subreaper), so any change means the launcher is gone. It prints one line and ends the process
    with os._exit: a thread cannot raise in the main thread, and a collective waiting on a peer that
    will never answer would hold a normal exit forever. A save cut short this way leaves the
    previous checkpoint whole, as any kill does (common/run/checkpoints.py)."""
    global _WATCHING
    if _WATCHING:
        return
    _WATCHING = True
    parent = os.getppid()

    def stop():
        try:
            print(f"error (rank {rank}): the launcher (torchrun, pid {parent}) is gone, so this "
                  "rank stops too; --resume continues from the last complete checkpoint.",
                  file=sys.__stderr__, flush=True)  # not sys.stderr: torch's excepthook buffers it
        finally:
            os._exit(LAUNCHER_GONE)

    def watch():
        while os.getppid() == parent:
            time.sleep(interval)
        stop()

    # A rank waiting in a collective learns first that a peer stopped ("Connection reset by
    # peer"); when its launcher is gone too, that error is this one, said as the others say it.
    said = sys.excepthook

    def excepthook(kind, error, traceback):
        if os.getppid() != parent:
            stop()
        said(kind, error, traceback)

    sys.excepthook = excepthook
    threading.Thread(target=watch, name="launcher-watch", daemon=True).start()


# async_grpo.py's processes part ways once its models load: under torchrun its last rank samples
# and the others train, data-parallel, so the trainers' collectives (gradients, metrics,
# checkpoints, evaluation) meet the trainers only, and the sampler's meet no other rank.
_GROUP = None  # the group this process's collectives meet (None: every rank, the default group)
_ALONE = False  # True: this process's collectives meet no other rank (async_grpo.py's sampler)


def part_ways(group=None):
    """From here on this process's collectives meet only `group`'s ranks (async_grpo.py's
    trainers), or, given None, no other rank (its sampler)."""
    global _GROUP, _ALONE
    _GROUP, _ALONE = group, group is None


def collective_group():
    """The group this process's collectives meet (None: the default group of every rank)."""
    return _GROUP


def world_size():
    """The ranks this process's collectives meet (1: one process, or async_grpo.py's sampler)."""
    if _ALONE or not dist.is_initialized():
        return 1
    return dist.get_world_size(_GROUP)


def print0(*args, **kwargs):
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(*args, **kwargs, flush=True)


def all_reduce_mean(metrics, device=torch.device("cpu")):
    """Dict of floats -> the same dict averaged over ranks (one collective for all keys)."""
    if world_size() == 1:
        return dict(metrics)
    keys = sorted(metrics)
    t = torch.tensor([float(metrics[k]) for k in keys], dtype=torch.float64, device=device)
    dist.all_reduce(t, group=_GROUP)
    return {k: v / world_size() for k, v in zip(keys, t.tolist())}


def all_reduce_stats(stats, keys=(), device=torch.device("cpu")):
    """Micro-batch statistics (a list of dicts) -> each key's mean over every rank's dicts that hold
    it, NaN where none does. Ranks may hold different keys (online DPO's rank whose pairs all have
    weight 0 measures nothing), so their union is gathered first; `keys` are always logged."""
    names = set(keys).union(*stats)
    names = sorted(set().union(*all_gather_objects(sorted(names))))
    sums = torch.tensor([[sum(s[k] for s in stats if k in s), sum(k in s for s in stats)]
                         for k in names], dtype=torch.float64, device=device).reshape(-1, 2)
    sums = all_reduce_sum(sums).tolist()
    return {k: total / count if count else float("nan") for k, (total, count) in zip(names, sums)}


def all_reduce_sum(x):
    """Tensor summed over ranks (in place), e.g. a global token count for a loss denominator."""
    if world_size() > 1:
        dist.all_reduce(x, group=_GROUP)
    return x


def all_gather_objects(obj):
    """Python object from every rank -> list of them (rank order)."""
    if world_size() == 1:
        return [obj]
    out = [None] * world_size()
    dist.all_gather_object(out, obj, group=_GROUP)
    return out


def broadcast_parameters(module):
    """Every rank starts from rank 0's weights, whatever its own initialisation did."""
    if world_size() > 1:
        for p in module.parameters():
            dist.broadcast(p.data, src=0, group=_GROUP)  # src: global rank 0


# DDP's default bucket (bucket_cap_mb = 25): big enough that a collective's fixed cost (a launch, a
# rendezvous of the ranks) is paid a few times an update, not once per parameter
BUCKET_BYTES = 25 * 2**20


def average_gradients(module, bucket_bytes=BUCKET_BYTES):
    """What DDP does, once per optimizer step, after every micro-batch has added its gradients:
    their mean over ranks. Here, not in backward hooks, accumulation needs no `no_sync`. The
    gradients travel in buckets of about `bucket_bytes`, one all_reduce each, the next bucket on
    its way while the last is copied back; each element is summed and divided as it would be
    alone, so the result is the per-parameter average's, bit for bit."""
    if world_size() == 1:
        return
    # sharded (FSDP2) gradients were already reduce-scattered and averaged in backward
    grads = [p.grad for p in module.parameters()
             if p.requires_grad and p.grad is not None and not is_dtensor(p.grad)]
    in_flight = None
    for bucket in gradient_buckets(grads, bucket_bytes):
        flat = torch.cat([g.reshape(-1) for g in bucket])
        work = dist.all_reduce(flat, async_op=True, group=_GROUP)
        if in_flight is not None:
            _copy_back(*in_flight)
        in_flight = (work, flat, bucket)
    if in_flight is not None:
        _copy_back(*in_flight)


def gradient_buckets(grads, bucket_bytes):
    """`grads` cut into consecutive buckets of one dtype and device, each holding gradients up to
    `bucket_bytes` in all (a larger gradient is a bucket of its own)."""
    bucket, size = [], 0
    for g in grads:
        nbytes = g.numel() * g.element_size()
        if bucket and (size + nbytes > bucket_bytes or (g.dtype, g.device) != (bucket[0].dtype,
                                                                              bucket[0].device)):
            yield bucket
            bucket, size = [], 0
        bucket.append(g)
        size += nbytes
    if bucket:
        yield bucket


def _copy_back(work, flat, bucket):
    work.wait()
    flat.div_(world_size())
    for g, part in zip(bucket, flat.split([g.numel() for g in bucket])):
        g.copy_(part.view_as(g))


def collective_device():
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


# ------------------------------------------------------------------------------------------------
# Seeds
# ------------------------------------------------------------------------------------------------
def set_seed(seed):
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np

        np.random.seed(seed % 2**32)
    except ImportError:
        pass


def sample_seed(seed, step, sample_index):
    """Sampling seed of one response, from (run seed, update, global sample index). Runs are
    reproducible, the samples do not depend on how many ranks share the batch, and a resumed run
    draws exactly what the uninterrupted run would have."""
    return (seed * 1_000_003 + step) * 1_000_003 + sample_index
