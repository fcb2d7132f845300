"""A local stand-in for a hub model in tests of full command lines: a random 2-layer Llama over a
character vocabulary (printable ASCII, newline, the Math-Shepherd step tag 'ки'), with a chat
template, saved with save_pretrained so that `--model_name_or_path <folder>` loads it like any local
checkpoint.

Its generation config stops on EOS and on a dozen rare characters, as some models stop on several
ids: with random weights a response then ends after about 8 tokens, so the seeds' command lines (512
samples of up to 1024 tokens) run in seconds on a CPU.
"""

from pathlib import Path

CHARS = [chr(c) for c in range(32, 127)] + ["\n"]
STOPS = list("~`|^{}[]<>@#$")  # stop like EOS, each about 1 % of a random model's samples
TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")


def build(folder):
    """Write the model and its tokenizer to `folder` (once) and return the folder as a string."""
    folder = Path(folder)
    if (folder / "config.json").exists():
        return str(folder)
    import torch
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    specials = ["<pad>", "<s>", "</s>", "<unk>"]
    vocab = {t: i for i, t in enumerate(specials + CHARS + ["ки"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    # every character is a token, except the step tag, which comes first in the alternation
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"ки|[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                        pad_token="<pad>", unk_token="<unk>")
    tokenizer.chat_template = TEMPLATE
    config = LlamaConfig(vocab_size=len(vocab), hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192,
                         tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = [2] + [vocab[c] for c in STOPS]
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)
