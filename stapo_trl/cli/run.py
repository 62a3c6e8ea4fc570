"""One `stapo-train` run from parsed arguments: [`prepare`] (everything that can fail before a model is built) and
[`train`] (resume, build the trainer, evaluate before, train, save with the model card and figures, evaluate after).

This module imports the training stack (TRL's trainer, datasets, math-verify); `stapo_trl.cli.train.main` imports it
after parsing, so that `stapo-train --help` and `--dry-run` stay fast.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shlex
import sys
import time
from dataclasses import dataclass
from typing import Any

import datasets
import torch
import transformers
from transformers import AutoConfig, AutoTokenizer, set_seed
from transformers.trainer import TRAINING_ARGS_NAME
from transformers.trainer_callback import TrainerState
from transformers.trainer_utils import get_last_checkpoint
from trl import GRPOTrainer, ModelConfig, get_peft_config, get_quantization_config
from trl.models.utils import unwrap_model_for_generation

from ..builtin import check_model_available, resolve_model_path
from ..data import evaluation_split, filter_long_prompts, load_prompt_dataset
from ..diagnostic_plots import plot_diagnostics
from ..evaluation.callback import BenchmarkEvalCallback
from ..evaluation.generation import evaluate_avg_at_k
from ..hub import check_hub_access
from ..metrics_log import (
    METRICS_FILENAME,
    SPURIOUS_TOKENS_FILENAME,
    candidate_facts,
    read_metrics,
    read_token_records,
    s2t_totals,
)
from ..model_card import (
    RESUME_FIXED_FIELDS,
)
from ..plots import plot_training_curves
from ..prompt_length import model_max_positions, prompt_token_budget, report_dropped
from ..reward_columns import check_reward_columns
from ..rewards import get_reward_funcs
from ..trainer import GRPOBaselineTrainer, STAPOTrainer
from ..upstream_warnings import QuietKnownUpstreamWarnings
from .args import STAPOScriptArguments, prompt_dataset_kwargs
from .geometry import too_few_prompts
from .interrupt import GracefulInterrupt
from .recipe_checks import parameter_sharding, sharding_error


logger = logging.getLogger(__name__)

EVAL_FILENAME = "eval.json"
CURVES_FILENAME = "training_curves.png"


# ---------------------------------------------------------------------------------------------------------------
# Held-out evaluation (before / after training)
# ---------------------------------------------------------------------------------------------------------------


def _evaluate_trainer_model(trainer, script_args, eval_dataset, max_new_tokens: int) -> dict[str, float]:
    with unwrap_model_for_generation(trainer.model_wrapped, trainer.accelerator) as model:
        return evaluate_avg_at_k(
            model,
            trainer.processing_class,
            eval_dataset["prompt"],
            eval_dataset["solution"],
            k=script_args.eval_num_samples,
            temperature=script_args.eval_temperature,
            top_p=script_args.eval_top_p,
            max_new_tokens=max_new_tokens,
            batch_size=script_args.eval_batch_size,
            seed=trainer.args.seed,
            accelerator=trainer.accelerator,
            chat_template_kwargs=trainer.args.chat_template_kwargs,
        )


# ---------------------------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------------------------


class TrainingInterrupted(KeyboardInterrupt):
    """Training stopped on Ctrl-C after saving a checkpoint (the message says where, and how to resume); a
    `KeyboardInterrupt`, so that callers that handle Ctrl-C handle it too."""


def resume_command(argv: list[str] | None = None) -> str:
    """The command to rerun after an interrupt (a run whose `output_dir` holds a checkpoint resumes from the last one):
    `stapo-train ARGS` for one process; under a multi-process launcher (`WORLD_SIZE` > 1, set by `accelerate launch` /
    `torchrun`) the same launch line, whose options a process cannot see, with this process's training arguments."""
    args = shlex.join(sys.argv[1:] if argv is None else argv)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return f"the same launch command, i.e. accelerate launch [your launch options] -m stapo_trl.cli.train {args}"
    return f"stapo-train {args}"


@dataclass
class PreparedRun:
    """Everything `train` needs that can be checked without building a model (see [`prepare`])."""

    reward_funcs: list
    model_path: str
    train_dataset: Any
    test_dataset: Any | None
    eval_dataset: Any | None  # the before/after evaluation problems (first eval_num_problems of the test split)
    benchmark_callback: (
        Any | None
    )  # a stapo_trl.evaluation.callback.BenchmarkEvalCallback, when `benchmark_eval` is set
    seconds: float = 0.0  # wall time of `prepare` (a first `builtin:` model build included)


def _is_builtin_or_local(name: str | None) -> bool:
    return bool(name) and (name.startswith("builtin:") or os.path.exists(name))


def _benchmark_callback(script_args: STAPOScriptArguments, training_args) -> BenchmarkEvalCallback | None:
    """The in-training benchmark evaluation of `benchmark_eval` (its name is checked here), or `None`.

    Raises:
        ValueError: an unknown benchmark, or `benchmark_eval` with sharded parameters (DeepSpeed ZeRO-3, FSDP).
    """
    if script_args.benchmark_eval is None:
        return None
    error = sharding_error(script_args, parameter_sharding(training_args))  # before the model is built
    if error:
        raise ValueError(error)
    return BenchmarkEvalCallback(  # checks the benchmark name; the problems load at the first eval
        script_args.benchmark_eval,
        data_dir=script_args.benchmark_eval_data_dir,
        samples=script_args.benchmark_eval_samples,
        every_n_steps=script_args.benchmark_eval_steps,
        limit=script_args.benchmark_eval_limit,
        max_new_tokens=script_args.eval_max_new_tokens or training_args.max_completion_length,
        temperature=script_args.eval_temperature,
        top_p=script_args.eval_top_p,
        batch_size=script_args.eval_batch_size,
        seed=training_args.seed,
    )


def prepare(script_args: STAPOScriptArguments, training_args, model_args: ModelConfig) -> PreparedRun:
    """Validate the run and load what is cheap to load, before any model is built.

    In order: the reward names, the model argument (checked, not loaded), the dataset (train split, and the test
    split when it is needed: before/after evaluation or `eval_strategy`), its columns, the in-training benchmark name,
    the model path (a `builtin:` model is built into its cache here on first use), then the `max_prompt_tokens`
    filter (with the model's tokenizer).
    Every failure is one exception with one message.

    Raises:
        ValueError: Unknown reward name, no `dataset_name`, `dataset_streaming`, missing column (the prompt or solution
            column, or one a reward function reads: [`~stapo_trl.reward_columns.check_reward_columns`]), unknown
            `builtin:`, fewer training prompts (after the length filter) than one rollout step takes,
            `benchmark_eval` under DeepSpeed ZeRO-3 or FSDP (its evaluation generates on rank 0 alone), a checkpoint
            in `output_dir` trained with other S2T or objective settings ([`_check_resume_settings`]).
        FileNotFoundError: A model or dataset path that does not exist.
        ConnectionError: `push_to_hub` set but the Hub cannot be used (offline, no token, unreachable): one line
            naming `hub_model_id` ([`~stapo_trl.hub.check_hub_access`]).
    """
    start = time.perf_counter()
    reward_funcs = get_reward_funcs(script_args.reward_funcs)

    if not model_args.model_name_or_path:
        raise ValueError("model_name_or_path is not set: give a Hub id, a local model directory or builtin:tiny-math.")
    check_model_available(model_args.model_name_or_path)  # a wrong path fails here, before any data is loaded
    if training_args.push_to_hub:  # offline, no token, Hub unreachable: now, not after training
        check_hub_access(training_args.hub_model_id, training_args.output_dir, training_args.hub_token)
    _check_resume_settings(training_args)  # a checkpoint in output_dir trained with other settings: now
    if script_args.dataset_name is None:
        raise ValueError(
            "dataset_name is not set: give builtin:tiny-math, a local .json/.jsonl/.parquet file or a Hub dataset id."
        )
    if script_args.dataset_streaming:
        raise ValueError("dataset_streaming=True is not supported by stapo-train: set it to false.")
    train_dataset, test_dataset, eval_dataset = _load_datasets(script_args, training_args, reward_funcs)
    benchmark_callback = _benchmark_callback(script_args, training_args)
    # Last: a `builtin:` model is built (about 30 s, once) when it is not cached yet.
    model_path = resolve_model_path(model_args.model_name_or_path)
    train_dataset, where = _drop_long_prompts(train_dataset, model_path, script_args, training_args, model_args)
    # TRL's sampler yields whole rollout batches only: fewer prompts than one needs would train 0 steps.
    error = too_few_prompts(
        len(train_dataset), training_args.generation_batch_size // training_args.num_generations, where
    )
    if error is not None:
        raise ValueError(error)
    return PreparedRun(
        reward_funcs,
        model_path,
        train_dataset,
        test_dataset,
        eval_dataset,
        benchmark_callback,
        time.perf_counter() - start,
    )


def _load_datasets(script_args: STAPOScriptArguments, training_args, reward_funcs):
    """(train, test, before/after eval) prompt datasets, the last two `None` when not needed; every column a reward
    function reads is checked here ([`~stapo_trl.reward_columns.check_reward_columns`])."""
    load_kwargs = prompt_dataset_kwargs(script_args)
    train_dataset = load_prompt_dataset(
        script_args.dataset_name,
        split=script_args.dataset_train_split,
        limit=script_args.max_train_samples,
        **load_kwargs,
    )
    test_dataset = eval_dataset = None
    if script_args.eval_before_after or training_args.eval_strategy != "no":
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
    if training_args.eval_strategy != "no":
        check_reward_columns(
            reward_funcs, test_dataset, f"{script_args.dataset_name} [{script_args.dataset_test_split}]"
        )
    return train_dataset, test_dataset, eval_dataset


def _drop_long_prompts(train_dataset, model_path: str, script_args, training_args, model_args):
    """(the training prompts within the prompt-token budget, where they were counted: for the too-few message).

    Prompts longer than `max_prompt_tokens` or than the model's positions minus `max_completion_length` are dropped
    with one warning line (the rule `stapo-eval` applies too: [`stapo_trl.prompt_length`]).
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
    tokenizer = AutoTokenizer.from_pretrained(
        model_path, revision=model_args.model_revision, trust_remote_code=training_args.trust_remote_code
    )
    total = len(train_dataset)
    train_dataset = filter_long_prompts(train_dataset, tokenizer, budget, training_args.chat_template_kwargs)
    report_dropped(
        total,
        len(train_dataset),
        budget,
        what="training prompts",
        max_positions=max_positions,
        max_new_tokens=training_args.max_completion_length,
    )
    if len(train_dataset) < total:
        where = f"after filtering (of {total}; prompt budget {budget} tokens)"
    return train_dataset, where


def _checkpoint_step(checkpoint: str) -> int | None:
    """The `global_step` recorded in a checkpoint's `trainer_state.json`, or `None` if it cannot be read."""
    try:
        with open(os.path.join(checkpoint, "trainer_state.json"), encoding="utf-8") as f:
            return int(json.load(f)["global_step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _summarize_s2t(rows: list[dict[str, Any]], output_dir: str | None = None) -> dict[str, Any]:
    """The S2T summary of a run's `metrics.jsonl` rows: the mean of the rows' silenced ratios, the pooled ratio of the
    run ([`~stapo_trl.metrics_log.s2t_totals`]) and, with `output_dir`, what its candidates were
    ([`~stapo_trl.metrics_log.candidate_facts`] of `spurious_tokens.jsonl`). Empty without `s2t/` metrics."""
    ratios = [r["s2t/silenced_ratio"] for r in rows if r.get("s2t/silenced_ratio") is not None]
    totals = s2t_totals(rows)
    if not ratios or totals is None:
        return {}
    summary = {
        "mean_silenced_ratio": sum(ratios) / len(ratios),
        "fraction_of_logging_steps_with_silencing": sum(r > 0 for r in ratios) / len(ratios),
        **totals,
    }
    if output_dir is not None and os.path.isfile(os.path.join(output_dir, SPURIOUS_TOKENS_FILENAME)):
        summary["candidates"] = candidate_facts(read_token_records(output_dir))
    return summary


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
        TrainingInterrupted: on Ctrl-C (SIGINT) during training, after the checkpoint of the step it came in; the
            final model, figures and evaluation are skipped. A second Ctrl-C exits the process at once (status 130).

    Returns:
        `dict[str, Any]`: `output_dir`, `global_step`, `eval` (the content of `eval.json`, or `None`), `eval_path`
        (where it was written, see [`eval_results_path`]; `None` off the main process or without evaluation) and `s2t`
        (mean silenced ratio and friends over the logging steps; empty for `trainer: grpo`).
    """
    # Known-harmless upstream warnings, silenced by message and category (stapo_trl.upstream_warnings).
    with torch_threads(script_args.torch_num_threads), QuietKnownUpstreamWarnings() as quiet:
        return _train(script_args, training_args, model_args, prepared, end_training, quiet)


@contextlib.contextmanager
def torch_threads(num_threads: int | None):
    """Run the block with `torch.set_num_threads(num_threads)` and `OMP_NUM_THREADS` set (a `builtin:` model is
    built in a child process), restoring both after, for in-process callers; `None` changes nothing."""
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
        if previous[1] is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = previous[1]


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


def _check_resume_settings(training_args) -> None:
    """Refuse to resume the checkpoint `stapo-train` would resume (`resume_from_checkpoint`, else the last one in
    `output_dir`) with other S2T or objective settings than it was trained with
    ([`~stapo_trl.model_card.RESUME_FIXED_FIELDS`], read from its `training_args.bin`): the run would mix them, and the
    model card states one value of each. `max_steps` and the batch geometry may change.

    Raises:
        ValueError: naming each changed field with its old and new value.
    """
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
    settings check and of [`_resolve_checkpoint`]."""
    last_checkpoint = None
    if os.path.isdir(training_args.output_dir):
        last_checkpoint = get_last_checkpoint(training_args.output_dir)
    return training_args.resume_from_checkpoint or last_checkpoint


def _resolve_checkpoint(training_args) -> tuple[str | None, str | None]:
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


def _build_trainer(script_args, training_args, model_args: ModelConfig, run: PreparedRun) -> GRPOTrainer:
    """The `STAPOTrainer` or `GRPOBaselineTrainer` (their `train()` writes the run files: `metrics.jsonl`, and
    `spurious_tokens.jsonl` for STAPO), with the benchmark evaluation callback."""
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
    if run.benchmark_callback is not None:
        run.benchmark_callback.attach(trainer)  # registers it and logs eval/<benchmark>/* through the trainer
    return trainer


def _fit(trainer, checkpoint: str | None, already_trained: str | None, num_train_samples: int) -> None:
    """Train (resuming from `checkpoint`), or load `already_trained` when it reached `max_steps`; save the state."""
    if already_trained is None:
        trainer.accelerator.print(f"Training with {type(trainer).__name__} ...")
        train_result = trainer.train(resume_from_checkpoint=checkpoint)
        # `None`: a metric with no defined value (TRL's mean of all-NaN values) since the last logging step.
        metrics = {key: value for key, value in train_result.metrics.items() if value is not None}
        metrics["train_samples"] = num_train_samples
        trainer.log_metrics("train", metrics)
        trainer.save_metrics("train", metrics)
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
    card_dataset = None if _is_builtin_or_local(script_args.dataset_name) else script_args.dataset_name
    trainer.create_model_card(
        model_name=os.path.basename(os.path.normpath(output_dir)),
        dataset_name=card_dataset,
        tags=["stapo_trl", script_args.trainer],
    )


def _write_figures(script_args, training_args, output_dir: str) -> list[dict[str, Any]]:
    """`training_curves.png` and the diagnostics figures of the run (main process); returns the metrics rows."""
    if not os.path.isfile(os.path.join(output_dir, METRICS_FILENAME)):
        return []
    rows = read_metrics(output_dir)
    if rows:
        label = f"{script_args.trainer} (seed {training_args.seed})"
        plot_training_curves({label: [rows]}, os.path.join(output_dir, CURVES_FILENAME), title=output_dir)
        plot_diagnostics([output_dir], output_dir, labels=[label])
    return rows


def _eval_record(script_args, training_args, trainer, before, after, max_new_tokens: int) -> dict[str, Any]:
    """The content of `eval.json`: held-out avg@k and pass@k before and after training, with the settings."""
    k = script_args.eval_num_samples
    return {
        "metric": f"avg@{k}",
        "accuracy_before": before[f"avg@{k}"],
        "accuracy_after": after[f"avg@{k}"],
        f"pass@{k}_before": before[f"pass@{k}"],
        f"pass@{k}_after": after[f"pass@{k}"],
        "k": k,
        "temperature": script_args.eval_temperature,
        "top_p": script_args.eval_top_p,
        "top_k": None,
        "max_new_tokens": max_new_tokens,
        "num_problems": before["num_problems"],
        "dataset": script_args.dataset_name,
        "split": evaluation_split(script_args.dataset_name, script_args.dataset_test_split)[0],
        "seed": training_args.seed,
        "trainer": script_args.trainer,
        "global_step": trainer.state.global_step,
    }


def eval_results_path(output_dir: str, global_step: int) -> str:
    """Where this run's before/after results go: `eval.json`, or beside it when `output_dir` already holds one.

    An earlier run's `eval.json` is never replaced (a rerun into a finished run's folder, with another `max_steps` or
    process count, would otherwise overwrite its results silently): the new results go to `eval-step{N}.json`, or
    `eval-step{N}-2.json`, `-3`, ... when that exists too. Continuing a run (raising `max_steps`) stays possible and
    keeps every evaluation.

    Args:
        output_dir (`str`): the run's folder.
        global_step (`int`): the optimizer step the results are for.

    Returns:
        `str`: the path to write.
    """
    path = os.path.join(output_dir, EVAL_FILENAME)
    if not os.path.exists(path):
        return path
    stem = os.path.join(output_dir, f"eval-step{global_step}")
    candidate, n = f"{stem}.json", 1
    while os.path.exists(candidate):
        n += 1
        candidate = f"{stem}-{n}.json"
    return candidate


def _print_summary(script_args, output_dir, step, s2t_summary, eval_record, max_new_tokens, timings) -> None:
    print(f"\n=== {script_args.trainer} run finished: {output_dir} (step {step}) ===")
    if s2t_summary:
        print(
            f"S2T: {s2t_summary['num_silenced']} of {s2t_summary['num_loss_tokens']} loss tokens silenced, pooled "
            f"silenced ratio {s2t_summary['silenced_ratio']:.3g} (mean over logging steps "
            f"{s2t_summary['mean_silenced_ratio']:.3g}); the mask fired at {s2t_summary['rows_with_silencing']} of "
            f"{s2t_summary['num_rows']} logging steps; {s2t_summary['num_candidates']} candidates."
        )
        facts = s2t_summary.get("candidates")
        if facts:
            logged = facts["silenced"] + facts["kept"]
            sample = "all" if logged == s2t_summary["num_candidates"] else f"a sample of {logged}"
            print(
                f"Candidates in spurious_tokens.jsonl ({sample}): {facts['silenced']} silenced, {facts['kept']} kept "
                f"({facts['kept_below']} of them with H < {facts['entropy_below']:g} nats); "
                f"{facts['masks_with_candidates']} masks had a candidate, {facts['masks_with_one_candidate']} exactly "
                f"one (a lone candidate is never silenced: strict H < tau_h)."
            )
    if eval_record is not None:
        print(
            f"Held-out {eval_record['metric']} on {eval_record['num_problems']} problems (T={eval_record['temperature']}, "
            f"top_p={eval_record['top_p']}, {max_new_tokens} new tokens): "
            f"before {100 * eval_record['accuracy_before']:.1f} % -> after {100 * eval_record['accuracy_after']:.1f} %"
        )
    print("Wall time (s): " + ", ".join(f"{name} {value:.0f}" for name, value in timings.items()))


def _write_eval_record(eval_record: dict[str, Any], output_dir: str, global_step: int) -> str:
    """Write the before/after record to `eval.json`, or beside an earlier run's (never over it); return the path."""
    path = eval_results_path(output_dir, global_step)
    if os.path.basename(path) != EVAL_FILENAME:
        logger.warning(
            f"{output_dir} already holds {EVAL_FILENAME} from an earlier run: kept unchanged; these results "
            f"are written beside it, to {os.path.basename(path)}."
        )
    with open(path, "w") as f:
        json.dump(eval_record, f, indent=2)
    return path


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


def _train(
    script_args, training_args, model_args, prepared: PreparedRun | None, end_training: bool, quiet
) -> dict[str, Any]:
    _setup_logging(training_args)
    set_seed(training_args.seed)  # for reproducibility
    logger.info(f"Script parameters {script_args}")
    logger.info(f"Training parameters {training_args}")
    logger.info(f"Model parameters {model_args}")

    # Validate and load data, rewards, model path (no model yet); then the checkpoint, the model and the trainer.
    run = prepared if prepared is not None else prepare(script_args, training_args, model_args)
    timings: dict[str, float] = {"prepare": run.seconds}
    checkpoint, already_trained = _resolve_checkpoint(training_args)
    trainer = _build_trainer(script_args, training_args, model_args, run)
    quiet.watch_model(trainer.model)  # a tied LM head: no "missing keys ['lm_head.weight']" on resume
    is_main = trainer.accelerator.is_main_process
    output_dir = training_args.output_dir
    eval_max_new_tokens = script_args.eval_max_new_tokens or training_args.max_completion_length

    # Evaluate before training
    eval_record = eval_path = None
    if script_args.eval_before_after:
        trainer.accelerator.print(f"Evaluating the initial model on {len(run.eval_dataset)} held-out problems ...")
        start = time.perf_counter()
        before = _evaluate_trainer_model(trainer, script_args, run.eval_dataset, eval_max_new_tokens)
        timings["eval_before"] = time.perf_counter() - start

    # Training loop, then the model, its card and the figures
    start = time.perf_counter()
    interrupt = GracefulInterrupt(trainer)  # Ctrl-C: checkpoint at the next step boundary; twice: quit at once
    trainer.add_callback(interrupt)
    with interrupt:
        _fit(trainer, checkpoint, already_trained, len(run.train_dataset))
    if interrupt.requested:
        step = trainer.state.global_step
        if end_training:
            trainer.end()
        raise TrainingInterrupted(
            f"Interrupted at step {step}: checkpoint saved to {os.path.join(output_dir, f'checkpoint-{step}')}. "
            f"Resume with the same command: {resume_command()}"
        )
    if already_trained is None:
        timings["train"] = time.perf_counter() - start
    _save_model_and_card(trainer, script_args, output_dir)
    rows = _write_figures(script_args, training_args, output_dir) if is_main else []
    s2t_summary = _summarize_s2t(rows, output_dir if is_main else None)

    # Evaluate after training
    if script_args.eval_before_after:
        trainer.accelerator.print("Evaluating the trained model ...")
        start = time.perf_counter()
        after = _evaluate_trainer_model(trainer, script_args, run.eval_dataset, eval_max_new_tokens)
        timings["eval_after"] = time.perf_counter() - start
        eval_record = _eval_record(script_args, training_args, trainer, before, after, eval_max_new_tokens)
        if is_main:
            eval_path = _write_eval_record(eval_record, output_dir, trainer.state.global_step)
            trainer.eval_record = eval_record  # the card's procedure gets the accuracy too
            _write_card(trainer, script_args, output_dir)

    if is_main:
        step = trainer.state.global_step
        _print_summary(script_args, output_dir, step, s2t_summary, eval_record, eval_max_new_tokens, timings)

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
