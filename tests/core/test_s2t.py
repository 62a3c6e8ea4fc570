"""The S2T rule (`stapo_trl.core.s2t`) on hand-built tensors: STAPO Sec. 3."""

import math

import numpy as np
import pytest
import torch
from testing_utils import candidates_batch, hand_s2t_batch

from stapo_trl.core.s2t import S2TResult, linear_quantile, s2t_mask


pytestmark = pytest.mark.release  # checked on every TRL release (`make test-releases`)


def test_candidates_threshold_and_silenced_tokens():
    result = s2t_mask(*hand_s2t_batch(), prob_threshold=0.002, entropy_quantile=0.75)
    assert isinstance(result, S2TResult)
    assert torch.equal(result.candidate, torch.tensor([[True, True, False, True, False], [False] * 5]))
    # Candidate entropies sorted [0.1, 0.3, 0.4]; h = (3 - 1) * 0.75 = 1.5 -> 0.3 + 0.5 * (0.4 - 0.3) = 0.35.
    assert result.entropy_threshold == pytest.approx(0.35)
    # H < 0.35: tokens 0 (0.1) and 3 (0.3) are silenced; token 1 (0.4) is kept (exploratory).
    silenced = torch.tensor([[True, False, False, True, False], [False] * 5])
    assert torch.equal(result.silenced, silenced) and torch.equal(result.keep, ~silenced)
    assert result.keep.dtype == torch.bool
    assert (result.num_candidates, result.num_silenced, result.num_loss_tokens, result.num_kept) == (3, 2, 8, 6)


def test_off_mode_silences_nothing_but_counts_and_reports_tau_h():
    off = s2t_mask(*hand_s2t_batch(), mode="off")
    assert not off.silenced.any() and off.keep.all()
    assert off.num_candidates == 3 and off.num_silenced == 0
    assert off.entropy_threshold == pytest.approx(0.35)  # the tau_h "low_entropy" would use: logs stay comparable


def test_no_candidate_silences_nothing_and_tau_h_is_nan():
    per_token_logps, entropies, advantages, loss_mask = hand_s2t_batch()
    result = s2t_mask(per_token_logps, entropies, -advantages.abs(), loss_mask)
    assert result.num_candidates == 0 and result.num_silenced == 0 and result.keep.all()
    assert math.isnan(result.entropy_threshold)


def test_a_lone_candidate_is_never_silenced():
    per_token_logps, entropies, advantages, _ = hand_s2t_batch()
    loss_mask = torch.tensor([[1, 0, 0, 0, 0], [1, 1, 1, 1, 0]])  # only row-0 token 0 can be a candidate
    result = s2t_mask(per_token_logps, entropies, advantages, loss_mask, entropy_quantile=1.0)
    assert result.num_candidates == 1
    assert result.entropy_threshold == pytest.approx(0.1)  # the quantile of one value is that value
    assert result.num_silenced == 0  # strict "<"


def test_tied_candidate_entropies_silence_nothing():
    per_token_logps, _, advantages, loss_mask = hand_s2t_batch()
    result = s2t_mask(per_token_logps, torch.full((2, 5), 0.7), advantages, loss_mask)
    assert result.num_candidates == 3 and result.num_silenced == 0


def test_zero_and_negative_advantages_and_masked_tokens_are_never_candidates():
    per_token_logps = torch.full((3, 4), math.log(1e-4))  # every token has a low probability
    advantages = torch.tensor([[0.0], [-2.0], [0.5]])  # (B, 1) is accepted
    loss_mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 1], [1, 0, 1, 0]])
    result = s2t_mask(per_token_logps, torch.rand(3, 4), advantages, loss_mask)
    assert not result.candidate[:2].any()
    assert result.candidate[2].tolist() == [True, False, True, False]


def test_inputs_are_untouched_and_the_mask_carries_no_gradient():
    tensors = hand_s2t_batch()
    tensors[0].requires_grad_(True)
    copies = [t.detach().clone() for t in tensors]
    result = s2t_mask(*tensors)
    assert not result.keep.requires_grad
    for original, copy in zip(tensors, copies, strict=True):
        assert torch.equal(original.detach(), copy)


def test_gather_serves_the_quantile_and_the_counts_in_exactly_two_calls():
    # Another process contributes candidate entropies [0.0, 0.05] and counts (silenced 2, loss tokens 10, non-finite 1).
    calls = []

    def gather(tensor):
        calls.append(tensor.numel())
        other = torch.tensor([0.0, 0.05]) if len(calls) == 1 else torch.tensor([2.0, 10.0, 1.0])
        return torch.cat([tensor, other.to(tensor.dtype)])

    result = s2t_mask(*hand_s2t_batch(), gather=gather)
    assert len(calls) == 2
    # All candidates [0.0, 0.05, 0.1, 0.3, 0.4]: h = 4 * 0.75 = 3 -> 0.3. Here H < 0.3: token 0 only.
    assert result.entropy_threshold == pytest.approx(0.3) and result.num_candidates == 5
    assert result.silenced[0].tolist() == [True, False, False, False, False]
    assert (result.num_silenced, result.num_loss_tokens, result.num_nonfinite) == (3, 18, 1)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"mode": "high_entropy"}, "mode='high_entropy'"),
        ({"prob_threshold": 0.0}, "prob_threshold"),
        ({"entropy_quantile": 1.5}, "entropy_quantile"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, message):
    with pytest.raises(ValueError, match=message):
        s2t_mask(*hand_s2t_batch(), **kwargs)


def test_mismatched_shapes_are_refused():
    per_token_logps, entropies, advantages, loss_mask = hand_s2t_batch()
    with pytest.raises(ValueError, match="shape"):
        s2t_mask(per_token_logps, entropies[:, :3], advantages, loss_mask)
    with pytest.raises(ValueError, match="advantages"):
        s2t_mask(per_token_logps, entropies, advantages[:1], loss_mask)


@pytest.mark.parametrize("n", [1, 2, 3, 10, 1001])
@pytest.mark.parametrize("q", [0.0, 0.2, 0.75, 0.8, 1.0])
def test_linear_quantile_matches_numpy(n, q):
    values = torch.randn(n, generator=torch.Generator().manual_seed(n))
    assert linear_quantile(values, q) == pytest.approx(float(np.quantile(values.double().numpy(), q)), abs=1e-7)


def test_tau_h_over_more_than_2_pow_24_candidates_is_exact():
    # torch.quantile refuses inputs above 2**24 elements; the rule's quantile (kthvalue selection, linear
    # interpolation in float64) must be exact there too: against numpy's float64 quantile of the same values.
    n = 2**24 + 1_000_003
    entropies = torch.rand(1, n, generator=torch.Generator().manual_seed(0)) * 5.0  # (1, n) nats
    result = s2t_mask(torch.full((1, n), math.log(1e-3)), entropies, torch.ones(1), torch.ones(1, n, dtype=torch.bool))
    reference = float(np.quantile(entropies.flatten().double().numpy(), 0.75))  # numpy's default: linear
    assert result.num_candidates == n
    assert result.entropy_threshold == pytest.approx(reference, rel=1e-15, abs=0)
    assert result.num_silenced == int((entropies.double() < reference).sum())  # the same tokens as the reference


def test_tau_h_is_compared_in_float64_not_in_the_entropies_dtype():
    # Sorted candidates [0.5, 1, 1, 1 + 2^-23] (float32), q = 0.75: h = 2.25, tau_h = 1 + 0.25 * 2^-23, which rounds
    # to 1.0 in float32, where "1.0 < 1.0" would keep the two candidates at exactly 1.0. Exactly, both are silenced.
    above_one = float(np.nextafter(np.float32(1.0), np.float32(2.0)))
    result = s2t_mask(*candidates_batch(torch.tensor([0.5, 1.0, 1.0, above_one], dtype=torch.float32)))
    assert result.entropy_threshold == 1.0 + 0.25 * 2.0**-23
    assert result.silenced[0].tolist() == [True, True, True, False]


def test_tau_h_is_exact_for_bf16_entropies():
    # bf16: the next value after 1.0 is 1.0078125; tau_h = 1 + 0.25 * 0.0078125 = 1.001953125 rounds to 1.0 in bf16.
    result = s2t_mask(*candidates_batch(torch.tensor([0.5, 1.0, 1.0, 1.0078125], dtype=torch.bfloat16)))
    assert result.entropy_threshold == 1.001953125
    assert result.silenced[0].tolist() == [True, True, True, False]


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_non_finite_entropy_is_never_a_candidate_and_is_counted(bad):
    # As a candidate, NaN would make tau_h NaN (nothing silenced) and inf would make it inf (everything silenced).
    # Excluded: tau_h over [0.1, 0.2, 0.3], h = 1.5 -> 0.25; 0.1 and 0.2 are silenced.
    result = s2t_mask(*candidates_batch([0.1, 0.2, 0.3, bad]))
    assert result.candidate[0].tolist() == [True, True, True, False]
    assert result.entropy_threshold == pytest.approx(0.25)
    assert result.silenced[0].tolist() == [True, True, False, False]
    assert result.num_nonfinite == 1 and result.num_loss_tokens == 4


def test_a_minus_infinite_log_prob_is_never_a_candidate():
    # log p = -inf passes "log p < log tau_p"; as a candidate, tau_h over [0.1, 0.15, 0.2, 0.3] would be 0.225.
    logps = torch.tensor([math.log(0.001)] * 3 + [float("-inf")])
    result = s2t_mask(*candidates_batch(torch.tensor([0.1, 0.2, 0.3, 0.15]), logps=logps))
    assert result.candidate[0].tolist() == [True, True, True, False]
    assert result.entropy_threshold == pytest.approx(0.25)
    assert result.num_silenced == 2 and result.num_nonfinite == 1
