r"""Dry run of a recipe: parse it, resolve every key, check the batch arithmetic for a process count, print the plan.

    stapo-train --config recipes/Qwen3-1.7B/stapo.yaml --dry-run                      # process count from the recipe
    stapo-train --config recipes/Qwen3-8B/stapo.yaml --dry-run --num-processes 16     # what if: 2 training nodes
    python -m stapo_trl.cli.dry_run --config recipes/Qwen3-8B/stapo.yaml --num-processes 8 --gradient_accumulation_steps 32

Nothing is downloaded and no model is built: the dry run stops where `stapo-train` would start loading data. It
answers "will this recipe start, and what will one step be?" before a multi-node job is queued, and the test suite
runs it over every recipe against the pinned TRL and transformers, so a renamed upstream field fails in CI rather
than on the cluster.

What it checks (warnings are printed; a recipe that fails a check or does not parse is an input error, exit status
2, as `stapo-train` gives for the same recipe; see `stapo_trl.cli.errors`):

- every key resolves into `STAPOScriptArguments`, `STAPOConfig` / `GRPOConfig` and `ModelConfig` (unknown keys fail,
  with the closest field names), and the config classes' own `__post_init__` checks pass;
- the batch geometry for `num_processes` training processes: the generation batch
  (`per_device_train_batch_size x num_processes x steps_per_generation`, completions generated at once) holds whole
  groups of `num_generations` and whole global micro-batches; the valid values are listed when it does not;
- the reward names (`stapo_trl.rewards.REWARDS` or dotted paths), the trainer (`stapo` | `grpo`), the dataset and its
  columns (a local .json/.jsonl/.parquet file is opened and its columns checked; a Hub dataset is named, not
  fetched), the model name (`builtin:` names are checked, Hub ids are not fetched);
- the `benchmark_eval*` settings TRL's evaluation cannot honour for `num_processes` (samples per problem against the
  eval batch and `num_generations_eval`, the schedule against `eval_strategy`);
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

import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml


# `read_launch_settings` is read by scripts/launch.sh and slurm/train.slurm before a job starts and must print nothing
# else: torch, TRL and the config (which imports DeepSpeed, whose import logs to stdout) are imported by the
# functions that need them.

LAUNCH_LINE = re.compile(r"^#\s*launch:\s*(?P<settings>.*)$")


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


# ---------------------------------------------------------------------------------------------------------------
# The checks
# ---------------------------------------------------------------------------------------------------------------


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

    The arguments are what `stapo_trl.cli.args.parse_args` returns (parsed in one process, so the config's derived
    `generation_batch_size` is that of one process; the arithmetic here is redone for `num_processes`).

    Args:
        script_args ([`~stapo_trl.cli.script_args.STAPOScriptArguments`]): trainer, rewards, data.
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
    if not isinstance(num_processes, int) or num_processes < 1:
        raise ValueError(
            f"num_processes={num_processes!r} must be a positive integer (training processes, one per GPU)."
        )
    from . import launch_checks as launch  # TRL and the config: see the note at the top
    from . import recipe_checks as checks

    f = checks.Findings()
    is_stapo = checks.check_trainer(f, script_args, training_args)
    checks.check_model(f, model_args)
    # Fields that plain TRL ScriptArguments lack (other scripts' argument classes): absent means "not set".
    max_prompt_tokens = getattr(script_args, "max_prompt_tokens", None)
    num_train_prompts = checks.check_data(f, script_args, max_prompt_tokens)
    checks.check_rewards(f, script_args, training_args)
    geometry = launch.check_batch(f, training_args, num_processes, generation_batch_size, is_stapo)
    checks.check_prompt_count(f, script_args, num_train_prompts, geometry)
    if checks.check_chat_template_of_model(f, model_args):  # the prompts can be formatted, so counted
        checks.check_prompt_lengths(f, script_args, training_args, model_args, num_train_prompts)
    max_tokens = launch.batch_lines(f, geometry, training_args.max_completion_length, max_prompt_tokens)
    if is_stapo:
        launch.s2t_values_line(f, training_args, geometry)
    checks.check_optimisation(f, training_args)
    launch.check_generation(f, training_args, num_processes, is_stapo, max_prompt_tokens, cpu_forced)
    checks.check_output(f, script_args, training_args, cpu_forced, geometry)
    launch.check_benchmark_eval(f, script_args, training_args, num_processes)
    return DryRunReport(
        trainer=script_args.trainer,
        num_processes=num_processes,
        per_device_train_batch_size=geometry.per_device_train_batch_size,
        gradient_accumulation_steps=geometry.gradient_accumulation_steps,
        steps_per_generation=geometry.micro_steps_per_generation,
        num_generations=geometry.num_generations,
        generation_batch_size=geometry.generation_batch,
        completions_per_optimizer_step=geometry.completions_per_optimizer_step,
        prompts_per_rollout_step=geometry.prompts_per_rollout_step,
        prompts_per_optimizer_step=geometry.prompts_per_optimizer_step,
        optimizer_steps_per_rollout_step=geometry.optimizer_steps_per_rollout_step,
        max_prompt_tokens=max_prompt_tokens,
        max_completion_length=training_args.max_completion_length,
        max_tokens_per_optimizer_step=max_tokens,
        lines=f.lines,
        errors=f.errors,
        warnings=f.warnings,
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
    from .args import check_recipe_argv, parse_args

    argv = list(argv)
    recipe = _recipe_path(argv)
    check_recipe_argv(argv)  # a missing or broken recipe: before torch and TRL are imported (seconds)
    source = "--num-processes"
    launch = read_launch_settings(recipe) if recipe else {}
    if num_processes is None:
        if "num_processes" in launch:
            num_processes, source = int(launch["num_processes"]), "the recipe's launch: line"
        else:
            num_processes, source = 1, "default (no launch: line in the recipe)"
    notes = [f"process count {num_processes} from {source}."]
    if force_cpu is None:
        import torch  # torch, TRL and the config: see the note at the top

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
    if force_cpu and "bf16" not in keys and training_args.bf16 is False:
        notes.append(
            "bf16 is not set: False here (STAPOConfig's default without an accelerator); on a GPU it is True (TRL's)."
        )
    report.notes += notes
    return report


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m stapo_trl.cli.dry_run --config RECIPE.yaml [--num-processes N] [--key value ...]`.

    Also what `stapo-train ... --dry-run` calls (with its whole argument list; `--dry-run` is dropped here).
    Prints the plan and returns the exit status: 0 when the recipe passes, 2 (an input error, as everywhere:
    `stapo_trl.cli.errors`) when it fails its checks (the plan lists them, and one `stapo-train --dry-run: error: ...`
    line on stderr names the first) or does not parse (that line alone).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    from .errors import EXIT_INPUT_ERROR, EXIT_STATUS_HELP, InputError, OneLineErrorParser, print_line

    pre = OneLineErrorParser(prog="stapo-train --dry-run", add_help=False, allow_abbrev=False)
    pre.add_argument("--dry-run", action="store_true")
    pre.add_argument("--num-processes", "--num_processes", dest="num_processes", type=int, default=None)
    pre.add_argument("-h", "--help", action="store_true")
    try:
        known, rest = pre.parse_known_args(argv)
        if known.help:
            print(__doc__ + "\n" + EXIT_STATUS_HELP)
            return 0
        if known.num_processes is not None and known.num_processes < 1:
            raise InputError(
                "stapo-train --dry-run",
                f"--num-processes: {known.num_processes} is not a number of training processes: give a positive "
                "integer (one per GPU, vLLM server GPUs excluded).",
            )
        try:
            report = dry_run_recipe(rest, known.num_processes)
        except (ValueError, OSError) as e:  # the message names the recipe key and file, or the flag
            raise InputError("stapo-train --dry-run", str(e)) from e
    except InputError as e:
        print_line(e.message)
        return EXIT_INPUT_ERROR
    print(report.summary())
    if report.ok:
        return 0
    first = f"; the first: {report.errors[0]}" if len(report.errors) > 1 else f": {report.errors[0]}"
    print_line(
        f"stapo-train --dry-run: error: {len(report.errors)} check(s) failed (the plan above lists them){first}"
    )
    return EXIT_INPUT_ERROR


if __name__ == "__main__":
    sys.exit(main())
