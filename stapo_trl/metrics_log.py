"""`MetricsLogCallback`: every training log dict as one JSON line in `<output_dir>/metrics.jsonl`.

A file a person (or `stapo-plot`) can read without TensorBoard or W&B. Each line is the dict the trainer logged at
one logging step (reward, per-reward means, entropy, `s2t/*`, loss, `clip_ratio/*`, completion lengths, learning
rate, ...) plus `step` (the optimizer step) and `epoch`:

    {"step": 12, "epoch": 0.02, "loss": 0.0013, "reward": 0.4375, "entropy": 0.21, "s2t/silenced_ratio": 0.0001, ...}

The file is flushed after every line, so an interrupted run keeps the curve up to its last logging step.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, TextIO

from transformers import TrainerCallback


METRICS_FILENAME = "metrics.jsonl"


def _jsonable(value: Any) -> Any:
    """A log value as strict JSON: NaN and infinities become `null` (JSON has no NaN), 0-d tensors become numbers."""
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


# Keys of the end-of-training summary log (`Trainer.train`), not per-step metrics.
TRAIN_SUMMARY_KEYS = frozenset(
    {"train_runtime", "train_samples_per_second", "train_steps_per_second", "total_flos", "train_loss", "epoch"}
)


class JsonlLogCallback(TrainerCallback):
    """Base of the callbacks that append JSON lines to `<output_dir>/<filename>` on the main process.

    The file is opened by [`open_for_run`] when training (re)starts (a resumed run keeps the rows up to its step, see
    [`open_jsonl_for_run`]), opened for appending by [`write_rows`] when rows come outside `train()`, flushed after
    every write and closed when training ends.

    Args:
        path (`str` or `None`, *optional*, defaults to `None`):
            File to write. `None` means `<args.output_dir>/<filename>`, resolved when it is opened.
    """

    filename: str = ""

    def __init__(self, path: str | None = None):
        self.path = path
        self._file: TextIO | None = None

    def resolved_path(self, args) -> str:
        return self.path or os.path.join(args.output_dir, self.filename)

    def open_for_run(self, args, state) -> list[dict[str, Any]]:
        """(Re)open the file at `state.global_step`; returns the rows a resumed run keeps."""
        self.close()
        self._file, kept = open_jsonl_for_run(self.resolved_path(args), state.global_step)
        return kept

    def write_rows(self, args, rows: list[dict[str, Any]]) -> None:
        """Append `rows`, one JSON line each, and flush."""
        if self._file is None:  # written outside `train()`
            self._file = open(self.resolved_path(args), "a", encoding="utf-8")  # noqa: SIM115 (closed by close())
        for row in rows:
            self._file.write(json.dumps(row, ensure_ascii=False) + "\n")
        self._file.flush()

    def on_train_end(self, args, state, control, **kwargs):
        self.close()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class MetricsLogCallback(JsonlLogCallback):
    """Append one JSON line per logging step to `metrics.jsonl`, on the main process only.

    The end-of-training summary (`train_runtime`, `train_loss`, ...) is not a logging step and is not written here
    (`stapo-train` saves it to `train_results.json`); the per-step metrics it carries for the steps after the last
    logging step are written as the final step's row. Evaluation logs (`eval_*` keys), when the trainer evaluates,
    are written as their own lines.

    When training resumes from a checkpoint, the lines of steps after the checkpoint's step (logged by the
    interrupted run, about to be redone) are dropped before appending, so every step appears once.

    Args:
        path (`str` or `None`, *optional*, defaults to `None`):
            File to write. `None` means `<args.output_dir>/metrics.jsonl`, resolved when training begins.
    """

    filename = METRICS_FILENAME

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.open_for_run(args, state)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        if "train_runtime" in logs:
            # The end-of-training summary also carries the per-step metrics of the steps after the last logging step
            # (when max_steps is not a multiple of logging_steps): they become that step's row.
            logs = {key: value for key, value in logs.items() if key not in TRAIN_SUMMARY_KEYS}
            if not logs:
                return
        row = {"step": state.global_step, "epoch": state.epoch}
        row.update({key: _jsonable(value) for key, value in logs.items()})
        self.write_rows(args, [row])


def read_metrics(path: str) -> list[dict[str, Any]]:
    """Rows of a `metrics.jsonl` file (or of `<dir>/metrics.jsonl` when `path` is a directory), in file order.

    A truncated last line (a run killed mid-write) is skipped.
    """
    if os.path.isdir(path):
        path = os.path.join(path, METRICS_FILENAME)
    return read_jsonl(path)


def open_jsonl_for_run(path: str, global_step: int) -> tuple[TextIO, list[dict[str, Any]]]:
    """Open a JSON-lines log for appending when training (re)starts at `global_step`.

    A fresh run (step 0) empties the file; a resumed run keeps the rows with `step <= global_step` (later rows belong
    to the steps being redone) and drops a line cut short by a killed run.

    Returns:
        `tuple`: the file, open for appending (the caller closes it), and the rows kept.
    """
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    kept = []
    if os.path.exists(path) and global_step > 0:
        kept = [row for row in read_jsonl(path) if row.get("step", math.inf) <= global_step]
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in kept)
    return open(path, "a", encoding="utf-8"), kept  # noqa: SIM115 (held open across steps)


def read_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The JSON objects of a JSON-lines file, in file order; blank lines and a line cut short by a killed run (not
    valid JSON) are skipped."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows
