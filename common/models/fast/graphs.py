"""Speedup (on a GPU, by default): the decode step over a static KV cache as one CUDA graph.

An eager decode step of SmolLM2 is ~1,700 kernel launches, each a few microseconds of host work,
so on a GPU the step costs what the host takes to launch it (dev/lab/host_ops.py). A CUDA graph
records the step's kernels once and replays them with one launch. `--compile` does this too, after
fusing the kernels with inductor, which takes about a minute of compiling a run; a capture of the
eager kernels takes one forward, a few milliseconds, once per rollout.
"""

import types
import warnings
import weakref

import torch

from common.models.fast.compile import _COMPILED
from common.models.fast.prompts import _full_attention
from common.models.hf import KV_CACHE
from common.models.sharding import _fsdp_modules, lend_weights, plain_twin

SDPA = ("sdpa", "mathrl_decode_sdpa")  # attention that reads a boolean mask (attention.py's)


def capture_decoding(model, graphs=None):
    """Make the FastDecoder decode `model` over a static KV cache (as --compile does), each step
    replayed from a CUDA graph captured at the rollout's first step. graphs: capture (True), or run
    the same static step eagerly (False: how the tests check it on a CPU); None: capture on a GPU,
    and leave a CPU's decoding as it is. A sharded model (FSDP2) decodes through its twin
    (`plain_twin`): the same modules without FSDP's hooks, which run on the host at every layer of
    every step and cannot be captured, lent the weights gathered for each rollout. Models it cannot
    capture keep their eager decoding: attention that is not SDPA or not causal over the whole
    sequence, and LoRA under --fsdp (no twin). `--compile` (compile_decoding) wins over it."""
    cuda = next(model.parameters()).device.type == "cuda"
    graphs = True if graphs is None else graphs
    if ((graphs and not cuda) or model in _COMPILED or not _full_attention(model)
            or getattr(model.config, "_attn_implementation", None) not in SDPA):
        return model
    if _fsdp_modules(model):
        twin = plain_twin(model)
        if twin is not None:
            _TWINS[model] = twin
            _COMPILED[twin] = CapturedStep(twin, graphs)
        return model
    _COMPILED[model] = CapturedStep(model, graphs)
    return model


_TWINS = weakref.WeakKeyDictionary()  # a sharded model -> the twin its rollouts decode through


def lent_twin(model):
    """What decodes `model` inside `unsharded(model)`: its twin, lent the gathered weights, or the
    model itself when it has none."""
    twin = _TWINS.get(model)
    return model if twin is None else lend_weights(model, twin)


class CapturedStep:
    """Called as a model is called for one decode step over a StaticCache (FastDecoder.decode):
    copies the token and its position into buffers of its own, and replays the graph of this cache
    (capturing it at the cache's first step). The logits it returns are the graph's own buffer,
    written again by the next step.

    Each step attends to the cache's columns up to the one its keys go to, which the StaticCache
    counts on the device (`cumulative_length`): the attention mask is built inside the graph from
    the prompts' padding and that count, so a replay needs nothing from the host."""

    def __init__(self, model, graphs=True):
        self.model, self.graphs = model, graphs
        self.cache = None  # a weak reference to the StaticCache the graph reads and writes
        self.graph = None

    def __call__(self, input_ids, attention_mask, position_ids, use_cache=True, **kwargs):
        cache = kwargs[KV_CACHE]
        if self.cache is None or self.cache() is not cache:
            self._start(cache, input_ids, attention_mask, position_ids)
        else:
            self.ids.copy_(input_ids)
            self.position.copy_(position_ids)
        if self.graph is not None:
            self.graph.replay()
        else:
            self.logits = self._step()
        return types.SimpleNamespace(logits=self.logits, **{KV_CACHE: cache})

    def _start(self, cache, input_ids, attention_mask, position_ids):
        """A new rollout's cache: new buffers, and a new graph (the old one wrote the old cache)."""
        self.graph, self.cache = None, weakref.ref(cache)
        # The values a step writes come out of v_proj, in autocast's dtype; some transformers
        # releases (5.17) give a cache's values the keys' dtype (float32 after the rotary
        # embedding), which a static cache's index_copy_ refuses.
        device = input_ids.device.type
        dtype = (torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device)
                 else next(self.model.parameters()).dtype)
        for layer in cache.layers:
            if layer.values.dtype != dtype:
                layer.values = layer.values.to(dtype)
        self.ids, self.position = input_ids.clone(), position_ids.clone()
        self.padding = attention_mask.bool()[:, None, None, :]  # [B, 1, 1, L]
        self.columns = torch.arange(attention_mask.shape[1], device=attention_mask.device)
        if self.graphs:
            self._capture(cache)

    def _step(self):
        """The decode step: the token's keys go to column `cumulative_length` of every layer's
        cache (written inside the forward, which then adds one), and it attends to the columns up
        to that one that are not padding."""
        written = self.cache().layers[0].cumulative_length
        mask = self.padding & (self.columns <= written)  # [B, 1, 1, L], a 4D mask used as is
        out = self.model(input_ids=self.ids, attention_mask=mask, position_ids=self.position,
                         use_cache=True, **{KV_CACHE: self.cache()})
        return out.logits

    def _capture(self, cache):
        """One warm-up step on a side stream (as CUDA graphs ask), the cache's counts put back,
        then the step recorded on that stream, not run. Autocast's cache of cast weights is off
        for both: a cast it had kept would be read by every replay, stale after an optimizer step.
        (torch.cuda.graph() would also empty the allocator's cache at every rollout's capture.)"""
        counts = [layer.cumulative_length.clone() for layer in cache.layers]
        device = self.ids.device.type
        autocast = torch.autocast(device, dtype=torch.get_autocast_dtype(device),
                                  enabled=torch.is_autocast_enabled(device), cache_enabled=False)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        try:
            with autocast, torch.cuda.stream(side):
                self._step()  # writes the column that the first replay writes again
                for layer, count in zip(cache.layers, counts):
                    layer.cumulative_length.copy_(count)
                graph = torch.cuda.CUDAGraph()
                graph.capture_begin()
                try:
                    self.logits = self._step()
                finally:
                    graph.capture_end()
            self.graph = graph
        except Exception as e:  # noqa: BLE001 -- a forward that reads the device from the host
            warnings.warn(f"decoding stays eager: its step could not be captured as a CUDA graph "
                          f"({type(e).__name__}: {str(e)[:200]})", stacklevel=2)
            torch.cuda.synchronize()
            for layer, count in zip(cache.layers, counts):
                layer.cumulative_length.copy_(count)
            self.graphs = False
        torch.cuda.current_stream().wait_stream(side)
