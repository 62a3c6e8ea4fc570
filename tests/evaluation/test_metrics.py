"""Evaluation metrics (`stapo_trl.evaluation.metrics`): pass@k against brute-force enumeration and at its edges,
the powers of two reported, and avg@k / pass@k of a hand-built table; an empty row names its benchmark and problem."""

import itertools

import pytest

from stapo_trl.evaluation.metrics import benchmark_metrics, pass_at_k, pass_k_values


def _pass_at_k_brute_force(n, c, k):
    # Enumerate every k-subset of n samples (the first c correct); pass@k = share of subsets with a correct one.
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


def test_pass_at_k_matches_brute_force():
    for n in range(1, 9):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(_pass_at_k_brute_force(n, c, k), abs=1e-12), (n, c, k)


def test_pass_at_k_edges():
    assert pass_at_k(32, 0, 32) == 0.0
    assert pass_at_k(32, 32, 1) == 1.0
    assert pass_at_k(32, 8, 1) == pytest.approx(0.25)  # pass@1 == avg accuracy
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 8)
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)


def test_pass_k_values_are_powers_of_two():
    assert pass_k_values(32) == [1, 2, 4, 8, 16, 32]
    assert pass_k_values(4) == [1, 2, 4]
    assert pass_k_values(6) == [1, 2, 4]
    assert pass_k_values(1) == [1]


def test_benchmark_metrics_hand_built():
    # Problem 0: 2/4 correct, problem 1: 0/4, problem 2: 4/4 -> avg@4 = (0.5 + 0 + 1) / 3 = 0.5.
    correct = [[True, False, True, False], [False] * 4, [True] * 4]
    table = benchmark_metrics(correct, 4)
    assert table["avg@4"] == pytest.approx(0.5)
    assert table["pass@k"]["1"] == pytest.approx(0.5)  # pass@1 is the mean accuracy
    # pass@4: problem 0 -> 1, problem 1 -> 0, problem 2 -> 1.
    assert table["pass@k"]["4"] == pytest.approx(2 / 3)
    assert table["num_problems"] == 3 and table["n_samples"] == 4


@pytest.mark.parametrize(
    "correct, ids, problem",
    [
        ([[True, False], []], ["p0", "p1"], "p1"),  # one empty row
        ([[], []], ["a", "b"], "a"),  # every row empty: the first is named
        ([[True], [], [False]], None, "#1"),  # no ids: the row index is named
    ],
)
def test_benchmark_metrics_empty_row_names_benchmark_and_problem(correct, ids, problem):
    with pytest.raises(ValueError) as info:
        benchmark_metrics(correct, 2, benchmark="aime24", problem_ids=ids)
    assert "aime24" in str(info.value) and f"problem {problem} " in str(info.value)
