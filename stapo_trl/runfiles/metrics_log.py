"""The run files of `stapo-train` as data: `metrics.jsonl`, `spurious_tokens.jsonl` and a run (or seeds) loader.

[`~stapo_trl.runfiles.callbacks.MetricsLogCallback`] writes every training log dict as one JSON line in
`<output_dir>/metrics.jsonl`. A file a person (or `stapo-plot`) can read without TensorBoard or W&B. Each line is the dict the trainer logged at
one logging step (reward, per-reward means, entropy, `s2t/*`, loss, `clip_ratio/*`, completion lengths, learning
rate, ...) plus `step` (the optimizer step) and `epoch`:

    {"step": 12, "epoch": 0.02, "loss": 0.0013, "reward": 0.4375, "entropy": 0.21, "s2t/silenced_ratio": 0.0001, ...}

The file is flushed after every line, so an interrupted run keeps the curve up to its last logging step. The
figures drawn from these files are [`stapo_trl.plots`].
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Callable, Iterator
from typing import Any, TextIO

from .run_folder import open_run_file


logger = logging.getLogger(__name__)

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


def is_metrics_row(row: Any) -> bool:
    """Whether a parsed line is a `metrics.jsonl` row: a JSON object with an integer `step` whose values are numbers
    or `null` (what [`~stapo_trl.runfiles.callbacks.MetricsLogCallback`] writes; [`jsonable`] turns NaN into `null`)."""
    if not isinstance(row, dict) or not _is_number(row.get("step")) or row["step"] != int(row["step"]):
        return False
    return all(value is None or _is_number(value) for value in row.values())


TOKEN_RECORD_KINDS = ("silenced", "kept_candidate", "reference")


def is_token_record(record: Any) -> bool:
    """Whether a parsed line is a `spurious_tokens.jsonl` record the figures and summaries can read: a JSON object
    with a `kind` of [`TOKEN_RECORD_KINDS`], an integer `step`, numbers `prob` and `entropy`, and a string `token`
    ([`~stapo_trl.diagnostics.token_records.spurious_token_records`] writes them)."""
    return (
        isinstance(record, dict)
        and record.get("kind") in TOKEN_RECORD_KINDS
        and _is_number(record.get("step"))
        and _is_number(record.get("prob"))
        and _is_number(record.get("entropy"))
        and isinstance(record.get("token"), str)
    )


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def read_metrics(path: str) -> list[dict[str, Any]]:
    """Rows of a `metrics.jsonl` file (or of `<dir>/metrics.jsonl` when `path` is a directory), in file order.

    Lines that are not metrics rows ([`is_metrics_row`]: a line cut short by a killed run, an edited or corrupted
    line) are skipped, with one warning per file that gives their line numbers.
    """
    if os.path.isdir(path):
        path = os.path.join(path, METRICS_FILENAME)
    return read_jsonl(
        path, valid=is_metrics_row, what="a metrics row (a JSON object with an integer step and numbers)"
    )


def open_jsonl_for_run(path: str, global_step: int) -> tuple[TextIO, list[dict[str, Any]]]:
    """Open a JSON-lines log for appending when training (re)starts at `global_step`.

    A fresh run (step 0) starts an empty file: an earlier run's non-empty file is first moved aside to
    `<name>.<n>.jsonl` (the first free n, with a warning), never replaced. A resumed run keeps the rows with
    `step <= global_step` (later rows belong to the steps being redone) and drops a line cut short by a killed run:
    written to `<name>.tmp` in the same folder, synced, then renamed over the file (`os.replace`), so that a kill at
    any moment leaves either every old row or the kept ones.

    Returns:
        `tuple`: the file, open for appending (the caller closes it), and the rows kept.
    """
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    kept = []
    if os.path.exists(path) and global_step > 0:
        kept = [row for row in read_jsonl(path) if row.get("step", math.inf) <= global_step]
        with open_run_file(f"{path}.tmp", "w") as f:
            f.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in kept)
            f.flush()
            os.fsync(f.fileno())
        os.replace(f"{path}.tmp", path)
    elif os.path.exists(path) and os.path.getsize(path) > 0:
        stem, ext = os.path.splitext(path)
        aside = next(f"{stem}.{n}{ext}" for n in range(1, 10_000) if not os.path.exists(f"{stem}.{n}{ext}"))
        os.replace(path, aside)
        logger.warning(
            f"{path} held an earlier run's records: kept as {os.path.basename(aside)}; this run starts anew."
        )
    return open_run_file(path, "a"), kept  # held open across steps


def json_lines(path: str | os.PathLike) -> Iterator[tuple[int, Any]]:
    """(its number counted from 1, its JSON value or `None` when it does not parse) of each non-blank line."""
    with open(path, "rb") as f:
        for number, line in enumerate(f, start=1):
            if line.strip():
                try:
                    value = json.loads(line)
                except ValueError:  # JSONDecodeError, UnicodeDecodeError
                    value = None
                yield number, value


def read_jsonl(
    path: str | os.PathLike, *, valid: Callable[[Any], bool] | None = None, what: str = "a JSON object"
) -> list[dict[str, Any]]:
    """The JSON objects of a JSON-lines file, in file order; blank lines are skipped.

    A line that is not a JSON object (a line cut short by a killed run, an edited or corrupted line, bytes that are
    not UTF-8), or that `valid` refuses, is skipped too, and said once per file and set of lines: one warning with the
    line numbers ([`logger`], `stapo_trl.runfiles.metrics_log`).

    Args:
        path (`str` or `os.PathLike`): the file.
        valid (`Callable[[Any], bool]`, *optional*): which parsed objects to keep (default: every JSON object).
        what (`str`, *optional*): what a kept line is, for the warning ("a metrics row ...").
    """
    rows, bad = [], []
    for number, row in json_lines(path):
        if isinstance(row, dict) and (valid is None or valid(row)):
            rows.append(row)
        else:
            bad.append(number)
    if bad:
        _warn_skipped_lines(os.fspath(path), bad, what)
    return rows


_WARNED: set[tuple[str, tuple[int, ...]]] = set()  # (file, skipped lines) already said in this process


def _warn_skipped_lines(path: str, lines: list[int], what: str) -> None:
    key = (os.path.abspath(path), tuple(lines))
    if key in _WARNED:
        return
    _WARNED.add(key)
    shown = ", ".join(map(str, lines[:20])) + (f", ... ({len(lines) - 20} more)" if len(lines) > 20 else "")
    many = len(lines) > 1
    logger.warning(
        f"{path}: skipped line{'s' * many} {shown}, not {what}: a run killed mid-write cuts its last line short; "
        f"other lines were edited or corrupted. The figures leave {'them' if many else 'it'} out."
    )


def read_token_records(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Records of a `spurious_tokens.jsonl` file (or `<dir>/spurious_tokens.jsonl`); lines that are not token records
    ([`is_token_record`]) are skipped, with one warning per file that gives their line numbers."""
    path = os.fspath(path)
    if os.path.isdir(path):
        path = os.path.join(path, SPURIOUS_TOKENS_FILENAME)
    return read_jsonl(
        path, valid=is_token_record, what="a token record (a JSON object with kind, step, prob, entropy and token)"
    )


def s2t_totals(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The S2T counts of a whole run, pooled over its log rows (`metrics.jsonl` rows or `trainer.state.log_history`).

    The silenced ratio of the run is Σ silenced / Σ loss tokens over every row that logged the `s2t/` counts (the
    README's pooled definition of `s2t/silenced_ratio`, over the whole run instead of one row), not a mean of the
    rows' ratios.

    Args:
        rows (`list[dict]`): log rows, each with `s2t/num_silenced`, `s2t/num_candidates` and `s2t/num_loss_tokens`
            when the S2T mask (or its `s2t_mode: "off"` count) ran; rows without them are skipped.

    Returns:
        `dict` or `None`: `num_rows` (rows with counts), `rows_with_silencing`, `num_silenced`, `num_candidates`,
        `num_loss_tokens` (ints), `silenced_ratio` and `candidate_ratio` (pooled floats); `None` when no row has the
        counts (a plain `GRPOTrainer` run).
    """
    counted = [row for row in rows if row.get("s2t/num_loss_tokens") is not None]
    if not counted:
        return None
    silenced = round(sum(row.get("s2t/num_silenced") or 0 for row in counted))
    candidates = round(sum(row.get("s2t/num_candidates") or 0 for row in counted))
    loss_tokens = round(sum(row["s2t/num_loss_tokens"] for row in counted))
    return {
        "num_rows": len(counted),
        "rows_with_silencing": sum(1 for row in counted if (row.get("s2t/num_silenced") or 0) > 0),
        "num_silenced": silenced,
        "num_candidates": candidates,
        "num_loss_tokens": loss_tokens,
        "silenced_ratio": silenced / loss_tokens if loss_tokens else 0.0,
        "candidate_ratio": candidates / loss_tokens if loss_tokens else 0.0,
    }


def candidate_facts(records: list[dict[str, Any]], entropy_below: float = 0.3) -> dict[str, Any]:
    """What the S2T candidates of a run were, from its `spurious_tokens.jsonl` records.

    A mask is told apart by its logging step and its τ_h (`entropy_threshold`): the masks of one logging step (one
    per optimizer update in the `optimizer_step` scope) have distinct τ_h unless two of them hold one candidate each
    with the same entropy. A mask with a single candidate never silences it: τ_h is then that candidate's entropy and
    the rule is the strict `H < τ_h` (`stapo_trl.core.s2t.s2t_mask`).

    Args:
        records (`list[dict]`): the run's token records ([`read_token_records`]).
        entropy_below (`float`, *optional*, defaults to `0.3`): the entropy (nats) below which kept candidates are
            counted in `kept_below`.

    Returns:
        `dict`: `silenced` and `kept` (candidate records of each kind), `kept_below` (kept candidates with entropy
        < `entropy_below`), `entropy_below`, `masks_with_candidates`, `masks_with_one_candidate` (of the masks that
        had a logged candidate) and `kept_alone` (kept candidates that were the only candidate of their mask).
        Kept candidates are a per-logging-step sample (`SpuriousTokenLogger.max_kept_candidates`): compare
        `silenced + kept` with the run's `num_candidates` ([`s2t_totals`]) to know whether all were logged.
    """
    candidates = [r for r in records if r["kind"] in ("silenced", "kept_candidate")]
    kept = [r for r in candidates if r["kind"] == "kept_candidate"]
    masks: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    for record in candidates:
        masks.setdefault((record["step"], record.get("entropy_threshold")), []).append(record)
    alone = [group[0] for group in masks.values() if len(group) == 1]
    return {
        "silenced": len(candidates) - len(kept),
        "kept": len(kept),
        "kept_below": sum(1 for r in kept if r["entropy"] < entropy_below),
        "entropy_below": entropy_below,
        "masks_with_candidates": len(masks),
        "masks_with_one_candidate": len(alone),
        "kept_alone": sum(1 for r in alone if r["kind"] == "kept_candidate"),
    }
