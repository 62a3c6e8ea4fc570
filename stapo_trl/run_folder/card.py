"""The model card: TRL's, with a quick start in the run's prompt format and the S2T values, counts and accuracy."""

from __future__ import annotations

import json
import os
import re
import sys

from huggingface_hub import ModelCard
from trl.trainer.utils import generate_model_card

from .. import __version__
from ..models.names import BUILTIN_MODELS, INFO_FILE, read_builtin_info
from .logs import s2t_totals


LOCAL_MODEL = "a local model"
ROWS = (  # (field, meaning) of the settings table; the first three for a run with S2T values
    ("s2t_prob_threshold", "τ_p: positive-advantage tokens sampled with a probability below it are candidates"),
    ("s2t_entropy_quantile", "q: candidates below the q-quantile τ_h of their entropies are silenced"),
    ("s2t_mode", "which candidates are silenced (`low_entropy`: the paper's rule)"),
    ("loss_type", "loss normalisation (`dapo`: token mean over the update)"), ("epsilon", "lower clip ε_low"),
    ("epsilon_high", "upper clip ε_high"), ("beta", "KL coefficient"), ("learning_rate", "learning rate"),
    ("num_generations", "rollouts per prompt"), ("per_device_train_batch_size", "completions per micro-step, process"),
    ("gradient_accumulation_steps", "micro-steps per update"), ("steps_per_generation", "micro-steps per rollout"),
    ("temperature", "rollout temperature (τ_p, q tuned at 1.0)"), ("max_completion_length", "max response tokens"),
)  # fmt: skip


def base_model_name(path: str | None) -> str:
    """A Hub id as is, a built-in model's folder by its `builtin:` name, another local folder as "a local model"."""
    if path and os.path.isfile(os.path.join(str(path), INFO_FILE)):
        return read_builtin_info(path).get("name", LOCAL_MODEL)
    return LOCAL_MODEL if not path or os.path.isabs(path) or os.path.exists(path) else path


def public_base_model_name(base: str) -> str:
    """How an uploaded card names a base model: a Hub id as is, a `builtin:` one by its Hub origin or as a demo."""
    name = base.removeprefix("builtin:")
    if name == base or "origin" not in (recipe := BUILTIN_MODELS.get(name, {})):
        return base if name == base else f"the {name} demo model built by stapo_trl"
    warmed = ", then SFT-warmed on two-digit addition" if recipe["kind"] == "gguf+sft" else ""
    return f"{recipe['origin']} (dequantized from a GGUF file{warmed} by stapo_trl: {name})"


def public_dataset_name(name: str | None) -> str | None:
    """A Hub dataset id as is; `None` for a `builtin:` dataset or a local file or folder."""
    local = name and (name.startswith("builtin:") or os.path.exists(name) or os.path.isabs(name))
    return None if not name or local or name.lower().endswith((".json", ".jsonl", ".csv", ".parquet")) else name


def _summary(trainer, s2t, eval_record) -> list[str]:
    t = s2t and s2t_totals(trainer.state.log_history)
    lines = [f"- **Steps trained**: {trainer.state.global_step} optimizer steps.", "- **S2T mask**" + (
        ": none (plain GRPO: `trl.GRPOTrainer`)." if s2t is None else
        f" (`s2t_mode: {s2t.mode}`): no S2T counts logged yet." if t is None else
        f": off (`s2t_mode: off`): no token was silenced; {t['num_candidates']:,} of {t['num_loss_tokens']:,} loss "
        "tokens were candidates (A > 0, p < τ_p), counted only." if s2t.mode == "off" else
        f" (`s2t_mode: {s2t.mode}`): {t['num_silenced']:,} of {t['num_loss_tokens']:,} loss tokens silenced over the "
        f"run, a silenced ratio of {t['silenced_ratio']:.3g} (pooled: Σ silenced / Σ loss tokens over "
        f"{t['num_rows']} logged rows); candidates (A > 0, p < τ_p): {t['num_candidates']:,}.")]  # fmt: skip
    if not (r := eval_record):
        return [*lines, "- **Held-out accuracy**: not measured (`stapo-train` measures it before and after training "
                "with `eval_before_after`)."]  # fmt: skip
    kind = "Accuracy on training prompts (not held out)" if "not held out" in r["split"] else "Held-out accuracy"
    return [*lines, f"- **{kind}** ({r['metric']} over {r['num_problems']} problems of the `{r['split']}` split, T = "
            f"{r['temperature']}, top-p {r['top_p']}): {100 * r['accuracy_before']:.1f} % before training, "
            f"{100 * r['accuracy_after']:.1f} % after."]  # fmt: skip


def model_card(trainer, model_name=None, dataset_name=None, tags=None, eval_record=None, public=False) -> ModelCard:
    """TRL's `ModelCard` of `trainer`'s run with a quick start asking a training prompt and the S2T section; `tags` add
    to `_tag_names`, `eval_record` is `eval.json`, `public`: as uploaded (no local path)."""
    args, s2t, step = trainer.args, getattr(trainer, "s2t", None), trainer.state.global_step
    out, model = args.output_dir, trainer.accelerator.unwrap_model(trainer.model)
    model_name = model_name or os.path.basename(os.path.normpath(out))
    base = base_model_name(getattr(model.config, "_name_or_path", None))
    named = public_base_model_name(base) if public else base if base == LOCAL_MODEL else f"`{base}`"
    stapo = "[STAPO](https://huggingface.co/papers/2602.15620)"
    method = f"Base model: {named}, trained with " + (
        f"the GRPO objective below and no S2T mask (the baseline of {stapo})." if s2t is None else
        f"`stapo_trl.STAPOTrainer` with the S2T mask off (`s2t_mode: off`): the like-for-like baseline of {stapo}."
        if s2t.mode == "off" else f'{stapo} (Liu et al., 2026, "STAPO: Stabilizing Reinforcement Learning for LLMs by '
        'Silencing Rare Spurious Tokens", arXiv:2602.15620): positive-advantage tokens sampled with a low probability '
        "at low-entropy positions are removed from the numerator and the denominator of the loss.")  # fmt: skip
    if base.startswith("builtin:") and (license_text := BUILTIN_MODELS.get(base[8:], {}).get("license")):
        method += f" The base model's license applies to this model too: {license_text}."
    try:
        prompt = trainer.train_dataset[0]["prompt"]
    except (KeyError, IndexError, TypeError, NotImplementedError):  # no prompt column, or an iterable dataset
        prompt = None
    saved = any(os.path.isfile(os.path.join(out, n)) for n in ("config.json", "adapter_config.json"))
    local = out if saved or step == 0 or args.save_strategy == "no" else f"{out}/checkpoint-{step}"
    reference = (args.hub_model_id or trainer.hub_model_id or model_name) if public else os.path.abspath(local)
    card = generate_model_card(
        base_model=None if base == LOCAL_MODEL or base.startswith("builtin:") else base, model_name=model_name,
        hub_model_id=reference, dataset_name=public_dataset_name(dataset_name), trainer_name=trainer._name,
        tags=sorted({*trainer._tag_names, *(tags or [])}), trainer_citation=trainer._paper.get("citation"),
        wandb_url=getattr(getattr(sys.modules.get("wandb"), "run", None), "url", None), trackio_url=None,
        paper_title=trainer._paper.get("title"), paper_id=trainer._paper.get("id"))  # fmt: skip
    vars(card.data).pop("licence", None)
    value = lambda n: getattr(s2t, n[4:]) if n.startswith("s2t_") else getattr(args, n, None)  # noqa: E731
    section = ["### STAPO run: settings and results\n", method, "", *_summary(trainer, s2t, eval_record), "",
        "| setting | meaning | value |", "|---|---|---|",
        *(f"| `{n}` | {what} | `{getattr(value(n), 'value', value(n))}` |" for n, what in ROWS[0 if s2t else 3 :]),
        "", ""]  # fmt: skip
    prompt = prompt if isinstance(prompt, (str, list)) else "What is 47+38?"
    ref, peft = json.dumps(reference), hasattr(model, "peft_config")
    load = ["from peft import AutoPeftModelForCausalLM", "from transformers import AutoTokenizer, pipeline", "",
            f"model = AutoPeftModelForCausalLM.from_pretrained({ref}).merge_and_unload()"] if peft else [
            "from transformers import pipeline", ""]  # fmt: skip
    model_arg = f"model=model, tokenizer=AutoTokenizer.from_pretrained({ref})" if peft else f"model={ref}"
    code = "\n".join([*load, f'generator = pipeline("text-generation", {model_arg})',
        f"prompt = {json.dumps(prompt, ensure_ascii=False)}  # a training prompt, in the run's format",
        f'output = generator(prompt, max_new_tokens={args.max_completion_length}, return_full_text=False)[0]',
        'print(output["generated_text"])'])  # fmt: skip
    end = "\n".join(section) + f"### Framework versions\n\n- stapo_trl: {__version__}"
    text = card.text.replace("[None](https://huggingface.co/None)", named).replace("### Framework versions\n", end, 1)
    text = re.sub(r"(## Quick start\s*```python\n).*?```", lambda m: f"{m[1]}{code}\n```", text, count=1, flags=re.S)
    card.text = re.sub(r"\n(?:[ \t]*\n){2,}", "\n\n", text)  # the blank lines of TRL's unused badges
    return card
