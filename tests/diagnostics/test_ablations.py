"""The paper's ablations of the S2T rule (`stapo_trl.diagnostics.ablations`) on hand-built tensors: `high_entropy`
silences the candidates above the (1 - q)-quantile of their entropies, `all_low_prob` every candidate."""

import math
import threading

import numpy as np
import pytest
import torch
from testing_utils import candidates_batch, hand_s2t_batch

from stapo_trl.core.s2t import s2t_mask
from stapo_trl.diagnostics.ablations import ABLATIONS, ablation_mask


def test_the_modes_are_the_papers_two_ablations():
    assert list(ABLATIONS) == ["high_entropy", "all_low_prob"]


def test_high_entropy_silences_the_candidates_above_the_complementary_quantile():
    result = ablation_mask(*hand_s2t_batch(), mode="high_entropy", entropy_quantile=0.75)
    # The (1 - 0.75) = 0.25-quantile of [0.1, 0.3, 0.4]: h = 2 * 0.25 = 0.5 -> 0.1 + 0.5 * (0.3 - 0.1) = 0.2.
    assert result.entropy_threshold == pytest.approx(0.2)
    # H > 0.2: tokens 1 (0.4) and 3 (0.3); token 0 (0.1, the one the rule would silence first) is kept.
    silenced = torch.tensor([[False, True, False, True, False], [False] * 5])
    assert torch.equal(result.silenced, silenced) and torch.equal(result.keep, ~silenced)
    assert torch.equal(result.candidate, torch.tensor([[True, True, False, True, False], [False] * 5]))
    assert (result.num_candidates, result.num_silenced, result.num_loss_tokens, result.num_kept) == (3, 2, 8, 6)


def test_high_entropy_silences_the_complement_of_the_rule_at_the_same_quantile_without_ties():
    # Distinct entropies, q = 0.5: the rule silences H < median, the ablation H > median; the median itself is kept
    # by both (9 candidates, so the median is one of them).
    entropies = torch.rand(9, generator=torch.Generator().manual_seed(0)) + 0.1
    rule = s2t_mask(*candidates_batch(entropies), entropy_quantile=0.5)
    ablation = ablation_mask(*candidates_batch(entropies), mode="high_entropy", entropy_quantile=0.5)
    median = entropies.double() == float(np.median(entropies.double().numpy()))
    assert ablation.entropy_threshold == rule.entropy_threshold
    assert torch.equal(ablation.silenced[0], ~rule.silenced[0] & ~median)
    assert rule.num_silenced == ablation.num_silenced == 4


def test_high_entropy_threshold_is_compared_exactly_in_float64():
    # Candidates [1 - 2^-24, 1, 1, 2] (float32), q = 0.75 -> the 0.25-quantile: h = 0.75, tau_h = (1 - 2^-24) +
    # 0.75 * 2^-24 = 1 - 2^-26, which rounds up to 1.0 in float32 (where "1.0 > 1.0" would keep the two candidates at
    # exactly 1.0). Exactly, both are above it: three candidates are silenced.
    below_one = float(np.nextafter(np.float32(1.0), np.float32(0.0)))
    entropies = torch.tensor([below_one, 1.0, 1.0, 2.0], dtype=torch.float32)
    result = ablation_mask(*candidates_batch(entropies), mode="high_entropy")
    assert result.entropy_threshold == 1.0 - 2.0**-26
    assert result.silenced[0].tolist() == [False, True, True, True]


def test_high_entropy_threshold_is_exact_for_bf16_entropies():
    # bf16: the value below 1.0 is 1 - 2^-8; tau_h = (1 - 2^-8) + 0.75 * 2^-8 = 1 - 2^-10 rounds to 1.0 in bf16.
    entropies = torch.tensor([1.0 - 2.0**-8, 1.0, 1.0, 2.0], dtype=torch.bfloat16)
    result = ablation_mask(*candidates_batch(entropies), mode="high_entropy")
    assert result.entropy_threshold == 1.0 - 2.0**-10
    assert result.silenced[0].tolist() == [False, True, True, True]


def test_all_low_prob_silences_every_candidate_and_reports_the_rules_tau_h():
    result = ablation_mask(*hand_s2t_batch(), mode="all_low_prob")
    assert torch.equal(result.silenced, result.candidate) and torch.equal(result.keep, ~result.candidate)
    assert result.silenced is not result.candidate  # two tensors: editing one must not edit the other
    assert (result.num_candidates, result.num_silenced, result.num_loss_tokens, result.num_kept) == (3, 3, 8, 5)
    # The rule's 0.75-quantile of [0.1, 0.3, 0.4] (logs stay comparable with low_entropy runs), though unused here.
    assert result.entropy_threshold == pytest.approx(0.35)


def test_all_low_prob_with_tau_p_one_silences_every_positive_advantage_loss_token():
    # tau_p = 1: every token with p < 1 in a positive-advantage completion is a candidate, hence silenced.
    per_token_logps = torch.log(torch.tensor([[0.9, 0.5, 0.99], [0.2, 0.3, 0.4], [0.1, 0.6, 0.7]]))
    advantages = torch.tensor([2.0, 0.0, -1.0])
    loss_mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 1, 1]])
    result = ablation_mask(
        per_token_logps, torch.rand(3, 3), advantages, loss_mask, mode="all_low_prob", prob_threshold=1.0
    )
    assert result.silenced.tolist() == [[True, True, False], [False] * 3, [False] * 3]
    assert (result.num_silenced, result.num_loss_tokens, result.num_kept) == (2, 8, 6)


@pytest.mark.parametrize("mode", list(ABLATIONS))
def test_without_candidates_nothing_is_silenced_and_tau_h_is_nan(mode):
    per_token_logps, entropies, advantages, loss_mask = hand_s2t_batch()
    result = ablation_mask(per_token_logps, entropies, -advantages.abs(), loss_mask, mode=mode)
    assert result.num_candidates == result.num_silenced == 0 and result.keep.all()
    assert math.isnan(result.entropy_threshold)


@pytest.mark.parametrize("mode", list(ABLATIONS))
def test_non_finite_values_are_never_silenced(mode):
    # A NaN entropy and a log p of -inf are no candidates (as in the rule), so neither ablation silences them: NaN > x
    # is False anyway, but "all_low_prob" silences every candidate, and -inf < log tau_p would make one.
    logps = torch.tensor([math.log(0.001)] * 4 + [float("-inf")])
    result = ablation_mask(*candidates_batch([0.1, 0.2, 0.3, float("nan"), 0.25], logps=logps), mode=mode)
    assert result.candidate[0].tolist() == [True, True, True, False, False]
    assert not result.silenced[0, 3:].any()
    assert result.num_nonfinite == 2 and result.num_loss_tokens == 5


@pytest.mark.parametrize("mode", ["low_entropy", "off", "bogus"])
def test_modes_other_than_the_ablations_are_refused(mode):
    with pytest.raises(ValueError, match=f"mode='{mode}'"):
        ablation_mask(*hand_s2t_batch(), mode=mode)


@pytest.mark.parametrize(
    "kwargs, message", [({"prob_threshold": 0.0}, "prob_threshold"), ({"entropy_quantile": 2.0}, "entropy_quantile")]
)
def test_the_rules_argument_checks_apply(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ablation_mask(*hand_s2t_batch(), mode="high_entropy", **kwargs)


def test_inputs_are_untouched():
    tensors = hand_s2t_batch()
    copies = [t.clone() for t in tensors]
    for mode in list(ABLATIONS):
        ablation_mask(*tensors, mode=mode)
    for original, copy in zip(tensors, copies, strict=True):
        assert torch.equal(original, copy)


# ----------------------------------------------------------------------------------------------------------------
# Collectives: two emulated processes, each on its own thread, exchanging tensors through a barrier
# ----------------------------------------------------------------------------------------------------------------
class ThreadGroup:
    """`gather` for `world_size` threads: each call concatenates the callers' 1-D tensors in rank order.

    A process that skips a collective (or calls one more) leaves the others waiting: the barrier's timeout then breaks
    it, and the test fails instead of hanging.
    """

    def __init__(self, world_size: int, timeout: float = 20.0):
        self.slots = [None] * world_size
        self.barrier = threading.Barrier(world_size, timeout=timeout)
        self.calls = [0] * world_size

    def gather_for(self, rank: int):
        def gather(tensor: torch.Tensor) -> torch.Tensor:
            self.calls[rank] += 1
            self.slots[rank] = tensor
            self.barrier.wait()
            gathered = torch.cat(list(self.slots))
            self.barrier.wait()  # everyone has read the slots before the next call overwrites them
            return gathered

        return gather


def run_on_two_processes(parts, **kwargs):
    """`ablation_mask` on each part (rank 0, rank 1) in its own thread, with a shared `ThreadGroup` gather."""
    group = ThreadGroup(len(parts))
    results, errors = [None] * len(parts), []

    def work(rank):
        try:
            results[rank] = ablation_mask(*parts[rank], gather=group.gather_for(rank), **kwargs)
        except Exception as e:  # noqa: BLE001 (re-raised in the test's thread)
            errors.append(e)
            group.barrier.abort()

    threads = [threading.Thread(target=work, args=(rank,)) for rank in range(len(parts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results, group.calls


def split_rows(tensors, rows):
    return tuple(t[rows] for t in tensors)


def random_batch(num_rows, seed):
    """(num_rows, 6) tokens: p in (0, 0.004) so about half are below tau_p = 0.002, advantages of both signs."""
    generator = torch.Generator().manual_seed(seed)
    logps = torch.log(torch.rand(num_rows, 6, generator=generator) * 0.004 + 1e-6)
    entropies = torch.rand(num_rows, 6, generator=generator) * 3
    advantages = torch.randn(num_rows, generator=generator)
    loss_mask = (torch.arange(6)[None] < torch.randint(1, 7, (num_rows, 1), generator=generator)).long()
    return logps, entropies, advantages, loss_mask


@pytest.mark.parametrize("mode", list(ABLATIONS))
@pytest.mark.parametrize(
    "rank_rows",
    [
        (slice(0, 5), slice(5, 14)),  # both processes have candidates
        (slice(0, 12), slice(12, 14)),  # rank 1 holds negative-advantage rows only: zero candidates, same collectives
    ],
)
def test_two_processes_give_the_one_process_mask(mode, rank_rows):
    batch = random_batch(14, seed=3)
    batch[2][12:] = -1.0  # rows 12, 13: negative advantages
    whole = ablation_mask(*batch, mode=mode)
    assert whole.num_candidates > 10 and whole.num_silenced > 0
    (rank0, rank1), calls = run_on_two_processes([split_rows(batch, rows) for rows in rank_rows], mode=mode)
    assert calls[0] == calls[1]  # every collective on every process
    for part in (rank0, rank1):
        assert part.entropy_threshold == whole.entropy_threshold
        assert (part.num_candidates, part.num_silenced, part.num_loss_tokens) == (
            whole.num_candidates,
            whole.num_silenced,
            whole.num_loss_tokens,
        )
    assert torch.equal(torch.cat([rank0.silenced, rank1.silenced]), whole.silenced)
    assert torch.equal(torch.cat([rank0.keep, rank1.keep]), whole.keep)


@pytest.mark.parametrize("mode", list(ABLATIONS))
def test_two_processes_without_any_candidate(mode):
    batch = random_batch(6, seed=4)
    batch[2][:] = -1.0
    (rank0, rank1), calls = run_on_two_processes(
        [split_rows(batch, slice(0, 3)), split_rows(batch, slice(3, 6))], mode=mode
    )
    assert calls[0] == calls[1] > 0
    for part in (rank0, rank1):
        assert part.num_candidates == part.num_silenced == 0 and math.isnan(part.entropy_threshold)
        assert part.num_loss_tokens == int(batch[3].sum())
