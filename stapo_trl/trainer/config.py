"""The package's `STAPOConfig`: the core's with the ablation modes, the run files switch, CPU defaults and checks."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import ClassVar, Literal

import torch
from transformers.utils import is_torch_hpu_available, is_torch_neuron_available, is_torch_xla_available

from .. import core
from ..diagnostics.ablations import ABLATIONS
from ..integrations.process_group import import_group_capturing_modules


S2T_MODES = (*core.s2t.S2T_MODES, *ABLATIONS)
LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo")  # TRL 1.16's
MINIMUMS = {  # field: (smallest value, what it is)
    "per_device_train_batch_size": (1, "completions per process per micro-step; the CPU demo uses 16"),
    "gradient_accumulation_steps": (1, "micro-steps per optimizer update; the CPU demo uses 1"),
    "steps_per_generation": (1, "or unset (None) for TRL's default"),
    "generation_batch_size": (1, "or unset (None) for TRL's default"),
    "learning_rate": (0, "the paper uses 1e-6, the CPU demo 1e-4"),
    "max_completion_length": (1, "response tokens per rollout; the paper uses 20480 for Qwen3, the CPU demo 48"),
}


@dataclass
class STAPOConfig(core.STAPOConfig):
    r"""Configuration class for [`~stapo_trl.STAPOTrainer`]: [`stapo_trl.core.STAPOConfig`], which it subclasses, plus
    the parameters below; a value TRL accepts and fails on later raises a `ValueError` naming the field.

    Parameters:
        s2t_mode (`str`, *optional*, defaults to `"low_entropy"`):
            The core's `"low_entropy"` (STAPO) and `"off"`, plus the paper's ablations `"high_entropy"` (silence the
            candidates above the (1 - q)-quantile) and `"all_low_prob"` (every candidate, JustRL-FullMask).
        s2t_write_run_files (`bool`, *optional*, defaults to `True`):
            During `train()`, write `<output_dir>/metrics.jsonl` and `spurious_tokens.jsonl` (what `stapo-plot` draws).
        use_cpu, bf16 (`bool`, *optional*):
            Not set and without an accelerator: `True` and `False` (bf16 on a CPU is ~2.3x slower), logged once.
    """

    _s2t_modes: ClassVar[tuple[str, ...]] = S2T_MODES

    s2t_mode: Literal[S2T_MODES] = field(default=core.s2t.S2TSettings.mode, metadata={
        "help": "Which candidates are silenced: 'low_entropy' (STAPO), 'off' (none; counts still logged), or the "
                "paper's ablations 'high_entropy' (above the (1-q)-quantile) and 'all_low_prob' (every candidate).",
        "choices": list(S2T_MODES)})  # fmt: skip
    s2t_write_run_files: bool = field(default=True, metadata={
        "help": "Write metrics.jsonl and spurious_tokens.jsonl into output_dir in train()."})  # fmt: skip
    use_cpu: bool | None = field(default=None, metadata={
        "help": "Train on the CPU; not set: when no accelerator.", "nargs": "?", "const": True})  # fmt: skip
    bf16: bool | None = field(default=None, metadata={
        "help": "bf16 mixed precision; not set: False without an accelerator, else TRL's."})  # fmt: skip

    def __post_init__(self):
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # a launched process, before its process group exists
            import_group_capturing_modules()
        if None in (self.use_cpu, self.bf16) and not has_accelerator():  # before TRL turns an unset bf16 on
            changed = ["use_cpu=True"] * (self.use_cpu is None)
            changed += ["bf16=False"] * (self.bf16 is None and not self.fp16)
            self.use_cpu, self.bf16 = self.use_cpu is not False, False if "bf16=False" in changed else self.bf16
            if changed:
                logging.getLogger(__name__).info(
                    "No accelerator found (CUDA, XPU, MPS, NPU, HPU, Neuron, TPU): STAPOConfig defaults to %s on this "
                    "machine; set them explicitly to override.", ", ".join(changed))  # fmt: skip
        self.use_cpu = bool(self.use_cpu)
        if getattr(self, "activation_checkpointing", False) is None:  # transformers >= 5.24's name, no warning
            self.activation_checkpointing = self.gradient_checkpointing
        write_run_files(self)
        if self.s2t_mode is False:
            message = "s2t_mode=False: YAML reads an unquoted `off` (or `no`, `false`) as the boolean false. Write "
            raise ValueError(message + f's2t_mode: "off" (quoted); allowed values: {list(self._s2t_modes)}.')
        check_training_values(self)
        steps_name = "gradient_accumulation_steps" if self.steps_per_generation is None else "steps_per_generation"
        fixed_batch = self.generation_batch_size is not None
        try:
            super().__post_init__()
        except (ValueError, ZeroDivisionError) as error:  # TRL's words stand; the fix follows where TRL gives none
            groups, batch, steps = self.num_generations, self.generation_batch_size, self.steps_per_generation
            if isinstance(error, ValueError) and "generation" not in str(error):
                raise
            if not isinstance(groups, int) or groups < 2:
                words = f"{error} Set" if isinstance(error, ValueError) else f"num_generations={groups}: set"
                message = f"{words} num_generations to 2 or more (the paper uses 8)."
                raise TrainingValueError(message, "num_generations") from error
            if fixed_batch or not isinstance(batch, int) or batch % groups == 0:
                raise
            per_device, valid = self.per_device_train_batch_size, [d for d in range(2, batch + 1) if batch % d == 0]
            raise TrainingValueError(f"{error} The generation batch is per_device_train_batch_size {per_device} x "
                f"{batch // (per_device * steps)} process(es) x {steps_name} {steps} = {batch} completions, and each "
                f"prompt needs a whole group of num_generations completions. Valid num_generations for this batch: "
                f"{valid}. Or change per_device_train_batch_size / {steps_name} so that the generation batch is a "
                "multiple of num_generations.",
                "num_generations", "per_device_train_batch_size", steps_name) from error  # fmt: skip


def has_accelerator() -> bool:
    probes = is_torch_xla_available, is_torch_hpu_available, is_torch_neuron_available
    return torch.accelerator.is_available() or any(probe() for probe in probes)


def write_run_files(args) -> bool:
    """`s2t_write_run_files` of any `GRPOConfig` (`True` where it has none)."""
    if not isinstance(value := getattr(args, "s2t_write_run_files", True), bool):
        raise ValueError(f"s2t_write_run_files={value!r} must be a bool (True or False), got {type(value).__name__}.")
    return value


class TrainingValueError(ValueError):
    def __init__(self, message: str, *fields: str):  # the fields whose values make the error, the reported one first
        super().__init__(message)
        self.fields = fields


def check_training_values(args) -> None:
    """Raise `TrainingValueError` for a value of a `GRPOConfig` or namespace that TRL accepts and fails on later."""
    number = {n: v for n in (*MINIMUMS, "seed", "data_seed", "temperature", "max_steps")
              if isinstance(v := getattr(args, n, None), (int, float)) and not isinstance(v, bool)}  # fmt: skip
    refused = [(n, f"must be >= {low} ({what}).") for n, (low, what) in MINIMUMS.items() if number.get(n, low) < low]
    refused += [(n, "must be in [0, 2**32 - 1] (numpy's seed range).") for n in ("seed", "data_seed")
                if isinstance(v := number.get(n), int) and not 0 <= v <= 2**32 - 1]  # fmt: skip
    if not number.get("temperature", 1) > 0:
        refused.append(("temperature", "must be > 0: GRPO samples its rollouts (the paper: 1.0)."))
    if isinstance(steps := number.get("max_steps"), int) and (steps == 0 or steps < -1):  # <= 0 reads as epochs
        refused.append(("max_steps", "is not a number of optimizer steps: give a positive number, or -1 for "
                        "num_train_epochs epochs."))  # fmt: skip
    if refused:
        raise TrainingValueError(f"{refused[0][0]}={number[refused[0][0]]} {refused[0][1]}", refused[0][0])
    names = [report_to] if isinstance(report_to := getattr(args, "report_to", None), str) else list(report_to or [])
    if names := [name for name in names if name not in ("none", "all")]:
        from transformers.integrations import get_reporting_integration_callbacks

        try:  # transformers' check, run now
            get_reporting_integration_callbacks(names)
        except ValueError as e:
            raise TrainingValueError(f"report_to={report_to!r}: {e}", "report_to") from None
    if getattr(args, "loss_type", None) not in (None, *LOSS_TYPES):  # TRL's words, at its first loss step only
        message = f"Unknown loss type: {args.loss_type} (loss_type={args.loss_type!r}; TRL's are {list(LOSS_TYPES)})."
        raise TrainingValueError(message, "loss_type")
