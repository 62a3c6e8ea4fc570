"""The public entry points [`grade`] and [`is_correct`], their result type and counters.

Extraction, normalisation, the integer and multiple-choice fast paths, the order-free matching of multi-answer golds,
then the bounded math-verify comparison (in-process or in a worker process).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from . import bound, verify, workers
from .bound import _error_text, _GraderTimeout, _run_bounded
from .choice import _OPTION_PREFIX_RE, _pred_option, _unwrap_decoration, option_letter
from .extract import _last_boxes, extract_boxed_answer
from .normalize import _as_int, _split_top_level, gold_parts, normalize_answer
from .verify import _parse_gold, _sympy_compare, _warm_up


logger = logging.getLogger(__package__)  # "stapo_trl.grading", as before the split

# Process-wide counters: "graded", "errors", "timeouts", "gold_unparseable". Read them, or `.clear()` them.
GRADER_STATS: Counter[str] = Counter()
_stats_lock = threading.Lock()


@dataclass(frozen=True)
class GradeResult:
    """Outcome of grading one completion.

    Args:
        correct (`bool`):
            Whether the last boxed answer matches the gold answer.
        extracted (`str` or `None`):
            Content of the last complete `\\boxed{}` (raw, before normalisation); `None` when there is no box.
        error (`str` or `None`):
            Why grading could not decide (math-verify exception, timeout, unparseable gold); `None` otherwise.
            `correct` is always `False` when `error` is set.
    """

    correct: bool
    extracted: str | None
    error: str | None = None


def _bounded_compare(pred: str, gold: str, deadline: float) -> bool:
    pool = workers._POOL  # rebound by configure_grader: read it here, never copy it
    if pool is not None and pool.ready():
        return pool.compare(pred, gold, deadline)
    return bool(_run_bounded(_sympy_compare, pred, gold, deadline=deadline))


def _gold_error(golds: list[str], deadline: float) -> str | None:
    """`"gold unparseable: ..."` when a (non-integer) gold part does not parse into SymPy, else None (cached)."""
    for gold in golds:
        if _as_int(gold) is not None or option_letter(gold) is not None:
            continue
        try:
            parsed = _parse_gold(gold, deadline)
        except _GraderTimeout as e:
            return str(e)
        except Exception as e:  # noqa: BLE001
            return f"gold unparseable: {_error_text(e)}"
        if not parsed:
            return f"gold unparseable: {gold[:200]!r}"
    return None


def _squash(s: str) -> str:
    return re.sub(r"\s+", "", s)


def _compare_single(pred: str, gold: str, deadline: float) -> tuple[bool, str | None]:
    """(correct, error) for one normalised prediction against one normalised gold string."""
    if not pred:
        return False, None
    if len(pred) > verify.MAX_ANSWER_CHARS:
        return False, f"timeout: refused before evaluation: answer longer than {verify.MAX_ANSWER_CHARS} characters"
    letter = option_letter(gold)
    if letter is not None:  # multiple choice: the letter decides
        option = _pred_option(pred)
        return option is not None and option[0] == letter, None
    prefixed = _OPTION_PREFIX_RE.match(_unwrap_decoration(pred))
    if prefixed:
        pred = prefixed.group(1)  # "(C) 12" or "C: 12" against a non-letter gold: the option's value is graded
    gi = _as_int(gold)
    if gi is not None:
        pi = _as_int(pred)
        if pi is not None:
            return pi == gi, None
    try:
        gold_parsed = _parse_gold(gold, deadline)
    except BaseException as e:  # noqa: BLE001 - math-verify's TimeoutException is a BaseException
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        return False, (str(e) if isinstance(e, _GraderTimeout) else f"gold unparseable: {_error_text(e)}")
    if not gold_parsed:
        return False, f"gold unparseable: {gold[:200]!r}"
    if _squash(pred) == _squash(gold):  # identical up to whitespace (and the gold parses): no SymPy needed
        return True, None
    try:
        return _bounded_compare(pred, gold, deadline), None
    except BaseException as e:  # noqa: BLE001 - math-verify's TimeoutException is a BaseException
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        return False, _error_text(e)


def _match_all(preds: list[str], golds: list[str], deadline: float) -> tuple[bool, str | None]:
    """Order-insensitive one-to-one matching of prediction parts to gold parts (backtracking, k is small)."""
    errors: list[str] = []
    cache: dict[tuple[int, int], bool] = {}

    def ok(i: int, j: int) -> bool:
        if (i, j) not in cache:
            c, e = _compare_single(preds[i], golds[j], deadline)
            if e:
                errors.append(e)
            cache[(i, j)] = c
        return cache[(i, j)]

    def assign(j: int, used: frozenset) -> bool:
        if j == len(golds):
            return True
        return any(i not in used and ok(i, j) and assign(j + 1, used | {i}) for i in range(len(preds)))

    if assign(0, frozenset()):
        return True, None
    return False, (errors[0] if errors else None)


def grade(completion: str | None, gold: Any) -> GradeResult:
    r"""Grade one completion against one gold answer (see the package docstring for the accepted formats).

    Never raises: a math-verify exception or timeout, or a gold that does not parse, gives
    `GradeResult(correct=False, error=...)` and increments `GRADER_STATS`.

    Args:
        completion (`str` or `None`):
            The model's text; only its last complete `\boxed{}` is read.
        gold (`str`, `int`, `float`, `list` or `tuple`):
            The ground truth, in any layout accepted by [`gold_parts`].

    Returns:
        [`GradeResult`]: `correct`, the `extracted` box content (or `None`) and the `error` (or `None`).
    """
    _warm_up()  # one-time import of SymPy / latex2sympy / math-verify, outside the time bound
    deadline = time.monotonic() + bound.GRADE_TIMEOUT_S
    with _stats_lock:
        GRADER_STATS["graded"] += 1
    extracted = extract_boxed_answer(completion)
    try:
        golds = gold_parts(gold)
    except Exception as e:  # noqa: BLE001 - malformed gold objects must not crash a training step
        golds, err = [], f"gold unparseable: {_error_text(e)}"
    else:
        err = None if golds else f"gold unparseable: {gold!r:.200}"
    if err is None:
        err = _gold_error(
            golds, deadline
        )  # checked even without a box: an unparseable gold makes every grade undefined
    if err is not None:
        return _count(GradeResult(False, extracted, err))
    if extracted is None:
        return _count(GradeResult(False, None, None))
    pred = normalize_answer(extracted)
    if len(golds) == 1:
        correct, err = _compare_single(pred, golds[0], deadline)
        return _count(GradeResult(correct, extracted, None if correct else err))
    # Multi-answer gold: all parts must match, any order.
    k = len(golds)
    parts = _split_top_level(pred)
    if len(parts) != k:
        boxes = _last_boxes(completion or "", k)
        if boxes is not None:
            parts = [normalize_answer(b) for b in boxes]
    if len(parts) == k:
        correct, err = _match_all(parts, golds, deadline)
        if correct:
            return _count(GradeResult(True, extracted, None))
    correct, err2 = _compare_single(pred, ", ".join(golds), deadline)
    return _count(GradeResult(correct, extracted, None if correct else (err2 or err)))


def _count(result: GradeResult) -> GradeResult:
    if result.error:
        with _stats_lock:
            GRADER_STATS["errors"] += 1
            if result.error.startswith("timeout"):
                GRADER_STATS["timeouts"] += 1
            if result.error.startswith("gold unparseable"):
                GRADER_STATS["gold_unparseable"] += 1
        logger.debug("grader error: %s", result.error)
    return result


def is_correct(completion: str | None, gold: Any) -> bool:
    r"""Whether the last `\boxed{}` of `completion` is equivalent to `gold` (see [`grade`]).

    Args:
        completion (`str` or `None`): the model's text.
        gold (`str`, `int`, `float`, `list` or `tuple`): the ground truth.

    Returns:
        `bool`: `True` only for a verified match; `False` for a mismatch, no box, or any grader failure.
    """
    return grade(completion, gold).correct
