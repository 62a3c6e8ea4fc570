"""The run files of `stapo-train` as data: `metrics.jsonl`, `spurious_tokens.jsonl` and a run (or seeds) loader.

[`~stapo_trl.callbacks.MetricsLogCallback`] writes every training log dict as one JSON line in
`<output_dir>/metrics.jsonl`. A file a person (or `stapo-plot`) can read without TensorBoard or W&B. Each line is the dict the trainer logged at
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


METRICS_FILENAME = "metrics.jsonl"
SPURIOUS_TOKENS_FILENAME = "spurious_tokens.jsonl"


def jsonable(value: Any) -> Any:
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


def read_token_records(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Records of a `spurious_tokens.jsonl` file (or `<dir>/spurious_tokens.jsonl`); a truncated line is skipped."""
    path = os.fspath(path)
    if os.path.isdir(path):
        path = os.path.join(path, SPURIOUS_TOKENS_FILENAME)
    return read_jsonl(path)


def load_run(path: str) -> list[list[dict[str, Any]]]:
    """The metrics of one run: `[rows]` for a folder with `metrics.jsonl`, one list per seed for a folder of seeds.

    Raises:
        FileNotFoundError: If neither `path/metrics.jsonl` nor any `path/*/metrics.jsonl` exists.
    """
    if os.path.isfile(os.path.join(path, METRICS_FILENAME)):
        return [read_metrics(path)]
    if os.path.isfile(path) and path.endswith(".jsonl"):
        return [read_metrics(path)]
    seeds = []
    if os.path.isdir(path):
        for name in sorted(os.listdir(path)):
            if os.path.isfile(os.path.join(path, name, METRICS_FILENAME)):
                seeds.append(read_metrics(os.path.join(path, name)))
    if not seeds:
        raise FileNotFoundError(
            f"No {METRICS_FILENAME} in {path!r} nor in its sub-folders. Pass the output_dir of a `stapo-train` run "
            "(or of one `stapo-train compare` arm)."
        )
    return seeds
