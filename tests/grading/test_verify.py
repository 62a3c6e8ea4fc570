"""The comparison itself (`stapo_trl.grading.verify`): exact values compared exactly, decimals with a relative
tolerance, answers over the size limits refused before evaluation, and a crash or timeout of math-verify counted as
wrong. A limit or a patched function in `verify` reaches `api`, which reads it."""

import pytest

from stapo_trl import grading
from stapo_trl.grading import GRADER_STATS, grade


def test_grader_exception_counts_as_wrong(monkeypatch):
    # A math-verify crash must never raise and never score 1; it is reported and counted.
    def boom(*args, **kwargs):
        raise RuntimeError("sympy exploded")

    monkeypatch.setattr(grading.verify, "_verify", boom)
    GRADER_STATS.clear()
    result = grade(r"\boxed{\frac{1}{2}}", "0.5")
    assert not result.correct
    assert "sympy exploded" in result.error
    assert GRADER_STATS["errors"] == 1


def test_timeout_counts_as_wrong(monkeypatch):
    from math_verify.errors import TimeoutException

    def slow(*args, **kwargs):
        raise TimeoutException("Operation timed out!")

    monkeypatch.setattr(grading.verify, "_verify", slow)
    GRADER_STATS.clear()
    result = grade(r"\boxed{x^2}", "x**2 + 0")
    assert not result.correct and result.error.startswith("timeout")
    assert GRADER_STATS["timeouts"] == 1


@pytest.mark.parametrize(
    "completion, gold, expected",
    [
        # Two different exact values, both tiny or both huge, are different (no absolute tolerance).
        (
            r"\boxed{\frac{1}{2006!}}",
            r"\frac{1}{2004!}",
            False,
        ),  # the reported case: two tiny exact values graded equal
        (r"\boxed{2^{-100}}", r"2^{-101}", False),
        (r"\boxed{10^{-20}}", r"2\cdot 10^{-20}", False),
        (r"\boxed{\frac{\sqrt{2}}{10^{30}}}", r"\frac{\sqrt{3}}{10^{30}}", False),  # radicals
        (r"\boxed{10^{-30}\pi}", r"\frac{\pi}{10^{29}}", False),  # pi
        (r"\boxed{2^{200}+1}", r"2^{200}", False),  # huge: relative difference 6e-61
        (r"\boxed{\frac{1}{2006 \cdot 2005 \cdot 2004!}}", r"\frac{1}{2006!}", True),  # equal exact values stay equal
        (r"\boxed{\frac{1}{\sqrt{2}}}", r"\frac{\sqrt{2}}{2}", True),
        (r"\boxed{2^{-100}}", r"\frac{1}{2^{100}}", True),
        # A decimal on either side: relative tolerance DECIMAL_REL_TOL (5e-6).
        (r"\boxed{0.3333}", r"\frac{1}{3}", False),
        (r"\boxed{0.333333}", r"\frac{1}{3}", True),
        (r"\boxed{27.0}", "27", True),
        (r"\boxed{3.14159}", r"\pi", True),
        (r"\boxed{3.14}", r"\pi", False),
        (r"\boxed{1.2 \times 10^{-8}}", r"1.5 \times 10^{-8}", False),  # tiny decimals: relative, not absolute
        (r"\boxed{0.0000001}", "0.0000004", False),
        (r"\boxed{1.5 \times 10^{-8}}", r"1.5 \times 10^{-8}", True),
        (r"\boxed{4.50 \times 10^{33}}", "4.5e33", True),
        (r"\boxed{I(0)}", "4.4e7", False),  # an unevaluated function of a number: no error, just wrong
    ],
)
def test_exact_and_decimal_magnitudes(completion, gold, expected):
    result = grade(completion, gold)
    assert result.correct is expected and result.error is None, result


def test_very_long_integer_answer_does_not_raise():
    # int() refuses strings over 4300 digits; the length guard must come before the integer fast path.
    result = grade(rf"\boxed{{{'1' * 5000}}}", "1")
    assert not result.correct and result.error.startswith("timeout")


def test_a_limit_in_verify_reaches_api(monkeypatch):
    # MAX_ANSWER_CHARS is defined in verify.py and read by api.py: "123456" (6 characters) is refused at 5.
    assert grade(r"\boxed{123456}", "123456").correct
    monkeypatch.setattr(grading.verify, "MAX_ANSWER_CHARS", 5)
    result = grade(r"\boxed{123456}", "123456")
    assert not result.correct
    assert result.error == "timeout: refused before evaluation: answer longer than 5 characters"


def test_patched_private_function_is_used_and_restored(monkeypatch):
    # `_verify` lives in verify.py; patched there, x+2 "equals" x+1; restored, it does not.
    with monkeypatch.context() as patch:
        patch.setattr(grading.verify, "_verify", lambda gold, pred: True)
        assert grade(r"\boxed{x+2}", "x+1").correct
    assert not grade(r"\boxed{x+2}", "x+1").correct
