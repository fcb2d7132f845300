"""async_grpo.py's processes under torchrun: the last rank samples, the others train,
data-parallel. Each batch goes from the sampler to every trainer, whole (each trains on its own
rows of it, and each checkpoint's queue holds whole batches); the weights after each update go
from trainer rank 0 to the sampler. Every send is non-blocking and every receive blocks, so each
process waits only for what it needs next and never for the other to be ready to listen: the
sampler draws the next batch while the trainers train on the last one.

    pair = Pair()                          # every rank, after the models load
    # the sampler (last rank)              # each trainer (rank 0 ... world - 2)
    pair.send_rollout(sampled)             sampled = pair.receive_rollout()
    pair.receive_weights(policy)           pair.send_weights(policy)   # rank 0 only

`SampledAhead` runs the schedule over it, or in one process without it.

The batches travel on a gloo group of their own, on the host, whatever the device: NCCL runs a
pair's sends and receives in one stream each, where two sends that cross would wait on each other.
A rollout travels as the bytes of torch.save and is read back with weights_only=True (tensors,
numbers, strings: the same format as a checkpoint's queue of rollouts, `rollout_state`). The
weights travel on a group of trainer rank 0 and the sampler alone, one way only (so NCCL's one
stream holds no crossing), on the collectives' device (`collective_device`): with NCCL (a GPU per
rank) from GPU to GPU, no host copy; with gloo (CPU, or ranks that share a GPU, which NCCL
refuses) through host memory."""

import io
import time
from collections import deque
from dataclasses import dataclass, fields

import torch
import torch.distributed as dist

from common.errors import UsageError
from common.distributed import collective_device, part_ways
from common.models.sampler import Generation, Rollout

TRAINER = 0  # the rank that sends the weights (and writes logs and checkpoints)


@dataclass
class Sampled:
    """One update's batch as the sampler made it."""
    version: int  # the update whose weights sampled it (the weights after `version` updates)
    rollout: Rollout
    seconds: float  # how long sampling and grading it took

    def share(self, first_prompt, local_prompts):
        """One trainer's rows of the batch: the groups of its local_prompts prompts from the
        first (grpo.py's share of a rank), as a Rollout."""
        r = self.rollout
        G = len(r.texts) // len(r.problems)
        rows = slice(first_prompt * G, (first_prompt + local_prompts) * G)
        return Rollout(r.gen.rows(rows), r.texts[rows], r.scores[rows], r.correct[rows],
                       r.problems[first_prompt:first_prompt + local_prompts])


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
        """Every rank calls it, after anything they all do together (the models' loading)."""
        world = dist.get_world_size()
        self.sampler, self.trainers = world - 1, range(world - 1)  # ranks
        self.group = dist.new_group(backend="gloo")  # the batches
        self.weights = dist.new_group([TRAINER, self.sampler])  # the default backend: NCCL on GPUs
        trainers = dist.new_group(list(self.trainers))  # gradients, metrics, checkpoints, eval
        self.device = collective_device()
        self.in_flight = []  # (work, buffer) of the sends not yet received: the buffers live on
        part_ways(None if dist.get_rank() == self.sampler else trainers)

    def _send(self, tensor, dst, group):
        self.in_flight = [(w, b) for w, b in self.in_flight if not w.is_completed()]
        self.in_flight.append((dist.isend(tensor, dst, group=group), tensor))

    def send_rollout(self, sampled):
        """The whole batch to every trainer."""
        buffer = io.BytesIO()
        torch.save(rollout_state(sampled), buffer)
        data = torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)
        for trainer in self.trainers:
            self._send(torch.tensor([data.numel()]), trainer, self.group)  # its length, its bytes
            self._send(data, trainer, self.group)

    def receive_rollout(self, device):
        length = torch.zeros(1, dtype=torch.long)
        dist.recv(length, self.sampler, group=self.group)
        data = torch.empty(int(length), dtype=torch.uint8)
        dist.recv(data, self.sampler, group=self.group)
        state = torch.load(io.BytesIO(data.numpy().tobytes()), weights_only=True)
        return rollout_from_state(state, device)

    def send_weights(self, module):
        """The trained weights (LoRA: the adapters), one flat fp32 copy on the collectives'
        device (a copy, so that the next update may change the weights while it travels)."""
        trained = [p for p in module.parameters() if p.requires_grad]
        flat = torch.cat([p.detach().float().reshape(-1) for p in trained]).to(self.device)
        self._send(flat, self.sampler, self.weights)

    def receive_weights(self, module):
        trained = [p for p in module.parameters() if p.requires_grad]
        flat = torch.empty(sum(p.numel() for p in trained), device=self.device)
        dist.recv(flat, TRAINER, group=self.weights)
        with torch.no_grad():
            for p, value in zip(trained, flat.split([p.numel() for p in trained])):
                p.copy_(value.view_as(p))

    def close(self):
        """Wait until the other processes have received every send."""
        for work, _ in self.in_flight:
            work.wait()
        self.in_flight = []


class SampledAhead:
    """The batches of the next updates, each sampled by the weights of k updates before its own
    (async_grpo.py's schedule): batch n is always drawn by update max(0, n - k)'s weights.

    One process: before update n it samples the batches up to update n + k with the weights as
    they are, and keeps them in a queue. Under torchrun the last rank samples (`serve`) while the
    others train, and after each update rank 0 sends it the new weights. Every trainer holds the
    whole batches (its own rows are `Sampled.share`); the queue rides in the checkpoint (`state`),
    so a resumed run, on any number of processes, trains on what this one would have.

    sample(position) -> the Rollout of update `position`'s problems with the weights as they are."""

    def __init__(self, run, staleness, sample, saved=()):
        self.k, self.sample, self.device = staleness, sample, run.device
        self.max_steps = run.args.max_steps
        self.queue = deque(rollout_from_state(s, run.device) for s in saved)
        self.pair = Pair() if run.world > 1 else None  # under torchrun: from here they part ways
        self.is_sampler = self.pair is not None and run.rank == self.pair.sampler
        self.sends_weights = self.pair is not None and run.rank == TRAINER

    def _sampled(self, position, version):
        t0 = time.time()
        batch = self.sample(position)
        return Sampled(version, batch, time.time() - t0)

    def serve(self, policy, start):
        """The last rank: it never trains. It samples update p's batch with the weights of update
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
        if self.pair is not None:  # torchrun: the sampler drew it while the last updates trained
            if not self.queue:
                self.queue.append(self.pair.receive_rollout(self.device))
        else:  # one process: the batches up to update step + k, with the weights as they are
            while len(self.queue) <= self.k and step + len(self.queue) < self.max_steps:
                self.queue.append(self._sampled(step + len(self.queue), step))
        return self.queue.popleft()

    def updated(self, policy, step):
        """After update `step`: under torchrun trainer rank 0 sends the weights to the sampler,
        which draws update step + 1 + k's batch with them (every trainer holds the same)."""
        if self.sends_weights and step + 1 + self.k < self.max_steps:
            self.pair.send_weights(policy)

    def state(self, step):
        """The checkpoint's share after update `step`: the batches of the next updates, already
        sampled by weights that no longer exist (torchrun: received from the sampler first, by
        every trainer)."""
        while self.pair is not None and len(self.queue) < min(self.k, self.max_steps - (step + 1)):
            self.queue.append(self.pair.receive_rollout(self.device))
        return [rollout_state(s) for s in self.queue]

    def close(self):
        if self.pair is not None:
            self.pair.close()
