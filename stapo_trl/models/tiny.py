"""The tiny-math recipe: a byte-level BPE tokenizer and a tiny Qwen3, built from scratch and SFT-warmed.

Deviations from an LLM worth knowing: the vocabulary is tiny, so hard-target SFT would make the model far more
peaked than a 150k-token LLM and the paper's tau_p = 0.002 would find almost no candidate; the warm-up therefore uses
label smoothing (0.02), which leaves an LLM-like low-probability tail.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import time
from typing import Any

from .names import build_record_header
from .warmup import EVAL_TEMPERATURE, SEED, evaluate_tiny_math, sft_warm_up


logger = logging.getLogger(__name__)

# An upper bound: BPE stops once every word of the task is a single token, at 329 tokens (256 bytes, 3 special
# tokens, 70 merges); digits never merge, so `85` is always `8`, `5`.
TOKENIZER_VOCAB_SIZE = 400
PAD_TOKEN, CHAT_START_TOKEN, EOS_TOKEN = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
# ChatML, as Qwen uses; `{% generation %}` marks assistant text so `assistant_only_loss=True` also works.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}{% generation %}{{- message['content'] + '<|im_end|>' }}{% endgeneration %}"
    "{{- '\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# hidden 64 / 2 layers / 4 query heads (2 key-value heads) / MLP 256 / tied embeddings: 144k parameters.
MODEL_CONFIG: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 512,
    "tie_word_embeddings": True,
}
SFT_CONFIG: dict[str, Any] = {
    "per_device_train_batch_size": 32,
    # A high rate suits a 144k-parameter model; measured on 2 CPU threads, 3e-3 needs ~450 steps to the same point.
    "learning_rate": 6e-3,
    "lr_scheduler_type": "linear",
    "warmup_steps": 20,
    # An LLM-like low-probability tail, so the paper's tau_p = 0.002 finds candidates (see the module docstring).
    "label_smoothing_factor": 0.02,
}


def build_tokenizer(corpus: list[str]):
    """Byte-level BPE tokenizer with single-digit tokens, trained on `corpus`, wrapped for transformers.

    Digits are split before BPE, so no merge ever contains a digit: `"85"` is always `["8", "5"]`, as in Qwen.

    Args:
        corpus (`list[str]`):
            Texts to learn the merges from (rendered chats of the task).

    Returns:
        [`~transformers.PreTrainedTokenizerFast`]: `TOKENIZER_VOCAB_SIZE` tokens, pad `<|endoftext|>`, eos
        `<|im_end|>`, a ChatML chat template.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB_SIZE,
        special_tokens=[PAD_TOKEN, CHAT_START_TOKEN, EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        chat_template=CHAT_TEMPLATE,
        model_max_length=MODEL_CONFIG["max_position_embeddings"],
    )


def build_model(tokenizer, seed: int = SEED, model_config: dict[str, Any] | None = None):
    """Random-init [`~transformers.Qwen3ForCausalLM`] of `MODEL_CONFIG`, sized to `tokenizer`, seeded.

    `model_config` overrides entries of `MODEL_CONFIG` (a built-in recipe's `model_config`, e.g. `{"head_dim": 64}`).
    """
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        **{**MODEL_CONFIG, **(model_config or {})},
    )
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None
    )
    return model


def build_tiny_model(name: str, recipe: dict[str, Any], output_dir: str | os.PathLike) -> dict[str, Any]:
    """The tiny recipe: tokenizer, model, optional warm-up and evaluation, saved into `output_dir`; returns the build
    record (`build_seconds` is set by the caller, which times the whole build)."""
    import tokenizers
    import torch
    import transformers
    import trl

    from ..data import make_tiny_math_dataset  # datasets is slow to import: only when a model is built

    data = make_tiny_math_dataset(seed=SEED)
    # The tokenizer learns its merges from the rendered chats, so the prompt's instruction and the chat markup
    # become whole-word tokens (30 prompt tokens, 29-31 completion tokens + eos).
    corpus = [
        "".join(f"{CHAT_START_TOKEN}{m['role']}\n{m['content']}{EOS_TOKEN}\n" for m in prompt)
        + f"{CHAT_START_TOKEN}assistant\n{completion}{EOS_TOKEN}\n"
        for prompt, completion in zip(data["train"]["prompt"], data["train"]["completion"])
    ]
    tokenizer = build_tokenizer(corpus)
    model = build_model(tokenizer, seed=SEED, model_config=recipe.get("model_config"))
    num_parameters = sum(p.numel() for p in model.parameters())
    logger.info("Tokenizer: %d tokens. Model: %d parameters.", len(tokenizer), num_parameters)

    losses = evaluation = None
    if recipe["sft_steps"] > 0:  # a random model scores 0 %: not worth the generation time either
        sft_start = time.perf_counter()
        losses = sft_warm_up(model, tokenizer, data["train"], recipe["sft_steps"], SFT_CONFIG, seed=SEED)
        logger.info("SFT warm-up: %d steps in %.1f s.", recipe["sft_steps"], time.perf_counter() - sft_start)
        evaluation = evaluate_tiny_math(model, tokenizer, data["test"])
        logger.info(
            "Held-out accuracy on %d problems: %.1f %% sampled (T=%.1f), %.1f %% greedy. Sample: %s -> %r",
            evaluation["num_problems"],
            100 * evaluation["sampled_accuracy"],
            EVAL_TEMPERATURE,
            100 * evaluation["greedy_accuracy"],
            evaluation["samples"][0]["problem"],
            evaluation["samples"][0]["completion"],
        )

    model.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    return {
        **build_record_header(name),
        "seed": SEED,
        "torch_threads": torch.get_num_threads(),
        "tokenizer": {"type": "byte-level BPE, single-digit tokens", "vocab_size": len(tokenizer)},
        "model": {
            "architecture": "Qwen3ForCausalLM",
            "num_parameters": num_parameters,
            **MODEL_CONFIG,
            **recipe.get("model_config", {}),
        },
        "sft": {
            "steps": recipe["sft_steps"],
            "train_examples": len(data["train"]),
            **(losses or {}),
            **(SFT_CONFIG if recipe["sft_steps"] > 0 else {}),
        },
        "eval": evaluation,
        "build_seconds": None,  # set by `build_builtin_model`, which times the whole build
        "versions": {
            "stapo_trl": importlib.metadata.version("stapo_trl"),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "trl": trl.__version__,
            "tokenizers": tokenizers.__version__,
        },
    }
