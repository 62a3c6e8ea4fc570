"""`STAPOConfig`: `trl.GRPOConfig` plus the S2T fields of STAPO, with the paper's objective as defaults."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Literal

from trl import GRPOConfig

from .process_group import import_group_capturing_modules
from .s2t import S2T_MODES


import_group_capturing_modules()  # before a config (and so the process group) can exist; see process_group.py


S2T_SCOPES = ("generation_batch", "micro_batch")


@dataclass
class STAPOConfig(GRPOConfig):
    r"""
    Configuration class for [`STAPOTrainer`].

    [STAPO](https://huggingface.co/papers/2602.15620) ("Stabilizing Reinforcement Learning for LLMs by Silencing Rare
    Spurious Tokens", Liu et al., 2026) only changes *which tokens count* in the GRPO loss: positive-advantage tokens
    that were sampled with a low probability at a low-entropy position ("spurious tokens") are removed from the
    numerator and the denominator of the token-mean loss. Every other field is inherited from [`~trl.GRPOConfig`];
    only the fields below are new, and four inherited defaults change to the paper's objective (the DAPO/JustRL
    objective: clip-higher, token-level normalisation, no KL): `loss_type="dapo"`, `epsilon=0.2`,
    `epsilon_high=0.28`, `beta=0.0`.

    Parameters:
        > Parameters that control the S2T mask (STAPO Sec. 3)

        s2t_prob_threshold (`float`, *optional*, defaults to `0.002`):
            τ_p: a positive-advantage token is a *candidate* when the probability of the sampled token under the
            current policy is strictly below this value. Range (0, 1]. Paper default 0.002. The probabilities come
            from the temperature-scaled logits used by the loss, so the threshold is calibrated at
            `temperature=1.0`.
        s2t_entropy_quantile (`float`, *optional*, defaults to `0.75`):
            q: the entropy threshold τ_h is the q-quantile (linear interpolation) of the candidates' entropies (nats)
            over the whole scope (all processes). Candidates with entropy strictly below τ_h are silenced, so about
            the bottom q of candidates by entropy are silenced and the top 1 - q (the exploratory ones) are kept.
            Range [0, 1]. Paper default 0.75 (v4/v5); v1 used 0.80.
        s2t_mode (`str`, *optional*, defaults to `"low_entropy"`):
            Which candidates are silenced: `"low_entropy"` (STAPO), `"high_entropy"` (the paper's ablation: silence
            candidates above the (1 - q)-quantile), `"all_low_prob"` (the paper's ablation: silence every candidate),
            `"off"` (silence nothing, still log the counts; the loss then equals `GRPOTrainer`'s).
        s2t_scope (`str`, *optional*, defaults to `"generation_batch"`):
            Over which tokens τ_h is computed and which kept-token count normalises the loss.
            `"generation_batch"` (the paper's per-mini-batch rule): the mask is built once per generation batch from
            a no-grad forward under the current policy (reusing TRL's old-log-prob forward when there is one, else
            one extra forward), and `dapo`/`cispo`/`vespo` divide by the global kept-token count of each optimizer
            step. `"micro_batch"`: the mask is built inside the loss from the training forward (no extra forward);
            τ_h and the kept-token count are then those of the current micro-step over all processes.
        s2t_diagnostics (`bool`, *optional*, defaults to `True`):
            Log the extra `s2t/` diagnostics (entropy quantiles of the loss tokens, mean probability and entropy of
            silenced tokens, logit-gradient-norm shares of candidates and silenced tokens); the policy's LM head then
            also returns log Σ_v π_v² from the same pass over the vocabulary. The mask and the loss do not depend on
            it. Off: only the mask counts (`s2t/silenced_ratio`, ...) are logged.
    """

    # Paper objective (STAPO Sec. 4.1: GRPO with clip-higher, token-level normalisation, no KL, as DAPO/JustRL).
    loss_type: str = field(
        default="dapo",
        metadata={
            "help": "Loss formulation, as in `GRPOConfig`. STAPO default: 'dapo' (global token mean; the S2T mask "
            "removes silenced tokens from numerator and denominator for every loss type)."
        },
    )
    epsilon: float = field(default=0.2, metadata={"help": "Lower clipping epsilon. Paper: 0.2."})
    epsilon_high: float | None = field(
        default=0.28, metadata={"help": "Upper clipping epsilon (clip-higher). Paper: 0.28."}
    )
    beta: float = field(default=0.0, metadata={"help": "KL coefficient. Paper: 0.0 (no KL, no reference model)."})

    # > Parameters that control the S2T mask
    s2t_prob_threshold: float = field(
        default=0.002,
        metadata={
            "help": "tau_p: positive-advantage tokens sampled with probability strictly below this value are "
            "candidates for silencing. Range (0, 1]. Paper default 0.002 (calibrated at temperature 1.0)."
        },
    )
    s2t_entropy_quantile: float = field(
        default=0.75,
        metadata={
            "help": "q: tau_h is the q-quantile (linear interpolation) of the candidates' entropies (nats) over the "
            "scope and all processes; candidates with entropy < tau_h are silenced. Range [0, 1]. Paper default "
            "0.75 (v4/v5); v1 used 0.80."
        },
    )
    s2t_mode: Literal["low_entropy", "high_entropy", "all_low_prob", "off"] = field(
        default="low_entropy",
        metadata={
            "help": "Which candidates are silenced: 'low_entropy' (STAPO), 'high_entropy' (ablation, above the "
            "(1-q)-quantile), 'all_low_prob' (ablation, every candidate), 'off' (none; counts still logged).",
            "choices": list(S2T_MODES),
        },
    )
    s2t_scope: Literal["generation_batch", "micro_batch"] = field(
        default="generation_batch",
        metadata={
            "help": "Scope of tau_h and of the kept-token normaliser: 'generation_batch' (paper; one no-grad forward "
            "per generation batch unless TRL already runs one) or 'micro_batch' (from the training forward, "
            "per micro-step).",
            "choices": list(S2T_SCOPES),
        },
    )
    s2t_diagnostics: bool = field(
        default=True,
        metadata={
            "help": "Log the extra s2t/ diagnostics (entropy quantiles, silenced-token means, logit-gradient-norm "
            "shares). The mask and the loss do not depend on it."
        },
    )

    def __post_init__(self):
        super().__post_init__()
        if not 0.0 < self.s2t_prob_threshold <= 1.0:
            raise ValueError(
                f"s2t_prob_threshold={self.s2t_prob_threshold!r} is out of range: it is a probability threshold "
                "tau_p and must be in (0, 1]. The paper uses 0.002."
            )
        if not 0.0 <= self.s2t_entropy_quantile <= 1.0:
            raise ValueError(
                f"s2t_entropy_quantile={self.s2t_entropy_quantile!r} is out of range: it is the quantile q and must "
                "be in [0, 1]. The paper uses 0.75 (0.80 in v1)."
            )
        if self.s2t_mode not in S2T_MODES:
            raise ValueError(f"s2t_mode={self.s2t_mode!r} is not one of {list(S2T_MODES)}.")
        if self.s2t_scope not in S2T_SCOPES:
            raise ValueError(f"s2t_scope={self.s2t_scope!r} is not one of {list(S2T_SCOPES)}.")
        if self.temperature != 1.0 and self.s2t_mode != "off":
            warnings.warn(
                f"temperature={self.temperature}: the S2T thresholds (s2t_prob_threshold, s2t_entropy_quantile) are "
                "calibrated at temperature 1.0, and probabilities and entropies are taken from the temperature-scaled "
                "logits. The paper trains at 1.0.",
                stacklevel=2,
            )
