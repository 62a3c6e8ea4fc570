"""The product's `STAPOConfig`: the core's ([`stapo_trl.core.STAPOConfig`]) plus what `stapo_trl` adds around it.

- `s2t_write_run_files`: `train()` writes `metrics.jsonl` and `spurious_tokens.jsonl` (the files `stapo-plot` reads).
- CPU defaults: on a machine without an accelerator, `use_cpu=True` and `bf16=False` unless set.
- Every value check, in `__post_init__` before TRL's own ([`check_training_values`], which `stapo-train` also runs
  for a plain `GRPOConfig`), and YAML's unquoted `off` for `s2t_mode`.
- In a launched process, the process-group workaround of [`~stapo_trl.integrations.process_group`].
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import ClassVar, Literal

import torch
from transformers.utils import is_torch_hpu_available, is_torch_neuron_available, is_torch_xla_available

from .. import core
from ..diagnostics.ablations import ABLATION_MODES
from ..integrations.process_group import import_group_capturing_modules


logger = logging.getLogger(__name__)

# TRL 1.16's loss types: GRPOTrainer refuses another only at its first loss step, after generation.
LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo")


@dataclass
class STAPOConfig(core.STAPOConfig):
    r"""
    Configuration class for [`~stapo_trl.STAPOTrainer`]: every field of [`stapo_trl.core.STAPOConfig`] (the S2T fields
    and the paper's objective defaults), plus the fields below.

    Parameters:
        > Parameters that control the S2T mask

        s2t_mode (`str`, *optional*, defaults to `"low_entropy"`):
            The core's `"low_entropy"` (STAPO) and `"off"` (the like-for-like baseline), plus the paper's ablations
            ([`~stapo_trl.diagnostics.ablations`]): `"high_entropy"` (silence the candidates above the
            (1 - q)-quantile) and `"all_low_prob"` (silence every candidate, JustRL-FullMask).

        > Parameters of the run files

        s2t_write_run_files (`bool`, *optional*, defaults to `True`):
            During `train()`, write every log row to `<output_dir>/metrics.jsonl` and the silenced tokens (with
            samples of kept candidates, in context) to `<output_dir>/spurious_tokens.jsonl`, the files `stapo-plot`
            draws, as `stapo-train` does. A callback of the same class that the caller passes or adds before `train()`
            replaces the built-in one. Off: no files (the trainer's `log_history` still has every metric).

        > Parameters whose defaults change on a CPU-only machine

        use_cpu (`bool`, *optional*):
            As in [`~transformers.TrainingArguments`]. Not set: `True` when no accelerator is visible (no CUDA, XPU,
            MPS, NPU, HPU, Neuron or TPU device), else `False`. An explicit value wins.
        bf16 (`bool`, *optional*):
            As in [`~trl.GRPOConfig`] (not set: `True` unless `fp16`), except that on a machine without an
            accelerator it defaults to `False`: transformers refuses bf16 there without `use_cpu`, and bf16 on a CPU
            is ~2.3x slower than float32. An explicit value wins. Either default change is logged on one info line.

    Raises:
        ValueError: a value TRL would accept and fail on later, or refuse with a message that hides the cause, on one
            line naming the field and the allowed values ([`check_training_values`]).
    """

    _s2t_modes: ClassVar[tuple[str, ...]] = core.STAPOConfig._s2t_modes + ABLATION_MODES

    s2t_mode: Literal["low_entropy", "high_entropy", "all_low_prob", "off"] = field(
        default="low_entropy",
        metadata={
            "help": "Which candidates are silenced: 'low_entropy' (STAPO), 'off' (none; counts still logged), or the "
            "paper's ablations 'high_entropy' (above the (1-q)-quantile) and 'all_low_prob' (every candidate).",
            "choices": list(core.STAPOConfig._s2t_modes + ABLATION_MODES),
        },
    )
    s2t_write_run_files: bool = field(
        default=True,
        metadata={
            "help": "Write metrics.jsonl (every log row) and spurious_tokens.jsonl (silenced tokens in context) into "
            "output_dir during train(), the files stapo-plot draws. A callback of the same class that the caller "
            "passes or adds before train() replaces the built-in one. Off: no files."
        },
    )

    # > Parameters whose defaults change on a CPU-only machine
    use_cpu: bool | None = field(
        default=None,
        metadata={
            "help": "Train on the CPU. Not set: True when no accelerator (CUDA, XPU, MPS, NPU, HPU, Neuron, TPU) is "
            "visible, else False. An explicit value wins.",
            # A bare `--use_cpu` still means true (transformers' parser gives `bool | None` fields no bare form).
            "nargs": "?",
            "const": True,
        },
    )
    bf16: bool | None = field(
        default=None,
        metadata={
            "help": "bf16 mixed precision. Not set: False on a machine without an accelerator (bf16 on a CPU is "
            "~2.3x slower), else True unless fp16 (TRL's default). An explicit value wins."
        },
    )

    def __post_init__(self):
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # a launched process, before its process group exists
            import_group_capturing_modules()
        # Before the parent's: TRL turns an unset bf16 on, and transformers then refuses it on a CPU without use_cpu.
        changed = []
        if (self.use_cpu is None or self.bf16 is None) and not has_accelerator():
            if self.use_cpu is None:
                self.use_cpu = True
                changed.append("use_cpu=True")
            if self.bf16 is None and not self.fp16:
                self.bf16 = False
                changed.append("bf16=False")
        if self.use_cpu is None:  # an accelerator: transformers' default
            self.use_cpu = False
        if changed:
            logger.info(
                "No accelerator found (CUDA, XPU, MPS, NPU, HPU, Neuron, TPU): STAPOConfig defaults to %s on this "
                "machine; set them explicitly to override.",
                ", ".join(changed),
            )
        if getattr(self, "activation_checkpointing", False) is None:
            # transformers >= 5.24 renamed the field and warns on the old name, which GRPOConfig sets by default (True):
            # carry the value over as transformers would, without its FutureWarning at every config a user builds.
            self.activation_checkpointing = self.gradient_checkpointing
        write_run_files(self)
        if self.s2t_mode is False:
            raise ValueError(
                's2t_mode=False: YAML reads an unquoted `off` (or `no`, `false`) as the boolean false. Write s2t_mode: "off" (quoted); '
                f"allowed values: {list(self._s2t_modes)}."
            )
        check_training_values(self)  # before TRL's own checks, whose messages hide the cause
        super().__post_init__()


def has_accelerator() -> bool:
    """Whether training can use a device other than the CPU: what `torch.accelerator` reports (CUDA, ROCm, XPU, MPS,
    and backends registered as PyTorch's private use device, e.g. Ascend NPU) or the three that transformers detects
    apart (TPU through XLA, Gaudi HPU, AWS Neuron). Decides [`STAPOConfig`]'s CPU defaults."""
    return (
        torch.accelerator.is_available()
        or is_torch_xla_available()
        or is_torch_hpu_available()
        or is_torch_neuron_available()
    )


def write_run_files(args) -> bool:
    """`s2t_write_run_files` of any `GRPOConfig` (`True` where it has none): whether `train()` writes the run files.

    Raises:
        ValueError: the value is not a bool.
    """
    value = getattr(args, "s2t_write_run_files", True)
    if not isinstance(value, bool):
        raise ValueError(f"s2t_write_run_files={value!r} must be a bool (True or False), got {type(value).__name__}.")
    return value


class TrainingValueError(ValueError):
    """A `ValueError` about config values; `fields`: the fields whose values make it, the reported one first."""

    def __init__(self, message: str, *fields: str):
        super().__init__(message)
        self.fields = fields


MINIMUMS = {  # field: (smallest value, what it is)
    "per_device_train_batch_size": (1, "completions per process per micro-step; the CPU demo uses 16"),
    "gradient_accumulation_steps": (1, "micro-steps per optimizer update; the CPU demo uses 1"),
    "steps_per_generation": (1, "or unset (None) for TRL's default"),
    "generation_batch_size": (1, "or unset (None) for TRL's default"),
    "learning_rate": (0, "the paper uses 1e-6, the CPU demo 1e-4"),
    "max_completion_length": (1, "response tokens per rollout; the paper uses 20480 for Qwen3, the CPU demo 48"),
}


def check_training_values(args) -> None:
    """Refuse the values of a `GRPOConfig` that TRL accepts and fails on later (after the model is built, or with a
    message that hides the cause): a count or the learning rate below its minimum, a seed outside numpy's range, an
    empty `output_dir` or one that is a file, an unknown `report_to` or `loss_type`, `temperature <= 0`, a `max_steps`
    of 0 or below -1. Where TRL (or transformers) refuses the value itself, its words come first, ours after: an
    unknown `report_to` or `loss_type`, a `num_generations` below 2 or that does not divide the generation batch (on
    `WORLD_SIZE` processes). Runs on the raw values of a config or namespace; a value of the wrong type is left to the
    config's own checks.

    Raises:
        TrainingValueError: one line, `field=value ...` with the allowed values.
    """

    def number(name: str, kind=(int, float)):
        value = getattr(args, name, None)
        return value if isinstance(value, kind) and not isinstance(value, bool) else None

    for name, (minimum, what) in MINIMUMS.items():
        if number(name) is not None and number(name) < minimum:
            raise TrainingValueError(f"{name}={number(name)} must be >= {minimum} ({what}).", name)
    for name in ("seed", "data_seed"):  # numpy's seeds: transformers' set_seed fails on others after the model build
        if number(name, int) is not None and not 0 <= number(name, int) <= 2**32 - 1:
            raise TrainingValueError(f"{name}={number(name)} must be in [0, 2**32 - 1] (numpy's seed range).", name)
    output_dir = getattr(args, "output_dir", None)
    if output_dir is not None and not str(output_dir).strip():
        raise TrainingValueError(
            f"output_dir={output_dir!r} is empty: give the folder the run writes its checkpoints, model and files into "
            "(e.g. outputs/my-run).",
            "output_dir",
        )
    if output_dir is not None and os.path.isfile(os.path.expanduser(output_dir)):
        raise TrainingValueError(
            f"output_dir={output_dir!r} is a file: give a folder (it is created if missing).", "output_dir"
        )
    report_to = getattr(args, "report_to", None)
    if report_to not in (None, "none", "all", []):
        from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK

        allowed = ["none", "all", *INTEGRATION_TO_CALLBACK]
        unknown = [name for name in ([report_to] if isinstance(report_to, str) else report_to) if name not in allowed]
        if unknown:  # transformers' words (it refuses them once the model is built), the field first
            message = (
                f"report_to={report_to!r}: {unknown[0]} is not supported, only {', '.join(allowed)} are supported."
            )
            raise TrainingValueError(message, "report_to")
    if getattr(args, "loss_type", None) not in (None, *LOSS_TYPES):  # TRL's words, at its first loss step
        message = f"Unknown loss type: {args.loss_type} (loss_type={args.loss_type!r}; TRL's are {list(LOSS_TYPES)})."
        raise TrainingValueError(message, "loss_type")
    if number("temperature") is not None and not number("temperature") > 0:
        raise TrainingValueError(
            f"temperature={number('temperature')} must be > 0: GRPO samples its rollouts (0 would be greedy, and "
            "generation refuses it); the S2T thresholds are calibrated at 1.0, the paper's value.",
            "temperature",
        )
    if number("max_steps", int) is not None and (args.max_steps == 0 or args.max_steps < -1):  # <= 0 reads as epochs
        raise TrainingValueError(
            f"max_steps={args.max_steps} is not a number of optimizer steps: give a positive number, or -1 (the default) "
            "to train for num_train_epochs epochs.",
            "max_steps",
        )
    # The generation batch (all processes) must hold whole groups of num_generations completions: TRL's words, then
    # where the batch comes from (a generation_batch_size set by hand is left to TRL's own checks).
    names = ("num_generations", "per_device_train_batch_size", "steps_per_generation")
    num_generations, per_device, steps, fixed, grad_accum = (
        getattr(args, name, None) for name in (*names, "generation_batch_size", "gradient_accumulation_steps")
    )
    if any(value is not None and type(value) is not int for value in (num_generations, per_device, steps, grad_accum)):
        return  # not integers: the parser or the config names the type
    if num_generations is None or per_device is None or fixed is not None:
        return  # TRL's defaults, or its own checks of generation_batch_size
    steps_name = "steps_per_generation" if steps is not None else "gradient_accumulation_steps"
    processes, micro_steps = int(os.environ.get("WORLD_SIZE", "1")), steps or grad_accum or 1
    batch = per_device * processes * micro_steps
    if num_generations and batch % num_generations:
        valid = [d for d in range(2, batch + 1) if batch % d == 0]
        raise TrainingValueError(
            f"generation_batch_size ({batch}) must be divisible by num_generations ({num_generations}). The "
            f"generation batch is per_device_train_batch_size {per_device} x {processes} process(es) x {steps_name} "
            f"{micro_steps} = {batch} completions, and each prompt needs a whole group of num_generations "
            f"completions. Valid num_generations for this batch: {valid}. "
            f"Or change per_device_train_batch_size / {steps_name} so that the generation batch is a multiple of "
            "num_generations.",
            *names[:2], steps_name,
        )  # fmt: skip
    if num_generations < 2:  # TRL's words (for 0, TRL divides by it first)
        raise TrainingValueError(
            "GRPO requires at least 2 generations per prompt to calculate the advantages. You provided "
            f"{num_generations}, which is less than the minimum required. Set num_generations to 2 or more (the paper "
            "uses 8).",
            "num_generations",
        )
