"""The exit status of every command ([`EXIT_STATUS_HELP`]: 2, argparse's, for an input error found before anything
runs; 1 for a run that failed; 128 + the signal's number), and the one-line `PROG: error: ...` that ends a command on
bad input, on every process under `accelerate launch` alike."""

from __future__ import annotations

import argparse
import contextlib
import difflib
import errno
import os
import shutil
import sys
from collections.abc import Iterator
from typing import NoReturn

from ..integrations.process_group import destroy_process_group_if_any
from ..run_folder.checkpoints import newest_complete_checkpoint


EXIT_INPUT_ERROR = 2

EXIT_STATUS_HELP = (
    "Exit status: 0 on success; 2 on an input error (an argument, recipe value, file or folder that cannot work: "
    "one 'PROG: error: ...' line, before anything runs); 1 when a run fails after it started; 130 on Ctrl-C, 143 on "
    "SIGTERM, 138 on SIGUSR1 (stapo-train saves a checkpoint first)."
)


class InputError(SystemExit):
    """End a command with status `code` (2: an input error; 1: a failed run told in one line) and the line
    `PROG: error: MESSAGE` ([`report_input_errors`] prints it). A `SystemExit`: it passes `except Exception`."""

    def __init__(self, prog: str, message: str, code: int = EXIT_INPUT_ERROR):
        self.message = f"{prog}: error: {message}"
        super().__init__(self.message)
        self.code = code


def print_line(message: str) -> None:
    """Write `message` and its newline to stderr in one `write`, so that the lines of processes sharing a pipe under
    `accelerate launch` cannot interleave (`print` writes the newline apart)."""
    sys.stderr.write(message + "\n")
    sys.stderr.flush()


@contextlib.contextmanager
def report_input_errors() -> Iterator[None]:
    """Print an [`InputError`] raised in the block as its line on stderr, then let it end the command, with no process
    group left (gloo's threads can abort the exit: [`~stapo_trl.integrations.process_group`])."""
    try:
        yield
    except InputError as e:
        print_line(e.message)
        destroy_process_group_if_any()
        raise


@contextlib.contextmanager
def full_disk_in_one_line(prog: str, output_dir: str) -> Iterator[None]:
    """Turn a failure on a full disk into one [`InputError`] line (status 1) naming `output_dir` and the checkpoint a
    rerun resumes. Full: ENOSPC / EDQUOT (an `OSError`'s or safetensors' "os error 28"), or under 1 MiB free
    (`torch.save` names no cause)."""
    try:
        yield
    except Exception as e:
        if getattr(e, "errno", None) not in (errno.ENOSPC, errno.EDQUOT) and "os error 28" not in str(e):
            if not os.path.isdir(output_dir) or shutil.disk_usage(output_dir).free >= 2**20:
                raise
        checkpoint = newest_complete_checkpoint(output_dir)[0] or "the start (no complete checkpoint)"
        first_line = (str(e).splitlines() or [""])[0][:200]
        raise InputError(
            prog,
            f"no space left on the disk of output_dir={output_dir!r} ({type(e).__name__}: {first_line}). Free some "
            f"space, then rerun the same command: it resumes from {checkpoint}.",
            code=1,
        ) from e


class OneLineErrorParser(argparse.ArgumentParser):
    """An argument parser whose errors are an [`InputError`] (one line, no usage block), with the closest flags for an
    unknown one and a pointer to `--help`."""

    def error(self, message: str) -> NoReturn:
        if message.startswith("unrecognized arguments:"):
            flags = [option for action in self._actions for option in action.option_strings]
            for word in message.split(":", 1)[1].split():
                close = difflib.get_close_matches(word.split("=")[0], flags, n=1, cutoff=0.6)
                if word.startswith("-") and close:
                    message += f"; did you mean {' or '.join(close)} for {word}?"
        raise InputError(self.prog, f"{message} (see `{self.prog} --help`)")
