"""The real-model tiny-math recipe (`kind: gguf+sft`): a converted real model SFT-warmed on tiny-math.

`builtin:smollm2-135m-math` is `builtin:smollm2-135m` (read from the cache, converted there first if needed) after
`sft_steps` steps of TRL's [`~trl.SFTTrainer`] on the tiny-math train split, so that RL starts from a model that is
right often but not always at temperature 1 and that still spreads some probability over other tokens.

Why label smoothing (as the tiny model's warm-up): hard-target SFT makes SmolLM2 near-deterministic on this task within
20-30 steps (59-74 % sampled accuracy, sampled-token entropy p50 0.006-0.0026 nats, 3e-4 of the sampled tokens below
p = 0.002), and the paper's tau_p = 0.002 then finds almost no candidate. Smoothing spreads its mass evenly over all
49,152 tokens, so a little goes a long way: at 0.02 a fifth of the sampled tokens are below p = 0.002 and completions
derail into junk (entropy p90 5-8 nats); at 0.005 the tail is thin (0.3-0.9 %). The settings tried are in
`benchmarks/results/2026-12-01-smollm2-warmup.md` (100 held-out problems each).

Chosen: label smoothing 0.01, 20 steps of 8 examples at lr 5e-5 (constant). The build's check, on the first 200 held-out
problems at T = 1 (top-p 1, no top-k, 64 new tokens, seed 0): 38 % sampled accuracy (77.5 % greedy: the argmax is mostly
right, sampling reaches the tail); sampled-token entropy p10 / p50 / p90 0.047 / 0.173 / 0.99 nats (mean 0.45; 70x the
hard-target model's p50); 2.3 % of the sampled tokens drawn with p < 0.002. Built in ~11 min on 2 CPU cores (20 SFT steps
~6 min, the two 200-problem checks ~4 min), 4.1 GB peak; two builds gave the same weights (state-dict SHA-256
c811246a...).
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import time
from typing import Any

from .names import build_record_header, read_builtin_info
from .warmup import SEED, evaluate_tiny_math, sft_warm_up


logger = logging.getLogger(__name__)

SFT_CONFIG: dict[str, Any] = {
    "per_device_train_batch_size": 8,
    "learning_rate": 5e-5,
    # Constant: a run stopped at step k is the same model as a k-step run, so one sweep run measures every length.
    "lr_scheduler_type": "constant",
    # See the module docstring: 0.01 leaves a tail (~1.5 % of sampled tokens below tau_p) without derailing.
    "label_smoothing_factor": 0.01,
}
# Held-out check: the first 200 problems of the tiny-math test split (of 300), sampled at T = 1 and greedy.
EVAL_NUM_PROBLEMS = 200
# SmolLM2's tokenizer writes a tiny-math completion in 29-32 tokens + eos (digits are single tokens, as in the tiny
# tokenizer; prompts are 53 tokens with its default system message); 64 leaves room for stray tokens.
EVAL_MAX_NEW_TOKENS = 64


def build_sft_math_model(
    name: str, recipe: dict[str, Any], output_dir: str | os.PathLike, base_path: str | os.PathLike
) -> dict[str, Any]:
    """SFT-warm the converted `recipe["base"]` on tiny-math, measure it, and save it into `output_dir`.

    Args:
        name (`str`): The registry key (without `builtin:`).
        recipe (`dict[str, Any]`): Its `BUILTIN_MODELS` entry (`base`, `sft_steps`, `version`, ...).
        output_dir (`str` or `os.PathLike`): Existing directory to write into.
        base_path (`str` or `os.PathLike`): The folder of the built base model (`recipe["base"]`).

    Returns:
        `dict[str, Any]`: The build record (the caller adds `build_seconds` and writes `stapo_builtin.json`): the
        base's source and checksums, the SFT settings and losses, `eval` (accuracy on `EVAL_NUM_PROBLEMS` held-out
        problems, sampled and greedy, and the entropy and probability of the sampled tokens) and `state_dict_sha256`.
    """
    import torch
    import transformers
    import trl
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..data import make_tiny_math_dataset
    from .gguf import state_dict_sha256

    base_info = read_builtin_info(base_path)
    tokenizer = AutoTokenizer.from_pretrained(base_path)
    model = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
    data = make_tiny_math_dataset(seed=SEED)

    sft_start = time.perf_counter()
    losses = sft_warm_up(model, tokenizer, data["train"], recipe["sft_steps"], SFT_CONFIG, seed=SEED)
    sft_seconds = round(time.perf_counter() - sft_start, 1)
    logger.info("SFT warm-up: %d steps in %.1f s.", recipe["sft_steps"], sft_seconds)
    evaluation = evaluate_tiny_math(
        model,
        tokenizer,
        data["test"].select(range(EVAL_NUM_PROBLEMS)),
        max_new_tokens=EVAL_MAX_NEW_TOKENS,
        token_statistics=True,
    )
    tokens = evaluation["sampled_tokens"]
    logger.info(
        "Held-out accuracy on %d problems: %.1f %% sampled (T=1), %.1f %% greedy; sampled-token entropy p50 %.4f "
        "nats, %.2e of them below p=%g.",
        evaluation["num_problems"],
        100 * evaluation["sampled_accuracy"],
        100 * evaluation["greedy_accuracy"],
        tokens["entropy_nats"]["p50"],
        tokens["frac_prob_below_tau_p"],
        tokens["tau_p"],
    )
    model.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    return {
        **build_record_header(name),
        "base": {
            "name": base_info["name"],
            "version": base_info["version"],
            "source": base_info["source"],
            "state_dict_sha256": base_info["state_dict_sha256"],
        },
        "chat_template": base_info["chat_template"],
        "tokenizer": base_info["tokenizer"],
        "model": base_info["model"],
        "seed": SEED,
        "torch_threads": torch.get_num_threads(),
        "sft": {
            "steps": recipe["sft_steps"],
            "train_examples": len(data["train"]),
            "seconds": sft_seconds,
            **losses,
            **SFT_CONFIG,
        },
        "eval": evaluation,
        "state_dict_sha256": state_dict_sha256(model),
        "versions": {
            "stapo_trl": importlib.metadata.version("stapo_trl"),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "trl": trl.__version__,
            **{k: v for k, v in base_info["versions"].items() if k == "gguf"},
        },
    }
