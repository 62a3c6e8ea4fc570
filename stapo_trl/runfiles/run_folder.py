"""The run folder (`output_dir`) as kills, full disks and a second writer leave it.

- [`checkpoint_problem`], [`newest_complete_checkpoint`]: which checkpoint a resume may take. transformers 5.24's
  `Trainer._save_checkpoint` writes a checkpoint's files in place, `trainer_state.json` last (no temporary folder, no
  rename), and `get_last_checkpoint` takes the highest-numbered `checkpoint-N` folder whatever it holds: a kill or a
  full disk during a save left a folder every resume failed on. A checkpoint is complete when its `trainer_state.json`
  parses and the weights, optimizer and RNG state saved before it are there.
- [`lock_run_folder`]: one writer per run folder, a `filelock.FileLock` on `output_dir/_writer.lock` (the OS releases
  it when its process dies, a kill included), taken by the processes that write the folder (`args.should_save`).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import socket
import sys
import time

from filelock import FileLock, Timeout


logger = logging.getLogger(__name__)

CHECKPOINT_FOLDER = re.compile(r"^checkpoint-(\d+)$")  # transformers' `PREFIX_CHECKPOINT_DIR`-<global_step>
# What a checkpoint holds before its trainer_state.json (`Trainer._save_checkpoint`), by name prefix: weights (full,
# sharded, adapter, FSDP, DeepSpeed), optimizer state (`optimizer.pt`, FSDP's `optimizer_0/`, DeepSpeed's
# `global_step<N>/`) and RNG state (`rng_state.pth`, `rng_state_<rank>.pth`). `save_only_model` saves the first only.
_SAVED_BEFORE_STATE = {
    "model weights": ("model", "pytorch_model", "adapter_model", "global_step"),
    "optimizer state (optimizer.pt)": ("optimizer", "global_step"),
    "RNG state (rng_state.pth)": ("rng_state",),
}


def checkpoint_problem(path: str, save_only_model: bool = False) -> str | None:
    """Why the folder `path` is not a complete checkpoint (a few words: "no trainer_state.json"), or `None`.

    Args:
        path (`str`): a `checkpoint-<step>` folder.
        save_only_model (`bool`, *optional*, defaults to `False`): the run saves weights only (`save_only_model`), so
            no optimizer or RNG state is expected.
    """
    if not os.path.isdir(path):
        return "not a folder"
    names = os.listdir(path)
    if not names:
        return "empty"
    if "trainer_state.json" not in names:
        return "no trainer_state.json: its save did not finish"
    try:
        with open(os.path.join(path, "trainer_state.json"), encoding="utf-8") as f:
            int(json.load(f)["global_step"])
    except (OSError, ValueError, KeyError, TypeError) as e:  # cut short (JSONDecodeError), not a trainer state
        return f"trainer_state.json unreadable ({type(e).__name__}): its save did not finish"
    for what, prefixes in list(_SAVED_BEFORE_STATE.items())[: 1 if save_only_model else None]:
        if not any(name.startswith(prefixes) for name in names):
            return f"no {what}"
    return None


def newest_complete_checkpoint(output_dir: str, save_only_model: bool = False) -> tuple[str | None, list[str]]:
    """(the complete `checkpoint-<step>` folder of `output_dir` with the highest step or `None`, a "checkpoint-N (why)"
    for each incomplete one above it, highest first): the checkpoint a resume takes ([`checkpoint_problem`])."""
    steps = {}
    if os.path.isdir(output_dir):
        steps = {name: int(m[1]) for name in os.listdir(output_dir) if (m := CHECKPOINT_FOLDER.match(name))}
    skipped = []
    for name in sorted(steps, key=steps.__getitem__, reverse=True):
        problem = checkpoint_problem(os.path.join(output_dir, name), save_only_model)
        if problem is None:
            return os.path.join(output_dir, name), skipped
        skipped.append(f"{name} ({problem})")
    return None, skipped


def resume_checkpoint(output_dir: str, save_only_model: bool = False) -> str | None:
    """[`newest_complete_checkpoint`], said in one warning line: the checkpoint resumed and those skipped, and why."""
    checkpoint, skipped = newest_complete_checkpoint(output_dir, save_only_model)
    skipped_text = f"; skipped {', '.join(skipped)}" if skipped else ""
    if checkpoint is not None:
        logger.warning(f"Resuming training from {checkpoint}, the newest complete checkpoint{skipped_text}.")
    elif skipped:
        logger.warning(f"No complete checkpoint in {output_dir} to resume from{skipped_text}.")
    return checkpoint


LOCK_FILENAME, OWNER_FILENAME = "_writer.lock", "_writer.json"  # "_*": not uploaded by `Trainer.push_to_hub`
_LOCKS: dict[str, FileLock] = {}  # one lock object per folder in this process: taking it again nests


def lock_run_folder(args, acquire: bool = True) -> None:
    """Take (or, `acquire=False`, give back once) this process's hold on `args.output_dir` as its one writer.

    Only processes with `args.should_save` (the main process; each node's first with `save_on_each_node`) take it:
    the other ranks of a launch write no run file, and a second launch's other ranks end with its main process (the
    launcher stops them). Holds nest within a process (`stapo-train` holds the folder for the whole run, its trainer's
    `train()` again). A killed holder leaves `_writer.lock` behind but no hold: the next run takes it.

    Raises:
        ValueError: one line, when another process holds the folder (naming the folder, that process's pid, host,
            command and start time from `_writer.json`), or when `output_dir` cannot be created or written (a
            read-only file system, a file in the way).
    """
    if not args.should_save:
        return
    folder = os.path.abspath(args.output_dir)
    lock = _LOCKS.setdefault(folder, FileLock(os.path.join(folder, LOCK_FILENAME)))
    if not acquire:
        lock.release()
        return
    held = lock.is_locked
    try:
        os.makedirs(folder, exist_ok=True)
        lock.acquire(timeout=0)
        if not held:  # who writes the folder, for a second writer's message (the lock file's contents are not kept)
            owner = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S")}
            with open(os.path.join(folder, OWNER_FILENAME), "w", encoding="utf-8") as f:
                json.dump(owner | {"command": shlex.join(sys.argv)}, f)
    except Timeout:
        try:
            with open(os.path.join(folder, OWNER_FILENAME), encoding="utf-8") as f:
                owner = json.load(f)
            who = f"pid {owner['pid']} on {owner['host']}, since {owner['since']}: {owner['command']}"
        except (OSError, ValueError, KeyError, TypeError):
            who = "its pid not yet recorded"
        raise ValueError(
            f"output_dir={args.output_dir!r} is in use by another run ({who}). Two runs in one folder mix their "
            "metrics, checkpoints and model: wait for that run to end, or give another output_dir."
        ) from None
    except OSError as e:
        raise ValueError(
            f"output_dir={args.output_dir!r} cannot be written ({e.strerror or e}): give a folder this process can "
            "create files in."
        ) from None
