"""The pure S2T rule (`stapo_trl.core.s2t`) on hand-built tensors: STAPO Sec. 3."""

import math

import numpy as np
import pytest
import torch

from stapo_trl import S2TResult, s2t_mask
from stapo_trl.core.s2t import linear_quantile


def logp(p):
    return math.log(p)


def hand_batch():
    """Two completions of 5 tokens; completion 0 has A = +1, completion 1 has A = -1.

    Row 0 probabilities: [0.001, 0.001, 0.5, 0.0005, 0.001]; entropies [0.1, 0.4, 0.2, 0.3, 2.0]; the last token
    is padding (loss_mask 0). With tau_p = 0.002 the candidates are row-0 tokens 0, 1, 3 (token 2 has p = 0.5,
    token 4 is padding). Row 1 has the same probabilities but a negative advantage: never a candidate.
    """
    probs = torch.tensor([[0.001, 0.001, 0.5, 0.0005, 0.001]] * 2)
    per_token_logps = probs.log()
    entropies = torch.tensor([[0.1, 0.4, 0.2, 0.3, 2.0]] * 2)
    loss_mask = torch.tensor([[1, 1, 1, 1, 0]] * 2)
    advantages = torch.tensor([1.0, -1.0])
    return per_token_logps, entropies, advantages, loss_mask


def test_candidates_threshold_and_silenced_low_entropy():
    per_token_logps, entropies, advantages, loss_mask = hand_batch()
    result = s2t_mask(per_token_logps, entropies, advantages, loss_mask, prob_threshold=0.002, entropy_quantile=0.75)
    expected_candidate = torch.tensor([[True, True, False, True, False], [False] * 5])
    assert torch.equal(result.candidate, expected_candidate)
    # Candidate entropies sorted: [0.1, 0.3, 0.4]; h = (3 - 1) * 0.75 = 1.5 -> 0.3 + 0.5 * (0.4 - 0.3) = 0.35.
    assert result.entropy_threshold == pytest.approx(0.35)
    # Silenced: candidates with H < 0.35 -> tokens 0 (0.1) and 3 (0.3); token 1 (0.4) is kept (exploratory).
    expected_silenced = torch.tensor([[True, False, False, True, False], [False] * 5])
    assert torch.equal(result.silenced, expected_silenced)
    assert torch.equal(result.keep, ~expected_silenced)
    assert result.keep.dtype == torch.bool
    assert (result.num_candidates, result.num_silenced, result.num_loss_tokens, result.num_kept) == (3, 2, 8, 6)


def test_high_entropy_mode_uses_complementary_quantile():
    per_token_logps, entropies, advantages, loss_mask = hand_batch()
    result = s2t_mask(per_token_logps, entropies, advantages, loss_mask, entropy_quantile=0.75, mode="high_entropy")
    # (1 - 0.75) = 0.25-quantile of [0.1, 0.3, 0.4]: h = 0.5 -> 0.1 + 0.5 * 0.2 = 0.2; silenced: H > 0.2 -> 1 and 3.
    assert result.entropy_threshold == pytest.approx(0.2)
    assert torch.equal(result.silenced, torch.tensor([[False, True, False, True, False], [False] * 5]))


def test_all_low_prob_mode_silences_every_candidate_and_off_mode_none():
    per_token_logps, entropies, advantages, loss_mask = hand_batch()
    all_low = s2t_mask(per_token_logps, entropies, advantages, loss_mask, mode="all_low_prob")
    assert torch.equal(all_low.silenced, all_low.candidate)
    assert all_low.num_silenced == 3
    off = s2t_mask(per_token_logps, entropies, advantages, loss_mask, mode="off")
    assert not off.silenced.any() and off.keep.all()
    assert off.num_candidates == 3 and off.num_silenced == 0
    # "off" still reports the tau_h that "low_entropy" would have used.
    assert off.entropy_threshold == pytest.approx(0.35)


def test_zero_candidates_nothing_silenced_nan_threshold():
    per_token_logps, entropies, advantages, loss_mask = hand_batch()
    result = s2t_mask(per_token_logps, entropies, -advantages.abs(), loss_mask)
    assert result.num_candidates == 0 and result.num_silenced == 0
    assert math.isnan(result.entropy_threshold)
    assert result.keep.all()


def test_one_candidate_is_never_silenced():
    per_token_logps, entropies, advantages, loss_mask = hand_batch()
    loss_mask = torch.tensor([[1, 0, 0, 0, 0], [1, 1, 1, 1, 0]])  # only row-0 token 0 can be a candidate
    result = s2t_mask(per_token_logps, entropies, advantages, loss_mask, entropy_quantile=1.0)
    assert result.num_candidates == 1
    assert result.entropy_threshold == pytest.approx(0.1)  # the quantile of one value is that value
    assert result.num_silenced == 0  # strict "<": the lone candidate stays


def test_tied_candidate_entropies_nothing_silenced():
    per_token_logps, _, advantages, loss_mask = hand_batch()
    entropies = torch.full((2, 5), 0.7)
    result = s2t_mask(per_token_logps, entropies, advantages, loss_mask)
    assert result.num_candidates == 3 and result.num_silenced == 0


def test_zero_and_negative_advantage_never_silenced_and_loss_masked_never_candidates():
    per_token_logps = torch.full((3, 4), math.log(1e-4))  # every token is low-probability
    entropies = torch.rand(3, 4)
    advantages = torch.tensor([[0.0], [-2.0], [0.5]])  # (B, 1) accepted
    loss_mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 1], [1, 0, 1, 0]])
    result = s2t_mask(per_token_logps, entropies, advantages, loss_mask, mode="all_low_prob")
    assert not result.candidate[:2].any()
    assert torch.equal(result.candidate[2], torch.tensor([True, False, True, False]))


def test_inputs_untouched_and_no_grad():
    per_token_logps, entropies, advantages, loss_mask = hand_batch()
    per_token_logps.requires_grad_(True)
    copies = [t.detach().clone() for t in (per_token_logps, entropies, advantages, loss_mask)]
    result = s2t_mask(per_token_logps, entropies, advantages, loss_mask)
    assert not result.keep.requires_grad
    for original, copy in zip((per_token_logps, entropies, advantages, loss_mask), copies, strict=True):
        assert torch.equal(original.detach(), copy)


def test_gather_is_used_for_quantile_and_counts():
    """A fake 2-process gather: the other process contributes candidate entropies [0.0, 0.05] and counts."""
    per_token_logps, entropies, advantages, loss_mask = hand_batch()
    calls = []

    def gather(tensor):
        calls.append(tensor.numel())
        # Second call: the other process's (silenced, loss tokens, non-finite) counts.
        other = torch.tensor([0.0, 0.05]) if len(calls) == 1 else torch.tensor([2.0, 10.0, 1.0], dtype=tensor.dtype)
        return torch.cat([tensor, other])

    result = s2t_mask(per_token_logps, entropies, advantages, loss_mask, gather=gather)
    assert len(calls) == 2  # exactly two collectives
    # All candidates: [0.0, 0.05, 0.1, 0.3, 0.4]; h = 4 * 0.75 = 3 -> 0.3. Local silenced: H < 0.3 -> token 0 only.
    assert result.entropy_threshold == pytest.approx(0.3)
    assert result.num_candidates == 5
    assert torch.equal(result.silenced[0], torch.tensor([True, False, False, False, False]))
    assert result.num_silenced == 1 + 2 and result.num_loss_tokens == 8 + 10
    assert result.num_nonfinite == 0 + 1


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"mode": "bogus"}, "mode='bogus'"),
        ({"prob_threshold": 0.0}, "prob_threshold"),
        ({"entropy_quantile": 1.5}, "entropy_quantile"),
    ],
)
def test_bad_arguments_raise(kwargs, message):
    per_token_logps, entropies, advantages, loss_mask = hand_batch()
    with pytest.raises(ValueError, match=message):
        s2t_mask(per_token_logps, entropies, advantages, loss_mask, **kwargs)


def test_shape_mismatch_raises():
    per_token_logps, entropies, advantages, loss_mask = hand_batch()
    with pytest.raises(ValueError, match="shape"):
        s2t_mask(per_token_logps, entropies[:, :3], advantages, loss_mask)
    with pytest.raises(ValueError, match="advantages"):
        s2t_mask(per_token_logps, entropies, advantages[:1], loss_mask)


@pytest.mark.parametrize("n", [1, 2, 3, 10, 1001])
@pytest.mark.parametrize("q", [0.0, 0.2, 0.75, 0.8, 1.0])
def test_linear_quantile_matches_numpy(n, q):
    values = torch.randn(n, generator=torch.Generator().manual_seed(n))
    assert linear_quantile(values, q) == pytest.approx(float(np.quantile(values.double().numpy(), q)), abs=1e-7)


def test_17_million_candidates_match_sort_reference():
    """torch.quantile raises above 2**24 elements (pytorch#64947); the selection-based quantile must not."""
    n = 17_000_000
    assert n > 2**24
    generator = torch.Generator().manual_seed(0)
    entropies = torch.rand(1, n, generator=generator) * 5.0  # (1, n) nats
    per_token_logps = torch.full((1, n), math.log(1e-3))  # every token is a candidate
    result = s2t_mask(per_token_logps, entropies, torch.ones(1), torch.ones(1, n, dtype=torch.bool))
    sorted_values = torch.sort(entropies.flatten()).values.double()
    h = (n - 1) * 0.75
    lo = math.floor(h)
    reference = float(sorted_values[lo] + (h - lo) * (sorted_values[lo + 1] - sorted_values[lo]))
    assert result.num_candidates == n
    assert result.entropy_threshold == pytest.approx(reference, rel=0, abs=1e-9)
    assert result.num_silenced == int((entropies.double() < result.entropy_threshold).sum())  # exact, in float64
    with pytest.raises(RuntimeError):
        torch.quantile(entropies.flatten(), 0.75)


def test_result_type():
    per_token_logps, entropies, advantages, loss_mask = hand_batch()
    assert isinstance(s2t_mask(per_token_logps, entropies, advantages, loss_mask), S2TResult)


def candidates_batch(entropies, logps=None):
    """One positive-advantage completion whose every token is a candidate (p = 0.001 < tau_p = 0.002)."""
    entropies = torch.as_tensor(entropies)
    per_token_logps = torch.full(entropies.shape, math.log(0.001)) if logps is None else torch.as_tensor(logps)
    return per_token_logps[None], entropies[None], torch.tensor([1.0]), torch.ones(1, entropies.numel())


def test_entropy_threshold_is_compared_exactly_not_in_the_entropies_dtype():
    # Issue 10, item 4. Sorted candidates [0.5, 1, 1, 1 + 2^-23] (float32), q = 0.75: h = 3 * 0.75 = 2.25, so
    # tau_h = 1 + 0.25 * 2^-23 = 1.0000000298 (float64). It rounds to 1.0 in float32, where "1.0 < 1.0" would keep
    # the two candidates at exactly 1.0; the rule H < tau_h silences them.
    above_one = float(np.nextafter(np.float32(1.0), np.float32(2.0)))
    result = s2t_mask(*candidates_batch(torch.tensor([0.5, 1.0, 1.0, above_one], dtype=torch.float32)))
    assert result.entropy_threshold == 1.0 + 0.25 * 2.0**-23
    assert result.silenced[0].tolist() == [True, True, True, False]


def test_entropy_threshold_is_exact_for_bf16_entropies():
    # bf16 has 8 significant bits: the next value after 1.0 is 1.0078125. Candidates [0.5, 1, 1, 1.0078125], q = 0.75:
    # tau_h = 1 + 0.25 * 0.0078125 = 1.001953125, which rounds to 1.0 in bf16. Exact: both 1.0 are silenced.
    entropies = torch.tensor([0.5, 1.0, 1.0, 1.0078125], dtype=torch.bfloat16)
    result = s2t_mask(*candidates_batch(entropies))
    assert result.entropy_threshold == 1.001953125
    assert result.silenced[0].tolist() == [True, True, True, False]


def test_high_entropy_threshold_is_compared_exactly():
    # high_entropy silences H > the (1 - q)-quantile. Candidates [1 - 2^-24, 1, 1, 2], q = 0.75 -> 0.25-quantile:
    # h = 0.75, tau_h = (1 - 2^-24) + 0.75 * 2^-24 = 1 - 2^-26, which rounds up to 1.0 in float32 ("1.0 > 1.0" is
    # False). Exactly, both 1.0 are above it: three candidates silenced.
    below_one = float(np.nextafter(np.float32(1.0), np.float32(0.0)))
    entropies = torch.tensor([below_one, 1.0, 1.0, 2.0], dtype=torch.float32)
    result = s2t_mask(*candidates_batch(entropies), mode="high_entropy")
    assert result.entropy_threshold == 1.0 - 2.0**-26
    assert result.silenced[0].tolist() == [False, True, True, True]


def test_nan_entropy_is_never_a_candidate_and_is_counted():
    # Issue 10, item 5: candidates [0.1, 0.2, 0.3, NaN] at q = 0.75. NaN would sort as +inf, tau_h would be NaN and
    # nothing would be silenced. It is no candidate: tau_h over [0.1, 0.2, 0.3], h = 1.5 -> 0.25; 0.1, 0.2 silenced.
    result = s2t_mask(*candidates_batch([0.1, 0.2, 0.3, float("nan")]))
    assert result.candidate[0].tolist() == [True, True, True, False]
    assert result.entropy_threshold == pytest.approx(0.25)
    assert result.silenced[0].tolist() == [True, True, False, False]
    assert result.num_nonfinite == 1 and result.num_loss_tokens == 4


def test_infinite_entropy_is_never_a_candidate():
    # An inf entropy would make tau_h = 0.3 + 0.25 * inf = inf and silence every finite candidate.
    result = s2t_mask(*candidates_batch([0.1, 0.2, 0.3, float("inf")]))
    assert result.entropy_threshold == pytest.approx(0.25)
    assert result.silenced[0].tolist() == [True, True, False, False]
    assert result.num_nonfinite == 1


def test_minus_infinite_log_prob_is_never_a_candidate():
    # log p = -inf (p = 0: a token that could not have been sampled) passes "log p < log tau_p"; with it as a
    # candidate, tau_h over [0.1, 0.15, 0.2, 0.3] would be 0.225 and silence three tokens. Excluded: tau_h = 0.25.
    logps = torch.tensor([math.log(0.001)] * 3 + [float("-inf")])
    result = s2t_mask(*candidates_batch(torch.tensor([0.1, 0.2, 0.3, 0.15]), logps=logps))
    assert result.candidate[0].tolist() == [True, True, True, False]
    assert result.entropy_threshold == pytest.approx(0.25)
    assert result.num_silenced == 2 and result.num_nonfinite == 1
