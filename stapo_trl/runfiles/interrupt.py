"""A stop signal during `train()` ([`STOP_SIGNALS`]: SIGINT from Ctrl-C or a notebook; SIGTERM from preemption,
`scancel`, a time limit, `kill`, torch's launcher; SIGUSR1, the warning a Slurm job asks for before its time limit):
a checkpoint at the next step boundary, then a `KeyboardInterrupt` that names the signal and says how to resume.

The product trainers' `train()` installs a [`GracefulInterrupt`] for the run, in a script as under `stapo-train`
(which then exits with 128 + the signal's number: 130, 143, 138). A later Ctrl-C quits at once (status 130), without
saving; a later SIGTERM or SIGUSR1 changes nothing: schedulers and launchers deliver them more than once.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

import torch
from transformers import TrainerCallback


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)

SCRIPT_RESUME_HINT = (
    "Resume with trainer.train(resume_from_checkpoint=True): a trainer built with the same arguments continues from "
    "the last checkpoint of its output_dir."
)


def _print_line(message: str) -> None:
    """`message` and its newline on stderr in one write (processes sharing a pipe do not interleave), flushed."""
    sys.stderr.write(message + "\n")
    sys.stderr.flush()


def training_interrupted(
    output_dir: str, step: int, resume_hint: str = SCRIPT_RESUME_HINT, signum: int = signal.SIGINT
) -> KeyboardInterrupt:
    """What `train()` raises once a stop signal's checkpoint is saved: a `KeyboardInterrupt` whose message is
    `Interrupted by SIGNAL at step N: checkpoint saved to DIR/checkpoint-N. <resume_hint>`, with the attributes `step`,
    `checkpoint` and `signal` (a `signal.Signals`). A plain `KeyboardInterrupt`, not a subclass: code that handles
    Ctrl-C handles it, and uncaught it ends the process as Ctrl-C does (Python exits by SIGINT, status 130, for that
    exact class only; a subclass would exit with 1).

    Args:
        output_dir (`str`): the run's folder.
        step (`int`): the optimizer step saved.
        resume_hint (`str`, *optional*): how to resume; defaults to [`SCRIPT_RESUME_HINT`].
        signum (`int`, *optional*, defaults to SIGINT): the signal that stopped the run, one of [`STOP_SIGNALS`].
    """
    checkpoint, signum = os.path.join(output_dir, f"checkpoint-{step}"), signal.Signals(signum)
    message = f"Interrupted by {signum.name} at step {step}: checkpoint saved to {checkpoint}. {resume_hint}"
    interrupt = KeyboardInterrupt(message)
    interrupt.step, interrupt.checkpoint, interrupt.signal = step, checkpoint, signum
    return interrupt


class GracefulInterrupt(TrainerCallback):
    """The first of the [`STOP_SIGNALS`] during training saves a checkpoint at the next step boundary and stops
    training; a later Ctrl-C quits at once (exit status 130), without saving; a later SIGTERM or SIGUSR1 changes nothing.

    Use as a context manager around `trainer.train()` with the callback added to the trainer (the product trainers'
    `train()` does both); after it, `signal` is the signal that stopped training (0: none, also for one that came after
    the last step boundary). The handlers are installed in the main thread only (Python's rule), over any earlier ones
    (transformers' `enable_jit_checkpoint` one too), and restored after the block. With several processes the signal
    number is all-reduced (max) at each step end: every rank saves at the same step and names the same signal.

    Args:
        trainer ([`~transformers.Trainer`], *optional*): its accelerator reduces the signal across processes.
    """

    def __init__(self, trainer=None):
        self.trainer, self.signal, self._received, self._previous = trainer, 0, 0, {}

    def _handle(self, signum, frame) -> None:
        if self._received and signum == signal.SIGINT:
            _print_line(f"{'Second ' if self._received == signum else ''}Ctrl-C: quitting now, without saving.")
            sys.stdout.flush()
            os._exit(128 + signum)
        if not self._received:  # a repeated SIGTERM / SIGUSR1 changes nothing: the checkpoint is on its way
            self._received = signal.Signals(signum)
            name, again = ("Ctrl-C", " again") if signum == signal.SIGINT else (self._received.name, "")
            _print_line(
                f"{name}: saving a checkpoint at the end of this step, then stopping (Ctrl-C{again} to quit at once)."
            )

    def __enter__(self) -> GracefulInterrupt:
        if threading.current_thread() is threading.main_thread():
            self._previous = {signum: signal.signal(signum, self._handle) for signum in STOP_SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous = {}

    def on_step_end(self, args, state, control, **kwargs):
        accelerator, signum = getattr(self.trainer, "accelerator", None), self._received
        if accelerator is not None and accelerator.num_processes > 1:
            signum = int(accelerator.gather(torch.tensor([int(signum)], device=accelerator.device)).max())
        if signum:
            self.signal = signal.Signals(signum)
            control.should_save = control.should_training_stop = True
        return control
