"""What the rest of common/ needs to know about transformers' causal LMs, in one place: the name
of the KV cache argument, positions under left padding, and where the body, the head and the
decoder layers sit (also through a peft wrapper)."""

from transformers.modeling_outputs import BaseModelOutputWithPast

from common.errors import UsageError

# Recent transformers (5.24 here) call the KV cache `cache`, in forward's arguments and in its
# outputs: the old `past_key_values` warns there and is to go in 5.40, while 4.x knows only the old
# one (and would silently ignore an unknown `cache=`), so the name is read off the installed
# version's output class.
KV_CACHE = "cache" if "cache" in BaseModelOutputWithPast.__dataclass_fields__ else "past_key_values"


def position_ids_from_mask(mask):
    # CRUCIAL: with left padding the first real token must get position 0, not the pad count.
    return (mask.cumsum(-1) - 1).clamp(min=0)


def backbone_and_head(model):
    """(transformer body, lm_head) of an HF causal LM, also through a PEFT wrapper."""
    if hasattr(model, "get_base_model"):
        model = model.get_base_model()
    return model.base_model, model.get_output_embeddings()


def decoder_layers(model):
    """The transformer blocks of an HF causal LM or body, also through a peft wrapper."""
    if hasattr(model, "get_base_model"):
        model = model.get_base_model()
    body = getattr(model, "model", model)  # a causal LM holds its body as .model
    layers = getattr(body, "layers", None)
    if layers is None:
        raise UsageError(f"--fsdp: no decoder layers found in {type(model).__name__} (it shards "
                         f"model.layers, as Llama, Qwen2 and Mistral name them)")
    return list(layers)
