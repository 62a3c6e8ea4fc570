"""What a resume trusts: whole checkpoints, the run record, no write through a link, one writer per folder."""

from __future__ import annotations

import enum
import errno
import json
import logging
import os
import re
import shlex
import socket
import sys
import tempfile
import time
import warnings
import zipfile
from pathlib import Path
from typing import IO, Any

from filelock import FileLock, Timeout
from safetensors import safe_open


logger = logging.getLogger(__name__)

CHECKPOINT_FOLDER = re.compile(r"^checkpoint-(\d+)$")
RUN_RECORD = "stapo_run.json"
DAMAGED_PREFIX = "_damaged-"
NOT_USER_FILES = re.compile(r"^(\.nfs.*|slurm-.*\.out|_writer\.(lock|txt)|(metrics|spurious_tokens)(\.\d+)?\.jsonl)$")
ROLLOUT_MANIFEST = re.compile(r"^rollout_state_\d+\.json$")
_REQUIRED = {  # what `Trainer._save_checkpoint` writes, by name prefix
    "model weights": ("model", "pytorch_model", "adapter_model", "global_step"),
    "optimizer state (optimizer.pt)": ("optimizer", "global_step"),
    "RNG state (rng_state.pth)": ("rng_state",)}  # fmt: skip
RESUME_FIELDS = tuple("loss_type epsilon epsilon_high delta beta scale_rewards reward_weights "
    "importance_sampling_level top_entropy_quantile mask_truncated_completions num_generations "
    "num_iterations temperature top_p top_k min_p repetition_penalty max_completion_length "
    "learning_rate lr_scheduler_type lr_scheduler_kwargs warmup_steps optim optim_args "
    "optim_target_modules weight_decay adam_beta1 adam_beta2 adam_epsilon max_grad_norm".split())  # fmt: skip
_HOLDS: dict[str, list] = {}  # folder -> [its FileLock or None, its holders: None (a command) or trainers]


class LinkError(ValueError):
    def __init__(self, path: str):
        super().__init__(f"{path} is a symbolic link (to {os.readlink(path)!r}): a run writes its files in its "
                         "folder, never through a link (it would overwrite the link's target). Remove the link, or "
                         "give another output_dir.")  # fmt: skip


def open_run_file(path: str | os.PathLike, mode: str = "w") -> IO:
    """`open(path, mode)` (`w`, `a`, `wb`, `ab`; text in UTF-8); raises [`LinkError`] for a symbolic link at `path`."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | (os.O_APPEND if "a" in mode else os.O_TRUNC)
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as e:
        raise (LinkError(os.fspath(path)) if e.errno == errno.ELOOP else e) from None
    return os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"}))


def write_atomic(path: str | os.PathLike, data: str | bytes) -> None:
    """Write `data` to `path` through a synced temporary file and a rename: a kill leaves the old file or the new."""
    folder, name = os.path.split(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f".{name}.{os.getpid()}.tmp")
    with open_run_file(tmp, "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def refuse_links(output_dir: str) -> None:
    """Raise [`LinkError`] for a symbolic link at the top of `output_dir` or in its `checkpoint-N` folders."""
    folder = os.path.abspath(output_dir)
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        path = os.path.join(folder, name)
        inner = sorted(os.listdir(path)) if CHECKPOINT_FOLDER.match(name) and os.path.isdir(path) else []
        if link := next((p for p in [path, *(os.path.join(path, n) for n in inner)] if os.path.islink(p)), None):
            raise LinkError(link)


def check_output_dir(output_dir: str, refuse_user_files: bool = False) -> None:
    """`ValueError`, creating nothing, for an empty, file, unwritable or linked `output_dir`, or one of user files."""
    if not str(output_dir or "").strip():
        raise ValueError(f"output_dir={output_dir!r} is empty: give the folder the run writes its checkpoints, model "
                         "and files into (e.g. outputs/my-run).")  # fmt: skip
    folder = os.path.abspath(os.path.expanduser(output_dir))
    if os.path.isfile(folder):
        raise ValueError(f"output_dir={output_dir!r} is a file: give a folder (it is created if missing).")
    try:
        tempfile.TemporaryFile(dir=next(p for p in (folder, *Path(folder).parents) if os.path.lexists(p))).close()
    except OSError as e:
        raise ValueError(f"output_dir={output_dir!r} cannot be written ({e.strerror or e}): give a folder this "
                         "process can create files in.") from None  # fmt: skip
    refuse_links(folder)
    names = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
    runs = ["", *(n for n in names if CHECKPOINT_FOLDER.match(n.removeprefix(DAMAGED_PREFIX)))]
    if any(os.path.isfile(os.path.join(folder, n, f)) for n in runs for f in ("trainer_state.json", RUN_RECORD)):
        return
    if others := [name for name in names if not NOT_USER_FILES.match(name)]:
        shown = ", ".join(others[:4]) + (f" and {len(others) - 4} more" if len(others) > 4 else "")
        what = f"output_dir={output_dir!r} holds files that are not a run's ({shown})"
        if refuse_user_files:
            raise ValueError(f"{what}: a run writes its model, card (README.md), config and checkpoints there, over "
                             "files of the same names. Give a new or empty folder, or a run folder.")  # fmt: skip
        warnings.warn(f"{what}: the trainer writes its model, card (README.md), config and checkpoints there, as "
                      "GRPOTrainer does, over files of the same names.", stacklevel=3)  # fmt: skip


def command_line(argv: list[str] | None = None) -> str:
    """`argv` (default `sys.argv`) as one shell line, secrets (`--*token`, `--*key`..., `hf_...`) written REDACTED."""
    words = list(sys.argv if argv is None else argv)
    for i, word in enumerate(words):
        name, eq, _ = word.partition("=")
        if re.fullmatch(r"--?[\w-]*(token|secret|password|key)", name, re.IGNORECASE):
            words[i : i + 1 + (not eq)] = [f"{name}=REDACTED"] if eq else [word, "REDACTED"][: len(words) - i]
        words[i] = re.sub(r"hf_[A-Za-z0-9]{8,}", "hf_REDACTED", words[i])
    return shlex.join(words)


def hold_run_folder(output_dir: str, acquire: bool = True, *, trainer: Any = None) -> None:
    """Take (`acquire=False`: give back) `output_dir` as its one writer; `ValueError` where another run holds it."""
    folder = os.path.abspath(output_dir)
    lock, holders = _HOLDS.setdefault(folder, [None, []])
    if not acquire:
        if trainer in holders:
            holders.remove(trainer)
            if not holders and lock is not None:
                lock.release()
        return
    refuse_links(output_dir)
    owner = os.path.join(folder, "_writer.txt")
    in_use = any(holder is not None and holder is not trainer for holder in holders)
    if not holders:
        os.makedirs(folder, exist_ok=True)
        lock = FileLock(os.path.join(folder, "_writer.lock"))
        try:
            lock.acquire(timeout=0)
        except Timeout:
            in_use = True
        except (NotImplementedError, OSError) as e:
            if getattr(e, "errno", errno.ENOSYS) not in (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP):
                raise
            logger.warning(f"output_dir={output_dir!r} is on a file system that cannot lock files ({e}): this run "
                           "writes it without the lock, so a second run writing the same folder would not be "
                           "stopped.")  # fmt: skip
            lock = None
        if not in_use:
            write_atomic(owner, f"pid {os.getpid()} on {socket.gethostname()}, since "
                         f"{time.strftime('%Y-%m-%d %H:%M:%S')}: {command_line()}")  # fmt: skip
    if in_use:
        holder = Path(owner).read_bytes()[:2000].decode(errors="replace") if os.path.isfile(owner) else "starting"
        raise ValueError(f"output_dir={output_dir!r} is in use by another run ({holder}). Two runs in one folder mix "
                         "their metrics, checkpoints and model: wait for that run to end, or give another "
                         "output_dir.")  # fmt: skip
    _HOLDS[folder] = [lock, [*holders, trainer]]


def tensor_specs(path: str) -> dict:
    """`{name: {"dtype": "F32", "shape": [16, 48]}}` of a safetensors file; safetensors' error for a damaged one."""
    with safe_open(path, framework="pt") as f:
        return {n: {"dtype": f.get_slice(n).get_dtype(), "shape": f.get_slice(n).get_shape()} for n in f.keys()}


def file_problem(path: str, load: bool = True) -> str | None:
    """Why the checkpoint file `path` cannot be loaded whole, in a few words, or `None` (`load=False`: zip only)."""
    name, tensors = os.path.basename(path), re.sub(r"\.json$", ".safetensors", path)
    if not os.path.isfile(path):
        return "not a file"
    if name.endswith((".pt", ".pth", ".bin")):
        try:
            with zipfile.ZipFile(path) as archive:
                if any(i.header_offset + i.compress_size > os.path.getsize(path) for i in archive.infolist()):
                    return "cut short: its zip directory points past its end"
        except (zipfile.BadZipFile, OSError, ValueError):
            return "damaged: no zip directory (cut short, or overwritten)"
        if not load or not name.startswith(("optimizer", "scheduler", "scaler", "rng_state", "pytorch_model")):
            return None  # DeepSpeed's, or a file a resume does not unpickle
        import torch
        from transformers.trainer_pt_utils import safe_globals

        try:
            with safe_globals():
                state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except Exception as e:  # noqa: BLE001 (UnpicklingError, RuntimeError)
            parts = [p.strip() for p in str(e).split("\n\n") if p.strip()] or [type(e).__name__]
            detail = next((p for p in parts[1:] if not p.startswith("Check the documentation")), parts[0])
            return "refused by a safe load: " + detail.splitlines()[0][:160].rstrip(".")
        rng = isinstance(state, dict) and {"python", "numpy", "cpu"} <= set(state)
        return "holds no RNG state" if name.startswith("rng_state") and not rng else None
    try:
        if name.endswith(".safetensors"):
            tensor_specs(path)
        elif name.endswith(".json"):
            data = json.loads(Path(path).read_text(encoding="utf-8"))
            specs = tensor_specs(tensors) if ROLLOUT_MANIFEST.match(name) and os.path.isfile(tensors) else None
            if ROLLOUT_MANIFEST.match(name) and (not isinstance(data, dict) or data.get("tensors") != specs):
                return f"does not match {os.path.basename(tensors)} (its tensors' names, dtypes or shapes)"
    except (ValueError, RecursionError) as e:
        return f"unreadable: {type(e).__name__}"
    except Exception as e:  # noqa: BLE001 (SafetensorError; a manifest's is its tensors file's)
        return "damaged: " + str(e).removeprefix("Error while deserializing header: ") if path == tensors else None


def checkpoint_problem(path: str, save_only_model: bool = False) -> str | None:
    """Why the folder `path` is not a complete checkpoint, in a few words naming the file, or `None`."""
    names = sorted(os.listdir(path)) if os.path.isdir(path) else None
    if not names:
        return "not a folder" if names is None else "empty"
    try:
        step = json.loads(Path(path, "trainer_state.json").read_text(encoding="utf-8"))["global_step"]
    except FileNotFoundError:
        return "no trainer_state.json: its save did not finish"
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as e:
        return f"trainer_state.json unreadable ({type(e).__name__}): its save did not finish"
    number = CHECKPOINT_FOLDER.match(os.path.basename(os.path.normpath(path)))
    if type(step) is not int or step < 0 or (number and step != int(number[1])):
        return f"trainer_state.json has global_step {repr(step)[:40]}, not " + (
            f"its step {number[1]}" if number else "a step")  # fmt: skip
    try:
        record = read_run_record(path) or {}
    except ValueError as e:
        return str(e)
    if record and record.get("files") is None:
        return f"{RUN_RECORD} says its save did not finish"
    save_only_model = bool(record.get("save_only_model", save_only_model))
    for what, prefixes in list(_REQUIRED.items())[: 1 if save_only_model else None]:
        if not any(name.startswith(prefixes) for name in names):
            return f"no {what}"
    if not save_only_model and {"optimizer.pt", "optimizer.bin"} & set(names) and "scheduler.pt" not in names:
        return "no scheduler.pt: without it transformers resumes with a fresh optimizer"
    if missing := [name for name in record.get("files", []) if name not in names]:
        return f"no {missing[0]}, which its save wrote"
    for name in names:
        full = os.path.join(path, name)
        if not os.path.isdir(full) and (problem := file_problem(full)):
            return f"{name} {problem}"
        for inner in sorted(os.listdir(full)) if name.startswith("global_step") and os.path.isdir(full) else []:
            if inner.endswith(".pt") and (problem := file_problem(os.path.join(full, inner), False)):
                return f"{name}/{inner} {problem}"  # DeepSpeed's: their zip directory only


def newest_complete_checkpoint(output_dir: str, save_only_model: bool = False) -> tuple[str | None, list]:
    """(the newest complete checkpoint of `output_dir` or `None`, [(name, why) of each incomplete one above it])."""
    names, skipped = os.listdir(output_dir) if os.path.isdir(output_dir) else [], []
    for name in sorted(filter(CHECKPOINT_FOLDER.match, names), key=lambda n: -int(n.split("-")[1])):
        if (problem := checkpoint_problem(os.path.join(output_dir, name), save_only_model)) is None:
            return os.path.join(output_dir, name), skipped
        skipped.append((name, problem))
    return None, skipped


def resume_checkpoint(output_dir: str, save_only_model: bool = False, *, move_aside: bool = False) -> str | None:
    """[`newest_complete_checkpoint`], the skipped said in one warning and (`move_aside`) renamed `_damaged-...`."""
    checkpoint, skipped = newest_complete_checkpoint(output_dir, save_only_model)
    words = []
    for name, problem in skipped:
        target, k = DAMAGED_PREFIX + name, 1
        while move_aside and os.path.lexists(os.path.join(output_dir, target)):
            k, target = k + 1, f"{DAMAGED_PREFIX}{name}-{k + 1}"
        if move_aside:
            os.replace(os.path.join(output_dir, name), os.path.join(output_dir, target))
        words.append(f"{name} ({problem})" + f" and moved it aside to {target}" * move_aside)
    if words:
        head = f"The newest complete checkpoint is {checkpoint}" if checkpoint else "No complete checkpoint to resume"
        logger.warning(f"{head}{'' if checkpoint else f' in {output_dir}'}: skipped {', '.join(words)}.")
    return checkpoint


def check_checkpoint(path: str, what: str, save_only_model: bool = False, fix: str = "") -> None:
    """Raise `ValueError("<what> <problem>. <fix>")` for a named checkpoint: missing, a file, a run folder, partial."""
    if (problem := checkpoint_problem(path, save_only_model)) is None:
        return
    newest = problem != "not a folder" and newest_complete_checkpoint(path)[0]
    problem = ("is a file" if os.path.exists(path) else "does not exist") if problem == "not a folder" else (
        f"is a run folder, not a checkpoint: give one of its checkpoints ({os.path.basename(newest)})" if newest else
        f"is not a complete checkpoint ({problem})")  # fmt: skip
    raise ValueError(f"{what} {problem}. " + (fix or "Give a complete checkpoint folder "
                     "(<output_dir>/checkpoint-<step>), or let a run take its newest one."))  # fmt: skip


def plain(value: Any) -> Any:
    """`value` as JSON data equal across processes: enums by value, sets sorted, `to_dict()`, else the type's name."""

    def default(v: Any) -> Any:
        if isinstance(v, (set, frozenset)):
            return sorted(plain(x) for x in v)
        return v.value if isinstance(v, enum.Enum) else v.to_dict() if hasattr(v, "to_dict") else type(v).__name__

    return json.loads(json.dumps(value, default=default))


def run_settings(args, *, trainer: str, model, reward_funcs, s2t=None, peft_config=None, train_dataset=None,
                 dtype=None) -> dict:  # fmt: skip
    """What a resume must keep, as plain data: trainer, model, dtype, rewards, S2T, [`RESUME_FIELDS`], PEFT, data."""
    from trl.trainer.utils import get_callable_name

    local = lambda p: os.path.abspath(p) if isinstance(p, str) and os.path.exists(p) else p  # noqa: E731
    model = model if isinstance(model, str) else getattr(getattr(model, "config", None), "_name_or_path", None)
    funcs = reward_funcs if isinstance(reward_funcs, list) else [reward_funcs] if reward_funcs is not None else []
    names = [getattr(getattr(f, "config", None), "_name_or_path", None) for f in funcs]  # a reward model's id
    rewards = [local(f) if isinstance(f, str) else name or get_callable_name(f) for f, name in zip(funcs, names)]
    dtype = None if dtype is None else str(dtype).removeprefix("torch.")
    settings = {"trainer": trainer, "model": local(model), "dtype": dtype, "reward_funcs": rewards}
    settings |= {f"s2t_{n}": getattr(s2t, n) for n in ("prob_threshold", "entropy_quantile", "mode")} if s2t else {}
    settings |= {name: getattr(args, name) for name in (*RESUME_FIELDS, "warmup_ratio") if hasattr(args, name)}
    fingerprint = getattr(train_dataset, "_fingerprint", None) if type(train_dataset).__name__ == "Dataset" else None
    return plain(settings | {"peft": peft_config, "train_dataset": fingerprint})


def write_run_record(checkpoint: str, settings: dict, *, save_only_model: bool, files: list[str] | None) -> None:
    """Write `checkpoint/stapo_run.json` atomically: `files` `None` while the save runs, then the files it wrote."""
    record = {"format": 1, "files": files, "save_only_model": save_only_model, "settings": settings}
    write_atomic(os.path.join(checkpoint, RUN_RECORD), json.dumps(record, indent=2))


def read_run_record(checkpoint: str) -> dict | None:
    """The record of `checkpoint` (`None` without one); `ValueError("stapo_run.json ...")` for a damaged one."""
    try:
        with open(os.path.join(checkpoint, RUN_RECORD), encoding="utf-8") as f:
            record = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError) as e:
        raise ValueError(f"{RUN_RECORD} unreadable: {type(e).__name__}") from None
    if not isinstance(record, dict) or not isinstance(record.get("settings"), dict):
        raise ValueError(f"{RUN_RECORD} holds no settings")
    if type(version := record.get("format")) is not int or version != 1:
        raise ValueError(f"{RUN_RECORD} is of an unknown format ({repr(version)[:40]}; this stapo_trl reads 1)")
    if missing := [n for n in ("trainer", "model", "reward_funcs", *RESUME_FIELDS) if n not in record["settings"]]:
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
    """`ValueError` naming each changed field (old -> new) to resume `checkpoint` with other `settings`."""
    if (record := read_run_record(checkpoint)) is None:
        logger.warning(f"{checkpoint} has no {RUN_RECORD} (saved before stapo_trl recorded a run's settings): resumed "
                       "without comparing the settings it was trained with to this run's.")  # fmt: skip
    elif changes := changed_settings(record["settings"], settings):
        raise ValueError(f"{checkpoint} was trained with other settings ({', '.join(changes)}): resuming would mix "
                         "two runs in one model, and its card could state only one. Resume with the checkpoint's "
                         f"values, or train in another output_dir (model_name_or_path / model {checkpoint} starts "
                         "from its weights).")  # fmt: skip
