"""Which checkpoint a `stapo-train` run resumes, and whether its settings allow it (the card states them once)."""

from __future__ import annotations

import json
import logging
import os

import torch
from transformers.trainer import TRAINING_ARGS_NAME
from transformers.trainer_utils import get_last_checkpoint

from ..runfiles.model_card import (
    RESUME_FIXED_FIELDS,
)


logger = logging.getLogger(__name__)


def _checkpoint_step(checkpoint: str) -> int | None:
    """The `global_step` recorded in a checkpoint's `trainer_state.json`, or `None` if it cannot be read."""
    try:
        with open(os.path.join(checkpoint, "trainer_state.json"), encoding="utf-8") as f:
            return int(json.load(f)["global_step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def check_resume_from_checkpoint(training_args) -> None:
    """Refuse a `resume_from_checkpoint` that is not a checkpoint folder (one holding `trainer_state.json`), before any
    model is built: `Trainer.train` would only find out after the model was built and evaluated.

    Raises:
        ValueError: naming the field, the path, what it is instead (missing, a file, a folder without a checkpoint,
            a run folder with its checkpoints listed) and what to give.
    """
    path = training_args.resume_from_checkpoint
    if not isinstance(path, str) or not path:
        return
    if os.path.isfile(os.path.join(path, "trainer_state.json")):
        return
    if not os.path.exists(path):
        problem = "does not exist"
    elif not os.path.isdir(path):
        problem = "is a file"
    else:
        steps = {name: _checkpoint_step(os.path.join(path, name)) for name in os.listdir(path)}
        checkpoints = sorted((name for name, step in steps.items() if step is not None), key=steps.__getitem__)
        problem = (
            f"is a run folder, not a checkpoint: give one of its checkpoints ({', '.join(checkpoints)})"
            if checkpoints
            else "is a folder without trainer_state.json, so not a checkpoint"
        )
    raise ValueError(
        f"resume_from_checkpoint={path!r} {problem}. Give a checkpoint folder (<output_dir>/checkpoint-<step>), or "
        "leave it unset: a run resumes from the last checkpoint in its output_dir by itself."
    )


def check_resume_settings(training_args) -> None:
    """Refuse to resume the checkpoint `stapo-train` would resume (`resume_from_checkpoint`, else the last one in
    `output_dir`) with other S2T or objective settings than it was trained with
    ([`~stapo_trl.runfiles.model_card.RESUME_FIXED_FIELDS`], read from its `training_args.bin`): the run would mix them, and the
    model card states one value of each. `max_steps` and the batch geometry may change.

    Raises:
        ValueError: naming each changed field with its old and new value; or a `resume_from_checkpoint` that is not a
            checkpoint ([`check_resume_from_checkpoint`]).
    """
    check_resume_from_checkpoint(training_args)
    checkpoint = _checkpoint_to_resume(training_args)
    if not isinstance(checkpoint, str):
        return
    path = os.path.join(checkpoint, TRAINING_ARGS_NAME)
    try:
        saved = torch.load(path, weights_only=False)  # the run's own pickled config, written by Trainer
    except Exception:  # noqa: BLE001 (missing, or from another version: nothing to compare against)
        return
    changed = [
        f"{name} {getattr(saved, name)!r} -> {getattr(training_args, name)!r}"
        for name in RESUME_FIXED_FIELDS
        if hasattr(saved, name)
        and hasattr(training_args, name)
        and getattr(saved, name) != getattr(training_args, name)
    ]
    if changed:
        raise ValueError(
            f"{training_args.output_dir} holds {os.path.basename(checkpoint)}, trained with other settings ("
            + ", ".join(changed)
            + "): resuming would mix them and the model card could state only one. Use another output_dir (with "
            f"model_name_or_path {checkpoint} to start from it), or the checkpoint's values."
        )


def _checkpoint_to_resume(training_args) -> str | None:
    """`resume_from_checkpoint`, else the last checkpoint in `output_dir`, else `None`: the one rule of [`prepare`]'s
    settings check and of [`resolve_checkpoint`]."""
    last_checkpoint = None
    if os.path.isdir(training_args.output_dir):
        last_checkpoint = get_last_checkpoint(training_args.output_dir)
    return training_args.resume_from_checkpoint or last_checkpoint


def resolve_checkpoint(training_args) -> tuple[str | None, str | None]:
    """(the checkpoint to resume from, the same checkpoint when it already reached `max_steps`, else `None`)."""
    checkpoint = _checkpoint_to_resume(training_args)
    if checkpoint is not None and training_args.resume_from_checkpoint is None:
        logger.warning(f"Checkpoint found in {training_args.output_dir}: resuming training from {checkpoint}.")
    # A checkpoint already at max_steps: `Trainer.train` would run one step past it (transformers 5.24), so training
    # is skipped and the checkpoint is what gets saved and evaluated (this also finishes a run that stopped after its
    # last checkpoint but before saving the final model).
    already_trained = None
    if checkpoint is not None and training_args.max_steps > 0:
        done = _checkpoint_step(checkpoint)
        if done is not None and done >= training_args.max_steps:
            already_trained = checkpoint
            logger.warning(
                f"{checkpoint} is at step {done} >= max_steps={training_args.max_steps}: training is already complete, "
                "nothing is trained. The checkpoint is saved as the final model (and evaluated). To train anew use "
                "another output_dir; to continue, raise max_steps."
            )
    return checkpoint, already_trained
