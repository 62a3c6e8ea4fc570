"""Ctrl-C during `train()`: a checkpoint at the next step boundary, then a `KeyboardInterrupt` with the resume hint.

The product trainers' `train()` installs a [`GracefulInterrupt`] for the run, in a script as under `stapo-train`:

- the first SIGINT (Ctrl-C, or a notebook's interrupt) asks for a checkpoint at the end of the current optimizer step
  and stops training there; `train()` then raises a `KeyboardInterrupt` ([`training_interrupted`]) whose message says
  where the checkpoint is and how to resume: `trainer.train(resume_from_checkpoint=True)` in a script, the same command
  under `stapo-train`. Uncaught, it ends a script as Ctrl-C does (exit status 130);
- a second SIGINT quits the process at once (exit status 130), without saving.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

import torch
from transformers import TrainerCallback


SCRIPT_RESUME_HINT = (
    "Resume with trainer.train(resume_from_checkpoint=True): a trainer built with the same arguments continues from "
    "the last checkpoint of its output_dir."
)


def _print_line(message: str) -> None:
    """`message` and its newline on stderr in one write (processes sharing a pipe do not interleave), flushed."""
    sys.stderr.write(message + "\n")
    sys.stderr.flush()


def training_interrupted(output_dir: str, step: int, resume_hint: str = SCRIPT_RESUME_HINT) -> KeyboardInterrupt:
    """What `train()` raises once the Ctrl-C checkpoint is saved: a `KeyboardInterrupt` whose message is `Interrupted at
    step N: checkpoint saved to DIR/checkpoint-N. <resume_hint>`, with the attributes `step` and `checkpoint`.

    A plain `KeyboardInterrupt`, not a subclass: code that handles Ctrl-C handles it, and uncaught it ends the process
    as Ctrl-C does (Python exits by SIGINT, status 130, for that exact class only; a subclass would exit with 1).

    Args:
        output_dir (`str`): the run's folder.
        step (`int`): the optimizer step saved.
        resume_hint (`str`, *optional*): how to resume; defaults to [`SCRIPT_RESUME_HINT`].
    """
    checkpoint = os.path.join(output_dir, f"checkpoint-{step}")
    interrupt = KeyboardInterrupt(f"Interrupted at step {step}: checkpoint saved to {checkpoint}. {resume_hint}")
    interrupt.step, interrupt.checkpoint = step, checkpoint
    return interrupt


class GracefulInterrupt(TrainerCallback):
    """Ctrl-C during training: the first SIGINT saves a checkpoint at the next step boundary and stops training; a
    second one quits at once (exit status 130), without saving.

    Use as a context manager around `trainer.train()` with the callback added to the trainer (the product trainers'
    `train()` does both); after it, `requested` tells whether training stopped for an interrupt. The handler is
    installed only in the main thread (Python's `signal` allows no other) and the previous one is restored at the end
    of the block. With several processes the flag is all-reduced (max) at each step end, so that every rank saves at
    the same step even when the signal reaches them a step apart.

    Args:
        trainer ([`~transformers.Trainer`], *optional*): its accelerator reduces the flag across processes.
    """

    def __init__(self, trainer=None):
        self.trainer = trainer
        self.requested = False
        self._previous = None

    def _handle(self, signum, frame) -> None:
        if self.requested:
            _print_line("Second Ctrl-C: quitting now, without saving.")
            sys.stdout.flush()
            os._exit(130)
        self.requested = True
        _print_line(
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
