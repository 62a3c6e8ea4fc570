r"""The one answer grader of `stapo_trl`: training reward and benchmark evaluation both call it.

A completion is graded by its LAST complete `\boxed{...}` (or `\fbox{...}`) against a gold answer, with
[math-verify](https://github.com/huggingface/Math-Verify) (`parse` + `verify`) deciding mathematical equivalence,
as in the [STAPO](https://huggingface.co/papers/2602.15620) recipe (Sec. 4.1: binary rule-based reward, final
answer in `\boxed{}`).

Accepted formats (completion side):

- `\boxed{...}` / `\fbox{...}` with nested braces (`\boxed{\frac{1}{3}}`), also the brace-less `\boxed 5`;
  several boxes: the last one wins; the last box unterminated (a truncated generation) or no box at all: wrong.
- Inside the box: LaTeX or plain expressions, optionally wrapped in `$...$`, `\(...\)`, `\[...\]`; `\text{13}`,
  `\textbf{13}`, `\mathrm{13}` around a number; leading zeros (`025`); integer-valued floats (`27.0`); thousands
  separators (`1,000` only where the gold is a single number); trailing periods; units in `\text{ km}`.

Accepted formats (gold side): `str`, `int`, `float` (`27.0` == `27`), a string wrapped in `$...$` or in
`\boxed{}` (verl ground truths), a Python-style number (`4.5e33`, `-1./3`), numpy-style functions
(`np.arcsin(10/13)`, as in some Minerva copies), and multi-answer golds:

- a `list`/`tuple` of answers (OlympiadBench `final_answer`), or a string of several `$...$` groups separated by
  commas (`"$69$,$84$"`, the OlympiadBench verl copy): ALL parts must match, in ANY order (the completion's last
  box is split at top-level commas; if the part count differs, the last k boxes are used when there are k of them;
  otherwise the whole box is compared with the joined gold as a set, which math-verify compares order-free).

A gold that math-verify cannot turn into a SymPy object never gives credit (the result carries
`error="gold unparseable: ..."`), even when the completion repeats it verbatim.

Fast paths (no SymPy): when both sides are plain integers (after the normalisation above) they are compared as
Python `int`s (the common case for AIME/AMC/DAPO); when the answer equals the gold up to whitespace, it is correct
as soon as the gold parses. Parsed golds are cached (an evaluation grades N samples against each gold).

Time bounds and threads: math-verify's own timeouts use `signal.alarm`, which only works on the main thread.
On the main thread we keep them (`PARSING_TIMEOUT_S`, `VERIFY_TIMEOUT_S`, whole seconds). Off the main thread
(TRL async rewards, thread pools, a `TrainerCallback` in a worker) we pass `parsing_timeout=None` /
`timeout_seconds=None` and bound the wall time instead by running the math-verify call in a daemon worker thread
that we wait for at most `THREAD_TIMEOUT_S` seconds; on a timeout the result is wrong with `error="timeout ..."`
(the abandoned daemon thread finishes in the background; it cannot be killed, but it never blocks exit).
Answers longer than `MAX_ANSWER_CHARS` characters are not given to SymPy at all (wrong, no error).

Any exception or timeout inside math-verify makes the completion wrong and is reported in `GradeResult.error`
and counted in `GRADER_STATS`; it never raises and never scores 1.
"""

from __future__ import annotations

import functools
import logging
import re
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Any


logger = logging.getLogger(__name__)

# math-verify timeouts on the main thread (signal.alarm takes whole seconds).
PARSING_TIMEOUT_S = 5
VERIFY_TIMEOUT_S = 5
# Wall-clock bound for one math-verify call off the main thread (seconds).
THREAD_TIMEOUT_S = 10.0
# Longer answers are rejected before SymPy sees them (pathological inputs can hang SymPy).
MAX_ANSWER_CHARS = 1000

# Process-wide counters: "graded", "errors", "timeouts", "gold_unparseable". Read them, or `.clear()` them.
GRADER_STATS: Counter[str] = Counter()


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


# ----------------------------------------------------------------------------------------------------------------
# Box extraction
# ----------------------------------------------------------------------------------------------------------------

_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")


def _match_braces(text: str, start: int) -> int | None:
    """Index just past the `}` closing the `{` at `text[start]`, or `None` when unbalanced."""
    depth = 0
    i = start
    while i < len(text):
        c = text[i]
        if c == "\\":  # skip escaped characters such as \{ and \}
            i += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return None


def _find_boxes(text: str) -> list[tuple[str | None, int, int]]:
    """All `\\boxed`/`\\fbox` occurrences as (content or None when unterminated, start, end)."""
    boxes = []
    for m in _BOX_RE.finditer(text):
        i = m.end()
        while i < len(text) and text[i] in " \t":
            i += 1
        if i < len(text) and text[i] == "{":
            end = _match_braces(text, i)
            boxes.append((None if end is None else text[i + 1 : end - 1], m.start(), end or len(text)))
        elif i > m.end() and i < len(text):  # brace-less form: "\boxed 5"
            tok = re.match(r"[^\s$]+", text[i:])
            boxes.append((tok.group(0), m.start(), i + tok.end()) if tok else (None, m.start(), len(text)))
        else:
            boxes.append((None, m.start(), len(text)))
    return boxes


def extract_boxed_answer(text: str | None) -> str | None:
    r"""Content of the LAST `\boxed{...}` or `\fbox{...}` of `text` (nested braces handled).

    Args:
        text (`str` or `None`):
            A completion or a gold answer.

    Returns:
        `str` or `None`: the content between the braces, stripped; `None` when there is no box, when the last
        box is unterminated (a truncated generation: an earlier box does not count then), or when it is empty.

    Example:
        >>> extract_boxed_answer(r"so \boxed{1} no, \boxed{\frac{1}{3}}.")
        '\\frac{1}{3}'
    """
    if not text:
        return None
    boxes = _find_boxes(text)
    if not boxes or boxes[-1][0] is None:
        return None
    content = boxes[-1][0].strip()
    return content or None


def _last_boxes(text: str, k: int) -> list[str] | None:
    """Contents of the last `k` boxes when all are complete, else None."""
    boxes = _find_boxes(text)
    if len(boxes) < k or any(b[0] is None for b in boxes[-k:]):
        return None
    return [b[0].strip() for b in boxes[-k:]]


# ----------------------------------------------------------------------------------------------------------------
# Normalisation (string level, before math-verify)
# ----------------------------------------------------------------------------------------------------------------

_INT_RE = re.compile(r"^[+-]?\d+(?:\.0*)?$")
_INT_COMMAS_RE = re.compile(r"^[+-]?\d{1,3}(?:,\d{3})+(?:\.0*)?$")
_SCI_RE = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))[eE]([+-]?\d+)$")
_TEXT_NUM_RE = re.compile(r"\\(?:text|textbf|mathrm|mathbf)\{\s*([+-]?[\d.,]+)\s*\}")
_SUBSCRIPT_CMD_RE = re.compile(r"_\{\s*\\([A-Za-z]+)\s*\}")
_NP_FUNCS = ("arcsin", "arccos", "arctan", "sinh", "cosh", "tanh", "sin", "cos", "tan", "exp", "log", "ln")
_NP_RE = re.compile(r"\b(?:np|numpy|math)\.(" + "|".join(_NP_FUNCS) + r"|sqrt|pi|e)\b")
_DOLLAR_GROUPS_RE = re.compile(r"^\s*\$[^$]+\$(?:\s*,\s*\$[^$]+\$)+\s*$")


def _strip_math_delims(s: str) -> str:
    s = s.strip()
    changed = True
    while changed and s:
        changed = False
        for left, right in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
            if len(s) >= len(left) + len(right) and s.startswith(left) and s.endswith(right):
                s = s[len(left) : len(s) - len(right)].strip()
                changed = True
                break
    return s


def _np_to_latex(s: str) -> str:
    def repl(m: re.Match) -> str:
        name = m.group(1)
        if name == "e":
            return "e"
        return "\\" + name

    s = _NP_RE.sub(repl, s)
    # \sqrt(x) -> \sqrt{x} (only for a simple, unnested argument)
    return re.sub(r"\\sqrt\(([^()]*)\)", r"\\sqrt{\1}", s)


def normalize_answer(s: str) -> str:
    r"""String-level clean-up applied to both sides before comparison.

    Strips math delimiters (`$`, `\(`, `\[`) and a trailing period, unwraps `\text{<number>}` (and
    `\textbf`/`\mathrm`/`\mathbf`), rewrites Python/numpy notation (`4.5e33`, `-1./3`, `np.arcsin(x)`) into LaTeX.

    Args:
        s (`str`): an answer string (box content or gold).

    Returns:
        `str`: the cleaned string (may be empty).
    """
    s = _strip_math_delims(str(s))
    s = s.rstrip().rstrip(".").rstrip()
    s = _strip_math_delims(s)
    s = _TEXT_NUM_RE.sub(r"\1", s)
    s = _SUBSCRIPT_CMD_RE.sub(r"_{\1}", s)  # m_{\max}, L_{\odot}: latex2sympy rejects a command as a subscript
    m = _SCI_RE.match(s)
    if m:
        s = f"{m.group(1)} \\times 10^{{{int(m.group(2))}}}"
    # "1./3" -> "1/3": a period after digits that no digit follows
    s = re.sub(r"(\d)\.(?=[/\s),\]]|$)", r"\1", s)
    if "np." in s or "numpy." in s or "math." in s:
        s = _np_to_latex(s)
    return s.strip()


def _as_int(s: str) -> int | None:
    """`int` value of a plain integer string ('025', '27.0', '-3', '1,000'), else None."""
    s = s.replace(" ", "").replace("\\!", "").replace("{,}", ",")
    if _INT_COMMAS_RE.match(s):
        s = s.replace(",", "")
    if _INT_RE.match(s):
        return int(s.split(".")[0])
    return None


def _split_top_level(s: str, sep: str = ",") -> list[str]:
    """Split `s` at `sep` outside (), [], {}."""
    parts, depth, cur = [], 0, []
    i = 0
    while i < len(s):
        c = s[i]
        if c == "\\" and i + 1 < len(s):  # keep \{ \} \, etc. intact
            cur.append(s[i : i + 2])
            i += 2
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        if c == sep and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
        else:
            cur.append(c)
        i += 1
    parts.append("".join(cur).strip())
    return [p for p in parts if p]


def gold_parts(gold: Any) -> list[str]:
    r"""Normalise a gold answer of any supported layout into its list of answer strings.

    Args:
        gold (`str`, `int`, `float`, `list` or `tuple`):
            The ground truth: a number (`27.0`), a string (`"025"`, `"$\frac{1}{2}$"`, `"\boxed{204}"`,
            `"$69$,$84$"`) or a list of those (OlympiadBench `final_answer`).

    Returns:
        `list[str]`: one string per expected answer (length > 1 for multi-answer golds); empty when the gold is
        empty or `None`.
    """
    if gold is None:
        return []
    if isinstance(gold, (list, tuple)):
        return [p for g in gold for p in gold_parts(g)]
    if isinstance(gold, bool):
        return [str(gold)]
    if isinstance(gold, int):
        return [str(gold)]
    if isinstance(gold, float):
        return [str(int(gold))] if gold.is_integer() else [repr(gold)]
    s = str(gold).strip()
    if _BOX_RE.search(s):
        boxed = extract_boxed_answer(s)
        if boxed is not None:
            s = boxed
    if _DOLLAR_GROUPS_RE.match(s):
        return [normalize_answer(p) for p in re.findall(r"\$([^$]+)\$", s)]
    s = normalize_answer(s)
    return [s] if s else []


# ----------------------------------------------------------------------------------------------------------------
# math-verify calls, time-bounded on any thread
# ----------------------------------------------------------------------------------------------------------------


class _GraderTimeout(Exception):
    pass


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _run_bounded(fn, *args, **kwargs):
    """Run `fn(*args, main_thread=..., **kwargs)` with a time bound suited to the current thread."""
    if _on_main_thread():
        return fn(*args, main_thread=True, **kwargs)
    box: dict[str, Any] = {}

    def target():
        try:
            box["value"] = fn(*args, main_thread=False, **kwargs)
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread below
            box["error"] = e

    worker = threading.Thread(target=target, daemon=True, name="stapo-grader")
    worker.start()
    worker.join(THREAD_TIMEOUT_S)
    if worker.is_alive():
        raise _GraderTimeout(f"timeout after {THREAD_TIMEOUT_S} s (off the main thread)")
    if "error" in box:
        raise box["error"]
    return box["value"]


def _extraction_config():
    from math_verify import ExprExtractionConfig, LatexExtractionConfig

    return [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]


def _parse(s: str, *, main_thread: bool, fallback: bool) -> list:
    from math_verify import parse

    return parse(
        f"\\boxed{{{s}}}",
        extraction_config=_extraction_config(),
        fallback_mode="first_match" if fallback else "no_fallback",
        parsing_timeout=PARSING_TIMEOUT_S if main_thread else None,
        raise_on_error=True,
    )


def _verify(gold_parsed: list, pred_parsed: list, *, main_thread: bool) -> bool:
    """True when any (gold, pred) pair is equivalent; raises only when no pair matched and one raised."""
    from math_verify import verify

    first_error = None
    for g in gold_parsed:
        for p in pred_parsed:
            try:
                if verify(g, p, timeout_seconds=VERIFY_TIMEOUT_S if main_thread else None, raise_on_error=True):
                    return True
            except BaseException as e:  # noqa: BLE001 - includes math-verify's TimeoutException
                if isinstance(e, (KeyboardInterrupt, SystemExit)):
                    raise
                first_error = first_error or e
    if first_error is not None:
        raise first_error
    return False


def _is_sympy(x: Any) -> bool:
    return not isinstance(x, str)


def _error_text(e: BaseException) -> str:
    kind = "timeout" if "timeout" in type(e).__name__.lower() or "timed out" in str(e).lower() else "error"
    return f"{kind}: {type(e).__name__}: {str(e)[:200]}"


@functools.lru_cache(maxsize=4096)
def _parse_gold_cached(gold: str) -> tuple:
    # Cached: an evaluation grades N samples against the same gold. Exceptions are not cached.
    parsed = _run_bounded(_parse, gold, fallback=False) if len(gold) <= MAX_ANSWER_CHARS else []
    return tuple(x for x in parsed if _is_sympy(x))


def _parse_gold(gold: str) -> list:
    return list(_parse_gold_cached(gold))


def _gold_error(golds: list[str]) -> str | None:
    """`"gold unparseable: ..."` when a (non-integer) gold part does not parse into SymPy, else None (cached)."""
    for gold in golds:
        if _as_int(gold) is not None:
            continue
        try:
            parsed = _parse_gold(gold)
        except BaseException as e:  # noqa: BLE001
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            return f"gold unparseable: {_error_text(e)}"
        if not parsed:
            return f"gold unparseable: {gold[:200]!r}"
    return None


def _squash(s: str) -> str:
    return re.sub(r"\s+", "", s)


def _compare_single(pred: str, gold: str) -> tuple[bool, str | None]:
    """(correct, error) for one normalised prediction against one normalised gold string."""
    gi = _as_int(gold)
    if gi is not None:
        pi = _as_int(pred)
        if pi is not None:
            return pi == gi, None
    try:
        gold_parsed = _parse_gold(gold)
    except BaseException as e:  # noqa: BLE001
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        return False, f"gold unparseable: {_error_text(e)}"
    if not gold_parsed:
        return False, f"gold unparseable: {gold[:200]!r}"
    if not pred or len(pred) > MAX_ANSWER_CHARS:
        return False, None
    if _squash(pred) == _squash(gold):  # identical up to whitespace (and the gold parses): no SymPy needed
        return True, None
    try:
        pred_parsed = _run_bounded(_parse, pred, fallback=True)
        if not pred_parsed:
            return False, None
        return bool(_run_bounded(_verify, gold_parsed, pred_parsed)), None
    except BaseException as e:  # noqa: BLE001
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        return False, _error_text(e)


def _match_all(preds: list[str], golds: list[str]) -> tuple[bool, str | None]:
    """Order-insensitive one-to-one matching of prediction parts to gold parts (backtracking, k is small)."""
    errors: list[str] = []
    cache: dict[tuple[int, int], bool] = {}

    def ok(i: int, j: int) -> bool:
        if (i, j) not in cache:
            c, e = _compare_single(preds[i], golds[j])
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


# ----------------------------------------------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------------------------------------------


def grade(completion: str | None, gold: Any) -> GradeResult:
    r"""Grade one completion against one gold answer (see the module docstring for the accepted formats).

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
    GRADER_STATS["graded"] += 1
    extracted = extract_boxed_answer(completion)
    try:
        golds = gold_parts(gold)
    except Exception as e:  # noqa: BLE001 - malformed gold objects must not crash a training step
        golds, err = [], f"gold unparseable: {_error_text(e)}"
    else:
        err = None if golds else f"gold unparseable: {gold!r:.200}"
    if err is None:
        err = _gold_error(golds)  # checked even without a box: an unparseable gold makes every grade undefined
    if err is not None:
        return _count(GradeResult(False, extracted, err))
    if extracted is None:
        return _count(GradeResult(False, None, None))
    pred = normalize_answer(extracted)
    if len(golds) == 1:
        correct, err = _compare_single(pred, golds[0])
        return _count(GradeResult(correct, extracted, None if correct else err))
    # Multi-answer gold: all parts must match, any order.
    k = len(golds)
    parts = _split_top_level(pred)
    if len(parts) != k:
        boxes = _last_boxes(completion or "", k)
        if boxes is not None:
            parts = [normalize_answer(b) for b in boxes]
    if len(parts) == k:
        correct, err = _match_all(parts, golds)
        if correct:
            return _count(GradeResult(True, extracted, None))
    correct, err2 = _compare_single(pred, ", ".join(golds))
    return _count(GradeResult(correct, extracted, None if correct else (err2 or err)))


def _count(result: GradeResult) -> GradeResult:
    if result.error:
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


__all__ = [
    "GRADER_STATS",
    "GradeResult",
    "extract_boxed_answer",
    "gold_parts",
    "grade",
    "is_correct",
    "normalize_answer",
]
