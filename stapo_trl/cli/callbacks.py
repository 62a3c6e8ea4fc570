"""`stapo-train`'s callbacks, for scripts too (`add_command_callbacks`): save on a stop signal, one line per log."""

from __future__ import annotations

import os
import signal
import threading

import torch
from transformers import TrainerCallback
from transformers.trainer_callback import PrinterCallback, ProgressCallback

from ..run_folder.checkpoints import checkpoint_problem
from .errors import print_line


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)
SCRIPT_RESUME_HINT = ("Resume with trainer.train(resume_from_checkpoint=True): a trainer built with the same "
                      "arguments continues from the last checkpoint of its output_dir.")  # fmt: skip


class SaveOnSignal(TrainerCallback):
    """On the first of [`STOP_SIGNALS`], save a checkpoint at the next step boundary on every rank, stop, and raise
    `KeyboardInterrupt("Interrupted by SIGTERM at step N: checkpoint saved to DIR. <resume_hint>")` with `signal`,
    `step` and `checkpoint` at `on_train_end` (add it last); a second Ctrl-C exits 130 at once."""

    def __init__(self, resume_hint: str = SCRIPT_RESUME_HINT):
        self.resume_hint, self.signal, self._received, self._previous, self.checkpoint = resume_hint, 0, 0, {}, None

    def _handle(self, signum, frame) -> None:
        if self._received and signum == signal.SIGINT:
            saved = self.checkpoint is not None and checkpoint_problem(self.checkpoint) is None
            end = f"checkpoint saved to {self.checkpoint}. {self.resume_hint}" if saved else "without saving."
            print_line(f"Second Ctrl-C: quitting now, {end}")
            os._exit(128 + signum)
        if not self._received:
            self._received = signal.Signals(signum)
            name = "Ctrl-C" if signum == signal.SIGINT else self._received.name
            print_line(f"{name}: saving a checkpoint at the end of this step, then stopping (Ctrl-C to quit at once).")

    def on_train_begin(self, args, state, control, **kwargs):
        self.signal, self._received, self.checkpoint = 0, 0, None
        if threading.current_thread() is threading.main_thread():
            self._previous = {signum: signal.signal(signum, self._handle) for signum in STOP_SIGNALS}

    def on_step_end(self, args, state, control, **kwargs):
        signum = torch.tensor([int(self._received)], device=args.device)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(signum, op=torch.distributed.ReduceOp.MAX)
        if signum.item():
            self.signal = signal.Signals(int(signum.item()))
            self.checkpoint = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
            control.should_save = control.should_training_stop = True

    def on_train_end(self, args, state, control, **kwargs):
        while self._previous:
            signal.signal(*self._previous.popitem())
        if self.signal:
            interrupt = KeyboardInterrupt(f"Interrupted by {self.signal.name} at step {state.global_step}: checkpoint "
                                          f"saved to {self.checkpoint}. {self.resume_hint}")  # fmt: skip
            interrupt.signal, interrupt.step, interrupt.checkpoint = self.signal, state.global_step, self.checkpoint
            raise interrupt


def _fmt(value, digits: int = 3) -> str:
    if not isinstance(value, float):
        return str(value)
    return format(value or 0.0, f".{digits}f" if 1e-3 <= abs(value) < 1e4 else ".3g" if abs(value) < 1e-3 else ".4g")


def format_log_line(logs: dict, step: int, max_steps: int | None = None) -> str:
    """One console line for a log row: `step N/M  reward R  entropy H  silenced S`, `step N  eval k v ...`,
    `training done at step N (T s, train_loss L)` (`training stopped at step N of M (...)`), else every key."""
    where = f"step {step}/{max_steps}" if max_steps and max_steps > 0 else f"step {step}"
    if "train_runtime" in logs:
        loss = f", train_loss {_fmt(logs['train_loss'], 4)}" if isinstance(logs.get("train_loss"), float) else ""
        end = f"stopped at step {step} of {max_steps}" if "/" in where and step < max_steps else f"done at step {step}"
        return f"training {end} ({_fmt(logs['train_runtime'], 1)} s{loss})"
    if (keys := {"reward": "reward", "entropy": "entropy", "s2t/silenced_ratio": "silenced"}).keys() & logs.keys():
        return "  ".join([where, *(f"{keys[k]} {_fmt(logs[k])}" for k in keys if logs.get(k) is not None)])
    if evals := {k.removeprefix("eval_"): v for k, v in logs.items() if k.startswith("eval_")}:
        return "  ".join([where, "eval", *(f"{k} {_fmt(v)}" for k, v in evals.items()
                          if k != "epoch" and not k.endswith(("runtime", "per_second")))])  # fmt: skip
    return "  ".join([where, *(f"{k} {_fmt(v)}" for k, v in logs.items() if k not in ("epoch", "total_flos"))])


class CompactProgressCallback(ProgressCallback):
    """transformers' progress bar with [`format_log_line`] instead of each row's dict."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and logs and self.training_bar is not None:
            getattr(self.training_bar, "write", print)(format_log_line(logs, state.global_step, state.max_steps))


class CompactPrinterCallback(PrinterCallback):
    """transformers' printer (`disable_tqdm`) with [`format_log_line`] instead of each row's dict."""

    training_bar, on_log = print, CompactProgressCallback.on_log


def add_command_callbacks(trainer, resume_hint: str = SCRIPT_RESUME_HINT) -> SaveOnSignal:
    """Give `trainer` `stapo-train`'s compact console and a [`SaveOnSignal`], which it returns."""
    compact = {ProgressCallback: CompactProgressCallback, PrinterCallback: CompactPrinterCallback}
    callbacks = trainer.callback_handler.callbacks
    callbacks[:] = [compact[type(c)]() if type(c) in compact else c for c in callbacks]
    trainer.add_callback(stop := SaveOnSignal(resume_hint))
    return stop
