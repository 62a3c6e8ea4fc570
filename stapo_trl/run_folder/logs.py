"""The run files `metrics.jsonl`, `spurious_tokens.jsonl` and the no-learning-signal warning."""

from __future__ import annotations

import importlib
import json
import logging
import math
import os
import random
from collections import Counter
from typing import Any

from accelerate.utils import gather_object
from transformers import DefaultFlowCallback, TrainerCallback

from ..data import format_prompt, json_lines
from ..diagnostics import token_records as records_
from ..models.names import BUILTIN_MODELS, INFO_FILE, read_builtin_info
from .checkpoints import open_run_file, write_atomic


logger = logging.getLogger(__name__)

METRICS_FILENAME = "metrics.jsonl"
SPURIOUS_TOKENS_FILENAME = "spurious_tokens.jsonl"
TRAIN_SUMMARY_KEYS = {"train_runtime", "train_samples_per_second", "train_steps_per_second", "total_flos",
                      "train_loss", "epoch"}  # fmt: skip
_WARNED: set = set()  # (file, skipped lines) already said
_number = lambda value: isinstance(value, (int, float)) and not isinstance(value, bool)  # noqa: E731


def read_jsonl(path: str | os.PathLike, valid=None, what: str = "a JSON object", name=None) -> list[dict]:
    """The rows of a JSON-lines file (`path/name` for a folder) that `valid` accepts; one warning for the others."""
    path = os.path.join(path, name) if name and os.path.isdir(path) else os.fspath(path)
    rows, bad = [], []
    for number, row in json_lines(path):
        if isinstance(row, dict) and (valid is None or valid(row)):
            rows.append(row)
        else:
            bad.append(number)
    if bad and (key := (os.path.abspath(path), tuple(bad))) not in _WARNED:
        _WARNED.add(key)
        shown = ", ".join(map(str, bad[:20])) + (f", ... ({len(bad) - 20} more)" if len(bad) > 20 else "")
        logger.warning(f"{path}: skipped line{'s' * (len(bad) > 1)} {shown}, not {what}: a run killed mid-write cuts "
                       "its last line short; other lines were edited or corrupted. The figures leave them "
                       "out.")  # fmt: skip
    return rows


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The rows of `metrics.jsonl` (or `<dir>/metrics.jsonl`): an integer `step`, numbers or `null`."""
    return read_jsonl(path, lambda row: _number(row.get("step")) and float(row["step"]).is_integer() and all(
        v is None or _number(v) for v in row.values()), "a metrics row (a JSON object with an integer step and "
        "numbers)", METRICS_FILENAME)  # fmt: skip


def read_token_records(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of `spurious_tokens.jsonl` (or of `<dir>/spurious_tokens.jsonl`), in order."""
    return read_jsonl(path, lambda row: row.get("kind") in records_.KINDS and isinstance(row.get("token"), str) and
        all(_number(row.get(key)) for key in ("step", "prob", "entropy")), "a token record (a JSON object with kind, "
        "step, prob, entropy, token)", SPURIOUS_TOKENS_FILENAME)  # fmt: skip


def s2t_totals(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The S2T counts pooled over log rows (`num_*`, ratios as Σ counts / Σ loss tokens); `None` without counts."""
    if not (counted := [row for row in rows if row.get("s2t/num_loss_tokens") is not None]):
        return None
    keys = ("silenced", "candidates", "loss_tokens")
    silenced, candidates, tokens = (round(sum(row.get(f"s2t/num_{key}") or 0 for row in counted)) for key in keys)
    return {
        "num_rows": len(counted), "rows_with_silencing": sum((r.get("s2t/num_silenced") or 0) > 0 for r in counted),
        "num_silenced": silenced, "num_candidates": candidates, "num_loss_tokens": tokens,
        "silenced_ratio": silenced / (tokens or 1), "candidate_ratio": candidates / (tokens or 1)}  # fmt: skip


class JsonlLogCallback(TrainerCallback):
    """Appends JSON lines to `path` (default `<output_dir>/<filename>`) on the main process. A resume keeps the rows
    up to its step (after `redone_after`: eval rows only); a fresh run moves an earlier file to `<name>.<n>.jsonl`."""

    filename, redone_after, _file = "", None, None

    def __init__(self, path: str | None = None):
        self.path = path

    def on_train_begin(self, args, state, control, **kwargs):
        self.close()
        path, step, self.kept = self.path or os.path.join(args.output_dir, self.filename), state.global_step, []
        if not state.is_world_process_zero:
            return
        if os.path.exists(path) and step > 0:
            redone = math.inf if self.redone_after is None else self.redone_after
            self.kept = [row for row in read_jsonl(path) if row.get("step", math.inf) <= step and (
                row["step"] <= redone or any(k.startswith("eval_") for k in row))]  # fmt: skip
            write_atomic(path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in self.kept))
        elif os.path.exists(path) and os.path.getsize(path) > 0:
            stem, ext = os.path.splitext(path)
            aside = next(f"{stem}.{n}{ext}" for n in range(1, 10_000) if not os.path.exists(f"{stem}.{n}{ext}"))
            os.replace(path, aside)
            logger.warning(f"{path} held an earlier run's records: kept as {os.path.basename(aside)}.")
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self._file = open_run_file(path, "a")

    def write_rows(self, args, rows: list[dict[str, Any]]) -> None:
        self._file = self._file or open_run_file(self.path or os.path.join(args.output_dir, self.filename), "a")
        self._file.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
        self._file.flush()

    def close(self, *args, **kwargs) -> None:
        self._file = self._file and self._file.close()

    on_train_end = close


class MetricsLogCallback(JsonlLogCallback):
    """One line per log row in `metrics.jsonl`: `step`, `epoch` and every logged value, NaN as `null`."""

    filename = METRICS_FILENAME

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = {k: v for k, v in (logs or {}).items() if "train_runtime" not in logs or k not in TRAIN_SUMMARY_KEYS}
        if state.is_world_process_zero and logs:
            row = json.dumps({"step": state.global_step, "epoch": state.epoch} | logs, default=lambda v: v.item())
            self.write_rows(args, [json.loads(row, parse_constant=lambda _: None)])  # NaN, infinities: null


class SpuriousTokenLogger(JsonlLogCallback):
    """The silenced tokens of `trainer`'s masks, with samples of kept candidates and reference tokens (`max_*` of each
    per logging step, `context_tokens` each side), in `path` (default `<output_dir>/spurious_tokens.jsonl`), gathered
    from every process; the `top_k` most silenced as a wandb/trackio table. One added before `train()` is used."""

    filename = SPURIOUS_TOKENS_FILENAME

    def __init__(self, trainer, path=None, *, max_silenced=256, max_kept_candidates=64, max_reference=64,
                 context_tokens=8, top_k=20):  # fmt: skip
        self.path, self.trainer, self.context_tokens, self.top_k = path, trainer, context_tokens, top_k
        self.caps = dict(zip(records_.KINDS, (max_silenced, max_kept_candidates, max_reference)))
        self.silenced_counts, self.kept_candidate_counts = Counter(), Counter()  # by token label, for the table
        self._token_bytes = self._pending = None  # token id -> bytes; the masks' sample on the device

    def on_train_begin(self, args, state, control, **kwargs):
        self._pending = None
        super().on_train_begin(args, state, control, **kwargs)
        self._count(self.kept)

    def _count(self, records: list[dict[str, Any]]) -> None:  # under the figures' label
        if self._token_bytes is None:
            backend = getattr(self.trainer.processing_class, "backend_tokenizer", None)  # a fast tokenizer
            self._token_bytes = records_.tokenizer_token_bytes(json.loads(backend.to_str())) if backend else {}
        for record in (r for r in records if r["kind"] != "reference"):
            label = records_.readable_token(record["token"], self._token_bytes.get(i := record.get("token_id")), i)
            (self.silenced_counts if record["kind"] == "silenced" else self.kept_candidate_counts)[label] += 1

    def record(self, result, per_token_logps, entropies, advantages, loss_mask, completion_ids) -> None:
        """Merge the records of one mask (`_compute_s2t_mask`'s arguments and result) into the pending sample."""
        caps, update, rank = tuple(self.caps.values()), self.trainer.state.global_step + 1, self.trainer.accelerator
        new = records_.select_token_records(result, per_token_logps, entropies, advantages, loss_mask, completion_ids,
            caps=caps, update=update, context_tokens=self.context_tokens,
            seed=f"{self.trainer.args.seed}-{update}-{rank.process_index}")  # fmt: skip
        self._pending = new if self._pending is None else records_.merge_token_records(self._pending, new, caps)

    def on_step_end(self, args, state, control, **kwargs):
        if control.should_log:
            self.write_pending(args, state.global_step)

    def on_train_end(self, args, state, control, **kwargs):
        self.write_pending(args, state.global_step)
        super().on_train_end(args, state, control, **kwargs)

    def write_pending(self, args, step: int) -> list[dict[str, Any]]:
        """Gather, cap, stamp with `step` and append the pending records (main process). A collective."""
        selected, self._pending, trainer = self._pending, None, self.trainer
        records = [] if selected is None else records_.token_records(selected, trainer.processing_class,
            prob_threshold=trainer.s2t.prob_threshold, process_index=trainer.accelerator.process_index)  # fmt: skip
        records = gather_object(records) if trainer.accelerator.num_processes > 1 else records
        if not trainer.accelerator.is_main_process or not records:
            return []
        rng, keep = random.Random(f"{args.seed}-{step}-all"), []
        for kind, cap in self.caps.items():
            of_kind = [i for i, r in enumerate(records) if r["kind"] == kind]
            keep += of_kind if len(of_kind) <= cap else rng.sample(of_kind, cap)
        records = [records[i] | {"step": step} for i in sorted(keep)]
        self.write_rows(args, records)
        self._count(records)
        backends = [importlib.import_module(name) for name in ("wandb", "trackio") if name in (args.report_to or [])]
        backends = [b for b in backends if getattr(b, "run", True) is not None]  # wandb without a run: no table
        if backends and self.silenced_counts:
            import pandas as pd

            table = pd.DataFrame(self.silenced_counts.most_common(self.top_k), columns=["token", "silenced"])
            table["kept_candidate_sampled"] = [self.kept_candidate_counts[token] for token in table["token"]]
            for backend in backends:
                backend.log({"s2t/top_silenced_tokens": backend.Table(dataframe=table)})
        return records


def add_run_file_callbacks(trainer) -> list[TrainerCallback]:
    """Add [`MetricsLogCallback`] and (with S2T) [`SpuriousTokenLogger`] where missing; returns those added."""
    callbacks = trainer.callback_handler.callbacks
    wanted = [(MetricsLogCallback, ())] + [(SpuriousTokenLogger, (trainer,))] * hasattr(trainer, "s2t")
    added = [cls(*a) for cls, a in wanted if not any(isinstance(c, cls) for c in callbacks)]
    position = next((i + 1 for i, cb in enumerate(callbacks) if isinstance(cb, DefaultFlowCallback)), 0)
    callbacks[position:position] = added
    return added


class NoLearningSignalCallback(TrainerCallback):
    """Warn once, naming the likely causes, when the first 3 log rows had no learning signal (or a constant reward)."""

    def __init__(self, trainer):
        self.trainer, self.rows = trainer, []

    def on_train_begin(self, args, state, control, **kwargs):
        self.rows = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        spread = (logs or {}).get("frac_reward_zero_std")
        if self.rows is None or not state.is_world_process_zero or not _number(spread) or spread != spread:
            return
        self.rows.append(dict(logs, step=state.global_step))
        if len(self.rows) >= 3 or "train_runtime" in logs:
            self.on_train_end(args, state, control)

    def on_train_end(self, args, state, control, **kwargs):
        rows, self.rows, constant, trainer = self.rows, None, {}, self.trainer  # decided once; reward name -> value
        if not rows or not state.is_world_process_zero:
            return
        for name in trainer.reward_func_names:
            means = [r.get(f"rewards/{name}/mean") for r in rows]
            stds = {r.get(f"rewards/{name}/std") for r in rows}
            if all(map(_number, means)) and stds == {0} and len(set(means)) == 1:
                constant[name] = f"{means[0]:g}"
            elif all(f"rewards/{name}/mean" in r and (m is None or m != m) for r, m in zip(rows, means)):
                constant[name] = "None"
        if not (zero_spread := all(r.get("frac_reward_zero_std") == 1.0 for r in rows)) and not constant:
            return
        a, b, n = rows[0]["step"], rows[-1]["step"], len(rows)
        where = f"the first {n} logging steps (steps {a}-{b})" if n > 1 else f"the first logging step (step {a})"
        values = ", ".join(f"{name} gave {value}" for name, value in constant.items())
        if zero_spread or set(constant) == set(trainer.reward_func_names):
            spread = "every prompt group had zero reward spread (frac_reward_zero_std = 1)" if zero_spread else (
                "no reward function gave two completions different values")  # fmt: skip
            text = f"No learning signal. In {where}, {spread}, so every advantage and the gradient were 0"
            text += f"; the reward functions gave every completion the same value ({values})." if constant else "."
        else:
            text = f"A reward function gave every completion the same value in {where} ({values}): it adds nothing."
        fmt = "The prompt format: the model gets no correct answer to prompts unlike those it was trained on."
        try:
            prompt = trainer.train_dataset[0]["prompt"]
        except (KeyError, IndexError, TypeError, NotImplementedError):
            prompt = None
        if isinstance(prompt, str) and getattr(trainer.processing_class, "chat_template", None):
            fmt += " Your prompts are plain text, so TRL does not apply the model's chat template."
        contents = [m.get("content") for m in prompt if isinstance(m, dict)] if isinstance(prompt, list) else [prompt]
        for content in [c for c in contents if isinstance(c, str)]:
            if len(tail := content.strip()[-40:]) >= 20 and content.count(tail) > 1:
                fmt += f" Your prompts hold their instruction twice ({tail!r} repeated)."
        path = getattr(getattr(trainer.model, "config", None), "_name_or_path", None)
        model = read_builtin_info(path)["name"][8:] if path and os.path.isfile(os.path.join(path, INFO_FILE)) else None
        why = {"tiny-random": " has random weights: it answers nothing correctly, whatever the prompt.",
               "smollm2-135m": ", as shipped, solves almost no two-digit addition at temperature 1.",
               "gemma3-270m": " is a base model: it rarely ends with a \\boxed{} answer."}  # fmt: skip
        why = why.get(model, f" was trained on one prompt format only: {format_prompt('47+38')}.")
        columns = ", ".join(c for c in getattr(trainer.train_dataset, "column_names", None) or [] if c != "prompt")
        clipped = all(r.get("completions/clipped_ratio") == 1.0 for r in rows)
        causes = [f"The length: every completion was cut at max_completion_length={trainer.args.max_completion_length}"
                  " (completions/clipped_ratio = 1), before its answer: raise it."] if clipped else []  # fmt: skip
        causes += [f"{fmt} builtin:{model}{why}" if model in BUILTIN_MODELS else fmt, "The reward: call "
                   f"{', '.join(constant) or 'your reward'} on a right and a wrong completion: they must differ.",
                   "The columns: TRL passes each column but `prompt` to the rewards by name"
                   f"{f' (here: {columns})' if columns else ''}; check the one it reads."]  # fmt: skip
        logger.warning(f"{text} Likely causes: " + " ".join(f"({i}) {c}" for i, c in enumerate(causes, 1)))
