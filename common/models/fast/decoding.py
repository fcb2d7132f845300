"""The sampler's speedups, switched on in one place: `generate` (common/models/sampler.py) draws
the same tokens with `FastDecoder` as with its plain `Decoder`, faster (log-probs within float
rounding).

    with autocast, fast_decoding(policy, enabled=not args.plain) as decoder:
        gen = generate(policy, tokenizer, prompts, max_new_tokens, temperature, seeds=seeds,
                       decoder=decoder)

Each speedup lives in its own module of common/models/fast/ and is switched on by `Speedups`; a
test checks each alone against the plain decoder (tests/test_fast_sampler.py):
- prompts.py: rows with the same prompt (a GRPO group) share one prefill, a prefix every
  prompt shares (the system prompt and worked example) is read once, and a stepwise episode's next
  prompt reads only the tokens added since its last call (`PrefixCache`);
- kv.py: decode steps write their keys and values into buffers with room, not a new copy of
  the whole cache per token;
- attention.py: decode attention reads each key/value head once under grouped-query attention;
- fused.py: one matmul for the q/k/v projections and one for gate/up, with the weights
  stacked once per rollout;
- linears.py: on a CPU, fp32 linear layers run through oneDNN with weights packed once per
  rollout;
- compile.py (--compile): a static KV cache and a compiled decode step, for the models that
  `compile_decoding` was called on (common.models.loading.trained_policy does it under --compile);
  with `grow_static_cache`, a cache that grows as it fills (off by default);
- graphs.py (on a GPU, by default): the same static cache, its eager step captured as a CUDA
  graph once per rollout, for the models that `capture_decoding` was called on; under --fsdp
  through a twin of the model without FSDP's hooks, on the weights gathered for the rollout.
The first three change how the decoder reads prompts and keeps its cache; the model-patching ones
(attention, fused projections, linears) hold for the `fast_decoding` block.
"""

import contextlib
import weakref
from dataclasses import dataclass

import torch

from common.models.fast.attention import _packed_gqa
from common.models.fast.compile import _COMPILED, _cache_lengths, _grown_cache, _static_cache
from common.models.fast.fused import _fused_projections
from common.models.fast.graphs import lent_twin
from common.models.fast.kv import _append_in_place
from common.models.fast.linears import _onednn_linears
from common.models.fast.prompts import PrefixCache, _full_attention, _prefill, identical_rows
from common.models.hf import KV_CACHE, position_ids_from_mask
from common.models.sampler import Decoder
from common.models.sharding import unsharded


@dataclass(frozen=True)
class Speedups:
    """Which speedups `fast_decoding` uses: those that pay on the model's device
    (`Speedups.for_device`) unless a caller says otherwise (the tests, dev/lab/roofline.py's before
    and after)."""
    shared_prefill: bool = True
    """prompts.py: prompt tokens another row or an earlier call of the rollout read run once"""
    in_place_kv: bool = True
    """kv.py: each decode step appends its keys and values in place"""
    packed_gqa: bool = True
    """attention.py: decode attention reads each key/value head once"""
    fused_projections: bool = True
    """fused.py: q/k/v as one matmul, gate/up as one, weights stacked once per rollout"""
    packed_linears: bool = True
    """linears.py: CPU fp32 linear layers through oneDNN, weights packed once per rollout"""
    drop_finished: bool = True
    """rows that finished leave the forward batch"""
    grow_static_cache: bool = False
    """compile.py (--compile): the static cache grows as it fills, so attention reads less of
    it (off until a GPU measures it: one compiled graph per cache length)"""

    @classmethod
    def for_device(cls, device):
        """The speedups that pay on `device` (a torch.device or its type). On a GPU an eager decode
        step is host work, one kernel launch per top-level op, so a speedup that saves memory
        traffic with more ops loses there: writing keys and values in place costs 4-5 ops more
        per layer than the concatenation (+131 a step at SmolLM2's 30 layers, dev/lab/host_ops.py);
        --compile's static cache writes in place inside its graph. oneDNN's linears are a CPU's."""
        cpu = torch.device(device).type == "cpu"
        return cls(in_place_kv=cpu, packed_linears=cpu)


_KEPT_FUSED = weakref.WeakKeyDictionary()  # a compiled model -> its fused projections


def fast_decoding(model, prefix_cache=None, speedups=None, check_every=None, enabled=True):
    """A `FastDecoder` for `generate`, with the model's fast forms for the block (`fast_decoder`);
    enabled False (--plain): the plain `Decoder`, and no speedup."""
    if not enabled:
        return contextlib.nullcontext(Decoder(model))
    return fast_decoder(model, prefix_cache, speedups, check_every)


@contextlib.contextmanager
def fast_decoder(model, prefix_cache=None, speedups=None, check_every=None):
    """A `FastDecoder` for `generate`, with `model`'s decode attention, q/k/v and gate/up
    projections and (on a CPU, in fp32) linear layers in their fast forms for the block. Enter it
    inside the forwards' autocast (--bf16): the fused weights take its dtype.

    prefix_cache: a `PrefixCache` that lives for one rollout (stepwise episodes): prompts read what
    it holds, `FastDecoder.remember` stores each row's prompt and response for the next call, and
    it keeps the rollout's packed and fused weights. None: a prefix that all prompts share is read
    once, for this call only. speedups: a `Speedups` (default: `Speedups.for_device`). check_every:
    see `FastDecoder`."""
    device = next(model.parameters()).device
    speedups = Speedups.for_device(device) if speedups is None else speedups
    autocast = torch.is_autocast_enabled(device.type)
    dtype = torch.get_autocast_dtype(device.type) if autocast else None
    # FSDP2: the weights gathered once, before the fused ones are stacked from them; a sharded
    # model that capture_decoding was called on decodes through its twin on the gathered weights
    with unsharded(model):
        runner = lent_twin(model)
        # the compiled forward (--compile) traces the layers as they are
        pack = speedups.packed_linears and dtype is None and runner not in _COMPILED
        # fused weights live for the rollout (prefix_cache), or for a compiled model's life: its
        # compiled step reads them as inputs, and new ones would make it compile again (a twin's
        # weights are gathered anew for each rollout: its fused ones are too)
        fused_store = (_KEPT_FUSED.setdefault(model, {}) if model in _COMPILED else
                       prefix_cache.fused if prefix_cache else None)
        with (_packed_gqa(runner) if speedups.packed_gqa else contextlib.nullcontext(),
              _fused_projections(runner, speedups.fused_projections, dtype, fused_store) as fused,
              _onednn_linears(runner, pack, prefix_cache.packed if prefix_cache else None,
                              also=[held[1] for held in fused.values()])):
            yield FastDecoder(runner, speedups, prefix_cache, check_every)


class FastDecoder(Decoder):
    """`Decoder`'s prefill and decode steps, the same function of the same tokens, faster: prompts
    that rows share are read once (prompts.py), decode steps append to the cache in place
    (kv.py), or, for a model that `compile_decoding` or `capture_decoding` was called on, run
    a compiled or captured step over a static cache (compile.py, graphs.py), where
    finished rows stay in the batch (dropping them would change the shapes).

    check_every: `generate` reads which rows are done every this many tokens: every token on a CPU,
    where a read costs nothing, and every 8 on a GPU, where it stalls the queue of kernels (finished
    rows decode a few tokens more, masked out)."""

    def __init__(self, model, speedups=None, prefix_cache=None, check_every=None):
        super().__init__(model)
        device = next(model.parameters()).device
        self.speedups = Speedups.for_device(device) if speedups is None else speedups
        self.prefix_cache = prefix_cache
        self.check_every = check_every or (1 if device.type == "cpu" else 8)
        self.compiled = _COMPILED.get(model)
        self.drops_rows = self.speedups.drop_finished and self.compiled is None
        self.left = {}  # row -> its cache layers, for rows that left the batch (`remember`)

    def prefill(self, prompt_ids, prompt_mask, max_new_tokens):
        B, W = prompt_ids.shape
        device = prompt_ids.device
        positions = position_ids_from_mask(prompt_mask)
        self.prompts = [ids[m.bool()].tolist() for ids, m in zip(prompt_ids, prompt_mask)]
        self.rows = torch.arange(B, device=device)  # the original row of each batch row
        # Rows with the same prompt (a GRPO group, G samples of one question) share one prefill:
        # only the distinct prompts run through the model, and their KV cache rows are then copied
        # out to every row.
        distinct, inverse = self.rows, self.rows
        store = None  # a model whose cache cannot be rearranged reads every prompt in full
        if self.speedups.shared_prefill:
            distinct, inverse = identical_rows(torch.cat([prompt_ids, prompt_mask], 1))
            if _full_attention(self.model):
                store = PrefixCache() if self.prefix_cache is None else self.prefix_cache
        cache, logits = _prefill(self.model, [self.prompts[i] for i in distinct.tolist()],
                                 prompt_ids[distinct], prompt_mask[distinct], positions[distinct],
                                 store)
        self.remembers = store is not None and store is self.prefix_cache
        if len(distinct) < B:
            cache.batch_select_indices(inverse)
        self.begin(cache, prompt_mask, positions, max_new_tokens)
        self.prompt_width, self.step = W, 0
        if self.compiled is not None:  # the prompts' keys and values, in a preallocated cache
            self.length, _ = _cache_lengths(W, max_new_tokens, self.speedups.grow_static_cache)
            self.cache = _static_cache(self.model, cache, self.length)
            # the columns after the current token are hidden by the causal mask
            self.mask = torch.cat([prompt_mask, prompt_mask.new_ones(B, self.length - W)], dim=1)
        elif self.speedups.in_place_kv:
            self.cache = _append_in_place(cache, max_new_tokens)
        return logits[inverse]  # [B, V]

    def decode(self, token):
        self.step += 1
        if self.compiled is None:
            return super().decode(token)
        # the static cache: this token's keys go to position W + step - 1; a full cache grows
        if self.prompt_width + self.step - 1 >= self.length:
            self.cache, grown = _grown_cache(self.model, self.cache, self.length,
                                             self.prompt_width + self.step - 1)
            self.mask = torch.cat([self.mask, self.mask.new_ones(len(token), grown - self.length)],
                                  dim=1)
            self.length = grown
        out = self.compiled(input_ids=token[:, None], attention_mask=self.mask,
                            position_ids=self.position, use_cache=True, **{KV_CACHE: self.cache})
        self.cache, self.position = getattr(out, KV_CACHE), self.position + 1
        return out.logits[:, -1]

    def keep(self, index):
        if self.remembers:  # the rows that leave: their cache, for `remember`
            gone = torch.ones(len(self.rows), dtype=torch.bool, device=index.device)
            gone[index] = False
            for b in gone.nonzero()[:, 0].tolist():
                self.left[int(self.rows[b])] = [(layer.keys[b].clone(), layer.values[b].clone())
                                                for layer in self.cache.layers]
        super().keep(index)
        self.rows = self.rows[index]

    def remember(self, gen):
        """Store each row's prompt and the response tokens the model has read (all but the last,
        which was never fed) in the prefix_cache, for the next call of the rollout to read."""
        if not self.remembers:
            return
        for b, row in enumerate(self.rows.tolist()):
            self.left[row] = [(layer.keys[b], layer.values[b]) for layer in self.cache.layers]
        lengths, responses = gen.response_mask.sum(1).tolist(), gen.response_ids.tolist()
        for row in self.left:  # in the order rows left the batch, as an earlier match prefers
            sequence = self.prompts[row] + responses[row][:lengths[row] - 1]
            start = self.prompt_width - len(self.prompts[row])
            self.prefix_cache.add(sequence, [(k[:, start:start + len(sequence)].clone(),
                                              v[:, start:start + len(sequence)].clone())
                                             for k, v in self.left[row]])
        self.left = {}
