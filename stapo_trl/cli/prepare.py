"""[`prepare`]: everything a `stapo-train` run can fail on before a model is built (datasets, rewards, the model
argument, the checkpoint settings, the Hub), as a [`PreparedRun`]; the dry run reads the same prompts."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Any

from transformers import AutoConfig, AutoTokenizer
from trl import ModelConfig

from ..data import (
    CLI_CHAT_TEMPLATE_FIX,
    check_chat_template,
    check_reward_columns,
    evaluation_split,
    filter_long_prompts,
    is_local_dataset_file,
    load_prompt_dataset,
    model_max_positions,
    prompt_token_budget,
    report_dropped,
)
from ..integrations.hub import check_hub_access, check_hub_dataset
from ..models import check_model_available, resolve_model_path
from ..models.cache import weight_files
from ..rewards import get_reward_funcs
from ..run_folder.checkpoints import check_output_dir, check_run_settings, hold_run_folder, resume_checkpoint
from .args import prompt_dataset_kwargs
from .checkpoints import check_resume_from_checkpoint, cli_run_settings
from .dry_run import benchmark_eval_error, too_few_prompts
from .script_args import STAPOScriptArguments


logger = logging.getLogger(__name__)


@dataclass
class PreparedRun:
    """Everything `train` needs that can be checked without building a model (see [`prepare`])."""

    reward_funcs: list
    model_path: str
    train_dataset: Any
    test_dataset: Any | None  # what eval_strategy evaluates: the test split, or benchmark_eval's problems
    eval_dataset: Any | None  # the before/after evaluation problems (first eval_num_problems of the test split)
    settings: dict[str, Any]  # what the run optimizes: its record in each checkpoint (cli_run_settings)
    checkpoint: str | None = None  # the checkpoint to resume (the newest complete one, or resume_from_checkpoint)
    seconds: float = 0.0  # wall time of `prepare` (a first `builtin:` model build included)


def is_builtin_or_local(name: str | None) -> bool:
    return bool(name) and (name.startswith("builtin:") or os.path.exists(name))


def _benchmark_eval_dataset(script_args: STAPOScriptArguments, training_args, reward_funcs):
    """The problems of `benchmark_eval` as the trainer's `eval_dataset` (`prompt`, `solution`), with TRL's evaluation
    set on `training_args`: `eval_strategy` `"steps"` (unless set), `eval_steps` (`benchmark_eval_steps`, else
    `eval_steps`, else `logging_steps`), `num_generations_eval` (`benchmark_eval_samples`); `None` without it.

    Raises:
        ValueError: a setting TRL's evaluation cannot honour ([`benchmark_eval_error`]), a benchmark that cannot be
            loaded, or a column a reward function reads that the benchmark lacks.
    """
    from transformers.trainer_utils import IntervalStrategy

    from ..evaluation.tasks import benchmark_dataset, load_benchmark

    a = script_args
    if a.benchmark_eval is None:
        return None
    try:
        problems = load_benchmark(a.benchmark_eval, a.benchmark_eval_data_dir, a.benchmark_eval_limit)
    except RuntimeError as e:  # the Hub copy cannot be loaded
        raise ValueError(f"benchmark_eval={a.benchmark_eval!r}: {e}") from e
    error = benchmark_eval_error(a, training_args, training_args.world_size, len(problems))
    if error:
        raise ValueError(error)
    dataset = benchmark_dataset(problems, prompt_dataset_kwargs(a)["instruction"])
    check_reward_columns(reward_funcs, dataset, f"benchmark_eval={a.benchmark_eval!r}")
    if training_args.eval_strategy == "no" or a.benchmark_eval_steps is not None:
        training_args.eval_strategy, training_args.do_eval = IntervalStrategy.STEPS, True
        training_args.eval_steps = a.benchmark_eval_steps or training_args.eval_steps or training_args.logging_steps
    training_args.num_generations_eval = a.benchmark_eval_samples
    return dataset


def prepare(script_args: STAPOScriptArguments, training_args, model_args: ModelConfig) -> PreparedRun:
    """Validate the run and load what is cheap to load, before any model is built, in order: the reward names, the
    model argument (checked, not loaded), the hold on `output_dir` (its links and write access checked) and, holding
    it, the checkpoint to resume (the newest complete one, the damaged ones above it moved aside) and its settings;
    then the dataset (the train split; the test split for the before/after evaluation or `eval_strategy`) with its
    columns and rows, the in-training benchmark name, the model path (a `builtin:` model is built into its cache on
    first use), with its tokenizer the chat template and the `max_prompt_tokens` filter. Every failure is one
    exception, one line (the hold given back). With `benchmark_eval`, the benchmark's problems are what
    `eval_strategy` evaluates ([`_benchmark_eval_dataset`]).

    Raises:
        ValueError: an unknown reward, benchmark or `builtin:` name; no `dataset_name`; `dataset_streaming`; a missing
            column, or one a reward function reads ([`~stapo_trl.data.check_reward_columns`]); fewer
            training prompts than one rollout step takes; a `benchmark_eval*` setting TRL cannot honour; a
            `resume_from_checkpoint` that is not a complete checkpoint; a checkpoint trained with other settings
            ([`~stapo_trl.run_folder.checkpoints.check_run_settings`]); an `output_dir` that holds the user's own files, another
            run writes or cannot be written ([`~stapo_trl.run_folder.checkpoints.hold_run_folder`]); a tokenizer without a chat
            template.
        FileNotFoundError: a model or dataset path that does not exist; offline, a Hub id not cached.
        ConnectionError: a Hub model or dataset id neither cached nor reachable; `push_to_hub` without Hub access
            ([`~stapo_trl.integrations.hub`]).
    """
    start = time.perf_counter()
    reward_funcs = get_reward_funcs(script_args.reward_funcs)

    if not model_args.model_name_or_path:
        raise ValueError("model_name_or_path is not set: give a Hub id, a local model directory or builtin:tiny-math.")
    check_model_available(model_args.model_name_or_path, model_args.model_revision)  # before any data is loaded
    if training_args.push_to_hub:  # offline, no token, Hub unreachable: now, not after training
        check_hub_access(training_args.hub_model_id, training_args.output_dir, training_args.hub_token)
    check_resume_from_checkpoint(training_args)  # a folder that is not a complete checkpoint: now
    if script_args.dataset_name is None:
        raise ValueError(
            "dataset_name is not set: give builtin:tiny-math, a local .json/.jsonl/.parquet/.csv file or a Hub id."
        )
    if script_args.dataset_streaming:
        raise ValueError("dataset_streaming=True is not supported by stapo-train: set it to false.")
    settings = cli_run_settings(script_args, training_args, model_args, reward_funcs)
    # This run is the folder's one writer (another's refused) until it ends. The folder is checked now (links, write
    # access, the user's own files); one that exists is held now, and its checkpoint and settings checked below, before
    # the data is read; a new one once the rest has passed (a refused run leaves no folder).
    output_dir, writer = training_args.output_dir, training_args.should_save
    held = writer and os.path.isdir(output_dir)
    if writer:
        check_output_dir(output_dir, refuse_user_files=True)
    if held:
        hold_run_folder(output_dir)
    try:
        checkpoint = training_args.resume_from_checkpoint or resume_checkpoint(
            output_dir, training_args.save_only_model, move_aside=held
        )
        if checkpoint is not None:
            check_run_settings(checkpoint, settings)
        elif model := _trained_model(output_dir):
            raise ValueError(
                f"output_dir={output_dir!r} holds a trained model ({model}) but no complete checkpoint "
                "to resume: this run would train from the start and overwrite it. Give another output_dir, or move "
                "the model away to train again."
            )
        loaded = _load(script_args, training_args, model_args, reward_funcs)
        if writer and not held:
            hold_run_folder(output_dir)
    except BaseException:
        if held:
            hold_run_folder(output_dir, acquire=False)
        raise
    return PreparedRun(reward_funcs, *loaded, settings, checkpoint, time.perf_counter() - start)


def _load(script_args: STAPOScriptArguments, training_args, model_args: ModelConfig, reward_funcs) -> tuple:
    """(model path, train, test and before/after eval datasets), as [`prepare`] loads them."""
    if not is_builtin_or_local(script_args.dataset_name) and not is_local_dataset_file(script_args.dataset_name):
        check_hub_dataset(script_args.dataset_name)  # a Hub id nobody can download: now, in one line
    train_dataset, test_dataset, eval_dataset = _load_datasets(script_args, training_args, reward_funcs)
    benchmark = _benchmark_eval_dataset(script_args, training_args, reward_funcs)
    test_dataset = test_dataset if benchmark is None else benchmark
    # Last: a `builtin:` model is built (about 30 s, once) when it is not cached yet.
    model_path = resolve_model_path(model_args.model_name_or_path)
    tokenizer = AutoTokenizer.from_pretrained(
        model_path, revision=model_args.model_revision, trust_remote_code=training_args.trust_remote_code
    )
    # stapo-train's prompts are chat messages: a model without a chat template fails at TRL's first step otherwise.
    check_chat_template(
        tokenizer, train_dataset, model_args.model_name_or_path, script_args.dataset_name, CLI_CHAT_TEMPLATE_FIX,
        training_args.chat_template_kwargs,
    )  # fmt: skip
    train_dataset, where = _drop_long_prompts(
        train_dataset, tokenizer, model_path, script_args, training_args, model_args
    )
    # TRL's sampler yields whole rollout batches only: fewer prompts than one needs would train 0 steps.
    error = too_few_prompts(
        len(train_dataset), training_args.generation_batch_size // training_args.num_generations, where
    )
    if error is not None:
        raise ValueError(error)
    return model_path, train_dataset, test_dataset, eval_dataset


def _trained_model(output_dir: str) -> str | None:
    """The weights file of a model saved in `output_dir` itself (a finished run's), or `None`."""
    return next(iter(weight_files(sorted(os.listdir(output_dir)) if os.path.isdir(output_dir) else [])), None)


def _load_datasets(script_args: STAPOScriptArguments, training_args, reward_funcs):
    """(train, test, before/after eval) prompt datasets, the last two `None` when not needed; every column a reward
    function reads is checked here ([`~stapo_trl.data.check_reward_columns`])."""
    load_kwargs = prompt_dataset_kwargs(script_args)
    name, limit = script_args.dataset_name, script_args.max_train_samples
    train_dataset = load_prompt_dataset(name, split=script_args.dataset_train_split, limit=limit, **load_kwargs)
    test_dataset = eval_dataset = None
    periodic = training_args.eval_strategy != "no" and script_args.benchmark_eval is None  # else the benchmark's
    if script_args.eval_before_after or periodic:
        test_dataset = load_prompt_dataset(
            script_args.dataset_name, split=script_args.dataset_test_split, **load_kwargs
        )
        if script_args.eval_before_after:
            eval_dataset = test_dataset.select(range(min(script_args.eval_num_problems, len(test_dataset))))
            _, warning = evaluation_split(script_args.dataset_name, script_args.dataset_test_split)
            if warning is not None:
                logger.warning(warning)
    # Every reward argument filled by a column: the trainer's own check, run here before a `builtin:` model build.
    check_reward_columns(reward_funcs, train_dataset, script_args.dataset_name)
    if periodic:
        check_reward_columns(
            reward_funcs, test_dataset, f"{script_args.dataset_name} [{script_args.dataset_test_split}]"
        )
    return train_dataset, test_dataset, eval_dataset


def _drop_long_prompts(train_dataset, tokenizer, model_path: str, script_args, training_args, model_args):
    """(the training prompts within the prompt-token budget, where they were counted: for the too-few message).

    Prompts longer than `max_prompt_tokens` or than the model's positions minus `max_completion_length` are dropped
    with one warning line (the rule `stapo-eval` applies too: [`stapo_trl.integrations.hub`]).
    """
    max_positions = model_max_positions(
        AutoConfig.from_pretrained(
            model_path, revision=model_args.model_revision, trust_remote_code=training_args.trust_remote_code
        )
    )
    budget = prompt_token_budget(max_positions, training_args.max_completion_length, script_args.max_prompt_tokens)
    where = "in the train split" if script_args.max_train_samples is None else "with max_train_samples"
    if budget is None:
        return train_dataset, where
    total = len(train_dataset)
    train_dataset = filter_long_prompts(train_dataset, tokenizer, budget, training_args.chat_template_kwargs)
    report_dropped(total, len(train_dataset), budget, what="training prompts")
    if len(train_dataset) < total:
        where = f"after filtering (of {total}; prompt budget {budget} tokens)"
    return train_dataset, where
