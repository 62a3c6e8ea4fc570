"""The model card of a run (`README.md` in `output_dir`): TRL's card with the run's S2T values, silenced counts and
accuracy, built with `huggingface_hub.ModelCard` from `templates/model_card.md`."""

from __future__ import annotations

import json
import os
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from huggingface_hub import ModelCard, ModelCardData

from .core import STAPOTrainer
from .run_files import s2t_totals


TEMPLATE = Path(__file__).parent / "templates" / "model_card.md"
PAPER_URL = "https://huggingface.co/papers/2602.15620"
BUILD_RECORD = "stapo_builtin.json"  # what a `builtin:` model's folder records about its build (stapo_trl.models)
ROWS = (  # (field, meaning) of the settings table; the S2T rows only for a STAPO run
    ("s2t_prob_threshold", "τ_p: positive-advantage tokens sampled with a probability below it are candidates"),
    ("s2t_entropy_quantile", "q: candidates below the q-quantile τ_h of their entropies are silenced"),
    ("s2t_mode", "which candidates are silenced (`low_entropy`: the paper's rule)"),
    ("loss_type", "loss normalisation (`dapo`: token mean over the optimizer update)"),
    ("epsilon", "lower clip ε_low"),
    ("epsilon_high", "upper clip ε_high"),
    ("beta", "KL coefficient"),
    ("learning_rate", "learning rate"),
    ("num_generations", "rollouts per prompt"),
    ("per_device_train_batch_size", "completions per micro-step and process"),
    ("gradient_accumulation_steps", "micro-steps per optimizer update"),
    ("steps_per_generation", "micro-steps per rollout batch"),
    ("temperature", "rollout temperature (τ_p and q are calibrated at 1.0)"),
    ("max_completion_length", "max response tokens"),
)


def base_model_name(path: str | None) -> str | None:
    """The base model as a card names it: a Hub id as is, a built-in model's folder as its `builtin:` name, `None` for
    any other local folder (its path means nothing to a reader)."""
    record = os.path.join(str(path), BUILD_RECORD)
    if path and os.path.isfile(record):
        with open(record, encoding="utf-8") as f:
            return json.load(f).get("name")
    return None if not path or os.path.isabs(path) or os.path.exists(path) else path


def _saved_model(trainer) -> str:
    """Where the model of this card is: `output_dir` once the model is saved there (or nothing was trained), else the
    checkpoint of the last step."""
    output_dir, step = trainer.args.output_dir, trainer.state.global_step
    saved = any(os.path.isfile(os.path.join(output_dir, name)) for name in ("config.json", "adapter_config.json"))
    if saved or step == 0 or trainer.args.save_strategy == "no":
        return output_dir
    return os.path.join(output_dir, f"checkpoint-{step}")


def _quick_start(model: str, prompt: Any, adapter: bool, max_new_tokens: int) -> str:
    """Python that loads `model` (a LoRA adapter onto its base with peft) and asks it a training prompt."""
    load = ["from transformers import pipeline", ""]
    if adapter:
        load = ["from peft import AutoPeftModelForCausalLM", "from transformers import AutoTokenizer, pipeline", ""]
        load.append(f"model = AutoPeftModelForCausalLM.from_pretrained({json.dumps(model)}).merge_and_unload()")
        model_arg = f"model, tokenizer=AutoTokenizer.from_pretrained({json.dumps(model)})"
    else:
        model_arg = f"model={json.dumps(model)}"
    return "\n".join([
        *load,
        f'generator = pipeline("text-generation", {model_arg})',
        f"prompt = {json.dumps(prompt, ensure_ascii=False)}  # a training prompt, in the run's format",
        f'print(generator(prompt, max_new_tokens={max_new_tokens}, return_full_text=False)[0]["generated_text"])',
    ])  # fmt: skip


def _summary(trainer, s2t, eval_record: dict[str, Any] | None) -> list[str]:
    """Bullet lines: steps trained, the S2T mask over the run (pooled from the log history), accuracy before/after."""
    args, lines = trainer.args, [f"- **Steps trained**: {trainer.state.global_step} optimizer steps."]
    totals = s2t_totals(trainer.state.log_history)
    if s2t is None:
        lines.append("- **S2T mask**: none (plain `trl.GRPOTrainer`).")
    elif totals is None:
        lines.append(f"- **S2T mask** (`s2t_mode: {s2t.mode}`): no S2T counts logged yet.")
    else:
        silenced = "counted only, none silenced" if s2t.mode == "off" else f"{totals['num_silenced']:,} silenced"
        lines.append(
            f"- **S2T mask** (`s2t_mode: {s2t.mode}`): of {totals['num_loss_tokens']:,} loss tokens, "
            f"{totals['num_candidates']:,} candidates (A > 0, p < τ_p), {silenced} (silenced ratio "
            f"{totals['silenced_ratio']:.3g}, Σ silenced / Σ loss tokens over {totals['num_rows']} logged rows)."
        )
    if eval_record:
        r = eval_record
        lines.append(
            f"- **Accuracy** ({r['metric']} over {r['num_problems']} problems of the `{r['split']}` split, "
            f"T = {r['temperature']}, top-p {r['top_p']}): {100 * r['accuracy_before']:.1f} % before training, "
            f"{100 * r['accuracy_after']:.1f} % after."
        )
    return lines + [f"- **Planned steps** (`max_steps`): {args.max_steps}."] * (args.max_steps > 0)


def model_card(trainer, model_name=None, dataset_name=None, tags=None, eval_record=None, public=False) -> ModelCard:
    """The card of `trainer`'s run: TRL's sections (base model, quick start, framework versions, citations) with the
    paper, the S2T values and objective, the silenced counts over the run and `eval_record`'s accuracy.

    Args:
        trainer ([`~trl.GRPOTrainer`]): a STAPO trainer (its `s2t` values) or a plain GRPO one.
        model_name (`str`, *optional*): the card's title; defaults to `output_dir`'s name.
        dataset_name (`str`, *optional*): a Hub dataset id (linked); `None` for local or built-in data.
        tags (`list[str]`, *optional*): added to the trainer's `_tag_names`.
        eval_record (`dict`, *optional*): accuracy before and after training (`stapo-train`'s `eval.json`).
        public (`bool`, *optional*, defaults to `False`): the card as uploaded: the quick start loads `hub_model_id`
            (or `model_name`), and no local path is named.

    Returns:
        [`~huggingface_hub.ModelCard`]: `card.save(path)` writes it; `ModelCard.load(path)` reads it back.
    """
    args, s2t = trainer.args, getattr(trainer, "s2t", None)
    model_name = model_name or os.path.basename(os.path.normpath(args.output_dir))
    model = trainer.accelerator.unwrap_model(trainer.model)
    base = base_model_name(getattr(model.config, "_name_or_path", None))
    is_hub_id = base is not None and not base.startswith("builtin:")
    base_text = f"[{base}](https://huggingface.co/{base})" if is_hub_id else f"`{base}`" if base else "a local model"
    try:
        prompt = trainer.train_dataset[0]["prompt"]
    except (KeyError, IndexError, TypeError, NotImplementedError):  # no prompt column, or an iterable dataset
        prompt = None
    prompt = prompt if isinstance(prompt, (str, list)) else "What is 47+38?"
    reference = (trainer.hub_model_id or model_name) if public else _saved_model(trainer)
    method = (
        f"This model was trained with STAPO, introduced in [STAPO: Stabilizing Reinforcement Learning for LLMs by "
        f"Silencing Rare Spurious Tokens]({PAPER_URL}): positive-advantage tokens sampled with a low probability at "
        "low-entropy positions are silenced, and the loss is averaged over the remaining tokens."
    )
    if s2t is None or s2t.mode == "off":
        method = f"This model was trained with the GRPO objective below without the S2T mask of [STAPO]({PAPER_URL})."
    values = {name: getattr(s2t, name[4:]) for name, _ in ROWS[:3]} if s2t is not None else {}
    rows = [(n, meaning, values.get(n, getattr(args, n, None))) for n, meaning in ROWS[0 if s2t else 3 :]]
    card_data = ModelCardData(
        base_model=base if is_hub_id else None,
        datasets=dataset_name,
        library_name="transformers",
        model_name=model_name,
        tags=sorted({"generated_from_trainer", *trainer._tag_names, *(tags or [])}),
    )
    versions = []
    for name in ("stapo_trl", "trl", "transformers", "torch", "datasets", "tokenizers"):
        try:
            versions.append((name, version(name)))
        except PackageNotFoundError:
            continue
    return ModelCard.from_template(
        card_data,
        template_path=str(TEMPLATE),
        model_name=model_name,
        base_model_text=base_text,
        dataset_name=dataset_name,
        quick_start=_quick_start(reference, prompt, hasattr(model, "peft_config"), args.max_completion_length),
        wandb_url=wandb.run.url if (wandb := sys.modules.get("wandb")) and getattr(wandb, "run", None) else None,
        method_text=method,
        summary=_summary(trainer, s2t, eval_record),
        settings=[(name, meaning, getattr(value, "value", value)) for name, meaning, value in rows],
        versions=versions,
        citation=STAPOTrainer._paper["citation"],
    )
