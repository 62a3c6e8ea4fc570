r"""The grader: a completion's last `\boxed{}` (STAPO Sec. 4.1) against a gold by math-verify (docs/evaluation.md)."""

from __future__ import annotations

import functools
import math
import re
import threading
from dataclasses import dataclass
from typing import Any


MAX_ANSWER_CHARS = 1000  # longer box contents are refused before parsing
MAX_RESULT_DIGITS = 20_000  # 2^{2023} (610 digits) and 2006! (5,720) pass; 10^{10^{10}} does not
EXACT_DIGITS = 40  # significant digits to which two exact numbers must agree
DECIMAL_REL_TOL = 5e-6  # relative difference allowed when either number has a decimal point (~6 significant digits)
TIMEOUT_S = 5  # bound of one comparison, in whole seconds (signal.alarm); math-verify's default

_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_INT_RE = re.compile(r"[+-]?\d+")
_FUNCTIONS = r"arc(?:sin|cos|tan)|(?:sin|cos|tan)h?|cot|sec|csc|ln|log|exp"
_REWRITES = [  # what math-verify misreads otherwise, in benchmark (Minerva, OlympiadBench, MATH-500) or reported golds
    (re.compile(r"(?<![\w.])(\d++(?:\.\d++)?|\.\d++)[eE]([+-]?\d++)(?![\w.])"), r"\1\\times10^{\2}"),  # 4.5e33
    (re.compile(r"(\d)\.(?=[/)\s,]|$)"), r"\1"),  # -1./3
    (re.compile(r"\bnp\.(?=[a-z])"), r"\\"),  # np.arcsin(10/13)
    (re.compile(r"\\(?:text|textbf|mathrm|mathbf)\{\s*([+-]?[\d.,]+)\s*\}"), r"\1"),  # \text{1.25}
    (re.compile(r"_\{\s*\\([A-Za-z]+)\s*\}"), r"_{\1}"),  # L_{\odot}, m_{\max}
    (re.compile(r"\{\\rm\s+([ei])\}|\\(?:mathrm|rm|operatorname)\s*\{\s*([ei])\s*\}"), lambda m: m[1] or m[2]),
    (re.compile(r"\\(?:mathrm|operatorname)\s*\{\s*\\?(" + _FUNCTIONS + r")\s*\}"), r"\\\1 "),  # \operatorname{arcsin}
    (re.compile(r"(?<=\d)\\,(?=\d{3}(?!\d))"), ""),  # 12\,345 (12 + 345 for math-verify)
    (re.compile("°"), r"^\\circ")]  # 90°  # fmt: skip
# An option letter with its value, `\textbf{(B)}\ 7`, `(C) 12`, `\text{(D) }5` (math-verify reads `b` times 7).
_OPTION_RE = re.compile(r"(?:\\(?:text|textbf|mathrm|mathbf)\s*\{\s*)?\(([A-E])\)\s*\}?(?:\s|\\[ ,;:!]|\\q?quad|~)*")


@dataclass(frozen=True)
class GradeResult:
    r"""One completion's grade: `correct` (`bool`), `extracted` (the last complete `\boxed{}`'s content, or `None`) and
    `error` (`None`, or why there is no verdict: `"gold unparseable: ..."`, `"timeout: ..."` for out of time or refused
    as too large, `"error: ..."`; `correct` is then `False`)."""

    correct: bool
    extracted: str | None
    error: str | None = None


def find_boxes(text: str) -> list[tuple[str | None, int, int]]:
    r"""Every `\boxed{` / `\fbox{` of `text` as (content, or `None` when its brace never closes; start; end)."""
    boxes = []
    for m in _BOX_RE.finditer(text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            if text[i] == "\\":  # \{, \} and \\ do not count
                i += 2
                continue
            depth += (text[i] == "{") - (text[i] == "}")
            i += 1
        boxes.append((None, m.start(), len(text)) if depth else (text[m.end() : i - 1], m.start(), i))
    return boxes


def extract_boxed_answer(text: str | None) -> str | None:
    r"""The stripped content of the LAST `\boxed{}` / `\fbox{}` of `text`; `None` without one, empty or unclosed."""
    return ((find_boxes(text or "") or [(None,)])[-1][0] or "").strip() or None


def _clean(s: str) -> str:  # also drops a sentence's period inside the box (`13.`: nothing)
    return functools.reduce(lambda t, rule: rule[0].sub(rule[1], t), _REWRITES, s.strip().removesuffix(".").strip())


def _gold_text(gold: Any) -> str:
    if isinstance(gold, (list, tuple)):
        return ", ".join(map(_gold_text, gold))
    if gold is None or isinstance(gold, float) and gold.is_integer():
        return "" if gold is None else str(int(gold))
    return _clean(extract_boxed_answer(s := str(gold).strip()) or s)  # a verl ground truth, `\boxed{204}`


def _parse(s: str, timeout: int | None) -> list:
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    config = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]
    parsed = parse(f"\\boxed{{{s}}}", config, "no_fallback", parsing_timeout=timeout, raise_on_error=True)
    return [x for x in parsed if not isinstance(x, str)]


@functools.lru_cache(maxsize=4096)  # an evaluation grades N samples against one gold; a training step G per prompt
def _parse_gold(s: str, timeout: int | None) -> tuple:
    try:
        return tuple(_parse(s, timeout)) if len(s) <= MAX_ANSWER_CHARS else ()
    except Exception:  # noqa: BLE001 - a gold math-verify fails on is unparseable (a timeout is no Exception: raised)
        return ()


def _log10_size(x) -> float:
    import sympy  # an upper estimate of the digits of the largest number evaluating `x` builds

    if isinstance(x, sympy.Rational):
        return max(int(x.p).bit_length(), int(x.q).bit_length()) * math.log10(2)
    if isinstance(x, sympy.Float):
        return math.log10(abs(float(x)) + 1)
    if not (sizes := [_log10_size(a) for a in getattr(x, "args", ())]):
        return 1.0
    if isinstance(x, (sympy.Pow, sympy.exp)) and x.args[-1].is_number:  # the exponent is at most 10^(its digits)
        return sizes[0] * 10 ** min(sizes[-1], 300)
    factorials = (sympy.factorial, sympy.factorial2, sympy.subfactorial, sympy.gamma, sympy.binomial)
    if isinstance(x, factorials) and x.is_number:
        return 10 ** min(sizes[-1] if isinstance(x, sympy.binomial) else sizes[0], 300) * sizes[0]
    return sum(sizes) if isinstance(x, sympy.Mul) else max(sizes) + 1


def _same(g, p, timeout: int | None) -> bool:
    """Two numbers equal within `DECIMAL_REL_TOL` with a decimal point, else to `EXACT_DIGITS`; else math-verify's."""
    import sympy
    from math_verify import verify

    special = (sympy.oo, -sympy.oo, sympy.zoo, sympy.nan, sympy.UnevaluatedExpr)
    if all(isinstance(x, sympy.Expr) and x.is_number and not x.has(*special) for x in (g, p)):
        a, b = sympy.N(g, EXACT_DIGITS + 20), sympy.N(p, EXACT_DIGITS + 20)
        if a.is_Number and b.is_Number:  # not complex, nor a function SymPy cannot evaluate
            tol = DECIMAL_REL_TOL if g.has(sympy.Float) or p.has(sympy.Float) else 10.0**-EXACT_DIGITS
            return bool(abs(a - b) <= sympy.Float(tol, EXACT_DIGITS + 20) * max(abs(a), abs(b)))
    return verify(g, p, allow_set_relation_comp=True, timeout_seconds=timeout, raise_on_error=True)


def _equivalent(gold_text: str, answer: str, timeout: int | None) -> bool:
    gold, pred = _parse_gold(gold_text, timeout), _parse(answer, timeout)
    if (big := next((x for x in (*gold, *pred) if _log10_size(x) > MAX_RESULT_DIGITS), None)) is not None:
        raise ValueError(f"refused: evaluating {str(big)[:80]} needs over {MAX_RESULT_DIGITS} digits")
    return any(_same(g, p, timeout) for g in gold for p in pred)


def _bounded(fn, *args):
    """`fn(*args, TIMEOUT_S)` on the main thread (signal.alarm), else in a daemon thread given up after TIMEOUT_S."""
    if threading.current_thread() is threading.main_thread():
        return fn(*args, TIMEOUT_S)
    outcome: list = []

    def run():
        try:
            outcome.append(fn(*args, None))
        except BaseException as e:  # noqa: BLE001 - raised again in the calling thread
            outcome.append(e)

    (worker := threading.Thread(target=run, daemon=True, name="stapo-grading")).start()
    worker.join(TIMEOUT_S)
    result = outcome[0] if outcome else TimeoutError(f"over {TIMEOUT_S} s, off the main thread")
    if isinstance(result, BaseException):
        raise result
    return result


def grade(completion: str | None, gold: Any) -> GradeResult:
    r"""Grade the last complete `\boxed{}` of `completion` against `gold` (str, int, float, or a list or tuple matched
    as a set). Never raises: an unparseable gold, a refusal, a timeout or an error is in [`GradeResult`]'s `error`."""
    extracted = extract_boxed_answer(completion)
    try:
        gold_text = _gold_text(gold)
        if not _INT_RE.fullmatch(gold_text) and not _bounded(_parse_gold, gold_text):
            return GradeResult(False, extracted, f"gold unparseable: {gold!r:.200}")
        if extracted is None or len(extracted) > MAX_ANSWER_CHARS:
            return GradeResult(False, extracted, extracted and f"timeout: refused: over {MAX_ANSWER_CHARS} characters")
        answer = _clean(extracted)
        if (option := _OPTION_RE.match(answer)) and option.end() < len(answer):
            letter_gold = _OPTION_RE.fullmatch(gold_text) or re.fullmatch("[A-E]", gold_text)
            answer = f"({option[1]})" if letter_gold else answer[option.end() :]
        if _INT_RE.fullmatch(gold_text) and _INT_RE.fullmatch(answer):
            return GradeResult(int(answer) == int(gold_text), extracted)
        return GradeResult(_bounded(_equivalent, gold_text, answer), extracted)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # noqa: BLE001 - math-verify's TimeoutException is a BaseException
        timed_out = "timeout" in type(e).__name__.lower() or str(e).startswith("refused")
        return GradeResult(False, extracted, f"{'timeout' if timed_out else 'error'}: {type(e).__name__}: {e!s:.200}")


def is_correct(completion: str | None, gold: Any) -> bool:
    r"""[`grade`]`(completion, gold).correct`."""
    return grade(completion, gold).correct
