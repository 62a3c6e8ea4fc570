"""[`GracefulInterrupt`]: Ctrl-C during `stapo-train` saves a checkpoint at the next step boundary and stops."""

from __future__ import annotations

import os
import signal
import sys
import threading

import torch
from transformers import TrainerCallback

from .errors import print_line


class GracefulInterrupt(TrainerCallback):
    """Ctrl-C during training: the first SIGINT saves a checkpoint at the next step boundary and stops training; a
    second one quits at once (exit status 130), without saving.

    Use as a context manager around `trainer.train()` with the callback added to the trainer; after it, `requested`
    tells whether training stopped for an interrupt. The handler is installed only in the main thread (Python's
    `signal` allows no other). With several processes the flag is all-reduced (max) at each step end, so that every
    rank saves at the same step even when the signal reaches them a step apart.

    Args:
        trainer ([`~transformers.Trainer`], *optional*): its accelerator reduces the flag across processes.
    """

    def __init__(self, trainer=None):
        self.trainer = trainer
        self.requested = False
        self._previous = None

    def _handle(self, signum, frame) -> None:
        if self.requested:
            print_line("Second Ctrl-C: quitting now, without saving.")
            sys.stdout.flush()
            os._exit(130)
        self.requested = True
        print_line(
            "Ctrl-C: saving a checkpoint at the end of this step, then stopping (Ctrl-C again to quit at once)."
        )

    def __enter__(self) -> GracefulInterrupt:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None

    def _any_rank_requested(self) -> bool:
        accelerator = getattr(self.trainer, "accelerator", None)
        if accelerator is None or accelerator.num_processes == 1:
            return self.requested
        flag = torch.tensor([float(self.requested)], device=accelerator.device)
        return bool(accelerator.reduce(flag, reduction="sum").item() > 0)

    def on_step_end(self, args, state, control, **kwargs):
        if self._any_rank_requested():
            self.requested = True
            control.should_save = True
            control.should_training_stop = True
        return control
