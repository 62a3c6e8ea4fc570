"""The product's `STAPOConfig`: the core's ([`stapo_trl.core.STAPOConfig`]) plus what `stapo_trl` adds around it.

- `s2t_write_run_files`: `train()` writes `metrics.jsonl` and `spurious_tokens.jsonl` (the files `stapo-plot` reads).
- CPU defaults: on a machine without an accelerator, `use_cpu=True` and `bf16=False` unless set.
- Early refusals of values TRL would accept and fail on later (an `output_dir` that is a file, `temperature <= 0`,
  `max_completion_length < 1`), and YAML's unquoted `off` for `s2t_mode`; before TRL's own checks, the counts, the
  learning rate, `report_to`, `max_steps` and the generation batch ([`~stapo_trl.checks.training_values`], the
  same checks and messages as `stapo-train`).
- In a launched process, the process-group workaround of [`~stapo_trl.integrations.process_group`].
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import ClassVar, Literal

import torch
from transformers.utils import is_torch_hpu_available, is_torch_neuron_available, is_torch_xla_available

from . import core
from .checks.training_values import check_training_values
from .diagnostics.ablations import ABLATION_MODES
from .integrations.process_group import import_group_capturing_modules


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
            line naming the field and the allowed values: see the module docstring, and
            [`~stapo_trl.checks.training_values.check_training_values`] (a
            [`~stapo_trl.checks.training_values.TrainingValueError`]), whose checks and messages `stapo-train` shares.
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
            uses_deepspeed = bool(self.deepspeed) or os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true"
            import_group_capturing_modules(deepspeed=uses_deepspeed)
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
        if self.output_dir is not None and os.path.isfile(os.path.expanduser(self.output_dir)):
            raise ValueError(f"output_dir={self.output_dir!r} is a file: give a folder (it is created if missing).")
        if self.s2t_mode is False:
            raise ValueError(
                's2t_mode=False: YAML reads an unquoted `off` (or `no`, `false`) as the boolean false. Write s2t_mode: "off" (quoted); '
                f"allowed values: {list(self._s2t_modes)}."
            )
        # Counts, learning rate, report_to, max_steps, the generation batch: before TRL's own checks, whose messages
        # hide the cause; the same set (and messages) as stapo-train's.
        check_training_values(self)
        super().__post_init__()
        if self.loss_type not in LOSS_TYPES:
            raise ValueError(f"loss_type={self.loss_type!r} is not one of TRL's loss types: {list(LOSS_TYPES)}.")
        if not self.temperature > 0:
            raise ValueError(
                f"temperature={self.temperature!r} must be > 0: GRPO samples its rollouts (0 would be greedy, and "
                "generation refuses it); the S2T thresholds are calibrated at 1.0, the paper's value."
            )
        if self.max_completion_length is not None and self.max_completion_length < 1:
            raise ValueError(
                f"max_completion_length={self.max_completion_length!r} must be >= 1 (response tokens per rollout; "
                "the paper uses 20480 for Qwen3, the CPU demo 48)."
            )


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
