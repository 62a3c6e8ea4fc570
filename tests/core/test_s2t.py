import math

import numpy as np
import pytest
import torch
from testing_utils import candidates_batch, hand_s2t_batch

from stapo_trl.core.s2t import S2TResult, linear_quantile, s2t_mask


pytestmark = pytest.mark.release  # checked on every TRL release (`make test-releases`)


def test_the_hand_batch_gather_no_candidate_ties_bad_arguments_float64_tau_h_non_finite_and_numpys_quantile():
    (tensors := hand_s2t_batch())[0].requires_grad_(True)
    copies = [t.detach().clone() for t in tensors]
    result = s2t_mask(*tensors, prob_threshold=0.002, entropy_quantile=0.75)
    assert isinstance(result, S2TResult) and result.keep.dtype == torch.bool and not result.keep.requires_grad
    assert all(torch.equal(t.detach(), c) for t, c in zip(tensors, copies, strict=True))  # inputs untouched
    assert torch.equal(result.candidate, torch.tensor([[True, True, False, True, False], [False] * 5]))
    # Candidate entropies [0.1, 0.3, 0.4]: h = 2 * 0.75 = 1.5 -> 0.35; H < 0.35: tokens 0 and 3 silenced, 1 kept
    assert result.entropy_threshold == pytest.approx(0.35)
    silenced = torch.tensor([[True, False, False, True, False], [False] * 5])
    assert torch.equal(result.silenced, silenced) and torch.equal(result.keep, ~silenced)
    assert (result.num_candidates, result.num_silenced, result.num_loss_tokens, result.num_kept) == (3, 2, 8, 6)
    off = s2t_mask(*hand_s2t_batch(), mode="off")  # silences nothing, counts and reports tau_h as "low_entropy"
    assert not off.silenced.any() and off.keep.all() and (off.num_candidates, off.num_silenced) == (3, 0)
    assert off.entropy_threshold == pytest.approx(0.35)
    logps, entropies, advantages, loss_mask = hand_s2t_batch()
    result = s2t_mask(logps, entropies, -advantages.abs(), loss_mask)
    assert result.num_candidates == result.num_silenced == 0 and math.isnan(result.entropy_threshold)
    assert result.keep.all()
    lone = torch.tensor([[1, 0, 0, 0, 0], [1, 1, 1, 1, 0]])  # only row-0 token 0 can be a candidate
    result = s2t_mask(logps, entropies, advantages, lone, entropy_quantile=1.0)
    assert result.num_candidates == 1 and result.entropy_threshold == pytest.approx(0.1) and result.num_silenced == 0
    result = s2t_mask(logps, torch.full((2, 5), 0.7), advantages, loss_mask)  # ties: strict "<"
    assert result.num_candidates == 3 and result.num_silenced == 0
    loss_mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 1], [1, 0, 1, 0]])  # advantages (B, 1) are accepted too
    result = s2t_mask(torch.full((3, 4), -9.0), torch.rand(3, 4), torch.tensor([[0.0], [-2.0], [0.5]]), loss_mask)
    assert not result.candidate[:2].any() and result.candidate[2].tolist() == [True, False, True, False]
    calls = []  # another process: candidate entropies [0.0, 0.05]; 2 silenced, 10 in the loss, 1 non-finite

    def gather(tensor):
        calls.append(tensor.numel())
        other = torch.tensor([0.0, 0.05]) if len(calls) == 1 else torch.tensor([2.0, 10.0, 1.0])
        return torch.cat([tensor, other.to(tensor.dtype)])

    result = s2t_mask(*hand_s2t_batch(), gather=gather)
    # All candidates [0.0, 0.05, 0.1, 0.3, 0.4]: h = 3 -> 0.3; here H < 0.3: token 0 only
    assert result.entropy_threshold == pytest.approx(0.3) and result.num_candidates == 5 and len(calls) == 2
    assert result.silenced[0].tolist() == [True, False, False, False, False]
    assert (result.num_silenced, result.num_loss_tokens, result.num_nonfinite) == (3, 18, 1)
    t = hand_s2t_batch()
    for tensors, kwargs, message in [(t, {"mode": "high_entropy"}, "mode='high_entropy'"),
                                     (t, {"prob_threshold": 0.0}, "prob_threshold"),
                                     (t, {"entropy_quantile": 1.5}, "entropy_quantile"),
                                     ((t[0], t[1][:, :3], *t[2:]), {}, "shape"),
                                     ((*t[:2], t[2][:1], t[3]), {}, "advantages")]:  # fmt: skip
        with pytest.raises(ValueError, match=message):
            s2t_mask(*tensors, **kwargs)
    for n, q in [(n, q) for n in (1, 2, 3, 10, 1001) for q in (0.0, 0.2, 0.75, 0.8, 1.0)]:
        values = torch.randn(n, generator=torch.Generator().manual_seed(n))
        assert linear_quantile(values, q) == pytest.approx(float(np.quantile(values.double().numpy(), q)), abs=1e-7)
    for dtype, step in [(torch.float32, 2.0**-23), (torch.bfloat16, 2.0**-7)]:
        # [0.5, 1, 1, 1 + step], q = 0.75: tau_h = 1 + step / 4, 1.0 in the dtype, where "1.0 < 1.0" keeps the 1.0s
        result = s2t_mask(*candidates_batch(torch.tensor([0.5, 1.0, 1.0, 1.0 + step], dtype=dtype)))
        assert result.entropy_threshold == 1.0 + step / 4 and result.silenced[0].tolist() == [True, True, True, False]
    for entropy, logp in [(float("nan"), None), (float("inf"), None), (0.15, float("-inf"))]:
        # a NaN tau_h silences nothing, an inf one everything, log p = -inf passes "log p < log tau_p"; excluded: 0.25
        logps = torch.tensor([math.log(0.001)] * 3 + [logp or math.log(0.001)])
        result = s2t_mask(*candidates_batch(torch.tensor([0.1, 0.2, 0.3, entropy]), logps=logps))
        assert result.candidate[0].tolist() == [True, True, True, False]
        assert result.entropy_threshold == pytest.approx(0.25)
        assert result.silenced[0].tolist() == [True, True, False, False]
        assert result.num_nonfinite == 1 and result.num_loss_tokens == 4


@pytest.mark.slow  # 17.8 M candidates: ~3 s
def test_tau_h_over_more_than_2_pow_24_candidates_is_exact():
    n = 2**24 + 1_000_003  # torch.quantile refuses above 2**24 elements; against numpy's float64 quantile
    entropies = torch.rand(1, n, generator=torch.Generator().manual_seed(0)) * 5.0  # (1, n) nats
    result = s2t_mask(torch.full((1, n), math.log(1e-3)), entropies, torch.ones(1), torch.ones(1, n, dtype=torch.bool))
    reference = float(np.quantile(entropies.flatten().double().numpy(), 0.75))
    assert result.num_candidates == n and result.entropy_threshold == pytest.approx(reference, rel=1e-15, abs=0)
    assert result.num_silenced == int((entropies.double() < reference).sum())
