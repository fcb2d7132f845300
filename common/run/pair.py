"""async_grpo.py's two processes under torchrun: rank 0 trains, rank 1 samples. Rollouts go from 1
to 0, the weights after each update from 0 to 1. Every send is non-blocking and every receive
blocks, so each process waits only for what it needs next and never for the other to be ready to
listen: the sampler draws the next batch while the trainer trains on the last one.

    pair = Pair()                          # both ranks, after the models load
    # rank 1                               # rank 0
    pair.send_rollout(sampled)             sampled = pair.receive_rollout()
    pair.receive_weights(policy)           pair.send_weights(policy)

`SampledAhead` runs the schedule over it, or in one process without it.

The channel is a gloo group of its own, on the host, whatever the device: NCCL runs a pair's
sends and receives in one stream each, where two sends that cross would wait on each other.
A rollout travels as the bytes of torch.save and is read back with weights_only=True (tensors,
numbers, strings: the same format as a checkpoint's queue of rollouts, `rollout_state`)."""

import io
import time
from collections import deque
from dataclasses import dataclass, fields

import torch
import torch.distributed as dist

from common.env.errors import UsageError
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


def saved_queue(state, args, start, num_problems, path):
    """The queue of sampled batches in a resumed run's trainer state, checked against the options
    and its own layout before any model loads: each entry as rollout_state writes it, a batch of
    num_prompts x num_generations rows of the data's problems, drawn by weights no newer than the
    checkpoint's (update `start`). A batch of another shape would be cut into groups of the wrong
    size without a word, and a damaged one would fail mid-run with a traceback."""
    queue = ((state or {}).get("extra") or {}).get("queue", [])
    damaged = (f"--resume: the queue of sampled batches in {path} is damaged ({{}}): resume from "
               "an earlier checkpoint (delete this one), or pass another --output_dir.")
    if not isinstance(queue, list):
        raise UsageError(damaged.format(f"a {type(queue).__name__}, not a list"))
    keys = {"version", "seconds", "gen", "texts", "scores", "correct", "problems"}
    for i, entry in enumerate(queue):
        where = f"batch {i} of {len(queue)}"
        if not (isinstance(entry, dict) and set(entry) == keys and isinstance(entry["gen"], dict)
                and set(entry["gen"]) == {f.name for f in fields(Generation)}):
            raise UsageError(damaged.format(f"{where} lacks the fields of a batch"))
        gen, problems, version = entry["gen"], entry["problems"], entry["version"]
        tensors = [*gen.values(), entry["scores"], entry["correct"]]
        if not (all(isinstance(t, torch.Tensor) and t.dim() >= 1 for t in tensors)
                and isinstance(entry["texts"], list) and isinstance(problems, list)
                and type(version) is int):
            raise UsageError(damaged.format(f"{where} holds a field of another type"))
        alike = [{len(t) for t in tensors} | {len(entry["texts"])},  # each a set of one
                 {gen["prompt_ids"].shape, gen["prompt_mask"].shape},
                 {gen[k].shape for k in ("response_ids", "response_mask", "logprobs")}]
        if any(len(s) > 1 for s in alike) or not problems or len(entry["texts"]) % len(problems):
            raise UsageError(damaged.format(f"{where}'s fields differ in shape"))
        samples = len(entry["texts"]) // len(problems)
        if (len(problems), samples) != (args.num_prompts, args.num_generations):
            raise UsageError(f"--resume: {path} holds batches sampled ahead of {len(problems)} "
                             f"prompts x {samples} samples, which this run would cut into groups "
                             "of another size: resume with the checkpoint's --num_prompts and "
                             "--num_generations (the run folder's args.json has them), or pass "
                             "another --output_dir.")
        if not all(type(p) is int and 0 <= p < num_problems for p in problems):
            raise UsageError(damaged.format(f"{where} names problems outside the data's "
                                            f"{num_problems}: was the data changed?"))
        if not 0 <= version <= start:
            raise UsageError(damaged.format(f"{where} was drawn by the weights of update "
                                            f"{version}, and the checkpoint is at update {start}"))
    return queue


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


class SampledAhead:
    """The batches of the next updates, each sampled by the weights of k updates before its own
    (async_grpo.py's schedule): batch n is always drawn by update max(0, n - k)'s weights.

    One process: before update n it samples the batches up to update n + k with the weights as
    they are, and keeps them in a queue. Two processes (torchrun --nproc_per_node 2): rank 1 samples
    (`serve`) while rank 0 trains, and after each update rank 0 sends it the new weights. The queue
    rides in the checkpoint (`state`), so a resumed run trains on what this one would have.

    sample(position) -> the Rollout of update `position`'s problems with the weights as they are."""

    def __init__(self, run, staleness, sample, saved=()):
        self.k, self.sample, self.device = staleness, sample, run.device
        self.max_steps = run.args.max_steps
        self.queue = deque(rollout_from_state(s, run.device) for s in saved)
        self.pair = Pair() if run.world == 2 else None  # two processes: from here they part ways
        self.is_sampler = self.pair is not None and run.rank == SAMPLER

    def _sampled(self, position, version):
        t0 = time.time()
        batch = self.sample(position)
        return Sampled(version, batch, time.time() - t0)

    def serve(self, policy, start):
        """Rank 1 of two: it never trains. It samples update p's batch with the weights of update
        p - k, receiving them from the trainer as they are made, and sends it on; `start` is the
        update whose weights it loaded (a resumed run's checkpoint holds the queue before it)."""
        version = start  # the update whose weights this process holds
        for position in range(start + len(self.queue), self.max_steps):
            while version < position - self.k:  # the weights of update position - k
                self.pair.receive_weights(policy)
                version += 1
            self.pair.send_rollout(self._sampled(position, version))
        self.pair.close()

    def pop(self, step):
        """Update `step`'s batch: a `Sampled` (.version: the update whose weights drew it)."""
        if self.pair is not None:  # two processes: rank 1 sampled it while the last updates trained
            if not self.queue:
                self.queue.append(self.pair.receive_rollout(self.device))
        else:  # one process: the batches up to update step + k, with the weights as they are
            while len(self.queue) <= self.k and step + len(self.queue) < self.max_steps:
                self.queue.append(self._sampled(step + len(self.queue), step))
        return self.queue.popleft()

    def updated(self, policy, step):
        """After update `step`: two processes send the weights to the sampler, which draws update
        step + 1 + k's batch with them."""
        if self.pair is not None and step + 1 + self.k < self.max_steps:
            self.pair.send_weights(policy)

    def state(self, step):
        """The checkpoint's share after update `step`: the batches of the next updates, already
        sampled by weights that no longer exist (two processes: received from the sampler
        first)."""
        while self.pair is not None and len(self.queue) < min(self.k, self.max_steps - (step + 1)):
            self.queue.append(self.pair.receive_rollout(self.device))
        return [rollout_state(s) for s in self.queue]

    def close(self):
        if self.pair is not None:
            self.pair.close()
