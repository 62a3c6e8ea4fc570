"""The dry run's sections about scale ([`stapo_trl.cli.dry_run.validate_recipe`]): the batch geometry with its summary
rows, generation (vLLM server or colocate), and the `benchmark_eval*` settings TRL's evaluation cannot honour. Each
adds its rows, errors and warnings to the same [`~stapo_trl.cli.recipe_checks.Findings`] as `recipe_checks.py`.
"""

from __future__ import annotations

import importlib.util
from math import gcd

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


def benchmark_eval_error(
    script_args, training_args, num_processes: int, num_problems: int | None = None
) -> str | None:
    """The one-line refusal of a `benchmark_eval*` setting that TRL's evaluation cannot honour exactly, or `None`.

    `benchmark_eval` is TRL's own evaluation (`eval_strategy`) on the benchmark's problems: `benchmark_eval_samples`
    becomes `num_generations_eval` and `benchmark_eval_steps` the `eval_steps` of a `"steps"` schedule. TRL takes the
    eval batches in whole groups of `num_generations_eval` and logs the mean of the batches' mean rewards, which is
    avg@k only when every batch is full.

    Args:
        script_args ([`~stapo_trl.cli.script_args.STAPOScriptArguments`]): the `benchmark_eval*` fields.
        training_args ([`~trl.GRPOConfig`]): `num_generations_eval`, `eval_strategy`, `per_device_eval_batch_size`.
        num_processes (`int`): training processes.
        num_problems (`int`, *optional*): the benchmark's problems (after `benchmark_eval_limit`), once loaded.
    """
    name, k = getattr(script_args, "benchmark_eval", None), getattr(script_args, "benchmark_eval_samples", 1)
    if name is None:
        return None
    if training_args.num_generations_eval not in (None, k):
        return (
            f"benchmark_eval_samples={k} and num_generations_eval={training_args.num_generations_eval} disagree (TRL's "
            f"evaluation samples num_generations_eval completions per problem): set benchmark_eval_samples: "
            f"{training_args.num_generations_eval} and remove num_generations_eval."
        )
    if script_args.benchmark_eval_steps is not None and training_args.eval_strategy == "epoch":
        return (
            f"benchmark_eval_steps={script_args.benchmark_eval_steps} evaluates every N steps, but eval_strategy is "
            "'epoch': remove one of them."
        )
    batch = training_args.per_device_eval_batch_size * num_processes
    in_batch = f"per_device_eval_batch_size {training_args.per_device_eval_batch_size} x {num_processes} process(es)"
    if batch % k:
        return (
            f"benchmark_eval_samples={k} must divide the global eval batch ({in_batch} = {batch} completions: TRL "
            f"evaluates whole groups of k): set per_device_eval_batch_size to a multiple of {k // gcd(k, num_processes)}."
        )
    if num_problems is not None and num_problems * k % batch:
        step = batch // gcd(batch, k)
        return (
            f"benchmark_eval={name!r}: {num_problems} problems x {k} samples do not fill whole eval batches of {batch} "
            f"completions ({in_batch}), and TRL would average a partial last batch as a full one: set "
            f"benchmark_eval_limit to a multiple of {step} (e.g. {max(step, num_problems // step * step)})."
        )
    return None


def check_benchmark_eval(f: Findings, script_args, training_args, num_processes: int) -> None:
    """The `benchmark_eval*` settings TRL's evaluation cannot honour ([`benchmark_eval_error`]; the problem count is
    checked when `stapo-train` loads the benchmark)."""
    error = benchmark_eval_error(script_args, training_args, num_processes)
    if error:
        f.errors.append(error)
