"""Speedup (CPU): fp32 linear layers through oneDNN with weights packed once per rollout."""

import contextlib
import functools

import torch


def _pack(weight):
    """A Linear's weight [out, in], laid out once for `_packed_linear` (oneDNN's blocked format)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)


def _packed_linear(x, packed, bias=None):
    """F.linear(x, weight, bias) from `_pack(weight)`."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


@functools.cache
def _onednn_works():
    """Whether this torch build has oneDNN's packed linear (x86 builds do; without, torch's)."""
    try:
        return _packed_linear(torch.ones(2, 3), _pack(torch.ones(4, 3))).tolist() == [[3.0] * 4] * 2
    except (AttributeError, NotImplementedError, RuntimeError):
        return False


@contextlib.contextmanager
def _onednn_linears(model, enabled, store=None, also=()):
    """Run the fp32 nn.Linear layers of a CPU model through oneDNN, with weights packed once for
    the call (or, given `store`, a PrefixCache's dict, once for the rollout). torch's own CPU linear
    (MKL's sgemm) re-packs the weight on every call, and at the few rows of a decode step that pass
    is the cost: on a 2-core CPU SmolLM2's head (49,152 x 576) took 56 ms a call at 32 rows, against
    22 ms packed, and a 1536 x 576 projection 0.61 against 0.40 ms. The same function, rounded
    differently (about 1e-6 in the logits). Packing all of SmolLM2-135M takes ~0.25 s. also: more
    Linear layers to pack, outside the model (fused.py's); a layer whose forward another
    speedup has replaced for the call is left to it."""
    enabled = enabled and _onednn_works()
    linears = [m for m in [*model.modules(), *also] if enabled and type(m) is torch.nn.Linear
               and "forward" not in vars(m) and m.weight.device.type == "cpu"
               and m.weight.dtype == torch.float32
               and type(m.weight) is torch.nn.Parameter]  # not FSDP2's DTensors
    store = {} if store is None else store
    try:
        for m in linears:
            # an optimizer step writes the weight in place, which bumps its version: pack it again
            key = (m.weight.data_ptr(), m.weight._version)
            if m not in store or store[m][0] != key:
                store[m] = (key, _pack(m.weight))
            m.forward = functools.partial(_packed_linear, packed=store[m][1], bias=m.bias)
        yield
    finally:
        for m in linears:
            vars(m).pop("forward", None)  # the class's forward again

