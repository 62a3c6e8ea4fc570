"""One `stapo-train` run from parsed arguments: [`~stapo_trl.cli.prepare.prepare`] (everything that can fail before a
model is built), then [`train`] (resume, build the trainer, evaluate before, train, save with the model card and
figures, evaluate after, push). The checkpoint rules are in `checkpoints.py`, the run's outputs in `outputs.py`.

This module imports the training stack (TRL's trainer, datasets, math-verify); `stapo_trl.cli.train.main` imports it
after parsing, so that `stapo-train --help` and `--dry-run` stay fast.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
import warnings
from typing import Any

import datasets
import torch
import transformers
from transformers import set_seed
from transformers.trainer_callback import TrainerState
from trl import GRPOTrainer, ModelConfig, get_peft_config, get_quantization_config

from ..data import evaluation_split
from ..rewards import NoRewardWarning, reward_error_line
from ..run_folder.checkpoints import LinkError, command_line, hold_run_folder
from ..trainer.trainers import GRPOBaselineTrainer, STAPOTrainer, tiny_model_threads
from .callbacks import add_command_callbacks
from .checkpoints import resolve_checkpoint
from .errors import InputError, full_disk_in_one_line
from .outputs import (
    evaluate_trainer_model,
    evaluation_kind,
    make_eval_record,
    print_summary,
    summarize_s2t,
    write_eval_record,
    write_figures,
)
from .prepare import PreparedRun, is_builtin_or_local, prepare
from .quiet import quiet_upstream
from .script_args import STAPOScriptArguments


logger = logging.getLogger(__name__)


__all__ = ["prepare", "resume_command", "torch_threads", "train"]


@contextlib.contextmanager
def torch_threads(num_threads: int | None):
    """Run the block on `num_threads` torch threads (`OMP_NUM_THREADS` too, for child processes), restoring both after;
    `None` changes nothing."""
    if num_threads is None:
        yield
        return
    previous = torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")
    torch.set_num_threads(num_threads)
    os.environ["OMP_NUM_THREADS"] = str(num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous[0])
        os.environ.pop("OMP_NUM_THREADS") if previous[1] is None else os.environ.update(OMP_NUM_THREADS=previous[1])


def resume_command(argv: list[str] | None = None) -> str:
    """The command to rerun after an interrupt (a run whose `output_dir` holds a checkpoint resumes from the last one):
    `stapo-train ARGS` for one process; under a multi-process launcher (`WORLD_SIZE` > 1, set by `accelerate launch` /
    `torchrun`) the same launch line, whose options a process cannot see, with this process's training arguments."""
    args = command_line(sys.argv[1:] if argv is None else argv)  # secrets written ***
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return f"the same launch command, i.e. accelerate launch [your launch options] -m stapo_trl.cli.train {args}"
    return f"stapo-train {args}"


def train(
    script_args: STAPOScriptArguments,
    training_args,
    model_args: ModelConfig,
    prepared: PreparedRun | None = None,
    *,
    end_training: bool = True,
) -> dict[str, Any]:
    """Run one training from parsed arguments (what `stapo-train` does after parsing).

    Args:
        script_args, training_args, model_args: what [`parse_args`] returns.
        prepared ([`PreparedRun`], *optional*): what [`prepare`] returns; `None` calls it here.
        end_training (`bool`, *optional*, defaults to `True`): finish the trackers and destroy the process group at
            the end (`Trainer.end`); `False` when more trainings follow in this process (`stapo-train compare`).

    Raises:
        InputError: (status 1) a reward function raised: one line naming it, the step and where.
        KeyboardInterrupt: on Ctrl-C, SIGTERM or SIGUSR1 during training, after the checkpoint of its step (the message
            names the signal, the checkpoint, the command to resume); nothing of a finished run follows.

    Returns:
        `dict[str, Any]`: `output_dir`, `global_step`, `eval` (the content of `eval.json`, or `None`), `eval_path`
        (where it was written, see [`eval_results_path`]; `None` off the main process or without evaluation) and `s2t`
        (mean silenced ratio and friends over the logging steps; empty for `trainer: grpo`).
    """
    threads = script_args.torch_num_threads  # else the tiny-model rule, for the evaluations around training too
    threads = torch_threads(threads) if threads else tiny_model_threads(prepared.model_path if prepared else None)
    with threads, quiet_upstream(), warnings.catch_warnings():  # known-harmless upstream messages (cli/quiet.py)
        warnings.simplefilter("error", NoRewardWarning)  # a step without any reward stops the run
        try:  # the run folder: a full disk said in one line; the hold `prepare` took on it given back at the end
            with full_disk_in_one_line("stapo-train", training_args.output_dir):
                return _train(script_args, training_args, model_args, prepared, end_training)
        except LinkError as e:  # a link planted in the run folder during the run: one line, never followed
            raise InputError("stapo-train", str(e), code=1) from e
        except NoRewardWarning as e:
            raise InputError("stapo-train", f"{e} Make the reward functions return a number for the completions "
                             "they can judge (None only for those they cannot).") from e  # fmt: skip
        except Exception as e:  # a reward function that raised: its name, the step and where, in one line
            line = reward_error_line(e)
            if line is None:
                raise
            raise InputError("stapo-train", line, code=1) from e
        finally:
            if training_args.should_save:
                hold_run_folder(training_args.output_dir, acquire=False)


def _setup_logging(training_args) -> None:
    logging.basicConfig(
        format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S",
        handlers=[logging.StreamHandler(sys.stdout)],
    )
    log_level = training_args.get_process_log_level()
    logger.setLevel(log_level)
    datasets.utils.logging.set_verbosity(log_level)
    transformers.utils.logging.set_verbosity(log_level)
    transformers.utils.logging.enable_default_handler()
    transformers.utils.logging.enable_explicit_format()


def _build_trainer(script_args, training_args, model_args: ModelConfig, run: PreparedRun) -> GRPOTrainer:
    """The `STAPOTrainer` or `GRPOBaselineTrainer` (their `train()` writes the run files: `metrics.jsonl`, and
    `spurious_tokens.jsonl` for STAPO), evaluating `run.test_dataset` on `eval_strategy`'s schedule."""
    model_init_kwargs = {
        "revision": model_args.model_revision,
        "attn_implementation": model_args.attn_implementation,
        "dtype": model_args.dtype,
    }
    model_init_kwargs.update(training_args.model_init_kwargs or {})
    training_args.model_init_kwargs = model_init_kwargs

    trainer_class = STAPOTrainer if script_args.trainer == "stapo" else GRPOBaselineTrainer
    trainer = trainer_class(
        model=run.model_path,
        reward_funcs=run.reward_funcs,
        args=training_args,
        train_dataset=run.train_dataset,
        eval_dataset=run.test_dataset if training_args.eval_strategy != "no" else None,
        quantization_config=get_quantization_config(model_args),
        peft_config=get_peft_config(model_args),
    )
    # Save on Ctrl-C / SIGTERM / SIGUSR1 (then the resume command), one line per log row.
    add_command_callbacks(trainer, resume_hint=f"Resume with the same command: {resume_command()}")
    trainer.run_settings = run.settings  # the record of each checkpoint: with the prompt format and data digest
    return trainer


def _fit(trainer, checkpoint: str | None, already_trained: str | None, num_train_samples: int) -> None:
    """Train (resuming from `checkpoint`), or load `already_trained` when it reached `max_steps`; save the state."""
    if already_trained is None:
        trainer.accelerator.print(f"Training with {type(trainer).__name__} ...")
        train_result = trainer.train(resume_from_checkpoint=checkpoint)
        # `None`: a metric with no defined value (TRL's mean of all-NaN values) since the last logging step.
        metrics = {key: value for key, value in train_result.metrics.items() if value is not None}
        metrics["train_samples"] = num_train_samples
        trainer.save_metrics("train", metrics)  # train_results.json
    else:
        trainer._load_from_checkpoint(already_trained)  # weights (or adapter) only; no optimizer step
        trainer.state = TrainerState.load_from_json(os.path.join(already_trained, "trainer_state.json"))
    trainer.save_state()


def _save_model_and_card(trainer, script_args, output_dir: str) -> None:
    trainer.save_model(output_dir)
    trainer.accelerator.print(f"Model and tokenizer saved to {output_dir}.")
    if trainer.accelerator.is_main_process:
        _write_card(trainer, script_args, output_dir)
        # Restore the KV cache for fast inference (training turns it off).
        trainer.model.config.use_cache = True
        trainer.model.config.save_pretrained(output_dir)


def _write_card(trainer, script_args, output_dir: str) -> None:
    """The run's model card in `output_dir` (the trainer's `create_model_card`: settings, results, quick start)."""
    card_dataset = None if is_builtin_or_local(script_args.dataset_name) else script_args.dataset_name
    trainer.create_model_card(
        model_name=os.path.basename(os.path.normpath(output_dir)),
        dataset_name=card_dataset,
        tags=["stapo_trl", script_args.trainer],
    )


def _push_to_hub(trainer, script_args, training_args, eval_record: dict[str, Any] | None) -> None:
    """Push the model and its card; a failure (network, auth, quota) prints how to push later and keeps every local
    file. No local path, no `builtin:` name, no "[None]" link in the uploaded card; the accuracy in its procedure."""
    output_dir = training_args.output_dir
    try:
        trainer.eval_record = eval_record  # every process (each calls push_to_hub); the main one writes the card
        trainer.push_to_hub(dataset_name=script_args.dataset_name, tags=["stapo_trl", script_args.trainer])
        trainer.accelerator.print(f"Model pushed to the Hub: https://huggingface.co/{trainer.hub_model_id}.")
    except Exception as e:  # noqa: BLE001 (network, auth, quota: the local results stay either way)
        repo = trainer.hub_model_id or training_args.hub_model_id
        trainer.accelerator.print(
            f"Push to hub_model_id={repo!r} failed ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
            f"the model, card and results are in {output_dir}: push them later with `hf upload {repo} {output_dir}`."
        )


def _train(script_args, training_args, model_args, prepared: PreparedRun | None, end_training: bool) -> dict[str, Any]:
    _setup_logging(training_args)
    set_seed(training_args.seed)  # for reproducibility
    logger.info(f"Script parameters {script_args}")
    logger.info(f"Training parameters {training_args}")
    logger.info(f"Model parameters {model_args}")

    # Validate and load data, rewards, model path (no model yet); then the checkpoint, the model and the trainer.
    run = prepared if prepared is not None else prepare(script_args, training_args, model_args)
    timings: dict[str, float] = {"prepare": run.seconds}
    checkpoint = run.checkpoint
    already_trained = resolve_checkpoint(training_args, checkpoint)
    trainer = _build_trainer(script_args, training_args, model_args, run)
    is_main = trainer.accelerator.is_main_process
    output_dir = training_args.output_dir
    eval_max_new_tokens = script_args.eval_max_new_tokens or training_args.max_completion_length

    # Evaluate before training
    eval_record = eval_path = None
    if script_args.eval_before_after:
        kind = evaluation_kind(evaluation_split(script_args.dataset_name, script_args.dataset_test_split)[0])
        trainer.accelerator.print(f"Evaluating the initial model on {len(run.eval_dataset)} {kind} problems ...")
        start = time.perf_counter()
        before = evaluate_trainer_model(trainer, script_args, run.eval_dataset, eval_max_new_tokens)
        timings["eval_before"] = time.perf_counter() - start

    # Training loop, then the model, its card and the figures
    start = time.perf_counter()
    # A stop signal: a checkpoint at the next step boundary, then a KeyboardInterrupt ending with the resume command
    # (stapo_trl.cli.callbacks.SaveOnSignal); a second Ctrl-C quits at once.
    try:
        _fit(trainer, checkpoint, already_trained, len(run.train_dataset))
    except KeyboardInterrupt:
        if end_training:
            trainer.end()
        raise
    if already_trained is None:
        timings["train"] = time.perf_counter() - start
    _save_model_and_card(trainer, script_args, output_dir)
    rows = write_figures(script_args, training_args, output_dir) if is_main else []
    s2t_summary = summarize_s2t(rows, output_dir if is_main else None)

    # Evaluate after training
    if script_args.eval_before_after:
        trainer.accelerator.print("Evaluating the trained model ...")
        start = time.perf_counter()
        after = evaluate_trainer_model(trainer, script_args, run.eval_dataset, eval_max_new_tokens)
        timings["eval_after"] = time.perf_counter() - start
        eval_record = make_eval_record(
            script_args, training_args, trainer, before, after, eval_max_new_tokens, model_args.model_name_or_path
        )
        if is_main:
            eval_path = write_eval_record(eval_record, output_dir, trainer.state.global_step)
            trainer.eval_record = eval_record  # the card's procedure gets the accuracy too
            _write_card(trainer, script_args, output_dir)

    if is_main:
        step = trainer.state.global_step
        print_summary(script_args, output_dir, step, s2t_summary, eval_record, eval_max_new_tokens, timings)

    if training_args.push_to_hub:
        _push_to_hub(trainer, script_args, training_args, eval_record)

    # Finish the trackers and destroy the process group (nothing may communicate after this)
    if end_training:
        trainer.end()

    return {
        "output_dir": output_dir,
        "global_step": trainer.state.global_step,
        "eval": eval_record,
        "eval_path": eval_path,
        "s2t": s2t_summary,
        "seconds": {name: round(value, 1) for name, value in timings.items()},
    }
