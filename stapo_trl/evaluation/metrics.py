"""avg@N and the unbiased pass@k of sampled completions ([STAPO](https://huggingface.co/papers/2602.15620), Sec. 4)."""

from __future__ import annotations

import math
from collections.abc import Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of [Chen et al. 2021](https://huggingface.co/papers/2107.03374), Eq. 1: 1 - C(n-c, k) / C(n, k)
    for n samples, c of them correct; `ValueError` for k outside [1, n] or c outside [0, n]."""
    if not (1 <= k <= n and 0 <= c <= n):
        raise ValueError(f"pass@k needs 1 <= k <= n and 0 <= c <= n, got n={n}, c={c}, k={k}")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_k_values(n: int) -> list[int]:
    """The pass@k budgets reported for n samples: the powers of two up to n (1, 2, 4, ...)."""
    return [2**j for j in range(int(math.log2(n)) + 1)] if n >= 1 else []


def benchmark_metrics(correct: Sequence[Sequence[bool]], n_samples: int, benchmark=None, problem_ids=None) -> dict:
    """`avg@N` (mean over problems of the fraction correct, in [0, 1]), mean `pass@k` (`{str(k): value}` for k in
    [`pass_k_values`]), `n_samples` and `num_problems` of a (P, N) correctness table; `ValueError` naming the
    `benchmark` and the problem (its id in `problem_ids`) for a row without a graded sample."""
    for i, row in enumerate(correct):
        if not row:
            problem = problem_ids[i] if problem_ids is not None and i < len(problem_ids) else f"#{i}"
            raise ValueError(f"benchmark {benchmark or '?'} problem {problem} has no graded sample (empty row).")
    counts = [(len(row), sum(map(bool, row))) for row in correct]
    mean = lambda values: sum(values) / len(values) if values else float("nan")  # noqa: E731
    passk = {str(k): mean([pass_at_k(n, c, k) for n, c in counts]) for k in pass_k_values(n_samples)}
    return {f"avg@{n_samples}": mean([c / n for n, c in counts]), "pass@k": passk, "n_samples": n_samples,
            "num_problems": len(counts)}  # fmt: skip
