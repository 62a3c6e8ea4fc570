"""math-verify parsing and equivalence, with our number rule on top: exact and decimal comparison.

Parsing (`_parse`, the cached gold parse), refusal of forms too large to evaluate (`_check_size`), exact versus
decimal equality of numbers (`_numbers_equal`, element-wise for tuples and matrices), `_verify` and the whole
unbounded comparison `_sympy_compare` that the time bound (`bound.py`) or a worker process (`workers.py`) runs.
Imports SymPy and math-verify lazily; never torch.
"""

from __future__ import annotations

import math
import os
import threading
from typing import Any

from .bound import _GraderTimeout, _Refused, _run_bounded


# Longer answers are refused before SymPy sees them (counted as timeouts).
MAX_ANSWER_CHARS = 1000
# Exact values whose evaluation needs integers of more digits than this are refused (counted as timeouts):
# 10^{10^{10}}, 2003^{2002^{2001}}, (10^5)!, \binom{10^9}{10^5}. 2^{2023} (610 digits) and 2006! (5,756) pass.
# The environment variable STAPO_GRADER_MAX_RESULT_DIGITS overrides it (read at import, workers included).
MAX_RESULT_DIGITS = int(float(os.environ.get("STAPO_GRADER_MAX_RESULT_DIGITS", "20000")))
# Parsed expressions with more nodes than this are refused (counted as timeouts).
MAX_EXPR_NODES = 2_000
# A decimal approximation agrees with the other side when |a - b| <= DECIMAL_REL_TOL * max(|a|, |b|):
# `0.333333` and `3.14159` are 1/3 and pi, `0.3333` and `3.14` are not.
DECIMAL_REL_TOL = 5e-6
# Two exact values (no decimal on either side) are equal when they agree to this many significant digits
# (evaluated with 20 more): 1/2006! and 1/2004! differ, sqrt(2)/2 and 1/sqrt(2) agree.
EXACT_DIGITS = 40


def _extraction_config():
    from math_verify import ExprExtractionConfig, LatexExtractionConfig

    return [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]


def _parse(s: str, *, fallback: bool) -> list:
    """math-verify `parse` of `\\boxed{s}` without its own (signal-based) timeout; the caller bounds the time."""
    from math_verify import parse

    return parse(
        f"\\boxed{{{s}}}",
        extraction_config=_extraction_config(),
        fallback_mode="first_match" if fallback else "no_fallback",
        parsing_timeout=None,
        raise_on_error=True,
    )


# ---- pathological forms -----------------------------------------------------------------------------------------

_LOG10_2 = math.log10(2)


def _digits(expr) -> float:
    """Upper estimate of the decimal digits of the largest integer that evaluating `expr` exactly can produce.

    Raises:
        _Refused: a power, factorial or binomial over `MAX_RESULT_DIGITS` digits, or a tower whose exponent alone
            is over 7 digits.
    """
    import sympy

    if isinstance(expr, sympy.Integer):
        return max(1.0, int(expr).bit_length() * _LOG10_2)
    if isinstance(expr, sympy.Rational):
        return max(1.0, max(int(expr.p).bit_length(), int(expr.q).bit_length()) * _LOG10_2)
    if isinstance(expr, sympy.Float) or not getattr(expr, "args", ()):
        return 1.0
    if isinstance(expr, sympy.Pow):
        base, exp = _digits(expr.base), _digits(expr.exp)
        if exp > math.log10(MAX_RESULT_DIGITS) + 2:
            raise _Refused(f"exponent with about {exp:.0f} digits")
        if isinstance(expr.exp, sympy.Rational):
            size = base * max(1, abs(int(expr.exp.p)))  # a root or a reciprocal does not grow the integers
        else:
            size = base * 10**exp if expr.exp.is_number else base
        if size > MAX_RESULT_DIGITS:
            raise _Refused(f"power with about {size:.3g} digits")
        return size
    if isinstance(expr, (sympy.factorial, sympy.factorial2, sympy.subfactorial, sympy.gamma, sympy.binomial)):
        args = [_digits(a) for a in expr.args]
        if max(args) > math.log10(MAX_RESULT_DIGITS) + 2:
            raise _Refused(f"{type(expr).__name__} of a number with about {max(args):.0f} digits")
        n = 10 ** args[0]
        size = n * math.log10(max(n, 2))
        if isinstance(expr, sympy.binomial) and expr.args[1].is_Integer and expr.args[0].is_Integer:
            k = min(int(expr.args[1]), int(expr.args[0]) - int(expr.args[1]))
            size = max(k, 0) * math.log10(max(n, 2))
        if size > MAX_RESULT_DIGITS:
            raise _Refused(f"{type(expr).__name__} with about {size:.3g} digits")
        return max(size, 1.0)
    sizes = [_digits(a) for a in expr.args]
    return sum(sizes) if isinstance(expr, sympy.Mul) else max(sizes) + 1


def _check_size(expr) -> None:
    """Refuse (raise `_Refused`) a parsed answer too large to evaluate within the time bound."""
    import sympy

    if isinstance(expr, str) or not isinstance(expr, (sympy.Basic, sympy.MatrixBase)):
        return
    nodes = 0
    for _ in sympy.preorder_traversal(expr):
        nodes += 1
        if nodes > MAX_EXPR_NODES:
            raise _Refused(f"expression with over {MAX_EXPR_NODES} nodes")
    if isinstance(expr, sympy.MatrixBase):
        for x in expr:
            _digits(x)
    else:
        _digits(expr)


# ---- exact and decimal comparison of numbers -------------------------------------------------------------------


def _numeric_scalar(x) -> bool:
    """A number-valued SymPy expression: no free symbols, no percentage wrapper, no infinity or NaN."""
    import sympy

    return (
        isinstance(x, sympy.Expr)
        and not x.free_symbols
        and not x.has(sympy.UnevaluatedExpr, sympy.oo, -sympy.oo, sympy.zoo, sympy.nan)
        and not isinstance(x, sympy.MatrixBase)
    )


def _numbers_equal(g, p) -> bool | None:
    """Exact or relative-tolerance equality of two numbers; `None` when one side is not a plain number.

    Both exact (no `Float` anywhere): rationals are compared as fractions, other closed forms to `EXACT_DIGITS`
    significant digits (never an absolute tolerance: 1/2006! != 1/2004!). A decimal on either side: relative
    tolerance `DECIMAL_REL_TOL`.
    """
    import sympy

    if not (_numeric_scalar(g) and _numeric_scalar(p)):
        return None
    decimal = g.has(sympy.Float) or p.has(sympy.Float)
    if not decimal:
        gv, pv = g.doit(), p.doit()
        if isinstance(gv, sympy.Rational) and isinstance(pv, sympy.Rational):
            return gv == pv
    digits = EXACT_DIGITS + 20
    try:
        a_hi, b_hi = sympy.N(g, digits), sympy.N(p, digits)
    except (TypeError, ValueError, OverflowError):
        return None
    diff = abs(sympy.N(a_hi - b_hi, digits))
    if not (diff.is_Number and abs(a_hi).is_Number and abs(b_hi).is_Number):
        return None  # an undefined function of a number (`I(0)`) does not evaluate: math-verify decides
    scale = max(abs(a_hi), abs(b_hi))
    tol = sympy.Float(DECIMAL_REL_TOL if decimal else 10.0**-EXACT_DIGITS, digits)
    return bool(diff <= tol * scale)


def _unwrap_assignment(g, p):
    """Follow math-verify: a predicted `x = v` is compared by `v` when the gold is not an equation."""
    from math_verify.grader import is_equation, take_last_relation

    if is_equation(p) and not is_equation(g):
        p = take_last_relation(p).rhs
    return g, p


def _values_equal(g, p) -> bool | None:
    """Our number rule for scalars, and element-wise for tuples / matrices of the same shape; else `None`."""
    import sympy

    g, p = _unwrap_assignment(g, p)
    if isinstance(g, sympy.Tuple) and isinstance(p, sympy.Tuple) and len(g) == len(p):
        results = [_numbers_equal(a, b) for a, b in zip(g, p)]
        if all(r is not None for r in results):
            return all(results)
        return False if any(r is False for r in results) and all(_numeric_scalar(a) for a in g) else None
    if isinstance(g, sympy.MatrixBase) and isinstance(p, sympy.MatrixBase):
        if g.shape != p.shape:
            return False
        results = [_numbers_equal(a, b) for a, b in zip(g, p)]
        return all(results) if all(r is not None for r in results) else None
    return _numbers_equal(g, p)


def _verify(gold_parsed: list, pred_parsed: list) -> bool:
    """True when any (gold, pred) pair is equivalent; raises only when no pair matched and one raised."""
    from math_verify import verify

    first_error = None
    for g in gold_parsed:
        for p in pred_parsed:
            try:
                decided = _values_equal(g, p) if _is_sympy(g) and _is_sympy(p) else None
                if decided is None:
                    # allow_set_relation_comp: "x > 3" against the gold "(3, \infty)" (the other way round is on)
                    decided = verify(g, p, timeout_seconds=None, raise_on_error=True, allow_set_relation_comp=True)
                if decided:
                    return True
            except (_GraderTimeout, KeyboardInterrupt, SystemExit):
                raise
            except BaseException as e:  # noqa: BLE001 - includes math-verify's TimeoutException
                first_error = first_error or e
    if first_error is not None:
        raise first_error
    return False


def _is_sympy(x: Any) -> bool:
    return not isinstance(x, str)


_gold_cache: dict[str, tuple] = {}
_gold_cache_lock = threading.Lock()


def _parse_gold_unbounded(gold: str) -> tuple:
    """Parsed gold (SymPy objects only), cached: an evaluation grades N samples against the same gold."""
    with _gold_cache_lock:
        hit = _gold_cache.get(gold)
    if hit is not None:
        return hit
    parsed = _parse(gold, fallback=False) if len(gold) <= MAX_ANSWER_CHARS else []
    value = tuple(x for x in parsed if _is_sympy(x))
    with _gold_cache_lock:
        if len(_gold_cache) >= 4096:
            _gold_cache.clear()
        _gold_cache[gold] = value
    return value


def _parse_gold(gold: str, deadline: float) -> list:
    with _gold_cache_lock:
        hit = _gold_cache.get(gold)
    if hit is not None:
        return list(hit)
    return list(_run_bounded(_parse_gold_unbounded, gold, deadline=deadline))


def _sympy_compare(pred: str, gold: str) -> bool:
    """Parse both sides, refuse pathological forms, verify. Unbounded: run it through [`_bounded_compare`]."""
    gold_parsed = list(_parse_gold_unbounded(gold))
    pred_parsed = [x for x in _parse(pred, fallback=True) if _is_sympy(x)]
    if not pred_parsed:
        return False
    for x in gold_parsed + pred_parsed:
        _check_size(x)
    return _verify(gold_parsed, [_same_symbols(gold_parsed, p) for p in pred_parsed])


def _same_symbols(gold_parsed: list, pred):
    """`pred` with each symbol replaced by the gold's symbol of the same name.

    latex2sympy gives one letter different assumptions depending on the spacing (`2i` makes a real `i`, `2 i` and
    `2{i}` a non-real one), and SymPy then sees two different symbols.
    """
    try:
        by_name = {s.name: s for g in gold_parsed for s in getattr(g, "free_symbols", ())}
        swap = {s: by_name[s.name] for s in getattr(pred, "free_symbols", ()) if by_name.get(s.name, s) != s}
        return pred.xreplace(swap) if swap else pred
    except Exception:  # noqa: BLE001 - keep the prediction as parsed
        return pred


_warm_lock = threading.Lock()
_warmed = False


def _warm_up() -> None:
    """Import and initialise math-verify's parser once per process (1-2 s), so that no grade pays it in its bound."""
    global _warmed
    if _warmed:
        return
    with _warm_lock:
        if not _warmed:
            import math_verify.grader
            import math_verify.parser

            # math-verify warns once that its timeouts are off "and you must provide the logic yourself": we do
            # (this module's time bound), so the warning would only mislead readers of training logs.
            math_verify.grader.TIMEOUT_WARNING_SHOWN = math_verify.parser.TIMEOUT_WARNING_SHOWN = True
            _parse("x+1/2", fallback=True)
            _warmed = True
