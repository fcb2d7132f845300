"""async_grpo.py's two processes under torchrun: rank 0 trains, rank 1 samples. Rollouts go from 1
to 0, the weights after each update from 0 to 1. Every send is non-blocking and every receive
blocks, so each process waits only for what it needs next and never for the other to be ready to
listen: the sampler draws the next batch while the trainer trains on the last one.

    pair = Pair()                          # both ranks, after the models load
    # rank 1                               # rank 0
    pair.send_rollout(sampled)             sampled = pair.receive_rollout()
    pair.receive_weights(policy)           pair.send_weights(policy)

The channel is a gloo group of its own, on the host, whatever the device: NCCL runs a pair's
sends and receives in one stream each, where two sends that cross would wait on each other.
A rollout travels as the bytes of torch.save and is read back with weights_only=True (tensors,
numbers, strings: the same format as a checkpoint's queue of rollouts, `rollout_state`)."""

import io
from dataclasses import dataclass

import torch
import torch.distributed as dist

from common.models.distributed import part_ways
from common.models.sampler import Generation, Rollout

TRAINER, SAMPLER = 0, 1  # the ranks


@dataclass
class Sampled:
    """One update's batch as the sampler made it."""
    version: int  # the update whose weights sampled it (the weights after `version` updates)
    rollout: Rollout
    seconds: float  # how long sampling and grading it took


def rollout_state(sampled):
    """Sampled -> a dict of tensors, numbers and strings (a checkpoint's, or the bytes sent)."""
    r = sampled.rollout
    return {"version": sampled.version, "seconds": sampled.seconds,
            "gen": {k: v.cpu() for k, v in vars(r.gen).items()}, "texts": list(r.texts),
            "scores": r.scores.cpu(), "correct": r.correct.cpu(), "problems": list(r.problems)}


def rollout_from_state(state, device):
    """The inverse of rollout_state, its tensors on `device`."""
    gen = Generation(**{k: v.to(device) for k, v in state["gen"].items()})
    rollout = Rollout(gen, state["texts"], state["scores"].to(device),
                      state["correct"].to(device), state["problems"])
    return Sampled(state["version"], rollout, state["seconds"])


class Pair:
    def __init__(self):
        """Every rank calls it, after anything the two do together (the models' loading)."""
        self.group = dist.new_group(backend="gloo")
        self.in_flight = []  # (work, buffer) of the sends not yet received: the buffers live on
        part_ways()

    def _send(self, tensor, dst):
        self.in_flight = [(w, b) for w, b in self.in_flight if not w.is_completed()]
        self.in_flight.append((dist.isend(tensor, dst, group=self.group), tensor))

    def send_rollout(self, sampled):
        buffer = io.BytesIO()
        torch.save(rollout_state(sampled), buffer)
        data = torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)
        self._send(torch.tensor([data.numel()]), TRAINER)  # its length, then its bytes
        self._send(data, TRAINER)

    def receive_rollout(self, device):
        length = torch.zeros(1, dtype=torch.long)
        dist.recv(length, SAMPLER, group=self.group)
        data = torch.empty(int(length), dtype=torch.uint8)
        dist.recv(data, SAMPLER, group=self.group)
        state = torch.load(io.BytesIO(data.numpy().tobytes()), weights_only=True)
        return rollout_from_state(state, device)

    def send_weights(self, module):
        """The trained weights (LoRA: the adapters), one flat fp32 copy on the host."""
        trained = [p for p in module.parameters() if p.requires_grad]
        self._send(torch.cat([p.detach().float().reshape(-1).cpu() for p in trained]), SAMPLER)

    def receive_weights(self, module):
        trained = [p for p in module.parameters() if p.requires_grad]
        flat = torch.empty(sum(p.numel() for p in trained))
        dist.recv(flat, TRAINER, group=self.group)
        with torch.no_grad():
            for p, value in zip(trained, flat.split([p.numel() for p in trained])):
                p.copy_(value.view_as(p))

    def close(self):
        """Wait until the other process has received every send."""
        for work, _ in self.in_flight:
            work.wait()
        self.in_flight = []
