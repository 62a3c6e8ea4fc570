"""The exit status of every command, and the one-line error that ends a command on bad input.

One convention for `stapo-train` (also its `--dry-run`, `compare`, and `python -m stapo_trl.cli.train` on every
process under `accelerate launch`), `stapo-eval` and `stapo-plot`, argparse's own:

- 0: done.
- 2 ([`EXIT_INPUT_ERROR`]): an input error, found before anything runs: an argument, a recipe key or value, a model,
  dataset or results file, or a run folder that cannot work. One `PROG: error: ...` line on stderr that names what
  the user wrote, the allowed values, and the fix.
- 1: a failure during a run (training, evaluation, drawing), with its traceback (Python's status for an uncaught
  exception); a full disk ends a `stapo-train` run with one line instead ([`full_disk_in_one_line`]).
- 130, 143, 138 (128 + the signal's number): Ctrl-C, SIGTERM, SIGUSR1 (`stapo-train` saves a checkpoint first).
"""

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
from ..runfiles.checkpoints import newest_complete_checkpoint


EXIT_INPUT_ERROR = 2  # argparse's status for a usage error

EXIT_STATUS_HELP = (
    "Exit status: 0 on success; 2 on an input error (an argument, recipe value, file or folder that cannot work: "
    "one 'PROG: error: ...' line, before anything runs); 1 when a run fails after it started; 130 on Ctrl-C, 143 on "
    "SIGTERM, 138 on SIGUSR1 (stapo-train saves a checkpoint first)."
)


class InputError(SystemExit):
    """End a command on bad input: exit status `code` (2; 1 for a run that failed after it started, told in one line)
    and `PROG: error: MESSAGE` as the text of the exception, which [`report_input_errors`] prints on stderr at the
    command's entry point (the interpreter prints nothing for an integer exit status). Being a `SystemExit`, it passes
    through `except Exception` and ends the process wherever it is raised.

    Args:
        prog (`str`): the command as the user typed it (`stapo-train`, `stapo-train compare`, `stapo-eval`, ...).
        message (`str`): one line: what is wrong, the allowed values, the fix.
    """

    def __init__(self, prog: str, message: str, code: int = EXIT_INPUT_ERROR):
        self.message = f"{prog}: error: {message}"
        super().__init__(self.message)
        self.code = code

    def __str__(self) -> str:
        return self.message


def print_line(message: str) -> None:
    """Write `message` and its newline to stderr in one `write` call, then flush.

    `print` writes the text and the newline separately: under `accelerate launch` every process writes to the same
    pipe, and two processes' lines interleave (`...error: A.stapo-train: error: A.` then two newlines). One write
    below the pipe's atomic size (4 KiB on Linux) is never split.
    """
    sys.stderr.write(message + "\n")
    sys.stderr.flush()


@contextlib.contextmanager
def report_input_errors() -> Iterator[None]:
    """Print an [`InputError`] raised in the block as its one line on stderr, then let it end the command, with no
    process group left (under `accelerate launch` the group exists once a config does; left alive, gloo's threads can
    abort the exit: [`~stapo_trl.integrations.process_group.destroy_process_group_if_any`])."""
    try:
        yield
    except InputError as e:
        print_line(e.message)
        destroy_process_group_if_any()
        raise


@contextlib.contextmanager
def full_disk_in_one_line(prog: str, output_dir: str) -> Iterator[None]:
    """End a run that failed on a full disk with one [`InputError`] line (status 1) naming `output_dir` and the
    checkpoint a rerun resumes, not a traceback. Full: ENOSPC / EDQUOT (an `OSError`'s or safetensors' "os error
    28"), or under 1 MiB free (`torch.save` names no cause: "unexpected pos")."""
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
    """An argument parser whose errors are an [`InputError`] (status 2, one line, no usage block), with the closest
    flags for an unknown one and a pointer to `--help`."""

    def error(self, message: str) -> NoReturn:
        if message.startswith("unrecognized arguments:"):
            flags = [option for action in self._actions for option in action.option_strings]
            for word in message.split(":", 1)[1].split():
                close = difflib.get_close_matches(word.split("=")[0], flags, n=1, cutoff=0.6)
                if word.startswith("-") and close:
                    message += f"; did you mean {' or '.join(close)} for {word}?"
        raise InputError(self.prog, f"{message} (see `{self.prog} --help`)")
