import math
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from testing_utils import candidates_batch, hand_s2t_batch

from stapo_trl.core.s2t import s2t_mask
from stapo_trl.diagnostics.ablations import ABLATIONS, ablation_mask


MODES = list(ABLATIONS)


def test_high_entropy_all_low_prob_no_candidates_non_finite_other_modes_refused_and_two_processes_give_one_mask():
    assert MODES == ["high_entropy", "all_low_prob"]  # the paper's two ablations
    tensors, copies = hand_s2t_batch(), hand_s2t_batch()  # the inputs are left untouched
    result = ablation_mask(*tensors, mode="high_entropy", entropy_quantile=0.75)
    # The 0.25-quantile of [0.1, 0.3, 0.4]: h = 0.5 -> 0.2; H > 0.2: tokens 1 and 3, token 0 (the rule's first) kept
    assert result.entropy_threshold == pytest.approx(0.2)
    silenced = torch.tensor([[False, True, False, True, False], [False] * 5])
    assert torch.equal(result.silenced, silenced) and torch.equal(result.keep, ~silenced)
    assert torch.equal(result.candidate, torch.tensor([[True, True, False, True, False], [False] * 5]))
    assert (result.num_candidates, result.num_silenced, result.num_loss_tokens, result.num_kept) == (3, 2, 8, 6)
    assert all(torch.equal(t, c) for t, c in zip(tensors, copies, strict=True))  # inputs untouched
    # q = 0.5: the rule silences H < median, the ablation H > median; the median is kept by both
    entropies = torch.rand(9, generator=torch.Generator().manual_seed(0)) + 0.1
    rule = s2t_mask(*candidates_batch(entropies), entropy_quantile=0.5)
    ablation = ablation_mask(*candidates_batch(entropies), mode="high_entropy", entropy_quantile=0.5)
    median = entropies.double() == float(np.median(entropies.double().numpy()))
    assert ablation.entropy_threshold == rule.entropy_threshold and rule.num_silenced == ablation.num_silenced == 4
    assert torch.equal(ablation.silenced[0], ~rule.silenced[0] & ~median)
    # [1 - e, 1, 1, 2], the 0.25-quantile: tau_h = 1 - e / 4, 1.0 in the dtype; in float64 three are above it
    for dtype, below_one in [(torch.float32, 2.0**-24), (torch.bfloat16, 2.0**-8)]:
        entropies = torch.tensor([1.0 - below_one, 1.0, 1.0, 2.0], dtype=dtype)
        result = ablation_mask(*candidates_batch(entropies), mode="high_entropy")
        assert result.entropy_threshold == 1.0 - below_one / 4
        assert result.silenced[0].tolist() == [False, True, True, True], dtype
    result = ablation_mask(*hand_s2t_batch(), mode="all_low_prob")
    assert torch.equal(result.silenced, result.candidate) and torch.equal(result.keep, ~result.candidate)
    assert result.silenced is not result.candidate  # two tensors: editing one must not edit the other
    assert (result.num_candidates, result.num_silenced, result.num_loss_tokens, result.num_kept) == (3, 3, 8, 5)
    assert result.entropy_threshold == pytest.approx(0.35)  # the rule's, unused: logs comparable with low_entropy
    per_token_logps = torch.log(torch.tensor([[0.9, 0.5, 0.99], [0.2, 0.3, 0.4], [0.1, 0.6, 0.7]]))
    loss_mask, advantages = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 1, 1]]), torch.tensor([2.0, 0.0, -1.0])
    result = ablation_mask(per_token_logps, torch.rand(3, 3), advantages, loss_mask, mode=MODES[1], prob_threshold=1.0)
    assert result.silenced.tolist() == [[True, True, False], [False] * 3, [False] * 3]
    assert (result.num_silenced, result.num_loss_tokens, result.num_kept) == (2, 8, 6)
    refused = [*(({"mode": m}, f"mode='{m}'") for m in ("low_entropy", "off", "bogus")),  # other modes
               ({"prob_threshold": 0.0}, "prob_threshold"), ({"entropy_quantile": 2.0}, "quantile")]  # fmt: skip
    for kwargs, match in refused:
        with pytest.raises(ValueError, match=match):  # and the rule's checks
            ablation_mask(*hand_s2t_batch(), **{"mode": "high_entropy", **kwargs})
    for mode in MODES:  # without candidates or with non-finite values nothing more is silenced
        per_token_logps, entropies, advantages, loss_mask = hand_s2t_batch()
        result = ablation_mask(per_token_logps, entropies, -advantages.abs(), loss_mask, mode=mode)
        assert result.num_candidates == result.num_silenced == 0 and result.keep.all()
        assert math.isnan(result.entropy_threshold)
        # A NaN entropy and a log p of -inf are no candidates (as in the rule), so neither ablation silences them
        logps = torch.tensor([math.log(0.001)] * 4 + [float("-inf")])
        result = ablation_mask(*candidates_batch([0.1, 0.2, 0.3, float("nan"), 0.25], logps=logps), mode=mode)
        assert result.candidate[0].tolist() == [True, True, True, False, False] and not result.silenced[0, 3:].any()
        assert result.num_nonfinite == 2 and result.num_loss_tokens == 5

    def on_two_processes(parts, **kwargs):  # each part on a thread, `gather` through a barrier (or a timeout)
        slots, calls, barrier = [None, None], [0, 0], threading.Barrier(2, timeout=20.0)

        def work(rank):
            def gather(tensor):
                calls[rank], slots[rank] = calls[rank] + 1, tensor
                barrier.wait()
                gathered = torch.cat(list(slots))
                barrier.wait()  # everyone has read the slots before the next call overwrites them
                return gathered

            return ablation_mask(*parts[rank], gather=gather, **kwargs)

        with ThreadPoolExecutor(2) as pool:
            return list(pool.map(work, range(2))), calls

    for mode, rows in [  # rows None: no candidate anywhere, the same collectives
        (m, r) for m in MODES for r in [(slice(0, 5), slice(5, 14)), (slice(0, 12), slice(12, 14)), None]
    ]:
        g = torch.Generator().manual_seed(3)
        logps, entropies = torch.log(torch.rand(14, 6, generator=g) * 0.004 + 1e-6), torch.rand(14, 6, generator=g) * 3
        advantages = torch.randn(14, generator=g)
        loss_mask = (torch.arange(6)[None] < torch.randint(1, 7, (14, 1), generator=g)).long()
        advantages[12:] = -1.0  # rows 12, 13: negative advantages; p in (0, 0.004): about half below tau_p
        if rows is None:
            advantages[:], rows = -1.0, (slice(0, 7), slice(7, 14))
        batch = (logps, entropies, advantages, loss_mask)
        whole = ablation_mask(*batch, mode=mode)
        assert (whole.num_candidates > 10 and whole.num_silenced > 0) or advantages.max() < 0
        (rank0, rank1), calls = on_two_processes([tuple(t[part] for t in batch) for part in rows], mode=mode)
        assert calls[0] == calls[1] > 0  # every collective on every process
        for part in (rank0, rank1):
            assert part.entropy_threshold == whole.entropy_threshold or math.isnan(whole.entropy_threshold)
            assert [getattr(part, f"num_{k}") for k in ("candidates", "silenced", "loss_tokens")] == [
                    whole.num_candidates, whole.num_silenced, whole.num_loss_tokens]  # fmt: skip
        assert torch.equal(torch.cat([rank0.silenced, rank1.silenced]), whole.silenced)
        assert torch.equal(torch.cat([rank0.keep, rank1.keep]), whole.keep)
