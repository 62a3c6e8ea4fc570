"""What a run optimizes, recorded as plain JSON in each of its checkpoints (`stapo_run.json`), and the refusal of a
resume that would change it.

A checkpoint is resumed by rerunning a command or a script, often with edits in between. Resuming with another
objective, optimizer, model, reward or dataset mixes two runs in one model whose card states one of them, or fails
deep inside transformers (another optimizer's state). The record is data the run writes itself: nothing in a checkpoint
is unpickled to compare settings (a checkpoint from elsewhere is untrusted input).

The record also tells whether the checkpoint's save finished: it is written first with `"files": null`, then again,
after transformers wrote trainer_state.json, with the names of the files the save wrote
([`~stapo_trl.runfiles.checkpoints.checkpoint_problem`] requires each).
"""

from __future__ import annotations

import enum
import json
import logging
import os
from typing import Any

from .run_folder import open_run_file


logger = logging.getLogger(__name__)

RUN_RECORD = "stapo_run.json"
FORMAT = 1

# The config fields a resume must keep (GRPOConfig and TrainingArguments names; a field an installed version lacks is
# left out). Not here, so free to change: threads, logging, saving, evaluation, max_steps, and the batch layout
# (per_device_train_batch_size, gradient_accumulation_steps, steps_per_generation, generation_batch_size), which
# another number of processes changes.
OBJECTIVE_FIELDS = (
    "loss_type",
    "epsilon",
    "epsilon_high",
    "delta",
    "beta",
    "scale_rewards",
    "reward_weights",
    "importance_sampling_level",
    "top_entropy_quantile",
    "mask_truncated_completions",
    "num_generations",
    "num_iterations",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "max_completion_length",
)
OPTIMIZER_FIELDS = (
    "learning_rate",
    "lr_scheduler_type",
    "lr_scheduler_kwargs",
    "warmup_steps",
    "warmup_ratio",
    "optim",
    "optim_args",
    "optim_target_modules",
    "weight_decay",
    "adam_beta1",
    "adam_beta2",
    "adam_epsilon",
    "max_grad_norm",
)


def plain(value: Any) -> Any:
    """`value` as JSON data that compares equal across processes: enums by value, tuples and sets as lists (sets
    sorted), dataclasses and configs with `to_dict` as dicts; any other object by its type's name (never its `repr`,
    which may hold an address)."""
    value = value.value if isinstance(value, enum.Enum) else value
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        return sorted(plain(v) for v in value)
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if hasattr(value, "to_dict"):
        return plain(value.to_dict())
    return type(value).__name__


def _local(path: Any) -> Any:
    """An existing local path made absolute (the same folder named from elsewhere is the same model); else unchanged."""
    return os.path.abspath(path) if isinstance(path, str) and os.path.exists(path) else path


def reward_names(reward_funcs: Any) -> list[str]:
    """How the record names each reward: a function by its name (as TRL logs it), a reward model by its model id."""
    from trl.trainer.utils import get_callable_name

    funcs = reward_funcs if isinstance(reward_funcs, list) else [reward_funcs] if reward_funcs is not None else []
    names = []
    for func in funcs:
        config = getattr(func, "config", None)
        names.append(
            _local(func)
            if isinstance(func, str)
            else getattr(config, "_name_or_path", None) or get_callable_name(func)
        )
    return names


def dataset_fingerprint(dataset: Any) -> str | None:
    """`datasets`' fingerprint of a `datasets.Dataset` (from its content in memory, from its Hub revision or files'
    modification times when loaded, and from the code of each `map`/`filter` applied); `None` for another dataset."""
    return getattr(dataset, "_fingerprint", None) if type(dataset).__name__ == "Dataset" else None


def run_settings(
    args: Any,
    *,
    trainer: str,
    model: Any,
    reward_funcs: Any,
    s2t: Any = None,
    peft_config: Any = None,
    train_dataset: Any = None,
) -> dict[str, Any]:
    """The settings a resume must keep, as plain data: the trainer class, the model, the reward functions, the S2T
    values (STAPO), the objective and optimizer fields of `args` ([`OBJECTIVE_FIELDS`], [`OPTIMIZER_FIELDS`]), the
    PEFT settings and the training data's fingerprint ([`dataset_fingerprint`]).

    Args:
        args ([`~trl.GRPOConfig`]): the run's config.
        trainer (`str`): the trainer's class name.
        model (`str` or model): what the trainer was given (a model's `config._name_or_path` for an object).
        reward_funcs: the reward functions, names or reward models ([`reward_names`]).
        s2t ([`~stapo_trl.core.s2t.S2TSettings`], *optional*): the S2T values in effect (`None`: no mask).
        peft_config (`peft.PeftConfig`, *optional*): the adapter's settings.
        train_dataset (*optional*): the training data.

    Returns:
        `dict[str, Any]`: field -> JSON value.
    """
    if not isinstance(model, str):
        model = getattr(getattr(model, "config", None), "_name_or_path", None)
    settings: dict[str, Any] = {"trainer": trainer, "model": _local(model), "reward_funcs": reward_names(reward_funcs)}
    if s2t is not None:
        settings |= {f"s2t_{name}": getattr(s2t, name) for name in ("prob_threshold", "entropy_quantile", "mode")}
    for name in OBJECTIVE_FIELDS + OPTIMIZER_FIELDS:
        if hasattr(args, name):
            settings[name] = getattr(args, name)
    settings["peft"] = peft_config
    settings["train_dataset"] = dataset_fingerprint(train_dataset)
    return plain(settings)


def write_run_record(checkpoint: str, settings: dict[str, Any], *, save_only_model: bool, files: list[str] | None):
    """Write `checkpoint/stapo_run.json` (creating the folder): `files` `None` while the save runs, then the names of the
    files it wrote. Through a temporary file and a rename, never through a symbolic link."""
    os.makedirs(checkpoint, exist_ok=True)
    record = {"format": FORMAT, "files": files, "save_only_model": save_only_model, "settings": settings}
    path = os.path.join(checkpoint, RUN_RECORD)
    with open_run_file(path + ".tmp", "w") as f:
        json.dump(record, f, indent=2)
    os.replace(path + ".tmp", path)


def read_run_record(checkpoint: str) -> dict[str, Any] | None:
    """The record of `checkpoint`, or `None` when it has none (saved before stapo_trl wrote one).

    Raises:
        ValueError: the file is not a JSON object with `settings` (cut short, edited).
    """
    path = os.path.join(checkpoint, RUN_RECORD)
    if not os.path.lexists(path):
        return None
    with open(path, encoding="utf-8") as f:
        record = json.load(f)
    if not isinstance(record, dict) or not isinstance(record.get("settings"), dict):
        raise ValueError(f"{RUN_RECORD} holds no settings")
    return record


def changed_settings(recorded: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """`"name old -> new"` for each field both hold with other values (a field one of them lacks was added or dropped
    by another stapo_trl version: not compared); a dict's changed keys one by one (`peft.r 8 -> 16`)."""
    changes = []
    for name in [key for key in current if key in recorded]:
        old, new = recorded[name], current[name]
        if isinstance(old, dict) and isinstance(new, dict):
            changes += [f"{name}.{change}" for change in changed_settings(old, new)]
        elif old != new:
            changes.append(f"{name} {_short(old)} -> {_short(new)}")
    return changes


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def check_run_settings(checkpoint: str, settings: dict[str, Any]) -> None:
    """Refuse to resume `checkpoint` with other `settings` than it was trained with; a checkpoint without a record
    (saved before stapo_trl wrote one) is resumed with one warning.

    Raises:
        ValueError: one line naming each changed field with its old and new value.
    """
    record = read_run_record(checkpoint)
    if record is None:
        logger.warning(
            f"{checkpoint} has no {RUN_RECORD} (saved before stapo_trl recorded a run's settings): resumed without "
            "comparing the settings it was trained with to this run's."
        )
        return
    changes = changed_settings(record["settings"], settings)
    if changes:
        raise ValueError(
            f"{checkpoint} was trained with other settings ({', '.join(changes)}): resuming would mix two runs in one "
            "model, and its card could state only one. Resume with the checkpoint's values, or train in another "
            f"output_dir (model_name_or_path / model {checkpoint} starts from its weights)."
        )
