"""Scores of sampled completions: the unbiased pass@k estimator and the per-benchmark avg@N / pass@k table.

[STAPO](https://huggingface.co/papers/2602.15620), Sec. 4 reports avg@N (the mean accuracy over N samples per
problem) and compares pass@k curves. Pure Python: no torch, no transformers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k estimator of [Chen et al. 2021](https://huggingface.co/papers/2107.03374), Eq. (1).

    pass@k = 1 - C(n - c, k) / C(n, k), computed as a stable product 1 - prod_{i=n-c+1}^{n} (1 - k / i).

    Args:
        n (`int`): samples drawn for the problem.
        c (`int`): correct samples among them, 0 <= c <= n.
        k (`int`): budget, 1 <= k <= n.

    Returns:
        `float`: the probability, in [0, 1], that at least one of k samples drawn without replacement is correct.

    Raises:
        ValueError: k outside [1, n] or c outside [0, n].
    """
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n, got k={k}, n={n}")
    if not 0 <= c <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n, got c={c}, n={n}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def pass_k_values(n: int) -> list[int]:
    """Powers of two `k <= n` (1, 2, 4, ...), the pass@k budgets reported for `n` samples."""
    return [2**j for j in range(int(math.log2(n)) + 1)] if n >= 1 else []


def benchmark_metrics(
    correct: Sequence[Sequence[bool]],
    n_samples: int,
    benchmark: str | None = None,
    problem_ids: Sequence[Any] | None = None,
) -> dict[str, Any]:
    """avg@N and pass@k for one benchmark.

    Args:
        correct (`Sequence[Sequence[bool]]`): shape (P, N), correctness of sample j of problem i.
        n_samples (`int`): N, the samples per problem.
        benchmark (`str`, *optional*): the benchmark's name, used in error messages only.
        problem_ids (`Sequence`, *optional*): P problem ids, used in error messages only.

    Returns:
        `dict`: `f"avg@{N}"` (mean over problems of the fraction of correct samples, in [0, 1]), `"pass@k"`
        (`{str(k): mean unbiased pass@k}` for k in [`pass_k_values`]), `"n_samples"`, `"num_problems"`.

    Raises:
        ValueError: a problem has no graded sample (an empty row); the message names the benchmark and the problem.
    """
    for i, row in enumerate(correct):
        if len(row) == 0:
            problem = problem_ids[i] if problem_ids is not None and i < len(problem_ids) else f"#{i}"
            raise ValueError(
                f"benchmark_metrics: benchmark {benchmark or '?'!s} problem {problem} has no graded sample "
                f"(empty row); every problem needs n_samples={n_samples} samples."
            )
    per_problem = [(len(row), sum(bool(x) for x in row)) for row in correct]
    num = len(per_problem)
    avg = sum(c / n for n, c in per_problem) / num if num else float("nan")
    passk = {
        str(k): (sum(pass_at_k(n, c, k) for n, c in per_problem) / num if num else float("nan"))
        for k in pass_k_values(n_samples)
    }
    return {f"avg@{n_samples}": avg, "pass@k": passk, "n_samples": n_samples, "num_problems": num}


def avg_key(table: dict[str, Any]) -> str:
    """The `avg@N` key of a per-benchmark table."""
    return f"avg@{table['n_samples']}"
