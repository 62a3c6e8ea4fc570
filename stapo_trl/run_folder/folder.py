"""The run folder: the `output_dir` check, no write through a symbolic link, the one atomic writer, one writer per
folder."""

from __future__ import annotations

import errno
import logging
import os
import re
import shlex
import socket
import sys
import tempfile
import time
import warnings
from typing import IO, Any


logger = logging.getLogger(__name__)

CHECKPOINT_FOLDER = re.compile(r"^checkpoint-(\d+)$")  # transformers' `PREFIX_CHECKPOINT_DIR`-<global_step>
RUN_RECORD = "stapo_run.json"
DAMAGED_PREFIX = "_damaged-"  # "_*": not pushed to the Hub; not "checkpoint-*": neither rotated nor resumed
# Files a scheduler or file system puts in a folder, and a run's own before its first checkpoint: not the user's.
NOT_USER_FILES = re.compile(r"^(\.nfs.*|slurm-.*\.out|_writer\.(lock|txt)|(metrics|spurious_tokens)(\.\d+)?\.jsonl)$")
_HOLDS: dict[str, list] = {}  # folder -> [its FileLock (None: cannot lock), its holders: None (a command), trainers]


class LinkError(ValueError):
    """A symbolic link where a run writes a file, in one line naming it and its target."""

    def __init__(self, path: str):
        super().__init__(
            f"{path} is a symbolic link (to {os.readlink(path)!r}): a run writes its files in its folder, never "
            "through a link (it would overwrite the link's target). Remove the link, or give another output_dir."
        )


def open_run_file(path: str | os.PathLike, mode: str = "w") -> IO:
    """`open(path, mode)` (`"w"`, `"a"`, `"wb"`, `"ab"`; text in UTF-8) that raises [`LinkError`] (a `ValueError`)
    for a symbolic link at `path` instead of writing its target."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | (os.O_APPEND if "a" in mode else os.O_TRUNC)
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise LinkError(os.fspath(path)) from None
        raise
    return os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"}))


def write_atomic(path: str | os.PathLike, data: str | bytes) -> None:
    """Write `data` to `path` through a synced temporary file beside it and a rename: a kill leaves the old file or
    the new one; a symbolic link at `path` is replaced, its target never written."""
    folder, name = os.path.split(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f".{name}.{os.getpid()}.tmp")
    with open_run_file(tmp, "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def refuse_links(output_dir: str) -> None:
    """Raise [`LinkError`] for a symbolic link at the top of `output_dir` or in its `checkpoint-N` folders
    (`output_dir` itself may be one: clusters link a scratch disk)."""
    folder = os.path.abspath(output_dir)
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        path = os.path.join(folder, name)
        inner = sorted(os.listdir(path)) if CHECKPOINT_FOLDER.match(name) and os.path.isdir(path) else []
        if link := next((p for p in [path, *(os.path.join(path, n) for n in inner)] if os.path.islink(p)), None):
            raise LinkError(link)


def check_output_dir(output_dir: str, refuse_user_files: bool = False) -> None:
    """Refuse, creating nothing, an `output_dir` that is empty, a file, not writable or holds a symbolic link. A folder
    of the user's own files (no `trainer_state.json` or run record at its top or in a checkpoint; files other than
    `NOT_USER_FILES`) is refused with `refuse_user_files` (`stapo-train`), else warned about, as GRPOTrainer writes it.

    Raises:
        ValueError: one line naming `output_dir` (or the link) and the fix.
    """
    if not str(output_dir or "").strip():
        raise ValueError(f"output_dir={output_dir!r} is empty: give the folder the run writes its checkpoints, model "
                         "and files into (e.g. outputs/my-run).")  # fmt: skip
    folder = existing = os.path.abspath(os.path.expanduser(output_dir))
    if os.path.isfile(folder):
        raise ValueError(f"output_dir={output_dir!r} is a file: give a folder (it is created if missing).")
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    try:
        tempfile.TemporaryFile(dir=existing).close()  # "Not a directory" below a file, "Read-only file system"
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
    """`argv` (default `sys.argv`) as one shell line, the value of a `--*token`, `--*secret`, `--*password` or
    `--*key` flag and any word like a Hub token (`hf_...`) written `REDACTED`."""
    words = list(sys.argv if argv is None else argv)
    for i, word in enumerate(words):
        name, eq, _ = word.partition("=")
        if re.fullmatch(r"--?[\w-]*(token|secret|password|key)", name, re.IGNORECASE):
            words[i : i + 1 + (not eq)] = [f"{name}=REDACTED"] if eq else [word, "REDACTED"][: len(words) - i]
        words[i] = re.sub(r"hf_[A-Za-z0-9]{8,}", "hf_REDACTED", words[i])
    return shlex.join(words)


def hold_run_folder(output_dir: str, acquire: bool = True, *, trainer: Any = None) -> None:
    """Take (`acquire=False`: give back) `output_dir` as its one writer: a `FileLock` on `_writer.lock` (released by
    the OS when the process dies), the holder's pid, host and [`command_line`] in `_writer.txt`. Holds nest within a
    process: a command's (`trainer=None`), then one trainer's; another trainer is refused. A file system that cannot
    lock is warned about.

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
    if not holders:
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
            logger.warning(f"output_dir={output_dir!r} is on a file system that cannot lock files ({e}): this run "
                           "writes it without the lock, so a second run writing the same folder would not be "
                           "stopped.")  # fmt: skip
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
        raise ValueError(f"output_dir={output_dir!r} is in use by another run ({holder}). Two runs in one folder mix "
                         "their metrics, checkpoints and model: wait for that run to end, or give another "
                         "output_dir.")  # fmt: skip
    _HOLDS[folder] = [lock, [*holders, trainer]]
