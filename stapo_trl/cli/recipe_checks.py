"""The sections of a recipe's dry run ([`stapo_trl.cli.dry_run.validate_recipe`]): small named checks, each adding
its summary rows, errors and warnings to one [`Findings`].

Nine sections, in the order of the printed plan: trainer, model, data, rewards, batch geometry (with its summary
rows), optimisation, generation, output (trackers, checkpoints, hardware), and what the launch's parameter sharding
(ZeRO-3, FSDP) cannot run. Nothing is downloaded: a Hub dataset or model is named, not fetched; a local dataset
file is opened.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path

from trl import GRPOConfig

from ..checks.dataset import CLI_CHAT_TEMPLATE_FIX, chat_template_message, has_chat_template
from ..config import STAPOConfig
from ..core.stapo_config import s2t_settings
from ..data import (
    BUILTIN_DATASETS,
    check_prompt_columns,
    evaluation_split,
    filter_long_prompts,
    is_local_dataset_file,
    load_local_dataset_file,
    load_prompt_dataset,
)
from ..data import BUILTIN_PREFIX as DATA_PREFIX
from ..models import BUILTIN_PREFIX as MODEL_PREFIX
from ..models import builtin_model_dir, check_model_name_or_path
from ..preflight import check_hub_access, model_max_positions, prompt_token_budget
from ..rewards import REWARDS, get_reward_funcs
from .args import prompt_dataset_kwargs
from .checkpoints import check_resume_from_checkpoint
from .geometry import BatchGeometry, too_few_prompts
from .script_args import TRAINERS


# Trackers `report_to` may name, with the module that must be importable for them.
TRACKER_MODULES = {
    "wandb": "wandb",
    "tensorboard": "tensorboard",
    "trackio": "trackio",
    "comet_ml": "comet_ml",
    "mlflow": "mlflow",
    "clearml": "clearml",
    "dvclive": "dvclive",
    "swanlab": "swanlab",
}


def fmt_int(n: float) -> str:
    """`n` with thousands separators, without decimals when it is whole (`2,048`, `0.25`)."""
    return f"{int(n):,}" if float(n).is_integer() else f"{n:,.2f}"


@dataclass
class Findings:
    """What the `check_*` sections add up: summary rows, errors and warnings (the parts of a
    [`~stapo_trl.cli.dry_run.DryRunReport`])."""

    lines: list[tuple[str, str]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def check_trainer(f: Findings, script_args, training_args) -> bool:
    """The trainer and its config class, and the objective."""
    trainer = script_args.trainer
    if trainer not in TRAINERS:
        f.errors.append(f"trainer={trainer!r} is not one of {list(TRAINERS)}.")
    is_stapo = isinstance(training_args, STAPOConfig)
    if trainer == "stapo" and not is_stapo:
        f.errors.append(f"trainer='stapo' needs a STAPOConfig, got {type(training_args).__name__}.")
    if trainer == "grpo" and (is_stapo or not isinstance(training_args, GRPOConfig)):
        f.errors.append(f"trainer='grpo' needs a plain GRPOConfig, got {type(training_args).__name__}.")
    if is_stapo:
        s2t = s2t_settings(training_args, STAPOConfig._s2t_modes)
        f.lines.append(
            (
                "trainer",
                (
                    f"stapo: STAPOTrainer, S2T mask tau_p={s2t.prob_threshold}, q={s2t.entropy_quantile}, "
                    f"mode={s2t.mode}, tau_h per optimizer update"
                ),
            )
        )
    else:
        entropy_mask = training_args.top_entropy_quantile
        extra = f", top_entropy_quantile={entropy_mask}" if entropy_mask < 1.0 else ""
        f.lines.append(("trainer", f"{trainer}: GRPOTrainer, no S2T mask{extra}"))
    f.lines.append(
        (
            "objective",
            (
                f"loss_type={training_args.loss_type}, epsilon={training_args.epsilon}/"
                f"{training_args.epsilon_high if training_args.epsilon_high is not None else training_args.epsilon}, "
                f"beta={training_args.beta}, entropy_coef={training_args.entropy_coef}, "
                f"scale_rewards={training_args.scale_rewards}"
            ),
        )
    )
    return is_stapo


def check_model(f: Findings, model_args) -> None:
    """The model name (checked, never fetched) and PEFT."""
    model_name = model_args.model_name_or_path
    if not model_name:
        f.errors.append("model_name_or_path is not set: give a Hub id, a local model directory or builtin:tiny-math.")
    else:
        try:
            check_model_name_or_path(model_name)
        except (ValueError, OSError) as err:
            f.errors.append(f"model_name_or_path: {err}")
    peft = (
        f"LoRA r={model_args.lora_r}, alpha={model_args.lora_alpha}, targets={model_args.lora_target_modules}"
        if model_args.use_peft
        else "off"
    )
    f.lines.append(("model", f"{model_name} (dtype {model_args.dtype}, PEFT {peft})"))


def check_data(f: Findings, script_args, max_prompt_tokens: int | None) -> int | None:
    """The dataset (a local file is opened and its columns checked; a Hub id is named), the instruction.

    Returns the number of training prompts before the prompt-length filter (`max_train_samples` applied) when it is
    known here (a built-in or local dataset), else `None`.
    """
    dataset = script_args.dataset_name
    num_rows = None
    if not dataset:
        f.errors.append(
            "dataset_name is not set: give builtin:tiny-math, a local .json/.jsonl/.parquet file or a Hub id."
        )
        data_line = "(none)"
    elif dataset.startswith(DATA_PREFIX):
        if dataset[len(DATA_PREFIX) :] not in BUILTIN_DATASETS:
            known = ", ".join(DATA_PREFIX + name for name in BUILTIN_DATASETS)
            f.errors.append(f"dataset_name={dataset!r} is not a built-in dataset; known: {known}.")
        else:
            splits = BUILTIN_DATASETS[dataset[len(DATA_PREFIX) :]]()
            if script_args.dataset_train_split in splits:
                num_rows = len(splits[script_args.dataset_train_split])
        data_line = f"{dataset} (built in: its own prompt/solution columns)"
    else:
        for column in ("prompt_column", "solution_column"):
            if not getattr(script_args, column):
                f.errors.append(f"{column} is empty: name the dataset column that holds the {column.split('_')[0]}.")
        opened = "named, not opened (a Hub dataset)"
        if is_local_dataset_file(dataset):
            _, warning = evaluation_split(dataset, script_args.dataset_test_split)
            if script_args.eval_before_after and warning is not None:
                f.warnings.append(warning)
            # A local file is cheap to open: check its columns as stapo-train will.
            try:
                local = load_local_dataset_file(dataset)
                columns = (script_args.prompt_column, script_args.solution_column)
                f.warnings += check_prompt_columns(local, dataset, *columns)  # rows trained on as they are: warned
                opened = f"checked: {len(local)} rows"
                num_rows = len(local)
            except FileNotFoundError:
                f.errors.append(f"dataset_name={dataset!r} looks like a local file but does not exist.")
                opened = "missing"
            except ValueError as e:  # a missing column, or an empty file
                f.errors.append(f"dataset_name={dataset!r}: {e}")
                opened = "failed"
            except Exception as e:  # noqa: BLE001 (an unreadable file: datasets raises many types)
                f.errors.append(f"dataset_name={dataset!r} could not be read: {type(e).__name__}: {e}")
                opened = "unreadable"
        config = f" [{script_args.dataset_config}]" if script_args.dataset_config else ""
        data_line = (
            f"{dataset}{config} split {script_args.dataset_train_split}, columns "
            f"{script_args.prompt_column!r} -> {script_args.solution_column!r} ({opened})"
        )
    if getattr(script_args, "strip_dapo_instruction", False):
        data_line += "; DAPO 'Answer:' instruction stripped"
    data_line += f"; prompts > {max_prompt_tokens} tokens dropped" if max_prompt_tokens else "; no max_prompt_tokens"
    f.lines.append(("data", data_line))
    if script_args.instruction is None:
        instruction = "(default) the paper's step-by-step / \\boxed{} suffix"
    elif script_args.instruction == "":
        instruction = "(none)"
    else:
        instruction = f'"{script_args.instruction}"'
    f.lines.append(("instruction", instruction))
    if script_args.dataset_streaming:
        f.errors.append("dataset_streaming=True is not supported by stapo-train: set it to false.")
    max_train_samples = getattr(script_args, "max_train_samples", None)
    if num_rows is not None and max_train_samples is not None:
        num_rows = min(num_rows, max_train_samples)
    return num_rows


def check_prompt_count(f: Findings, script_args, num_rows: int | None, geometry: BatchGeometry) -> None:
    """Enough training prompts for one rollout step (as `stapo-train` checks after loading; the prompt-length filter,
    which needs the tokenizer, is not applied here)."""
    if num_rows is None or not geometry.holds_whole_groups:
        return
    where = (
        "in the train split" if getattr(script_args, "max_train_samples", None) is None else "with max_train_samples"
    )
    error = too_few_prompts(num_rows, geometry.generation_batch // geometry.num_generations, where)
    if error is not None:
        f.errors.append(error)


def check_rewards(f: Findings, script_args, training_args) -> None:
    """The reward names and weights."""
    try:
        get_reward_funcs(script_args.reward_funcs)
    except ValueError as e:
        f.errors.append(f"reward_funcs={script_args.reward_funcs!r}: {e} (registry: {sorted(REWARDS)})")
    weights = f", weights {training_args.reward_weights}" if training_args.reward_weights else ""
    f.lines.append(("rewards", f"{', '.join(script_args.reward_funcs)}{weights}"))


def check_optimisation(f: Findings, training_args) -> None:
    """The optimizer, schedule, horizon and precision."""
    horizon = (
        f"max_steps {training_args.max_steps}"
        if training_args.max_steps > 0
        else f"num_train_epochs {training_args.num_train_epochs}"
    )
    f.lines.append(
        (
            "optimizer",
            (
                f"{training_args.optim.value} lr {training_args.learning_rate:g} "
                f"{training_args.lr_scheduler_type.value} (warmup_steps "
                f"{training_args.warmup_steps}), weight_decay {training_args.weight_decay}, max_grad_norm "
                f"{training_args.max_grad_norm}, {horizon}"
            ),
        )
    )
    f.lines.append(
        (
            "precision",
            # transformers < 5.24 (the vLLM CPU environment's 5.19) has only the old name
            f"bf16={training_args.bf16}, activation_checkpointing="
            f"{getattr(training_args, 'activation_checkpointing', training_args.gradient_checkpointing)}",
        )
    )


def check_output(f: Findings, script_args, training_args, cpu_forced: bool, geometry: BatchGeometry) -> None:
    """Trackers, checkpoints, precision on CPU, and the paper's geometry on the paper's data."""
    trackers = [t for t in (training_args.report_to or []) if t not in ("none", "all")]
    missing = [t for t in trackers if t in TRACKER_MODULES and importlib.util.find_spec(TRACKER_MODULES[t]) is None]
    if missing:
        f.warnings.append(f"report_to names {missing}, not installed here: install it where the job runs.")
    save = (
        f"every {training_args.save_steps} optimizer steps (keep {training_args.save_total_limit or 'all'})"
        if training_args.save_strategy == "steps"
        else training_args.save_strategy.value
    )
    f.lines.append(
        (
            "output",
            (
                f"{training_args.output_dir}; checkpoints {save}; report_to {training_args.report_to}; "
                f"push_to_hub={training_args.push_to_hub}"
            ),
        )
    )
    try:
        check_resume_from_checkpoint(training_args)
    except ValueError as e:
        f.errors.append(str(e))
    if training_args.push_to_hub:  # offline mode or no token (no request is made here)
        try:
            check_hub_access(
                training_args.hub_model_id, training_args.output_dir, training_args.hub_token, network=False
            )
        except ConnectionError as e:
            f.errors.append(str(e))
    if training_args.use_cpu and training_args.bf16 and not cpu_forced:
        f.warnings.append("bf16=True on CPU is about 2.3x slower than float32: set bf16: false for CPU runs.")
    if "dapo-math" in str(script_args.dataset_name).lower() and not geometry.is_paper_geometry():
        f.warnings.append(
            f"the paper's data (DAPO-Math) with another batch geometry: {geometry.prompts_per_rollout_step:g} prompts "
            f"x {geometry.num_generations} rollouts per rollout step and {geometry.prompts_per_optimizer_step:g}-prompt "
            f"updates for {geometry.num_processes} process(es), vs the paper's 256 x 8 and 64. recipes/README.md gives "
            "per_device_train_batch_size / gradient_accumulation_steps / steps_per_generation that keep the paper's "
            "for 4, 8, 16 and 32 processes."
        )


def check_prompt_lengths(f: Findings, script_args, training_args, model_args, num_train_prompts: int | None) -> None:
    """How many training prompts the prompt-length rule will drop, when the data and the model's tokenizer are here.

    The rule is `stapo-train`'s ([`stapo_trl.preflight`]): a prompt longer than `max_prompt_tokens` or than the
    model's positions minus `max_completion_length` is dropped. Counted only for a built-in or local dataset and a
    local (or already built `builtin:`) model; otherwise the row says why it was not counted.
    """
    if num_train_prompts is None:
        return  # a Hub dataset, or one that could not be opened: nothing to count here
    path = _local_model_path(model_args)
    if path is None:
        f.lines.append(
            ("prompt length", "not counted: the model is not here (a Hub id, or a builtin: model not built)")
        )
        return
    from transformers import AutoConfig, AutoTokenizer  # heavy: only when there is something to count

    budget = prompt_token_budget(
        model_max_positions(AutoConfig.from_pretrained(path)),
        training_args.max_completion_length,
        getattr(script_args, "max_prompt_tokens", None),
    )
    if budget is None:
        f.lines.append(("prompt length", "unbounded (no max_prompt_tokens, no position limit)"))
        return
    dataset = load_prompt_dataset(
        script_args.dataset_name,
        split=script_args.dataset_train_split,
        limit=script_args.max_train_samples,
        **prompt_dataset_kwargs(script_args),
    )
    kept = filter_long_prompts(
        dataset, AutoTokenizer.from_pretrained(path), budget, training_args.chat_template_kwargs
    )
    dropped = len(dataset) - len(kept)
    f.lines.append(
        ("prompt length", f"{dropped} of {len(dataset)} training prompts exceed {budget} tokens and will be dropped")
    )
    if dropped and dropped == len(dataset):
        f.errors.append(
            f"every training prompt exceeds {budget} tokens (max_prompt_tokens, or the model's positions minus "
            f"max_completion_length={training_args.max_completion_length}): nothing would be left to train on."
        )


def _local_model_path(model_args) -> Path | None:
    """The model's folder when it is here (a local folder, or a `builtin:` model already built), else `None`."""
    name = str(model_args.model_name_or_path or "")
    path = builtin_model_dir(name[len(MODEL_PREFIX) :]) if name.startswith(MODEL_PREFIX) else Path(name)
    return path if (path / "config.json").is_file() else None


def check_chat_template_of_model(f: Findings, model_args) -> bool:
    """`stapo-train`'s prompts are chat messages: refuse a model whose tokenizer has no chat template, as
    `stapo-train` itself does ([`~stapo_trl.checks.dataset.check_chat_template`]), when the model is here.

    Returns:
        `bool`: False when the model was refused (its prompts cannot be formatted, so not counted), else True (a Hub id
        or a `builtin:` name not built yet is not checked).
    """
    path = _local_model_path(model_args)
    if path is None:
        return True  # a Hub id (not downloaded by a dry run) or a builtin: model not built yet (all have a template)
    from transformers import AutoTokenizer  # heavy: only for a model that is here

    if not has_chat_template(AutoTokenizer.from_pretrained(path)):
        f.errors.append(
            chat_template_message(
                str(model_args.model_name_or_path), "stapo-train's prompts are", CLI_CHAT_TEMPLATE_FIX
            )
        )
        return False
    return True
