"""What `stapo-train` resumes: the newest complete checkpoint of `output_dir` (or `resume_from_checkpoint`), refused
when it was trained with other settings than the command's ([`cli_run_settings`]: the library's record plus the prompt
format and the data files' digest), and not trained further when it already reached `max_steps`."""

from __future__ import annotations

import json
import logging
import os

from ..run_folder.checkpoints import check_checkpoint, plain, run_settings


logger = logging.getLogger(__name__)

TRAINER_CLASSES = {"stapo": "STAPOTrainer", "grpo": "GRPOBaselineTrainer"}  # the class `stapo-train` builds


def check_resume_from_checkpoint(training_args) -> None:
    """Refuse a `resume_from_checkpoint` that is not a complete checkpoint folder, before any model is built
    ([`~stapo_trl.run_folder.checkpoints.check_checkpoint`]).

    Raises:
        ValueError: naming the field, the path, what it is instead (missing, a file, a run folder, a checkpoint whose
            save did not finish or with a damaged file) and what to give.
    """
    path = training_args.resume_from_checkpoint
    if isinstance(path, str) and path:
        check_checkpoint(path, f"resume_from_checkpoint={path!r}", training_args.save_only_model)


def cli_run_settings(script_args, training_args, model_args, reward_funcs) -> dict:
    """The run record of a `stapo-train` run ([`~stapo_trl.run_folder.checkpoints.run_settings`]), with its data named
    as the command gives it: the dataset (a local path made absolute), configuration and split, the prompt format
    (instruction, prompt and solution columns, DAPO stripping, the prompt filters) and the SHA-256 of the local data
    files ([`~stapo_trl.data.local_data_digest`]) instead of the fingerprint of the prepared dataset."""
    from trl import get_peft_config

    from ..core.stapo_config import s2t_settings
    from ..data import local_data_digest
    from ..trainer.config import STAPOConfig
    from .args import prompt_dataset_kwargs

    s2t = s2t_settings(training_args, STAPOConfig._s2t_modes) if script_args.trainer == "stapo" else None
    settings = run_settings(
        training_args,
        trainer=TRAINER_CLASSES[script_args.trainer],
        model=model_args.model_name_or_path,
        reward_funcs=reward_funcs,
        s2t=s2t,
        peft_config=get_peft_config(model_args),
        dtype=(training_args.model_init_kwargs or {}).get("dtype", model_args.dtype),  # as the trainer loads it
    )
    del settings["train_dataset"]
    name = script_args.dataset_name
    data = {
        "dataset_name": os.path.abspath(name) if os.path.exists(name) else name,
        **prompt_dataset_kwargs(script_args),
    }
    data |= {
        "dataset_train_split": script_args.dataset_train_split,
        "max_train_samples": script_args.max_train_samples,
    }
    data |= {"max_prompt_tokens": script_args.max_prompt_tokens, "dataset_sha256": local_data_digest(name)}
    return settings | plain(data)


def resolve_checkpoint(training_args, checkpoint: str | None) -> str | None:
    """`checkpoint` when it already reached `max_steps` (nothing is trained: it becomes the final model), else `None`."""
    # A checkpoint already at max_steps: `Trainer.train` would run one step past it (transformers 5.24), so training
    # is skipped and the checkpoint is what gets saved and evaluated (this also finishes a run that stopped after its
    # last checkpoint but before saving the final model).
    if checkpoint is None or training_args.max_steps <= 0:
        return None
    with open(os.path.join(checkpoint, "trainer_state.json"), encoding="utf-8") as f:
        done = json.load(f)["global_step"]
    if done < training_args.max_steps:
        return None
    logger.warning(
        f"{checkpoint} is at step {done} >= max_steps={training_args.max_steps}: training is already complete, "
        "nothing is trained. The checkpoint is saved as the final model (and evaluated). To train anew use "
        "another output_dir; to continue, raise max_steps."
    )
    return checkpoint
