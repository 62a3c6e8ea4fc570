r"""Answer grading: the LAST complete `\boxed{}` of a completion against a gold answer, decided by math-verify.

In the shape of TRL's `accuracy_reward` (`trl/rewards/accuracy_rewards.py`): math-verify `parse`s both sides and
`verify`s them; a gold that does not parse gives no verdict. The training reward ([`stapo_trl.rewards`]) and the
benchmark evaluation both call [`grade`]. What is ours, each for a reason:

- The box: the last complete `\boxed{...}` / `\fbox{...}` is the answer (STAPO Sec. 4.1); math-verify would read
  every box. No box, or a last box that never closes (a truncated generation): wrong.
- Gold layouts: a float (`27.0` is `27`), a `\boxed{}` ground truth (verl copies), a list (OlympiadBench
  `final_answer`, read as a set: every part, any order).
- `_REWRITES`, on both sides, for benchmark and reported golds that math-verify misreads.
- An option letter with its value (`\textbf{(B)}\ 7`): the letter against a letter gold, else the value.
- Numbers without a variable ([`_numbers_equal`]): exact values to `EXACT_DIGITS` significant digits, a decimal on
  either side to a relative `DECIMAL_REL_TOL`. math-verify rounds to 6 decimal places: it takes `1/2006!` for
  `1/2004!`, `2^{-100}` for `2^{-101}` and `3e-7` for the Minerva gold `1e-8`. Plain integers on both sides compare
  as `int`s, math-verify's verdict without SymPy (AIME, AMC, GSM8K, the built-in task).
- A bound on any thread: answers over `MAX_ANSWER_CHARS` characters, and answers whose value needs numbers of over
  `MAX_RESULT_DIGITS` digits (`10^{10^{10}}`, `(10^7)!`, `e^{e^{e^{e^e}}}`), are refused before evaluation; the rest
  runs under math-verify's own `TIMEOUT_S` timeouts on the main thread and, off it (where its `signal.alarm` cannot
  work), in a daemon thread that is given up after `TIMEOUT_S` seconds.

Never raises: a refusal, a timeout or an error of math-verify makes the answer wrong, with the reason in
[`GradeResult`]`.error`. Imports math-verify (and SymPy) on first use, never torch.
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any


MAX_ANSWER_CHARS = 1000  # longer box contents are refused before parsing
MAX_RESULT_DIGITS = 20_000  # 2^{2023} (610 digits) and 2006! (5,720) pass; 10^{10^{10}} does not
EXACT_DIGITS = 40  # significant digits to which two exact numbers must agree
DECIMAL_REL_TOL = 5e-6  # relative difference allowed when either number has a decimal point (~6 significant digits)
TIMEOUT_S = 5  # bound of one comparison, in whole seconds (signal.alarm); math-verify's default

_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_INT_RE = re.compile(r"[+-]?\d+")
_FUNCTIONS = r"arc(?:sin|cos|tan)|(?:sin|cos|tan)h?|cot|sec|csc|ln|log|exp"
# What `_clean` rewrites on both sides, and what math-verify makes of it otherwise:
_REWRITES = [
    # Python's `4.5e33` (4.5 * e * 33), `-1./3` (nothing), `np.arcsin(10/13)` (nothing): Minerva golds.
    (re.compile(r"(?<![\w.])(\d++(?:\.\d++)?|\.\d++)[eE]([+-]?\d++)(?![\w.])"), r"\1\\times10^{\2}"),
    (re.compile(r"(\d)\.(?=[/)\s,]|$)"), r"\1"),
    (re.compile(r"\bnp\.(?=[a-z])"), r"\\"),
    # `\text{1.25}` (a name), a command as a subscript, `L_{\odot}` or `m_{\max}` (nothing): Minerva, OlympiadBench.
    (re.compile(r"\\(?:text|textbf|mathrm|mathbf)\{\s*([+-]?[\d.,]+)\s*\}"), r"\1"),
    (re.compile(r"_\{\s*\\([A-Za-z]+)\s*\}"), r"_{\1}"),
    # Upright e, i and function names (reported golds): `1-\frac{1}{\mathrm{e}}`, `{\rm e}^{-2}` (nothing),
    # `\operatorname{arcsin}\frac{1}{2}` (1/2).
    (re.compile(r"\{\\rm\s+([ei])\}|\\(?:mathrm|rm|operatorname)\s*\{\s*([ei])\s*\}"), lambda m: m[1] or m[2]),
    (re.compile(r"\\(?:mathrm|operatorname)\s*\{\s*\\?(" + _FUNCTIONS + r")\s*\}"), r"\\\1 "),
    # A thin space between digit groups, `12\,345` (12 + 345), and the degree sign, `90°` (nothing): MATH-500 golds
    # `10,\!080` and `90^\circ`.
    (re.compile(r"(?<=\d)\\,(?=\d{3}(?!\d))"), ""),
    (re.compile("°"), r"^\\circ"),
]
# An option letter with its value, `\textbf{(B)}\ 7`, `(C) 12`, `\text{(D) }5` (AMC solutions end so): the letter is
# graded against a letter gold, the value against any other (math-verify reads `b` times 7).
_OPTION_RE = re.compile(r"(?:\\(?:text|textbf|mathrm|mathbf)\s*\{\s*)?\(([A-E])\)\s*\}?(?:\s|\\[ ,;:!]|\\q?quad|~)*")


@dataclass(frozen=True)
class GradeResult:
    """Outcome of grading one completion.

    Args:
        correct (`bool`): whether the last boxed answer is equivalent to the gold.
        extracted (`str` or `None`): the content of the last complete `\\boxed{}`; `None` when there is none.
        error (`str` or `None`): why no verdict could be reached: `"gold unparseable: ..."`, `"timeout: ..."` (out of
            time, or refused as too large to evaluate) or `"error: ..."`; `None` otherwise. `correct` is `False`
            whenever `error` is set.
    """

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
    r"""The content of the LAST `\boxed{...}` or `\fbox{...}` of `text`, nested braces included, stripped.

    Returns:
        `str` or `None`: `None` when there is no box, when the last one is empty, or when it never closes (a
        truncated generation: an earlier box does not count then).

    Example:
        >>> extract_boxed_answer(r"so \boxed{1} no, \boxed{\frac{1}{3}}.")
        '\\frac{1}{3}'
    """
    boxes = find_boxes(text or "")
    content = boxes[-1][0] if boxes else None
    return (content or "").strip() or None


def _clean(s: str) -> str:
    s = s.strip().removesuffix(".").strip()  # a sentence's period inside the box (`13.`: nothing)
    for pattern, replacement in _REWRITES:
        s = pattern.sub(replacement, s)
    return s


def _gold_text(gold: Any) -> str:
    if gold is None:
        return ""
    if isinstance(gold, (list, tuple)):
        return ", ".join(_gold_text(g) for g in gold)
    if isinstance(gold, float) and gold.is_integer():
        return str(int(gold))
    s = str(gold).strip()
    if _BOX_RE.search(s):  # a verl ground truth, `\boxed{204}`
        s = extract_boxed_answer(s) or s
    return _clean(s)


def _parse(s: str, timeout: int | None) -> list:
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    config = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]
    parsed = parse(f"\\boxed{{{s}}}", config, "no_fallback", parsing_timeout=timeout, raise_on_error=True)
    return [x for x in parsed if not isinstance(x, str)]


@lru_cache(maxsize=4096)  # an evaluation grades N samples against one gold; a training step G per prompt
def _parse_gold(s: str, timeout: int | None) -> tuple:
    try:
        return tuple(_parse(s, timeout)) if len(s) <= MAX_ANSWER_CHARS else ()
    except Exception:  # noqa: BLE001 - a gold math-verify fails on is unparseable (a timeout is no Exception: raised)
        return ()


def _log10_size(x) -> float:
    """Upper estimate of the decimal digits of the largest number that evaluating `x` builds."""
    import sympy

    if isinstance(x, sympy.Rational):
        return max(int(x.p).bit_length(), int(x.q).bit_length()) * math.log10(2)
    if isinstance(x, sympy.Float):
        return math.log10(abs(float(x)) + 1)
    sizes = [_log10_size(a) for a in getattr(x, "args", ())]
    if not sizes:
        return 1.0
    if isinstance(x, (sympy.Pow, sympy.exp)) and x.args[-1].is_number:  # the exponent is at most 10^(its digits)
        return sizes[0] * 10 ** min(sizes[-1], 300)
    factorials = (sympy.factorial, sympy.factorial2, sympy.subfactorial, sympy.gamma, sympy.binomial)
    if isinstance(x, factorials) and x.is_number:
        return 10 ** min(sizes[-1] if isinstance(x, sympy.binomial) else sizes[0], 300) * sizes[0]
    return sum(sizes) if isinstance(x, sympy.Mul) else max(sizes) + 1


def _numbers_equal(g, p) -> bool | None:
    """Two numbers (no variable): equal within a relative `DECIMAL_REL_TOL` when either has a decimal point, else to
    `EXACT_DIGITS` significant digits; `None` (math-verify decides) for anything else."""
    import sympy

    special = (sympy.oo, -sympy.oo, sympy.zoo, sympy.nan, sympy.UnevaluatedExpr)
    if not all(isinstance(x, sympy.Expr) and x.is_number and not x.has(*special) for x in (g, p)):
        return None
    a, b = sympy.N(g, EXACT_DIGITS + 20), sympy.N(p, EXACT_DIGITS + 20)
    if not (a.is_Number and b.is_Number):  # complex, or a function SymPy cannot evaluate
        return None
    tol = DECIMAL_REL_TOL if g.has(sympy.Float) or p.has(sympy.Float) else 10.0**-EXACT_DIGITS
    return bool(abs(a - b) <= sympy.Float(tol, EXACT_DIGITS + 20) * max(abs(a), abs(b)))


def _equivalent(gold_text: str, answer: str, timeout: int | None) -> bool:
    """Parse, refuse what is too large to evaluate, compare (math-verify's `timeout`: called through [`_bounded`])."""
    from math_verify import verify

    gold, pred = _parse_gold(gold_text, timeout), _parse(answer, timeout)
    for x in (*gold, *pred):
        if _log10_size(x) > MAX_RESULT_DIGITS:
            raise ValueError(f"refused: evaluating {str(x)[:80]} needs over {MAX_RESULT_DIGITS} digits")
    for g in gold:
        for p in pred:
            same = _numbers_equal(g, p)
            if same is None:
                same = verify(g, p, allow_set_relation_comp=True, timeout_seconds=timeout, raise_on_error=True)
            if same:
                return True
    return False


def _bounded(fn: Callable, *args):
    """`fn(*args, timeout)`: on the main thread with math-verify's own timeouts (`TIMEOUT_S`, by `signal.alarm`); on
    any other thread, where those cannot work, without them in a daemon thread, given up after `TIMEOUT_S` seconds
    (it finishes in the background; the size refusal keeps out the forms that would not finish)."""
    if threading.current_thread() is threading.main_thread():
        return fn(*args, TIMEOUT_S)
    outcome: list = []

    def run():
        try:
            outcome.append(fn(*args, None))
        except BaseException as e:  # noqa: BLE001 - raised again in the calling thread
            outcome.append(e)

    worker = threading.Thread(target=run, daemon=True, name="stapo-grading")
    worker.start()
    worker.join(TIMEOUT_S)
    if not outcome:
        raise TimeoutError(f"over {TIMEOUT_S} s, off the main thread")
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return outcome[0]


def grade(completion: str | None, gold: Any) -> GradeResult:
    r"""Grade one completion against one gold answer (the rules are in the module docstring).

    Args:
        completion (`str` or `None`): the model's text; only its last complete `\boxed{}` is read.
        gold (`str`, `int`, `float`, `list` or `tuple`): the ground truth; a list is a multi-answer gold, matched as
            a set (every part, in any order).

    Returns:
        [`GradeResult`]: never raises. A gold that does not parse gives `error="gold unparseable: ..."` whatever the
        completion; a refusal, a timeout or an error of math-verify gives a wrong answer with the reason.
    """
    extracted = extract_boxed_answer(completion)
    try:
        gold_text = _gold_text(gold)
        if not _INT_RE.fullmatch(gold_text) and not _bounded(_parse_gold, gold_text):
            return GradeResult(False, extracted, f"gold unparseable: {gold!r:.200}")
        if extracted is None:
            return GradeResult(False, None)
        if len(extracted) > MAX_ANSWER_CHARS:
            return GradeResult(False, extracted, f"timeout: refused: over {MAX_ANSWER_CHARS} characters")
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
    r"""Whether the last `\boxed{}` of `completion` is equivalent to `gold`: [`grade`]`(completion, gold).correct`."""
    return grade(completion, gold).correct
