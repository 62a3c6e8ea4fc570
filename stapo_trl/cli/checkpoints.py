"""Which checkpoint a `stapo-train` run resumes (the newest complete one), and whether its settings allow it."""

from __future__ import annotations

import json
import logging
import os

import torch
from transformers import TrainerCallback
from transformers.trainer import TRAINING_ARGS_NAME

from ..runfiles.model_card import RESUME_FIXED_FIELDS
from ..runfiles.run_folder import checkpoint_problem, newest_complete_checkpoint, resume_checkpoint


logger = logging.getLogger(__name__)

SETTINGS_KEY = "stapo_train"  # the entry of trainer_state.json's `stateful_callbacks` that [`RunSettings`] writes


def _checkpoint_state(checkpoint: str) -> dict:
    with open(os.path.join(checkpoint, "trainer_state.json"), encoding="utf-8") as f:
        return json.load(f)


def check_resume_from_checkpoint(training_args) -> None:
    """Refuse a `resume_from_checkpoint` that is not a complete checkpoint folder, before any model is built
    ([`~stapo_trl.runfiles.run_folder.checkpoint_problem`]).

    Raises:
        ValueError: naming the field, the path, what it is instead (missing, a file, a run folder, a checkpoint whose
            save did not finish) and what to give.
    """
    path = training_args.resume_from_checkpoint
    problem = checkpoint_problem(path, training_args.save_only_model) if isinstance(path, str) and path else None
    if problem is None:
        return
    if problem == "not a folder":
        problem = "is a file" if os.path.exists(path) else "does not exist"
    elif newest := newest_complete_checkpoint(path)[0]:
        problem = f"is a run folder, not a checkpoint: give one of its checkpoints ({os.path.basename(newest)})"
    else:
        problem = f"is not a complete checkpoint ({problem})"
    raise ValueError(
        f"resume_from_checkpoint={path!r} {problem}. Give a complete checkpoint folder (<output_dir>/checkpoint-"
        "<step>), or leave it unset: a run resumes from the newest complete checkpoint in its output_dir by itself."
    )


class RunSettings(TrainerCallback):
    """Record what a run trains on beyond its `training_args.bin` (trainer, model, dataset, rewards; local paths made
    absolute) in each checkpoint's `trainer_state.json`, as an entry of the `stateful_callbacks` that transformers
    saves as is, for [`check_resume_settings`] to compare on resume."""

    def __init__(self, script_args, model_args):
        names = (model_args.model_name_or_path, script_args.dataset_name)
        model, dataset = (os.path.abspath(name) if name and os.path.exists(name) else name for name in names)
        self.settings = {"trainer": script_args.trainer, "model_name_or_path": model, "dataset_name": dataset}
        self.settings |= {"dataset_config": script_args.dataset_config, "reward_funcs": list(script_args.reward_funcs)}

    def on_train_begin(self, args, state, control, **kwargs):
        state.stateful_callbacks[SETTINGS_KEY] = self.settings


def check_resume_settings(training_args, script_args, model_args) -> None:
    """Refuse to resume the checkpoint `stapo-train` would resume (`resume_from_checkpoint`, else the newest complete
    one) with other S2T or objective settings ([`~stapo_trl.runfiles.model_card.RESUME_FIXED_FIELDS`], from its
    `training_args.bin`: the model card states one value of each), or another trainer, model, dataset or rewards
    ([`RunSettings`]). `max_steps` and the batch geometry may change. An unreadable `training_args.bin` (another
    version's) is said in one warning line.

    Raises:
        ValueError: naming each changed field with its old and new value; or a `resume_from_checkpoint` that is not a
            complete checkpoint ([`check_resume_from_checkpoint`]).
    """
    check_resume_from_checkpoint(training_args)
    checkpoint = training_args.resume_from_checkpoint
    checkpoint = checkpoint or newest_complete_checkpoint(training_args.output_dir, training_args.save_only_model)[0]
    if checkpoint is None:
        return
    changed = []
    try:
        saved = torch.load(os.path.join(checkpoint, TRAINING_ARGS_NAME), weights_only=False)  # the run's own config
        for name in RESUME_FIXED_FIELDS:
            old, new = getattr(saved, name, None), getattr(training_args, name, None)
            if hasattr(saved, name) and hasattr(training_args, name) and old != new:
                changed.append(f"{name} {old!r} -> {new!r}")
    except Exception as e:  # noqa: BLE001 (missing, or pickled by another version)
        logger.warning(
            f"{checkpoint}/{TRAINING_ARGS_NAME} cannot be read ({type(e).__name__}: {str(e)[:100]}): the S2T and "
            "objective settings of this run are not compared with those it was trained with."
        )
    recorded = _checkpoint_state(checkpoint).get("stateful_callbacks", {}).get(SETTINGS_KEY) or {}
    current = RunSettings(script_args, model_args).settings
    changed += [
        f"{key} {recorded[key]!r} -> {value!r}" for key, value in current.items() if recorded.get(key, value) != value
    ]
    if changed:
        raise ValueError(
            f"{training_args.output_dir} holds {os.path.basename(checkpoint)}, trained with other settings ("
            + ", ".join(changed)
            + "): resuming would mix them and the model card could state only one. Use another output_dir (with "
            f"model_name_or_path {checkpoint} to start from it), or the checkpoint's values."
        )


def resolve_checkpoint(training_args) -> tuple[str | None, str | None]:
    """(the checkpoint to resume from, the same checkpoint when it already reached `max_steps`, else `None`): the
    newest complete one in `output_dir`, said in one line with those it skipped, unless `resume_from_checkpoint`
    names one ([`~stapo_trl.runfiles.run_folder.resume_checkpoint`])."""
    checkpoint = training_args.resume_from_checkpoint or resume_checkpoint(
        training_args.output_dir, training_args.save_only_model
    )
    # A checkpoint already at max_steps: `Trainer.train` would run one step past it (transformers 5.24), so training
    # is skipped and the checkpoint is what gets saved and evaluated (this also finishes a run that stopped after its
    # last checkpoint but before saving the final model).
    already_trained = None
    if checkpoint is not None and training_args.max_steps > 0:
        done = _checkpoint_state(checkpoint)["global_step"]
        if done >= training_args.max_steps:
            already_trained = checkpoint
            logger.warning(
                f"{checkpoint} is at step {done} >= max_steps={training_args.max_steps}: training is already complete, "
                "nothing is trained. The checkpoint is saved as the final model (and evaluated). To train anew use "
                "another output_dir; to continue, raise max_steps."
            )
    return checkpoint, already_trained
