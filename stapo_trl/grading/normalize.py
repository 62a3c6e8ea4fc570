r"""String-level normalisation before math-verify (both sides) and the layouts of gold answers.

LaTeX clean-up (math delimiters, `\text{13}`, upright constants, Unicode symbols, repeating decimals, numpy
notation), the plain-integer reading of the integer fast path, top-level comma splits and [`gold_parts`].
Standard library only.
"""

from __future__ import annotations

import math
import re
from typing import Any

from .extract import _BOX_RE, extract_boxed_answer


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
