"""The model card of a STAPO run: TRL's card plus a section with the run's settings, results and base model.

TRL writes the card (`README.md` in `output_dir`) from the trainer's `_name`, `_paper` and `_tag_names`: it names
STAPO, links the paper and carries its BibTeX, but its "Training procedure" is empty (tracker badges only), it says
nothing about the S2T thresholds, and for a local or `builtin:` base model it prints a broken link ("fine-tuned
version of [None](https://huggingface.co/None)"). [`add_stapo_section`] fills the procedure (steps trained, the S2T
mask over the run, held-out accuracy, the recipe's key values) and fixes the link. It is idempotent (a marked section
is replaced, never duplicated), so the product trainers' `create_model_card` runs it after TRL's every time, including
the one `push_to_hub` makes.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from ..core import STAPOConfig
from ..core.s2t import S2TSettings
from ..core.stapo_config import s2t_settings
from ..data import NOT_HELD_OUT, is_local_dataset_file
from ..models.names import BUILTIN_MODELS, INFO_FILE, read_builtin_info
from .metrics_log import s2t_totals
from .run_folder import open_run_file


SECTION_START = "<!-- stapo_trl:settings -->"
SECTION_END = "<!-- /stapo_trl:settings -->"
PAPER_URL = "https://huggingface.co/papers/2602.15620"
LOCAL_MODEL = "a local model"  # how a card names a base model loaded from a local folder

# (field, what it is in the paper) of the rows of the settings table, in order.
_S2T_FIELDS = (
    ("s2t_prob_threshold", "τ_p: positive-advantage tokens sampled with probability below it are candidates"),
    ("s2t_entropy_quantile", "q: candidates below the q-quantile τ_h of the candidates' entropies are silenced"),
    ("s2t_mode", "which candidates are silenced (`low_entropy` is the paper's rule)"),
)
_OBJECTIVE_FIELDS = (
    ("loss_type", "loss normalisation (`dapo`: token mean over the optimizer step)"),
    ("epsilon", "lower clip ε_low"),
    ("epsilon_high", "upper clip ε_high (clip-higher)"),
    ("beta", "KL coefficient"),
    ("learning_rate", "learning rate"),
    ("lr_scheduler_type", "learning-rate schedule"),
    ("num_generations", "rollouts per prompt"),
    ("per_device_train_batch_size", "completions per micro-step and process"),
    ("gradient_accumulation_steps", "micro-steps per optimizer update"),
    ("steps_per_generation", "micro-steps per rollout batch (> GA: several optimizer updates per rollout batch)"),
    ("temperature", "rollout temperature (the S2T thresholds are calibrated at 1.0)"),
    ("top_p", "rollout top-p"),
    ("max_completion_length", "max response tokens"),
)


def base_model_name(model_name_or_path: str) -> str:
    """How a card names the base model: a Hub id as is, a built-in model's folder by its `builtin:` name, any other
    local folder as `LOCAL_MODEL` (its path means nothing to a reader, and may say more than the user wants).

    Args:
        model_name_or_path (`str`): what the model was loaded from (a Hub id, a directory, a `builtin:` cache folder).

    Returns:
        `str`: e.g. `"Qwen/Qwen3-1.7B-Base"`, `"builtin:tiny-math"` or `"a local model"`.
    """
    if os.path.isfile(os.path.join(model_name_or_path, INFO_FILE)):
        return read_builtin_info(model_name_or_path).get("name", LOCAL_MODEL)
    if os.path.isabs(model_name_or_path) or os.path.exists(model_name_or_path):
        return LOCAL_MODEL
    return model_name_or_path


def _named(base_model: str) -> str:
    """The base model as the card writes it: a name in code font, `LOCAL_MODEL` as words."""
    return base_model if base_model == LOCAL_MODEL else f"`{base_model}`"


def _s2t_of(args: Any, s2t: S2TSettings | None) -> S2TSettings | None:
    """`s2t` when given (a trainer's), else a `STAPOConfig`'s S2T values; `None` for a plain GRPO run."""
    return s2t if s2t is not None or not isinstance(args, STAPOConfig) else s2t_settings(args, STAPOConfig._s2t_modes)


def _value(args: Any, name: str, s2t: S2TSettings | None = None) -> str:
    value = (
        getattr(s2t, name.removeprefix("s2t_")) if s2t is not None and name.startswith("s2t_") else getattr(args, name)
    )
    value = getattr(value, "value", value)  # transformers enums (SchedulerType) -> their string
    return f"`{value}`"


def _percent(value: float) -> str:
    return f"{100 * value:.1f} %"


def run_summary_lines(
    args: Any,
    *,
    s2t: S2TSettings | None = None,
    global_step: int | None = None,
    log_rows: list[dict[str, Any]] | None = None,
    eval_record: dict[str, Any] | None = None,
) -> list[str]:
    """The card's account of what the run did: steps trained, the S2T mask over the run, held-out accuracy.

    Args:
        args ([`~stapo_trl.STAPOConfig`] or [`~trl.GRPOConfig`]): the training arguments.
        s2t ([`~stapo_trl.core.s2t.S2TSettings`], *optional*): the S2T values the trainer ran with (`trainer.s2t`, also
            for a plain `GRPOConfig`); `None`: those of a `STAPOConfig`, else a plain GRPO run without the mask.
        global_step (`int`, *optional*): optimizer steps trained; `None` leaves the line out.
        log_rows (`list[dict]`, *optional*): the run's log rows (`trainer.state.log_history`, the rows `metrics.jsonl`
            is written from); the silenced ratio is pooled over them ([`~stapo_trl.runfiles.metrics_log.s2t_totals`]).
        eval_record (`dict`, *optional*): the content of `eval.json` (held-out accuracy before and after training);
            `None`: "not measured".

    Returns:
        `list[str]`: Markdown bullet lines. No paths and no dataset names (the same lines go into an uploaded card).
    """
    lines = []
    if global_step is not None:
        planned = f" (`max_steps` {args.max_steps})" if getattr(args, "max_steps", -1) > 0 else ""
        lines.append(f"- **Steps trained**: {global_step} optimizer steps{planned}.")
    s2t = _s2t_of(args, s2t)
    mode = s2t.mode if s2t is not None else None
    totals = s2t_totals(log_rows) if log_rows else None
    if mode is None:
        lines.append("- **S2T mask**: off (plain GRPO: `trl.GRPOTrainer`, no S2T mask).")
    elif mode == "off":
        counted = ""
        if totals is not None:
            counted = (
                f"; {totals['num_candidates']:,} of {totals['num_loss_tokens']:,} loss tokens were candidates "
                f"(A > 0, p < τ_p = {s2t.prob_threshold:g}), counted only"
            )
        lines.append(f"- **S2T mask**: off (`s2t_mode: off`): no token was silenced{counted}.")
    elif totals is not None:
        lines.append(
            f"- **S2T mask** (`s2t_mode: {mode}`): {totals['num_silenced']:,} of {totals['num_loss_tokens']:,} loss "
            f"tokens silenced over the run, a silenced ratio of {totals['silenced_ratio']:.3g} (pooled: Σ silenced / "
            f"Σ loss tokens over the {totals['num_rows']} logged rows); the mask fired in "
            f"{totals['rows_with_silencing']} of them; candidates (A > 0, p < τ_p): {totals['num_candidates']:,}."
        )
    else:
        lines.append(f"- **S2T mask** (`s2t_mode: {mode}`): no S2T counts logged yet.")
    if eval_record is not None:
        split = eval_record.get("split", "test")
        kind = "Accuracy on training prompts (not held out)" if split == NOT_HELD_OUT else "Held-out accuracy"
        lines.append(
            f"- **{kind}** ({eval_record['metric']} over {eval_record['num_problems']} problems of the "
            f"`{split}` split, T = {eval_record['temperature']}, top-p "
            f"{eval_record['top_p']}, up to {eval_record['max_new_tokens']} new tokens): "
            f"{_percent(eval_record['accuracy_before'])} before training, "
            f"{_percent(eval_record['accuracy_after'])} after."
        )
    else:
        lines.append("- **Held-out accuracy**: not measured (`eval_before_after` off, or not finished yet).")
    return lines


def stapo_card_section(
    args: Any,
    base_model: str,
    *,
    s2t: S2TSettings | None = None,
    global_step: int | None = None,
    log_rows: list[dict[str, Any]] | None = None,
    eval_record: dict[str, Any] | None = None,
) -> str:
    """The Markdown section: what was trained from what, how long, with which settings, and what it gave.

    It goes under TRL's "## Training procedure" heading: the run's summary ([`run_summary_lines`]: steps trained, the
    S2T mask over the run, held-out accuracy before and after) and the recipe's key values (S2T, objective, batch
    geometry, rollouts).

    Args:
        args ([`~stapo_trl.STAPOConfig`] or [`~trl.GRPOConfig`]): the training arguments.
        base_model (`str`): the base model's name.
        s2t, global_step, log_rows, eval_record: as in [`run_summary_lines`]; without S2T values, a "no S2T mask" line
            instead of the S2T rows.

    Returns:
        `str`: the section, between the markers `SECTION_START` and `SECTION_END`.
    """
    s2t = _s2t_of(args, s2t)
    is_stapo = s2t is not None
    lines = [SECTION_START, "", "### STAPO run: settings and results", ""]
    if is_stapo and s2t.mode == "off":
        lines.append(
            f"Base model: {_named(base_model)}, trained with `stapo_trl.STAPOTrainer` with the S2T mask off "
            f"(`s2t_mode: off`): the GRPO objective below without the mask, the like-for-like baseline of "
            f"[STAPO]({PAPER_URL}) (arXiv:2602.15620)."
        )
    elif is_stapo:
        lines.append(
            f'Base model: {_named(base_model)}, trained with [STAPO]({PAPER_URL}) (Liu et al., 2026, "STAPO: Stabilizing '
            'Reinforcement Learning for LLMs by Silencing Rare Spurious Tokens", arXiv:2602.15620) using '
            "`stapo_trl.STAPOTrainer`: positive-advantage tokens sampled with a low probability at low-entropy "
            "positions (spurious tokens) are removed from the numerator and the denominator of the loss."
        )
    else:
        lines.append(
            f"Base model: {_named(base_model)}, trained with the GRPO objective below and no S2T mask (the baseline of "
            f"[STAPO]({PAPER_URL}), arXiv:2602.15620)."
        )
    base_license = BUILTIN_MODELS.get(base_model.removeprefix("builtin:"), {}).get("license")
    if base_model.startswith("builtin:") and base_license:
        lines += ["", f"The base model's license applies to this model too: {base_license}."]
    lines += [""] + run_summary_lines(
        args, s2t=s2t, global_step=global_step, log_rows=log_rows, eval_record=eval_record
    )
    lines += ["", "| setting | meaning | value |", "|---|---|---|"]
    rows = (_S2T_FIELDS if is_stapo else ()) + _OBJECTIVE_FIELDS
    lines += [f"| `{name}` | {meaning} | {_value(args, name, s2t)} |" for name, meaning in rows]
    lines += ["", SECTION_END, ""]
    return "\n".join(lines)


def quick_start_code(model: str, prompt: Any, *, adapter: bool, max_new_tokens: int) -> str:
    """The card's quick start: Python that loads the saved model and asks it one prompt in the run's own format.

    Args:
        model (`str`): what the reader loads: the output folder, or the Hub id when the card is uploaded.
        prompt (`str` or `list[dict]`): a training prompt as the run saw it (a string, or chat messages with the
            run's instruction), so the model is asked what it was trained on.
        adapter (`bool`): the folder holds a PEFT (LoRA) adapter, not full weights: it is loaded onto its base model
            with `peft.AutoPeftModelForCausalLM` (`pipeline(model=folder)` would look for full weights).
        max_new_tokens (`int`): the generation budget (the run's `max_completion_length`).

    Returns:
        `str`: a fenced Python block.
    """
    if adapter:
        load = [
            "from peft import AutoPeftModelForCausalLM",
            "from transformers import AutoTokenizer, pipeline",
            "",
            f"model = AutoPeftModelForCausalLM.from_pretrained({json.dumps(model)})  # the LoRA adapter on its base",
            f'generator = pipeline("text-generation", model=model, tokenizer=AutoTokenizer.from_pretrained({json.dumps(model)}))',
        ]
    else:
        load = [
            "from transformers import pipeline",
            "",
            f'generator = pipeline("text-generation", model={json.dumps(model)})',
        ]
    ask = f"output = generator(prompt, max_new_tokens={max_new_tokens}, return_full_text=False)[0]"
    lines = [
        "```python",
        *load,
        f"prompt = {json.dumps(prompt, ensure_ascii=False)}  # a training prompt, in the format the run used",
        ask,
        'print(output["generated_text"])',
        "```",
    ]
    return "\n".join(lines)


def _replace_quick_start(card: str, code: str) -> str:
    """`card` with the code block under TRL's "## Quick start" heading replaced by `code` (unchanged when absent)."""
    heading = "## Quick start"
    if heading not in card:
        return card
    head, tail = card.split(heading, 1)
    start = tail.find("```python")
    end = tail.find("```", start + len("```python")) if start >= 0 else -1
    if start < 0 or end < 0:
        return card
    return head + heading + tail[:start] + code + tail[end + 3 :]


def saved_model_path(trainer) -> str:
    """Where the card's quick start finds the model: `output_dir` once `save_model` wrote it there, before training or
    without checkpoints; else `checkpoint-<global_step>` in it, which TRL saves right after writing the card (a
    Python-API run never calls `save_model`)."""
    output_dir, step = trainer.args.output_dir, trainer.state.global_step
    saved = any(os.path.isfile(os.path.join(output_dir, name)) for name in ("config.json", "adapter_config.json"))
    if saved or step == 0 or trainer.args.save_strategy == "no":
        return output_dir
    return os.path.join(output_dir, f"{PREFIX_CHECKPOINT_DIR}-{step}")


def write_quick_start(trainer, example_prompt: Any, model_ref: str | None = None) -> str | None:
    """Replace the quick start of the card in `trainer.args.output_dir/README.md` (main process only).

    TRL's quick start asks a generic chat question with `device_map="auto"`, which a task model trained on a fixed
    prompt format cannot answer, and loads a LoRA output folder as full weights (it fails). This one asks a training
    prompt in the run's own format and loads an adapter onto its base model ([`quick_start_code`]).

    Args:
        trainer ([`~stapo_trl.STAPOTrainer`] or [`~trl.GRPOTrainer`]): after `create_model_card`.
        example_prompt (`str` or `list[dict]`): a training prompt as the run saw it.
        model_ref (`str`, *optional*): what the quick start loads; defaults to [`saved_model_path`].

    Returns:
        `str` or `None`: the card's path, or `None` on other processes or when there is no card.
    """
    path = os.path.join(trainer.args.output_dir, "README.md")
    if not trainer.is_world_process_zero() or not os.path.isfile(path):
        return None
    code = quick_start_code(
        model_ref or saved_model_path(trainer),
        example_prompt,
        adapter=hasattr(trainer.accelerator.unwrap_model(trainer.model), "peft_config"),
        max_new_tokens=trainer.args.max_completion_length,
    )
    with open(path, encoding="utf-8") as f:
        card = _replace_quick_start(f.read(), code)
    with open_run_file(path) as f:
        f.write(card)
    return path


def add_stapo_section(trainer, base_model: str | None = None, eval_record: dict[str, Any] | None = None) -> str | None:
    """Add the STAPO section to the card TRL wrote in `trainer.args.output_dir/README.md` (main process only).

    The section ([`stapo_card_section`]) fills TRL's "## Training procedure", which TRL leaves empty but for tracker
    badges: the steps trained (`trainer.state.global_step`), the S2T mask over the run (pooled from
    `trainer.state.log_history`, the rows `metrics.jsonl` is written from), the held-out accuracy of `eval_record`,
    and the recipe's key values. Replaces an earlier section (idempotent). Where TRL had no Hub id it wrote "None": its broken
    `[None](https://huggingface.co/None)` base-model link becomes the base model's name, and the quick start's
    `model="None"` (no `hub_model_id` without `push_to_hub`) becomes where the model is saved ([`saved_model_path`]).
    TRL's placeholder `licence: license` front-matter line is dropped.

    Args:
        trainer ([`~stapo_trl.STAPOTrainer`] or [`~trl.GRPOTrainer`]): after `create_model_card`.
        base_model (`str`, *optional*): the base model's name; `None` reads it from the model's config
            (`builtin:` names are recovered from the built-in model's folder).
        eval_record (`dict`, *optional*): the run's `eval.json` content (accuracy before and after training);
            `None`: the card says the accuracy was not measured.

    Returns:
        `str` or `None`: the card's path, or `None` on other processes or when there is no card yet.
    """
    if not trainer.is_world_process_zero():
        return None
    path = os.path.join(trainer.args.output_dir, "README.md")
    if not os.path.isfile(path):
        return None
    if base_model is None:
        model = trainer.accelerator.unwrap_model(trainer.model)
        base_model = base_model_name(model.config._name_or_path)
    with open(path, encoding="utf-8") as f:
        card = f.read()
    if SECTION_START in card and SECTION_END in card:
        head, rest = card.split(SECTION_START, 1)
        card = head.rstrip("\n") + "\n" + rest.split(SECTION_END, 1)[1].lstrip("\n")
    card = card.replace("[None](https://huggingface.co/None)", _named(base_model))
    card = card.replace('model="None"', f"model={json.dumps(saved_model_path(trainer))}")  # a quoted Python string
    card = card.replace("licence: license\n", "")
    # TRL's tracker-badge lines are blank without a tracker: one empty line under the heading instead of four.
    card = re.sub(r"(## Training procedure\n)(?:[ \t]*\n)+", r"\1\n", card)

    section = stapo_card_section(
        trainer.args,
        base_model,
        s2t=getattr(trainer, "s2t", None),  # a STAPOTrainer's, whatever the class of its config
        global_step=trainer.state.global_step,
        log_rows=trainer.state.log_history,
        eval_record=eval_record,
    )
    # The section goes right before TRL's "### Framework versions" (after "Training procedure"), else at the end.
    anchor = "### Framework versions"
    if anchor in card:
        head, tail = card.split(anchor, 1)
        card = head.rstrip("\n") + "\n\n" + section + "\n" + anchor + tail
    else:
        card = card.rstrip("\n") + "\n\n" + section
    with open_run_file(path) as f:
        f.write(card)
    return path


def public_base_model_name(base_model: str) -> str:
    """How an uploaded card names the base model: a Hub id as is; a `builtin:` model or a local directory by what it
    is, never by its local name or path (neither means anything on the Hub).

    `public_base_model_name("Qwen/Qwen3-1.7B-Base") == "Qwen/Qwen3-1.7B-Base"`,
    `public_base_model_name("builtin:tiny-math") == "the tiny-math demo model built by stapo_trl"`,
    `public_base_model_name("/home/me/sft-model") == "a local model"`.
    """
    if base_model.startswith("builtin:"):
        name = base_model[len("builtin:") :]
        recipe = BUILTIN_MODELS.get(name, {})
        if "origin" in recipe:  # a real model, converted from a wheel's GGUF file (and maybe SFT-warmed)
            warmed = ", then SFT-warmed on two-digit addition" if recipe["kind"] == "gguf+sft" else ""
            return f"{recipe['origin']} (dequantized from a GGUF file{warmed} by stapo_trl: {name})"
        return f"the {name} demo model built by stapo_trl"
    if os.path.isabs(base_model) or os.path.exists(base_model):
        return LOCAL_MODEL
    return base_model


def public_dataset_name(dataset_name: str | None) -> str | None:
    """The dataset name an uploaded card may carry (its `datasets:` metadata links to the Hub): a Hub id as is,
    `None` for a `builtin:` dataset or a local file or folder."""
    if not dataset_name or dataset_name.startswith("builtin:") or os.path.exists(dataset_name):
        return None
    if os.path.isabs(dataset_name) or is_local_dataset_file(dataset_name):
        return None  # a local path that is not here (the card is written on another machine than the data?)
    return dataset_name


def make_card_public(trainer, base_model: str | None = None, eval_record: dict[str, Any] | None = None) -> str | None:
    """Rewrite the card in `trainer.args.output_dir/README.md` as it is uploaded: TRL's card plus the STAPO section
    ([`add_stapo_section`], also for a plain `GRPOTrainer`), with no local path and no `builtin:` name in it.

    The base model is named by [`public_base_model_name`] (TRL's broken `[None](https://huggingface.co/None)` link
    included), the quick start loads `hub_model_id`, and the output directory's path never appears.

    Args:
        trainer ([`~stapo_trl.STAPOTrainer`] or [`~trl.GRPOTrainer`]): after `create_model_card`.
        base_model, eval_record: as in [`add_stapo_section`].

    Returns:
        `str` or `None`: the card's path, or `None` on other processes or when there is no card yet.
    """
    path = add_stapo_section(trainer, base_model, eval_record)
    if path is None:
        return None
    if base_model is None:
        base_model = base_model_name(trainer.accelerator.unwrap_model(trainer.model).config._name_or_path)
    with open(path, encoding="utf-8") as f:
        card = f.read()
    public = public_base_model_name(base_model)
    card = card.replace(_named(base_model), public if public != base_model else _named(base_model))
    output_dir = trainer.args.output_dir
    target = trainer.args.hub_model_id or os.path.basename(os.path.normpath(output_dir))
    card = card.replace(f"model={json.dumps(output_dir)}", f"model={json.dumps(target)}")
    for local in {output_dir, os.path.abspath(output_dir)}:
        card = card.replace(local, target)
    with open_run_file(path) as f:
        f.write(card)
    return path
