"""The commands' exit statuses, their one-line `PROG: error: ...`, and the harmless upstream messages they silence."""

from __future__ import annotations

import argparse
import contextlib
import difflib
import errno
import logging
import os
import shutil
import sys
import warnings

from ..integrations.process_group import destroy_process_group_if_any
from ..run_folder.checkpoints import newest_complete_checkpoint


EXIT_INPUT_ERROR = 2
EXIT_STATUS_HELP = ("Exit status: 0 on success; 2 on an input error (an argument, recipe value, file or folder that "
                    "cannot work: one 'PROG: error: ...' line, before anything runs); 1 when a run fails after it "
                    "started; 130 on Ctrl-C, 143 on SIGTERM, 138 on SIGUSR1 (stapo-train saves a checkpoint "
                    "first).")  # fmt: skip


class InputError(SystemExit):
    """End a command with status `code` (2: an input error; 1: a failed run) and the line `PROG: error: MESSAGE`."""

    def __init__(self, prog: str, message: str, code: int = EXIT_INPUT_ERROR):
        self.message = f"{prog}: error: {message}"
        super().__init__(self.message)
        self.code = code


def print_line(message: str) -> None:
    """`message` and its newline on stderr in one write (processes sharing a pipe cannot interleave)."""
    sys.stderr.write(message + "\n")
    sys.stderr.flush()


@contextlib.contextmanager
def report_input_errors():
    """Print an [`InputError`] of the block as its line, leaving no process group."""
    try:
        yield
    except InputError as e:
        print_line(e.message)
        destroy_process_group_if_any()
        raise


@contextlib.contextmanager
def full_disk_in_one_line(prog: str, output_dir: str):
    """A failure on a full disk (ENOSPC, EDQUOT, "os error 28", or under 1 MiB free) as one [`InputError`] line."""
    try:
        yield
    except Exception as e:
        if getattr(e, "errno", None) not in (errno.ENOSPC, errno.EDQUOT) and "os error 28" not in str(e):
            if not os.path.isdir(output_dir) or shutil.disk_usage(output_dir).free >= 2**20:
                raise
        checkpoint = newest_complete_checkpoint(output_dir)[0] or "the start (no complete checkpoint)"
        cause = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"
        message = f"no space left on the disk of output_dir={output_dir!r} ({cause}). Free some space, then rerun the"
        raise InputError(prog, f"{message} same command: it resumes from {checkpoint}.", code=1) from e


@contextlib.contextmanager
def quiet_upstream():
    """Silence, by exact text, upstream lines a run cannot act on (transformers, TRL's vLLM range, DeepSpeed's CPU)."""
    cpu = "Setting accelerator to CPU. If you have GPU or other accelerator, we were unable to detect it."

    def log_filter(record: logging.LogRecord) -> bool:
        import torch

        return record.getMessage() != cpu or torch.accelerator.is_available()

    logging.getLogger("DeepSpeed").addFilter(log_filter)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", r"TRL currently supports vLLM versions from 0\.22\.0 to 0\.31\.0\. You "
                                    r"have version 0\.32\.0(\+[\w.]+)? installed", UserWarning, r"trl\.")  # fmt: skip
            warnings.filterwarnings("ignore", r"`(is_gradient_checkpointing|gradient_checkpointing_(en|dis)able)` is "
                                    "deprecated", FutureWarning, r"transformers\.")  # fmt: skip
            yield
    finally:
        logging.getLogger("DeepSpeed").removeFilter(log_filter)


class OneLineErrorParser(argparse.ArgumentParser):
    """An argument parser whose errors are an [`InputError`], naming the closest flags."""

    def error(self, message: str):
        if message.startswith("unrecognized arguments:"):
            flags = [option for action in self._actions for option in action.option_strings]
            for word in message.split(":", 1)[1].split():
                if word.startswith("-") and (close := difflib.get_close_matches(word.split("=")[0], flags, n=1)):
                    message += f"; did you mean {' or '.join(close)} for {word}?"
        raise InputError(self.prog, f"{message} (see `{self.prog} --help`)")
