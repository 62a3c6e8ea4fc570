r"""Multiple choice: the option letter A-E of a gold (`C`, `(C)`, `\text{(C)}`) and of an answer
(`\textbf{(C)}\ 12`, `C: 12`, `(c)`). Standard library only."""

from __future__ import annotations

import re


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
