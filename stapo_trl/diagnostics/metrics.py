"""The S2T diagnostics logged beside the core's counts, reduced over processes (entropy quantiles, silenced means)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from ..core.s2t import S2TResult


ENTROPY_QUANTILES = (0.10, 0.50, 0.80, 0.95)  # logged as `s2t/entropy_p{100 q}`
ENTROPY_MIN, ENTROPY_MAX, ENTROPY_BINS = 1e-6, 100.0, 4096  # bin 0 below; 1..BINS: [MIN, MAX) nats, equal ratios r
_LOG_RATIO = (math.log(ENTROPY_MAX) - math.log(ENTROPY_MIN)) / ENTROPY_BINS  # ln r
HISTOGRAM_QUANTILE_REL_ERROR = math.exp(_LOG_RATIO / 2) - 1  # 0.00225: √r - 1, the bound on `histogram_quantile`'s


def entropy_histogram(entropies: torch.Tensor) -> torch.Tensor:
    r"""Counts (float64, (ENTROPY_BINS + 1,)) of entropies (float, (n,), nats) in the log-spaced bins (bin 0: below
    `ENTROPY_MIN`, rounding negatives too): the same bins on every process, so histograms add up exactly."""
    values = entropies.detach().double()
    index = torch.floor((torch.log(values.clamp(min=ENTROPY_MIN)) - math.log(ENTROPY_MIN)) / _LOG_RATIO) + 1  # (n,)
    index = torch.where(values < ENTROPY_MIN, torch.zeros_like(index), index).clamp(max=ENTROPY_BINS).long()
    return torch.bincount(index, minlength=ENTROPY_BINS + 1).double()


def histogram_quantile(counts: torch.Tensor, q: float) -> float:
    r"""The q-quantile (linear) of an [`entropy_histogram`]'s values in nats, within HISTOGRAM_QUANTILE_REL_ERROR ·
    exact + ENTROPY_MIN / 2 (bins' geometric centres); NaN when empty, `ValueError` for q outside [0, 1]."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q={q!r} must be in [0, 1]")
    cumulative = torch.cumsum(counts.double(), dim=0)  # (ENTROPY_BINS + 1,)
    if (n := round(cumulative[-1].item())) == 0:
        return float("nan")
    lo, hi = math.floor(h := (n - 1) * q), math.ceil(h)
    bins = torch.searchsorted(cumulative, torch.tensor([lo, hi], dtype=torch.float64), right=True).tolist()
    x_lo, x_hi = (math.exp(math.log(ENTROPY_MIN) + (b - 0.5) * _LOG_RATIO) if b else ENTROPY_MIN / 2 for b in bins)
    return x_lo + (h - lo) * (x_hi - x_lo)


def diagnostic_metrics(result: S2TResult, per_token_logps: torch.Tensor, entropies: torch.Tensor,
                       loss_mask: torch.Tensor, reduce: Callable | None = None) -> dict[str, float]:  # fmt: skip
    """`s2t/entropy_p10`, `p50`, `p80`, `p95` (nats), `s2t/silenced_prob_mean` and `s2t/silenced_entropy_mean` of the
    mask `result` over all processes, NaN where undefined, non-finite p or H left out. `per_token_logps`, `entropies`:
    float (B, T); `loss_mask`: (B, T); `reduce` sums a 1-D float64 tensor over processes (one call on each process)."""
    reduce = reduce or (lambda t: t)
    with torch.no_grad():
        in_loss = loss_mask.bool() & torch.isfinite(per_token_logps) & torch.isfinite(entropies)  # (B, T)
        silenced = result.silenced & in_loss  # (B, T)
        ent, logps = entropies.detach().double(), per_token_logps.detach().double()  # (B, T)
        sums = torch.stack([logps[silenced].exp().sum(), ent[silenced].sum(), silenced.sum().double()])  # (3,)
        total = reduce(torch.cat([sums, entropy_histogram(ent[in_loss]).to(sums.device)])).cpu()  # (3 + BINS + 1,)
    *sums, n = total[:3].tolist()  # silenced p and H sums, silenced count
    metrics = {f"s2t/entropy_p{round(100 * q)}": histogram_quantile(total[3:], q) for q in ENTROPY_QUANTILES}
    return metrics | {f"s2t/silenced_{k}_mean": s / n if n else math.nan for k, s in zip(("prob", "entropy"), sums)}
