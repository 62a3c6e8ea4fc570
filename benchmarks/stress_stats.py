"""Exact paired tests over seeds for the stress experiment (`stress.py`); no scipy in the venv."""

from __future__ import annotations

import itertools
import math


def sign_test(differences: list[float]) -> float:
    """Exact two-sided sign test p-value of paired differences (zeros dropped); 1.0 when all are zero."""
    nonzero = [d for d in differences if d != 0]
    n = len(nonzero)
    if n == 0:
        return 1.0
    k = min(sum(d > 0 for d in nonzero), sum(d < 0 for d in nonzero))
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


def paired_permutation_test(differences: list[float]) -> float:
    """Exact two-sided sign-flip permutation p-value of the mean of paired differences (all 2^n flips, n <= 16)."""
    n = len(differences)
    if n == 0 or n > 16:
        return float("nan")
    observed = abs(sum(differences))
    count = sum(
        abs(sum(s * d for s, d in zip(signs, differences, strict=True))) >= observed - 1e-12
        for signs in itertools.product((1, -1), repeat=n)
    )
    return count / 2**n
