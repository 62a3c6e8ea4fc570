"""The `gguf+sft` recipe: a converted model SFT-warmed on tiny-math with label smoothing (keeps a low-p tail)."""

from __future__ import annotations

import os
import time
from typing import Any

from .names import BUILTIN_MODELS, read_builtin_info
from .warmup import SEED, evaluate_tiny_math, sft_warm_up


SFT_CONFIG: dict[str, Any] = {
    "per_device_train_batch_size": 8, "learning_rate": 5e-5, "lr_scheduler_type": "constant",
    "label_smoothing_factor": 0.01,
}  # fmt: skip
EVAL_NUM_PROBLEMS = 200  # the first 200 of the 300 held-out problems
EVAL_MAX_NEW_TOKENS = 64  # SmolLM2 writes a tiny-math completion in 29-32 tokens + eos


def build(name: str, output_dir: str | os.PathLike, base_path: str | os.PathLike | None) -> dict[str, Any]:
    """SFT-warm the built base at `base_path`, check it and save into `output_dir`; returns the record's fields."""
    import torch
    import trl
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..data import make_tiny_math_dataset
    from .gguf import state_dict_sha256

    recipe = BUILTIN_MODELS[name]
    if base_path is None:
        raise ValueError(f"builtin:{name} is SFT-warmed from builtin:{recipe['base']}: give its folder.")
    base_info = read_builtin_info(base_path)
    tokenizer = AutoTokenizer.from_pretrained(base_path)
    model = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
    data = make_tiny_math_dataset(seed=SEED)
    start = time.perf_counter()
    losses = sft_warm_up(model, tokenizer, data["train"], recipe["sft_steps"], SFT_CONFIG)
    sft = {"steps": recipe["sft_steps"], "train_examples": len(data["train"])}
    sft |= {"seconds": round(time.perf_counter() - start, 1), **losses, **SFT_CONFIG}
    evaluation = evaluate_tiny_math(model, tokenizer, EVAL_NUM_PROBLEMS, EVAL_MAX_NEW_TOKENS, statistics=True)
    model.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    return {
        "base": {k: base_info[k] for k in ("name", "version", "source", "state_dict_sha256")},
        **{k: base_info[k] for k in ("chat_template", "tokenizer", "model")},
        "seed": SEED,
        "sft": sft,
        "eval": evaluation,
        "state_dict_sha256": state_dict_sha256(model),
        "versions": {"trl": trl.__version__, "gguf": base_info["versions"]["gguf"]},
    }
