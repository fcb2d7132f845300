"""A random model that can call a tool by chance, for tools.py's learning test: tests/char_model.py's
character vocabulary plus the tags <calc>, </calc>, <output>, </output> as one token each, so that a
random 2-layer Llama writes </calc> about once in a hundred tokens (tiny-random would need three
rare tokens in a row). It stops on EOS only. Saved with save_pretrained: `--model_name_or_path
<folder>` loads it like any local checkpoint."""

from pathlib import Path

from char_model import CHARS, TEMPLATE

TAGS = ["<calc>", "</calc>", "<output>", "</output>"]


def build(folder):
    """Write the model and its tokenizer to `folder` (once) and return the folder as a string."""
    folder = Path(folder)
    if (folder / "config.json").exists():
        return str(folder)
    import torch
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    specials = ["<pad>", "<s>", "</s>", "<unk>"]
    vocab = {t: i for i, t in enumerate(specials + CHARS + TAGS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    # the tags are single tokens, everything else one character
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"</?calc>|</?output>|[\s\S]"),
                                             behavior="isolated")
    tok.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                        pad_token="<pad>", unk_token="<unk>")
    tokenizer.chat_template = TEMPLATE
    config = LlamaConfig(vocab_size=len(vocab), hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=8192, tie_word_embeddings=True, bos_token_id=1,
                         eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)
