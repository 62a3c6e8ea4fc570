import math

import pytest
import torch
from testing_utils import hand_diagnostics_batch

from stapo_trl.core.s2t import S2TResult, linear_quantile, s2t_mask
from stapo_trl.diagnostics import metrics as m
from stapo_trl.diagnostics.metrics import diagnostic_metrics


def test_histogram_quantiles_within_the_stated_error_and_hand_batch_metrics_non_finite_tokens_out_of_the_quantiles():
    r = (m.ENTROPY_MAX / m.ENTROPY_MIN) ** (1 / m.ENTROPY_BINS)  # a bin's value is within sqrt(r) of any
    assert m.HISTOGRAM_QUANTILE_REL_ERROR == pytest.approx(math.sqrt(r) - 1, rel=1e-12) and r < 1.0025**2
    values = torch.exp(torch.randn(20_001, generator=torch.Generator().manual_seed(0)) * 4 - 3).clamp(max=20.0)
    values[:500], values[500:1500] = 0.0, 0.25  # 1e-9 .. 20 nats (most near 0, LLM-like), exact zeros, heavy ties
    histogram = m.entropy_histogram(values)
    assert histogram.dtype == torch.float64 and histogram.shape == (m.ENTROPY_BINS + 1,)
    assert histogram.sum().item() == values.numel()
    for q in [0.0, 0.01, 0.1, 0.25, 0.5, 0.8, 0.95, 0.999, 1.0]:
        exact, estimate = linear_quantile(values.double(), q), m.histogram_quantile(histogram, q)
        assert abs(estimate - exact) <= m.HISTOGRAM_QUANTILE_REL_ERROR * exact + m.ENTROPY_MIN / 2 + 1e-12, q
    assert torch.equal(m.entropy_histogram(values[:300]) + m.entropy_histogram(values[300:]), histogram)  # add up
    edges = m.entropy_histogram(torch.tensor([-1e-7, 0.0, m.ENTROPY_MIN / 2, m.ENTROPY_MIN * 1.0001, 150.0]).double())
    assert edges[0] == 3 and edges[1] == 1 and edges[m.ENTROPY_BINS] == 1  # [0, MIN) and negatives; MIN; >= MAX
    assert math.isnan(m.histogram_quantile(m.entropy_histogram(torch.empty(0)), 0.5))
    with pytest.raises(ValueError, match="q=1.5"):
        m.histogram_quantile(histogram, 1.5)
    result, logps, entropies, advantages, loss_mask = hand_diagnostics_batch()[:5]
    assert result.silenced.nonzero().tolist() == [[0, 1]]
    reference = metrics = diagnostic_metrics(result, logps, entropies, loss_mask)
    assert set(metrics) == {f"s2t/entropy_{p}" for p in ("p10", "p50", "p80", "p95")} | {
        "s2t/silenced_prob_mean", "s2t/silenced_entropy_mean"}  # fmt: skip
    # Loss-token entropies [0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.9], h = 7 q: p10 0.085, p50 0.35, p80 0.56, p95 0.795
    for key, exact in [("p10", 0.085), ("p50", 0.35), ("p80", 0.56), ("p95", 0.795)]:
        assert metrics[f"s2t/entropy_{key}"] == pytest.approx(exact, rel=m.HISTOGRAM_QUANTILE_REL_ERROR)
    assert (metrics["s2t/silenced_prob_mean"], metrics["s2t/silenced_entropy_mean"]) == pytest.approx((0.001, 0.2))
    # q = 1.0: tau_h = 0.9, positions 1 (p 0.001, H 0.2) and 4 (p 0.005, H 0.5) silenced: means 0.003 and 0.35
    result = s2t_mask(logps, entropies, advantages, loss_mask, prob_threshold=0.01, entropy_quantile=1.0)
    metrics = diagnostic_metrics(result, logps, entropies, loss_mask)
    assert (metrics["s2t/silenced_prob_mean"], metrics["s2t/silenced_entropy_mean"]) == pytest.approx((0.003, 0.35))
    result = s2t_mask(logps, entropies, torch.zeros(2), loss_mask, prob_threshold=0.01)
    metrics = diagnostic_metrics(result, logps, entropies, loss_mask)
    assert math.isnan(metrics["s2t/silenced_prob_mean"]) and math.isnan(metrics["s2t/silenced_entropy_mean"])  # A = 0
    assert metrics["s2t/entropy_p50"] == pytest.approx(0.35, rel=m.HISTOGRAM_QUANTILE_REL_ERROR)
    empty = torch.zeros_like(loss_mask)
    result = s2t_mask(logps, entropies, advantages, empty, prob_threshold=0.01)
    assert all(math.isnan(value) for value in diagnostic_metrics(result, logps, entropies, empty).values())
    # A NaN and an inf H, and a log p of -inf (H 0.4), on loss tokens of row 1: left out of the quantiles as well
    logps, entropies, loss_mask = logps.clone(), entropies.clone(), loss_mask.clone()
    loss_mask[1], entropies[1, 3], entropies[1, 4], logps[1, 0] = 1, float("nan"), float("inf"), float("-inf")
    result = s2t_mask(logps, entropies, advantages, loss_mask, prob_threshold=0.01, entropy_quantile=0.5)
    assert result.num_nonfinite == 3
    metrics = diagnostic_metrics(result, logps, entropies, loss_mask)
    assert metrics["s2t/entropy_p50"] == pytest.approx(0.3, rel=m.HISTOGRAM_QUANTILE_REL_ERROR)
    assert metrics["s2t/silenced_prob_mean"] == reference["s2t/silenced_prob_mean"]
    result, logps, entropies, _, loss_mask = hand_diagnostics_batch()[:5]  # over two processes: the same metrics
    whole, sent, calls = diagnostic_metrics(result, logps, entropies, loss_mask), [], []
    for rows0, rows1 in [(slice(0, 1), slice(1, 2)), (slice(0, 2), slice(2, 2))]:  # rank 1 may have no row
        parts = [(S2TResult(result.keep[rows], result.candidate[rows], result.silenced[rows], result.entropy_threshold,
                  0, 0, 0), logps[rows], entropies[rows], loss_mask[rows]) for rows in (rows0, rows1)]  # fmt: skip
        sent.clear(), calls.clear()  # one all-reduce each: rank 0 adds what rank 1 sends
        diagnostic_metrics(*parts[1], reduce=lambda local: calls.append(1) or sent.append(local.clone()) or local)
        reduced = diagnostic_metrics(*parts[0], reduce=lambda local: calls.append(0) or local + sent[0])
        assert calls == [1, 0] and reduced == pytest.approx(whole, nan_ok=True)
