"""Supervised warm-up of a built-in model with TRL's `SFTTrainer`, and its held-out accuracy on tiny-math."""

from __future__ import annotations

import tempfile
import warnings
from typing import Any

from ..grading import extract_boxed_answer


# The seed of every built-in recipe (data order, model init, sampling of the accuracy check).
SEED = 0
# Held-out accuracy check after the build: the whole tiny-math test split, sampled like the RL rollouts.
EVAL_TEMPERATURE = 1.0
EVAL_MAX_NEW_TOKENS = 48


def sft_warm_up(
    model, tokenizer, train_dataset, max_steps: int, sft_config: dict[str, Any], seed: int = SEED
) -> dict[str, float]:
    """Supervised warm-up with TRL's [`~trl.SFTTrainer`] on prompt/completion pairs (CPU, loss on completions).

    Args:
        model ([`~transformers.PreTrainedModel`]): The model, trained in place.
        tokenizer ([`~transformers.PreTrainedTokenizerBase`]): Its tokenizer, with a chat template.
        train_dataset ([`~datasets.Dataset`]): Tiny-math rows (conversational `prompt`, string `completion`).
        max_steps (`int`): Optimizer steps of `sft_config["per_device_train_batch_size"]` examples.
        sft_config (`dict[str, Any]`): `SFTConfig` fields of the recipe (batch size, learning rate, schedule,
            label smoothing), e.g. `stapo_trl.builtin.tiny.SFT_CONFIG`.
        seed (`int`, *optional*, defaults to `SEED`): Seed of the data order.

    Returns:
        `dict[str, float]`: `mean_train_loss` (over all steps) and `last_logged_loss` (label-smoothed cross-entropy,
        nats per completion token).
    """
    from trl import SFTConfig, SFTTrainer

    dataset = train_dataset.map(
        lambda ex: {"completion": [{"role": "assistant", "content": ex["completion"]}]},
        remove_columns=[c for c in train_dataset.column_names if c not in ("prompt", "completion")],
    )
    with tempfile.TemporaryDirectory() as output_dir:
        args = SFTConfig(
            output_dir=output_dir,
            max_steps=max_steps,
            seed=seed,
            use_cpu=True,
            bf16=False,
            report_to=[],
            save_strategy="no",
            logging_steps=50,
            disable_tqdm=True,
            # TRL turns it on by default; a 144k-parameter model needs no memory saving.
            **{_checkpointing_field(SFTConfig): False},
            **sft_config,
        )
        with warnings.catch_warnings():
            # TRL deprecates `label_smoothing_factor` in SFTTrainer (it costs an extra forward pass); it is the point
            # of this warm-up, see the module docstring.
            warnings.filterwarnings("ignore", message=".*label_smoothing_factor.*", category=FutureWarning)
            trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)
        trainer.train()
    losses = [log["loss"] for log in trainer.state.log_history if "loss" in log]
    return {"mean_train_loss": trainer.state.log_history[-1]["train_loss"], "last_logged_loss": losses[-1]}


def _checkpointing_field(config_class) -> str:
    """The gradient-checkpointing field of a `TrainingArguments` subclass: `activation_checkpointing` from
    transformers 5.24 (where `gradient_checkpointing` is a deprecated alias), `gradient_checkpointing` before (5.19,
    the vLLM CPU environment)."""
    import dataclasses

    names = {field.name for field in dataclasses.fields(config_class)}
    return "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"


def measure_accuracy(
    model, tokenizer, prompts: list, solutions: list[str], *, do_sample: bool, seed: int = SEED, batch_size: int = 100
) -> tuple[float, list[str]]:
    """Fraction of prompts whose completion's last `\\boxed{}` equals the gold string exactly.

    Args:
        model ([`~transformers.PreTrainedModel`]): The model, on CPU.
        tokenizer ([`~transformers.PreTrainedTokenizerBase`]): Its tokenizer, with a chat template.
        prompts (`list`): Conversational prompts.
        solutions (`list[str]`): Gold answers.
        do_sample (`bool`): Sample at `EVAL_TEMPERATURE` (True) or decode greedily (False).
        seed (`int`, *optional*, defaults to `SEED`): Seed of the sampling.
        batch_size (`int`, *optional*, defaults to `100`): Prompts per `generate` call.

    Returns:
        `tuple[float, list[str]]`: The accuracy, a fraction in [0, 1], and the decoded completions.
    """
    import torch

    torch.manual_seed(seed)
    model.eval()
    completions: list[str] = []
    for start in range(0, len(prompts), batch_size):
        texts = [
            tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True)
            for p in prompts[start : start + batch_size]
        ]
        batch = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(
                **batch,
                max_new_tokens=EVAL_MAX_NEW_TOKENS,
                do_sample=do_sample,
                temperature=EVAL_TEMPERATURE if do_sample else None,
                top_p=1.0 if do_sample else None,
                top_k=0 if do_sample else None,
            )
        completions += tokenizer.batch_decode(out[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
    correct = sum(extract_boxed_answer(c) == s for c, s in zip(completions, solutions))
    return correct / len(prompts), completions


def evaluate_tiny_math(model, tokenizer, test_dataset) -> dict[str, Any]:
    """Held-out accuracy of a tiny-math model: sampled at `EVAL_TEMPERATURE` (as RL rollouts are) and greedy.

    Args:
        model ([`~transformers.PreTrainedModel`]): The model, on CPU.
        tokenizer ([`~transformers.PreTrainedTokenizerBase`]): Its tokenizer.
        test_dataset ([`~datasets.Dataset`]): Tiny-math rows (`prompt`, `solution`, `problem`).

    Returns:
        `dict[str, Any]`: `sampled_accuracy` and `greedy_accuracy` (fractions in [0, 1]), the settings, and the
        first five sampled completions.
    """
    prompts, solutions = test_dataset["prompt"], test_dataset["solution"]
    sampled_accuracy, sampled = measure_accuracy(model, tokenizer, prompts, solutions, do_sample=True)
    greedy_accuracy, _ = measure_accuracy(model, tokenizer, prompts, solutions, do_sample=False)
    return {
        "split": "builtin:tiny-math test",
        "num_problems": len(prompts),
        "temperature": EVAL_TEMPERATURE,
        "top_p": 1.0,
        "max_new_tokens": EVAL_MAX_NEW_TOKENS,
        "sampled_accuracy": sampled_accuracy,
        "greedy_accuracy": greedy_accuracy,
        # A few sampled completions: at T = 1.0 some wander into the low-probability tail label smoothing left.
        "samples": [
            {"problem": test_dataset[i]["problem"], "completion": sampled[i], "solution": solutions[i]}
            for i in range(min(5, len(prompts)))
        ],
    }
