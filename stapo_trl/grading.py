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

Equality of values (after math-verify has parsed both sides):

- Both sides exact (integers, rationals, factorials, powers, radicals, pi, e, no decimal point anywhere): rationals
  are compared as fractions, other closed forms to `EXACT_DIGITS` (40) significant digits. There is no absolute
  tolerance: `1/2006!` is not `1/2004!`, `2^{-100}` is not `2^{-101}`, `2^{200}+1` is not `2^{200}`.
- A decimal on either side: relative tolerance `DECIMAL_REL_TOL` (5e-6, about six significant digits):
  `27.0` == `27`, `0.333333` == `1/3` and `3.14159` == `pi`, but `0.3333` != `1/3` and `1.2e-8` != `1.5e-8`.
- Tuples and matrices element by element with the same rules; everything else (sets, intervals, equations,
  expressions with variables, percentages) as math-verify decides, with `allow_set_relation_comp` on
  (`x > 3` == `(3, \infty)`).

Multiple choice: when the gold is an option letter A-E (`C`, `(C)`, `\text{(C)}`, `\textbf{C}`), the letter of the
answer decides (`\text{C: } 12`, `\textbf{(C)}\ 12`, `(c)`); an answer without a letter is wrong. Against any other
gold an option prefix is dropped and its value graded (`\textbf{(C)}\ 12` == `12`).

Upright constants and operators are read as what they write, on both sides: `\mathrm{e}`, `{\rm e}` (Euler's e),
`\mathrm{i}` (the imaginary unit letter), `\mathrm{d}` (a differential), `\operatorname{arcsin}`,
`\mathrm{sin}` (the function). Also read: repeating decimals (`0.\overline{3}`), thin spaces between digit groups
(`12\,345`), Unicode `°`, `π`, `∞`, `×`, `·`, `√`, `≤`, `≥`.

Fast paths (no SymPy): when both sides are plain integers (after the normalisation above) they are compared as
Python `int`s (the common case for AIME/AMC/DAPO); when the answer equals the gold up to whitespace, it is correct
as soon as the gold parses. Parsed golds are cached (an evaluation grades N samples against each gold).

Time bound: every `grade` / `is_correct` call (and so every reward value) returns within `GRADE_TIMEOUT_S` seconds
(2.0 by default, [`configure_grader`]) of wall time, on the main thread, on any other thread, in a thread pool or
inside an `async` reward; the only exception is the first call in a process, which also imports SymPy /
latex2sympy / math-verify once (1-2 s) before its bound starts. Three layers:

1. Refusal before evaluation: answers over `MAX_ANSWER_CHARS` characters, parsed expressions over `MAX_EXPR_NODES`
   nodes, and numbers whose exact evaluation needs more than `MAX_RESULT_DIGITS` digits (`10^{10^{10}}`,
   `2003^{2002^{2001}}`, `(10^7)!`, `\binom{10^9}{10^5}`: a big-integer power holds the GIL, so no thread timeout
   could stop it).
2. In-process (the default): on the main thread a `signal.setitimer` alarm interrupts the comparison at the bound;
   on other threads the comparison runs in a daemon thread that is abandoned at the bound (it finishes in the
   background; math-verify's own `signal.alarm` timeouts are off everywhere).
3. Optional worker processes (`configure_grader(processes=N)` or `STAPO_GRADER_PROCESSES=N`): parsing and
   verification run in N persistent child interpreters (started with `subprocess`, not `fork`: safe next to torch
   threads; they import this file alone, not torch) and one that overruns the bound is killed and replaced.

Refused, interrupted and killed comparisons are wrong, carry `error="timeout: ..."` and are counted in
`GRADER_STATS["timeouts"]` (and as `grading/timeout_ratio` by the reward); never correct.

Any exception inside math-verify makes the completion wrong and is reported in `GradeResult.error` and counted in
`GRADER_STATS`; `grade` never raises and never scores 1 on an error.
"""

from __future__ import annotations

import atexit
import json
import logging
import math
import os
import queue
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any


logger = logging.getLogger(__name__)

# Wall-clock bound for one `grade` / `is_correct` call, on any thread (seconds). See "Time bounds" above.
GRADE_TIMEOUT_S = 2.0
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
_INT_THIN_SPACES_RE = re.compile(r"^[+-]?\d{1,3}(?:\\[,\s]?\d{3})+$")
_INT_COMMAS_RE = re.compile(r"^[+-]?\d{1,3}(?:,\d{3})+(?:\.0*)?$")
_SCI_RE = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))[eE]([+-]?\d+)$")
_TEXT_NUM_RE = re.compile(r"\\(?:text|textbf|mathrm|mathbf)\{\s*([+-]?[\d.,]+)\s*\}")
_SUBSCRIPT_CMD_RE = re.compile(r"_\{\s*\\([A-Za-z]+)\s*\}")
_NP_FUNCS = ("arcsin", "arccos", "arctan", "sinh", "cosh", "tanh", "sin", "cos", "tan", "exp", "log", "ln")
_NP_RE = re.compile(r"\b(?:np|numpy|math)\.(" + "|".join(_NP_FUNCS) + r"|sqrt|pi|e)\b")
_DOLLAR_GROUPS_RE = re.compile(r"^\s*\$[^$]+\$(?:\s*,\s*\$[^$]+\$)+\s*$")


# Upright constants and operators: \mathrm{e} is Euler's e, \mathrm{i} the imaginary unit, \mathrm{d} a differential,
# \operatorname{arcsin} / \mathrm{sin} the function. latex2sympy reads \mathrm{e} as a text symbol and rejects
# \operatorname{arcsin}, so they are rewritten into the plain form it knows (on both sides).
_UPRIGHT_CMDS = r"(?:mathrm|operatorname|textrm|mathup|rm|up)"
_LATEX_FUNCS = (
    "arcsin|arccos|arctan|arccot|arcsec|arccsc|sinh|cosh|tanh|coth|sin|cos|tan|cot|sec|csc|exp|ln|log|lg|det|"
    "gcd|max|min"
)
_UPRIGHT_BRACED_RE = re.compile(r"\\" + _UPRIGHT_CMDS + r"\s*\{\s*(?:(e|i|d)|\\?(" + _LATEX_FUNCS + r")|\\(pi))\s*\}")
_UPRIGHT_BARE_RE = re.compile(r"\\(?:mathrm|operatorname|rm)\s+(e|i|d)(?![A-Za-z])")
_UPRIGHT_GROUP_RE = re.compile(r"\{\s*\\rm\s+(e|i|d)\s*\}")


def _upright_to_plain(s: str) -> str:
    def plain(letter: str) -> str:
        return " d " if letter == "d" else "{" + letter + "}"  # " d ": latex2sympy reads \frac{ d y}{ d x}

    def braced(m: re.Match) -> str:
        if m.group(1):
            return plain(m.group(1))
        return f"\\{m.group(2) or m.group(3)} "

    s = _UPRIGHT_BRACED_RE.sub(braced, s)
    s = _UPRIGHT_GROUP_RE.sub(lambda m: plain(m.group(1)), s)
    s = _UPRIGHT_BARE_RE.sub(lambda m: plain(m.group(1)), s)
    return s


# Multiple choice: a letter A-E, optionally decorated (\text, \textbf, \mathrm, \mathbf, parentheses, a colon or a
# period after it, the option's own text after that).
_WRAP_CMD_RE = re.compile(r"\\(?:text|textbf|textrm|mathrm|mathbf|mathit|textit|bf|mbox|emph)\s*\{([^{}]*)\}")
_SPACE_CMD_RE = re.compile(r"\\(?:quad|qquad|[ ,;:!>])|~")
_GOLD_LETTER_RE = re.compile(r"^\(\s*([A-Ea-e])\s*\)$|^([A-E])$")
_OPTION_PREFIX_RE = re.compile(r"^(?:\(\s*[A-Ea-e]\s*\)|[A-E]\s*[:)])\s*(\S.*)$", re.S)
_PRED_LETTER_RE = re.compile(r"^(?:\(\s*([A-Ea-e])\s*\)|([A-Da-d]|E)(?=\s*[):.]|\s|$))\s*[):.]?\s*(.*)$", re.S)


def _unwrap_decoration(s: str) -> str:
    prev = None
    while prev != s:
        prev, s = s, _WRAP_CMD_RE.sub(r"\1", s)
    s = _SPACE_CMD_RE.sub(" ", s).replace("{", " ").replace("}", " ").replace("*", " ")
    return re.sub(r"\s+", " ", s).strip()


def option_letter(gold: str) -> str | None:
    r"""The option letter of a multiple-choice gold answer, or `None` when the gold is not a lone letter.

    Args:
        gold (`str`): a normalised gold answer: `C`, `(C)`, `\text{(C)}`, `\textbf{C}`, `\mathrm{(c)}`.

    Returns:
        `str` or `None`: the upper-case letter `A`-`E`. A bare lower-case letter (`e`, `c`) is a symbol, not an
        option: `None`.
    """
    m = _GOLD_LETTER_RE.match(_unwrap_decoration(gold))
    return (m.group(1) or m.group(2)).upper() if m else None


def _pred_option(pred: str) -> tuple[str, str] | None:
    """(letter, the option's text after it) of a decorated option answer (`\\textbf{(C)}\\ 12`), else None."""
    m = _PRED_LETTER_RE.match(_unwrap_decoration(pred))
    if not m:
        return None
    return (m.group(1) or m.group(2)).upper(), m.group(3).strip()


# Unicode symbols written in place of their LaTeX commands.
_UNICODE_MATH = {
    "°": "^{\\circ}",
    "π": "\\pi ",
    "∞": "\\infty ",
    "×": "\\times ",
    "·": "\\cdot ",
    "√": "\\sqrt ",
    "≤": "\\le ",
    "≥": "\\ge ",
}
# A repeating decimal: 0.\overline{3}, 1.2\overline{45}, .\overline{6}.
_REPEATING_RE = re.compile(r"(?<![\d.])(\d*)\.(\d*)\\overline\s*\{\s*(\d+)\s*\}")


def _repeating_to_frac(m: re.Match) -> str:
    whole, fixed, period = m.group(1) or "0", m.group(2), m.group(3)
    # x = whole.fixed(period)... = whole + (fixed + period / (10^len(period) - 1)) / 10^len(fixed)
    den = (10 ** len(period) - 1) * 10 ** len(fixed)
    num = int(whole) * den + int(fixed or "0") * (10 ** len(period) - 1) + int(period)
    g = math.gcd(num, den)
    return f"\\frac{{{num // g}}}{{{den // g}}}"


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
    s = _upright_to_plain(s)
    for char, latex in _UNICODE_MATH.items():
        s = s.replace(char, latex)
    s = _REPEATING_RE.sub(_repeating_to_frac, s)
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
    if _INT_THIN_SPACES_RE.match(s):  # 12\,345 (a thin space between digit groups)
        s = s.replace("\\,", "").replace("\\", "")
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


class _GraderTimeout(BaseException):
    """The grade call ran out of time. A BaseException, so that math-verify's `except Exception` cannot swallow it."""


class _Refused(Exception):
    """A pathological form refused before evaluation (counted as a timeout)."""


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _remaining(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise _GraderTimeout(f"timeout: over the {GRADE_TIMEOUT_S} s bound")
    return left


def _raise_timeout(signum, frame):  # SIGALRM handler on the main thread
    raise _GraderTimeout(f"timeout: over the {GRADE_TIMEOUT_S} s bound (main thread)")


def _run_bounded(fn, *args, deadline: float):
    """Run `fn(*args)` so that control comes back by `deadline` (a `time.monotonic()` value).

    Main thread (and no other interval timer armed): a `signal.setitimer` alarm interrupts `fn` between bytecodes.
    Other threads: `fn` runs in a daemon thread that is abandoned at the deadline. Neither can interrupt one long C
    call (a big-integer power holds the GIL): such forms are refused beforehand ([`_check_size`]), and the worker
    processes ([`configure_grader`]) bound everything.
    """
    left = _remaining(deadline)
    if _on_main_thread() and signal.getitimer(signal.ITIMER_REAL)[0] == 0:
        previous = signal.signal(signal.SIGALRM, _raise_timeout)
        try:
            signal.setitimer(signal.ITIMER_REAL, left)
            try:
                return fn(*args)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        finally:
            signal.signal(signal.SIGALRM, previous)
    box: dict[str, Any] = {}

    def target():
        try:
            box["value"] = fn(*args)
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread below
            box["error"] = e

    worker = threading.Thread(target=target, daemon=True, name="stapo-grader")
    worker.start()
    worker.join(left)
    if worker.is_alive():
        raise _GraderTimeout(f"timeout: over the {GRADE_TIMEOUT_S} s bound (off the main thread)")
    if "error" in box:
        raise box["error"]
    return box["value"]


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


def _error_text(e: BaseException) -> str:
    if isinstance(e, _GraderTimeout):
        return str(e)
    if isinstance(e, _Refused):
        return f"timeout: refused before evaluation: {e}"
    kind = "timeout" if "timeout" in type(e).__name__.lower() or "timed out" in str(e).lower() else "error"
    return f"{kind}: {type(e).__name__}: {str(e)[:200]}"


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


def _bounded_compare(pred: str, gold: str, deadline: float) -> bool:
    pool = _POOL
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
    if len(pred) > MAX_ANSWER_CHARS:
        return False, f"timeout: refused before evaluation: answer longer than {MAX_ANSWER_CHARS} characters"
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


# ----------------------------------------------------------------------------------------------------------------
# Worker processes (optional): verification that can be killed
# ----------------------------------------------------------------------------------------------------------------

# The worker loads this very file as a standalone module (it imports only the standard library and math-verify),
# so it never imports torch through `stapo_trl/__init__`. A fresh interpreter (subprocess, not fork): safe next to
# torch's threads and CUDA.
_WORKER_BOOT = (
    "import importlib.util, sys; "
    "spec = importlib.util.spec_from_file_location('_stapo_grading_worker', sys.argv[1]); "
    "m = importlib.util.module_from_spec(spec); sys.modules[spec.name] = m; spec.loader.exec_module(m); "
    "m._worker_main()"
)


def _worker_main() -> None:  # pragma: no cover - runs in the worker process
    # Answers go to a private copy of the pipe; fd 1 itself is pointed at stderr (devnull), so that a stray print
    # in SymPy or latex2sympy cannot corrupt the protocol.
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    logging.disable(logging.WARNING)
    _sympy_compare("1/2", "0.5")  # import and warm up SymPy, latex2sympy and math-verify before "ready"
    out.write("ready\n")
    out.flush()
    for line in sys.stdin:
        request_id, pred, gold = json.loads(line)
        try:
            answer = [request_id, bool(_sympy_compare(pred, gold)), None]
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            answer = [request_id, False, _error_text(e)]
        out.write(json.dumps(answer) + "\n")
        out.flush()


class _WorkerPool:
    """`size` persistent grader processes; one that overruns the deadline is killed and replaced in the background."""

    def __init__(self, size: int):
        self.size = size
        self._idle: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._procs: set = set()
        self._closed = False
        self.started = 0  # worker processes started so far (replacements included)
        self.killed = 0  # workers killed for overrunning the bound
        self._next_id = 0
        for _ in range(size):
            self._spawn_async()

    def _spawn_async(self) -> None:
        threading.Thread(target=self._spawn, daemon=True, name="stapo-grader-spawn").start()

    def _spawn(self) -> None:
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        proc = subprocess.Popen(
            [sys.executable, "-c", _WORKER_BOOT, os.path.abspath(__file__)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        with self._lock:
            self.started += 1
            if self._closed:
                proc.kill()
                return
            self._procs.add(proc)
        if proc.stdout.readline().strip() == "ready":
            self._idle.put(proc)
        else:
            self._discard(proc)

    def _discard(self, proc) -> None:
        with self._lock:
            self._procs.discard(proc)
            closed = self._closed
        proc.kill()
        threading.Thread(target=proc.wait, daemon=True).start()
        if not closed:
            self._spawn_async()

    def ready(self) -> bool:
        """Whether at least one worker has started (before that, grading runs in-process)."""
        return not self._idle.empty() or any(p.poll() is None for p in list(self._procs))

    def compare(self, pred: str, gold: str, deadline: float) -> bool:
        try:
            proc = self._idle.get(timeout=_remaining(deadline))
        except queue.Empty:
            raise _GraderTimeout(f"timeout: no grader worker free within the {GRADE_TIMEOUT_S} s bound") from None
        with self._lock:
            self._next_id += 1
            request_id = self._next_id
        sent = time.monotonic()
        try:
            proc.stdin.write(json.dumps([request_id, pred, gold]) + "\n")
            proc.stdin.flush()
        except (OSError, ValueError):
            self._discard(proc)
            raise _GraderTimeout("timeout: the grader worker died") from None
        answer = self._read_answer(proc, request_id, deadline)
        if answer is None:
            # The caller's bound is over (it may have waited for a free worker). The worker itself gets its full
            # GRADE_TIMEOUT_S for this comparison: it is killed only if it overruns that, else it rejoins the pool.
            threading.Thread(target=self._reap, args=(proc, request_id, sent + GRADE_TIMEOUT_S), daemon=True).start()
            raise _GraderTimeout(f"timeout: over the {GRADE_TIMEOUT_S} s bound (worker process)")
        self._idle.put(proc)
        _, correct, error = answer
        if error:
            raise (_GraderTimeout(error) if error.startswith("timeout") else RuntimeError(error))
        return correct

    @staticmethod
    def _read_answer(proc, request_id: int, deadline: float) -> list | None:
        """The worker's answer to `request_id`, or None when none came by `deadline` (or the worker died)."""
        while True:
            try:
                readable, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
                line = proc.stdout.readline() if readable else ""
                answer = json.loads(line) if line else None
            except (OSError, ValueError):
                return None
            if answer is None or (isinstance(answer, list) and answer and answer[0] == request_id):
                return answer

    def _reap(self, proc, request_id: int, hard_deadline: float) -> None:
        if self._read_answer(proc, request_id, hard_deadline) is None:
            with self._lock:
                self.killed += 1
            self._discard(proc)
        else:
            self._idle.put(proc)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            procs = list(self._procs)
            self._procs.clear()
        for proc in procs:
            proc.kill()
            proc.wait()


_POOL: _WorkerPool | None = None
_POOL_LOCK = threading.Lock()


def configure_grader(processes: int | None = None, timeout_s: float | None = None) -> None:
    """Set the grader's time bound and its worker processes.

    Args:
        processes (`int`, *optional*): number of persistent worker processes that run parsing and verification
            (0 = in-process, the default; also read from the `STAPO_GRADER_PROCESSES` environment variable at
            import). With workers, a comparison that overruns the bound is killed with its process, whatever it is
            doing; in-process, forms that would hold the GIL are refused beforehand and the rest is interrupted
            (main thread) or abandoned (other threads). Each worker costs one Python start-up (~1-2 s, in the
            background; calls made before the first worker is ready run in-process) and ~100 MB of memory.
        timeout_s (`float`, *optional*): the wall-clock bound of one `grade` call, in seconds (default 2.0).

    Raises:
        ValueError: `processes` < 0 or `timeout_s` <= 0.
    """
    global _POOL, GRADE_TIMEOUT_S
    if timeout_s is not None:
        if not timeout_s > 0:
            raise ValueError(f"configure_grader: timeout_s must be > 0 seconds, got {timeout_s!r}")
        GRADE_TIMEOUT_S = float(timeout_s)
    if processes is None:
        return
    if processes < 0:
        raise ValueError(f"configure_grader: processes must be >= 0 (0 = in-process), got {processes!r}")
    with _POOL_LOCK:
        if _POOL is not None:
            _POOL.close()
            _POOL = None
        if processes:
            _POOL = _WorkerPool(processes)


@atexit.register
def _close_pool() -> None:
    if _POOL is not None:
        _POOL.close()


if os.environ.get("STAPO_GRADER_PROCESSES", "").strip() not in ("", "0") and __name__ != "_stapo_grading_worker":
    configure_grader(processes=int(os.environ["STAPO_GRADER_PROCESSES"]))


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
    _warm_up()  # one-time import of SymPy / latex2sympy / math-verify, outside the time bound
    deadline = time.monotonic() + GRADE_TIMEOUT_S
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


__all__ = [
    "GRADER_STATS",
    "GradeResult",
    "configure_grader",
    "extract_boxed_answer",
    "gold_parts",
    "grade",
    "is_correct",
    "normalize_answer",
    "option_letter",
]
