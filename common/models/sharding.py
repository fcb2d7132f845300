"""Past one GPU's memory: LoRA adapters (peft) and FSDP2 sharding (torch's `fully_shard`), shared
by every algorithm file. Without --fsdp every rank holds the whole model and gradients are averaged
once per optimizer step (common/distributed.py: `average_gradients`, what DDP does); with
--fsdp each rank holds 1/world of every trained weight, gradient and AdamW state, and gathers the
weights a layer at a time in the training forward and backward, and all at once for a rollout
(`unsharded`).

- `add_lora`: adapters on frozen weights; the reference is the same model with them off.
- `shard`: FSDP2 over each decoder layer, then the root, bf16 compute under --bf16, fp32 reductions.
- `unsharded`: one all-gather per weight for a whole rollout, not one per decoded token.
- `plain_twin`, `lend_weights`: the model without FSDP's hooks, on the gathered weights, which a
  rollout decodes through (common/models/fast/graphs.py captures its step on a GPU).
- `clip_grad_norm`, `full_state_dict`, `optimizer_state`, `load_optimizer_state`: what training
  and checkpoints need to work the same on sharded and whole models.
"""

import contextlib
import math
import sys

import torch
from transformers.modeling_outputs import BaseModelOutput

from common.models.hf import backbone_and_head


# torch.distributed.fsdp takes about 1 s to import, which every run without --fsdp (and every test
# process) would pay for nothing: nothing is sharded before `shard` has imported it.
def is_sharded(model) -> bool:
    """True when FSDP2 has sharded `model` (its root)."""
    if "torch.distributed.fsdp" not in sys.modules:
        return False
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


# ------------------------------------------------------------------------------------------------
# LoRA
# ------------------------------------------------------------------------------------------------
def add_lora(policy, r, alpha, target_modules, base_name, resume_from=None):
    """LoRA adapters of rank r (scale alpha / r) on `target_modules` ('all-linear' or a comma list),
    no dropout; the base weights freeze. base_name: where the base model lies (a folder or a hub
    id), which the adapter's config records for peft and load_policy to load it from. resume_from:
    a checkpoint folder with an adapter."""
    from peft import LoraConfig, PeftModel, get_peft_model

    if resume_from is not None:
        policy = PeftModel.from_pretrained(policy, str(resume_from), is_trainable=True)
    else:
        targets = target_modules if target_modules == "all-linear" else target_modules.split(",")
        config = LoraConfig(r=r, lora_alpha=alpha, target_modules=targets, lora_dropout=0.0,
                            bias="none", task_type="CAUSAL_LM")
        policy = get_peft_model(policy, config)
    # peft would record the folder the weights were read from: none for tiny-random, which is
    # built in memory. A resumed checkpoint's record is replaced too, as one written before
    # adapters named a folder holds a reserved name that peft cannot load.
    policy.peft_config["default"].base_model_name_or_path = base_name
    return policy


class AdapterOff:
    """A LoRA policy seen with its adapters off: the model it started from, without a second copy
    (OpenR's reference). `token_logprobs` runs it as the policy inside `disable_adapter()`."""

    def __init__(self, policy):
        self.policy = policy


class AdapterOffBody(torch.nn.Module):
    """The LoRA policy's transformer body with its adapters off: OpenR's critic body. The policy is
    held outside the module tree, so a critic on it has the value head as its only parameters."""

    def __init__(self, policy):
        super().__init__()
        object.__setattr__(self, "policy", policy)

    @property
    def gradient_checkpointing(self):  # the body's: HF then turns its cache off
        return getattr(backbone_and_head(self.policy)[0], "gradient_checkpointing", False)

    def forward(self, input_ids, attention_mask=None, position_ids=None, **cache):
        with self.policy.disable_adapter():
            if is_sharded(self.policy):  # the whole model runs: no cache in or out
                assert not cache, "a sharded critic body runs without a KV cache"
                return BaseModelOutput(last_hidden_state=sharded_hidden_states(
                    self.policy, input_ids, attention_mask, position_ids))
            return backbone_and_head(self.policy)[0](input_ids=input_ids,
                                                     attention_mask=attention_mask,
                                                     position_ids=position_ids, **cache)


# ------------------------------------------------------------------------------------------------
# FSDP2
# ------------------------------------------------------------------------------------------------
def sharded_hidden_states(model, input_ids, attention_mask, position_ids):
    """The body's last hidden states [B, T, H] of an FSDP2-sharded causal LM. FSDP2 gathers the
    root's weights (embeddings, final norm, head) in the root's forward only, and keeps them until
    backward: so the whole model runs, with one logit per row, and its head can be used after."""
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                output_hidden_states=True, logits_to_keep=1)
    return out.hidden_states[-1]


def shard(model, layers, bf16):
    """FSDP2: each decoder layer is a unit (gathered in its forward, freed after), then the root
    holds the rest (embeddings, final norm, head). Compute in bf16 under --bf16, gradients reduced
    in fp32; master weights and AdamW states stay fp32 and sharded."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if bf16 else None,
                                  reduce_dtype=torch.float32)
    for layer in layers:
        fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    return model


def _fsdp_modules(model):
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def unsharded(model):
    """Every weight of a sharded `model` gathered once for the block (a rollout or an evaluation),
    then freed (`gathered`). A no-op on a whole model and inside another `unsharded` block."""
    modules = _fsdp_modules(model)
    if not modules or getattr(model, "_mathrl_unsharded", False):
        return contextlib.nullcontext()
    return gathered(model, modules)


@contextlib.contextmanager
def gathered(model, modules):
    """FSDP2's weights whole for the block: decoding token by token would otherwise all-gather
    every layer for every token. It costs one whole copy of the weights per rank while it lasts
    (bf16 under --bf16); under it, ranks may run different numbers of forwards (each stops when its
    own rows are done)."""
    for m in modules:
        m.set_reshard_after_forward(False, recurse=False)
        m.unshard()
    model._mathrl_unsharded = True
    try:
        yield
    finally:
        model._mathrl_unsharded = False
        for m in modules:
            m.reshard()
            # the root keeps its weights after forward (FSDP2's default: backward needs them first)
            m.set_reshard_after_forward(m is not model, recurse=False)


def plain_twin(model):
    """A model of `model`'s class and config, without FSDP2's hooks, its weights on the meta
    device (no memory) until `lend_weights` lends it the gathered ones. None for what has no
    config to build it from (LoRA's peft wrapper)."""
    from transformers import AutoModelForCausalLM

    if "peft" in sys.modules and isinstance(model, sys.modules["peft"].PeftModel):
        return None
    with torch.device("meta"):
        twin = AutoModelForCausalLM.from_config(
            model.config, attn_implementation=model.config._attn_implementation)
    twin.eval()
    return twin


def lend_weights(model, twin):
    """`twin` holding `model`'s weights and buffers, the same tensors (inside `unsharded`, the
    gathered ones: nothing is copied). -> twin"""
    for kind, named in (("_parameters", model.named_parameters(remove_duplicate=False)),
                        ("_buffers", model.named_buffers(remove_duplicate=False))):
        for name, tensor in named:
            module, _, leaf = name.rpartition(".")
            getattr(twin.get_submodule(module), kind)[leaf] = tensor
    return twin


def clip_grad_norm(model, max_norm) -> float:
    """clip_grad_norm_ over the trained parameters; the total norm as a float, also when the
    gradients are sharded (DTensors: the norm is then over every rank's shard). max_norm 0: the
    norm is measured and nothing is clipped (transformers' Trainer reads 0 the same way)."""
    params = [p for p in model.parameters() if p.requires_grad]
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else math.inf)
    # sharded gradients give a DTensor norm, of this rank's shard: full_tensor() is every rank's
    return (norm.full_tensor() if hasattr(norm, "full_tensor") else norm).item()


# ------------------------------------------------------------------------------------------------
# Checkpoints of sharded models: whole state dicts, gathered on every rank, written by rank 0
# ------------------------------------------------------------------------------------------------
def full_state_dict(model, all_ranks=False):
    """The whole state dict (every rank takes part in the gathers under --fsdp). Sharded, it goes
    to rank 0's CPU memory, other ranks get {}; all_ranks: every rank gets it, on its device."""
    if is_sharded(model):
        return _gathered_state_dict(model, all_ranks)
    return model.state_dict()


def _gathered_state_dict(model, all_ranks):
    """full_state_dict of a sharded model: gathered from the ranks' shards."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                                cpu_offload=not all_ranks))


def untied(model, state):
    """`state` without the second name of a tied weight (the head that is the embedding): gathered,
    the two are separate tensors, and save_pretrained would write both."""
    kept = dict(model.named_parameters())
    tied = {n for n, _ in model.named_parameters(remove_duplicate=False) if n not in kept}
    return {k: v for k, v in state.items() if k not in tied}


def optimizer_state(model, optimizer):
    """The optimizer's state as optimizer.state_dict() gives it for a whole model."""
    if is_sharded(model):
        return _gathered_optimizer_state(model, optimizer)
    return optimizer.state_dict()


def _gathered_optimizer_state(model, optimizer):
    """optimizer_state of a sharded model: gathered from the ranks' shards, to rank 0's CPU."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer,
                                    options=StateDictOptions(full_state_dict=True,
                                                             cpu_offload=True))


def load_optimizer_state(model, optimizer, state):
    """The inverse of `optimizer_state`: each rank keeps its shard of a whole state."""
    if not is_sharded(model):
        optimizer.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(model, optimizer, optim_state_dict=state,
                             options=StateDictOptions(full_state_dict=True))
