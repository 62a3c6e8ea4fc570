"""avg@k and pass@k: against enumeration, at their edges, on a hand-built table."""

import itertools

import pytest

from stapo_trl.evaluation.tasks import benchmark_metrics, pass_at_k, pass_k_values


def test_pass_at_k_is_the_share_of_k_subsets_holding_a_correct_sample():
    for n in range(1, 9):
        for c in range(n + 1):
            for k in range(1, n + 1):
                subsets = list(itertools.combinations([True] * c + [False] * (n - c), k))
                assert pass_at_k(n, c, k) == pytest.approx(sum(map(any, subsets)) / len(subsets), abs=1e-12)
    assert (pass_at_k(32, 0, 32), pass_at_k(32, 32, 1), pass_at_k(32, 8, 1)) == (0.0, 1.0, 0.25)
    for n, c, k in ((4, 1, 8), (4, 5, 1)):
        with pytest.raises(ValueError, match="1 <= k <= n and 0 <= c <= n"):
            pass_at_k(n, c, k)
    assert [pass_k_values(n) for n in (32, 4, 6, 1)] == [[1, 2, 4, 8, 16, 32], [1, 2, 4], [1, 2, 4], [1]]


def test_benchmark_metrics_hand_built():
    # 2/4, 0/4 and 4/4 correct: avg@4 = (0.5 + 0 + 1) / 3 = pass@1; pass@4 = (1 + 0 + 1) / 3.
    table = benchmark_metrics([[True, False, True, False], [False] * 4, [True] * 4], 4)
    assert table["avg@4"] == pytest.approx(0.5) and table["pass@k"]["1"] == pytest.approx(0.5)
    assert table["pass@k"]["4"] == pytest.approx(2 / 3) and (table["num_problems"], table["n_samples"]) == (3, 4)

    for correct, ids, problem in [([[True, False], []], ["p0", "p1"], "p1"), ([[], []], ["a", "b"], "a"),
                                  ([[True], [], [False]], None, "#1")]:  # fmt: skip
        with pytest.raises(ValueError, match=f"^benchmark aime24 problem {problem} has no graded sample"):
            benchmark_metrics(correct, 2, benchmark="aime24", problem_ids=ids)
