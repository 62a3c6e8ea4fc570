"""The values of a training config that TRL checks late, with an unclear message, or never: one set of checks for the
Python API and `stapo-train`.

[`~stapo_trl.STAPOConfig`] runs [`check_training_values`] in its `__post_init__`, before TRL's own checks (which
would otherwise answer `per_device_train_batch_size=-4` with "generation_batch_size (-4) must be divisible by
num_generations (8)"); `stapo-train` gets the same messages from it, and runs it on the parsed values itself for
`trainer: grpo` (a plain `GRPOConfig`). The CLI adds the flag or the recipe key around the message: each error
names its fields ([`TrainingValueError.fields`]).
"""

from __future__ import annotations

import os
from numbers import Real
from typing import Any


class TrainingValueError(ValueError):
    """A `ValueError` about the value of one or more config fields.

    Attributes:
        fields (`tuple[str, ...]`): the fields whose values make the error, the reported one first (the message
            starts with `field=value`); `stapo-train` names the flags or recipe keys they came from.
    """

    def __init__(self, message: str, fields: tuple[str, ...]):
        super().__init__(message)
        self.fields = tuple(fields)


def _below(value: Any, minimum: float) -> bool:
    """Whether `value` is a number (not a bool) below `minimum`; other types are left to the config's own checks."""
    return isinstance(value, Real) and not isinstance(value, bool) and value < minimum


def _divisors(n: int, minimum: int = 1) -> list[int]:
    return [d for d in range(minimum, n + 1) if n % d == 0]


def check_training_values(args: Any, num_processes: int | None = None) -> None:
    """Refuse the counts and settings that upstream checks only once the model is built, with a message that hides
    the cause, or never: batch sizes and accumulation below 1, fewer than 2 generations per prompt, a negative
    learning rate, a seed outside numpy's range, an empty `output_dir`, an unknown `report_to`, a `max_steps` that is
    not a number of steps, and a `num_generations` that does not divide the generation batch.

    Args:
        args: a [`~trl.GRPOConfig`] before its own `__post_init__` (as [`~stapo_trl.STAPOConfig`] calls it), or any
            object with the same attributes (`stapo-train`'s parsed namespace); a missing attribute is not checked.
        num_processes (`int`, *optional*): training processes, for the generation batch; defaults to `WORLD_SIZE`
            (set by `torchrun` and `accelerate launch`), else 1.

    Raises:
        TrainingValueError: one line, `field=value ...` with the allowed values (and the paper's setting), e.g.
            "per_device_train_batch_size=-4 must be >= 1 (completions per process per micro-step; the CPU demo uses
            16)."
    """
    value = lambda name: getattr(args, name, None)  # noqa: E731
    for name, what in (
        ("per_device_train_batch_size", "completions per process per micro-step; the CPU demo uses 16"),
        ("gradient_accumulation_steps", "micro-steps per optimizer update; the CPU demo uses 1"),
    ):
        if _below(value(name), 1):
            raise TrainingValueError(f"{name}={value(name)} must be >= 1 ({what}).", (name,))
    for name in ("steps_per_generation", "generation_batch_size"):
        if _below(value(name), 1):
            raise TrainingValueError(f"{name}={value(name)} must be >= 1, or unset (None) for TRL's default.", (name,))
    num_generations = value("num_generations")
    if _below(num_generations, 2):
        raise TrainingValueError(
            f"num_generations={num_generations} must be >= 2: GRPO's advantage compares the completions of one prompt "
            "(the paper uses 8).",
            ("num_generations",),
        )
    if _below(value("learning_rate"), 0):
        raise TrainingValueError(
            f"learning_rate={value('learning_rate')} must be >= 0 (the paper uses 1e-6, the CPU demo 1e-4).",
            ("learning_rate",),
        )
    for name in ("seed", "data_seed"):  # numpy's seeds: transformers' set_seed fails on others after the model build
        seed = value(name)
        if isinstance(seed, int) and not isinstance(seed, bool) and not 0 <= seed <= 2**32 - 1:
            raise TrainingValueError(f"{name}={seed} must be in [0, 2**32 - 1] (numpy's seed range).", (name,))
    if value("output_dir") is not None and not str(value("output_dir")).strip():
        raise TrainingValueError(
            f"output_dir={value('output_dir')!r} is empty: give the folder the run writes into (outputs/my-run).",
            ("output_dir",),
        )
    _check_report_to(value("report_to"))
    max_steps = value("max_steps")
    if isinstance(max_steps, int) and (max_steps == 0 or max_steps < -1):  # transformers reads <= 0 as "use epochs"
        raise TrainingValueError(
            f"max_steps={max_steps} is not a number of optimizer steps: give a positive number, or -1 (the default) "
            "to train for num_train_epochs epochs.",
            ("max_steps",),
        )
    _check_generation_batch(args, num_processes)


def _check_report_to(report_to: Any) -> None:
    if report_to is None or report_to in ("none", "all", []):
        return
    from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK

    allowed = ["none", "all", *INTEGRATION_TO_CALLBACK]
    names = [report_to] if isinstance(report_to, str) else report_to
    unknown = [name for name in names if name not in allowed]
    if unknown:
        raise TrainingValueError(
            f"report_to={report_to!r}: {', '.join(map(repr, unknown))} is not one of {allowed}.", ("report_to",)
        )


def _check_generation_batch(args: Any, num_processes: int | None) -> None:
    """A `num_generations` that does not divide the generation batch: the valid values, and the fields that made it.

    The generation batch (completions generated at once, all processes) is `generation_batch_size` if set, else
    `per_device_train_batch_size x processes x steps_per_generation` (`steps_per_generation` defaults to
    `gradient_accumulation_steps`); it must hold whole groups of `num_generations` completions per prompt.
    """
    num_generations = getattr(args, "num_generations", None)
    per_device = getattr(args, "per_device_train_batch_size", None)
    steps = getattr(args, "steps_per_generation", None)
    fixed = getattr(args, "generation_batch_size", None)
    grad_accum = getattr(args, "gradient_accumulation_steps", 1)
    counts = (num_generations, per_device, steps, fixed, grad_accum)
    if any(v is not None and (isinstance(v, bool) or not isinstance(v, int)) for v in counts):
        return  # not integers: the parser or the config names the type
    if num_generations is None or per_device is None or (steps is not None and fixed is not None):
        return  # TRL's defaults; both set: TRL's own "can not be both configured"
    processes = num_processes or int(os.environ.get("WORLD_SIZE", "1"))
    if fixed is not None:
        batch, fields = fixed, ("num_generations", "generation_batch_size")
        how = f"generation_batch_size = {batch}"
    else:
        steps_name = "steps_per_generation" if steps is not None else "gradient_accumulation_steps"
        micro_steps = steps if steps is not None else grad_accum
        batch, fields = (
            per_device * processes * micro_steps,
            ("num_generations", "per_device_train_batch_size", steps_name),
        )
        how = (
            f"per_device_train_batch_size {per_device} x {processes} process(es) x {steps_name} {micro_steps} = "
            f"{batch} completions"
        )
    if batch % num_generations == 0:
        return
    raise TrainingValueError(
        f"num_generations={num_generations} does not divide the generation batch ({how}): each prompt needs a whole "
        f"group of num_generations completions. Valid num_generations for this batch: {_divisors(batch, 2)}. Or change "
        f"per_device_train_batch_size / {fields[-1]} so that the generation batch is a multiple of num_generations.",
        fields,
    )


__all__ = ["TrainingValueError", "check_training_values"]
