# Copyright 2026 The stapo_trl Authors. All rights reserved.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.

"""`STAPOConfig`: `trl.GRPOConfig` with the S2T fields of STAPO and the paper's objective as defaults."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from trl import GRPOConfig

from .s2t import S2T_MODES


@dataclass
class STAPOConfig(GRPOConfig):
    r"""
    Configuration class for the [`STAPOTrainer`].

    [STAPO](https://huggingface.co/papers/2602.15620) only changes which tokens count in the GRPO loss: tokens of a
    positive-advantage completion sampled with a low probability at a low-entropy position are silenced, and the loss
    is averaged over the remaining tokens. Four inherited defaults change to the paper's objective (Sec. 4.1, the
    DAPO/JustRL objective): `loss_type="dapo"`, `epsilon=0.2`, `epsilon_high=0.28`, `beta=0.0`.

    Parameters:
        > Parameters that control the S2T mask

        s2t_prob_threshold (`float`, *optional*, defaults to `0.002`):
            tau_p: a positive-advantage token is a candidate when its sampled probability is below this value.
            Range (0, 1]. Calibrated at `temperature=1.0`, the paper's value.
        s2t_entropy_quantile (`float`, *optional*, defaults to `0.75`):
            q: tau_h is the q-quantile of the candidates' entropies (nats) over each optimizer update on all
            processes; candidates below tau_h are silenced. Range [0, 1]. Paper: 0.75 (v1: 0.80).
        s2t_mode (`str`, *optional*, defaults to `"low_entropy"`):
            `"low_entropy"` applies the rule; `"off"` silences nothing but logs the same counts: the baseline with the
            same trainer and normalizer.
    """

    _s2t_modes: ClassVar[tuple[str, ...]] = S2T_MODES

    # Paper objective (Sec. 4.1)
    loss_type: str = field(default="dapo", metadata={"help": "As in GRPOConfig. STAPO: 'dapo' (token mean)."})
    epsilon: float = field(default=0.2, metadata={"help": "Lower clipping epsilon. Paper: 0.2."})
    epsilon_high: float | None = field(default=0.28, metadata={"help": "Upper clipping epsilon. Paper: 0.28."})
    beta: float = field(default=0.0, metadata={"help": "KL coefficient. Paper: 0.0 (no reference model)."})

    # > Parameters that control the S2T mask
    s2t_prob_threshold: float = field(
        default=0.002,
        metadata={"help": "tau_p: positive-advantage tokens with probability below it are candidates. (0, 1]."},
    )
    s2t_entropy_quantile: float = field(
        default=0.75,
        metadata={"help": "q: candidates below the q-quantile of their entropies per update are silenced. [0, 1]."},
    )
    s2t_mode: Literal["low_entropy", "off"] = field(
        default="low_entropy",
        metadata={"help": "'low_entropy' (STAPO) or 'off' (nothing silenced, counts logged).", "choices": S2T_MODES},
    )

    def __post_init__(self):
        super().__post_init__()
        if not 0.0 < self.s2t_prob_threshold <= 1.0:
            raise ValueError(f"s2t_prob_threshold={self.s2t_prob_threshold} must be in (0, 1]; the paper uses 0.002.")
        if not 0.0 <= self.s2t_entropy_quantile <= 1.0:
            raise ValueError(f"s2t_entropy_quantile={self.s2t_entropy_quantile} must be in [0, 1]; the paper: 0.75.")
        if self.s2t_mode not in self._s2t_modes:
            raise ValueError(f"s2t_mode={self.s2t_mode!r} is not one of {list(self._s2t_modes)}.")


def s2t_warnings(args: STAPOConfig, steps_per_generation: int | None = None) -> list[str]:
    """Where the S2T loss cannot be the paper's exact objective: `list[str]`, one message each (none when the mask is
    off). `steps_per_generation` overrides `args.steps_per_generation` (a dry run for another process count)."""
    steps_per_generation = steps_per_generation or args.steps_per_generation
    messages = []
    if args.s2t_mode != "off" and args.loss_type in ("dr_grpo", "luspo"):
        messages.append(
            f"loss_type={args.loss_type!r} has a constant denominator: silenced tokens leave the numerator only. "
            "STAPO's kept-token average needs 'dapo' (the paper's), 'bnpo', 'grpo', 'cispo' or 'vespo'."
        )
    if args.s2t_mode != "off" and steps_per_generation % args.gradient_accumulation_steps:
        messages.append(
            f"steps_per_generation={steps_per_generation} is not a multiple of gradient_accumulation_steps="
            f"{args.gradient_accumulation_steps}: an optimizer update spans rollout batches, so tau_h is taken over each "
            "rollout batch and the loss keeps TRL's estimated normalizer instead of the update's kept-token count."
        )
    return messages
