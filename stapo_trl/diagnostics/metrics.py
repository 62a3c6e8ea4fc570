r"""The S2T diagnostics that `stapo_trl` logs beside the core's counts, reduced over processes.

- `s2t/entropy_p10`, `p50`, `p80`, `p95` (nats): quantiles of the entropies of all loss tokens of each mask, from a
  log-spaced histogram summed over processes ([`entropy_histogram`], [`histogram_quantile`]).
- `s2t/silenced_prob_mean` (a probability) and `s2t/silenced_entropy_mean` (nats): means over the silenced tokens.

[`diagnostic_metrics`] is called by the product's `STAPOTrainer` for every mask the core builds
([`~stapo_trl.core.STAPOTrainer._compute_s2t_mask`]); `stapo-plot` draws the quantiles.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from ..core.s2t import S2TResult


# Entropy quantiles logged as `s2t/entropy_p{100 q}`.
ENTROPY_QUANTILES = (0.10, 0.50, 0.80, 0.95)

# Log-spaced entropy histogram used for the quantiles: bin 0 is [0, ENTROPY_MIN), bins 1..ENTROPY_BINS split
# [ENTROPY_MIN, ENTROPY_MAX) into equal ratios r = (ENTROPY_MAX / ENTROPY_MIN) ** (1 / ENTROPY_BINS) (r - 1 = 0.45 %).
# ENTROPY_MAX = 100 nats exceeds ln V for any vocabulary (ln 152k = 11.9), so no real entropy is clamped.
ENTROPY_MIN = 1e-6
ENTROPY_MAX = 100.0
ENTROPY_BINS = 4096
_LOG_RATIO = (math.log(ENTROPY_MAX) - math.log(ENTROPY_MIN)) / ENTROPY_BINS  # ln r
# Guaranteed error of `histogram_quantile` against the exact linear-interpolation quantile: relative √r - 1, plus
# ENTROPY_MIN / 2 absolute for values below ENTROPY_MIN.
HISTOGRAM_QUANTILE_REL_ERROR = math.exp(_LOG_RATIO / 2) - 1  # 0.00225


def entropy_histogram(entropies: torch.Tensor) -> torch.Tensor:
    r"""Counts of entropies in the fixed log-spaced bins used by [`histogram_quantile`].

    Bin 0 holds [0, `ENTROPY_MIN`) (and rounding negatives); bin k in 1..`ENTROPY_BINS` holds
    [ENTROPY_MIN r^(k-1), ENTROPY_MIN r^k). The bins are the same on every process, so histograms add up across
    processes exactly (one all-reduce of `ENTROPY_BINS + 1` numbers, whatever the token count).

    Args:
        entropies (`torch.Tensor`): float, shape (n,), entropies in nats.

    Returns:
        `torch.Tensor`: float64, shape (ENTROPY_BINS + 1,), counts.
    """
    values = entropies.detach().double()
    index = torch.floor((torch.log(values.clamp(min=ENTROPY_MIN)) - math.log(ENTROPY_MIN)) / _LOG_RATIO) + 1  # (n,)
    index = torch.where(values < ENTROPY_MIN, torch.zeros_like(index), index).clamp(max=ENTROPY_BINS).long()
    return torch.bincount(index, minlength=ENTROPY_BINS + 1).double()


def _bin_value(bin_index: int) -> float:
    """Representative value of a histogram bin: ENTROPY_MIN / 2 for bin 0, the geometric centre otherwise."""
    if bin_index == 0:
        return ENTROPY_MIN / 2
    return math.exp(math.log(ENTROPY_MIN) + (bin_index - 0.5) * _LOG_RATIO)


def histogram_quantile(counts: torch.Tensor, q: float) -> float:
    r"""The q-quantile (linear interpolation, numpy's default) of the values behind an [`entropy_histogram`].

    With n values and h = (n - 1) q, the exact quantile is x_(lo) + (h - lo)(x_(hi) - x_(lo)) with lo = floor(h),
    hi = ceil(h) over the sorted values. Here each order statistic is replaced by the representative value of its
    bin (geometric centre), so for every value within [ENTROPY_MIN, ENTROPY_MAX):

        |estimate - exact| <= (√r - 1) · exact + ENTROPY_MIN / 2,    √r - 1 = HISTOGRAM_QUANTILE_REL_ERROR = 0.23 %

    (each representative is within a factor √r of its order statistic, and the interpolation is a convex
    combination). Selection by counts, so there is no element limit (unlike `torch.quantile`, pytorch#64947).

    Args:
        counts (`torch.Tensor`): float, shape (ENTROPY_BINS + 1,), counts (summed over processes).
        q (`float`): quantile in [0, 1].

    Returns:
        `float`: the estimate in nats, NaN when the histogram is empty.
    """
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q={q!r} must be in [0, 1]")
    cumulative = torch.cumsum(counts.double(), dim=0)  # (ENTROPY_BINS + 1,)
    n = round(cumulative[-1].item())
    if n == 0:
        return float("nan")
    h = (n - 1) * q
    lo, hi = math.floor(h), math.ceil(h)
    # The k-th smallest value (0-based) lies in the first bin whose cumulative count exceeds k.
    ranks = torch.tensor([lo, hi], dtype=torch.float64)
    bins = torch.searchsorted(cumulative, ranks, right=True).tolist()
    x_lo, x_hi = _bin_value(bins[0]), _bin_value(bins[1])
    return x_lo + (h - lo) * (x_hi - x_lo)


def diagnostic_metrics(
    result: S2TResult,
    per_token_logps: torch.Tensor,
    entropies: torch.Tensor,
    loss_mask: torch.Tensor,
    reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> dict[str, float]:
    r"""The diagnostic `s2t/` scalars of one S2T mask, over all processes (one all-reduce of ENTROPY_BINS + 3 float64
    values, also on a process without tokens); undefined values are NaN.

    Args:
        result ([`~stapo_trl.core.S2TResult`]): the mask built from the tensors below.
        per_token_logps (`torch.Tensor`): float, (B, T), log-probabilities (nats) of the sampled tokens.
        entropies (`torch.Tensor`): float, (B, T), entropies (nats).
        loss_mask (`torch.Tensor`): bool/int/float, (B, T), 1 for loss tokens.
        reduce (`Callable`, *optional*): sums a 1-D float64 tensor over processes (a collective); `None`: one process.

    Returns:
        `dict[str, float]`: `s2t/entropy_p10`, `p50`, `p80`, `p95`, `s2t/silenced_prob_mean`, `s2t/silenced_entropy_mean`.
    """
    reduce = reduce or (lambda t: t)
    with torch.no_grad():
        # Non-finite values stay out, as they stay out of the candidates (counted in s2t/num_nonfinite).
        in_loss = loss_mask.bool() & torch.isfinite(per_token_logps) & torch.isfinite(entropies)  # (B, T)
        silenced = result.silenced & in_loss  # (B, T)
        ent = entropies.detach().double()  # (B, T)
        sums = torch.stack(
            [per_token_logps.detach().double()[silenced].exp().sum(), ent[silenced].sum(), silenced.sum().double()]
        )  # (3,)
        total = reduce(torch.cat([sums, entropy_histogram(ent[in_loss]).to(sums.device)])).cpu()  # (3 + BINS + 1,)
    prob_sum, entropy_sum, num_silenced = total[:3].tolist()
    metrics = {f"s2t/entropy_p{round(100 * q)}": histogram_quantile(total[3:], q) for q in ENTROPY_QUANTILES}
    metrics["s2t/silenced_prob_mean"] = prob_sum / num_silenced if num_silenced else float("nan")
    metrics["s2t/silenced_entropy_mean"] = entropy_sum / num_silenced if num_silenced else float("nan")
    return metrics
