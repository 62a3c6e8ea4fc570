"""`stapo_trl.diagnostics.gradients`: the logit-space maths of STAPO's Theorem 3.3 (gradient norm and its bounds) and
Lemma 3.2 (the entropy change of a positive update), checked against autograd, finite differences, direct
computation and hand-derived values. Pure torch, float64, offline, well under a second."""

import math

import pytest
import torch

from stapo_trl.diagnostics.gradients import (
    entropy_after_logit_step,
    entropy_change_first_order,
    entropy_logit_gradient,
    logit_grad_norm_bounds,
    logit_grad_norm_sq,
    softmax_statistics,
)


def _entropy(logits: torch.Tensor) -> torch.Tensor:
    """Reference entropy (nats), independent of the code under test."""
    return torch.distributions.Categorical(logits=logits).entropy()


def _random_logits(num: int, vocab: int, seed: int) -> torch.Tensor:
    """(num, vocab) float64 logits at scales from near-uniform (0.01) to near-one-hot (30), one scale per row."""
    gen = torch.Generator().manual_seed(seed)
    scales = torch.logspace(-2, math.log10(30.0), num, dtype=torch.float64).unsqueeze(1)  # (num, 1)
    return scales * torch.randn(num, vocab, generator=gen, dtype=torch.float64)


# ---------------------------------------------------------------------------------------------------------------
# Theorem 3.3: the exact gradient norm and its bounds
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("vocab", [2, 3, 17, 1000, 49_152])  # 49,152: SmolLM2's vocabulary
def test_grad_norm_matches_autograd(vocab):
    logits = _random_logits(4, vocab, seed=vocab)
    sampled = torch.tensor([0, vocab - 1, vocab // 2, 1])
    weight = torch.tensor([0.7, -1.3, 2.0, 0.05], dtype=torch.float64)
    z = logits.clone().requires_grad_()
    loss = -(weight * torch.log_softmax(z, -1).gather(-1, sampled.unsqueeze(-1)).squeeze(-1)).sum()
    loss.backward()  # rows are independent: row i of z.grad is the gradient of its own token's loss
    expected = z.grad.square().sum(-1)  # (4,)
    probs = torch.softmax(logits, -1)
    got = logit_grad_norm_sq(probs.gather(-1, sampled.unsqueeze(-1)).squeeze(-1), probs.square().sum(-1), weight)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-14)


def test_softmax_statistics_match_direct_formulas():
    logits = _random_logits(6, 300, seed=1)
    sampled = torch.tensor([0, 5, 299, 17, 3, 100])
    stats = softmax_statistics(logits.float(), sampled)  # float32 logits in, float64 statistics out
    probs = torch.softmax(logits.float().double(), -1)
    assert stats.entropy.dtype == torch.float64
    torch.testing.assert_close(stats.probs_sampled, probs[torch.arange(6), sampled])
    torch.testing.assert_close(stats.entropy, _entropy(logits.float().double()))
    torch.testing.assert_close(stats.collision_prob, probs.square().sum(-1))
    torch.testing.assert_close(stats.collision_logp, (probs.square() * probs.log()).sum(-1))


def test_softmax_statistics_ignore_minus_inf_logits():
    # A masked-out token (logit -inf) has probability 0 and adds 0 log 0 = 0 to every sum (no NaN).
    logits = torch.tensor([[0.0, 0.0, -math.inf]])
    stats = softmax_statistics(logits, torch.tensor([0]))
    torch.testing.assert_close(stats.entropy, torch.tensor([math.log(2.0)], dtype=torch.float64))
    torch.testing.assert_close(stats.collision_logp, torch.tensor([0.5 * math.log(0.5)], dtype=torch.float64))


def _assert_within_bounds(probs: torch.Tensor, sampled: torch.Tensor, weight: float = 1.3) -> None:
    """The exact squared norm lies between the Theorem's bounds for every row of `probs` (N, V) (rounding: 1e-12)."""
    vocab = probs.size(-1)
    w = torch.tensor(weight, dtype=torch.float64)
    p = probs.gather(-1, sampled.unsqueeze(-1)).squeeze(-1)
    entropy = -torch.where(probs > 0, probs * probs.log(), torch.zeros_like(probs)).sum(-1)
    exact = logit_grad_norm_sq(p, probs.square().sum(-1), w)
    lower, upper = logit_grad_norm_bounds(p, entropy, w, vocab)
    tol = 1e-12 * w.item() ** 2
    assert (lower <= exact + tol).all(), (lower - exact).max()
    assert (exact <= upper + tol).all(), (exact - upper).max()


@pytest.mark.parametrize("vocab", [2, 3, 10, 257, 5000])
def test_bounds_hold_on_random_distributions(vocab):
    logits = _random_logits(200, vocab, seed=vocab)
    probs = torch.softmax(logits, -1)
    gen = torch.Generator().manual_seed(0)
    for sampled in (probs.argmax(-1), probs.argmin(-1), torch.randint(vocab, (200,), generator=gen)):
        _assert_within_bounds(probs, sampled)


@pytest.mark.parametrize("vocab", [2, 5, 1000, 49_152])
def test_bounds_hold_on_adversarial_distributions(vocab):
    rows = []
    # Uniform (the upper bound is tight there: sum pi^2 = 1/V and C_V (ln V)^2 = (V - 1) / V) and near-uniform.
    rows.append(torch.full((vocab,), 1.0 / vocab, dtype=torch.float64))
    rows.append(torch.softmax(1e-6 * torch.randn(vocab, generator=torch.Generator().manual_seed(1)).double(), -1))
    # One-hot and near-one-hot (all three expressions meet at 2 - 2p when H = 0).
    rows.append(torch.nn.functional.one_hot(torch.tensor(0), vocab).double())
    # Mass 1 - eps on the mode and eps spread evenly over the rest: from tiny p at low entropy to nearly uniform.
    for eps in (1e-9, 1e-6, 1e-3, 0.1, 0.5, 1 - 1.0 / vocab):
        row = torch.full((vocab,), eps / (vocab - 1), dtype=torch.float64)
        row[0] = 1.0 - eps
        rows.append(row)
    # Uniform on k of the V tokens, zero elsewhere.
    for k in {1, 2, max(2, vocab // 2), vocab}:
        row = torch.zeros(vocab, dtype=torch.float64)
        row[:k] = 1.0 / k
        rows.append(row)
    probs = torch.stack(rows)  # (N, V)
    _assert_within_bounds(probs, torch.zeros(len(rows), dtype=torch.long))  # the mode
    _assert_within_bounds(probs, torch.full((len(rows),), vocab - 1, dtype=torch.long))  # a tail token (p tiny or 0)


def test_upper_bound_is_tight_at_uniform_and_lower_bound_at_two_point():
    vocab = 1000
    uniform = torch.full((1,), 1.0 / vocab, dtype=torch.float64)
    w = torch.tensor(1.0, dtype=torch.float64)
    exact = logit_grad_norm_sq(uniform, uniform, w)  # sum pi^2 = 1/V
    _, upper = logit_grad_norm_bounds(uniform, torch.tensor([math.log(vocab)], dtype=torch.float64), w, vocab)
    torch.testing.assert_close(exact, upper)
    # The lower bound uses sum pi^2 >= exp(-H), with equality exactly when pi is uniform on its support (here 2 tokens).
    half = torch.tensor([0.5], dtype=torch.float64)
    lower, _ = logit_grad_norm_bounds(half, torch.tensor([math.log(2.0)], dtype=torch.float64), w, vocab)
    torch.testing.assert_close(logit_grad_norm_sq(half, half, w), lower)


def test_bounds_reject_a_one_token_vocabulary():
    one = torch.ones(1, dtype=torch.float64)
    with pytest.raises(ValueError, match="vocab_size"):
        logit_grad_norm_bounds(one, one * 0, one, vocab_size=1)


# ---------------------------------------------------------------------------------------------------------------
# Lemma 3.2: the entropy change of one update
# ---------------------------------------------------------------------------------------------------------------


def test_entropy_logit_gradient_matches_autograd():
    logits = _random_logits(5, 64, seed=3).requires_grad_()
    _entropy(logits).sum().backward()
    got = entropy_logit_gradient(logits.detach())
    torch.testing.assert_close(got, logits.grad, rtol=1e-10, atol=1e-14)
    torch.testing.assert_close(got.sum(-1), torch.zeros(5, dtype=torch.float64), rtol=0, atol=1e-12)


def test_logit_step_is_a_gradient_descent_step_on_the_token_loss():
    # entropy_after_logit_step moves z by eta w (e_a - pi): the same as z - eta * d(-w log pi_a)/dz from autograd.
    logits = _random_logits(3, 40, seed=4)
    sampled = torch.tensor([1, 39, 7])
    weight = torch.tensor([0.8, -0.4, 1.5], dtype=torch.float64)
    eta = 0.3
    z = logits.clone().requires_grad_()
    (-(weight * torch.log_softmax(z, -1)[torch.arange(3), sampled])).sum().backward()
    expected = _entropy(logits - eta * z.grad)
    torch.testing.assert_close(entropy_after_logit_step(logits, sampled, weight, eta), expected)
    # A scalar weight broadcasts over the positions.
    torch.testing.assert_close(
        entropy_after_logit_step(logits, sampled, 0.8, eta)[0],
        entropy_after_logit_step(logits, sampled, weight, eta)[0],
    )


def _first_order(logits, sampled, weight, eta):
    stats = softmax_statistics(logits, sampled)
    return entropy_change_first_order(
        stats.probs_sampled, stats.entropy, stats.collision_prob, stats.collision_logp, weight, eta
    )


@pytest.mark.parametrize("vocab", [3, 50, 2000])
def test_first_order_change_matches_finite_differences(vocab):
    logits = _random_logits(8, vocab, seed=vocab)
    gen = torch.Generator().manual_seed(5)
    sampled = torch.randint(vocab, (8,), generator=gen)
    weight = torch.linspace(-2.0, 2.0, 8, dtype=torch.float64)
    h = 1e-4  # central difference in the step size: truncation O(h^2), rounding ~1e-16 H / h (H up to ln 2000)
    central = (
        entropy_after_logit_step(logits, sampled, weight, h) - entropy_after_logit_step(logits, sampled, weight, -h)
    ) / (2 * h)
    torch.testing.assert_close(_first_order(logits, sampled, weight, 1.0), central, rtol=1e-5, atol=1e-9)


def test_first_order_change_error_is_second_order():
    # exact - first order = O(eta^2): ten times smaller steps leave an error ~100 times smaller.
    logits = _random_logits(6, 500, seed=6)[1:]  # drop the near-uniform row (its change is ~0 at any order)
    sampled = torch.tensor([0, 3, 499, 250, 9])
    before = softmax_statistics(logits, sampled).entropy
    errors = []
    for eta in (1e-2, 1e-3):
        exact = entropy_after_logit_step(logits, sampled, 1.0, eta) - before
        errors.append((exact - _first_order(logits, sampled, 1.0, eta)).abs())
    ratio = errors[0] / errors[1]
    assert ((ratio > 50) & (ratio < 200)).all(), ratio


def test_sign_rule_on_a_hand_built_distribution():
    # pi = (1/2, 1/4, 1/4): H = 1.5 ln 2, and sum_v pi_v^2 (log pi_v + H) = 1/4 (0.5 ln 2) + 2/16 (-0.5 ln 2) = ln2/16.
    # a = 0 (the mode):  bracket = ln2/16 - 1/2 (0.5 ln 2) = -3 ln2/16 (the entropy falls);
    # a = 1 (p = 1/4 < exp(-H) = 2^-1.5):  bracket = ln2/16 + 1/4 (0.5 ln 2) = +3 ln2/16 (the entropy rises).
    logits = torch.tensor([[0.5, 0.25, 0.25]]).log().double().expand(2, 3)
    got = _first_order(logits, torch.tensor([0, 1]), 1.0, 1.0)
    torch.testing.assert_close(got, torch.tensor([-3.0, 3.0], dtype=torch.float64) * math.log(2) / 16)
    # The sign follows w: a negative update on the mode raises the entropy.
    assert _first_order(logits[:1], torch.tensor([0]), -1.0, 1.0).item() > 0


def test_sign_rule_on_a_confident_position_of_a_real_vocabulary_size():
    # SmolLM2's vocabulary: the mode at 0.999, 1e-3 spread over the rest; the sampled token at p ~ 2e-8 (spurious).
    vocab = 49_152
    probs = torch.full((vocab,), 1e-3 / (vocab - 1), dtype=torch.float64)
    probs[0] = 0.999
    logits = probs.log().expand(2, vocab)
    sampled = torch.tensor([vocab - 1, 0])
    weight = torch.tensor([1.0, 1.0], dtype=torch.float64)
    change = _first_order(logits, sampled, weight, 1e-3)
    assert change[0] > 0 > change[1]  # the rare token raises the entropy, the mode lowers it
    exact = entropy_after_logit_step(logits, sampled, weight, 1e-3) - softmax_statistics(logits, sampled).entropy
    assert torch.equal(exact.sign(), change.sign())


def test_sign_rule_on_random_distributions():
    # p < exp(-H): the entropy rises under a positive update; the mode: it never rises.
    logits = _random_logits(300, 100, seed=7)
    stats_mode = softmax_statistics(logits, logits.argmax(-1))
    change_mode = entropy_change_first_order(*stats_mode, 1.0)
    assert (change_mode <= 1e-15).all()
    gen = torch.Generator().manual_seed(8)
    sampled = torch.randint(100, (300,), generator=gen)
    stats = softmax_statistics(logits, sampled)
    rare = stats.probs_sampled < torch.exp(-stats.entropy)
    assert rare.sum() > 50  # the check below is not vacuous
    assert (entropy_change_first_order(*stats, 1.0)[rare] > 0).all()


def test_uniform_distribution_has_no_first_order_change():
    logits = torch.zeros(1, 10, dtype=torch.float64)
    torch.testing.assert_close(
        _first_order(logits, torch.tensor([3]), 2.0, 1.0), torch.zeros(1, dtype=torch.float64), rtol=0, atol=1e-15
    )
