"""What a training run prints: one compact line per logging step, and at the end the files it wrote.

transformers prints every log row as a dict (`ProgressCallback` inside the progress bar, `PrinterCallback` with
`disable_tqdm`): ~40 keys per row for STAPO, so a 500-step demo printed 125 lines of ~1,500 characters. The product
trainers print instead, per logging step ([`format_log_line`]):

    step 40/500  reward 0.438  entropy 0.512  silenced 7.75e-05

(reward, mean token entropy, S2T silenced ratio; the last for STAPO only), and when training ends the files in
`output_dir` ([`written_files`]). Every metric is still in `metrics.jsonl`, `trainer.state.log_history` and the
trackers of `report_to`. [`use_compact_console`] swaps transformers' two callbacks for [`CompactProgressCallback`] /
[`CompactPrinterCallback`] (subclasses, so `trainer.remove_callback(ProgressCallback)` still removes them); to get the
dicts back: `trainer.remove_callback(CompactProgressCallback); trainer.add_callback(ProgressCallback)`.
"""

from __future__ import annotations

import os
import re
from typing import Any

from transformers.trainer_callback import PrinterCallback, ProgressCallback

from .metrics_log import METRICS_FILENAME, SPURIOUS_TOKENS_FILENAME


# The files a run can leave in output_dir, in the order listed, with what each holds.
RUN_FILES = (
    (METRICS_FILENAME, "every metric of every logging step"),
    (SPURIOUS_TOKENS_FILENAME, "the silenced tokens in context"),
    ("training_curves.png", "reward, entropy and silenced ratio over steps"),
    ("s2t_*.png", "the S2T diagnostics"),
    ("eval.json", "accuracy before and after training"),
    ("eval-step*.json", "accuracy before and after, of a rerun"),
    ("train_results.json", "runtime and final loss"),
    ("README.md", "the model card"),
    ("model.safetensors", "the trained model, with its tokenizer and config"),
    ("adapter_model.safetensors", "the trained adapter"),
    ("checkpoint-*", "checkpoints (resume: same command or trainer.train(resume_from_checkpoint=True))"),
)


def written_files(output_dir: str) -> list[tuple[str, str]]:
    """The run files present in `output_dir`, as (name, what it holds): [`RUN_FILES`] that exist; a pattern with `*`
    becomes the matching names (checkpoints in step order); more than two, the first and last checkpoint or the
    pattern, with their count."""
    try:
        present = os.listdir(output_dir)
    except OSError:
        return []
    found = []
    for pattern, what in RUN_FILES:
        regex = re.compile(re.escape(pattern).replace(r"\*", ".*") + "$")
        names = [name for name in present if regex.match(name)]
        names.sort(key=lambda n: (len(n), n))  # checkpoint-20 before checkpoint-100
        names = [n + ("/" if os.path.isdir(os.path.join(output_dir, n)) else "") for n in names]
        if len(names) > 2:  # checkpoints: the first and the last; figures: the pattern
            names = [
                f"{names[0]} ... {names[-1]} ({len(names)})" if names[0].endswith("/") else f"{pattern} ({len(names)})"
            ]
        if names:
            found.append((", ".join(names), what))
    return found


def files_summary(output_dir: str, indent: str = "  ") -> str:
    """`Files in DIR:` and one line per [`written_files`] entry; empty when there are none."""
    files = written_files(output_dir)
    if not files:
        return ""
    width = min(max(len(name) for name, _ in files), 40)
    return "\n".join([f"Files in {output_dir}:"] + [f"{indent}{name:<{width}}  {what}" for name, what in files])


def _fmt(value: Any, digits: int = 3) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if value == 0 or isinstance(value, int):
        return str(int(value)) if value == 0 else str(value)
    if 1e-3 <= abs(value) < 1e4:
        return f"{value:.{digits}f}"
    return f"{value:.3g}" if abs(value) < 1e-3 else f"{value:.4g}"


# (log key, label) of the compact training line.
TRAIN_LINE_KEYS = (("reward", "reward"), ("entropy", "entropy"), ("s2t/silenced_ratio", "silenced"))


def format_log_line(logs: dict[str, Any], step: int, max_steps: int | None = None) -> str:
    """One line for a log row: a training row as `step N/M  reward R  entropy H  silenced S` (the keys present); an
    evaluation row (`eval_*`, `eval/*` keys) as `step N  eval  k v ...`; the end-of-training row as `training done
    at step N (T s, train_loss L)`, or `training stopped at step N of M (...)` before `max_steps` (Ctrl-C, a callback
    that stops training); any other row (the caller's own `trainer.log`) as `step N  k v ...`, every key."""
    where = f"step {step}/{max_steps}" if max_steps and max_steps > 0 else f"step {step}"
    logs = {k: v for k, v in logs.items() if k != "total_flos"}
    if "train_runtime" in logs:
        loss = f", train_loss {_fmt(logs['train_loss'], 4)}" if isinstance(logs.get("train_loss"), float) else ""
        timing = f"({_fmt(logs['train_runtime'], 1)} s{loss})"
        if max_steps and max_steps > 0 and step < max_steps:
            return f"training stopped at step {step} of {max_steps} {timing}"
        return f"training done at step {step} {timing}"
    if any(key in logs for key, _ in TRAIN_LINE_KEYS):
        parts = [f"{label} {_fmt(logs[key])}" for key, label in TRAIN_LINE_KEYS if logs.get(key) is not None]
        return "  ".join([where, *parts])
    evals = {k.removeprefix("eval_"): v for k, v in logs.items() if k.startswith(("eval_", "eval/"))}
    if evals:
        keep = [k for k in evals if not k.endswith(("runtime", "per_second")) and k != "epoch"]
        return "  ".join([where, "eval", *(f"{k} {_fmt(evals[k])}" for k in keep)])
    return "  ".join([where, *(f"{k} {_fmt(v)}" for k, v in logs.items() if k != "epoch")])


class _CompactLines:
    """The part both compact callbacks share: the line of a row, and the files at the end (`summary`)."""

    summary: bool = True  # print the files at the end of training (`stapo-train` prints its own summary instead)

    def _line(self, state, logs) -> str | None:
        if not logs:
            return None
        return format_log_line(logs, state.global_step, state.max_steps)

    def _summary(self, args) -> str:
        text = files_summary(args.output_dir) if self.summary else ""
        return f"{text}\nFigures of the curves: stapo-plot {args.output_dir}" if text else ""


class CompactProgressCallback(_CompactLines, ProgressCallback):
    """transformers' progress bar, with [`format_log_line`] instead of each row's dict, and the files written at the end."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and self.training_bar is not None:
            line = self._line(state, logs)
            if line:
                self.training_bar.write(line)

    def on_train_end(self, args, state, control, **kwargs):
        super().on_train_end(args, state, control, **kwargs)
        if state.is_world_process_zero and (text := self._summary(args)):
            print(text)


class CompactPrinterCallback(_CompactLines, PrinterCallback):
    """transformers' printer (used with `disable_tqdm`), with [`format_log_line`] instead of each row's dict, and the
    files written at the end."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_local_process_zero and state.is_world_process_zero:
            line = self._line(state, logs)
            if line:
                print(line)

    def on_train_end(self, args, state, control, **kwargs):
        if state.is_world_process_zero and (text := self._summary(args)):
            print(text)


def use_compact_console(trainer) -> None:
    """Replace transformers' `ProgressCallback` / `PrinterCallback` of `trainer` (the exact classes: a subclass of the
    caller's is kept) by the compact ones, at the same place in the callback list."""
    callbacks = trainer.callback_handler.callbacks
    for i, callback in enumerate(callbacks):
        if type(callback) is ProgressCallback:
            callbacks[i] = CompactProgressCallback()
            callbacks[i].max_str_len = callback.max_str_len
        elif type(callback) is PrinterCallback:
            callbacks[i] = CompactPrinterCallback()


def set_console_summary(trainer, enabled: bool) -> None:
    """Turn the end-of-training file list of the compact callbacks of `trainer` on or off."""
    for callback in trainer.callback_handler.callbacks:
        if isinstance(callback, _CompactLines):
            callback.summary = enabled


__all__ = [
    "CompactPrinterCallback",
    "CompactProgressCallback",
    "files_summary",
    "format_log_line",
    "set_console_summary",
    "use_compact_console",
    "written_files",
]
