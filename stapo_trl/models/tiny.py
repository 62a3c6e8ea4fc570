"""The `tiny` recipe: a byte-level BPE tokenizer and a tiny Qwen3 from scratch, SFT-warmed with label smoothing."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import tokenizers
import torch
import trl
from tokenizers import decoders, models, pre_tokenizers, trainers
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from ..data import make_tiny_math_dataset
from .names import BUILTIN_MODELS
from .sft_math import SEED, evaluate_tiny_math, sft_warm_up


TOKENIZER_VOCAB_SIZE = 400  # an upper bound: BPE stops once every word of the task is one token
PAD_TOKEN, CHAT_START_TOKEN, EOS_TOKEN = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
CHAT_TEMPLATE = (Path(__file__).parents[1] / "templates" / "tiny_chat_template.jinja").read_text("utf-8")
MODEL_CONFIG: dict[str, Any] = {"hidden_size": 64, "intermediate_size": 256, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 512,
    "tie_word_embeddings": True}  # fmt: skip
SFT_CONFIG: dict[str, Any] = {"per_device_train_batch_size": 32, "learning_rate": 6e-3, "lr_scheduler_type": "linear",
                              "warmup_steps": 20, "label_smoothing_factor": 0.02}  # fmt: skip


def build(name: str, output_dir: str | os.PathLike, base_path: None = None) -> dict[str, Any]:
    """Build `builtin:<name>` into `output_dir` (BPE, digits split as in Qwen, ChatML); the record's fields."""
    recipe, data = BUILTIN_MODELS[name], make_tiny_math_dataset(seed=SEED)
    config = {**MODEL_CONFIG, **recipe.get("model_config", {})}
    bpe = tokenizers.Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False)])  # fmt: skip
    bpe.decoder = decoders.ByteLevel()
    corpus = ["".join(f"{CHAT_START_TOKEN}{m['role']}\n{m['content']}{EOS_TOKEN}\n" for m in prompt)
              + f"{CHAT_START_TOKEN}assistant\n{completion}{EOS_TOKEN}\n"
              for prompt, completion in zip(data["train"]["prompt"], data["train"]["completion"])]  # fmt: skip
    bpe.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB_SIZE, special_tokens=[PAD_TOKEN, CHAT_START_TOKEN, EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))  # fmt: skip
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token=PAD_TOKEN, eos_token=EOS_TOKEN,
        chat_template=CHAT_TEMPLATE, model_max_length=MODEL_CONFIG["max_position_embeddings"])  # fmt: skip
    special = {"pad_token_id": tokenizer.pad_token_id, "eos_token_id": tokenizer.eos_token_id, "bos_token_id": None}
    torch.manual_seed(SEED)
    model = Qwen3ForCausalLM(Qwen3Config(vocab_size=len(tokenizer), **special, **config))
    model.generation_config = GenerationConfig(**special)
    num_parameters = sum(p.numel() for p in model.parameters())
    sft, evaluation = {"steps": recipe["sft_steps"], "train_examples": len(data["train"])}, None
    if recipe["sft_steps"] > 0:
        sft.update(sft_warm_up(model, tokenizer, data["train"], recipe["sft_steps"], SFT_CONFIG), **SFT_CONFIG)
        evaluation = evaluate_tiny_math(model, tokenizer, len(data["test"]))
    model.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    return {"seed": SEED, "tokenizer": {"type": "byte-level BPE, single-digit tokens", "vocab_size": len(tokenizer)},
        "model": {"architecture": "Qwen3ForCausalLM", "num_parameters": num_parameters, **config}, "sft": sft,
        "eval": evaluation, "versions": {"trl": trl.__version__, "tokenizers": tokenizers.__version__}}  # fmt: skip
