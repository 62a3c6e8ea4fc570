"""The rest of a rollout batch and the open logging window in each checkpoint (`rollout_state_<process>.safetensors`
and `.json`, never a pickle), so that a resume from any checkpoint trains as the uninterrupted run."""

from __future__ import annotations

import json
import logging
import os

import torch
from safetensors.torch import load, save
from transformers import TrainerCallback

from .checkpoints import open_run_file, tensor_specs
from .logs import SpuriousTokenLogger


logger = logging.getLogger(__name__)

FILES = "rollout_state_{}.json", "rollout_state_{}.safetensors"  # manifest, tensors; by process index


def _layout(trainer) -> dict:
    names = ("per_device_train_batch_size", "steps_per_generation", "gradient_accumulation_steps")
    layout = {"world_size": trainer.accelerator.num_processes, "num_iterations": trainer.num_iterations}
    return layout | {name: getattr(trainer.args, name) for name in names}


def _is_json(value) -> bool:
    try:
        return json.loads(json.dumps(value, allow_nan=False)) == value
    except (TypeError, ValueError):
        return False


def save_rollout_state(trainer, folder: str) -> None:
    """Write this process's rollout state into the checkpoint `folder`: `_step`, the micro-batches still to be used,
    TRL's pending metrics, the summed loss and the pending token records."""
    spg = trainer.args.steps_per_generation
    every, offset = spg * trainer.num_iterations, trainer._step % (spg * trainer.num_iterations)
    tensors, batches, why = {}, {}, None
    if not trainer.control.should_save:  # transformers' JIT checkpoint
        why = "it was saved inside an optimizer update (transformers' JIT checkpoint)"
    if offset and trainer._buffered_inputs is not None:
        for i in range(spg) if every - offset >= spg else range(offset % spg, spg):
            batch = trainer._buffered_inputs[i]
            tensors |= {f"batch.{i}.{k}": v for k, v in batch.items() if isinstance(v, torch.Tensor)}
            values = {k: v for k, v in batch.items() if not isinstance(v, torch.Tensor)}
            batches[str(i)] = {"size": len(batch["advantages"]), "values": values}
            if why is None and (key := next((k for k, v in values.items() if not _is_json(v)), None)):
                kind = type(values[key]).__name__
                why = f"its micro-batch {i} holds {key!r}, a {kind}, which is not saved (no pickle)"
    for key, values in trainer._metrics["train"].items():
        tensors[f"metrics.{key}"] = torch.tensor(values, dtype=torch.float64)
    if getattr(trainer, "_tr_loss", None) is not None:
        tensors["loss"] = trainer._tr_loss
    if (pending := getattr(_token_logger(trainer), "_pending", None)) is not None:
        tensors["token_records"] = pending
    tensors, batches = ({}, {}) if why else (tensors, batches)
    names = [name.format(trainer.accelerator.process_index) for name in FILES]
    with open_run_file(os.path.join(folder, names[1]), "wb") as f:  # copies: views of one batch share memory
        f.write(save({k: v.detach().to("cpu", copy=True).contiguous() for k, v in tensors.items()}))
    manifest = {
        "format": 1, "global_step": trainer.state.global_step, "micro_step": trainer._step,
        "process_index": trainer.accelerator.process_index, **_layout(trainer),
        "last_logged_step": getattr(trainer, "_globalstep_last_logged", trainer.state.global_step),
        "not_saved": why, "micro_batches": batches,
        "tensors": tensor_specs(os.path.join(folder, names[1])),
    }  # fmt: skip
    with open_run_file(os.path.join(folder, names[0]), "w") as f:
        json.dump(manifest, f)


def _token_logger(trainer) -> SpuriousTokenLogger | None:
    return next((c for c in trainer.callback_handler.callbacks if isinstance(c, SpuriousTokenLogger)), None)


def _read(trainer, checkpoint: str) -> tuple[dict | None, str | None]:  # (the state, None) or (None, why not)
    manifest_path, tensors_path = (
        os.path.join(checkpoint, n.format(trainer.accelerator.process_index)) for n in FILES
    )
    if not os.path.isfile(manifest_path):
        return None, f"it holds no {os.path.basename(manifest_path)} (saved before checkpoints held the rollout)"
    try:
        with open(manifest_path, encoding="utf-8") as f:
            manifest = json.load(f)
        if manifest["not_saved"]:
            return None, manifest["not_saved"]
        if changed := [f"{k} {manifest.get(k)} -> {v}" for k, v in _layout(trainer).items() if manifest.get(k) != v]:
            return None, f"it was saved with another batch layout ({', '.join(changed)})"
        with open(tensors_path, "rb") as f:
            tensors = load(f.read())
        batches = [None] * trainer.args.steps_per_generation
        for i, batch in manifest["micro_batches"].items():
            batches[int(i)] = dict(batch["values"])
        for name, tensor in tensors.items():
            if name.startswith("batch."):
                _, i, key = name.split(".", 2)
                batches[int(i)][key] = tensor.to(trainer.accelerator.device)
        state = {"micro_step": int(manifest["micro_step"]), "last_logged": int(manifest["last_logged_step"])}
        state |= {"batches": batches if any(b is not None for b in batches) else None, "tensors": tensors}
        return state, None
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError) as e:
        return None, f"its {os.path.basename(manifest_path)} is unreadable ({type(e).__name__})"


def load_rollout_state(trainer, checkpoint: str) -> dict | None:
    """This process's rollout state in `checkpoint` (`micro_step`, `last_logged`, `batches` on the device, `tensors`),
    or `None` where any process has none, said in one line. A collective."""
    state, why = _read(trainer, checkpoint)
    if trainer.accelerator.gather(torch.tensor([why is None], device=trainer.accelerator.device)).all():
        return state
    with open(os.path.join(checkpoint, "trainer_state.json"), encoding="utf-8") as f:
        step = int(json.load(f)["global_step"])
    every = trainer.args.steps_per_generation * trainer.num_iterations
    offset = step * trainer.args.gradient_accumulation_steps % every
    if offset and trainer.accelerator.is_main_process:
        logger.warning(
            f"Resuming from {checkpoint}, {offset} of the {every} micro-steps of a rollout batch in, with a new "
            f"rollout: {why or 'another process has no rollout state to restore'}; the rest of this batch trains on "
            "other completions than the uninterrupted run's."
        )
    return None


class RolloutStateCallback(TrainerCallback):
    """Restores `self.state` ([`load_rollout_state`]) at `on_train_begin`, after the run files' callbacks, and draws
    the prompt orders of the epochs a resume skips from TRL's sampler (one a pass, from its own generator)."""

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
        if "token_records" in tensors and (token_logger := _token_logger(trainer)) is not None:
            token_logger._pending = tensors["token_records"].to(trainer.accelerator.device)
