"""The run folder (`output_dir`) as kills, a second writer and a folder from elsewhere leave it.

- [`lock_run_folder`]: one writer per folder, a `filelock.FileLock` that the OS releases when its process dies.
- [`open_run_file`]: the files stapo_trl writes there are never opened through a symbolic link, and a run does not
  start in a folder whose top level or checkpoints hold one ([`check_no_links`]): a link planted in a folder copied from
  elsewhere would have a run overwrite its target, anywhere the user can write. A symlinked `output_dir` itself is
  fine (clusters link a scratch disk).

Which checkpoint a run resumes is [`~stapo_trl.runfiles.checkpoints`].
"""

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
from typing import IO

from filelock import FileLock, Timeout


logger = logging.getLogger(__name__)

CHECKPOINT_FOLDER = re.compile(r"^checkpoint-(\d+)$")  # transformers' `PREFIX_CHECKPOINT_DIR`-<global_step>


def open_run_file(path: str | os.PathLike, mode: str = "w") -> IO:
    """`open(path, mode)` for a file of the run folder (`"w"`, `"a"`, `"wb"`, `"ab"`; text in UTF-8), refusing a
    symbolic link in its place (`O_NOFOLLOW`) instead of writing its target.

    Raises:
        ValueError: `path` is a symbolic link (one line naming it).
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | (os.O_APPEND if "a" in mode else os.O_TRUNC)
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise ValueError(_link_message(os.fspath(path))) from None
        raise
    return os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"}))


def _link_message(path: str) -> str:
    return (
        f"{path} is a symbolic link (to {os.readlink(path)!r}): a run writes its files in its folder, never through a "
        "link (it would overwrite the link's target). Remove the link, or give another output_dir."
    )


def check_no_links(output_dir: str) -> None:
    """Refuse a folder whose top level or `checkpoint-N` folders hold a symbolic link: a run, or transformers' saves
    for it, would write through it. `output_dir` itself may be a link.

    Raises:
        ValueError: one line naming the first link found.
    """
    if not os.path.isdir(output_dir):
        return
    for name in sorted(os.listdir(output_dir)):
        path = os.path.join(output_dir, name)
        if os.path.islink(path):
            raise ValueError(_link_message(path))
        if CHECKPOINT_FOLDER.match(name) and os.path.isdir(path):
            for inner in sorted(os.listdir(path)):
                if os.path.islink(os.path.join(path, inner)):
                    raise ValueError(_link_message(os.path.join(path, inner)))


def check_output_dir_named(args) -> None:
    """Refuse an empty `output_dir` (`''`: the current folder would become the run folder).

    Raises:
        ValueError: one line naming the field.
    """
    if not str(args.output_dir or "").strip():
        raise ValueError(empty_output_dir_message(args.output_dir))


def empty_output_dir_message(output_dir) -> str:
    return (
        f"output_dir={output_dir!r} is empty: give the folder the run writes its checkpoints, model and files into "
        "(e.g. outputs/my-run)."
    )


_LOCKS: dict[str, FileLock] = {}  # one per folder in this process, so that holds nest


def lock_run_folder(args, acquire: bool = True) -> None:
    """Take (`acquire=False`: give back) this process's hold on `args.output_dir` as its one writer: a `FileLock` on
    `_writer.lock`, the holder's pid, host, start and command in `_writer.txt` ("_*": not pushed to the Hub).

    Only the processes that write the folder (`args.should_save`) take it; another launch's other ranks end with its
    main process (the launcher stops them). Holds nest in a process (`stapo-train`, then its trainer's `train()`).

    Raises:
        ValueError: one line: another process holds the folder (naming it), `output_dir` is empty, cannot be created or
            written (a read-only file system, a file in the way), or holds a symbolic link ([`check_no_links`]).
    """
    if not args.should_save:
        return
    folder = os.path.abspath(args.output_dir)
    lock = _LOCKS.setdefault(folder, FileLock(os.path.join(folder, "_writer.lock")))
    if not acquire:
        return lock.release()
    check_output_dir_named(args)
    check_no_links(folder)
    owner, held = os.path.join(folder, "_writer.txt"), lock.is_locked
    try:
        os.makedirs(folder, exist_ok=True)
        lock.acquire(timeout=0)
        if not held:  # read by a contender (filelock 3 empties the lock file itself when it opens it)
            since = time.strftime("%Y-%m-%d %H:%M:%S")
            with open_run_file(owner) as f:
                f.write(f"pid {os.getpid()} on {socket.gethostname()}, since {since}: {shlex.join(sys.argv)}")
    except Timeout:
        holder = "starting"
        if os.path.isfile(owner) and not os.path.islink(owner):
            with open(owner, encoding="utf-8", errors="replace") as f:
                holder = f.read(2000)
        raise ValueError(
            f"output_dir={args.output_dir!r} is in use by another run ({holder}). Two runs in one folder mix their "
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
    check_output_dir_named(args)
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
