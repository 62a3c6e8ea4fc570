"""The run folder (`output_dir`) as kills, full disks and a second writer leave it.

- [`newest_complete_checkpoint`]: transformers 5.24's `Trainer._save_checkpoint` writes a checkpoint in place, its
  `trainer_state.json` last (no temporary folder, no rename), and `get_last_checkpoint` takes the highest-numbered
  `checkpoint-N` whatever it holds: a save cut short left a folder that every resume failed on.
- [`lock_run_folder`]: one writer per folder, a `filelock.FileLock` that the OS releases when its process dies.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import socket
import sys
import tempfile
import time
from pathlib import Path

from filelock import FileLock, Timeout


logger = logging.getLogger(__name__)

CHECKPOINT_FOLDER = re.compile(r"^checkpoint-(\d+)$")  # transformers' `PREFIX_CHECKPOINT_DIR`-<global_step>
# What `Trainer._save_checkpoint` writes before trainer_state.json, by name prefix (full, sharded, adapter, FSDP and
# DeepSpeed layouts); `save_only_model` writes the weights only.
_SAVED_BEFORE_STATE = {
    "model weights": ("model", "pytorch_model", "adapter_model", "global_step"),
    "optimizer state (optimizer.pt)": ("optimizer", "global_step"),
    "RNG state (rng_state.pth)": ("rng_state",),
}


def checkpoint_problem(path: str, save_only_model: bool = False) -> str | None:
    """Why the folder `path` is not a complete checkpoint, in a few words, or `None`: complete means its
    `trainer_state.json` parses and what is saved before it is there (the optimizer and RNG state unless
    `save_only_model`)."""
    names = os.listdir(path) if os.path.isdir(path) else None
    if not names:
        return "not a folder" if names is None else "empty"
    try:
        with open(os.path.join(path, "trainer_state.json"), encoding="utf-8") as f:
            int(json.load(f)["global_step"])
    except FileNotFoundError:
        return "no trainer_state.json: its save did not finish"
    except (OSError, ValueError, KeyError, TypeError) as e:  # cut short: JSONDecodeError
        return f"trainer_state.json unreadable ({type(e).__name__}): its save did not finish"
    for what, prefixes in list(_SAVED_BEFORE_STATE.items())[: 1 if save_only_model else None]:
        if not any(name.startswith(prefixes) for name in names):
            return f"no {what}"
    return None


def newest_complete_checkpoint(output_dir: str, save_only_model: bool = False) -> tuple[str | None, list[str]]:
    """(the complete checkpoint of `output_dir` with the highest step, or `None`; "checkpoint-N (why)" for each
    incomplete one above it, highest first): what a resume takes ([`checkpoint_problem`])."""
    names = os.listdir(output_dir) if os.path.isdir(output_dir) else []
    skipped = []
    for name in sorted(filter(CHECKPOINT_FOLDER.match, names), key=lambda n: -int(n.split("-")[1])):
        problem = checkpoint_problem(os.path.join(output_dir, name), save_only_model)
        if problem is None:
            return os.path.join(output_dir, name), skipped
        skipped.append(f"{name} ({problem})")
    return None, skipped


def resume_checkpoint(output_dir: str, save_only_model: bool = False) -> str | None:
    """[`newest_complete_checkpoint`], said in one warning line with the checkpoints skipped and why."""
    checkpoint, skipped = newest_complete_checkpoint(output_dir, save_only_model)
    skipped = f"; skipped {', '.join(skipped)}" if skipped else ""
    if checkpoint or skipped:
        found = f"Resuming training from {checkpoint}, the newest complete checkpoint" if checkpoint else output_dir
        logger.warning(found + (skipped or "") + ("." if checkpoint else ": no complete checkpoint to resume."))
    return checkpoint


_LOCKS: dict[str, FileLock] = {}  # one per folder in this process, so that holds nest


def lock_run_folder(args, acquire: bool = True) -> None:
    """Take (`acquire=False`: give back) this process's hold on `args.output_dir` as its one writer: a `FileLock` on
    `_writer.lock`, the holder's pid, host, start and command in `_writer.txt` ("_*": not pushed to the Hub).

    Only the processes that write the folder (`args.should_save`) take it; another launch's other ranks end with its
    main process (the launcher stops them). Holds nest in a process (`stapo-train`, then its trainer's `train()`).

    Raises:
        ValueError: one line: another process holds the folder (naming it), or `output_dir` cannot be created or
            written (a read-only file system, a file in the way).
    """
    if not args.should_save:
        return
    folder = os.path.abspath(args.output_dir)
    lock = _LOCKS.setdefault(folder, FileLock(os.path.join(folder, "_writer.lock")))
    if not acquire:
        return lock.release()
    owner, held = Path(folder, "_writer.txt"), lock.is_locked
    try:
        os.makedirs(folder, exist_ok=True)
        lock.acquire(timeout=0)
        if not held:  # read by a contender (filelock 3 empties the lock file itself when it opens it)
            since = time.strftime("%Y-%m-%d %H:%M:%S")
            owner.write_text(f"pid {os.getpid()} on {socket.gethostname()}, since {since}: {shlex.join(sys.argv)}")
    except Timeout:
        owner = owner.read_text()[:2000] if owner.is_file() else "starting"
        raise ValueError(
            f"output_dir={args.output_dir!r} is in use by another run ({owner}). Two runs in one folder mix their "
            "metrics, checkpoints and model: wait for that run to end, or give another output_dir."
        ) from None
    except OSError as e:
        raise _unwritable(args, e) from None


def check_run_folder(args) -> None:
    """Refuse now, at construction, what [`lock_run_folder`] would refuse at `train()`; a folder that does not exist yet
    is not created (a trainer refused later, on its data, leaves nothing behind): its nearest existing parent must take
    a file.

    Raises:
        ValueError: as [`lock_run_folder`].
    """
    folder = os.path.abspath(args.output_dir)
    if not args.should_save or os.path.isdir(folder):
        lock_run_folder(args)
        return lock_run_folder(args, acquire=False)
    parent = os.path.dirname(folder)
    while not os.path.lexists(parent):
        parent = os.path.dirname(parent)
    try:
        tempfile.TemporaryFile(dir=parent).close()  # "Not a directory" below a file, "Read-only file system"
    except OSError as e:
        raise _unwritable(args, e) from None


def _unwritable(args, error: OSError) -> ValueError:
    return ValueError(
        f"output_dir={args.output_dir!r} cannot be written ({error.strerror or error}): give a folder this process can "
        "create files in."
    )
