"""The paper's ablations of the S2T rule: other candidates silenced ([`~stapo_trl.core.s2t_mask`], `mode="off"`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch

from ..core.s2t import S2TResult, S2TSettings, linear_quantile, s2t_mask


ABLATIONS = ("high_entropy", "all_low_prob")


def ablation_mask(per_token_logps: torch.Tensor, entropies: torch.Tensor, advantages: torch.Tensor,
                  loss_mask: torch.Tensor, *, mode: str, prob_threshold: float = S2TSettings.prob_threshold,
                  entropy_quantile: float = S2TSettings.entropy_quantile,
                  gather: Callable[[torch.Tensor], torch.Tensor] | None = None) -> S2TResult:  # fmt: skip
    """The keep mask of an ablation `mode` (`ABLATIONS`), with the arguments, result, collectives and `ValueError`s of
    [`~stapo_trl.core.s2t_mask`]; `entropy_threshold` is the (1 - q)-quantile for `"high_entropy"`."""
    if mode not in ABLATIONS:
        raise ValueError(f"mode={mode!r} is not one of {list(ABLATIONS)}")
    base = s2t_mask(per_token_logps, entropies, advantages, loss_mask, prob_threshold=prob_threshold,
                    entropy_quantile=entropy_quantile, mode="off", gather=gather)  # fmt: skip
    if mode == "all_low_prob":
        return replace(base, keep=~base.candidate, silenced=base.candidate.clone(), num_silenced=base.num_candidates)
    gather = gather or (lambda t: t)
    with torch.no_grad():
        candidate_entropies = entropies[base.candidate].double()  # (N_local,)
        all_entropies = gather(candidate_entropies)  # (N_global,)
        threshold = linear_quantile(all_entropies, 1.0 - entropy_quantile) if all_entropies.numel() else float("nan")
        silenced = torch.zeros_like(base.candidate)  # (B, T)
        silenced[base.candidate] = candidate_entropies > threshold
        num_silenced = int(gather(silenced.count_nonzero().double().view(1)).sum())
    return replace(base, keep=~silenced, silenced=silenced, entropy_threshold=threshold, num_silenced=num_silenced)
