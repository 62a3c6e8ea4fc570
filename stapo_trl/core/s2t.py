# Copyright 2026 The stapo_trl Authors. All rights reserved.
# SPDX-License-Identifier: Apache-2.0

"""The S2T rule of [STAPO](https://huggingface.co/papers/2602.15620) (Sec. 3) as pure tensor maths; torch only."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields

import torch


S2T_MODES = ("low_entropy", "off")


@dataclass(frozen=True)
class S2TSettings:
    """tau_p in (0, 1], q in [0, 1], the mode: the paper's defaults (Sec. 4.1), checked (`ValueError`: `s2t_*`)."""

    prob_threshold: float = 0.002
    entropy_quantile: float = 0.75
    mode: str = "low_entropy"

    def __post_init__(self):
        for f, allowed in zip(fields(self)[:2], ("(0, 1]", "[0, 1]"), strict=True):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"s2t_{f.name}={value!r} must be a number in {allowed}, got {type(value).__name__}.")
            if not (0.0 < value <= 1.0 if allowed[0] == "(" else 0.0 <= value <= 1.0):
                raise ValueError(f"s2t_{f.name}={value} must be in {allowed}; the paper: {f.default}.")


@dataclass
class S2TResult:
    """[`s2t_mask`]'s bool (B, T) masks (`keep` is `True` outside the loss mask), tau_h in nats (NaN without
    candidates) and counts over all processes (`num_nonfinite`: loss tokens with NaN/inf log p or H)."""

    keep: torch.Tensor
    candidate: torch.Tensor
    silenced: torch.Tensor
    entropy_threshold: float
    num_candidates: int
    num_silenced: int
    num_loss_tokens: int
    num_nonfinite: int = 0

    @property
    def num_kept(self) -> int:
        return self.num_loss_tokens - self.num_silenced


def linear_quantile(values: torch.Tensor, q: float) -> float:
    """numpy's linear q-quantile of a non-empty 1-D tensor, float64, by `kthvalue` (no 2**24 cap); else ValueError."""
    if values.dim() != 1 or values.numel() == 0 or not 0.0 <= q <= 1.0:
        raise ValueError(f"linear_quantile needs a non-empty 1-D tensor and q in [0, 1], got {values.shape}, {q}")
    h = (values.numel() - 1) * q
    lo, hi = math.floor(h), math.ceil(h)
    x_lo = torch.kthvalue(values, lo + 1).values.double().item()
    x_hi = x_lo if hi == lo else torch.kthvalue(values, hi + 1).values.double().item()
    return x_lo + (h - lo) * (x_hi - x_lo)


def s2t_mask(per_token_logps: torch.Tensor, entropies: torch.Tensor, advantages: torch.Tensor, loss_mask: torch.Tensor,
             *, prob_threshold: float = S2TSettings.prob_threshold,
             entropy_quantile: float = S2TSettings.entropy_quantile, mode: str = S2TSettings.mode,
             gather: Callable[[torch.Tensor], torch.Tensor] | None = None) -> S2TResult:  # fmt: skip
    r"""The keep mask of the S2T rule ([STAPO](https://huggingface.co/papers/2602.15620), Sec. 3).

        candidate_it = loss_mask_it and A_i > 0 and p_it < tau_p       (log p and H finite)
        tau_h        = q-quantile of {H_it : candidate_it} over all processes (linear interpolation, float64)
        silenced_it  = candidate_it and H_it < tau_h                  (strict: a lone candidate is kept)
        keep_it      = not silenced_it

    `p < tau_p` is evaluated as `log p < log tau_p`, `H < tau_h` in float64. Inputs are not modified.

    Args: per_token_logps, entropies: float (B, T), log p of the sampled tokens and H, in nats; advantages: float
    (B,), (B, 1) or (B, T); loss_mask: bool/int/float (B, T); prob_threshold (tau_p), entropy_quantile (q), mode
    (`"off"`: none silenced): [`S2TSettings`]; gather: concatenates a 1-D tensor over processes (two calls on every
    process, also without candidates), `None` for one process.

    Returns [`S2TResult`]. Raises `ValueError`: an unknown `mode`, a threshold out of range, mismatched shapes.
    """
    if S2TSettings(prob_threshold, entropy_quantile, mode).mode not in S2T_MODES:
        raise ValueError(f"mode={mode!r} is not one of {list(S2T_MODES)}")
    advantages = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages  # (B, 1) or (B, T)
    shapes = [tuple(t.shape) for t in (per_token_logps, entropies, loss_mask)]
    if per_token_logps.dim() != 2 or len(set(shapes)) > 1 or advantages.size(0) != per_token_logps.size(0):
        raise ValueError(f"per_token_logps, entropies, loss_mask must share a (B, T) shape, advantages (B,): {shapes}")
    gather = gather or (lambda t: t)
    with torch.no_grad():
        in_loss = loss_mask.bool()  # (B, T)
        finite = torch.isfinite(per_token_logps) & torch.isfinite(entropies)  # (B, T)
        candidate = in_loss & finite & (advantages > 0) & (per_token_logps < math.log(prob_threshold))  # (B, T)
        candidate_entropies = entropies[candidate].double()  # (N_local,): float64 is exact for fp32 / bf16
        all_candidate_entropies = gather(candidate_entropies)  # (N_global,)
        num_candidates = all_candidate_entropies.numel()
        threshold = linear_quantile(all_candidate_entropies, entropy_quantile) if num_candidates else float("nan")
        silenced = torch.zeros_like(candidate)  # (B, T)
        if mode == "low_entropy":
            silenced[candidate] = candidate_entropies < threshold
        counts = torch.stack([silenced.count_nonzero(), in_loss.count_nonzero(), (in_loss & ~finite).count_nonzero()])
        counts = gather(counts.double()).view(-1, 3).sum(0).long().tolist()  # silenced, loss tokens, non-finite
    return S2TResult(~silenced, candidate, silenced, threshold, num_candidates, *counts)
