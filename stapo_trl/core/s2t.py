"""The S2T rule of STAPO ("silencing spurious tokens"), as pure tensor maths.

[STAPO](https://huggingface.co/papers/2602.15620), Sec. 3: a token is *spurious* when its completion has a positive
advantage, the sampled token had a low probability under the current policy, and the position had a low entropy
relative to the other such tokens of the batch. Spurious tokens are silenced: they leave the numerator and the
denominator of the token-mean loss.

This module imports only torch, so the rule can be read and tested without TRL.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch


S2T_MODES = ("low_entropy", "high_entropy", "all_low_prob", "off")


@dataclass
class S2TResult:
    """Output of [`s2t_mask`].

    Attributes:
        keep (`torch.Tensor`):
            bool, shape (B, T). `True` = the token stays in the loss (1 - spurious). Positions outside the loss mask
            are `True` too: `keep` is meant to be multiplied with the loss mask, never to replace it.
        candidate (`torch.Tensor`):
            bool, shape (B, T). Loss tokens with advantage > 0 and sampled-token probability < τ_p.
        silenced (`torch.Tensor`):
            bool, shape (B, T). Candidates removed by the mode's entropy rule (`~keep`).
        entropy_threshold (`float`):
            The realised τ_h in nats, computed over the candidates of all processes. NaN when there is no candidate.
            For modes that use no threshold (`"all_low_prob"`, `"off"`) it is the τ_h that `"low_entropy"` would
            have used, so that logs stay comparable across runs.
        num_candidates (`int`): number of candidates, summed over all processes.
        num_silenced (`int`): number of silenced tokens, summed over all processes.
        num_loss_tokens (`int`): number of loss tokens (`loss_mask` = 1), summed over all processes.
        num_nonfinite (`int`): loss tokens whose log-probability or entropy is not finite (NaN or ±inf), summed over
            all processes. Such tokens are never candidates and never enter the quantile; any count above 0 means
            numerical trouble upstream of the mask.
    """

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
        """Loss tokens that stay in the loss, summed over all processes."""
        return self.num_loss_tokens - self.num_silenced


@dataclass
class S2TBatch:
    """The inputs and output of the last S2T mask built on this process (for diagnostics callbacks).

    Attributes:
        result ([`S2TResult`]): the mask and its global counts.
        per_token_logps (`torch.Tensor`): float, (B, T), detached log-probs of the sampled tokens (nats).
        entropies (`torch.Tensor`): float, (B, T), detached entropies (nats).
        advantages (`torch.Tensor`): float, (B,) or (B, 1).
        loss_mask (`torch.Tensor`): int, (B, T), the loss mask before silencing.
        completion_ids (`torch.Tensor`): long, (B, T).
        mode (`str`): "train" or "eval".
        log_collision (`torch.Tensor`, *optional*): float, (B, T), log Σ_v π_v² (nats) of the same forward, when the
            trainer records it (`STAPOConfig.s2t_diagnostics`).
    """

    result: S2TResult
    per_token_logps: torch.Tensor
    entropies: torch.Tensor
    advantages: torch.Tensor
    loss_mask: torch.Tensor
    completion_ids: torch.Tensor
    mode: str
    log_collision: torch.Tensor | None = None


def linear_quantile(values: torch.Tensor, q: float) -> float:
    """The q-quantile of a 1-D tensor with linear interpolation (numpy's default, `method="linear"`).

    Selection-based (`torch.kthvalue`, O(n)), so unlike `torch.quantile` it has no 2**24-element limit
    (pytorch#64947). Interpolation is done in float64.

    Args:
        values (`torch.Tensor`): float, shape (n,), n >= 1.
        q (`float`): quantile in [0, 1].

    Returns:
        `float`: x_(lo) + (h - lo) * (x_(hi) - x_(lo)) with h = (n - 1) q, lo = floor(h), hi = ceil(h), x sorted.

    Raises:
        ValueError: if `values` is empty or not 1-D, or `q` is outside [0, 1].
    """
    if values.dim() != 1 or values.numel() == 0:
        raise ValueError(f"linear_quantile needs a non-empty 1-D tensor, got shape {tuple(values.shape)}")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q={q!r} must be in [0, 1]")
    n = values.numel()
    h = (n - 1) * q
    lo, hi = math.floor(h), math.ceil(h)
    x_lo = torch.kthvalue(values, lo + 1).values.double().item()  # kthvalue is 1-indexed
    x_hi = x_lo if hi == lo else torch.kthvalue(values, hi + 1).values.double().item()
    return x_lo + (h - lo) * (x_hi - x_lo)


def _check_inputs(per_token_logps, entropies, advantages, loss_mask, prob_threshold, entropy_quantile, mode):
    """Validate [`s2t_mask`]'s arguments (raising `ValueError` as documented there); returns the advantages as
    (B, 1) or (B, T)."""
    if mode not in S2T_MODES:
        raise ValueError(f"mode={mode!r} is not one of {list(S2T_MODES)}")
    if not 0.0 < prob_threshold <= 1.0:
        raise ValueError(f"prob_threshold={prob_threshold!r} must be in (0, 1]")
    if not 0.0 <= entropy_quantile <= 1.0:
        raise ValueError(f"entropy_quantile={entropy_quantile!r} must be in [0, 1]")
    if (
        per_token_logps.dim() != 2
        or entropies.shape != per_token_logps.shape
        or loss_mask.shape != per_token_logps.shape
    ):
        raise ValueError(
            "per_token_logps, entropies and loss_mask must all have shape (B, T); got "
            f"{tuple(per_token_logps.shape)}, {tuple(entropies.shape)}, {tuple(loss_mask.shape)}"
        )
    batch_size = per_token_logps.size(0)
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)  # (B,) -> (B, 1)
    if advantages.size(0) != batch_size or advantages.size(1) not in (1, per_token_logps.size(1)):
        raise ValueError(f"advantages must have shape (B,), (B, 1) or (B, T); got {tuple(advantages.shape)}")
    return advantages


def s2t_mask(
    per_token_logps: torch.Tensor,
    entropies: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    prob_threshold: float = 0.002,
    entropy_quantile: float = 0.75,
    mode: str = "low_entropy",
    gather: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> S2TResult:
    r"""Build the S2T keep mask of STAPO ([paper](https://huggingface.co/papers/2602.15620), Sec. 3, the S2T rule).

    For completion i and token t:

        candidate_it = loss_mask_it and A_i > 0 and p_it < τ_p and log p_it, H_it finite
        τ_h          = q-quantile of {H_it : candidate_it} over all processes (linear interpolation, float64)
        silenced_it  = candidate_it and H_it < τ_h          (strict: 1 candidate or all-tied entropies -> none)
        keep_it      = not silenced_it

    `p_it < τ_p` is evaluated as `log p_it < log τ_p` so that no float copy of the (B, T) tensor is made; the two
    differ only for a log-prob within one rounding step of log τ_p. `H_it < τ_h` is compared exactly: the candidates'
    entropies are widened to float64 (exact for float32/bf16 inputs) and compared with the float64 τ_h, never with τ_h
    rounded to the entropies' dtype. A position whose log-probability or entropy is NaN or ±inf is never a candidate;
    such loss tokens are counted in `num_nonfinite`. Zero- and negative-advantage tokens are never candidates. Runs
    under `torch.no_grad()`, never modifies its inputs, and with `gather` it performs exactly two collectives on every
    call (also with zero candidates), so every process must call it the same number of times.

    Args:
        per_token_logps (`torch.Tensor`):
            float, shape (B, T), natural-log probabilities of the sampled tokens under the current policy
            (temperature-scaled logits, as in the loss).
        entropies (`torch.Tensor`):
            float, shape (B, T), Shannon entropy (nats) of the full next-token distribution at each position.
        advantages (`torch.Tensor`):
            float, shape (B,), (B, 1) or (B, T): the advantage of each completion (or token).
        loss_mask (`torch.Tensor`):
            bool/int/float, shape (B, T), 1 where the token is in the loss (completion and not padding / tool output).
        prob_threshold (`float`, *optional*, defaults to `0.002`): τ_p, in (0, 1].
        entropy_quantile (`float`, *optional*, defaults to `0.75`): q, in [0, 1].
        mode (`str`, *optional*, defaults to `"low_entropy"`):
            `"low_entropy"` (STAPO: silence candidates with H < q-quantile), `"high_entropy"` (ablation: silence
            candidates with H > (1 - q)-quantile), `"all_low_prob"` (ablation: silence every candidate), `"off"`
            (silence nothing, still count).
        gather (`Callable[[torch.Tensor], torch.Tensor]`, *optional*):
            Concatenates a 1-D tensor across processes (all processes must call it; lengths may differ). `None`
            means a single process.

    Returns:
        [`S2TResult`]: the keep / candidate / silenced masks (bool, (B, T)), τ_h and global counts.

    Raises:
        ValueError: on an unknown `mode`, a threshold or quantile out of range, or mismatched shapes.
    """
    advantages = _check_inputs(
        per_token_logps, entropies, advantages, loss_mask, prob_threshold, entropy_quantile, mode
    )
    gather = gather if gather is not None else (lambda t: t)

    with torch.no_grad():
        in_loss = loss_mask.bool()  # (B, T)
        finite = torch.isfinite(per_token_logps) & torch.isfinite(entropies)  # (B, T)
        candidate = in_loss & finite & (advantages > 0) & (per_token_logps < math.log(prob_threshold))  # (B, T)

        # τ_h over the candidates of every process, in float64 (exact for float32 / bf16 entropies): a 1-D tensor of
        # candidates only, so the widening never copies the (B, T) tensor.
        candidate_entropies = entropies[candidate].to(torch.float64)  # (N_cand_local,)
        all_candidate_entropies = gather(candidate_entropies)  # (N_cand_global,)
        num_candidates = all_candidate_entropies.numel()
        # Only the threshold the mode uses ("high_entropy": the (1 - q)-quantile; the others report the q-quantile).
        quantile = 1.0 - entropy_quantile if mode == "high_entropy" else entropy_quantile
        entropy_threshold = linear_quantile(all_candidate_entropies, quantile) if num_candidates > 0 else float("nan")

        silenced = torch.zeros_like(candidate)  # (B, T) bool
        if mode == "low_entropy":
            silenced[candidate] = candidate_entropies < entropy_threshold  # float64 vs float64: exact
        elif mode == "high_entropy":
            silenced[candidate] = candidate_entropies > entropy_threshold
        elif mode == "all_low_prob":
            silenced = candidate.clone()

        # count_nonzero, not .sum(): a bool .sum() allocates an int64 copy of the (B, T) mask.
        nonfinite = (in_loss & ~finite).count_nonzero()
        local_counts = torch.stack([silenced.count_nonzero(), in_loss.count_nonzero(), nonfinite])  # (3,)
        global_counts = gather(local_counts.to(torch.float64)).view(-1, 3).sum(dim=0)  # (P*3,) -> (3,)
        num_silenced, num_loss_tokens, num_nonfinite = (int(c) for c in global_counts.tolist())

    return S2TResult(
        keep=~silenced,
        candidate=candidate,
        silenced=silenced,
        entropy_threshold=entropy_threshold,
        num_candidates=num_candidates,
        num_silenced=num_silenced,
        num_loss_tokens=num_loss_tokens,
        num_nonfinite=num_nonfinite,
    )
