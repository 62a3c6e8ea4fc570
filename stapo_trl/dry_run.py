r"""Dry run of a recipe: parse it, resolve every key, check the batch arithmetic for a process count, print the plan.

    stapo-train --config recipes/Qwen3-1.7B/stapo.yaml --dry-run                      # process count from the recipe
    stapo-train --config recipes/Qwen3-8B/stapo.yaml --dry-run --num-processes 16     # what if: 2 training nodes
    python -m stapo_trl.dry_run --config recipes/Qwen3-8B/stapo.yaml --num-processes 8 --gradient_accumulation_steps 32

Nothing is downloaded and no model is built: the dry run stops where `stapo-train` would start loading data. It
answers "will this recipe start, and what will one step be?" before a multi-node job is queued, and the test suite
runs it over every recipe against the pinned TRL and transformers, so a renamed upstream field fails in CI rather
than on the cluster.

What it checks (failed checks make the exit status 1, a recipe that does not parse 2; warnings are printed):

- every key resolves into `STAPOScriptArguments`, `STAPOConfig` / `GRPOConfig` and `ModelConfig` (unknown keys fail,
  with the closest field names), and the config classes' own `__post_init__` checks pass;
- the batch geometry for `num_processes` training processes: the generation batch
  (`per_device_train_batch_size x num_processes x steps_per_generation`, completions generated at once) holds whole
  groups of `num_generations` and whole global micro-batches; the valid values are listed when it does not;
- the reward names (`stapo_trl.rewards.REWARDS` or dotted paths), the trainer (`stapo` | `grpo`), the dataset and its
  columns (a local .json/.jsonl/.parquet file is opened and its columns checked; a Hub dataset is named, not
  fetched), the model name (`builtin:` names are checked, Hub ids are not fetched);
- warnings for settings the paper did not run: a rollout temperature other than 1.0 (the S2T thresholds are
  calibrated at T = 1), optimizer steps that hold partial prompt groups, `steps_per_generation` not a multiple of
  `gradient_accumulation_steps` (the kept-token normaliser is then estimated), trackers or vLLM not installed here.

The recipe is parsed in this one process, as `stapo-train` parses it on every rank. On a machine without a GPU,
`use_cpu` is forced on for the parse (transformers refuses `bf16: true` on a CPU-only machine); this changes no batch
arithmetic and is stated in the summary.

A recipe's intended process count is read from its `# launch: ... num_processes=N ...` comment line (see
`recipes/README.md`); `--num-processes` overrides it; without either it is 1.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


LAUNCH_LINE = re.compile(r"^#\s*launch:\s*(?P<settings>.*)$")
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
# Trackers `report_to` may name, with the module that must be importable for them.
TRACKER_MODULES = {
    "wandb": "wandb",
    "tensorboard": "tensorboard",
    "trackio": "trackio",
    "comet_ml": "comet_ml",
    "mlflow": "mlflow",
    "clearml": "clearml",
    "dvclive": "dvclive",
    "swanlab": "swanlab",
}
# The paper's batch geometry (STAPO Sec. 4.1): 256 prompts x 8 rollouts per rollout step, 64-prompt updates.
PAPER_PROMPTS_PER_ROLLOUT_STEP, PAPER_PROMPTS_PER_UPDATE, PAPER_NUM_GENERATIONS = 256, 64, 8


# ---------------------------------------------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class DryRunReport:
    """What one step of a recipe will be on `num_processes` training processes, and what is wrong with it.

    Batch sizes count completions, as TRL does (`per_device_train_batch_size` counts completions, not prompts).

    Attributes:
        trainer (`str`): `"stapo"` or `"grpo"`.
        num_processes (`int`): training processes (GPUs) the arithmetic is for.
        per_device_train_batch_size (`int`): completions per process per micro-step.
        gradient_accumulation_steps (`int`): micro-steps per optimizer update.
        steps_per_generation (`int`): micro-steps per rollout (generation) batch on `num_processes` processes.
        num_generations (`int`): completions per prompt.
        generation_batch_size (`int`): completions per rollout step, all processes.
        completions_per_optimizer_step (`int`): completions per optimizer update, all processes.
        prompts_per_rollout_step (`float`): `generation_batch_size / num_generations`.
        prompts_per_optimizer_step (`float`): `completions_per_optimizer_step / num_generations`.
        optimizer_steps_per_rollout_step (`float`): `steps_per_generation / gradient_accumulation_steps`.
        max_prompt_tokens (`int` or `None`): prompts longer than this are dropped (`None`: no limit).
        max_completion_length (`int`): generation budget per completion (tokens).
        max_tokens_per_optimizer_step (`int` or `None`): completions per update x (max prompt + max completion)
            tokens; `None` when the prompt length is unbounded.
        lines (`list[tuple[str, str]]`): (label, value) rows of the printable summary.
        errors (`list[str]`): what makes the recipe fail; empty when it passes.
        warnings (`list[str]`): settings worth a second look.
        notes (`list[str]`): how the dry run itself deviated from a real launch (e.g. `use_cpu` forced on).
        recipe (`str` or `None`): the recipe path, when known.
    """

    trainer: str
    num_processes: int
    per_device_train_batch_size: int
    gradient_accumulation_steps: int
    steps_per_generation: int
    num_generations: int
    generation_batch_size: int
    completions_per_optimizer_step: int
    prompts_per_rollout_step: float
    prompts_per_optimizer_step: float
    optimizer_steps_per_rollout_step: float
    max_prompt_tokens: int | None
    max_completion_length: int
    max_tokens_per_optimizer_step: int | None
    lines: list[tuple[str, str]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    recipe: str | None = None

    @property
    def ok(self) -> bool:
        """Whether the recipe passes (no errors; warnings allowed)."""
        return not self.errors

    def summary(self) -> str:
        """The printable plan: a header, one row per aspect, then errors, warnings and notes."""
        where = f" {self.recipe}" if self.recipe else " the command-line arguments (no --config)"
        status = "OK" if self.ok else f"FAILED ({len(self.errors)} error{'s' * (len(self.errors) != 1)})"
        out = [f"Dry run of{where} for {self.num_processes} training process(es): {status}"]
        width = max(len(label) for label, _ in self.lines) if self.lines else 0
        out += [f"  {label.ljust(width)}  {value}" for label, value in self.lines]
        for title, items in (("Errors", self.errors), ("Warnings", self.warnings), ("Notes", self.notes)):
            if items:
                out.append(f"{title}:")
                out += [f"  - {item}" for item in items]
        return "\n".join(out)

    def raise_for_errors(self) -> None:
        """Raise `ValueError` with every error message when the recipe fails."""
        if self.errors:
            raise ValueError("The recipe fails its dry run:\n" + "\n".join(f"  - {e}" for e in self.errors))


# ---------------------------------------------------------------------------------------------------------------
# The checks
# ---------------------------------------------------------------------------------------------------------------


def _divisors(n: int, minimum: int = 1) -> list[int]:
    return [d for d in range(minimum, n + 1) if n % d == 0]


def _fmt_int(n: float) -> str:
    return f"{int(n):,}" if float(n).is_integer() else f"{n:,.2f}"


def validate_recipe(
    script_args,
    training_args,
    model_args,
    num_processes: int,
    *,
    generation_batch_size: int | None = None,
    recipe: str | None = None,
    cpu_forced: bool = False,
) -> DryRunReport:
    """Check a parsed recipe for `num_processes` training processes, without downloading or building anything.

    The arguments are what `stapo_trl.train.parse_args` returns (parsed in one process, so the config's derived
    `generation_batch_size` is that of one process; the arithmetic here is redone for `num_processes`).

    Args:
        script_args ([`~stapo_trl.train.STAPOScriptArguments`]): trainer, rewards, data.
        training_args ([`~stapo_trl.STAPOConfig`] or [`~trl.GRPOConfig`]): the optimisation settings.
        model_args ([`~trl.ModelConfig`]): model name, dtype, PEFT.
        num_processes (`int`): training processes (GPUs) the recipe will run on, vLLM server GPUs excluded.
        generation_batch_size (`int`, *optional*): the recipe's own `generation_batch_size` when it sets one
            instead of `steps_per_generation` (it then stays fixed when the process count changes). `None`: the
            recipe sets `steps_per_generation` (or leaves it to default to `gradient_accumulation_steps`).
        recipe (`str`, *optional*): the recipe path, for the summary.
        cpu_forced (`bool`, *optional*, defaults to `False`): `use_cpu` was forced on for the parse (no GPU here),
            so CPU-only warnings do not apply.

    Returns:
        [`DryRunReport`]: the plan; `report.ok` is False when the recipe would fail, `report.summary()` prints it.
    """
    from trl import GRPOConfig

    from .config import STAPOConfig
    from .train import TRAINERS

    errors: list[str] = []
    warnings: list[str] = []
    lines: list[tuple[str, str]] = []
    if not isinstance(num_processes, int) or num_processes < 1:
        raise ValueError(
            f"num_processes={num_processes!r} must be a positive integer (training processes, one per GPU)."
        )
    n = num_processes

    # ------------------------------------------------------------------ trainer and its config class
    trainer = script_args.trainer
    if trainer not in TRAINERS:
        errors.append(f"trainer={trainer!r} is not one of {list(TRAINERS)}.")
    is_stapo = isinstance(training_args, STAPOConfig)
    if trainer == "stapo" and not is_stapo:
        errors.append(f"trainer='stapo' needs a STAPOConfig, got {type(training_args).__name__}.")
    if trainer == "grpo" and (is_stapo or not isinstance(training_args, GRPOConfig)):
        errors.append(f"trainer='grpo' needs a plain GRPOConfig, got {type(training_args).__name__}.")
    if is_stapo:
        a = training_args
        lines.append(
            (
                "trainer",
                (
                    f"stapo: STAPOTrainer, S2T mask tau_p={a.s2t_prob_threshold}, q={a.s2t_entropy_quantile}, "
                    f"mode={a.s2t_mode}, scope={a.s2t_scope}"
                ),
            )
        )
    else:
        entropy_mask = training_args.top_entropy_quantile
        extra = f", top_entropy_quantile={entropy_mask}" if entropy_mask < 1.0 else ""
        lines.append(("trainer", f"{trainer}: GRPOTrainer, no S2T mask{extra}"))
    lines.append(
        (
            "objective",
            (
                f"loss_type={training_args.loss_type}, epsilon={training_args.epsilon}/"
                f"{training_args.epsilon_high if training_args.epsilon_high is not None else training_args.epsilon}, "
                f"beta={training_args.beta}, entropy_coef={training_args.entropy_coef}, "
                f"scale_rewards={training_args.scale_rewards}"
            ),
        )
    )

    # ------------------------------------------------------------------ model
    model_name = model_args.model_name_or_path
    if not model_name:
        errors.append("model_name_or_path is not set: give a Hub id, a local model directory or builtin:tiny-math.")
    else:
        from .builtin import check_model_name_or_path

        try:
            check_model_name_or_path(model_name)
        except (ValueError, OSError) as err:
            errors.append(f"model_name_or_path: {err}")
    peft = (
        f"LoRA r={model_args.lora_r}, alpha={model_args.lora_alpha}, targets={model_args.lora_target_modules}"
        if model_args.use_peft
        else "off"
    )
    lines.append(("model", f"{model_name} (dtype {model_args.dtype}, PEFT {peft})"))

    # ------------------------------------------------------------------ data
    from .data import BUILTIN_DATASETS, check_prompt_columns, is_local_dataset_file, load_local_dataset_file
    from .data import BUILTIN_PREFIX as DATA_PREFIX

    dataset = script_args.dataset_name
    # Fields that plain TRL ScriptArguments lack (other scripts' argument classes): absent means "not set".
    max_prompt_tokens = getattr(script_args, "max_prompt_tokens", None)
    if not dataset:
        errors.append(
            "dataset_name is not set: give builtin:tiny-math, a local .json/.jsonl/.parquet file or a Hub id."
        )
        data_line = "(none)"
    elif dataset.startswith(DATA_PREFIX):
        if dataset[len(DATA_PREFIX) :] not in BUILTIN_DATASETS:
            known = ", ".join(DATA_PREFIX + name for name in BUILTIN_DATASETS)
            errors.append(f"dataset_name={dataset!r} is not a built-in dataset; known: {known}.")
        data_line = f"{dataset} (built in: its own prompt/solution columns)"
    else:
        for column in ("prompt_column", "solution_column"):
            if not getattr(script_args, column):
                errors.append(f"{column} is empty: name the dataset column that holds the {column.split('_')[0]}.")
        opened = "named, not opened (a Hub dataset)"
        if is_local_dataset_file(dataset):
            # A local file is cheap to open: check its columns as stapo-train will.
            try:
                local = load_local_dataset_file(dataset)
                check_prompt_columns(local, dataset, script_args.prompt_column, script_args.solution_column)
                opened = f"checked: {len(local)} rows"
            except FileNotFoundError:
                errors.append(f"dataset_name={dataset!r} looks like a local file but does not exist.")
                opened = "missing"
            except ValueError as e:
                errors.append(f"dataset_name={dataset!r}: {e}")
                opened = "column missing"
            except Exception as e:  # noqa: BLE001 (an unreadable file: datasets raises many types)
                errors.append(f"dataset_name={dataset!r} could not be read: {type(e).__name__}: {e}")
                opened = "unreadable"
        config = f" [{script_args.dataset_config}]" if script_args.dataset_config else ""
        data_line = (
            f"{dataset}{config} split {script_args.dataset_train_split}, columns "
            f"{script_args.prompt_column!r} -> {script_args.solution_column!r} ({opened})"
        )
    if getattr(script_args, "strip_dapo_instruction", False):
        data_line += "; DAPO 'Answer:' instruction stripped"
    data_line += (
        f"; prompts > {max_prompt_tokens} tokens dropped" if max_prompt_tokens else "; prompt length unbounded"
    )
    lines.append(("data", data_line))
    if script_args.instruction is None:
        instruction = "(default) the paper's step-by-step / \\boxed{} suffix"
    elif script_args.instruction == "":
        instruction = "(none)"
    else:
        instruction = f'"{script_args.instruction}"'
    lines.append(("instruction", instruction))
    if script_args.dataset_streaming:
        errors.append("dataset_streaming=True is not supported by stapo-train: set it to false.")

    # ------------------------------------------------------------------ rewards
    from .rewards import REWARDS, get_reward_funcs

    try:
        get_reward_funcs(script_args.reward_funcs)
    except ValueError as e:
        errors.append(f"reward_funcs={script_args.reward_funcs!r}: {e} (registry: {sorted(REWARDS)})")
    weights = f", weights {training_args.reward_weights}" if training_args.reward_weights else ""
    lines.append(("rewards", f"{', '.join(script_args.reward_funcs)}{weights}"))

    # ------------------------------------------------------------------ batch arithmetic for n processes
    per_device = training_args.per_device_train_batch_size
    grad_accum = training_args.gradient_accumulation_steps
    num_generations = training_args.num_generations
    global_micro_batch = per_device * n  # completions per micro-step, all processes
    if generation_batch_size is None:
        steps_per_generation = training_args.steps_per_generation
        generation_batch = global_micro_batch * steps_per_generation
    else:
        generation_batch = generation_batch_size
        steps_per_generation = generation_batch // global_micro_batch
        if generation_batch % global_micro_batch != 0:
            valid_n = [p for p in _divisors(generation_batch) if generation_batch % (per_device * p) == 0]
            errors.append(
                f"generation_batch_size={generation_batch} is not a multiple of the global micro-batch "
                f"(per_device_train_batch_size {per_device} x {n} processes = {global_micro_batch}). Valid process "
                f"counts for this batch: {valid_n}; valid per_device_train_batch_size on {n} processes: "
                f"{[d for d in _divisors(generation_batch) if generation_batch % (d * n) == 0]}. Or set "
                "steps_per_generation instead of generation_batch_size."
            )
    if num_generations < 2 or generation_batch % num_generations != 0:
        errors.append(
            f"num_generations={num_generations} does not divide the generation batch ({generation_batch} completions "
            f"= per_device_train_batch_size {per_device} x {n} processes x steps_per_generation "
            f"{steps_per_generation}): every prompt needs a whole group. Valid num_generations: "
            f"{_divisors(generation_batch, 2)}. Or choose per_device_train_batch_size x steps_per_generation as a "
            f"multiple of {num_generations}."
        )
    completions_per_step = global_micro_batch * grad_accum
    updates_per_rollout = steps_per_generation / grad_accum if grad_accum else float("nan")
    if completions_per_step % num_generations != 0:
        warnings.append(
            f"An optimizer update holds {completions_per_step} completions (per_device_train_batch_size {per_device} "
            f"x {n} processes x gradient_accumulation_steps {grad_accum}), not a whole number of prompt groups of "
            f"{num_generations}: the paper's mini-batches are whole prompts (64 prompts x 8)."
        )
    if steps_per_generation % grad_accum != 0:
        warnings.append(
            f"steps_per_generation={steps_per_generation} is not a multiple of gradient_accumulation_steps="
            f"{grad_accum}: an optimizer update spans two rollout batches"
            + (" and STAPO's kept-token normaliser is estimated, not counted exactly." if is_stapo else ".")
        )
    if training_args.eval_strategy != "no":
        eval_generations = training_args.num_generations_eval or num_generations
        eval_batch = training_args.per_device_eval_batch_size * n
        if eval_batch % eval_generations != 0:
            errors.append(
                f"per_device_eval_batch_size {training_args.per_device_eval_batch_size} x {n} processes = "
                f"{eval_batch} "
                f"is not a multiple of the evaluation's num_generations {eval_generations}."
            )
    prompt_budget = max_prompt_tokens
    max_tokens = (
        completions_per_step * (prompt_budget + training_args.max_completion_length) if prompt_budget else None
    )
    lines.append(
        (
            "micro-step",
            f"per_device_train_batch_size {per_device} x {n} processes = {global_micro_batch} completions",
        )
    )
    lines.append(
        (
            "rollout step",
            (
                f"{_fmt_int(generation_batch)} completions = {_fmt_int(generation_batch / num_generations)} prompts x "
                f"{num_generations} generations (steps_per_generation {steps_per_generation})"
            ),
        )
    )
    lines.append(
        (
            "optimizer update",
            (
                f"{_fmt_int(completions_per_step)} completions = {_fmt_int(completions_per_step / num_generations)} "
                f"prompts (gradient_accumulation_steps {grad_accum})"
            ),
        )
    )
    lines.append(
        ("updates / rollout", f"{_fmt_int(updates_per_rollout)} (steps_per_generation / gradient_accumulation_steps)")
    )
    if max_tokens is not None:
        tokens = (
            f"{_fmt_int(max_tokens)} per optimizer update = {completions_per_step} x ({prompt_budget} prompt + "
            f"{training_args.max_completion_length} completion); "
            f"{_fmt_int(max_tokens * updates_per_rollout)} per rollout step"
        )
    else:
        tokens = (
            "unbounded prompts; completions alone up to "
            f"{_fmt_int(completions_per_step * training_args.max_completion_length)}"
            " per optimizer update"
        )
    lines.append(("max tokens", tokens))

    # ------------------------------------------------------------------ optimisation
    horizon = (
        f"max_steps {training_args.max_steps}"
        if training_args.max_steps > 0
        else f"num_train_epochs {training_args.num_train_epochs}"
    )
    lines.append(
        (
            "optimizer",
            (
                f"{training_args.optim.value} lr {training_args.learning_rate:g} "
                f"{training_args.lr_scheduler_type.value} (warmup_steps "
                f"{training_args.warmup_steps}), weight_decay {training_args.weight_decay}, max_grad_norm "
                f"{training_args.max_grad_norm}, {horizon}"
            ),
        )
    )
    lines.append(
        (
            "precision",
            # transformers < 5.24 (the vLLM CPU environment's 5.19) has only the old name
            f"bf16={training_args.bf16}, activation_checkpointing="
            f"{getattr(training_args, 'activation_checkpointing', training_args.gradient_checkpointing)}",
        )
    )

    # ------------------------------------------------------------------ generation
    sampling = (
        f"T={training_args.temperature}, top_p={training_args.top_p}, top_k={training_args.top_k}, "
        f"max_completion_length {training_args.max_completion_length}"
    )
    if training_args.use_vllm:
        if training_args.vllm_mode == "server":
            host = training_args.vllm_server_host
            where = training_args.vllm_server_base_url or f"{host}:{training_args.vllm_server_port}"
            lines.append(
                (
                    "generation",
                    f"vLLM server at {where} (weight sync port {training_args.vllm_group_port}); {sampling}",
                )
            )
            if training_args.use_cpu and not cpu_forced:
                errors.append(
                    "vllm_mode='server' with use_cpu=True: TRL 1.16 syncs weights to the server over NCCL (CUDA only), "
                    "so STAPOTrainer refuses it at construction. On CPU use vllm_mode='colocate' (make install-vllm)."
                )
            elif cpu_forced:
                warnings.append(
                    "vllm_mode='server': the weight sync to the server is CUDA-only (NCCL); this recipe needs GPUs."
                )
            if training_args.vllm_server_base_url is None and host not in LOOPBACK_HOSTS:
                warnings.append(
                    f"vllm_server_host={host!r} is not a loopback address: the trainer expects a vLLM server there "
                    "(scripts/launch.sh serves on 127.0.0.1; slurm/train.slurm sets the vLLM node's address)."
                )
        elif training_args.vllm_mode == "colocate":
            tp = training_args.vllm_tensor_parallel_size
            lines.append(
                (
                    "generation",
                    (
                        f"vLLM colocated in every training process (tensor parallel {tp}, "
                        f"gpu_memory_utilization {training_args.vllm_gpu_memory_utilization}); {sampling}"
                    ),
                )
            )
            if n % tp != 0:
                errors.append(
                    f"vllm_tensor_parallel_size={tp} does not divide the {n} training processes (colocate mode "
                    f"groups processes into tensor-parallel blocks). Valid values: {_divisors(n)}."
                )
            max_len = training_args.vllm_max_model_length
            if max_len is not None and prompt_budget and max_len < prompt_budget + training_args.max_completion_length:
                errors.append(
                    f"vllm_max_model_length={max_len} < max_prompt_tokens {prompt_budget} + max_completion_length "
                    f"{training_args.max_completion_length}: long rollouts would be cut by vLLM."
                )
        else:
            errors.append(f"vllm_mode={training_args.vllm_mode!r} is not 'server' or 'colocate'.")
        if importlib.util.find_spec("vllm") is None:
            warnings.append(
                "use_vllm=True but vllm is not installed here: install the `vllm` extra on the GPU machine."
            )
    else:
        lines.append(("generation", f"transformers generate (no vLLM); {sampling}"))
    if is_stapo and training_args.temperature != 1.0:
        warnings.append(
            f"temperature={training_args.temperature}: the S2T thresholds (tau_p=0.002, q) are calibrated on rollouts "
            "at temperature 1.0 (the paper's setting); probabilities and entropies come from logits scaled by this "
            "temperature, so the silenced set changes."
        )

    # ------------------------------------------------------------------ logging, checkpoints, hardware
    trackers = [t for t in (training_args.report_to or []) if t not in ("none", "all")]
    missing = [t for t in trackers if t in TRACKER_MODULES and importlib.util.find_spec(TRACKER_MODULES[t]) is None]
    if missing:
        warnings.append(f"report_to names {missing}, not installed here: install it where the job runs.")
    save = (
        f"every {training_args.save_steps} optimizer steps (keep {training_args.save_total_limit or 'all'})"
        if training_args.save_strategy == "steps"
        else training_args.save_strategy.value
    )
    lines.append(
        (
            "output",
            (
                f"{training_args.output_dir}; checkpoints {save}; report_to {training_args.report_to}; "
                f"push_to_hub={training_args.push_to_hub}"
            ),
        )
    )
    if training_args.use_cpu and training_args.bf16 and not cpu_forced:
        warnings.append("bf16=True on CPU is about 2.3x slower than float32: set bf16: false for CPU runs.")
    paper_geometry = (PAPER_PROMPTS_PER_ROLLOUT_STEP, PAPER_PROMPTS_PER_UPDATE, PAPER_NUM_GENERATIONS)
    geometry = (generation_batch / num_generations, completions_per_step / num_generations, num_generations)
    if "dapo-math" in str(script_args.dataset_name).lower() and geometry != paper_geometry:
        warnings.append(
            f"the paper's data (DAPO-Math) with another batch geometry: {geometry[0]:g} prompts x {num_generations} "
            f"rollouts per rollout step and {geometry[1]:g}-prompt updates for {n} process(es), vs the paper's 256 "
            "x 8 and 64. recipes/README.md gives per_device_train_batch_size / gradient_accumulation_steps / "
            "steps_per_generation that keep the paper's for 4, 8, 16 and 32 processes."
        )

    return DryRunReport(
        trainer=trainer,
        num_processes=n,
        per_device_train_batch_size=per_device,
        gradient_accumulation_steps=grad_accum,
        steps_per_generation=steps_per_generation,
        num_generations=num_generations,
        generation_batch_size=generation_batch,
        completions_per_optimizer_step=completions_per_step,
        prompts_per_rollout_step=generation_batch / num_generations,
        prompts_per_optimizer_step=completions_per_step / num_generations,
        optimizer_steps_per_rollout_step=updates_per_rollout,
        max_prompt_tokens=max_prompt_tokens,
        max_completion_length=training_args.max_completion_length,
        max_tokens_per_optimizer_step=max_tokens,
        lines=lines,
        errors=errors,
        warnings=warnings,
        recipe=recipe,
    )


# ---------------------------------------------------------------------------------------------------------------
# From a recipe file
# ---------------------------------------------------------------------------------------------------------------


def read_launch_settings(recipe: str) -> dict[str, str]:
    """The `# launch: key=value ...` comment line of a recipe as a dict (empty when the recipe has none).

    Example: `# launch: accelerate_config=zero2 num_processes=4 vllm_gpus=4 nodes=1` ->
    `{"accelerate_config": "zero2", "num_processes": "4", "vllm_gpus": "4", "nodes": "1"}`.
    """
    with open(recipe, encoding="utf-8") as f:
        for line in f:
            match = LAUNCH_LINE.match(line.strip())
            if match:
                pairs = [item.split("=", 1) for item in match.group("settings").split() if "=" in item]
                return {key: value for key, value in pairs}
    return {}


def _recipe_path(argv: Sequence[str]) -> str | None:
    argv = list(argv)
    return argv[argv.index("--config") + 1] if "--config" in argv and argv.index("--config") + 1 < len(argv) else None


def _set_keys(argv: Sequence[str], recipe: str | None) -> dict[str, Any]:
    """The keys the recipe or the command line sets explicitly, with their raw values (the command line wins)."""
    import yaml

    keys: dict[str, Any] = {}
    if recipe is not None:
        with open(recipe, encoding="utf-8") as f:
            keys.update(yaml.safe_load(f) or {})
    argv = list(argv)
    for i, arg in enumerate(argv):
        if arg.startswith("--") and arg != "--config":
            name, _, value = arg[2:].partition("=")
            keys[name] = value if value else (argv[i + 1] if i + 1 < len(argv) else None)
    return keys


def dry_run_recipe(
    argv: Sequence[str], num_processes: int | None = None, *, force_cpu: bool | None = None
) -> DryRunReport:
    """Parse `argv` (`--config RECIPE.yaml [--key value ...]`) as `stapo-train` does and validate it.

    Args:
        argv (`Sequence[str]`): the `stapo-train` arguments, without `--dry-run` / `--num-processes`.
        num_processes (`int`, *optional*): training processes; `None` = the recipe's `# launch:` value, else 1.
        force_cpu (`bool`, *optional*): parse with `use_cpu=True`; `None` = when no CUDA device is visible.

    Returns:
        [`DryRunReport`].

    Raises:
        ValueError, FileNotFoundError: what parsing raises (unknown keys, invalid values, missing recipe).
    """
    import torch

    from .train import parse_args

    argv = list(argv)
    recipe = _recipe_path(argv)
    if recipe is not None and not os.path.isfile(recipe):
        raise FileNotFoundError(f"Recipe {recipe!r} does not exist.")
    source = "--num-processes"
    if num_processes is None:
        launch = read_launch_settings(recipe) if recipe else {}
        if "num_processes" in launch:
            num_processes, source = int(launch["num_processes"]), "the recipe's launch: line"
        else:
            num_processes, source = 1, "default (no launch: line in the recipe)"
    notes = [f"process count {num_processes} from {source}."]
    if force_cpu is None:
        force_cpu = not torch.cuda.is_available()
    if force_cpu:
        argv += ["--use_cpu", "true"]
        notes.append(
            "parsed with use_cpu=True: this machine has no GPU and transformers refuses bf16 without one; the batch "
            "arithmetic does not depend on it."
        )
    script_args, training_args, model_args = parse_args(argv)
    keys = _set_keys(argv, recipe)
    generation_batch_size = keys.get("generation_batch_size")
    report = validate_recipe(
        script_args,
        training_args,
        model_args,
        num_processes,
        generation_batch_size=None if generation_batch_size in (None, "None", "null") else int(generation_batch_size),
        recipe=recipe,
        cpu_forced=force_cpu,
    )
    # Only visible in the raw keys: after parsing, both names mirror each other.
    if "gradient_checkpointing" in keys:
        report.warnings.append(
            "gradient_checkpointing is the deprecated transformers 5 alias (removed in v6): write "
            "activation_checkpointing."
        )
    elif "activation_checkpointing" not in keys:
        report.warnings.append(
            "activation_checkpointing is not set: GRPOConfig then turns gradient checkpointing ON through its "
            "deprecated alias (with a FutureWarning). Set activation_checkpointing: true or false explicitly."
        )
    report.notes += notes
    return report


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m stapo_trl.dry_run --config RECIPE.yaml [--num-processes N] [--key value ...]`.

    Also what `stapo-train ... --dry-run` calls (with its whole argument list; `--dry-run` is dropped here).
    Prints the plan and returns the exit status: 0 when the recipe passes, 1 when it fails its checks, 2 when it does
    not even parse.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--dry-run", action="store_true")
    pre.add_argument("--num-processes", "--num_processes", dest="num_processes", type=int, default=None)
    pre.add_argument("-h", "--help", action="store_true")
    known, rest = pre.parse_known_args(argv)
    if known.help:
        print(__doc__)
        return 0
    try:
        report = dry_run_recipe(rest, known.num_processes)
    except (ValueError, FileNotFoundError) as e:
        print(f"Dry run: the recipe does not parse.\n{e}", file=sys.stderr)
        return 2
    print(report.summary())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
