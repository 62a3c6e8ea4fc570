"""The run folder a resume trusts: which checkpoint is whole, what the run optimizes, and files never written through a
symbolic link. Nothing here unpickles a file but with `torch.load(weights_only=True)`: a checkpoint from elsewhere is
untrusted input.

- [`checkpoint_problem`]: complete means every file the save wrote (named by its run record; by rule for a checkpoint
  saved before it had one) is there and whole: a safetensors file's header and length, a torch file's zip directory,
  and what transformers unpickles on resume loaded the same safe way. transformers writes a checkpoint in place and
  resumes the highest-numbered one whatever it holds.
- [`resume_checkpoint`]: the newest complete one, in one line with those skipped and why; the skipped ones are moved
  aside (`_damaged-checkpoint-N`), out of reach of `save_total_limit`'s rotation and of `get_last_checkpoint`.
- [`run_settings`] / [`check_run_settings`]: what the run optimizes, as plain JSON in each checkpoint
  (`stapo_run.json`), and the refusal of a resume that would change it.
- [`hold_run_folder`]: one writer per run folder (`_writer.lock`), taken by `train()` and by `stapo-train`.
"""

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
from typing import IO, Any


logger = logging.getLogger(__name__)

CHECKPOINT_FOLDER = re.compile(r"^checkpoint-(\d+)$")  # transformers' `PREFIX_CHECKPOINT_DIR`-<global_step>
RUN_RECORD = "stapo_run.json"
ROLLOUT_MANIFEST = re.compile(r"^rollout_state_\d+\.json$")  # stapo_trl.run_folder.rollout's, beside its .safetensors
DAMAGED_PREFIX = "_damaged-"  # "_*": not pushed to the Hub; not "checkpoint-*": neither rotated nor resumed
RESUME_FIX = "Give a complete checkpoint folder (<output_dir>/checkpoint-<step>), or let a run take its newest one."
# What `Trainer._save_checkpoint` writes before trainer_state.json, by name prefix (full, adapter, DeepSpeed layouts).
_REQUIRED = {
    "model weights": ("model", "pytorch_model", "adapter_model", "global_step"),
    "optimizer state (optimizer.pt)": ("optimizer", "global_step"),
    "RNG state (rng_state.pth)": ("rng_state",),
}
_UNPICKLED_ON_RESUME = ("optimizer", "scheduler", "scaler", "rng_state", "pytorch_model")  # by transformers
# The config fields a resume must keep. Free to change: threads, logging, saving, evaluation, max_steps and the batch
# layout (another number of processes changes it).
RESUME_FIELDS = (
    "loss_type", "epsilon", "epsilon_high", "delta", "beta", "scale_rewards", "reward_weights",
    "importance_sampling_level", "top_entropy_quantile", "mask_truncated_completions", "num_generations",
    "num_iterations", "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_completion_length",
    "learning_rate", "lr_scheduler_type", "lr_scheduler_kwargs", "warmup_steps", "optim", "optim_args",
    "optim_target_modules", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon", "max_grad_norm",
)  # fmt: skip
# What the settings of a record of each format hold: one without them is damaged (`warmup_ratio` is recorded where
# transformers has it).
RECORD_FIELDS = {1: ("trainer", "model", "reward_funcs", *RESUME_FIELDS)}
# Files a scheduler or file system puts in a folder, and a run's own before its first checkpoint: not the user's.
NOT_USER_FILES = re.compile(r"^(\.nfs.*|slurm-.*\.out|_writer\.(lock|txt)|(metrics|spurious_tokens)(\.\d+)?\.jsonl)$")


# -- the run folder ----------------------------------------------------------------------------------------------------
class LinkError(ValueError):
    """A symbolic link where a run writes a file, in one line naming it and its target."""

    def __init__(self, path: str):
        super().__init__(
            f"{path} is a symbolic link (to {os.readlink(path)!r}): a run writes its files in its folder, never "
            "through a link (it would overwrite the link's target). Remove the link, or give another output_dir."
        )


def open_run_file(path: str | os.PathLike, mode: str = "w") -> IO:
    """`open(path, mode)` (`"w"`, `"a"`, `"wb"`, `"ab"`; text in UTF-8) for a file of the run folder, refusing a
    symbolic link in its place (`O_NOFOLLOW`) instead of writing its target.

    Raises:
        ValueError: `path` is a symbolic link (one line naming it).
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | (os.O_APPEND if "a" in mode else os.O_TRUNC)
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise LinkError(os.fspath(path)) from None
        raise
    return os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"}))


def refuse_links(output_dir: str) -> None:
    """Refuse a symbolic link at the top of `output_dir` or in its `checkpoint-N` folders, where a run writes
    (`output_dir` itself may be a link: clusters link a scratch disk). Run before each save as well as at the start.

    Raises:
        ValueError: one line naming the link and its target.
    """
    folder = os.path.abspath(output_dir)
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        path = os.path.join(folder, name)
        inner = sorted(os.listdir(path)) if CHECKPOINT_FOLDER.match(name) and os.path.isdir(path) else []
        for link in [path, *(os.path.join(path, n) for n in inner)]:
            if os.path.islink(link):
                raise LinkError(link)


def check_output_dir(output_dir: str, refuse_user_files: bool = False) -> None:
    """Refuse, before a model is built and without creating anything, an `output_dir` that is empty, cannot be written
    (its nearest existing parent must take a file) or holds a symbolic link ([`refuse_links`]); a folder of the user's
    own files is refused with `refuse_user_files` (`stapo-train`), else warned about (the library writes into it as
    `GRPOTrainer` does): a folder other than a run's (a `trainer_state.json` at its top or in a `checkpoint-N`, or a
    checkpoint stapo_trl began or moved aside) holding files but [`NOT_USER_FILES`].

    Raises:
        ValueError: one line naming the field, the link or (a few of) the user's files.
    """
    if not str(output_dir or "").strip():
        raise ValueError(
            f"output_dir={output_dir!r} is empty: give the folder the run writes its checkpoints, model and files into "
            "(e.g. outputs/my-run)."
        )
    folder = os.path.abspath(output_dir)
    existing = folder
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    try:
        tempfile.TemporaryFile(dir=existing).close()  # "Not a directory" below a file, "Read-only file system"
    except OSError as e:
        raise ValueError(
            f"output_dir={output_dir!r} cannot be written ({e.strerror or e}): give a folder this process can create "
            "files in."
        ) from None
    refuse_links(folder)
    names = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
    checkpoints = ["", *(n for n in names if CHECKPOINT_FOLDER.match(n.removeprefix(DAMAGED_PREFIX)))]
    if any(
        os.path.isfile(os.path.join(folder, n, f)) for n in checkpoints for f in ("trainer_state.json", RUN_RECORD)
    ):
        names = []  # a run folder
    if others := [name for name in names if not NOT_USER_FILES.match(name)]:
        shown = ", ".join(others[:4]) + (f" and {len(others) - 4} more" if len(others) > 4 else "")
        what = f"output_dir={output_dir!r} holds files that are not a run's ({shown})"
        if refuse_user_files:
            raise ValueError(
                f"{what}: a run writes its model, card (README.md), config and checkpoints there, over files of the "
                "same names. Give a new or empty folder, or a run folder."
            )
        warnings.warn(f"{what}: the trainer writes its model, card (README.md), config and checkpoints there, as "
                      "GRPOTrainer does, over files of the same names.", stacklevel=3)  # fmt: skip


# folder -> [its FileLock (None: cannot lock), who holds it in this process: None (a command) or a trainer]
_HOLDS: dict[str, list] = {}


def command_line(argv: list[str] | None = None) -> str:
    """`argv` (default `sys.argv`) as one shell line, the value of a `--*token` / `--*secret` / `--*password` /
    `--*key` flag and any word like a Hub token (`hf_...`) written `REDACTED`."""
    words = list(sys.argv if argv is None else argv)
    for i, word in enumerate(words):
        name, eq, _ = word.partition("=")
        if re.fullmatch(r"--?[\w-]*(token|secret|password|key)", name, re.IGNORECASE):
            words[i : i + 1 + (not eq)] = [f"{name}=REDACTED"] if eq else [word, "REDACTED"][: len(words) - i]
        words[i] = re.sub(r"hf_[A-Za-z0-9]{8,}", "hf_REDACTED", words[i])
    return shlex.join(words)


def hold_run_folder(output_dir: str, acquire: bool = True, *, trainer: Any = None) -> None:
    """Take (`acquire=False`: give back) a hold on `output_dir` as its one writer: a `FileLock` on `_writer.lock`
    (released by the OS when the process dies), with the holder's pid, host and command line ([`command_line`]) in
    `_writer.txt`. Holds nest within a process: a command's (`trainer=None`: `stapo-train`), then one trainer's
    (`train()`); another trainer, or a command while a trainer trains, is refused. A file system that cannot lock is
    warned about, and written without the lock.

    Raises:
        ValueError: one line: another run holds the folder (naming it), or it holds a link.
    """
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
    in_use = any(holder is not None and holder is not trainer for holder in holders)  # another trainer in this process
    if not holders and not in_use:
        from filelock import FileLock, Timeout

        os.makedirs(folder, exist_ok=True)
        lock = FileLock(os.path.join(folder, "_writer.lock"))
        try:
            lock.acquire(timeout=0)
        except Timeout:
            in_use = True
        except (NotImplementedError, OSError) as e:  # flock refused by the file system (NFS without lockd...)
            if getattr(e, "errno", errno.ENOSYS) not in (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP):
                raise
            logger.warning(
                f"output_dir={output_dir!r} is on a file system that cannot lock files ({e}): this run writes it "
                "without the lock, so a second run writing the same folder would not be stopped."
            )
            lock = None
        if not in_use:
            with open_run_file(owner) as f:
                since = time.strftime("%Y-%m-%d %H:%M:%S")
                f.write(f"pid {os.getpid()} on {socket.gethostname()}, since {since}: {command_line()}")
    if in_use:
        holder = "starting"
        if os.path.isfile(owner) and not os.path.islink(owner):
            with open(owner, encoding="utf-8", errors="replace") as f:
                holder = f.read(2000)
        raise ValueError(
            f"output_dir={output_dir!r} is in use by another run ({holder}). Two runs in one folder mix their "
            "metrics, checkpoints and model: wait for that run to end, or give another output_dir."
        )
    _HOLDS[folder] = [lock, [*holders, trainer]]


# -- whole checkpoints -------------------------------------------------------------------------------------------------
def _safetensors_problem(path: str) -> str | None:
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        length = int.from_bytes(head, "little") if len(head) == 8 else None
        if length is None or length > size - 8:
            return f"cut short: {size} bytes, less than its header"
        try:
            header = json.loads(f.read(length))
            end = max((int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"), default=0)
        except (ValueError, TypeError, KeyError, IndexError, AttributeError):
            return "damaged: its header does not parse"
    expected = 8 + length + end
    if size != expected:
        return f"cut short: {size} of {expected} bytes" if size < expected else "damaged: bytes past its tensors"
    return None


def _torch_file_problem(path: str, load: bool) -> str | None:
    """A torch file: its zip directory, then (`load`) a safe load, its tensors mapped, not read."""
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
    is_rng = os.path.basename(path).startswith("rng_state")
    if is_rng and not (isinstance(state, dict) and {"python", "numpy", "cpu"} <= set(state)):
        return "holds no RNG state"
    return None


def tensor_specs(path: str) -> dict:
    """`{name: {"dtype": "F32", "shape": [16, 48]}}` of the safetensors file `path` (safetensors' dtype names)."""
    from safetensors import safe_open

    with safe_open(path, framework="pt") as f:
        slices = {name: f.get_slice(name) for name in f.keys()}
        return {name: {"dtype": s.get_dtype(), "shape": s.get_shape()} for name, s in slices.items()}


def _manifest_problem(path: str, manifest: Any) -> str | None:
    """A rollout manifest ([`~stapo_trl.run_folder.rollout`]) must name its tensors file's tensors, dtypes and shapes."""
    tensors = path.removesuffix(".json") + ".safetensors"
    if os.path.isfile(tensors) and _safetensors_problem(tensors):
        return None  # named as the tensors file's own damage
    try:
        specs = tensor_specs(tensors)
    except Exception:  # noqa: BLE001 (missing, or safetensors' SafetensorError)
        specs = None
    if not isinstance(manifest, dict) or manifest.get("tensors") != specs:
        return f"does not match {os.path.basename(tensors)} (its tensors' names, dtypes or shapes)"
    return None


def file_problem(path: str) -> str | None:
    """Why the checkpoint file `path` cannot be loaded whole, in a few words, or `None`."""
    name = os.path.basename(path)
    if not os.path.isfile(path):
        return "not a file"
    if name.endswith(".safetensors"):
        return _safetensors_problem(path)
    if name.endswith((".pt", ".pth", ".bin")):
        return _torch_file_problem(path, load=name.startswith(_UNPICKLED_ON_RESUME))
    if name.endswith(".json"):
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except (ValueError, RecursionError) as e:  # RecursionError: nested too deep
            return f"unreadable: {type(e).__name__}"
        if ROLLOUT_MANIFEST.match(name):
            return _manifest_problem(path, data)
    return None


def checkpoint_problem(path: str, save_only_model: bool = False) -> str | None:
    """Why the folder `path` is not a complete checkpoint, in a few words naming the file, or `None`: its
    `trainer_state.json` parses (written last), its run record says the save finished, every file it names (without a
    record: the weights and, unless `save_only_model`, the optimizer, scheduler and RNG state) is there and whole."""
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
        return f"trainer_state.json has global_step {repr(step)[:40]}, not {f'its step {number[1]}' if number else 'a step'}"
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
        if not os.path.isdir(full):
            problem = file_problem(full)
        elif name.startswith("global_step"):  # DeepSpeed's files: their zip directory only (DeepSpeed unpickles them)
            pt_files = [n for n in sorted(os.listdir(full)) if n.endswith(".pt")]
            problems = [f"/{n} {p}" for n in pt_files if (p := _torch_file_problem(os.path.join(full, n), False))]
            problem = problems[0] if problems else None
        else:
            problem = None
        if problem:
            return f"{name}{'' if problem.startswith('/') else ' '}{problem}"
    return None


def newest_complete_checkpoint(output_dir: str, save_only_model: bool = False) -> tuple[str | None, list]:
    """(the complete checkpoint of `output_dir` with the highest step or `None`, [(name, why) of each incomplete one
    above it, highest first])."""
    names = os.listdir(output_dir) if os.path.isdir(output_dir) else []
    skipped = []
    for name in sorted(filter(CHECKPOINT_FOLDER.match, names), key=lambda n: -int(n.split("-")[1])):
        if (problem := checkpoint_problem(os.path.join(output_dir, name), save_only_model)) is None:
            return os.path.join(output_dir, name), skipped
        skipped.append((name, problem))
    return None, skipped


def resume_checkpoint(output_dir: str, save_only_model: bool = False, *, move_aside: bool = False) -> str | None:
    """[`newest_complete_checkpoint`]; those skipped above it are said in one warning line with why, and with
    `move_aside` (the folder's writer only) each is renamed `_damaged-checkpoint-N[-k]`. The resume itself is said by
    `train()`, once its checks have passed."""
    checkpoint, skipped = newest_complete_checkpoint(output_dir, save_only_model)
    words = []
    for name, problem in skipped:
        aside = ""
        if move_aside:
            target, k = DAMAGED_PREFIX + name, 1
            while os.path.lexists(os.path.join(output_dir, target)):
                k, target = k + 1, f"{DAMAGED_PREFIX}{name}-{k + 1}"
            os.replace(os.path.join(output_dir, name), os.path.join(output_dir, target))
            aside = f" and moved it aside to {target}"
        words.append(f"{name} ({problem}){aside}")
    if words and checkpoint:
        logger.warning(f"The newest complete checkpoint is {checkpoint}: skipped {', '.join(words)}.")
    elif words:
        logger.warning(f"No complete checkpoint to resume in {output_dir}: skipped {', '.join(words)}.")
    return checkpoint


def check_checkpoint(path: str, what: str, save_only_model: bool = False, fix: str = RESUME_FIX) -> None:
    """Refuse a checkpoint given by name (`resume_from_checkpoint`, `stapo-eval --model`) that is not complete.

    Raises:
        ValueError: `<what> <problem>. <fix>`: missing, a file, a run folder (naming its newest complete checkpoint), or
            not complete (naming the file and the damage).
    """
    if (problem := checkpoint_problem(path, save_only_model)) is None:
        return
    if problem == "not a folder":
        problem = "is a file" if os.path.exists(path) else "does not exist"
    elif newest := newest_complete_checkpoint(path)[0]:
        problem = f"is a run folder, not a checkpoint: give one of its checkpoints ({os.path.basename(newest)})"
    else:
        problem = f"is not a complete checkpoint ({problem})"
    raise ValueError(f"{what} {problem}. {fix}")


# -- what the run optimizes --------------------------------------------------------------------------------------------
def plain(value: Any) -> Any:
    """`value` as JSON data that compares equal across processes: enums by value, tuples as lists, sets sorted,
    objects with `to_dict` as dicts, any other object by its type's name (never a `repr` with an address)."""
    value = value.value if isinstance(value, enum.Enum) else value
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        return sorted(plain(v) for v in value)
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return plain(value.to_dict()) if hasattr(value, "to_dict") else type(value).__name__


def _local(path: Any) -> Any:
    return os.path.abspath(path) if isinstance(path, str) and os.path.exists(path) else path


def run_settings(args, *, trainer: str, model, reward_funcs, s2t=None, peft_config=None, train_dataset=None,
                 dtype=None) -> dict:  # fmt: skip
    """What a resume must keep, as plain data: the trainer class, the model and its `dtype` (`"float32"`), the rewards
    (a function by its name, a reward model by its id), the S2T values, the objective and optimizer fields of `args`
    ([`RESUME_FIELDS`]), the PEFT settings and the training data's `datasets` fingerprint."""
    from trl.trainer.utils import get_callable_name

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
    """Write `checkpoint/stapo_run.json`: `files` `None` while the save runs, then the files it wrote (a temporary file
    and a rename, never through a symbolic link)."""
    os.makedirs(checkpoint, exist_ok=True)
    record = {"format": 1, "files": files, "save_only_model": save_only_model, "settings": settings}
    path = os.path.join(checkpoint, RUN_RECORD)
    with open_run_file(path + ".tmp", "w") as f:
        json.dump(record, f, indent=2)
    os.replace(path + ".tmp", path)


def read_run_record(checkpoint: str) -> dict | None:
    """The record of `checkpoint`, `None` when it has none.

    Raises:
        ValueError: `stapo_run.json ...`: it does not parse (or is nested too deep), is of an unknown format, or lacks
            settings its format holds or the list of files.
    """
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
    """`"name old -> new"` for each field both hold with other values (one only one of them holds was added by another
    stapo_trl version: not compared); a dict's changed keys one by one (`peft.r 8 -> 16`)."""
    changes = []
    for name in [key for key in current if key in recorded]:
        old, new = recorded[name], current[name]
        if isinstance(old, dict) and isinstance(new, dict):
            changes += [f"{name}.{change}" for change in changed_settings(old, new)]
        elif old != new:
            changes.append(f"{name} {repr(old)[:120]} -> {repr(new)[:120]}")
    return changes


def check_run_settings(checkpoint: str, settings: dict) -> None:
    """Refuse to resume `checkpoint` with other `settings` than it was trained with; a checkpoint without a record
    (saved before stapo_trl wrote one) resumes with one warning.

    Raises:
        ValueError: one line naming each changed field with its old and new value.
    """
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
