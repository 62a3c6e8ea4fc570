"""A saved 2-layer Qwen3 (hidden 32, random weights) and a character-level tokenizer of ~50 tokens, from transformers
and tokenizers: nothing of the product."""

from string import ascii_lowercase, digits

import pytest


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory) -> str:
    import torch
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    vocab = {t: i for i, t in enumerate(["<pad>", "<eos>", "<unk>", *digits, *ascii_lowercase, *"+=.,? "])}
    (backend := Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))).decoder = decoders.Fuse()
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    config = Qwen3Config(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=128,
                         pad_token_id=0, eos_token_id=1, tie_word_embeddings=True)  # fmt: skip
    torch.manual_seed(0)
    Qwen3ForCausalLM(config).save_pretrained(path := tmp_path_factory.mktemp("tiny-qwen3"))
    PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>",
                            unk_token="<unk>").save_pretrained(path)  # fmt: skip
    return str(path)
