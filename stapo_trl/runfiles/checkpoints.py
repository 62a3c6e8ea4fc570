"""Which checkpoint a run resumes: the newest one a rerun can load whole, read without unpickling anything unsafely.

transformers 5.25 writes a checkpoint in place, `trainer_state.json` last (no temporary folder, no rename); its
`get_last_checkpoint` takes the highest-numbered `checkpoint-N`, and the rotation of `save_total_limit` always keeps
the newest, whatever they hold. A save cut short (a kill, a full disk), a copy half synced or a file overwritten left a
folder that every rerun failed on, or resumed with a fresh optimizer (transformers loads `optimizer.pt` only when
`scheduler.pt` is there too).

- [`checkpoint_problem`]: complete means every file the save wrote (named by its run record,
  [`~stapo_trl.runfiles.run_record`]; by rule for a checkpoint saved before it had one) is there and whole: a
  safetensors file's header and length, a torch file's zip directory, and what transformers unpickles on resume
  (`optimizer.pt`, `scheduler.pt`, `scaler.pt`, `rng_state*.pth`, `pytorch_model*.bin`, all with
  `torch.load(weights_only=True)`) loaded the same way, lazily (`mmap`): a file that a safe load refuses is damaged.
- [`resume_checkpoint`]: the newest complete one, said in one line with those skipped and why; the skipped ones are
  moved aside (`_damaged-checkpoint-N`), out of reach of rotation and of `get_last_checkpoint`.
"""

from __future__ import annotations

import json
import logging
import os
import zipfile

from .run_folder import CHECKPOINT_FOLDER
from .run_record import RUN_RECORD, read_run_record


logger = logging.getLogger(__name__)

RESUME_FIX = (
    "Give a complete checkpoint folder (<output_dir>/checkpoint-<step>); a run resumes from the newest complete "
    "checkpoint in its output_dir by itself."
)
DAMAGED_PREFIX = "_damaged-"  # "_*": not pushed to the Hub; not "checkpoint-*": neither rotated nor resumed
# What `Trainer._save_checkpoint` writes before trainer_state.json, by name prefix (full, sharded, adapter, FSDP and
# DeepSpeed layouts); `save_only_model` writes the weights only.
_REQUIRED = {
    "model weights": ("model", "pytorch_model", "adapter_model", "global_step"),
    "optimizer state (optimizer.pt)": ("optimizer", "global_step"),
    "RNG state (rng_state.pth)": ("rng_state",),
}
_UNPICKLED_ON_RESUME = ("optimizer", "scheduler", "scaler", "rng_state", "pytorch_model")  # by transformers


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
    if size != 8 + length + end:
        expected = 8 + length + end
        return f"cut short: {size} of {expected} bytes" if size < expected else "damaged: bytes past its tensors"
    return None


def _torch_file_problem(path: str, load: bool) -> str | None:
    """A torch file: its zip directory, then (`load`) a safe load of it, its tensors mapped, not read."""
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


def file_problem(path: str) -> str | None:
    """Why the file `path` of a checkpoint cannot be loaded whole, in a few words, or `None` (a kind not checked:
    `None`)."""
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
                json.load(f)
        except (ValueError, UnicodeDecodeError) as e:
            return f"unreadable: {type(e).__name__}"
    return None


def checkpoint_problem(path: str, save_only_model: bool = False) -> str | None:
    """Why the folder `path` is not a complete checkpoint, in a few words naming the file, or `None`.

    Complete: `trainer_state.json` parses (transformers writes it last), the run record says the save finished and
    names files that are all there ([`~stapo_trl.runfiles.run_record`]; without a record, the weights and, unless
    `save_only_model`, `optimizer.pt`, `scheduler.pt` and the RNG state), and every file is whole ([`file_problem`]).
    A file transformers unpickles on resume is loaded here with `weights_only=True`: a file that would run code is
    damaged, never loaded otherwise.

    Args:
        path (`str`): the checkpoint folder.
        save_only_model (`bool`, *optional*, defaults to `False`): the run saved its weights only (a record says so
            itself).
    """
    names = sorted(os.listdir(path)) if os.path.isdir(path) else None
    if not names:
        return "not a folder" if names is None else "empty"
    try:
        with open(os.path.join(path, "trainer_state.json"), encoding="utf-8") as f:
            int(json.load(f)["global_step"])
    except FileNotFoundError:
        return "no trainer_state.json: its save did not finish"
    except (OSError, ValueError, KeyError, TypeError) as e:  # cut short: JSONDecodeError
        return f"trainer_state.json unreadable ({type(e).__name__}): its save did not finish"
    try:
        record = read_run_record(path)
    except (OSError, ValueError) as e:
        return f"{RUN_RECORD} unreadable: {type(e).__name__}"
    if record is not None:
        if record.get("files") is None:
            return f"{RUN_RECORD} says its save did not finish"
        save_only_model = bool(record.get("save_only_model", save_only_model))
    for what, prefixes in list(_REQUIRED.items())[: 1 if save_only_model else None]:
        if not any(name.startswith(prefixes) for name in names):
            return f"no {what}"
    if not save_only_model and {"optimizer.pt", "optimizer.bin"} & set(names) and "scheduler.pt" not in names:
        return "no scheduler.pt: without it transformers resumes with a fresh optimizer"
    missing = [name for name in (record or {}).get("files", []) if name not in names]
    if missing:
        return f"no {missing[0]}, which its save wrote"
    for name in names:
        problem = file_problem(os.path.join(path, name)) if not os.path.isdir(os.path.join(path, name)) else None
        if problem is None and name.startswith("global_step") and os.path.isdir(os.path.join(path, name)):
            problem = next(  # DeepSpeed's own files: their zip directory only (DeepSpeed unpickles them itself)
                (
                    f"{inner} {p}"
                    for inner in sorted(os.listdir(os.path.join(path, name)))
                    if inner.endswith(".pt") and (p := _torch_file_problem(os.path.join(path, name, inner), False))
                ),
                None,
            )
            if problem:
                return f"{name}/{problem}"
        if problem:
            return f"{name} {problem}"
    return None


def newest_complete_checkpoint(
    output_dir: str, save_only_model: bool = False
) -> tuple[str | None, list[tuple[str, str]]]:
    """(the complete checkpoint of `output_dir` with the highest step, or `None`; (name, why) of each incomplete one
    above it, highest first): what a resume takes ([`checkpoint_problem`])."""
    names = os.listdir(output_dir) if os.path.isdir(output_dir) else []
    skipped = []
    for name in sorted(filter(CHECKPOINT_FOLDER.match, names), key=lambda n: -int(n.split("-")[1])):
        problem = checkpoint_problem(os.path.join(output_dir, name), save_only_model)
        if problem is None:
            return os.path.join(output_dir, name), skipped
        skipped.append((name, problem))
    return None, skipped


def _move_aside(output_dir: str, name: str) -> str:
    """Rename `output_dir/name` to the first free `_damaged-<name>[-k]`; return the new name."""
    target, k = DAMAGED_PREFIX + name, 1
    while os.path.lexists(os.path.join(output_dir, target)):
        k += 1
        target = f"{DAMAGED_PREFIX}{name}-{k}"
    os.replace(os.path.join(output_dir, name), os.path.join(output_dir, target))
    return target


def resume_checkpoint(output_dir: str, save_only_model: bool = False, *, move_aside: bool = False) -> str | None:
    """[`newest_complete_checkpoint`], said in one warning line with the checkpoints skipped and why; with `move_aside`
    (the run folder's one writer only) each skipped one is renamed `_damaged-checkpoint-N`, so that the rotation of
    `save_total_limit` (which keeps the newest) and `get_last_checkpoint` (the highest number) do not take it."""
    checkpoint, skipped = newest_complete_checkpoint(output_dir, save_only_model)
    if not checkpoint and not skipped:
        return None
    words = []
    for name, problem in skipped:
        aside = f" and moved it aside to {_move_aside(output_dir, name)}" if move_aside else ""
        words.append(f"{name} ({problem}){aside}")
    found = f"Resuming training from {checkpoint}, the newest complete checkpoint" if checkpoint else output_dir
    skipped_words = f"; skipped {', '.join(words)}" if words else ""
    logger.warning(found + skipped_words + ("." if checkpoint else ": no complete checkpoint to resume."))
    return checkpoint


def check_checkpoint(path: str, what: str, save_only_model: bool = False, fix: str = RESUME_FIX) -> None:
    """Refuse a checkpoint given by name (`resume_from_checkpoint`, `stapo-eval --model`) that is not complete.

    Args:
        path (`str`): the folder.
        what (`str`): how the user gave it, to start the message (`"resume_from_checkpoint='out/checkpoint-4'"`).
        save_only_model (`bool`, *optional*): only the weights are needed.
        fix (`str`, *optional*): the end of the message, what to do instead.

    Raises:
        ValueError: one line: the path is missing, a file, a run folder (naming its newest complete checkpoint), or a
            checkpoint that is not complete (naming the file and the damage).
    """
    problem = checkpoint_problem(path, save_only_model)
    if problem is None:
        return
    if problem == "not a folder":
        problem = "is a file" if os.path.exists(path) else "does not exist"
    elif newest := newest_complete_checkpoint(path)[0]:
        problem = f"is a run folder, not a checkpoint: give one of its checkpoints ({os.path.basename(newest)})"
    else:
        problem = f"is not a complete checkpoint ({problem})"
    raise ValueError(f"{what} {problem}. {fix}")
