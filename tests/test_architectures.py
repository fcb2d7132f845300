"""The architectures people bring, as tiny random models built offline from their configs (2 layers,
hidden 64, tiny-random's tokenizer): each decodes the same tokens through the plain and the fast
sampler, its training forward gives the same log-probs on the plain and the fast path, and (second
tier) a few of them train one update of grpo.py with and without --plain."""

import json
from dataclasses import replace

import pytest
import torch
import transformers

import grpo
from common.models.loading import load_tokenizer, tiny_random_config
from common.models.logprobs import token_logprobs
from common.models.sampler import encode_prompts, generate
from sampling import fast_generate

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 1024}
# name -> (config class, model class, what the architecture needs besides the shared sizes)
ARCHITECTURES = {
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 16}),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", {"head_dim": 16}),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", {"head_dim": 16}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {}),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", {}),
    "granite": ("GraniteConfig", "GraniteForCausalLM", {}),
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", {}),
    "llama3_rope": ("LlamaConfig", "LlamaForCausalLM", {"rope_scaling": LLAMA3_ROPE}),
}


def tiny(name):
    """A 2-layer, hidden-64 random model of architecture `name`, tiny-random's vocabulary."""
    config_class, model_class, extra = ARCHITECTURES[name]
    ids = tiny_random_config().to_dict()
    config = getattr(transformers, config_class)(
        vocab_size=ids["vocab_size"], hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
        bos_token_id=ids["bos_token_id"], eos_token_id=ids["eos_token_id"],
        pad_token_id=ids["pad_token_id"], **extra)
    torch.manual_seed(0)
    return getattr(transformers, model_class)(config)


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny-random")


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_the_plain_and_the_fast_paths_agree(name, tok):
    model = tiny(name)
    prompts = encode_prompts(tok, ["What is 2 + 3?", "Tom has 5 apples and eats 2 of them."])
    kw = dict(temperature=1.0, seeds=[1, 2])
    plain = generate(model, tok, prompts, 12, **kw)
    fast = fast_generate(model, tok, prompts, 12, **kw)
    assert fast.response_ids.tolist() == plain.response_ids.tolist()
    torch.testing.assert_close(fast.logprobs, plain.logprobs, atol=5e-5, rtol=0)
    ids, mask = plain.sequences()
    slow, _ = token_logprobs(model, ids, mask, plain.response_ids.shape[1], 1.0, fast=False)
    quick, _ = token_logprobs(model, ids, mask, plain.response_ids.shape[1], 1.0, fast=True)
    keep = plain.response_mask.bool()
    torch.testing.assert_close(quick[keep], slow[keep], atol=5e-5, rtol=0)
    # the sampler's log-probs are the training forward's, token for token
    torch.testing.assert_close(plain.logprobs[keep], slow[keep], atol=5e-5, rtol=0)


@pytest.mark.slow  # the second tier: two runs each
@pytest.mark.parametrize("name", ["qwen3", "gemma2", "phi3"])
def test_one_update_of_grpo_trains_alike_with_and_without_plain(name, tok, tmp_path):
    folder = tmp_path / name
    tiny(name).save_pretrained(folder)
    tok.save_pretrained(folder)
    lines = {}
    for plain in (False, True):
        out = tmp_path / f"run-{plain}"
        args = replace(grpo.Args(), model_name_or_path=str(folder), max_steps=1, num_prompts=2,
                       num_generations=4, max_new_tokens=12, num_eval_problems=0, plain=plain,
                       learning_rate=1e-3, output_dir=str(out))
        grpo.main(args)
        (lines[plain],) = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert lines[True]["response_len/mean"] == lines[False]["response_len/mean"]
    for key in ("reward/mean", "entropy", "grad_norm"):
        assert lines[True][key] == pytest.approx(lines[False][key], rel=1e-4, abs=1e-6), key
