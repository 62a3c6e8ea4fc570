"""The dry run's sections about scale ([`stapo_trl.cli.dry_run.validate_recipe`]): the batch geometry with its summary
rows, generation (vLLM server or colocate), and what the launch's parameter sharding (ZeRO-3, FSDP) cannot run. Each
adds its rows, errors and warnings to the same [`~stapo_trl.cli.recipe_checks.Findings`] as `recipe_checks.py`.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from ..config import STAPOConfig
from ..core.stapo_config import s2t_path, s2t_settings, s2t_warnings
from .geometry import BatchGeometry, divisors
from .recipe_checks import Findings, fmt_int


LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
S2T_PATHS = {  # the core's `s2t_path`, in words, with its cost
    "loss": "the loss's own forward, detached (no extra forward)",
    "old_logps": "TRL's no-grad old-log-prob forward of the rollout batch (no extra forward)",
    "extra_forward": "one extra no-grad forward per rollout batch",
}


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
    if is_stapo:  # the trainer's own construction warnings, from the one function that makes them
        s2t = s2t_settings(training_args, STAPOConfig._s2t_modes)
        f.warnings += s2t_warnings(training_args, s2t, steps_per_generation, num_processes=n)
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


def s2t_values_line(f: Findings, training_args, geometry: BatchGeometry) -> None:
    """The row saying where the S2T mask's p and H come from and what that costs (the path `STAPOTrainer` takes)."""
    f.lines.append(("S2T p and H", S2T_PATHS[s2t_path(training_args, geometry.micro_steps_per_generation)]))


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
        script_args ([`~stapo_trl.cli.script_args.STAPOScriptArguments`]): reads `benchmark_eval` (absent: not set).
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
