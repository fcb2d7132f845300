"""--offload_optimizer, ZeRO-Offload's split of a training step (Ren et al. 2021, arXiv:2101.06840):
the model's trained weights and their gradients in bf16 on the device, 4 bytes a parameter, and
the fp32 master weights with the optimizer's moments in the CPU's memory, 12 bytes a parameter,
where the optimizer step runs. A whole-model update of a 1.5B model then needs about 6 GB of a
GPU before activations, not 24.

    optimizer = torch.optim.AdamW(params, lr=args.learning_rate, weight_decay=0.0)
    if args.offload_optimizer:
        optimizer = offload_optimizer(policy, optimizer)

Each step copies the bf16 gradients to the CPU as fp32, steps the optimizer there and copies the
new weights back, rounded to bf16. The update is the fp32 update up to that rounding (the forward
under --bf16 casts the weights to bf16 anyway): tests/test_offload.py measures the difference.
The price is time: the copies, and an optimizer step on the CPU's cores.
"""

import torch


class OffloadedOptimizer:
    """`optimizer`'s update on fp32 copies of its parameters kept on the CPU; the parameters
    themselves become bf16. It answers what the algorithm files and checkpoints ask of an
    optimizer: param_groups (the learning rate), zero_grad, step, state_dict and
    load_state_dict. The state dict is the inner optimizer's, which a run without the option
    reads too, plus the master weights."""

    def __init__(self, optimizer, dtype=torch.bfloat16):
        pin = torch.cuda.is_available()  # page-locked host memory copies to and from a GPU faster
        self.params, groups = [], []
        for group in optimizer.param_groups:  # the same groups and settings, on the masters
            master = [torch.empty(p.shape, dtype=torch.float32, pin_memory=pin).copy_(p.detach())
                      for p in group["params"]]
            self.params += group["params"]
            groups.append({**group, "params": master})
        self.master = [m for group in groups for m in group["params"]]
        self.inner = type(optimizer)(groups)
        for p in self.params:
            p.data = p.data.to(dtype)

    @property
    def param_groups(self):
        return self.inner.param_groups

    def zero_grad(self, set_to_none=True):
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    @torch.no_grad()
    def step(self):
        for p, m in zip(self.params, self.master):
            m.grad = None if p.grad is None else p.grad.to("cpu", torch.float32)
        self.inner.step()
        for p, m in zip(self.params, self.master):
            p.copy_(m)  # to the device, rounded to its dtype
            m.grad = None

    def state_dict(self):
        return {**self.inner.state_dict(), "master": [m.clone() for m in self.master]}

    @torch.no_grad()
    def load_state_dict(self, state):
        state = dict(state)
        master = state.pop("master", None)  # None: a checkpoint written without the option
        self.inner.load_state_dict(state)
        for p, m, saved in zip(self.params, self.master, master or [None] * len(self.master)):
            if saved is not None:
                m.copy_(saved)
            p.copy_(m)


def offload_optimizer(model, optimizer):
    """`optimizer` (built on `model`'s trained parameters, before any step) as an
    `OffloadedOptimizer`: the same class, groups and settings, on fp32 copies in the CPU's
    memory."""
    trained = {id(p) for p in model.parameters() if p.requires_grad}
    assert all(id(p) in trained for group in optimizer.param_groups for p in group["params"]), \
        "the optimizer trains another model's weights"
    return OffloadedOptimizer(optimizer)
