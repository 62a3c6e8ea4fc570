"""The sections of a recipe's dry run ([`stapo_trl.cli.dry_run.validate_recipe`]): small named checks, each adding
its summary rows, errors and warnings to one [`Findings`].

Nine sections, in the order of the printed plan: trainer, model, data, rewards, batch geometry (with its summary
rows), optimisation, generation, output (trackers, checkpoints, hardware), and what the launch's parameter sharding
(ZeRO-3, FSDP) cannot run. Nothing is downloaded: a Hub dataset or model is named, not fetched; a local dataset
file is opened.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path

from trl import GRPOConfig

from ..builtin import BUILTIN_PREFIX as MODEL_PREFIX
from ..builtin import builtin_model_dir, check_model_name_or_path
from ..config import STAPOConfig
from ..core.stapo_config import untested_combination_warnings
from ..data import (
    BUILTIN_DATASETS,
    check_prompt_columns,
    evaluation_split,
    filter_long_prompts,
    is_local_dataset_file,
    load_local_dataset_file,
    load_prompt_dataset,
)
from ..data import BUILTIN_PREFIX as DATA_PREFIX
from ..hub import check_hub_access
from ..prompt_length import model_max_positions, prompt_token_budget
from ..rewards import REWARDS, get_reward_funcs
from .args import TRAINERS, prompt_dataset_kwargs
from .geometry import BatchGeometry, divisors, too_few_prompts


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


def fmt_int(n: float) -> str:
    """`n` with thousands separators, without decimals when it is whole (`2,048`, `0.25`)."""
    return f"{int(n):,}" if float(n).is_integer() else f"{n:,.2f}"


@dataclass
class Findings:
    """What the `check_*` sections add up: summary rows, errors and warnings (the parts of a
    [`~stapo_trl.cli.dry_run.DryRunReport`])."""

    lines: list[tuple[str, str]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def check_trainer(f: Findings, script_args, training_args) -> bool:
    """The trainer and its config class, and the objective."""
    trainer = script_args.trainer
    if trainer not in TRAINERS:
        f.errors.append(f"trainer={trainer!r} is not one of {list(TRAINERS)}.")
    is_stapo = isinstance(training_args, STAPOConfig)
    if trainer == "stapo" and not is_stapo:
        f.errors.append(f"trainer='stapo' needs a STAPOConfig, got {type(training_args).__name__}.")
    if trainer == "grpo" and (is_stapo or not isinstance(training_args, GRPOConfig)):
        f.errors.append(f"trainer='grpo' needs a plain GRPOConfig, got {type(training_args).__name__}.")
    if is_stapo:
        a = training_args
        f.lines.append(
            (
                "trainer",
                (
                    f"stapo: STAPOTrainer, S2T mask tau_p={a.s2t_prob_threshold}, q={a.s2t_entropy_quantile}, "
                    f"mode={a.s2t_mode}, scope={a.s2t_scope}, policy={a.s2t_policy}"
                ),
            )
        )
    else:
        entropy_mask = training_args.top_entropy_quantile
        extra = f", top_entropy_quantile={entropy_mask}" if entropy_mask < 1.0 else ""
        f.lines.append(("trainer", f"{trainer}: GRPOTrainer, no S2T mask{extra}"))
    f.lines.append(
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
    return is_stapo


def check_model(f: Findings, model_args) -> None:
    """The model name (checked, never fetched) and PEFT."""
    model_name = model_args.model_name_or_path
    if not model_name:
        f.errors.append("model_name_or_path is not set: give a Hub id, a local model directory or builtin:tiny-math.")
    else:
        try:
            check_model_name_or_path(model_name)
        except (ValueError, OSError) as err:
            f.errors.append(f"model_name_or_path: {err}")
    peft = (
        f"LoRA r={model_args.lora_r}, alpha={model_args.lora_alpha}, targets={model_args.lora_target_modules}"
        if model_args.use_peft
        else "off"
    )
    f.lines.append(("model", f"{model_name} (dtype {model_args.dtype}, PEFT {peft})"))


def check_data(f: Findings, script_args, max_prompt_tokens: int | None) -> int | None:
    """The dataset (a local file is opened and its columns checked; a Hub id is named), the instruction.

    Returns the number of training prompts before the prompt-length filter (`max_train_samples` applied) when it is
    known here (a built-in or local dataset), else `None`.
    """
    dataset = script_args.dataset_name
    num_rows = None
    if not dataset:
        f.errors.append(
            "dataset_name is not set: give builtin:tiny-math, a local .json/.jsonl/.parquet file or a Hub id."
        )
        data_line = "(none)"
    elif dataset.startswith(DATA_PREFIX):
        if dataset[len(DATA_PREFIX) :] not in BUILTIN_DATASETS:
            known = ", ".join(DATA_PREFIX + name for name in BUILTIN_DATASETS)
            f.errors.append(f"dataset_name={dataset!r} is not a built-in dataset; known: {known}.")
        else:
            splits = BUILTIN_DATASETS[dataset[len(DATA_PREFIX) :]]()
            if script_args.dataset_train_split in splits:
                num_rows = len(splits[script_args.dataset_train_split])
        data_line = f"{dataset} (built in: its own prompt/solution columns)"
    else:
        for column in ("prompt_column", "solution_column"):
            if not getattr(script_args, column):
                f.errors.append(f"{column} is empty: name the dataset column that holds the {column.split('_')[0]}.")
        opened = "named, not opened (a Hub dataset)"
        if is_local_dataset_file(dataset):
            _, warning = evaluation_split(dataset, script_args.dataset_test_split)
            if script_args.eval_before_after and warning is not None:
                f.warnings.append(warning)
            # A local file is cheap to open: check its columns as stapo-train will.
            try:
                local = load_local_dataset_file(dataset)
                check_prompt_columns(local, dataset, script_args.prompt_column, script_args.solution_column)
                opened = f"checked: {len(local)} rows"
                num_rows = len(local)
            except FileNotFoundError:
                f.errors.append(f"dataset_name={dataset!r} looks like a local file but does not exist.")
                opened = "missing"
            except ValueError as e:  # a missing column, or an empty file
                f.errors.append(f"dataset_name={dataset!r}: {e}")
                opened = "failed"
            except Exception as e:  # noqa: BLE001 (an unreadable file: datasets raises many types)
                f.errors.append(f"dataset_name={dataset!r} could not be read: {type(e).__name__}: {e}")
                opened = "unreadable"
        config = f" [{script_args.dataset_config}]" if script_args.dataset_config else ""
        data_line = (
            f"{dataset}{config} split {script_args.dataset_train_split}, columns "
            f"{script_args.prompt_column!r} -> {script_args.solution_column!r} ({opened})"
        )
    if getattr(script_args, "strip_dapo_instruction", False):
        data_line += "; DAPO 'Answer:' instruction stripped"
    data_line += f"; prompts > {max_prompt_tokens} tokens dropped" if max_prompt_tokens else "; no max_prompt_tokens"
    f.lines.append(("data", data_line))
    if script_args.instruction is None:
        instruction = "(default) the paper's step-by-step / \\boxed{} suffix"
    elif script_args.instruction == "":
        instruction = "(none)"
    else:
        instruction = f'"{script_args.instruction}"'
    f.lines.append(("instruction", instruction))
    if script_args.dataset_streaming:
        f.errors.append("dataset_streaming=True is not supported by stapo-train: set it to false.")
    max_train_samples = getattr(script_args, "max_train_samples", None)
    if num_rows is not None and max_train_samples is not None:
        num_rows = min(num_rows, max_train_samples)
    return num_rows


def check_prompt_count(f: Findings, script_args, num_rows: int | None, geometry: BatchGeometry) -> None:
    """Enough training prompts for one rollout step (as `stapo-train` checks after loading; the prompt-length filter,
    which needs the tokenizer, is not applied here)."""
    if num_rows is None or not geometry.holds_whole_groups:
        return
    where = (
        "in the train split" if getattr(script_args, "max_train_samples", None) is None else "with max_train_samples"
    )
    error = too_few_prompts(num_rows, geometry.generation_batch // geometry.num_generations, where)
    if error is not None:
        f.errors.append(error)


def check_rewards(f: Findings, script_args, training_args) -> None:
    """The reward names and weights."""
    try:
        get_reward_funcs(script_args.reward_funcs)
    except ValueError as e:
        f.errors.append(f"reward_funcs={script_args.reward_funcs!r}: {e} (registry: {sorted(REWARDS)})")
    weights = f", weights {training_args.reward_weights}" if training_args.reward_weights else ""
    f.lines.append(("rewards", f"{', '.join(script_args.reward_funcs)}{weights}"))


def check_batch(
    f: Findings, training_args, n: int, generation_batch_size: int | None, is_stapo: bool
) -> BatchGeometry:
    """The batch geometry on `n` processes: whole prompt groups per rollout and per update ([`BatchGeometry`])."""
    per_device = training_args.per_device_train_batch_size
    grad_accum = training_args.gradient_accumulation_steps
    num_generations = training_args.num_generations
    geometry = BatchGeometry(
        per_device_train_batch_size=per_device,
        num_processes=n,
        gradient_accumulation_steps=grad_accum,
        num_generations=num_generations,
        steps_per_generation=training_args.steps_per_generation,
        generation_batch_size=generation_batch_size,
    )
    global_micro_batch = geometry.global_micro_batch  # completions per micro-step, all processes
    generation_batch = geometry.generation_batch
    steps_per_generation = geometry.micro_steps_per_generation
    if generation_batch_size is not None and generation_batch % global_micro_batch != 0:
        valid_n = [p for p in divisors(generation_batch) if generation_batch % (per_device * p) == 0]
        f.errors.append(
            f"generation_batch_size={generation_batch} is not a multiple of the global micro-batch "
            f"(per_device_train_batch_size {per_device} x {n} processes = {global_micro_batch}). Valid process "
            f"counts for this batch: {valid_n}; valid per_device_train_batch_size on {n} processes: "
            f"{[d for d in divisors(generation_batch) if generation_batch % (d * n) == 0]}. Or set "
            "steps_per_generation instead of generation_batch_size."
        )
    if not geometry.holds_whole_groups:
        f.errors.append(
            f"num_generations={num_generations} does not divide the generation batch ({generation_batch} completions "
            f"= per_device_train_batch_size {per_device} x {n} processes x steps_per_generation "
            f"{steps_per_generation}): every prompt needs a whole group. Valid num_generations: "
            f"{geometry.valid_num_generations()}. Or choose per_device_train_batch_size x steps_per_generation as a "
            f"multiple of {num_generations}."
        )
    completions_per_step = geometry.completions_per_optimizer_step
    if completions_per_step % num_generations != 0:
        f.warnings.append(
            f"An optimizer update holds {completions_per_step} completions (per_device_train_batch_size {per_device} "
            f"x {n} processes x gradient_accumulation_steps {grad_accum}), not a whole number of prompt groups of "
            f"{num_generations}: the paper's mini-batches are whole prompts (64 prompts x 8)."
        )
    if is_stapo:  # the trainer's own construction warnings, from the one function that makes them
        f.warnings += untested_combination_warnings(training_args, steps_per_generation=steps_per_generation)
    elif steps_per_generation % grad_accum != 0:
        f.warnings.append(
            f"steps_per_generation={steps_per_generation} is not a multiple of gradient_accumulation_steps="
            f"{grad_accum}: an optimizer update spans two rollout batches."
        )
    if training_args.eval_strategy != "no":
        eval_generations = training_args.num_generations_eval or num_generations
        eval_batch = training_args.per_device_eval_batch_size * n
        if eval_batch % eval_generations != 0:
            f.errors.append(
                f"per_device_eval_batch_size {training_args.per_device_eval_batch_size} x {n} processes = "
                f"{eval_batch} "
                f"is not a multiple of the evaluation's num_generations {eval_generations}."
            )
    return geometry


def batch_lines(f: Findings, geometry: BatchGeometry, max_completion_length: int, prompt_budget: int | None):
    """The summary rows of the batch geometry; returns the token bound per optimizer update (`None`: unbounded)."""
    n, num_generations = geometry.num_processes, geometry.num_generations
    generation_batch, completions_per_step = geometry.generation_batch, geometry.completions_per_optimizer_step
    updates_per_rollout = geometry.optimizer_steps_per_rollout_step
    max_tokens = completions_per_step * (prompt_budget + max_completion_length) if prompt_budget else None
    f.lines.append(
        (
            "micro-step",
            f"per_device_train_batch_size {geometry.per_device_train_batch_size} x {n} processes = "
            f"{geometry.global_micro_batch} completions",
        )
    )
    f.lines.append(
        (
            "rollout step",
            (
                f"{fmt_int(generation_batch)} completions = {fmt_int(generation_batch / num_generations)} prompts x "
                f"{num_generations} generations (steps_per_generation {geometry.micro_steps_per_generation})"
            ),
        )
    )
    f.lines.append(
        (
            "optimizer update",
            (
                f"{fmt_int(completions_per_step)} completions = {fmt_int(completions_per_step / num_generations)} "
                f"prompts (gradient_accumulation_steps {geometry.gradient_accumulation_steps})"
            ),
        )
    )
    f.lines.append(
        ("updates / rollout", f"{fmt_int(updates_per_rollout)} (steps_per_generation / gradient_accumulation_steps)")
    )
    if max_tokens is not None:
        tokens = (
            f"{fmt_int(max_tokens)} per optimizer update = {completions_per_step} x ({prompt_budget} prompt + "
            f"{max_completion_length} completion); "
            f"{fmt_int(max_tokens * updates_per_rollout)} per rollout step"
        )
    else:
        tokens = (
            "unbounded prompts; completions alone up to "
            f"{fmt_int(completions_per_step * max_completion_length)}"
            " per optimizer update"
        )
    f.lines.append(("max tokens", tokens))
    return max_tokens


def check_optimisation(f: Findings, training_args) -> None:
    """The optimizer, schedule, horizon and precision."""
    horizon = (
        f"max_steps {training_args.max_steps}"
        if training_args.max_steps > 0
        else f"num_train_epochs {training_args.num_train_epochs}"
    )
    f.lines.append(
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
    f.lines.append(
        (
            "precision",
            # transformers < 5.24 (the vLLM CPU environment's 5.19) has only the old name
            f"bf16={training_args.bf16}, activation_checkpointing="
            f"{getattr(training_args, 'activation_checkpointing', training_args.gradient_checkpointing)}",
        )
    )


def check_generation(
    f: Findings, training_args, n: int, is_stapo: bool, prompt_budget: int | None, cpu_forced: bool = False
) -> None:
    """Generation: transformers or vLLM (server / colocate), and the sampling settings."""
    sampling = (
        f"T={training_args.temperature}, top_p={training_args.top_p}, top_k={training_args.top_k}, "
        f"max_completion_length {training_args.max_completion_length}"
    )
    if training_args.use_vllm:
        if training_args.vllm_mode == "server":
            host = training_args.vllm_server_host
            where = training_args.vllm_server_base_url or f"{host}:{training_args.vllm_server_port}"
            f.lines.append(
                (
                    "generation",
                    f"vLLM server at {where} (weight sync port {training_args.vllm_group_port}); {sampling}",
                )
            )
            if training_args.use_cpu and not cpu_forced:
                f.errors.append(
                    "vllm_mode='server' with use_cpu=True: TRL 1.16 syncs weights to the server over NCCL (CUDA only), "
                    "so STAPOTrainer refuses it at construction. On CPU use vllm_mode='colocate' (make install-vllm)."
                )
            elif cpu_forced:
                f.warnings.append(
                    "vllm_mode='server': the weight sync to the server is CUDA-only (NCCL); this recipe needs GPUs."
                )
            if training_args.vllm_server_base_url is None and host not in LOOPBACK_HOSTS:
                f.warnings.append(
                    f"vllm_server_host={host!r} is not a loopback address: the trainer expects a vLLM server there "
                    "(scripts/launch.sh serves on 127.0.0.1; slurm/train.slurm sets the vLLM node's address)."
                )
        elif training_args.vllm_mode == "colocate":
            tp = training_args.vllm_tensor_parallel_size
            f.lines.append(
                (
                    "generation",
                    (
                        f"vLLM colocated in every training process (tensor parallel {tp}, "
                        f"gpu_memory_utilization {training_args.vllm_gpu_memory_utilization}); {sampling}"
                    ),
                )
            )
            if n % tp != 0:
                f.errors.append(
                    f"vllm_tensor_parallel_size={tp} does not divide the {n} training processes (colocate mode "
                    f"groups processes into tensor-parallel blocks). Valid values: {divisors(n)}."
                )
            max_len = training_args.vllm_max_model_length
            if max_len is not None and prompt_budget and max_len < prompt_budget + training_args.max_completion_length:
                f.errors.append(
                    f"vllm_max_model_length={max_len} < max_prompt_tokens {prompt_budget} + max_completion_length "
                    f"{training_args.max_completion_length}: long rollouts would be cut by vLLM."
                )
        else:
            f.errors.append(f"vllm_mode={training_args.vllm_mode!r} is not 'server' or 'colocate'.")
        if importlib.util.find_spec("vllm") is None:
            f.warnings.append(
                "use_vllm=True but vllm is not installed here: install the `vllm` extra on the GPU machine."
            )
    else:
        f.lines.append(("generation", f"transformers generate (no vLLM); {sampling}"))


def check_output(f: Findings, script_args, training_args, cpu_forced: bool, geometry: BatchGeometry) -> None:
    """Trackers, checkpoints, precision on CPU, and the paper's geometry on the paper's data."""
    trackers = [t for t in (training_args.report_to or []) if t not in ("none", "all")]
    missing = [t for t in trackers if t in TRACKER_MODULES and importlib.util.find_spec(TRACKER_MODULES[t]) is None]
    if missing:
        f.warnings.append(f"report_to names {missing}, not installed here: install it where the job runs.")
    save = (
        f"every {training_args.save_steps} optimizer steps (keep {training_args.save_total_limit or 'all'})"
        if training_args.save_strategy == "steps"
        else training_args.save_strategy.value
    )
    f.lines.append(
        (
            "output",
            (
                f"{training_args.output_dir}; checkpoints {save}; report_to {training_args.report_to}; "
                f"push_to_hub={training_args.push_to_hub}"
            ),
        )
    )
    if training_args.push_to_hub:  # offline mode or no token (no request is made here)
        try:
            check_hub_access(
                training_args.hub_model_id, training_args.output_dir, training_args.hub_token, network=False
            )
        except ConnectionError as e:
            f.errors.append(str(e))
    if training_args.use_cpu and training_args.bf16 and not cpu_forced:
        f.warnings.append("bf16=True on CPU is about 2.3x slower than float32: set bf16: false for CPU runs.")
    if "dapo-math" in str(script_args.dataset_name).lower() and not geometry.is_paper_geometry():
        f.warnings.append(
            f"the paper's data (DAPO-Math) with another batch geometry: {geometry.prompts_per_rollout_step:g} prompts "
            f"x {geometry.num_generations} rollouts per rollout step and {geometry.prompts_per_optimizer_step:g}-prompt "
            f"updates for {geometry.num_processes} process(es), vs the paper's 256 x 8 and 64. recipes/README.md gives "
            "per_device_train_batch_size / gradient_accumulation_steps / steps_per_generation that keep the paper's "
            "for 4, 8, 16 and 32 processes."
        )


ACCELERATE_CONFIGS_DIR = Path(__file__).resolve().parents[2] / "recipes" / "accelerate_configs"


def parameter_sharding(training_args, accelerate_config: str | None = None) -> str | None:
    """Whether a run's parameters are sharded across processes: `"DeepSpeed ZeRO-3"`, `"FSDP"` or `None`.

    Read from the parsed config when this process runs under `accelerate launch` (its DeepSpeed plugin's stage, or
    `fsdp`), else from `accelerate_config`: a name under `recipes/accelerate_configs` (as a recipe's `# launch:` line
    gives it to scripts/launch.sh and slurm/train.slurm) or a path to an accelerate config YAML.

    Args:
        training_args ([`~trl.GRPOConfig`]): the parsed config.
        accelerate_config (`str`, *optional*): the accelerate config the run will be launched with; `None`, or a name
            whose file is not in this checkout: only the parsed config counts.

    Returns:
        `str` or `None`: the sharding, `None` for ZeRO-0/1/2, DDP or one process.
    """
    plugin = getattr(training_args, "deepspeed_plugin", None)
    if plugin is not None and plugin.zero_stage == 3:
        return "DeepSpeed ZeRO-3"
    if getattr(training_args, "fsdp", None):
        return "FSDP"
    if not accelerate_config:
        return None
    path = Path(accelerate_config)
    if path.suffix not in (".yaml", ".yml") and "/" not in accelerate_config:
        path = ACCELERATE_CONFIGS_DIR / f"{accelerate_config}.yaml"
    if not path.is_file():
        return None
    import yaml

    config = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    if config.get("distributed_type") == "DEEPSPEED" and (config.get("deepspeed_config") or {}).get("zero_stage") == 3:
        return "DeepSpeed ZeRO-3"
    if config.get("distributed_type") == "FSDP":
        return "FSDP"
    return None


def sharding_error(script_args, sharding: str | None) -> str | None:
    """The one-line refusal of a setting that cannot run with sharded parameters, or `None`.

    `benchmark_eval` ([`~stapo_trl.evaluation.callback.BenchmarkEvalCallback`]) generates on rank 0 alone; with sharded
    parameters every rank must take part in each forward of `generate`, so it would hang or fail.

    Args:
        script_args ([`~stapo_trl.cli.args.STAPOScriptArguments`]): reads `benchmark_eval` (absent: not set).
        sharding (`str` or `None`): what [`parameter_sharding`] returns.
    """
    benchmark = getattr(script_args, "benchmark_eval", None)
    if sharding is None or benchmark is None:
        return None
    return (
        f"benchmark_eval={benchmark!r} cannot run under {sharding}: its in-training evaluation generates on rank 0 "
        "alone, and sharded parameters need every rank in generate. Unset benchmark_eval and evaluate the saved "
        "checkpoints with stapo-eval (or train under ZeRO-2 / DDP)."
    )


def check_sharding(f: Findings, script_args, training_args, accelerate_config: str | None) -> None:
    """Settings that cannot run with the launch's sharded parameters ([`sharding_error`])."""
    error = sharding_error(script_args, parameter_sharding(training_args, accelerate_config))
    if error:
        f.errors.append(error)


def check_prompt_lengths(f: Findings, script_args, training_args, model_args, num_train_prompts: int | None) -> None:
    """How many training prompts the prompt-length rule will drop, when the data and the model's tokenizer are here.

    The rule is `stapo-train`'s ([`stapo_trl.prompt_length`]): a prompt longer than `max_prompt_tokens` or than the
    model's positions minus `max_completion_length` is dropped. Counted only for a built-in or local dataset and a
    local (or already built `builtin:`) model; otherwise the row says why it was not counted.
    """
    if num_train_prompts is None:
        return  # a Hub dataset, or one that could not be opened: nothing to count here
    name = str(model_args.model_name_or_path or "")
    path = builtin_model_dir(name[len(MODEL_PREFIX) :]) if name.startswith(MODEL_PREFIX) else Path(name)
    if not (path / "config.json").is_file():
        f.lines.append(
            ("prompt length", "not counted: the model is not here (a Hub id, or a builtin: model not built)")
        )
        return
    from transformers import AutoConfig, AutoTokenizer  # heavy: only when there is something to count

    budget = prompt_token_budget(
        model_max_positions(AutoConfig.from_pretrained(path)),
        training_args.max_completion_length,
        getattr(script_args, "max_prompt_tokens", None),
    )
    if budget is None:
        f.lines.append(("prompt length", "unbounded (no max_prompt_tokens, no position limit)"))
        return
    dataset = load_prompt_dataset(
        script_args.dataset_name,
        split=script_args.dataset_train_split,
        limit=script_args.max_train_samples,
        **prompt_dataset_kwargs(script_args),
    )
    kept = filter_long_prompts(
        dataset, AutoTokenizer.from_pretrained(path), budget, training_args.chat_template_kwargs
    )
    dropped = len(dataset) - len(kept)
    f.lines.append(
        ("prompt length", f"{dropped} of {len(dataset)} training prompts exceed {budget} tokens and will be dropped")
    )
    if dropped and dropped == len(dataset):
        f.errors.append(
            f"every training prompt exceeds {budget} tokens (max_prompt_tokens, or the model's positions minus "
            f"max_completion_length={training_args.max_completion_length}): nothing would be left to train on."
        )
