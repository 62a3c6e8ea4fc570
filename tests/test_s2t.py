"""The pure S2T rule (`stapo_trl.s2t`) on hand-built tensors: STAPO Sec. 3."""

import math

import numpy as np
import pytest
import torch

from stapo_trl import S2TResult, s2t_mask
from stapo_trl.s2t import linear_quantile


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
        other = torch.tensor([0.0, 0.05]) if len(calls) == 1 else torch.tensor([2.0, 10.0], dtype=tensor.dtype)
        return torch.cat([tensor, other])

    result = s2t_mask(per_token_logps, entropies, advantages, loss_mask, gather=gather)
    assert len(calls) == 2  # exactly two collectives
    # All candidates: [0.0, 0.05, 0.1, 0.3, 0.4]; h = 4 * 0.75 = 3 -> 0.3. Local silenced: H < 0.3 -> token 0 only.
    assert result.entropy_threshold == pytest.approx(0.3)
    assert result.num_candidates == 5
    assert torch.equal(result.silenced[0], torch.tensor([True, False, False, False, False]))
    assert result.num_silenced == 1 + 2 and result.num_loss_tokens == 8 + 10


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
    assert result.num_silenced == int((entropies < result.entropy_threshold).sum())
    with pytest.raises(RuntimeError):
        torch.quantile(entropies.flatten(), 0.75)


def test_result_type():
    per_token_logps, entropies, advantages, loss_mask = hand_batch()
    assert isinstance(s2t_mask(per_token_logps, entropies, advantages, loss_mask), S2TResult)
