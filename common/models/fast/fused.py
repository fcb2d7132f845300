"""Speedup: one matmul where a layer runs two or three on the same input (q/k/v, gate/up)."""

import contextlib
import functools

import torch

# The projections that read the same input, by the names Llama, Qwen2/3 and Mistral give them. A
# decode step multiplies a few rows by each: the k and v projections of a grouped-query model are
# narrow (SmolLM2: 576 x 192), and a narrow matmul reads its weight at a fraction of the memory
# bandwidth (on a GPU) or pays a fixed cost per call (on a 2-core CPU at 32 rows, SmolLM2's q, k
# and v took 342 us as three packed matmuls, 204 us as one).
GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def _fusable(module, names):
    """The plain nn.Linear layers `names` of `module`, when all are there and one matmul can serve
    them (the same input width, dtype, device and bias or none); else None. LoRA's layers and
    FSDP2's sharded weights are not plain, and stay as they are."""
    layers = [getattr(module, name, None) for name in names]
    if not all(type(m) is torch.nn.Linear and type(m.weight) is torch.nn.Parameter
               for m in layers):
        return None
    if len({(m.in_features, m.weight.dtype, m.weight.device, m.bias is None) for m in layers}) > 1:
        return None
    return layers


def _fused_linear(layers, dtype, fused=None):
    """One Linear whose output is the outputs of `layers` side by side, its weight the layers'
    weights stacked, in `dtype` (under autocast: the dtype it would cast them to, so that a decode
    step casts nothing). `fused`: the Linear of an earlier call, written again in place (a compiled
    decode step reads its weight as an input, so the same tensor must hold the new values)."""
    weight = torch.cat([m.weight.detach() for m in layers]).to(dtype)
    bias = (None if layers[0].bias is None
            else torch.cat([m.bias.detach() for m in layers]).to(dtype))
    if fused is None:  # on "meta": no memory and no random initialisation, the stack is its weight
        fused = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None,
                                device="meta")
        fused.weight = torch.nn.Parameter(weight, requires_grad=False)
        if bias is not None:
            fused.bias = torch.nn.Parameter(bias, requires_grad=False)
        return fused
    with torch.no_grad():
        fused.weight.copy_(weight)
        if bias is not None:
            fused.bias.copy_(bias)
    return fused


def _first(x, fused, sizes, stash):
    """The first layer of a group: the fused matmul, whose other parts wait in `stash`."""
    outs = fused(x).split(sizes, dim=-1)
    stash["input"], stash["outs"] = x, outs
    return outs[0]


def _rest(x, layer, k, stash):
    """Layer k of a group: its part of the fused output when it reads the first layer's input (as
    every decoder layer of these models does), else its own matmul. The last layer empties the
    stash, which would otherwise hold a prefill's outputs of every layer until the next step."""
    if stash.get("input") is x:
        out = stash["outs"][k]
        if k == len(stash["outs"]) - 1:
            stash.clear()
        return out
    return torch.nn.functional.linear(x, layer.weight, layer.bias)


@contextlib.contextmanager
def _fused_projections(model, enabled, dtype=None, store=None):
    """Run each group of GROUPS as one matmul for the call: the first layer computes all of the
    group's outputs, the others take their part. The fused weights are built once per `store` (a
    dict kept for a rollout, or for a compiled model's life) and again after an optimizer step
    changes a layer's weight. The same function, summed in the same order: the outputs are the
    separate matmuls' (bit-identical with oneDNN on a CPU). dtype: autocast's, or None."""
    store = {} if store is None else store
    patched = []
    try:
        for module in model.modules() if enabled else ():
            for names in GROUPS:
                layers = _fusable(module, names)
                if layers is None:
                    continue
                dtype_now = dtype or layers[0].weight.dtype
                key = (dtype_now, tuple((m.weight._version, m.weight.data_ptr()) for m in layers))
                held = store.get((module, names))  # [key, fused Linear, forwards] of a call
                if held is not None and held[0][0] == dtype_now:
                    if held[0] != key:  # an optimizer step since: the same Linear, new values
                        held[0], held[1] = key, _fused_linear(layers, dtype_now, held[1])
                else:
                    # the same forwards every call: a compiled step's guards see the same objects
                    fused, stash = _fused_linear(layers, dtype_now), {}
                    sizes = [m.out_features for m in layers]
                    forwards = [functools.partial(_first, fused=fused, sizes=sizes, stash=stash)]
                    forwards += [functools.partial(_rest, layer=m, k=k, stash=stash)
                                 for k, m in enumerate(layers[1:], 1)]
                    held = store[(module, names)] = [key, fused, forwards]
                for m, forward in zip(layers, held[2]):
                    m.forward = forward
                patched += layers
        yield store
    finally:
        for m in patched:
            vars(m).pop("forward", None)  # the class's forward again
