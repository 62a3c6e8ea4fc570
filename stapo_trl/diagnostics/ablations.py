r"""The paper's ablations of the S2T rule: which candidates are silenced instead. `"high_entropy"` silences those above
the (1 - q)-quantile of their entropies (the exploratory ones the rule keeps), `"all_low_prob"` every candidate
(JustRL-FullMask). Both keep the core's candidates, loss mask and normalization ([`~stapo_trl.core.s2t_mask`] with
`mode="off"`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch

from ..core.s2t import S2TResult, linear_quantile, s2t_mask


ABLATION_MODES = ("high_entropy", "all_low_prob")


def ablation_mask(
    per_token_logps: torch.Tensor,
    entropies: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    mode: str,
    prob_threshold: float = 0.002,
    entropy_quantile: float = 0.75,
    gather: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> S2TResult:
    """The keep mask of an ablation `mode`, with the arguments and result of [`~stapo_trl.core.s2t_mask`]; its
    `entropy_threshold` is the (1 - q)-quantile for `"high_entropy"`, the rule's q-quantile for `"all_low_prob"`. Every
    process runs the same collectives. Raises ValueError for a `mode` not in `ABLATION_MODES`, or as `s2t_mask`."""
    if mode not in ABLATION_MODES:
        raise ValueError(f"mode={mode!r} is not one of {list(ABLATION_MODES)}")
    gather = gather or (lambda t: t)
    base = s2t_mask(
        per_token_logps,
        entropies,
        advantages,
        loss_mask,
        prob_threshold=prob_threshold,
        entropy_quantile=entropy_quantile,
        mode="off",
        gather=gather,
    )
    if mode == "all_low_prob":
        return replace(base, keep=~base.candidate, silenced=base.candidate.clone(), num_silenced=base.num_candidates)
    with torch.no_grad():
        candidate_entropies = entropies[base.candidate].double()  # (N_local,)
        all_entropies = gather(candidate_entropies)  # (N_global,)
        threshold = linear_quantile(all_entropies, 1.0 - entropy_quantile) if all_entropies.numel() else float("nan")
        silenced = torch.zeros_like(base.candidate)  # (B, T)
        silenced[base.candidate] = candidate_entropies > threshold
        num_silenced = int(gather(silenced.count_nonzero().double().view(1)).sum())
    return replace(base, keep=~silenced, silenced=silenced, entropy_threshold=threshold, num_silenced=num_silenced)
