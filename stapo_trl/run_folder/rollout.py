"""The rest of a rollout batch and the logging window in each checkpoint (safetensors and JSON, never a pickle)."""

from __future__ import annotations

import json
import logging
import os

import torch
from safetensors.torch import load_file, save
from transformers import TrainerCallback, TrainerState

from .checkpoints import open_run_file, tensor_specs
from .logs import SpuriousTokenLogger


logger = logging.getLogger(__name__)

FILES = "rollout_state_{}.json", "rollout_state_{}.safetensors"  # a checkpoint's rollout state: manifest, tensors
_LAYOUT = ("per_device_train_batch_size", "steps_per_generation", "gradient_accumulation_steps")
_layout = lambda t: {"world_size": t.accelerator.num_processes, "num_iterations": t.num_iterations} | {  # noqa: E731
    name: getattr(t.args, name) for name in _LAYOUT}  # fmt: skip


def _is_json(value) -> bool:
    try:
        return json.loads(json.dumps(value, allow_nan=False)) == value
    except (TypeError, ValueError):
        return False


def save_rollout_state(trainer, folder: str) -> None:
    """Write `rollout_state_<process>.json` and `.safetensors` (`_step`, unused micro-batches...) in `folder`."""
    spg = trainer.args.steps_per_generation
    every, offset = spg * trainer.num_iterations, trainer._step % (spg * trainer.num_iterations)
    tensors, batches, why = {}, {}, None if trainer.control.should_save else (
        "it was saved inside an optimizer update (transformers' JIT checkpoint)")  # fmt: skip
    if offset and trainer._buffered_inputs is not None:
        for i in range(spg) if every - offset >= spg else range(offset % spg, spg):
            batch = trainer._buffered_inputs[i]
            tensors |= {f"batch.{i}.{k}": v for k, v in batch.items() if isinstance(v, torch.Tensor)}
            values = {k: v for k, v in batch.items() if not isinstance(v, torch.Tensor)}
            batches[str(i)] = {"size": len(batch["advantages"]), "values": values}
            if why is None and (key := next((k for k, v in values.items() if not _is_json(v)), None)):
                kind = type(values[key]).__name__
                why = f"its micro-batch {i} holds {key!r}, a {kind}, which is not saved (no pickle)"
    tensors |= {f"metrics.{k}": torch.tensor(v, dtype=torch.float64) for k, v in trainer._metrics["train"].items()}
    if getattr(trainer, "_tr_loss", None) is not None:
        tensors["loss"] = trainer._tr_loss
    for pending in (c._pending for c in trainer.callback_handler.callbacks if isinstance(c, SpuriousTokenLogger)):
        tensors |= {} if pending is None else {"token_records": pending}
    tensors, batches = ({}, {}) if why else (tensors, batches)
    manifest, path = (os.path.join(folder, name.format(trainer.accelerator.process_index)) for name in FILES)
    with open_run_file(path, "wb") as f:  # copies: views of one batch share memory
        f.write(save({k: v.detach().to("cpu", copy=True).contiguous() for k, v in tensors.items()}))
    with open_run_file(manifest, "w") as f:
        json.dump({"format": 1, "global_step": trainer.state.global_step, "micro_step": trainer._step,
                   "process_index": trainer.accelerator.process_index, **_layout(trainer), "not_saved": why,
                   "last_logged_step": getattr(trainer, "_globalstep_last_logged", trainer.state.global_step),
                   "micro_batches": batches, "tensors": tensor_specs(path)}, f)  # fmt: skip


def load_rollout_state(trainer, checkpoint: str) -> dict | None:
    """This process's rollout state in `checkpoint`, or `None` (one line) where any process has none. A collective."""
    path, tensors_path = (os.path.join(checkpoint, n.format(trainer.accelerator.process_index)) for n in FILES)
    state, why = None, f"it holds no {os.path.basename(path)} (saved before checkpoints held the rollout)"
    try:
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                manifest = json.load(f)
            changed = [f"{k} {manifest.get(k)} -> {v}" for k, v in _layout(trainer).items() if manifest.get(k) != v]
            layout = f"it was saved with another batch layout ({', '.join(changed)})" if changed else None
            why = manifest["not_saved"] or layout
        if why is None:
            tensors, device = load_file(tensors_path), trainer.accelerator.device
            batches = [None] * trainer.args.steps_per_generation
            for i, batch in manifest["micro_batches"].items():
                batches[int(i)] = dict(batch["values"]) | {k.split(".", 2)[2]: v.to(device) for k, v in tensors.items()
                                                            if k.startswith(f"batch.{i}.")}  # fmt: skip
            state = {"micro_step": int(manifest["micro_step"]), "last_logged": int(manifest["last_logged_step"]),
                     "batches": batches if any(batches) else None, "tensors": tensors}  # fmt: skip
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError) as e:
        state, why = None, f"its {os.path.basename(path)} is unreadable ({type(e).__name__})"
    if trainer.accelerator.gather(torch.tensor([why is None], device=trainer.accelerator.device)).all():
        return state
    every = trainer.args.steps_per_generation * trainer.num_iterations
    step = TrainerState.load_from_json(os.path.join(checkpoint, "trainer_state.json")).global_step
    if (offset := step * trainer.args.gradient_accumulation_steps % every) and trainer.accelerator.is_main_process:
        logger.warning(f"Resuming from {checkpoint}, {offset} of the {every} micro-steps of a rollout batch in, with "
                       f"a new rollout: {why or 'another process has no rollout state to restore'}; the rest of this "
                       "batch trains on other completions than the uninterrupted run's.")  # fmt: skip


class RolloutStateCallback(TrainerCallback):
    """Restores `self.state` at `on_train_begin` and draws the prompt orders of the epochs a resume skips."""

    def __init__(self, trainer):
        self.trainer, self.state = trainer, None

    def on_train_begin(self, args, state, control, **kwargs):
        trainer, restored, self.state = self.trainer, self.state, None
        sampler = getattr(trainer, "_train_sampler", None)
        for _ in range(int(state.epoch or 0) if getattr(sampler, "shuffle", False) else 0):
            next(iter(sampler), None)
        if restored is None:
            return
        trainer._step, trainer._globalstep_last_logged = restored["micro_step"], restored["last_logged"]
        trainer._buffered_inputs, tensors = restored["batches"], restored["tensors"]
        trainer._metrics["train"].clear()
        trainer._metrics["train"].update({k[8:]: v.tolist() for k, v in tensors.items() if k.startswith("metrics.")})
        if "loss" in tensors:
            trainer._tr_loss = tensors["loss"].to(trainer._tr_loss.device)
        loggers = [c for c in trainer.callback_handler.callbacks if isinstance(c, SpuriousTokenLogger)]
        for token_logger in loggers if "token_records" in tensors else []:
            token_logger._pending = tensors["token_records"].to(trainer.accelerator.device)
