# Copyright 2026 The stapo_trl Authors. All rights reserved.
# SPDX-License-Identifier: Apache-2.0

"""`STAPOConfig`, and what any `GRPOConfig` means for STAPO: its S2T settings, p and H's path, the features warned."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import ClassVar, Literal

import trl
from packaging.version import Version
from trl import GRPOConfig

from .s2t import S2T_MODES, S2TSettings


PAPER_OBJECTIVE = {"loss_type": "dapo", "epsilon": 0.2, "epsilon_high": 0.28, "beta": 0.0}
NUM_ITEMS_LOSSES = ("dapo", "cispo", "vespo")  # divided by `num_items_in_batch`


@dataclass
class STAPOConfig(GRPOConfig):
    r"""Config of the [`STAPOTrainer`]: [`~trl.GRPOConfig`] with the S2T fields and the paper's objective.

    The defaults are the paper's objective (Sec. 4.1, DAPO/JustRL's): `loss_type="dapo"`, `epsilon=0.2`,
    `epsilon_high=0.28`, `beta=0.0`; trl 1.16's `GRPOConfig` differs only in `epsilon_high` (`None`: `epsilon`).
    `stapo_trl.STAPOConfig` (the package's, with CPU defaults and the ablation modes) subclasses this one.

    Parameters:
        s2t_prob_threshold (`float`, *optional*, defaults to `0.002`):
            tau_p: a positive-advantage token sampled with a probability below it is a candidate. (0, 1].
        s2t_entropy_quantile (`float`, *optional*, defaults to `0.75`):
            q: candidates below tau_h, the q-quantile of their entropies (nats) per update, are silenced. [0, 1].
        s2t_mode (`str`, *optional*, defaults to `"low_entropy"`):
            `"low_entropy"` (the rule) or `"off"` (nothing silenced, the same counts logged: the baseline).
    """

    _s2t_modes: ClassVar[tuple[str, ...]] = S2T_MODES

    loss_type: str = field(default=PAPER_OBJECTIVE["loss_type"], metadata={"help": "As in GRPOConfig. Paper: 'dapo'."})
    epsilon: float = field(default=PAPER_OBJECTIVE["epsilon"], metadata={"help": "Paper: 0.2."})
    epsilon_high: float | None = field(default=PAPER_OBJECTIVE["epsilon_high"], metadata={"help": "Paper: 0.28."})
    beta: float = field(default=PAPER_OBJECTIVE["beta"], metadata={"help": "KL coefficient. Paper: 0.0 (no KL)."})

    s2t_prob_threshold: float = field(default=S2TSettings.prob_threshold, metadata={
        "help": "tau_p: positive-advantage tokens with probability below it are candidates. (0, 1]."})  # fmt: skip
    s2t_entropy_quantile: float = field(default=S2TSettings.entropy_quantile, metadata={
        "help": "q: candidates below the q-quantile of their entropies per update are silenced. [0, 1]."})  # fmt: skip
    s2t_mode: Literal[S2T_MODES] = field(default=S2TSettings.mode, metadata={"choices": S2T_MODES,
        "help": "'low_entropy' (STAPO) or 'off' (nothing silenced, counts logged)."})  # fmt: skip

    def __post_init__(self):
        super().__post_init__()
        s2t_settings(self, self._s2t_modes)


def s2t_settings(args: GRPOConfig, modes: tuple[str, ...] = S2T_MODES) -> S2TSettings:
    """Any `GRPOConfig`'s `s2t_*` fields, else the paper's; ValueError naming a bad field or a path past the mask."""
    settings = S2TSettings(**{f.name: getattr(args, f"s2t_{f.name}", f.default) for f in fields(S2TSettings)})
    if settings.mode not in modes:
        raise ValueError(f"s2t_mode={settings.mode!r} is not one of {list(modes)}.")
    refuse_paths_around_the_mask(args)
    return settings


def refuse_paths_around_the_mask(args: GRPOConfig) -> None:
    """`ValueError` for a setting with which the installed TRL trains past the mask: `use_liger_kernel=True` below
    trl 1.14, `loss_type="luspo"` with token-level ratios below trl 1.10."""
    version = Version(trl.__version__)
    if getattr(args, "use_liger_kernel", False) and version < Version("1.14.0"):
        raise ValueError(
            f"use_liger_kernel=True: trl {trl.__version__} computes the loss in Liger's kernel, past the S2T mask. "
            "Set use_liger_kernel=False, or use trl>=1.14."
        )
    if args.loss_type == "luspo" and args.importance_sampling_level == "token" and version < Version("1.10.0"):
        raise ValueError(
            f"loss_type='luspo' with importance_sampling_level='token': trl {trl.__version__} sums every token's "
            "loss, masked or not. Use importance_sampling_level='sequence', or trl>=1.10."
        )


def s2t_settings_line(args: GRPOConfig, settings: S2TSettings) -> str | None:
    """The S2T values in effect and what differs from the paper's objective in one line; `None` for the paper's."""
    missing = [f"s2t_{f.name}" for f in fields(settings) if not hasattr(args, f"s2t_{f.name}")]
    values = [(f"s2t_{f.name}", getattr(settings, f.name), f.default) for f in fields(settings)]
    values += [(name, getattr(args, name), paper) for name, paper in PAPER_OBJECTIVE.items()]
    differs = ", ".join(f"{name}={value!r} (paper {paper!r})" for name, value, paper in values if value != paper)
    if not missing and not differs:
        return None
    source = f" (the paper's values: {type(args).__name__} has no {', '.join(missing)} field{'s' * (len(missing) > 1)}"
    source += ", and such values given to it, in a YAML file say, are ignored; to set them, use `from stapo_trl"
    source = f"{source} import STAPOConfig as GRPOConfig`)" if missing else ""
    end = f"differs from the paper's objective: {differs}." if differs else "the rest is the paper's objective."
    return f"STAPO with {', '.join(f'{name}={value!r}' for name, value, _ in values[:3])}{source}; {end}"


def s2t_path(args: GRPOConfig, steps_per_generation: int | None = None) -> str:
    """Where p and H come from in training (TRL 1.16's decision): `"loss"`, `"old_logps"` or `"extra_forward"`."""
    spg, iterations = steps_per_generation or args.steps_per_generation, args.num_iterations
    if spg == iterations == 1:
        return "loss"
    vllm_is = args.use_vllm and args.vllm_importance_sampling_correction
    return "old_logps" if args.gradient_accumulation_steps % (spg * iterations) or vllm_is else "extra_forward"


def s2t_warnings(args: GRPOConfig, settings: S2TSettings, steps_per_generation=None, num_processes=None) -> list[str]:
    """A message naming the field per GRPO feature the mask changes (docs/stapo.md); the arguments: a dry run's."""
    a, lt, ga = args, args.loss_type, args.gradient_accumulation_steps
    spg = steps_per_generation or a.steps_per_generation
    if settings.mode == "off":
        off = f"s2t_mode='off' with steps_per_generation={spg} > gradient_accumulation_steps={ga} is not plain "
        off += "GRPOTrainer: each update is divided by its own loss-token count, GRPOTrainer's by the rollout batch's."
        return [off] if lt in NUM_ITEMS_LOSSES and spg > ga and spg % ga == 0 else []
    groups = a.per_device_train_batch_size * (num_processes or a.world_size) * ga
    checks = [
        ("loss_type", lt in ("dr_grpo", "luspo"), "a constant denominator: silenced tokens leave the numerator only"),
        ("steps_per_generation", spg % ga, f"not a multiple of GA={ga}: tau_h per rollout batch, TRL's normalizer"),
        ("beta", a.beta, "silenced tokens lose their KL penalty too (part of each token's loss)"),
        ("importance_sampling_level", a.importance_sampling_level == "sequence", "each ratio averages kept tokens"),
        ("loss_type", lt == "vespo", "each completion's weight phi sums its kept tokens' log-ratios only"),
        ("top_entropy_quantile", a.top_entropy_quantile < 1, "its entropy quantile is taken over kept tokens only"),
        ("entropy_coef", a.entropy_coef or a.use_adaptive_entropy, "the bonus averages kept tokens only"),
        ("temperature", a.temperature != 1, "p and H are temperature-scaled; tau_p and q are calibrated at 1.0"),
        ("num_generations", groups % a.num_generations, f"an update of {groups} completions splits prompt groups"),
    ]
    value = lambda name: spg if name == "steps_per_generation" else getattr(a, name)  # noqa: E731
    return [f"S2T mask with {name}={value(name)!r}: {what}." for name, on, what in checks if on]
