"""The run files of a training run, as `TrainerCallback`s (TRL's `trl/trainer/callbacks.py` is the pattern).

- [`MetricsLogCallback`]: every training log dict as one JSON line in `<output_dir>/metrics.jsonl`.
- [`SpuriousTokenLogger`]: the silenced tokens of each logging step in `<output_dir>/spurious_tokens.jsonl`.
- [`add_run_file_callbacks`]: the two above, as `STAPOTrainer.train` adds them (`s2t_write_run_files`).

The files they write are read back by [`stapo_trl.runfiles.metrics_log`] (no transformers needed there).
"""

from __future__ import annotations

import json
import logging
import os
import random
from collections import Counter
from typing import Any, TextIO

import torch
from accelerate.utils import gather_object
from transformers import DefaultFlowCallback, TrainerCallback

from ..core import S2TResult, STAPOTrainer
from ..diagnostics.token_records import merge_token_records, select_token_records, token_records
from .metrics_log import (
    METRICS_FILENAME,
    SPURIOUS_TOKENS_FILENAME,
    TRAIN_SUMMARY_KEYS,
    jsonable,
    open_jsonl_for_run,
)
from .run_folder import open_run_file


logger = logging.getLogger(__name__)


class JsonlLogCallback(TrainerCallback):
    """Base of the callbacks that append JSON lines to `path` (default `<output_dir>/<filename>`) on the main process:
    opened by [`open_for_run`] when training (re)starts (a resumed run keeps the rows up to its step:
    [`open_jsonl_for_run`]), for appending by [`write_rows`] outside `train()`, flushed per write, closed at the end.
    """

    filename: str = ""

    def __init__(self, path: str | None = None):
        self.path = path
        self._file: TextIO | None = None

    def resolved_path(self, args) -> str:
        """The file written: `path`, or `<args.output_dir>/<filename>`."""
        return self.path or os.path.join(args.output_dir, self.filename)

    def open_for_run(self, args, state) -> list[dict[str, Any]]:
        """(Re)open the file at `state.global_step`; returns the rows a resumed run keeps."""
        self.close()
        self._file, kept = open_jsonl_for_run(self.resolved_path(args), state.global_step)
        return kept

    def write_rows(self, args, rows: list[dict[str, Any]]) -> None:
        """Append `rows`, one JSON line each, and flush."""
        if self._file is None:  # written outside `train()`
            self._file = open_run_file(self.resolved_path(args), "a")  # closed by close()
        for row in rows:
            self._file.write(json.dumps(row, ensure_ascii=False) + "\n")
        self._file.flush()

    def on_train_end(self, args, state, control, **kwargs):
        self.close()

    def close(self) -> None:
        """Close the file, if open (a later write reopens it for appending)."""
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
    interrupted run, about to be redone) are dropped before appending, so every step appears once. `path`: the file
    (default `<output_dir>/metrics.jsonl`).
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
        row.update({key: jsonable(value) for key, value in logs.items()})
        self.write_rows(args, [row])


class SpuriousTokenLogger(JsonlLogCallback):
    r"""Write the silenced tokens of the training masks to `spurious_tokens.jsonl` at every logging step.

    The product's [`~stapo_trl.STAPOTrainer`] hands every training mask to [`record`] when it is built: its silenced
    tokens, a sample of kept candidates and of other positive-advantage tokens, with their context, are selected on the
    device and merged into one uniform sample per kind of the masks since the last logging step, within the caps
    ([`~stapo_trl.diagnostics.token_records.select_token_records`]): no device-to-host transfer, and what waits for the
    logging step is the caps, not the batch. At each step where the trainer logs (`control.should_log`, set on every
    process), that sample comes to the host in one transfer and is decoded in one batch, the records of all processes
    are gathered with `accelerate.utils.gather_object` (every process calls it at the same steps, also with no record,
    so nothing hangs), capped once over all processes, stamped with the logging step and appended by the main process,
    flushed per write. Each record names the optimizer step of its mask (`update`). Evaluation masks are not recorded.

    When wandb (or trackio) is in `report_to` and active, the `top_k` most frequent silenced tokens so far (labelled
    as in `s2t_top_tokens.png`), with their kept-candidate counts (of the sample), are logged as a table
    `s2t/top_silenced_tokens`; otherwise the file is the record.

    [`~stapo_trl.STAPOTrainer`] adds one itself at `train()` (`args.s2t_write_run_files`); one added before, e.g. with
    other caps, replaces it:

    ```python
    trainer = STAPOTrainer(model, reward_funcs, args=config, train_dataset=dataset)
    trainer.add_callback(SpuriousTokenLogger(trainer, max_silenced=1000))
    ```

    Args:
        trainer ([`~stapo_trl.STAPOTrainer`]): the trainer whose masks are recorded.
        path (`str`, *optional*): file to write; `None` = `<output_dir>/spurious_tokens.jsonl`.
        max_silenced (`int`, *optional*, defaults to `256`): silenced tokens per logging step (a uniform sample when
            there are more; at the paper's ~1e-4 rate a mask has a handful).
        max_kept_candidates (`int`, *optional*, defaults to `64`): kept candidates sampled per logging step.
        max_reference (`int`, *optional*, defaults to `64`): other positive-advantage tokens sampled, the same way.
        context_tokens (`int`, *optional*, defaults to `8`): tokens of context on each side.
        top_k (`int`, *optional*, defaults to `20`): rows of the tracker table.
    """

    filename = SPURIOUS_TOKENS_FILENAME

    def __init__(self, trainer, path: str | None = None, *, max_silenced: int = 256, max_kept_candidates: int = 64,
                 max_reference: int = 64, context_tokens: int = 8, top_k: int = 20):  # fmt: skip
        super().__init__(path)
        self.trainer, self.max_silenced, self.max_kept_candidates = trainer, max_silenced, max_kept_candidates
        self.max_reference, self.context_tokens, self.top_k = max_reference, context_tokens, top_k
        self.silenced_counts: Counter[str] = Counter()
        self.kept_candidate_counts: Counter[str] = Counter()
        self._token_bytes: dict[int, bytes] | None = None  # token id -> bytes, read from the tokenizer when needed
        self._pending: torch.Tensor | None = None  # the masks' sample since the last logging step, on the device

    # -- file ----------------------------------------------------------------------------------------------------
    def on_train_begin(self, args, state, control, **kwargs):
        self._pending = None
        if not state.is_world_process_zero:
            return
        # Resuming keeps the records up to the checkpoint; a fresh run starts an empty file.
        for record in self.open_for_run(args, state):
            self._count(record)

    def _count(self, record: dict[str, Any]) -> None:
        if record["kind"] == "silenced":
            self.silenced_counts[self._label(record)] += 1
        elif record["kind"] == "kept_candidate":
            self.kept_candidate_counts[self._label(record)] += 1

    def _label(self, record: dict[str, Any]) -> str:
        """The token as `s2t_top_tokens.png` labels it ([`~stapo_trl.plots.readable_token`]): byte-level fragments by
        their bytes, from the trainer's tokenizer vocabulary."""
        from ..plots import readable_token, tokenizer_token_bytes  # the figures' module: not loaded with the trainer

        if self._token_bytes is None:
            backend = getattr(self.trainer.processing_class, "backend_tokenizer", None)  # a fast tokenizer
            self._token_bytes = tokenizer_token_bytes(json.loads(backend.to_str())) if backend is not None else {}
        token_id = record.get("token_id")
        return readable_token(record["token"], self._token_bytes.get(token_id), token_id)

    # -- masks and logging steps -----------------------------------------------------------------------------------
    def record(self, result: S2TResult, per_token_logps, entropies, advantages, loss_mask, completion_ids) -> None:
        """Merge the records of one training mask (the arguments of the trainer's `_compute_s2t_mask`, and its result)
        into the sample kept on the device until the next logging step; sampled with the update's step in the seed."""
        trainer, caps = self.trainer, (self.max_silenced, self.max_kept_candidates, self.max_reference)
        update, process = trainer.state.global_step + 1, trainer.accelerator.process_index
        selected = select_token_records(
            result, per_token_logps, entropies, advantages, loss_mask, completion_ids, caps=caps,
            context_tokens=self.context_tokens, seed=f"{trainer.args.seed}-{update}-{process}", update=update,
        )  # fmt: skip
        self._pending = selected if self._pending is None else merge_token_records(self._pending, selected, caps)

    def on_step_end(self, args, state, control, **kwargs):
        if control.should_log:
            self.write_pending(args, state.global_step)

    def on_train_end(self, args, state, control, **kwargs):
        # The masks after the last logging step (max_steps not a multiple of logging_steps), as metrics.jsonl writes
        # their counts in the final row. Every process ends training, so the gather runs on all of them.
        self.write_pending(args, state.global_step)
        super().on_train_end(args, state, control, **kwargs)

    def write_pending(self, args, step: int) -> list[dict[str, Any]]:
        """Gather the pending records from every process, cap them once for the logging step, stamp them with `step`
        and append them (main process). A collective: every process calls it at the same steps."""
        selected, self._pending, trainer = self._pending, None, self.trainer
        accelerator = trainer.accelerator
        records = [] if selected is None else token_records(
            selected, trainer.processing_class, prob_threshold=trainer.s2t.prob_threshold,
            process_index=accelerator.process_index,
        )  # fmt: skip
        if accelerator.num_processes > 1:
            records = gather_object(records)  # every process, every logging step: never skipped
        if not accelerator.is_main_process or not records:
            return []
        records = [record | {"step": step} for record in self._cap(records, step, args.seed)]
        self.write_rows(args, records)
        for record in records:
            self._count(record)
        self._log_table(args)
        return records

    def _cap(self, records: list[dict[str, Any]], step: int, seed: int) -> list[dict[str, Any]]:
        """Apply the per-step caps to the records of all processes (uniform sample per kind, order kept)."""
        caps = {"silenced": self.max_silenced, "kept_candidate": self.max_kept_candidates}
        caps["reference"] = self.max_reference
        rng = random.Random(f"{seed}-{step}-all")
        capped = []
        for kind, cap in caps.items():
            of_kind = [i for i, r in enumerate(records) if r["kind"] == kind]
            capped += of_kind if len(of_kind) <= cap else rng.sample(of_kind, cap)
        return [records[i] for i in sorted(capped)]

    def _log_table(self, args) -> None:
        report_to = args.report_to or []
        backends = []
        if "wandb" in report_to:
            import wandb  # optional tracker, only when it is in report_to

            if wandb.run is not None:
                backends.append(wandb)
        if "trackio" in report_to:
            import trackio  # optional tracker, only when it is in report_to

            backends.append(trackio)
        if not backends or not self.silenced_counts:
            return
        import pandas as pd  # only for a tracker table

        top = self.silenced_counts.most_common(self.top_k)
        table = pd.DataFrame(top, columns=["token", "silenced"])
        table["kept_candidate_sampled"] = [self.kept_candidate_counts.get(token, 0) for token, _ in top]
        for backend in backends:
            backend.log({"s2t/top_silenced_tokens": backend.Table(dataframe=table)})


def add_run_file_callbacks(trainer) -> list[TrainerCallback]:
    """Add a [`MetricsLogCallback`] and, to an S2T trainer, a [`SpuriousTokenLogger`], each unless one of its class
    is there.

    [`~stapo_trl.STAPOTrainer.train`] calls it when `args.s2t_write_run_files` is on (the default), so the Python API
    writes the same `metrics.jsonl` and `spurious_tokens.jsonl` as `stapo-train`, and `stapo-plot` reads them. A
    callback of either class that the caller passed or added before `train()` (other caps, another path) is kept
    instead, so each file has one writer. Calling it again adds nothing. The callbacks go right after transformers'
    `DefaultFlowCallback`, ahead of the caller's: they see the step's `should_log` decision, and their files are open
    before another callback logs at `on_train_begin`.

    Args:
        trainer ([`~transformers.Trainer`]): the trainer; the spurious-token logger is added only to a
            [`~stapo_trl.core.STAPOTrainer`] (it reads its masks).

    Returns:
        `list[TrainerCallback]`: the callbacks added (empty when all were already there).
    """
    callbacks = trainer.callback_handler.callbacks
    added = []
    if not any(isinstance(callback, MetricsLogCallback) for callback in callbacks):
        added.append(MetricsLogCallback())
    if isinstance(trainer, STAPOTrainer) and not any(isinstance(cb, SpuriousTokenLogger) for cb in callbacks):
        added.append(SpuriousTokenLogger(trainer))
    position = next((i + 1 for i, cb in enumerate(callbacks) if isinstance(cb, DefaultFlowCallback)), 0)
    callbacks[position:position] = added
    return added
