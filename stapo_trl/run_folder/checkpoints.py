"""Whole checkpoints and the run record (`stapo_run.json`: what the run optimizes and the files its save wrote).
Nothing here unpickles a file but with `torch.load(weights_only=True)`: a checkpoint from elsewhere is untrusted."""

from __future__ import annotations

import enum
import json
import logging
import os
import re
import zipfile
from typing import Any

from . import folder
from .folder import (  # noqa: F401 (re-exported)
    LinkError,
    check_output_dir,
    command_line,
    hold_run_folder,
    open_run_file,
    refuse_links,
)


logger = logging.getLogger(__name__)
CHECKPOINT_FOLDER, RUN_RECORD = folder.CHECKPOINT_FOLDER, folder.RUN_RECORD

ROLLOUT_MANIFEST = re.compile(r"^rollout_state_\d+\.json$")  # stapo_trl.run_folder.rollout's, beside its .safetensors
RESUME_FIX = "Give a complete checkpoint folder (<output_dir>/checkpoint-<step>), or let a run take its newest one."
# What `Trainer._save_checkpoint` writes before trainer_state.json, by name prefix (full, adapter, DeepSpeed layouts).
_REQUIRED = {
    "model weights": ("model", "pytorch_model", "adapter_model", "global_step"),
    "optimizer state (optimizer.pt)": ("optimizer", "global_step"),
    "RNG state (rng_state.pth)": ("rng_state",),
}
_UNPICKLED_ON_RESUME = ("optimizer", "scheduler", "scaler", "rng_state", "pytorch_model")  # by transformers
# The config fields a resume must keep (free: threads, logging, saving, evaluation, max_steps, the batch layout).
RESUME_FIELDS = (
    "loss_type", "epsilon", "epsilon_high", "delta", "beta", "scale_rewards", "reward_weights",
    "importance_sampling_level", "top_entropy_quantile", "mask_truncated_completions", "num_generations",
    "num_iterations", "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_completion_length",
    "learning_rate", "lr_scheduler_type", "lr_scheduler_kwargs", "warmup_steps", "optim", "optim_args",
    "optim_target_modules", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon", "max_grad_norm",
)  # fmt: skip
RECORD_FIELDS = {1: ("trainer", "model", "reward_funcs", *RESUME_FIELDS)}  # a record without them is damaged


def _torch_file_problem(path: str, load: bool) -> str | None:  # its zip directory, then (`load`) a safe load
    size = os.path.getsize(path)
    try:
        with zipfile.ZipFile(path) as archive:
            if any(info.header_offset + info.compress_size > size for info in archive.infolist()):
                return "cut short: its zip directory points past its end"
    except (zipfile.BadZipFile, OSError, ValueError):
        return "damaged: no zip directory (cut short, or overwritten)"
    if not load:
        return None
    import torch
    from transformers.trainer_pt_utils import safe_globals

    try:
        with safe_globals():  # numpy's RNG state, as transformers loads it
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:  # noqa: BLE001 (UnpicklingError, RuntimeError: what transformers would raise)
        paragraphs = [p.strip() for p in str(e).split("\n\n") if p.strip()]
        detail = next((p for p in paragraphs[1:] if not p.startswith("Check the documentation")), None)
        detail = (detail or (paragraphs or [type(e).__name__])[0]).splitlines()[0][:160].rstrip(".")
        return f"refused by a safe load: {detail}"
    rng = isinstance(state, dict) and {"python", "numpy", "cpu"} <= set(state)
    return "holds no RNG state" if os.path.basename(path).startswith("rng_state") and not rng else None


def tensor_specs(path: str) -> dict:
    """`{name: {"dtype": "F32", "shape": [16, 48]}}` of the safetensors file `path`; safetensors' `SafetensorError`
    for a header that does not parse or a file longer or shorter than its header says."""
    from safetensors import safe_open

    with safe_open(path, framework="pt") as f:
        slices = {name: f.get_slice(name) for name in f.keys()}
        return {name: {"dtype": s.get_dtype(), "shape": s.get_shape()} for name, s in slices.items()}


def file_problem(path: str) -> str | None:
    """Why the checkpoint file `path` cannot be loaded whole, in a few words, or `None`."""
    name, tensors = os.path.basename(path), re.sub(r"\.json$", ".safetensors", path)
    if not os.path.isfile(path):
        return "not a file"
    if name.endswith((".pt", ".pth", ".bin")):
        return _torch_file_problem(path, load=name.startswith(_UNPICKLED_ON_RESUME))
    try:
        if name.endswith(".safetensors"):
            tensor_specs(path)
        elif name.endswith(".json"):
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
            specs = tensor_specs(tensors) if ROLLOUT_MANIFEST.match(name) and os.path.isfile(tensors) else None
            if ROLLOUT_MANIFEST.match(name) and (not isinstance(data, dict) or data.get("tensors") != specs):
                return f"does not match {os.path.basename(tensors)} (its tensors' names, dtypes or shapes)"
    except (ValueError, RecursionError) as e:  # RecursionError: nested too deep
        return f"unreadable: {type(e).__name__}"
    except Exception as e:  # noqa: BLE001 (safetensors' SafetensorError; a manifest's: named as its tensors file's)
        return "damaged: " + str(e).removeprefix("Error while deserializing header: ") if path == tensors else None
    return None


def checkpoint_problem(path: str, save_only_model: bool = False) -> str | None:
    """Why the folder `path` is not a complete checkpoint, in a few words naming the file, or `None`: its
    `trainer_state.json` (written last) parses, its run record says the save finished, and every file the record names
    (without one: the weights and, unless `save_only_model`, the optimizer, scheduler and RNG state) is whole."""
    names = sorted(os.listdir(path)) if os.path.isdir(path) else None
    if not names:
        return "not a folder" if names is None else "empty"
    try:
        with open(os.path.join(path, "trainer_state.json"), encoding="utf-8") as f:
            step = json.load(f)["global_step"]
    except FileNotFoundError:
        return "no trainer_state.json: its save did not finish"
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as e:  # cut short: JSONDecodeError
        return f"trainer_state.json unreadable ({type(e).__name__}): its save did not finish"
    number = CHECKPOINT_FOLDER.match(os.path.basename(os.path.normpath(path)))
    if type(step) is not int or step < 0 or (number and step != int(number[1])):
        expected = f"its step {number[1]}" if number else "a step"
        return f"trainer_state.json has global_step {repr(step)[:40]}, not {expected}"
    try:
        record = read_run_record(path)
    except OSError as e:
        return f"{RUN_RECORD} unreadable: {type(e).__name__}"
    except ValueError as e:
        return str(e)
    if record is not None:
        if record.get("files") is None:
            return f"{RUN_RECORD} says its save did not finish"
        save_only_model = bool(record.get("save_only_model", save_only_model))
    for what, prefixes in list(_REQUIRED.items())[: 1 if save_only_model else None]:
        if not any(name.startswith(prefixes) for name in names):
            return f"no {what}"
    if not save_only_model and {"optimizer.pt", "optimizer.bin"} & set(names) and "scheduler.pt" not in names:
        return "no scheduler.pt: without it transformers resumes with a fresh optimizer"
    if missing := [name for name in (record or {}).get("files", []) if name not in names]:
        return f"no {missing[0]}, which its save wrote"
    for name in names:
        full = os.path.join(path, name)
        if not os.path.isdir(full) and (problem := file_problem(full)):
            return f"{name} {problem}"
        for inner in sorted(os.listdir(full)) if name.startswith("global_step") and os.path.isdir(full) else []:
            if inner.endswith(".pt") and (problem := _torch_file_problem(os.path.join(full, inner), False)):
                return f"{name}/{inner} {problem}"  # DeepSpeed's files: their zip directory (DeepSpeed unpickles them)
    return None


def newest_complete_checkpoint(output_dir: str, save_only_model: bool = False) -> tuple[str | None, list]:
    """(the complete checkpoint of `output_dir` with the highest step or `None`, [(name, why) of each incomplete one
    above it, highest first])."""
    names, skipped = os.listdir(output_dir) if os.path.isdir(output_dir) else [], []
    for name in sorted(filter(CHECKPOINT_FOLDER.match, names), key=lambda n: -int(n.split("-")[1])):
        if (problem := checkpoint_problem(os.path.join(output_dir, name), save_only_model)) is None:
            return os.path.join(output_dir, name), skipped
        skipped.append((name, problem))
    return None, skipped


def resume_checkpoint(output_dir: str, save_only_model: bool = False, *, move_aside: bool = False) -> str | None:
    """[`newest_complete_checkpoint`], those skipped above it said in one warning line and, with `move_aside` (the
    folder's writer only), renamed `_damaged-checkpoint-N[-k]`: out of reach of the rotation and of transformers."""
    checkpoint, skipped = newest_complete_checkpoint(output_dir, save_only_model)
    words = []
    for name, problem in skipped:
        aside = ""
        if move_aside:
            target, k = folder.DAMAGED_PREFIX + name, 1
            while os.path.lexists(os.path.join(output_dir, target)):
                k, target = k + 1, f"{folder.DAMAGED_PREFIX}{name}-{k + 1}"
            os.replace(os.path.join(output_dir, name), os.path.join(output_dir, target))
            aside = f" and moved it aside to {target}"
        words.append(f"{name} ({problem}){aside}")
    if words and checkpoint:
        logger.warning(f"The newest complete checkpoint is {checkpoint}: skipped {', '.join(words)}.")
    elif words:
        logger.warning(f"No complete checkpoint to resume in {output_dir}: skipped {', '.join(words)}.")
    return checkpoint


def check_checkpoint(path: str, what: str, save_only_model: bool = False, fix: str = RESUME_FIX) -> None:
    """Raise `ValueError("<what> <problem>. <fix>")` for a checkpoint given by name that is missing, a file, a run
    folder (naming its newest complete checkpoint) or not complete (naming the file and the damage)."""
    if (problem := checkpoint_problem(path, save_only_model)) is None:
        return
    if problem == "not a folder":
        problem = "is a file" if os.path.exists(path) else "does not exist"
    elif newest := newest_complete_checkpoint(path)[0]:
        problem = f"is a run folder, not a checkpoint: give one of its checkpoints ({os.path.basename(newest)})"
    else:
        problem = f"is not a complete checkpoint ({problem})"
    raise ValueError(f"{what} {problem}. {fix}")


def plain(value: Any) -> Any:
    """`value` as JSON data that compares equal across processes: enums by value, sets sorted, objects with `to_dict`
    as dicts, any other object by its type's name (never a `repr` with an address)."""

    def default(v: Any) -> Any:
        if isinstance(v, (set, frozenset)):
            return sorted(plain(x) for x in v)
        return v.value if isinstance(v, enum.Enum) else v.to_dict() if hasattr(v, "to_dict") else type(v).__name__

    return json.loads(json.dumps(value, default=default))


def run_settings(args, *, trainer: str, model, reward_funcs, s2t=None, peft_config=None, train_dataset=None,
                 dtype=None) -> dict:  # fmt: skip
    """What a resume must keep, as plain data: the trainer class, the model and its `dtype` (`"float32"`), the rewards
    (a function by its name, a reward model by its id), the S2T values, [`RESUME_FIELDS`] of `args`, the PEFT
    settings and the training data's `datasets` fingerprint."""
    from trl.trainer.utils import get_callable_name

    def _local(path: Any) -> Any:
        return os.path.abspath(path) if isinstance(path, str) and os.path.exists(path) else path

    if not isinstance(model, str):
        model = getattr(getattr(model, "config", None), "_name_or_path", None)
    funcs = reward_funcs if isinstance(reward_funcs, list) else [reward_funcs] if reward_funcs is not None else []
    names = [getattr(getattr(f, "config", None), "_name_or_path", None) for f in funcs]  # a reward model's id
    rewards = [_local(f) if isinstance(f, str) else name or get_callable_name(f) for f, name in zip(funcs, names)]
    dtype = None if dtype is None else str(dtype).removeprefix("torch.")
    settings = {"trainer": trainer, "model": _local(model), "dtype": dtype, "reward_funcs": rewards}
    if s2t is not None:
        settings |= {f"s2t_{name}": getattr(s2t, name) for name in ("prob_threshold", "entropy_quantile", "mode")}
    settings |= {name: getattr(args, name) for name in (*RESUME_FIELDS, "warmup_ratio") if hasattr(args, name)}
    settings["peft"] = peft_config
    is_dataset = type(train_dataset).__name__ == "Dataset"
    settings["train_dataset"] = getattr(train_dataset, "_fingerprint", None) if is_dataset else None
    return plain(settings)


def write_run_record(checkpoint: str, settings: dict, *, save_only_model: bool, files: list[str] | None) -> None:
    """Write `checkpoint/stapo_run.json` atomically: `files` `None` while the save runs, then the files it wrote."""
    record = {"format": 1, "files": files, "save_only_model": save_only_model, "settings": settings}
    folder.write_atomic(os.path.join(checkpoint, RUN_RECORD), json.dumps(record, indent=2))


def read_run_record(checkpoint: str) -> dict | None:
    """The record of `checkpoint` (`None` without one); `ValueError("stapo_run.json ...")` for one that does not parse,
    is of an unknown format, or lacks settings its format holds or the list of files."""
    path = os.path.join(checkpoint, RUN_RECORD)
    if not os.path.lexists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
    except (ValueError, RecursionError) as e:
        raise ValueError(f"{RUN_RECORD} unreadable: {type(e).__name__}") from None
    if not isinstance(record, dict) or not isinstance(record.get("settings"), dict):
        raise ValueError(f"{RUN_RECORD} holds no settings")
    if type(version := record.get("format")) is not int or version not in RECORD_FIELDS:
        raise ValueError(f"{RUN_RECORD} is of an unknown format ({repr(version)[:40]}; this stapo_trl reads 1)")
    if missing := [name for name in RECORD_FIELDS[version] if name not in record["settings"]]:
        raise ValueError(f"{RUN_RECORD} holds no {missing[0]}, which its format records")
    files = record.get("files")
    if files is not None and not (isinstance(files, list) and all(isinstance(name, str) for name in files)):
        raise ValueError(f"{RUN_RECORD} holds no list of files")
    return record


def changed_settings(recorded: dict, current: dict) -> list[str]:
    """`"name old -> new"` for each field both hold with other values, a dict's keys one by one (`peft.r 8 -> 16`)."""
    changes = []
    for name in [key for key in current if key in recorded]:
        old, new = recorded[name], current[name]
        if isinstance(old, dict) and isinstance(new, dict):
            changes += [f"{name}.{change}" for change in changed_settings(old, new)]
        elif old != new:
            changes.append(f"{name} {repr(old)[:120]} -> {repr(new)[:120]}")
    return changes


def check_run_settings(checkpoint: str, settings: dict) -> None:
    """Raise `ValueError` (one line naming each changed field, old -> new) to resume `checkpoint` with other
    `settings` than it was trained with; one without a record resumes with one warning."""
    record = read_run_record(checkpoint)
    if record is None:
        logger.warning(
            f"{checkpoint} has no {RUN_RECORD} (saved before stapo_trl recorded a run's settings): resumed without "
            "comparing the settings it was trained with to this run's."
        )
    elif changes := changed_settings(record["settings"], settings):
        raise ValueError(
            f"{checkpoint} was trained with other settings ({', '.join(changes)}): resuming would mix two runs in one "
            "model, and its card could state only one. Resume with the checkpoint's values, or train in another "
            f"output_dir (model_name_or_path / model {checkpoint} starts from its weights)."
        )
